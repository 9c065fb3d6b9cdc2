//! An agent's decisions without I/O: how much work to ask its parent for, when to report, what to
//! tell the executor, which branch a frame from above goes down, what to say when a child is lost,
//! and when the agent is done. The driver (`mod.rs`) feeds it `(now, input)` and carries out the
//! effects it returns; the tests below drive it with scripted inputs.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use htc_core::idmap::IdSet;
use htc_core::tree::Tree;

use crate::liveness::Liveness;
use crate::msg::{Came, Down, Hello, Report, Started, Stop, TaskResult, ToAgent, Up};
use htc_core::work::{Command, ExecEvent};

pub use crate::pace::REPORT_BATCH;
use crate::pace::{self, Pace};

use super::stall::{Probe, Stall, PROBE_HOLDS};
/// How long a finished relay waits for its children to close before it exits anyway.
pub const CHILDREN_GRACE_US: u64 = 30_000_000;

/// What happened, as the machine sees it.
#[derive(Debug)]
pub enum Input {
    /// A message from the parent (for this agent, or for one below it).
    Parent(Down),
    /// The connection to the parent ended (closed, broken, or a write failed).
    ParentEnded(String),
    /// SIGTERM or SIGINT from outside (scancel, kill, Ctrl-C).
    Signal(&'static str),
    /// An executor stopped without being told to: the agent cannot run what it is sent.
    ExecFailed(String),
    /// A direct child (this agent id) connected and was admitted.
    ChildOpened(u32),
    /// A message from below (a child's, or one it relays).
    ChildFrame(Up),
    /// A direct child's connection ended: these agents (it and those it relayed for) are gone.
    ChildClosed { child: u32, agents: Vec<u32>, why: String },
    /// Task starts and ends from the executor.
    Exec(Vec<ExecEvent>),
    /// The executor stopped: everything it was given has ended.
    ExecEnded,
    /// The report timer fired.
    Tick,
    /// After `Effect::Rejoin` or `Effect::Revive`: the leader welcomed this agent on a new
    /// connection.
    Rejoined,
    /// After `Command::Reset`: every spawner stopped what it ran and dropped what it held.
    ExecReset,
    /// After `Effect::Revive`: the leader could not be reached again in time.
    ReviveFailed(String),
}

/// When the driver must next tick the machine (`Machine::wake`), whatever else comes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// Every `FLUSH_EVERY`: something waits whose time this machine does not know ahead (a
    /// stop under way, a relay's children, a parent in doubt).
    Soon,
    /// At this time of the machine's clock: news held back for the report gap, and nothing else.
    At(u64),
    /// Only heartbeats and the lease wait: at the heartbeat's pace.
    Quiet,
}

/// What the driver must do.
#[derive(Debug)]
pub enum Effect {
    /// This agent's own message to the parent.
    Up(Up),
    /// A child's message passed up unchanged.
    Relay(Up),
    /// A message down to this direct child (for it, or for one below it).
    Down {
        child: u32,
        msg: Down,
    },
    Exec(Command),
    /// The last frame is out: close the sending side of the parent connection.
    CloseUp,
    /// The relay above is gone: connect to the leader and say Hello with `rejoin`; then
    /// `Input::Rejoined`.
    Rejoin,
    /// Given up and emptied: drop the parent connection, connect to the leader and say Hello
    /// with `fresh`; then `Input::Rejoined`, or `Input::ReviveFailed`.
    Revive,
    /// The leader is gone and the run may be taken over: wait for a new leader in the run
    /// directory and say Hello to it with `handover`; then `Input::Rejoined`, or
    /// `Input::ReviveFailed` when none came.
    AwaitLeader,
}

/// Where an agent's effects are carried out: the node's agent driver (sockets, processes) or
/// `htc simulate` (a virtual world). `Effect::carry_out` is the one reading of the machine's
/// effects, so every driver means the same by each, and a new effect is a compile error in
/// every driver rather than a silent drop in one.
pub trait Carrier {
    /// A message to the parent: the agent's own, or a child's passed up unchanged.
    fn up(&mut self, msg: Up);
    /// A message down to this direct child.
    fn down(&mut self, child: u32, msg: Down);
    fn exec(&mut self, command: Command);
    /// The last frame is out: close the sending side of the parent connection.
    fn close_up(&mut self);
    /// Connect to the leader around the lost relay, keeping the tasks; then `Input::Rejoined`.
    fn rejoin(&mut self);
    /// Given up and emptied: connect to the leader as a fresh member; then `Input::Rejoined`,
    /// or `Input::ReviveFailed`.
    fn revive(&mut self);
    /// The leader is gone: wait for the run's new one and come to it with the tasks; then
    /// `Input::Rejoined`, or `Input::ReviveFailed`.
    fn await_leader(&mut self);
}

impl Effect {
    pub fn carry_out(self, to: &mut impl Carrier) {
        match self {
            Effect::Up(msg) | Effect::Relay(msg) => to.up(msg),
            Effect::Down { child, msg } => to.down(child, msg),
            Effect::Exec(c) => to.exec(c),
            Effect::CloseUp => to.close_up(),
            Effect::Rejoin => to.rejoin(),
            Effect::Revive => to.revive(),
            Effect::AwaitLeader => to.await_leader(),
        }
    }
}

/// The parent connection as the machine knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Parent {
    Open,
    /// Closed after it said Shutdown: the normal end.
    Closed,
    /// The relay above was lost; the agent reconnects to the leader, keeping its tasks, until
    /// its lease runs out.
    Rejoining,
    /// Given up by the leader (or fenced by its lease): stopping every task, then reconnecting
    /// to the leader as a fresh member (`reconnecting`).
    Reviving {
        reconnecting: bool,
    },
    /// The leader is gone with its job: what runs runs on, nothing new starts, and the agent
    /// waits for the run's new leader (a joined job that takes it over) to come to with it.
    Awaiting,
    /// Lost, or the agent stopped itself (a signal, a failed executor); the tasks were stopped.
    Cut {
        why: String,
        own: bool,
    },
}

/// How long an agent stopped by a signal waits before it stops what runs: its spawners give
/// back what they have not started at once, and the leader, signalled with it under Slurm, may
/// say within this time that the job has a grace (a preemption's `GraceTime`: `Stop::Hold`, so
/// what runs is finished) or that it ends now (`Stop::Abort`). An ask to the controller: a
/// second or two on one busy with the preemption (2 s were too few on the test cluster), and a
/// second look when the first came before the preemption. Well within Slurm's `KillWait`
/// (30 s by default) when no word comes.
pub const GIVE_BACK_US: u64 = 5_000_000;

/// The give-back time of an agent whose leader has no Slurm job to ask about a grace: what has
/// not started comes back from the spawners within milliseconds, and no word is to come.
pub const GIVE_BACK_UNASKED_US: u64 = 500_000;

pub struct Machine {
    id: u32,
    tree: Arc<Tree>,
    slots: usize,
    /// When to report, and how much queued work keeps every slot busy across a report's round
    /// trip.
    pace: Pace,
    /// The gap between reports, when not the layout's (`pace::gap_for`).
    report_gap: Option<u64>,
    /// Received and not yet finished.
    outstanding: u64,
    /// Requested and not yet received.
    asked: u64,
    /// Idle slots as the last report said: the parent remembers them, so saying it again is
    /// no news (an idle agent at the tail answered every ack with a report: a ping-pong).
    told_idle: u32,
    seq: u64,
    /// Reports with results the parent has not acknowledged yet: (seq, results, when sent).
    unacked: VecDeque<(u64, usize, u64)>,
    started: Vec<Started>,
    results: Vec<TaskResult>,
    /// Taken out of the queue unstarted on a Recall, for the next report.
    recalled: Vec<u64>,
    /// Stopped by a signal while holding tasks: what has not started is given back first,
    /// until this time (µs), then the agent stops as the signal said.
    giving_back: Option<(&'static str, u64)>,
    /// How long `giving_back` lasts: `GIVE_BACK_US`, or `GIVE_BACK_UNASKED_US` (`with_give_back`).
    give_back_us: u64,
    children: HashSet<u32>,
    parent: Parent,
    shutting_down: bool,
    /// When the executor stopped.
    exec_ended_at: Option<u64>,
    finished: bool,
    live: Liveness,
    /// When the parent was last heard from (the first input, before anything was).
    last_heard_us: Option<u64>,
    /// The executor was told to start nothing more (the parent fell silent).
    held: bool,
    /// This agent's own standing still, and its probe of the parent after it.
    stall: Stall,
    /// SIGTERM or SIGINT came (`Input::Signal`): every report says so, for the leader to ask
    /// Slurm whether the job has a grace.
    signalled: bool,
    /// The signal is news for the next report.
    signal_untold: bool,
    /// The parent said to start nothing more (Shutdown with `hold`): for good.
    told_to_hold: bool,
    /// The end of the last lease given the executor (`Command::Lease`), 0 before the first.
    lease_sent_us: u64,
    /// Tasks received and not finished (queued or running), for a resync.
    /// Hashed by one multiply (`IdSet`): an insert and a remove per task.
    holding: IdSet<u64>,
    /// The leader asked for a resync: the next report lists `holding`.
    resync: bool,
    /// Whether a lost parent is worth reconnecting around (a relay: the leader is still there).
    can_rejoin: bool,
    /// Rejoined and not resynced yet: requests for work may have died with the relay.
    rejoined: bool,
    /// Whether this agent, given up, may come back as a fresh member (it knows the leader and
    /// nothing depends on it: no agents below it).
    can_revive: bool,
    /// Whether this agent, its leader gone, waits for a new one (`Parent::Awaiting`): one of a
    /// joined allocation, directly below the leader.
    can_await: bool,
    /// The Hellos of the agents below, as relayed: said again to a new leader.
    hellos_below: std::collections::BTreeMap<u32, Hello>,
    /// Messages from below while the leader is awaited, for the new one.
    held_up: Vec<Up>,
    /// When the agents below were last told that this relay is still here, while awaiting.
    kept_alive_us: u64,
    /// With `can_await`: the results of reports not acknowledged yet, by report, to bring to a
    /// new leader (the old one may have died before it recorded them).
    unacked_results: VecDeque<(u64, Vec<TaskResult>)>,
}

impl Machine {
    pub fn new(id: u32, slots: usize, tree: Arc<Tree>) -> Machine {
        let gap = pace::gap_for(pace::reporters(&tree, id), Liveness::default().heartbeat_us);
        Machine {
            id,
            tree,
            slots,
            pace: Pace::new(queue_target(slots), gap),
            report_gap: None,
            outstanding: 0,
            asked: 0,
            told_idle: 0,
            seq: 0,
            unacked: VecDeque::new(),
            started: Vec::new(),
            results: Vec::new(),
            recalled: Vec::new(),
            giving_back: None,
            give_back_us: GIVE_BACK_US,
            children: HashSet::new(),
            parent: Parent::Open,
            shutting_down: false,
            exec_ended_at: None,
            finished: false,
            live: Liveness::default(),
            last_heard_us: None,
            held: false,
            stall: Stall::default(),
            signalled: false,
            signal_untold: false,
            told_to_hold: false,
            lease_sent_us: 0,
            holding: IdSet::default(),
            resync: false,
            can_rejoin: false,
            rejoined: false,
            can_revive: false,
            can_await: false,
            hellos_below: Default::default(),
            held_up: Vec::new(),
            kept_alive_us: 0,
            unacked_results: VecDeque::new(),
        }
    }

