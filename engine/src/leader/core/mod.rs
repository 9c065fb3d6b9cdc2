//! The leader's scheduling core, without I/O: fed events (an agent joined, a report came, an
//! agent was lost, a signal) with the current time, it answers with effects (`leader::effect`:
//! messages for agents in the engine's own types, `msg`) and writes task records through
//! [`Tasks`]. It owns no socket, thread, clock or file, so scripted event sequences test it
//! (`tests.rs`) and the same core runs under every driver (the node's `leader/driver.rs`: the
//! LMDB transaction, group commits and the agents' channels; `htc simulate`).
//!
//! One state, split by concern: this file has the inputs, the state and `handle` (which routes
//! each input); `dispatch` hands out work, `results` records what agents report, `agents` their
//! joins, losses and rejoins, `returns` what comes back unstarted, `allocations` the run's
//! allocations, `handover` a run taken over, `preempt` stops low-priority work for high, `view`
//! what the core shows. Parts of the state that keep their own invariants are types of files
//! that use nothing of this one: `flights` (what each agent holds), `allocation` (one
//! allocation), `settling` (the wait of a hand-over), `nodes_back` (the nodes given back by `give_back`).
//!
//! A task costs the ledger one write, when its attempt ends: dispatch and start live in memory
//! (`in_flight`), since a leader that dies loses them anyway (the next session re-runs what was
//! not recorded finished), and the counts by state that `htc status` shows include them.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use htc_core::affinity::{Affinity, Route};
use htc_core::arrivals::Arrivals;
use htc_core::backfill::{self, Memory, Need};
use htc_core::hist::Summary;
use htc_core::idmap::{IdMap, IdSet};
use htc_core::partition::{Block, Partition};
use htc_core::task::{self, End, Life, Step};
use htc_core::tree::Tree;

use super::effect::{self, Effect, Effects};
use crate::live;
use crate::liveness::Liveness;
use crate::msg::{self, Came, Hello, Stop, ToAgent, Up};
use htc_core::record::{Attempt, Change, Ended, Outcome, Record};
use htc_core::task::{Counts, State};

mod adds;
mod agents;
pub mod allocation;
mod allocations;
mod asking;
mod cancel;
pub mod deps;
mod dispatch;
mod figures;
mod flights;
mod give_back;
mod handover;
mod nodes_back;
pub mod open;
mod preempt;
mod preemption;
mod results;
mod returns;
mod roster;
mod settling;
mod streak;
#[cfg(test)]
mod tests;
mod turnout;
mod view;

use allocation::{Allocation, Stage};
use asking::{Asking, Idle};
use deps::Deps;
use figures::Figures;
use flights::{Flight, Flights};
use preemption::Preemption;
use roster::{Agent, Agents};
use settling::Settling;
use turnout::Turnout;

/// Where task records live: the ledger's write transaction in a real run, a map in tests. Reads
/// see the writes made before them.
pub trait Tasks {
    /// The store's own failure; the core never makes one, it passes the first on and stops.
    type Error;
    fn get(&self, id: u64) -> Result<Option<Record>, Self::Error>;
    /// The records of `ids` that exist, in id order.
    fn range(&self, ids: std::ops::Range<u64>) -> Result<Vec<(u64, Record)>, Self::Error>;
    /// Applies one change the core decided; the core's only way to change the ledger.
    fn apply(&mut self, c: &Change) -> Result<(), Self::Error>;
    /// The task's command line.
    fn command(&self, r: &Record) -> Vec<u8>;
    /// The id the next added task gets: one past the highest.
    fn next_id(&self) -> Result<u64, Self::Error>;
    /// Adds a task under the next id, with its command, what it waits for and its key.
    fn add(&mut self, t: &NewTask) -> Result<(u64, Record), Self::Error>;
    /// The task added under `key`, if one was.
    fn keyed(&self, key: &[u8]) -> Result<Option<u64>, Self::Error>;
    /// The run's class names (`class=`), by number: 0 is `default`.
    fn classes(&self) -> Result<Vec<String>, Self::Error>;
    /// The run's class names, now with those that added tasks named first.
    fn set_classes(&mut self, names: &[String]) -> Result<(), Self::Error>;
}

