//! The leader's scheduling core, without I/O: fed events (an agent joined, a report came, an
//! agent was lost, a signal) with the current time, it answers with effects (`leader::effect`:
//! messages for agents in the engine's own types, `msg`) and writes task records through
//! [`Tasks`]. It owns no socket, thread, clock or file, so scripted event sequences test it
//! (`tests.rs`) and the same core runs under every driver (the node's `leader/driver.rs`: the
//! LMDB transaction, group commits and the agents' channels; `htc simulate`).
//!
//! One state, its handlers as free functions (the shape of HyperQueue's `tako` reactor): the
//! `Core` type has its fields, builders, shared helpers and views in `state` and its event
//! entry points (`handle`, the tick, the ending) here, and nowhere else. What it is fed and
//! answers is in `input`; the names handlers share in `prelude`. Each handler file takes the
//! core as `&mut Core` and calls only the files below it, in this order, so that no two call
//! each other: `records` (a record's change of state, what a final state releases, a cancel),
//! `dispatch` (handing out work: a plan, then its application), `preempt`, `returns` (what
//! comes back unstarted), `give_back` (idle nodes given back), `results` (an attempt's end,
//! retries, refunds), `handover` (a run taken over), `agents` (joins, losses, rejoins, audits),
//! `allocations` (the run's allocations), `adds` (an open run's added tasks), `report` (an
//! agent's report, `--max-fails`, black holes). Parts of the state that keep their own
//! invariants are types of files that use nothing of the core: `flights` (what each agent
//! holds), `roster` (the agents), `allocation` (one allocation), `settling` (the wait of a
//! hand-over), `nodes_back` (the nodes given back), `deps`, `figures`, `turnout`, `streak`.
//!
//! A task costs the ledger one write, when its attempt ends: dispatch and start live in memory
//! (`in_flight`), since a leader that dies loses them anyway (the next session re-runs what was
//! not recorded finished), and the counts by state that `htc status` shows include them.

use prelude::*;

use allocation::Attach;
use deps::Added;
use htc_core::after::Needs;

mod adds;
mod agents;
pub mod allocation;
mod allocations;
mod asking;
pub mod deps;
mod dispatch;
pub mod explain;
mod figures;
mod flights;
mod give_back;
mod handover;
mod input;
mod nodes_back;
pub mod open;
mod preempt;
mod preemption;
mod prelude;
mod records;
mod report;
mod results;
mod returns;
mod roster;
mod settling;
mod state;
mod streak;
#[cfg(test)]
mod tests;
mod turnout;

pub use give_back::OPEN_IDLE_US;
pub use input::{Ending, Input, Progress, Tasks, AUDIT_EVERY_LOST_AFTER, GRACE_MARGIN_US, HORIZON_MS};
pub use open::{Answer, NewTask};
pub use preemption::MAX_PREEMPTIONS;
pub use state::Core;
pub use streak::BLACK_HOLE_STREAK;

impl<'a> Core<'a> {
    /// Whether the task waits for others (`after=`): the caller lists which for `explain`
    /// (`Why::After`) from the ledger, as the core keeps only counts.
    pub fn waits_for_others(&self, id: u64) -> bool {
        self.deps.is_waiting(id)
    }

    /// Why task `id` (its record `r`) is where it is (`htc task explain`). `after`: the open
    /// tasks it waits for and how many more, for one that `waits_for_others`.
    pub fn explain(&self, id: u64, r: &Record, after: Option<(Vec<u64>, u64)>) -> explain::Why {
        explain::explain(self, id, r, after)
    }

    /// Whether the run is over without an event: every task finished, or no agent left.
    pub fn ending(&self) -> Option<Ending> {
        if self.stays_open() {
            return None;
        }
        if self.counts.unfinished() == 0 {
            return Some(Ending::Complete);
        }
        let in_flight = self.counts.get(State::Dispatched) + self.counts.get(State::Running);
        if let Some((signal, until_us)) = self.grace {
            if self.own_in_flight() == 0 || self.now_us >= until_us {
                return Some(Ending::Preempted(signal));
            }
        }
        if let Some(failed) = self.failed_too_often().filter(|_| in_flight == 0) {
            return Some(Ending::TooManyFailures(failed));
        }
        if !self.late.is_empty() && in_flight == 0 && self.counts.unfinished() == self.late.len() as u64 {
            return Some(Ending::OutOfTime(self.late.len() as u64));
        }
        // An agent given up may come back empty (a hung node that runs again, a leader that was
        // stopped itself): the run waits one loss bound for that before it gives up.
        let alive = self.agents.values().filter(|a| a.alive).count();
        let why = self.turnout.given_up(alive, self.now_us, self.live.lost_after_us, self.counts.unfinished());
        why.map(Ending::AgentsLost)
    }

