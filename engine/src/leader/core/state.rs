//! The core's state: its fields, how a core is built, the helpers every handler shares, and what
//! the core shows (progress, the live view, the figures `htc status` reports).

use std::collections::VecDeque;
use std::sync::Arc;

use htc_core::affinity::Affinity;
use htc_core::arrivals::Arrivals;
use htc_core::backfill::{self, Memory};
use htc_core::hist::Summary;
use htc_core::idmap::{IdMap, IdSet};
use htc_core::partition::Partition;
use htc_core::record::Record;
use htc_core::task::{self, Counts, Life, Step};
use htc_core::tree::Tree;

use super::super::effect::Effects;
use crate::live;
use crate::liveness::Liveness;

use super::allocation::{Allocation, Stage};
use super::asking::Asking;
use super::deps::Deps;
use super::figures::Figures;
use super::flights::{Flight, Flights};
use super::input::{Progress, Tasks};
use super::open::Openness;
use super::preemption::Preemption;
use super::roster::{Agent, Agents};
use super::settling::Settling;
use super::turnout::Turnout;
use super::{nodes_back, open};
use htc_core::salvage::Told;
use std::ops::Range;

pub struct Core<'a> {
    /// The plan of the tasks the run started with, and what arrived since (`Arrivals`).
    pub(super) partition: Arrivals<'a>,
    /// Which tasks wait for which (`deps`).
    pub(super) deps: Deps,
    /// An open run's state (`adds`); `None`: the run's tasks are those it started with.
    pub(super) open: Option<open::Openness>,
    /// Answers to adds, held until their tasks are committed (`acks`).
    pub(super) answers: Effects,
    /// Who came, who never did, the last loss (`turnout`).
    pub(super) turnout: Turnout,
    pub(super) job_id: String,
    pub(super) agents: Agents,
    pub(super) retry: VecDeque<u64>,
    /// Ids joined `retry` since agents other than the reporting one were last offered them.
    pub(super) fresh_retries: bool,
    /// Tasks arrived since agents were last all offered work (added, or ready now that what
    /// they waited for ended): an idle agent with credit takes them at once, not at its next
    /// report.
    pub(super) fresh_arrivals: bool,
    /// Asking queued work back for idle slots at the tail (`asking`).
    pub(super) asking: Asking,
    /// What this session has to show (`figures`).
    pub(super) figures: Figures,
    pub(super) in_flight: Flights,
    pub(super) counts: Counts,
    pub(super) horizon_ms: Option<u64>,
    /// Who heads which instance; without it every agent is an instance of its own.
    pub(super) layout: Option<Arc<Tree>>,
    /// Fail fast: stop starting tasks once this many failed for good in this session.
    pub(super) max_fails: Option<u64>,
    /// The time limit (the Slurm job's end, `--time-limit`): a task whose runtime hint would
    /// not end before it is set aside for the next session.
    pub(super) deadline_us: Option<u64>,
    pub(super) late: IdSet<u64>,
    /// The time of the input being handled.
    pub(super) now_us: u64,
    /// The agents were told to start nothing more (`max_fails` reached, or a grace).
    pub(super) told_to_hold: bool,
    /// Signalled with a grace (`Input::Grace`): the signal, and when the run ends at the latest.
    pub(super) grace: Option<(i32, u64)>,
    /// An agent said it was signalled, and the driver was asked about a grace (`Effect::Signalled`).
    pub(super) asked_grace: bool,
    /// Rejoined agents asked to resync, with the tasks they held when asked: those they do not
    /// list in their answer were lost on the way with the relay.
    pub(super) resyncs: IdMap<u32, Vec<u64>>,
    pub(super) live: Liveness,
    /// When every agent was last asked what it holds (`audit`).
    pub(super) audit_us: u64,
    /// When time last passed (`Input::Tick`, every 100 ms from the driver): a longer gap is the
    /// leader's own stall, not its agents' silence.
    pub(super) ticked_us: u64,
    /// Memory committed on each agent, tasks waiting for it, reservations (`backfill`).
    pub(super) mem: Memory,
    /// Which agent each `affinity=` key runs on, and the tasks handed to each (`affinity`).
    pub(super) affinity: Affinity,
    /// Tasks were handed to other agents' affinity queues since agents were last all offered
    /// work: an idle one may take them.
    pub(super) fresh_handoffs: bool,
    /// Preemptible tasks in flight, those being stopped, those to run again (`preemption`).
    pub(super) preemption: Preemption,
    /// Instances never take from another's share (`--no-steal`, for measuring what moving
    /// work from a loaded instance to an idle one gains), nor ask queued tasks back.
    pub(super) no_steal: bool,
    /// The allocations that joined the run (`attach`), in the order they came.
    pub(super) allocations: Vec<Allocation>,
    /// This session took the run over: the wait for the agents that kept their tasks.
    pub(super) settling: Option<Settling>,
    /// What the last session's agents journaled of the attempts they started and had not
    /// ended, by task id: interrupted once the wait is over, unless an agent brought them.
    pub(super) awaiting: Vec<htc_core::salvage::Told>,
    /// Agents that came from a hand-over: what they hold or ran may be pending here.
    pub(super) adoptees: IdSet<u32>,
    /// Those of them from other allocations than this leader's own, each an instance of its own
    /// until their launcher attaches again (`keep_ids`).
    pub(super) strays: IdSet<u32>,
    /// Nodes of the run's own allocation given back at its tail (`give_back`).
    pub(super) give_back: nodes_back::GiveBack,
}

