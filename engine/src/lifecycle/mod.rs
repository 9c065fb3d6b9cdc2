//! A Slurm job's life in a run that may span several allocations, without I/O. A joined job
//! (`--htc-join`) attaches to the run's leader and starts its agents (or, after a hand-over,
//! keeps those that kept their tasks); when they end or the leader's link closes, it judges
//! whether its leader let it go, leaves near its time limit, or looks for the run's next leader:
//! it joins that one, or takes the run over. A job that led a session decides what follows it: a
//! joined job takes over, or a resubmitted job continues (`--htc-resubmit`).
//!
//! The driver (`htc-agent lead`) feeds `Life` `(now, input)` and carries out the effects it
//! answers through a `Carrier`: it holds the locks, files, links, agents and the leader's run;
//! the tests below drive the machine with scripted inputs on a virtual clock.

mod judge;
mod report;
#[cfg(test)]
mod tests;

pub use judge::{
    at_time_limit, resubmit_due, still_leads, LiveSeen, SessionEnd, KILL_WAIT_US, LIMIT_SLACK_US, LIVE_FRESH_US,
};
pub use report::Report;

/// Between tries of a run's lock that is held while nobody has published an address yet.
pub const LOCK_RETRY_US: u64 = 250_000;
/// How long a lock may stay held with nobody leading before the job gives up.
pub const NOBODY_LEADS_US: u64 = 120_000_000;
/// Before attaching afresh to a new leader, which may not answer yet.
pub const REATTACH_PAUSE_US: u64 = 1_000_000;

/// What the machine knows of this job from its start.
#[derive(Debug, Clone, Default)]
pub struct Job {
    /// This job's id.
    pub id: String,
    /// The run's id (its first job's), which `htc resume` takes.
    pub run_id: String,
    /// The run's directory, as reports show it.
    pub run: String,
    pub nodes: usize,
    /// The job's end: its start plus its time limit, unix µs (to the second); `None`: no limit.
    pub end_us: Option<u64>,
    /// `--htc-resubmit=N`.
    pub resubmit: Option<u32>,
    /// Its agents are one-agent instances right below the leader: should the leader go, they
    /// wait for the next one with their tasks (`--await-leader-s`).
    pub agents_wait: bool,
}

impl Job {
    /// When the job leaves the run: its end less KillWait.
    pub fn leave_us(&self) -> Option<u64> {
        self.end_us.map(|e| e.saturating_sub(KILL_WAIT_US))
    }
}

/// What happened, as the machine sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// After `Effect::Attach`: the leader took this job in; its agents are `first..=last`.
    Attached {
        first: u32,
        last: u32,
        run_job: String,
        leader_job: String,
        /// The run's working directory and why this job cannot enter it, if it cannot.
        workdir_refused: Option<(String, String)>,
    },
    /// After `Effect::Attach`: refused. `leader_went`: no leader listens or answers (it ended,
    /// perhaps for good); otherwise the job cannot join at all.
    AttachFailed {
        why: String,
        leader_went: bool,
    },
    /// After `Effect::StartAgents`.
    AgentsStarted,
    AgentsNotStarted(String),
    /// After `Effect::Watch` or `Effect::DrainAgents`: every agent of this job has ended.
    AgentsEnded,
    /// After `Effect::Watch { link: true }`: the leader's end of the link closed first.
    LeaderLinkClosed,
    /// After `Effect::LookForLeader`: the job in the run's address file and its live view.
    LeaderSeen {
        published: Option<String>,
        live: Option<LiveSeen>,
    },
    /// After `Effect::TakeLock`: the run's lock is this job's; `unfinished` tasks are left.
    LockTaken {
        unfinished: u64,
    },
    /// After `Effect::TakeLock`: another holds it; `published`: a leader's address is out.
    LockBusy {
        published: bool,
    },
    /// After `Effect::Sleep`.
    Woke,
    /// After `Effect::TakeOver`: the run's ledger is this node's; `left` tasks to run, and the
    /// agents this job kept, if it did.
    TookOver {
        left: u64,
        kept_agents: Option<usize>,
    },
    /// After `Effect::TakeOver`: this node cannot hold the ledger.
    CannotTakeOver(String),
    /// A session this job led ended (`Effect::Lead`, or the driver's own first session), at
    /// `at_us`: for a signal, when the leader stopped on it (within a commit of its arrival).
    SessionEnded {
        end: SessionEnd,
        joined_running: usize,
        at_us: u64,
    },
    /// After `Effect::CountResubmits`.
    Resubmits(u64),
    /// After `Effect::Resubmit`: sbatch's answer.
    Resubmitted(String),
    /// After `Effect::CountResubmits` or `Effect::Resubmit`.
    ResubmitFailed(String),
}

