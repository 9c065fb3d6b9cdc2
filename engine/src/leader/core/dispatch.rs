//! Handing out work: which tasks an agent gets when it asks (its share of the partition, the
//! retries, what waits for memory, what was preempted, affinity hand-overs, what others gave
//! back), and asking busy agents to give back what they have not started.
//!
//! An agent's dispatch is planned, then applied. The plan (`plan` and the `offer_*` steps) draws
//! tasks from the queues that hold them and decides where each goes: into the agent's batch,
//! back to the retries, to another agent's keys, to wait for memory or for the next session; it
//! changes no task's life. The application (`apply`) moves each picked task's life to
//! dispatched, counts it in flight and sends the batch.

use super::prelude::*;
use super::records;
use htc_core::work::TaskToRun;

/// One agent's dispatch plan: how many more it may take, what it takes, and what fits no agent.
pub(super) struct Batch {
    agent: u32,
    pub(super) want: u64,
    pub(super) picks: Vec<(u64, Record)>,
    /// The picks' ids: a task may sit in two queues (a retry that was also handed back).
    picked: IdSet<u64>,
    /// The picks' work by their hints (core·ms), ahead of what the agent has (`Agent::ahead_ms`).
    ahead_ms: u64,
    unschedulable: Vec<(u64, Record)>,
}

impl Batch {
    fn new(agent: u32, want: u64) -> Batch {
        Batch { agent, want, picks: Vec::new(), picked: IdSet::default(), ahead_ms: 0, unschedulable: Vec::new() }
    }

    fn has(&self, id: u64) -> bool {
        self.picked.contains(&id)
    }

    fn pick(&mut self, id: u64, r: Record) {
        self.picked.insert(id);
        self.ahead_ms += r.shape().runtime_ms as u64 * r.shape().cores as u64;
        self.picks.push((id, r));
        self.want = self.want.saturating_sub(1);
    }

    fn len(&self) -> u64 {
        self.picks.len() as u64
    }
}

/// Where `start` put a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placed {
    Taken,
    /// It fits the agent but may not start there yet: it waits for memory.
    Waits,
    /// It does not fit the agent (cores, GPUs or memory it has not).
    Unfit,
    /// Its hint says it cannot finish before the time limit: left for the next session.
    Late,
}

/// Tasks waiting for memory that no live agent can ever run (the only big enough one left)
/// fail as unschedulable rather than wait for ever.
pub(super) fn fail_unfit_waiting<E>(core: &mut Core<'_>, t: &mut dyn Tasks<Error = E>) -> Result<(), E> {
    if core.mem.waiting() == 0 || !all_accounted(core) {
        return Ok(());
    }
    let ids: Vec<u64> = core.mem.waiting_tasks().map(|n| n.task).collect();
    for id in ids {
        let Some(r) = t.get(id)? else { continue };
        if !schedulable(core, &r) {
            core.mem.forget(id, core.now_us);
            fail_unschedulable(core, t, id, r)?;
        }
    }
    Ok(())
}

/// Whether the task, started now, would run past `end` by its hint.
fn ends_after(core: &Core<'_>, r: &Record, end: Option<u64>) -> bool {
    end.is_some_and(|d| r.shape().runtime_ms > 0 && core.now_us + r.shape().runtime_ms as u64 * 1000 > d)
}

/// Slots `agent` may start now, less `sent` since its report, the plan's `sent` not yet in
/// flight (`Agent::can_start`).
fn can_start(core: &Core<'_>, agent: u32, sent: u64, planned: u64) -> u64 {
    core.agents[&agent].can_start(sent, core.in_flight.held(agent) + planned, heads_members(core, agent))
}

/// Tasks `agent` holds that wait unstarted (`Agent::queued`).
fn queued_at(core: &Core<'_>, agent: u32) -> u64 {
    core.agents[&agent].queued(core.in_flight.held(agent), heads_members(core, agent))
}

/// Only when nothing else waits anywhere: a task that came back and fits no idle slot (too
/// wide, no memory there) goes to the retries, and asking for more would only churn the
/// busy agent's queue.
pub(super) fn may_ask_back(core: &Core<'_>) -> bool {
    !core.no_steal && core.partition.remaining() == 0 && core.retry.is_empty() && core.mem.waiting() == 0
}