impl<'a> Core<'a> {
    // Building a core.

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

    /// An open run: it does not end when its tasks are done, but once closed (or idle for
    /// `idle_exit_us`), and takes tasks while it runs (`Input::Add`).
    pub fn open(mut self, idle_exit_us: Option<u64>) -> Self {
        self.open = Some(Openness { closed: false, idle_exit_us, busy_us: self.now_us });
        self
    }

    /// Gives back the nodes of the leader's own allocation that hold nothing once the run has
    /// nothing waiting (`give_back`): never the leader's own node (`leader_node`, as its
    /// agents name it).
    pub fn giving_back_nodes(mut self, leader_node: String) -> Self {
        self.give_back.leader_node = Some(leader_node);
        self
    }

    /// How long a node of an open run stands idle before it is given back (`OPEN_IDLE_US` by
    /// default): the longer, the likelier the run's next tasks find it still there.
    pub fn open_idle_before_give_back(mut self, us: u64) -> Self {
        self.give_back.open_idle_us = Some(us);
        self
    }

    /// The layout's heads, and `others` agents of other allocations, come from a hand-over
    /// holding tasks: nothing is handed out until each has said what it holds, or `wait_us`
    /// has passed. `awaiting`: the journal entries of the tasks whose started attempts wait for
    /// their agent's word (`htc_core::salvage` with `Survivors::Maybe` left them).
    pub fn expecting_handover(mut self, wait_us: u64, others: usize, mut awaiting: Vec<Told>) -> Self {
        let heads = self.layout.as_ref().map(|t| t.heads().to_vec()).unwrap_or_default();
        self.settling = Some(Settling::new(heads, others, self.now_us + wait_us));
        awaiting.sort_by_key(|t| t.id);
        self.awaiting = awaiting;
        self
    }

    // Helpers the handlers share: each keeps one invariant of the state.

    /// An open run that does not end yet: not closed, and not idle for its idle time.
    pub(super) fn stays_open(&self) -> bool {
        let Some(o) = self.open else { return false };
        !o.closed && o.idle_exit_us.is_none_or(|idle| self.now_us.saturating_sub(o.busy_us) < idle)
    }

    /// The partition index of the instance `agent` heads; `None` for an agent that heads none.
    pub(super) fn instance_of(&self, agent: u32) -> Option<usize> {
        match &self.layout {
            Some(t) => t.instance_index(agent),
            None => Some(agent as usize),
        }
    }

    /// An agent (or one given up, back empty) takes part in placement: memory and GPUs to
    /// commit, and a share of the affinity keys.
    pub(super) fn place(&mut self, agent: u32, cores: u32, mem_mb: u64, gpus: u32) {
        self.mem.join(agent, mem_mb, cores, gpus);
        self.affinity.join(agent);
    }

    /// Takes `agent` into placement and dispatch, drawing on `instance`'s share.
    pub(super) fn enroll(
        &mut self,
        agent: u32,
        instance: usize,
        (cores, mem_mb, gpus): (u32, u64, u32),
        hostname: String,
    ) {
        self.place(agent, cores, mem_mb, gpus);
        self.agents.insert(agent, Agent::new(instance, (cores, mem_mb, gpus), hostname, self.now_us));
    }

    /// The allocation `agent` belongs to: `None` for the leader's own.
    pub(super) fn allocation_of(&self, agent: u32) -> Option<usize> {
        self.allocations.iter().position(|a| a.agents.contains(&agent))
    }

    /// When `agent` must be done: its allocation's end, or the run's time limit.
    pub(super) fn ends_of(&self, agent: u32) -> Option<u64> {
        match self.allocation_of(agent) {
            Some(i) => self.allocations[i].ends_us,
            None => self.deadline_us,
        }
    }

