//! When a spawner hands what happened (tasks started, ended, recalled) to the agent's main
//! thread. Each hand-off wakes that thread: an eventfd write, a context switch and a turn of
//! its loop, which done for every `true` task was a fifth of the agent's CPU per task
//! (bench/RESULTS.md §20). So under load a spawner hands off at most once per `HOLD`, and
//! what happens meanwhile goes together; after a quiet spell, and whenever the agent has to act
//! (a queue ran dry, an answer it waits for), at once.

use std::time::{Duration, Instant};

/// The longest an event waits for company. The agent reports under load once per report gap
/// (100 ms or more), so this holds back no report; it lags only the agent's count of what
/// runs, whose queues hold far more than this much work. At a low rate nothing waits. 10 ms
/// rather than 5 halved the main thread's wake-ups at the default layout (its CPU 4.1 µs a
/// `true` task against 5.2, with `mem=` 4.8 against 6.2) with the leader's cost unchanged
/// (measured, bench/RESULTS.md in git's history).
pub const HOLD: Duration = Duration::from_millis(10);

/// What to do with events waiting to be handed off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    Now,
    At(Instant),
}

/// A spawner's hand-offs: the time of the last one.
#[derive(Debug, Default)]
pub struct Handoff {
    last: Option<Instant>,
}

impl Handoff {
    /// Events wait (`urgent`: the agent must act on them soon): hand them off now, or when.
    pub fn when(&self, now: Instant, urgent: bool) -> When {
        match self.last {
            Some(t) if !urgent && now < t + HOLD => When::At(t + HOLD),
            _ => When::Now,
        }
    }

    /// The events went at `now`.
    pub fn handed(&mut self, now: Instant) {
        self.last = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_events_and_those_after_a_quiet_spell_go_at_once() {
        let t0 = Instant::now();
        let mut h = Handoff::default();
        assert_eq!(h.when(t0, false), When::Now);
        h.handed(t0);
        assert_eq!(h.when(t0 + HOLD, false), When::Now);
        assert_eq!(h.when(t0 + 10 * HOLD, false), When::Now);
    }

    #[test]
    fn under_load_events_wait_for_the_next_hold_unless_urgent() {
        let t0 = Instant::now();
        let mut h = Handoff::default();
        h.handed(t0);
        let soon = t0 + Duration::from_millis(1);
        assert_eq!(h.when(soon, false), When::At(t0 + HOLD));
        assert_eq!(h.when(t0 + HOLD - Duration::from_micros(1), false), When::At(t0 + HOLD));
        assert_eq!(h.when(soon, true), When::Now);
        // Never more than HOLD after the event, whenever it came.
        h.handed(soon);
        let late = soon + HOLD - Duration::from_micros(1);
        let When::At(at) = h.when(late, false) else { panic!("held") };
        assert!(at <= late + HOLD);
    }
}
