//! The agents the leader deals with (instance heads, and lone agents): what each has, what it
//! said it can take, and when it was last heard from and last told something. A part of `Core`
//! with the questions asked of it (does a task fit, how many may start, how many wait queued,
//! whose ack or heartbeat is due, who is silent); it does no I/O and uses nothing of `mod`.

use std::ops::Index;

use htc_core::idmap::IdMap;
use htc_core::shape::TaskShape;

use super::streak::Streak;

pub(super) struct Agent {
    /// The partition's index of the agent's instance.
    pub(super) instance: usize,
    /// Slots of its instance (all its members').
    pub(super) cores: u32,
    /// The most memory, GPUs and cores one task may have on it (its largest member's).
    pub(super) mem_mb: u64,
    pub(super) gpus: u32,
    pub(super) widest: u32,
    pub(super) credit: u64,
    /// Slots the agent last said it had nothing for, less what was sent since.
    pub(super) idle: u64,
    /// Core-milliseconds of runtime hints of the tasks it holds (running or queued).
    pub(super) ahead_ms: u64,
    pub(super) last_seq: u64,
    pub(super) acked_seq: u64,
    /// When it was last sent an Ack (of a report, or a heartbeat): what keeps it from holding.
    pub(super) told_us: u64,
    pub(super) alive: bool,
    pub(super) hostname: String,
    /// When it was last heard from (joined or reported).
    pub(super) heard_us: u64,
    /// Its failures in a row: a black hole fails everything while the others succeed.
    pub(super) streak: Streak,
    /// Found to be a black hole: it gets nothing more.
    pub(super) drained: bool,
    /// Its slots running a task, as it last reported (for the live view).
    pub(super) busy: u32,
    /// Attempts it ended: successes, and failures (retried or not).
    pub(super) done: u64,
    pub(super) failed: u64,
}

impl Agent {
    /// A member of `instance` with these resources, joined at `now_us`.
    pub(super) fn new(instance: usize, (cores, mem_mb, gpus): (u32, u64, u32), hostname: String, now_us: u64) -> Agent {
        Agent {
            instance,
            cores,
            mem_mb,
            gpus,
            widest: cores,
            credit: 0,
            idle: 0,
            ahead_ms: 0,
            last_seq: 0,
            acked_seq: 0,
            told_us: now_us,
            alive: true,
            hostname,
            heard_us: now_us,
            streak: Streak::default(),
            drained: false,
            busy: 0,
            done: 0,
            failed: 0,
        }
    }

    /// Alive and not drained: it may be given work.
    pub(super) fn usable(&self) -> bool {
        self.alive && !self.drained
    }

    /// Whether a task of this shape could ever run on it (cores, GPUs, memory).
    pub(super) fn fits(&self, s: &TaskShape) -> bool {
        s.cores as u32 <= self.widest
            && s.gpus as u32 <= self.gpus
            && (self.mem_mb == 0 || s.mem_mb == 0 || s.mem_mb as u64 <= self.mem_mb)
    }

    /// Slots it said were idle, less `sent` since. A lone agent's report may predate what it
    /// holds now (`held`, in flight with it), so never more than its slots less what it holds;
    /// a head's idle members (`heads`) are idle whatever the busy ones hold.
    pub(super) fn can_start(&self, sent: u64, held: u64, heads: bool) -> u64 {
        let idle = self.idle.saturating_sub(sent);
        if heads {
            idle
        } else {
            idle.min((self.cores as u64).saturating_sub(held))
        }
    }

    /// Tasks it holds (`held`) that wait unstarted: beyond its slots for a lone agent; beyond
    /// what runs for a head (`heads`), whose members' queues may hold work while another is idle.
    pub(super) fn queued(&self, held: u64, heads: bool) -> u64 {
        let running = if heads { self.busy } else { self.cores };
        held.saturating_sub(running as u64)
    }

    /// A report with sequence number `seq` came at `now_us`.
    pub(super) fn heard(&mut self, now_us: u64, seq: u64) {
        self.heard_us = now_us;
        self.last_seq = self.last_seq.max(seq);
    }
}

/// Every agent the leader deals with, by id.
#[derive(Default)]
pub(super) struct Agents {
    by_id: IdMap<u32, Agent>,
}

impl Agents {
    pub(super) fn get(&self, id: &u32) -> Option<&Agent> {
        self.by_id.get(id)
    }

    pub(super) fn get_mut(&mut self, id: &u32) -> Option<&mut Agent> {
        self.by_id.get_mut(id)
    }

    pub(super) fn contains_key(&self, id: &u32) -> bool {
        self.by_id.contains_key(id)
    }

    pub(super) fn insert(&mut self, id: u32, a: Agent) {
        self.by_id.insert(id, a);
    }

