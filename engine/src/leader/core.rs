//! The leader's scheduling core, without I/O: fed events (an agent joined, a report came, an
//! agent was lost, a signal) with the current time, it answers with frames to send to agents and
//! writes task records through [`Tasks`]. It owns no socket, thread, clock or file, so scripted
//! event sequences test it (below) and the same core runs under every driver (`driver.rs`:
//! the LMDB transaction, group commits and the agents' channels).
//!
//! A task costs the ledger one write, when its attempt ends: dispatch and start live in memory
//! (`in_flight`), since a leader that dies loses them anyway (the next session re-runs what was
//! not recorded finished), and the counts by state that `htc status` shows include them.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use htc_core::affinity::{Affinity, Route};
use htc_core::backfill::{self, Memory, Need};
use htc_core::hist::{Hist, Summary};
use htc_core::idmap::{IdMap, IdSet};
use htc_core::partition::{Block, Partition};
use htc_core::recall::{self, Recalls};
use htc_core::task::{self, Effect, End, Life, Step};
use htc_core::tree::Tree;

use crate::live;
use crate::liveness::Liveness;
use crate::proto::{self, frame::Body};
use htc_core::record::{Attempt, Outcome, Record};
use htc_core::task::{Counts, State};

/// Where task records live: the ledger's write transaction in a real run, a map in tests. Reads
/// see the writes made before them.
pub trait Tasks {
    /// The store's own failure; the core never makes one, it passes the first on and stops.
    type Error;
    fn get(&self, id: u64) -> Result<Option<Record>, Self::Error>;
    /// The records of `ids` that exist, in id order.
    fn range(&self, ids: std::ops::Range<u64>) -> Result<Vec<(u64, Record)>, Self::Error>;
    fn put(&mut self, id: u64, r: &Record) -> Result<(), Self::Error>;
    /// Appends an attempt that did not end the task to its history.
    fn put_attempt(&mut self, id: u64, a: &Attempt) -> Result<(), Self::Error>;
    /// Adds the task to the index of failed tasks.
    fn mark_failed(&mut self, id: u64) -> Result<(), Self::Error>;
    /// Takes the task out of that index.
    fn unmark_failed(&mut self, id: u64) -> Result<(), Self::Error>;
    /// The task's command line.
    fn command(&self, r: &Record) -> Vec<u8>;
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
        report: proto::Report,
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
    /// An agent's relay was lost: it may rejoin within its lease, or fall silent and be lost.
    Detached {
        agent: u32,
    },
    /// An agent process ended before it ever joined (local launcher), or could not be started.
    NeverJoined {
        agent: u32,
        why: String,
    },
    Interrupt {
        signal: i32,
    },
    /// Time passed: heartbeats are due, silent agents are given up.
    Tick,
}

/// How often agents are asked what they hold (`Core::audit`), in units of the loss bound
/// (`lost_after_s`): every minute by default.
pub const AUDIT_EVERY_LOST_AFTER: u64 = 6;

/// Failures in a row on one agent, while as many tasks succeed elsewhere, that make it a black
/// hole (drained).
pub const BLACK_HOLE_STREAK: usize = 8;

/// Times the leader stops one task for higher-priority work in a session; after that it runs to
/// its end (what waits may need another agent than the one it is on).
pub const MAX_PREEMPTIONS: u8 = 3;

/// Queued tasks an idle slot gets at most with the one it starts, when work is asked back: each
/// moved task costs the leader a recall, a return and a dispatch, so the tail's queues are not
/// moved wholesale (an even share of queues a thousand long moved most of an `--exec none` run's
/// tail); with eight a slot, an idle slot's tail takes an eighth of the round trips.
const RECALL_SHARE_MAX: u64 = 7;

/// How often at most the leader looks for queued work to ask back for idle slots (`ask_back`),
/// per agent it looks at: so that doing so costs a bounded share of its time however many
/// there are (10 ms with a thousand), and a few agents are asked at once.
const ASK_EVERY_US_PER_AGENT: u64 = 10;

/// Hinted work per core an agent may hold before it gets only what it can start (`with_horizon`).
pub const HORIZON_MS: u64 = 1_000;

/// Frames for agents, in the order they must be sent.
pub type Outbox = Vec<(u32, Body)>;

/// One agent's dispatch in the making: how many more it may take, and what it takes.
struct Batch {
    agent: u32,
    want: u64,
    specs: Vec<proto::TaskSpec>,
}

/// Where `Core::start` put a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placed {
    Taken,
    /// It fits the agent but may not start there yet: it waits for memory.
    Waits,
    /// It does not fit the agent (cores, GPUs or memory it has not).
    Unfit,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Progress {
    pub counts: Counts,
    pub elapsed: std::time::Duration,
    /// Tasks finished (done or failed) in this session, for the rate.
    pub finished_this_session: u64,
    pub agents: usize,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Ending {
    /// Every task is done or failed.
    Complete,
    /// Stopped by a signal; the run can be resumed.
    Interrupted(i32),
    /// No agent is left to run the remaining tasks.
    AgentsLost(String),
    /// `--max-fails`: this many tasks failed for good, so nothing more was started and the
    /// run stopped once what was running ended; it can be resumed.
    TooManyFailures(u64),
    /// What is left (this many tasks) cannot finish before the time limit, by their runtime
    /// hints; it waits for a resume.
    OutOfTime(u64),
}

struct Agent {
    /// The partition's index of the agent's instance.
    instance: usize,
    /// Slots of its instance (all its members').
    cores: u32,
    /// The most memory, GPUs and cores one task may have on it (its largest member's).
    mem_mb: u64,
    gpus: u32,
    widest: u32,
    credit: u64,
    /// Slots the agent last said it had nothing for, less what was sent since.
    idle: u64,
    /// Core-milliseconds of runtime hints of the tasks it holds (running or queued).
    ahead_ms: u64,
    last_seq: u64,
    acked_seq: u64,
    /// When it was last sent an Ack (of a report, or a heartbeat): what keeps it from holding.
    told_us: u64,
    alive: bool,
    hostname: String,
    /// When it was last heard from (joined or reported).
    heard_us: u64,
    /// Tasks that failed on it in a row since its last success, and the job's successes when
    /// that began: a black hole fails everything while the others succeed.
    streak: Vec<u64>,
    oks_before_streak: u64,
    /// Found to be a black hole: it gets nothing more.
    drained: bool,
    /// Its slots running a task, as it last reported (for the live view).
    busy: u32,
    /// Attempts it ended: successes, and failures (retried or not).
    done: u64,
    failed: u64,
}

pub struct Core<'a> {
    partition: Box<dyn Partition + 'a>,
    /// Agents the launcher started; the run fails when all of them are gone with work left.
    expected_agents: usize,
    job_id: String,
    agents: IdMap<u32, Agent>,
    ever_seen: usize,
    never_joined: usize,
    retry: VecDeque<u64>,
    /// Ids joined `retry` since agents other than the reporting one were last offered them.
    fresh_retries: bool,
    /// Offers of work to every agent with credit (`dispatch_all`), for tests.
    scans: u64,
    /// When queued work was last asked back for idle slots (`ask_back`), and whether an ask
    /// was put off since.
    last_ask_us: Option<u64>,
    ask_pending: bool,
    /// Queued tasks per slot, across the agents, when work was last asked back (at most
    /// `RECALL_SHARE_MAX`): an idle slot gets one to start and this many more, so the queues
    /// even out in a few rounds, not one task per round trip (16 one-slot agents at the tail of
    /// tiny tasks reported about once per task).
    recall_share: u64,
    /// Results per report, for `htc status` (what the leader's cost per task depends on).
    report_sizes: Hist,
    /// How long after its end each result reached the leader, in microseconds.
    result_delays: Hist,
    in_flight: Flights,
    counts: Counts,
    finished_start: u64,
    /// Tasks failed before this session started.
    failed_start: u64,
    started_us: u64,
    horizon_ms: Option<u64>,
    /// Who heads which instance; without it every agent is an instance of its own.
    layout: Option<Arc<Tree>>,
    /// Fail fast: stop starting tasks once this many failed for good in this session.
    max_fails: Option<u64>,
    /// Tasks that succeeded in this session (black holes are judged against them).
    oks: u64,
    /// The time limit (the Slurm job's end, `--time-limit`): a task whose runtime hint would
    /// not end before it is set aside for the next session.
    deadline_us: Option<u64>,
    late: IdSet<u64>,
    /// The time of the input being handled.
    now_us: u64,
    /// The agents were told to start nothing more (`max_fails` reached).
    told_to_hold: bool,
    /// Why the last agent lost unexpectedly went (with its id and host), for the final message.
    last_loss: Option<String>,
    /// When an agent was last given up: for a while after, it may come back (`revived`).
    lost_at_us: u64,
    /// Rejoined agents asked to resync, with the tasks they held when asked: those they do not
    /// list in their answer were lost on the way with the relay.
    resyncs: IdMap<u32, Vec<u64>>,
    live: Liveness,
    /// When every agent was last asked what it holds (`audit`).
    audit_us: u64,
    /// When time last passed (`Input::Tick`, every 100 ms from the driver): a longer gap is the
    /// leader's own stall, not its agents' silence.
    ticked_us: u64,
    /// Tasks given back unstarted by a lost agent (or a head for a lost member), and how often:
    /// the agent may have started them after all, so their next dispatch is a new attempt
    /// number without counting as a loss.
    returned: IdMap<u64, u32>,
    /// The latest failed attempts, newest last, for the live view.
    recent_failures: VecDeque<live::Failure>,
    /// Memory committed on each agent, tasks waiting for it, reservations (`backfill`).
    mem: Memory,
    /// Which agent each `affinity=` key runs on, and the tasks handed to each (`affinity`).
    affinity: Affinity,
    /// Tasks were handed to other agents' affinity queues since agents were last all offered
    /// work: an idle one may take them.
    fresh_handoffs: bool,
    /// Preemptible tasks in flight, lowest priority and then newest first (the first to stop
    /// for higher-priority work), with the priority of each; those told to stop.
    preemptible: BTreeSet<(i16, std::cmp::Reverse<u64>)>,
    preemptible_of: IdMap<u64, i16>,
    preempting: IdSet<u64>,
    /// How often the leader stopped each task in this session (`MAX_PREEMPTIONS`).
    times_preempted: IdMap<u64, u8>,
    /// Tasks being preempted to make room for a task waiting for memory or GPUs: which one.
    preempted_for: IdMap<u64, u64>,
    /// Preempted tasks, to run again once no higher-priority work waits.
    preempted: VecDeque<u64>,
    /// Instances never take from another's share (`--no-steal`, for measuring what moving
    /// work from a loaded instance to an idle one gains), nor ask queued tasks back.
    no_steal: bool,
    /// Queued tasks asked back from agents that are behind, for agents that sit idle.
    recalls: Recalls,
}

/// How an attempt ended, as reported (or decided, for a lost agent).
struct Ended {
    outcome: Outcome,
    value: i32,
    start_us: u64,
    end_us: u64,
    /// The agent that ran it (a member of the reporting head's instance, or the head).
    ran_on: u32,
}

/// An attempt out at an agent: its life as `task::step` moved it (dispatched, then running),
/// while the ledger still holds the task as it was before the attempt.
#[derive(Debug, Clone, Copy)]
struct Flight {
    agent: u32,
    life: Life,
}

/// The attempts in flight, indexed by task id: 8 bytes a task, and a batch's ids sit side by
/// side in memory. (A hash map here cost a cache miss per result: most of the leader's time.)
struct Flights {
    by_id: Vec<Flight>,
    /// Per agent: tasks held, and the highest id handed to it since it last held none (where a
    /// scan for its queued tasks starts: `unstarted_of`).
    per_agent: IdMap<u32, (u64, u64)>,
}

impl Flights {
    const FREE: Flight = Flight { agent: u32::MAX, life: Life { state: 0, attempts: 0, retries: 0, losses: 0 } };

    fn new(ids: u64) -> Flights {
        Flights { by_id: vec![Flights::FREE; ids as usize + 1], per_agent: IdMap::default() }
    }

    fn get(&self, id: u64) -> Option<Flight> {
        self.by_id.get(id as usize).copied().filter(|f| f.agent != u32::MAX)
    }

