//! `htc simulate`: a run of a task file on agents that are not there (say 1,000 nodes of 24
//! cores), on a virtual clock. The leader's core (`leader::new_core`, over the real ledger) and
//! every agent's machine (`agent::Instance`: an agent, or an instance head feeding its members)
//! are the ones a real run uses; only time, the network
//! (a fixed latency per frame), the leader's CPU (a cost per input and per result in it, as
//! `htc calibrate` measures them; one input at a time)
//! and the task processes (each ends after its `runtime` hint) are modelled. A plan's makespan on
//! a large machine is so measured on a laptop, exactly and repeatably, in seconds.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use htc_core::tree::Tree;

use crate::agent::machine::{self, Carrier, Effect};
use crate::agent::Instance;
use crate::leader::core::{Core, Ending, Input, Outbox};
use crate::leader::driver::LedgerTasks;
use crate::leader::{new_core, Planned};
use crate::ledger::{Ledger, Outcome, Record, WriteTxn};
use crate::load::TaskText;
use crate::proto::{self, frame::Body};
use crate::rundir::RunDir;
use htc_core::virtual_exec::VirtualExec;
use htc_core::work::{Command, ExecEvent, TaskToRun};

mod report;
pub use report::{json, text};

#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Agents.
    pub agents: u32,
    pub cores_per_agent: u32,
    /// Agents per 2nd-level instance: the first of each takes work for all of them.
    pub instance_agents: u32,
    pub plan: Planned,
    /// One way, every frame.
    pub latency_us: u64,
    /// The leader's CPU per input and per result; while it is busy, inputs wait their turn.
    pub leader: crate::site::LeaderCost,
    /// Agents join one after another over this long (a launcher's start-up).
    pub join_spread_us: u64,
    /// The agents' report timer (`agent::FLUSH_EVERY`).
    pub flush_every_us: u64,
    /// Tasks last their runtime hints, but the leader and agents never see them: a run of the
    /// same file without hints, whose tasks take as long as the hints say.
    pub hide_hints: bool,
    /// Memory each agent says it has for tasks, MiB (0: not accounted), and its GPUs.
    pub mem_mb_per_agent: u64,
    pub gpus_per_agent: u32,
    /// Faults to inject at virtual times.
    pub faults: Vec<Fault>,
}

/// A fault injected into a simulated run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The agent's node dies at `at_us`: its connections close, its tasks are gone.
    Lose { agent: u32, at_us: u64 },
    /// The agent process is stopped (SIGSTOP) from `at_us` for `for_us`: it hears, says and
    /// starts nothing meanwhile, while its tasks run on; its connections stay open.
    Stop { agent: u32, at_us: u64, for_us: u64 },
}

impl std::str::FromStr for Fault {
    type Err = String;
    /// `lose:AGENT@SECONDS` or `stop:AGENT@SECONDS+SECONDS`.
    fn from_str(s: &str) -> Result<Fault, String> {
        let bad = || format!("`{s}`: expected lose:AGENT@SECONDS or stop:AGENT@SECONDS+SECONDS");
        let (kind, rest) = s.split_once(':').ok_or_else(bad)?;
        let (agent, when) = rest.split_once('@').ok_or_else(bad)?;
        let agent: u32 = agent.parse().map_err(|_| bad())?;
        let secs = |x: &str| -> Result<u64, String> {
            let v: f64 = x.parse().map_err(|_| bad())?;
            (v.is_finite() && v >= 0.0).then(|| (v * 1e6).round() as u64).ok_or_else(bad)
        };
        match kind {
            "lose" => Ok(Fault::Lose { agent, at_us: secs(when)? }),
            "stop" => {
                let (at, dur) = when.split_once('+').ok_or_else(bad)?;
                Ok(Fault::Stop { agent, at_us: secs(at)?, for_us: secs(dur)? })
            }
            _ => Err(bad()),
        }
    }
}

