//! The k-ary tree the agents form under the leader (papers/004 §4: each process talks to at most
//! k others, so n agents are reached in about log_k(n) hops). Positions: 0 is the leader, agent
//! `i` sits at position `i + 1`; the parent of position p is (p - 1) / k.

/// Position of agent `id` in the tree.
pub fn position(agent: u32) -> u64 {
    agent as u64 + 1
}

/// Agent id at a position (> 0).
pub fn agent_at(pos: u64) -> u32 {
    (pos - 1) as u32
}

/// Parent position of `pos` (> 0).
pub fn parent(pos: u64, k: u32) -> u64 {
    (pos - 1) / k.max(1) as u64
}

/// Child positions of `pos` in a tree of `n` agents.
pub fn children(pos: u64, k: u32, n: u32) -> std::ops::RangeInclusive<u64> {
    let k = k.max(1) as u64;
    let first = pos * k + 1;
    let last = (pos * k + k).min(n as u64);
    first..=last
}

/// The child of `from` on the path down to `to`, or `None` when `to` is not below `from`.
pub fn next_hop(from: u64, to: u64, k: u32) -> Option<u64> {
    let mut p = to;
    while p > from {
        let q = parent(p, k);
        if q == from {
            return Some(p);
        }
        p = q;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_agent_is_reached_from_the_leader_and_each_parent_has_at_most_k_children() {
        for k in [1u32, 2, 3, 8, 32] {
            for n in [1u32, 2, 7, 100, 1000] {
                let mut seen = vec![0u32; n as usize + 1];
                for pos in 0..=n as u64 {
                    let ch = children(pos, k, n);
                    assert!(ch.clone().count() <= k as usize);
                    for c in ch {
                        assert_eq!(parent(c, k), pos);
                        seen[c as usize] += 1;
                    }
                }
                assert!(seen[1..].iter().all(|&s| s == 1), "k={k} n={n}");
            }
        }
    }

    #[test]
    fn routing() {
        // k = 2: 0 -> {1, 2}; 1 -> {3, 4}; 3 -> {7, 8}
        assert_eq!(next_hop(0, 8, 2), Some(1));
        assert_eq!(next_hop(1, 8, 2), Some(3));
        assert_eq!(next_hop(3, 8, 2), Some(8));
        assert_eq!(next_hop(2, 8, 2), None);
        assert_eq!(next_hop(8, 8, 2), None);
        assert_eq!(position(0), 1);
        assert_eq!(agent_at(position(41)), 41);
    }
}