    /// An agent below a relay: when the relay is lost it reconnects to the leader (`Rejoin`).
    pub fn with_rejoin(mut self, can: bool) -> Self {
        self.can_rejoin = can;
        self
    }

    /// An agent that, given up, stops its tasks and comes back empty instead of leaving.
    pub fn with_revive(mut self, can: bool) -> Self {
        self.can_revive = can;
        self
    }

    /// How long a signalled agent gives back what has not started before it stops what runs:
    /// under Slurm, time for the leader's word on a grace (`GIVE_BACK_US`); without a job to
    /// ask, only for the spawners' answer (`GIVE_BACK_UNASKED_US`).
    pub fn with_give_back(mut self, us: u64) -> Self {
        self.give_back_us = us;
        self
    }

    /// An agent of a joined allocation: should the leader go, it waits for the run's new one
    /// with what it holds (`Parent::Awaiting`) rather than stop.
    pub fn with_await_leader(mut self, can: bool) -> Self {
        self.can_await = can && self.tree.parent(self.id).is_none();
        self
    }

    /// Heartbeats and the lease on the parent (`liveness`).
    pub fn with_liveness(mut self, live: Liveness) -> Self {
        self.live = live;
        self.pace.set_gap(self.gap());
        self
    }

    /// The shared clock is `now_us + phase_us` (wall-clock µs): an agent that reports to the
    /// leader keeps to its windows, as the other heads do (`Pace::align`).
    pub fn with_clock(mut self, phase_us: u64) -> Self {
        if self.tree.head(self.id) == self.id {
            self.pace.align(phase_us);
        }
        self
    }

    /// The least time between reports under load, instead of the layout's (`pace::gap_for`).
    pub fn with_report_gap(mut self, gap_us: u64) -> Self {
        self.report_gap = Some(gap_us);
        self.pace.set_gap(gap_us);
        self
    }

    fn gap(&self) -> u64 {
        self.report_gap.unwrap_or_else(|| pace::gap_for(pace::reporters(&self.tree, self.id), self.live.heartbeat_us))
    }

    /// `None` while running; then `Ok` for a normal end, or why the agent stopped early.
    pub fn outcome(&self) -> Option<Result<(), String>> {
        if !self.finished {
            return None;
        }
        Some(match &self.parent {
            Parent::Cut { why, own } => {
                let lost = self.unacked_results();
                let unrecorded = if lost > 0 {
                    format!("; {lost} results the leader had not acknowledged run again when the job resumes")
                } else {
                    String::new()
                };
                Err(if *own {
                    format!("{why}; running tasks were stopped{unrecorded}")
                } else {
                    format!("lost the connection to the parent ({why}); running tasks were stopped{unrecorded}")
                })
            }
            _ => Ok(()),
        })
    }

    /// Whether task `id` was received and has not ended here (queued or running).
    pub fn holds(&self, id: u64) -> bool {
        self.holding.contains(&id)
    }

    /// Results reported but not yet acknowledged as recorded.
    pub fn unacked_results(&self) -> usize {
        self.unacked.iter().map(|(_, n, _)| n).sum()
    }

    /// Whether what starts now might run again elsewhere: the parent has been silent for the
    /// hold, or has not acknowledged results for a heartbeat (acks follow each commit within
    /// milliseconds; a cut link stops them at once, while heartbeats take a while to be missed).
    fn unsure(&self, now_us: u64, heard: u64) -> bool {
        now_us.saturating_sub(heard) >= self.live.hold_us
            || self.unacked.front().is_some_and(|&(_, _, at)| now_us.saturating_sub(at) >= self.live.heartbeat_us)
    }

    pub fn handle(&mut self, now_us: u64, input: Input, out: &mut Vec<Effect>) {
        if self.finished {
            return;
        }
        let heard = *self.last_heard_us.get_or_insert(now_us);
        let probing = match self.stall.stood_still(now_us, self.live.hold_us) {
            Some(stood_us) => self.stood_still(now_us, heard, stood_us, out),
            None => false,
        };
        // A frame read after the lease ran out may be stale: it waited in the socket while this
        // agent was stopped (SIGSTOP), and the leader may have given the agent up since. The
        // lease is judged first, as a tick would, and such a frame renews nothing.
        if matches!(input, Input::Parent(_)) && self.lease_ran_out(now_us, heard) {
            self.fence(now_us, heard, out);
            return;
        }
        // Whether a report must go now, whatever its age (`pace`).
        let urgent = self.on_input(now_us, heard, input, out) || probing;
        if let Some((what, until)) = self.giving_back {
            if now_us >= until {
                self.stop_on_signal(now_us, what, out);
            }
        }
        self.after(now_us, urgent, out);
    }

    /// One input handled; says whether a report must go at once.
    fn on_input(&mut self, now_us: u64, heard: u64, input: Input, out: &mut Vec<Effect>) -> bool {
        match input {
            Input::Parent(down) => self.heard_from_parent(now_us, down, out),
            Input::ParentEnded(why) => {
                self.parent_ended(why, out);
                false
            }
            Input::Rejoined => self.reconnected(now_us, out),
            Input::ExecReset => {
                if self.parent == (Parent::Reviving { reconnecting: false }) {
                    self.emptied();
                    self.parent = Parent::Reviving { reconnecting: true };
                    out.push(Effect::Revive);
                }
                false
            }
            Input::ReviveFailed(why) => {
                self.revive_failed(why, out);
                false
            }
            // While reviving, what the spawners report is the end of what they were told to stop.
            Input::Exec(_) if matches!(self.parent, Parent::Reviving { .. }) => false,
            Input::Signal(what) => self.on_signal(now_us, what, out),
            // The agent goes away as a whole: its connection closes, and the leader gives its
            // tasks to others (those that had started count as lost), as for a lost agent.
            Input::ExecFailed(why) => {
                // Said before the connection closes, so the leader can tell the user why.
                if self.parent == Parent::Open {
                    out.push(Effect::Up(Up::Lost { agent: self.id, why: why.clone() }));
                }
                self.stop(why, out);
                false
            }
            Input::ChildOpened(child) => {
                self.children.insert(child);
                false
            }
            Input::ChildFrame(up) => {
                self.child_frame(up, out);
                false
            }
            Input::ChildClosed { child, agents, why } => self.child_closed(child, agents, why, out),
            Input::Exec(batch) => self.on_exec(now_us, batch),
            Input::ExecEnded => {
                self.exec_ended_at = Some(now_us);
                false
            }
            Input::Tick if self.parent == Parent::Awaiting => {
                self.keep_below_alive(now_us, out);
                false
            }
            Input::Tick => {
                self.tick(now_us, heard, out);
                false
            }
        }
    }

    /// Reconnecting failed: after a hand-over no new leader took the run, or a revival found
    /// the leader gone. Either way the agent stops.
    fn revive_failed(&mut self, why: String, out: &mut Vec<Effect>) {
        if self.parent == Parent::Awaiting {
            self.parent = Parent::Open;
            self.stop(format!("its leader is gone, and no new one took the run: {why}"), out);
        } else if matches!(self.parent, Parent::Reviving { .. }) {
            self.parent = Parent::Open;
            self.stop(format!("given up, and could not rejoin the leader: {why}"), out);
        }
    }

    /// SIGTERM or SIGINT from outside; says whether the leader must hear of it at once.
    fn on_signal(&mut self, now_us: u64, what: &'static str, out: &mut Vec<Effect>) -> bool {
        if self.told_to_hold && self.parent == Parent::Open {
            // The leader said to finish what runs (a grace, or --max-fails): that stands; the
            // leader ends the grace, or this agent stops should the leader go.
            tracing::info!(agent = self.id, what, "signalled while finishing what runs, as the leader said: going on");
            return false;
        }
        if self.giving_back.is_none() && self.parent == Parent::Open && !self.holding.is_empty() {
            // What has not started goes back to the leader first (a joined job's scancel): it
            // counts no attempt for a task that never ran here. The spawners start nothing more
            // and give back their queues; what runs is stopped after.
            out.push(Effect::Exec(Command::Hold(true)));
            out.push(Effect::Exec(Command::Recall(self.holding.iter().copied().collect())));
            self.giving_back = Some((what, now_us + self.give_back_us));
            // The leader hears of it at once: it may know of a grace.
            self.signal_untold = !std::mem::replace(&mut self.signalled, true);
            return self.signal_untold;
        }
        self.stop_on_signal(now_us, what, out);
        false
    }

    /// A frame from a child goes up, or waits while a new leader is awaited.
    fn child_frame(&mut self, up: Up, out: &mut Vec<Effect>) {
        if let Up::Hello(h) = &up {
            self.hellos_below.insert(h.agent, h.clone());
        }
        match self.parent {
            Parent::Open => out.push(Effect::Relay(up)),
            Parent::Awaiting => self.held_up.push(up),
            _ => {}
        }
    }

    /// A message from the parent; says whether a report must go at once.
    fn heard_from_parent(&mut self, now_us: u64, down: Down, out: &mut Vec<Effect>) -> bool {
        if self.stall.probe().is_some() && !self.answers_probe(&down) {
            // Perhaps read from before a give-up: it renews nothing, and what it brings waits
            // behind the hold.
            return self.on_parent(down, out);
        }
        self.last_heard_us = Some(now_us);
        self.renew_lease(now_us, out);
        let urgent = self.on_parent(down, out);
        // A Shutdown that said to start nothing more is never undone by an ack.
        if self.held && !self.told_to_hold && !self.unsure(now_us, now_us) {
            self.held = false;
            out.push(Effect::Exec(Command::Hold(false)));
        }
        urgent
    }

