//! Moving work from an agent that is behind to agents that sit idle (issue 24, finding 7).
//!
//! An agent keeps a queue of tasks ahead of its slots (`machine::queue_target`), so tiny tasks
//! never wait for a round trip. When the partition has nothing left to hand out, that queue is
//! all the work there is: without hints, one agent may hold every long task while the others
//! have nothing. The leader then asks the agents with tasks queued beyond their slots for some
//! back (a Recall): those not started yet come back (`Report.recalled`) and go to agents that
//! can start them at once. It is work stealing at the tail of the run, as the partition's own
//! stealing is before it.
//!
//! `Recalls` keeps what was asked and what came back; `plan` decides whom to ask for how many.
//! Both are pure: the leader's core feeds them.

use std::collections::{BinaryHeap, HashMap, VecDeque};

#[derive(Debug, Default)]
pub struct Recalls {
    /// Given back unstarted, oldest first, for agents that can start them now.
    back: VecDeque<u64>,
    /// Asked back and not answered yet, with the agent asked. An agent says only which tasks it
    /// gave back; one that had started runs on, so entries leave when the task is no longer
    /// queued there (`prune`).
    asked: HashMap<u64, u32>,
    /// Recall frames sent, and tasks that came back, in this session.
    pub frames: u64,
    pub moved: u64,
}

impl Recalls {
    /// Task `id` came back unstarted: it waits for an agent that can start it.
    pub fn came_back(&mut self, id: u64) {
        self.asked.remove(&id);
        self.back.push_back(id);
        self.moved += 1;
    }

    pub fn take(&mut self) -> Option<u64> {
        self.back.pop_front()
    }

    pub fn is_asked(&self, id: u64) -> bool {
        self.asked.contains_key(&id)
    }

    /// Forgets asks that are moot: `queued(id, agent)` says whether the task still waits
    /// unstarted at the agent asked.
    pub fn prune(&mut self, queued: impl Fn(u64, u32) -> bool) {
        if !self.asked.is_empty() {
            self.asked.retain(|&id, &mut agent| queued(id, agent));
        }
    }

    /// Tasks on their way to idle slots: asked back, or back and not handed out yet.
    pub fn underway(&self) -> u64 {
        (self.asked.len() + self.back.len()) as u64
    }

    /// How many tasks each agent was asked for and has not answered.
    pub fn asked_of(&self) -> HashMap<u32, u64> {
        let mut n = HashMap::new();
        for &agent in self.asked.values() {
            *n.entry(agent).or_default() += 1;
        }
        n
    }

    pub fn ask(&mut self, agent: u32, ids: &[u64]) {
        self.asked.extend(ids.iter().map(|&id| (id, agent)));
        self.frames += 1;
    }
}

/// Agents asked at most, about, for one demand: each answers with a report of its own, and
/// queues levelled a task at a time spread a small demand over every agent whose queue was as
/// long (16 one-slot agents answered up to 162 recalls in the last 2 s of a run, measured:
/// bench/RESULTS.md in git's history).
const ASKED_PER_DEMAND: u64 = 4;

/// Whom to ask for how many tasks, to fill `demand` idle slots: each part of the demand (a
/// task, or a quarter of it for a larger one) is asked of the agent with the most still queued
/// beyond its slots (`queued`: agent, tasks), so the queues that are furthest behind shrink
/// first and about evenly. Returns (agent, tasks), in agent order.
pub fn plan(demand: u64, queued: &[(u32, u64)]) -> Vec<(u32, u64)> {
    let mut heap: BinaryHeap<(u64, std::cmp::Reverse<u32>)> =
        queued.iter().filter(|(_, n)| *n > 0).map(|&(a, n)| (n, std::cmp::Reverse(a))).collect();
    let mut take: HashMap<u32, u64> = HashMap::new();
    let part = demand.div_ceil(ASKED_PER_DEMAND).max(1);
    let mut left = demand;
    while left > 0 {
        let Some((n, std::cmp::Reverse(a))) = heap.pop() else { break };
        let k = part.min(n).min(left);
        *take.entry(a).or_default() += k;
        left -= k;
        if n > k {
            heap.push((n - k, std::cmp::Reverse(a)));
        }
    }
    let mut v: Vec<(u32, u64)> = take.into_iter().collect();
    v.sort_unstable();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_demand_among_equal_queues_is_asked_of_a_few_agents_not_of_every_one() {
        let queued: Vec<(u32, u64)> = (0..16).map(|a| (a, 300)).collect();
        let p = plan(32, &queued);
        assert_eq!(p.iter().map(|(_, n)| n).sum::<u64>(), 32);
        assert_eq!(p.len() as u64, ASKED_PER_DEMAND, "{p:?}");
    }

    #[test]
    fn the_longest_queues_give_first_and_no_more_than_they_hold() {
        assert_eq!(plan(4, &[(0, 10), (1, 2), (2, 0)]), [(0, 4)]);
        // Down to an even 2 each, then alternately.
        assert_eq!(plan(10, &[(0, 10), (1, 2)]), [(0, 9), (1, 1)]);
        assert_eq!(plan(100, &[(0, 3), (1, 2)]), [(0, 3), (1, 2)]);
        assert!(plan(5, &[(0, 0)]).is_empty());
        assert!(plan(0, &[(0, 9)]).is_empty());
    }

    #[test]
    fn what_came_back_goes_out_oldest_first_and_answered_asks_are_forgotten() {
        let mut r = Recalls::default();
        r.ask(3, &[7, 8, 9]);
        assert_eq!(r.underway(), 3);
        assert_eq!(r.asked_of()[&3], 3);
        r.came_back(8);
        r.came_back(7);
        // 9 started at agent 3 after all: no longer queued there.
        r.prune(|id, agent| agent == 3 && id != 9);
        assert_eq!(r.underway(), 2);
        assert!(!r.is_asked(9));
        assert_eq!((r.take(), r.take(), r.take()), (Some(8), Some(7), None));
        assert_eq!((r.frames, r.moved), (1, 2));
    }
}
