//! One running agent: its machine and everything that feeds it or carries out what it answers.
//! A turn is: wait for the next input from any source (`next`), hand it to the machine, set the
//! timer to when the machine wants to wake (`pace`), carry out its effects and write what goes up
//! (`carry_out`), end what the tasks left behind (`sweep`).

use std::collections::HashMap;
use std::pin::Pin;
use std::time::Duration;

use anyhow::Context;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::time::{Instant, Sleep};

use super::clock::Clock;
use super::config::AgentConfig;
use super::connection::{join, read_frames, revive_fresh, JoinAs, Joining, Reconnected};
use super::relay::{self, Child};
use super::spawners::{memory_cgroups, Executors, Spawned};
use super::turn::Turn;
use crate::auth;
use crate::frame::FrameError;
use htc_engine::agent::machine::{Effect, Input, Wake};
use htc_engine::agent::Instance;
use htc_engine::msg::Down;
use htc_exec::leftovers::Sweeper;
use htc_exec::simexec::ExecKind;

/// The longest tick while nothing but heartbeats and the lease waits for time (`Wake::Quiet`):
/// an idle agent cost 11.3 ms of CPU a second ticking every 5 ms, 4.1 ms at this (bench/RESULTS.md §20).
const QUIET_EVERY: Duration = Duration::from_millis(50);

/// How often the agent looks for processes its tasks left behind (`leftovers`): what a task
/// leaves ends within about this long of the task.
const SWEEP_EVERY_US: u64 = 100_000;

/// A frame from above, with the generation of the connection it came on.
type FromParent = (u32, Result<Down, FrameError>);

/// The connection upward and what comes back on it.
struct Parent {
    wr: OwnedWriteHalf,
    /// Frames carry the generation of their connection: after a revival the old one may still
    /// deliver what it had read.
    gen: u32,
    open: bool,
    frames_tx: UnboundedSender<FromParent>,
    frames: UnboundedReceiver<FromParent>,
    rejoin_tx: UnboundedSender<Reconnected>,
    rejoined: UnboundedReceiver<Reconnected>,
}

impl Parent {
    /// Reads from a new connection; what the old one still delivers is of no account now.
    fn switch(&mut self, stream: tokio::net::TcpStream) {
        let (rd, wr) = stream.into_split();
        self.gen += 1;
        read_frames(rd, self.gen, self.frames_tx.clone());
        self.wr = wr;
        self.open = true;
    }
}

/// When the machine is next woken without an input.
struct Pacer {
    tick: Pin<Box<Sleep>>,
    last_tick: Instant,
    flush_every: Duration,
    /// Every `flush_every` while something waits for its time (a report held back, a stop under
    /// way, a relay's children); at the heartbeat's pace, at most `QUIET_EVERY`, while only
    /// heartbeats and the lease do: a node whose tasks run long then wakes 20 times a second,
    /// not 200.
    quiet_every: Duration,
}

impl Pacer {
    fn new(flush_every: Duration, heartbeat_us: u64) -> Pacer {
        let quiet_every = Duration::from_micros(heartbeat_us).min(QUIET_EVERY).max(flush_every);
        let tick = Box::pin(tokio::time::sleep(flush_every));
        Pacer { tick, last_tick: Instant::now(), flush_every, quiet_every }
    }

    fn set(&mut self, wake: Wake, clock: &Clock) {
        let (soon, quiet) = (self.last_tick + self.flush_every, self.last_tick + self.quiet_every);
        let due = match wake {
            Wake::Soon => soon,
            Wake::Quiet => quiet,
            // Never sooner than the ticks were: a time already past would spin the loop.
            Wake::At(us) => clock.instant(us).clamp(soon, quiet),
        };
        if self.tick.deadline() != due {
            self.tick.as_mut().reset(due);
        }
    }
}

pub(super) struct Driver {
    cfg: AgentConfig,
    secret: Vec<u8>,
    job_id: String,
    clock: Clock,
    machine: Instance,
    execs: Executors,
    exec_events: Option<UnboundedReceiver<Spawned>>,
    parent: Parent,
    children: HashMap<u32, UnboundedSender<Vec<u8>>>,
    child_events: Option<UnboundedReceiver<Child>>,
    signals: (Signal, Signal),
    pacer: Pacer,
    effects: Vec<Effect>,
    out: Vec<u8>,
    /// Real tasks only: simulated ones leave nothing behind. With when it last looked.
    leftovers: Option<(Sweeper, u64)>,
}