fn heads_members(core: &Core<'_>, agent: u32) -> bool {
    core.layout.as_ref().is_some_and(|t| t.instance_len(agent) > 1)
}

/// Nothing is left to hand out and slots are idle: asks agents with tasks queued beyond
/// their slots for some back (`recall`), as many as `Asking::plan` says, the tasks each
/// gives back its latest unstarted ones.
pub(super) fn ask_back(core: &mut Core<'_>, out: &mut Effects) {
    // It looks at every agent: not for each idle report (with a thousand agents idle at the
    // tail, that was seconds per turn); what was put off is done with the first input after
    // (`handle`).
    if !core.asking.due(core.now_us, core.agents.len()) {
        return;
    }
    let flights = &core.in_flight;
    core.asking
        .recalls
        .prune(|id, agent| flights.get(id).is_some_and(|f| f.agent == agent && f.life.state() != State::Running));
    let live = |a: &Agent| a.usable();
    let at = Idle {
        idle: core.agents.iter().filter(|(_, a)| live(a)).map(|(&id, _)| can_start(core, id, 0, 0)).sum(),
        slots: core.agents.values().filter(|a| live(a)).map(|a| a.cores as u64).sum(),
    };
    if core.asking.enough_underway(at.idle) {
        return;
    }
    let queued = core.agents.iter().filter(|(_, a)| live(a)).map(|(&id, _)| (id, queued_at(core, id))).collect();
    for (agent, n) in core.asking.plan(at, queued) {
        let ids = core.in_flight.unstarted_of(agent, n, |id| core.asking.recalls.is_asked(id));
        if ids.is_empty() {
            continue;
        }
        tracing::debug!(job = %core.job_id, agent, tasks = ids.len(), "queued tasks asked back for idle slots");
        core.asking.recalls.ask(agent, &ids);
        out.push(Effect::ToAgent(agent, ToAgent::Recall(ids)));
    }
}

pub(super) fn dispatch_all<E>(core: &mut Core<'_>, t: &mut dyn Tasks<Error = E>, out: &mut Effects) -> Result<(), E> {
    core.fresh_retries = false;
    core.fresh_handoffs = false;
    core.fresh_arrivals = false;
    core.figures.scans += 1;
    let ids = core.agents.with_credit();
    for agent in ids {
        dispatch(core, t, agent, out)?;
    }
    Ok(())
}

fn fits(core: &Core<'_>, agent: u32, r: &Record) -> bool {
    core.agents[&agent].fits(r.shape())
}

/// Whether some live agent could ever run the task. Meaningful only once every agent the
/// launcher started has joined or is known gone (`all_accounted`): a big node may join last.
pub(super) fn schedulable(core: &Core<'_>, r: &Record) -> bool {
    core.agents.could_run(r.shape())
}

pub(super) fn all_accounted(core: &Core<'_>) -> bool {
    core.turnout.all_accounted()
}

pub(super) fn fail_unschedulable<E>(
    core: &mut Core<'_>,
    t: &mut dyn Tasks<Error = E>,
    id: u64,
    mut r: Record,
) -> Result<(), E> {
    tracing::warn!(job = %core.job_id, task = id, cores = r.shape().cores, mem_mb = r.shape().mem_mb, gpus = r.shape().gpus, "task needs more than any agent has");
    let Some((life, _)) = core.move_life(r.life(), Step::Refuse) else { return Ok(()) };
    t.apply(&Change::Failed(id, true))?;
    r.set_unschedulable();
    records::record(core, t, id, &mut r, life)
}

/// Hands `agent` up to its credit of tasks, from five sources in turn: the retries (the
/// oldest work), what waits for memory, what was preempted, what other agents handed over
/// for its affinity keys, and its share of the partition; with nothing else for it, what
/// waits for busy agents' keys and what agents behind gave back.
pub(super) fn dispatch<E>(
    core: &mut Core<'_>,
    t: &mut dyn Tasks<Error = E>,
    agent: u32,
    out: &mut Effects,
) -> Result<(), E> {
    if core.failed_too_often().is_some()
        || (core.grace.is_some() && core.allocation_of(agent).is_none())
        || core.agents[&agent].drained
        || core.mem.runs_exclusive(agent)
        || core.leaving(agent)
        || core.settling()
    {
        return Ok(());
    }
    let (b, ask) = plan(core, t, agent)?;
    apply(core, t, b, out)?;
    if ask {
        ask_back(core, out);
    }
    Ok(())
}

