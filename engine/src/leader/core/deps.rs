//! Dependencies between tasks (`after=`, `afterany=`): which tasks wait, on how many others still,
//! and what a task's end makes ready or cancels. A task may name only tasks that exist already,
//! so no cycle can form. Its own invariants: a task waits (`is_waiting`) exactly while it has an
//! open count; every edge leads from a task that has not ended to one that waits; a task that
//! ended has no edges left.
//!
//! Memory is what a run of millions of waiting tasks pays for: a count and a first edge per task
//! id (4 bytes each, in vectors indexed by id, allocated only as far as the highest id that has
//! either; a run without dependencies pays nothing), and one 12-byte edge per dependency, in an
//! arena threaded by index and reused as edges fire.

pub use htc_core::after::Kind;
use htc_core::after::Needs;

/// How a named task stands when a dependency on it is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Not ended: the dependency waits for it.
    Open,
    Succeeded,
    /// Failed for good, or cancelled.
    Unsuccessful,
}

/// A task's dependencies as made (`Deps::add`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Added {
    /// Nothing to wait for: it may run.
    Ready,
    /// It waits for this many tasks.
    Waiting(u32),
    /// An `after=` dependency had failed already: the task is cancelled before it waits.
    Cancelled { because: u64 },
}

/// What ends released: tasks that may run now, and tasks cancelled, each with the dependency
/// that failed (for the reason: `dependency N failed`), in the order they were decided.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Released {
    pub ready: Vec<u64>,
    pub cancelled: Vec<(u64, u64)>,
}

const ANY: u64 = 1 << 63;
const NONE: u32 = u32::MAX;

/// A `u32` per task id, 0 for every id never set; as long as the highest id set.
#[derive(Debug, Default)]
struct PerId(Vec<u32>);

impl PerId {
    fn get(&self, id: u64) -> u32 {
        self.0.get(id as usize).copied().unwrap_or(0)
    }
    fn set(&mut self, id: u64, v: u32) {
        let i = id as usize;
        if i >= self.0.len() {
            if v == 0 {
                return;
            }
            self.0.resize(i + 1, 0);
        }
        self.0[i] = v;
    }
    fn take(&mut self, id: u64) -> u32 {
        let v = self.get(id);
        self.set(id, 0);
        v
    }
}

#[derive(Debug, Default)]
pub struct Deps {
    /// Per task: how many of its dependencies are still open (0: it waits for nothing).
    open: PerId,
    /// Per task: its first edge plus one (0: it has no dependents).
    first: PerId,
    /// The edges: the dependent (its kind in the top bit), and the next edge of the same task.
    dependent: Vec<u64>,
    next: Vec<u32>,
    /// Edges freed by ends, for reuse.
    free: Vec<u32>,
    waiting: usize,
}

impl Deps {
    /// Task `id` depends on `on`, the `i`th named task standing as `standing(i)` says now (by
    /// place, not id: a fan-in names a million, and nothing is looked up). Made once per task
    /// (when it is added, or again on a resume for the dependencies still open).
    pub fn add(&mut self, id: u64, on: &Needs, standing: impl Fn(usize) -> Standing) -> Added {
        let failed = |&(i, (_, k)): &(usize, (u64, Kind))| k == Kind::After && standing(i) == Standing::Unsuccessful;
        if let Some((_, (because, _))) = on.each().enumerate().find(failed) {
            return Added::Cancelled { because };
        }
        let mut n = 0;
        for (_, (d, kind)) in on.each().enumerate().filter(|&(i, _)| standing(i) == Standing::Open) {
            let dependent = if kind == Kind::AfterAny { id | ANY } else { id };
            let next = self.first.get(d).wrapping_sub(1);
            let e = self.new_edge(dependent, next);
            self.first.set(d, e + 1);
            n += 1;
        }
        if n == 0 {
            return Added::Ready;
        }
        self.open.set(id, n);
        self.waiting += 1;
        Added::Waiting(n)
    }