impl Driver {
    /// Joins the parent and starts the executors and, for an agent with children, the relay.
    pub(super) async fn start(mut cfg: AgentConfig) -> anyhow::Result<Driver> {
        let secret = cfg.run.read_secret().context("reading the job secret")?;
        // What keeps this agent from running tasks is found before it joins: one that cannot
        // start stops the run saying where and why (`srun_output`); one that joined and then
        // left would only be lost, and the run go on without its node.
        let memcg = if cfg.exec == ExecKind::Real { memory_cgroups(&cfg)? } else { None };
        let (job_id, stream) = join(&JoinAs::of(&cfg), cfg.parent, &secret, Joining::First).await?;

        let (child_tx, child_events) = unbounded_channel::<Child>();
        if let Some(listener) = cfg.relay.take() {
            let place = auth::RelayPlace { me: cfg.agent_id, tree: cfg.tree.clone() };
            relay::listen(listener, place, &job_id, secret.clone(), child_tx)?;
        }
        let (ev_tx, exec_events) = unbounded_channel::<Spawned>();
        let execs = Executors::start(&cfg, &job_id, memcg, ev_tx)?;

        let (rd, wr) = stream.into_split();
        let (frames_tx, frames) = unbounded_channel();
        read_frames(rd, 0, frames_tx.clone());
        let (rejoin_tx, rejoined) = unbounded_channel();
        let parent = Parent { wr, gen: 0, open: true, frames_tx, frames, rejoin_tx, rejoined };

        let clock = Clock::start();
        let machine = machine(&cfg, &job_id, clock.wall_at_start());
        let pacer = Pacer::new(cfg.flush_every, machine.heartbeat_us());
        let signals = (signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?);
        // The spawners stop starting tasks within the signal's delivery (`stopping`); the loop
        // hears of it later, through tokio.
        for sig in [libc::SIGTERM, libc::SIGINT] {
            // SAFETY: the action only stores to an atomic, which is async-signal-safe, and it
            // stays registered for the life of the process, as the static it touches does.
            unsafe { signal_hook_registry::register(sig, htc_exec::stopping::request) }?;
        }
        let leftovers = (cfg.exec == ExecKind::Real).then(|| (Sweeper::new(cfg.agent_id, cfg.keep_daemons), 0));
        Ok(Driver {
            cfg,
            secret,
            job_id,
            clock,
            machine,
            execs,
            exec_events: Some(exec_events),
            parent,
            children: HashMap::new(),
            child_events: Some(child_events),
            signals,
            pacer,
            effects: Vec::new(),
            out: Vec::new(),
            leftovers,
        })
    }

    /// Turns until the machine has an outcome, then waits for the executors.
    pub(super) async fn run(mut self) -> anyhow::Result<()> {
        let outcome = loop {
            if let Some(input) = self.next().await {
                let now = self.clock.now();
                self.machine.handle(now, input, &mut self.effects);
                self.pacer.set(self.machine.wake(), &self.clock);
                self.carry_out(now).await;
                self.sweep(now);
            }
            if let Some(outcome) = self.machine.outcome() {
                break outcome;
            }
        };
        self.execs.join();
        outcome
            .map_err(|why| anyhow::anyhow!("{why}"))
            .with_context(|| format!("agent {} under {}", self.cfg.agent_id, self.cfg.parent))
    }

    /// The next input from any source; `None` for what the machine need not hear (a frame of
    /// an old connection, a source that closed without news).
    async fn next(&mut self) -> Option<Input> {
        if let Some(batch) = self.execs.own_events() {
            return Some(Input::Exec(batch));
        }
        let parent_open = self.parent.open;
        tokio::select! {
            // Killed from outside (scancel, kill): stop the tasks, which live in their own
            // process groups, rather than leave them running without an agent.
            _ = self.signals.0.recv() => Some(Input::Signal("terminated by a signal")),
            _ = self.signals.1.recv() => Some(Input::Signal("interrupted")),
            f = self.parent.frames.recv(), if parent_open => self.heard_from_parent(f),
            c = recv(&mut self.child_events) => self.heard_from_child(c),
            e = recv(&mut self.exec_events) => self.heard_from_executors(e),
            r = self.parent.rejoined.recv() => self.reconnected(r?),
            _ = &mut self.pacer.tick => {
                self.pacer.last_tick = Instant::now();
                self.execs.tick();
                Some(Input::Tick)
            }
        }
    }

    fn heard_from_parent(&mut self, f: Option<FromParent>) -> Option<Input> {
        let ended = |parent: &mut Parent, why: String| {
            parent.open = false;
            Some(Input::ParentEnded(why))
        };
        match f {
            Some((g, _)) if g != self.parent.gen => None,
            Some((_, Ok(down))) => Some(Input::Parent(down)),
            Some((_, Err(e))) => ended(&mut self.parent, e.to_string()),
            None => ended(&mut self.parent, "connection closed".into()),
        }
    }