/// What `agent` gets, up to its credit, and whether it has slots left idle with nothing
/// more to hand out (so that busy agents are asked for some of their queues back).
pub(super) fn plan<E>(core: &mut Core<'_>, t: &mut dyn Tasks<Error = E>, agent: u32) -> Result<(Batch, bool), E> {
    let mut b = Batch::new(agent, core.agents[&agent].credit);
    offer_retries(core, t, &mut b)?;
    offer_waiting_for_memory(core, t, &mut b)?;
    offer_preempted(core, t, &mut b)?;
    while b.want > 0 {
        let Some(id) = core.affinity.take_own(agent) else { break };
        offer(core, t, &mut b, id)?;
    }
    let drained = offer_share(core, t, &mut b)?;
    // Leftovers also for an agent that got nothing this time (its share is held back by the
    // horizon or by memory), but only a drained one asks for more back.
    let idle_left = (drained || b.picks.is_empty()) && offer_leftovers(core, t, &mut b)?;
    Ok((b, drained && idle_left))
}

/// Carries out a plan: the picks dispatched and sent, what fits no agent failed.
pub(super) fn apply<E>(
    core: &mut Core<'_>,
    t: &mut dyn Tasks<Error = E>,
    b: Batch,
    out: &mut Effects,
) -> Result<(), E> {
    for (id, r) in b.unschedulable {
        fail_unschedulable(core, t, id, r)?;
    }
    let mut specs = Vec::with_capacity(b.picks.len());
    for (id, r) in b.picks {
        take_task(core, t, b.agent, id, r, &mut specs)?;
    }
    let a = core.agents.get_mut(&b.agent).unwrap();
    a.credit = b.want;
    a.idle = a.idle.saturating_sub(specs.len() as u64);
    // A head counts what was just sent as running: it goes to members' idle slots.
    a.busy = a.busy.saturating_add(specs.len() as u32).min(a.cores);
    // The Dispatch goes first: a Recall of a task must never overtake the task itself.
    if !specs.is_empty() {
        out.push(Effect::ToAgent(b.agent, ToAgent::Dispatch(specs)));
    }
    Ok(())
}

/// The retries, oldest first; those that fit no agent yet stay queued, in order.
fn offer_retries<E>(core: &mut Core<'_>, t: &mut dyn Tasks<Error = E>, b: &mut Batch) -> Result<(), E> {
    let mut skipped = VecDeque::new();
    while b.want > 0 {
        let Some(id) = core.retry.pop_front() else { break };
        let Some(r) = t.get(id)? else { continue };
        if r.state() != State::Pending || core.in_flight.contains(id) || b.has(id) {
            continue;
        }
        if start(core, b, id, r) == Placed::Unfit {
            if all_accounted(core) && !schedulable(core, &r) {
                b.unschedulable.push((id, r));
            } else {
                skipped.push_back(id);
            }
        }
    }
    skipped.append(&mut core.retry);
    core.retry = skipped;
    Ok(())
}

/// What waits for memory, oldest first, where it may start now.
fn offer_waiting_for_memory<E>(core: &mut Core<'_>, t: &mut dyn Tasks<Error = E>, b: &mut Batch) -> Result<(), E> {
    while b.want > 0 {
        let Some(need) = core.mem.take_waiting(b.agent, core.now_us) else { break };
        match t.get(need.task)? {
            Some(r) if r.state() == State::Pending && !core.in_flight.contains(need.task) && !b.has(need.task) => {
                b.pick(need.task, r);
            }
            _ => core.mem.ended(b.agent, need.task),
        }
    }
    Ok(())
}

