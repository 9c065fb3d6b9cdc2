//! Tasks that arrive while a run runs (an open run's adds, and tasks whose dependencies were
//! just met) beside the plan of the tasks it started with. The file's tasks are partitioned
//! ahead (HFlow); an arrival is no instance's: whoever asks next gets it, highest priority
//! first, then in the order they came, so a ready task waits for no particular agent and costs
//! nothing per agent.
//!
//! An instance takes its own share of the plan first, then arrivals, and steals from another's
//! share only when there are none: an arrival is work no instance was promised.

use std::collections::BTreeMap;

use crate::partition::{Block, Partition};

pub struct Arrivals<'a> {
    plan: Box<dyn Partition + 'a>,
    /// Per priority, the ids that may run, as ranges: a million released at once, or added in
    /// one request, are one entry, not 16 bytes each.
    queue: BTreeMap<i16, Ranges>,
    waiting: u64,
}

/// Ids as ranges that never touch (start → end, exclusive), and how many.
#[derive(Default)]
struct Ranges {
    by_start: BTreeMap<u64, u64>,
    len: u64,
}

impl Ranges {
    /// Adds `id`, joined to the ranges it touches; false if it was there already.
    fn insert(&mut self, id: u64) -> bool {
        let before = self.by_start.range(..=id).next_back().map(|(&s, &e)| (s, e));
        if before.is_some_and(|(_, e)| e > id) {
            return false;
        }
        let start = match before {
            Some((s, e)) if e == id => s,
            _ => id,
        };
        let end = self.by_start.remove(&(id + 1)).unwrap_or(id + 1);
        self.by_start.insert(start, end);
        self.len += 1;
        true
    }

    /// Up to `max` of the lowest ids, appended to `out`.
    fn pop(&mut self, max: u64, out: &mut Vec<std::ops::Range<u64>>) -> u64 {
        let mut taken = 0;
        while taken < max {
            let Some((s, e)) = self.by_start.pop_first() else { break };
            let n = (e - s).min(max - taken);
            out.push(s..s + n);
            if s + n < e {
                self.by_start.insert(s + n, e);
            }
            taken += n;
        }
        self.len -= taken;
        taken
    }
}

impl<'a> Arrivals<'a> {
    pub fn new(plan: Box<dyn Partition + 'a>) -> Self {
        Arrivals { plan, queue: BTreeMap::new(), waiting: 0 }
    }

    /// Task `id`, of `priority=`, may run now.
    pub fn push(&mut self, id: u64, priority: i16) {
        if self.queue.entry(priority).or_default().insert(id) {
            self.waiting += 1;
        }
    }

    /// Arrivals not handed out yet.
    pub fn waiting(&self) -> u64 {
        self.waiting
    }

    /// Up to `max` arrivals, highest priority first, then lowest id: one range when they are
    /// consecutive.
    fn pop(&mut self, max: u64) -> Block {
        let mut runs = Vec::new();
        let mut taken = 0;
        while taken < max {
            let Some(mut top) = self.queue.last_entry() else { break };
            taken += top.get_mut().pop(max - taken, &mut runs);
            if top.get().len == 0 {
                top.remove();
            }
        }
        self.waiting -= taken;
        match &runs[..] {
            [one] => Block::Range(one.clone()),
            _ => Block::Ids(runs.into_iter().flatten().collect()),
        }
    }
}

impl Partition for Arrivals<'_> {
    fn take(&mut self, instance: usize, max: u64, steal: u64) -> Option<Block> {
        if let Some(own) = self.plan.take(instance, max, 0) {
            return Some(own);
        }
        if self.waiting > 0 && max > 0 {
            return Some(self.pop(max));
        }
        self.plan.take(instance, max, steal)
    }

    fn remaining(&self) -> u64 {
        self.plan.remaining() + self.waiting()
    }

    fn top_priority(&self) -> Option<(i16, u64)> {
        let mine = self.queue.last_key_value().map(|(&p, ids)| (p, ids.len));
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
    fn consecutive_arrivals_are_one_range_in_whatever_order_they_came() {
        let mut a = Arrivals::new(Box::new(Even::new(0..0, 1)));
        for id in (10..20).rev().chain([5, 7, 6, 10]) {
            a.push(id, 0);
        }
        assert_eq!((a.waiting(), a.queue[&0].by_start.len()), (13, 2), "5-7 and 10-19; 10 once");
        assert!(matches!(a.take(0, 2, 0), Some(Block::Range(r)) if r == (5..7)));
        assert_eq!(ids(a.take(0, 4, 0)), [7, 10, 11, 12], "across two ranges");
        assert!(matches!(a.take(0, 100, 0), Some(Block::Range(r)) if r == (13..20)));
        assert_eq!((a.take(0, 1, 0), a.waiting()), (None, 0));
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
