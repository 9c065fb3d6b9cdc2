//! A histogram for the leader's own figures (results per report, a result's delay from its end
//! to the leader): constant memory, about 6% precision, quantiles read at any time. Benchmarks
//! print these beside the leader's cost per task (issue 25).

/// Sub-buckets per power of two: values are kept to within 1/16 of themselves.
const SUB_BITS: u32 = 4;
const BUCKETS: usize = ((64 - SUB_BITS as usize) + 1) << SUB_BITS;

#[derive(Debug, Clone)]
pub struct Hist {
    counts: Vec<u64>,
    n: u64,
    sum: u64,
}

impl Default for Hist {
    fn default() -> Self {
        Hist { counts: vec![0; BUCKETS], n: 0, sum: 0 }
    }
}

/// Small values exactly; larger ones by their top `SUB_BITS + 1` bits.
fn bucket(v: u64) -> usize {
    if v < (1 << SUB_BITS) {
        return v as usize;
    }
    let msb = 63 - v.leading_zeros();
    let shift = msb - SUB_BITS;
    (((shift + 1) << SUB_BITS) as u64 + ((v >> shift) & ((1 << SUB_BITS) - 1))) as usize
}

/// The smallest value of bucket `b`.
fn low(b: usize) -> u64 {
    let sub = (b as u64) & ((1 << SUB_BITS) - 1);
    let level = (b as u32) >> SUB_BITS;
    if level == 0 {
        return sub;
    }
    ((1u64 << SUB_BITS) | sub) << (level - 1)
}

impl Hist {
    pub fn record(&mut self, v: u64) {
        self.counts[bucket(v)] += 1;
        self.n += 1;
        self.sum = self.sum.saturating_add(v);
    }

    pub fn count(&self) -> u64 {
        self.n
    }

    pub fn sum(&self) -> u64 {
        self.sum
    }

    /// The value `q` (0..=1) of the recorded ones are at or below, to the histogram's precision
    /// (the bucket's smallest value); 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        let rank = ((self.n as f64 * q).ceil() as u64).max(1);
        let mut seen = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return low(b);
            }
        }
        0
    }

    /// Count, sum, median and 99th percentile, as the ledger keeps them.
    pub fn summary(&self) -> Summary {
        Summary { n: self.n, sum: self.sum, p50: self.quantile(0.5), p99: self.quantile(0.99) }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Summary {
    pub n: u64,
    pub sum: u64,
    pub p50: u64,
    pub p99: u64,
}

impl Summary {
    pub fn mean(&self) -> Option<f64> {
        (self.n > 0).then(|| self.sum as f64 / self.n as f64)
    }

    pub fn to_bytes(self) -> [u8; 32] {
        let mut b = [0u8; 32];
        for (i, v) in [self.n, self.sum, self.p50, self.p99].into_iter().enumerate() {
            b[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    pub fn from_bytes(b: &[u8]) -> Option<Summary> {
        if b.len() != 32 {
            return None;
        }
        let u = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
        Some(Summary { n: u(0), sum: u(1), p50: u(2), p99: u(3) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_keep_values_to_a_sixteenth() {
        for v in [0u64, 1, 15, 16, 17, 31, 32, 33, 100, 1_000, 123_456, 10_000_000, u64::MAX / 3] {
            let b = bucket(v);
            assert!(low(b) <= v && v - low(b) <= v / 16, "{v}: bucket {b} starts at {}", low(b));
            assert!(b + 1 == BUCKETS || low(b + 1) > v, "{v}");
        }
        assert!(bucket(u64::MAX) < BUCKETS);
    }

    #[test]
    fn quantiles_mean_and_bytes() {
        let mut h = Hist::default();
        assert_eq!(h.summary(), Summary::default());
        assert_eq!(h.summary().mean(), None);
        // 98 reports of 10 results, one of 50, one of 9,000.
        for _ in 0..98 {
            h.record(10);
        }
        h.record(50);
        h.record(9_000);
        let s = h.summary();
        assert_eq!((s.n, s.sum, s.p50), (100, 98 * 10 + 50 + 9_000, 10));
        assert!((48..=50).contains(&s.p99), "the 99th of 100 is the 50: {}", s.p99);
        assert_eq!(Summary::from_bytes(&s.to_bytes()), Some(s));
        assert_eq!(Summary::from_bytes(&[1, 2, 3]), None);
    }
}
