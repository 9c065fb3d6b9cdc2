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
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use htc_core::tree::Tree;

use crate::agent::machine::{self, Carrier, Effect};
use crate::agent::Instance;
use crate::leader::core::{Ending, Input};
use crate::leader::effect::{self, Effects};
use crate::leader::session::{DriverConfig, Session, World as SessionWorld};
use crate::leader::{new_core, Planned};
use crate::ledger::{Change, Ledger, Outcome};
use crate::liveness::Liveness;
use crate::load::TaskText;
use crate::rundir::RunDir;
use htc_core::virtual_agent::VirtualAgent;
use htc_core::work::{Command, ExecEvent, TaskToRun};
use htc_engine::msg::{Came, Down, Hello, ToAgent, Up};

mod breaking;
mod fault;
mod report;
use fault::Close;
pub use fault::Fault;
pub use report::{json, text};

#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Agents.
    pub agents: u32,
    pub cores_per_agent: u32,
    /// Agents per 2nd-level instance: the first of each takes work for all of them.
    pub instance_agents: u32,
    /// Heads per parent: more form a tree of relays (heads passing others' frames), as
    /// `htc run --fanout` does; `None`: every head talks to the leader.
    pub fanout: Option<u32>,
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
    /// The leader's session has a commit due (its acks wait for it).
    LeaderDue,
    /// The leader's timer (heartbeats, silent agents), as its driver's.
    LeaderTick,
    /// An input for agent `a`'s machine.
    ToAgent(u32, machine::Input),
    /// `ev`, carried over agent `link`'s connection to its parent as it was (`gen`): lost if
    /// that connection broke since.
    Over { link: u32, gen: u32, ev: Box<Ev> },
    /// Agent `a`'s report timer.
    Tick(u32),
    /// Agent `a`'s executor has a task ending now.
    ExecDue(u32),
    /// The `i`th of `SimConfig::faults` happens.
    Fault(usize),
    /// A stopped agent goes on.
    Resume(u32),
    /// Agent `a` is through to the leader on a new connection and says `hello` (a rejoin
    /// around a lost relay, or a given-up agent back empty).
    Connected(u32, Input),
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

/// How an agent reconnects to the leader (`node/src/agent/mod.rs`): a rejoin starts after the
/// leader has had time to notice the relay's loss and tries every so often until the lease is
/// over; a given-up agent tries to come back for a minute.
const REJOIN_AFTER_US: u64 = 50_000;
const REJOIN_EVERY_US: u64 = 100_000;
const REVIVE_EVERY_US: u64 = 200_000;
const REVIVE_FOR_US: u64 = 60_000_000;

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
    let n = cfg.agents.max(1);
    fault::check(&cfg.faults, n)?;
    let ledger = Ledger::open(&run.ledger(), false).context("opening the ledger")?;
    let text = TaskText::open(&run.tasks()).context("mapping the run's task file")?;
    let planning = Instant::now();
    // Heads talk to the leader, or with a fan-out to a relay (another head) above them;
    // members to their head.
    let tree = Arc::new(Tree::instances(n, cfg.instance_agents, cfg.fanout.unwrap_or(n).max(1)));
    let plan = Planned { instances: tree.heads().len(), ..cfg.plan.clone() };
    let (bound_s, bound_joined_s) = bounds(&ledger, cfg)?;
    let truth = if cfg.hide_hints { Some(Arc::new(hide_hints(&ledger)?)) } else { None };
    let core = new_core(&ledger, &plan, &run.id(), 0)?.with_layout(tree.clone());
    let plan_s = planning.elapsed().as_secs_f64();
    let mut fleet = Fleet::new(tree, &run.id(), cfg, truth);
    let mut session = Session::new(core, &ledger, &text, sim_driver_config(), SimNet::default());
    session.begin(&run.id())?;
    let mut leader = Leader { session, inbox: VecDeque::new(), free_at: 0, waking: false, busy_us: 0, due_at: None };
    let (ending, events) = run_to_end(cfg, &mut leader, &mut fleet)?;
    let Leader { session, busy_us, .. } = leader;
    let (ending, _, core) = session.end(ending)?;
    if !matches!(ending, Ending::Complete) {
        anyhow::bail!("the simulated run did not complete: {ending:?}");
    }
    let counts = core.counts();
    Ok(SimReport {
        tasks: counts.total(),
        failed: counts.get(htc_core::task::State::Failed),
        makespan_s: fleet.last_end as f64 / 1e6,
        bound_s,
        bound_joined_s,
        leader_busy_s: busy_us as f64 / 1e6,
        load_s: 0.0,
        plan_s,
        events,
        wall: wall.elapsed(),
        moved_back: core.moved_back(),
        reruns: fleet.starts.saturating_sub(fleet.started.len() as u64),
        running_at_faults: fleet.running_at_faults,
        queued_at_faults: fleet.queued_at_faults,
    })
}

