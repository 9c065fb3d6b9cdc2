//! Which of an agent's spawners (spawn loops, each with its own thread, slots and CPUs) runs
//! each task: one loop per CPU keeps tiny tasks flowing, while the leader still sees one agent
//! and one report stream per node. `Spread` keeps what each holds; `Fanout` feeds it.
//!
//! A task wider than a loop goes to the wide spawner (the last one, holding every CPU's slot),
//! which borrows the loops of as many CPUs, from the first: they take nothing new, and the wide
//! spawner starts nothing until they are empty (`gate_open`). It gives them back once it holds
//! nothing. So narrow tasks keep their loop per CPU, and a wide task never shares its CPUs with
//! them; while every loop is lent, narrow tasks wait for one (`assign`).

use std::collections::VecDeque;

use crate::work::TaskToRun;

/// Tasks held by each spawner, against its slots, and which of them wait unstarted.
#[derive(Debug, Clone)]
pub struct Spread {
    slots: Vec<usize>,
    held: Vec<usize>,
    /// Per spawner, the tasks it holds and has not said it started, in the order sent. A
    /// spawner's queue is its own: one whose slots all run long tasks keeps these waiting
    /// while another may idle (`stuck`). With each, whether it may be asked back: not a task
    /// with `mem=` or GPUs, which may wait there for its memory or devices as the leader placed it.
    unstarted: Vec<VecDeque<(u64, bool)>>,
    /// Asked back by `stuck` and not back yet: not asked again.
    asked: Vec<u64>,
    /// When each spawner last started, ended or gave back a task (µs).
    moved_us: Vec<u64>,
    /// The wide spawner's index, when there is one.
    wide: Option<usize>,
    /// What the wide spawner holds, with the cores each asks.
    wide_tasks: Vec<(u64, usize)>,
    /// How many loops, from the first, are lent to the wide spawner. It only grows while the wide
    /// spawner holds anything: its first-fit slots then stay below it (`lend`).
    lent: usize,
}

/// How long a spawner's slots must all have run the same tasks before what waits behind them
/// is asked back: short tasks start what they queue soon enough, and asking back costs a trip
/// to the leader.
pub const STUCK_AFTER_US: u64 = 5_000_000;

impl Spread {
    /// Spawners of these many slots each.
    pub fn new(slots: Vec<usize>) -> Spread {
        let n = slots.len();
        Spread {
            slots,
            held: vec![0; n],
            unstarted: vec![VecDeque::new(); n],
            asked: Vec::new(),
            moved_us: vec![0; n],
            wide: None,
            wide_tasks: Vec::new(),
            lent: 0,
        }
    }

    /// `loops` one-slot loops, one per CPU, and after them the wide spawner with a slot for
    /// each of their CPUs.
    pub fn with_wide(loops: usize) -> Spread {
        let mut s = Spread::new([vec![1; loops], vec![loops]].concat());
        s.wide = Some(loops);
        s
    }

    /// Splits `tasks` among the spawners, each to the one with the fewest held per slot among
    /// those wide enough for it (ties: the lowest index); a task wider than every spawner goes
    /// to the widest, whose executor reports it unschedulable. With a wide spawner, a task
    /// wider than a loop goes to it; a narrow one finds no loop while all are lent, and waits
    /// (the second list) to be assigned again once they are back (`lent_out`). Returns one
    /// list per spawner, and those that wait.
    pub fn assign(&mut self, tasks: Vec<TaskToRun>) -> (Vec<Vec<TaskToRun>>, Vec<TaskToRun>) {
        let mut out: Vec<Vec<TaskToRun>> = vec![Vec::new(); self.slots.len()];
        let mut wait = Vec::new();
        for t in tasks {
            let cores = t.shape.cores.max(1) as usize;
            let Some(i) = self.pick(cores) else {
                wait.push(t);
                continue;
            };
            if Some(i) == self.wide {
                self.wide_tasks.push((t.id, cores));
                self.lend();
            }
            self.held[i] += 1;
            self.unstarted[i].push_back((t.id, t.shape.mem_mb == 0 && t.shape.gpus == 0));
            out[i].push(t);
        }
        (out, wait)
    }

