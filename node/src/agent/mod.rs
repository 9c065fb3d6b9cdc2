//! A node agent (`htc-agent work`): connects to its parent (the leader, or a relay agent above it
//! in the tree), proves it belongs to the job, asks for tasks, runs them through the executor and
//! reports starts and results in batches. An agent with children also relays: frames from below
//! go up unchanged, frames from above addressed to another agent go down the right branch.
//!
//! The decisions are `machine`'s; this driver moves frames, executor events, signals and timer
//! ticks into it and carries out what it answers. `relay` serves the children.

pub use htc_engine::agent::{instance, machine, Instance};
pub use htc_engine::pace;
mod relay;
mod spawners;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use htc_core::tree::Tree;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

use crate::auth;
use crate::frame::{self, read_frame, FrameError};
use htc_core::output::OutputMode;
use htc_engine::msg::{Down, Up};
use htc_engine::wire::proto::{self, frame::Body};
use htc_engine::wire::{self, PROTOCOL_VERSION};
use htc_exec::executor::{self, Command, ExecConfig, ExecEvent, Handle, TaskToRun};
use htc_exec::leftovers::Sweeper;
use htc_exec::simexec::{self, ExecKind};
use htc_store::rundir::RunDir;

use machine::{Carrier, Input, Wake};
use relay::Child;
use spawners::Spread;

/// The default `spawners`: a spawn loop per slot, whatever the tasks' widths; a task needing
/// several cores runs in the wide spawner beside them (`Spread`). `--spawners N` asks for N loops.
pub const LOOP_PER_SLOT: usize = 0;

/// The agents' report timer: short enough that a slot waits little for work, long enough that a
/// busy agent's results travel in batches. `htc simulate` uses it too.
pub const FLUSH_EVERY: Duration = Duration::from_millis(5);
/// The longest tick while nothing but heartbeats and the lease waits for time (`Wake::Quiet`):
/// an idle agent cost 9-12 ms of CPU a second ticking every 5 ms (bench/RESULTS.md §20).
const QUIET_EVERY: Duration = Duration::from_millis(50);

/// The least time between reports under load when not the layout's (`pace::gap_for`):
/// HTC_REPORT_MS from the job's environment, for measuring what the gap costs and gains.
pub fn report_gap() -> Option<Duration> {
    let ms = std::env::var("HTC_REPORT_MS").ok().and_then(|v| v.parse::<u64>().ok());
    ms.map(Duration::from_millis)
}

/// How often the agent looks for processes its tasks left behind (`leftovers`): what a task
/// leaves ends within about this long of the task.
const SWEEP_EVERY: Duration = Duration::from_millis(100);

pub struct AgentConfig {
    /// Where to connect: the leader, or the parent agent in the tree.
    pub parent: SocketAddr,
    /// The leader, to reconnect to when the relay above is lost.
    pub leader: SocketAddr,
    pub run: RunDir,
    pub agent_id: u32,
    pub slots: usize,
    pub cpus: Vec<usize>,
    pub mem_mb: u64,
    /// The GPUs the agent hands to tasks (`gpu`).
    pub gpus: Vec<htc_exec::gpu::Device>,
    /// How tasks' `mem=` is enforced (`memcg`).
    pub mem_limit: htc_exec::memcg::Enforce,
    pub output: OutputMode,
    pub kill_grace: Duration,
    /// How often the agent looks whether a report is due (`FLUSH_EVERY`).
    pub flush_every: Duration,
    /// The least time between reports under load, when not the layout's (`report_gap()`).
    pub report_gap: Option<Duration>,
    /// The job's tree (shared by the agents of one process).
    pub tree: Arc<Tree>,
    /// Set when this agent has children to serve: the bound listener.
    pub relay: Option<std::net::TcpListener>,
    /// Real processes, or a simulation that starts none.
    pub exec: ExecKind,
    /// Executors (spawn loops) splitting the slots; 0 = one per slot.
    pub spawners: usize,
    /// Heartbeats, the lease on the parent, the bound on silent members.
    pub live: htc_engine::liveness::Liveness,
    /// What tasks leave outside their process group lives until the agent ends (`leftovers`).
    pub keep_daemons: bool,
    /// An agent of a joined allocation: should the leader go, how long to wait for the run's
    /// new one (`Machine::with_await_leader`).
    pub await_leader: Option<Duration>,
    /// How long a signalled agent gives back what has not started before it stops what runs
    /// (`Machine::with_give_back`).
    pub give_back: Duration,
}

pub fn run(cfg: AgentConfig) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(run_async(cfg))
}

/// Several agents in one process (simulations: thousands of agents on a few cores). Each keeps
/// its own connection, tree position and executor; the first error is returned after all end.
pub fn run_many(cfgs: Vec<AgentConfig>) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for cfg in cfgs {
            let id = cfg.agent_id;
            set.spawn(async move { run_async(cfg).await.with_context(|| format!("agent {id}")) });
        }
        let mut first = Ok(());
        while let Some(r) = set.join_next().await {
            let r = r.map_err(anyhow::Error::from).and_then(|r| r);
            if first.is_ok() {
                first = r;
            }
        }
        first
    })
}