impl SimConfig {
    /// How long a task runs here: its hint, else the site's default runtime (`t`).
    fn runtime_us(&self, hint_ms: u32) -> u64 {
        if hint_ms > 0 {
            hint_ms as u64 * 1000
        } else {
            (self.plan.params.t * 1e6).round() as u64
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct SimReport {
    pub tasks: u64,
    pub failed: u64,
    /// When the last task ended, from the first agent's start.
    pub makespan_s: f64,
    /// max(core-seconds / cores, longest task): no schedule ends earlier.
    pub bound_s: f64,
    /// The same, counting each agent's cores only from when it joined.
    pub bound_joined_s: f64,
    /// Virtual time the leader spent handling inputs.
    pub leader_busy_s: f64,
    /// Wall time to parse the file into the ledger (`htc simulate FILE` only), and to plan the
    /// partition from the ledger, as a real run's leader does at its start.
    pub load_s: f64,
    pub plan_s: f64,
    pub events: u64,
    pub wall: Duration,
    /// Tasks asked back from an agent's queue for idle slots elsewhere.
    pub moved_back: u64,
    /// Starts beyond each task's first: what faults made run again.
    pub reruns: u64,
    /// Tasks running, and queued unstarted, on the agents hit by faults when they were hit.
    pub running_at_faults: u64,
    pub queued_at_faults: u64,
}

impl SimReport {
    pub fn above_bound(&self) -> f64 {
        if self.bound_s > 0.0 {
            self.makespan_s / self.bound_s - 1.0
        } else {
            0.0
        }
    }
}

enum Ev {
    /// Agent `a` starts and says Hello.
    Join(u32),
    /// An input reaches the leader's queue.
    ToLeader(Input),
    /// The leader takes the next input from its queue.
    LeaderWake,
    /// The leader's timer (heartbeats, silent agents), as its driver's.
    LeaderTick,
    /// An input for agent `a`'s machine.
    ToAgent(u32, machine::Input),
    /// Agent `a`'s report timer.
    Tick(u32),
    /// Agent `a`'s executor has a task ending now.
    ExecDue(u32),
    /// The `i`th of `SimConfig::faults` happens.
    Fault(usize),
    /// A stopped agent goes on.
    Resume(u32),
}

struct At {
    at: u64,
    seq: u64,
    ev: Ev,
}

impl PartialEq for At {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for At {}
impl PartialOrd for At {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for At {
    // Earliest first out of a max-heap; equal times in the order they were scheduled.
    fn cmp(&self, o: &Self) -> Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

/// How often the simulated leader's timer fires (`leader::driver`'s tick).
const LEADER_TICK_US: u64 = 100_000;

struct World {
    heap: BinaryHeap<At>,
    seq: u64,
    now: u64,
}

impl World {
    fn at(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.heap.push(At { at, seq: self.seq, ev });
    }
}

/// Simulates the run in `run` (loaded, nothing finished needed) to its end.
pub fn simulate(run: &RunDir, cfg: &SimConfig) -> anyhow::Result<SimReport> {
    let wall = Instant::now();
    let ledger = Ledger::open(&run.ledger(), false).context("opening the ledger")?;
    let text = TaskText::open(&run.tasks()).context("mapping the run's task file")?;
    let planning = Instant::now();
    let n = cfg.agents.max(1);
    // Every head talks to the leader itself (one level above the instances); members to their head.
    let tree = Arc::new(Tree::instances(n, cfg.instance_agents, n));
    let plan = Planned { instances: tree.heads().len(), ..cfg.plan.clone() };
    let (bound_s, bound_joined_s) = bounds(&ledger, cfg)?;
    let truth = if cfg.hide_hints { Some(Arc::new(hide_hints(&ledger)?)) } else { None };
    let core = new_core(&ledger, &plan, &run.id(), 0)?.with_layout(tree.clone());
    let plan_s = planning.elapsed().as_secs_f64();
    let mut fleet = Fleet::new(tree, &run.id(), cfg, truth);
    let mut leader = Leader {
        core,
        ledger: &ledger,
        text: &text,
        txn: None,
        since_commit: 0,
        inbox: VecDeque::new(),
        free_at: 0,
        waking: false,
        busy_us: 0,
        outbox: Vec::new(),
    };
    let mut w = World { heap: BinaryHeap::new(), seq: 0, now: 0 };
    for a in 0..n {
        w.at(cfg.join_spread_us * a as u64 / n as u64, Ev::Join(a));
    }
    for (i, f) in cfg.faults.iter().enumerate() {
        let (Fault::Lose { at_us, .. } | Fault::Stop { at_us, .. }) = *f;
        w.at(at_us, Ev::Fault(i));
    }
    w.at(LEADER_TICK_US, Ev::LeaderTick);
    let mut events = 0u64;
    let ending = loop {
        let Some(At { at, ev, .. }) = w.heap.pop() else {
            break Ending::AgentsLost("the simulation ran out of events".into());
        };
        w.now = at;
        events += 1;
        match ev {
            Ev::Join(a) => fleet.join(&mut w, cfg, a),
            Ev::ToLeader(input) => leader.arrive(&mut w, input),
            Ev::LeaderTick => {
                leader.arrive(&mut w, Input::Tick);
                // Only while something else may still happen: a stuck run ends for want of events.
                if w.heap.len() > 1 {
                    w.at(at + LEADER_TICK_US, Ev::LeaderTick);
                }
            }
            Ev::LeaderWake => {
                if let Some(e) = leader.wake(&mut w, cfg)? {
                    break e;
                }
            }
            Ev::ToAgent(a, input) => fleet.step(&mut w, cfg, a, input),
            Ev::Tick(a) => fleet.tick(&mut w, cfg, a),
            Ev::ExecDue(a) => fleet.exec_due(&mut w, cfg, a),
            Ev::Fault(i) => fleet.fault(&mut w, cfg, cfg.faults[i]),
            Ev::Resume(a) => fleet.resume(&mut w, cfg, a),
        }
    };
    if let Some(t) = leader.txn.take() {
        t.commit()?;
    }
    if !matches!(ending, Ending::Complete) {
        anyhow::bail!("the simulated run did not complete: {ending:?}");
    }
    let counts = leader.core.counts();
    Ok(SimReport {
        tasks: counts.total(),
        failed: counts.get(htc_core::task::State::Failed),
        makespan_s: fleet.last_end as f64 / 1e6,
        bound_s,
        bound_joined_s,
        leader_busy_s: leader.busy_us as f64 / 1e6,
        load_s: 0.0,
        plan_s,
        events,
        wall: wall.elapsed(),
        moved_back: leader.core.moved_back(),
        reruns: fleet.starts.saturating_sub(fleet.started.len() as u64),
        running_at_faults: fleet.running_at_faults,
        queued_at_faults: fleet.queued_at_faults,
    })
}

/// The leader: its core over the real ledger, and one input at a time at a cost per input and
/// per result.
struct Leader<'l> {
    core: Core<'static>,
    ledger: &'l Ledger,
    text: &'l TaskText,
    txn: Option<WriteTxn<'l>>,
    since_commit: u64,
    inbox: VecDeque<Input>,
    /// When it is done with what it is handling.
    free_at: u64,
    waking: bool,
    busy_us: u64,
    outbox: Outbox,
}

impl Leader<'_> {
    fn arrive(&mut self, w: &mut World, input: Input) {
        self.inbox.push_back(input);
        if !self.waking {
            self.waking = true;
            w.at(w.now.max(self.free_at), Ev::LeaderWake);
        }
    }

    /// Handles the next input; its frames leave when the leader is done with it.
    fn wake(&mut self, w: &mut World, cfg: &SimConfig) -> anyhow::Result<Option<Ending>> {
        let input = self.inbox.pop_front().expect("woken with an empty queue");
        let results = match &input {
            Input::Report { report, .. } => report.results.len() as u64,
            _ => 0,
        };
        let t = match self.txn.as_mut() {
            Some(t) => t,
            None => self.txn.insert(self.ledger.write()?),
        };
        let ended = self.core.handle(w.now, &mut LedgerTasks { txn: t, text: self.text }, input, &mut self.outbox)?;
        // Commits in batches: LMDB holds a write transaction's dirty pages in memory.
        self.since_commit += results;
        if self.since_commit >= 50_000 {
            self.txn.take().unwrap().commit()?;
            self.since_commit = 0;
        }
        self.core.acks(&mut self.outbox);
        let cost = cfg.leader.of(results).round() as u64;
        self.busy_us += cost;
        self.free_at = w.now + cost;
        for (agent, body) in self.outbox.drain(..) {
            w.at(self.free_at + cfg.latency_us, Ev::ToAgent(agent, machine::Input::Parent(body)));
        }
        if let Some(e) = ended.or_else(|| self.core.ending()) {
            return Ok(Some(e));
        }
        self.waking = !self.inbox.is_empty();
        if self.waking {
            w.at(self.free_at, Ev::LeaderWake);
        }
        Ok(None)
    }
}

/// One agent's turn of effects, carried out in the virtual world as the node's agent driver
/// does over sockets: frames take the latency, commands go to its executor (after the turn).
struct SimTurn<'a> {
    w: &'a mut World,
    agent: u32,
    parent: &'a mut Option<u32>,
    latency_us: u64,
    /// What the leader hears when this agent comes back given up (`revive`).
    hello: Option<Input>,
    exec: Vec<Command>,
}

impl Carrier for SimTurn<'_> {
    fn up(&mut self, body: Body) {
        let at = self.w.now + self.latency_us;
        match *self.parent {
            Some(head) => self.w.at(at, Ev::ToAgent(head, machine::Input::ChildFrame(body))),
            None => Fleet::to_leader(self.w, at, body),
        }
    }
    fn down(&mut self, child: u32, body: Body) {
        // A member's Welcome ends its join handshake, which `Fleet::join` models.
        if !matches!(body, Body::Welcome(_)) {
            self.w.at(self.w.now + self.latency_us, Ev::ToAgent(child, machine::Input::Parent(body)));
        }
    }
    fn exec(&mut self, command: Command) {
        self.exec.push(command);
    }
    // The connection's end tells the leader nothing it does not know from the frames.
    fn close_up(&mut self) {}
    fn rejoin(&mut self) {
        // Around the lost relay, straight to the leader, keeping its tasks.
        let input = Input::Rejoined { agent: self.agent, below: Vec::new() };
        self.reconnect(input);
    }
    fn revive(&mut self) {
        if let Some(hello) = self.hello.take() {
            self.reconnect(hello);
        }
    }
}

impl SimTurn<'_> {
    /// A new connection to the leader: it hears `hello`, then the agent hears it is back.
    fn reconnect(&mut self, hello: Input) {
        *self.parent = None;
        let at = self.w.now + self.latency_us;
        self.w.at(at, Ev::ToLeader(hello));
        self.w.at(at + self.latency_us, Ev::ToAgent(self.agent, machine::Input::Rejoined));
    }
}

/// One simulated agent: its machine, its executor, and what a fault did to it.
struct Agent {
    machine: Instance,
    exec: VirtualExec,
    /// Its machine was told that the executor ended.
    told_end: bool,
    /// Who it talks to: the leader (`None`), or its instance head.
    parent: Option<u32>,
    /// Its node died: nothing reaches it or comes from it.
    dead: bool,
    /// Stopped until then: what reaches it waits, in order.
    stopped_until: Option<u64>,
    deferred: Vec<machine::Input>,
    /// The earliest `Ev::ExecDue` on the heap for it.
    due_at: Option<u64>,
}

/// The agents: their machines and simulated executors. Every effect a machine asks for is
/// carried out here as the node's agent driver does over sockets and processes: frames up and
/// down (with the latency), commands to the executor, reconnecting to the leader after a relay's
/// loss (`Rejoin`) or after being given up (`Revive`).
struct Fleet {
    tree: Arc<Tree>,
    agents: Vec<Agent>,
    effects: Vec<Effect>,
    last_end: u64,
    /// Every task that started, and the starts in all (re-runs are the difference).
    started: htc_core::idmap::IdSet<u64>,
    starts: u64,
    running_at_faults: u64,
    queued_at_faults: u64,
}

impl Fleet {
    fn new(tree: Arc<Tree>, job_id: &str, cfg: &SimConfig, truth: Option<Arc<Vec<u32>>>) -> Fleet {
        let (n, c) = (tree.len(), cfg.cores_per_agent);
        let default_us = cfg.runtime_us(0);
        let agent = |a: u32| {
            let truth = truth.clone();
            let runtime = move |t: &TaskToRun| {
                let hint = truth.as_ref().and_then(|v| v.get(t.id as usize).copied()).unwrap_or(t.runtime_ms);
                if hint > 0 {
                    hint as u64 * 1000
                } else {
                    default_us
                }
            };
            Agent {
                // One clock for all, as the wall clock is for real agents: reports keep to its windows.
                machine: Instance::new(a, c as usize, tree.clone(), job_id).with_clock(0),
                exec: VirtualExec::new(c, cfg.gpus_per_agent, Box::new(runtime)),
                told_end: false,
                parent: (tree.head(a) != a).then(|| tree.head(a)),
                dead: false,
                stopped_until: None,
                deferred: Vec::new(),
                due_at: None,
            }
        };
        Fleet {
            agents: (0..n).map(agent).collect(),
            tree,
            effects: Vec::new(),
            last_end: 0,
            started: Default::default(),
            starts: 0,
            running_at_faults: 0,
            queued_at_faults: 0,
        }
    }

