//! Maps and sets keyed by task and agent ids, hashed by one multiply instead of SipHash.
//!
//! The leader looks an agent or a task up several times per result (a quarter of a million a
//! second at scale); SipHash was ~4% of its time (`perf` of `--exec sleep` on 1000 x 24,
//! bench/RESULTS.md in git's history). Its protection against chosen keys is not needed here: the ids are
//! the run's own, dense, and come from authenticated agents.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// Fibonacci hashing: the multiply spreads dense ids into the high bits hashbrown uses.
#[derive(Default, Clone, Copy)]
pub struct IdHasher(u64);

const K: u64 = 0x9E37_79B9_7F4A_7C15;

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(n as u64);
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(K);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;
pub type IdSet<K> = HashSet<K, BuildHasherDefault<IdHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn dense_ids_spread_over_the_high_bits() {
        let b = BuildHasherDefault::<IdHasher>::default();
        // hashbrown takes the top 7 bits as a tag: consecutive ids must not share them all.
        let tags: HashSet<u64> = (0..1_000u64).map(|id| b.hash_one(id) >> 57).collect();
        assert!(tags.len() > 100, "{} distinct tags", tags.len());
        let mut m: IdMap<u32, u32> = IdMap::default();
        m.extend((0..10_000).map(|i| (i, i * 2)));
        assert!((0..10_000).all(|i| m[&i] == i * 2));
    }
}