    pub(super) fn len(&self) -> usize {
        self.by_id.len()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&u32, &Agent)> {
        self.by_id.iter()
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &Agent> {
        self.by_id.values()
    }

    /// Whether some usable agent could ever run a task of this shape.
    pub(super) fn could_run(&self, s: &TaskShape) -> bool {
        self.values().any(|a| a.usable() && a.fits(s))
    }

    /// Live agents with credit, in id order (the same events always give the same decisions).
    pub(super) fn with_credit(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.iter().filter(|(_, a)| a.alive && a.credit > 0).map(|(&id, _)| id).collect();
        ids.sort_unstable();
        ids
    }

    /// Live agents whose last reports are not acknowledged yet: each is now, at `now_us`, with
    /// the sequence number to acknowledge.
    pub(super) fn acks_due(&mut self, now_us: u64) -> Vec<(u32, u64)> {
        let mut due = Vec::new();
        for (&id, a) in self.by_id.iter_mut().filter(|(_, a)| a.alive && a.last_seq > a.acked_seq) {
            a.acked_seq = a.last_seq;
            a.told_us = now_us;
            due.push((id, a.last_seq));
        }
        due
    }

    /// Live agents told nothing for `every` µs: each is sent a heartbeat now (an Ack of what was
    /// already acknowledged), with that sequence number.
    pub(super) fn heartbeats_due(&mut self, now_us: u64, every: u64) -> Vec<(u32, u64)> {
        let mut due = Vec::new();
        for (&id, a) in self.by_id.iter_mut().filter(|(_, a)| a.alive) {
            if now_us.saturating_sub(a.told_us) >= every {
                a.told_us = now_us;
                due.push((id, a.acked_seq));
            }
        }
        due
    }

    /// Live agents silent for `bound` µs or more, in id order, with how long.
    pub(super) fn silent(&self, now_us: u64, bound: u64) -> Vec<(u32, u64)> {
        let mut quiet: Vec<(u32, u64)> = self
            .iter()
            .filter(|(_, a)| a.alive && now_us.saturating_sub(a.heard_us) >= bound)
            .map(|(&id, a)| (id, now_us.saturating_sub(a.heard_us)))
            .collect();
        quiet.sort_unstable();
        quiet
    }

    /// The leader stood still for `gap` µs: its agents' silence in that time is not theirs.
    pub(super) fn excuse(&mut self, gap: u64, now_us: u64) {
        for a in self.by_id.values_mut() {
            a.heard_us = a.heard_us.saturating_add(gap).min(now_us);
        }
    }
}

impl Index<&u32> for Agents {
    type Output = Agent;

    fn index(&self, id: &u32) -> &Agent {
        &self.by_id[id]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(cores: u32, mem_mb: u64, gpus: u32) -> Agent {
        Agent::new(0, (cores, mem_mb, gpus), "n1".into(), 0)
    }

    #[test]
    fn a_task_fits_by_its_widest_member_its_gpus_and_its_memory_unless_either_declares_none() {
        let a = agent(4, 1024, 1);
        let shape = |cores, mem_mb, gpus| TaskShape { cores, mem_mb, gpus, ..Default::default() };
        assert!(a.fits(&shape(4, 1024, 1)));
        assert!(!a.fits(&shape(5, 0, 0)) && !a.fits(&shape(1, 1025, 0)) && !a.fits(&shape(1, 0, 2)));
        assert!(agent(4, 0, 0).fits(&shape(1, 1 << 20, 0)), "an agent that says no memory limits none");
    }

    #[test]
    fn a_lone_agent_starts_no_more_than_its_free_slots_a_head_what_its_members_said() {
        let mut a = agent(4, 0, 0);
        a.idle = 3;
        assert_eq!(a.can_start(1, 0, false), 2, "one sent since its report");
        assert_eq!(a.can_start(0, 3, false), 1, "its report predates what it holds");
        assert_eq!(a.can_start(0, 3, true), 3, "a head's idle members are idle");
        a.busy = 2;
        assert_eq!((a.queued(6, false), a.queued(6, true)), (2, 4));
    }

    #[test]
    fn acks_go_once_per_new_report_heartbeats_to_those_told_nothing_and_silence_is_excused() {
        let mut all = Agents::default();
        all.insert(2, Agent::new(0, (1, 0, 0), "b".into(), 0));
        all.insert(1, Agent::new(1, (1, 0, 0), "a".into(), 0));
        all.get_mut(&1).unwrap().heard(50, 7);
        assert_eq!(all.acks_due(60), vec![(1, 7)]);
        assert!(all.acks_due(61).is_empty(), "acknowledged once");
        assert_eq!(all.heartbeats_due(100, 50), vec![(2, 0)], "agent 1 was told at 60");
        assert_eq!(all.silent(1_000, 960), vec![(2, 1_000)]);
        all.excuse(500, 1_000);
        assert!(all.silent(1_000, 960).is_empty(), "the leader's own stall is not their silence");
        all.get_mut(&2).unwrap().credit = 1;
        all.get_mut(&1).unwrap().credit = 1;
        assert_eq!(all.with_credit(), vec![1, 2]);
    }
}
