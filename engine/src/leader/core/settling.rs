//! The wait of a leader that took the run over for the agents that kept their tasks
//! (`handover`): which heads have not said what they hold, how many agents of other allocations
//! are still expected, and until when it waits. A part of the core's state of its own: it knows
//! agents by their ids, nothing of the core.

use htc_core::idmap::IdSet;

#[derive(Debug)]
pub(super) struct Settling {
    /// Heads expected back that have not said what they hold yet.
    waiting: IdSet<u32>,
    /// Agents of other allocations still expected back (`strays`), however numbered.
    others: usize,
    until_us: u64,
    /// Tasks taken as in flight with the agents that came back.
    adopted: u64,
}

impl Settling {
    /// Waits for `heads`, and `others` agents of other allocations, until `until_us`.
    pub(super) fn new(heads: impl IntoIterator<Item = u32>, others: usize, until_us: u64) -> Settling {
        Settling { waiting: heads.into_iter().collect(), others, until_us, adopted: 0 }
    }

    pub(super) fn adopted_one(&mut self) {
        self.adopted += 1;
    }

    pub(super) fn adopted(&self) -> u64 {
        self.adopted
    }

    /// `agent` said what it holds: one of the heads, or else one of the others if a `stray`.
    pub(super) fn answered(&mut self, agent: u32, stray: bool) {
        if !self.waiting.remove(&agent) && stray {
            self.others = self.others.saturating_sub(1);
        }
    }

    /// Heads that are `gone` will not answer: the wait is not for them.
    pub(super) fn forget(&mut self, gone: impl Fn(u32) -> bool) {
        self.waiting.retain(|&a| !gone(a));
    }

    /// Whether the wait is over at `now_us`: everyone answered, or the time is up.
    pub(super) fn over(&self, now_us: u64) -> bool {
        self.missing() == 0 || now_us >= self.until_us
    }

    /// Those expected that have not answered.
    pub(super) fn missing(&self) -> usize {
        self.waiting.len() + self.others
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_ends_when_every_head_and_every_other_answered_or_the_time_is_up() {
        let mut s = Settling::new([0, 1], 1, 100);
        assert!(!s.over(0));
        s.answered(0, false);
        s.answered(7, true);
        assert_eq!(s.missing(), 1, "head 1 is still out");
        s.answered(1, false);
        assert!(s.over(0));
        assert!(Settling::new([0], 0, 100).over(100), "the time is up");
    }

    #[test]
    fn an_answer_counts_once_and_a_gone_head_is_not_waited_for() {
        let mut s = Settling::new([0, 1], 1, 100);
        s.answered(0, false);
        s.answered(0, false);
        assert_eq!(s.missing(), 2, "a second answer of head 0 is no stray's");
        s.answered(5, false);
        assert_eq!(s.missing(), 2, "an agent neither expected nor a stray changes nothing");
        s.forget(|a| a == 1);
        assert_eq!(s.missing(), 1);
        s.answered(9, true);
        s.answered(8, true);
        assert!(s.over(0), "strays beyond those expected do not go below none");
    }
}
