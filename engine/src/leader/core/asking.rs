//! Asking queued work back for idle slots, at the tail of a run: when the leader last looked,
//! whether a look was put off, the share of queued tasks per slot it last found, and the recalls
//! under way. A part of the core's state of its own; how much to ask of whom (`plan`) is decided
//! here from figures the core gathers, and which tasks, and sending, stay with the core.

use htc_core::recall::{self, Recalls};

/// Queued tasks an idle slot gets at most with the one it starts, when work is asked back: each
/// moved task costs the leader a recall, a return and a dispatch, so the tail's queues are not
/// moved wholesale (an even share of queues a thousand long moved most of an `--exec none` run's
/// tail); with 32 a slot, an idle slot's tail takes a 32nd of the round trips. Each round trip
/// is a report from that slot's agent: at 8 a slot, 16 one-slot agents' tails were up to a third
/// of their reports (bench/RESULTS.md §14).
const SHARE_MAX: u64 = 31;

/// How often at most the leader looks for queued work to ask back for idle slots, per agent it
/// looks at: so that doing so costs a bounded share of its time however many there are (10 ms
/// with a thousand), and a few agents are asked at once.
const EVERY_US_PER_AGENT: u64 = 10;

#[derive(Default)]
pub(super) struct Asking {
    last_us: Option<u64>,
    pending: bool,
    /// Queued tasks per slot, across the agents, at the last look (at most `SHARE_MAX`): an
    /// idle slot gets one to start and this many more, so the queues even out in a few rounds,
    /// not one task per round trip (16 one-slot agents at the tail of tiny tasks reported about
    /// once per task).
    share: u64,
    pub(super) recalls: Recalls,
}

/// Where the live agents stand when the leader looks: slots idle, and slots in all.
pub(super) struct Idle {
    pub(super) idle: u64,
    pub(super) slots: u64,
}

impl Asking {
    /// Whether the leader may look now, with `agents` agents to look at; a look put off is
    /// pending (`pending`), for the first input after.
    pub(super) fn due(&mut self, now_us: u64, agents: usize) -> bool {
        let every = agents as u64 * EVERY_US_PER_AGENT;
        if self.last_us.is_some_and(|t| now_us.saturating_sub(t) < every) {
            self.pending = true;
            return false;
        }
        self.last_us = Some(now_us);
        self.pending = false;
        true
    }

    pub(super) fn pending(&self) -> bool {
        self.pending
    }

    /// The queued tasks an idle slot gets with the one it starts, at the last look.
    pub(super) fn share(&self) -> u64 {
        self.share
    }

    /// Whether enough is on its way already for `idle` idle slots, at the last share: then no
    /// agent's queue needs looking at.
    pub(super) fn enough_underway(&self, idle: u64) -> bool {
        idle * (1 + self.share) <= self.recalls.underway()
    }

    /// How many tasks to ask back from which agents: as many as the idle slots can start and
    /// queue at the even share, less what is already on its way (stealing half, as work
    /// stealing does, so the tail takes a few rounds, not one per task). `queued`: each live
    /// agent's tasks waiting beyond what runs.
    pub(super) fn plan(&mut self, at: Idle, queued: Vec<(u32, u64)>) -> Vec<(u32, u64)> {
        let asked = self.recalls.asked_of();
        let queued: Vec<(u32, u64)> =
            queued.into_iter().map(|(a, n)| (a, n.saturating_sub(asked.get(&a).copied().unwrap_or(0)))).collect();
        let even = queued.iter().map(|(_, n)| n).sum::<u64>() / at.slots.max(1);
        self.share = even.min(SHARE_MAX);
        let demand = (at.idle * (1 + self.share)).saturating_sub(self.recalls.underway());
        if demand == 0 {
            return Vec::new();
        }
        recall::plan(demand, &queued)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_look_at_most_once_per_ten_microseconds_an_agent_the_rest_pending() {
        let mut a = Asking::default();
        assert!(a.due(1_000, 100));
        assert!(!a.due(1_999, 100) && a.pending(), "within 1 ms of 100 agents: put off");
        assert!(a.due(2_000, 100) && !a.pending());
    }

    #[test]
    fn idle_slots_get_one_task_and_the_even_share_capped_less_what_is_under_way() {
        let mut a = Asking::default();
        // 4 slots, 2 idle; 400 queued on agent 1: an even share of 100 a slot, capped.
        assert!(!a.enough_underway(2));
        let plan = a.plan(Idle { idle: 2, slots: 4 }, vec![(1, 400), (2, 0)]);
        assert_eq!((plan, a.share()), (vec![(1, 2 * (1 + SHARE_MAX))], SHARE_MAX));
        // Asked and under way: the next look needs no agent's queue for the same idle slots.
        a.recalls.ask(1, &(1..=2 * (1 + SHARE_MAX)).collect::<Vec<_>>());
        assert!(a.enough_underway(2) && !a.enough_underway(3));
        // What was asked of an agent counts against what it has queued: of 100, 36 are left
        // to ask (an even share of 9 a slot).
        assert_eq!(a.plan(Idle { idle: 10, slots: 4 }, vec![(1, 100)]), [(1, 100 - 2 * (1 + SHARE_MAX))]);
        assert_eq!(a.share(), 9);
    }

    #[test]
    fn nothing_queued_asks_nothing() {
        let mut a = Asking::default();
        assert!(a.plan(Idle { idle: 3, slots: 4 }, vec![(1, 0), (2, 0)]).is_empty());
    }
}
