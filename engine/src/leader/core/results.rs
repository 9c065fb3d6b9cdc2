//! Results: a task's start and end as agents report them, its next state (`task::step`), its
//! attempts' history, retries, refunds, fail-fast, and black-hole agents that fail every task.

use super::dispatch::group_of;
use super::prelude::*;
use super::{dispatch, records};

/// An agent is gone (its connection ended, or it fell silent): its tasks go to others.
/// Keeps each agent's run of failures since its last success.
fn note_streak(core: &mut Core<'_>, agent: u32, id: u64, end: End) {
    match end {
        End::Succeeded => {
            core.figures.succeeded();
            if let Some(a) = core.agents.get_mut(&agent) {
                a.streak.succeeded();
            }
        }
        End::Failed { .. } => {
            let oks = core.figures.oks();
            if let Some(a) = core.agents.get_mut(&agent) {
                a.streak.failed(id, oks);
            }
        }
        End::Lost | End::Preempted => {}
    }
}

/// A failure that was the node's fault: the task waits for another run, its retry given
/// back (and out of the failed index if it had failed for good).
pub(super) fn refund<E>(core: &mut Core<'_>, t: &mut dyn Tasks<Error = E>, id: u64) -> Result<(), E> {
    let Some(mut r) = t.get(id)? else { return Ok(()) };
    if core.in_flight.contains(id) {
        return Ok(()); // already out again
    }
    let from = r.state();
    let Some((life, _)) = core.move_life(r.life(), Step::Refund) else { return Ok(()) };
    if from == State::Failed {
        // The failure that was final stays in the history, as every ended attempt does.
        let a = Attempt { attempt: r.life().attempt_no().min(255) as u8, agent: r.agent(), ended: r.ended() };
        t.apply(&Change::Attempt(id, a))?;
        t.apply(&Change::Failed(id, false))?;
    }
    records::record(core, t, id, &mut r, life)?;
    core.push_retry(id);
    Ok(())
}

/// A start moves the attempt in memory only; its time travels with the result, and is kept
/// meanwhile for an attempt lost with its agent.
pub(super) fn on_started(core: &mut Core<'_>, agent: u32, s: &msg::Started) {
    let Some(f) = core.in_flight.get(s.id) else { return };
    if f.agent != agent || f.life.attempt_no() != s.attempt {
        return;
    }
    let Some((life, _)) = core.move_life(f.life, Step::Start) else { return };
    core.in_flight.set_life(s.id, life);
    core.in_flight.started(s.id, s.start_us);
}

pub(super) fn on_result<E>(
    core: &mut Core<'_>,
    t: &mut dyn Tasks<Error = E>,
    agent: u32,
    res: &msg::TaskResult,
    now_us: u64,
) -> Result<(), E> {
    // A result from an agent that no longer holds the task (it was lost and the task re-sent)
    // or for an old attempt is stale: the ledger already moved on.
    let Some(f) = core.in_flight.get(res.id) else { return Ok(()) };
    if f.agent != agent || f.life.attempt_no() != res.attempt {
        return Ok(());
    }
    let Some(mut r) = t.get(res.id)? else { return Ok(()) };
    core.land(res.id);
    if let Some(a) = core.agents.get_mut(&agent) {
        a.ahead_ms = a.ahead_ms.saturating_sub(r.shape().runtime_ms as u64 * r.shape().cores as u64);
    }
    // A head telling of a member's lost task knows no end: it is now.
    let end_us = if res.ended.end_us == 0 { now_us } else { res.ended.end_us };
    finish_attempt(core, t, res.id, &mut r, f, res.ran_on.unwrap_or(agent), Ended { end_us, ..res.ended })
}