    /// Agent `a` starts and says Hello to its parent; its first report goes out once the
    /// Welcome is back.
    fn join(&mut self, w: &mut World, cfg: &SimConfig, a: u32) {
        let (cores, at) = (cfg.cores_per_agent, w.now + cfg.latency_us);
        match self.agents[a as usize].parent {
            None => w.at(at, Ev::ToLeader(self.hello(cfg, a, false))),
            Some(head) => {
                let hello = proto::Hello {
                    agent_id: a,
                    cores,
                    mem_mb: cfg.mem_mb_per_agent,
                    gpus: cfg.gpus_per_agent,
                    ..Default::default()
                };
                w.at(at, Ev::ToAgent(head, machine::Input::ChildOpened(a)));
                w.at(at, Ev::ToAgent(head, machine::Input::ChildFrame(Body::Hello(hello))));
            }
        }
        w.at(w.now + 2 * cfg.latency_us, Ev::Tick(a));
    }

    /// What the leader hears when agent `a` says Hello to it: as a new member, or again after
    /// being given up (`revived`).
    fn hello(&self, cfg: &SimConfig, agent: u32, revived: bool) -> Input {
        let (cores, mem_mb, gpus, hostname) =
            (cfg.cores_per_agent, cfg.mem_mb_per_agent, cfg.gpus_per_agent, format!("sim{agent}"));
        if revived {
            Input::Revived { agent, cores, mem_mb, gpus, hostname }
        } else {
            Input::Joined { agent, cores, mem_mb, gpus, hostname }
        }
    }