/// What happens, as the core sees it.
#[derive(Debug)]
pub enum Input {
    Joined {
        agent: u32,
        cores: u32,
        mem_mb: u64,
        gpus: u32,
        hostname: String,
    },
    Report {
        agent: u32,
        report: msg::Report,
    },
    Lost {
        agent: u32,
        why: String,
    },
    /// An agent whose relay was lost reconnected directly, with the agents it relays for.
    /// An agent given up (hung, cut off) came back, having stopped everything it held: a new
    /// member from here on.
    Revived {
        agent: u32,
        cores: u32,
        mem_mb: u64,
        gpus: u32,
        hostname: String,
    },
    Rejoined {
        agent: u32,
        below: Vec<u32>,
    },
    /// An agent whose leader was lost came to this one, which took the run over, with the tasks
    /// it kept (`handover`).
    HandedOver {
        agent: u32,
        cores: u32,
        mem_mb: u64,
        gpus: u32,
        hostname: String,
    },
    /// An agent's relay was lost: it may rejoin within its lease, or fall silent and be lost.
    Detached {
        agent: u32,
    },
    /// An agent process ended before it ever joined (local launcher), or could not be started.
    NeverJoined {
        agent: u32,
        why: String,
    },
    /// An agent's process exited badly (the srun step says so), `why` naming its node and its
    /// last words.
    AgentExited {
        agent: u32,
        why: String,
    },
    Interrupt {
        signal: i32,
    },
    /// Stopped by a signal, and Slurm ends the job `grace_us` from now (a preemption's
    /// `GraceTime`): the run finishes what runs and starts nothing more until then.
    Grace {
        signal: i32,
        grace_us: u64,
    },
    /// Time passed: heartbeats are due, silent agents are given up.
    Tick,
    /// A user cancelled these tasks.
    Cancel {
        ids: Vec<u64>,
    },
    /// A client adds tasks to an open run; the answer is `Effect::Added` with `request`.
    Add {
        request: u64,
        tasks: Vec<open::NewTask>,
    },
    /// `htc close`: the open run takes no more tasks; with `cancel`, what it holds is cancelled.
    Close {
        cancel: bool,
    },
}

pub use open::{Answer, NewTask};

/// What a Hello tells the core, by why the agent came: the one reading, for every driver.
impl From<Hello> for Input {
    fn from(h: Hello) -> Input {
        let Hello { agent, cores, mem_mb, gpus, hostname, came } = h;
        match came {
            Came::New => Input::Joined { agent, cores, mem_mb, gpus, hostname },
            Came::Rejoin { below } => Input::Rejoined { agent, below },
            Came::Fresh => Input::Revived { agent, cores, mem_mb, gpus, hostname },
            Came::Handover => Input::HandedOver { agent, cores, mem_mb, gpus, hostname },
        }
    }
}

/// What an agent's word tells the core: the one reading, for every driver.
impl From<Up> for Input {
    fn from(up: Up) -> Input {
        match up {
            Up::Hello(h) => Input::from(h),
            Up::Report { agent, report } => Input::Report { agent, report },
            Up::Lost { agent, why } => Input::Lost { agent, why },
        }
    }
}

/// How often agents are asked what they hold (`Core::audit`), in units of the loss bound
/// (`lost_after_s`): every minute by default.
pub const AUDIT_EVERY_LOST_AFTER: u64 = 6;

pub use streak::BLACK_HOLE_STREAK;

pub use give_back::OPEN_IDLE_US;
pub use preemption::MAX_PREEMPTIONS;

/// Hinted work per core an agent may hold before it gets only what it can start (`with_horizon`).
pub const HORIZON_MS: u64 = 1_000;

#[derive(Debug, Clone, Copy, Default)]
pub struct Progress {
    pub counts: Counts,
    pub elapsed: std::time::Duration,
    /// Tasks finished (done or failed) in this session, for the rate.
    pub finished_this_session: u64,
    pub agents: usize,
    /// Pending tasks that wait for others.
    pub blocked: u64,
    /// Allocations that joined the run and still run: should the leader's own end, one of them
    /// takes the run over (no resubmission).
    pub joined_running: usize,
}

/// How long before the end of a grace (`Input::Grace`) the run stops what still runs.
pub const GRACE_MARGIN_US: u64 = 2_000_000;