async fn connect(addr: SocketAddr) -> anyhow::Result<TcpStream> {
    let mut delay = Duration::from_millis(20);
    let mut last = None;
    for _ in 0..40 {
        match TcpStream::connect(addr).await {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(500));
    }
    Err(last.unwrap()).with_context(|| format!("connecting to {addr}"))
}

// Long (about 130 lines): the agent's one select over every source (signals, the parent's
// frames, children, executors, reconnections, the timer), each turned into one machine input,
// and the machine's effects carried out (`Turn`); the sources share the connection state, which
// a split would pass around by the dozen.
async fn run_async(mut cfg: AgentConfig) -> anyhow::Result<()> {
    let secret = cfg.run.read_secret().context("reading the job secret")?;
    // What keeps this agent from running tasks is found before it joins: one that cannot start
    // stops the run saying where and why (`srun_output`); one that joined and then left would
    // only be lost, and the run go on without its node.
    let memcg = if cfg.exec == ExecKind::Real { memory_cgroups(&cfg)? } else { None };
    let (job_id, stream) = join(&JoinAs::of(&cfg), cfg.parent, &secret, Joining::First).await?;

    let (child_tx, mut child_rx) = unbounded_channel::<Child>();
    if let Some(listener) = cfg.relay.take() {
        let place = auth::RelayPlace { me: cfg.agent_id, tree: cfg.tree.clone() };
        relay::listen(listener, place, &job_id, secret.clone(), child_tx.clone())?;
    }
    drop(child_tx);

    let (ev_tx, mut ev_rx) = unbounded_channel::<Spawned>();
    let mut execs = Executors::start(&cfg, &job_id, memcg, ev_tx)?;

    let (rd, mut wr) = stream.into_split();
    // Frames carry the generation of their connection: after a revival the old one may still
    // deliver what it had read.
    let mut gen = 0u32;
    let (fr_tx, mut fr_rx) = unbounded_channel::<(u32, Result<Down, FrameError>)>();
    read_frames(rd, gen, fr_tx.clone());
    let (rejoin_tx, mut rejoin_rx) = unbounded_channel::<Reconnected>();

    let start = tokio::time::Instant::now();
    let wall_us =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64);
    // A head below a relay can go around the relay's loss: the leader is still there.
    let can_rejoin = cfg.tree.parent(cfg.agent_id).is_some() && cfg.tree.head(cfg.agent_id) == cfg.agent_id;
    let mut m = Instance::new(cfg.agent_id, cfg.slots, cfg.tree.clone(), &job_id)
        .with_resources(cfg.mem_mb, cfg.gpus.len() as u32)
        .with_liveness(cfg.live)
        .with_clock(wall_us)
        .with_rejoin(can_rejoin)
        .with_revive(true)
        .with_await_leader(cfg.await_leader.is_some())
        .with_give_back(cfg.give_back.as_micros() as u64);
    if let Some(gap) = cfg.report_gap {
        m = m.with_report_gap(gap.as_micros() as u64);
    }
    let mut children: HashMap<u32, UnboundedSender<Vec<u8>>> = HashMap::new();
    let (mut parent_open, mut children_open, mut exec_open) = (true, true, true);
    // When a report held back for the gap is due; every `flush_every` while something else
    // waits for its time (a stop under way, a relay's children); at the heartbeat's pace, at
    // most `QUIET_EVERY`, while only heartbeats and the lease do: a node whose tasks run long
    // then wakes 20 times a second, not 200.
    let quiet_every = Duration::from_micros(m.heartbeat_us()).min(QUIET_EVERY).max(cfg.flush_every);
    let mut last_tick = tokio::time::Instant::now();
    let tick = tokio::time::sleep(cfg.flush_every);
    tokio::pin!(tick);
    let (mut sigterm, mut sigint) = (
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?,
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?,
    );
    // The spawners stop starting tasks within the signal's delivery (`stopping`); the loop
    // hears of it later, through tokio.
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: the action only stores to an atomic, which is async-signal-safe, and it stays
        // registered for the life of the process, as the static it touches does.
        unsafe { signal_hook_registry::register(sig, htc_exec::stopping::request) }?;
    }
    let mut effects = Vec::new();
    let mut out = Vec::new();
    // Real tasks only: simulated ones leave nothing behind.
    let mut leftovers = (cfg.exec == ExecKind::Real).then(|| Sweeper::new(cfg.agent_id, cfg.keep_daemons));
    let mut swept = std::time::Instant::now();
    let outcome = loop {
        let input = if let Some(batch) = execs.own_events() {
            Input::Exec(batch)
        } else {
            tokio::select! {
                // Killed from outside (scancel, kill): stop the tasks, which live in their own
                // process groups, rather than leave them running without an agent.
                _ = sigterm.recv() => Input::Signal("terminated by a signal"),
                _ = sigint.recv() => Input::Signal("interrupted"),
                f = fr_rx.recv(), if parent_open => match f {
                    Some((g, _)) if g != gen => continue,
                    Some((_, Ok(down))) => Input::Parent(down),
                    Some((_, Err(e))) => { parent_open = false; Input::ParentEnded(e.to_string()) }
                    None => { parent_open = false; Input::ParentEnded("connection closed".into()) }
                },
                c = child_rx.recv(), if children_open => match c {
                    Some(Child::Open { child, tx }) => { children.insert(child, tx); Input::ChildOpened(child) }
                    Some(Child::Up(up)) => Input::ChildFrame(up),
                    Some(Child::Closed { child, agents, why }) => {
                        children.remove(&child);
                        Input::ChildClosed { child, agents, why }
                    }
                    None => { children_open = false; continue }
                },
                batch = ev_rx.recv(), if exec_open => match batch {
                    Some((i, Some(batch))) => if execs.ran(i, &batch) { Input::ExecReset } else { Input::Exec(batch) },
                    Some((i, None)) => match execs.ended(i) {
                        Some(why) => Input::ExecFailed(why),
                        None => continue,
                    },
                    None => { exec_open = false; Input::ExecEnded }
                },
                s = rejoin_rx.recv() => match s {
                    Some(Ok((stream, leader))) => {
                        // After a hand-over the run's leader listens elsewhere.
                        cfg.leader = leader;
                        let (rd, w) = stream.into_split();
                        gen += 1;
                        read_frames(rd, gen, fr_tx.clone());
                        wr = w;
                        parent_open = true;
                        Input::Rejoined
                    }
                    Some(Err(why)) => Input::ReviveFailed(why),
                    None => continue,
                },
                _ = &mut tick => { last_tick = tokio::time::Instant::now(); execs.unstick(); Input::Tick }
            }
        };
        let now = start.elapsed().as_micros() as u64;
        m.handle(now, input, &mut effects);
        let due = match m.wake() {
            Wake::Soon => last_tick + cfg.flush_every,
            Wake::Quiet => last_tick + quiet_every,
            // Never sooner than the ticks were: a time already past would spin the loop.
            Wake::At(us) => {
                (start + Duration::from_micros(us)).clamp(last_tick + cfg.flush_every, last_tick + quiet_every)
            }
        };
        if tick.deadline() != due {
            tick.as_mut().reset(due);
        }
        let mut turn = Turn::new(&cfg, &secret, &rejoin_tx, &children, &mut execs, &mut out, now);
        effects.drain(..).for_each(|e| e.carry_out(&mut turn));
        let (close, revive) = (turn.close, turn.revive);
        if !out.is_empty() {
            let written = wr.write_all(&out).await;
            out.clear();
            if written.is_err() {
                m.handle(now, Input::ParentEnded("write failed".into()), &mut effects);
                // Nothing more goes up this connection, but an agent below a lost relay must
                // still go around it: the machine hears of the end once, here, and ignores the
                // reader's word of it after (a Rejoin dropped here was never asked again).
                let mut turn = Turn::new(&cfg, &secret, &rejoin_tx, &children, &mut execs, &mut out, now);
                turn.parent_gone = true;
                effects.drain(..).for_each(|e| e.carry_out(&mut turn));
            }
        }
        if close || revive {
            let _ = wr.shutdown().await;
        }
        if revive {
            // What the old connection still delivers is of no account now.
            gen += 1;
            parent_open = true;
            revive_fresh(&cfg, &secret, rejoin_tx.clone());
        }
        if let Some(sweeper) = leftovers.as_mut().filter(|_| swept.elapsed() >= SWEEP_EVERY) {
            swept = std::time::Instant::now();
            for (pid, task) in sweeper.sweep(|id| m.holds(id)) {
                tracing::info!(job = %job_id, agent = cfg.agent_id, task, pid, "killed a process the task left behind");
            }
        }
        if let Some(outcome) = m.outcome() {
            break outcome;
        }
    };
    execs.join();
    outcome
        .map_err(|why| anyhow::anyhow!("{why}"))
        .with_context(|| format!("agent {} under {}", cfg.agent_id, cfg.parent))
}

