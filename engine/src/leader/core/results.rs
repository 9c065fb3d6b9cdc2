//! Results: a task's start and end as agents report them, its next state (`task::step`), its
//! attempts' history, retries, refunds, fail-fast, and black-hole agents that fail every task.

use super::dispatch::group_of;
use super::*;

impl Core<'_> {
    /// Once `--max-fails` is reached: every agent finishes what runs, starts nothing more, and
    /// leaves; what it had queued comes back when it does (as for any agent that leaves).
    pub(super) fn hold_if_failing(&mut self, out: &mut Effects) {
        let Some(failed) = self.failed_too_often().filter(|_| !self.told_to_hold) else { return };
        self.told_to_hold = true;
        tracing::warn!(job = %self.job_id, failed, "--max-fails reached: starting nothing more");
        let reason = format!("{failed} tasks failed (--max-fails)");
        for (&agent, _) in self.agents.iter().filter(|(_, a)| a.alive) {
            out.push(Effect::stop(agent, Stop::Hold, reason.clone()));
        }
    }

    /// Tasks failed for good in this session, when that reached `--max-fails`.
    pub(super) fn failed_too_often(&self) -> Option<u64> {
        let failed = self.figures.failed_since(&self.counts);
        self.max_fails.filter(|&n| failed >= n).map(|_| failed)
    }

    /// An agent is gone (its connection ended, or it fell silent): its tasks go to others.
    /// Keeps each agent's run of failures since its last success.
    fn note_streak(&mut self, agent: u32, id: u64, end: End) {
        match end {
            End::Succeeded => {
                self.figures.succeeded();
                if let Some(a) = self.agents.get_mut(&agent) {
                    a.streak.succeeded();
                }
            }
            End::Failed { .. } => {
                let oks = self.figures.oks();
                if let Some(a) = self.agents.get_mut(&agent) {
                    a.streak.failed(id, oks);
                }
            }
            End::Lost | End::Preempted => {}
        }
    }

    /// An agent that failed `BLACK_HOLE_STREAK` tasks in a row while as many succeeded
    /// elsewhere meanwhile (a full /tmp, a broken mount) gets nothing more: it finishes what runs and
    /// leaves, and the tasks it failed run again elsewhere without using up their retries.
    pub(super) fn drain_if_black_hole<E>(
        &mut self,
        t: &mut dyn Tasks<Error = E>,
        agent: u32,
        out: &mut Effects,
    ) -> Result<(), E> {
        // Already drained: what it still fails (it was running when told) is its fault too.
        if let Some(a) = self.agents.get_mut(&agent).filter(|a| a.drained) {
            for id in a.streak.take() {
                self.refund(t, id)?;
            }
            return Ok(());
        }
        let oks = self.figures.oks();
        // Never the last agent that still gets work: then the tasks themselves are failing.
        if !self.agents.iter().any(|(&id, a)| id != agent && a.alive && !a.drained) {
            return Ok(());
        }
        let Some(a) = self.agents.get_mut(&agent).filter(|a| a.alive && !a.drained && a.streak.is_black_hole(oks))
        else {
            return Ok(());
        };
        a.drained = true;
        a.credit = 0;
        self.mem.leave(agent);
        for id in self.affinity.leave(agent) {
            self.retry.push_back(id);
            self.fresh_retries = true;
        }
        let failed = a.streak.take();
        let reason = format!("failed {} tasks in a row while the others succeeded: drained", failed.len());
        tracing::warn!(job = %self.job_id, agent, host = %a.hostname, %reason, "black hole");
        for id in failed {
            self.refund(t, id)?;
        }
        self.fail_unfit_waiting(t)?;
        out.push(Effect::stop(agent, Stop::Hold, reason));
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
        let Some((life, _)) = self.move_life(r.life(), Step::Refund) else { return Ok(()) };
        if from == State::Failed {
            // The failure that was final stays in the history, as every ended attempt does.
            let a = Attempt { attempt: r.life().attempt_no().min(255) as u8, agent: r.agent(), ended: r.ended() };
            t.apply(&Change::Attempt(id, a))?;
            t.apply(&Change::Failed(id, false))?;
        }
        self.record(t, id, &mut r, life)?;
        self.push_retry(id);
        Ok(())
    }

    /// A start moves the attempt in memory only; its time travels with the result, and is kept
    /// meanwhile for an attempt lost with its agent.
    pub(super) fn on_started(&mut self, agent: u32, s: &msg::Started) {
        let Some(f) = self.in_flight.get(s.id) else { return };
        if f.agent != agent || f.life.attempt_no() != s.attempt {
            return;
        }
        let Some((life, _)) = self.move_life(f.life, Step::Start) else { return };
        self.in_flight.set_life(s.id, life);
        self.in_flight.started(s.id, s.start_us);
    }

    /// Moves a task's life by `task::step`, and the counts with it: the one way a task's state
    /// changes in the core. `None` for a step its state does not allow (a stale report, say),
    /// which changes nothing.
    pub(super) fn move_life(&mut self, from: Life, s: Step) -> Option<(Life, task::Effect)> {
        self.counts.step(from, s).ok()
    }

    /// Writes a record with the life `move_life` gave it: the one place a task's record changes
    /// state.
    pub(super) fn record<E>(
        &mut self,
        t: &mut dyn Tasks<Error = E>,
        id: u64,
        r: &mut Record,
        life: Life,
    ) -> Result<(), E> {
        r.set_life(life);
        t.apply(&Change::Record(id, *r))?;
        match life.state() {
            State::Done => self.release(t, id, true),
            State::Failed | State::Cancelled => self.release(t, id, false),
            _ => Ok(()),
        }
    }

    pub(super) fn on_result<E>(
        &mut self,
        t: &mut dyn Tasks<Error = E>,
        agent: u32,
        res: &msg::TaskResult,
        now_us: u64,
    ) -> Result<(), E> {
        // A result from an agent that no longer holds the task (it was lost and the task re-sent)
        // or for an old attempt is stale: the ledger already moved on.
        let Some(f) = self.in_flight.get(res.id) else { return Ok(()) };
        if f.agent != agent || f.life.attempt_no() != res.attempt {
            return Ok(());
        }
        let Some(mut r) = t.get(res.id)? else { return Ok(()) };
        self.land(res.id);
        if let Some(a) = self.agents.get_mut(&agent) {
            a.ahead_ms = a.ahead_ms.saturating_sub(r.shape().runtime_ms as u64 * r.shape().cores as u64);
        }
        // A head telling of a member's lost task knows no end: it is now.
        let end_us = if res.ended.end_us == 0 { now_us } else { res.ended.end_us };
        self.finish_attempt(t, res.id, &mut r, f, res.ran_on.unwrap_or(agent), Ended { end_us, ..res.ended })
    }

    /// Records how an attempt, run by agent `ran_on` (a member of the reporting head's instance,
    /// or the head), ended and moves the task to done, failed, or back to pending.
    pub(super) fn finish_attempt<E>(
        &mut self,
        t: &mut dyn Tasks<Error = E>,
        id: u64,
        r: &mut Record,
        f: Flight,
        ran_on: u32,
        e: Ended,
    ) -> Result<(), E> {
        let Ended { outcome, value, start_us, end_us } = e;
        let end = outcome.end(value);
        let Some((life, effect)) = self.move_life(f.life, Step::Finish(end)) else { return Ok(()) };
        self.note_streak(f.agent, id, end);
        if end == End::Succeeded && start_us != 0 && end_us >= start_us {
            self.partition.observe(r.shape().class, r.shape().runtime_ms, (end_us - start_us) / 1000);
            self.figures.ran((end_us - start_us) * r.shape().cores.max(1) as u64);
            if r.shape().mem_mb > 0 || r.shape().gpus > 0 {
                self.mem.observe(group_of(r), end_us - start_us);
            }
        }
        r.set_ended(ran_on, e);
        if effect == task::Effect::Retry {
            let a = Attempt { attempt: f.life.attempt_no().min(255) as u8, agent: ran_on, ended: r.ended() };
            t.apply(&Change::Attempt(id, a))?;
            if end == End::Preempted {
                self.preemption.run_again_later(id);
                self.fresh_retries = true;
            } else {
                self.push_retry(id);
            }
        }
        self.tally(f.agent, id, r, end, life.state().is_final());
        if life.state() == State::Failed {
            t.apply(&Change::Failed(id, true))?;
            tracing::debug!(job = %self.job_id, task = id, attempts = life.attempts(), outcome = %outcome.describe(value), "task failed");
        }
        self.record(t, id, r, life)
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
        self.figures.failure(live::Failure {
            task: id,
            line: r.line(),
            host: a.hostname.clone(),
            at_us: r.end_us(),
            reason: r.outcome().describe(r.value()),
            retrying: !last,
        });
    }

    /// An agent's (or a head's, for its instance) report: starts and results, tasks it gave
    /// back or was asked back, what it holds after a rejoin, its slots and what it wants; then
    /// work for it, and for others when retries or hand-overs came of it.
    pub(super) fn on_report<E>(
        &mut self,
        t: &mut dyn Tasks<Error = E>,
        agent: u32,
        report: msg::Report,
        out: &mut Effects,
    ) -> Result<(), E> {
        if !self.agents.get(&agent).is_some_and(|a| a.alive) {
            return Ok(());
        }
        self.figures.report(report.results.len());
        if report.signalled && !std::mem::replace(&mut self.asked_grace, true) {
            out.push(Effect::Signalled);
        }
        if self.is_adoptee(agent) {
            // Started or ran before this leader knew of it (a hand-over): its own now.
            let ids = report.started.iter().map(|s| s.id).chain(report.results.iter().map(|r| r.id));
            for id in ids.collect::<Vec<_>>() {
                self.adopt(t, agent, id)?;
            }
        }
        // Agents leave out the start of a task whose result is in the same report.
        for s in &report.started {
            self.on_started(agent, s);
        }
        for r in &report.results {
            self.figures.result_arrived(self.now_us, r.ended.end_us);
            self.on_result(t, agent, r, self.now_us)?;
        }
        for &id in &report.returned {
            self.take_back(t, agent, id)?;
        }
        for &id in &report.recalled {
            self.came_back(t, agent, id)?;
        }
        if let Some(holding) = &report.holding {
            if self.is_adoptee(agent) {
                self.adopt_held(t, agent, holding)?;
            }
            self.resynced(t, agent, holding, self.now_us)?;
            self.settle(t, out)?;
        }
        let a = self.agents.get_mut(&agent).unwrap();
        a.heard(self.now_us, report.seq);
        if report.cores > 0 {
            a.cores = report.cores;
        }
        a.credit += report.want as u64;
        a.idle = report.idle as u64;
        a.busy = a.cores.saturating_sub(report.idle);
        if let Some(c) = report.capacity {
            self.resize(t, agent, c)?;
        }
        self.dispatch(t, agent, out)?;
        // New retries can go to any agent with credit, not only the one that reported;
        // older ones wait for an agent that fits to report (its dispatch takes retries
        // first), so a retry nobody can take does not cost a scan of every agent per report.
        if self.fresh_retries || self.fresh_handoffs || self.fresh_arrivals || !report.recalled.is_empty() {
            self.dispatch_all(t, out)?;
        }
        self.hold_if_failing(out);
        self.drain_if_black_hole(t, agent, out)?;
        Ok(())
    }

    /// An instance's members changed (one joined, one was lost): tasks are committed against
    /// their sums, and none is sent that the largest cannot hold (`fits`).
    fn resize<E>(&mut self, t: &mut dyn Tasks<Error = E>, agent: u32, c: msg::Capacity) -> Result<(), E> {
        let a = self.agents.get_mut(&agent).unwrap();
        (a.mem_mb, a.gpus, a.widest) = (c.largest_mem_mb, c.largest_gpus, c.largest_cores.max(1));
        let largest = backfill::Size { mem_mb: c.largest_mem_mb, cores: c.largest_cores, gpus: c.largest_gpus };
        self.mem.resize(agent, c.mem_mb, c.gpus, largest);
        // It may have lost the only member that could hold some waiting task.
        self.fail_unfit_waiting(t)?;
        Ok(())
    }
}
