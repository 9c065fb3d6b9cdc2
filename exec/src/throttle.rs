//! Logging a recurring condition once per interval instead of once per occurrence: a process out
//! of descriptors fails every accept and every pidfd, and one line per failure would flood the
//! log (and the disk) at the moment resources are scarce.

use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct Throttle {
    every: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl Throttle {
    pub const fn new(every: Duration) -> Throttle {
        Throttle { every, last: None, suppressed: 0 }
    }

    /// Some(occurrences not logged since the last line) when this one should be logged.
    pub fn allow(&mut self, now: Instant) -> Option<u64> {
        if self.last.is_some_and(|t| now.duration_since(t) < self.every) {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn once_per_interval_with_the_count_of_what_was_left_out() {
        let mut t = Throttle::new(Duration::from_secs(60));
        let t0 = Instant::now();
        assert_eq!(t.allow(t0), Some(0));
        assert_eq!(t.allow(t0 + Duration::from_secs(1)), None);
        assert_eq!(t.allow(t0 + Duration::from_secs(59)), None);
        assert_eq!(t.allow(t0 + Duration::from_secs(60)), Some(2));
        assert_eq!(t.allow(t0 + Duration::from_secs(61)), None);
    }
}