/// One turn's effects, as this agent carries them out: frames up into the write buffer, down to
/// the children's connections, commands to the executors, reconnecting to the leader.
struct Turn<'a> {
    cfg: &'a AgentConfig,
    secret: &'a [u8],
    rejoin_tx: &'a UnboundedSender<Reconnected>,
    children: &'a HashMap<u32, UnboundedSender<Vec<u8>>>,
    execs: &'a mut Executors,
    out: &'a mut Vec<u8>,
    /// The machine's clock (µs since the agent started) at this turn.
    now_us: u64,
    /// The parent connection failed a write: nothing more goes to it, or below through it.
    parent_gone: bool,
    close: bool,
    revive: bool,
}

impl<'a> Turn<'a> {
    fn new(
        cfg: &'a AgentConfig,
        secret: &'a [u8],
        rejoin_tx: &'a UnboundedSender<Reconnected>,
        children: &'a HashMap<u32, UnboundedSender<Vec<u8>>>,
        execs: &'a mut Executors,
        out: &'a mut Vec<u8>,
        now_us: u64,
    ) -> Self {
        Turn { cfg, secret, rejoin_tx, children, execs, out, now_us, parent_gone: false, close: false, revive: false }
    }
}

impl Carrier for Turn<'_> {
    fn up(&mut self, msg: Up) {
        if !self.parent_gone {
            frame::encode_into(wire::up::frame(msg), self.out);
        }
    }
    fn down(&mut self, child: u32, msg: Down) {
        if let Some(tx) = self.children.get(&child).filter(|_| !self.parent_gone) {
            let mut bytes = Vec::new();
            wire::down::frames(msg.agent, msg.msg, |body| frame::encode_into(body, &mut bytes));
            let _ = tx.send(bytes);
        }
    }
    fn exec(&mut self, command: Command) {
        let command = match command {
            // From the machine's clock to the executors' (the wall clock's µs).
            Command::Lease(until) => Command::Lease(htc_host::now_us() + until.saturating_sub(self.now_us)),
            c => c,
        };
        self.execs.send(command);
    }
    fn close_up(&mut self) {
        self.close |= !self.parent_gone;
    }
    // Even after a failed write (see the loop): a Rejoin dropped there is never asked again.
    fn rejoin(&mut self) {
        rejoin(self.cfg, self.secret, self.cfg.live.lease_us, self.rejoin_tx.clone());
    }
    fn revive(&mut self) {
        self.revive |= !self.parent_gone;
    }
    fn await_leader(&mut self) {
        let wait = self.cfg.await_leader.unwrap_or_default();
        await_leader(self.cfg, self.secret, wait, self.rejoin_tx.clone());
    }
}

