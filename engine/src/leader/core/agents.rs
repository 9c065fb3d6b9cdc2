//! The agents' lives: joining and placement, loss (silence, a closed link), rejoining after a
//! relay's loss, revival after being given up, resync of what they hold, and the audit that
//! finds tasks lost in transit.

use super::prelude::*;
use super::{dispatch, give_back, results, returns};

/// How many report to the leader: the instance heads.
pub(super) fn reporters(core: &Core<'_>) -> usize {
    core.layout.as_ref().map_or(core.turnout.expected(), |t| t.heads().len())
}

pub(super) fn lose<E>(
    core: &mut Core<'_>,
    t: &mut dyn Tasks<Error = E>,
    agent: u32,
    why: &str,
    now_us: u64,
    out: &mut Effects,
) -> Result<(), E> {
    let Some(a) = core.agents.get_mut(&agent).filter(|a| a.alive) else { return Ok(()) };
    a.alive = false;
    let leaving = core.leaving(agent);
    let a = core.agents.get_mut(&agent).expect("checked above");
    if core.told_to_hold || a.drained || leaving {
        tracing::info!(job = %core.job_id, agent, host = %a.hostname, "agent left, as told");
        core.turnout.lost(now_us, None);
    } else {
        tracing::warn!(job = %core.job_id, agent, host = %a.hostname, %why, "agent lost");
        core.turnout.lost(now_us, Some(format!("agent {agent} on {}: {why}", a.hostname)));
    }
    requeue_agent(core, t, agent, now_us)?;
    if core.has_joined() {
        core.replan();
    }
    core.mem.leave(agent);
    for id in core.affinity.leave(agent) {
        core.push_retry(id);
    }
    dispatch::fail_unfit_waiting(core, t)?;
    give_back::left_with_node(core, agent, out);
    dispatch::dispatch_all(core, t, out)
}

/// Time passed without a tick for longer than a hold: the leader itself stood still (SIGSTOP,
/// a starved or swapped-out process, a long disk stall). What its agents sent meanwhile waits
/// unread in its sockets, so the stall is not counted as their silence: an agent is judged
/// only on time the leader was there to hear it.
pub(super) fn excuse_own_stall(core: &mut Core<'_>, now_us: u64) {
    let gap = now_us.saturating_sub(core.ticked_us);
    core.ticked_us = now_us;
    if gap <= core.live.hold_us {
        return;
    }
    tracing::warn!(stalled_s = gap as f64 / 1e6, "the leader stood still; its agents' silence in that time is excused");
    core.agents.excuse(gap, now_us);
}

/// A lost agent's attempts: those that had started count as lost (the task may be what
/// killed the agent); those still queued there go back to the queue as if never sent.
fn requeue_agent<E>(core: &mut Core<'_>, t: &mut dyn Tasks<Error = E>, agent: u32, now_us: u64) -> Result<(), E> {
    // In id order, so that the same events always give the same decisions.
    for id in core.in_flight.of_agent(agent) {
        recall(core, t, agent, id, now_us)?;
    }
    Ok(())
}

/// Task `id`, in flight with `agent`, will not end there: a started attempt is lost (no
/// retry used unless it keeps happening), an unstarted one is taken back.
pub(super) fn recall<E>(
    core: &mut Core<'_>,
    t: &mut dyn Tasks<Error = E>,
    agent: u32,
    id: u64,
    now_us: u64,
) -> Result<(), E> {
    let start_us = core.in_flight.start_of(id).unwrap_or(0);
    let Some(f) = core.land(id) else { return Ok(()) };
    if f.life.state() == State::Running {
        if let Some(mut r) = t.get(id)? {
            let lost = Ended::new(Outcome::Lost, 0, start_us, now_us);
            results::finish_attempt(core, t, id, &mut r, f, agent, lost)?;
        }
    } else {
        core.in_flight.insert(id, f);
        returns::take_back(core, t, agent, id)?;
    }
    Ok(())
}