/// Joins the agents, schedules the faults, and handles events until the leader's run ends;
/// returns how it ended and the events handled.
fn run_to_end(cfg: &SimConfig, leader: &mut Leader, fleet: &mut Fleet) -> anyhow::Result<(Ending, u64)> {
    let mut w = World { heap: BinaryHeap::new(), seq: 0, now: 0 };
    let n = fleet.tree.len();
    for a in 0..n {
        w.at(cfg.join_spread_us * a as u64 / n as u64, Ev::Join(a));
    }
    for (i, f) in cfg.faults.iter().enumerate() {
        w.at(f.at_us(), Ev::Fault(i));
    }
    w.at(LEADER_TICK_US, Ev::LeaderTick);
    let mut events = 0u64;
    loop {
        let Some(At { at, ev, .. }) = w.heap.pop() else {
            return Ok((Ending::AgentsLost("the simulation ran out of events".into()), events));
        };
        w.now = at;
        events += 1;
        let Some(ev) = fleet.arrives(ev) else { continue };
        match ev {
            Ev::Over { .. } => unreachable!("unwrapped by arrives"),
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
                if let Some(e) = leader.wake(&mut w, cfg, fleet)? {
                    return Ok((e, events));
                }
            }
            Ev::LeaderDue => leader.due(&mut w, cfg, fleet)?,
            Ev::ToAgent(a, input) => fleet.step(&mut w, cfg, a, input),
            Ev::Tick(a) => fleet.tick(&mut w, cfg, a),
            Ev::ExecDue(a) => fleet.exec_due(&mut w, cfg, a),
            Ev::Fault(i) => fleet.fault(&mut w, cfg, cfg.faults[i]),
            Ev::Resume(a) => fleet.resume(&mut w, cfg, a),
            Ev::Connected(a, hello) => fleet.connected(&mut w, cfg, a, hello),
        }
    }
}

/// The group-commit interval of the simulated leader: the one `htc run` and a Slurm job's leader
/// use, so that acks reach the agents as late as they do there.
const COMMIT_EVERY: Duration = Duration::from_millis(10);

/// The leader's session as the simulation runs it: no live view, progress or growing, and no
/// sync to disk (nothing outlives a simulated run).
fn sim_driver_config() -> DriverConfig {
    DriverConfig {
        commit_interval: COMMIT_EVERY,
        progress: None,
        live_dir: None,
        given_up: None,
        signalled: None,
        give_back: None,
        grow: None,
        durable: false,
    }
}

/// The simulated world as the leader's session sees it: the virtual clock, and the effects of its
/// turns, which the simulation carries out once the leader's CPU has spent their cost (`Downward`).
#[derive(Default)]
struct SimNet {
    now: u64,
    effects: Effects,
}

impl SessionWorld for SimNet {
    fn now_us(&self) -> u64 {
        self.now
    }
    fn carry(&mut self, out: &mut Effects) {
        self.effects.append(out);
    }
}

/// The leader: the session a real leader runs (its core over the real ledger, its commits, acks
/// only after them), fed one input at a time at a cost per input and per result.
struct Leader<'l> {
    session: Session<'static, 'l, SimNet>,
    inbox: VecDeque<Input>,
    /// When it is done with what it is handling.
    free_at: u64,
    waking: bool,
    busy_us: u64,
    /// When the session's next commit is due (`Ev::LeaderDue` on the heap), if one is.
    due_at: Option<u64>,
}

