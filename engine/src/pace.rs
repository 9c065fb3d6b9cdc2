//! When an agent (or an instance head) reports, and how much work it keeps queued so that its
//! reporting pace never leaves a slot waiting.
//!
//! Every report costs the leader a wakeup, a read, a ledger write and an ack, whatever it
//! carries: the leader's cost per task is mostly its cost per report divided by the results in
//! one (a mostly idle leader pays 100-200 µs a report in wakeups and cold caches; bench/RESULTS.md
//! §14). So reports go out by count and age, with a leading edge: news goes up at once when the
//! last report left at least `gap` ago (a lone result at a low rate reaches the leader without
//! waiting), and otherwise waits until `gap` has passed since the last one, unless it is urgent
//! (a full batch, a slot newly with nothing to start, work about to run out, a recall answered).
//! Under load a report so carries `gap` worth of results, and the parent hears from each
//! reporter at most once per `gap`.
//!
//! The gap grows with the reporters a parent has (`gap_for`), so that the leader handles about
//! `1 s / PER_REPORTER_US` reports a second under load however many instances there are, up to
//! two heartbeats (a report is a heartbeat too: a reporter whose gap is longer than the
//! heartbeat beats at its gap, still twenty times within the bound on silent agents).
//!
//! Reporters to the leader keep to windows of the shared clock (`Pace::align`): under load each
//! reports once per window, at its start, so the leader's reports come together and it pays
//! its wakeups and its commit once for all of them, not once per reporter (16 one-slot agents
//! reporting each at its own moment cost it 100-200 µs a report). A head's members are not
//! aligned: what they say waits at the head for its own window anyway.
//!
//! The queue must then last a gap and a round trip: the target grows with the rate at which
//! tasks finish here, measured over windows of `RATE_WINDOW_US`.

/// The least time between two reports under load, with few reporters.
pub const REPORT_GAP_US: u64 = 100_000;
/// The gap per reporter beside this one at its parent.
const PER_REPORTER_US: u64 = 25_000;
/// Results that make a report urgent whatever its age.
pub const REPORT_BATCH: usize = 512;
/// What a dispatch takes to arrive after the report that asked for it, allowed for in the
/// queue's size: the leader's commit interval and the network, with room to spare.
const ROUND_TRIP_US: u64 = 20_000;
const RATE_WINDOW_US: u64 = 200_000;
const RATE_RISE_US: u64 = 10_000;
/// A queue longer than this gains nothing (a full batch goes at once anyway) and holds back
/// work that idle slots elsewhere could use.
const MAX_TARGET: u64 = 2 * REPORT_BATCH as u64;

#[derive(Debug, Clone)]
pub struct Pace {
    gap_us: u64,
    /// The queue's least target, from the slots alone (`queue_target`).
    base: u64,
    last_up_us: Option<u64>,
    /// When the last report that was more than a heartbeat went up: the gap is counted from
    /// it, so a heartbeat in between does not hold back a lone result at a low rate.
    last_news_us: Option<u64>,
    /// What turns the caller's clock into the shared one (wall-clock µs), when aligned.
    phase_us: Option<u64>,
    window_start_us: u64,
    window_done: u64,
    /// Tasks finished per second here: the last full window's, or more as soon as the current
    /// one shows more.
    rate: f64,
    /// Queues this pace's target fills: 2 for an instance head, whose queue feeds its members'
    /// own (each paced as well).
    levels: u64,
}

/// The gap for one of `reporters` that report to one parent, heartbeats every `heartbeat_us`
/// (16 one-slot agents reporting every heartbeat cost the leader 2.2-2.3 µs per task here, at
/// 400 ms 1.85-2.0: bench/RESULTS.md §14).
pub fn gap_for(reporters: usize, heartbeat_us: u64) -> u64 {
    (reporters as u64 * PER_REPORTER_US).max(REPORT_GAP_US).min(2 * heartbeat_us)
}

