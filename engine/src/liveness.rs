//! How the job tells a live peer from a dead, hung (SIGSTOP) or cut-off one, without trusting
//! TCP to notice (a dead peer's connection can stay open for minutes). Every link carries a frame
//! at least every `heartbeat` in both directions (agents report, parents acknowledge; an Ack that
//! acknowledges nothing new is the heartbeat), except that a busy agent with many peers reports
//! once per report gap, up to two heartbeats (`pace`): still twenty times per bound; the
//! leader then speaks to it at that pace too, its acks counting (`beat_every_us`), still twice
//! within `hold`. A parent that hears nothing from a child for `lost_after` declares it lost and
//! re-dispatches its tasks. A child that hears nothing from its parent for `hold` (a few
//! heartbeats) starts nothing more from its queue until it does, and for `lease` (half of
//! `lost_after`) stops its tasks and leaves (fencing): so that a task runs at both the lost agent
//! and the one that re-runs it only if it was running at the fault (or started within `hold` of
//! it).

use std::time::Duration;

/// Default `lost_after`: the detection bound (the site file's `lost_after_s`).
pub const DEFAULT_LOST_AFTER: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Liveness {
    pub heartbeat_us: u64,
    /// A parent silent this long: the child starts nothing more until it hears again.
    pub hold_us: u64,
    /// A child silent this long is lost.
    pub lost_after_us: u64,
    /// A parent silent this long: the child fences itself.
    pub lease_us: u64,
}

impl Liveness {
    /// For a detection bound of `lost_after`: heartbeats 40 times as often (at most every
    /// second), a hold after four heartbeats missed, the lease at half the bound.
    pub fn new(lost_after: Duration) -> Liveness {
        let lost_after_us = (lost_after.as_micros() as u64).max(10_000);
        let heartbeat_us = (lost_after_us / 40).min(1_000_000);
        Liveness { heartbeat_us, hold_us: 4 * heartbeat_us, lost_after_us, lease_us: lost_after_us / 2 }
    }

    /// How often a parent with `reporters` children speaks to each at least, as each of them
    /// reports: every heartbeat, or every report gap when that is longer (`pace`).
    /// Still at least twice within `hold`.
    pub fn beat_every_us(&self, reporters: usize) -> u64 {
        crate::pace::gap_for(reporters, self.heartbeat_us).max(self.heartbeat_us)
    }
}

impl Default for Liveness {
    fn default() -> Liveness {
        Liveness::new(DEFAULT_LOST_AFTER)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_ends_before_the_parent_gives_up_and_heartbeats_come_well_within_both() {
        for secs in [1, 10, 60, 600] {
            let l = Liveness::new(Duration::from_secs(secs));
            assert!(l.lease_us < l.lost_after_us, "{l:?}");
            assert!(l.heartbeat_us * 2 < l.hold_us && l.hold_us < l.lease_us, "{l:?}");
        }
        let l = Liveness::default();
        assert_eq!((l.heartbeat_us, l.hold_us, l.lease_us), (250_000, 1_000_000, 5_000_000));
        for reporters in [1, 16, 1_000] {
            let every = l.beat_every_us(reporters);
            assert!(every >= l.heartbeat_us && 2 * every <= l.hold_us, "{reporters}: {every}");
        }
    }
}