    fn tick(&mut self, w: &mut World, cfg: &SimConfig, a: u32) {
        let x = &self.agents[a as usize];
        if x.dead || x.machine.outcome().is_some() {
            return;
        }
        if let Some(until) = x.stopped_until {
            w.at(until, Ev::Tick(a));
            return;
        }
        self.step(w, cfg, a, machine::Input::Tick);
        w.at(w.now + cfg.flush_every_us, Ev::Tick(a));
    }

    /// Feeds agent `a`'s machine and carries out its effects.
    fn step(&mut self, w: &mut World, cfg: &SimConfig, a: u32, input: machine::Input) {
        let x = &mut self.agents[a as usize];
        if x.dead {
            return;
        }
        if x.stopped_until.is_some() {
            x.deferred.push(input);
            return;
        }
        x.machine.handle(w.now, input, &mut self.effects);
        let hello = self.hello(cfg, a, true);
        let mut turn = SimTurn {
            w,
            agent: a,
            parent: &mut self.agents[a as usize].parent,
            latency_us: cfg.latency_us,
            hello: Some(hello),
            exec: Vec::new(),
        };
        std::mem::take(&mut self.effects).into_iter().for_each(|e| e.carry_out(&mut turn));
        let exec = turn.exec;
        let mut events = Vec::new();
        let x = &mut self.agents[a as usize];
        for c in exec {
            x.exec.command(w.now, c, &mut events);
        }
        self.run_exec(w, cfg, a, events);
    }