    /// A signal, and Slurm's end of the job `grace_us` away: every agent finishes what runs,
    /// starts nothing more, and gives back its queue, until `GRACE_MARGIN_US` before that end
    /// (time to record the last results and stop); what ends within it is recorded. A grace too
    /// short for that is none.
    fn use_grace(&mut self, signal: i32, grace_us: u64, out: &mut Effects) -> Option<Ending> {
        if grace_us < 2 * GRACE_MARGIN_US {
            return Some(Ending::Preempted(signal));
        }
        if self.grace.is_some() {
            return None;
        }
        let secs = grace_us / 1_000_000;
        tracing::warn!(job = %self.job_id, signal, grace_s = secs, "signalled with a grace: finishing what runs, starting nothing more");
        self.grace = Some((signal, self.now_us + grace_us - GRACE_MARGIN_US));
        self.told_to_hold = true;
        let reason = format!("the job ends in {secs} s (signal {signal}, with a grace): finishing what runs");
        // Joined allocations are not preempted with it: their agents go on, and one of them
        // takes the run over when this session ends (`handover`).
        let own: Vec<u32> = self
            .agents
            .iter()
            .filter(|(&id, a)| a.alive && self.allocation_of(id).is_none())
            .map(|(&id, _)| id)
            .collect();
        for agent in own {
            out.push(Effect::stop(agent, Stop::Hold, reason.clone()));
        }
        None
    }

    /// Tasks in flight with the agents of the leader's own job (not of joined allocations).
    fn own_in_flight(&self) -> usize {
        self.agents
            .iter()
            .filter(|(&id, a)| a.alive && self.allocation_of(id).is_none())
            .map(|(&id, _)| self.in_flight.of_agent(id).len())
            .sum()
    }

    /// A Shutdown for every live agent; but a leader stopped by a signal (its job's time
    /// limit, `scancel`) leaves the agents of joined allocations that still run alone: they wait
    /// with their tasks for the job that takes the run over (`handover`).
    pub fn shutdown(&self, ending: &Ending, out: &mut Effects) {
        let reason = match ending {
            Ending::Complete => "all tasks finished".to_string(),
            Ending::Interrupted(s) => format!("leader got signal {s}"),
            Ending::Preempted(s) => format!("preempted (signal {s}); its grace is over"),
            Ending::AgentsLost(w) => w.clone(),
            Ending::TooManyFailures(n) => format!("{n} tasks failed (--max-fails)"),
            Ending::OutOfTime(n) => format!("{n} tasks cannot finish before the time limit"),
            Ending::AgentNotStarted(why) => why.clone(),
        };
        let stop = if *ending == Ending::Complete { Stop::Finish } else { Stop::Abort };
        let handed_over = |agent: u32| {
            matches!(ending, Ending::Interrupted(_) | Ending::Preempted(_))
                && self.allocation_of(agent).is_some_and(|i| self.allocations[i].stage == Stage::Running)
        };
        for (&agent, _) in self.agents.iter().filter(|(&id, a)| a.alive && !handed_over(id)) {
            out.push(Effect::stop(agent, stop, reason.clone()));
        }
    }

    /// Acks every report received so far, and answers the adds: call after the ledger writes
    /// of those reports and adds are committed, never before.
    pub fn acks(&mut self, out: &mut Effects) {
        out.append(&mut self.answers);
        for (id, seq) in self.agents.acks_due(self.now_us) {
            out.push(Effect::ToAgent(id, ToAgent::Ack { seq }));
        }
    }