/// What the driver must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Ask the run's leader for a place; `keep`: for the agents this job kept, under their ids.
    /// Then `Attached` or `AttachFailed`.
    Attach {
        keep: bool,
    },
    /// Start this job's agents (one srun step); `await_leader`: they wait for a next leader
    /// should theirs go. Then `AgentsStarted` or `AgentsNotStarted`.
    StartAgents {
        await_leader: bool,
    },
    /// Wait for the agents to end (`AgentsEnded`), or, with `link`, the leader's link to close
    /// (`LeaderLinkClosed`).
    Watch {
        link: bool,
    },
    /// Close the link to the leader (this job leaves it); `keep_agents`: the agents run on,
    /// with their tasks, for the next leader.
    Detach {
        keep_agents: bool,
    },
    /// Let the kept agents finish what they hold; then `AgentsEnded`.
    DrainAgents,
    /// Read who the run's files say leads; then `LeaderSeen`.
    LookForLeader,
    /// Try the run's lock; then `LockTaken` or `LockBusy`.
    TakeLock,
    /// Wait this long; then `Woke`.
    Sleep {
        us: u64,
    },
    /// Rebuild the run's ledger on this node, holding the lock; then `TookOver` or
    /// `CannotTakeOver`.
    TakeOver,
    /// Lead a session of the run with this job's nodes (and its kept agents); then
    /// `SessionEnded`.
    Lead,
    /// Print the session's summary; `resume_hint`: with how to continue the run (not when a
    /// joined job or a resubmitted one continues it). Its exit code is `Exit::Session`'s.
    Summarize {
        resume_hint: bool,
    },
    /// Read how many times the run was resubmitted; then `Resubmits` or `ResubmitFailed`.
    CountResubmits,
    /// Count resubmission `nth` and submit the job that continues the run; then `Resubmitted`
    /// or `ResubmitFailed`.
    Resubmit {
        nth: u64,
    },
    Print(Report),
    /// The job's life is over.
    Exit(Exit),
}

/// The job's exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    /// What the last session's summary said (`Effect::Summarize`).
    Session,
}

/// Where the machine's effects are carried out. `Effect::carry_out` is the one reading of
/// them, so that a new effect is a compile error in the driver rather than a silent drop.
pub trait Carrier {
    type Error;
    fn attach(&mut self, keep: bool) -> Result<(), Self::Error>;
    fn start_agents(&mut self, await_leader: bool) -> Result<(), Self::Error>;
    fn watch(&mut self, link: bool) -> Result<(), Self::Error>;
    fn detach(&mut self, keep_agents: bool) -> Result<(), Self::Error>;
    fn drain_agents(&mut self) -> Result<(), Self::Error>;
    fn look_for_leader(&mut self) -> Result<(), Self::Error>;
    fn take_lock(&mut self) -> Result<(), Self::Error>;
    fn sleep(&mut self, us: u64) -> Result<(), Self::Error>;
    fn take_over(&mut self) -> Result<(), Self::Error>;
    fn lead(&mut self) -> Result<(), Self::Error>;
    fn summarize(&mut self, resume_hint: bool) -> Result<(), Self::Error>;
    fn count_resubmits(&mut self) -> Result<(), Self::Error>;
    fn resubmit(&mut self, nth: u64) -> Result<(), Self::Error>;
    fn print(&mut self, report: Report) -> Result<(), Self::Error>;
    fn exit(&mut self, exit: Exit) -> Result<(), Self::Error>;
}

