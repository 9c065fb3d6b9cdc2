//! What preemption knows: the preemptible tasks in flight, by priority; those told to stop, and
//! for which waiting task; how often each was stopped; and the stopped ones waiting to run again.
//! A part of the core's state of its own, knowing tasks only by id and priority. Its invariants:
//! `running` and `priority_of` name the same tasks, and a task being stopped is one of them
//! until it lands. Who is stopped, when, is the core's (`preempt.rs`).

use std::cmp::Reverse;
use std::collections::{BTreeSet, VecDeque};

use htc_core::idmap::{IdMap, IdSet};

/// How often one task may be stopped in a session: past it, it runs to its end (the work
/// waiting may need another agent than the one it is on, and it must not be stopped for ever).
pub const MAX_PREEMPTIONS: u8 = 3;

#[derive(Default)]
pub(super) struct Preemption {
    /// Preemptible tasks in flight, lowest priority and then newest first: the first to stop.
    running: BTreeSet<(i16, Reverse<u64>)>,
    priority_of: IdMap<u64, i16>,
    stopping: IdSet<u64>,
    /// Tasks being stopped to make room for a task waiting for memory or GPUs: which one.
    stopped_for: IdMap<u64, u64>,
    /// How often the leader stopped each task in this session.
    times: IdMap<u64, u8>,
    /// Stopped tasks, to run again once no higher-priority work waits.
    again: VecDeque<u64>,
}

impl Preemption {
    /// A preemptible task of `priority` went out.
    pub(super) fn dispatched(&mut self, id: u64, priority: i16) {
        self.running.insert((priority, Reverse(id)));
        self.priority_of.insert(id, priority);
    }

    /// Task `id` is back from its agent (ended, lost or taken back): nothing to stop any more.
    pub(super) fn landed(&mut self, id: u64) {
        if self.priority_of.is_empty() {
            return;
        }
        if let Some(p) = self.priority_of.remove(&id) {
            self.running.remove(&(p, Reverse(id)));
            self.stopping.remove(&id);
            self.stopped_for.remove(&id);
        }
    }

    /// Whether some preemptible task in flight is not already being stopped.
    pub(super) fn any_to_stop(&self) -> bool {
        self.running.len() > self.stopping.len()
    }

    /// How many tasks are being stopped.
    pub(super) fn stopping(&self) -> usize {
        self.stopping.len()
    }

    /// The tasks that may be stopped for work of priority `above`: lower priority, lowest and
    /// newest first, not being stopped already, not stopped `MAX_PREEMPTIONS` times.
    pub(super) fn candidates(&self, above: i16) -> impl Iterator<Item = u64> + '_ {
        self.running
            .iter()
            .take_while(move |(q, _)| *q < above)
            .map(|(_, id)| id.0)
            .filter(|id| !self.stopping.contains(id) && self.times.get(id).is_none_or(|&k| k < MAX_PREEMPTIONS))
    }

    /// Task `id` is told to stop; `for_task`: to make room for that waiting task.
    pub(super) fn stop(&mut self, id: u64, for_task: Option<u64>) {
        self.stopping.insert(id);
        *self.times.entry(id).or_default() += 1;
        if let Some(w) = for_task {
            self.stopped_for.insert(id, w);
        }
    }

    /// The waiting task that task `id` is being stopped for, if any.
    pub(super) fn stopped_for(&self, id: u64) -> Option<u64> {
        self.stopped_for.get(&id).copied()
    }

    /// Task `id` ended preempted: it runs again later.
    pub(super) fn run_again_later(&mut self, id: u64) {
        self.again.push_back(id);
    }

    /// The oldest stopped task waiting to run again.
    pub(super) fn next_again(&self) -> Option<u64> {
        self.again.front().copied()
    }

    pub(super) fn take_next_again(&mut self) -> Option<u64> {
        self.again.pop_front()
    }

    /// Whether the task was stopped and waits to run again.
    pub(super) fn waits_again(&self, id: u64) -> bool {
        self.again.contains(&id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lowest_priority_and_newest_go_first_and_only_below_the_work_that_waits() {
        let mut p = Preemption::default();
        for (id, prio) in [(1, 0), (2, 0), (3, -5), (4, 7)] {
            p.dispatched(id, prio);
        }
        assert_eq!(p.candidates(5).collect::<Vec<_>>(), [3, 2, 1]);
        assert_eq!(p.candidates(0).collect::<Vec<_>>(), [3], "equal priority is not stopped");
        assert!(p.candidates(-5).next().is_none());
    }

    #[test]
    fn a_task_is_stopped_at_most_max_preemptions_times_and_once_at_a_time() {
        let mut p = Preemption::default();
        p.dispatched(1, 0);
        for _ in 0..MAX_PREEMPTIONS {
            assert_eq!(p.candidates(1).collect::<Vec<_>>(), [1]);
            p.stop(1, None);
            assert!(p.candidates(1).next().is_none(), "being stopped already");
            assert!(!p.any_to_stop());
            p.landed(1);
            p.run_again_later(1);
            assert_eq!(p.take_next_again(), Some(1));
            p.dispatched(1, 0);
        }
        assert!(p.candidates(1).next().is_none(), "stopped {MAX_PREEMPTIONS} times: it runs to its end");
        assert!(p.any_to_stop(), "still in flight, and preemptible");
    }

    #[test]
    fn landing_forgets_the_task_and_what_it_was_stopped_for() {
        let mut p = Preemption::default();
        p.dispatched(1, 0);
        p.dispatched(2, 0);
        p.stop(1, Some(9));
        assert_eq!((p.stopped_for(1), p.stopping()), (Some(9), 1));
        p.landed(1);
        assert_eq!((p.stopped_for(1), p.stopping()), (None, 0));
        assert_eq!(p.candidates(1).collect::<Vec<_>>(), [2]);
        p.landed(7); // never dispatched: nothing happens
        assert!(p.any_to_stop());
    }
}