    /// Feeds one event; what it causes is appended to `out`. `Some` ends the run.
    pub fn handle<E>(
        &mut self,
        now_us: u64,
        t: &mut dyn Tasks<Error = E>,
        ev: Input,
        out: &mut Effects,
    ) -> Result<Option<Ending>, E> {
        self.now_us = now_us;
        match ev {
            Input::Joined { agent, cores, mem_mb, gpus, hostname } => {
                agents::joined(self, agent, (cores, mem_mb, gpus), hostname)
            }
            Input::Report { agent, report } => report::on_report(self, t, agent, report, out)?,
            Input::Lost { agent, why } => agents::lose(self, t, agent, &why, now_us, out)?,
            Input::Rejoined { agent, below } => agents::rejoined(self, agent, below, now_us, out),
            Input::HandedOver { agent, cores, mem_mb, gpus, hostname } => {
                handover::handed_over(self, agent, (cores, mem_mb, gpus), hostname, out)
            }
            Input::Revived { agent, cores, mem_mb, gpus, hostname } => {
                agents::revived(self, t, agent, (cores, mem_mb, gpus), hostname, now_us, out)?
            }
            Input::Detached { agent } => {
                if let Some(a) = self.agents.get(&agent).filter(|a| a.alive) {
                    tracing::warn!(job = %self.job_id, agent, host = %a.hostname, "cut off with its relay; waiting for it to rejoin");
                }
            }
            Input::Tick => self.tick(t, now_us, out)?,
            Input::NeverJoined { agent, why } => agents::never_joined(self, agent, &why),
            Input::AgentExited { agent, why } => {
                if let Some(ending) = agents::agent_exited(self, agent, why) {
                    return Ok(Some(ending));
                }
            }
            Input::Interrupt { signal } => return Ok(Some(Ending::Interrupted(signal))),
            Input::Grace { signal, grace_us } => return Ok(self.use_grace(signal, grace_us, out)),
            Input::Cancel { ids } => {
                records::cancel(self, t, &ids, out)?;
            }
            Input::Add { request, tasks } => adds::add(self, t, request, tasks, out)?,
            Input::Close { cancel } => adds::close(self, t, cancel, out)?,
        }
        adds::note_busy(self);
        if self.fresh_arrivals {
            dispatch::dispatch_all(self, t, out)?;
        }
        if self.asking.pending() && dispatch::may_ask_back(self) {
            dispatch::ask_back(self, out);
        }
        Ok(None)
    }

    /// Agents silent past the bound are lost, and told to stop should they resume (a hung agent
    /// reads it when it runs again; its lease has run out by then anyway). Every live agent hears
    /// from the leader at least as often as it reports (`Liveness::beat_every_us`): the ack of
    /// its last report, or else an Ack of what was already acknowledged. Under load the acks
    /// alone do it (16 one-slot agents were sent as many heartbeats as acks).
    fn tick<E>(&mut self, t: &mut dyn Tasks<Error = E>, now_us: u64, out: &mut Effects) -> Result<(), E> {
        agents::excuse_own_stall(self, now_us);
        let silent = self.agents.silent(now_us, self.live.lost_after_us);
        for (agent, quiet_us) in silent {
            let why = format!("silent for {:.1} s", quiet_us as f64 / 1e6);
            agents::lose(self, t, agent, &why, now_us, out)?;
            effect::give_up(out, agent, why);
        }
        if now_us.saturating_sub(self.audit_us) >= AUDIT_EVERY_LOST_AFTER * self.live.lost_after_us {
            self.audit_us = now_us;
            agents::audit(self, out);
        }
        preempt::preempt_for_waiting(self, t, out)?;
        allocations::leave_due(self, t, out)?;
        handover::settle(self, t, out)?;
        give_back::give_back_idle(self, out);
        let every = self.live.beat_every_us(agents::reporters(self));
        for (agent, seq) in self.agents.heartbeats_due(now_us, every) {
            out.push(Effect::ToAgent(agent, ToAgent::Ack { seq }));
        }
        Ok(())
    }

    /// Takes a joining allocation into the run: its agents get the next ids, grafted onto the
    /// tree as instances of their own, whose shares come with the re-plan when each head joins.
    /// Refused once the run is ending, or without a tree to graft onto.
    pub fn attach(&mut self, req: Attach, now_us: u64) -> Result<u32, String> {
        allocations::attach(self, req, now_us)
    }

    /// Tells a joined allocation to leave now (a grown job giving its nodes back to jobs that
    /// wait for them): as at its time limit.
    pub fn leave_allocation(&mut self, job: &str, reason: &str, out: &mut Effects) {
        allocations::leave_allocation(self, job, reason, out)
    }

    /// The launcher of a joined allocation ended (its job ended): its agents that never joined
    /// never will, and those still here go as its job's end takes them.
    pub fn allocation_gone(&mut self, job: &str, now_us: u64) {
        allocations::allocation_gone(self, job, now_us)
    }

    /// Task `id` waits for `on` (tasks that exist): made as it is added, or again on a resume
    /// for a task not final yet. A dependency that failed already cancels it at once.
    pub fn depend<E>(&mut self, t: &mut dyn Tasks<Error = E>, id: u64, on: &Needs) -> Result<Added, E> {
        records::depend(self, t, id, on)
    }
}