    /// A new connection to the leader is up, after `Effect::Rejoin` (tasks kept) or
    /// `Effect::Revive` (emptied); says whether a report must go at once.
    fn reconnected(&mut self, now_us: u64, out: &mut Vec<Effect>) -> bool {
        match self.parent {
            Parent::Rejoining => {
                tracing::info!(agent = self.id, "rejoined the leader; tasks kept");
                self.reopened_with_tasks(now_us, out);
                false
            }
            Parent::Awaiting => {
                tracing::info!(agent = self.id, "with the run's new leader; tasks kept");
                self.reopened_with_tasks(now_us, out);
                // What the old leader did not acknowledge goes to the new one (which ignores what
                // its ledger has recorded already).
                self.unacked.clear();
                let again: Vec<TaskResult> = self.unacked_results.drain(..).flat_map(|(_, r)| r).collect();
                self.results.splice(0..0, again);
                // The agents below join the new leader through this one, as they did the old.
                for h in self.hellos_below.values() {
                    out.push(Effect::Relay(Up::Hello(Hello { came: Came::Handover, ..h.clone() })));
                }
                out.extend(self.held_up.drain(..).map(Effect::Relay));
                true
            }
            Parent::Reviving { reconnecting: true } => {
                tracing::info!(agent = self.id, "back with the leader as a fresh member");
                self.parent = Parent::Open;
                self.last_heard_us = Some(now_us);
                self.renew_lease(now_us, out);
                if std::mem::take(&mut self.held) {
                    out.push(Effect::Exec(Command::Hold(false)));
                }
                true
            }
            _ => false,
        }
    }

    /// Open again, with the tasks kept: the lease renewed, a resync to come (what was asked for
    /// may have died on the way), and the leader's view of this agent's idle slots reset.
    fn reopened_with_tasks(&mut self, now_us: u64, out: &mut Vec<Effect>) {
        self.parent = Parent::Open;
        self.last_heard_us = Some(now_us);
        self.renew_lease(now_us, out);
        self.rejoined = true;
        self.told_idle = 0;
    }

    /// Fencing: a parent silent past the lease may have given this agent up and sent its tasks
    /// elsewhere; stopping them first keeps any task from running twice. After this agent stood
    /// still, the probe's end stands for the lease.
    fn lease_ran_out(&self, now_us: u64, heard: u64) -> bool {
        let out = match self.stall.probe() {
            Some(p) => now_us >= p.until_us,
            None => now_us.saturating_sub(heard) >= self.live.lease_us,
        };
        out && matches!(self.parent, Parent::Open | Parent::Rejoining) && !self.shutting_down
    }

    fn fence(&mut self, now_us: u64, heard: u64, out: &mut Vec<Effect>) {
        let secs = |us: u64| us as f64 / 1e6;
        let why = match self.stall.probe() {
            Some(p) => format!(
                "stood still for {:.1} s, and its parent did not answer within {:.1} s after (lease expired)",
                secs(p.stood_us),
                secs(PROBE_HOLDS * self.live.hold_us)
            ),
            None => format!("no word from its parent for {:.1} s (lease expired)", secs(now_us.saturating_sub(heard))),
        };
        self.given_up(why, out);
    }

    /// This agent's own loop stood still for `stood_us` (see `stall`). Past the lease its parent
    /// may have given it up meanwhile, or stood still with it: the queue holds and a probe goes
    /// up (a report with a sequence number of its own, at once: says so). Within the lease no
    /// parent can have given it up yet (`lost_after` is twice the lease), and nothing changes.
    fn stood_still(&mut self, now_us: u64, heard: u64, stood_us: u64, out: &mut Vec<Effect>) -> bool {
        let open = self.parent == Parent::Open && !self.shutting_down && self.giving_back.is_none();
        if !open || self.stall.probe().is_some() || now_us.saturating_sub(heard) < self.live.lease_us {
            return false;
        }
        tracing::warn!(
            agent = self.id,
            stood_s = stood_us as f64 / 1e6,
            "this agent stood still past its lease; holding its queue until its parent says it still holds it"
        );
        self.seq += 1;
        self.unacked.push_back((self.seq, 0, now_us));
        let until_us = now_us + PROBE_HOLDS * self.live.hold_us;
        self.stall.ask(Probe { seq: self.seq, until_us, stood_us });
        if !self.held {
            self.held = true;
            out.push(Effect::Exec(Command::Hold(true)));
        }
        true
    }

    /// Whether `down` acknowledges the probe's report: the parent read it, after this agent
    /// stood still, and still holds this agent.
    fn answers_probe(&mut self, down: &Down) -> bool {
        let seq = match down.msg {
            ToAgent::Ack { seq } | ToAgent::Resync { seq } if down.agent == self.id => seq,
            _ => return false,
        };
        let Some(p) = self.stall.answered(seq) else { return false };
        tracing::info!(
            agent = self.id,
            stood_s = p.stood_us as f64 / 1e6,
            "its parent still holds this agent; going on"
        );
        true
    }

    /// The executor may start tasks until the parent's silence would make this agent unsure
    /// (`hold_us`), by its own clock: an agent stopped past that (SIGSTOP) starts nothing when
    /// it runs again before this machine has heard whether it was given up. Renewed as the
    /// parent is heard, at most every quarter of the span, so the executor is not told per frame.
    fn renew_lease(&mut self, now_us: u64, out: &mut Vec<Effect>) {
        let until = now_us + self.live.hold_us;
        if until >= self.lease_sent_us + self.live.hold_us / 4 {
            self.lease_sent_us = until;
            out.push(Effect::Exec(Command::Lease(until)));
        }
    }

    /// The report timer: fencing, and holding the queue while the parent is unsure.
    fn tick(&mut self, now_us: u64, heard: u64, out: &mut Vec<Effect>) {
        if self.lease_ran_out(now_us, heard) {
            self.fence(now_us, heard, out);
            return;
        }
        if self.unsure(now_us, heard) && !self.held && self.parent == Parent::Open && !self.shutting_down {
            // What starts now might run again elsewhere if the parent is gone for good.
            self.held = true;
            out.push(Effect::Exec(Command::Hold(true)));
        }
        // What waits goes when its gap has passed (`after`).
    }

    /// While the leader is awaited nothing comes down from it: the agents below hear from this
    /// relay instead, so that their leases hold until the new leader is found.
    fn keep_below_alive(&mut self, now_us: u64, out: &mut Vec<Effect>) {
        if now_us.saturating_sub(self.kept_alive_us) < self.live.heartbeat_us {
            return;
        }
        self.kept_alive_us = now_us;
        for &agent in self.hellos_below.keys() {
            if let Some(child) = self.tree.next_hop(Some(self.id), agent).filter(|c| self.children.contains(c)) {
                out.push(Effect::Down { child, msg: Down { agent, msg: ToAgent::Ack { seq: 0 } } });
            }
        }
    }

    /// The leader gave this agent up, or may have (its lease ran out): what it holds runs
    /// elsewhere, so it must stop all of it. Then it comes back empty if it can, or leaves.
    fn given_up(&mut self, why: String, out: &mut Vec<Effect>) {
        if !(self.can_revive && self.children.is_empty() && self.parent == Parent::Open) {
            return self.stop(why, out);
        }
        tracing::warn!(agent = self.id, %why, "given up: stopping every task, then rejoining the leader fresh");
        self.parent = Parent::Reviving { reconnecting: false };
        out.push(Effect::Exec(Command::Reset));
    }

    /// After a reset nothing is held, asked for or owed: the leader forgot it all already.
    fn emptied(&mut self) {
        self.outstanding = 0;
        self.asked = 0;
        self.told_idle = 0;
        self.unacked.clear();
        self.unacked_results.clear();
        self.started.clear();
        self.results.clear();
        self.holding.clear();
        self.resync = false;
        self.rejoined = false;
    }

    /// Stops the tasks and stops reporting: what ran is not recorded, and runs again elsewhere.
    /// Stops as a signal said. Results that wait for the report gap go first, and what was
    /// given back: a task that ended is not run again elsewhere for want of its report.
    fn stop_on_signal(&mut self, now_us: u64, what: &'static str, out: &mut Vec<Effect>) {
        self.giving_back = None;
        if self.parent == Parent::Open && (!self.results.is_empty() || !self.recalled.is_empty()) {
            self.report(now_us, 0, false, 0, out);
        }
        self.stop(what.to_string(), out);
    }

    fn stop(&mut self, why: String, out: &mut Vec<Effect>) {
        if !matches!(self.parent, Parent::Cut { .. }) {
            self.parent = Parent::Cut { why, own: true };
            out.push(Effect::Exec(Command::Abort));
        }
    }

    fn on_parent(&mut self, down: Down, out: &mut Vec<Effect>) -> bool {
        if self.parent != Parent::Open {
            return false;
        }
        if down.agent != self.id {
            match self.tree.next_hop(Some(self.id), down.agent).filter(|c| self.children.contains(c)) {
                Some(child) => out.push(Effect::Down { child, msg: down }),
                None => tracing::debug!(agent = down.agent, "message for an agent not below this one dropped"),
            }
            return false;
        }
        match down.msg {
            ToAgent::Dispatch(tasks) => {
                let n = tasks.len() as u64;
                self.holding.extend(tasks.iter().map(|t| t.id));
                self.outstanding += n;
                self.asked = self.asked.saturating_sub(n);
                out.push(Effect::Exec(Command::Run(tasks)));
            }
            ToAgent::Preempt(ids) => out.push(Effect::Exec(Command::Stop(ids))),
            ToAgent::Recall(ids) => out.push(Effect::Exec(Command::Recall(ids))),
            ToAgent::Ack { seq } => self.acked(seq),
            ToAgent::Resync { seq } => {
                self.acked(seq);
                self.resync = true;
                if std::mem::take(&mut self.rejoined) {
                    // What was asked for may have died with the relay: ask afresh.
                    self.asked = 0;
                }
                return true;
            }
            ToAgent::Shutdown { stop: Stop::Revive, reason } => {
                self.given_up(format!("given up by the leader: {reason}"), out)
            }
            ToAgent::Shutdown { stop, reason } => {
                tracing::info!(agent = self.id, ?stop, %reason, "shutdown");
                self.shutting_down = true;
                if stop != Stop::Abort {
                    // What runs is to finish: a signal of this agent's own waits no more.
                    self.giving_back = None;
                }
                if stop == Stop::Hold {
                    self.told_to_hold = true;
                    out.push(Effect::Exec(Command::Hold(true)));
                }
                out.push(Effect::Exec(if stop == Stop::Abort { Command::Abort } else { Command::Finish }));
            }
            ToAgent::Welcome { .. } | ToAgent::Reject { .. } => {
                tracing::warn!(agent = self.id, "unexpected answer from above ignored")
            }
        }
        false
    }

