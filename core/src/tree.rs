//! The tree the agents form under the leader (papers/004 §4: each process talks to at most k
//! others, so n agents are reached in about log_k(n) hops), as data: each agent's parent, the
//! leader being `None`. It starts k-ary in id order; `reattach` moves an agent (with everything
//! below it) under another parent, which is how the tree heals when a relay is lost.
//!
//! Agents are grouped into 2nd-level instances (HFlow's scheduling domains): each has a head,
//! the only agent of the instance the leader deals with, and members that hang directly below
//! it and get their tasks from it. An instance of one agent is that agent alone.

/// Who is whose parent, and which instance each agent belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tree {
    /// Parent of each agent id; `None` is the leader.
    parent: Vec<Option<u32>>,
    /// The head of each agent's instance (a head is its own).
    head: Vec<u32>,
    /// The heads in the order their instances came (id order, but for `graft_at` below the
    /// highest id): an instance's index is its head's position here, and never changes.
    heads: Vec<u32>,
    /// Whether `heads` is in id order (searched, not scanned).
    in_order: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TreeError {
    #[error("agent {0} is not in the tree")]
    Unknown(u32),
    #[error("agent {agent} cannot hang below itself (agent {under} is below it)")]
    Cycle { agent: u32, under: u32 },
    #[error("agent {0} is in the tree already")]
    Taken(u32),
}

impl Tree {
    /// `n` agents, `k` per parent, in id order: the leader's children are agents 0..k, agent
    /// `a`'s are `(a + 1)·k .. (a + 2)·k` (positions: the leader is 0, agent `a` is `a + 1`).
    pub fn kary(n: u32, k: u32) -> Tree {
        let k = k.max(1) as u64;
        let parent = (0..n as u64).map(|a| ((a / k) as u32).checked_sub(1)).collect();
        Tree { parent, head: (0..n).collect(), heads: (0..n).collect(), in_order: true }
    }

    /// `n` agents in instances of `size` consecutive ids (the last may be smaller), the first of
    /// each its head: the heads form the k-ary tree among themselves, the members hang directly
    /// below their head. `size` 1 is `kary`.
    pub fn instances(n: u32, size: u32, k: u32) -> Tree {
        let size = size.max(1);
        let heads: Vec<u32> = (0..n).step_by(size as usize).collect();
        let upper = Tree::kary(heads.len() as u32, k);
        let parent = (0..n)
            .map(|a| match a % size {
                0 => upper.parent(a / size).map(|p| p * size),
                _ => Some(a - a % size),
            })
            .collect();
        Tree { parent, head: (0..n).map(|a| a - a % size).collect(), heads, in_order: true }
    }

    /// Adds an allocation's `n` agents to the run, laid out as `instances(n, size, k)` and
    /// numbered after every agent so far; their top heads hang below the leader. Returns the
    /// first new id. Instance indices (`instance_index`) of the agents so far do not change.
    pub fn graft(&mut self, n: u32, size: u32, k: u32) -> u32 {
        let base = self.len();
        self.graft_at(base, n, size, k).expect("ids past the tree are free");
        base
    }

    /// As `graft`, at ids `base..base + n` that the tree does not hold yet (past its end, or
    /// where another view of the run stands apart, `grafted`): agents that keep their ids from
    /// an earlier leader. Their instances come after those so far.
    pub fn graft_at(&mut self, base: u32, n: u32, size: u32, k: u32) -> Result<(), TreeError> {
        if let Some(a) = (base..base.saturating_add(n)).find(|&a| self.holds(a)) {
            return Err(TreeError::Taken(a));
        }
        let end = base as usize + n as usize;
        if end > self.parent.len() {
            let from = self.len();
            self.parent.resize(end, None);
            self.head.extend(from..end as u32);
        }
        let sub = Tree::instances(n, size, k);
        for (i, (p, h)) in sub.parent.iter().zip(&sub.head).enumerate() {
            self.parent[base as usize + i] = p.map(|p| p + base);
            self.head[base as usize + i] = h + base;
        }
        self.in_order &= self.heads.last().is_none_or(|&last| last < base);
        self.heads.extend(sub.heads.iter().map(|h| h + base));
        Ok(())
    }