#[derive(Debug, PartialEq, Eq)]
pub enum Ending {
    /// Every task is done or failed.
    Complete,
    /// Stopped by a signal; the run can be resumed.
    Interrupted(i32),
    /// Preempted with a grace (`Input::Grace`), which it used: what ran in it finished, nothing
    /// more started; the run can be resumed, and `--htc-resubmit` continues it.
    Preempted(i32),
    /// No agent is left to run the remaining tasks.
    AgentsLost(String),
    /// `--max-fails`: this many tasks failed for good, so nothing more was started and the
    /// run stopped once what was running ended; it can be resumed.
    TooManyFailures(u64),
    /// What is left (this many tasks) cannot finish before the time limit, by their runtime
    /// hints; it waits for a resume.
    OutOfTime(u64),
    /// An agent could not start on its node (why): the node is broken, and the run stops until
    /// it is fixed; it can be resumed then.
    AgentNotStarted(String),
}

pub struct Core<'a> {
    /// The plan of the tasks the run started with, and what arrived since (`Arrivals`).
    partition: Arrivals<'a>,
    /// Which tasks wait for which (`deps`).
    deps: Deps,
    /// An open run's state (`adds`); `None`: the run's tasks are those it started with.
    open: Option<open::Openness>,
    /// Answers to adds, held until their tasks are committed (`acks`).
    answers: Effects,
    /// Who came, who never did, the last loss (`turnout`).
    turnout: Turnout,
    job_id: String,
    agents: Agents,
    retry: VecDeque<u64>,
    /// Ids joined `retry` since agents other than the reporting one were last offered them.
    fresh_retries: bool,
    /// Tasks arrived since agents were last all offered work (added, or ready now that what
    /// they waited for ended): an idle agent with credit takes them at once, not at its next
    /// report.
    fresh_arrivals: bool,
    /// Asking queued work back for idle slots at the tail (`asking`).
    asking: Asking,
    /// What this session has to show (`figures`).
    figures: Figures,
    in_flight: Flights,
    counts: Counts,
    horizon_ms: Option<u64>,
    /// Who heads which instance; without it every agent is an instance of its own.
    layout: Option<Arc<Tree>>,
    /// Fail fast: stop starting tasks once this many failed for good in this session.
    max_fails: Option<u64>,
    /// The time limit (the Slurm job's end, `--time-limit`): a task whose runtime hint would
    /// not end before it is set aside for the next session.
    deadline_us: Option<u64>,
    late: IdSet<u64>,
    /// The time of the input being handled.
    now_us: u64,
    /// The agents were told to start nothing more (`max_fails` reached, or a grace).
    told_to_hold: bool,
    /// Signalled with a grace (`Input::Grace`): the signal, and when the run ends at the latest.
    grace: Option<(i32, u64)>,
    /// An agent said it was signalled, and the driver was asked about a grace (`Effect::Signalled`).
    asked_grace: bool,
    /// Rejoined agents asked to resync, with the tasks they held when asked: those they do not
    /// list in their answer were lost on the way with the relay.
    resyncs: IdMap<u32, Vec<u64>>,
    live: Liveness,
    /// When every agent was last asked what it holds (`audit`).
    audit_us: u64,
    /// When time last passed (`Input::Tick`, every 100 ms from the driver): a longer gap is the
    /// leader's own stall, not its agents' silence.
    ticked_us: u64,
    /// Memory committed on each agent, tasks waiting for it, reservations (`backfill`).
    mem: Memory,
    /// Which agent each `affinity=` key runs on, and the tasks handed to each (`affinity`).
    affinity: Affinity,
    /// Tasks were handed to other agents' affinity queues since agents were last all offered
    /// work: an idle one may take them.
    fresh_handoffs: bool,
    /// Preemptible tasks in flight, those being stopped, those to run again (`preemption`).
    preemption: Preemption,
    /// Instances never take from another's share (`--no-steal`, for measuring what moving
    /// work from a loaded instance to an idle one gains), nor ask queued tasks back.
    no_steal: bool,
    /// The allocations that joined the run (`attach`), in the order they came.
    allocations: Vec<Allocation>,
    /// This session took the run over: the wait for the agents that kept their tasks.
    settling: Option<Settling>,
    /// What the last session's agents journaled of the attempts they started and had not
    /// ended, by task id: interrupted once the wait is over, unless an agent brought them.
    awaiting: Vec<htc_core::salvage::Told>,
    /// Agents that came from a hand-over: what they hold or ran may be pending here.
    adoptees: IdSet<u32>,
    /// Those of them from other allocations than this leader's own, each an instance of its own
    /// until their launcher attaches again (`keep_ids`).
    strays: IdSet<u32>,
    /// Nodes of the run's own allocation given back at its tail (`give_back`).
    give_back: nodes_back::GiveBack,
}