    /// How many spawners there are.
    pub fn spawners(&self) -> usize {
        self.slots.len()
    }

    /// Whether every loop is lent to the wide spawner: a narrow task would wait.
    pub fn lent_out(&self) -> bool {
        self.wide.is_some_and(|w| self.lent >= w)
    }

    /// The wide spawner, when there is one.
    pub fn wide(&self) -> Option<usize> {
        self.wide
    }

    /// Lends the wide spawner as many loops as the cores of what it holds (all, at most).
    fn lend(&mut self) {
        let Some(w) = self.wide else { return };
        let cores: usize = self.wide_tasks.iter().map(|t| t.1).sum();
        self.lent = self.lent.max(cores.min(w));
    }

    /// `n` tasks of spawner `i` ended.
    pub fn finished(&mut self, i: usize, n: usize) {
        if let Some(h) = self.held.get_mut(i) {
            *h = h.saturating_sub(n);
        }
    }

    /// Task `id` of the wide spawner ended or came back: once it holds nothing, the loops it
    /// borrowed are the loops' again.
    pub fn wide_ended(&mut self, id: u64) {
        if let Some(at) = self.wide_tasks.iter().position(|t| t.0 == id) {
            self.wide_tasks.swap_remove(at);
        }
        if self.wide_tasks.is_empty() {
            self.lent = 0;
        }
    }

    /// Whether the wide spawner may start what it holds: the loops lent to it hold nothing.
    pub fn gate_open(&self) -> bool {
        self.held[..self.lent].iter().all(|&h| h == 0)
    }

    /// Task `id` of spawner `i` started, ended or was given back (at `now_us`): it waits there
    /// no more.
    pub fn left_queue(&mut self, i: usize, id: u64, now_us: u64) {
        let Some(q) = self.unstarted.get_mut(i) else { return };
        self.moved_us[i] = now_us;
        // Mostly the oldest: a spawner starts its queue in order, but for priorities.
        if q.front().is_some_and(|f| f.0 == id) {
            q.pop_front();
        } else if let Some(at) = q.iter().position(|x| x.0 == id) {
            q.remove(at);
        }
        if let Some(at) = self.asked.iter().position(|&x| x == id) {
            self.asked.swap_remove(at);
        }
    }

    /// Spawner `i` ended a task that had started (at `now_us`).
    pub fn moved(&mut self, i: usize, now_us: u64) {
        if let Some(m) = self.moved_us.get_mut(i) {
            *m = now_us;
        }
    }

    /// Spawner `i` dropped everything it held (a reset).
    pub fn emptied(&mut self, i: usize) {
        if let Some(h) = self.held.get_mut(i) {
            *h = 0;
        }
        if let Some(q) = self.unstarted.get_mut(i) {
            self.asked.retain(|id| !q.iter().any(|x| x.0 == *id));
            q.clear();
        }
        if Some(i) == self.wide {
            self.wide_tasks.clear();
            self.lent = 0;
        }
    }

    /// Tasks to ask back from a spawner whose slots have all run the same tasks for
    /// [`STUCK_AFTER_US`] while another has idle slots and nothing queued: (spawner, ids), its
    /// latest first, as many as the idle slots. Given back, they go up as recalled, and the
    /// leader hands them out again, to an idle slot.
    pub fn stuck(&mut self, now_us: u64) -> Option<(usize, Vec<u64>)> {
        let running = |i: usize| self.held[i] - self.unstarted[i].len().min(self.held[i]);
        // The wide spawner's slots are its loops' CPUs, and lent loops take nothing new: only
        // the loops not lent count, either way.
        let loops = self.wide.map_or(0..self.slots.len(), |w| self.lent..w);
        let idle: usize = loops
            .clone()
            .filter(|&i| self.unstarted[i].is_empty())
            .map(|i| self.slots[i].saturating_sub(running(i)))
            .sum();
        if idle == 0 {
            return None;
        }
        let j = loops.into_iter().find(|&j| {
            running(j) >= self.slots[j]
                && now_us.saturating_sub(self.moved_us[j]) >= STUCK_AFTER_US
                && self.unstarted[j].iter().any(|&(id, may)| may && !self.asked.contains(&id))
        })?;
        let ids: Vec<u64> = self.unstarted[j]
            .iter()
            .rev()
            .filter(|&&(id, may)| may && !self.asked.contains(&id))
            .take(idle)
            .map(|x| x.0)
            .collect();
        self.asked.extend(&ids);
        Some((j, ids))
    }

