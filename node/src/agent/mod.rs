//! A node agent (`htc-agent work`): connects to its parent (the leader, or a relay agent above it
//! in the tree), proves it belongs to the job, asks for tasks, runs them through the executor and
//! reports starts and results in batches. An agent with children also relays: frames from below
//! go up unchanged, frames from above addressed to another agent go down the right branch.
//!
//! The decisions are `machine`'s; this driver moves frames, executor events, signals and timer
//! ticks into it and carries out what it answers. `relay` serves the children.

pub use config::AgentConfig;
pub use htc_engine::agent::{instance, machine, Instance};
pub use htc_engine::pace;
mod config;
mod connection;
mod relay;
mod spawners;

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

use crate::auth;
use crate::frame::{self, FrameError};
use htc_engine::msg::{Down, Up};
use htc_engine::wire;
use htc_exec::executor::Command;
use htc_exec::leftovers::Sweeper;
use htc_exec::simexec::ExecKind;

use connection::{await_leader, join, read_frames, rejoin, revive_fresh, JoinAs, Joining, Reconnected};
use machine::{Carrier, Input, Wake};
use relay::Child;
use spawners::{memory_cgroups, Executors, Spawned};

/// The default `spawners`: a spawn loop per slot, whatever the tasks' widths; a task needing
/// several cores runs in the wide spawner beside them (`Spread`). `--spawners N` asks for N loops.
pub const LOOP_PER_SLOT: usize = 0;

/// The agents' report timer: short enough that a slot waits little for work, long enough that a
/// busy agent's results travel in batches. `htc simulate` uses it too.
pub const FLUSH_EVERY: Duration = Duration::from_millis(5);
/// The longest tick while nothing but heartbeats and the lease waits for time (`Wake::Quiet`):
/// an idle agent cost 11.3 ms of CPU a second ticking every 5 ms, 4.1 ms at this (bench/RESULTS.md §20).
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
                _ = &mut tick => { last_tick = tokio::time::Instant::now(); execs.tick(); Input::Tick }
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