impl Effect {
    pub fn carry_out<C: Carrier>(self, to: &mut C) -> Result<(), C::Error> {
        match self {
            Effect::Attach { keep } => to.attach(keep),
            Effect::StartAgents { await_leader } => to.start_agents(await_leader),
            Effect::Watch { link } => to.watch(link),
            Effect::Detach { keep_agents } => to.detach(keep_agents),
            Effect::DrainAgents => to.drain_agents(),
            Effect::LookForLeader => to.look_for_leader(),
            Effect::TakeLock => to.take_lock(),
            Effect::Sleep { us } => to.sleep(us),
            Effect::TakeOver => to.take_over(),
            Effect::Lead => to.lead(),
            Effect::Summarize { resume_hint } => to.summarize(resume_hint),
            Effect::CountResubmits => to.count_resubmits(),
            Effect::Resubmit { nth } => to.resubmit(nth),
            Effect::Print(r) => to.print(r),
            Effect::Exit(e) => to.exit(e),
        }
    }
}

/// Where the job is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// Asked a leader for a place, with kept agents or not.
    Attaching,
    /// Waiting a moment before attaching afresh.
    Pausing,
    /// Its agents are starting for the leader of job `leader`.
    Starting {
        leader: String,
    },
    /// In the run under the leader of job `leader`.
    Staying {
        leader: String,
    },
    /// Kept agents the new leader would not take finish what they hold.
    Draining,
    /// The stay is over: does the leader of job `leader` (`None`: whoever is published) still
    /// lead, having let this job go?
    Judging {
        leader: Option<String>,
    },
    /// Looking for the next leader since `since_us`, by the run's lock.
    Succeeding {
        since_us: u64,
    },
    TakingOver,
    Leading,
    /// The session ended; resubmissions are being counted against `--htc-resubmit`.
    Counting {
        max: u32,
    },
    Submitting {
        nth: u64,
        max: u32,
    },
    Over,
}

pub struct Life {
    job: Job,
    phase: Phase,
    /// This job's agents outlived their leader and run on with their tasks.
    kept: bool,
}

impl Life {
    /// A job that joins the run: the first effects ask its leader for a place.
    pub fn joining(job: Job, out: &mut Vec<Effect>) -> Life {
        out.push(Effect::Attach { keep: false });
        Life { job, phase: Phase::Attaching, kept: false }
    }

    /// A job that leads its own run: its driver runs the session and says how it ended.
    pub fn leading(job: Job) -> Life {
        Life { job, phase: Phase::Leading, kept: false }
    }

    pub fn is_over(&self) -> bool {
        self.phase == Phase::Over
    }

    pub fn handle(&mut self, now_us: u64, input: Input, out: &mut Vec<Effect>) {
        let phase = std::mem::replace(&mut self.phase, Phase::Over);
        self.phase = match (phase, input) {
            (Phase::Attaching, Input::Attached { first, last, run_job, leader_job, workdir_refused }) => {
                self.attached(first, last, run_job, leader_job, workdir_refused, out)
            }
            (Phase::Attaching, Input::AttachFailed { why, leader_went }) => {
                self.not_attached(now_us, why, leader_went, out)
            }
            (Phase::Pausing, Input::Woke) => {
                out.push(Effect::Attach { keep: false });
                Phase::Attaching
            }
            (Phase::Starting { leader }, Input::AgentsStarted) => {
                out.push(Effect::Watch { link: self.job.agents_wait });
                Phase::Staying { leader }
            }
            (Phase::Starting { leader }, Input::AgentsNotStarted(why)) => {
                out.push(Effect::Detach { keep_agents: false });
                self.say(out, |job| Report::AgentsDidNotStart { job, why });
                out.push(Effect::LookForLeader);
                Phase::Judging { leader: Some(leader) }
            }
            (Phase::Staying { leader }, Input::AgentsEnded) => {
                self.kept = false;
                out.push(Effect::Detach { keep_agents: false });
                self.say(out, |job| Report::AgentsEnded { job });
                out.push(Effect::LookForLeader);
                Phase::Judging { leader: Some(leader) }
            }
            (Phase::Staying { .. }, Input::LeaderLinkClosed) => {
                self.kept = true;
                out.push(Effect::Detach { keep_agents: true });
                self.say(out, |job| Report::LeaderGone { job });
                self.after_stay(now_us, out)
            }
            (Phase::Draining, Input::AgentsEnded) => {
                self.kept = false;
                out.push(Effect::LookForLeader);
                Phase::Judging { leader: None }
            }
            (Phase::Judging { leader }, Input::LeaderSeen { published, live }) => {
                let leader = leader.or_else(|| published.clone()).unwrap_or_default();
                if still_leads(&leader, published.as_deref(), live.as_ref(), now_us) {
                    self.say(out, |job| Report::LetGo { job });
                    self.exit(Exit::Code(0), out)
                } else {
                    self.after_stay(now_us, out)
                }
            }
            (Phase::Succeeding { since_us }, input) => self.succeed(now_us, since_us, input, out),
            (Phase::TakingOver, Input::TookOver { left, kept_agents }) => {
                self.say(out, |job| Report::TakesOver { job, left });
                if let Some(agents) = kept_agents {
                    self.say(out, |job| Report::LeadsWithKept { job, agents });
                }
                out.push(Effect::Lead);
                Phase::Leading
            }
            (Phase::TakingOver, Input::CannotTakeOver(why)) => {
                out.push(Effect::Print(Report::CannotLead { why }));
                self.exit(Exit::Code(2), out)
            }
            (Phase::Leading, Input::SessionEnded { end, joined_running, at_us }) => {
                self.session_ended(end, joined_running, at_us, out)
            }
            (phase @ (Phase::Counting { .. } | Phase::Submitting { .. }), input) => {
                self.resubmitting(phase, input, out)
            }
            (phase, input) => {
                tracing::warn!(?phase, ?input, "run life: an input out of turn, ignored");
                phase
            }
        };
    }