    /// Whether `agent` is one of the tree's own (not past its end, nor a stand-in for an agent
    /// of another view).
    pub fn holds(&self, agent: u32) -> bool {
        self.contains(agent) && (self.head(agent) != agent || self.parent(agent).is_some() || self.is_head(agent))
    }

    fn is_head(&self, agent: u32) -> bool {
        // Heads are in id order but for `graft_at`: a sorted tree is searched, others scanned.
        match self.heads.binary_search(&agent) {
            Ok(_) => true,
            Err(_) => !self.in_order && self.heads.contains(&agent),
        }
    }

    /// The tree as the agents of one grafted allocation see it (`graft` returned `base`): their
    /// own layout, the run's earlier agents standing apart (no parent, no instance), since these
    /// agents never route to them.
    pub fn grafted(base: u32, n: u32, size: u32, k: u32) -> Tree {
        let mut t =
            Tree { parent: vec![None; base as usize], head: (0..base).collect(), heads: Vec::new(), in_order: true };
        t.graft(n, size, k);
        t
    }

    pub fn len(&self) -> u32 {
        self.parent.len() as u32
    }

    pub fn is_empty(&self) -> bool {
        self.parent.is_empty()
    }

    /// The parent of `agent`: `None` for the leader, and for an agent not in the tree.
    pub fn parent(&self, agent: u32) -> Option<u32> {
        self.parent.get(agent as usize).copied().flatten()
    }

    pub fn contains(&self, agent: u32) -> bool {
        (agent as usize) < self.parent.len()
    }

    /// The head of `agent`'s instance (itself for a head, and for an agent not in the tree).
    pub fn head(&self, agent: u32) -> u32 {
        self.head.get(agent as usize).copied().unwrap_or(agent)
    }

    /// Whether `agent` is a member (not the head) of the instance headed by `head`.
    pub fn is_member(&self, agent: u32, head: u32) -> bool {
        agent != head && self.contains(agent) && self.head(agent) == head
    }

    /// How many agents the instance headed by `head` has, the head included (its members
    /// follow it in id order).
    pub fn instance_len(&self, head: u32) -> usize {
        if !self.is_head(head) {
            return 0;
        }
        1 + self.head[head as usize + 1..].iter().take_while(|&&h| h == head).count()
    }

    /// The instances' heads in instance order.
    pub fn heads(&self) -> &[u32] {
        &self.heads
    }

    /// The position of `head`'s instance among the instances (the partition's index); `None`
    /// for an agent that heads none.
    pub fn instance_index(&self, head: u32) -> Option<usize> {
        match self.heads.binary_search(&head) {
            Ok(i) => Some(i),
            Err(_) if self.in_order => None,
            Err(_) => self.heads.iter().position(|&h| h == head),
        }
    }

    /// Whether `child` hangs directly below `of` (`None`: the leader).
    pub fn is_child(&self, child: u32, of: Option<u32>) -> bool {
        self.contains(child) && self.parent(child) == of
    }

