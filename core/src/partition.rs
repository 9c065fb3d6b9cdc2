//! Which instance runs which tasks. The leader asks a [`Partition`] for the next range of task
//! ids for an instance; HFlow (papers/000 §4.2) will be one more implementation of this trait.

use std::ops::Range;

/// Hands out task-id ranges to instances. Ranges may contain tasks that are already done (after a
/// resume); the caller skips those, so partitions stay pure arithmetic over ids.
pub trait Partition: Send {
    /// The next ids for `instance`, at most `max` of them, or `None` when nothing is left for it.
    /// Once its own share is gone, it may take at most `steal` ids of another's share: an
    /// instance should steal only what it can start now, or it hoards long tasks that an idle
    /// (or late) instance would have run at the same time.
    fn take(&mut self, instance: usize, max: u64, steal: u64) -> Option<Range<u64>>;
    /// Ids not yet handed out, over all instances.
    fn remaining(&self) -> u64;
}

/// Even split: instance i owns the i-th of n contiguous blocks of ids. An instance whose block is
/// drained takes the back of the largest remaining block (half of it at most, and no more than
/// it may steal), so a slow instance never holds the tail of the run hostage.
#[derive(Debug, Clone)]
pub struct Even {
    blocks: Vec<Range<u64>>,
}

impl Even {
    pub fn new(ids: Range<u64>, instances: usize) -> Self {
        let n = instances.max(1) as u64;
        let len = ids.end.saturating_sub(ids.start);
        let blocks = (0..n).map(|i| (ids.start + len * i / n)..(ids.start + len * (i + 1) / n)).collect();
        Even { blocks }
    }
}

impl Partition for Even {
    fn take(&mut self, instance: usize, max: u64, steal: u64) -> Option<Range<u64>> {
        if max == 0 {
            return None;
        }
        if instance >= self.blocks.len() {
            self.blocks.resize(instance + 1, 0..0);
        }
        if self.blocks[instance].is_empty() {
            if steal == 0 {
                return None;
            }
            let (victim, largest) = self
                .blocks
                .iter()
                .enumerate()
                .max_by_key(|(_, b)| b.end - b.start)
                .map(|(i, b)| (i, b.end - b.start))?;
            if largest == 0 {
                return None;
            }
            let b = &mut self.blocks[victim];
            let mid = b.end - largest.div_ceil(2).min(steal);
            let stolen = mid..b.end;
            b.end = mid;
            self.blocks[instance] = stolen;
        }
        let b = &mut self.blocks[instance];
        let end = b.start + max.min(b.end - b.start);
        let r = b.start..end;
        b.start = end;
        Some(r)
    }

    fn remaining(&self) -> u64 {
        self.blocks.iter().map(|b| b.end - b.start).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_id_exactly_once_with_stealing() {
        let mut p = Even::new(1..10_001, 4);
        let mut seen = vec![0u8; 10_001];
        let mut turn = 0usize;
        // Instance 3 is slow: it takes one id per round, the others 7.
        while let Some(r) = p.take(turn % 4, if turn % 4 == 3 { 1 } else { 7 }, 7) {
            for id in r {
                seen[id as usize] += 1;
            }
            turn += 1;
        }
        assert_eq!(seen[0], 0);
        assert!(seen[1..].iter().all(|&c| c == 1));
        assert_eq!(p.remaining(), 0);
    }

    #[test]
    fn blocks_are_even_and_contiguous() {
        let mut p = Even::new(0..10, 3);
        assert_eq!(p.take(0, 100, 100), Some(0..3));
        assert_eq!(p.take(1, 100, 100), Some(3..6));
        assert_eq!(p.take(2, 100, 100), Some(6..10));
        assert_eq!(p.take(0, 100, 100), None);
    }

    #[test]
    fn drained_instance_steals_half_of_the_largest() {
        let mut p = Even::new(0..100, 2);
        assert_eq!(p.take(0, 50, 100), Some(0..50));
        assert_eq!(p.take(0, 100, 100), Some(75..100));
        assert_eq!(p.take(1, 100, 100), Some(50..75));
        assert_eq!(p.take(5, 1, 1), None);
    }

    #[test]
    fn stealing_takes_no_more_than_the_thief_may() {
        // 8 long tasks on 4 instances of 2 cores: the first to ask gets its own 2, and steals
        // only for cores it has free, so the others keep theirs.
        let mut p = Even::new(0..8, 4);
        assert_eq!(p.take(0, 32, 0), Some(0..2));
        assert_eq!(p.take(0, 30, 0), None, "nothing free: nothing stolen");
        assert_eq!(p.take(0, 30, 1), Some(7..8), "one core free: one task, from the back of the largest");
        assert_eq!(p.take(3, 32, 0), Some(6..7));
        assert_eq!(p.take(1, 32, 0), Some(2..4));
        assert_eq!(p.remaining(), 2);
    }
}
