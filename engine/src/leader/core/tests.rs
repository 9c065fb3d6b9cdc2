//! Scripted event sequences: the core fed joins, reports, losses and ticks at given times,
//! its frames and the records it wrote checked. No sockets, processes or clocks.

use super::*;
use crate::liveness::Liveness;
use htc_core::partition::Even;
use htc_core::record::{CommandAt, Ended};
use htc_core::shape::TaskShape;
use htc_core::task::Counts;
use htc_core::tree::Tree;
use std::collections::BTreeMap;

mod adds;
mod attempts;
mod deps;
mod explain;
mod give_back;

/// Task records in memory; the command of task N is "task N".
#[derive(Default)]
struct Mem {
    records: BTreeMap<u64, Record>,
    /// Added tasks' commands and keys.
    added: BTreeMap<u64, Vec<u8>>,
    keys: BTreeMap<Vec<u8>, u64>,
    /// The run's class names beyond `default`.
    classes: Vec<String>,
    attempts: Vec<(u64, Attempt)>,
    failed: Vec<u64>,
    puts: usize,
    /// Tasks' rules for their attempts, and how often they were read.
    rules: BTreeMap<u64, htc_core::attempts::Rules>,
    rules_read: std::cell::Cell<usize>,
}

impl Mem {
    fn with(n: u64, retries: u8, cores: u16) -> Mem {
        let mut m = Mem::default();
        for id in 1..=n {
            let cmd = CommandAt { off: id, ..Default::default() };
            m.records.insert(id, Record::new(cmd, TaskShape { retries, cores, ..Default::default() }));
        }
        m
    }
    fn counts(&self) -> Counts {
        let mut c = Counts::default();
        self.records.values().for_each(|r| c.add(r.state()));
        c
    }
    fn state(&self, id: u64) -> State {
        self.records[&id].state()
    }
}

impl Tasks for Mem {
    type Error = std::convert::Infallible;
    fn get(&self, id: u64) -> Result<Option<Record>, Self::Error> {
        Ok(self.records.get(&id).copied())
    }
    fn range(&self, ids: std::ops::Range<u64>) -> Result<Vec<(u64, Record)>, Self::Error> {
        Ok(self.records.range(ids).map(|(id, r)| (*id, *r)).collect())
    }
    fn apply(&mut self, c: &Change) -> Result<(), Self::Error> {
        match *c {
            Change::Record(id, r) => {
                self.records.insert(id, r);
                self.puts += 1;
            }
            Change::Attempt(id, a) => self.attempts.push((id, a)),
            Change::Failed(id, true) => self.failed.push(id),
            Change::Failed(id, false) => self.failed.retain(|&f| f != id),
        }
        Ok(())
    }
    fn command(&self, r: &Record) -> Vec<u8> {
        match self.added.get(&r.cmd_off()).filter(|_| r.command().is_added()) {
            Some(c) => c.clone(),
            None => format!("task {}", r.cmd_off()).into_bytes(),
        }
    }
    fn rules(&self, id: u64) -> Result<Option<htc_core::attempts::Rules>, Self::Error> {
        self.rules_read.set(self.rules_read.get() + 1);
        Ok(self.rules.get(&id).cloned())
    }
    fn next_id(&self) -> Result<u64, Self::Error> {
        Ok(self.records.keys().next_back().map_or(1, |id| id + 1))
    }
    fn add(&mut self, t: &NewTask) -> Result<(u64, Record), Self::Error> {
        let id = self.next_id()?;
        let shape = TaskShape { rules: !t.rules.is_empty(), ..t.shape };
        let r = Record::new(CommandAt::added(id, t.command.len() as u32, t.shell), shape);
        self.records.insert(id, r);
        self.added.insert(id, t.command.clone());
        if shape.rules {
            self.rules.insert(id, t.rules.clone());
        }
        if let Some(k) = &t.key {
            self.keys.insert(k.clone(), id);
        }
        Ok((id, r))
    }
    fn keyed(&self, key: &[u8]) -> Result<Option<u64>, Self::Error> {
        Ok(self.keys.get(key).copied())
    }
    fn classes(&self) -> Result<Vec<String>, Self::Error> {
        Ok(std::iter::once("default".to_string()).chain(self.classes.iter().cloned()).collect())
    }
    fn set_classes(&mut self, names: &[String]) -> Result<(), Self::Error> {
        self.classes = names[1..].to_vec();
        Ok(())
    }
}

fn core(m: &Mem, agents: usize) -> Core<'static> {
    let n = m.records.len() as u64;
    Core::new(Box::new(Even::new(1..n + 1, agents)), "job".into(), agents, m.counts(), 0)
}

fn join(agent: u32, cores: u32) -> Input {
    Input::Joined { agent, cores, mem_mb: 0, gpus: 0, hostname: format!("node{agent}") }
}

fn want(agent: u32, n: u32) -> Input {
    Input::Report { agent, report: msg::Report { want: n, ..Default::default() } }
}

/// Attempt `attempt` of task `id` exited with `exit`.
fn exited(id: u64, attempt: u32, exit: i32) -> msg::TaskResult {
    msg::TaskResult {
        id,
        attempt,
        ended: Ended { outcome: Outcome::Exited, value: exit, ..Ended::NONE },
        ..Default::default()
    }
}

fn result(agent: u32, seq: u64, id: u64, attempt: u32, exit: i32) -> Input {
    let r = exited(id, attempt, exit);
    Input::Report { agent, report: msg::Report { seq, results: vec![r], ..Default::default() } }
}

/// Feeds events in order; returns the frames sent and the ending, if any.
fn feed(c: &mut Core<'_>, m: &mut Mem, events: Vec<Input>) -> (Effects, Option<Ending>) {
    feed_at(c, m, 1_000, events)
}

/// As `feed`, the first event at `t0` µs.
fn feed_at(c: &mut Core<'_>, m: &mut Mem, t0: u64, events: Vec<Input>) -> (Effects, Option<Ending>) {
    let mut out = Vec::new();
    for (i, ev) in events.into_iter().enumerate() {
        if let Some(e) = c.handle(t0 + i as u64, m, ev, &mut out).unwrap() {
            return (out, Some(e));
        }
    }
    (out, c.ending())
}

/// The messages for agents in `out`, with their agents.
fn sent(out: &Effects) -> impl Iterator<Item = (u32, &ToAgent)> {
    out.iter().filter_map(|e| match e {
        Effect::ToAgent(a, m) => Some((*a, m)),
        Effect::GivenUp(_) | Effect::Added { .. } | Effect::Signalled | Effect::GiveBack { .. } => None,
    })
}

/// Whether `agent` was told to stop as `stop` says.
fn told(out: &Effects, agent: u32, stop: Stop) -> bool {
    sent(out).any(|(a, m)| a == agent && matches!(m, ToAgent::Shutdown { stop: s, .. } if *s == stop))
}

/// The agents told to stop in any way.
fn stopped(out: &Effects) -> Vec<u32> {
    sent(out).filter(|(_, m)| matches!(m, ToAgent::Shutdown { .. })).map(|(a, _)| a).collect()
}

/// (agent, [(id, attempt)]) of every Dispatch in `out`.
fn dispatched(out: &Effects) -> Vec<(u32, Vec<(u64, u32)>)> {
    sent(out)
        .filter_map(|(a, m)| match m {
            ToAgent::Dispatch(tasks) => Some((a, tasks.iter().map(|t| (t.id, t.attempt)).collect())),
            _ => None,
        })
        .collect()
}

#[test]
fn tasks_of_one_affinity_key_go_to_one_agent_whichever_share_they_are_in() {
    // Tasks 1-4 are agent 0's share, 5-8 agent 1's; the odd ones have key 7, the even ones
    // key 8; both agents have room for everything.
    let mut m = Mem::with(8, 0, 1);
    for id in 1..=8 {
        m.records.get_mut(&id).unwrap().shape_mut().affinity = 7 + (id % 2 == 0) as u32;
    }
    let mut c = core(&m, 2);
    let (out, _) = feed(&mut c, &mut m, vec![join(0, 8), join(1, 8), want(0, 8), want(1, 8), Input::Tick]);
    let mut on: BTreeMap<u64, u32> = BTreeMap::new();
    for (agent, tasks) in dispatched(&out) {
        for (id, _) in tasks {
            assert!(on.insert(id, agent).is_none(), "task {id} sent twice");
        }
    }
    assert_eq!(on.len(), 8, "every task is sent: {on:?}");
    for key in [7, 8] {
        let agents: std::collections::BTreeSet<u32> =
            on.iter().filter(|(id, _)| m.records[id].shape().affinity == key).map(|(_, a)| *a).collect();
        assert_eq!(agents.len(), 1, "key {key}'s tasks went to {agents:?}");
    }
}