    /// The agents directly below `of`, in id order.
    pub fn children(&self, of: Option<u32>) -> impl Iterator<Item = u32> + '_ {
        (0..self.len()).filter(move |&a| self.parent(a) == of)
    }

    /// The child of `from` (`None`: the leader) on the path down to `to`, or `None` when `to`
    /// is not below `from`.
    pub fn next_hop(&self, from: Option<u32>, to: u32) -> Option<u32> {
        if !self.contains(to) {
            return None;
        }
        let mut at = to;
        // A tree of n agents has no path longer than n.
        for _ in 0..=self.len() {
            let up = self.parent(at);
            if up == from {
                return Some(at);
            }
            at = up?;
        }
        None
    }

    /// Moves `agent`, with the agents below it, under `to` (`None`: the leader).
    pub fn reattach(&mut self, agent: u32, to: Option<u32>) -> Result<(), TreeError> {
        if !self.contains(agent) {
            return Err(TreeError::Unknown(agent));
        }
        if let Some(to) = to {
            if !self.contains(to) {
                return Err(TreeError::Unknown(to));
            }
            if to == agent || self.next_hop(Some(agent), to).is_some() {
                return Err(TreeError::Cycle { agent, under: to });
            }
        }
        self.parent[agent as usize] = to;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Today's positions: 0 is the leader, agent `a` sits at `a + 1`, and the parent of
    /// position p is (p - 1) / k. The data must say the same.
    fn parent_by_arithmetic(agent: u32, k: u32) -> Option<u32> {
        let up = agent as u64 / k.max(1) as u64;
        (up > 0).then(|| (up - 1) as u32)
    }

    #[test]
    fn the_kary_tree_reaches_every_agent_with_at_most_k_children_each() {
        for k in [1u32, 2, 3, 8, 32] {
            for n in [0u32, 1, 2, 7, 100, 1000] {
                let t = Tree::kary(n, k);
                assert_eq!(t.len(), n);
                let mut seen = vec![0u32; n as usize];
                for of in std::iter::once(None).chain((0..n).map(Some)) {
                    let ch: Vec<u32> = t.children(of).collect();
                    assert!(ch.len() <= k as usize, "k={k} n={n} of={of:?}");
                    for c in ch {
                        assert_eq!(t.parent(c), of);
                        seen[c as usize] += 1;
                    }
                }
                assert!(seen.iter().all(|&s| s == 1), "k={k} n={n}");
                for a in 0..n {
                    assert_eq!(t.parent(a), parent_by_arithmetic(a, k), "k={k} a={a}");
                }
            }
        }
    }

    #[test]
    fn agents_that_keep_their_ids_graft_where_they_were_and_earlier_instances_keep_their_index() {
        // A leader that took the run over sees its own allocation (agents 5..7) apart from the
        // run's earlier agents; another allocation's agents 2..4 come back with their ids.
        let mut t = Tree::grafted(5, 2, 1, 4);
        assert_eq!((t.holds(2), t.holds(5), t.holds(9)), (false, true, false));
        t.graft_at(2, 3, 1, 4).unwrap();
        assert_eq!(t.heads(), [5, 6, 2, 3, 4]);
        assert_eq!((t.instance_index(5), t.instance_index(3), t.instance_index(1)), (Some(0), Some(3), None));
        assert_eq!((t.instance_len(2), t.instance_len(6), t.instance_len(0)), (1, 1, 0));
        assert_eq!(t.graft_at(1, 2, 1, 4), Err(TreeError::Taken(2)));
        // Past the end, with room between; an instance of 3 there.
        t.graft_at(10, 3, 3, 4).unwrap();
        assert_eq!((t.len(), t.instance_len(10), t.instance_index(10), t.holds(8)), (13, 3, Some(5), false));
        assert!(t.is_member(12, 10) && t.parent(10).is_none());
        assert_eq!(t.graft(1, 1, 4), 13, "new ids come after every id so far");
    }

    #[test]
    fn routing() {
        // k = 2: leader -> {0, 1}; 0 -> {2, 3}; 2 -> {6, 7}
        let t = Tree::kary(8, 2);
        assert_eq!(t.next_hop(None, 7), Some(0));
        assert_eq!(t.next_hop(Some(0), 7), Some(2));
        assert_eq!(t.next_hop(Some(2), 7), Some(7));
        assert_eq!(t.next_hop(Some(1), 7), None);
        assert_eq!(t.next_hop(Some(7), 7), None);
        assert_eq!(t.next_hop(None, 99), None);
        assert!(t.is_child(3, Some(0)) && !t.is_child(3, None) && !t.is_child(99, None));
    }

    #[test]
    fn a_lost_relay_s_children_reattach_above_it() {
        let mut t = Tree::kary(8, 2);
        // Agent 0 (children 2 and 3; 2 has 6 and 7) is lost: its children move to the leader.
        for c in t.children(Some(0)).collect::<Vec<_>>() {
            t.reattach(c, t.parent(0)).unwrap();
        }
        assert_eq!(t.children(None).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
        assert_eq!(t.next_hop(None, 7), Some(2), "agent 2 keeps its own children");
        assert_eq!(t.children(Some(0)).count(), 0);
    }

    #[test]
    fn reattaching_refuses_cycles_and_strangers() {
        let mut t = Tree::kary(8, 2);
        assert_eq!(t.reattach(0, Some(7)), Err(TreeError::Cycle { agent: 0, under: 7 }));
        assert_eq!(t.reattach(2, Some(2)), Err(TreeError::Cycle { agent: 2, under: 2 }));
        assert_eq!(t.reattach(9, None), Err(TreeError::Unknown(9)));
        assert_eq!(t.reattach(1, Some(9)), Err(TreeError::Unknown(9)));
        assert_eq!(t, Tree::kary(8, 2), "nothing moved");
        t.reattach(1, Some(7)).unwrap();
        assert_eq!(t.next_hop(None, 1), Some(0), "now below 0 -> 2 -> 7");
    }

    #[test]
    fn instances_hang_their_members_below_their_head_and_heads_form_the_kary_tree() {
        // 10 agents in instances of 4 with k = 2: heads 0, 4, 8 (the last of two agents).
        // The heads' tree: leader -> {0, 4}, 0 -> {8}. Members below their head.
        let t = Tree::instances(10, 4, 2);
        assert_eq!(t.heads(), &[0, 4, 8]);
        assert_eq!(t.children(None).collect::<Vec<_>>(), vec![0, 4]);
        assert_eq!(t.children(Some(0)).collect::<Vec<_>>(), vec![1, 2, 3, 8]);
        assert_eq!(t.children(Some(4)).collect::<Vec<_>>(), vec![5, 6, 7]);
        assert_eq!(t.children(Some(8)).collect::<Vec<_>>(), vec![9]);
        assert_eq!((t.head(6), t.head(4), t.head(9)), (4, 4, 8));
        assert!(t.is_member(6, 4) && !t.is_member(4, 4) && !t.is_member(8, 0) && !t.is_member(99, 4));
        assert_eq!([0, 4, 8, 5].map(|h| t.instance_len(h)), [4, 4, 2, 0]);
        assert_eq!([0, 4, 8, 5].map(|h| t.instance_index(h)), [Some(0), Some(1), Some(2), None]);
        assert_eq!(t.next_hop(None, 9), Some(0));
        assert_eq!(t.next_hop(Some(0), 9), Some(8));
        assert_eq!(Tree::instances(7, 1, 3), Tree::kary(7, 3), "instances of one agent are the k-ary tree");
    }

    #[test]
    fn a_grafted_allocation_gets_new_ids_and_instances_after_the_run_s() {
        let mut run = Tree::instances(4, 2, 2);
        let base = run.graft(6, 3, 2);
        assert_eq!(base, 4);
        assert_eq!(run.heads(), &[0, 2, 4, 7]);
        assert_eq!((run.instance_index(4), run.instance_index(7)), (Some(2), Some(3)));
        assert_eq!((run.parent(4), run.parent(7)), (None, None), "the new heads hang below the leader");
        assert!(run.is_member(5, 4) && run.is_member(9, 7));
        assert_eq!(run.instance_len(7), 3);
        // The joined agents' own view routes and heads as the leader's does.
        let own = Tree::grafted(base, 6, 3, 2);
        for a in 4..10 {
            assert_eq!((own.parent(a), own.head(a)), (run.parent(a), run.head(a)));
            assert_eq!(own.instance_len(own.head(a)), run.instance_len(run.head(a)));
        }
        assert!(own.heads().iter().all(|&h| h >= base));
        assert_eq!(own.next_hop(Some(4), 1), None, "the run's earlier agents are not below it");
        assert!(!own.is_member(1, 0));
    }
}