    fn pick(&self, cores: usize) -> Option<usize> {
        if let Some(w) = self.wide {
            // Loops not lent, for what one slot runs; the wide spawner for the rest.
            return if cores == 1 { (self.lent..w).min_by_key(|&i| self.held[i]) } else { Some(w) };
        }
        let fits = (0..self.slots.len()).filter(|&i| self.slots[i] >= cores);
        // held / slots compared without division: a/b < c/d  <=>  a*d < c*b.
        let best = fits.min_by(|&a, &b| (self.held[a] * self.slots[b]).cmp(&(self.held[b] * self.slots[a])));
        Some(
            best.unwrap_or_else(|| (0..self.slots.len()).max_by_key(|&i| (self.slots[i], usize::MAX - i)).unwrap_or(0)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shape::TaskShape;

    fn tasks(cores: &[u16]) -> Vec<TaskToRun> {
        cores
            .iter()
            .enumerate()
            .map(|(i, &cores)| {
                TaskToRun::new(i as u64 + 1, 1, Vec::new()).shaped(TaskShape { cores, ..Default::default() })
            })
            .collect()
    }

    fn ids(v: &[TaskToRun]) -> Vec<u64> {
        v.iter().map(|t| t.id).collect()
    }

    #[test]
    fn tasks_go_round_the_spawners_by_load() {
        let mut s = Spread::new(vec![1, 1]);
        let out = s.assign(tasks(&[1, 1, 1, 1])).0;
        assert_eq!((ids(&out[0]), ids(&out[1])), (vec![1, 3], vec![2, 4]));
        // Spawner 1 finished both: the next two go to it first.
        s.finished(1, 2);
        let out = s.assign(tasks(&[1, 1, 1])).0;
        assert_eq!((out[0].len(), out[1].len()), (1, 2));
    }

    #[test]
    fn load_is_per_slot_and_wide_tasks_go_where_they_fit() {
        // 3 CPUs split 2 + 1: the two-slot spawner takes two of every three.
        let mut s = Spread::new(vec![2, 1]);
        let out = s.assign(tasks(&[1, 1, 1, 1, 1, 1])).0;
        assert_eq!((out[0].len(), out[1].len()), (4, 2));
        let out = s.assign(tasks(&[2, 2])).0;
        assert_eq!((out[0].len(), out[1].len()), (2, 0), "only spawner 0 has two cores");
        // Wider than all: the widest takes it (and its executor says unschedulable).
        let out = s.assign(tasks(&[5])).0;
        assert_eq!(out[0].len(), 1);
    }

    #[test]
    fn tasks_queued_behind_busy_slots_are_asked_back_for_an_idle_one() {
        const T: u64 = STUCK_AFTER_US;
        let mut s = Spread::new(vec![1, 1]);
        let out = s.assign(tasks(&[1, 1, 1, 1])).0;
        assert_eq!((ids(&out[0]), ids(&out[1])), (vec![1, 3], vec![2, 4]));
        for (i, id) in [(0, 1), (1, 2)] {
            s.left_queue(i, id, 0);
        }
        assert_eq!(s.stuck(5 * T), None, "both run, each with one queued: nothing idles");
        // Spawner 0 ran 1 and 3; spawner 1 still runs 2 (a long task), with 4 queued behind it.
        s.left_queue(0, 3, T / 2);
        s.finished(0, 2);
        assert_eq!(s.stuck(T / 2), None, "2 may end soon");
        assert_eq!(s.stuck(T), Some((1, vec![4])));
        assert_eq!(s.stuck(2 * T), None, "asked once");
        s.left_queue(1, 4, 2 * T);
        s.finished(1, 1);
        assert_eq!(s.stuck(9 * T), None, "given back");
        // A task with mem= waits where the leader placed it, for its memory: never asked back.
        let mut s = Spread::new(vec![1, 1]);
        let mut t = tasks(&[1, 1, 1, 1]);
        t[3].shape.mem_mb = 100;
        s.assign(t);
        for (i, id) in [(0, 1), (1, 2), (0, 3)] {
            s.left_queue(i, id, 0);
        }
        s.finished(0, 2);
        assert_eq!(s.stuck(9 * T), None, "4 waits behind 2 for its memory");
        // A spawner with a free slot and a queue starts it itself: nothing is asked.
        let mut s = Spread::new(vec![2, 1]);
        s.assign(tasks(&[1, 1, 1]));
        s.left_queue(0, 1, 0);
        assert_eq!(s.stuck(9 * T), None);
    }

    fn lens(parts: &(Vec<Vec<TaskToRun>>, Vec<TaskToRun>)) -> (Vec<usize>, usize) {
        (parts.0.iter().map(Vec::len).collect(), parts.1.len())
    }

    #[test]
    fn a_wide_task_borrows_loops_which_drain_first_and_come_back_when_it_is_done() {
        // 4 CPUs: loops 0-3, the wide spawner 4.
        let mut s = Spread::with_wide(4);
        assert_eq!(lens(&s.assign(tasks(&[1, 1, 1, 1, 1]))), (vec![2, 1, 1, 1, 0], 0));
        assert!(s.gate_open(), "nothing lent");
        // A 2-core task borrows loops 0 and 1, which still hold tasks: it waits for them.
        let mut wide = tasks(&[1, 1, 1, 1, 1, 2]);
        wide.drain(..5);
        let out = s.assign(wide);
        assert_eq!(ids(&out.0[4]), vec![6]);
        assert!(!s.gate_open(), "loops 0 and 1 still hold tasks");
        // Narrow tasks go to loops 2 and 3 only.
        assert_eq!(lens(&s.assign(tasks(&[1, 1]))), (vec![0, 0, 1, 1, 0], 0));
        s.finished(0, 2);
        assert!(!s.gate_open());
        s.finished(1, 1);
        assert!(s.gate_open(), "lent loops empty: the wide task may start");
        // It ends: loops 0 and 1 take tasks again.
        s.finished(4, 1);
        s.wide_ended(6);
        assert_eq!(lens(&s.assign(tasks(&[1, 1]))), (vec![1, 1, 0, 0, 0], 0));
    }

    #[test]
    fn while_every_loop_is_lent_narrow_tasks_wait_for_one() {
        let mut s = Spread::with_wide(2);
        assert_eq!(lens(&s.assign(tasks(&[2, 1, 3]))), (vec![0, 0, 2], 1), "the 3-core one fails there");
        assert!(s.lent_out());
        // Lent loops only grow while it holds anything: slots given first-fit stay below.
        s.wide_ended(1);
        assert_eq!(lens(&s.assign(tasks(&[1]))), (vec![0, 0, 0], 1));
        s.wide_ended(3);
        assert!(!s.lent_out());
        assert_eq!(lens(&s.assign(tasks(&[1]))), (vec![1, 0, 0], 0));
        // A reset gives everything back.
        s.assign(tasks(&[2]));
        s.emptied(2);
        assert!(s.gate_open());
        assert_eq!(lens(&s.assign(tasks(&[1]))), (vec![0, 1, 0], 0));
    }

    #[test]
    fn finishing_more_than_held_does_not_underflow() {
        let mut s = Spread::new(vec![1]);
        s.finished(0, 3);
        s.finished(9, 1);
        assert_eq!(s.assign(tasks(&[1])).0.len(), 1);
    }
}
