//! Several executors (spawn loops) in one agent, each with its own thread, slots and CPUs: one
//! loop per CPU keeps tiny tasks flowing (bench/RESULTS.md §1), while the leader still sees one
//! agent and one report stream per node. `Spread` decides which spawner runs each task; it is
//! pure, and the driver feeds it what it sends and what ends.

use std::collections::VecDeque;

use htc_exec::executor::TaskToRun;

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
}

/// How long a spawner's slots must all have run the same tasks before what waits behind them
/// is asked back: short tasks start what they queue soon enough, and asking back costs a trip
/// to the leader.
pub const STUCK_AFTER_US: u64 = 5_000_000;

impl Spread {
    pub fn new(slots: Vec<usize>) -> Spread {
        let n = slots.len();
        Spread { slots, held: vec![0; n], unstarted: vec![VecDeque::new(); n], asked: Vec::new(), moved_us: vec![0; n] }
    }

    /// Splits `tasks` among the spawners, each to the one with the fewest held per slot among
    /// those wide enough for it (ties: the lowest index); a task wider than every spawner goes
    /// to the widest, whose executor reports it unschedulable. Returns one list per spawner.
    pub fn assign(&mut self, tasks: Vec<TaskToRun>) -> Vec<Vec<TaskToRun>> {
        let mut out: Vec<Vec<TaskToRun>> = vec![Vec::new(); self.slots.len()];
        for t in tasks {
            let i = self.pick(t.shape.cores.max(1) as usize);
            self.held[i] += 1;
            self.unstarted[i].push_back((t.id, t.shape.mem_mb == 0 && t.shape.gpus == 0));
            out[i].push(t);
        }
        out
    }

    /// `n` tasks of spawner `i` ended.
    pub fn finished(&mut self, i: usize, n: usize) {
        if let Some(h) = self.held.get_mut(i) {
            *h = h.saturating_sub(n);
        }
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
    }

    /// Tasks to ask back from a spawner whose slots have all run the same tasks for
    /// [`STUCK_AFTER_US`] while another has idle slots and nothing queued: (spawner, ids), its
    /// latest first, as many as the idle slots. Given back, they go up as recalled, and the
    /// leader hands them out again, to an idle slot.
    pub fn stuck(&mut self, now_us: u64) -> Option<(usize, Vec<u64>)> {
        let running = |i: usize| self.held[i] - self.unstarted[i].len().min(self.held[i]);
        let idle: usize = (0..self.slots.len())
            .filter(|&i| self.unstarted[i].is_empty())
            .map(|i| self.slots[i].saturating_sub(running(i)))
            .sum();
        if idle == 0 {
            return None;
        }
        let j = (0..self.slots.len()).find(|&j| {
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

    fn pick(&self, cores: usize) -> usize {
        let fits = (0..self.slots.len()).filter(|&i| self.slots[i] >= cores);
        // held / slots compared without division: a/b < c/d  <=>  a*d < c*b.
        let best = fits.min_by(|&a, &b| (self.held[a] * self.slots[b]).cmp(&(self.held[b] * self.slots[a])));
        best.unwrap_or_else(|| (0..self.slots.len()).max_by_key(|&i| (self.slots[i], usize::MAX - i)).unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use htc_core::shape::TaskShape;

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
        let out = s.assign(tasks(&[1, 1, 1, 1]));
        assert_eq!((ids(&out[0]), ids(&out[1])), (vec![1, 3], vec![2, 4]));
        // Spawner 1 finished both: the next two go to it first.
        s.finished(1, 2);
        let out = s.assign(tasks(&[1, 1, 1]));
        assert_eq!((out[0].len(), out[1].len()), (1, 2));
    }

    #[test]
    fn load_is_per_slot_and_wide_tasks_go_where_they_fit() {
        // 3 CPUs split 2 + 1: the two-slot spawner takes two of every three.
        let mut s = Spread::new(vec![2, 1]);
        let out = s.assign(tasks(&[1, 1, 1, 1, 1, 1]));
        assert_eq!((out[0].len(), out[1].len()), (4, 2));
        let out = s.assign(tasks(&[2, 2]));
        assert_eq!((out[0].len(), out[1].len()), (2, 0), "only spawner 0 has two cores");
        // Wider than all: the widest takes it (and its executor says unschedulable).
        let out = s.assign(tasks(&[5]));
        assert_eq!(out[0].len(), 1);
    }

    #[test]
    fn tasks_queued_behind_busy_slots_are_asked_back_for_an_idle_one() {
        const T: u64 = STUCK_AFTER_US;
        let mut s = Spread::new(vec![1, 1]);
        let out = s.assign(tasks(&[1, 1, 1, 1]));
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

    #[test]
    fn finishing_more_than_held_does_not_underflow() {
        let mut s = Spread::new(vec![1]);
        s.finished(0, 3);
        s.finished(9, 1);
        assert_eq!(s.assign(tasks(&[1])).len(), 1);
    }
}