/// A new connection to the leader, and where that leader listens.
type Reconnected = Result<(TcpStream, SocketAddr), String>;

/// Feeds what the parent says to the agent's loop; reading a frame is not cancel-safe, so it
/// lives in its own task rather than in select!. A frame that never goes down is dropped here.
fn read_frames(mut rd: tokio::net::tcp::OwnedReadHalf, gen: u32, tx: UnboundedSender<(u32, Result<Down, FrameError>)>) {
    tokio::spawn(async move {
        let mut buf = Vec::new();
        loop {
            let r = match read_frame(&mut rd, &mut buf).await.map(wire::down::down) {
                Ok(Some(down)) => Ok(down),
                Ok(None) => {
                    tracing::warn!("unexpected frame from above ignored");
                    continue;
                }
                Err(e) => Err(e),
            };
            let end = r.is_err();
            if tx.send((gen, r)).is_err() || end {
                break;
            }
        }
    });
}

/// Reconnects to the leader around a lost relay, retrying (the leader may not have noticed the
/// loss yet, and then still counts this agent as connected) until the lease is over; the
/// machine fences the agent then anyway.
fn rejoin(cfg: &AgentConfig, secret: &[u8], lease_us: u64, tx: UnboundedSender<Reconnected>) {
    let below: Vec<u32> = (0..cfg.tree.len()).filter(|&a| cfg.tree.next_hop(Some(cfg.agent_id), a).is_some()).collect();
    let (me, leader, secret) = (JoinAs::of(cfg), cfg.leader, secret.to_vec());
    tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + Duration::from_micros(lease_us);
        // The leader notices the relay's loss at about the same moment; until it has, it still
        // counts this agent as connected and refuses it.
        tokio::time::sleep(Duration::from_millis(50)).await;
        while tokio::time::Instant::now() < deadline {
            match tokio::time::timeout_at(deadline, join(&me, leader, &secret, Joining::Rejoin(below.clone()))).await {
                Ok(Ok((_, stream))) => {
                    let _ = tx.send(Ok((stream, leader)));
                    return;
                }
                Ok(Err(e)) => tracing::debug!(agent = me.agent, error = %format!("{e:#}"), "rejoin attempt failed"),
                Err(_) => break,
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tracing::warn!(agent = me.agent, "could not rejoin the leader within the lease");
    });
}

/// How long an agent given up keeps trying to come back: the leader may be hung for a while
/// (and the agent's tasks are stopped already, so waiting costs nothing but the node).
const REVIVE_FOR: Duration = Duration::from_secs(60);

/// A leader whose port refuses connections this long is gone (a stopped one still accepts).
const REFUSED_FOR: Duration = Duration::from_secs(2);

/// Comes back to the leader as a fresh member after being given up, retrying (until the leader
/// has seen the old connection close it refuses the id) for `REVIVE_FOR`, or until the leader's
/// port has refused connections for `REFUSED_FOR`: then the leader is gone, and waiting would
/// only leave the agent behind it.
fn revive_fresh(cfg: &AgentConfig, secret: &[u8], tx: UnboundedSender<Reconnected>) {
    let (me, leader, secret) = (JoinAs::of(cfg), cfg.leader, secret.to_vec());
    tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + REVIVE_FOR;
        let mut last = String::from("no attempt finished");
        let mut refused_since = None;
        while tokio::time::Instant::now() < deadline {
            match tokio::time::timeout_at(deadline, join(&me, leader, &secret, Joining::Fresh)).await {
                Ok(Ok((_, stream))) => {
                    let _ = tx.send(Ok((stream, leader)));
                    return;
                }
                Ok(Err(e)) => {
                    let refused = e.chain().any(|c| {
                        c.downcast_ref::<std::io::Error>()
                            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
                    });
                    let since = *refused_since.get_or_insert_with(tokio::time::Instant::now);
                    if !refused {
                        refused_since = None;
                    } else if since.elapsed() >= REFUSED_FOR {
                        let _ = tx.send(Err(format!("the leader is gone ({e:#})")));
                        return;
                    }
                    last = format!("{e:#}");
                }
                Err(_) => break,
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let _ = tx.send(Err(format!("for {} s; the last attempt: {last}", REVIVE_FOR.as_secs())));
    });
}