impl Leader<'_> {
    fn arrive(&mut self, w: &mut World, input: Input) {
        self.inbox.push_back(input);
        if !self.waking {
            self.waking = true;
            w.at(w.now.max(self.free_at), Ev::LeaderWake);
        }
    }

    /// Handles the next input as a turn of the session; its frames leave when the leader is
    /// done with it.
    fn wake(&mut self, w: &mut World, cfg: &SimConfig, fleet: &Fleet) -> anyhow::Result<Option<Ending>> {
        let input = self.inbox.pop_front().expect("woken with an empty queue");
        let results = match &input {
            Input::Report { report, .. } => report.results.len() as u64,
            _ => 0,
        };
        self.session.world.now = w.now;
        let ended = match input {
            Input::Tick => self.session.tick()?,
            input => self.session.turn(input)?,
        };
        let ending = ended.or_else(|| self.session.core().ending());
        self.session.commit(ending.as_ref())?;
        self.session.chores()?;
        let cost = cfg.leader.of(results).round() as u64;
        self.busy_us += cost;
        self.free_at = w.now + cost;
        self.send(w, fleet, self.free_at + cfg.latency_us);
        if ending.is_some() {
            return Ok(ending);
        }
        self.waking = !self.inbox.is_empty();
        if self.waking {
            w.at(self.free_at, Ev::LeaderWake);
        }
        self.schedule_due(w);
        Ok(None)
    }

    /// A commit came due with no input: it commits, and the acks go out.
    fn due(&mut self, w: &mut World, cfg: &SimConfig, fleet: &Fleet) -> anyhow::Result<()> {
        self.due_at = None;
        self.session.world.now = w.now;
        self.session.commit(None)?;
        self.session.chores()?;
        self.send(w, fleet, w.now.max(self.free_at) + cfg.latency_us);
        self.schedule_due(w);
        Ok(())
    }

    /// Puts the session's next commit on the heap while its writes wait for one.
    fn schedule_due(&mut self, w: &mut World) {
        let Some(at) = self.session.commit_due_us() else { return };
        if self.due_at.is_none_or(|d| d > at) {
            self.due_at = Some(at);
            w.at(at.max(w.now), Ev::LeaderDue);
        }
    }

    /// The session's effects so far, to reach the agents at the top of the tree at `at`.
    fn send(&mut self, w: &mut World, fleet: &Fleet, at: u64) {
        let mut down = Downward { w, fleet, at };
        self.session.world.effects.drain(..).for_each(|e| e.carry_out(&mut down));
    }
}

/// The leader's effects of one input, carried out as the node's leader driver does over sockets:
/// each message down the connection that leads to its agent.
struct Downward<'a> {
    w: &'a mut World,
    fleet: &'a Fleet,
    /// When they reach the agents at the top of the tree.
    at: u64,
}

impl effect::Carrier for Downward<'_> {
    fn to_agent(&mut self, agent: u32, msg: ToAgent) {
        self.fleet.send_down(self.w, self.at, Down { agent, msg });
    }
    // The virtual network keeps no place for an agent to free: what comes over a connection
    // that no longer stands for an agent is dropped there (`Fleet::carries`).
    fn given_up(&mut self, _agent: u32) {}
    // A simulated run has no clients.
    fn added(&mut self, _request: u64, _answer: Result<Vec<u64>, String>) {}
    // Nor signals.
    fn signalled(&mut self) {}
    // Nor a Slurm job to shrink (its core gives no nodes back: `giving_back_nodes` is unset).
    fn give_back(&mut self, _nodes: Vec<String>) {}
}

/// One agent's turn of effects, carried out in the virtual world as the node's agent driver
/// does over sockets: frames take the latency over the connection they go by, commands go to
/// its executor (after the turn), reconnecting to the leader takes tries.
struct SimTurn<'a> {
    w: &'a mut World,
    agent: u32,
    tree: &'a Tree,
    links: &'a [Link],
    latency_us: u64,
    lease_us: u64,
    /// Its node reaches nobody before this (a cut link): reconnecting fails until then.
    offline_until: u64,
    /// What the leader hears when this agent comes back given up (`revive`).
    hello: Option<Input>,
    exec: Vec<Command>,
    /// It dropped its connection to come back fresh (`revive`).
    dropped: bool,
}

