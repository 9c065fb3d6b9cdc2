//! The agent's one clock. The machine counts µs since the agent started; the timer, the sweep of
//! leftovers and the executors' lease are all told in that count, turned into a tokio instant or
//! into the wall clock's µs here, and nowhere else.

use std::time::Duration;

use tokio::time::Instant;

pub(super) struct Clock {
    start: Instant,
    /// The steady clock's µs (`htc_host::steady_us`, the wall's as the process first read it)
    /// at `start`: the phase the heads' report windows keep to. The executors read that clock,
    /// so the lease told them in it holds however the wall clock is stepped.
    wall_at_start: u64,
}

impl Clock {
    pub(super) fn start() -> Clock {
        // In this order, the lease told in it never outlasts the executors' reading of it.
        let wall_at_start = htc_host::steady_us();
        Clock { start: Instant::now(), wall_at_start }
    }

    /// µs since the agent started: the machine's time.
    pub(super) fn now(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }

    /// The instant at the machine's `us`, for the timer.
    pub(super) fn instant(&self, us: u64) -> Instant {
        self.start + Duration::from_micros(us)
    }

    /// The steady clock's µs at the machine's `us`, for the executors (their lease).
    pub(super) fn wall(&self, us: u64) -> u64 {
        self.wall_at_start + us
    }

    pub(super) fn wall_at_start(&self) -> u64 {
        self.wall_at_start
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timer_and_the_wall_are_told_the_machines_time() {
        let c = Clock::start();
        std::thread::sleep(Duration::from_millis(2));
        let now = c.now();
        assert!(now >= 2_000);
        assert_eq!(c.instant(now) - c.instant(0), Duration::from_micros(now));
        assert_eq!(c.wall(now) - c.wall_at_start(), now);
        assert!(c.wall(now) <= htc_host::steady_us());
    }
}