/// How often an agent whose leader is gone looks for the run's new one.
const LOOK_EVERY: Duration = Duration::from_millis(250);

/// The leader went with its job: waits up to `wait` for the run's new leader (a joined job that
/// took the run over publishes its address in the run directory) and comes to it with the tasks
/// it holds (`Hello.handover`).
fn await_leader(cfg: &AgentConfig, secret: &[u8], wait: Duration, tx: UnboundedSender<Reconnected>) {
    let (me, old, run, secret) = (JoinAs::of(cfg), cfg.leader, cfg.run.clone(), secret.to_vec());
    tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + wait;
        let mut last = String::from("no new leader published its address");
        while tokio::time::Instant::now() < deadline {
            match run.leader_at() {
                Ok(Some(at)) if at.addr != old => {
                    match tokio::time::timeout_at(deadline, join(&me, at.addr, &secret, Joining::Handover)).await {
                        Ok(Ok((_, stream))) => {
                            tracing::info!(agent = me.agent, leader = %at.addr, job = %at.job, "found the run's new leader");
                            let _ = tx.send(Ok((stream, at.addr)));
                            return;
                        }
                        Ok(Err(e)) => last = format!("{e:#}"),
                        Err(_) => break,
                    }
                }
                Ok(_) => {}
                Err(e) => last = format!("reading its address: {e}"),
            }
            tokio::time::sleep(LOOK_EVERY).await;
        }
        let _ = tx.send(Err(format!("none within {} s ({last})", wait.as_secs())));
    });
}

/// Which Hello.
enum Joining {
    First,
    /// Around a lost relay, with the agents below.
    Rejoin(Vec<u32>),
    /// After being given up, empty.
    Fresh,
    /// To the run's new leader after its old one went, with the tasks held.
    Handover,
}

/// Who says Hello.
#[derive(Clone)]
struct JoinAs {
    agent: u32,
    slots: usize,
    mem_mb: u64,
    gpus: u32,
}

impl JoinAs {
    fn of(cfg: &AgentConfig) -> JoinAs {
        JoinAs { agent: cfg.agent_id, slots: cfg.slots, mem_mb: cfg.mem_mb, gpus: cfg.gpus.len() as u32 }
    }
}

/// Connects to `to` (the parent, or the leader for a rejoin), proves membership of the job and
/// says Hello; returns the job id it welcomed us with and the connection.
async fn join(me: &JoinAs, to: SocketAddr, secret: &[u8], how: Joining) -> anyhow::Result<(String, TcpStream)> {
    let mut stream = match how {
        // The caller retries, and wants to see each refusal.
        Joining::Fresh => TcpStream::connect(to).await.with_context(|| format!("connecting to {to}"))?,
        _ => connect(to).await?,
    };
    frame::tune(&stream)?;
    auth::connect(&mut stream, secret).await.with_context(|| format!("authenticating with {to}"))?;
    // Under Slurm the node's name as Slurm knows it: what squeue shows, and what the leader
    // names when it gives the node back (`scontrol update … NodeList=`).
    let hostname = std::env::var("SLURMD_NODENAME").ok().filter(|n| !n.is_empty()).unwrap_or_else(htc_host::hostname);
    let hello = proto::Hello {
        agent_id: me.agent,
        cores: me.slots as u32,
        mem_mb: me.mem_mb,
        gpus: me.gpus,
        hostname: hostname.clone(),
        pid: std::process::id(),
        protocol: PROTOCOL_VERSION,
        rejoin: matches!(how, Joining::Rejoin(_)),
        fresh: matches!(how, Joining::Fresh),
        handover: matches!(how, Joining::Handover),
        below: match how {
            Joining::Rejoin(below) => below,
            _ => Vec::new(),
        },
    };
    frame::write_frame(&mut stream, Body::Hello(hello)).await?;
    let mut buf = Vec::new();
    let job_id = match tokio::time::timeout(Duration::from_secs(30), read_frame(&mut stream, &mut buf)).await {
        Err(_) => bail!("no answer from {} within 30 s", to),
        Ok(Ok(Body::Welcome(w))) => w.job_id,
        Ok(Ok(Body::Reject(r))) => bail!("refused by {}: {}", to, r.reason),
        Ok(Ok(_)) => bail!("unexpected first frame from {}", to),
        Ok(Err(e)) => bail!("{} closed the connection during the handshake: {e}", to),
    };
    tracing::info!(job = %job_id, agent = me.agent, slots = me.slots, %hostname, "joined");
    Ok((job_id, stream))
}