/// An agent (and those it relays for) came back around a lost relay: each is asked which
/// tasks it holds, since frames both ways may have died with the relay.
pub(super) fn rejoined(core: &mut Core<'_>, agent: u32, below: Vec<u32>, now_us: u64, out: &mut Effects) {
    for a in std::iter::once(agent).chain(below) {
        if a == agent && !core.agents.contains_key(&a) && member_s_instance(core, a).is_some() {
            // A member around its lost head: what it holds went back with the head (or will,
            // once the head is found lost), so it stops it and comes back empty.
            let reason = "its instance head is gone: come back empty to the leader".to_string();
            effect::give_up(out, a, reason);
            continue;
        }
        let Some(x) = core.agents.get_mut(&a) else { continue };
        if !x.alive {
            if a == agent {
                // Given up already: its tasks run elsewhere, so it must not run them too.
                let why = "rejoined after it was given up".to_string();
                effect::give_up(out, a, why);
            }
            continue;
        }
        tracing::info!(job = %core.job_id, agent = a, host = %x.hostname, "rejoined around a lost relay");
        x.heard_us = now_us;
        out.push(Effect::ToAgent(a, ToAgent::Resync { seq: x.acked_seq }));
        core.resyncs.insert(a, core.in_flight.of_agent(a));
    }
}

/// A given-up agent back, empty. Should the leader not have given it up yet (the agent's
/// lease ran out first), it does so now: the agent stopped what it held. A black hole stays
/// drained; an agent that never joined is not a member to revive.
#[allow(clippy::too_many_arguments)]
pub(super) fn revived<E>(
    core: &mut Core<'_>,
    t: &mut dyn Tasks<Error = E>,
    agent: u32,
    (cores, mem_mb, gpus): (u32, u64, u32),
    hostname: String,
    now_us: u64,
    out: &mut Effects,
) -> Result<(), E> {
    if !core.agents.contains_key(&agent) && !core.told_to_hold {
        if let Some(instance) = member_s_instance(core, agent) {
            // Its head is gone (or gave it up): it works on for its instance, from here.
            tracing::info!(job = %core.job_id, agent, %hostname, "a member back without its head: it reports to the leader now");
            core.enroll(agent, instance, (cores, mem_mb, gpus), hostname);
            return Ok(());
        }
    }
    let Some(a) = core.agents.get(&agent) else {
        let reason = "never joined this session".to_string();
        out.push(Effect::stop(agent, Stop::Abort, reason));
        return Ok(());
    };
    if a.drained || core.told_to_hold {
        let reason = if a.drained { "drained as a black hole" } else { "the run starts nothing more" }.to_string();
        out.push(Effect::stop(agent, Stop::Hold, reason));
        return Ok(());
    }
    if a.alive {
        lose(core, t, agent, "came back empty after its lease ran out", now_us, out)?;
    }
    let a = core.agents.get_mut(&agent).expect("checked above");
    tracing::info!(job = %core.job_id, agent, %hostname, "given up before, back as a fresh member");
    (a.alive, a.heard_us, a.cores, a.mem_mb, a.gpus, a.hostname) = (true, now_us, cores, mem_mb, gpus, hostname);
    a.widest = cores;
    (a.credit, a.idle, a.ahead_ms, a.busy) = (0, 0, 0, 0);
    a.streak.succeeded();
    core.place(agent, cores, mem_mb, gpus);
    core.resyncs.remove(&agent);
    Ok(())
}