    /// A frame a head (or an agent that rejoined) sends the leader, as the leader's network
    /// side turns it into an input.
    fn to_leader(w: &mut World, at: u64, body: Body) {
        match body {
            Body::Report(report) => w.at(at, Ev::ToLeader(Input::Report { agent: report.agent, report })),
            Body::Lost(l) => w.at(at, Ev::ToLeader(Input::Lost { agent: l.agent, why: l.reason })),
            _ => {}
        }
    }

    fn exec_due(&mut self, w: &mut World, cfg: &SimConfig, a: u32) {
        let x = &mut self.agents[a as usize];
        if x.due_at.is_some_and(|t| t <= w.now) {
            x.due_at = None;
        }
        self.run_exec(w, cfg, a, Vec::new());
    }

    /// Ends and starts what is due on agent `a`'s executor, tells its machine (`events` first:
    /// what its commands caused), and keeps a wakeup on the heap for its next end.
    fn run_exec(&mut self, w: &mut World, cfg: &SimConfig, a: u32, mut events: Vec<ExecEvent>) {
        let x = &mut self.agents[a as usize];
        if x.dead {
            return;
        }
        x.exec.step(w.now, &mut events);
        if let Some(next) = x.exec.next_end_us() {
            if x.due_at.is_none_or(|t| next < t) {
                x.due_at = Some(next);
                w.at(next, Ev::ExecDue(a));
            }
        }
        let end = !x.told_end && x.exec.is_done();
        x.told_end |= end;
        for e in &events {
            match e {
                ExecEvent::Started { id, .. } => {
                    self.starts += 1;
                    self.started.insert(*id);
                }
                ExecEvent::Finished(f) if f.outcome == Outcome::Exited => self.last_end = self.last_end.max(f.end_us),
                _ => {}
            }
        }
        // The node's driver says a reset as one input once the executor has dropped everything.
        let reset = events.iter().any(|e| matches!(e, ExecEvent::Reset));
        events.retain(|e| !matches!(e, ExecEvent::Reset));
        if !events.is_empty() {
            self.step(w, cfg, a, machine::Input::Exec(events));
        }
        if reset {
            self.step(w, cfg, a, machine::Input::ExecReset);
        }
        if end {
            self.step(w, cfg, a, machine::Input::ExecEnded);
        }
    }

