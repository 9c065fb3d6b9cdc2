//! An agent's report: starts and results, what came back, what it holds after a rejoin; then
//! work for it and for others, `--max-fails`, and black-hole agents that fail every task.

use super::prelude::*;
use super::{agents, dispatch, handover, results, returns};

/// Once `--max-fails` is reached: every agent finishes what runs, starts nothing more, and
/// leaves; what it had queued comes back when it does (as for any agent that leaves).
pub(super) fn hold_if_failing(core: &mut Core<'_>, out: &mut Effects) {
    let Some(failed) = core.failed_too_often().filter(|_| !core.told_to_hold) else { return };
    core.told_to_hold = true;
    tracing::warn!(job = %core.job_id, failed, "--max-fails reached: starting nothing more");
    let reason = format!("{failed} tasks failed (--max-fails)");
    for (&agent, _) in core.agents.iter().filter(|(_, a)| a.alive) {
        out.push(Effect::stop(agent, Stop::Hold, reason.clone()));
    }
}

/// An agent that failed `BLACK_HOLE_STREAK` tasks in a row while as many succeeded
/// elsewhere meanwhile (a full /tmp, a broken mount) gets nothing more: it finishes what runs and
/// leaves, and the tasks it failed run again elsewhere without using up their retries.
pub(super) fn drain_if_black_hole<E>(
    core: &mut Core<'_>,
    t: &mut dyn Tasks<Error = E>,
    agent: u32,
    out: &mut Effects,
) -> Result<(), E> {
    // Already drained: what it still fails (it was running when told) is its fault too.
    if let Some(a) = core.agents.get_mut(&agent).filter(|a| a.drained) {
        for id in a.streak.take() {
            results::refund(core, t, id)?;
        }
        return Ok(());
    }
    let oks = core.figures.oks();
    // Never the last agent that still gets work: then the tasks themselves are failing.
    if !core.agents.iter().any(|(&id, a)| id != agent && a.alive && !a.drained) {
        return Ok(());
    }
    let Some(a) = core.agents.get_mut(&agent).filter(|a| a.alive && !a.drained && a.streak.is_black_hole(oks)) else {
        return Ok(());
    };
    a.drained = true;
    a.credit = 0;
    core.mem.leave(agent);
    for id in core.affinity.leave(agent) {
        core.retry.push_back(id);
        core.fresh_retries = true;
    }
    let failed = a.streak.take();
    let reason = format!("failed {} tasks in a row while the others succeeded: drained", failed.len());
    tracing::warn!(job = %core.job_id, agent, host = %a.hostname, %reason, "black hole");
    for id in failed {
        results::refund(core, t, id)?;
    }
    dispatch::fail_unfit_waiting(core, t)?;
    out.push(Effect::stop(agent, Stop::Hold, reason));
    dispatch::dispatch_all(core, t, out)
}

/// An agent's (or a head's, for its instance) report: starts and results, tasks it gave
/// back or was asked back, what it holds after a rejoin, its slots and what it wants; then
/// work for it, and for others when retries or hand-overs came of it.
pub(super) fn on_report<E>(
    core: &mut Core<'_>,
    t: &mut dyn Tasks<Error = E>,
    agent: u32,
    report: msg::Report,
    out: &mut Effects,
) -> Result<(), E> {
    if !core.agents.get(&agent).is_some_and(|a| a.alive) {
        return Ok(());
    }
    core.figures.report(report.results.len());
    if report.signalled && !std::mem::replace(&mut core.asked_grace, true) {
        out.push(Effect::Signalled);
    }
    if core.is_adoptee(agent) {
        // Started or ran before this leader knew of it (a hand-over): its own now.
        let ids = report.started.iter().map(|s| s.id).chain(report.results.iter().map(|r| r.id));
        for id in ids.collect::<Vec<_>>() {
            handover::adopt(core, t, agent, id)?;
        }
    }
    // Agents leave out the start of a task whose result is in the same report.
    for s in &report.started {
        results::on_started(core, agent, s);
    }
    for r in &report.results {
        core.figures.result_arrived(core.now_us, r.ended.end_us);
        results::on_result(core, t, agent, r, core.now_us)?;
    }
    for &id in &report.returned {
        returns::take_back(core, t, agent, id)?;
    }
    for &id in &report.recalled {
        returns::came_back(core, t, agent, id)?;
    }
    if let Some(holding) = &report.holding {
        if core.is_adoptee(agent) {
            handover::adopt_held(core, t, agent, holding)?;
        }
        agents::resynced(core, t, agent, holding, core.now_us)?;
        handover::settle(core, t, out)?;
    }
    let a = core.agents.get_mut(&agent).unwrap();
    a.heard(core.now_us, report.seq);
    if report.cores > 0 {
        a.cores = report.cores;
    }
    a.credit += report.want as u64;
    a.idle = report.idle as u64;
    a.busy = a.cores.saturating_sub(report.idle);
    if let Some(c) = report.capacity {
        results::resize(core, t, agent, c)?;
    }
    dispatch::dispatch(core, t, agent, out)?;
    // New retries can go to any agent with credit, not only the one that reported;
    // older ones wait for an agent that fits to report (its dispatch takes retries
    // first), so a retry nobody can take does not cost a scan of every agent per report.
    if core.fresh_retries || core.fresh_handoffs || core.fresh_arrivals || !report.recalled.is_empty() {
        dispatch::dispatch_all(core, t, out)?;
    }
    hold_if_failing(core, out);
    drain_if_black_hole(core, t, agent, out)?;
    Ok(())
}