/// How many report to the parent of `agent`, itself included: the instance heads (to the
/// leader, directly or through relays, which fold nothing), or the head's other members.
pub fn reporters(tree: &htc_core::tree::Tree, agent: u32) -> usize {
    let head = tree.head(agent);
    if head == agent {
        tree.heads().len()
    } else {
        tree.instance_len(head).saturating_sub(1)
    }
}

impl Pace {
    pub fn new(base: u64, gap_us: u64) -> Pace {
        Pace {
            gap_us,
            base,
            last_up_us: None,
            last_news_us: None,
            phase_us: None,
            window_start_us: 0,
            window_done: 0,
            rate: 0.0,
            levels: 1,
        }
    }

    /// An instance head's: its queue feeds members that keep their own.
    pub fn for_head(mut self) -> Pace {
        self.levels = 2;
        self
    }

    /// Reports under load go at the start of the windows of a clock shared with the other
    /// reporters to the same parent: the caller's `now_us + phase_us`.
    pub fn align(&mut self, phase_us: u64) {
        self.phase_us = Some(phase_us);
    }

    /// The least time between reports under load.
    pub fn set_gap(&mut self, gap_us: u64) {
        self.gap_us = gap_us;
    }

    /// The least target, as members come and go.
    pub fn set_base(&mut self, base: u64) {
        self.base = base;
    }

    /// Whether a report is due now: urgent news goes at once, other news once the gap since the
    /// last report has passed (at once, after a quiet spell), or when aligned, once a window
    /// has begun since the last report.
    pub fn due(&self, now_us: u64, news: bool, urgent: bool) -> bool {
        let waited = |t: u64| match self.phase_us {
            Some(p) if self.gap_us > 0 => (now_us + p) / self.gap_us > (t + p) / self.gap_us,
            _ => now_us.saturating_sub(t) >= self.gap_us,
        };
        urgent || (news && self.last_news_us.is_none_or(waited))
    }

    /// The earliest time at which news that is not urgent is due (`due`): the carrier wakes then
    /// rather than looking every few milliseconds while a report waits for the gap.
    pub fn due_at(&self) -> u64 {
        let Some(t) = self.last_news_us else { return 0 };
        match self.phase_us {
            Some(p) if self.gap_us > 0 => ((t + p) / self.gap_us + 1) * self.gap_us - p,
            _ => t + self.gap_us,
        }
    }

    /// Whether a heartbeat is due: nothing went up for a heartbeat, or for the gap when that is
    /// longer (a report is a heartbeat too).
    pub fn beat_due(&self, now_us: u64, heartbeat_us: u64) -> bool {
        now_us.saturating_sub(self.last_up_us()) >= heartbeat_us.max(self.gap_us)
    }

    /// A report went up: news, or only a heartbeat.
    pub fn sent(&mut self, now_us: u64, beat_only: bool) {
        self.last_up_us = Some(now_us);
        if !beat_only {
            self.last_news_us = Some(now_us);
        }
    }

    /// When the last report went up (0: none yet).
    pub fn last_up_us(&self) -> u64 {
        self.last_up_us.unwrap_or(0)
    }

    /// `n` tasks finished here at `now_us`.
    pub fn finished(&mut self, now_us: u64, n: u64) {
        let span = now_us.saturating_sub(self.window_start_us);
        if span >= RATE_WINDOW_US {
            // A window with nothing in it after a quiet spell says the rate is low, and it is.
            self.rate = self.window_done as f64 * 1e6 / span as f64;
            self.window_start_us = now_us;
            self.window_done = 0;
        }
        self.window_done += n;
        // A rate that rises shows within the window (the queue must grow before it runs dry);
        // one that falls, at the window's end.
        if span >= RATE_RISE_US {
            self.rate = self.rate.max(self.window_done as f64 * 1e6 / span as f64);
        }
    }