    fn contains(&self, id: u64) -> bool {
        self.get(id).is_some()
    }

    fn set_life(&mut self, id: u64, life: Life) {
        if let Some(f) = self.by_id.get_mut(id as usize).filter(|f| f.agent != u32::MAX) {
            f.life = life;
        }
    }

    fn insert(&mut self, id: u64, f: Flight) {
        if id as usize >= self.by_id.len() {
            self.by_id.resize(id as usize + 1, Flights::FREE);
        }
        let old = std::mem::replace(&mut self.by_id[id as usize], f);
        if old.agent != u32::MAX {
            self.leave(old.agent);
        }
        let (n, top) = self.per_agent.entry(f.agent).or_default();
        *n += 1;
        *top = (*top).max(id);
    }

    fn remove(&mut self, id: u64) -> Option<Flight> {
        let f = self.get(id)?;
        self.by_id[id as usize] = Flights::FREE;
        self.leave(f.agent);
        Some(f)
    }

    fn leave(&mut self, agent: u32) {
        if let Some((n, _)) = self.per_agent.get_mut(&agent) {
            *n -= 1;
            if *n == 0 {
                self.per_agent.remove(&agent);
            }
        }
    }

    /// How many tasks an agent holds (sent to it and not finished, in transit included).
    fn held(&self, agent: u32) -> u64 {
        self.per_agent.get(&agent).map_or(0, |&(n, _)| n)
    }

    /// Up to `n` tasks `agent` holds and has not said it started, highest ids first (the last
    /// handed out within a share), leaving out those `skip` names. A scan from the top, only at
    /// the tail of a run (`ask_back`).
    fn unstarted_of(&self, agent: u32, n: u64, skip: impl Fn(u64) -> bool) -> Vec<u64> {
        let Some(&(mut left, top)) = self.per_agent.get(&agent) else { return Vec::new() };
        let mut ids = Vec::new();
        for id in (0..=top.min(self.by_id.len() as u64 - 1)).rev() {
            if ids.len() as u64 == n || left == 0 {
                break;
            }
            let f = self.by_id[id as usize];
            if f.agent != agent {
                continue;
            }
            left -= 1;
            if f.life.state() != State::Running && !skip(id) {
                ids.push(id);
            }
        }
        ids
    }

    /// The ids an agent holds, in id order: a scan, but only on the rare loss of an agent.
    fn of_agent(&self, agent: u32) -> Vec<u64> {
        if !self.per_agent.contains_key(&agent) {
            return Vec::new();
        }
        (0..self.by_id.len() as u64).filter(|&id| self.by_id[id as usize].agent == agent).collect()
    }
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
            report_sizes: Hist::default(),
            result_delays: Hist::default(),
            last_ask_us: None,
            ask_pending: false,
            recall_share: 0,
            partition,
            expected_agents,
            job_id,
            agents: IdMap::default(),
            ever_seen: 0,
            never_joined: 0,
            retry: VecDeque::new(),
            fresh_retries: false,
            scans: 0,
            in_flight: Flights::new(counts.total()),
            finished_start: counts.get(State::Done) + counts.get(State::Failed),
            failed_start: counts.get(State::Failed),
            counts,
            started_us: now_us,
            horizon_ms: None,
            layout: None,
            live: Liveness::default(),
            audit_us: now_us,
            ticked_us: now_us,
            returned: IdMap::default(),
            recent_failures: VecDeque::new(),
            max_fails: None,
            oks: 0,
            deadline_us: None,
            late: Default::default(),
            now_us,
            told_to_hold: false,
            last_loss: None,
            lost_at_us: 0,
            resyncs: IdMap::default(),
            mem: Memory::new(backfill::Policy::default()),
            affinity: Affinity::expecting(0..expected_agents as u32),
            fresh_handoffs: false,
            preemptible: BTreeSet::new(),
            preemptible_of: IdMap::default(),
            preempting: IdSet::default(),
            times_preempted: IdMap::default(),
            preempted_for: IdMap::default(),
            preempted: VecDeque::new(),
            no_steal: false,
            recalls: Recalls::default(),
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

    /// Takes an attempt out of flight, and its memory off its agent.
    fn land(&mut self, id: u64) -> Option<Flight> {
        let f = self.in_flight.remove(id)?;
        self.mem.ended(f.agent, id);
        if !self.preemptible_of.is_empty() {
            if let Some(p) = self.preemptible_of.remove(&id) {
                self.preemptible.remove(&(p, std::cmp::Reverse(id)));
                self.preempting.remove(&id);
                self.preempted_for.remove(&id);
            }
        }
        Some(f)
    }

    /// Fail fast (`--max-fails N`): once `n` tasks failed for good in this session, nothing more
    /// starts, and the run ends when what runs has ended.
    pub fn with_max_fails(mut self, n: u64) -> Self {
        self.max_fails = Some(n.max(1));
        self
    }

    /// Once `--max-fails` is reached: every agent finishes what runs, starts nothing more, and
    /// leaves; what it had queued comes back when it does (as for any agent that leaves).
    fn hold_if_failing(&mut self, out: &mut Outbox) {
        let Some(failed) = self.failed_too_often().filter(|_| !self.told_to_hold) else { return };
        self.told_to_hold = true;
        tracing::warn!(job = %self.job_id, failed, "--max-fails reached: starting nothing more");
        let reason = format!("{failed} tasks failed (--max-fails)");
        for (&agent, _) in self.agents.iter().filter(|(_, a)| a.alive) {
            let stop = proto::Shutdown { revive: false, abort: false, hold: true, reason: reason.clone(), agent };
            out.push((agent, Body::Shutdown(stop)));
        }
    }

    /// Starts no task whose runtime hint would not end by `end_us`.
    pub fn with_deadline(mut self, end_us: u64) -> Self {
        self.deadline_us = Some(end_us);
        self
    }

    /// Whether the task, started now, would run past the time limit by its hint.
    fn too_late(&self, r: &Record) -> bool {
        self.deadline_us.is_some_and(|d| r.runtime_ms > 0 && self.now_us + r.runtime_ms as u64 * 1000 > d)
    }

    /// Tasks failed for good in this session, when that reached `--max-fails`.
    fn failed_too_often(&self) -> Option<u64> {
        let failed = self.counts.get(State::Failed).saturating_sub(self.failed_start);
        self.max_fails.filter(|&n| failed >= n).map(|_| failed)
    }

    /// The number on the wire of the attempt `life` has in flight (or had last).
    fn attempt_no(&self, id: u64, life: Life) -> u32 {
        // Almost always empty: no hashing per task then.
        let returned = if self.returned.is_empty() { 0 } else { self.returned.get(&id).copied().unwrap_or(0) };
        life.attempt_no() + returned
    }

    /// Takes back a task sent to `agent` and not reported started: it waits for another.
    fn take_back<E>(&mut self, t: &dyn Tasks<Error = E>, agent: u32, id: u64) -> Result<(), E> {
        if self.unsend(t, agent, id)? {
            *self.returned.entry(id).or_default() += 1;
            self.push_retry(id);
        }
        Ok(())
    }

    /// A task `agent` gave back unstarted when asked (a Recall): it never ran, so its next
    /// dispatch is the same attempt; it goes to an agent that can start it now.
    fn came_back<E>(&mut self, t: &dyn Tasks<Error = E>, agent: u32, id: u64) -> Result<(), E> {
        if self.unsend(t, agent, id)? {
            self.recalls.came_back(id);
        }
        Ok(())
    }

    /// Task `id`, sent to `agent` and not reported started, is pending again. False when it is
    /// not (any more) in flight there unstarted.
    fn unsend<E>(&mut self, t: &dyn Tasks<Error = E>, agent: u32, id: u64) -> Result<bool, E> {
        let Some(f) = self.in_flight.get(id).filter(|f| f.agent == agent && f.life.state() != State::Running) else {
            return Ok(false);
        };
        self.land(id);
        if let (Some(a), Some(r)) = (self.agents.get_mut(&agent), t.get(id)?) {
            a.ahead_ms = a.ahead_ms.saturating_sub(r.runtime_ms as u64 * r.cores as u64);
        }
        self.counts.moved(f.life.state(), State::Pending);
        // Back from the agent: a resync it answers later must not take it back again (it may
        // be out with it once more by then, as a new dispatch the answer predates).
        if let Some(asked) = self.resyncs.get_mut(&agent) {
            asked.retain(|&x| x != id);
        }
        Ok(true)
    }

    /// Slots `agent` said were idle, less `sent` since. A lone agent's report may predate
    /// what it holds now, so never more than its slots less what it holds; a head's idle
    /// members are idle whatever the busy ones hold.
    fn can_start(&self, agent: u32, sent: u64) -> u64 {
        let a = &self.agents[&agent];
        let idle = a.idle.saturating_sub(sent);
        if self.heads_members(agent) {
            idle
        } else {
            idle.min((a.cores as u64).saturating_sub(self.in_flight.held(agent)))
        }
    }

    /// Tasks `agent` holds that wait unstarted: beyond its slots for a lone agent; beyond what
    /// runs for a head, whose members' queues may hold work while another member is idle.
    fn queued_at(&self, agent: u32) -> u64 {
        let a = &self.agents[&agent];
        let running = if self.heads_members(agent) { a.busy } else { a.cores };
        self.in_flight.held(agent).saturating_sub(running as u64)
    }

    /// Only when nothing else waits anywhere: a task that came back and fits no idle slot (too
    /// wide, no memory there) goes to the retries, and asking for more would only churn the
    /// busy agent's queue.
    fn may_ask_back(&self) -> bool {
        !self.no_steal && self.partition.remaining() == 0 && self.retry.is_empty() && self.mem.waiting() == 0
    }

    fn heads_members(&self, agent: u32) -> bool {
        self.layout.as_ref().is_some_and(|t| t.instance_len(agent) > 1)
    }

    /// Nothing is left to hand out and slots are idle: asks agents with tasks queued beyond
    /// their slots for some back (`recall`), as many as the idle slots can start and queue at
    /// the even share (`recall_share`), less what is already on its way: stealing half, as
    /// work stealing does, so the tail takes a few rounds, not one per task.
    fn ask_back(&mut self, out: &mut Outbox) {
        // It looks at every agent: once per ASK_EVERY at most, not for each idle report (with a
        // thousand agents idle at the tail, that was seconds per turn); what was put off is
        // done with the first input after (`handle`).
        let every = self.agents.len() as u64 * ASK_EVERY_US_PER_AGENT;
        if self.last_ask_us.is_some_and(|t| self.now_us.saturating_sub(t) < every) {
            self.ask_pending = true;
            return;
        }
        self.last_ask_us = Some(self.now_us);
        self.ask_pending = false;
        let flights = &self.in_flight;
        self.recalls
            .prune(|id, agent| flights.get(id).is_some_and(|f| f.agent == agent && f.life.state() != State::Running));
        let live = |a: &Agent| a.alive && !a.drained;
        let idle: u64 = self.agents.iter().filter(|(_, a)| live(a)).map(|(&id, _)| self.can_start(id, 0)).sum();
        // Enough on its way already, at the last share: no need to look at every agent's queue.
        if idle * (1 + self.recall_share) <= self.recalls.underway() {
            return;
        }
        let asked = self.recalls.asked_of();
        let queued: Vec<(u32, u64)> = self
            .agents
            .iter()
            .filter(|(_, a)| live(a))
            .map(|(&id, _)| (id, self.queued_at(id).saturating_sub(asked.get(&id).copied().unwrap_or(0))))
            .collect();
        let slots: u64 = self.agents.values().filter(|a| live(a)).map(|a| a.cores as u64).sum();
        let even = queued.iter().map(|(_, n)| n).sum::<u64>() / slots.max(1);
        self.recall_share = even.min(RECALL_SHARE_MAX);
        let demand = (idle * (1 + self.recall_share)).saturating_sub(self.recalls.underway());
        if demand == 0 {
            return;
        }
        for (agent, n) in recall::plan(demand, &queued) {
            let ids = self.in_flight.unstarted_of(agent, n, |id| self.recalls.is_asked(id));
            if ids.is_empty() {
                continue;
            }
            tracing::debug!(job = %self.job_id, agent, tasks = ids.len(), "queued tasks asked back for idle slots");
            self.recalls.ask(agent, &ids);
            out.push((agent, Body::Recall(proto::Recall { agent, ids })));
        }
    }

