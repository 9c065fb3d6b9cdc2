//! Memory-aware placement with backfill, after the backfill patent's S1 (papers/001): a task
//! starts on a node only when its `mem=` fits beside what the node already runs. A task that
//! cannot start waits, oldest first, and gets a reservation on the node where it can start
//! earliest (at most one reservation per node). A smaller task then runs on a reserved node only
//! when it does not delay the reservation: it fits beside the reserved task, or its runtime hint
//! ends before the memory the reservation needs is expected free. So a big task is never starved
//! by a stream of small ones, while cores do not idle in front of it.
//!
//! GPUs (`gpus=`) are committed the same way, so a node never gets more GPU tasks than it has
//! devices; a task waiting for GPUs only waits its turn (reservations are for memory).
//!
//! An `exclusive` task needs a node with nothing else on it, and nothing starts beside it. For
//! runs that have such tasks every task is committed, and a waiting exclusive task reserves the
//! node expected to empty first (whatever the memory policy): on it, only tasks that should end
//! before it empties start, so the node drains instead of being refilled for ever.
//!
//! Pure bookkeeping: the leader feeds it nodes (their budget), commits (a task sent to a node),
//! starts and ends, and asks what may start where. Times are microseconds, sizes MiB. Tasks
//! without `mem=`, and nodes without a budget, are not accounted for memory.

use std::collections::{BTreeMap, BTreeSet};

use crate::idmap::IdMap;

/// How memory decides what starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// Reservations for tasks that wait, smaller tasks around them (S1).
    #[default]
    Backfill,
    /// Strict arrival order: while a task waits for memory, no later task that declares memory
    /// starts anywhere.
    Fcfs,
    /// Memory is not looked at (tasks start as cores allow): for comparisons.
    Ignore,
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Policy, String> {
        match s {
            "backfill" => Ok(Policy::Backfill),
            "fcfs" => Ok(Policy::Fcfs),
            "ignore" => Ok(Policy::Ignore),
            _ => Err(format!("'{s}' is not a memory policy (backfill, fcfs, ignore)")),
        }
    }
}

/// The smaller of two amounts, 0 standing for none.
fn least(a: u64, b: u64) -> u64 {
    match (a, b) {
        (0, x) | (x, 0) => x,
        (a, b) => a.min(b),
    }
}

/// What a task asks for, as placement sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need {
    pub task: u64,
    pub mem_mb: u64,
    pub cores: u32,
    pub gpus: u32,
    /// The `runtime` hint; 0 = unknown.
    pub runtime_us: u64,
    /// Tasks of one group (class and hint) run alike: their runtimes so far refine the hint.
    pub group: u64,
    /// Nothing else may run on its node meanwhile.
    pub exclusive: bool,
}

/// What a group's tasks took so far, as TCP estimates a round trip (RFC 6298): a smoothed mean
/// and a smoothed deviation, in µs.
#[derive(Debug, Clone, Copy, Default)]
struct Learned {
    mean: f64,
    dev: f64,
    n: u64,
}

/// A task holding memory on a node, and when it is expected to end (`u64::MAX`: unknown).
#[derive(Debug, Clone, Copy)]
struct Hold {
    mem: u64,
    gpus: u32,
    end_us: u64,
}

#[derive(Debug)]
struct Node {
    /// Memory and GPUs for tasks; an instance of several agents has the sums of its members'.
    budget: u64,
    gpus: u32,
    /// The most one task may have: the node's, or the largest member's of an instance.
    largest: Size,
    used: u64,
    gpus_used: u32,
    holds: IdMap<u64, Hold>,
    /// The waiting task this node is kept for.
    reserved: Option<Need>,
    /// The exclusive task running here.
    exclusive: Option<u64>,
}

impl Node {
    /// When `mem` is expected free here: now if it is, else when enough of what runs has
    /// ended by its hints; `u64::MAX` when that depends on a task without a hint.
    fn free_at(&self, mem: u64, now_us: u64) -> u64 {
        let mut free = self.budget.saturating_sub(self.used);
        if free >= mem {
            return now_us;
        }
        let mut ends: Vec<Hold> = self.holds.values().copied().collect();
        ends.sort_unstable_by_key(|h| h.end_us);
        for h in ends {
            if h.end_us == u64::MAX {
                return u64::MAX;
            }
            free += h.mem;
            if free >= mem {
                return h.end_us.max(now_us);
            }
        }
        u64::MAX
    }

    /// When everything here is expected to have ended (`u64::MAX`: unknown).
    fn empty_at(&self, now_us: u64) -> u64 {
        self.holds.values().map(|h| h.end_us).max().unwrap_or(now_us).max(now_us)
    }

    fn fits_now(&self, mem: u64, gpus: u32) -> bool {
        self.used + mem <= self.budget && self.gpus_used + gpus <= self.gpus
    }

    /// Whether the node could ever hold the task.
    fn could_hold(&self, need: &Need, mem: u64) -> bool {
        need.cores <= self.largest.cores && need.gpus <= self.largest.gpus && mem <= self.largest.mem_mb
    }
}