    fn new_edge(&mut self, dependent: u64, next: u32) -> u32 {
        match self.free.pop() {
            Some(i) => {
                (self.dependent[i as usize], self.next[i as usize]) = (dependent, next);
                i
            }
            None => {
                self.dependent.push(dependent);
                self.next.push(next);
                (self.dependent.len() - 1) as u32
            }
        }
    }

    /// Stops `id` waiting, if it did.
    fn unwait(&mut self, id: u64) {
        if self.open.take(id) > 0 {
            self.waiting -= 1;
        }
    }

    /// Task `id` ended: `ok` when it succeeded. Its dependents are released: those with nothing
    /// left to wait for are ready; those whose `after=` it failed are cancelled, and that is an
    /// unsuccessful end for their own dependents in turn.
    pub fn ended(&mut self, id: u64, ok: bool, out: &mut Released) {
        let mut todo = vec![(id, ok, id)];
        self.unwait(id);
        while let Some((id, ok, root)) = todo.pop() {
            let mut e = self.first.take(id).wrapping_sub(1);
            while e != NONE {
                let (dependent, next) = (self.dependent[e as usize], self.next[e as usize]);
                self.free.push(e);
                e = next;
                let (task, any) = (dependent & !ANY, dependent & ANY != 0);
                let left = self.open.get(task);
                if left == 0 {
                    continue; // cancelled already, by another of its dependencies
                }
                if !ok && !any {
                    self.unwait(task);
                    out.cancelled.push((task, root));
                    todo.push((task, false, root));
                } else if left == 1 {
                    self.unwait(task);
                    out.ready.push(task);
                } else {
                    self.open.set(task, left - 1);
                }
            }
        }
    }

    /// Task `id` was cancelled while it waited (by a user): it waits no more, and its own
    /// dependents are released as by an unsuccessful end. Its edges at the tasks it waited for
    /// stay until those end, and are skipped then.
    pub fn cancel(&mut self, id: u64, out: &mut Released) {
        self.ended(id, false, out);
    }

    /// Whether some task waits on `id`.
    pub fn has_dependents(&self, id: u64) -> bool {
        self.first.get(id) != 0
    }

    pub fn is_waiting(&self, id: u64) -> bool {
        self.open.get(id) > 0
    }

    /// Tasks waiting for others.
    pub fn waiting(&self) -> usize {
        self.waiting
    }

