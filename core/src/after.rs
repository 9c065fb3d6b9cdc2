//! What a task waits for: `after=` (these tasks succeeded) and `afterany=` (these tasks ended,
//! however), each a list of task ids and ranges separated by `:` as in Slurm's `--dependency`
//! (`after=3`, `after=1-1000:2000`). A task may name only tasks before it, so no cycle can form.
//! Ranges stay ranges until the leader makes the edges: a fan-in of a million costs a line.

use std::ops::RangeInclusive;

/// What a dependency waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `after=`: the task succeeded. Should it fail for good (or be cancelled), the dependent is
    /// cancelled.
    After,
    /// `afterany=`: the task ended, however.
    AfterAny,
}

impl Kind {
    pub fn option(self) -> &'static str {
        match self {
            Kind::After => "after",
            Kind::AfterAny => "afterany",
        }
    }
}

/// Tasks a task waits for, as written: ranges of ids with their kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Needs(Vec<(RangeInclusive<u64>, Kind)>);

/// The most ids one task may wait for: its edges are the leader's memory.
pub const MAX_NEEDS: u64 = 10_000_000;
/// The most ranges: what a task waits for is stored as one value (17 bytes a range).
pub const MAX_RANGES: usize = 50_000;

impl Needs {
    /// Waiting for nothing.
    pub const EMPTY: Needs = Needs(Vec::new());

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Ids named, ranges counted whole.
    pub fn count(&self) -> u64 {
        self.0.iter().map(|(r, _)| r.end() - r.start() + 1).sum()
    }

    /// Every id with its kind, in the order written.
    pub fn each(&self) -> impl Iterator<Item = (u64, Kind)> + '_ {
        self.0.iter().flat_map(|(r, k)| r.clone().map(move |id| (id, *k)))
    }

    pub fn ranges(&self) -> &[(RangeInclusive<u64>, Kind)] {
        &self.0
    }

    /// Adds `ids`, joined to the last range when they follow it with the same kind.
    pub fn push(&mut self, ids: RangeInclusive<u64>, kind: Kind) {
        if let Some((last, k)) = self.0.last_mut() {
            if *k == kind && last.end().checked_add(1) == Some(*ids.start()) {
                *last = *last.start()..=*ids.end();
                return;
            }
        }
        self.0.push((ids, kind));
    }

    /// Adds the ids of one option's value (`3`, `1-1000:2000`) for a task that may name ids from
    /// 1 to `last`; the reason when the value is not such a list.
    pub fn parse(&mut self, value: &str, kind: Kind, last: u64) -> Result<(), String> {
        if value.is_empty() {
            return Err("a list of earlier task ids like 3 or 1-100:205".into());
        }
        let mut added = Needs::default();
        for part in value.split(':') {
            let (a, b) = part.split_once('-').unwrap_or((part, part));
            let (Some(a), Some(b)) = (number(a), number(b)) else {
                return Err(format!("{part:?} is not a task id or a range of them like 1-100"));
            };
            if a == 0 || a > b {
                return Err(format!("{part:?} is not a range of task ids (they count from 1)"));
            }
            if b > last {
                return Err(match last {
                    0 => "the first task can wait for no other".to_string(),
                    _ => format!("task {b} is not before this one (a task waits only for earlier ones, up to {last})"),
                });
            }
            added.push(a..=b, kind);
        }
        if self.count() + added.count() > MAX_NEEDS {
            return Err(format!("more than {MAX_NEEDS} tasks to wait for"));
        }
        if self.0.len() + added.0.len() > MAX_RANGES {
            return Err(format!("more than {MAX_RANGES} ids and ranges to wait for (write runs of ids as ranges)"));
        }
        for (r, k) in added.0 {
            self.push(r, k);
        }
        Ok(())
    }
}

fn number(s: &str) -> Option<u64> {
    (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse().ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_ranges_of_earlier_tasks_are_read_as_written() {
        let mut n = Needs::default();
        n.parse("3", Kind::After, 10).unwrap();
        n.parse("1-2:7", Kind::AfterAny, 10).unwrap();
        assert_eq!(n.count(), 4);
        n.parse("8:9-10", Kind::AfterAny, 10).unwrap();
        assert_eq!(n.ranges().last(), Some(&(7..=10, Kind::AfterAny)), "runs of ids join into one range");
        let each: Vec<_> = n.each().take(4).collect();
        assert_eq!(each, [(3, Kind::After), (1, Kind::AfterAny), (2, Kind::AfterAny), (7, Kind::AfterAny)]);
    }

    #[test]
    fn a_task_may_wait_only_for_tasks_before_it() {
        let mut n = Needs::default();
        assert!(n.parse("5", Kind::After, 4).unwrap_err().contains("not before this one"));
        assert!(n.parse("1", Kind::After, 0).unwrap_err().contains("first task"));
        for bad in ["", "0", "x", "3-1", "1:", "-2", "1-", "1--2", "+1"] {
            assert!(n.parse(bad, Kind::After, 9).is_err(), "{bad:?}");
        }
        assert!(n.is_empty(), "a refused value adds nothing");
        assert!(n.parse("1-10000001", Kind::After, u64::MAX).unwrap_err().contains("more than"));
    }
}