    /// Tasks to keep queued (received, not finished): enough for the slots, and at the rate
    /// measured, for four gaps and round trips, so that asking at three quarters of it (and
    /// the ask waiting up to a gap) leaves a quarter to cover the wait.
    pub fn target(&self) -> u64 {
        let need = self.rate * 4.0 * (self.gap_us + ROUND_TRIP_US) as f64 / 1e6;
        ((need.ceil() as u64).min(MAX_TARGET) * self.levels).max(self.base)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lone_result_goes_at_once_and_news_under_load_waits_for_the_gap() {
        let mut p = Pace::new(32, 20_000);
        assert!(p.due(1_000, true, false), "the first news goes at once");
        p.sent(1_000, false);
        assert!(!p.due(5_000, true, false), "4 ms later: waits");
        assert!(p.due(5_000, true, true), "unless urgent");
        assert!(!p.due(21_000, false, false), "nothing to say: no report");
        assert!(p.due(21_000, true, false), "a gap later: goes");
        p.sent(21_000, false);
        assert!(p.due(1_000_000, true, false), "after a quiet spell: at once again");
        // A heartbeat in between does not hold the next result back.
        p.sent(1_000_000, false);
        p.sent(1_200_000, true);
        assert!(p.due(1_210_000, true, false));
    }

    #[test]
    fn news_is_due_from_the_moment_due_at_names_not_before() {
        let mut plain = Pace::new(32, 20_000);
        assert_eq!(plain.due_at(), 0, "no news yet: at once");
        plain.sent(1_000, false);
        let mut aligned = Pace::new(32, 100_000);
        aligned.align(1_030_000);
        aligned.sent(5_000, false);
        for p in [&plain, &aligned] {
            let at = p.due_at();
            assert!(!p.due(at - 1, true, false) && p.due(at, true, false), "{p:?} due at {at}");
        }
        assert_eq!(aligned.due_at(), 70_000, "the shared clock's next window");
    }

    #[test]
    fn aligned_reporters_report_at_the_start_of_the_shared_clock_s_windows() {
        // Two reporters whose clocks started 30 ms apart: the same windows of the shared clock.
        let (mut a, mut b) = (Pace::new(32, 100_000), Pace::new(32, 100_000));
        a.align(1_000_000);
        b.align(1_030_000);
        a.sent(10_000, false); // shared 1,010,000
        b.sent(5_000, false); // shared 1,035,000
        assert!(!a.due(99_000, true, false), "shared 1,099,000: the window has not turned");
        assert!(a.due(100_000, true, false), "shared 1,100,000: it has");
        assert!(!b.due(69_000, true, false));
        assert!(b.due(70_000, true, false), "the same moment on the shared clock");
        // An urgent report mid-window does not move the next one off the windows' start.
        a.sent(130_000, false); // shared 1,130,000
        assert!(!a.due(199_000, true, false), "a gap after it, but the window has not turned");
        assert!(a.due(200_000, true, false), "shared 1,200,000");
    }

    #[test]
    fn the_gap_grows_with_the_reporters_up_to_two_heartbeats() {
        assert_eq!(gap_for(1, 250_000), REPORT_GAP_US);
        assert_eq!(gap_for(8, 250_000), 200_000);
        assert_eq!(gap_for(16, 250_000), 400_000);
        assert_eq!(gap_for(1_000, 250_000), 500_000);
        assert_eq!(gap_for(1, 25_000), 50_000, "short heartbeats bound it");
    }

    #[test]
    fn the_queue_target_follows_the_rate_and_keeps_the_slots_floor() {
        let mut p = Pace::new(32, 20_000);
        assert_eq!(p.target(), 32);
        // 4,000 tasks a second, in 5 ms batches of 20, for a second.
        for i in 1..=200 {
            p.finished(i * 5_000, 20);
        }
        // 4,000/s x 4 x 40 ms = 640.
        assert!((630..=650).contains(&p.target()), "target {}", p.target());
        // Quiet for a second: the next window says so.
        p.finished(2_000_000, 1);
        assert_eq!(p.target(), 32);
        // Far beyond what a queue needs: capped.
        let mut fast = Pace::new(32, 20_000);
        fast.finished(200_000, 1_000_000);
        fast.finished(400_000, 1);
        assert_eq!(fast.target(), MAX_TARGET);
    }
}
