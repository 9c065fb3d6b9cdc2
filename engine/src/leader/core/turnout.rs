//! Who came: the agents the launchers started (instances, with a layout), those that joined,
//! those that never did, and the last loss. The run gives up when every one is gone, a loss bound
//! after the last went (one given up may come back). A part of the core's state of its own,
//! counting agents, not knowing them.

#[derive(Debug, Default)]
pub(super) struct Turnout {
    /// Agents the launchers started; the run fails when all of them are gone with work left.
    expected: usize,
    /// Agents that joined (or came from a hand-over), and those that ended before they could.
    seen: usize,
    never_joined: usize,
    /// When an agent was last lost, and why the last one lost unexpectedly went (with its id
    /// and host), for the final message.
    lost_at_us: u64,
    last_loss: Option<String>,
}

impl Turnout {
    pub(super) fn expecting(expected: usize) -> Turnout {
        Turnout { expected, ..Turnout::default() }
    }

    /// More agents to come: an allocation that joined, or a stray from a hand-over.
    pub(super) fn expect_more(&mut self, n: usize) {
        self.expected += n;
    }

    pub(super) fn expected(&self) -> usize {
        self.expected
    }

    pub(super) fn joined(&mut self) {
        self.seen += 1;
    }

    pub(super) fn never_joined(&mut self) {
        self.never_joined += 1;
    }

    /// An agent was lost at `now_us`; `why`, unless it left as told.
    pub(super) fn lost(&mut self, now_us: u64, why: Option<String>) {
        self.lost_at_us = now_us;
        if why.is_some() {
            self.last_loss = why;
        }
    }

    /// Why the last agent lost unexpectedly went.
    #[cfg(test)]
    pub(super) fn last_loss(&self) -> Option<&str> {
        self.last_loss.as_deref()
    }

    /// Every agent expected joined or is known never to.
    pub(super) fn all_accounted(&self) -> bool {
        self.seen + self.never_joined >= self.expected
    }

    /// Whether, with `alive` agents alive, every agent expected is gone (or never came).
    pub(super) fn all_gone(&self, alive: usize) -> bool {
        alive == 0 && (self.seen - alive) + self.never_joined >= self.expected.max(1)
    }

    /// Why the run gives up at `now_us`, with `alive` agents alive and `unfinished` tasks: every
    /// agent is gone, and the loss bound `bound_us` has passed since the last went.
    pub(super) fn given_up(&self, alive: usize, now_us: u64, bound_us: u64, unfinished: u64) -> Option<String> {
        let waited = now_us.saturating_sub(self.lost_at_us) >= bound_us;
        (self.all_gone(alive) && waited).then(|| {
            let last = self.last_loss.as_ref().map(|w| format!(" (the last: {w})")).unwrap_or_default();
            format!("all {} agents are gone with {unfinished} tasks unfinished{last}", self.expected)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_run_gives_up_a_loss_bound_after_the_last_of_its_agents_went() {
        let mut t = Turnout::expecting(2);
        t.joined();
        assert!(!t.all_accounted(), "one of two");
        t.never_joined();
        assert!(t.all_accounted());
        assert!(!t.all_gone(1));
        t.lost(1_000, Some("agent 0 on n1: connection closed".into()));
        assert_eq!(t.given_up(0, 1_999, 1_000, 5), None, "within the bound: it may come back");
        let why = t.given_up(0, 2_000, 1_000, 5).unwrap();
        assert_eq!(why, "all 2 agents are gone with 5 tasks unfinished (the last: agent 0 on n1: connection closed)");
    }

    #[test]
    fn agents_still_to_come_keep_the_run_going() {
        let mut t = Turnout::expecting(1);
        t.joined();
        t.expect_more(2);
        t.lost(0, None);
        assert!(!t.all_gone(0), "two agents of a joined allocation have not come yet");
        assert_eq!(t.given_up(0, 10_000, 1, 0), None);
        t.never_joined();
        t.never_joined();
        assert!(t.all_gone(0));
        assert_eq!(t.given_up(0, 10_000, 1, 0).unwrap(), "all 3 agents are gone with 0 tasks unfinished");
    }

    #[test]
    fn no_agent_expected_is_not_all_gone_before_one_is_seen() {
        let t = Turnout::expecting(0);
        assert!(!t.all_gone(0), "at least one must have gone");
    }
}