    /// The latest end of the allocations still running: a task that cannot finish before it
    /// waits for the next session. `None` while one has no end.
    pub(super) fn run_ends_us(&self) -> Option<u64> {
        let joined = self.allocations.iter().filter(|a| a.stage == Stage::Running).map(|a| a.ends_us);
        std::iter::once(self.deadline_us).chain(joined).try_fold(0, |m, e| e.map(|e| m.max(e)))
    }

    /// Whether `agent` was told to leave with its allocation, or with its node (`give_back`).
    pub(super) fn leaving(&self, agent: u32) -> bool {
        self.give_back.leaving(agent)
            || self.allocation_of(agent).is_some_and(|i| self.allocations[i].stage != Stage::Running)
    }

    /// Splits what is not handed out yet over the live instances by their cores (eq. 10 once
    /// every instance runs). An instance expected but not joined yet counts as an average one,
    /// unless its allocation is gone; a lost, drained or leaving one gets nothing.
    pub(super) fn replan(&mut self) {
        let Some(tree) = &self.layout else { return };
        let live: Vec<u64> = self.agents.values().filter(|a| a.alive && !a.drained).map(|a| a.cores as u64).collect();
        let average = (live.iter().sum::<u64>() / live.len().max(1) as u64).max(1);
        let weights: Vec<u64> = tree
            .heads()
            .iter()
            .map(|&h| match self.agents.get(&h) {
                Some(a) if a.alive && !a.drained && !self.leaving(h) => a.cores.max(1) as u64,
                Some(_) => 0,
                None if self.leaving(h) => 0,
                None => average,
            })
            .collect();
        tracing::debug!(job = %self.job_id, instances = weights.len(), left = self.partition.remaining(), "re-planned the partition");
        self.partition.replan(&htc_core::partition::live_weights(&weights));
    }

    /// Whether the run has allocations beyond the leader's own (re-plans happen only then: a
    /// single allocation keeps HFlow's static plan, its lost instances' shares stolen).
    pub(super) fn has_joined(&self) -> bool {
        !self.allocations.is_empty()
    }

    pub(super) fn push_retry(&mut self, id: u64) {
        self.retry.push_back(id);
        self.fresh_retries = true;
    }

    /// Whether the leader still waits for the agents of a hand-over.
    pub(super) fn settling(&self) -> bool {
        self.settling.is_some()
    }

    /// Whether `agent` came from a hand-over: what it holds or ran may be pending here.
    pub(super) fn is_adoptee(&self, agent: u32) -> bool {
        !self.adoptees.is_empty() && self.adoptees.contains(&agent)
    }

    /// The highest priority of work waiting to be handed out (the partition's, the retries'),
    /// and how many tasks have it.
    pub(super) fn top_waiting<E>(&self, t: &dyn Tasks<Error = E>) -> Result<Option<(i16, u64)>, E> {
        let mut top = self.partition.top_priority();
        for &id in self.retry.iter().take(64) {
            let Some(r) = t.get(id)? else { continue };
            top = match top {
                Some((p, n)) if p == r.shape().priority => Some((p, n + 1)),
                Some((p, _)) if p > r.shape().priority => top,
                _ => Some((r.shape().priority, 1)),
            };
        }
        Ok(top)
    }

    /// Tasks failed for good in this session, when that reached `--max-fails`.
    pub(super) fn failed_too_often(&self) -> Option<u64> {
        let failed = self.figures.failed_since(&self.counts);
        self.max_fails.filter(|&n| failed >= n).map(|_| failed)
    }

    /// Moves a task's life by `task::step`, and the counts with it: the one way a task's state
    /// changes in the core. `None` for a step its state does not allow (a stale report, say),
    /// which changes nothing.
    pub(super) fn move_life(&mut self, from: Life, s: Step) -> Option<(Life, task::Effect)> {
        self.counts.step(from, s).ok()
    }

    /// Takes an attempt out of flight, and its memory off its agent.
    pub(super) fn land(&mut self, id: u64) -> Option<Flight> {
        let f = self.in_flight.remove(id)?;
        self.mem.ended(f.agent, id);
        self.preemption.landed(id);
        Some(f)
    }

    // What the core shows.

    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// Tasks finished before this session started.
    pub fn finished_start(&self) -> u64 {
        self.figures.finished_start()
    }

