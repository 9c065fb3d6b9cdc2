//! Black holes: an agent that fails everything while the others succeed (a full /tmp, a broken
//! mount). Each agent keeps its failures in a row and the job's successes when they began; past
//! `BLACK_HOLE_STREAK` of both it is drained. Pure, one per agent; what draining does is the
//! core's (`results.rs`).

/// Failures in a row on one agent, while as many tasks succeed elsewhere, that make it a black
/// hole (drained).
pub const BLACK_HOLE_STREAK: usize = 8;

#[derive(Debug, Default)]
pub(super) struct Streak {
    /// Tasks that failed on the agent in a row since its last success.
    failed: Vec<u64>,
    /// The job's successes when the streak began.
    oks_before: u64,
}

impl Streak {
    pub(super) fn succeeded(&mut self) {
        self.failed.clear();
    }

    /// Task `id` failed on the agent, `oks` tasks of the job having succeeded so far.
    pub(super) fn failed(&mut self, id: u64, oks: u64) {
        if self.failed.is_empty() {
            self.oks_before = oks;
        }
        self.failed.push(id);
    }

    /// Whether the failures in a row, with as many successes elsewhere since they began (the
    /// job's `oks` now), make the agent a black hole rather than the tasks bad.
    pub(super) fn is_black_hole(&self, oks: u64) -> bool {
        self.failed.len() >= BLACK_HOLE_STREAK && oks - self.oks_before >= BLACK_HOLE_STREAK as u64
    }

    /// The tasks of the streak, which it forgets: they run again elsewhere.
    pub(super) fn take(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.failed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_in_a_row_while_others_succeed_make_a_black_hole() {
        let mut s = Streak::default();
        for id in 0..BLACK_HOLE_STREAK as u64 {
            s.failed(id, 100 + id);
        }
        assert!(!s.is_black_hole(100 + BLACK_HOLE_STREAK as u64 - 1), "the others succeeded only 7 times meanwhile");
        assert!(s.is_black_hole(100 + BLACK_HOLE_STREAK as u64));
        assert_eq!(s.take().len(), BLACK_HOLE_STREAK);
        assert!(!s.is_black_hole(1_000), "taken: a new streak begins");
    }

    #[test]
    fn a_success_ends_the_streak_and_failing_tasks_alone_make_none() {
        let mut s = Streak::default();
        for id in 0..20 {
            s.failed(id, 5);
        }
        assert!(!s.is_black_hole(5), "nothing succeeded anywhere: the tasks fail, not the agent");
        s.succeeded();
        s.failed(21, 50);
        assert!(!s.is_black_hole(1_000), "one failure since its last success");
    }
}