    /// Every report up to and including `seq` is recorded.
    fn acked(&mut self, seq: u64) {
        while self.unacked.front().is_some_and(|(s, _, _)| *s <= seq) {
            self.unacked.pop_front();
        }
        while self.unacked_results.front().is_some_and(|(s, _)| *s <= seq) {
            self.unacked_results.pop_front();
        }
    }

    fn parent_ended(&mut self, why: String, out: &mut Vec<Effect>) {
        if self.parent != Parent::Open {
            return;
        }
        if self.shutting_down {
            // After Shutdown the leader may close first; that is the normal end.
            self.parent = Parent::Closed;
        } else if self.can_await {
            // The leader went with its job: a joined job takes the run over, and this agent goes
            // to its leader with what it holds. What runs meanwhile runs on; nothing new starts.
            tracing::warn!(agent = self.id, %why, "lost the leader; waiting for the run's new one");
            self.hold_and_reconnect(Parent::Awaiting, Effect::AwaitLeader, out);
        } else if self.can_rejoin {
            // The relay is gone, not necessarily the leader: keep the tasks, start nothing new,
            // and reconnect; the lease still bounds how long this may take.
            tracing::warn!(agent = self.id, %why, "lost the relay above; rejoining the leader");
            self.hold_and_reconnect(Parent::Rejoining, Effect::Rejoin, out);
        } else if self.can_revive && self.children.is_empty() {
            // The leader counts it lost (a member: it went with its head), and its tasks run
            // elsewhere: it stops them and comes back to the leader empty, should the leader
            // still be there (a cut link, a lost head), to work on; else it leaves.
            let what = if self.tree.head(self.id) == self.id { "lost its parent" } else { "lost its instance head" };
            self.given_up(format!("{what}: {why}"), out);
        } else {
            // Without a leader nobody records results: stop the tasks rather than let them run
            // unaccounted. The resumed run re-runs them.
            self.parent = Parent::Cut { why, own: false };
            out.push(Effect::Exec(Command::Abort));
        }
    }

    /// Keeps the tasks, starts nothing new, and reconnects as `how` says.
    fn hold_and_reconnect(&mut self, parent: Parent, how: Effect, out: &mut Vec<Effect>) {
        self.parent = parent;
        if !std::mem::replace(&mut self.held, true) {
            out.push(Effect::Exec(Command::Hold(true)));
        }
        out.push(how);
    }

    fn child_closed(&mut self, child: u32, agents: Vec<u32>, why: String, out: &mut Vec<Effect>) -> bool {
        self.children.remove(&child);
        for a in &agents {
            self.hellos_below.remove(a);
        }
        if self.shutting_down || self.parent != Parent::Open {
            return false;
        }
        for agent in agents {
            out.push(Effect::Up(Up::Lost { agent, why: why.clone() }));
        }
        true
    }

    fn on_exec(&mut self, now_us: u64, batch: Vec<ExecEvent>) -> bool {
        let before = self.results.len();
        for e in batch {
            match e {
                ExecEvent::Started { id, attempt, start_us } => self.started.push(Started { id, attempt, start_us }),
                ExecEvent::Reset => {}
                ExecEvent::Recalled { id, .. } => {
                    self.outstanding = self.outstanding.saturating_sub(1);
                    self.holding.remove(&id);
                    self.recalled.push(id);
                }
                ExecEvent::Finished(f) => {
                    self.outstanding = self.outstanding.saturating_sub(1);
                    self.holding.remove(&f.id);
                    self.results.push(TaskResult { id: f.id, attempt: f.attempt, ran_on: None, ended: f.ended });
                }
            }
        }
        self.pace.finished(now_us, (self.results.len() - before) as u64);
        // Recalled tasks are wanted elsewhere now, where slots are idle.
        self.results.len() >= REPORT_BATCH || !self.recalled.is_empty()
    }

    /// After every input: the end of the agent, or a report when one is due.
    fn after(&mut self, now_us: u64, urgent: bool, out: &mut Vec<Effect>) {
        let open = self.parent == Parent::Open;
        if let Some(at) = self.exec_ended_at {
            if !open || self.shutting_down {
                // A relay stays until its children are done: their last reports pass through it.
                if open && !self.children.is_empty() && now_us.saturating_sub(at) < CHILDREN_GRACE_US {
                    if self.pace.due(now_us, self.has_news(), urgent && self.has_news()) {
                        self.report(now_us, 0, true, 0, out);
                    }
                    return;
                }
                if open {
                    self.report(now_us, 0, true, 0, out);
                    out.push(Effect::CloseUp);
                }
                self.finished = true;
                return;
            }
        }
        if !open {
            return;
        }
        let target = self.pace.target();
        let want = self.want();
        // Work about to run out, or a slot newly with nothing to start (the tail, the end),
        // cannot wait for the gap: the parent must hear of the idle slot to fill it. A result
        // is such news too: the parent counted that slot busy since it sent the task.
        let idle = self.slots.saturating_sub(self.outstanding as usize) as u32;
        let idle_news = idle > 0 && (idle > self.told_idle || !self.results.is_empty());
        let dry = (want > 0 && self.outstanding < target / 4) || idle_news;
        let beat = !self.shutting_down && self.pace.beat_due(now_us, self.live.heartbeat_us);
        let news = want > 0 || self.has_news();
        if (news || beat || self.resync) && self.pace.due(now_us, news, urgent || dry || beat || self.resync) {
            self.asked += want;
            let drained = self.outstanding == 0 && self.asked == 0;
            self.report(now_us, want as u32, drained, idle, out);
        }
    }

    /// Tasks to ask for now: what the queue's target lacks, once that is at least a quarter of
    /// it (small requests cost a frame each), or anything when nothing is held or asked.
    fn want(&self) -> u64 {
        let target = self.pace.target();
        let want = if self.shutting_down { 0 } else { target.saturating_sub(self.outstanding + self.asked) };
        if want >= target / 4 || self.outstanding + self.asked == 0 {
            want
        } else {
            0
        }
    }

    pub fn heartbeat_us(&self) -> u64 {
        self.live.heartbeat_us
    }

    /// When the carrier must next tick, beyond what inputs bring. Under load only news held
    /// back for the report gap waits for time, and the gap's end is known: ticking every
    /// `FLUSH_EVERY` instead was 200 wake-ups a second of the agent's main thread that did
    /// nothing but look (bench/RESULTS.md §20).
    pub fn wake(&self) -> Wake {
        let simple = self.parent == Parent::Open
            && !self.resync
            && !self.held
            && !self.shutting_down
            && self.giving_back.is_none()
            && self.exec_ended_at.is_none()
            && self.children.is_empty();
        if !simple {
            Wake::Soon
        } else if self.has_news() || self.want() > 0 {
            Wake::At(self.pace.due_at())
        } else {
            Wake::Quiet
        }
    }

    fn has_news(&self) -> bool {
        self.signal_untold || !self.results.is_empty() || !self.started.is_empty() || !self.recalled.is_empty()
    }