#[test]
fn higher_priority_work_that_no_agent_can_take_preempts_a_lower_preemptible_task() {
    // Task 1: preemptible, priority 0; task 2: priority 5 with a retry. One agent, 2 cores.
    let mut m = Mem::with(2, 0, 1);
    m.records.get_mut(&1).unwrap().shape_mut().preemptible = true;
    let r2 = m.records.get_mut(&2).unwrap().shape_mut();
    (r2.priority, r2.retries) = (5, 1);
    let mut c = core(&m, 1);
    let (out, _) = feed(&mut c, &mut m, vec![join(0, 2), want(0, 2)]);
    assert_eq!(dispatched(&out), vec![(0, vec![(1, 1), (2, 1)])]);
    // Task 2 fails; the agent is busy (no idle slot): its retry waits at the leader.
    let busy =
        |results| Input::Report { agent: 0, report: msg::Report { seq: 1, results, idle: 0, ..Default::default() } };
    let failed = exited(2, 1, 1);
    let (out, _) = feed(&mut c, &mut m, vec![busy(vec![failed]), Input::Tick]);
    let preempts: Vec<_> = sent(&out)
        .filter_map(|(a, m)| match m {
            ToAgent::Preempt(ids) => Some((a, ids.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(preempts, vec![(0, vec![1])], "task 1 is told to stop for task 2");
    let (out, _) = feed(&mut c, &mut m, vec![Input::Tick]);
    assert!(!sent(&out).any(|(_, m)| matches!(m, ToAgent::Preempt(_))), "not twice");
    // It ends preempted: no retry used, a new attempt number; task 2 runs first.
    let pre = msg::TaskResult {
        id: 1,
        attempt: 1,
        ended: Ended { outcome: Outcome::Preempted, ..Ended::NONE },
        ..Default::default()
    };
    let rep = Input::Report {
        agent: 0,
        report: msg::Report { seq: 2, results: vec![pre], want: 2, idle: 2, ..Default::default() },
    };
    let (out, _) = feed(&mut c, &mut m, vec![rep]);
    assert_eq!(dispatched(&out), vec![(0, vec![(2, 2), (1, 2)])]);
    // The ledger holds it as before this dispatch (flights live in memory), a retry richer.
    assert_eq!((m.records[&1].state(), m.records[&1].shape().retries), (State::Pending, 1));
    assert_eq!(
        m.attempts.iter().filter(|(id, _)| *id == 1).map(|(_, a)| a.ended.outcome).collect::<Vec<_>>(),
        [Outcome::Preempted]
    );
}

#[test]
fn memory_is_committed_per_agent_and_a_big_task_waits_for_its_reservation() {
    // Tasks 1-4: 400 MiB; task 5: 900 MiB; 6-8: 100 MiB, no hints. One agent, 1000 MiB,
    // 4 cores. Even partition of one instance: all in one block.
    let mut m = Mem::with(8, 0, 1);
    for (id, r) in m.records.iter_mut() {
        r.shape_mut().mem_mb = match id {
            1..=4 => 400,
            5 => 900,
            _ => 100,
        };
    }
    let mut c = core(&m, 1);
    let joined = Input::Joined { agent: 0, cores: 4, mem_mb: 1000, gpus: 0, hostname: "n0".into() };
    let (out, _) = feed(&mut c, &mut m, vec![joined, want(0, 4)]);
    // 1, 2 fit (800); 3, 4 and 5 wait; 6 and 7 would fit, but the node is kept for 3
    // (the oldest waiting) and unhinted small tasks could delay it.
    assert_eq!(dispatched(&out), vec![(0, vec![(1, 1), (2, 1)])]);
    assert_eq!(c.mem.committed(0), Some((800, 1000)));
    assert_eq!(c.mem.reservation(0), Some(3));
    // 1 ends: 3 starts (400 + 400); then 2 ends: 4 starts; then both end: 5 (900) starts
    // alone, and 6 fits beside it.
    let (out, _) = feed(&mut c, &mut m, vec![report(0, 1, 0, &[(1, 1)])]);
    assert_eq!(dispatched(&out), vec![(0, vec![(3, 1)])]);
    let (out, _) = feed(&mut c, &mut m, vec![report(0, 1, 0, &[(2, 1)])]);
    assert_eq!(dispatched(&out), vec![(0, vec![(4, 1)])]);
    let (out, _) = feed(&mut c, &mut m, vec![report(0, 1, 0, &[(3, 1)])]);
    assert_eq!(dispatched(&out), vec![], "5 needs 900: 4's 400 is still out");
    let (out, _) = feed(&mut c, &mut m, vec![report(0, 2, 1, &[(4, 1)])]);
    assert_eq!(dispatched(&out), vec![(0, vec![(5, 1), (6, 1)])]);
    assert_eq!(c.mem.committed(0), Some((1000, 1000)));
    let (out, _) = feed(&mut c, &mut m, vec![report(0, 2, 2, &[(5, 1), (6, 1)])]);
    assert_eq!(dispatched(&out), vec![(0, vec![(7, 1), (8, 1)])]);
    let (_, end) = feed(&mut c, &mut m, vec![report(0, 2, 2, &[(7, 1), (8, 1)])]);
    assert_eq!(end, Some(Ending::Complete));
    assert_eq!(c.mem.committed(0), Some((0, 1000)));
}

#[test]
fn a_full_agent_s_deep_ask_leaves_the_partition_where_it_is_rather_than_in_the_waiting_queue() {
    // 1,000 tasks of 100 MiB; one agent of 2 cores and 1,000 MiB asks for 500 (a fast node's
    // queue). Ten fit; the rest would all wait, each through the costlier waiting path.
    let mut m = Mem::with(1_000, 0, 1);
    m.records.values_mut().for_each(|r| r.shape_mut().mem_mb = 100);
    let mut c = core(&m, 1);
    let joined = Input::Joined { agent: 0, cores: 2, mem_mb: 1000, gpus: 0, hostname: "n0".into() };
    let (out, _) = feed(&mut c, &mut m, vec![joined, want(0, 500)]);
    assert_eq!(dispatched(&out)[0].1.len(), 10);
    assert!(c.mem.waiting() <= 2, "a core's worth waits, not the block: {}", c.mem.waiting());
    for seq in 1..=20u64 {
        let done: Vec<(u64, u32)> = (0..5).map(|i| ((seq - 1) * 5 + i + 1, 1)).collect();
        let (out, _) = feed(&mut c, &mut m, vec![report(0, 5, 0, &done)]);
        let sent: usize = dispatched(&out).iter().map(|(_, t)| t.len()).sum();
        assert_eq!(sent, 5, "what ended is replaced");
        assert!(c.mem.waiting() <= 4, "report {seq}: {} wait", c.mem.waiting());
    }
    assert_eq!(c.mem.committed(0), Some((1000, 1000)));
}

#[test]
fn a_task_waiting_for_memory_fails_as_unschedulable_when_the_only_big_agent_is_lost() {
    let mut m = Mem::with(2, 0, 1);
    m.records.get_mut(&1).unwrap().shape_mut().mem_mb = 1500;
    m.records.get_mut(&2).unwrap().shape_mut().mem_mb = 1500;
    let mut c = core(&m, 2);
    let big = Input::Joined { agent: 0, cores: 1, mem_mb: 2000, gpus: 0, hostname: "big".into() };
    let small = Input::Joined { agent: 1, cores: 1, mem_mb: 1000, gpus: 0, hostname: "small".into() };
    let (out, _) = feed(&mut c, &mut m, vec![big, small, want(0, 1), want(1, 1)]);
    assert_eq!(dispatched(&out), vec![(0, vec![(1, 1)])]);
    let lost = Input::Lost { agent: 0, why: "gone".into() };
    let (_, end) = feed(&mut c, &mut m, vec![lost]);
    assert_eq!(end, Some(Ending::Complete), "nothing can run them any more");
    assert_eq!(m.records[&2].outcome(), Outcome::Unschedulable);
}

/// An agent of 4 cores with `gpus` GPUs.
fn joined_with_gpus(agent: u32, gpus: u32) -> Input {
    Input::Joined { agent, cores: 4, mem_mb: 0, gpus, hostname: format!("node{agent}") }
}

#[test]
fn gpu_tasks_go_only_to_agents_with_gpus_and_never_more_at_once_than_they_have() {
    // Tasks 1-6 want a GPU, 7-8 none; the even plan makes 1-4 agent 0's share, 5-8 agent 1's.
    // Agent 0 has no GPU, agent 1 two.
    let mut m = Mem::with(8, 0, 1);
    for id in 1..=6 {
        m.records.get_mut(&id).unwrap().shape_mut().gpus = 1;
    }
    let mut c = core(&m, 2);
    let (mut out, mut end) =
        feed(&mut c, &mut m, vec![joined_with_gpus(0, 0), joined_with_gpus(1, 2), want(0, 4), want(1, 4)]);
    // What each agent holds; each round it finishes all of it and asks for as much again.
    let mut held: BTreeMap<u32, Vec<(u64, u32)>> = BTreeMap::new();
    let mut most = 0;
    for round in 0..10 {
        for (agent, tasks) in dispatched(&out) {
            held.entry(agent).or_default().extend(tasks);
        }
        for (agent, tasks) in &held {
            let gpu_tasks = tasks.iter().filter(|(id, _)| m.records[id].shape().gpus > 0).count();
            assert!(*agent == 1 || gpu_tasks == 0, "round {round}: agent {agent} has no GPU: {held:?}");
            assert!(gpu_tasks <= 2, "round {round}: {gpu_tasks} GPU tasks at once on 2 GPUs: {held:?}");
            most = most.max(gpu_tasks);
        }
        assert!(c.mem.gpus_committed(1).is_some_and(|(used, has)| used <= has && has == 2));
        if end.is_some() {
            break;
        }
        out = Vec::new();
        for (&agent, tasks) in held.iter_mut().filter(|(_, t)| !t.is_empty()) {
            let done = std::mem::take(tasks);
            let (o, e) = feed(&mut c, &mut m, vec![report(agent, done.len() as u32, 4, &done)]);
            out.extend(o);
            end = end.or(e);
        }
    }
    assert_eq!((end, most), (Some(Ending::Complete), 2), "both GPUs busy at once");
    assert!((1..=8).all(|id| m.state(id) == State::Done), "{:?}", m.records);
    assert!((1..=6).all(|id| m.records[&id].agent() == 1), "every GPU task ran on agent 1: {:?}", m.records);
}

#[test]
fn a_task_wanting_more_gpus_than_any_agent_has_fails_as_unschedulable() {
    // Task 1 wants 4 GPUs, task 2 one; agent 0 has 2, agent 1 none.
    let mut m = Mem::with(2, 2, 1);
    m.records.get_mut(&1).unwrap().shape_mut().gpus = 4;
    m.records.get_mut(&2).unwrap().shape_mut().gpus = 1;
    let mut c = core(&m, 2);
    let (out, end) = feed(&mut c, &mut m, vec![joined_with_gpus(0, 2), joined_with_gpus(1, 0), want(0, 2), want(1, 2)]);
    assert_eq!(dispatched(&out), vec![(0, vec![(2, 1)])], "task 2 only where a GPU is");
    assert_eq!((m.state(1), m.records[&1].outcome()), (State::Failed, Outcome::Unschedulable));
    assert_eq!(end, None, "task 2 is still running");
    let (_, end) = feed(&mut c, &mut m, vec![report(0, 0, 4, &[(2, 1)])]);
    assert_eq!((end, m.state(2)), (Some(Ending::Complete), State::Done));
}

#[test]
fn an_agent_gets_what_it_asks_for_and_results_are_recorded_then_acked() {
    let mut m = Mem::with(10, 2, 1);
    let mut c = core(&m, 1);
    let (out, end) = feed(&mut c, &mut m, vec![join(0, 2), want(0, 4)]);
    assert_eq!(dispatched(&out), vec![(0, vec![(1, 1), (2, 1), (3, 1), (4, 1)])]);
    let Effect::ToAgent(0, ToAgent::Dispatch(tasks)) = &out[0] else { unreachable!() };
    assert_eq!(tasks[2].command, b"task 3");
    assert_eq!(end, None);
    // A dispatch writes nothing: the ledger learns of an attempt when it ends.
    assert_eq!((m.state(1), m.puts), (State::Pending, 0));
    assert_eq!((c.counts().get(State::Dispatched), c.counts().get(State::Pending)), (4, 6));

    let started = msg::Started { id: 3, attempt: 1, start_us: 5 };
    let start = Input::Report { agent: 0, report: msg::Report { started: vec![started], ..Default::default() } };
    let (out, _) = feed(&mut c, &mut m, vec![result(0, 1, 1, 1, 0), result(0, 2, 2, 1, 0), start]);
    assert!(out.is_empty(), "no ack before the commit: {out:?}");
    assert_eq!((m.state(1), m.state(2), m.state(3)), (State::Done, State::Done, State::Pending));
    assert_eq!(m.puts, 2, "one write per finished task");
    assert_eq!((c.counts().get(State::Running), c.counts().get(State::Dispatched)), (1, 1));
    let mut acks = Vec::new();
    c.acks(&mut acks);
    assert_eq!(acks, [Effect::ToAgent(0, ToAgent::Ack { seq: 2 })]);
    c.acks(&mut acks);
    assert_eq!(acks.len(), 1, "each report is acked once");
    let (_, _) = feed(&mut c, &mut m, vec![result(0, 3, 3, 1, 0), result(0, 4, 4, 1, 0)]);
    assert_eq!(c.counts(), m.counts(), "once nothing is in flight, the counts are the records'");
    assert_eq!(m.records[&3].start_us(), 0, "results carry their own start time");
}

/// A head lost with its instance's work: its members, cut off from it, come to the leader.
/// One that rejoins still holding tasks is told to stop them and come back empty (they went
/// back with the head); back empty, it works on for its instance's share.
#[test]
fn members_of_a_lost_head_come_back_to_the_leader_and_work_on_its_instance_s_share() {
    let mut m = Mem::with(8, 1, 1);
    let n = m.records.len() as u64;
    let mut c = Core::new(Box::new(Even::new(1..n + 1, 2)), "job".into(), 2, m.counts(), 0)
        .with_layout(Arc::new(Tree::instances(4, 2, 2)));
    let (out, _) = feed(&mut c, &mut m, vec![join(0, 2), join(2, 2), want(0, 4)]);
    assert_eq!(dispatched(&out), vec![(0, vec![(1, 1), (2, 1), (3, 1), (4, 1)])], "head 0: instance 0's share");
    let (out, _) = feed(
        &mut c,
        &mut m,
        vec![Input::Lost { agent: 0, why: "gone".into() }, Input::Rejoined { agent: 1, below: vec![] }],
    );
    assert!(
        told(&out, 1, Stop::Revive) && out.contains(&Effect::GivenUp(1)),
        "member 1 stops what it held and comes back empty: {out:?}"
    );
    let back = Input::Revived { agent: 1, cores: 2, mem_mb: 0, gpus: 0, hostname: "node1".into() };
    let (out, _) = feed(&mut c, &mut m, vec![back, want(1, 4)]);
    let to_member: Vec<u64> =
        dispatched(&out).into_iter().filter(|(a, _)| *a == 1).flat_map(|(_, t)| t).map(|(id, _)| id).collect();
    assert_eq!(to_member.len(), 4, "instance 0's tasks go to its member: {out:?}");
    assert!(to_member.iter().all(|id| *id <= 4), "from its instance's share first: {to_member:?}");
    // An agent of no instance of this job is still turned away.
    let (out, _) =
        feed(&mut c, &mut m, vec![Input::Revived { agent: 9, cores: 2, mem_mb: 0, gpus: 0, hostname: "x".into() }]);
    assert!(told(&out, 9, Stop::Abort), "{out:?}");
}

#[test]
fn instance_heads_stand_for_their_members_which_the_ledger_names() {
    // Four agents in instances of two: heads 0 and 2 are the partition's instances 0 and 1.
    let mut m = Mem::with(8, 1, 1);
    let n = m.records.len() as u64;
    let mut c = Core::new(Box::new(Even::new(1..n + 1, 2)), "job".into(), 2, m.counts(), 0)
        .with_layout(Arc::new(Tree::instances(4, 2, 2)));
    let lost = |agent: u32, id| msg::TaskResult {
        id,
        attempt: 1,
        ran_on: Some(agent + 1),
        ended: Ended { outcome: Outcome::Lost, ..Ended::NONE },
    };
    let from_head = |agent: u32, seq, cores, results| Input::Report {
        agent,
        report: msg::Report { seq, results, cores, want: 8, ..Default::default() },
    };
    let (out, _) = feed(&mut c, &mut m, vec![join(1, 2), join(0, 2), join(2, 2), want(2, 8)]);
    assert_eq!(dispatched(&out), vec![(2, vec![(5, 1), (6, 1), (7, 1), (8, 1)])], "head 2 holds instance 1's share");
    assert_eq!(c.progress(0).agents, 2, "a member that says Hello to the leader is ignored");

    let ok = msg::TaskResult { ended: Ended { outcome: Outcome::Exited, ..Ended::NONE }, ..lost(2, 5) };
    let (out, _) = feed(&mut c, &mut m, vec![from_head(2, 1, 4, vec![ok, lost(2, 6)])]);
    assert_eq!((m.state(5), m.records[&5].agent()), (State::Done, 3), "the ledger names the member that ran it");
    assert_eq!(m.state(6), State::Pending, "lost with its member: retried");
    assert_eq!(m.records[&6].losses(), 1);
    assert_eq!(
        dispatched(&out),
        vec![(2, vec![(6, 2)])],
        "the retry, a new attempt, goes back to the instance that asks"
    );
    assert_eq!(c.agents[&2].cores, 4, "the head speaks for its members' slots too");
    // A head gives back what a lost member had not reported started: it goes out again as a
    // new attempt, no loss counted.
    let give_back = Input::Report { agent: 2, report: msg::Report { returned: vec![7], ..Default::default() } };
    let (out, _) = feed(&mut c, &mut m, vec![give_back]);
    assert_eq!(dispatched(&out), vec![(2, vec![(7, 2)])], "the head still asks: to it again");
    assert_eq!(m.records[&7].losses(), 0);
}

fn report(agent: u32, want: u32, idle: u32, done: &[(u64, u32)]) -> Input {
    let results = done
        .iter()
        .map(|&(id, attempt)| msg::TaskResult {
            id,
            attempt,
            ended: Ended { outcome: Outcome::Exited, ..Ended::NONE },
            ..Default::default()
        })
        .collect();
    Input::Report { agent, report: msg::Report { want, idle, results, ..Default::default() } }
}

#[test]
fn busy_agents_leave_a_late_agent_its_share_and_idle_ones_steal_only_what_they_can_start() {
    let mut m = Mem::with(400, 2, 1);
    let mut c = core(&m, 4);
    // Agents 0-2 join and ask for far more than their cores: each gets its own 100.
    let (out, _) = feed(
        &mut c,
        &mut m,
        vec![
            join(0, 2),
            join(1, 2),
            join(2, 2),
            report(0, 150, 2, &[]),
            report(1, 150, 2, &[]),
            report(2, 150, 2, &[]),
        ],
    );
    let got: Vec<(u32, usize)> = dispatched(&out).iter().map(|(a, t)| (*a, t.len())).collect();
    assert_eq!(got, vec![(0, 100), (1, 100), (2, 100)]);
    // Agent 0 finishes its share while busy (no idle core): it takes nothing of agent 3's.
    let done: Vec<(u64, u32)> = (1..=100).map(|id| (id, 1)).collect();
    let (out, _) = feed(&mut c, &mut m, vec![report(0, 0, 0, &done)]);
    assert!(dispatched(&out).is_empty());
    // Now idle with 2 free cores: it steals 2 from the back of agent 3's share, no more.
    let (out, _) = feed(&mut c, &mut m, vec![report(0, 0, 2, &[])]);
    assert_eq!(dispatched(&out), vec![(0, vec![(399, 1), (400, 1)])]);
    // Agent 3 joins late and still finds the rest of its share.
    let (out, _) = feed(&mut c, &mut m, vec![join(3, 2), report(3, 200, 2, &[])]);
    assert_eq!(dispatched(&out), vec![(3, (301..=398).map(|id| (id, 1)).collect())]);
}

fn recalls(out: &Effects) -> Vec<(u32, Vec<u64>)> {
    sent(out)
        .filter_map(|(a, m)| match m {
            ToAgent::Recall(ids) => Some((a, ids.clone())),
            _ => None,
        })
        .collect()
}

/// Finding 7 of issue 24: with nothing left to hand out, an idle agent's slots are filled
/// from the queue of an agent that is behind, not left idle while that queue waits.
#[test]
fn idle_slots_get_what_waits_unstarted_in_a_busy_agent_s_queue() {
    let mut m = Mem::with(40, 0, 1);
    let mut c = core(&m, 2);
    let (out, _) = feed(&mut c, &mut m, vec![join(0, 2), join(1, 2), report(0, 32, 2, &[]), report(1, 32, 2, &[])]);
    let got: Vec<(u32, usize)> = dispatched(&out).iter().map(|(a, t)| (*a, t.len())).collect();
    assert_eq!(got, vec![(0, 20), (1, 20)]);
    // Agent 0 runs tasks 1 and 2 (long ones); agent 1 is done with its share and idle.
    let running = Input::Report {
        agent: 0,
        report: msg::Report {
            started: vec![
                msg::Started { id: 1, attempt: 1, start_us: 5 },
                msg::Started { id: 2, attempt: 1, start_us: 5 },
            ],
            ..Default::default()
        },
    };
    let done: Vec<(u64, u32)> = (21..=40).map(|id| (id, 1)).collect();
    let (out, _) = feed(&mut c, &mut m, vec![running, report(1, 20, 2, &done)]);
    assert!(dispatched(&out).is_empty());
    // Agent 0 queues 18 beyond its 2 slots: 4.5 per slot of the 4. Agent 1's 2 idle slots
    // are asked one task each to start and 4 each to queue, from the back of the queue:
    // both agents then hold 10.
    let ten: Vec<u64> = (11..=20).rev().collect();
    assert_eq!(recalls(&out), vec![(0, ten)], "the even share, from the back of the queue");
    // Said idle again before the answer: what is on its way is not asked for twice.
    let (out, _) = feed(&mut c, &mut m, vec![report(1, 0, 2, &[])]);
    assert!(recalls(&out).is_empty());
    // Agent 0 gives back all but 19, which had started; agent 1 gets the nine at once, as
    // the same attempts, and has no slot left idle to ask more for.
    let nine: Vec<u64> = (11..=20).rev().filter(|&id| id != 19).collect();
    let back = Input::Report {
        agent: 0,
        report: msg::Report {
            started: vec![msg::Started { id: 19, attempt: 1, start_us: 6 }],
            recalled: nine.clone(),
            ..Default::default()
        },
    };
    let (out, _) = feed_at(&mut c, &mut m, 2_000, vec![back]);
    let mut got = dispatched(&out);
    got.iter_mut().for_each(|(_, t)| t.sort_unstable());
    assert_eq!(got, vec![(1, nine.iter().rev().map(|&id| (id, 1)).collect())]);
    assert!(recalls(&out).is_empty());
    assert_eq!(c.moved_back(), 9);
    // Without stealing, nothing is asked back.
    let mut m = Mem::with(40, 0, 1);
    let mut c = core(&m, 2).without_stealing();
    let (out, _) = feed(&mut c, &mut m, vec![join(0, 2), join(1, 2), report(0, 32, 2, &[]), report(1, 32, 2, &[])]);
    assert_eq!(dispatched(&out).len(), 2);
    let (out, _) = feed(&mut c, &mut m, vec![report(1, 20, 2, &done)]);
    assert!(recalls(&out).is_empty());
}

/// HFlow's plan through the core: tasks of two runtimes alternate in the file; each of two
/// agents gets its half of the long ones first, read one by one (an id list, not a range).
#[test]
fn the_hflow_plan_sends_each_agent_its_long_tasks_first() {
    use htc_core::partition::{Classes, Grouper};
    let mut m = Mem::with(8, 2, 1);
    let mut g = Grouper::default();
    for (id, r) in m.records.iter_mut() {
        r.shape_mut().runtime_ms = if id % 2 == 0 { 320 } else { 10 };
        g.add(*id, 0, 0, r.shape().runtime_ms);
    }
    let params = htc_core::hflow::Params { s: 0.0, d: 0.0, t: 1.0 };
    let plan = Classes::new(g.finish(), 2, 4, params);
    let mut c = Core::new(Box::new(plan), "job".into(), 2, m.counts(), 0);
    let (out, _) = feed(&mut c, &mut m, vec![join(0, 2), join(1, 2), want(0, 3), want(1, 4)]);
    assert_eq!(dispatched(&out), vec![(0, vec![(2, 1), (4, 1), (1, 1)]), (1, vec![(6, 1), (8, 1), (5, 1), (7, 1)])]);
}

/// A task no joined agent can run waits for one that can (a wider agent may still join);
/// reports meanwhile do not offer it to every agent again and again.
#[test]
fn a_retry_nobody_can_take_costs_no_scan_of_every_agent_per_report() {
    let mut m = Mem::with(3, 2, 1);
    m.records.get_mut(&3).unwrap().shape_mut().cores = 4;
    let mut c = core(&m, 3);
    let (out, _) = feed(&mut c, &mut m, vec![join(0, 2), join(1, 2), want(0, 8), want(1, 8)]);
    assert_eq!(dispatched(&out).iter().map(|(_, t)| t.len()).sum::<usize>(), 2, "tasks 1 and 2");
    // Agent 0, idle, steals task 3 (the third agent's share): too wide, it waits as a retry.
    feed(&mut c, &mut m, vec![report(0, 1, 2, &[])]);
    assert_eq!(c.retry.iter().copied().collect::<Vec<_>>(), vec![3]);
    let scans = c.figures.scans;
    for _ in 0..100 {
        let (out, _) = feed(&mut c, &mut m, vec![report(0, 1, 2, &[])]);
        assert!(dispatched(&out).is_empty());
    }
    assert_eq!(c.figures.scans, scans);
    // A new retry is offered to every agent with credit at once, with one scan.
    let failed = exited(1, 1, 1);
    let who = dispatched(&out_of(
        &mut c,
        &mut m,
        Input::Report { agent: 0, report: msg::Report { seq: 1, results: vec![failed], ..Default::default() } },
    ));
    assert!(who.iter().any(|(_, t)| t.contains(&(1, 2))), "{who:?}");
    assert_eq!(c.figures.scans, scans + 1);
}

fn out_of(c: &mut Core<'_>, m: &mut Mem, ev: Input) -> Effects {
    feed(c, m, vec![ev]).0
}

/// Two classes without hints: the first in class order runs until `LEARN_AFTER` of its tasks
/// have succeeded; seen to be short, it then yields to the other, which may be long.
#[test]
fn the_hflow_plan_learns_the_runtimes_the_file_did_not_give() {
    use htc_core::partition::{Classes, Grouper, LEARN_AFTER};
    let mut m = Mem::with(40, 2, 1);
    let mut g = Grouper::default();
    for (id, r) in m.records.iter_mut() {
        r.shape_mut().class = if *id <= 20 { 1 } else { 2 };
        g.add(*id, 0, r.shape().class, 0);
    }
    let plan = Classes::new(g.finish(), 1, 1, htc_core::hflow::Params { s: 0.0, d: 0.0, t: 1.0 });
    let mut c = Core::new(Box::new(plan), "job".into(), 1, m.counts(), 0);
    let n = LEARN_AFTER;
    let (out, _) = feed(&mut c, &mut m, vec![join(0, 1), want(0, n as u32)]);
    assert_eq!(dispatched(&out), vec![(0, (1..=n).map(|id| (id, 1)).collect())]);
    // They ran 10 ms each.
    let results = (1..=n)
        .map(|id| msg::TaskResult {
            id,
            attempt: 1,
            ended: Ended {
                outcome: Outcome::Exited,
                start_us: 1_000_000 + id * 10_000,
                end_us: 1_000_000 + (id + 1) * 10_000,
                ..Ended::NONE
            },
            ..Default::default()
        })
        .collect();
    let done = Input::Report { agent: 0, report: msg::Report { seq: 1, results, want: 1, ..Default::default() } };
    let (out, _) = feed(&mut c, &mut m, vec![done]);
    assert_eq!(dispatched(&out), vec![(0, vec![(21, 1)])], "class 2 now goes first");
}

/// Long hinted tasks: past the horizon an agent gets only what it can start, however much
/// it asks for, so the rest waits in the partition for the next free core anywhere.
#[test]
fn past_the_horizon_an_agent_gets_only_what_it_can_start() {
    let mut m = Mem::with(12, 2, 1);
    m.records.values_mut().for_each(|r| r.shape_mut().runtime_ms = 3_000);
    let mut c = Core::new(Box::new(Even::new(1..13, 1)), "job".into(), 1, m.counts(), 0).with_horizon(HORIZON_MS);
    let (out, _) = feed(&mut c, &mut m, vec![join(0, 2), report(0, 32, 2, &[])]);
    assert_eq!(dispatched(&out), vec![(0, vec![(1, 1), (2, 1)])], "2 cores, 2 tasks of 3 s");
    // A report sent before that dispatch arrived still says 2 idle: nothing more is sent.
    let (out, _) = feed(&mut c, &mut m, vec![report(0, 0, 2, &[])]);
    assert!(dispatched(&out).is_empty(), "{out:?}");
    // One finishes: one core free, one task.
    let (out, _) = feed(&mut c, &mut m, vec![report(0, 0, 1, &[(1, 1)])]);
    assert_eq!(dispatched(&out), vec![(0, vec![(3, 1)])]);
}

#[test]
fn a_failing_task_is_retried_then_fails_with_its_history() {
    let mut m = Mem::with(1, 1, 1);
    let mut c = core(&m, 1);
    let (out, _) = feed(&mut c, &mut m, vec![join(0, 1), want(0, 1), result(0, 1, 1, 1, 3), want(0, 1)]);
    assert_eq!(dispatched(&out), vec![(0, vec![(1, 1)]), (0, vec![(1, 2)])], "the retry is attempt 2");
    assert_eq!(m.attempts.len(), 1, "the failed attempt is kept");
    let (_, end) = feed(&mut c, &mut m, vec![result(0, 2, 1, 2, 3)]);
    assert_eq!((m.state(1), m.failed.clone(), end), (State::Failed, vec![1], Some(Ending::Complete)));
    assert_eq!(c.counts().get(State::Failed), 1);
}

#[test]
fn the_live_view_counts_per_node_and_keeps_the_latest_failures() {
    let mut m = Mem::with(3, 1, 1);
    let mut c = core(&m, 1);
    let feeds = vec![join(0, 4), want(0, 3), result(0, 1, 1, 1, 0), result(0, 2, 2, 1, 3), report(0, 0, 3, &[])];
    feed(&mut c, &mut m, feeds);
    let v = c.live_view(7, "running");
    assert_eq!((v.job.as_str(), v.now_us, v.state.as_str()), ("job", 7, "running"));
    let n = &v.nodes[..];
    assert_eq!(n.len(), 1);
    assert_eq!((n[0].host.as_str(), n[0].cores, n[0].busy, n[0].done, n[0].failed), ("node0", 4, 1, 1, 1));
    assert_eq!(v.failures.len(), 1);
    let f = &v.failures[0];
    assert_eq!((f.task, f.host.as_str(), f.reason.as_str(), f.retrying), (2, "node0", "exit 3", true));
    // Its retry fails too, for good; the node lost, it shows as such.
    feed(&mut c, &mut m, vec![want(0, 1), result(0, 3, 2, 2, 4), Input::Lost { agent: 0, why: "x".into() }]);
    let v = c.live_view(8, "running");
    assert_eq!((v.failures.len(), v.failures[1].reason.as_str(), v.failures[1].retrying), (2, "exit 4", false));
    assert_eq!((v.nodes[0].state.as_str(), v.nodes[0].busy), ("lost", 0));
}

/// Two agents of one core, four tasks; agent 0 got tasks 1 and 2 and started task 1.
fn task_1_running_and_2_queued_on_agent_0() -> (Mem, Core<'static>) {
    let mut m = Mem::with(4, 0, 1);
    let mut c = core(&m, 2);
    let started = msg::Started { id: 1, attempt: 1, start_us: 5 };
    let start = Input::Report { agent: 0, report: msg::Report { started: vec![started], ..Default::default() } };
    let (out, _) = feed(&mut c, &mut m, vec![join(0, 1), join(1, 1), want(0, 2), start]);
    assert_eq!(dispatched(&out), vec![(0, vec![(1, 1), (2, 1)])]);
    (m, c)
}

#[test]
fn a_lost_agent_s_tasks_go_to_another_without_using_a_retry() {
    let (mut m, mut c) = task_1_running_and_2_queued_on_agent_0();
    let lost = Input::Lost { agent: 0, why: "connection closed".into() };
    let (out, end) = feed(&mut c, &mut m, vec![lost, want(1, 4)]);
    // Agent 1 takes the lost tasks first (retries are the oldest work). Task 1's run was
    // lost; task 2 was not reported started, but the lost agent may have started it: both
    // go out as attempt 2, and only task 1's loss counts.
    assert_eq!(dispatched(&out), vec![(1, vec![(1, 2), (2, 2), (3, 1), (4, 1)])]);
    // Task 1 was running when its agent went: a loss. Task 2 never left the agent's queue.
    assert_eq!((m.records[&1].losses(), m.records[&2].losses()), (1, 0));
    // The lost attempt's history row starts when its agent said it started (`htc log`).
    let lost_run: Vec<_> = m.attempts.iter().filter(|(id, _)| *id == 1).map(|(_, a)| a.ended.start_us).collect();
    assert_eq!(lost_run, [5]);
    assert_eq!(end, None);
    // A late result from the lost agent changes nothing.
    let (_, _) = feed(&mut c, &mut m, vec![result(0, 1, 1, 1, 0)]);
    assert_eq!(m.state(1), State::Pending);
    assert_eq!(c.counts().get(State::Dispatched), 4);
    let (_, end) = feed(&mut c, &mut m, (1..=4).map(|id| result(1, id, id, 1 + (id <= 2) as u32, 0)).collect());
    assert_eq!(end, Some(Ending::Complete));
    assert_eq!(m.counts().get(State::Done), 4);
}

/// Agent 0's relay was lost: it is detached, not lost, and rejoins with its tasks. Asked to
/// resync, it holds task 1 (running) but not task 2, whose dispatch died with the relay:
/// task 2 goes out again, task 1 stays with agent 0, and nothing counts as a loss.
#[test]
fn a_rejoined_agent_keeps_what_it_holds_and_what_died_with_the_relay_goes_out_again() {
    let (mut m, mut c) = task_1_running_and_2_queued_on_agent_0();
    let rejoin = vec![Input::Detached { agent: 0 }, Input::Rejoined { agent: 0, below: vec![7] }];
    let (out, _) = feed(&mut c, &mut m, rejoin);
    assert!(
        matches!(out.as_slice(), [Effect::ToAgent(0, ToAgent::Resync { .. })]),
        "asked to resync (agent 7 is unknown and left alone): {out:?}"
    );
    let answer = Input::Report { agent: 0, report: msg::Report { holding: Some(vec![1]), ..Default::default() } };
    let (out, end) = feed(&mut c, &mut m, vec![answer, want(1, 4)]);
    assert_eq!(dispatched(&out), vec![(1, vec![(2, 2), (3, 1), (4, 1)])], "task 2 again, as a new attempt");
    assert_eq!((m.records[&1].losses(), m.records[&2].losses()), (0, 0));
    assert_eq!(end, None);
    let (_, end) = feed(&mut c, &mut m, vec![result(0, 1, 1, 1, 0)]);
    assert_eq!(m.state(1), State::Done, "agent 0's result for the task it kept counts");
    assert_eq!(end, None);
}

/// A dispatch lost on the way to a live agent (HTDcr's task lost in transit): the periodic
/// audit asks the agent what it holds, and what it does not hold goes out again.
#[test]
fn the_audit_finds_a_task_lost_in_transit_and_sends_it_again() {
    let mut m = Mem::with(4, 0, 1);
    let mut c = core(&m, 2);
    let (out, _) = feed(&mut c, &mut m, vec![join(0, 1), join(1, 1), want(0, 2)]);
    assert_eq!(dispatched(&out), vec![(0, vec![(1, 1), (2, 1)])]);
    // Agent 0 keeps heartbeating; time passes beyond the audit period.
    let every = AUDIT_EVERY_LOST_AFTER * Liveness::default().lost_after_us;
    let mut out = Vec::new();
    c.handle(every + 2_000, &mut m, want(0, 0), &mut out).unwrap();
    c.handle(every + 2_000, &mut m, want(1, 0), &mut out).unwrap();
    c.handle(every + 2_001, &mut m, Input::Tick, &mut out).unwrap();
    let asked: Vec<u32> = sent(&out).filter(|(_, m)| matches!(m, ToAgent::Resync { .. })).map(|(a, _)| a).collect();
    assert_eq!(asked, [0], "only the agent holding tasks is asked");
    // It never got task 2.
    let answer = Input::Report { agent: 0, report: msg::Report { holding: Some(vec![1]), ..Default::default() } };
    let mut out = Vec::new();
    c.handle(every + 3_000, &mut m, answer, &mut out).unwrap();
    c.handle(every + 3_001, &mut m, want(1, 4), &mut out).unwrap();
    assert_eq!(dispatched(&out), vec![(1, vec![(2, 2), (3, 1), (4, 1)])]);
    assert_eq!(m.records[&2].losses(), 0, "an unstarted task taken back is no loss");
}

#[test]
fn stale_and_foreign_results_are_ignored() {
    let mut m = Mem::with(2, 2, 1);
    let mut c = core(&m, 2);
    feed(&mut c, &mut m, vec![join(0, 1), join(1, 1), want(0, 1)]);
    // Agent 1 never got task 1; attempt 7 of task 1 never existed.
    let (_, _) = feed(&mut c, &mut m, vec![result(1, 1, 1, 1, 0), result(0, 1, 1, 7, 0)]);
    assert_eq!((m.state(1), m.puts), (State::Pending, 0));
    assert_eq!(c.counts().get(State::Dispatched), 1);
}

#[test]
fn a_task_bigger_than_every_agent_fails_as_unschedulable() {
    let mut m = Mem::with(2, 2, 1);
    m.records.get_mut(&2).unwrap().shape_mut().cores = 8;
    let mut c = core(&m, 1);
    let (out, _) = feed(&mut c, &mut m, vec![join(0, 2), want(0, 2), want(0, 1)]);
    assert_eq!(dispatched(&out), vec![(0, vec![(1, 1)])]);
    assert_eq!(m.state(2), State::Failed);
    assert_eq!(Outcome::Unschedulable, m.records[&2].outcome());
}

#[test]
fn the_leader_s_own_stall_is_not_its_agents_silence() {
    let mut m = Mem::with(4, 0, 1);
    let mut c = core(&m, 2).with_liveness(Liveness::new(std::time::Duration::from_secs(10)));
    let mut out = Vec::new();
    for (now, ev) in [(0, join(0, 1)), (0, join(1, 1)), (1, want(0, 1)), (2, Input::Tick)] {
        c.handle(now, &mut m, ev, &mut out).unwrap();
    }
    // SIGSTOP for 30 s: the first tick after it finds both agents heard 30 s ago.
    out.clear();
    c.handle(30_000_000, &mut m, Input::Tick, &mut out).unwrap();
    assert!(stopped(&out).is_empty(), "no agent is lost: {out:?}");
    assert_eq!(c.progress(0).agents, 2);
    // The reports that waited in the sockets are read; one agent then really falls silent.
    c.handle(30_000_100, &mut m, want(1, 0), &mut out).unwrap();
    for now in (30_500_000..=40_500_000).step_by(500_000) {
        c.handle(now, &mut m, Input::Tick, &mut out).unwrap();
        c.handle(now + 1, &mut m, want(1, 0), &mut out).unwrap();
    }
    assert!(stopped(&out).contains(&0), "silent since the stall: {out:?}");
    assert_eq!(c.progress(0).agents, 1);
}

#[test]
fn a_silent_agent_is_lost_within_the_bound_and_everyone_else_hears_a_heartbeat() {
    let mut m = Mem::with(4, 0, 1);
    let mut c = core(&m, 2).with_liveness(Liveness::new(std::time::Duration::from_secs(10)));
    let started = msg::Started { id: 1, attempt: 1, start_us: 5 };
    let start = Input::Report { agent: 0, report: msg::Report { started: vec![started], ..Default::default() } };
    let mut out = Vec::new();
    for (now, ev) in [(0, join(0, 1)), (0, join(1, 1)), (1, want(0, 1)), (2, start), (3, want(1, 1))] {
        c.handle(now, &mut m, ev, &mut out).unwrap();
    }
    out.clear();
    // Most of a second on: both hear a heartbeat.
    c.handle(900_000, &mut m, Input::Tick, &mut out).unwrap();
    let beats: Vec<u32> = sent(&out).filter(|(_, m)| matches!(m, ToAgent::Ack { .. })).map(|(a, _)| a).collect();
    assert_eq!(beats.len(), 2, "{out:?}");
    // Agent 1 keeps reporting, agent 0 (task 1 running) falls silent; the leader ticks on.
    for now in (1_400_000..9_000_000).step_by(500_000) {
        c.handle(now, &mut m, Input::Tick, &mut out).unwrap();
    }
    c.handle(9_000_000, &mut m, want(1, 0), &mut out).unwrap();
    c.handle(9_500_000, &mut m, Input::Tick, &mut out).unwrap();
    out.clear();
    c.handle(10_000_001, &mut m, Input::Tick, &mut out).unwrap();
    assert!(stopped(&out).is_empty(), "not yet: {out:?}");
    c.handle(10_000_002, &mut m, Input::Tick, &mut out).unwrap();
    assert!(
        sent(&out).any(|(a, m)| a == 0
            && matches!(m, ToAgent::Shutdown { stop: Stop::Revive, reason } if reason.starts_with("silent for 10.0 s")))
            && out.contains(&Effect::GivenUp(0)),
        "{out:?}"
    );
    assert_eq!(m.records[&1].losses(), 1, "its running task is lost");
    assert_eq!(c.progress(0).agents, 1);
    // Should it resume, its late result is stale.
    c.handle(10_000_003, &mut m, result(0, 1, 1, 1, 0), &mut out).unwrap();
    assert_eq!(m.state(1), State::Pending);
}

#[test]
fn fail_fast_starts_nothing_more_after_max_fails_and_ends_once_the_running_ended() {
    let mut m = Mem::with(10, 0, 1);
    let mut c = core(&m, 1).with_max_fails(2);
    let (out, _) = feed(&mut c, &mut m, vec![join(0, 3), want(0, 3)]);
    assert_eq!(dispatched(&out).len(), 1);
    // Two fail for good: no more dispatch, though the agent asks; task 3 still runs.
    let (out, end) = feed(&mut c, &mut m, vec![result(0, 1, 1, 1, 1), result(0, 2, 2, 1, 1), want(0, 5)]);
    assert!(dispatched(&out).is_empty(), "{out:?}");
    assert_eq!(end, None, "task 3 is still running");
    let (_, end) = feed(&mut c, &mut m, vec![result(0, 3, 3, 1, 0)]);
    assert_eq!(end, Some(Ending::TooManyFailures(2)));
    assert_eq!((m.state(3), m.state(4)), (State::Done, State::Pending), "the rest waits for a resume");
}

#[test]
fn a_black_hole_is_drained_and_what_it_failed_runs_elsewhere_without_using_a_retry() {
    let mut m = Mem::with(40, 0, 1);
    let mut c = core(&m, 2);
    let (out, _) = feed(&mut c, &mut m, vec![join(0, 1), join(1, 1), want(0, 10), want(1, 10)]);
    let sent = dispatched(&out);
    let (to0, to1): (Vec<u64>, Vec<u64>) =
        (sent[0].1.iter().map(|t| t.0).collect(), sent[1].1.iter().map(|t| t.0).collect());
    // Agent 1 succeeds; agent 0 fails 7 in a row: failures, no retries left, final.
    let ok: Vec<Input> = to1.iter().take(8).map(|&id| result(1, id, id, 1, 0)).collect();
    let bad: Vec<Input> = to0.iter().take(7).map(|&id| result(0, id, id, 1, 1)).collect();
    let (_, _) = feed(&mut c, &mut m, bad.into_iter().chain(ok).collect());
    assert_eq!(m.state(to0[0]), State::Failed);
    assert!(!c.agents[&0].drained);
    // The eighth: a black hole. It is told to stop starting, and its failures run again.
    let (out, _) = feed(&mut c, &mut m, vec![result(0, 8, to0[7], 1, 1)]);
    assert!(c.agents[&0].drained);
    assert!(told(&out, 0, Stop::Hold), "{out:?}");
    for &id in &to0[..8] {
        assert!(matches!(m.state(id), State::Pending | State::Dispatched), "task {id}: {:?}", m.state(id));
        assert_eq!(m.records[&id].attempts(), 0, "task {id}: its retry given back");
    }
    assert!(m.failed.is_empty(), "nothing left in the failed index: {:?}", m.failed);
    // It asks again: nothing. Agent 1 gets the refunded tasks, as new attempts.
    let (out, _) = feed(&mut c, &mut m, vec![want(0, 10), want(1, 10)]);
    let sent = dispatched(&out);
    assert!(sent.iter().all(|(a, _)| *a == 1), "{sent:?}");
    assert!(sent.iter().flat_map(|(_, t)| t).any(|&(id, attempt)| id == to0[0] && attempt == 2), "{sent:?}");
}

#[test]
fn near_the_time_limit_no_task_starts_that_its_hint_says_cannot_finish() {
    let mut m = Mem::with(6, 0, 1);
    for id in 1..=6 {
        m.records.get_mut(&id).unwrap().shape_mut().runtime_ms = if id % 2 == 0 { 100_000 } else { 1_000 };
    }
    let mut c = core(&m, 1).with_deadline(10_000_000);
    let (out, end) = feed(&mut c, &mut m, vec![join(0, 6), want(0, 6)]);
    assert_eq!(dispatched(&out), vec![(0, vec![(1, 1), (3, 1), (5, 1)])], "the 100 s tasks wait");
    assert_eq!(end, None);
    let (_, end) = feed(&mut c, &mut m, [1, 3, 5].into_iter().map(|id| result(0, id, id, 1, 0)).collect());
    assert_eq!(end, Some(Ending::OutOfTime(3)));
    assert_eq!(m.state(2), State::Pending, "left for the next session");
}

fn signalled(agent: u32) -> Input {
    Input::Report { agent, report: msg::Report { signalled: true, ..Default::default() } }
}

/// A preemption with a `GraceTime`: the agents say they were signalled, the driver is asked
/// once whether Slurm gives a grace, and with one every agent finishes what runs and starts
/// nothing more; the run ends interrupted once nothing is in flight.
#[test]
fn a_grace_finishes_what_runs_starts_nothing_more_and_ends_interrupted() {
    let mut m = Mem::with(10, 0, 1);
    let mut c = core(&m, 2);
    let (out, _) = feed(&mut c, &mut m, vec![join(0, 2), join(1, 2), want(0, 2), want(1, 2)]);
    let running: Vec<(u32, u64)> =
        dispatched(&out).into_iter().flat_map(|(a, t)| t.into_iter().map(move |(id, _)| (a, id))).collect();
    assert_eq!(running.len(), 4);
    let (out, end) = feed_at(&mut c, &mut m, 2_000, vec![signalled(0), signalled(1)]);
    assert_eq!(out.iter().filter(|e| matches!(e, Effect::Signalled)).count(), 1, "asked once: {out:?}");
    assert_eq!(end, None, "no grace known yet: the run goes on");
    let (out, end) = feed_at(&mut c, &mut m, 3_000, vec![Input::Grace { signal: 15, grace_us: 10_000_000 }]);
    assert!(told(&out, 0, Stop::Hold) && told(&out, 1, Stop::Hold), "{out:?}");
    assert_eq!(end, None, "4 tasks in flight");
    let (a, id) = running[0];
    let (out, end) = feed_at(&mut c, &mut m, 4_000, vec![result(a, 1, id, 1, 0), want(a, 5)]);
    assert!(dispatched(&out).is_empty(), "nothing more starts: {out:?}");
    assert_eq!(end, None);
    let rest: Vec<Input> = running[1..].iter().map(|&(a, id)| result(a, 2, id, 1, 0)).collect();
    let (_, end) = feed_at(&mut c, &mut m, 5_000, rest);
    assert_eq!(end, Some(Ending::Preempted(15)));
    assert_eq!(m.state(running[3].1), State::Done, "what ended in the grace is recorded");
}

/// What still runs at the grace's end (less the margin to record and stop) is stopped; a grace
/// too short for that margin is none.
#[test]
fn a_grace_ends_before_slurm_s_end_and_a_short_one_is_none() {
    let mut m = Mem::with(10, 0, 1);
    let mut c = core(&m, 1);
    feed(&mut c, &mut m, vec![join(0, 2), want(0, 2)]);
    let (_, end) = feed_at(&mut c, &mut m, 2_000, vec![Input::Grace { signal: 15, grace_us: 10_000_000 }]);
    assert_eq!(end, None);
    let until = 2_000 + 10_000_000 - GRACE_MARGIN_US;
    let (_, end) = feed_at(&mut c, &mut m, until - 1, vec![Input::Tick]);
    assert_eq!(end, None);
    let (_, end) = feed_at(&mut c, &mut m, until, vec![Input::Tick]);
    assert_eq!(end, Some(Ending::Preempted(15)));
    let mut c = core(&m, 1);
    let (_, end) = feed(&mut c, &mut m, vec![join(0, 2), Input::Grace { signal: 15, grace_us: GRACE_MARGIN_US }]);
    assert_eq!(end, Some(Ending::Preempted(15)));
}

#[test]
fn the_run_ends_on_a_signal_or_when_every_agent_is_gone() {
    let mut m = Mem::with(3, 2, 1);
    let mut c = core(&m, 2);
    let (_, end) = feed(&mut c, &mut m, vec![join(0, 1), Input::Interrupt { signal: 2 }]);
    assert_eq!(end, Some(Ending::Interrupted(2)));
    let mut out = Vec::new();
    c.shutdown(&Ending::Interrupted(2), &mut out);
    assert!(matches!(out.as_slice(), [Effect::ToAgent(0, ToAgent::Shutdown { stop: Stop::Abort, .. })]));

    let mut c = core(&m, 2);
    let gone = vec![
        join(0, 1),
        Input::NeverJoined { agent: 1, why: "exited".into() },
        Input::Lost { agent: 0, why: "killed".into() },
    ];
    let (_, end) = feed(&mut c, &mut m, gone);
    assert_eq!(end, None, "for one loss bound a given-up agent may come back");
    let later = 1_002 + c.live.lost_after_us;
    c.handle(later, &mut m, Input::Tick, &mut Vec::new()).unwrap();
    let end = c.ending();
    assert!(matches!(end, Some(Ending::AgentsLost(ref w)) if w.contains("3 tasks unfinished")), "{end:?}");
}

/// An agent that exits before it joined could not start on its node: the run stops, saying
/// where and why, and every agent that did join is told to stop. One that exits after joining
/// is lost by its link, as any other.
#[test]
fn an_agent_that_exits_before_joining_stops_the_run_with_where_and_why() {
    let mut m = Mem::with(3, 2, 1);
    let mut c = core(&m, 2);
    let exited =
        |agent| Input::AgentExited { agent, why: format!("on c{agent}: execve(): No such file (exit code 2)") };
    let (_, end) = feed(&mut c, &mut m, vec![join(0, 1), exited(0)]);
    assert_eq!(end, None, "agent 0 joined: its end is a loss, seen by its link");
    let (_, end) = feed(&mut c, &mut m, vec![exited(1)]);
    let Some(Ending::AgentNotStarted(why)) = end else { panic!("{end:?}") };
    assert_eq!(why, "the agent could not start on c1: execve(): No such file (exit code 2)");
    let mut out = Vec::new();
    c.shutdown(&Ending::AgentNotStarted(why), &mut out);
    assert!(matches!(out.as_slice(), [Effect::ToAgent(0, ToAgent::Shutdown { stop: Stop::Abort, .. })]), "{out:?}");
}

/// Agent 0 was given up (hung) and comes back having stopped what it held: its tasks ran
/// elsewhere already; it is a member again and gets new work, and what it reports of its old
/// attempts changes nothing.
#[test]
fn a_given_up_agent_back_empty_is_a_fresh_member() {
    let (mut m, mut c) = task_1_running_and_2_queued_on_agent_0();
    let lost = Input::Lost { agent: 0, why: "silent for 10.0 s".into() };
    let (out, _) = feed(&mut c, &mut m, vec![lost, want(1, 2)]);
    assert_eq!(dispatched(&out), vec![(1, vec![(1, 2), (2, 2)])]);
    let back = Input::Revived { agent: 0, cores: 1, mem_mb: 0, gpus: 0, hostname: "node0".into() };
    // Idle, it may take from any instance's share.
    let ask = Input::Report { agent: 0, report: msg::Report { want: 2, idle: 1, ..Default::default() } };
    let (out, end) = feed(&mut c, &mut m, vec![back, ask]);
    assert_eq!(dispatched(&out), vec![(0, vec![(4, 1)])], "new work for the fresh member (its idle slot)");
    assert_eq!(end, None);
    let (_, _) = feed(&mut c, &mut m, vec![result(0, 1, 1, 1, 0)]);
    assert_eq!(m.state(1), State::Pending, "its old attempt of task 1 is not recorded");
    let mut results: Vec<Input> = (1..=2).map(|id| result(1, id, id, 2, 0)).collect();
    let ask = Input::Report { agent: 0, report: msg::Report { want: 1, idle: 1, ..Default::default() } };
    results.extend([result(0, 2, 4, 1, 0), ask, result(0, 3, 3, 1, 0)]);
    let (_, end) = feed(&mut c, &mut m, results);
    assert_eq!(end, Some(Ending::Complete));
    assert_eq!((m.records[&1].losses(), m.records[&2].losses()), (1, 0));
}

/// An agent that comes back before the leader gave it up (its lease ran out first) is given
/// up then: what it held goes out again. A black hole stays drained.
#[test]
fn an_agent_back_before_it_was_given_up_loses_its_tasks_first() {
    let (mut m, mut c) = task_1_running_and_2_queued_on_agent_0();
    let back = Input::Revived { agent: 0, cores: 1, mem_mb: 0, gpus: 0, hostname: "node0".into() };
    let (out, _) = feed(&mut c, &mut m, vec![back, want(1, 2)]);
    assert_eq!(dispatched(&out), vec![(1, vec![(1, 2), (2, 2)])]);
    assert_eq!(m.records[&1].losses(), 1);
}

fn attach(agents: u32, ends_us: Option<u64>) -> allocation::Attach {
    let job = format!("job-of-{agents}");
    allocation::Attach { job, agents, instance_size: 1, fanout: 2, nodes: agents, ends_us, keep_first: None }
}

fn layout_core(m: &Mem, agents: u32) -> Core<'static> {
    let n = m.records.len() as u64;
    Core::new(Box::new(Even::new(1..n + 1, agents as usize)), "job".into(), agents as usize, m.counts(), 0)
        .with_layout(Arc::new(Tree::instances(agents, 1, 2)))
}

/// Every task id dispatched in `out`, checked to be new against `seen`.
fn dispatched_once(out: &Effects, seen: &mut std::collections::HashSet<u64>) -> usize {
    let ids: Vec<u64> = dispatched(out).into_iter().flat_map(|(_, t)| t.into_iter().map(|(id, _)| id)).collect();
    ids.iter().for_each(|&id| assert!(seen.insert(id), "task {id} dispatched twice"));
    ids.len()
}

#[test]
fn an_allocation_that_joins_gets_new_agents_and_a_fair_share_of_what_is_left() {
    let mut m = Mem::with(400, 0, 1);
    let mut c = layout_core(&m, 2);
    let mut seen = std::collections::HashSet::new();
    let (out, _) = feed(&mut c, &mut m, vec![join(0, 2), join(1, 2), report(0, 100, 2, &[]), report(1, 100, 2, &[])]);
    assert_eq!(dispatched_once(&out, &mut seen), 200);
    // Two agents of 2 cores join: ids after the run's, one instance each.
    assert_eq!(c.attach(attach(2, None), 2_000), Ok(2));
    assert_eq!(c.attach(attach(1, None), 2_001), Ok(4), "a second allocation numbers after the first");
    // Agents 2 and 3 join; agent 4 never does (its allocation ended first).
    c.allocation_gone("job-of-1", 2_002);
    let (out, _) = feed_at(&mut c, &mut m, 3_000, vec![join(2, 2), join(3, 2), report(2, 1000, 2, &[])]);
    // 200 were left for the four live instances of 2 cores: a quarter each.
    assert_eq!(dispatched_once(&out, &mut seen), 50);
    let (out, _) = feed_at(&mut c, &mut m, 4_000, vec![report(0, 1000, 2, &[]), report(3, 1000, 2, &[])]);
    assert_eq!(dispatched_once(&out, &mut seen), 100);
    let (out, _) = feed_at(&mut c, &mut m, 5_000, vec![report(1, 1000, 2, &[])]);
    assert_eq!(dispatched_once(&out, &mut seen), 50);
    assert_eq!(seen.len(), 400, "every task handed out once");
}

#[test]
fn joining_a_run_with_nothing_left_is_refused() {
    let mut m = Mem::with(2, 0, 1);
    let mut c = layout_core(&m, 1);
    let (_, _) = feed(&mut c, &mut m, vec![join(0, 2), report(0, 2, 2, &[])]);
    let (_, end) = feed(&mut c, &mut m, vec![report(0, 2, 2, &[(1, 1), (2, 1)])]);
    assert_eq!(end, Some(Ending::Complete));
    assert!(c.attach(attach(2, None), 9_000).unwrap_err().contains("ending"));
}

#[test]
fn an_allocation_at_its_end_hands_back_its_queue_and_its_agents_go_without_a_loss() {
    let mut m = Mem::with(100, 0, 1);
    let mut c = layout_core(&m, 1);
    feed(&mut c, &mut m, vec![join(0, 2)]);
    assert_eq!(c.attach(attach(1, Some(10_000_000)), 2_000), Ok(1));
    let mut seen = std::collections::HashSet::new();
    let (out, _) = feed_at(&mut c, &mut m, 3_000, vec![join(1, 2), report(1, 10, 2, &[]), report(0, 10, 2, &[])]);
    assert_eq!(dispatched_once(&out, &mut seen), 20);
    // Its end comes: agent 1 is told to start nothing more and go; it gets no more work.
    let (out, _) = feed_at(&mut c, &mut m, 10_000_000, vec![Input::Tick]);
    assert!(told(&out, 1, Stop::Hold), "{out:?}");
    let (out, _) = feed_at(&mut c, &mut m, 10_000_100, vec![report(1, 10, 2, &[(51, 1)])]);
    assert!(dispatched(&out).is_empty(), "a leaving agent gets nothing");
    // It goes; what it still held runs on agent 0, and the run does not count it a loss.
    let (out, _) = feed_at(&mut c, &mut m, 10_000_200, vec![Input::Lost { agent: 1, why: "closed".into() }]);
    let (out2, _) = feed_at(&mut c, &mut m, 10_000_300, vec![report(0, 100, 2, &[])]);
    let again: Vec<u64> =
        dispatched(&out).into_iter().chain(dispatched(&out2)).flat_map(|(_, t)| t).map(|(id, _)| id).collect();
    assert!(again.iter().all(|&id| id != 51), "what it finished stays finished");
    assert!((52..=60).all(|id| again.contains(&id)), "what it held goes out again: {again:?}");
    assert!(c.turnout.last_loss().is_none(), "leaving at its end is not a loss");
}

#[test]
fn a_task_too_long_for_a_joined_allocation_s_time_left_runs_on_another() {
    let mut m = Mem::with(1, 0, 1);
    m.records.get_mut(&1).unwrap().shape_mut().runtime_ms = 60_000;
    let mut c = layout_core(&m, 1);
    assert_eq!(c.attach(attach(1, Some(30_000_000)), 1_000), Ok(1));
    // Agent 1 (30 s left) asks first: the one-minute task is not for it.
    let (out, _) = feed_at(&mut c, &mut m, 2_000, vec![join(1, 2), report(1, 10, 2, &[])]);
    assert!(dispatched(&out).is_empty(), "{out:?}");
    let (out, _) = feed_at(&mut c, &mut m, 3_000, vec![join(0, 2), report(0, 10, 2, &[])]);
    assert_eq!(dispatched(&out), vec![(0, vec![(1, 1)])]);
}

#[test]
fn a_grown_allocation_told_to_leave_holds_its_agents_and_the_situation_counts_it_no_more() {
    let mut m = Mem::with(100, 0, 1);
    let mut c = layout_core(&m, 1);
    feed(&mut c, &mut m, vec![join(0, 2)]);
    assert_eq!(c.attach(attach(2, Some(600_000_000)), 2_000), Ok(1));
    let (out, _) = feed_at(&mut c, &mut m, 3_000, vec![join(1, 2), join(2, 2), report(1, 4, 2, &[])]);
    assert!(!dispatched(&out).is_empty());
    let s = c.grow_situation(4_000, 10);
    assert_eq!(s.live, vec![(2, None), (4, Some(600_000_000))], "the leader's own, then the joined one");
    assert_eq!((s.tasks_left, s.joined.as_slice()), (100, &["job-of-2".to_string()][..]));
    let mut out = Vec::new();
    c.leave_allocation("job-of-2", "gives its nodes back", &mut out);
    let held: Vec<u32> =
        sent(&out).filter(|(_, m)| matches!(m, ToAgent::Shutdown { stop: Stop::Hold, .. })).map(|(a, _)| a).collect();
    assert_eq!(held, vec![1, 2]);
    assert_eq!(c.grow_situation(5_000, 10).live.len(), 1, "a leaving allocation does no more work");
    assert_eq!(c.allocations_over().collect::<Vec<_>>(), ["job-of-2"]);
    let (out, _) = feed_at(&mut c, &mut m, 6_000, vec![report(2, 4, 2, &[])]);
    assert!(dispatched(&out).is_empty(), "nor gets any");
}

fn handed_over(agent: u32, cores: u32) -> Input {
    Input::HandedOver { agent, cores, mem_mb: 0, gpus: 0, hostname: format!("node{agent}") }
}

/// Agent `agent`'s answer to a resync: it holds `held`.
fn holding(agent: u32, want: u32, held: &[u64]) -> Input {
    let report = msg::Report { want, holding: Some(held.to_vec()), ..Default::default() };
    Input::Report { agent, report }
}

/// A leader that took the run over: agents 3 and 4 of the run (grafted after 0..3, a job gone)
/// are its own, and come back holding tasks it has as pending.
fn taken_over(m: &Mem) -> Core<'static> {
    let n = m.records.len() as u64;
    Core::new(Box::new(Even::new(1..n + 1, 2)), "job".into(), 2, m.counts(), 0)
        .with_layout(Arc::new(Tree::grafted(3, 2, 1, 2)))
        .expecting_handover(20_000_000, 0, Vec::new())
}

#[test]
fn after_a_hand_over_nothing_goes_out_until_the_agents_said_what_they_kept_and_that_runs_once() {
    let mut m = Mem::with(40, 0, 1);
    let mut c = taken_over(&m);
    let mut seen = std::collections::HashSet::new();
    // Agent 3 comes back: asked what it holds; its first report (a result of task 2, which
    // ended while it waited, and a want) hands out nothing while agent 4 is still awaited.
    let (out, _) = feed(&mut c, &mut m, vec![handed_over(3, 2), report(3, 8, 0, &[(2, 1)])]);
    assert!(sent(&out).any(|(a, m)| a == 3 && matches!(m, ToAgent::Resync { .. })), "{out:?}");
    assert!(dispatched(&out).is_empty(), "nothing goes out while agent 4 may hold tasks");
    assert_eq!(m.state(2), State::Done, "what it ran meanwhile is recorded, not run again");
    let (out, _) = feed_at(&mut c, &mut m, 2_000, vec![holding(3, 8, &[1, 3]), handed_over(4, 2)]);
    assert!(dispatched(&out).is_empty(), "still waiting for agent 4");
    // Agent 4 says it holds 21 and 22 (its own share) and 5 (agent 3's): all three stay with it,
    // and work goes out at once, none of what the agents kept.
    let (out, _) = feed_at(&mut c, &mut m, 3_000, vec![holding(4, 8, &[5, 21, 22])]);
    let (out2, _) = feed_at(&mut c, &mut m, 4_000, vec![want(3, 8)]);
    dispatched_once(&out, &mut seen);
    dispatched_once(&out2, &mut seen);
    assert!(!seen.is_empty(), "work goes out once every agent said what it holds");
    for id in [1, 2, 3, 5, 21, 22] {
        assert!(!seen.contains(&id), "task {id} was kept by an agent, yet sent again");
    }
    // What they kept ends as any task does.
    feed_at(&mut c, &mut m, 5_000, vec![report(4, 0, 0, &[(21, 1)]), report(3, 0, 0, &[(1, 1)])]);
    assert_eq!((m.state(21), m.state(1)), (State::Done, State::Done));
}

#[test]
fn after_a_hand_over_an_agent_that_does_not_come_back_is_waited_for_only_so_long() {
    let mut m = Mem::with(40, 0, 1);
    let mut c = taken_over(&m);
    let (out, _) = feed(&mut c, &mut m, vec![handed_over(3, 2), holding(3, 8, &[1]), Input::Tick]);
    assert!(dispatched(&out).is_empty());
    let (out, _) = feed_at(&mut c, &mut m, 20_000_001, vec![Input::Tick]);
    let sent: Vec<u64> = dispatched(&out).into_iter().flat_map(|(_, t)| t).map(|(id, _)| id).collect();
    assert!(!sent.is_empty() && !sent.contains(&1), "past the wait, work goes out: {sent:?}");
    // An agent the leader has no place for (one of that id is here already) is told to stop.
    let (out, _) = feed_at(&mut c, &mut m, 20_000_100, vec![handed_over(3, 2)]);
    assert!(told(&out, 3, Stop::Abort), "{out:?}");
}

#[test]
fn after_a_hand_over_what_started_on_an_agent_that_does_not_come_back_runs_again_as_a_new_logged_attempt() {
    use htc_core::salvage::Told;
    let started = |agent, id| Told { agent, id, attempt: 1, start_us: 500, end: None };
    let mut m = Mem::with(40, 0, 1);
    let n = m.records.len() as u64;
    // Task 1 started on agent 3, which comes back holding it; task 7 on agent 0, of the job
    // that went, which does not.
    let mut c = Core::new(Box::new(Even::new(1..n + 1, 2)), "job".into(), 2, m.counts(), 0)
        .with_layout(Arc::new(Tree::grafted(3, 2, 1, 2)))
        .expecting_handover(20_000_000, 0, vec![started(0, 7), started(3, 1)]);
    feed(&mut c, &mut m, vec![handed_over(3, 2), holding(3, 8, &[1]), handed_over(4, 2), holding(4, 8, &[])]);
    let (out2, _) = feed_at(&mut c, &mut m, 2_000, vec![want(3, 8), want(4, 8)]);
    let rows: Vec<(u64, u8, Outcome)> = m.attempts.iter().map(|(id, a)| (*id, a.attempt, a.ended.outcome)).collect();
    assert_eq!(rows, [(7, 1, Outcome::Interrupted)], "the lost attempt has its row, the kept one none");
    assert_eq!(m.state(7), State::Pending);
    let all: Vec<(u64, u32)> = dispatched(&out2).into_iter().flat_map(|(_, t)| t).collect();
    assert!(!all.iter().any(|(id, _)| *id == 1), "task 1 stays with agent 3");
    match all.iter().find(|(id, _)| *id == 7) {
        Some((_, attempt)) => assert_eq!(*attempt, 2, "task 7 runs again as attempt 2"),
        None => assert_eq!(m.records[&7].attempt_no(), 1, "task 7's attempt 1 stays used: its next is 2"),
    }
}

#[test]
fn a_leader_stopped_by_a_signal_leaves_the_agents_of_a_joined_allocation_to_the_next() {
    let mut m = Mem::with(100, 0, 1);
    let mut c = layout_core(&m, 1);
    feed(&mut c, &mut m, vec![join(0, 2)]);
    assert_eq!(c.attach(attach(1, None), 2_000), Ok(1));
    feed_at(&mut c, &mut m, 3_000, vec![join(1, 2)]);
    let mut out = Vec::new();
    c.shutdown(&Ending::Interrupted(15), &mut out);
    let told: Vec<u32> = stopped(&out);
    assert_eq!(told, [0], "the joined agent waits for the job that takes the run over");
    out.clear();
    c.shutdown(&Ending::TooManyFailures(3), &mut out);
    assert_eq!(out.len(), 2, "a run stopped for its failures stops everywhere");
}

#[test]
fn after_a_hand_over_another_allocation_s_agents_keep_their_ids_and_their_tasks() {
    // The leader that took over expects its agents 3 and 4 and two agents of another job (1 and
    // 2, ids its own view holds apart), which come before their launcher attaches again.
    let mut m = Mem::with(40, 0, 1);
    let n = m.records.len() as u64;
    let mut c = Core::new(Box::new(Even::new(1..n + 1, 2)), "job".into(), 2, m.counts(), 0)
        .with_layout(Arc::new(Tree::grafted(3, 2, 1, 2)))
        .expecting_handover(20_000_000, 2, Vec::new());
    let events = vec![
        handed_over(3, 2),
        holding(3, 8, &[1]),
        handed_over(4, 2),
        holding(4, 8, &[21]),
        handed_over(1, 2),
        holding(1, 8, &[2, 22]),
    ];
    let (out, _) = feed(&mut c, &mut m, events);
    assert!(dispatched(&out).is_empty(), "agent 2 of the other job is still awaited");
    let (out, _) = feed_at(&mut c, &mut m, 2_000, vec![handed_over(2, 2), holding(2, 8, &[30])]);
    let (out2, _) = feed_at(&mut c, &mut m, 3_000, vec![want(1, 8), want(3, 8)]);
    let mut seen = std::collections::HashSet::new();
    dispatched_once(&out, &mut seen);
    dispatched_once(&out2, &mut seen);
    assert!(!seen.is_empty());
    for id in [1, 2, 21, 22, 30] {
        assert!(!seen.contains(&id), "task {id} was kept by an agent, yet sent again");
    }
    // Their launcher attaches again keeping the ids: its allocation is 1..3, no new ids. One
    // that asks for ids this leader's own agents have is refused.
    let keep = |first, agents| allocation::Attach { keep_first: Some(first), ..attach(agents, None) };
    assert_eq!(c.attach(keep(3, 1), 4_000).unwrap_err(), "agent 3 is another allocation's here");
    assert_eq!(c.attach(keep(1, 2), 4_001), Ok(1));
    assert_eq!(c.allocations()[0].agents, 1..3);
    assert_eq!(c.attach(keep(1, 2), 4_002).unwrap_err(), "agent 1 is another allocation's here");
    // What the kept agents ran is recorded as any task.
    feed_at(&mut c, &mut m, 5_000, vec![report(1, 0, 0, &[(22, 1)]), report(2, 0, 0, &[(30, 1)])]);
    assert_eq!((m.state(22), m.state(30)), (State::Done, State::Done));
}

#[test]
fn a_plan_moves_no_task_s_life_and_picks_a_task_held_in_two_queues_once() {
    let mut m = Mem::with(4, 2, 1);
    let mut c = core(&m, 1);
    feed(&mut c, &mut m, vec![join(0, 4)]);
    // Task 1 came back twice (say, given back, then its agent lost): a retry, and in its share.
    c.retry.extend([1, 1]);
    let a = c.agents.get_mut(&0).unwrap();
    (a.credit, a.idle) = (8, 4);
    let (plan, ask) = dispatch::plan(&mut c, &mut m, 0).unwrap();
    assert_eq!(plan.picks.iter().map(|(id, _)| *id).collect::<Vec<_>>(), vec![1, 2, 3, 4]);
    assert_eq!((plan.want, ask), (4, false));
    assert!((1..=4).all(|id| m.state(id) == State::Pending && !c.in_flight.contains(id)));
    let mut out = Vec::new();
    dispatch::apply(&mut c, &mut m, plan, &mut out).unwrap();
    assert_eq!(dispatched(&out), vec![(0, vec![(1, 1), (2, 1), (3, 1), (4, 1)])]);
    assert!((1..=4).all(|id| c.in_flight.contains(id)));
    assert_eq!((c.agents[&0].credit, c.agents[&0].idle), (4, 0));
}