/// What one task may have at most on a node (its largest member's, for an instance).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    pub mem_mb: u64,
    pub cores: u32,
    pub gpus: u32,
}

#[derive(Debug, Default)]
pub struct Memory {
    policy: Policy,
    nodes: BTreeMap<u32, Node>,
    /// Tasks waiting for memory, by id (arrival order), and the same grouped by size: a node
    /// looks at the oldest of each size only, since an older task of the same size that does
    /// not fit means a younger one does not either.
    waiting: BTreeMap<u64, Need>,
    by_size: BTreeMap<(u64, u32, bool), BTreeSet<u64>>,
    /// Which node each reserved task is kept on.
    reserved_on: IdMap<u64, u32>,
    learned: IdMap<u64, Learned>,
    /// Every task is committed, not only those with memory or GPUs: the run has exclusive tasks.
    whole_nodes: bool,
    /// The least memory (MiB) and the fewest GPUs any task offered has declared (0: none yet):
    /// what `could_start` divides a node's free memory and devices by.
    smallest: (u64, u32),
    /// A task was offered: until then nothing is known of what tasks declare.
    offered: bool,
}

/// Why a task did not start on the node offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Not enough memory free.
    Full,
    /// It would delay the task the node is reserved for.
    Reserved,
    /// An older task waits (FCFS).
    Behind,
}