/// Events of spawner `i`; `None` once it stopped.
type Spawned = (usize, Option<Vec<ExecEvent>>);

/// Hands a spawner's events to the agent's loop, and says so when the spawner's thread ends
/// (the sink is dropped with it), however it ends.
struct Sink {
    i: usize,
    tx: UnboundedSender<Spawned>,
}

impl Sink {
    fn send(&self, batch: Vec<ExecEvent>) {
        let _ = self.tx.send((self.i, Some(batch)));
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        let _ = self.tx.send((self.i, None));
    }
}

/// The agent's executors: one simulated one, or `spawners` real ones splitting the slots and
/// CPUs, with `Spread` choosing which runs each task.
struct Executors {
    handles: Vec<Handle>,
    threads: Vec<Option<std::thread::JoinHandle<std::io::Result<()>>>>,
    spread: Spread,
    /// Told to finish or abort: from then on a spawner that stops is expected to.
    stopping: bool,
    /// Spawners told to reset that have not said so yet.
    resetting: usize,
    /// The clock `Spread` is told the time by.
    epoch: std::time::Instant,
    /// The agent's own hold (its parent silent), and whether the wide spawner was told to hold:
    /// also while the loops lent to it still run.
    held: bool,
    wide_held: bool,
    /// Told to finish while the wide spawner's gate was shut: it is told once the gate opens.
    finish_wide: bool,
    /// Narrow tasks that found every loop lent to the wide spawner, until one is back; and
    /// told to finish meanwhile, the loops are told once none waits.
    waiting: htc_core::slots::Queue,
    finish_loops: bool,
    /// What became of waiting tasks asked back or stopped, for the machine (`own_events`).
    own: Vec<ExecEvent>,
}

impl Executors {
    /// No spawner yet, tasks split as `spread` says.
    fn with(spread: Spread) -> Executors {
        Executors {
            handles: Vec::new(),
            threads: Vec::new(),
            spread,
            stopping: false,
            resetting: 0,
            epoch: std::time::Instant::now(),
            held: false,
            wide_held: false,
            finish_wide: false,
            waiting: Default::default(),
            finish_loops: false,
            own: Vec::new(),
        }
    }

    /// Events of tasks that waited here for a loop, not in any spawner: the agent's loop feeds
    /// them to the machine before it waits for anything else.
    fn own_events(&mut self) -> Option<Vec<ExecEvent>> {
        (!self.own.is_empty()).then(|| std::mem::take(&mut self.own))
    }

    /// Tasks to the spawners `Spread` picks; those with no loop free wait here.
    fn run(&mut self, tasks: Vec<TaskToRun>) {
        let (parts, wait) = self.spread.assign(tasks);
        // The wide spawner hears of its gate before of its tasks: it must not start one on CPUs
        // whose loops still run.
        self.gate();
        for (h, part) in self.handles.iter().zip(parts) {
            if !part.is_empty() {
                h.send(Command::Run(part));
            }
        }
        self.waiting.add(wait);
    }

    fn start(
        cfg: &AgentConfig,
        job_id: &str,
        memcg: Option<Arc<htc_exec::memcg::Root>>,
        events: UnboundedSender<Spawned>,
    ) -> anyhow::Result<Executors> {
        let sink = |i: usize| {
            let sink = Sink { i, tx: events.clone() };
            move |batch| sink.send(batch)
        };
        if cfg.exec != ExecKind::Real {
            let (h, t) = simexec::start(cfg.exec, cfg.slots, sink(0))?;
            let mut x = Executors::with(Spread::new(vec![cfg.slots]));
            x.handles.push(h);
            x.threads.push(Some(t));
            return Ok(x);
        }
        let k = match cfg.spawners {
            0 => cfg.slots,
            n => n,
        }
        .clamp(1, cfg.slots.max(1));
        let mut x = Executors::with(Spread::new(Vec::new()));
        // One pool for all the spawn loops: a task gets devices whichever loop runs it.
        let gpus = htc_exec::gpu::Pool::new(cfg.gpus.clone());
        // (spawner, its CPUs, its slots, its first slot): the loops, then beside them one for
        // tasks that need several of their CPUs, its slots numbered after theirs for its own
        // output files.
        let mut specs: Vec<(usize, Vec<usize>, usize, usize)> = (0..k)
            .map(|i| {
                let (first, n) = crate::slurm::node_share(cfg.slots, k, i);
                let cpus = if cfg.cpus.is_empty() { Vec::new() } else { cfg.cpus[first..first + n].to_vec() };
                (i, cpus, n, first)
            })
            .collect();
        let loops: Vec<usize> = specs.iter().map(|s| s.2).collect();
        let wide = cfg.spawners == 0 && k > 1;
        if wide {
            specs.push((k, cfg.cpus.clone(), k, k));
        }
        for (i, cpus, slots, first_slot) in specs {
            let ec = ExecConfig {
                cpus,
                slots,
                spawner: i,
                first_slot,
                results: Some(cfg.run.agent_out(cfg.agent_id).join(htc_exec::results::file_name(i))),
                gpus: gpus.clone(),
                memcg: memcg.clone(),
                ..exec_config(cfg, job_id)
            };
            let (h, t) = executor::start(ec, sink(i))?;
            x.handles.push(h);
            x.threads.push(Some(t));
        }
        x.spread = if wide { Spread::with_wide(k) } else { Spread::new(loops) };
        Ok(x)
    }