/// What was preempted, unless higher-priority work is still to be handed out.
fn offer_preempted<E>(core: &mut Core<'_>, t: &mut dyn Tasks<Error = E>, b: &mut Batch) -> Result<(), E> {
    while b.want > 0 {
        let Some(id) = core.preemption.next_again() else { break };
        let Some(r) = t.get(id)? else {
            core.preemption.take_next_again();
            continue;
        };
        if core.top_waiting(t)?.is_some_and(|(p, _)| p > r.shape().priority) {
            break;
        }
        core.preemption.take_next_again();
        offer(core, t, b, id)?;
    }
    Ok(())
}

/// The agent's share of the partition (stealing from others' when its own is done); says
/// whether the partition had nothing more for it. Tasks refused for memory in this offer:
/// past a core's worth, the rest of the partition is left for later offers rather than
/// pulled into the waiting queue; so are tasks handed to other agents for their affinity
/// keys, past a few per core.
fn offer_share<E>(core: &mut Core<'_>, t: &mut dyn Tasks<Error = E>, b: &mut Batch) -> Result<bool, E> {
    let (mut refused, mut handed) = (0u64, 0u64);
    let cores = core.agents[&b.agent].cores.max(1) as u64;
    while b.want > 0 && refused < cores && handed < 8 * cores + 32 {
        let a = &core.agents[&b.agent];
        // Its last report's idle slots, less what was sent since; and never more than its
        // cores minus what it holds: reports sent before a dispatch arrived still say idle.
        let free = (a.cores as u64).saturating_sub(core.in_flight.held(b.agent) + b.len());
        let steal = a.idle.saturating_sub(b.len()).min(free);
        let room = match core.horizon_ms {
            None => b.want,
            Some(h) if a.ahead_ms + b.ahead_ms >= h * a.cores as u64 => steal,
            // In steps of a core's worth, checking the horizon after each.
            Some(_) => b.want.min(a.cores.max(1) as u64),
        };
        // With memory or GPUs full, a block past what could start would go whole into the
        // waiting queue, a costlier path per task than the partition: no more than that, or a
        // core's worth (tasks that declare neither still flow; the run's first offer learns
        // what its tasks declare).
        let room = core.mem.could_start(b.agent).map_or(room, |fit| room.min(fit.max(cores)));
        if room == 0 {
            return Ok(false);
        }
        let steal = if core.no_steal { 0 } else { steal };
        let Some(block) = core.partition.take(a.instance, room, steal) else { return Ok(true) };
        let records = match block {
            Block::Range(r) => t.range(r)?,
            Block::Ids(ids) => ids
                .into_iter()
                .filter_map(|id| t.get(id).transpose().map(|r| r.map(|r| (id, r))))
                .collect::<Result<_, _>>()?,
        };
        for (id, r) in records {
            if r.state() != State::Pending || core.in_flight.contains(id) || b.has(id) || core.deps.is_waiting(id) {
                continue; // done in an earlier session, out already, or waiting for others
            }
            if hand_to_key_owner(core, b.agent, id, &r) {
                handed += 1;
            } else {
                match start(core, b, id, r) {
                    Placed::Taken | Placed::Late => {}
                    Placed::Waits => refused += 1,
                    Placed::Unfit => core.push_retry(id),
                }
            }
        }
    }
    Ok(false)
}

/// Keys spread over every agent expected, joined yet or not: one that joins late finds its
/// keys' tasks waiting for it. Says whether the task went to another agent's keys.
fn hand_to_key_owner(core: &mut Core<'_>, agent: u32, id: u64, r: &Record) -> bool {
    if r.shape().affinity == 0 {
        return false;
    }
    let Route::To(other) = core.affinity.route(r.shape().affinity, agent) else { return false };
    if !core.agents.get(&other).is_none_or(|a| a.alive && !a.drained) {
        return false;
    }
    core.affinity.defer(other, id);
    core.fresh_handoffs = true;
    true
}

