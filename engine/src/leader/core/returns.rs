//! Tasks that come back from an agent unstarted: taken back (a lost member's, a rejoin's, a
//! resync's), or given back on a Recall; and the end of an attempt's flight (`land`).

use super::prelude::*;
use super::records;

/// Takes back a task sent to `agent` and not reported started: it waits for another.
/// The agent may have started it after all, so its next dispatch is a new attempt number
/// (kept in the record: a late result of this one must not pass for the next).
pub(super) fn take_back<E>(core: &mut Core<'_>, t: &mut dyn Tasks<Error = E>, agent: u32, id: u64) -> Result<(), E> {
    if let Some(life) = unsend(core, t, agent, id, Step::Reclaim)? {
        if let Some(mut r) = t.get(id)? {
            records::record(core, t, id, &mut r, life)?;
        }
        core.push_retry(id);
    }
    Ok(())
}

/// A task `agent` gave back unstarted when asked (a Recall): it never ran, so its next
/// dispatch is the same attempt; it goes to an agent that can start it now.
pub(super) fn came_back<E>(core: &mut Core<'_>, t: &dyn Tasks<Error = E>, agent: u32, id: u64) -> Result<(), E> {
    if unsend(core, t, agent, id, Step::Return)?.is_some() {
        core.asking.recalls.came_back(id);
    }
    Ok(())
}

/// Task `id`, sent to `agent` and not reported started, is pending again. False when it is
/// not (any more) in flight there unstarted.
fn unsend<E>(
    core: &mut Core<'_>,
    t: &dyn Tasks<Error = E>,
    agent: u32,
    id: u64,
    step: Step,
) -> Result<Option<Life>, E> {
    let Some(f) = core.in_flight.get(id).filter(|f| f.agent == agent && f.life.state() != State::Running) else {
        return Ok(None);
    };
    core.land(id);
    if let (Some(a), Some(r)) = (core.agents.get_mut(&agent), t.get(id)?) {
        a.ahead_ms = a.ahead_ms.saturating_sub(r.shape().runtime_ms as u64 * r.shape().cores as u64);
    }
    let life = core.move_life(f.life, step).map(|(life, _)| life);
    // Back from the agent: a resync it answers later must not take it back again (it may
    // be out with it once more by then, as a new dispatch the answer predates).
    if let Some(asked) = core.resyncs.get_mut(&agent) {
        asked.retain(|&x| x != id);
    }
    Ok(life)
}