impl Carrier for SimTurn<'_> {
    fn up(&mut self, msg: Up) {
        let l = self.links[self.agent as usize];
        if !l.open {
            return;
        }
        let ev = match l.parent {
            Some(p) => Ev::ToAgent(p, machine::Input::ChildFrame(msg)),
            None => Ev::ToLeader(Input::from(msg)),
        };
        let at = self.w.now + self.latency_us;
        self.w.at(at, Ev::Over { link: self.agent, gen: l.gen, ev: Box::new(ev) });
    }
    fn down(&mut self, child: u32, msg: Down) {
        let l = self.links[child as usize];
        // A member's Welcome ends its join handshake, which `Fleet::join` models.
        if matches!(msg.msg, ToAgent::Welcome { .. }) || !l.open || l.parent != Some(self.agent) {
            return;
        }
        let ev = Ev::ToAgent(child, machine::Input::Parent(msg));
        self.w.at(self.w.now + self.latency_us, Ev::Over { link: child, gen: l.gen, ev: Box::new(ev) });
    }
    fn exec(&mut self, command: Command) {
        self.exec.push(command);
    }
    // The agent's end closes the connection (`Fleet::exit`).
    fn close_up(&mut self) {}
    fn rejoin(&mut self) {
        // Around the lost relay, straight to the leader, keeping its tasks and those below it.
        let (me, n) = (self.agent, self.tree.len());
        let below = (0..n).filter(|&x| self.tree.next_hop(Some(me), x).is_some()).collect();
        let now = self.w.now;
        let at = first_try(now + REJOIN_AFTER_US, REJOIN_EVERY_US, self.offline_until);
        // Past the lease the driver stops trying; the machine fences itself then.
        if at < now + self.lease_us {
            self.w.at(at, Ev::Connected(me, Input::Rejoined { agent: me, below }));
        }
    }
    // Simulated agents are all the leader's own: none waits for a new leader.
    fn await_leader(&mut self) {}
    fn revive(&mut self) {
        self.dropped = true;
        let Some(hello) = self.hello.take() else { return };
        let now = self.w.now;
        let at = first_try(now, REVIVE_EVERY_US, self.offline_until);
        if at < now + REVIVE_FOR_US {
            self.w.at(at, Ev::Connected(self.agent, hello));
        } else {
            let why = machine::Input::ReviveFailed("the leader could not be reached for 60 s".into());
            self.w.at(now + REVIVE_FOR_US, Ev::ToAgent(self.agent, why));
        }
    }
}

/// The first of tries at `first`, then every `every`, that falls at or after `open_at`.
fn first_try(first: u64, every: u64, open_at: u64) -> u64 {
    if open_at <= first {
        first
    } else {
        first + (open_at - first).div_ceil(every) * every
    }
}

/// An agent's connection to its parent, as the network has it.
#[derive(Debug, Clone, Copy)]
struct Link {
    /// The leader (`None`), its head, or its relay.
    parent: Option<u32>,
    open: bool,
    /// Each new connection, and each broken one, is a new generation: what was on the way over
    /// a broken one is lost.
    gen: u32,
}

