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

use crate::agent::machine::{self, Effect};
use crate::agent::Instance;
use crate::executor::{Command, ExecEvent, Finished, TaskToRun};
use crate::leader::core::{Core, Ending, Input, Outbox};
use crate::leader::driver::LedgerTasks;
use crate::leader::{new_core, Planned};
use crate::ledger::{Ledger, Outcome, Record, WriteTxn};
use crate::load::TaskText;
use crate::proto::{self, frame::Body};
use crate::rundir::RunDir;

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
    /// A simulated task process ends.
    TaskEnd { agent: u32, cores: u32, done: Finished },
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

/// One agent's executor: slots, a FIFO queue, tasks that end after their hint.
struct SimExec {
    free: u32,
    slots: u32,
    queue: VecDeque<TaskToRun>,
    finishing: bool,
    /// Stopped (finished or aborted): ends of tasks still scheduled are ignored.
    stopped: bool,
    /// Its machine was told that it stopped.
    told: bool,
}

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
    let truth = if cfg.hide_hints { Some(hide_hints(&ledger)?) } else { None };
    let core = new_core(&ledger, &plan, &run.id(), 0)?.with_layout(tree.clone());
    let plan_s = planning.elapsed().as_secs_f64();
    let mut fleet = Fleet::new(tree, &run.id(), cfg);
    fleet.truth = truth;
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
    w.at(LEADER_TICK_US, Ev::LeaderTick);
    let mut events = 0u64;
    let ending = loop {
        let Some(At { at, ev, .. }) = w.heap.pop() else {
            break Ending::AgentsLost("the simulation ran out of events".into());
        };
        w.now = at;
        events += 1;
        match ev {
            Ev::Join(a) => {
                let (cores, head) = (cfg.cores_per_agent, fleet.tree.head(a));
                if head == a {
                    let joined = Input::Joined { agent: a, cores, mem_mb: 0, gpus: 0, hostname: format!("sim{a}") };
                    w.at(at + cfg.latency_us, Ev::ToLeader(joined));
                } else {
                    let hello = proto::Hello { agent_id: a, cores, ..Default::default() };
                    w.at(at + cfg.latency_us, Ev::ToAgent(head, machine::Input::ChildOpened(a)));
                    w.at(at + cfg.latency_us, Ev::ToAgent(head, machine::Input::ChildFrame(Body::Hello(hello))));
                }
                // Its first report goes out once the Welcome is back.
                w.at(at + 2 * cfg.latency_us, Ev::Tick(a));
            }
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
            Ev::Tick(a) => {
                fleet.step(&mut w, cfg, a, machine::Input::Tick);
                if fleet.machines[a as usize].outcome().is_none() {
                    w.at(at + cfg.flush_every_us, Ev::Tick(a));
                }
            }
            Ev::TaskEnd { agent, cores, done } => fleet.task_ended(&mut w, cfg, agent, cores, done),
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

/// The agents: their machines and simulated executors.
struct Fleet {
    tree: Arc<Tree>,
    machines: Vec<Instance>,
    execs: Vec<SimExec>,
    effects: Vec<Effect>,
    last_end: u64,
    /// Each task's runtime hint by id, where the ledger's were hidden (`hide_hints`).
    truth: Option<Vec<u32>>,
}

impl Fleet {
    fn new(tree: Arc<Tree>, job_id: &str, cfg: &SimConfig) -> Fleet {
        let (n, c) = (tree.len(), cfg.cores_per_agent);
        let exec =
            || SimExec { free: c, slots: c, queue: VecDeque::new(), finishing: false, stopped: false, told: false };
        Fleet {
            // One clock for all, as the wall clock is for real agents: reports keep to its windows.
            machines: (0..n).map(|a| Instance::new(a, c as usize, tree.clone(), job_id).with_clock(0)).collect(),
            tree,
            execs: (0..n).map(|_| exec()).collect(),
            effects: Vec::new(),
            last_end: 0,
            truth: None,
        }
    }

    /// Feeds agent `a`'s machine and carries out its effects.
    fn step(&mut self, w: &mut World, cfg: &SimConfig, a: u32, input: machine::Input) {
        self.machines[a as usize].handle(w.now, input, &mut self.effects);
        let mut commands = Vec::new();
        let mut recalled = Vec::new();
        let head = self.tree.head(a);
        let later = w.now + cfg.latency_us;
        for e in self.effects.drain(..) {
            match e {
                Effect::Up(body) if head != a => w.at(later, Ev::ToAgent(head, machine::Input::ChildFrame(body))),
                Effect::Up(Body::Report(report)) => w.at(later, Ev::ToLeader(Input::Report { agent: a, report })),
                Effect::Up(Body::Lost(l)) => w.at(later, Ev::ToLeader(Input::Lost { agent: l.agent, why: l.reason })),
                // A member's Welcome ends its join handshake, which `Ev::Join` models.
                Effect::Down { body: Body::Welcome(_), .. } => {}
                Effect::Down { child, body } => w.at(later, Ev::ToAgent(child, machine::Input::Parent(body))),
                // No relays: every simulated head talks to the leader itself.
                Effect::Up(_) | Effect::Relay(_) | Effect::CloseUp | Effect::Rejoin | Effect::Revive => {}
                Effect::Exec(c) => commands.push(c),
            }
        }
        for c in commands {
            let x = &mut self.execs[a as usize];
            match c {
                Command::Run(tasks) => x.queue.extend(tasks),
                Command::Finish => x.finishing = true,
                Command::Abort => {
                    x.queue.clear();
                    x.stopped = true;
                }
                // Nothing in the simulation falls silent long enough to be held or given up,
                // and simulated tasks are not preempted.
                Command::Hold(_) | Command::Reset | Command::Stop(_) => {}
                Command::Recall(ids) => crate::executor::recall_from(&mut x.queue, &ids, &mut recalled),
            }
            self.start_queued(w, cfg, a);
        }
        if !recalled.is_empty() {
            self.step(w, cfg, a, machine::Input::Exec(recalled));
        }
    }

    fn task_ended(&mut self, w: &mut World, cfg: &SimConfig, a: u32, cores: u32, done: Finished) {
        let x = &mut self.execs[a as usize];
        if x.stopped {
            return;
        }
        x.free += cores;
        self.last_end = self.last_end.max(w.now);
        self.step(w, cfg, a, machine::Input::Exec(vec![ExecEvent::Finished(done)]));
        self.start_queued(w, cfg, a);
    }

    /// Starts what fits from agent `a`'s queue, in order; tells its machine; ends a finished
    /// executor.
    fn start_queued(&mut self, w: &mut World, cfg: &SimConfig, a: u32) {
        let x = &mut self.execs[a as usize];
        let mut started = Vec::new();
        while !x.stopped {
            let Some(t) = x.queue.front() else { break };
            let cores = (t.cores.max(1)).min(x.slots);
            if cores > x.free {
                break;
            }
            let t = x.queue.pop_front().unwrap();
            x.free -= cores;
            let hint = self.truth.as_ref().and_then(|v| v.get(t.id as usize).copied()).unwrap_or(t.runtime_ms);
            let end = w.now + cfg.runtime_us(hint);
            let done = Finished {
                id: t.id,
                attempt: t.attempt,
                outcome: Outcome::Exited,
                value: 0,
                start_us: w.now,
                end_us: end,
            };
            w.at(end, Ev::TaskEnd { agent: a, cores, done });
            started.push(ExecEvent::Started { id: t.id, attempt: t.attempt, start_us: w.now });
        }
        let idle = x.free == x.slots && x.queue.is_empty();
        let end = !x.told && (x.stopped || (x.finishing && idle));
        if end {
            x.stopped = true;
            x.told = true;
        }
        if !started.is_empty() {
            self.step(w, cfg, a, machine::Input::Exec(started));
        }
        if end {
            self.step(w, cfg, a, machine::Input::ExecEnded);
        }
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

/// The report as `htc simulate` prints it.
pub fn text(cfg: &SimConfig, r: &SimReport) -> String {
    let mut t = format!(
        "htc simulate: {} tasks on {} agents x {} cores in instances of {} ({}), latency {} us, \
         leader {:.2} us/report + {:.2} us/task\n\
         makespan     {:.3} s (virtual)\n\
         lower bound  {:.3} s ({:.1}% above)\n",
        r.tasks,
        cfg.agents,
        cfg.cores_per_agent,
        cfg.instance_agents,
        cfg.plan.plan.name(),
        cfg.latency_us,
        cfg.leader.per_report_us,
        cfg.leader.per_task_us,
        r.makespan_s,
        r.bound_s,
        r.above_bound() * 100.0,
    );
    if cfg.hide_hints {
        t += "  (runtime hints hidden from the run: each task lasts its hint, unannounced)\n";
    }
    if cfg.join_spread_us > 0 {
        let above = (r.makespan_s / r.bound_joined_s - 1.0) * 100.0;
        t += &format!(
            "  from joins {:.3} s ({above:.1}% above; each agent's cores counted from its join)\n",
            r.bound_joined_s
        );
    }
    t + &format!(
        "leader busy  {:.3} s\nfailed       {}\nmoved back   {} (queued tasks asked back for idle slots)\nloaded in    {:.2} s, planned in {:.2} s, simulated in {:.1} s ({} events)\n",
        r.leader_busy_s,
        r.failed,
        r.moved_back,
        r.load_s,
        r.plan_s,
        r.wall.as_secs_f64(),
        r.events
    )
}

/// The report as one JSON object (`--json`).
pub fn json(cfg: &SimConfig, r: &SimReport) -> String {
    let f = |v: f64| format!("{v:.6}");
    let fields = [
        ("tasks", r.tasks.to_string()),
        ("agents", cfg.agents.to_string()),
        ("cores_per_agent", cfg.cores_per_agent.to_string()),
        ("instance_agents", cfg.instance_agents.to_string()),
        ("partition", format!("\"{}\"", cfg.plan.plan.name())),
        ("latency_us", cfg.latency_us.to_string()),
        ("leader_us_per_report", cfg.leader.per_report_us.to_string()),
        ("leader_us_per_task", cfg.leader.per_task_us.to_string()),
        ("makespan_s", f(r.makespan_s)),
        ("bound_s", f(r.bound_s)),
        ("above_bound", f(r.above_bound())),
        ("bound_joined_s", f(r.bound_joined_s)),
        ("leader_busy_s", f(r.leader_busy_s)),
        ("failed", r.failed.to_string()),
        ("events", r.events.to_string()),
        ("moved_back", r.moved_back.to_string()),
        ("hide_hints", cfg.hide_hints.to_string()),
        ("wall_s", format!("{:.3}", r.wall.as_secs_f64())),
        ("load_s", format!("{:.3}", r.load_s)),
        ("plan_s", format!("{:.3}", r.plan_s)),
    ];
    let body: Vec<String> = fields.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
    format!("{{{}}}\n", body.join(","))
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