    fn say(&self, out: &mut Vec<Effect>, report: impl FnOnce(String) -> Report) {
        out.push(Effect::Print(report(self.job.id.clone())));
    }

    fn exit(&mut self, exit: Exit, out: &mut Vec<Effect>) -> Phase {
        out.push(Effect::Exit(exit));
        Phase::Over
    }

    fn attached(
        &mut self,
        first: u32,
        last: u32,
        run_job: String,
        leader: String,
        workdir_refused: Option<(String, String)>,
        out: &mut Vec<Effect>,
    ) -> Phase {
        if let Some((dir, why)) = workdir_refused {
            self.say(out, |job| Report::WorkdirRefused { job, dir, why });
        }
        let run = self.job.run.clone();
        if self.kept {
            self.say(out, |job| Report::Stays { job, run, first, last });
            out.push(Effect::Watch { link: self.job.agents_wait });
            return Phase::Staying { leader };
        }
        let nodes = self.job.nodes;
        self.say(out, |job| Report::Joins { job, run, run_job, nodes, first, last });
        out.push(Effect::StartAgents { await_leader: self.job.agents_wait });
        Phase::Starting { leader }
    }

    fn not_attached(&mut self, now_us: u64, why: String, leader_went: bool, out: &mut Vec<Effect>) -> Phase {
        if self.kept {
            // Its agents work on for the leader as they are (their own links held: only this
            // launcher's broke), or stop: either way they end first, and then so does this stay,
            // as one its leader let go.
            self.say(out, |job| Report::CouldNotKeep { job, why });
            out.push(Effect::DrainAgents);
            return Phase::Draining;
        }
        if !leader_went {
            self.say(out, |job| Report::CannotJoin { job, why });
            return self.exit(Exit::Code(2), out);
        }
        // The leader went before this job could join: perhaps for good.
        self.say(out, |job| Report::LeaderWentFirst { job, why });
        self.after_stay(now_us, out)
    }

    /// A stay in the run is over and its leader did not let this job go: it leaves if its time
    /// has come, else it looks for the run's next leader.
    fn after_stay(&mut self, now_us: u64, out: &mut Vec<Effect>) -> Phase {
        if self.job.leave_us().is_some_and(|t| now_us >= t) {
            self.say(out, |job| Report::TimeUp { job });
            return self.exit(Exit::Code(0), out);
        }
        out.push(Effect::TakeLock);
        Phase::Succeeding { since_us: now_us }
    }

