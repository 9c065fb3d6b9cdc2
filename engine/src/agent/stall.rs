//! An agent's own standing still: SIGSTOP, a whole job suspended by Slurm (`scontrol suspend`,
//! `PreemptMode=SUSPEND`), a frozen cgroup. Its driver feeds it an input at least every
//! `QUIET_EVERY` (50 ms) while it runs, so a gap of a hold between two inputs means the agent's
//! own loop did not run: its parent's silence in that time is no evidence that the parent is gone.
//!
//! Whether the parent stood still with it (a whole job suspended) or went on and gave it up (the
//! agent stopped alone) cannot be told from here; frames waiting in the socket may predate a
//! give-up. So an agent that stood still past its lease asks: it holds its queue, sends a report
//! with a sequence number of its own (a probe), and goes on only when an acknowledgement of that
//! report comes back: a parent that gave the agent up acknowledges nothing more. No answer within
//! `PROBE_HOLDS` holds, and the agent fences itself as a lease run out would.

/// How long an agent that stood still waits for its parent to answer its probe, in holds: time
/// for a parent that stood still too to read its sockets and commit (milliseconds when it runs).
pub const PROBE_HOLDS: u64 = 2;

/// The probe of an agent that stood still, until its parent answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    /// The report sequence number that the parent's acknowledgement must reach.
    pub seq: u64,
    /// When the agent fences itself without an answer.
    pub until_us: u64,
    /// How long the agent stood still.
    pub stood_us: u64,
}

/// The last input's time, and the probe under way.
#[derive(Debug, Default)]
pub struct Stall {
    ran_us: Option<u64>,
    probe: Option<Probe>,
}

impl Stall {
    /// An input at `now_us`: how long the agent stood still before it, when that was at least
    /// `hold_us`.
    pub fn stood_still(&mut self, now_us: u64, hold_us: u64) -> Option<u64> {
        let gap = self.ran_us.map(|at| now_us.saturating_sub(at));
        self.ran_us = Some(now_us);
        gap.filter(|&g| g >= hold_us)
    }

    pub fn ask(&mut self, probe: Probe) {
        self.probe = Some(probe);
    }

    pub fn probe(&self) -> Option<Probe> {
        self.probe
    }

    /// The parent acknowledged reports up to `seq`: the probe it answers, if it does.
    pub fn answered(&mut self, seq: u64) -> Option<Probe> {
        self.probe.filter(|p| seq >= p.seq).inspect(|_| self.probe = None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_gap_of_a_hold_between_inputs_is_standing_still() {
        let mut s = Stall::default();
        assert_eq!(s.stood_still(5, 1_000), None, "the first input has nothing before it");
        assert_eq!(s.stood_still(55, 1_000), None);
        assert_eq!(s.stood_still(1_054, 1_000), None, "999 µs");
        assert_eq!(s.stood_still(2_054, 1_000), Some(1_000));
    }

    #[test]
    fn a_probe_is_answered_by_an_acknowledgement_that_reaches_its_report() {
        let mut s = Stall::default();
        s.ask(Probe { seq: 7, until_us: 10, stood_us: 3 });
        assert_eq!(s.answered(6), None, "an older acknowledgement answers nothing");
        assert!(s.probe().is_some());
        assert_eq!(s.answered(8).map(|p| p.seq), Some(7));
        assert_eq!(s.probe(), None);
        assert_eq!(s.answered(9), None, "answered once");
    }
}