/// Records how an attempt, run by agent `ran_on` (a member of the reporting head's instance,
/// or the head), ended and moves the task to done, failed, or back to pending.
pub(super) fn finish_attempt<E>(
    core: &mut Core<'_>,
    t: &mut dyn Tasks<Error = E>,
    id: u64,
    r: &mut Record,
    f: Flight,
    ran_on: u32,
    e: Ended,
) -> Result<(), E> {
    let Ended { outcome, value, start_us, end_us } = e;
    // Only a task with rules for its attempts has them read: one without costs nothing.
    let rules = if r.shape().rules { t.rules(id)? } else { None };
    let end = match outcome.end(value) {
        End::Failed { .. } if rules.as_ref().is_some_and(|rl| rl.stops(outcome, value)) => {
            End::Failed { permanent: true }
        }
        end => end,
    };
    let Some((life, effect)) = core.move_life(f.life, Step::Finish(end)) else { return Ok(()) };
    note_streak(core, f.agent, id, end);
    if end == End::Succeeded && start_us != 0 && end_us >= start_us {
        core.partition.observe(r.shape().class, r.shape().runtime_ms, (end_us - start_us) / 1000);
        core.figures.ran((end_us - start_us) * r.shape().cores.max(1) as u64);
        if r.shape().mem_mb > 0 || r.shape().gpus > 0 {
            core.mem.observe(group_of(r), end_us - start_us);
        }
    }
    r.set_ended(ran_on, e);
    if let (Some(rl), task::Effect::Retry, End::Failed { .. }) = (&rules, effect, end) {
        // The next attempt asks what its number does: the record holds the current attempt's.
        let next = rl.shape_at(r.shape(), life.attempts() as u32 + 1);
        if next != *r.shape() {
            tracing::debug!(job = %core.job_id, task = id, attempt = life.attempts() + 1, mem_mb = next.mem_mb, timeout_ms = next.timeout_ms, cores = next.cores, "retry asks more");
        }
        *r.shape_mut() = next;
    }
    if effect == task::Effect::Retry {
        let a = Attempt { attempt: f.life.attempt_no().min(255) as u8, agent: ran_on, ended: r.ended() };
        t.apply(&Change::Attempt(id, a))?;
        if end == End::Preempted {
            core.preemption.run_again_later(id);
            core.fresh_retries = true;
        } else {
            core.push_retry(id);
        }
    }
    tally(core, f.agent, id, r, end, life.state().is_final());
    if life.state() == State::Failed {
        t.apply(&Change::Failed(id, true))?;
        tracing::debug!(job = %core.job_id, task = id, attempts = life.attempts(), outcome = %outcome.describe(value), "task failed");
    }
    records::record(core, t, id, r, life)
}

/// Counts an ended attempt on the instance that ran it, and keeps it if it failed.
fn tally(core: &mut Core<'_>, agent: u32, id: u64, r: &Record, end: End, last: bool) {
    let Some(a) = core.agents.get_mut(&agent) else { return };
    if end == End::Succeeded {
        a.done += 1;
        return;
    }
    if end == End::Preempted {
        return; // not a failure
    }
    a.failed += 1;
    core.figures.failure(live::Failure {
        task: id,
        line: r.line(),
        host: a.hostname.clone(),
        at_us: r.end_us(),
        reason: r.outcome().describe(r.value()),
        retrying: !last,
    });
}

/// An instance's members changed (one joined, one was lost): tasks are committed against
/// their sums, and none is sent that the largest cannot hold (`fits`).
pub(super) fn resize<E>(
    core: &mut Core<'_>,
    t: &mut dyn Tasks<Error = E>,
    agent: u32,
    c: msg::Capacity,
) -> Result<(), E> {
    let a = core.agents.get_mut(&agent).unwrap();
    (a.mem_mb, a.gpus, a.widest) = (c.largest_mem_mb, c.largest_gpus, c.largest_cores.max(1));
    let largest = backfill::Size { mem_mb: c.largest_mem_mb, cores: c.largest_cores, gpus: c.largest_gpus };
    core.mem.resize(agent, c.mem_mb, c.gpus, largest);
    // It may have lost the only member that could hold some waiting task.
    dispatch::fail_unfit_waiting(core, t)?;
    Ok(())
}