    /// Who leads next: the lock is held by whoever leads (the old leader while it writes its
    /// last snapshot, or a joined job that took over); once it is free, the run is this job's.
    fn succeed(&mut self, now_us: u64, since_us: u64, input: Input, out: &mut Vec<Effect>) -> Phase {
        match input {
            Input::LockTaken { unfinished: 0 } => {
                self.say(out, |job| Report::RunEnded { job });
                self.exit(Exit::Code(0), out)
            }
            Input::LockTaken { .. } => {
                out.push(Effect::TakeOver);
                Phase::TakingOver
            }
            // Another job leads now: this one attaches to it, its kept agents keeping their ids
            // (they go to that leader with their tasks by themselves); without hammering one
            // that does not answer yet.
            Input::LockBusy { published: true } if self.kept => {
                out.push(Effect::Attach { keep: true });
                Phase::Attaching
            }
            Input::LockBusy { published: true } => {
                out.push(Effect::Sleep { us: REATTACH_PAUSE_US });
                Phase::Pausing
            }
            Input::LockBusy { published: false } if now_us.saturating_sub(since_us) > NOBODY_LEADS_US => {
                out.push(Effect::Print(Report::NobodyLeads { secs: NOBODY_LEADS_US / 1_000_000 }));
                self.exit(Exit::Code(1), out)
            }
            Input::LockBusy { published: false } => {
                out.push(Effect::Sleep { us: LOCK_RETRY_US });
                Phase::Succeeding { since_us }
            }
            Input::Woke => {
                out.push(Effect::TakeLock);
                Phase::Succeeding { since_us }
            }
            input => {
                tracing::warn!(?input, "run life: an input out of turn while looking for a leader, ignored");
                Phase::Succeeding { since_us }
            }
        }
    }

    /// What follows a session this job led: a joined job takes the run over, or a resubmitted
    /// job continues it, or nothing (the run ended, or the user continues it).
    fn session_ended(&mut self, end: SessionEnd, joined: usize, at_us: u64, out: &mut Vec<Effect>) -> Phase {
        if joined > 0 && end != SessionEnd::Complete {
            out.push(Effect::Summarize { resume_hint: false });
            out.push(Effect::Print(Report::HandedOver { joined }));
            return self.exit(Exit::Session, out);
        }
        match self.job.resubmit.filter(|_| resubmit_due(end, at_us, self.job.end_us)) {
            Some(max) => {
                out.push(Effect::CountResubmits);
                Phase::Counting { max }
            }
            None => {
                out.push(Effect::Summarize { resume_hint: true });
                self.exit(Exit::Session, out)
            }
        }
    }

    fn resubmitting(&mut self, phase: Phase, input: Input, out: &mut Vec<Effect>) -> Phase {
        match (phase, input) {
            (Phase::Counting { max }, Input::Resubmits(done)) if done >= max as u64 => {
                out.push(Effect::Summarize { resume_hint: true });
                out.push(Effect::Print(Report::NotResubmitting { done, max }));
                self.exit(Exit::Session, out)
            }
            (Phase::Counting { max }, Input::Resubmits(done)) => {
                out.push(Effect::Summarize { resume_hint: false });
                out.push(Effect::Resubmit { nth: done + 1 });
                Phase::Submitting { nth: done + 1, max }
            }
            (Phase::Counting { .. }, Input::ResubmitFailed(why)) => {
                out.push(Effect::Summarize { resume_hint: true });
                out.push(Effect::Print(Report::CouldNotResubmit { why, resume: None }));
                self.exit(Exit::Session, out)
            }
            (Phase::Submitting { nth, max }, Input::Resubmitted(said)) => {
                out.push(Effect::Print(Report::Resubmitted { nth, max, said }));
                self.exit(Exit::Session, out)
            }
            (Phase::Submitting { .. }, Input::ResubmitFailed(why)) => {
                let resume = Some(format!("htc resume {}", self.job.run_id));
                out.push(Effect::Print(Report::CouldNotResubmit { why, resume }));
                self.exit(Exit::Session, out)
            }
            (phase, input) => {
                tracing::warn!(?phase, ?input, "run life: an input out of turn while resubmitting, ignored");
                phase
            }
        }
    }
}