/// Tasks lost in transit (HTDcr's T_loss): rather than guess from runtimes when a task is
/// overdue, which would re-run long tasks that are fine, every agent holding tasks is asked
/// now and then which it holds (one pass over the tasks in flight), and what it does not
/// hold is re-run (`resynced`). A lost dispatch or result thus costs at most this period.
pub(super) fn audit(core: &mut Core<'_>, out: &mut Effects) {
    let mut by_agent: HashMap<u32, Vec<u64>> = HashMap::new();
    for (id, f) in core.in_flight.by_id.iter().enumerate() {
        if f.agent != u32::MAX {
            by_agent.entry(f.agent).or_default().push(id as u64);
        }
    }
    for (agent, ids) in by_agent {
        let Some(a) = core.agents.get(&agent).filter(|a| a.alive && !a.drained) else { continue };
        if core.resyncs.contains_key(&agent) {
            continue;
        }
        out.push(Effect::ToAgent(agent, ToAgent::Resync { seq: a.acked_seq }));
        core.resyncs.insert(agent, ids);
    }
}

/// The answer to a resync: what was in flight with the agent when it was asked and is not in
/// its hands was lost on the way (a dispatch, or a result), and goes to be run again.
pub(super) fn resynced<E>(
    core: &mut Core<'_>,
    t: &mut dyn Tasks<Error = E>,
    agent: u32,
    holding: &[u64],
    now_us: u64,
) -> Result<(), E> {
    let Some(asked) = core.resyncs.remove(&agent) else { return Ok(()) };
    let held: HashSet<u64> = holding.iter().copied().collect();
    let mut lost = 0;
    for id in asked.into_iter().filter(|id| !held.contains(id)) {
        if core.in_flight.get(id).is_some_and(|f| f.agent == agent) {
            recall(core, t, agent, id, now_us)?;
            lost += 1;
        }
    }
    tracing::info!(job = %core.job_id, agent, held = holding.len(), lost, "resynced after a rejoin");
    Ok(())
}

/// An instance head joined: it is placed (memory, affinity keys) and waits for its first
/// report to ask for work.
pub(super) fn joined(core: &mut Core<'_>, agent: u32, resources: (u32, u64, u32), hostname: String) {
    let Some(instance) = core.instance_of(agent) else {
        tracing::warn!(job = %core.job_id, agent, %hostname, "an agent that heads no instance joined; ignored");
        return;
    };
    tracing::info!(job = %core.job_id, agent, cores = resources.0, mem_mb = resources.1, %hostname, "agent joined");
    core.turnout.joined();
    core.enroll(agent, instance, resources, hostname);
    if core.has_joined() {
        core.replan();
    }
}

/// The instance a member (not a head) belongs to, if `agent` is one: a member whose head
/// is gone may come to the leader itself.
fn member_s_instance(core: &Core<'_>, agent: u32) -> Option<usize> {
    let tree = core.layout.as_ref()?;
    let head = tree.head(agent);
    (tree.contains(agent) && head != agent).then(|| tree.instance_index(head)).flatten()
}

/// An agent the launcher started ended, or could not start, before it joined.
pub(super) fn never_joined(core: &mut Core<'_>, agent: u32, why: &str) {
    // Members join their head, not the leader: their absence is the head's to tell.
    if !core.agents.contains_key(&agent) && core.instance_of(agent).is_some() {
        tracing::warn!(job = %core.job_id, agent, %why, "agent never joined");
        core.turnout.never_joined();
        for id in core.affinity.leave(agent) {
            core.push_retry(id);
        }
    }
}

/// An agent's process exited badly. One that never joined could not start on its node (its
/// program missing there, or refusing the node's setup): a node broken, not lost, so the run
/// stops and says which and why, rather than run on without it and come back to it when
/// resumed or resubmitted. One that joined is lost the usual way, by its link. Members join
/// their head, not the leader, which cannot tell whether one did: only heads are judged (a
/// node's agents fail alike, and every node of the default layout has a head).
pub(super) fn agent_exited(core: &mut Core<'_>, agent: u32, why: String) -> Option<Ending> {
    if core.agents.contains_key(&agent) || core.instance_of(agent).is_none() {
        return None;
    }
    tracing::info!(job = %core.job_id, agent, %why, "an agent could not start");
    Some(Ending::AgentNotStarted(format!("the agent could not start {why}")))
}
