//! What the run's life tells the job's output, as values: the machine says what happened, the
//! driver prints it (`Display`), to stderr where `to_stderr` says.

use std::fmt;

/// One line for the job's output. `job` is this job's id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// Taken into the run with fresh agents `first..=last`.
    Joins {
        job: String,
        run: String,
        run_job: String,
        nodes: usize,
        first: u32,
        last: u32,
    },
    /// Taken in again by a new leader, with the agents that kept their tasks.
    Stays {
        job: String,
        run: String,
        first: u32,
        last: u32,
    },
    /// The run's tasks run in `dir`, which this job cannot enter: its own directory instead.
    WorkdirRefused {
        job: String,
        dir: String,
        why: String,
    },
    AgentsDidNotStart {
        job: String,
        why: String,
    },
    /// The new leader would not take the kept agents back: they finish what they hold.
    CouldNotKeep {
        job: String,
        why: String,
    },
    AgentsEnded {
        job: String,
    },
    /// The leader's link closed while the agents ran: they wait, with their tasks.
    LeaderGone {
        job: String,
    },
    /// The leader that took this job in still leads: it told the agents to leave.
    LetGo {
        job: String,
    },
    /// The leader went before this job could join.
    LeaderWentFirst {
        job: String,
        why: String,
    },
    CannotJoin {
        job: String,
        why: String,
    },
    TimeUp {
        job: String,
    },
    RunEnded {
        job: String,
    },
    /// The run's lock stayed held with no leader published for this long (s).
    NobodyLeads {
        secs: u64,
    },
    TakesOver {
        job: String,
        left: u64,
    },
    LeadsWithKept {
        job: String,
        agents: usize,
    },
    CannotLead {
        why: String,
    },
    /// The session ended while joined jobs run: one of them takes over.
    HandedOver {
        joined: usize,
    },
    NotResubmitting {
        done: u64,
        max: u32,
    },
    Resubmitted {
        nth: u64,
        max: u32,
        said: String,
    },
    /// The resubmission failed; `resume`: what to run instead, when the summary did not say it.
    CouldNotResubmit {
        why: String,
        resume: Option<String>,
    },
}

impl Report {
    /// Whether this is an error (stderr) rather than news (stdout).
    pub fn to_stderr(&self) -> bool {
        matches!(self, Report::CannotJoin { .. } | Report::NobodyLeads { .. } | Report::CannotLead { .. })
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Report::Joins { job, run, run_job, nodes, first, last } => {
                write!(f, "htc: job {job} joins run {run} (job {run_job}) with {nodes} node(s): agents {first}..{last}")
            }
            Report::Stays { job, run, first, last } => {
                write!(f, "htc: job {job} stays in run {run} with its agents {first}..{last}, which kept their tasks")
            }
            Report::WorkdirRefused { job, dir, why } => {
                write!(f, "htc: job {job}: the run's tasks run in {dir}, which it cannot enter ({why}); its own run here")
            }
            Report::AgentsDidNotStart { job, why } => write!(f, "htc: job {job}: its agents did not start: {why}"),
            Report::CouldNotKeep { job, why } => {
                write!(f, "htc: job {job}: its agents could not keep their places ({why}); they finish first")
            }
            Report::AgentsEnded { job } => write!(f, "htc: job {job}: its agents have ended"),
            Report::LeaderGone { job } => {
                write!(f, "htc: job {job}: the run's leader is gone; its agents wait, with their tasks, for the next")
            }
            Report::LetGo { job } => write!(f, "htc: job {job}: its leader let it go; it has left the run"),
            Report::LeaderWentFirst { job, why } => write!(f, "htc: job {job}: {why}"),
            Report::CannotJoin { job, why } => write!(f, "htc: job {job} cannot join: {why}"),
            Report::TimeUp { job } => write!(f, "htc: job {job}: its time is up; it has left the run"),
            Report::RunEnded { job } => write!(f, "htc: job {job}: the run has ended"),
            Report::NobodyLeads { secs } => {
                write!(f, "htc-agent: the run's lock is held, but nobody leads it, for {secs} s")
            }
            Report::TakesOver { job, left } => write!(
                f,
                "htc: job {job} takes the run over ({left} tasks left to run, those in flight when its leader went among them)"
            ),
            Report::LeadsWithKept { job, agents } => {
                write!(f, "htc: job {job} leads the run with its {agents} agent(s), which kept their tasks")
            }
            Report::CannotLead { why } => write!(f, "htc: {why}"),
            Report::HandedOver { joined } => {
                write!(f, "htc: {joined} joined job(s) still run: one of them takes the run over")
            }
            Report::NotResubmitting { done, max } => write!(
                f,
                "htc: not resubmitting: the run was resubmitted {done} times already (--htc-resubmit={max})"
            ),
            Report::Resubmitted { nth, max, said } => write!(f, "htc: resubmitted ({nth} of {max}): {said}"),
            Report::CouldNotResubmit { why, resume: None } => write!(f, "htc: could not resubmit: {why}"),
            Report::CouldNotResubmit { why, resume: Some(r) } => {
                write!(f, "htc: could not resubmit: {why}; continue with: {r}")
            }
        }
    }
}