    /// Reports handled in this session and the results they carried.
    pub fn report_sizes(&self) -> Summary {
        self.report_sizes.summary()
    }

    /// How long results took from their end to the leader, in microseconds, in this session.
    pub fn result_delays(&self) -> Summary {
        self.result_delays.summary()
    }

    /// Tasks moved from an agent that was behind to idle slots, in this session.
    pub fn moved_back(&self) -> u64 {
        self.recalls.moved
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

    /// How many report to the leader: the instance heads.
    fn reporters(&self) -> usize {
        self.layout.as_ref().map_or(self.expected_agents, |t| t.heads().len())
    }

    /// The partition index of the instance `agent` heads; `None` for an agent that heads none.
    fn instance_of(&self, agent: u32) -> Option<usize> {
        match &self.layout {
            Some(t) => t.instance_index(agent),
            None => Some(agent as usize),
        }
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
        self.finished_start
    }

    pub fn progress(&self, now_us: u64) -> Progress {
        Progress {
            counts: self.counts,
            elapsed: std::time::Duration::from_micros(now_us.saturating_sub(self.started_us)),
            finished_this_session: (self.counts.get(State::Done) + self.counts.get(State::Failed))
                .saturating_sub(self.finished_start),
            agents: self.agents.values().filter(|a| a.alive).count(),
        }
    }

    /// Whether the run is over without an event: every task finished, or no agent left.
    pub fn ending(&self) -> Option<Ending> {
        if self.counts.unfinished() == 0 {
            return Some(Ending::Complete);
        }
        let in_flight = self.counts.get(State::Dispatched) + self.counts.get(State::Running);
        if let Some(failed) = self.failed_too_often().filter(|_| in_flight == 0) {
            return Some(Ending::TooManyFailures(failed));
        }
        if !self.late.is_empty() && in_flight == 0 && self.counts.unfinished() == self.late.len() as u64 {
            return Some(Ending::OutOfTime(self.late.len() as u64));
        }
        // An agent given up may come back empty (a hung node that runs again, a leader that was
        // stopped itself): the run waits one loss bound for that before it gives up.
        let waited = self.now_us.saturating_sub(self.lost_at_us) >= self.live.lost_after_us;
        (self.all_agents_gone() && waited).then(|| {
            let last = self.last_loss.as_ref().map(|w| format!(" (the last: {w})")).unwrap_or_default();
            Ending::AgentsLost(format!(
                "all {} agents are gone with {} tasks unfinished{last}",
                self.expected_agents,
                self.counts.unfinished()
            ))
        })
    }

    /// Shutdown frames for every live agent.
    pub fn shutdown(&self, ending: &Ending, out: &mut Outbox) {
        let reason = match ending {
            Ending::Complete => "all tasks finished".to_string(),
            Ending::Interrupted(s) => format!("leader got signal {s}"),
            Ending::AgentsLost(w) => w.clone(),
            Ending::TooManyFailures(n) => format!("{n} tasks failed (--max-fails)"),
            Ending::OutOfTime(n) => format!("{n} tasks cannot finish before the time limit"),
        };
        let abort = *ending != Ending::Complete;
        for (&agent, _) in self.agents.iter().filter(|(_, a)| a.alive) {
            out.push((
                agent,
                Body::Shutdown(proto::Shutdown { revive: false, agent, abort, reason: reason.clone(), hold: false }),
            ));
        }
    }

    pub fn all_agents_gone(&self) -> bool {
        let alive = self.agents.values().filter(|a| a.alive).count();
        let gone = (self.ever_seen - alive) + self.never_joined;
        alive == 0 && gone >= self.expected_agents.max(1)
    }

    /// Acks every report received so far: call after the ledger writes of those reports are
    /// committed, never before.
    pub fn acks(&mut self, out: &mut Outbox) {
        for (&id, a) in self.agents.iter_mut() {
            if a.alive && a.last_seq > a.acked_seq {
                a.acked_seq = a.last_seq;
                a.told_us = self.now_us;
                out.push((id, Body::Ack(proto::Ack { seq: a.last_seq, agent: id, resync: false })));
            }
        }
    }

    /// Feeds one event; frames to send are appended to `out`. `Some` ends the run.
    pub fn handle<E>(
        &mut self,
        now_us: u64,
        t: &mut dyn Tasks<Error = E>,
        ev: Input,
        out: &mut Outbox,
    ) -> Result<Option<Ending>, E> {
        self.now_us = now_us;
        match ev {
            Input::Joined { agent, cores, mem_mb, gpus, hostname } => {
                let Some(instance) = self.instance_of(agent) else {
                    tracing::warn!(job = %self.job_id, agent, %hostname, "an agent that heads no instance joined; ignored");
                    return Ok(None);
                };
                tracing::info!(job = %self.job_id, agent, cores, mem_mb, %hostname, "agent joined");
                self.ever_seen += 1;
                self.place(agent, cores, mem_mb, gpus);
                self.agents.insert(
                    agent,
                    Agent {
                        instance,
                        cores,
                        mem_mb,
                        gpus,
                        widest: cores,
                        credit: 0,
                        idle: 0,
                        ahead_ms: 0,
                        last_seq: 0,
                        acked_seq: 0,
                        told_us: now_us,
                        alive: true,
                        hostname,
                        heard_us: now_us,
                        streak: Vec::new(),
                        oks_before_streak: 0,
                        drained: false,
                        busy: 0,
                        done: 0,
                        failed: 0,
                    },
                );
            }
            Input::Report { agent, report } => {
                if !self.agents.get(&agent).is_some_and(|a| a.alive) {
                    return Ok(None);
                }
                self.report_sizes.record(report.results.len() as u64);
                // Agents leave out the start of a task whose result is in the same report.
                for s in &report.started {
                    self.on_started(agent, s);
                }
                for r in &report.results {
                    // Clocks of other nodes may differ: only what looks plausible counts.
                    if r.end_us > 0 && r.end_us <= now_us {
                        self.result_delays.record(now_us - r.end_us);
                    }
                    self.on_result(t, agent, r, now_us)?;
                }
                for &id in &report.returned {
                    self.take_back(t, agent, id)?;
                }
                for &id in &report.recalled {
                    self.came_back(t, agent, id)?;
                }
                if report.resync {
                    self.resynced(t, agent, &report.holding, now_us)?;
                }
                let a = self.agents.get_mut(&agent).unwrap();
                a.heard_us = now_us;
                a.last_seq = a.last_seq.max(report.seq);
                if report.cores > 0 {
                    a.cores = report.cores;
                }
                a.credit += report.want as u64;
                a.idle = report.idle as u64;
                a.busy = a.cores.saturating_sub(report.idle);
                if let Some(c) = report.capacity {
                    // An instance's members: tasks are committed against their sums, and none is
                    // sent that the largest cannot hold (`fits`).
                    (a.mem_mb, a.gpus, a.widest) = (c.largest_mem_mb, c.largest_gpus, c.largest_cores.max(1));
                    let largest =
                        backfill::Size { mem_mb: c.largest_mem_mb, cores: c.largest_cores, gpus: c.largest_gpus };
                    self.mem.resize(agent, c.mem_mb, c.gpus, largest);
                    // It may have lost the only member that could hold some waiting task.
                    self.fail_unfit_waiting(t)?;
                }
                self.dispatch(t, agent, out)?;
                // New retries can go to any agent with credit, not only the one that reported;
                // older ones wait for an agent that fits to report (its dispatch takes retries
                // first), so a retry nobody can take does not cost a scan of every agent per report.
                if self.fresh_retries || self.fresh_handoffs || !report.recalled.is_empty() {
                    self.dispatch_all(t, out)?;
                }
                self.hold_if_failing(out);
                self.drain_if_black_hole(t, agent, out)?;
            }
            Input::Lost { agent, why } => self.lose(t, agent, &why, now_us, out)?,
            Input::Rejoined { agent, below } => self.rejoined(agent, below, now_us, out),
            Input::Revived { agent, cores, mem_mb, gpus, hostname } => {
                self.revived(t, agent, (cores, mem_mb, gpus), hostname, now_us, out)?
            }
            Input::Detached { agent } => {
                if let Some(a) = self.agents.get(&agent).filter(|a| a.alive) {
                    tracing::warn!(job = %self.job_id, agent, host = %a.hostname, "cut off with its relay; waiting for it to rejoin");
                }
            }
            Input::Tick => self.tick(t, now_us, out)?,
            Input::NeverJoined { agent, why } => {
                // Members join their head, not the leader: their absence is the head's to tell.
                if !self.agents.contains_key(&agent) && self.instance_of(agent).is_some() {
                    tracing::warn!(job = %self.job_id, agent, %why, "agent never joined");
                    self.never_joined += 1;
                    for id in self.affinity.leave(agent) {
                        self.push_retry(id);
                    }
                }
            }
            Input::Interrupt { signal } => return Ok(Some(Ending::Interrupted(signal))),
        }
        if self.ask_pending && self.may_ask_back() {
            self.ask_back(out);
        }
        Ok(None)
    }

    /// An agent is gone (its connection ended, or it fell silent): its tasks go to others.
    /// Keeps each agent's run of failures since its last success.
    fn note_streak(&mut self, agent: u32, id: u64, end: End) {
        match end {
            End::Succeeded => {
                self.oks += 1;
                if let Some(a) = self.agents.get_mut(&agent) {
                    a.streak.clear();
                }
            }
            End::Failed { .. } => {
                let oks = self.oks;
                if let Some(a) = self.agents.get_mut(&agent) {
                    if a.streak.is_empty() {
                        a.oks_before_streak = oks;
                    }
                    a.streak.push(id);
                }
            }
            End::Lost | End::Preempted => {}
        }
    }

    /// An agent that failed `BLACK_HOLE_STREAK` tasks in a row while as many succeeded
    /// elsewhere meanwhile (a full /tmp, a broken mount) gets nothing more: it finishes what runs and
    /// leaves, and the tasks it failed run again elsewhere without using up their retries.
    fn drain_if_black_hole<E>(&mut self, t: &mut dyn Tasks<Error = E>, agent: u32, out: &mut Outbox) -> Result<(), E> {
        // Already drained: what it still fails (it was running when told) is its fault too.
        if let Some(a) = self.agents.get_mut(&agent).filter(|a| a.drained) {
            for id in std::mem::take(&mut a.streak) {
                self.refund(t, id)?;
            }
            return Ok(());
        }
        let oks = self.oks;
        // Never the last agent that still gets work: then the tasks themselves are failing.
        if !self.agents.iter().any(|(&id, a)| id != agent && a.alive && !a.drained) {
            return Ok(());
        }
        let Some(a) = self.agents.get_mut(&agent).filter(|a| {
            a.alive
                && !a.drained
                && a.streak.len() >= BLACK_HOLE_STREAK
                && oks - a.oks_before_streak >= BLACK_HOLE_STREAK as u64
        }) else {
            return Ok(());
        };
        a.drained = true;
        a.credit = 0;
        self.mem.leave(agent);
        for id in self.affinity.leave(agent) {
            self.retry.push_back(id);
            self.fresh_retries = true;
        }
        let failed = std::mem::take(&mut a.streak);
        let reason = format!("failed {} tasks in a row while the others succeeded: drained", failed.len());
        tracing::warn!(job = %self.job_id, agent, host = %a.hostname, %reason, "black hole");
        for id in failed {
            self.refund(t, id)?;
        }
        self.fail_unfit_waiting(t)?;
        out.push((agent, Body::Shutdown(proto::Shutdown { revive: false, abort: false, hold: true, reason, agent })));
        self.dispatch_all(t, out)
    }

    /// A failure that was the node's fault: the task waits for another run, its retry given
    /// back (and out of the failed index if it had failed for good).
    fn refund<E>(&mut self, t: &mut dyn Tasks<Error = E>, id: u64) -> Result<(), E> {
        let Some(mut r) = t.get(id)? else { return Ok(()) };
        if self.in_flight.contains(id) {
            return Ok(()); // already out again
        }
        let from = r.state();
        let Ok((life, _)) = task::step(r.life(), Step::Refund) else { return Ok(()) };
        if from == State::Failed {
            // The failure that was final stays in the history, as every ended attempt does.
            let a = Attempt {
                attempt: self.attempt_no(id, r.life()).min(255) as u8,
                outcome: r.outcome(),
                value: r.value,
                agent: r.agent,
                start_us: r.start_us,
                end_us: r.end_us,
            };
            t.put_attempt(id, &a)?;
            t.unmark_failed(id)?;
        }
        // Its attempts count goes back one, but its next run is a new attempt number.
        *self.returned.entry(id).or_default() += 1;
        self.apply(t, id, &mut r, from, life)?;
        self.push_retry(id);
        Ok(())
    }

    fn lose<E>(
        &mut self,
        t: &mut dyn Tasks<Error = E>,
        agent: u32,
        why: &str,
        now_us: u64,
        out: &mut Outbox,
    ) -> Result<(), E> {
        let Some(a) = self.agents.get_mut(&agent).filter(|a| a.alive) else { return Ok(()) };
        a.alive = false;
        self.lost_at_us = now_us;
        if self.told_to_hold || a.drained {
            tracing::info!(job = %self.job_id, agent, host = %a.hostname, "agent left, as told");
        } else {
            tracing::warn!(job = %self.job_id, agent, host = %a.hostname, %why, "agent lost");
            self.last_loss = Some(format!("agent {agent} on {}: {why}", a.hostname));
        }
        self.requeue_agent(t, agent, now_us)?;
        self.mem.leave(agent);
        for id in self.affinity.leave(agent) {
            self.push_retry(id);
        }
        self.fail_unfit_waiting(t)?;
        self.dispatch_all(t, out)
    }

    /// Tasks waiting for memory that no live agent can ever run (the only big enough one left)
    /// fail as unschedulable rather than wait for ever.
    fn fail_unfit_waiting<E>(&mut self, t: &mut dyn Tasks<Error = E>) -> Result<(), E> {
        if self.mem.waiting() == 0 || !self.all_accounted() {
            return Ok(());
        }
        let ids: Vec<u64> = self.mem.waiting_tasks().map(|n| n.task).collect();
        for id in ids {
            let Some(r) = t.get(id)? else { continue };
            if !self.schedulable(&r) {
                self.mem.forget(id, self.now_us);
                self.fail_unschedulable(t, id, r)?;
            }
        }
        Ok(())
    }

    /// Time passed without a tick for longer than a hold: the leader itself stood still (SIGSTOP,
    /// a starved or swapped-out process, a long disk stall). What its agents sent meanwhile waits
    /// unread in its sockets, so the stall is not counted as their silence: an agent is judged
    /// only on time the leader was there to hear it.
    fn excuse_own_stall(&mut self, now_us: u64) {
        let gap = now_us.saturating_sub(self.ticked_us);
        self.ticked_us = now_us;
        if gap <= self.live.hold_us {
            return;
        }
        tracing::warn!(
            stalled_s = gap as f64 / 1e6,
            "the leader stood still; its agents' silence in that time is excused"
        );
        for a in self.agents.values_mut() {
            a.heard_us = a.heard_us.saturating_add(gap).min(now_us);
        }
    }

    /// Agents silent past the bound are lost, and told to stop should they resume (a hung agent
    /// reads it when it runs again; its lease has run out by then anyway). Every live agent hears
    /// from the leader at least as often as it reports (`Liveness::beat_every_us`): the ack of
    /// its last report, or else an Ack of what was already acknowledged. Under load the acks
    /// alone do it (16 one-slot agents were sent as many heartbeats as acks).
    fn tick<E>(&mut self, t: &mut dyn Tasks<Error = E>, now_us: u64, out: &mut Outbox) -> Result<(), E> {
        self.excuse_own_stall(now_us);
        let mut silent: Vec<(u32, u64)> = self
            .agents
            .iter()
            .filter(|(_, a)| a.alive && now_us.saturating_sub(a.heard_us) >= self.live.lost_after_us)
            .map(|(&id, a)| (id, now_us.saturating_sub(a.heard_us)))
            .collect();
        silent.sort_unstable();
        for (agent, quiet_us) in silent {
            let why = format!("silent for {:.1} s", quiet_us as f64 / 1e6);
            self.lose(t, agent, &why, now_us, out)?;
            out.push((
                agent,
                Body::Shutdown(proto::Shutdown { revive: true, abort: true, reason: why, agent, hold: false }),
            ));
        }
        if now_us.saturating_sub(self.audit_us) >= AUDIT_EVERY_LOST_AFTER * self.live.lost_after_us {
            self.audit_us = now_us;
            self.audit(out);
        }
        self.preempt_for_waiting(t, out)?;
        let every = self.live.beat_every_us(self.reporters());
        for (&agent, a) in self.agents.iter_mut().filter(|(_, a)| a.alive) {
            if now_us.saturating_sub(a.told_us) >= every {
                a.told_us = now_us;
                out.push((agent, Body::Ack(proto::Ack { seq: a.acked_seq, agent, resync: false })));
            }
        }
        Ok(())
    }

    /// A start moves the attempt in memory only; its time travels with the result.
    fn on_started(&mut self, agent: u32, s: &proto::TaskStarted) {
        let Some(f) = self.in_flight.get(s.id) else { return };
        if f.agent != agent || self.attempt_no(s.id, f.life) != s.attempt {
            return;
        }
        let Ok((life, _)) = task::step(f.life, Step::Start) else { return };
        self.counts.moved(f.life.state(), life.state());
        self.in_flight.set_life(s.id, life);
    }

    /// Writes a record whose life `task::step` moved from `from` (the ledger's state, or the
    /// in-memory one of an attempt in flight), and moves the counts with it: the one place a
    /// task's record changes state.
    fn apply<E>(
        &mut self,
        t: &mut dyn Tasks<Error = E>,
        id: u64,
        r: &mut Record,
        from: State,
        life: Life,
    ) -> Result<(), E> {
        r.set_life(life);
        t.put(id, r)?;
        self.counts.moved(from, r.state());
        Ok(())
    }

    fn on_result<E>(
        &mut self,
        t: &mut dyn Tasks<Error = E>,
        agent: u32,
        res: &proto::TaskResult,
        now_us: u64,
    ) -> Result<(), E> {
        // A result from an agent that no longer holds the task (it was lost and the task re-sent)
        // or for an old attempt is stale: the ledger already moved on.
        let Some(f) = self.in_flight.get(res.id) else { return Ok(()) };
        if f.agent != agent || self.attempt_no(res.id, f.life) != res.attempt {
            return Ok(());
        }
        let Some(mut r) = t.get(res.id)? else { return Ok(()) };
        self.land(res.id);
        if let Some(a) = self.agents.get_mut(&agent) {
            a.ahead_ms = a.ahead_ms.saturating_sub(r.runtime_ms as u64 * r.cores as u64);
        }
        let ended = Ended {
            outcome: Outcome::from(proto::Outcome::try_from(res.outcome).unwrap_or(proto::Outcome::Unspecified)),
            value: res.value,
            start_us: res.start_us,
            // A head telling of a member's lost task knows no end: it is now.
            end_us: if res.end_us == 0 { now_us } else { res.end_us },
            ran_on: res.ran_on.unwrap_or(agent),
        };
        self.finish_attempt(t, res.id, &mut r, f, ended)
    }

    /// Records how an attempt ended and moves the task to done, failed, or back to pending.
    fn finish_attempt<E>(
        &mut self,
        t: &mut dyn Tasks<Error = E>,
        id: u64,
        r: &mut Record,
        f: Flight,
        e: Ended,
    ) -> Result<(), E> {
        let Ended { outcome, value, start_us, end_us, ran_on: agent } = e;
        let end = match outcome {
            Outcome::Exited if value == 0 => End::Succeeded,
            Outcome::Lost => End::Lost,
            Outcome::Preempted => End::Preempted,
            _ => End::Failed { permanent: outcome.is_permanent(value) },
        };
        let Ok((life, effect)) = task::step(f.life, Step::Finish(end)) else { return Ok(()) };
        self.note_streak(f.agent, id, end);
        if end == End::Succeeded && start_us != 0 && end_us >= start_us {
            self.partition.observe(r.class, r.runtime_ms, (end_us - start_us) / 1000);
            if r.mem_mb > 0 || r.gpus > 0 {
                self.mem.observe(group_of(r), end_us - start_us);
            }
        }
        r.outcome = outcome as u8;
        r.value = value;
        r.agent = agent;
        r.returns = self.returned.get(&id).copied().unwrap_or(0).min(255) as u8;
        if start_us != 0 {
            r.start_us = start_us;
        }
        r.end_us = end_us;
        if effect == Effect::Retry {
            let a = Attempt {
                attempt: self.attempt_no(id, f.life).min(255) as u8,
                outcome,
                value,
                agent,
                start_us: r.start_us,
                end_us,
            };
            t.put_attempt(id, &a)?;
            if end == End::Preempted {
                self.preempted.push_back(id);
                self.fresh_retries = true;
            } else {
                self.push_retry(id);
            }
        }
        self.tally(f.agent, id, r, end, life.state().is_final());
        if life.state().is_final() {
            self.returned.remove(&id);
        }
        if life.state() == State::Failed {
            t.mark_failed(id)?;
            tracing::debug!(job = %self.job_id, task = id, attempts = life.attempts, outcome = %outcome.describe(value), "task failed");
        }
        self.apply(t, id, r, f.life.state(), life)
    }

    /// Counts an ended attempt on the instance that ran it, and keeps it if it failed.
    fn tally(&mut self, agent: u32, id: u64, r: &Record, end: End, last: bool) {
        let Some(a) = self.agents.get_mut(&agent) else { return };
        if end == End::Succeeded {
            a.done += 1;
            return;
        }
        if end == End::Preempted {
            return; // not a failure
        }
        a.failed += 1;
        if self.recent_failures.len() == live::RECENT_FAILURES {
            self.recent_failures.pop_front();
        }
        self.recent_failures.push_back(live::Failure {
            task: id,
            line: r.line,
            host: a.hostname.clone(),
            at_us: r.end_us,
            reason: r.outcome().describe(r.value),
            retrying: !last,
        });
    }

    /// What `htc watch` shows: the counts, every instance, the latest failures.
    pub fn live_view(&self, now_us: u64, state: &str) -> live::View {
        let mut nodes: Vec<live::Node> = self
            .agents
            .iter()
            .map(|(&agent, a)| live::Node {
                agent,
                host: a.hostname.clone(),
                cores: a.cores,
                busy: if a.alive { a.busy } else { 0 },
                done: a.done,
                failed: a.failed,
                heard_us: a.heard_us,
                state: (if a.drained {
                    "drained"
                } else if a.alive {
                    "up"
                } else {
                    "lost"
                })
                .into(),
            })
            .collect();
        nodes.sort_by_key(|n| n.agent);
        live::View {
            job: self.job_id.clone(),
            now_us,
            session_start_us: self.started_us,
            state: state.into(),
            counts: self.counts,
            finished_start: self.finished_start,
            nodes,
            failures: self.recent_failures.iter().cloned().collect(),
        }
    }

    /// A lost agent's attempts: those that had started count as lost (the task may be what
    /// killed the agent); those still queued there go back to the queue as if never sent.
    fn requeue_agent<E>(&mut self, t: &mut dyn Tasks<Error = E>, agent: u32, now_us: u64) -> Result<(), E> {
        // In id order, so that the same events always give the same decisions.
        for id in self.in_flight.of_agent(agent) {
            self.recall(t, agent, id, now_us)?;
        }
        Ok(())
    }

    /// Task `id`, in flight with `agent`, will not end there: a started attempt is lost (no
    /// retry used unless it keeps happening), an unstarted one is taken back.
    fn recall<E>(&mut self, t: &mut dyn Tasks<Error = E>, agent: u32, id: u64, now_us: u64) -> Result<(), E> {
        let Some(f) = self.land(id) else { return Ok(()) };
        if f.life.state() == State::Running {
            if let Some(mut r) = t.get(id)? {
                let lost = Ended { outcome: Outcome::Lost, value: 0, start_us: 0, end_us: now_us, ran_on: agent };
                self.finish_attempt(t, id, &mut r, f, lost)?;
            }
        } else {
            self.in_flight.insert(id, f);
            self.take_back(t, agent, id)?;
        }
        Ok(())
    }

    /// An agent (and those it relays for) came back around a lost relay: each is asked which
    /// tasks it holds, since frames both ways may have died with the relay.
    fn rejoined(&mut self, agent: u32, below: Vec<u32>, now_us: u64, out: &mut Outbox) {
        for a in std::iter::once(agent).chain(below) {
            let Some(x) = self.agents.get_mut(&a) else { continue };
            if !x.alive {
                if a == agent {
                    // Given up already: its tasks run elsewhere, so it must not run them too.
                    let why = "rejoined after it was given up".to_string();
                    out.push((
                        a,
                        Body::Shutdown(proto::Shutdown {
                            revive: true,
                            abort: true,
                            reason: why,
                            agent: a,
                            hold: false,
                        }),
                    ));
                }
                continue;
            }
            tracing::info!(job = %self.job_id, agent = a, host = %x.hostname, "rejoined around a lost relay");
            x.heard_us = now_us;
            out.push((a, Body::Ack(proto::Ack { seq: x.acked_seq, agent: a, resync: true })));
            self.resyncs.insert(a, self.in_flight.of_agent(a));
        }
    }

    /// A given-up agent back, empty. Should the leader not have given it up yet (the agent's
    /// lease ran out first), it does so now: the agent stopped what it held. A black hole stays
    /// drained; an agent that never joined is not a member to revive.
    #[allow(clippy::too_many_arguments)]
    fn revived<E>(
        &mut self,
        t: &mut dyn Tasks<Error = E>,
        agent: u32,
        (cores, mem_mb, gpus): (u32, u64, u32),
        hostname: String,
        now_us: u64,
        out: &mut Outbox,
    ) -> Result<(), E> {
        let Some(a) = self.agents.get(&agent) else {
            let reason = "never joined this session".to_string();
            out.push((
                agent,
                Body::Shutdown(proto::Shutdown { revive: false, abort: true, reason, agent, hold: false }),
            ));
            return Ok(());
        };
        if a.drained || self.told_to_hold {
            let reason = if a.drained { "drained as a black hole" } else { "the run starts nothing more" }.to_string();
            out.push((
                agent,
                Body::Shutdown(proto::Shutdown { revive: false, abort: false, reason, agent, hold: true }),
            ));
            return Ok(());
        }
        if a.alive {
            self.lose(t, agent, "came back empty after its lease ran out", now_us, out)?;
        }
        let a = self.agents.get_mut(&agent).expect("checked above");
        tracing::info!(job = %self.job_id, agent, %hostname, "given up before, back as a fresh member");
        (a.alive, a.heard_us, a.cores, a.mem_mb, a.gpus, a.hostname) = (true, now_us, cores, mem_mb, gpus, hostname);
        a.widest = cores;
        (a.credit, a.idle, a.ahead_ms, a.busy) = (0, 0, 0, 0);
        a.streak.clear();
        self.place(agent, cores, mem_mb, gpus);
        self.resyncs.remove(&agent);
        Ok(())
    }

    /// An agent (or one given up, back empty) takes part in placement: memory and GPUs to
    /// commit, and a share of the affinity keys.
    fn place(&mut self, agent: u32, cores: u32, mem_mb: u64, gpus: u32) {
        self.mem.join(agent, mem_mb, cores, gpus);
        self.affinity.join(agent);
    }

    /// Tasks lost in transit (HTDcr's T_loss): rather than guess from runtimes when a task is
    /// overdue, which would re-run long tasks that are fine, every agent holding tasks is asked
    /// now and then which it holds (one pass over the tasks in flight), and what it does not
    /// hold is re-run (`resynced`). A lost dispatch or result thus costs at most this period.
    fn audit(&mut self, out: &mut Outbox) {
        let mut by_agent: HashMap<u32, Vec<u64>> = HashMap::new();
        for (id, f) in self.in_flight.by_id.iter().enumerate() {
            if f.agent != u32::MAX {
                by_agent.entry(f.agent).or_default().push(id as u64);
            }
        }
        for (agent, ids) in by_agent {
            let Some(a) = self.agents.get(&agent).filter(|a| a.alive && !a.drained) else { continue };
            if self.resyncs.contains_key(&agent) {
                continue;
            }
            out.push((agent, Body::Ack(proto::Ack { seq: a.acked_seq, agent, resync: true })));
            self.resyncs.insert(agent, ids);
        }
    }

    /// The answer to a resync: what was in flight with the agent when it was asked and is not in
    /// its hands was lost on the way (a dispatch, or a result), and goes to be run again.
    fn resynced<E>(&mut self, t: &mut dyn Tasks<Error = E>, agent: u32, holding: &[u64], now_us: u64) -> Result<(), E> {
        let Some(asked) = self.resyncs.remove(&agent) else { return Ok(()) };
        let held: HashSet<u64> = holding.iter().copied().collect();
        let mut lost = 0;
        for id in asked.into_iter().filter(|id| !held.contains(id)) {
            if self.in_flight.get(id).is_some_and(|f| f.agent == agent) {
                self.recall(t, agent, id, now_us)?;
                lost += 1;
            }
        }
        tracing::info!(job = %self.job_id, agent, held = holding.len(), lost, "resynced after a rejoin");
        Ok(())
    }

    fn push_retry(&mut self, id: u64) {
        self.retry.push_back(id);
        self.fresh_retries = true;
    }

    fn dispatch_all<E>(&mut self, t: &mut dyn Tasks<Error = E>, out: &mut Outbox) -> Result<(), E> {
        self.fresh_retries = false;
        self.fresh_handoffs = false;
        self.scans += 1;
        let mut ids: Vec<u32> =
            self.agents.iter().filter(|(_, a)| a.alive && a.credit > 0).map(|(id, _)| *id).collect();
        ids.sort_unstable();
        for agent in ids {
            self.dispatch(t, agent, out)?;
        }
        Ok(())
    }

    fn fits(&self, agent: u32, r: &Record) -> bool {
        let a = &self.agents[&agent];
        r.cores as u32 <= a.widest
            && r.gpus as u32 <= a.gpus
            && (a.mem_mb == 0 || r.mem_mb == 0 || r.mem_mb as u64 <= a.mem_mb)
    }

    /// Whether some live agent could ever run the task. Meaningful only once every agent the
    /// launcher started has joined or is known gone (`all_accounted`): a big node may join last.
    fn schedulable(&self, r: &Record) -> bool {
        self.agents.values().any(|a| a.alive && !a.drained)
            && self.agents.iter().any(|(id, a)| a.alive && !a.drained && self.fits(*id, r))
    }

    fn all_accounted(&self) -> bool {
        self.ever_seen + self.never_joined >= self.expected_agents
    }

    fn fail_unschedulable<E>(&mut self, t: &mut dyn Tasks<Error = E>, id: u64, mut r: Record) -> Result<(), E> {
        tracing::warn!(job = %self.job_id, task = id, cores = r.cores, mem_mb = r.mem_mb, gpus = r.gpus, "task needs more than any agent has");
        let Ok((life, _)) = task::step(r.life(), Step::Refuse) else { return Ok(()) };
        t.mark_failed(id)?;
        r.outcome = Outcome::Unschedulable as u8;
        self.apply(t, id, &mut r, State::Pending, life)
    }

    /// Hands `agent` up to its credit of tasks, from five sources in turn: the retries (the
    /// oldest work), what waits for memory, what was preempted, what other agents handed over
    /// for its affinity keys, and its share of the partition; with nothing else for it, what
    /// waits for busy agents' keys and what agents behind gave back.
    fn dispatch<E>(&mut self, t: &mut dyn Tasks<Error = E>, agent: u32, out: &mut Outbox) -> Result<(), E> {
        if self.failed_too_often().is_some() || self.agents[&agent].drained || self.mem.runs_exclusive(agent) {
            return Ok(());
        }
        let mut b = Batch { agent, want: self.agents[&agent].credit, specs: Vec::new() };
        self.offer_retries(t, &mut b)?;
        self.offer_waiting_for_memory(t, &mut b)?;
        self.offer_preempted(t, &mut b)?;
        while b.want > 0 {
            let Some(id) = self.affinity.take_own(agent) else { break };
            self.offer(t, &mut b, id)?;
        }
        let drained = self.offer_share(t, &mut b)?;
        // Leftovers also for an agent that got nothing this time (its share is held back by the
        // horizon or by memory), but only a drained one asks for more back.
        let idle_left = (drained || b.specs.is_empty()) && self.offer_leftovers(t, &mut b)?;
        let ask = drained && idle_left;
        let Batch { want, specs, .. } = b;
        let a = self.agents.get_mut(&agent).unwrap();
        a.credit = want;
        a.idle = a.idle.saturating_sub(specs.len() as u64);
        // A head counts what was just sent as running: it goes to members' idle slots.
        a.busy = a.busy.saturating_add(specs.len() as u32).min(a.cores);
        // The Dispatch goes first: a Recall of a task must never overtake the task itself.
        out.extend(crate::wire::dispatches(agent, specs).into_iter().map(|d| (agent, Body::Dispatch(d))));
        if ask {
            self.ask_back(out);
        }
        Ok(())
    }

    /// The retries, oldest first; those that fit no agent yet stay queued, in order.
    fn offer_retries<E>(&mut self, t: &mut dyn Tasks<Error = E>, b: &mut Batch) -> Result<(), E> {
        let mut skipped = VecDeque::new();
        while b.want > 0 {
            let Some(id) = self.retry.pop_front() else { break };
            let Some(r) = t.get(id)? else { continue };
            if r.state() != State::Pending || self.in_flight.contains(id) {
                continue;
            }
            if self.too_late(&r) {
                self.late.insert(id);
                continue;
            }
            if self.start(t, b, id, r)? == Placed::Unfit {
                if self.all_accounted() && !self.schedulable(&r) {
                    self.fail_unschedulable(t, id, r)?;
                } else {
                    skipped.push_back(id);
                }
            }
        }
        skipped.append(&mut self.retry);
        self.retry = skipped;
        Ok(())
    }

    /// What waits for memory, oldest first, where it may start now.
    fn offer_waiting_for_memory<E>(&mut self, t: &mut dyn Tasks<Error = E>, b: &mut Batch) -> Result<(), E> {
        while b.want > 0 {
            let Some(need) = self.mem.take_waiting(b.agent, self.now_us) else { break };
            match t.get(need.task)? {
                Some(r) if r.state() == State::Pending && !self.in_flight.contains(need.task) => {
                    self.take_task(t, b.agent, need.task, r, &mut b.specs)?;
                    b.want -= 1;
                }
                _ => self.mem.ended(b.agent, need.task),
            }
        }
        Ok(())
    }

    /// What was preempted, unless higher-priority work is still to be handed out.
    fn offer_preempted<E>(&mut self, t: &mut dyn Tasks<Error = E>, b: &mut Batch) -> Result<(), E> {
        while b.want > 0 {
            let Some(&id) = self.preempted.front() else { break };
            let Some(r) = t.get(id)? else {
                self.preempted.pop_front();
                continue;
            };
            if self.top_waiting(t)?.is_some_and(|(p, _)| p > r.priority) {
                break;
            }
            self.preempted.pop_front();
            self.offer(t, b, id)?;
        }
        Ok(())
    }

    /// The agent's share of the partition (stealing from others' when its own is done); says
    /// whether the partition had nothing more for it. Tasks refused for memory in this offer:
    /// past a core's worth, the rest of the partition is left for later offers rather than
    /// pulled into the waiting queue; so are tasks handed to other agents for their affinity
    /// keys, past a few per core.
    fn offer_share<E>(&mut self, t: &mut dyn Tasks<Error = E>, b: &mut Batch) -> Result<bool, E> {
        let (mut refused, mut handed) = (0u64, 0u64);
        let cores = self.agents[&b.agent].cores.max(1) as u64;
        while b.want > 0 && refused < cores && handed < 8 * cores + 32 {
            let a = &self.agents[&b.agent];
            // Its last report's idle slots, less what was sent since; and never more than its
            // cores minus what it holds: reports sent before a dispatch arrived still say idle.
            let free = (a.cores as u64).saturating_sub(self.in_flight.held(b.agent));
            let steal = a.idle.saturating_sub(b.specs.len() as u64).min(free);
            let room = match self.horizon_ms {
                None => b.want,
                Some(h) if a.ahead_ms >= h * a.cores as u64 => steal,
                // In steps of a core's worth, checking the horizon after each.
                Some(_) => b.want.min(a.cores.max(1) as u64),
            };
            if room == 0 {
                return Ok(false);
            }
            let steal = if self.no_steal { 0 } else { steal };
            let Some(block) = self.partition.take(a.instance, room, steal) else { return Ok(true) };
            let records = match block {
                Block::Range(r) => t.range(r)?,
                Block::Ids(ids) => ids
                    .into_iter()
                    .filter_map(|id| t.get(id).transpose().map(|r| r.map(|r| (id, r))))
                    .collect::<Result<_, _>>()?,
            };
            for (id, r) in records {
                if r.state() != State::Pending || self.in_flight.contains(id) {
                    continue; // done in an earlier session, or out already
                }
                if self.hand_to_key_owner(b.agent, id, &r) {
                    handed += 1;
                } else if self.too_late(&r) {
                    self.late.insert(id);
                } else {
                    match self.start(t, b, id, r)? {
                        Placed::Taken => {}
                        Placed::Waits => refused += 1,
                        Placed::Unfit => self.push_retry(id),
                    }
                }
            }
        }
        Ok(false)
    }

    /// Keys spread over every agent expected, joined yet or not: one that joins late finds its
    /// keys' tasks waiting for it. Says whether the task went to another agent's keys.
    fn hand_to_key_owner(&mut self, agent: u32, id: u64, r: &Record) -> bool {
        if r.affinity == 0 {
            return false;
        }
        let Route::To(other) = self.affinity.route(r.affinity, agent) else { return false };
        if !self.agents.get(&other).is_none_or(|a| a.alive && !a.drained) {
            return false;
        }
        self.affinity.defer(other, id);
        self.fresh_handoffs = true;
        true
    }

    /// Nothing else for the agent: rather than idle, it runs what waits for busy agents' keys,
    /// as much as it can start now; then what agents that are behind gave back, with its share
    /// of queue. Says whether slots are still idle, so that more of their queues may be asked
    /// back.
    fn offer_leftovers<E>(&mut self, t: &mut dyn Tasks<Error = E>, b: &mut Batch) -> Result<bool, E> {
        let mut can_start = self.can_start(b.agent, b.specs.len() as u64);
        while b.want > 0 && can_start > 0 {
            let Some(id) = self.affinity.steal(b.agent) else { break };
            if self.offer(t, b, id)? {
                can_start -= 1;
            }
        }
        let mut room = can_start.saturating_mul(1 + self.recall_share);
        let before = b.specs.len();
        while b.want > 0 && room > 0 {
            let Some(id) = self.recalls.take() else { break };
            if self.offer(t, b, id)? {
                room -= 1;
            }
        }
        can_start = can_start.saturating_sub((b.specs.len() - before) as u64);
        Ok(can_start > 0 && self.may_ask_back())
    }

    /// Higher-priority work that no agent can take now (every one is busy) stops preemptible
    /// tasks of lower priority, lowest and newest first, one per waiting task; they run again
    /// later without using a retry. Tasks already handed to an agent are its executor's to
    /// preempt (it knows what waits in its queue).
    fn preempt_for_waiting<E>(&mut self, t: &dyn Tasks<Error = E>, out: &mut Outbox) -> Result<(), E> {
        if self.preemptible.len() <= self.preempting.len() {
            return Ok(());
        }
        self.preempt_for_memory(t, out)?;
        let Some((p, waiting)) = self.top_waiting(t)? else { return Ok(()) };
        if self.agents.values().any(|a| a.alive && !a.drained && a.idle > 0) {
            return Ok(()); // an agent can take it: no need to stop anything
        }
        let n = (waiting as usize).min(64).saturating_sub(self.preempting.len());
        // A task preempted this often already runs to its end: the waiting work may need
        // another agent than the one it is on, and it must not be stopped for ever.
        let victims: Vec<u64> = self
            .preemptible
            .iter()
            .take_while(|(q, _)| *q < p)
            .map(|(_, id)| id.0)
            .filter(|id| {
                !self.preempting.contains(id) && self.times_preempted.get(id).is_none_or(|&k| k < MAX_PREEMPTIONS)
            })
            .take(n)
            .collect();
        let mut by_agent: HashMap<u32, Vec<u64>> = HashMap::new();
        for id in victims {
            if let Some(f) = self.in_flight.get(id) {
                self.preempting.insert(id);
                *self.times_preempted.entry(id).or_default() += 1;
                by_agent.entry(f.agent).or_default().push(id);
            }
        }
        for (agent, ids) in by_agent {
            tracing::info!(job = %self.job_id, agent, tasks = ?ids, priority = p, "preempting for higher-priority work");
            out.push((agent, Body::Preempt(proto::Preempt { agent, ids })));
        }
        Ok(())
    }

    /// Tasks waiting for memory or GPUs (the oldest few) stop preemptible tasks of lower
    /// priority on the agent where the fewest stops make room, which is then kept for them.
    fn preempt_for_memory<E>(&mut self, t: &dyn Tasks<Error = E>, out: &mut Outbox) -> Result<(), E> {
        let waiting: Vec<u64> = self.mem.waiting_tasks().take(8).map(|n| n.task).collect();
        for w in waiting {
            let Some(r) = t.get(w)? else { continue };
            let stoppable: HashSet<u64> = self
                .preemptible
                .iter()
                .take_while(|(q, _)| *q < r.priority)
                .map(|(_, id)| id.0)
                .filter(|id| {
                    !self.preempting.contains(id) && self.times_preempted.get(id).is_none_or(|&k| k < MAX_PREEMPTIONS)
                })
                .collect();
            // Only what is stopped for this task makes room for it: room made for another
            // waiting task is that one's.
            let stopping = |id: u64| self.preempted_for.get(&id) == Some(&w);
            let may_stop = |id: u64| stoppable.contains(&id);
            let Some((agent, ids)) = self.mem.room_for(w, &may_stop, &stopping, self.now_us) else { continue };
            // A node kept for a task of the same or higher priority stays kept for it.
            if let Some(kept) = self.mem.reservation(agent).filter(|&k| k != w) {
                if t.get(kept)?.is_none_or(|k| k.priority >= r.priority) {
                    continue;
                }
            }
            self.mem.reserve_on(w, agent, self.now_us);
            if ids.is_empty() {
                continue;
            }
            for &id in &ids {
                self.preempting.insert(id);
                self.preempted_for.insert(id, w);
                *self.times_preempted.entry(id).or_default() += 1;
            }
            tracing::info!(job = %self.job_id, agent, tasks = ?ids, task = w, priority = r.priority, "preempting to make room for a task waiting for memory or GPUs");
            out.push((agent, Body::Preempt(proto::Preempt { agent, ids })));
        }
        Ok(())
    }

    /// The highest priority of work waiting to be handed out (the partition's, the retries'),
    /// and how many tasks have it.
    fn top_waiting<E>(&self, t: &dyn Tasks<Error = E>) -> Result<Option<(i16, u64)>, E> {
        let mut top = self.partition.top_priority();
        for &id in self.retry.iter().take(64) {
            let Some(r) = t.get(id)? else { continue };
            top = match top {
                Some((p, n)) if p == r.priority => Some((p, n + 1)),
                Some((p, _)) if p > r.priority => top,
                _ => Some((r.priority, 1)),
            };
        }
        Ok(top)
    }

    /// Offers a task that was set aside (preempted, an affinity queue, given back) to the
    /// batch's agent: sent if it fits and may start, else back to the retries (it fits no
    /// agent now) or waiting for memory; true when it was taken.
    fn offer<E>(&mut self, t: &mut dyn Tasks<Error = E>, b: &mut Batch, id: u64) -> Result<bool, E> {
        let Some(r) = t.get(id)? else { return Ok(false) };
        if r.state() != State::Pending || self.in_flight.contains(id) {
            return Ok(false);
        }
        Ok(match self.start(t, b, id, r)? {
            Placed::Taken => true,
            Placed::Waits => false,
            Placed::Unfit => {
                self.push_retry(id);
                false
            }
        })
    }

    /// The one ladder every source of work goes down: a pending task that fits the batch's
    /// agent and may start there (memory, GPUs) is taken into the batch; one that fits but may
    /// not start yet waits for memory (`admit` queued it); one that does not fit is the
    /// caller's to place.
    fn start<E>(&mut self, t: &mut dyn Tasks<Error = E>, b: &mut Batch, id: u64, r: Record) -> Result<Placed, E> {
        if !self.fits(b.agent, &r) {
            return Ok(Placed::Unfit);
        }
        if !self.admit(b.agent, id, &r) {
            return Ok(Placed::Waits);
        }
        self.take_task(t, b.agent, id, r, &mut b.specs)?;
        b.want = b.want.saturating_sub(1);
        Ok(Placed::Taken)
    }

    fn admit(&mut self, agent: u32, id: u64, r: &Record) -> bool {
        let need = Need {
            task: id,
            mem_mb: r.mem_mb as u64,
            cores: r.cores as u32,
            gpus: r.gpus as u32,
            runtime_us: r.runtime_ms as u64 * 1000,
            group: group_of(r),
            exclusive: r.flags & Record::EXCLUSIVE != 0,
        };
        if self.mem.admit(agent, need, self.now_us).is_ok() {
            return true;
        }
        self.mem.wait(need, self.now_us);
        false
    }

    fn take_task<E>(
        &mut self,
        t: &mut dyn Tasks<Error = E>,
        agent: u32,
        id: u64,
        r: Record,
        specs: &mut Vec<proto::TaskSpec>,
    ) -> Result<(), E> {
        let Ok((life, _)) = task::step(r.life(), Step::Dispatch) else { return Ok(()) };
        self.counts.moved(r.state(), life.state());
        self.in_flight.insert(id, Flight { agent, life });
        if let Some(a) = self.agents.get_mut(&agent) {
            a.ahead_ms += r.runtime_ms as u64 * r.cores as u64;
        }
        if r.flags & Record::PREEMPTIBLE != 0 {
            self.preemptible.insert((r.priority, std::cmp::Reverse(id)));
            self.preemptible_of.insert(id, r.priority);
        }
        specs.push(proto::TaskSpec {
            id,
            attempt: self.attempt_no(id, life),
            command: t.command(&r),
            shell: r.shell,
            cores: r.cores as u32,
            mem_mb: r.mem_mb,
            timeout_ms: r.timeout_ms,
            runtime_ms: r.runtime_ms,
            max_output: htc_core::taskfile::output_cap::bytes(r.max_output),
            gpus: r.gpus as u32,
            priority: r.priority as i32,
            preemptible: r.flags & Record::PREEMPTIBLE != 0,
        });
        Ok(())
    }
}

/// Tasks that run alike, for placement's runtime estimates: one class with one hint.
fn group_of(r: &Record) -> u64 {
    (r.class as u64) << 32 | r.runtime_ms as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use htc_core::partition::Even;
    use htc_core::tree::Tree;
    use std::collections::BTreeMap;

    /// Task records in memory; the command of task N is "task N".
    #[derive(Default)]
    struct Mem {
        records: BTreeMap<u64, Record>,
        attempts: Vec<(u64, Attempt)>,
        failed: Vec<u64>,
        puts: usize,
    }

    impl Mem {
        fn with(n: u64, retries: u8, cores: u16) -> Mem {
            let mut m = Mem::default();
            for id in 1..=n {
                m.records.insert(id, Record { cmd_off: id, retries, cores, ..Default::default() });
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
        fn put(&mut self, id: u64, r: &Record) -> Result<(), Self::Error> {
            self.records.insert(id, *r);
            self.puts += 1;
            Ok(())
        }
        fn put_attempt(&mut self, id: u64, a: &Attempt) -> Result<(), Self::Error> {
            self.attempts.push((id, *a));
            Ok(())
        }
        fn mark_failed(&mut self, id: u64) -> Result<(), Self::Error> {
            self.failed.push(id);
            Ok(())
        }
        fn unmark_failed(&mut self, id: u64) -> Result<(), Self::Error> {
            self.failed.retain(|&f| f != id);
            Ok(())
        }
        fn command(&self, r: &Record) -> Vec<u8> {
            format!("task {}", r.cmd_off).into_bytes()
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
        Input::Report { agent, report: proto::Report { want: n, agent, ..Default::default() } }
    }

    /// Attempt `attempt` of task `id` exited with `exit`.
    fn exited(id: u64, attempt: u32, exit: i32) -> proto::TaskResult {
        proto::TaskResult { id, attempt, outcome: proto::Outcome::Exited as i32, value: exit, ..Default::default() }
    }

    fn result(agent: u32, seq: u64, id: u64, attempt: u32, exit: i32) -> Input {
        let r = exited(id, attempt, exit);
        Input::Report { agent, report: proto::Report { seq, results: vec![r], agent, ..Default::default() } }
    }

    /// Feeds events in order; returns the frames sent and the ending, if any.
    fn feed(c: &mut Core<'_>, m: &mut Mem, events: Vec<Input>) -> (Outbox, Option<Ending>) {
        feed_at(c, m, 1_000, events)
    }

    /// As `feed`, the first event at `t0` µs.
    fn feed_at(c: &mut Core<'_>, m: &mut Mem, t0: u64, events: Vec<Input>) -> (Outbox, Option<Ending>) {
        let mut out = Vec::new();
        for (i, ev) in events.into_iter().enumerate() {
            if let Some(e) = c.handle(t0 + i as u64, m, ev, &mut out).unwrap() {
                return (out, Some(e));
            }
        }
        (out, c.ending())
    }

    /// (agent, [(id, attempt)]) of every Dispatch in `out`.
    fn dispatched(out: &Outbox) -> Vec<(u32, Vec<(u64, u32)>)> {
        out.iter()
            .filter_map(|(a, b)| match b {
                Body::Dispatch(d) => Some((*a, d.tasks.iter().map(|t| (t.id, t.attempt)).collect())),
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
            m.records.get_mut(&id).unwrap().affinity = 7 + (id % 2 == 0) as u32;
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
                on.iter().filter(|(id, _)| m.records[id].affinity == key).map(|(_, a)| *a).collect();
            assert_eq!(agents.len(), 1, "key {key}'s tasks went to {agents:?}");
        }
    }

    #[test]
    fn higher_priority_work_that_no_agent_can_take_preempts_a_lower_preemptible_task() {
        // Task 1: preemptible, priority 0; task 2: priority 5 with a retry. One agent, 2 cores.
        let mut m = Mem::with(2, 0, 1);
        m.records.get_mut(&1).unwrap().flags = Record::PREEMPTIBLE;
        let r2 = m.records.get_mut(&2).unwrap();
        (r2.priority, r2.retries) = (5, 1);
        let mut c = core(&m, 1);
        let (out, _) = feed(&mut c, &mut m, vec![join(0, 2), want(0, 2)]);
        assert_eq!(dispatched(&out), vec![(0, vec![(1, 1), (2, 1)])]);
        // Task 2 fails; the agent is busy (no idle slot): its retry waits at the leader.
        let busy = |results| Input::Report {
            agent: 0,
            report: proto::Report { seq: 1, results, idle: 0, agent: 0, ..Default::default() },
        };
        let failed = exited(2, 1, 1);
        let (out, _) = feed(&mut c, &mut m, vec![busy(vec![failed]), Input::Tick]);
        let preempts: Vec<_> = out
            .iter()
            .filter_map(|(a, b)| match b {
                Body::Preempt(p) => Some((*a, p.ids.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(preempts, vec![(0, vec![1])], "task 1 is told to stop for task 2");
        let (out, _) = feed(&mut c, &mut m, vec![Input::Tick]);
        assert!(!out.iter().any(|(_, b)| matches!(b, Body::Preempt(_))), "not twice");
        // It ends preempted: no retry used, a new attempt number; task 2 runs first.
        let pre =
            proto::TaskResult { id: 1, attempt: 1, outcome: proto::Outcome::Preempted as i32, ..Default::default() };
        let rep = Input::Report {
            agent: 0,
            report: proto::Report { seq: 2, results: vec![pre], want: 2, idle: 2, agent: 0, ..Default::default() },
        };
        let (out, _) = feed(&mut c, &mut m, vec![rep]);
        assert_eq!(dispatched(&out), vec![(0, vec![(2, 2), (1, 2)])]);
        // The ledger holds it as before this dispatch (flights live in memory), a retry richer.
        assert_eq!((m.records[&1].state(), m.records[&1].retries), (State::Pending, 1));
        assert_eq!(
            m.attempts.iter().filter(|(id, _)| *id == 1).map(|(_, a)| a.outcome).collect::<Vec<_>>(),
            [Outcome::Preempted]
        );
    }

    #[test]
    fn memory_is_committed_per_agent_and_a_big_task_waits_for_its_reservation() {
        // Tasks 1-4: 400 MiB; task 5: 900 MiB; 6-8: 100 MiB, no hints. One agent, 1000 MiB,
        // 4 cores. Even partition of one instance: all in one block.
        let mut m = Mem::with(8, 0, 1);
        for (id, r) in m.records.iter_mut() {
            r.mem_mb = match id {
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
    fn a_task_waiting_for_memory_fails_as_unschedulable_when_the_only_big_agent_is_lost() {
        let mut m = Mem::with(2, 0, 1);
        m.records.get_mut(&1).unwrap().mem_mb = 1500;
        m.records.get_mut(&2).unwrap().mem_mb = 1500;
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

    #[test]
    fn an_agent_gets_what_it_asks_for_and_results_are_recorded_then_acked() {
        let mut m = Mem::with(10, 2, 1);
        let mut c = core(&m, 1);
        let (out, end) = feed(&mut c, &mut m, vec![join(0, 2), want(0, 4)]);
        assert_eq!(dispatched(&out), vec![(0, vec![(1, 1), (2, 1), (3, 1), (4, 1)])]);
        let Body::Dispatch(d) = &out[0].1 else { unreachable!() };
        assert_eq!(d.tasks[2].command, b"task 3");
        assert_eq!(end, None);
        // A dispatch writes nothing: the ledger learns of an attempt when it ends.
        assert_eq!((m.state(1), m.puts), (State::Pending, 0));
        assert_eq!((c.counts().get(State::Dispatched), c.counts().get(State::Pending)), (4, 6));

        let started = proto::TaskStarted { id: 3, attempt: 1, start_us: 5 };
        let start = Input::Report {
            agent: 0,
            report: proto::Report { started: vec![started], agent: 0, ..Default::default() },
        };
        let (out, _) = feed(&mut c, &mut m, vec![result(0, 1, 1, 1, 0), result(0, 2, 2, 1, 0), start]);
        assert!(out.is_empty(), "no ack before the commit: {out:?}");
        assert_eq!((m.state(1), m.state(2), m.state(3)), (State::Done, State::Done, State::Pending));
        assert_eq!(m.puts, 2, "one write per finished task");
        assert_eq!((c.counts().get(State::Running), c.counts().get(State::Dispatched)), (1, 1));
        let mut acks = Vec::new();
        c.acks(&mut acks);
        assert!(
            matches!(acks.as_slice(), [(0, Body::Ack(proto::Ack { seq: 2, agent: 0, resync: false }))]),
            "{acks:?}"
        );
        c.acks(&mut acks);
        assert_eq!(acks.len(), 1, "each report is acked once");
        let (_, _) = feed(&mut c, &mut m, vec![result(0, 3, 3, 1, 0), result(0, 4, 4, 1, 0)]);
        assert_eq!(c.counts(), m.counts(), "once nothing is in flight, the counts are the records'");
        assert_eq!(m.records[&3].start_us, 0, "results carry their own start time");
    }

    #[test]
    fn instance_heads_stand_for_their_members_which_the_ledger_names() {
        // Four agents in instances of two: heads 0 and 2 are the partition's instances 0 and 1.
        let mut m = Mem::with(8, 1, 1);
        let n = m.records.len() as u64;
        let mut c = Core::new(Box::new(Even::new(1..n + 1, 2)), "job".into(), 2, m.counts(), 0)
            .with_layout(Arc::new(Tree::instances(4, 2, 2)));
        let lost = |agent: u32, id| proto::TaskResult {
            id,
            attempt: 1,
            outcome: proto::Outcome::Lost as i32,
            ran_on: Some(agent + 1),
            ..Default::default()
        };
        let from_head = |agent: u32, seq, cores, results| Input::Report {
            agent,
            report: proto::Report { seq, results, agent, cores, want: 8, ..Default::default() },
        };
        let (out, _) = feed(&mut c, &mut m, vec![join(1, 2), join(0, 2), join(2, 2), want(2, 8)]);
        assert_eq!(
            dispatched(&out),
            vec![(2, vec![(5, 1), (6, 1), (7, 1), (8, 1)])],
            "head 2 holds instance 1's share"
        );
        assert_eq!(c.progress(0).agents, 2, "a member that says Hello to the leader is ignored");

        let ok = proto::TaskResult { outcome: proto::Outcome::Exited as i32, ..lost(2, 5) };
        let (out, _) = feed(&mut c, &mut m, vec![from_head(2, 1, 4, vec![ok, lost(2, 6)])]);
        assert_eq!((m.state(5), m.records[&5].agent), (State::Done, 3), "the ledger names the member that ran it");
        assert_eq!(m.state(6), State::Pending, "lost with its member: retried");
        assert_eq!(m.records[&6].losses, 1);
        assert_eq!(
            dispatched(&out),
            vec![(2, vec![(6, 2)])],
            "the retry, a new attempt, goes back to the instance that asks"
        );
        assert_eq!(c.agents[&2].cores, 4, "the head speaks for its members' slots too");
        // A head gives back what a lost member had not reported started: it goes out again as a
        // new attempt, no loss counted.
        let give_back =
            Input::Report { agent: 2, report: proto::Report { returned: vec![7], agent: 2, ..Default::default() } };
        let (out, _) = feed(&mut c, &mut m, vec![give_back]);
        assert_eq!(dispatched(&out), vec![(2, vec![(7, 2)])], "the head still asks: to it again");
        assert_eq!(m.records[&7].losses, 0);
    }

    fn report(agent: u32, want: u32, idle: u32, done: &[(u64, u32)]) -> Input {
        let results = done
            .iter()
            .map(|&(id, attempt)| proto::TaskResult {
                id,
                attempt,
                outcome: proto::Outcome::Exited as i32,
                ..Default::default()
            })
            .collect();
        Input::Report { agent, report: proto::Report { want, idle, results, agent, ..Default::default() } }
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

    fn recalls(out: &Outbox) -> Vec<(u32, Vec<u64>)> {
        out.iter()
            .filter_map(|(a, b)| match b {
                Body::Recall(r) => Some((*a, r.ids.clone())),
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
            report: proto::Report {
                started: vec![
                    proto::TaskStarted { id: 1, attempt: 1, start_us: 5 },
                    proto::TaskStarted { id: 2, attempt: 1, start_us: 5 },
                ],
                agent: 0,
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
            report: proto::Report {
                started: vec![proto::TaskStarted { id: 19, attempt: 1, start_us: 6 }],
                recalled: nine.clone(),
                agent: 0,
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
            r.runtime_ms = if id % 2 == 0 { 320 } else { 10 };
            g.add(*id, 0, 0, r.runtime_ms);
        }
        let params = htc_core::hflow::Params { s: 0.0, d: 0.0, t: 1.0 };
        let plan = Classes::new(g.finish(), 2, 4, params);
        let mut c = Core::new(Box::new(plan), "job".into(), 2, m.counts(), 0);
        let (out, _) = feed(&mut c, &mut m, vec![join(0, 2), join(1, 2), want(0, 3), want(1, 4)]);
        assert_eq!(
            dispatched(&out),
            vec![(0, vec![(2, 1), (4, 1), (1, 1)]), (1, vec![(6, 1), (8, 1), (5, 1), (7, 1)])]
        );
    }

    /// A task no joined agent can run waits for one that can (a wider agent may still join);
    /// reports meanwhile do not offer it to every agent again and again.
    #[test]
    fn a_retry_nobody_can_take_costs_no_scan_of_every_agent_per_report() {
        let mut m = Mem::with(3, 2, 1);
        m.records.get_mut(&3).unwrap().cores = 4;
        let mut c = core(&m, 3);
        let (out, _) = feed(&mut c, &mut m, vec![join(0, 2), join(1, 2), want(0, 8), want(1, 8)]);
        assert_eq!(dispatched(&out).iter().map(|(_, t)| t.len()).sum::<usize>(), 2, "tasks 1 and 2");
        // Agent 0, idle, steals task 3 (the third agent's share): too wide, it waits as a retry.
        feed(&mut c, &mut m, vec![report(0, 1, 2, &[])]);
        assert_eq!(c.retry.iter().copied().collect::<Vec<_>>(), vec![3]);
        let scans = c.scans;
        for _ in 0..100 {
            let (out, _) = feed(&mut c, &mut m, vec![report(0, 1, 2, &[])]);
            assert!(dispatched(&out).is_empty());
        }
        assert_eq!(c.scans, scans);
        // A new retry is offered to every agent with credit at once, with one scan.
        let failed = exited(1, 1, 1);
        let who = dispatched(&out_of(
            &mut c,
            &mut m,
            Input::Report {
                agent: 0,
                report: proto::Report { seq: 1, results: vec![failed], agent: 0, ..Default::default() },
            },
        ));
        assert!(who.iter().any(|(_, t)| t.contains(&(1, 2))), "{who:?}");
        assert_eq!(c.scans, scans + 1);
    }

    fn out_of(c: &mut Core<'_>, m: &mut Mem, ev: Input) -> Outbox {
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
            r.class = if *id <= 20 { 1 } else { 2 };
            g.add(*id, 0, r.class, 0);
        }
        let plan = Classes::new(g.finish(), 1, 1, htc_core::hflow::Params { s: 0.0, d: 0.0, t: 1.0 });
        let mut c = Core::new(Box::new(plan), "job".into(), 1, m.counts(), 0);
        let n = LEARN_AFTER;
        let (out, _) = feed(&mut c, &mut m, vec![join(0, 1), want(0, n as u32)]);
        assert_eq!(dispatched(&out), vec![(0, (1..=n).map(|id| (id, 1)).collect())]);
        // They ran 10 ms each.
        let results = (1..=n)
            .map(|id| proto::TaskResult {
                id,
                attempt: 1,
                outcome: proto::Outcome::Exited as i32,
                start_us: 1_000_000 + id * 10_000,
                end_us: 1_000_000 + (id + 1) * 10_000,
                ..Default::default()
            })
            .collect();
        let done = Input::Report {
            agent: 0,
            report: proto::Report { seq: 1, results, want: 1, agent: 0, ..Default::default() },
        };
        let (out, _) = feed(&mut c, &mut m, vec![done]);
        assert_eq!(dispatched(&out), vec![(0, vec![(21, 1)])], "class 2 now goes first");
    }

    /// Long hinted tasks: past the horizon an agent gets only what it can start, however much
    /// it asks for, so the rest waits in the partition for the next free core anywhere.
    #[test]
    fn past_the_horizon_an_agent_gets_only_what_it_can_start() {
        let mut m = Mem::with(12, 2, 1);
        m.records.values_mut().for_each(|r| r.runtime_ms = 3_000);
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
        let started = proto::TaskStarted { id: 1, attempt: 1, start_us: 5 };
        let start = Input::Report {
            agent: 0,
            report: proto::Report { started: vec![started], agent: 0, ..Default::default() },
        };
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
        assert_eq!((m.records[&1].losses, m.records[&2].losses), (1, 0));
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
            matches!(out.as_slice(), [(0, Body::Ack(a))] if a.resync),
            "asked to resync (agent 7 is unknown and left alone): {out:?}"
        );
        let answer = Input::Report {
            agent: 0,
            report: proto::Report { agent: 0, resync: true, holding: vec![1], ..Default::default() },
        };
        let (out, end) = feed(&mut c, &mut m, vec![answer, want(1, 4)]);
        assert_eq!(dispatched(&out), vec![(1, vec![(2, 2), (3, 1), (4, 1)])], "task 2 again, as a new attempt");
        assert_eq!((m.records[&1].losses, m.records[&2].losses), (0, 0));
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
        let asked: Vec<u32> =
            out.iter().filter(|(_, b)| matches!(b, Body::Ack(a) if a.resync)).map(|(a, _)| *a).collect();
        assert_eq!(asked, [0], "only the agent holding tasks is asked");
        // It never got task 2.
        let answer = Input::Report {
            agent: 0,
            report: proto::Report { agent: 0, resync: true, holding: vec![1], ..Default::default() },
        };
        let mut out = Vec::new();
        c.handle(every + 3_000, &mut m, answer, &mut out).unwrap();
        c.handle(every + 3_001, &mut m, want(1, 4), &mut out).unwrap();
        assert_eq!(dispatched(&out), vec![(1, vec![(2, 2), (3, 1), (4, 1)])]);
        assert_eq!(m.records[&2].losses, 0, "an unstarted task taken back is no loss");
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
        m.records.get_mut(&2).unwrap().cores = 8;
        let mut c = core(&m, 1);
        let (out, _) = feed(&mut c, &mut m, vec![join(0, 2), want(0, 2), want(0, 1)]);
        assert_eq!(dispatched(&out), vec![(0, vec![(1, 1)])]);
        assert_eq!(m.state(2), State::Failed);
        assert_eq!(Outcome::Unschedulable as u8, m.records[&2].outcome);
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
        assert!(!out.iter().any(|(_, b)| matches!(b, Body::Shutdown(_))), "no agent is lost: {out:?}");
        assert_eq!(c.progress(0).agents, 2);
        // The reports that waited in the sockets are read; one agent then really falls silent.
        c.handle(30_000_100, &mut m, want(1, 0), &mut out).unwrap();
        for now in (30_500_000..=40_500_000).step_by(500_000) {
            c.handle(now, &mut m, Input::Tick, &mut out).unwrap();
            c.handle(now + 1, &mut m, want(1, 0), &mut out).unwrap();
        }
        assert!(out.iter().any(|(a, b)| *a == 0 && matches!(b, Body::Shutdown(_))), "silent since the stall: {out:?}");
        assert_eq!(c.progress(0).agents, 1);
    }

    #[test]
    fn a_silent_agent_is_lost_within_the_bound_and_everyone_else_hears_a_heartbeat() {
        let mut m = Mem::with(4, 0, 1);
        let mut c = core(&m, 2).with_liveness(Liveness::new(std::time::Duration::from_secs(10)));
        let started = proto::TaskStarted { id: 1, attempt: 1, start_us: 5 };
        let start = Input::Report {
            agent: 0,
            report: proto::Report { started: vec![started], agent: 0, ..Default::default() },
        };
        let mut out = Vec::new();
        for (now, ev) in [(0, join(0, 1)), (0, join(1, 1)), (1, want(0, 1)), (2, start), (3, want(1, 1))] {
            c.handle(now, &mut m, ev, &mut out).unwrap();
        }
        out.clear();
        // Most of a second on: both hear a heartbeat.
        c.handle(900_000, &mut m, Input::Tick, &mut out).unwrap();
        let beats: Vec<u32> = out.iter().filter(|(_, b)| matches!(b, Body::Ack(_))).map(|(a, _)| *a).collect();
        assert_eq!(beats.len(), 2, "{out:?}");
        // Agent 1 keeps reporting, agent 0 (task 1 running) falls silent; the leader ticks on.
        for now in (1_400_000..9_000_000).step_by(500_000) {
            c.handle(now, &mut m, Input::Tick, &mut out).unwrap();
        }
        c.handle(9_000_000, &mut m, want(1, 0), &mut out).unwrap();
        c.handle(9_500_000, &mut m, Input::Tick, &mut out).unwrap();
        out.clear();
        c.handle(10_000_001, &mut m, Input::Tick, &mut out).unwrap();
        assert!(!out.iter().any(|(_, b)| matches!(b, Body::Shutdown(_))), "not yet: {out:?}");
        c.handle(10_000_002, &mut m, Input::Tick, &mut out).unwrap();
        assert!(
            out.iter().any(|(a, b)| *a == 0
                && matches!(b, Body::Shutdown(s) if s.abort && s.reason.starts_with("silent for 10.0 s"))),
            "{out:?}"
        );
        assert_eq!(m.records[&1].losses, 1, "its running task is lost");
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
        assert!(out.iter().any(|(a, b)| *a == 0 && matches!(b, Body::Shutdown(s) if s.hold && !s.abort)), "{out:?}");
        for &id in &to0[..8] {
            assert!(matches!(m.state(id), State::Pending | State::Dispatched), "task {id}: {:?}", m.state(id));
            assert_eq!(m.records[&id].attempts, 0, "task {id}: its retry given back");
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
            m.records.get_mut(&id).unwrap().runtime_ms = if id % 2 == 0 { 100_000 } else { 1_000 };
        }
        let mut c = core(&m, 1).with_deadline(10_000_000);
        let (out, end) = feed(&mut c, &mut m, vec![join(0, 6), want(0, 6)]);
        assert_eq!(dispatched(&out), vec![(0, vec![(1, 1), (3, 1), (5, 1)])], "the 100 s tasks wait");
        assert_eq!(end, None);
        let (_, end) = feed(&mut c, &mut m, [1, 3, 5].into_iter().map(|id| result(0, id, id, 1, 0)).collect());
        assert_eq!(end, Some(Ending::OutOfTime(3)));
        assert_eq!(m.state(2), State::Pending, "left for the next session");
    }

    #[test]
    fn the_run_ends_on_a_signal_or_when_every_agent_is_gone() {
        let mut m = Mem::with(3, 2, 1);
        let mut c = core(&m, 2);
        let (_, end) = feed(&mut c, &mut m, vec![join(0, 1), Input::Interrupt { signal: 2 }]);
        assert_eq!(end, Some(Ending::Interrupted(2)));
        let mut out = Vec::new();
        c.shutdown(&Ending::Interrupted(2), &mut out);
        assert!(matches!(out.as_slice(), [(0, Body::Shutdown(proto::Shutdown { revive: false, abort: true, .. }))]));

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
        let ask =
            Input::Report { agent: 0, report: proto::Report { want: 2, idle: 1, agent: 0, ..Default::default() } };
        let (out, end) = feed(&mut c, &mut m, vec![back, ask]);
        assert_eq!(dispatched(&out), vec![(0, vec![(4, 1)])], "new work for the fresh member (its idle slot)");
        assert_eq!(end, None);
        let (_, _) = feed(&mut c, &mut m, vec![result(0, 1, 1, 1, 0)]);
        assert_eq!(m.state(1), State::Pending, "its old attempt of task 1 is not recorded");
        let mut results: Vec<Input> = (1..=2).map(|id| result(1, id, id, 2, 0)).collect();
        let ask =
            Input::Report { agent: 0, report: proto::Report { want: 1, idle: 1, agent: 0, ..Default::default() } };
        results.extend([result(0, 2, 4, 1, 0), ask, result(0, 3, 3, 1, 0)]);
        let (_, end) = feed(&mut c, &mut m, results);
        assert_eq!(end, Some(Ending::Complete));
        assert_eq!((m.records[&1].losses, m.records[&2].losses), (1, 0));
    }

    /// An agent that comes back before the leader gave it up (its lease ran out first) is given
    /// up then: what it held goes out again. A black hole stays drained.
    #[test]
    fn an_agent_back_before_it_was_given_up_loses_its_tasks_first() {
        let (mut m, mut c) = task_1_running_and_2_queued_on_agent_0();
        let back = Input::Revived { agent: 0, cores: 1, mem_mb: 0, gpus: 0, hostname: "node0".into() };
        let (out, _) = feed(&mut c, &mut m, vec![back, want(1, 2)]);
        assert_eq!(dispatched(&out), vec![(1, vec![(1, 2), (2, 2)])]);
        assert_eq!(m.records[&1].losses, 1);
    }
}