impl Memory {
    pub fn new(policy: Policy) -> Memory {
        Memory { policy, ..Memory::default() }
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    pub fn set_policy(&mut self, policy: Policy) {
        self.policy = policy;
    }

    /// The run has exclusive tasks: every task is committed on its node from now on.
    pub fn with_whole_nodes(mut self) -> Memory {
        self.whole_nodes = true;
        self
    }

    /// Whether an exclusive task runs on `node` (nothing else goes there meanwhile).
    pub fn runs_exclusive(&self, node: u32) -> bool {
        self.nodes.get(&node).is_some_and(|n| n.exclusive.is_some())
    }

    /// A node joined (or came back empty) with `budget_mb` for tasks (0: not accounted), and
    /// `gpus` devices.
    pub fn join(&mut self, node: u32, budget_mb: u64, cores: u32, gpus: u32) {
        self.leave(node);
        let n = Node {
            budget: budget_mb,
            gpus,
            largest: Size { mem_mb: budget_mb, cores, gpus },
            used: 0,
            gpus_used: 0,
            holds: IdMap::default(),
            reserved: None,
            exclusive: None,
        };
        self.nodes.insert(node, n);
    }

    /// An instance's members joined or were lost: it has `budget_mb` and `gpus` in all, and
    /// `largest` for one task. What it holds stays committed.
    pub fn resize(&mut self, node: u32, budget_mb: u64, gpus: u32, largest: Size) {
        if let Some(n) = self.nodes.get_mut(&node) {
            (n.budget, n.gpus, n.largest) = (budget_mb, gpus, largest);
        }
    }

    /// A node is gone (or drained): what it held is forgotten, its reservation given up.
    pub fn leave(&mut self, node: u32) {
        if let Some(n) = self.nodes.remove(&node) {
            if let Some(r) = n.reserved {
                self.reserved_on.remove(&r.task);
            }
        }
    }

    /// A task of `group` ran `ran_us` (it succeeded).
    pub fn observe(&mut self, group: u64, ran_us: u64) {
        let l = self.learned.entry(group).or_default();
        let x = ran_us as f64;
        if l.n == 0 {
            (l.mean, l.dev) = (x, x / 2.0);
        } else {
            l.dev += ((x - l.mean).abs() - l.dev) / 4.0;
            l.mean += (x - l.mean) / 8.0;
        }
        l.n += 1;
    }

    /// When a task like `need` is expected to end, from `now_us`: its hint, or what its group
    /// took when that was longer; `u64::MAX` when unknown.
    fn expected_end(&self, need: &Need, now_us: u64, margin: f64) -> u64 {
        let learned = self.learned.get(&need.group).map(|l| l.mean + margin * l.dev).unwrap_or(0.0);
        match need.runtime_us.max(learned as u64) {
            0 => u64::MAX,
            run => now_us.saturating_add(run),
        }
    }

    /// The memory `need` is accounted for on a node with `budget`: none for a task without
    /// `mem=`, on a node without a budget, or when memory is ignored.
    fn mem_of(&self, budget: u64, need: &Need) -> u64 {
        if self.policy == Policy::Ignore || budget == 0 {
            0
        } else {
            need.mem_mb
        }
    }

    /// Offers `need` (a task that is not waiting) to `node`: `Ok` commits its memory and GPUs
    /// there; on `Err` the caller hands it to `wait`.
    pub fn admit(&mut self, node: u32, need: Need, now_us: u64) -> Result<(), Refusal> {
        let Some(n) = self.nodes.get(&node) else { return Ok(()) };
        let mem = self.mem_of(n.budget, &need);
        self.offered = true;
        if mem == 0 && need.gpus == 0 && !self.whole_nodes {
            return Ok(());
        }
        self.smallest = (least(self.smallest.0, mem), least(self.smallest.1.into(), need.gpus.into()) as u32);
        if mem > 0 && self.policy == Policy::Fcfs && self.waiting.keys().next().is_some_and(|&w| w < need.task) {
            return Err(Refusal::Behind);
        }
        self.check(node, &need, now_us)?;
        self.commit(node, need, now_us);
        Ok(())
    }

    fn check(&self, node: u32, need: &Need, now_us: u64) -> Result<(), Refusal> {
        let n = &self.nodes[&node];
        let mem = self.mem_of(n.budget, need);
        if !n.fits_now(mem, need.gpus) || n.exclusive.is_some() || (need.exclusive && !n.holds.is_empty()) {
            return Err(Refusal::Full);
        }
        match n.reserved {
            Some(r) if r.task != need.task && r.exclusive => {
                // Kept for an exclusive task: only what should end before the node empties.
                let at = n.empty_at(now_us);
                let before = need.runtime_us > 0 && at != u64::MAX && self.expected_end(need, now_us, 4.0) <= at;
                if before {
                    Ok(())
                } else {
                    Err(Refusal::Reserved)
                }
            }
            // Reservations keep memory and GPUs: what uses neither passes.
            Some(r) if r.task != need.task && (mem > 0 || need.gpus > 0) => {
                let mem_beside = mem == 0 || n.used + mem + self.mem_of(n.budget, &r) <= n.budget;
                let beside = mem_beside && (need.gpus == 0 || n.gpus_used + need.gpus + r.gpus <= n.gpus);
                let at = n.free_at(r.mem_mb, now_us);
                // It must end before, even if it runs as long as its group's slow ones.
                let before = need.runtime_us > 0 && at != u64::MAX && self.expected_end(need, now_us, 4.0) <= at;
                if beside || before {
                    Ok(())
                } else {
                    Err(Refusal::Reserved)
                }
            }
            _ => Ok(()),
        }
    }

    fn commit(&mut self, node: u32, need: Need, now_us: u64) {
        if let Some(kept) = self.reserved_on.remove(&need.task) {
            if let Some(k) = self.nodes.get_mut(&kept) {
                k.reserved = None;
            }
        }
        let mem = self.mem_of(self.nodes[&node].budget, &need);
        let end_us = if need.runtime_us > 0 { self.expected_end(&need, now_us, 0.0) } else { u64::MAX };
        let n = self.nodes.get_mut(&node).expect("committed on a known node");
        n.used += mem;
        n.gpus_used += need.gpus;
        n.holds.insert(need.task, Hold { mem, gpus: need.gpus, end_us });
        if need.exclusive {
            n.exclusive = Some(need.task);
        }
    }

    /// `need` could not start where it was offered: it waits, and under `Backfill` gets a
    /// reservation if a node is free of one.
    pub fn wait(&mut self, need: Need, now_us: u64) {
        if self.waiting.insert(need.task, need).is_none() {
            self.by_size.entry((need.mem_mb, need.gpus, need.exclusive)).or_default().insert(need.task);
        }
        self.reserve_waiting(now_us);
    }

    /// Tasks waiting for memory.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// The oldest waiting task that may start on `node` now, committed there and no longer
    /// waiting.
    pub fn take_waiting(&mut self, node: u32, now_us: u64) -> Option<Need> {
        let n = self.nodes.get(&node)?;
        let fits = |need: &Need| n.could_hold(need, self.mem_of(n.budget, need));
        // The task this node is kept for comes first; then the oldest that may start here.
        let own = n.reserved.filter(|r| self.check(node, r, now_us).is_ok());
        let candidate = if let Some(own) = own {
            Some(own)
        } else if self.policy == Policy::Fcfs {
            self.waiting.values().next().copied().filter(|w| fits(w) && self.check(node, w, now_us).is_ok())
        } else {
            self.by_size
                .values()
                .filter_map(|ids| ids.iter().map(|id| self.waiting[id]).find(fits))
                .filter(|w| self.check(node, w, now_us).is_ok())
                .min_by_key(|w| w.task)
        }?;
        self.unwait(candidate.task);
        self.commit(node, candidate, now_us);
        self.reserve_waiting(now_us);
        Some(candidate)
    }

    /// Stops waiting for a task (it failed, or was found done), giving up its reservation.
    pub fn forget(&mut self, task: u64, now_us: u64) {
        if self.unwait(task) {
            if let Some(node) = self.reserved_on.remove(&task) {
                if let Some(n) = self.nodes.get_mut(&node) {
                    n.reserved = None;
                }
            }
            self.reserve_waiting(now_us);
        }
    }

    fn unwait(&mut self, task: u64) -> bool {
        let Some(need) = self.waiting.remove(&task) else { return false };
        let key = (need.mem_mb, need.gpus, need.exclusive);
        if let Some(ids) = self.by_size.get_mut(&key) {
            ids.remove(&task);
            if ids.is_empty() {
                self.by_size.remove(&key);
            }
        }
        true
    }

    /// The waiting tasks, oldest first (to find those no node can ever run).
    pub fn waiting_tasks(&self) -> impl Iterator<Item = &Need> {
        self.waiting.values()
    }

    /// Gives waiting tasks without a reservation one, oldest first, on the node where each can
    /// start earliest among those not reserved yet.
    fn reserve_waiting(&mut self, now_us: u64) {
        if self.reserved_on.len() >= self.nodes.len() {
            return;
        }
        let backfill = self.policy == Policy::Backfill;
        // The oldest few: a long backlog of big tasks must not make every wait a scan of it.
        let unreserved: Vec<Need> = self
            .waiting
            .values()
            .filter(|w| (w.exclusive || (backfill && w.mem_mb > 0)) && !self.reserved_on.contains_key(&w.task))
            .take(self.nodes.len().saturating_sub(self.reserved_on.len()) + 8)
            .copied()
            .collect();
        for need in unreserved {
            let best = self
                .nodes
                .iter()
                .filter(|(_, n)| {
                    n.reserved.is_none()
                        && (need.exclusive || n.budget > 0)
                        && n.could_hold(&need, self.mem_of(n.budget, &need))
                })
                .map(|(&id, n)| {
                    let at = if need.exclusive { n.empty_at(now_us) } else { n.free_at(need.mem_mb, now_us) };
                    (at, u64::MAX - n.budget.saturating_sub(n.used), id)
                })
                .min();
            let Some((_, _, node)) = best else {
                if self.reserved_on.len() >= self.nodes.len() {
                    return;
                }
                continue; // too big for the free nodes; a younger, smaller one may fit one
            };
            self.nodes.get_mut(&node).unwrap().reserved = Some(need);
            self.reserved_on.insert(need.task, node);
        }
    }

    /// Where waiting `task` could start if some running tasks were stopped (preempted): the
    /// node, and the fewest tasks to stop there, largest first, among those `may_stop` allows.
    /// Tasks already being stopped for it (`stopping`) count as gone, so a node they make room
    /// on needs none more (an empty list). None if the task is not waiting, may start now, is
    /// exclusive (it waits for a node to drain), or no node has room even so. On an instance
    /// (sums of several members) the room must be on one member: only what is freed beyond all
    /// the other members' memory and GPUs counts.
    pub fn room_for(
        &self,
        task: u64,
        may_stop: &dyn Fn(u64) -> bool,
        stopping: &dyn Fn(u64) -> bool,
        now_us: u64,
    ) -> Option<(u32, Vec<u64>)> {
        let need = self.waiting.get(&task).filter(|w| !w.exclusive)?;
        let mut best: Option<(u32, Vec<u64>)> = None;
        for (&id, n) in &self.nodes {
            let mem = self.mem_of(n.budget, need);
            if !n.could_hold(need, mem) || n.exclusive.is_some() {
                continue;
            }
            if self.check(id, need, now_us).is_ok() {
                return None; // it starts as soon as it is offered
            }
            let slack = (n.budget.saturating_sub(n.largest.mem_mb), n.gpus.saturating_sub(n.largest.gpus));
            let mem = if mem > 0 { mem + slack.0 } else { 0 };
            let want_gpus = if need.gpus > 0 { need.gpus + slack.1 } else { 0 };
            let (mut free, mut gpus) = (n.budget.saturating_sub(n.used), n.gpus.saturating_sub(n.gpus_used));
            let mut stoppable = Vec::new();
            for (&t, h) in &n.holds {
                if stopping(t) {
                    (free, gpus) = (free + h.mem, gpus + h.gpus);
                } else if may_stop(t) {
                    stoppable.push((h.mem, h.gpus, t));
                }
            }
            stoppable.sort_unstable_by(|a, b| b.cmp(a));
            let mut victims = Vec::new();
            for (m, g, t) in stoppable {
                if free >= mem && gpus >= want_gpus {
                    break;
                }
                (free, gpus) = (free + m, gpus + g);
                victims.push(t);
            }
            let room = free >= mem && gpus >= want_gpus;
            if room && best.as_ref().is_none_or(|(_, v)| victims.len() < v.len()) {
                best = Some((id, victims));
            }
        }
        best
    }

    /// Keeps `node` for waiting `task` (room is being made there for it), taking the node's
    /// reservation from whatever task held it (it gets another in turn).
    pub fn reserve_on(&mut self, task: u64, node: u32, now_us: u64) {
        let Some(&need) = self.waiting.get(&task) else { return };
        if self.reserved_on.get(&task) == Some(&node) || !self.nodes.contains_key(&node) {
            return;
        }
        if let Some(old) = self.reserved_on.remove(&task) {
            if let Some(n) = self.nodes.get_mut(&old) {
                n.reserved = None;
            }
        }
        let n = self.nodes.get_mut(&node).expect("a known node");
        if let Some(other) = n.reserved.replace(need) {
            self.reserved_on.remove(&other.task);
        }
        self.reserved_on.insert(task, node);
        self.reserve_waiting(now_us);
    }

    /// The task's attempt ended (or came back): its memory is free.
    pub fn ended(&mut self, node: u32, task: u64) {
        if let Some(n) = self.nodes.get_mut(&node) {
            if let Some(h) = n.holds.remove(&task) {
                n.used -= h.mem;
                n.gpus_used -= h.gpus;
            }
            if n.exclusive == Some(task) {
                n.exclusive = None;
            }
        }
    }

    /// GPUs committed on a node, and its devices.
    pub fn gpus_committed(&self, node: u32) -> Option<(u32, u32)> {
        self.nodes.get(&node).map(|n| (n.gpus_used, n.gpus))
    }

    /// Memory committed on a node, and its budget.
    pub fn committed(&self, node: u32) -> Option<(u64, u64)> {
        self.nodes.get(&node).map(|n| (n.used, n.budget))
    }

    /// At most how many more tasks could start on `node` now, as far as its free memory and GPUs
    /// tell: each task needs at least the least memory, or the fewest GPUs, offered so far;
    /// `Some(0)` before any task was offered, when nothing is known yet. `None` while neither
    /// limits (no task has declared either, or the node accounts neither: GPU tasks do not wait
    /// on a node without GPUs, they go elsewhere).
    pub fn could_start(&self, node: u32) -> Option<u64> {
        let n = self.nodes.get(&node)?;
        let accounts = (n.budget > 0 && self.policy != Policy::Ignore, n.gpus > 0);
        if !self.offered {
            return (accounts.0 || accounts.1).then_some(0);
        }
        let (mem, gpus) = self.smallest;
        let by_mem = (mem > 0 && accounts.0).then(|| n.budget.saturating_sub(n.used) / mem);
        let by_gpus = (gpus > 0 && accounts.1).then(|| u64::from(n.gpus.saturating_sub(n.gpus_used) / gpus));
        // A task may need only one of the two: the larger count bounds what could start.
        by_mem.into_iter().chain(by_gpus).max()
    }

    /// The task a node is kept for.
    pub fn reservation(&self, node: u32) -> Option<u64> {
        self.nodes.get(&node).and_then(|n| n.reserved.map(|r| r.task))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;

    fn need(task: u64, mem_mb: u64, runtime_s: u64) -> Need {
        Need { task, mem_mb, cores: 1, gpus: 0, runtime_us: runtime_s * S, group: runtime_s, exclusive: false }
    }

    fn two_nodes(policy: Policy) -> Memory {
        let mut m = Memory::new(policy);
        m.join(0, 1000, 4, 0);
        m.join(1, 1000, 4, 0);
        m
    }

    #[test]
    fn what_could_start_counts_the_smallest_need_offered_into_what_is_free() {
        let mut m = two_nodes(Policy::Backfill);
        assert_eq!(m.could_start(0), Some(0), "nothing known yet");
        m.join(3, 0, 4, 0);
        assert_eq!(m.could_start(3), None, "a node that accounts nothing");
        assert_eq!(m.admit(0, need(1, 0, 0), 0), Ok(()));
        assert_eq!(m.could_start(0), None, "a task without mem= does not bound anything");
        assert_eq!(m.admit(0, need(2, 300, 0), 0), Ok(()));
        assert_eq!(m.could_start(0), Some(2), "700 free, 300 each");
        assert_eq!(m.admit(0, need(3, 100, 0), 0), Ok(()));
        assert_eq!((m.could_start(0), m.could_start(1)), (Some(6), Some(10)));
        m.join(2, 0, 4, 2);
        assert_eq!(m.could_start(2), None, "no budget, no GPU task yet");
        assert_eq!(m.admit(2, Need { gpus: 1, ..need(4, 0, 0) }, 0), Ok(()));
        assert_eq!(m.could_start(2), Some(1));
        m.set_policy(Policy::Ignore);
        assert_eq!(m.could_start(0), None, "memory ignored");
    }

    #[test]
    fn commits_never_pass_the_budget() {
        let mut m = two_nodes(Policy::Backfill);
        assert_eq!(m.admit(0, need(1, 600, 0), 0), Ok(()));
        assert_eq!(m.admit(0, need(2, 600, 0), 0), Err(Refusal::Full));
        assert_eq!(m.admit(0, need(3, 400, 0), 0), Ok(()));
        assert_eq!(m.committed(0), Some((1000, 1000)));
        m.ended(0, 1);
        assert_eq!(m.committed(0), Some((400, 1000)));
        m.ended(0, 1);
        assert_eq!(m.committed(0), Some((400, 1000)), "an end counted once");
    }

    #[test]
    fn unaccounted_tasks_and_nodes_pass() {
        let mut m = two_nodes(Policy::Backfill);
        m.join(2, 0, 4, 0);
        assert_eq!(m.admit(2, need(1, 5000, 0), 0), Ok(()), "a node without a budget");
        assert_eq!(m.admit(0, need(2, 0, 0), 0), Ok(()), "a task without mem=");
        let mut m = two_nodes(Policy::Ignore);
        assert_eq!(m.admit(0, need(1, 900, 0), 0), Ok(()));
        assert_eq!(m.admit(0, need(2, 900, 0), 0), Ok(()), "ignored");
    }

    #[test]
    fn a_waiting_task_reserves_the_node_that_frees_first_and_small_ones_fill_only_before_it() {
        let mut m = two_nodes(Policy::Backfill);
        // Node 0: 700 MiB until t=10 s; node 1: 700 MiB until t=20 s.
        m.admit(0, need(1, 700, 10), 0).unwrap();
        m.admit(1, need(2, 700, 20), 0).unwrap();
        // A 950 MiB task fits neither now: it waits, kept on node 0 (free at 10 s).
        assert_eq!(m.admit(0, need(3, 950, 5), S), Err(Refusal::Full));
        m.wait(need(3, 950, 5), S);
        assert_eq!(m.reservation(0), Some(3));
        // A small task that ends by 10 s runs on node 0; one that would not, does not.
        assert_eq!(m.admit(0, need(4, 100, 8), S), Ok(()));
        assert_eq!(m.admit(0, need(5, 100, 30), S), Err(Refusal::Reserved));
        assert_eq!(m.admit(0, need(6, 100, 0), S), Err(Refusal::Reserved), "no hint: could be long");
        // Node 1 has no reservation: the long one runs there.
        assert_eq!(m.admit(1, need(5, 100, 30), S), Ok(()));
        // Task 1 ends; task 4 still holds 100: 950 is free only after it.
        m.ended(0, 1);
        assert_eq!(m.take_waiting(0, 2 * S), None);
        m.ended(0, 4);
        assert_eq!(m.take_waiting(0, 3 * S).map(|n| n.task), Some(3));
        assert_eq!(m.reservation(0), None, "started: the node is free of it");
        assert_eq!(m.waiting(), 0);
    }

    #[test]
    fn a_big_task_is_not_starved_by_a_stream_of_small_ones() {
        // One node, 1000 MiB; small tasks of 300 MiB without hints keep coming. FCFS order of
        // arrival: small 1-3 run, big 4 (800) arrives, then smalls keep arriving.
        let mut m = Memory::new(Policy::Backfill);
        m.join(0, 1000, 8, 0);
        for t in 1..=3 {
            m.admit(0, need(t, 300, 0), 0).unwrap();
        }
        assert!(m.admit(0, need(4, 800, 0), 0).is_err());
        m.wait(need(4, 800, 0), 0);
        let mut next = 5;
        let mut running: Vec<u64> = vec![1, 2, 3];
        let mut big_started = false;
        for step in 1..20 {
            // The oldest running ends; the node offers itself to the waiting, then to new ones.
            let done = running.remove(0);
            m.ended(0, done);
            if m.take_waiting(0, step * S).is_some() {
                big_started = true;
                break;
            }
            if m.admit(0, need(next, 300, 0), step * S).is_ok() {
                running.push(next);
            }
            next += 1;
        }
        assert!(big_started, "the big task started once the running small ones ended");
        assert!(next <= 8, "no small task started after the big one arrived ({next})");
    }

    #[test]
    fn fcfs_holds_every_later_task_with_memory() {
        let mut m = two_nodes(Policy::Fcfs);
        m.admit(0, need(1, 700, 10), 0).unwrap();
        m.admit(1, need(2, 700, 10), 0).unwrap();
        assert!(m.admit(0, need(3, 900, 1), 0).is_err());
        m.wait(need(3, 900, 1), 0);
        assert_eq!(m.reservation(0), None, "no reservations under FCFS");
        assert_eq!(m.admit(1, need(4, 100, 1), 0), Err(Refusal::Behind));
        m.ended(1, 2);
        assert_eq!(m.take_waiting(1, S).map(|n| n.task), Some(3));
        assert_eq!(m.admit(1, need(4, 100, 1), S), Ok(()), "nothing waits now");
    }

    #[test]
    fn one_reservation_per_node_and_the_next_gets_it_when_freed() {
        let mut m = two_nodes(Policy::Backfill);
        m.admit(0, need(1, 900, 10), 0).unwrap();
        m.admit(1, need(2, 900, 20), 0).unwrap();
        for t in 3..=5 {
            m.wait(need(t, 500, 1), 0);
        }
        assert_eq!((m.reservation(0), m.reservation(1)), (Some(3), Some(4)));
        m.ended(0, 1);
        assert_eq!(m.take_waiting(0, S).map(|n| n.task), Some(3));
        assert_eq!(m.reservation(0), Some(5), "the next waiting one takes the freed reservation");
        // 5 fits beside 3 (500 + 500): it starts too.
        assert_eq!(m.take_waiting(0, S).map(|n| n.task), Some(5));
    }

    #[test]
    fn a_lost_node_gives_up_its_reservation_and_waiting_tasks_can_be_forgotten() {
        let mut m = two_nodes(Policy::Backfill);
        m.admit(0, need(1, 900, 10), 0).unwrap();
        m.admit(1, need(2, 900, 20), 0).unwrap();
        m.wait(need(3, 500, 1), 0);
        assert_eq!(m.reservation(0), Some(3));
        m.leave(0);
        assert_eq!(m.waiting(), 1);
        m.wait(need(4, 500, 1), 0); // a new arrival re-runs the reservations
        assert_eq!(m.reservation(1), Some(3));
        m.forget(3, 0);
        assert_eq!(m.reservation(1), Some(4));
        m.forget(4, 0);
        assert_eq!((m.waiting(), m.reservation(1)), (0, None));
    }

    #[test]
    fn only_tasks_that_fit_the_node_are_taken_and_the_oldest_of_those() {
        let mut m = Memory::new(Policy::Backfill);
        m.join(0, 1000, 2, 0);
        m.join(1, 4000, 8, 0);
        m.admit(0, need(1, 800, 0), 0).unwrap();
        m.admit(1, need(2, 3900, 0), 0).unwrap();
        m.wait(need(3, 3000, 0), 0);
        m.wait(Need { cores: 4, ..need(4, 100, 0) }, 0);
        m.wait(need(5, 150, 0), 0);
        m.ended(0, 1);
        // Node 0 is kept for nobody (3 needs node 1's size, 4 its cores): 5 is the one.
        assert_eq!(m.take_waiting(0, S).map(|n| n.task), Some(5));
        assert_eq!(m.take_waiting(0, S), None);
    }

    #[test]
    fn gpus_are_committed_whatever_the_memory_policy_and_waiting_ones_start_in_turn() {
        let mut m = Memory::new(Policy::Ignore);
        m.join(0, 0, 8, 2);
        let gpu = |task| Need { gpus: 1, ..need(task, 0, 0) };
        assert_eq!(m.admit(0, gpu(1), 0), Ok(()));
        assert_eq!(m.admit(0, gpu(2), 0), Ok(()));
        assert_eq!(m.admit(0, gpu(3), 0), Err(Refusal::Full), "two devices");
        m.wait(gpu(3), 0);
        m.wait(gpu(4), 0);
        assert_eq!(m.admit(0, need(5, 0, 0), 0), Ok(()), "a task without GPUs is not held");
        assert_eq!(m.reservation(0), None, "no reservation for GPUs alone");
        m.ended(0, 2);
        assert_eq!(m.take_waiting(0, S).map(|n| n.task), Some(3));
        assert_eq!(m.take_waiting(0, S), None);
        assert_eq!(m.gpus_committed(0), Some((2, 2)));
        m.ended(0, 1);
        m.ended(0, 3);
        assert_eq!(m.take_waiting(0, S).map(|n| n.task), Some(4));
        assert_eq!(m.gpus_committed(0), Some((1, 2)));
        // A node without devices never takes a GPU task.
        m.join(1, 0, 8, 0);
        m.wait(gpu(6), 0);
        assert_eq!(m.take_waiting(1, S), None);
    }

    #[test]
    fn small_tasks_that_ran_longer_than_their_hint_are_judged_by_what_they_took() {
        let mut m = Memory::new(Policy::Backfill);
        m.join(0, 1000, 8, 0);
        m.admit(0, need(1, 600, 10), 0).unwrap();
        m.wait(need(2, 900, 1), 0);
        // Hinted 2 s, a task of that group fits before the reservation at 10 s...
        assert_eq!(m.admit(0, need(3, 100, 2), 0), Ok(()));
        m.ended(0, 3);
        // ...but its group took 9 s each time: 9 + 4 x deviation passes 10 s.
        for _ in 0..5 {
            m.observe(2, 9 * S);
        }
        assert_eq!(m.admit(0, need(4, 100, 2), 0), Err(Refusal::Reserved));
        // A group that keeps to its hint still fills.
        for _ in 0..5 {
            m.observe(1, S);
        }
        assert_eq!(m.admit(0, need(5, 100, 1), 0), Ok(()));
    }

    #[test]
    fn an_exclusive_task_drains_a_node_runs_alone_and_short_tasks_fill_only_before_it() {
        let mut m = Memory::new(Policy::Ignore).with_whole_nodes();
        m.join(0, 0, 4, 0);
        m.join(1, 0, 4, 0);
        // Node 0 runs tasks ending at 5 s and 8 s; node 1 one ending at 20 s.
        m.admit(0, need(1, 0, 5), 0).unwrap();
        m.admit(0, need(2, 0, 8), 0).unwrap();
        m.admit(1, need(3, 0, 20), 0).unwrap();
        let ex = Need { exclusive: true, ..need(4, 0, 2) };
        assert_eq!(m.admit(1, ex, 0), Err(Refusal::Full), "not beside anything");
        m.wait(ex, 0);
        assert_eq!(m.reservation(0), Some(4), "node 0 empties first (8 s)");
        assert_eq!(m.admit(0, need(5, 0, 1), 0), Ok(()), "ends before the node empties");
        assert_eq!(m.admit(0, need(6, 0, 0), 0), Err(Refusal::Reserved), "unknown end: could keep it busy");
        assert_eq!(m.admit(1, need(6, 0, 0), 0), Ok(()), "node 1 is not kept");
        for t in [1, 2, 5] {
            m.ended(0, t);
        }
        assert_eq!(m.take_waiting(0, 9 * S).map(|n| n.task), Some(4));
        assert!(m.runs_exclusive(0));
        assert_eq!(m.admit(0, need(7, 0, 0), 9 * S), Err(Refusal::Full), "nothing beside it");
        m.ended(0, 4);
        assert!(!m.runs_exclusive(0));
        assert_eq!(m.admit(0, need(7, 0, 0), 10 * S), Ok(()));
    }

    #[test]
    fn room_is_made_with_the_fewest_stops_and_stops_under_way_count() {
        let mut m = two_nodes(Policy::Backfill);
        for (task, node, mem) in [(1, 0, 300), (2, 0, 300), (3, 0, 300), (4, 1, 600), (5, 1, 300)] {
            assert_eq!(m.admit(node, need(task, mem, 0), 0), Ok(()));
        }
        m.wait(need(9, 700, 0), 0);
        let any = |_: u64| true;
        let none = |_: u64| false;
        // Node 0 needs two stops (100 + 300 + 300), node 1 one (100 + 600).
        assert_eq!(m.room_for(9, &any, &none, 0), Some((1, vec![4])));
        // Only the small ones may be stopped: node 0, two of them.
        let small = |t: u64| t <= 3;
        let (node, v) = m.room_for(9, &small, &none, 0).unwrap();
        assert_eq!((node, v.len()), (0, 2));
        // Once those two are being stopped nothing more is needed.
        let stopping = |t: u64| v.contains(&t);
        assert_eq!(m.room_for(9, &none, &stopping, 0), Some((0, vec![])));
        assert_eq!(m.room_for(9, &none, &none, 0), None, "nothing may be stopped");
        assert_eq!(m.room_for(8, &any, &none, 0), None, "not waiting");
        // The node is kept for it, and it starts there once the two have ended.
        m.reserve_on(9, 0, 0);
        assert_eq!(m.reservation(0), Some(9));
        assert_eq!(m.admit(0, need(10, 200, 0), 0), Err(Refusal::Full));
        for t in v {
            m.ended(0, t);
        }
        assert_eq!(m.take_waiting(0, 0).map(|n| n.task), Some(9));
    }

    #[test]
    fn an_instance_is_committed_against_its_sums_and_holds_no_task_larger_than_its_largest_member() {
        let mut m = Memory::new(Policy::Backfill);
        m.join(0, 1000, 2, 0);
        m.resize(0, 2000, 4, Size { mem_mb: 1000, cores: 2, gpus: 2 });
        assert_eq!(m.admit(0, need(1, 600, 0), 0), Ok(()));
        assert_eq!(m.admit(0, need(2, 600, 0), 0), Ok(()), "the second member's share");
        // By the sums a third fits (the head keeps it until a member has room for it).
        assert_eq!(m.admit(0, need(3, 600, 0), 0), Ok(()));
        assert_eq!(m.admit(0, need(4, 600, 0), 0), Err(Refusal::Full));
        m.wait(need(5, 1200, 0), 0);
        assert_eq!(m.reservation(0), None, "no member could ever hold 1200");
        assert_eq!(m.committed(0), Some((1800, 2000)));
    }

    #[test]
    fn a_reservation_keeps_gpus_too() {
        let mut m = Memory::new(Policy::Backfill);
        m.join(0, 1000, 4, 2);
        let gpus = |task, n| Need { gpus: n, ..need(task, 0, 0) };
        assert_eq!(m.admit(0, gpus(1, 2), 0), Ok(()));
        m.wait(gpus(2, 2), 0);
        m.reserve_on(2, 0, 0);
        m.ended(0, 1);
        // A younger GPU task may not take the devices kept for task 2; one without GPUs may.
        assert_eq!(m.admit(0, gpus(3, 1), 0), Err(Refusal::Reserved));
        assert_eq!(m.admit(0, need(4, 100, 0), 0), Ok(()));
        assert_eq!(m.take_waiting(0, 0).map(|n| n.task), Some(2));
    }

    #[test]
    fn room_on_an_instance_is_room_on_one_member() {
        // Two members of 1000 MiB, each running 600 + 400: stopping both 600s frees 1200 in all,
        // but 600 on each member, and 700 fits neither.
        let mut m = Memory::new(Policy::Backfill);
        m.join(0, 1000, 2, 0);
        m.resize(0, 2000, 0, Size { mem_mb: 1000, cores: 2, gpus: 0 });
        for (task, mem) in [(1, 600), (2, 400), (3, 600), (4, 400)] {
            assert_eq!(m.admit(0, need(task, mem, 0), 0), Ok(()));
        }
        m.wait(need(9, 700, 0), 0);
        let none = |_: u64| false;
        assert_eq!(m.room_for(9, &|t| t == 1 || t == 3, &none, 0), None);
        // Whatever may be stopped: enough that one member surely has room, not knowing which.
        let (_, v) = m.room_for(9, &|_| true, &none, 0).unwrap();
        assert_eq!(v.len(), 4);
    }

    #[test]
    fn policies_parse() {
        assert_eq!("fcfs".parse::<Policy>(), Ok(Policy::Fcfs));
        assert!("lifo".parse::<Policy>().unwrap_err().contains("backfill, fcfs, ignore"));
    }
}
