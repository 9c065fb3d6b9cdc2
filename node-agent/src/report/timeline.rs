//! Quantities over time in a fixed number of bins whose width doubles as the times seen spread
//! out, so one pass over attempts in any order (the ledger's id order is not time order) bins
//! them without knowing the run's span beforehand. Rebinning merges neighbour pairs: sums stay
//! exact, only the resolution halves.

/// Bins per series. The run covers at least a quarter of them when it grew one way, and most
/// often far more; the charts draw only the bins it covers.
pub const BINS: usize = 1024;

/// The shared time axis of several series (each a `Vec<f64>` of `BINS` sums).
#[derive(Debug, Clone, PartialEq)]
pub struct Axis {
    /// Start of bin 0, µs (below 0 once grown left of the epoch, as in tests).
    pub lo: i64,
    /// Bin width, µs.
    pub width: u64,
    /// Whether anything was placed yet (the first time anchors `lo`).
    pub anchored: bool,
}

impl Default for Axis {
    fn default() -> Self {
        Axis { lo: 0, width: 1000, anchored: false }
    }
}

/// How the bins of every series must be merged to take in a new time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grow {
    /// The old range becomes the left half.
    Right,
    /// The old range becomes the right half.
    Left,
}

impl Axis {
    pub fn hi(&self) -> i64 {
        self.lo + (self.width * BINS as u64) as i64
    }

    /// The doublings that make `[t0, t1]` fit, each to be applied to every series (`grow`).
    pub fn fit(&mut self, t0: u64, t1: u64) -> Vec<Grow> {
        let mut steps = Vec::new();
        let (t0, t1) = (t0 as i64, t1 as i64);
        if !self.anchored {
            self.anchored = true;
            self.lo = t0;
        }
        while t0 < self.lo || t1 >= self.hi() {
            let g = if t0 < self.lo { Grow::Left } else { Grow::Right };
            if g == Grow::Left {
                self.lo -= (self.width * BINS as u64) as i64;
            }
            self.width *= 2;
            steps.push(g);
        }
        steps
    }

    /// Bin of time `t` (which `fit` made fit).
    pub fn bin(&self, t: u64) -> usize {
        ((t as i64 - self.lo).max(0) as u64 / self.width).min(BINS as u64 - 1) as usize
    }

    /// Adds `rate` per µs over `[t0, t1)` to the bins it overlaps (core-µs for a task of `rate`
    /// cores).
    pub fn spread(&self, series: &mut [f64], t0: u64, t1: u64, rate: f64) {
        if t1 <= t0 {
            return;
        }
        let (b0, b1) = (self.bin(t0), self.bin(t1 - 1));
        for (b, v) in series.iter_mut().enumerate().take(b1 + 1).skip(b0) {
            let s = self.lo + (b as u64 * self.width) as i64;
            let overlap = (t1 as i64).min(s + self.width as i64) - (t0 as i64).max(s);
            *v += overlap as f64 * rate;
        }
    }
}

/// Applies one doubling to a series.
pub fn grow(series: &mut [f64], g: Grow) {
    let half = BINS / 2;
    let merged: Vec<f64> = (0..half).map(|i| series[2 * i] + series[2 * i + 1]).collect();
    series.fill(0.0);
    let at = if g == Grow::Right { 0 } else { half };
    series[at..at + half].copy_from_slice(&merged);
}

/// The bins that hold anything, as a range (empty series: `0..0`).
pub fn used(series: &[&[f64]]) -> std::ops::Range<usize> {
    let any = |i: usize| series.iter().any(|s| s[i] != 0.0);
    match ((0..BINS).find(|&i| any(i)), (0..BINS).rev().find(|&i| any(i))) {
        (Some(a), Some(b)) => a..b + 1,
        _ => 0..0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_survive_any_order_of_times_and_doublings() {
        let mut ax = Axis::default();
        let mut s = vec![0.0; BINS];
        // Tasks of 1 core: 10 s from t=100 s, 1 ms at t=5 s (before), 3 s ending at t=900 s (after).
        let tasks = [(100_000_000u64, 110_000_000u64), (5_000_000, 5_001_000), (897_000_000, 900_000_000)];
        for (t0, t1) in tasks {
            for g in ax.fit(t0, t1) {
                grow(&mut s, g);
            }
            ax.spread(&mut s, t0, t1, 1.0);
        }
        let total: f64 = s.iter().sum();
        assert_eq!(total, (10_000_000 + 1_000 + 3_000_000) as f64, "core-µs kept exactly");
        assert!(ax.lo <= 5_000_000 && ax.hi() > 900_000_000, "{ax:?}");
        let r = used(&[&s]);
        assert!(r.len() >= BINS / 4, "{r:?}: the run covers a good part of the bins");
        // The 10 s task is in the bins of 100..110 s.
        let (a, b) = (ax.bin(100_000_000), ax.bin(109_999_999));
        let inside: f64 = s[a..=b].iter().sum();
        assert!(inside >= 10_000_000.0, "{inside}");
    }

    #[test]
    fn a_spread_fills_whole_bins_with_the_rate_and_edges_in_part() {
        let ax = Axis { lo: 0, width: 10, anchored: true };
        let mut s = vec![0.0; BINS];
        ax.spread(&mut s, 5, 35, 2.0);
        assert_eq!(&s[..5], &[10.0, 20.0, 20.0, 10.0, 0.0]);
    }
}