    fn fault(&mut self, w: &mut World, cfg: &SimConfig, f: Fault) {
        let (Fault::Lose { agent, .. } | Fault::Stop { agent, .. }) = f;
        let x = &self.agents[agent as usize];
        if !x.dead && x.stopped_until.is_none() {
            self.running_at_faults += x.exec.running() as u64;
            self.queued_at_faults += x.exec.queued() as u64;
        }
        match f {
            Fault::Lose { agent, .. } => self.lose(w, cfg, agent),
            Fault::Stop { agent, at_us, for_us } => {
                let x = &mut self.agents[agent as usize];
                if x.dead || x.stopped_until.is_some() {
                    return;
                }
                x.stopped_until = Some(at_us + for_us);
                // Its tasks run on and end; nothing new starts while the agent is stopped.
                x.exec.set_frozen(true);
                w.at(at_us + for_us, Ev::Resume(agent));
            }
        }
    }

    /// Agent `a`'s node dies: its parent sees the connection close; its children see theirs
    /// close, and the leader sees them detached from it.
    fn lose(&mut self, w: &mut World, cfg: &SimConfig, a: u32) {
        let x = &mut self.agents[a as usize];
        if x.dead {
            return;
        }
        x.dead = true;
        let later = w.now + cfg.latency_us;
        let why = "connection closed (simulated node loss)".to_string();
        match x.parent {
            None => w.at(later, Ev::ToLeader(Input::Lost { agent: a, why: why.clone() })),
            Some(head) => {
                let closed = machine::Input::ChildClosed { child: a, agents: vec![a], why: why.clone() };
                w.at(later, Ev::ToAgent(head, closed));
            }
        }
        for m in (0..self.tree.len()).filter(|&m| self.agents[m as usize].parent == Some(a)) {
            w.at(later, Ev::ToLeader(Input::Detached { agent: m }));
            w.at(later, Ev::ToAgent(m, machine::Input::ParentEnded(why.clone())));
        }
    }