    /// Bytes held, for the memory budget (a waiting task's share of it).
    pub fn bytes(&self) -> usize {
        4 * (self.open.0.capacity() + self.first.0.capacity() + self.next.capacity() + self.free.capacity())
            + 8 * self.dependent.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn open(_: usize) -> Standing {
        Standing::Open
    }

    /// `on` as a task line's list.
    fn on(on: &[(u64, Kind)]) -> Needs {
        let mut n = Needs::default();
        for &(id, k) in on {
            n.push(id..=id, k);
        }
        n
    }

    fn ended(d: &mut Deps, id: u64, ok: bool) -> Released {
        let mut out = Released::default();
        d.ended(id, ok, &mut out);
        out
    }

    #[test]
    fn a_task_waits_for_each_open_dependency_and_is_ready_after_the_last() {
        let mut d = Deps::default();
        assert_eq!(d.add(3, &on(&[(1, Kind::After), (2, Kind::After)]), open), Added::Waiting(2));
        assert!(d.is_waiting(3));
        assert_eq!(ended(&mut d, 1, true), Released::default());
        assert_eq!(ended(&mut d, 2, true), Released { ready: vec![3], cancelled: vec![] });
        assert!(!d.is_waiting(3));
        assert_eq!(d.waiting(), 0);
    }

    #[test]
    fn what_has_ended_already_counts_as_its_end_says() {
        let mut d = Deps::default();
        let of = |id| HashMap::from([(1, Standing::Succeeded), (2, Standing::Unsuccessful)])[&id];
        let mut add = |id, list: &[(u64, Kind)]| d.add(id, &on(list), |i| of(list[i].0));
        assert_eq!(add(5, &[(1, Kind::After)]), Added::Ready);
        assert_eq!(add(6, &[(2, Kind::AfterAny)]), Added::Ready);
        assert_eq!(add(7, &[(1, Kind::After), (2, Kind::After)]), Added::Cancelled { because: 2 });
        assert_eq!(d.waiting(), 0);
    }

    #[test]
    fn a_failure_cancels_after_dependents_transitively_and_releases_afterany_ones() {
        let mut d = Deps::default();
        d.add(2, &on(&[(1, Kind::After)]), open);
        d.add(3, &on(&[(2, Kind::After)]), open);
        d.add(4, &on(&[(2, Kind::AfterAny)]), open);
        d.add(5, &on(&[(1, Kind::AfterAny)]), open);
        let out = ended(&mut d, 1, false);
        assert_eq!(out.ready, vec![5, 4], "5 waited for 1's end; 4 for 2's, cancelled");
        assert_eq!(out.cancelled, vec![(2, 1), (3, 1)], "each names the failure that began it");
        assert_eq!(d.waiting(), 0);
    }

    #[test]
    fn a_task_cancelled_twice_over_is_said_once() {
        let mut d = Deps::default();
        d.add(3, &on(&[(1, Kind::After), (2, Kind::After)]), open);
        assert_eq!(ended(&mut d, 1, false).cancelled, vec![(3, 1)]);
        assert_eq!(ended(&mut d, 2, false), Released::default());
    }

    #[test]
    fn a_task_cancelled_through_two_paths_at_once_is_said_once() {
        let mut d = Deps::default();
        d.add(2, &on(&[(1, Kind::After)]), open);
        d.add(3, &on(&[(1, Kind::After), (2, Kind::After)]), open);
        assert_eq!(ended(&mut d, 1, false).cancelled, vec![(3, 1), (2, 1)]);
        assert_eq!(d.waiting(), 0);
    }

    #[test]
    fn a_cancelled_waiting_task_releases_its_dependents() {
        let mut d = Deps::default();
        d.add(2, &on(&[(1, Kind::After)]), open);
        d.add(3, &on(&[(2, Kind::After)]), open);
        d.add(4, &on(&[(2, Kind::AfterAny)]), open);
        let mut out = Released::default();
        d.cancel(2, &mut out);
        assert_eq!(out, Released { ready: vec![4], cancelled: vec![(3, 2)] });
        // 1's end finds its edge to 2 stale.
        assert_eq!(ended(&mut d, 1, true), Released::default());
    }

    #[test]
    fn a_chain_runs_one_by_one() {
        let mut d = Deps::default();
        for id in 1..1_000 {
            assert_eq!(d.add(id, &on(&[(id - 1, Kind::After)]), open), Added::Waiting(1));
        }
        for id in 0..999 {
            assert_eq!(ended(&mut d, id, true).ready, vec![id + 1]);
        }
        assert_eq!(d.waiting(), 0);
    }

    /// 1 → N → 1: every middle task waits for the first, the last for all of them; edges freed
    /// by the first's end are reused, and a waiting task costs well under 64 bytes.
    #[test]
    fn a_fan_out_and_in_costs_little_per_waiting_task() {
        let n = 100_000u64;
        let mut d = Deps::default();
        for id in 1..=n {
            d.add(id, &on(&[(0, Kind::After)]), open);
        }
        let mut all = Needs::default();
        all.push(1..=n, Kind::After);
        assert_eq!(d.add(n + 1, &all, open), Added::Waiting(n as u32));
        let per_task = d.bytes() as f64 / n as f64;
        assert!(per_task <= 64.0, "{per_task:.1} bytes per waiting task");
        assert_eq!(ended(&mut d, 0, true).ready.len(), n as usize);
        for id in 1..n {
            assert!(ended(&mut d, id, true).ready.is_empty());
        }
        assert_eq!(ended(&mut d, n, true).ready, vec![n + 1]);
        assert!(d.first.0.iter().chain(&d.open.0).all(|&v| v == 0));
    }
}
