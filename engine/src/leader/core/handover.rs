//! A hand-over (`--htc-join`): the run's leader went with its job, a joined job took the run
//! over from the replica, and that job's agents, which kept running what they held, come to the
//! new leader (`Hello.handover`). The replica records no dispatches, so every task not recorded
//! ended is pending here. The new leader therefore hands nothing out until each agent it expects
//! has said what it holds (or the wait is over), takes what they hold as in flight with them
//! (`adopt`), and records the results they bring for tasks it had as pending: none of it runs a
//! second time.

use super::dispatch;
use super::prelude::*;
use htc_core::salvage::{salvage, Survivors};

/// An agent back from a hand-over: placed as any joining head, then asked what it holds.
/// One of another allocation (an id this leader's tree does not hold) stands as an instance
/// of its own until its launcher attaches again keeping the ids (`keep_ids`). One this leader
/// has no place for (here already, or a member of an instance) stops.
pub(super) fn handed_over(
    core: &mut Core<'_>,
    agent: u32,
    resources: (u32, u64, u32),
    hostname: String,
    out: &mut Effects,
) {
    let stray = core.layout.as_ref().is_some_and(|t| !t.holds(agent));
    if stray {
        let tree = Arc::make_mut(core.layout.as_mut().expect("checked"));
        tree.graft_at(agent, 1, 1, 1).expect("checked free");
        core.strays.insert(agent);
        core.turnout.expect_more(1);
        core.affinity.join(agent);
    }
    let Some(instance) = core.instance_of(agent).filter(|_| !core.agents.contains_key(&agent)) else {
        tracing::warn!(job = %core.job_id, agent, %hostname, "an agent this leader has no place for came from a hand-over");
        let reason = "the run's new leader has no place for this agent".to_string();
        out.push(Effect::stop(agent, Stop::Abort, reason));
        return;
    };
    tracing::info!(job = %core.job_id, agent, %hostname, "agent came back from the hand-over, with its tasks");
    core.turnout.joined();
    core.enroll(agent, instance, resources, hostname);
    core.adoptees.insert(agent);
    out.push(Effect::ToAgent(agent, ToAgent::Resync { seq: 0 }));
    core.resyncs.insert(agent, Vec::new());
    if stray {
        // A new instance: it gets a share of what is not handed out.
        core.replan();
    }
}

/// Takes task `id`, which `agent` holds or ran, as in flight with it, where the ledger has it
/// pending and nobody else holds it. Says whether it did.
pub(super) fn adopt<E>(core: &mut Core<'_>, t: &mut dyn Tasks<Error = E>, agent: u32, id: u64) -> Result<bool, E> {
    if core.in_flight.contains(id) {
        return Ok(false);
    }
    let Some(r) = t.get(id)? else { return Ok(false) };
    if r.state() != State::Pending {
        return Ok(false);
    }
    let Some((life, _)) = core.move_life(r.life(), Step::Dispatch) else { return Ok(false) };
    core.in_flight.insert(id, Flight { agent, life });
    if let Some(a) = core.agents.get_mut(&agent) {
        a.ahead_ms += r.shape().runtime_ms as u64 * r.shape().cores as u64;
    }
    if let Some(s) = core.settling.as_mut() {
        s.adopted_one();
    }
    Ok(true)
}

/// `agent` said what it holds: that is in flight with it now.
pub(super) fn adopt_held<E>(
    core: &mut Core<'_>,
    t: &mut dyn Tasks<Error = E>,
    agent: u32,
    held: &[u64],
) -> Result<(), E> {
    let mut n = 0;
    for &id in held {
        n += adopt(core, t, agent, id)? as u64;
    }
    tracing::info!(job = %core.job_id, agent, held = held.len(), adopted = n, "tasks kept through the hand-over");
    let stray = core.strays.contains(&agent);
    if let Some(s) = core.settling.as_mut() {
        s.answered(agent, stray);
    }
    Ok(())
}

/// Ends the wait once every expected agent has said what it holds (or is lost), or the time
/// is up; then work goes out.
pub(super) fn settle<E>(core: &mut Core<'_>, t: &mut dyn Tasks<Error = E>, out: &mut Effects) -> Result<(), E> {
    let Some(s) = core.settling.as_mut() else { return Ok(()) };
    let agents = &core.agents;
    s.forget(|a| agents.get(&a).is_some_and(|x| !x.alive));
    if !s.over(core.now_us) {
        return Ok(());
    }
    let s = core.settling.take().expect("checked above");
    let interrupted = interrupt_unclaimed(core, t)?;
    tracing::info!(
        job = %core.job_id,
        back = core.adoptees.len(),
        adopted = s.adopted(),
        missing = s.missing(),
        interrupted,
        "hand-over settled: work goes out"
    );
    dispatch::dispatch_all(core, t, out)
}

/// The attempts journaled as started and not ended that no agent brought back: their agents
/// are gone, so they were interrupted. Recorded so (their number used, a history row) before
/// anything goes out, so that each runs again as a new attempt that `htc log` shows, as
/// after a resume. Returns how many.
fn interrupt_unclaimed<E>(core: &mut Core<'_>, t: &mut dyn Tasks<Error = E>) -> Result<u64, E> {
    let awaiting = std::mem::take(&mut core.awaiting);
    let mut n = 0;
    for told in awaiting.chunk_by(|a, b| a.id == b.id) {
        let id = told[0].id;
        if core.in_flight.contains(id) {
            continue;
        }
        let Some(r) = t.get(id)? else { continue };
        let Some(changes) = salvage(id, &r, told, Survivors::None, core.now_us) else { continue };
        // An interruption leaves a pending task pending: the counts stand. Anything else
        // (which a journal salvaged at the take-over does not lead to) is left as it was.
        let keeps = changes.iter().all(|c| !matches!(c, Change::Record(_, after) if after.state() != r.state()));
        if !keeps {
            continue;
        }
        for c in &changes {
            t.apply(c)?;
        }
        n += 1;
    }
    Ok(n)
}