    /// After what changed the lent loops: the waiting tasks go to loops back from the wide
    /// spawner, which holds while lent loops still run tasks (or the agent holds), and finishes
    /// held back go once nothing stands in their way.
    fn regate(&mut self) {
        if self.spread.wide().is_none() {
            return;
        }
        if !self.waiting.is_empty() && !self.spread.lent_out() {
            let tasks: Vec<TaskToRun> = self.waiting.drain().collect();
            self.run(tasks);
        }
        self.gate();
        if self.finish_loops && self.waiting.is_empty() {
            self.finish_loops = false;
            let wide = self.spread.wide();
            for (i, h) in self.handles.iter().enumerate() {
                if Some(i) != wide {
                    h.send(Command::Finish);
                }
            }
        }
    }

    /// The wide spawner holds while the loops lent to it hold tasks, or the agent holds; told
    /// to finish meanwhile, it is told once they are empty.
    fn gate(&mut self) {
        let Some(w) = self.spread.wide() else { return };
        let open = self.spread.gate_open();
        let hold = self.held || !open;
        if hold != self.wide_held {
            self.wide_held = hold;
            self.handles[w].send(Command::Hold(hold));
        }
        if self.finish_wide && open {
            self.finish_wide = false;
            self.handles[w].send(Command::Finish);
        }
    }

    fn send(&mut self, c: Command) {
        match c {
            Command::Run(tasks) if self.handles.len() > 1 => self.run(tasks),
            Command::Run(tasks) => self.handles[0].send(Command::Run(tasks)),
            Command::Finish => {
                self.stopping = true;
                let wide = self.spread.wide();
                for (i, h) in self.handles.iter().enumerate() {
                    if Some(i) == wide && !self.spread.gate_open() {
                        self.finish_wide = true;
                    } else if Some(i) != wide && !self.waiting.is_empty() {
                        self.finish_loops = true;
                    } else {
                        h.send(Command::Finish);
                    }
                }
            }
            Command::Abort => {
                self.stopping = true;
                self.drop_waiting();
                self.handles.iter().for_each(|h| h.send(Command::Abort));
            }
            Command::Hold(held) => {
                self.held = held;
                let wide = self.spread.wide();
                for (i, h) in self.handles.iter().enumerate() {
                    if Some(i) != wide {
                        h.send(Command::Hold(held));
                    }
                }
                self.regate();
            }
            Command::Lease(until) => self.handles.iter().for_each(|h| h.send(Command::Lease(until))),
            // Each spawner stops those it has and ignores the others; so do the waiting here.
            Command::Stop(ids) => {
                self.waiting.preempt(&ids, htc_host::now_us(), &mut self.own);
                self.handles.iter().for_each(|h| h.send(Command::Stop(ids.clone())));
            }
            Command::Recall(ids) => {
                self.waiting.recall(&ids, &mut self.own);
                self.handles.iter().for_each(|h| h.send(Command::Recall(ids.clone())));
            }
            Command::Reset => {
                self.drop_waiting();
                self.resetting = self.handles.len();
                self.handles.iter().for_each(|h| h.send(Command::Reset));
            }
        }
    }

    /// The waiting tasks are dropped with everything else (an abort, a reset), and so are the
    /// finishes held back for them.
    fn drop_waiting(&mut self) {
        self.waiting.clear();
        self.finish_wide = false;
        self.finish_loops = false;
    }

    /// Spawner `i`'s thread ended. Unasked, that is a failure: the others are stopped too, and
    /// the reason is returned for the agent (the thread's own error, when it returned one).
    fn ended(&mut self, i: usize) -> Option<String> {
        if self.stopping {
            return None;
        }
        self.send(Command::Abort);
        // The thread dropped its sink on the way out: joining waits for its last instructions.
        let why = match self.threads.get_mut(i).and_then(Option::take).map(|t| t.join()) {
            Some(Ok(Err(e))) => format!("spawn loop {i} failed: {e}"),
            Some(Err(_)) => format!("spawn loop {i} panicked"),
            _ => format!("spawn loop {i} stopped unexpectedly"),
        };
        Some(why)
    }