/// One simulated agent: its machine, its spawners as a real agent lays them out, and what a
/// fault did to it.
struct Agent {
    machine: Instance,
    exec: VirtualAgent,
    /// Its machine was told that the executor ended.
    told_end: bool,
    /// Its node died: nothing reaches it or comes from it.
    dead: bool,
    /// Its machine ended, and so did its process.
    exited: bool,
    /// Stopped until then: what reaches it waits, in order.
    stopped_until: Option<u64>,
    deferred: Vec<machine::Input>,
    /// Its node reaches nobody before this (a cut link).
    offline_until: u64,
    /// What its tasks' runtimes are multiplied by when they start (a slow node), as f64 bits.
    slow: Arc<AtomicU64>,
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
    links: Vec<Link>,
    live: Liveness,
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
        let live = Liveness::default();
        let agent = |a: u32| {
            let truth = truth.clone();
            let slow = Arc::new(AtomicU64::new(1f64.to_bits()));
            let factor = slow.clone();
            let runtime = move |t: &TaskToRun| -> u64 {
                let hint = truth.as_ref().and_then(|v| v.get(t.id as usize).copied()).unwrap_or(t.shape.runtime_ms);
                let us = if hint > 0 { hint as u64 * 1000 } else { default_us };
                match f64::from_bits(factor.load(Relaxed)) {
                    1.0 => us,
                    f => (us as f64 * f).round() as u64,
                }
            };
            // As the node's agent driver makes it: a head below a relay can go around the
            // relay's loss, and an agent given up comes back empty.
            let can_rejoin = tree.parent(a).is_some() && tree.head(a) == a;
            let machine = Instance::new(a, c as usize, tree.clone(), job_id)
                .with_resources(cfg.mem_mb_per_agent, cfg.gpus_per_agent)
                .with_liveness(live)
                // One clock for all, as the wall clock is for real agents: reports keep to its windows.
                .with_clock(0)
                .with_rejoin(can_rejoin)
                .with_revive(true);
            Agent {
                machine,
                exec: VirtualAgent::per_core(c, cfg.gpus_per_agent, Arc::new(runtime)),
                told_end: false,
                dead: false,
                exited: false,
                stopped_until: None,
                deferred: Vec::new(),
                offline_until: 0,
                slow,
                due_at: None,
            }
        };
        Fleet {
            agents: (0..n).map(agent).collect(),
            links: (0..n).map(|a| Link { parent: tree.parent(a), open: true, gen: 0 }).collect(),
            tree,
            live,
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
        let l = self.links[a as usize];
        let over = |ev| Ev::Over { link: a, gen: l.gen, ev: Box::new(ev) };
        let at = w.now + cfg.latency_us;
        match l.parent {
            None => w.at(at, over(Ev::ToLeader(self.hello(cfg, a, false)))),
            Some(p) => {
                let hello = Hello {
                    agent: a,
                    cores: cfg.cores_per_agent,
                    mem_mb: cfg.mem_mb_per_agent,
                    gpus: cfg.gpus_per_agent,
                    hostname: format!("sim{a}"),
                    came: Came::New,
                };
                w.at(at, over(Ev::ToAgent(p, machine::Input::ChildOpened(a))));
                w.at(at, over(Ev::ToAgent(p, machine::Input::ChildFrame(Up::Hello(hello)))));
            }
        }
        w.at(w.now + 2 * cfg.latency_us, Ev::Tick(a));
    }

    /// What the leader hears when agent `a` says Hello to it: as a new member, or again after
    /// being given up (`revived`).
    fn hello(&self, cfg: &SimConfig, agent: u32, revived: bool) -> Input {
        Input::from(Hello {
            agent,
            cores: cfg.cores_per_agent,
            mem_mb: cfg.mem_mb_per_agent,
            gpus: cfg.gpus_per_agent,
            hostname: format!("sim{agent}"),
            came: if revived { Came::Fresh } else { Came::New },
        })
    }

    /// What arrives of `ev`: itself, or what it carries over a connection if that got it there.
    fn arrives(&self, mut ev: Ev) -> Option<Ev> {
        while let Ev::Over { link, gen, ev: inner } = ev {
            if !self.carries(link, gen, &inner) {
                return None;
            }
            ev = *inner;
        }
        Some(ev)
    }

    /// Whether `ev`, on its way over agent `link`'s connection as it was at `gen`, arrives: not
    /// if the connection broke since; and what the leader hears about an agent over a
    /// connection that no longer stands for it (it came back over another) is dropped, as the
    /// leader's network side does.
    fn carries(&self, link: u32, gen: u32, ev: &Ev) -> bool {
        self.links[link as usize].gen == gen
            && match ev {
                Ev::ToLeader(Input::Report { agent, .. } | Input::Lost { agent, .. }) => self.top(*agent) == link,
                _ => true,
            }
    }

    /// The agent whose connection to the leader carries agent `a`'s frames.
    fn top(&self, mut a: u32) -> u32 {
        for _ in 0..self.tree.len() {
            match self.links[a as usize].parent {
                Some(p) => a = p,
                None => break,
            }
        }
        a
    }

    /// A frame from the leader for agent `a`, put on the connection to the leader that leads
    /// to it; relays (and heads) pass it down as their machines say.
    fn send_down(&self, w: &mut World, at: u64, down: Down) {
        let top = self.top(down.agent);
        let l = self.links[top as usize];
        if l.open {
            let ev = Ev::ToAgent(top, machine::Input::Parent(down));
            w.at(at, Ev::Over { link: top, gen: l.gen, ev: Box::new(ev) });
        }
    }

