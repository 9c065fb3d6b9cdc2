//! Tasks in flight: which agent holds each dispatched task and in what state of its life, kept
//! in memory (a leader that dies loses them anyway; the next session re-runs what was not
//! recorded finished). A part of the core's state of its own: it knows tasks and agents by
//! their ids, nothing of the core.

use htc_core::idmap::IdMap;
use htc_core::task::{Life, State};

/// An attempt out at an agent: its life as `task::step` moved it (dispatched, then running),
/// while the ledger still holds the task as it was before the attempt.
#[derive(Debug, Clone, Copy)]
pub(super) struct Flight {
    pub(super) agent: u32,
    pub(super) life: Life,
}

/// The attempts in flight, indexed by task id: 8 bytes a task, and a batch's ids sit side by
/// side in memory. (A hash map here cost a cache miss per result: most of the leader's time.)
pub(super) struct Flights {
    pub(super) by_id: Vec<Flight>,
    /// Per agent: tasks held, and the highest id handed to it since it last held none (where a
    /// scan for its queued tasks starts: `unstarted_of`).
    pub(super) per_agent: IdMap<u32, (u64, u64)>,
    /// When each running attempt started, as its agent said. A result carries its own start;
    /// an attempt lost with its agent has only this one for its record (`htc log`). Only the
    /// attempts that run are here, so it stays as small as the slots.
    starts: IdMap<u64, u64>,
}

impl Flights {
    const FREE: Flight = Flight { agent: u32::MAX, life: Life::new(0) };

    pub(super) fn new(ids: u64) -> Flights {
        Flights { by_id: vec![Flights::FREE; ids as usize + 1], per_agent: IdMap::default(), starts: IdMap::default() }
    }

    pub(super) fn get(&self, id: u64) -> Option<Flight> {
        self.by_id.get(id as usize).copied().filter(|f| f.agent != u32::MAX)
    }

    pub(super) fn contains(&self, id: u64) -> bool {
        self.get(id).is_some()
    }

    pub(super) fn set_life(&mut self, id: u64, life: Life) {
        if let Some(f) = self.by_id.get_mut(id as usize).filter(|f| f.agent != u32::MAX) {
            f.life = life;
        }
    }

    pub(super) fn insert(&mut self, id: u64, f: Flight) {
        if id as usize >= self.by_id.len() {
            self.by_id.resize(id as usize + 1, Flights::FREE);
        }
        let old = std::mem::replace(&mut self.by_id[id as usize], f);
        if old.agent != u32::MAX {
            self.leave(old.agent);
            self.starts.remove(&id);
        }
        let (n, top) = self.per_agent.entry(f.agent).or_default();
        *n += 1;
        *top = (*top).max(id);
    }

    pub(super) fn remove(&mut self, id: u64) -> Option<Flight> {
        let f = self.get(id)?;
        self.by_id[id as usize] = Flights::FREE;
        self.leave(f.agent);
        self.starts.remove(&id);
        Some(f)
    }

    /// Notes when the attempt of task `id` in flight started.
    pub(super) fn started(&mut self, id: u64, start_us: u64) {
        if self.contains(id) {
            self.starts.insert(id, start_us);
        }
    }

    /// When the attempt of task `id` in flight started, if its agent said.
    pub(super) fn start_of(&self, id: u64) -> Option<u64> {
        self.starts.get(&id).copied()
    }

    pub(super) fn leave(&mut self, agent: u32) {
        if let Some((n, _)) = self.per_agent.get_mut(&agent) {
            *n -= 1;
            if *n == 0 {
                self.per_agent.remove(&agent);
            }
        }
    }

    /// How many tasks all agents hold.
    pub(super) fn held_total(&self) -> u64 {
        self.per_agent.values().map(|&(n, _)| n).sum()
    }

    /// How many attempts in flight their agents said they started.
    pub(super) fn running(&self) -> usize {
        self.starts.len()
    }

    /// How many tasks an agent holds (sent to it and not finished, in transit included).
    pub(super) fn held(&self, agent: u32) -> u64 {
        self.per_agent.get(&agent).map_or(0, |&(n, _)| n)
    }

    /// Up to `n` tasks `agent` holds and has not said it started, highest ids first (the last
    /// handed out within a share), leaving out those `skip` names. A scan from the top, only at
    /// the tail of a run (`ask_back`).
    pub(super) fn unstarted_of(&self, agent: u32, n: u64, skip: impl Fn(u64) -> bool) -> Vec<u64> {
        let Some(&(mut left, top)) = self.per_agent.get(&agent) else { return Vec::new() };
        let mut ids = Vec::new();
        for id in (0..=top.min(self.by_id.len() as u64 - 1)).rev() {
            if ids.len() as u64 == n || left == 0 {
                break;
            }
            let f = self.by_id[id as usize];
            if f.agent != agent {
                continue;
            }
            left -= 1;
            if f.life.state() != State::Running && !skip(id) {
                ids.push(id);
            }
        }
        ids
    }

    /// The ids an agent holds, in id order: a scan, but only on the rare loss of an agent.
    pub(super) fn of_agent(&self, agent: u32) -> Vec<u64> {
        if !self.per_agent.contains_key(&agent) {
            return Vec::new();
        }
        (0..self.by_id.len() as u64).filter(|&id| self.by_id[id as usize].agent == agent).collect()
    }
}