    fn heard_from_child(&mut self, c: Option<Child>) -> Option<Input> {
        match c {
            Some(Child::Open { child, tx }) => {
                self.children.insert(child, tx);
                Some(Input::ChildOpened(child))
            }
            Some(Child::Up(up)) => Some(Input::ChildFrame(up)),
            Some(Child::Closed { child, agents, why }) => {
                self.children.remove(&child);
                Some(Input::ChildClosed { child, agents, why })
            }
            None => {
                self.child_events = None;
                None
            }
        }
    }

    fn heard_from_executors(&mut self, e: Option<Spawned>) -> Option<Input> {
        match e {
            Some((i, Some(batch))) => {
                Some(if self.execs.ran(i, &batch) { Input::ExecReset } else { Input::Exec(batch) })
            }
            Some((i, None)) => self.execs.ended(i).map(Input::ExecFailed),
            None => {
                self.exec_events = None;
                Some(Input::ExecEnded)
            }
        }
    }

    fn reconnected(&mut self, r: Reconnected) -> Option<Input> {
        match r {
            Ok((stream, leader)) => {
                // After a hand-over the run's leader listens elsewhere.
                self.cfg.leader = leader;
                self.parent.switch(stream);
                Some(Input::Rejoined)
            }
            Err(why) => Some(Input::ReviveFailed(why)),
        }
    }

    /// Carries out the machine's effects, writes what goes up, and closes or revives the
    /// connection when the machine said so.
    async fn carry_out(&mut self, now: u64) {
        let (close, revive) = self.turn(false);
        if !self.out.is_empty() {
            let written = self.parent.wr.write_all(&self.out).await;
            self.out.clear();
            if written.is_err() {
                self.machine.handle(now, Input::ParentEnded("write failed".into()), &mut self.effects);
                // Nothing more goes up this connection, but an agent below a lost relay must
                // still go around it: the machine hears of the end once, here, and ignores the
                // reader's word of it after (a Rejoin dropped here was never asked again).
                self.turn(true);
            }
        }
        if close || revive {
            let _ = self.parent.wr.shutdown().await;
        }
        if revive {
            // What the old connection still delivers is of no account now.
            self.parent.gen += 1;
            self.parent.open = true;
            revive_fresh(&self.cfg, &self.secret, self.parent.rejoin_tx.clone());
        }
    }

    /// The effects waiting, carried out; whether the connection up is to close, to revive.
    fn turn(&mut self, parent_gone: bool) -> (bool, bool) {
        let mut turn = Turn {
            cfg: &self.cfg,
            secret: &self.secret,
            clock: &self.clock,
            rejoin_tx: &self.parent.rejoin_tx,
            children: &self.children,
            execs: &mut self.execs,
            out: &mut self.out,
            parent_gone,
            close: false,
            revive: false,
        };
        self.effects.drain(..).for_each(|e| e.carry_out(&mut turn));
        (turn.close, turn.revive)
    }

    fn sweep(&mut self, now: u64) {
        let Some((sweeper, swept)) = self.leftovers.as_mut().filter(|(_, at)| now >= at + SWEEP_EVERY_US) else {
            return;
        };
        *swept = now;
        for (pid, task) in sweeper.sweep(|id| self.machine.holds(id)) {
            tracing::info!(job = %self.job_id, agent = self.cfg.agent_id, task, pid, "killed a process the task left behind");
        }
    }
}

/// The next from a source that may have closed; a closed one is never ready again.
async fn recv<T>(rx: &mut Option<UnboundedReceiver<T>>) -> Option<T> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// The agent's machine as its configuration and the wall clock at its start set it up.
fn machine(cfg: &AgentConfig, job_id: &str, wall_at_start: u64) -> Instance {
    // A head below a relay can go around the relay's loss: the leader is still there.
    let can_rejoin = cfg.tree.parent(cfg.agent_id).is_some() && cfg.tree.head(cfg.agent_id) == cfg.agent_id;
    let m = Instance::new(cfg.agent_id, cfg.slots, cfg.tree.clone(), job_id)
        .with_resources(cfg.mem_mb, cfg.gpus.len() as u32)
        .with_liveness(cfg.live)
        .with_clock(wall_at_start)
        .with_rejoin(can_rejoin)
        .with_revive(true)
        .with_await_leader(cfg.await_leader.is_some())
        .with_give_back(cfg.give_back.as_micros() as u64);
    match cfg.report_gap {
        Some(gap) => m.with_report_gap(gap.as_micros() as u64),
        None => m,
    }
}