    /// Spawner `i` reported these events. True when that completes a reset: every spawner
    /// stopped what it ran and dropped its queue.
    fn ran(&mut self, i: usize, batch: &[ExecEvent]) -> bool {
        if batch.iter().any(|e| matches!(e, ExecEvent::Reset)) {
            self.spread.emptied(i);
            self.resetting = self.resetting.saturating_sub(1);
            self.regate();
            return self.resetting == 0;
        }
        let ended = batch.iter().filter(|e| matches!(e, ExecEvent::Finished(_) | ExecEvent::Recalled { .. })).count();
        self.spread.finished(i, ended);
        if self.handles.len() > 1 {
            let now = self.epoch.elapsed().as_micros() as u64;
            for e in batch {
                match e {
                    ExecEvent::Started { id, .. } | ExecEvent::Recalled { id, .. } => {
                        self.spread.left_queue(i, *id, now)
                    }
                    // Its process ran, so it left the queue when it started: looking for it
                    // there again was a walk of the whole queue for every task.
                    ExecEvent::Finished(f) if f.ended.outcome.ran() => self.spread.moved(i, now),
                    ExecEvent::Finished(f) => self.spread.left_queue(i, f.id, now),
                    ExecEvent::Reset => {}
                }
                if Some(i) == self.spread.wide() {
                    match e {
                        ExecEvent::Finished(f) => self.spread.wide_ended(f.id),
                        ExecEvent::Recalled { id, .. } => self.spread.wide_ended(*id),
                        _ => {}
                    }
                }
            }
            self.regate();
        }
        false
    }

    /// A spawner's queue is its own: what waits behind its long tasks while another spawner
    /// idles goes back up, and the leader sends it again, to the idle one. On each tick (at
    /// least every `QUIET_EVERY`), not on each hand-off: it looks at every spawner, and a wait
    /// of `STUCK_AFTER_US` is seconds.
    fn unstick(&mut self) {
        if self.handles.len() > 1 {
            if let Some((j, ids)) = self.spread.stuck(self.epoch.elapsed().as_micros() as u64) {
                tracing::debug!(spawner = j, tasks = ids.len(), "tasks queued behind busy slots given back");
                self.handles[j].send(Command::Recall(ids));
            }
        }
    }

    fn join(self) {
        for (i, t) in self.threads.into_iter().enumerate() {
            let Some(t) = t else { continue };
            match t.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::error!(spawner = i, error = %e, "spawn loop failed"),
                Err(_) => tracing::error!(spawner = i, "spawn loop panicked"),
            }
        }
    }
}

fn exec_config(cfg: &AgentConfig, job_id: &str) -> ExecConfig {
    ExecConfig {
        job_id: job_id.to_string(),
        agent: cfg.agent_id,
        cpus: cfg.cpus.clone(),
        slots: cfg.slots,
        out_dir: match cfg.output {
            OutputMode::PerTask => cfg.run.out().join("tasks"),
            _ => cfg.run.agent_out(cfg.agent_id),
        },
        output: cfg.output,
        env: std::env::vars_os().collect(),
        kill_grace: cfg.kill_grace,
        spawner: 0,
        first_slot: 0,
        gpus: htc_exec::gpu::Pool::default(),
        memcg: None,
        linger: if cfg.keep_daemons { htc_exec::executor::LINGER } else { Duration::ZERO },
        results: Some(cfg.run.agent_out(cfg.agent_id).join(htc_exec::results::file_name(0))),
    }
}

/// The agent's memory cgroups for its slots, shared by its spawn loops, per `--mem-limit`.
fn memory_cgroups(cfg: &AgentConfig) -> anyhow::Result<Option<Arc<htc_exec::memcg::Root>>> {
    use htc_exec::memcg::{Enforce, Root};
    if cfg.mem_limit == Enforce::Watch {
        // The log says which way it enforces, chosen or not (docs/resources.md).
        tracing::info!(
            agent = cfg.agent_id,
            why = "--mem-limit watch",
            "tasks' mem= enforced by watching their resident memory"
        );
        return Ok(None);
    }
    match Root::create() {
        Ok(root) => {
            tracing::info!(agent = cfg.agent_id, dir = %root.dir().display(), version = ?root.version(), "tasks' mem= enforced by memory cgroups");
            Ok(Some(Arc::new(root)))
        }
        Err(why) if cfg.mem_limit == Enforce::Cgroup => anyhow::bail!("--mem-limit cgroup: {why}"),
        Err(why) => {
            tracing::info!(agent = cfg.agent_id, why, "tasks' mem= enforced by watching their resident memory");
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spawner_says_when_its_thread_ends_and_unasked_that_is_a_failure() {
        let (tx, mut rx) = unbounded_channel::<Spawned>();
        let sink = {
            let sink = Sink { i: 1, tx };
            move |batch| sink.send(batch)
        };
        sink(Vec::new());
        drop(sink); // as when the executor's thread ends, however it ends
        assert!(matches!(rx.try_recv(), Ok((1, Some(_)))));
        assert!(matches!(rx.try_recv(), Ok((1, None))));
        assert!(rx.try_recv().is_err(), "and then the channel is closed");

        let idle = || Executors::with(Spread::new(Vec::new()));
        let mut x = idle();
        assert_eq!(x.ended(1).as_deref(), Some("spawn loop 1 stopped unexpectedly"));
        assert!(x.ended(0).is_none(), "the others were told to stop");
        let mut x = idle();
        x.send(Command::Finish);
        assert!(x.ended(0).is_none(), "told to finish: the normal end");
    }
}
