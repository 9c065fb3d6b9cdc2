//! Data locality (`affinity=KEY`, after HTDcr's shared-storage strategy, papers/002 §5.1): tasks
//! that share a key run on the node that ran that key before, where its data is already read
//! (page cache, node-local scratch). A key is bound to a node the first time one of its tasks is
//! placed: to the live node with the fewest keys, so keys spread evenly. A node that takes work
//! finds tasks bound elsewhere and hands them over (`defer`); each node runs its own queue first.
//! Cores never idle for it: a node with nothing else to run takes from the longest queue of
//! another (`steal`), and those tasks stay bound to their node.
//!
//! Pure bookkeeping, as `backfill`: the leader asks where a task goes and keeps the queues here.

use std::collections::{BTreeMap, HashMap, VecDeque};

/// A key's hash as the ledger stores it (FNV-1a; never 0, which means "no affinity").
pub fn key_hash(key: &[u8]) -> u32 {
    let h = key.iter().fold(0x811c_9dc5u32, |h, &b| (h ^ b as u32).wrapping_mul(0x0100_0193));
    h.max(1)
}

/// Where a task with a key goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The asking node: the key is its (or just became so).
    Here,
    /// Another node's key: hand the task to it.
    To(u32),
}

#[derive(Debug, Default)]
pub struct Affinity {
    owner: HashMap<u32, u32>,
    /// Live nodes and how many keys each owns.
    keys: BTreeMap<u32, u64>,
    /// Tasks handed to each node, in the order they came.
    queues: HashMap<u32, VecDeque<u64>>,
}

impl Affinity {
    /// Keys will spread over these nodes, before they join.
    pub fn expecting(nodes: impl IntoIterator<Item = u32>) -> Affinity {
        let mut a = Affinity::default();
        nodes.into_iter().for_each(|n| a.join(n));
        a
    }

    pub fn join(&mut self, node: u32) {
        self.keys.entry(node).or_insert(0);
    }

    /// A node is gone: its keys go to whoever next places one of their tasks, and the tasks
    /// handed to it are returned to be placed again.
    pub fn leave(&mut self, node: u32) -> Vec<u64> {
        self.keys.remove(&node);
        self.owner.retain(|_, n| *n != node);
        self.queues.remove(&node).map(Vec::from).unwrap_or_default()
    }

    /// Where a task with `key`, found by `asking`, should run.
    pub fn route(&mut self, key: u32, asking: u32) -> Route {
        if let Some(&n) = self.owner.get(&key) {
            return if n == asking { Route::Here } else { Route::To(n) };
        }
        // A new key: to the live node with the fewest (the asking one on a tie, then the lowest).
        let fewest = self.keys.values().copied().min().unwrap_or(0);
        let node = if self.keys.get(&asking).is_none_or(|&k| k == fewest) {
            asking
        } else {
            self.keys.iter().find(|(_, &k)| k == fewest).map(|(&n, _)| n).unwrap_or(asking)
        };
        self.owner.insert(key, node);
        *self.keys.entry(node).or_insert(0) += 1;
        if node == asking {
            Route::Here
        } else {
            Route::To(node)
        }
    }

    /// Hands `task` to `node`'s queue.
    pub fn defer(&mut self, node: u32, task: u64) {
        self.queues.entry(node).or_default().push_back(task);
    }

    /// The next task handed to `node`.
    pub fn take_own(&mut self, node: u32) -> Option<u64> {
        let q = self.queues.get_mut(&node)?;
        let t = q.pop_front();
        if q.is_empty() {
            self.queues.remove(&node);
        }
        t
    }

    /// A task from the longest queue of another node, for `node` that has nothing else to run.
    pub fn steal(&mut self, node: u32) -> Option<u64> {
        let (&victim, _) = self
            .queues
            .iter()
            .filter(|(&n, q)| n != node && !q.is_empty())
            .max_by_key(|(&n, q)| (q.len(), std::cmp::Reverse(n)))?;
        let q = self.queues.get_mut(&victim)?;
        let t = q.pop_back();
        if q.is_empty() {
            self.queues.remove(&victim);
        }
        t
    }

    /// Tasks waiting in the queues.
    pub fn queued(&self) -> usize {
        self.queues.values().map(VecDeque::len).sum()
    }

    /// The node a key is bound to.
    pub fn owner(&self, key: u32) -> Option<u32> {
        self.owner.get(&key).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_spread_over_the_nodes_and_stay_where_they_went() {
        let mut a = Affinity::default();
        a.join(0);
        a.join(1);
        let (k1, k2, k3) = (key_hash(b"a"), key_hash(b"b"), key_hash(b"c"));
        assert_eq!(a.route(k1, 0), Route::Here);
        assert_eq!(a.route(k2, 0), Route::To(1), "node 0 has one key already");
        assert_eq!(a.route(k3, 0), Route::Here, "tied: the asking node");
        assert_eq!(a.route(k1, 1), Route::To(0), "bound");
        assert_eq!(a.route(k2, 1), Route::Here);
        assert_eq!((a.owner(k1), a.owner(k2)), (Some(0), Some(1)));
    }

    #[test]
    fn queues_go_first_to_their_node_and_to_idle_others_from_the_back() {
        let mut a = Affinity::default();
        a.join(0);
        a.join(1);
        for t in 1..=4 {
            a.defer(1, t);
        }
        a.defer(0, 9);
        assert_eq!(a.take_own(1), Some(1));
        assert_eq!(a.steal(0), Some(4), "the longest other queue, from its back");
        assert_eq!(a.steal(1), Some(9));
        assert_eq!(a.queued(), 2);
        // Node 1 leaves: its tasks come back, its keys are free to bind again.
        let k = key_hash(b"x");
        assert_eq!(a.route(k, 0), Route::Here);
        let k2 = key_hash(b"y");
        assert_eq!(a.route(k2, 0), Route::To(1));
        assert_eq!(a.leave(1), vec![2, 3]);
        assert_eq!(a.route(k2, 0), Route::Here, "rebound to a live node");
        assert_eq!(a.queued(), 0);
    }

    #[test]
    fn hashes_are_never_zero() {
        assert_ne!(key_hash(b""), 0);
        assert_ne!(key_hash(b"sample-17"), key_hash(b"sample-18"));
    }
}
