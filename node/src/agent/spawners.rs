//! Several executors (spawn loops) in one agent, each with its own thread, slots and CPUs: one
//! loop per CPU keeps tiny tasks flowing (bench/RESULTS.md §1), while the leader still sees one
//! agent and one report stream per node. `Spread` decides which spawner runs each task; it is
//! pure, and the driver feeds it what it sends and what ends.

use htc_exec::executor::TaskToRun;

/// Tasks held by each spawner, against its slots.
#[derive(Debug, Clone)]
pub struct Spread {
    slots: Vec<usize>,
    held: Vec<usize>,
}

impl Spread {
    pub fn new(slots: Vec<usize>) -> Spread {
        let held = vec![0; slots.len()];
        Spread { slots, held }
    }

    /// Splits `tasks` among the spawners, each to the one with the fewest held per slot among
    /// those wide enough for it (ties: the lowest index); a task wider than every spawner goes
    /// to the widest, whose executor reports it unschedulable. Returns one list per spawner.
    pub fn assign(&mut self, tasks: Vec<TaskToRun>) -> Vec<Vec<TaskToRun>> {
        let mut out: Vec<Vec<TaskToRun>> = vec![Vec::new(); self.slots.len()];
        for t in tasks {
            let i = self.pick(t.shape.cores.max(1) as usize);
            self.held[i] += 1;
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

    /// Spawner `i` dropped everything it held (a reset).
    pub fn emptied(&mut self, i: usize) {
        if let Some(h) = self.held.get_mut(i) {
            *h = 0;
        }
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
    fn finishing_more_than_held_does_not_underflow() {
        let mut s = Spread::new(vec![1]);
        s.finished(0, 3);
        s.finished(9, 1);
        assert_eq!(s.assign(tasks(&[1])).len(), 1);
    }
}
