//! Tasks that arrive while a run runs (an open run's adds, and tasks whose dependencies were
//! just met) beside the plan of the tasks it started with. The file's tasks are partitioned
//! ahead (HFlow); an arrival is no instance's: whoever asks next gets it, highest priority
//! first, then in the order they came, so a ready task waits for no particular agent and costs
//! nothing per agent.
//!
//! An instance takes its own share of the plan first, then arrivals, and steals from another's
//! share only when there are none: an arrival is work no instance was promised.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use crate::partition::{Block, Partition};

pub struct Arrivals<'a> {
    plan: Box<dyn Partition + 'a>,
    /// Highest priority first, then the lowest id.
    queue: BinaryHeap<(i16, Reverse<u64>)>,
    /// Arrivals waiting, per priority (for `top_priority`).
    by_priority: BTreeMap<i16, u64>,
}

impl<'a> Arrivals<'a> {
    pub fn new(plan: Box<dyn Partition + 'a>) -> Self {
        Arrivals { plan, queue: BinaryHeap::new(), by_priority: BTreeMap::new() }
    }

    /// Task `id`, of `priority=`, may run now.
    pub fn push(&mut self, id: u64, priority: i16) {
        self.queue.push((priority, Reverse(id)));
        *self.by_priority.entry(priority).or_default() += 1;
    }

    /// Arrivals not handed out yet.
    pub fn waiting(&self) -> u64 {
        self.queue.len() as u64
    }

    fn pop(&mut self, max: u64) -> Vec<u64> {
        let mut ids = Vec::with_capacity(max.min(self.queue.len() as u64) as usize);
        while ids.len() < max as usize {
            let Some((p, Reverse(id))) = self.queue.pop() else { break };
            let n = self.by_priority.get_mut(&p).expect("counted when pushed");
            *n -= 1;
            if *n == 0 {
                self.by_priority.remove(&p);
            }
            ids.push(id);
        }
        ids
    }
}

impl Partition for Arrivals<'_> {
    fn take(&mut self, instance: usize, max: u64, steal: u64) -> Option<Block> {
        if let Some(own) = self.plan.take(instance, max, 0) {
            return Some(own);
        }
        if !self.queue.is_empty() && max > 0 {
            return Some(Block::Ids(self.pop(max)));
        }
        self.plan.take(instance, max, steal)
    }

    fn remaining(&self) -> u64 {
        self.plan.remaining() + self.waiting()
    }

    fn top_priority(&self) -> Option<(i16, u64)> {
        let mine = self.by_priority.last_key_value().map(|(&p, &n)| (p, n));
        match (self.plan.top_priority(), mine) {
            (Some((a, n)), Some((b, m))) if a == b => Some((a, n + m)),
            (Some(x), Some(y)) => Some(x.max(y)),
            (x, y) => x.or(y),
        }
    }

    fn observe(&mut self, class: u16, hint_ms: u32, ran_ms: u64) {
        self.plan.observe(class, hint_ms, ran_ms);
    }

    fn replan(&mut self, weights: &[f64]) {
        self.plan.replan(weights);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::Even;

    fn ids(b: Option<Block>) -> Vec<u64> {
        match b {
            Some(Block::Range(r)) => r.collect(),
            Some(Block::Ids(v)) => v,
            None => Vec::new(),
        }
    }

    #[test]
    fn an_instance_takes_its_own_share_then_arrivals_then_steals() {
        let mut a = Arrivals::new(Box::new(Even::new(0..8, 2)));
        a.push(20, 0);
        a.push(21, 0);
        assert_eq!(a.remaining(), 10);
        assert_eq!(ids(a.take(0, 4, 4)), [0, 1, 2, 3], "its own share first");
        assert_eq!(ids(a.take(0, 4, 4)), [20, 21], "then what arrived, before stealing");
        assert_eq!(ids(a.take(0, 2, 2)), [6, 7], "then the back of the other's share");
        assert_eq!(ids(a.take(1, 9, 9)), [4, 5]);
        assert_eq!((a.take(1, 9, 9), a.remaining()), (None, 0));
    }

    #[test]
    fn arrivals_go_highest_priority_first_then_in_order() {
        let mut a = Arrivals::new(Box::new(Even::new(0..0, 1)));
        for (id, p) in [(5, 0), (3, 2), (9, 2), (4, -1), (7, 0)] {
            a.push(id, p);
        }
        assert_eq!(a.top_priority(), Some((2, 2)));
        assert_eq!(ids(a.take(0, 3, 0)), [3, 9, 5]);
        assert_eq!(a.top_priority(), Some((0, 1)));
        assert_eq!(ids(a.take(0, 9, 0)), [7, 4]);
        assert_eq!((a.top_priority(), a.waiting()), (None, 0));
    }
}