    /// Agent `a` got through to the leader on a new connection (its old one, if still open,
    /// closes cleanly): the leader hears `hello`, then the agent hears it is back.
    fn connected(&mut self, w: &mut World, cfg: &SimConfig, a: u32, hello: Input) {
        let x = &self.agents[a as usize];
        if x.dead || x.exited {
            return;
        }
        self.close_up(w, cfg, a, "connection closed (the agent reconnected)", Close::Clean);
        let l = &mut self.links[a as usize];
        (l.parent, l.open, l.gen) = (None, true, l.gen + 1);
        let over = |ev| Ev::Over { link: a, gen: l.gen, ev: Box::new(ev) };
        w.at(w.now + cfg.latency_us, over(Ev::ToLeader(hello)));
        w.at(w.now + 2 * cfg.latency_us, over(Ev::ToAgent(a, machine::Input::Rejoined)));
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
        // The agent's tick: its fan-out asks back what is stuck behind a busy loop.
        let mut events = Vec::new();
        self.agents[a as usize].exec.tick(w.now, &mut events);
        if !events.is_empty() {
            self.run_exec(w, cfg, a, events);
        }
        self.step(w, cfg, a, machine::Input::Tick);
        w.at(w.now + cfg.flush_every_us, Ev::Tick(a));
    }

    /// Feeds agent `a`'s machine and carries out its effects; an agent whose machine ended
    /// exits.
    fn step(&mut self, w: &mut World, cfg: &SimConfig, a: u32, input: machine::Input) {
        let hello = self.hello(cfg, a, true);
        let x = &mut self.agents[a as usize];
        if x.dead {
            return;
        }
        if x.stopped_until.is_some() {
            x.deferred.push(input);
            return;
        }
        x.machine.handle(w.now, input, &mut self.effects);
        let mut turn = SimTurn {
            w,
            agent: a,
            tree: &self.tree,
            links: &self.links,
            latency_us: cfg.latency_us,
            lease_us: self.live.lease_us,
            offline_until: x.offline_until,
            hello: Some(hello),
            exec: Vec::new(),
            dropped: false,
        };
        std::mem::take(&mut self.effects).into_iter().for_each(|e| e.carry_out(&mut turn));
        let (exec, dropped) = (turn.exec, turn.dropped);
        if dropped {
            self.close_up(w, cfg, a, "connection closed (the agent left to come back fresh)", Close::Clean);
        }
        let mut events = Vec::new();
        let x = &mut self.agents[a as usize];
        for c in exec {
            x.exec.command(w.now, c, &mut events);
        }
        self.run_exec(w, cfg, a, events);
        let x = &self.agents[a as usize];
        if !x.exited && x.machine.outcome().is_some() {
            self.exit(w, cfg, a);
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
                ExecEvent::Finished(f) if f.ended.outcome == Outcome::Exited => {
                    self.last_end = self.last_end.max(f.ended.end_us)
                }
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
}

/// Takes the runtime hints out of the ledger's records; returns them by task id.
fn hide_hints(ledger: &Ledger) -> anyhow::Result<Vec<u32>> {
    let mut truth = Vec::new();
    let mut hinted = Vec::new();
    ledger.read()?.for_each(|id, r| {
        if truth.len() <= id as usize {
            truth.resize(id as usize + 1, 0);
        }
        truth[id as usize] = r.shape().runtime_ms;
        if r.shape().runtime_ms > 0 {
            let mut unhinted = *r;
            unhinted.shape_mut().runtime_ms = 0;
            hinted.push((id, unhinted));
        }
    })?;
    let mut txn = ledger.write()?;
    for (id, r) in &hinted {
        txn.apply(&Change::Record(*id, *r))?;
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
        let us = cfg.runtime_us(r.shape().runtime_ms);
        work_us += us as f64 * r.shape().cores.max(1) as f64;
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
        let defaults = htc_core::taskfile::TaskShape::default();
        let loading = Instant::now();
        let (run, _) = crate::load::create_run(
            &scratch,
            "sim",
            Some(file),
            htc_core::output::OutputMode::None,
            defaults,
            None,
            None,
        )?;
        let load_s = loading.elapsed().as_secs_f64();
        simulate(&run, cfg).map(|r| SimReport { load_s, ..r })
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    r
}