    fn report(&mut self, now_us: u64, want: u32, drained: bool, idle: u32, out: &mut Vec<Effect>) {
        self.pace.sent(now_us, want == 0 && !self.has_news() && !self.resync);
        self.told_idle = idle;
        if !self.results.is_empty() {
            self.seq += 1;
            self.unacked.push_back((self.seq, self.results.len(), now_us));
            if self.can_await {
                self.unacked_results.push_back((self.seq, self.results.clone()));
            }
            // A start whose result travels in the same report needs no separate ledger write.
            if !self.started.is_empty() {
                let done: HashSet<u64> = self.results.iter().map(|r| r.id).collect();
                self.started.retain(|s| !done.contains(&s.id));
            }
        }
        let resync = std::mem::take(&mut self.resync);
        let holding = resync.then(|| {
            let mut h: Vec<u64> = self.holding.iter().copied().collect();
            h.sort_unstable();
            h
        });
        let report = Report {
            seq: self.seq,
            started: std::mem::take(&mut self.started),
            results: std::mem::take(&mut self.results),
            want,
            drained,
            idle,
            holding,
            recalled: std::mem::take(&mut self.recalled),
            signalled: std::mem::take(&mut self.signal_untold) || self.signalled,
            ..Report::default()
        };
        out.push(Effect::Up(Up::Report { agent: self.id, report }));
    }
}

/// Tasks an agent with `slots` slots keeps queued: enough to keep every slot busy across one
/// report round trip.
pub fn queue_target(slots: usize) -> u64 {
    (slots as u64 * 8).max(32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use htc_core::record::{Ended, Outcome};
    use htc_core::work::{Finished, TaskToRun};

    /// The least time between reports (`pace`) of one of `tree()`'s eight instances.
    const GAP: u64 = 8 * 25_000;

    fn spec(id: u64) -> TaskToRun {
        TaskToRun::new(id, 1, b"true".to_vec())
    }

    /// `msg` from the parent for `agent`.
    fn down(agent: u32, msg: ToAgent) -> Input {
        Input::Parent(Down { agent, msg })
    }

    fn hello(agent: u32, cores: u32, mem_mb: u64, gpus: u32) -> Up {
        Up::Hello(Hello { agent, cores, mem_mb, gpus, hostname: String::new(), came: Came::New })
    }

    fn dispatch(agent: u32, ids: std::ops::Range<u64>) -> Input {
        down(agent, ToAgent::Dispatch(ids.map(spec).collect()))
    }

    fn done(id: u64) -> ExecEvent {
        ExecEvent::Finished(Finished { id, attempt: 1, ended: Ended::new(Outcome::Exited, 0, 10, 20) })
    }

    fn step(m: &mut Machine, now: u64, input: Input) -> Vec<Effect> {
        let mut out = Vec::new();
        m.handle(now, input, &mut out);
        out
    }

    /// Ticks as the driver gives them while the agent runs (at least every 50 ms), after `from`
    /// and up to `to` (the last one at `to`): the time passes without the agent standing still.
    fn ticks_to(m: &mut Machine, from: u64, to: u64) -> Vec<Effect> {
        let mut out = Vec::new();
        let mut now = from;
        while now < to {
            now = (now + 50_000).min(to);
            m.handle(now, Input::Tick, &mut out);
        }
        out
    }

    /// Eight agents, two per parent: agent 0's children are 2 and 3, agent 2's are 6 and 7.
    fn tree() -> Arc<Tree> {
        Arc::new(Tree::kary(8, 2))
    }

    /// Agent 0 with `slots` slots that asked for work and received tasks `0..n`.
    fn holding(slots: usize, n: u64) -> Machine {
        let mut m = Machine::new(0, slots, tree());
        step(&mut m, 0, Input::Tick);
        step(&mut m, 1, dispatch(0, 0..n));
        m
    }

    fn reports(out: &[Effect]) -> Vec<&Report> {
        out.iter()
            .filter_map(|e| match e {
                Effect::Up(Up::Report { report, .. }) => Some(report),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn asks_for_a_full_queue_then_reports_results_and_idle_slots() {
        let mut m = Machine::new(0, 4, tree());
        let out = step(&mut m, 0, Input::Tick);
        let r = reports(&out);
        assert_eq!((r.len(), r[0].want, r[0].idle, r[0].drained), (1, 32, 4, false));
        // Nothing new and nothing due: a tick says nothing.
        assert!(step(&mut m, 1, Input::Tick).is_empty());

        let out = step(&mut m, 2, dispatch(0, 0..32));
        // The parent's first word gives the executor its lease: 1 s (`hold_us`) from now.
        assert!(
            matches!(out.as_slice(), [Effect::Exec(Command::Lease(1_000_002)), Effect::Exec(Command::Run(t))]
            if t.len() == 32 && t[5].id == 5),
            "{out:?}"
        );

        let started = (0..4).map(|id| ExecEvent::Started { id, attempt: 1, start_us: 5 });
        assert!(step(&mut m, 3, Input::Exec(started.collect())).is_empty(), "news waits for the gap");
        let out = step(&mut m, 4, Input::Exec((0..3).map(done).collect()));
        assert!(out.is_empty());
        assert!(step(&mut m, GAP - 1, Input::Tick).is_empty());
        let out = step(&mut m, GAP, Input::Tick);
        let r = reports(&out)[0];
        // Task 3 started and is still running: only its start goes up.
        assert_eq!(r.results.iter().map(|r| r.id).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(r.started.iter().map(|s| s.id).collect::<Vec<_>>(), [3]);
        assert_eq!((r.seq, r.want, r.idle), (1, 0, 0), "29 queued: not yet a quarter of the target to ask for");
        assert_eq!(m.unacked_results(), 3);
    }

    /// The carrier ticks when the gap ends while news waits for it, slowly while nothing but
    /// heartbeats and the lease waits for time, and fast while a relay's children or a stop
    /// under way do.
    #[test]
    fn the_carrier_wakes_when_held_news_is_due_and_only_then_under_load() {
        let mut m = holding(4, 8);
        let started = (0..2).map(|id| ExecEvent::Started { id, attempt: 1, start_us: 5 });
        step(&mut m, 3, Input::Exec(started.collect()));
        let Wake::At(due) = m.wake() else { panic!("two starts wait for the gap: {:?}", m.wake()) };
        assert!(reports(&step(&mut m, due - 1, Input::Tick)).is_empty(), "not before {due}");
        assert_eq!(reports(&step(&mut m, due, Input::Tick)).len(), 1, "at {due}");
        assert_eq!(m.wake(), Wake::Quiet, "reported: only the running tasks' ends are awaited");
        step(&mut m, due + 1, Input::Exec(vec![done(0)]));
        step(&mut m, due + 2, Input::Exec(vec![done(1)]));
        assert_eq!(m.wake(), Wake::At(due + GAP), "a result waits for the gap after the last report");
        step(&mut m, due + 6, Input::Signal("terminated by a signal"));
        assert_eq!(m.wake(), Wake::Soon, "stopping");
        let mut relay = Machine::new(2, 1, tree());
        step(&mut relay, 0, Input::ChildOpened(6));
        assert_eq!(relay.wake(), Wake::Soon, "a relay watches its children");
    }

    /// Issue 25: under load results travel in batches, one report per gap; a lone result after
    /// a quiet spell goes at once; a full batch does not wait; the queue grows with the rate, so
    /// that waiting for the gap never leaves a slot without work.
    #[test]
    fn results_go_up_by_count_and_age_and_the_queue_follows_the_rate() {
        let mut m = holding(2, 32);
        let mut next = 0u64;
        let mut sent = Vec::new();
        // A task ends every 250 µs for half a second: 4,000 a second.
        for k in 1..=2_000u64 {
            let now = k * 250;
            let mut out = step(&mut m, now, Input::Exec(vec![done(next)]));
            next += 1;
            if k % 20 == 0 {
                out.extend(step(&mut m, now, Input::Tick));
            }
            for r in reports(&out) {
                sent.push((now, r.results.len(), r.want));
            }
            // The parent answers each request at once.
            let want: u64 = reports(&out).iter().map(|r| r.want as u64).sum();
            if want > 0 {
                step(&mut m, now, dispatch(0, 10_000 + next * 10..10_000 + next * 10 + want));
            }
        }
        let last = reports(&step(&mut m, 500_000 + GAP, Input::Tick)).iter().map(|r| r.results.len()).sum::<usize>();
        let results: usize = sent.iter().map(|s| s.1).sum();
        assert_eq!(results + last, 2_000, "every result went up, the last a gap after the one before");
        assert!(sent.len() <= 500_000 / GAP as usize + 3, "{} reports in 0.5 s: two, then one a gap", sent.len());
        // Until the rate shows (10 ms), the queue of 32 runs low and asks at once; then never
        // two reports within a gap unless the second carries a full batch.
        assert!(sent[..2].iter().all(|s| s.0 <= 10_000), "{sent:?}");
        let paced = |w: &[(u64, usize, u32)]| w[1].0 - w[0].0 >= GAP || w[1].1 == REPORT_BATCH;
        assert!(sent[2..].windows(2).all(paced), "{sent:?}");
        assert!(sent[2..].iter().any(|s| s.1 == REPORT_BATCH), "at 4,000/s a batch fills within the gap: {sent:?}");
        assert!(m.pace.target() > 320, "the queue covers the gap at 4,000/s: {}", m.pace.target());
        // Quiet for a while, then one result: it goes at once.
        let out = step(&mut m, 2_000_000, Input::Exec(vec![done(next)]));
        assert_eq!(reports(&out).len(), 1);
        // A full batch does not wait for the gap.
        let batch = (0..REPORT_BATCH as u64).map(|i| done(100_000 + i)).collect();
        let out = step(&mut m, 2_000_001, Input::Exec(batch));
        assert_eq!(reports(&out)[0].results.len(), REPORT_BATCH);
    }

    #[test]
    fn a_recall_gives_back_what_has_not_started_at_once() {
        let mut m = holding(1, 8);
        let recall = Down { agent: 0, msg: ToAgent::Recall(vec![6, 7]) };
        let out = step(&mut m, 2, Input::Parent(recall));
        assert!(matches!(out.as_slice(), [Effect::Exec(Command::Recall(ids))] if ids == &[6, 7]));
        // The executor had started 7 already: only 6 comes back, in a report of its own.
        let out = step(&mut m, 3, Input::Exec(vec![ExecEvent::Recalled { id: 6, attempt: 1 }]));
        let r = reports(&out);
        assert_eq!((r.len(), r[0].recalled.as_slice()), (1, &[6][..]));
        // It is no longer held: a resync does not list it.
        let mut out = step(&mut m, 4, down(0, ToAgent::Resync { seq: 0 }));
        out.extend(step(&mut m, 5, Input::Tick));
        assert_eq!(reports(&out)[0].holding.as_deref(), Some(&[0, 1, 2, 3, 4, 5, 7][..]));
    }

    #[test]
    fn a_draining_queue_reports_at_once_and_asks_for_more() {
        let mut m = holding(1, 32);
        let out = step(&mut m, 2, Input::Exec((0..25).map(done).collect()));
        let r = reports(&out);
        assert_eq!(r.len(), 1, "7 left of a target of 32: below a quarter");
        assert_eq!((r[0].want, r[0].results.len()), (25, 25));
    }

    /// An idle slot is news once: the parent remembers it. An idle agent at the tail answered
    /// every ack with another report saying the same (a ping-pong at network speed).
    #[test]
    fn an_idle_slot_is_said_once_and_a_result_that_frees_one_at_once() {
        let mut m = holding(2, 2);
        step(&mut m, 2, Input::Exec((0..2).map(|id| ExecEvent::Started { id, attempt: 1, start_us: 2 }).collect()));
        let out = step(&mut m, 3, Input::Exec(vec![done(0)]));
        let r = reports(&out);
        assert_eq!((r.len(), r[0].idle, r[0].results.len()), (1, 1, 1), "a slot freed: said at once");
        // The leader has nothing for it: its ack, and ticks, bring no report until the gap.
        for now in 4..20 {
            let mut out = step(&mut m, now, down(0, ToAgent::Ack { seq: 1 }));
            out.extend(step(&mut m, now, Input::Tick));
            assert!(reports(&out).is_empty(), "at {now}: {out:?}");
        }
        // The other slot frees: news again, at once.
        let r = step(&mut m, 20, Input::Exec(vec![done(1)]));
        assert_eq!(reports(&r)[0].idle, 2);
    }

    #[test]
    fn acks_release_what_the_leader_recorded() {
        let mut m = holding(1, 32);
        for (i, id) in (0..3).enumerate() {
            // A gap since the last report: the result goes at once.
            let r = step(&mut m, (i as u64 + 1) * GAP, Input::Exec(vec![done(id)]));
            assert_eq!(reports(&r)[0].seq, i as u64 + 1);
        }
        assert_eq!(m.unacked_results(), 3);
        step(&mut m, 4, down(0, ToAgent::Ack { seq: 2 }));
        assert_eq!(m.unacked_results(), 1);
        // An ack for another agent is not this one's.
        step(&mut m, 5, down(7, ToAgent::Ack { seq: 3 }));
        assert_eq!(m.unacked_results(), 1);
        step(&mut m, 5, down(0, ToAgent::Ack { seq: 3 }));
        assert_eq!(m.unacked_results(), 0);
    }

    #[test]
    fn shutdown_finishes_the_queue_then_sends_the_last_report_and_closes() {
        let mut m = Machine::new(3, 2, tree());
        step(&mut m, 0, Input::Tick);
        step(&mut m, 1, dispatch(3, 0..2));
        let out = step(
            &mut m,
            2,
            Input::Parent(Down { agent: 3, msg: ToAgent::Shutdown { stop: Stop::Finish, reason: "done".into() } }),
        );
        assert!(matches!(out.as_slice(), [Effect::Exec(Command::Finish)]));
        let out = step(&mut m, GAP, Input::Exec((0..2).map(done).collect()));
        let r = reports(&out);
        assert_eq!((r[0].results.len(), r[0].want), (2, 0), "a shutting-down agent asks for nothing");
        assert!(m.outcome().is_none());
        let out = step(&mut m, GAP + 1, Input::ExecEnded);
        let r = reports(&out);
        assert_eq!((r.len(), r[0].results.len(), r[0].drained, r[0].want), (1, 0, true, 0));
        assert!(matches!(out.last(), Some(Effect::CloseUp)));
        assert_eq!(m.outcome(), Some(Ok(())));
        // Nothing after the end.
        assert!(step(&mut m, GAP + 2, Input::Tick).is_empty());
    }

    #[test]
    fn losing_the_parent_stops_the_tasks_and_says_what_was_not_recorded() {
        let mut m = holding(1, 32);
        assert_eq!(reports(&step(&mut m, GAP, Input::Exec(vec![done(0)]))).len(), 1);
        let out = step(&mut m, GAP + 1, Input::ParentEnded("connection reset".into()));
        assert!(matches!(out.as_slice(), [Effect::Exec(Command::Abort)]));
        // What the executor still says goes nowhere: there is nobody to record it.
        assert!(step(&mut m, 2 * GAP, Input::Exec(vec![done(1)])).is_empty());
        let out = step(&mut m, 2 * GAP + 1, Input::ExecEnded);
        assert!(out.is_empty(), "{out:?}");
        let err = m.outcome().unwrap().unwrap_err();
        assert!(err.contains("connection reset") && err.contains("1 results"), "{err}");
    }

    #[test]
    fn the_parent_closing_after_shutdown_is_the_normal_end() {
        let mut m = Machine::new(0, 1, tree());
        step(
            &mut m,
            0,
            Input::Parent(Down { agent: 0, msg: ToAgent::Shutdown { stop: Stop::Abort, reason: "x".into() } }),
        );
        assert!(step(&mut m, 1, Input::ParentEnded("closed".into())).is_empty());
        step(&mut m, 2, Input::ExecEnded);
        assert_eq!(m.outcome(), Some(Ok(())));
    }

    /// Agent 2, below relay 0, with two slots and tasks 0..4; it may rejoin.
    fn below_a_relay_holding_0_to_3() -> (Machine, Liveness) {
        let live = Liveness::new(std::time::Duration::from_secs(10));
        let mut m = Machine::new(2, 2, tree()).with_liveness(live).with_rejoin(true);
        step(&mut m, 0, Input::Tick);
        step(&mut m, 1, dispatch(2, 0..4));
        (m, live)
    }

    /// Agent 2 sits below relay 0. When the relay goes, it keeps its tasks, holds, and asks to
    /// rejoin; once back it answers the leader's resync with what it holds, and asks afresh.
    #[test]
    fn an_agent_below_a_lost_relay_keeps_its_tasks_rejoins_and_resyncs() {
        let (mut m, _) = below_a_relay_holding_0_to_3();
        let out = step(&mut m, 2, Input::ParentEnded("connection closed".into()));
        assert!(matches!(out.as_slice(), [Effect::Exec(Command::Hold(true)), Effect::Rejoin]), "{out:?}");
        // Nothing is stopped while it rejoins, and task 1 ends meanwhile.
        assert!(step(&mut m, 3, Input::Exec(vec![done(1)])).iter().all(|e| !matches!(e, Effect::Exec(Command::Abort))));
        step(&mut m, 4, Input::Rejoined);
        let ack = Down { agent: 2, msg: ToAgent::Resync { seq: 0 } };
        let out = step(&mut m, 5, Input::Parent(ack));
        let r = reports(&out);
        assert_eq!(r.len(), 1, "{out:?}");
        assert_eq!(r[0].holding.as_deref(), Some(&[0, 2, 3][..]), "what it still has queued or running");
        assert!(r[0].want > 0, "it asks afresh: what it had asked for may have died with the relay");
        assert!(out.iter().any(|e| matches!(e, Effect::Exec(Command::Hold(false)))), "and starts tasks again");
        assert_eq!(m.outcome(), None);
    }

    #[test]
    fn an_agent_that_cannot_rejoin_within_its_lease_stops_its_tasks() {
        let (mut m, live) = below_a_relay_holding_0_to_3();
        step(&mut m, 2, Input::ParentEnded("connection closed".into()));
        let out = step(&mut m, 1 + live.lease_us, Input::Tick);
        assert!(out.iter().any(|e| matches!(e, Effect::Exec(Command::Abort))), "{out:?}");
    }

    #[test]
    fn a_failed_executor_stops_the_agent_without_reporting_what_it_killed() {
        let mut m = holding(2, 32);
        let out = step(&mut m, 2, Input::ExecFailed("spawn loop 1 stopped unexpectedly".into()));
        // The leader hears why before the connection closes.
        assert!(
            matches!(out.as_slice(), [Effect::Up(Up::Lost { agent, why }), Effect::Exec(Command::Abort)] if *agent == m.id && why.contains("spawn loop 1")),
            "{out:?}"
        );
        // The killed tasks' ends go nowhere; the leader counts them lost with the agent.
        assert!(step(&mut m, 3, Input::Exec(vec![done(0)])).is_empty());
        assert!(step(&mut m, 4, Input::ExecEnded).is_empty());
        let err = m.outcome().unwrap().unwrap_err();
        assert!(err.starts_with("spawn loop 1 stopped unexpectedly; running tasks were stopped"), "{err}");
    }

    #[test]
    fn a_signal_aborts_once_and_ends_in_an_error() {
        let mut m = Machine::new(0, 1, tree());
        let out = step(&mut m, 0, Input::Signal("terminated by a signal"));
        assert!(matches!(out.as_slice(), [Effect::Exec(Command::Abort)]));
        assert!(step(&mut m, 1, Input::Signal("interrupted")).is_empty());
        step(&mut m, 2, Input::ExecEnded);
        let err = m.outcome().unwrap().unwrap_err();
        assert!(err.starts_with("terminated by a signal; running tasks were stopped"), "{err}");

        // Holding tasks, it first gives back what has not started; then the results still
        // waiting for the report gap and what came back go up before the tasks are stopped.
        let mut m = holding(2, 8);
        step(&mut m, GAP, Input::Exec(vec![done(0)]));
        assert!(step(&mut m, GAP + 1, Input::Exec(vec![done(1)])).is_empty(), "waits for the gap");
        // The leader hears of the signal at once (it may know of a grace), with what waited.
        let signal = step(&mut m, GAP + 2, Input::Signal("terminated by a signal"));
        let mut asked: Vec<u64> = match &signal[..] {
            [Effect::Exec(Command::Hold(true)), Effect::Exec(Command::Recall(ids)), Effect::Up(Up::Report { report, .. })]
                if report.signalled =>
            {
                ids.clone()
            }
            _ => panic!("{signal:?}"),
        };
        asked.sort_unstable();
        assert_eq!(asked, (2..8).collect::<Vec<u64>>(), "all it holds: the spawners know which started");
        let back = (4..8).map(|id| ExecEvent::Recalled { id, attempt: 1 }).collect();
        // What came back goes up at once (it is wanted elsewhere), the rest with the stop.
        let mut out = signal;
        out.extend(step(&mut m, GAP + 3, Input::Exec(back)));
        assert!(!out.iter().any(|e| matches!(e, Effect::Exec(Command::Abort))), "{out:?}");
        out.extend(step(&mut m, GAP + 3 + GIVE_BACK_US, Input::Tick));
        let reported: Vec<(Vec<u64>, Vec<u64>)> = out
            .iter()
            .filter_map(|e| match e {
                Effect::Up(Up::Report { report, .. }) => {
                    Some((report.results.iter().map(|r| r.id).collect(), report.recalled.clone()))
                }
                _ => None,
            })
            .collect();
        let results: Vec<u64> = reported.iter().flat_map(|r| r.0.clone()).collect();
        let recalled: Vec<u64> = reported.iter().flat_map(|r| r.1.clone()).collect();
        assert_eq!((results, recalled), (vec![1], vec![4, 5, 6, 7]), "{out:?}");
        assert!(matches!(out.last(), Some(Effect::Exec(Command::Abort))), "{out:?}");
        assert!(step(&mut m, GAP + 9 + GIVE_BACK_US, Input::Signal("again")).is_empty());
    }

    /// With no Slurm job for the leader to ask (`GIVE_BACK_UNASKED_US`), what runs is stopped
    /// once the spawners could answer, not after the wait for a word that will not come.
    #[test]
    fn a_signalled_agent_with_no_grace_to_ask_about_stops_after_the_short_give_back() {
        let mut m = holding(2, 8).with_give_back(GIVE_BACK_UNASKED_US);
        step(&mut m, 2, Input::Signal("terminated by a signal"));
        let before = ticks_to(&mut m, 2, GIVE_BACK_UNASKED_US);
        assert!(!before.iter().any(|e| matches!(e, Effect::Exec(Command::Abort))), "{before:?}");
        let after = ticks_to(&mut m, GIVE_BACK_UNASKED_US, GIVE_BACK_UNASKED_US + 100_000);
        assert!(after.iter().any(|e| matches!(e, Effect::Exec(Command::Abort))), "{after:?}");
    }

    /// A preemption with a grace: the leader, told of the signal, says to finish what runs
    /// (`Stop::Hold`) within the give-back time. The agent stops nothing when that time is up,
    /// nor on Slurm's signals after; it finishes and leaves.
    #[test]
    fn a_signalled_agent_told_to_finish_what_runs_stops_nothing() {
        let mut m = holding(2, 8);
        step(&mut m, 2, Input::Signal("terminated by a signal"));
        let hold = Down { agent: 0, msg: ToAgent::Shutdown { stop: Stop::Hold, reason: "a grace".into() } };
        let out = step(&mut m, 100_000, Input::Parent(hold));
        assert!(out.iter().any(|e| matches!(e, Effect::Exec(Command::Finish))), "{out:?}");
        let mut later = ticks_to(&mut m, 100_000, 2 * GIVE_BACK_US);
        later.extend(step(&mut m, 2 * GIVE_BACK_US + 1, Input::Signal("terminated by a signal")));
        assert!(!later.iter().any(|e| matches!(e, Effect::Exec(Command::Abort))), "{later:?}");
        step(&mut m, 2 * GIVE_BACK_US + 2, Input::Exec(vec![done(0), done(1)]));
        step(&mut m, 2 * GIVE_BACK_US + 3, Input::ExecEnded);
        assert_eq!(m.outcome(), Some(Ok(())));
    }

    #[test]
    fn the_parent_s_word_renews_the_executor_s_lease_at_most_every_quarter_of_it() {
        let mut m = Machine::new(0, 4, tree());
        let leases = |out: &[Effect]| -> Vec<u64> {
            out.iter()
                .filter_map(|e| match e {
                    Effect::Exec(Command::Lease(u)) => Some(*u),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(leases(&step(&mut m, 0, Input::Tick)), Vec::<u64>::new(), "none before the parent spoke");
        let ack = || down(0, ToAgent::Ack { seq: 0 });
        assert_eq!(leases(&step(&mut m, 10, ack())), [1_000_010]);
        assert!(leases(&step(&mut m, 200_000, ack())).is_empty(), "still 3/4 of it ahead");
        assert_eq!(leases(&step(&mut m, 250_010, ack())), [1_250_010]);
        // A parent silent past it: the lease is not renewed by ticks.
        assert!(leases(&step(&mut m, 1_300_000, Input::Tick)).is_empty());
    }

    #[test]
    fn frames_for_agents_below_go_down_the_right_branch() {
        // Fan-out 2: agent 0's children are agents 2 and 3; agent 7 is below agent 2.
        let mut m = Machine::new(0, 1, tree());
        step(&mut m, 0, Input::ChildOpened(2));
        let out = step(&mut m, 1, dispatch(7, 0..1));
        assert!(
            matches!(
                out.as_slice(),
                [
                    Effect::Exec(Command::Lease(_)),
                    Effect::Down { child: 2, msg: Down { msg: ToAgent::Dispatch(_), .. } }
                ]
            ),
            "{out:?}"
        );
        // Agent 3 is below, but its branch has not connected; agent 1 is not below at all.
        assert!(step(&mut m, 2, dispatch(3, 0..1)).is_empty());
        assert!(step(&mut m, 3, dispatch(1, 0..1)).is_empty());
        let lost = Up::Lost { agent: 6, why: "x".into() };
        let out = step(&mut m, 4, Input::ChildFrame(lost.clone()));
        assert!(matches!(out.as_slice(), [Effect::Relay(b)] if b == &lost));
    }

    #[test]
    fn a_lost_child_is_reported_with_every_agent_it_relayed_for() {
        let mut m = Machine::new(0, 1, tree());
        step(&mut m, 0, Input::ChildOpened(2));
        let out = step(&mut m, 1, Input::ChildClosed { child: 2, agents: vec![2, 7], why: "reset".into() });
        let lost: Vec<u32> = out
            .iter()
            .filter_map(|e| match e {
                Effect::Up(Up::Lost { agent, .. }) => Some(*agent),
                _ => None,
            })
            .collect();
        assert_eq!(lost, [2, 7]);
        // After shutdown a child closing is the normal end, not a loss.
        step(&mut m, 2, Input::ChildOpened(3));
        step(
            &mut m,
            3,
            Input::Parent(Down { agent: 0, msg: ToAgent::Shutdown { stop: Stop::Finish, reason: String::new() } }),
        );
        let out = step(&mut m, 4, Input::ChildClosed { child: 3, agents: vec![3], why: "closed".into() });
        assert!(out.iter().all(|e| !matches!(e, Effect::Up(Up::Lost { .. }))));
    }

    /// Agent 0 with its child 2 connected, told to shut down, its own tasks all ended.
    fn finished_relay() -> Machine {
        let mut m = Machine::new(0, 1, tree());
        step(&mut m, 0, Input::ChildOpened(2));
        let shutdown = Down { agent: 0, msg: ToAgent::Shutdown { stop: Stop::Finish, reason: String::new() } };
        step(&mut m, 1, Input::Parent(shutdown));
        step(&mut m, 2, Input::ExecEnded);
        m
    }

    #[test]
    fn a_finished_relay_waits_for_its_children_but_not_forever() {
        let mut m = finished_relay();
        assert!(m.outcome().is_none(), "its child's last report still has to pass through");
        let out = step(&mut m, 3, Input::ChildFrame(Up::Lost { agent: 6, why: "x".into() }));
        assert!(matches!(out.as_slice(), [Effect::Relay(_)]));
        step(&mut m, 2 + CHILDREN_GRACE_US - 1, Input::Tick);
        assert!(m.outcome().is_none());
        let out = step(&mut m, 2 + CHILDREN_GRACE_US, Input::Tick);
        assert!(matches!(out.last(), Some(Effect::CloseUp)));
        assert_eq!(m.outcome(), Some(Ok(())));

        // A relay whose children all closed ends at once.
        let mut m = finished_relay();
        step(&mut m, 3, Input::ChildClosed { child: 2, agents: vec![2], why: "closed".into() });
        assert_eq!(m.outcome(), Some(Ok(())));
    }

    #[test]
    fn an_agent_reports_at_least_every_heartbeat_and_fences_itself_when_its_parent_falls_silent() {
        let live = Liveness::new(std::time::Duration::from_secs(10));
        let mut m = Machine::new(0, 1, tree()).with_liveness(live);
        step(&mut m, 0, Input::Tick);
        step(&mut m, 1, dispatch(0, 0..32));
        // Busy, nothing new: silent until a heartbeat is due, then an empty report.
        assert!(reports(&step(&mut m, 249_999, Input::Tick)).is_empty());
        let r = step(&mut m, 250_000, Input::Tick);
        assert_eq!(reports(&r).len(), 1, "a heartbeat: {r:?}");
        // A second without a word: nothing more starts until the parent speaks.
        let out = step(&mut m, 1_000_001, Input::Tick);
        assert!(out.iter().any(|e| matches!(e, Effect::Exec(Command::Hold(true)))), "{out:?}");
        assert!(!step(&mut m, 1_500_000, Input::Tick).iter().any(|e| matches!(e, Effect::Exec(Command::Hold(_)))));
        // The parent's heartbeats release the hold and keep the lease; past the lease without
        // one, the tasks are stopped.
        let out = step(&mut m, 4_000_000, down(0, ToAgent::Ack { seq: 0 }));
        assert!(out.iter().any(|e| matches!(e, Effect::Exec(Command::Hold(false)))), "{out:?}");
        let out = step(&mut m, 8_999_999, Input::Tick);
        assert!(!out.iter().any(|e| matches!(e, Effect::Exec(Command::Abort))));
        let out = step(&mut m, 9_000_000, Input::Tick);
        assert!(out.iter().any(|e| matches!(e, Effect::Exec(Command::Abort))), "{out:?}");
        assert!(reports(&out).is_empty(), "a fenced agent reports nothing more");
        step(&mut m, 9_000_001, Input::ExecEnded);
        let why = m.outcome().unwrap().unwrap_err();
        assert!(why.contains("no word from its parent for 5.0 s (lease expired)"), "{why}");
    }

    /// An agent stopped alone (SIGSTOP) past its lease reads, when it goes on, frames that
    /// waited in its socket, perhaps from before its parent gave it up. It cannot tell, so it
    /// holds its queue and asks (`stall`): a stale dispatch or heartbeat renews nothing and starts
    /// nothing; a parent that gave it up answers nothing, and the agent fences itself when the
    /// probe's time is up.
    #[test]
    fn an_agent_stopped_alone_past_its_lease_asks_its_parent_and_without_an_answer_fences_itself() {
        let live = Liveness::new(std::time::Duration::from_secs(10));
        let mut m = Machine::new(0, 1, tree()).with_liveness(live);
        step(&mut m, 0, Input::Tick);
        step(&mut m, 1, dispatch(0, 0..8));
        let out = step(&mut m, 20_000_000, dispatch(0, 8..16));
        assert!(out.iter().any(|e| matches!(e, Effect::Exec(Command::Hold(true)))), "{out:?}");
        assert!(!out.iter().any(|e| matches!(e, Effect::Exec(Command::Lease(_) | Command::Abort))), "{out:?}");
        assert_eq!(reports(&out).iter().map(|r| r.seq).collect::<Vec<_>>(), [1], "the probe goes at once");
        let beat = step(&mut m, 20_500_000, down(0, ToAgent::Ack { seq: 0 }));
        assert!(
            !beat.iter().any(|e| matches!(e, Effect::Exec(Command::Lease(_) | Command::Hold(false)))),
            "an older ack answers nothing: {beat:?}"
        );
        let mut now = 20_500_000;
        while now < 20_000_000 + PROBE_HOLDS * live.hold_us - 50_000 {
            now += 50_000;
            let out = step(&mut m, now, Input::Tick);
            assert!(!out.iter().any(|e| matches!(e, Effect::Exec(Command::Abort))), "at {now}: {out:?}");
        }
        let out = step(&mut m, 20_000_000 + PROBE_HOLDS * live.hold_us, Input::Tick);
        assert!(out.iter().any(|e| matches!(e, Effect::Exec(Command::Abort))), "{out:?}");
        step(&mut m, 22_000_001, Input::ExecEnded);
        let why = m.outcome().unwrap().unwrap_err();
        assert!(why.contains("stood still for 20.0 s, and its parent did not answer within 2.0 s after"), "{why}");
    }

    /// A whole job suspended (`scontrol suspend`, `PreemptMode=SUSPEND`): the parent stood still
    /// too, and answers the probe; the agent goes on with what it holds, nothing stopped. Standing
    /// still within the lease asks nothing: no parent can have given the agent up yet.
    #[test]
    fn an_agent_that_stood_still_with_its_parent_goes_on_when_its_probe_is_answered() {
        let live = Liveness::new(std::time::Duration::from_secs(10));
        let mut m = Machine::new(0, 1, tree()).with_liveness(live);
        step(&mut m, 0, Input::Tick);
        step(&mut m, 1, dispatch(0, 0..8));
        let short = step(&mut m, 3_000_000, Input::Tick);
        assert!(!short.iter().any(|e| matches!(e, Effect::Exec(Command::Abort))), "{short:?}");
        assert!(reports(&short).iter().all(|r| r.seq == 0), "no probe within the lease: {short:?}");
        step(&mut m, 3_000_001, down(0, ToAgent::Ack { seq: 0 }));
        let woke = step(&mut m, 30_000_000, Input::Tick);
        assert!(woke.iter().any(|e| matches!(e, Effect::Exec(Command::Hold(true)))), "{woke:?}");
        assert_eq!(reports(&woke).iter().map(|r| r.seq).collect::<Vec<_>>(), [1]);
        let answer = step(&mut m, 30_010_000, down(0, ToAgent::Ack { seq: 1 }));
        assert!(answer.iter().any(|e| matches!(e, Effect::Exec(Command::Hold(false)))), "{answer:?}");
        let renewed = 30_010_000 + live.hold_us;
        assert!(answer.iter().any(|e| matches!(e, Effect::Exec(Command::Lease(u)) if *u == renewed)), "{answer:?}");
        for now in (30_060_000..36_000_000).step_by(50_000) {
            let out = step(
                &mut m,
                now,
                if (now % 250_000) < 50_000 { down(0, ToAgent::Ack { seq: 1 }) } else { Input::Tick },
            );
            assert!(
                !out.iter().any(|e| matches!(e, Effect::Exec(Command::Abort | Command::Hold(true)))),
                "at {now}: {out:?}"
            );
        }
        assert_eq!(m.outcome(), None);
        assert!(m.holds(0) && m.holds(7), "what it held, it holds");
    }

    /// Issue 24, finding 4: a cut link stops the acks at once, while heartbeats take a second to
    /// be missed. Results unacknowledged for a heartbeat hold the queue even while heartbeats
    /// still arrive (a leader that commits slowly); the ack releases it.
    #[test]
    fn results_left_unacknowledged_for_a_heartbeat_hold_the_queue_until_acked() {
        let live = Liveness::new(std::time::Duration::from_secs(10));
        // Reporting at once: this is about acks, not the pace.
        let mut m = Machine::new(0, 1, tree()).with_liveness(live).with_report_gap(0);
        step(&mut m, 0, Input::Tick);
        step(&mut m, 1, dispatch(0, 0..32));
        assert_eq!(reports(&step(&mut m, 10, Input::Exec(vec![done(0)])))[0].seq, 1);
        let held =
            |out: &[Effect], on: bool| out.iter().any(|e| matches!(e, Effect::Exec(Command::Hold(h)) if *h == on));
        assert!(!held(&step(&mut m, 249_999, Input::Tick), true));
        assert!(held(&step(&mut m, 250_010, Input::Tick), true), "a heartbeat without the ack");
        let beat = down(0, ToAgent::Ack { seq: 0 });
        assert!(!held(&step(&mut m, 300_000, beat), false), "a heartbeat acknowledges nothing");
        let ack = down(0, ToAgent::Ack { seq: 1 });
        assert!(held(&step(&mut m, 310_000, ack), false));
        // Held again, then told to start nothing more (--max-fails): the ack that follows does
        // not undo that.
        step(&mut m, 320_000, Input::Exec(vec![done(1)]));
        step(&mut m, 330_000, Input::Tick);
        assert!(held(&step(&mut m, 600_000, Input::Tick), true));
        let stop = Down { agent: 0, msg: ToAgent::Shutdown { stop: Stop::Hold, reason: "max fails".into() } };
        assert!(held(&step(&mut m, 610_000, Input::Parent(stop)), true));
        let ack = down(0, ToAgent::Ack { seq: 2 });
        assert!(!held(&step(&mut m, 620_000, ack), false), "a Shutdown's hold is for good");
    }

    /// With revival, a fenced agent (or one the leader gave up) stops every task and drops its
    /// queue, says nothing of them, then comes back empty and asks for work afresh; if it cannot
    /// reach the leader it leaves as before.
    /// A member's parent is its instance head: when that link ends, the head (and what it held
    /// for the member) is gone, so the member stops its tasks and comes back to the leader
    /// empty; so does an agent whose link to the leader broke. One that relays for others
    /// leaves.
    #[test]
    fn an_agent_that_loses_its_parent_comes_back_empty_to_the_leader() {
        let instances = Arc::new(Tree::instances(4, 2, 2));
        let mut m = Machine::new(1, 1, instances.clone()).with_revive(true);
        step(&mut m, 0, Input::Tick);
        step(&mut m, 1, dispatch(1, 0..4));
        let out = step(&mut m, 2, Input::ParentEnded("connection closed".into()));
        assert!(out.iter().any(|e| matches!(e, Effect::Exec(Command::Reset))), "{out:?}");
        let out = step(&mut m, 3, Input::ExecReset);
        assert!(matches!(out.as_slice(), [Effect::Revive]), "{out:?}");
        let mut head = Machine::new(0, 1, instances.clone()).with_revive(true);
        step(&mut head, 0, Input::Tick);
        let out = step(&mut head, 1, Input::ParentEnded("connection closed".into()));
        assert!(out.iter().any(|e| matches!(e, Effect::Exec(Command::Reset))), "{out:?}");
        let mut relay = Machine::new(0, 1, instances).with_revive(true);
        step(&mut relay, 0, Input::ChildOpened(1));
        let out = step(&mut relay, 1, Input::ParentEnded("connection closed".into()));
        assert!(out.iter().any(|e| matches!(e, Effect::Exec(Command::Abort))), "{out:?}");
    }

    #[test]
    fn a_given_up_agent_stops_everything_and_comes_back_empty() {
        let live = Liveness::new(std::time::Duration::from_secs(10));
        let mut m = Machine::new(0, 1, tree()).with_liveness(live).with_revive(true);
        step(&mut m, 0, Input::Tick);
        step(&mut m, 1, dispatch(0, 0..32));
        step(&mut m, 2, Input::Exec(vec![done(0)]));
        let out = ticks_to(&mut m, 2, 5_000_002);
        assert!(out.iter().any(|e| matches!(e, Effect::Exec(Command::Reset))), "{out:?}");
        assert!(!out.iter().any(|e| matches!(e, Effect::Exec(Command::Abort))), "{out:?}");
        // What the reset kills is not reported, nor what ended before it.
        assert!(reports(&step(&mut m, 5_000_003, Input::Exec(vec![done(1)]))).is_empty());
        let out = step(&mut m, 5_000_004, Input::ExecReset);
        assert!(matches!(out.as_slice(), [Effect::Revive]), "{out:?}");
        assert!(m.outcome().is_none(), "still there");
        let out = step(&mut m, 5_000_005, Input::Rejoined);
        let r = reports(&out);
        assert_eq!(r.len(), 1, "{out:?}");
        assert!(r[0].results.is_empty() && r[0].started.is_empty());
        assert_eq!(r[0].want as u64, queue_target(1), "asks for a full queue again");
        // Given up by the leader again (a Shutdown that says so), and the leader is gone for good.
        let stop = Down { agent: 0, msg: ToAgent::Shutdown { stop: Stop::Revive, reason: "silent".into() } };
        let out = step(&mut m, 6_000_000, Input::Parent(stop));
        assert!(out.iter().any(|e| matches!(e, Effect::Exec(Command::Reset))), "{out:?}");
        step(&mut m, 6_000_001, Input::ExecReset);
        let out = step(&mut m, 7_000_000, Input::ReviveFailed("refused".into()));
        assert!(out.iter().any(|e| matches!(e, Effect::Exec(Command::Abort))), "{out:?}");
        step(&mut m, 7_000_001, Input::ExecEnded);
        let why = m.outcome().unwrap().unwrap_err();
        assert!(why.contains("could not rejoin the leader: refused"), "{why}");
    }

    #[test]
    fn a_joined_agent_whose_leader_goes_keeps_its_tasks_for_the_next_and_brings_those_below() {
        // Agent 0 of a joined allocation (its parent is the leader), relaying for agent 2.
        let live = Liveness::new(std::time::Duration::from_secs(10));
        let mut m = Machine::new(0, 1, tree()).with_liveness(live).with_revive(true).with_await_leader(true);
        step(&mut m, 0, Input::Tick);
        step(&mut m, 1, Input::ChildOpened(2));
        let hello = hello(2, 3, 0, 0);
        step(&mut m, 2, Input::ChildFrame(hello));
        step(&mut m, 3, dispatch(0, 0..5));
        // Task 4's result went to the old leader, which went before it acknowledged it.
        let mut out = step(&mut m, 4, Input::Exec(vec![done(4)]));
        out.extend(step(&mut m, 500_000, Input::Tick));
        assert!(reports(&out).iter().any(|r| r.results.len() == 1), "{out:?}");
        let out = step(&mut m, 500_001, Input::ParentEnded("connection closed".into()));
        assert!(out.iter().any(|e| matches!(e, Effect::AwaitLeader)), "{out:?}");
        assert!(out.iter().any(|e| matches!(e, Effect::Exec(Command::Hold(true)))), "{out:?}");
        assert!(!out.iter().any(|e| matches!(e, Effect::Exec(Command::Abort | Command::Reset))), "{out:?}");
        // Past the lease nothing is fenced: the leader that gave out these tasks is gone. What
        // ends meanwhile, and what comes from below, waits for the new leader; agent 2 hears
        // from this relay so that its own lease holds.
        let out = step(&mut m, 6_000_000, Input::Exec(vec![done(0)]));
        let report = Up::Report { agent: 2, report: Report { seq: 1, ..Default::default() } };
        let out2 = step(&mut m, 6_000_001, Input::ChildFrame(report));
        let out3 = step(&mut m, 6_000_002, Input::Tick);
        assert!(out.iter().chain(&out2).all(|e| !matches!(e, Effect::Up(_) | Effect::Exec(Command::Reset))));
        assert!(
            out3.iter().any(|e| matches!(e, Effect::Down { child: 2, msg: Down { msg: ToAgent::Ack { .. }, .. } })),
            "{out3:?}"
        );
        assert!(m.holds(1) && m.outcome().is_none());
        // The new leader: agent 2's Hello goes again (a hand-over), then what waited, and a report
        // with the result; asked, it says what it holds.
        let out = step(&mut m, 6_100_000, Input::Rejoined);
        let ups: Vec<&Up> = out
            .iter()
            .filter_map(|e| match e {
                Effect::Up(b) | Effect::Relay(b) => Some(b),
                _ => None,
            })
            .collect();
        assert!(matches!(ups[0], Up::Hello(h) if h.agent == 2 && h.came == Came::Handover), "{ups:?}");
        assert!(matches!(ups[1], Up::Report { agent: 2, .. }), "{ups:?}");
        let ids: Vec<u64> = reports(&out).iter().flat_map(|r| r.results.iter().map(|t| t.id)).collect();
        assert_eq!(ids, [4, 0], "what the old leader did not acknowledge comes again");
        let ack = Down { agent: 0, msg: ToAgent::Resync { seq: 0 } };
        let out = step(&mut m, 6_100_001, Input::Parent(ack));
        assert_eq!(reports(&out)[0].holding.as_deref(), Some(&[1, 2, 3][..]));
        // With no new leader in time it stops what it holds.
        let mut m = Machine::new(0, 1, tree()).with_revive(true).with_await_leader(true);
        step(&mut m, 0, Input::Tick);
        step(&mut m, 1, Input::ParentEnded("connection closed".into()));
        let out = step(&mut m, 2, Input::ReviveFailed("none within 60 s".into()));
        assert!(out.iter().any(|e| matches!(e, Effect::Exec(Command::Abort))), "{out:?}");
        // An agent below a relay does not wait: its relay is there, or it goes around it.
        let m = Machine::new(2, 1, tree()).with_await_leader(true);
        assert!(!m.can_await);
    }
}