    /// A stopped agent goes on: what reached it meanwhile, in order, then its executor.
    fn resume(&mut self, w: &mut World, cfg: &SimConfig, a: u32) {
        let x = &mut self.agents[a as usize];
        if x.dead {
            return;
        }
        x.stopped_until = None;
        x.exec.set_frozen(false);
        for input in std::mem::take(&mut x.deferred) {
            self.step(w, cfg, a, input);
        }
        self.run_exec(w, cfg, a, Vec::new());
    }
}

/// Takes the runtime hints out of the ledger's records; returns them by task id.
fn hide_hints(ledger: &Ledger) -> anyhow::Result<Vec<u32>> {
    let mut truth = Vec::new();
    let mut hinted = Vec::new();
    ledger.read()?.for_each(|id, r| {
        if truth.len() <= id as usize {
            truth.resize(id as usize + 1, 0);
        }
        truth[id as usize] = r.runtime_ms;
        if r.runtime_ms > 0 {
            hinted.push((id, Record { runtime_ms: 0, ..*r }));
        }
    })?;
    let mut txn = ledger.write()?;
    for (id, r) in &hinted {
        txn.put(*id, r)?;
    }
    txn.commit()?;
    Ok(truth)
}

/// The lower bound max(Σ runtime × cores / C, longest runtime) over the run's tasks, and the
/// same with each agent's cores counted only from its join, both in seconds.
fn bounds(ledger: &Ledger, cfg: &SimConfig) -> anyhow::Result<(f64, f64)> {
    let n = cfg.agents.max(1) as u64;
    let c = cfg.cores_per_agent.max(1) as f64;
    let (mut work_us, mut longest) = (0f64, 0u64);
    ledger.read()?.for_each(|_, r| {
        let us = cfg.runtime_us(r.runtime_ms);
        work_us += us as f64 * r.cores.max(1) as f64;
        longest = longest.max(us);
    })?;
    let plain = (work_us / (n as f64 * c)).max(longest as f64);
    // Capacity by time T grows with T; bisect for the first T that holds all the work.
    let joins: Vec<f64> = (0..n).map(|a| (cfg.join_spread_us * a / n) as f64).collect();
    let capacity = |t: f64| joins.iter().map(|j| (t - j).max(0.0) * c).sum::<f64>();
    let (mut lo, mut hi) = (plain, plain + cfg.join_spread_us as f64);
    for _ in 0..64 {
        let mid = (lo + hi) / 2.0;
        if capacity(mid) >= work_us {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok((plain / 1e6, hi.max(longest as f64) / 1e6))
}

/// `htc simulate FILE`: loads the file into a scratch run (the same load as `htc run`), gives
/// simulates, and removes the scratch run.
pub fn simulate_file(file: &std::path::Path, cfg: &SimConfig) -> anyhow::Result<SimReport> {
    let scratch = std::env::temp_dir().join(format!("htc-simulate.{}", std::process::id()));
    std::fs::create_dir_all(&scratch).with_context(|| format!("creating {}", scratch.display()))?;
    let r = (|| {
        let defaults = htc_core::taskfile::TaskOptions::default();
        let loading = Instant::now();
        let (run, _) =
            crate::load::create_run(&scratch, "sim", file, htc_core::output::OutputMode::None, defaults, None)?;
        let load_s = loading.elapsed().as_secs_f64();
        simulate(&run, cfg).map(|r| SimReport { load_s, ..r })
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    r
}
