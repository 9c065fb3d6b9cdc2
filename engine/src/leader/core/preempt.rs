//! Preemption: stopping lower-priority preemptible tasks for higher-priority work that no
//! agent can take, and for memory that a waiting task needs.

use super::prelude::*;

/// Higher-priority work that no agent can take now (every one is busy) stops preemptible
/// tasks of lower priority, lowest and newest first, one per waiting task; they run again
/// later without using a retry. Tasks already handed to an agent are its executor's to
/// preempt (it knows what waits in its queue).
pub(super) fn preempt_for_waiting<E>(
    core: &mut Core<'_>,
    t: &dyn Tasks<Error = E>,
    out: &mut Effects,
) -> Result<(), E> {
    if !core.preemption.any_to_stop() {
        return Ok(());
    }
    preempt_for_memory(core, t, out)?;
    let Some((p, waiting)) = core.top_waiting(t)? else { return Ok(()) };
    if core.agents.values().any(|a| a.alive && !a.drained && a.idle > 0) {
        return Ok(()); // an agent can take it: no need to stop anything
    }
    let n = (waiting as usize).min(64).saturating_sub(core.preemption.stopping());
    let victims: Vec<u64> = core.preemption.candidates(p).take(n).collect();
    let mut by_agent: HashMap<u32, Vec<u64>> = HashMap::new();
    for id in victims {
        if let Some(f) = core.in_flight.get(id) {
            core.preemption.stop(id, None);
            by_agent.entry(f.agent).or_default().push(id);
        }
    }
    for (agent, ids) in by_agent {
        tracing::info!(job = %core.job_id, agent, tasks = ?ids, priority = p, "preempting for higher-priority work");
        out.push(Effect::ToAgent(agent, ToAgent::Preempt(ids)));
    }
    Ok(())
}

/// Tasks waiting for memory or GPUs (the oldest few) stop preemptible tasks of lower
/// priority on the agent where the fewest stops make room, which is then kept for them.
fn preempt_for_memory<E>(core: &mut Core<'_>, t: &dyn Tasks<Error = E>, out: &mut Effects) -> Result<(), E> {
    let waiting: Vec<u64> = core.mem.waiting_tasks().take(8).map(|n| n.task).collect();
    for w in waiting {
        let Some(r) = t.get(w)? else { continue };
        let stoppable: HashSet<u64> = core.preemption.candidates(r.shape().priority).collect();
        // Only what is stopped for this task makes room for it: room made for another
        // waiting task is that one's.
        let stopping = |id: u64| core.preemption.stopped_for(id) == Some(w);
        let may_stop = |id: u64| stoppable.contains(&id);
        let Some((agent, ids)) = core.mem.room_for(w, &may_stop, &stopping, core.now_us) else { continue };
        // A node kept for a task of the same or higher priority stays kept for it.
        if let Some(kept) = core.mem.reservation(agent).filter(|&k| k != w) {
            if t.get(kept)?.is_none_or(|k| k.shape().priority >= r.shape().priority) {
                continue;
            }
        }
        core.mem.reserve_on(w, agent, core.now_us);
        if ids.is_empty() {
            continue;
        }
        for &id in &ids {
            core.preemption.stop(id, Some(w));
        }
        tracing::info!(job = %core.job_id, agent, tasks = ?ids, task = w, priority = r.shape().priority, "preempting to make room for a task waiting for memory or GPUs");
        out.push(Effect::ToAgent(agent, ToAgent::Preempt(ids)));
    }
    Ok(())
}