impl<'a> Core<'a> {
    /// A core for a run whose tasks stand at `counts`, starting at `now_us`.
    pub fn new(
        partition: Box<dyn Partition + 'a>,
        job_id: String,
        expected_agents: usize,
        counts: Counts,
        now_us: u64,
    ) -> Core<'a> {
        Core {
            partition: Arrivals::new(partition),
            deps: Deps::default(),
            open: None,
            answers: Vec::new(),
            turnout: Turnout::expecting(expected_agents),
            job_id,
            agents: Agents::default(),
            retry: VecDeque::new(),
            fresh_retries: false,
            fresh_arrivals: false,
            in_flight: Flights::new(counts.total()),
            counts,
            horizon_ms: None,
            layout: None,
            live: Liveness::default(),
            audit_us: now_us,
            ticked_us: now_us,
            max_fails: None,
            deadline_us: None,
            late: Default::default(),
            now_us,
            told_to_hold: false,
            grace: None,
            asked_grace: false,
            resyncs: IdMap::default(),
            mem: Memory::new(backfill::Policy::default()),
            affinity: Affinity::expecting(0..expected_agents as u32),
            fresh_handoffs: false,
            preemption: Preemption::default(),
            asking: Asking::default(),
            figures: Figures::new(now_us, &counts),
            no_steal: false,
            allocations: Vec::new(),
            settling: None,
            awaiting: Vec::new(),
            adoptees: IdSet::default(),
            strays: IdSet::default(),
            give_back: Default::default(),
        }
    }

    /// How memory decides what starts (`--mem-policy`).
    pub fn with_memory_policy(mut self, policy: backfill::Policy) -> Self {
        self.mem.set_policy(policy);
        self
    }

    /// No instance takes from another's share: each runs its own and no more.
    pub fn without_stealing(mut self) -> Self {
        self.no_steal = true;
        self
    }

    /// The run has exclusive tasks: every task is committed on its agent, so that an agent is
    /// known empty (`backfill`).
    pub fn with_exclusive_tasks(mut self) -> Self {
        self.mem = std::mem::take(&mut self.mem).with_whole_nodes();
        self
    }

    /// Fail fast (`--max-fails N`): once `n` tasks failed for good in this session, nothing more
    /// starts, and the run ends when what runs has ended.
    pub fn with_max_fails(mut self, n: u64) -> Self {
        self.max_fails = Some(n.max(1));
        self
    }

    /// Starts no task whose runtime hint would not end by `end_us`.
    pub fn with_deadline(mut self, end_us: u64) -> Self {
        self.deadline_us = Some(end_us);
        self
    }

    /// Heartbeats and the bound on silent agents (`liveness`).
    pub fn with_liveness(mut self, live: Liveness) -> Self {
        self.live = live;
        self
    }

    /// Agents grouped into instances: only heads deal with the leader, each stands for its
    /// instance's index in the partition, and `expected_agents` counts instances.
    pub fn with_layout(mut self, tree: Arc<Tree>) -> Self {
        self.affinity = Affinity::expecting(tree.heads().iter().copied());
        self.layout = Some(tree);
        self
    }

    /// Past `ms` of hinted work per core in flight on an agent, it gets only what it can start
    /// now, so that the rest stays in the partition for whoever frees a core first (a queue of
    /// long tasks behind a busy agent's cores is the tail of the run). For files with runtime
    /// hints; without, prefetch is unbounded (zero-length tasks need it).
    pub fn with_horizon(mut self, ms: u64) -> Self {
        self.horizon_ms = Some(ms);
        self
    }

    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// Tasks finished before this session started.
    pub fn finished_start(&self) -> u64 {
        self.figures.finished_start()
    }

    /// Whether the run is over without an event: every task finished, or no agent left.
    pub fn ending(&self) -> Option<Ending> {
        if self.stays_open() {
            return None;
        }
        if self.counts.unfinished() == 0 {
            return Some(Ending::Complete);
        }
        let in_flight = self.counts.get(State::Dispatched) + self.counts.get(State::Running);
        if let Some((signal, until_us)) = self.grace {
            if self.own_in_flight() == 0 || self.now_us >= until_us {
                return Some(Ending::Preempted(signal));
            }
        }
        if let Some(failed) = self.failed_too_often().filter(|_| in_flight == 0) {
            return Some(Ending::TooManyFailures(failed));
        }
        if !self.late.is_empty() && in_flight == 0 && self.counts.unfinished() == self.late.len() as u64 {
            return Some(Ending::OutOfTime(self.late.len() as u64));
        }
        // An agent given up may come back empty (a hung node that runs again, a leader that was
        // stopped itself): the run waits one loss bound for that before it gives up.
        let alive = self.agents.values().filter(|a| a.alive).count();
        let why = self.turnout.given_up(alive, self.now_us, self.live.lost_after_us, self.counts.unfinished());
        why.map(Ending::AgentsLost)
    }

    /// A signal, and Slurm's end of the job `grace_us` away: every agent finishes what runs,
    /// starts nothing more, and gives back its queue, until `GRACE_MARGIN_US` before that end
    /// (time to record the last results and stop); what ends within it is recorded. A grace too
    /// short for that is none.
    fn use_grace(&mut self, signal: i32, grace_us: u64, out: &mut Effects) -> Option<Ending> {
        if grace_us < 2 * GRACE_MARGIN_US {
            return Some(Ending::Preempted(signal));
        }
        if self.grace.is_some() {
            return None;
        }
        let secs = grace_us / 1_000_000;
        tracing::warn!(job = %self.job_id, signal, grace_s = secs, "signalled with a grace: finishing what runs, starting nothing more");
        self.grace = Some((signal, self.now_us + grace_us - GRACE_MARGIN_US));
        self.told_to_hold = true;
        let reason = format!("the job ends in {secs} s (signal {signal}, with a grace): finishing what runs");
        // Joined allocations are not preempted with it: their agents go on, and one of them
        // takes the run over when this session ends (`handover`).
        let own: Vec<u32> = self
            .agents
            .iter()
            .filter(|(&id, a)| a.alive && self.allocation_of(id).is_none())
            .map(|(&id, _)| id)
            .collect();
        for agent in own {
            out.push(Effect::stop(agent, Stop::Hold, reason.clone()));
        }
        None
    }

    /// Tasks in flight with the agents of the leader's own job (not of joined allocations).
    fn own_in_flight(&self) -> usize {
        self.agents
            .iter()
            .filter(|(&id, a)| a.alive && self.allocation_of(id).is_none())
            .map(|(&id, _)| self.in_flight.of_agent(id).len())
            .sum()
    }

    /// A Shutdown for every live agent; but a leader stopped by a signal (its job's time
    /// limit, `scancel`) leaves the agents of joined allocations that still run alone: they wait
    /// with their tasks for the job that takes the run over (`handover`).
    pub fn shutdown(&self, ending: &Ending, out: &mut Effects) {
        let reason = match ending {
            Ending::Complete => "all tasks finished".to_string(),
            Ending::Interrupted(s) => format!("leader got signal {s}"),
            Ending::Preempted(s) => format!("preempted (signal {s}); its grace is over"),
            Ending::AgentsLost(w) => w.clone(),
            Ending::TooManyFailures(n) => format!("{n} tasks failed (--max-fails)"),
            Ending::OutOfTime(n) => format!("{n} tasks cannot finish before the time limit"),
            Ending::AgentNotStarted(why) => why.clone(),
        };
        let stop = if *ending == Ending::Complete { Stop::Finish } else { Stop::Abort };
        let handed_over = |agent: u32| {
            matches!(ending, Ending::Interrupted(_) | Ending::Preempted(_))
                && self.allocation_of(agent).is_some_and(|i| self.allocations[i].stage == Stage::Running)
        };
        for (&agent, _) in self.agents.iter().filter(|(&id, a)| a.alive && !handed_over(id)) {
            out.push(Effect::stop(agent, stop, reason.clone()));
        }
    }

    pub fn all_agents_gone(&self) -> bool {
        self.turnout.all_gone(self.agents.values().filter(|a| a.alive).count())
    }

    /// Acks every report received so far, and answers the adds: call after the ledger writes
    /// of those reports and adds are committed, never before.
    pub fn acks(&mut self, out: &mut Effects) {
        out.append(&mut self.answers);
        for (id, seq) in self.agents.acks_due(self.now_us) {
            out.push(Effect::ToAgent(id, ToAgent::Ack { seq }));
        }
    }

    /// Feeds one event; what it causes is appended to `out`. `Some` ends the run.
    pub fn handle<E>(
        &mut self,
        now_us: u64,
        t: &mut dyn Tasks<Error = E>,
        ev: Input,
        out: &mut Effects,
    ) -> Result<Option<Ending>, E> {
        self.now_us = now_us;
        match ev {
            Input::Joined { agent, cores, mem_mb, gpus, hostname } => {
                self.joined(agent, (cores, mem_mb, gpus), hostname)
            }
            Input::Report { agent, report } => self.on_report(t, agent, report, out)?,
            Input::Lost { agent, why } => self.lose(t, agent, &why, now_us, out)?,
            Input::Rejoined { agent, below } => self.rejoined(agent, below, now_us, out),
            Input::HandedOver { agent, cores, mem_mb, gpus, hostname } => {
                self.handed_over(agent, (cores, mem_mb, gpus), hostname, out)
            }
            Input::Revived { agent, cores, mem_mb, gpus, hostname } => {
                self.revived(t, agent, (cores, mem_mb, gpus), hostname, now_us, out)?
            }
            Input::Detached { agent } => {
                if let Some(a) = self.agents.get(&agent).filter(|a| a.alive) {
                    tracing::warn!(job = %self.job_id, agent, host = %a.hostname, "cut off with its relay; waiting for it to rejoin");
                }
            }
            Input::Tick => self.tick(t, now_us, out)?,
            Input::NeverJoined { agent, why } => self.never_joined(agent, &why),
            Input::AgentExited { agent, why } => {
                if let Some(ending) = self.agent_exited(agent, why) {
                    return Ok(Some(ending));
                }
            }
            Input::Interrupt { signal } => return Ok(Some(Ending::Interrupted(signal))),
            Input::Grace { signal, grace_us } => return Ok(self.use_grace(signal, grace_us, out)),
            Input::Cancel { ids } => {
                self.cancel(t, &ids, out)?;
            }
            Input::Add { request, tasks } => self.add(t, request, tasks, out)?,
            Input::Close { cancel } => self.close(t, cancel, out)?,
        }
        self.note_busy();
        if self.fresh_arrivals {
            self.dispatch_all(t, out)?;
        }
        if self.asking.pending() && self.may_ask_back() {
            self.ask_back(out);
        }
        Ok(None)
    }

    /// Agents silent past the bound are lost, and told to stop should they resume (a hung agent
    /// reads it when it runs again; its lease has run out by then anyway). Every live agent hears
    /// from the leader at least as often as it reports (`Liveness::beat_every_us`): the ack of
    /// its last report, or else an Ack of what was already acknowledged. Under load the acks
    /// alone do it (16 one-slot agents were sent as many heartbeats as acks).
    fn tick<E>(&mut self, t: &mut dyn Tasks<Error = E>, now_us: u64, out: &mut Effects) -> Result<(), E> {
        self.excuse_own_stall(now_us);
        let silent = self.agents.silent(now_us, self.live.lost_after_us);
        for (agent, quiet_us) in silent {
            let why = format!("silent for {:.1} s", quiet_us as f64 / 1e6);
            self.lose(t, agent, &why, now_us, out)?;
            effect::give_up(out, agent, why);
        }
        if now_us.saturating_sub(self.audit_us) >= AUDIT_EVERY_LOST_AFTER * self.live.lost_after_us {
            self.audit_us = now_us;
            self.audit(out);
        }
        self.preempt_for_waiting(t, out)?;
        self.leave_due(t, out)?;
        self.settle(t, out)?;
        self.give_back_idle(out);
        let every = self.live.beat_every_us(self.reporters());
        for (agent, seq) in self.agents.heartbeats_due(now_us, every) {
            out.push(Effect::ToAgent(agent, ToAgent::Ack { seq }));
        }
        Ok(())
    }
}