    pub fn progress(&self, now_us: u64) -> Progress {
        Progress {
            counts: self.counts,
            elapsed: std::time::Duration::from_micros(now_us.saturating_sub(self.figures.started_us())),
            finished_this_session: self.figures.finished_since(&self.counts),
            agents: self.agents.values().filter(|a| a.alive).count(),
            blocked: self.blocked(),
            joined_running: self.allocations.iter().filter(|a| a.stage == Stage::Running).count(),
        }
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
            session_start_us: self.figures.started_us(),
            state: state.into(),
            counts: self.counts,
            finished_start: self.figures.finished_start(),
            blocked: self.blocked(),
            nodes,
            failures: self.figures.recent_failures().cloned().collect(),
            allocations: self.allocations.iter().map(|a| self.allocation_view(a)).collect(),
        }
    }

    pub(super) fn allocation_view(&self, a: &Allocation) -> live::Allocation {
        let tasks = self.agents.iter().filter(|(id, _)| a.agents.contains(id)).map(|(_, x)| x.done + x.failed).sum();
        live::Allocation {
            job: a.job.clone(),
            first_agent: a.agents.start,
            agents: a.agents.len() as u32,
            nodes: a.nodes,
            ends_us: a.ends_us.unwrap_or(0),
            state: a.stage.name().into(),
            tasks,
        }
    }

    /// Reports handled in this session and the results they carried.
    pub fn report_sizes(&self) -> Summary {
        self.figures.report_sizes()
    }

    /// How long results took from their end to the leader, in microseconds, in this session.
    pub fn result_delays(&self) -> Summary {
        self.figures.result_delays()
    }

    /// Tasks moved from an agent that was behind to idle slots, in this session.
    pub fn moved_back(&self) -> u64 {
        self.asking.recalls.moved
    }

    /// Pending tasks that wait for others (`after=`).
    pub fn blocked(&self) -> u64 {
        self.deps.waiting() as u64
    }

    /// Tasks that wait for others to end.
    pub fn waiting(&self) -> usize {
        self.deps.waiting()
    }

    /// Whether the run takes tasks now.
    pub fn is_open(&self) -> bool {
        self.open.is_some_and(|o| !o.closed)
    }

    /// Whether the run was started open (closed since or not): one a client may close.
    pub fn is_open_run(&self) -> bool {
        self.open.is_some()
    }

    /// How long an open run (not closed) has had nothing to do; `None` while it has, or for a
    /// run that is not open.
    pub fn idle_us(&self) -> Option<u64> {
        let o = self.open.filter(|o| !o.closed)?;
        (self.counts.unfinished() == 0).then(|| self.now_us.saturating_sub(o.busy_us))
    }

    /// Task `id` as a client sees it now, from its record and what the core knows beyond it (an
    /// attempt out to an agent, a wait for other tasks).
    pub fn status_of(&self, id: u64, r: &Record) -> htc_core::record::TaskStatus {
        let now = self.in_flight.get(id).map_or(r.state(), |f| f.life.state());
        htc_core::record::TaskStatus::of(id, r, now, self.deps.is_waiting(id))
    }

    /// The run's allocations besides the leader's own, as they stand.
    pub fn allocations(&self) -> &[Allocation] {
        &self.allocations
    }

    /// Joined allocations that are over (left, or their job ended): a grown job among them no
    /// longer counts against the run's bound.
    pub fn allocations_over(&self) -> impl Iterator<Item = &str> {
        self.allocations.iter().filter(|a| a.stage != Stage::Running).map(|a| a.job.as_str())
    }

    /// The run as a growing run's policy sees it (`htc_core::grow`): tasks left and what one
    /// costs (measured once a few ran), the allocations working and their ends.
    pub fn grow_situation(&self, now_us: u64, own_minutes: u64) -> htc_core::grow::Situation {
        let alive = |range: Option<&Range<u32>>| -> u64 {
            self.agents
                .iter()
                .filter(|(id, a)| a.alive && range.map_or(self.allocation_of(**id).is_none(), |r| r.contains(id)))
                .map(|(_, a)| a.cores as u64)
                .sum()
        };
        let mut live = vec![(alive(None), self.deadline_us)];
        for a in self.allocations.iter().filter(|a| a.stage == Stage::Running) {
            live.push((alive(Some(&a.agents)), a.ends_us));
        }
        htc_core::grow::Situation {
            now_us,
            tasks_left: self.counts.unfinished(),
            task_core_s: self.figures.task_core_s(htc_core::partition::LEARN_AFTER),
            live,
            joined: self.allocations.iter().map(|a| a.job.clone()).collect(),
            cores_per_node: self.agents.values().filter(|a| a.alive).map(|a| a.cores as u64).max().unwrap_or(1),
            own_minutes,
            others_waiting: false,
            idle_us: self.idle_us(),
        }
    }

    /// The nodes given back so far.
    pub fn nodes_given_back(&self) -> &[String] {
        &self.give_back.given
    }

    pub fn all_agents_gone(&self) -> bool {
        self.turnout.all_gone(self.agents.values().filter(|a| a.alive).count())
    }
}