/// Nothing else for the agent: rather than idle, it runs what waits for busy agents' keys,
/// as much as it can start now; then what agents that are behind gave back, with its share
/// of queue. Says whether slots are still idle, so that more of their queues may be asked
/// back.
fn offer_leftovers<E>(core: &mut Core<'_>, t: &mut dyn Tasks<Error = E>, b: &mut Batch) -> Result<bool, E> {
    let mut can_start = can_start(core, b.agent, b.len(), b.len());
    while b.want > 0 && can_start > 0 {
        let Some(id) = core.affinity.steal(b.agent) else { break };
        if offer(core, t, b, id)? {
            can_start -= 1;
        }
    }
    let mut room = can_start.saturating_mul(1 + core.asking.share());
    let before = b.len();
    while b.want > 0 && room > 0 {
        let Some(id) = core.asking.recalls.take() else { break };
        if offer(core, t, b, id)? {
            room -= 1;
        }
    }
    can_start = can_start.saturating_sub(b.len() - before);
    Ok(can_start > 0 && may_ask_back(core))
}

/// Offers a task that was set aside (preempted, an affinity queue, given back) to the
/// batch's agent: sent if it fits and may start, else back to the retries (it fits no
/// agent now) or waiting for memory; true when it was taken.
fn offer<E>(core: &mut Core<'_>, t: &mut dyn Tasks<Error = E>, b: &mut Batch, id: u64) -> Result<bool, E> {
    let Some(r) = t.get(id)? else { return Ok(false) };
    if r.state() != State::Pending || core.in_flight.contains(id) || b.has(id) {
        return Ok(false);
    }
    Ok(match start(core, b, id, r) {
        Placed::Taken => true,
        Placed::Waits | Placed::Late => false,
        Placed::Unfit => {
            core.push_retry(id);
            false
        }
    })
}

/// The one ladder every source of work goes down: a task its hint says cannot finish
/// before the time limit (the latest of the allocations') is left for the next session; a
/// pending task that fits the batch's agent and may start there (memory, GPUs) is picked
/// for the batch; one that fits but may not start yet waits for memory (`admit` queued it);
/// one that does not fit is the caller's to place.
fn start(core: &mut Core<'_>, b: &mut Batch, id: u64, r: Record) -> Placed {
    if ends_after(core, &r, core.run_ends_us()) {
        core.late.insert(id);
        return Placed::Late;
    }
    // Too late for this agent's allocation, not for a later one's: it runs there.
    if !fits(core, b.agent, &r) || ends_after(core, &r, core.ends_of(b.agent)) {
        return Placed::Unfit;
    }
    if !admit(core, b.agent, id, &r) {
        return Placed::Waits;
    }
    b.pick(id, r);
    Placed::Taken
}

fn admit(core: &mut Core<'_>, agent: u32, id: u64, r: &Record) -> bool {
    let need = Need {
        task: id,
        mem_mb: r.shape().mem_mb as u64,
        cores: r.shape().cores as u32,
        gpus: r.shape().gpus as u32,
        runtime_us: r.shape().runtime_ms as u64 * 1000,
        group: group_of(r),
        exclusive: r.shape().exclusive,
    };
    if core.mem.admit(agent, need, core.now_us).is_ok() {
        return true;
    }
    core.mem.wait(need, core.now_us);
    false
}

fn take_task<E>(
    core: &mut Core<'_>,
    t: &mut dyn Tasks<Error = E>,
    agent: u32,
    id: u64,
    r: Record,
    specs: &mut Vec<TaskToRun>,
) -> Result<(), E> {
    let Some((life, _)) = core.move_life(r.life(), Step::Dispatch) else { return Ok(()) };
    core.in_flight.insert(id, Flight { agent, life });
    if let Some(a) = core.agents.get_mut(&agent) {
        a.ahead_ms += r.shape().runtime_ms as u64 * r.shape().cores as u64;
    }
    if r.shape().preemptible {
        core.preemption.dispatched(id, r.shape().priority);
    }
    specs.push(TaskToRun {
        id,
        attempt: life.attempt_no(),
        command: t.command(&r),
        shell: r.shell(),
        shape: r.shape().for_agent(),
    });
    Ok(())
}
/// Tasks that run alike, for placement's runtime estimates: one class with one hint.
pub(super) fn group_of(r: &Record) -> u64 {
    (r.shape().class as u64) << 32 | r.shape().runtime_ms as u64
}
