//! How many results the leader's reports carry: the leader pays per report what it pays per
//! task only when reports carry many (issue 25), so the run keeps count, and benchmarks print
//! the mean and the 99th percentile beside the leader's cost per task.

/// Sizes above this share one bucket (reported as this).
const EXACT_UP_TO: usize = 4096;

#[derive(Debug, Clone)]
pub struct ReportSizes {
    /// Reports by their number of results; the last bucket holds all larger ones.
    by_size: Vec<u64>,
    reports: u64,
    results: u64,
}

impl Default for ReportSizes {
    fn default() -> Self {
        ReportSizes { by_size: vec![0; EXACT_UP_TO + 1], reports: 0, results: 0 }
    }
}

/// What `ReportSizes` sums up to, as the ledger keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Summary {
    pub reports: u64,
    pub results: u64,
    /// The size 99% of reports are at or below.
    pub p99: u64,
}

impl ReportSizes {
    pub fn add(&mut self, results: usize) {
        self.by_size[results.min(EXACT_UP_TO)] += 1;
        self.reports += 1;
        self.results += results as u64;
    }

    pub fn summary(&self) -> Summary {
        let rank = (self.reports * 99).div_ceil(100);
        let mut seen = 0;
        let p99 = self.by_size.iter().position(|&n| {
            seen += n;
            seen >= rank && seen > 0
        });
        Summary { reports: self.reports, results: self.results, p99: p99.unwrap_or(0) as u64 }
    }
}

impl Summary {
    pub fn mean(&self) -> Option<f64> {
        (self.reports > 0).then(|| self.results as f64 / self.reports as f64)
    }

    pub fn to_bytes(self) -> [u8; 24] {
        let mut b = [0u8; 24];
        b[..8].copy_from_slice(&self.reports.to_le_bytes());
        b[8..16].copy_from_slice(&self.results.to_le_bytes());
        b[16..].copy_from_slice(&self.p99.to_le_bytes());
        b
    }

    pub fn from_bytes(b: &[u8]) -> Option<Summary> {
        let u = |i: usize| Some(u64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?));
        (b.len() == 24).then_some(())?;
        Some(Summary { reports: u(0)?, results: u(8)?, p99: u(16)? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_and_99th_percentile() {
        let mut s = ReportSizes::default();
        assert_eq!(s.summary(), Summary::default());
        assert_eq!(s.summary().mean(), None);
        // 98 reports of 10 results, one of 50, one of 9,000.
        for _ in 0..98 {
            s.add(10);
        }
        s.add(50);
        s.add(9_000);
        let sum = s.summary();
        assert_eq!((sum.reports, sum.results), (100, 98 * 10 + 50 + 9_000));
        assert_eq!(sum.p99, 50, "the 99th of 100 is the 50");
        assert_eq!(Summary::from_bytes(&sum.to_bytes()), Some(sum));
        assert_eq!(Summary::from_bytes(&[1, 2, 3]), None);
        let mut one = ReportSizes::default();
        one.add(0);
        assert_eq!(one.summary().p99, 0);
        one.add(7);
        assert_eq!(one.summary().p99, 7);
    }
}
