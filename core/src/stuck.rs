//! The stuck watch (`stuck=DURATION`): when a running task has sat idle long enough to be
//! called stuck. Fed samples of the task's counters (CPU time and bytes read and written, of
//! all its processes) at the times it asks for; no clock or /proc of its own, so every case is
//! a scripted test. Idle is what Snellius's zslurm calls it: under 0.05 of a core and at most
//! 4 KiB of I/O in an interval; stuck is idle in every interval for the whole duration.
//!
//! A task is first looked at one interval after it started (its counters start at zero), so
//! a task shorter than that costs the watch nothing but its creation.

/// Below this share of one core, in thousandths, an interval counts as idle.
pub const IDLE_CPU_PERMILLE: u64 = 50;
/// At most this many bytes read and written in an interval count as idle.
pub const IDLE_IO_BYTES: u64 = 4096;
/// Intervals per watch: how finely the duration is cut (bounded below by `MIN_EVERY_US`).
pub const INTERVALS: u64 = 20;
const MIN_EVERY_US: u64 = 1_000_000;
const MAX_EVERY_US: u64 = 60_000_000;

/// A task's counters at one moment, summed over its processes (live ones, and what the ended
/// ones left to their parents).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sample {
    pub cpu_us: u64,
    pub io_bytes: u64,
}

/// What a look found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Not stuck (yet): look again at `next_us`.
    Watching { next_us: u64 },
    /// Idle for this many seconds, at least its `stuck=`: stop it.
    Stuck { idle_s: u32 },
}

/// One running task's watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watch {
    stuck_us: u64,
    every_us: u64,
    last: Sample,
    last_us: u64,
    /// When the run of idle intervals it is in began.
    idle_since: Option<u64>,
    next_us: u64,
}

impl Watch {
    /// The watch of a task that started at `start_us` with `stuck=` of `stuck_s` seconds.
    pub fn new(start_us: u64, stuck_s: u32) -> Watch {
        let stuck_us = stuck_s.max(1) as u64 * 1_000_000;
        let every_us = (stuck_us / INTERVALS).clamp(MIN_EVERY_US, MAX_EVERY_US).min(stuck_us);
        Watch {
            stuck_us,
            every_us,
            last: Sample::default(),
            last_us: start_us,
            idle_since: None,
            next_us: start_us + every_us,
        }
    }

    /// When it wants its next sample.
    pub fn next_us(&self) -> u64 {
        self.next_us
    }

    /// The task's counters at `now_us` (None: they could not be read, which never counts as
    /// idle: a task is killed only for what was seen).
    pub fn sampled(&mut self, now_us: u64, s: Option<Sample>) -> Verdict {
        let elapsed = now_us.saturating_sub(self.last_us);
        self.next_us = now_us + self.every_us;
        let Some(s) = s else {
            // The interval unseen starts the count again; the next is judged from now.
            self.idle_since = None;
            self.last_us = now_us;
            return Verdict::Watching { next_us: self.next_us };
        };
        // Counters that went back (a process of it left for another parent took its share
        // along) show a change, not idleness.
        let idle = match (s.cpu_us.checked_sub(self.last.cpu_us), s.io_bytes.checked_sub(self.last.io_bytes)) {
            (Some(cpu), Some(io)) => {
                elapsed > 0
                    && cpu * 1000 < IDLE_CPU_PERMILLE * elapsed
                    && io as u128 * self.every_us as u128 <= IDLE_IO_BYTES as u128 * elapsed as u128
            }
            _ => false,
        };
        self.idle_since = if idle { self.idle_since.or(Some(self.last_us)) } else { None };
        (self.last, self.last_us) = (s, now_us);
        match self.idle_since {
            Some(since) if now_us - since >= self.stuck_us => {
                Verdict::Stuck { idle_s: ((now_us - since) / 1_000_000).min(u32::MAX as u64) as u32 }
            }
            _ => Verdict::Watching { next_us: self.next_us },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;

    fn at(cpu_ms: u64, io: u64) -> Option<Sample> {
        Some(Sample { cpu_us: cpu_ms * 1000, io_bytes: io })
    }

    #[test]
    fn a_task_that_sleeps_is_stuck_after_its_duration_and_not_before() {
        // stuck=60s: looked at every 3 s from 3 s after its start at 100 s.
        let mut w = Watch::new(100 * S, 60);
        assert_eq!(w.next_us(), 103 * S);
        let mut t = 103;
        loop {
            match w.sampled(t * S, at(2, 100)) {
                Verdict::Watching { next_us } => assert_eq!(next_us, (t + 3) * S),
                Verdict::Stuck { idle_s } => {
                    // Idle from its first interval, after a few ms of start-up CPU (2 ms in 3 s).
                    assert_eq!((t, idle_s), (160, 60));
                    break;
                }
            }
            assert!(t < 200, "never called stuck");
            t += 3;
        }
    }

    #[test]
    fn cpu_or_io_in_any_interval_starts_the_count_again() {
        let mut w = Watch::new(0, 10);
        assert_eq!(w.next_us(), S, "intervals of at least a second");
        let mut cpu = 0;
        let mut io = 0;
        for t in 1..=9 {
            assert!(matches!(w.sampled(t * S, at(cpu, io)), Verdict::Watching { .. }), "idle {t} s only");
        }
        // 60 ms of CPU in a second: past 0.05 of a core.
        cpu += 60;
        assert!(matches!(w.sampled(10 * S, at(cpu, io)), Verdict::Watching { .. }));
        for t in 11..=19 {
            assert!(matches!(w.sampled(t * S, at(cpu, io)), Verdict::Watching { .. }), "{t}");
        }
        // 40 ms is under it, but 5 KiB of output is I/O.
        cpu += 40;
        io += 5000;
        assert!(matches!(w.sampled(20 * S, at(cpu, io)), Verdict::Watching { .. }));
        for t in 21..30 {
            cpu += 40;
            io += 4096;
            assert!(matches!(w.sampled(t * S, at(cpu, io)), Verdict::Watching { .. }), "{t}: little is still idle");
        }
        assert_eq!(w.sampled(30 * S, at(cpu, io)), Verdict::Stuck { idle_s: 10 });
    }

    #[test]
    fn what_cannot_be_seen_or_went_back_is_never_idle() {
        let mut w = Watch::new(0, 2);
        assert_eq!(w.sampled(S, at(500, 0)), Verdict::Watching { next_us: 2 * S });
        assert_eq!(w.sampled(2 * S, None), Verdict::Watching { next_us: 3 * S }, "unreadable");
        assert_eq!(w.sampled(3 * S, at(500, 0)), Verdict::Watching { next_us: 4 * S });
        assert_eq!(w.sampled(4 * S, at(100, 0)), Verdict::Watching { next_us: 5 * S }, "went back");
        assert_eq!(w.sampled(5 * S, at(100, 0)), Verdict::Watching { next_us: 6 * S });
        assert_eq!(w.sampled(6 * S, at(100, 0)), Verdict::Stuck { idle_s: 2 });
    }

    #[test]
    fn a_late_look_judges_by_the_time_that_passed() {
        // Looked at 5 s late: 200 ms of CPU over 6 s is idle, 6 KiB over 6 s too (1 KiB a second).
        let mut w = Watch::new(0, 5);
        assert_eq!(w.sampled(6 * S, at(200, 6144)), Verdict::Stuck { idle_s: 6 });
        let mut w = Watch::new(0, 5);
        assert!(matches!(w.sampled(6 * S, at(400, 0)), Verdict::Watching { .. }), "0.067 of a core is not idle");
    }
}
