//! Tasks in flight: which agent holds each dispatched task and in what state of its life, kept
//! in memory (a leader that dies loses them anyway; the next session re-runs what was not
//! recorded finished), and how a task comes back from an agent unstarted.

use super::*;

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
}

impl Flights {
    const FREE: Flight =
        Flight { agent: u32::MAX, life: Life { state: 0, attempts: 0, retries: 0, losses: 0, returns: 0 } };

    pub(super) fn new(ids: u64) -> Flights {
        Flights { by_id: vec![Flights::FREE; ids as usize + 1], per_agent: IdMap::default() }
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
        }
        let (n, top) = self.per_agent.entry(f.agent).or_default();
        *n += 1;
        *top = (*top).max(id);
    }

    pub(super) fn remove(&mut self, id: u64) -> Option<Flight> {
        let f = self.get(id)?;
        self.by_id[id as usize] = Flights::FREE;
        self.leave(f.agent);
        Some(f)
    }

    pub(super) fn leave(&mut self, agent: u32) {
        if let Some((n, _)) = self.per_agent.get_mut(&agent) {
            *n -= 1;
            if *n == 0 {
                self.per_agent.remove(&agent);
            }
        }
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

impl Core<'_> {
    /// Takes an attempt out of flight, and its memory off its agent.
    pub(super) fn land(&mut self, id: u64) -> Option<Flight> {
        let f = self.in_flight.remove(id)?;
        self.mem.ended(f.agent, id);
        if !self.preemptible_of.is_empty() {
            if let Some(p) = self.preemptible_of.remove(&id) {
                self.preemptible.remove(&(p, std::cmp::Reverse(id)));
                self.preempting.remove(&id);
                self.preempted_for.remove(&id);
            }
        }
        Some(f)
    }

    /// Takes back a task sent to `agent` and not reported started: it waits for another.
    /// The agent may have started it after all, so its next dispatch is a new attempt number
    /// (kept in the record: a late result of this one must not pass for the next).
    pub(super) fn take_back<E>(&mut self, t: &mut dyn Tasks<Error = E>, agent: u32, id: u64) -> Result<(), E> {
        if let Some(life) = self.unsend(t, agent, id, Step::Reclaim)? {
            if let Some(mut r) = t.get(id)? {
                self.record(t, id, &mut r, life)?;
            }
            self.push_retry(id);
        }
        Ok(())
    }

    /// A task `agent` gave back unstarted when asked (a Recall): it never ran, so its next
    /// dispatch is the same attempt; it goes to an agent that can start it now.
    pub(super) fn came_back<E>(&mut self, t: &dyn Tasks<Error = E>, agent: u32, id: u64) -> Result<(), E> {
        if self.unsend(t, agent, id, Step::Return)?.is_some() {
            self.recalls.came_back(id);
        }
        Ok(())
    }

    /// Task `id`, sent to `agent` and not reported started, is pending again. False when it is
    /// not (any more) in flight there unstarted.
    fn unsend<E>(&mut self, t: &dyn Tasks<Error = E>, agent: u32, id: u64, step: Step) -> Result<Option<Life>, E> {
        let Some(f) = self.in_flight.get(id).filter(|f| f.agent == agent && f.life.state() != State::Running) else {
            return Ok(None);
        };
        self.land(id);
        if let (Some(a), Some(r)) = (self.agents.get_mut(&agent), t.get(id)?) {
            a.ahead_ms = a.ahead_ms.saturating_sub(r.runtime_ms as u64 * r.cores as u64);
        }
        let life = self.move_life(f.life, step).map(|(life, _)| life);
        // Back from the agent: a resync it answers later must not take it back again (it may
        // be out with it once more by then, as a new dispatch the answer predates).
        if let Some(asked) = self.resyncs.get_mut(&agent) {
            asked.retain(|&x| x != id);
        }
        Ok(life)
    }
}
