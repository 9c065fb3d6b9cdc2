//! Tasks that end others' wait, and tasks stopped for good: a final state releases the tasks
//! that depend on it (`deps`), which go to whoever asks next (`Arrivals`) or are cancelled in
//! turn; a user's cancel stops what runs of a task and makes it final without a retry.

use std::collections::BTreeMap;

use super::deps::{Added, Released, Standing};
use super::prelude::*;
use htc_core::after::Needs;

/// Records read at a time, by `depend` and `release`: a slice's records are in memory at once.
const READ_SLICE: u64 = 65_536;

/// The records of `ids` (those there are): a lookup for one, a walk for more.
fn records<E>(t: &dyn Tasks<Error = E>, ids: std::ops::Range<u64>) -> Result<Vec<(u64, Record)>, E> {
    if ids.end - ids.start == 1 {
        return Ok(t.get(ids.start)?.map(|r| (ids.start, r)).into_iter().collect());
    }
    t.range(ids)
}

/// Task `id` waits for `on` (tasks that exist): made as it is added, or again on a resume
/// for a task not final yet. A dependency that failed already cancels it at once.
pub(super) fn depend<E>(core: &mut Core<'_>, t: &mut dyn Tasks<Error = E>, id: u64, on: &Needs) -> Result<Added, E> {
    // A byte each, in the order named: a fan-in waits for a million tasks, read a range
    // at a time with one walk of the ledger each, not a lookup each.
    let mut standing = Vec::with_capacity(on.count().min(1 << 24) as usize);
    for (ids, _) in on.ranges() {
        let mut from = *ids.start();
        while from <= *ids.end() {
            let to = ids.end().saturating_add(1).min(from + READ_SLICE);
            let mut records = records(t, from..to)?.into_iter().peekable();
            for d in from..to {
                // An id with no record is refused before it gets here; should one slip
                // through, it is a dependency that can never succeed.
                let state = records.next_if(|(id, _)| *id == d).map(|(_, r)| r.state());
                standing.push(match state {
                    Some(State::Done) => Standing::Succeeded,
                    Some(State::Failed | State::Cancelled) | None => Standing::Unsuccessful,
                    Some(_) => Standing::Open,
                });
            }
            from = to;
        }
    }
    let added = core.deps.add(id, on, |i| standing[i]);
    if let Added::Cancelled { because } = added {
        tracing::info!(job = %core.job_id, task = id, because, "cancelled: task {because} did not succeed");
        cancel_one(core, t, id, Some(because))?;
    }
    Ok(added)
}

/// Task `id` became final: its dependents may run now, or are cancelled (an `after=` it
/// failed), as `deps` decides. Nothing to do, and no cost, for a task nobody waits on.
pub(super) fn release<E>(core: &mut Core<'_>, t: &mut dyn Tasks<Error = E>, id: u64, ok: bool) -> Result<(), E> {
    if !core.deps.has_dependents(id) && !core.deps.is_waiting(id) {
        return Ok(());
    }
    let mut out = Released::default();
    core.deps.ended(id, ok, &mut out);
    for (task, because) in out.cancelled {
        tracing::info!(job = %core.job_id, task, because, "cancelled: task {because} did not succeed");
        cancel_one(core, t, task, Some(because))?;
    }
    // In id order, consecutive ones read with one walk of the ledger: a fan-out's million
    // are released by one end.
    let mut ready = out.ready;
    ready.sort_unstable();
    for run in ready.chunk_by(|a, b| b == &(a + 1)) {
        for ids in run.chunks(READ_SLICE as usize) {
            for (task, r) in records(t, ids[0]..ids[ids.len() - 1] + 1)? {
                core.partition.push(task, r.shape().priority);
            }
        }
        core.fresh_arrivals = true;
    }
    Ok(())
}

/// A user's cancel of `ids`: what is queued never starts, what runs is stopped (its agent
/// reports it preempted, which finds it landed already and changes nothing). Unknown and
/// finished tasks are left as they are. Says how many it cancelled.
pub(super) fn cancel<E>(
    core: &mut Core<'_>,
    t: &mut dyn Tasks<Error = E>,
    ids: &[u64],
    out: &mut Effects,
) -> Result<u64, E> {
    let mut stop: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    let mut n = 0;
    for &id in ids {
        let Some(holder) = cancel_one(core, t, id, None)? else { continue };
        n += 1;
        if let Some(agent) = holder {
            stop.entry(agent).or_default().push(id);
        }
    }
    for (agent, ids) in stop {
        out.push(Effect::ToAgent(agent, ToAgent::Preempt(ids)));
    }
    Ok(n)
}

/// Makes task `id` cancelled (by a user, or because task `because` did not succeed) if it is
/// not final yet: `None` if it was (or is unknown), else the agent that holds an attempt of
/// it, if one does.
fn cancel_one<E>(
    core: &mut Core<'_>,
    t: &mut dyn Tasks<Error = E>,
    id: u64,
    because: Option<u64>,
) -> Result<Option<Option<u32>>, E> {
    let Some(mut r) = t.get(id)? else { return Ok(None) };
    // An attempt in flight has its life in the flight (a dispatch writes nothing).
    let now = core.in_flight.get(id).map_or(r.life(), |f| f.life);
    let Some((life, _)) = core.move_life(now, Step::Cancel) else { return Ok(None) };
    let holder = core.land(id).map(|f| f.agent);
    if let Some(a) = holder.and_then(|a| core.agents.get_mut(&a)) {
        a.ahead_ms = a.ahead_ms.saturating_sub(r.shape().runtime_ms as u64 * r.shape().cores as u64);
    }
    r.set_cancelled(because);
    record(core, t, id, &mut r, life)?;
    Ok(Some(holder))
}

/// Writes a record with the life `move_life` gave it: the one place a task's record changes
/// state.
pub(super) fn record<E>(
    core: &mut Core<'_>,
    t: &mut dyn Tasks<Error = E>,
    id: u64,
    r: &mut Record,
    life: Life,
) -> Result<(), E> {
    r.set_life(life);
    t.apply(&Change::Record(id, *r))?;
    match life.state() {
        State::Done => release(core, t, id, true),
        State::Failed | State::Cancelled => release(core, t, id, false),
        _ => Ok(()),
    }
}
