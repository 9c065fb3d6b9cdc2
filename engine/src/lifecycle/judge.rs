//! The judgements the run's life turns on, each from what the driver saw and the time: whether
//! the leader that took a job in still leads the run, and whether a session that ended continues
//! in a resubmitted job.

/// Slurm's default KillWait: between the SIGTERM at the time limit and the SIGKILL. A job starts
/// no task and leaves the run this long before its end, so that it ends well.
pub const KILL_WAIT_US: u64 = 30_000_000;

/// How far before the job's end a SIGTERM still counts as the time limit's. The end is known to
/// the second (`squeue`'s `%L`, read once at the start), so a signal in the last 2 s may be a
/// cancel or the limit: it is taken for the limit. Slurm itself sends the limit's SIGTERM at or
/// after the end (its check runs every ~30 s), never before.
pub const LIMIT_SLACK_US: u64 = 2_000_000;

/// A leader rewrites its live view every second: one older than this is not a running leader's
/// (a leader killed outright leaves its address file, but its view ages).
pub const LIVE_FRESH_US: u64 = 5_000_000;

/// How a session this job led ended, as far as what comes next depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEnd {
    /// Every task is done or failed.
    Complete,
    /// SIGTERM: Slurm's at the time limit, or a `scancel`.
    Terminated,
    /// Another signal (SIGINT).
    Interrupted,
    /// Preempted by Slurm, with a grace that the run used.
    Preempted,
    /// No agent was left to run the remaining tasks.
    AgentsLost,
    /// `--max-fails` stopped it.
    TooManyFailures,
    /// What is left cannot finish before the time limit, by the tasks' runtime hints.
    OutOfTime,
    /// An agent could not start on its node: a broken node, which a resubmitted job might be
    /// given again.
    AgentNotStarted,
}

/// The run's live view as the driver read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveSeen {
    /// The job whose leader wrote it.
    pub job: String,
    /// "running" while its session runs.
    pub state: String,
    /// When it was written, unix µs.
    pub written_us: u64,
}

/// Whether job `leader`'s leader still leads the run at `now_us`: its address is the published
/// one and its live view is fresh.
pub fn still_leads(leader: &str, published: Option<&str>, live: Option<&LiveSeen>, now_us: u64) -> bool {
    let fresh = live.is_some_and(|v| {
        v.job == leader && v.state == "running" && now_us.saturating_sub(v.written_us) < LIVE_FRESH_US
    });
    published == Some(leader) && fresh
}

/// Whether a signal that came at `signal_us` came at the time limit of a job that ends at
/// `end_us`: at or after the end, give or take the end's precision (`LIMIT_SLACK_US`). A job
/// without a limit has none to reach.
pub fn at_time_limit(signal_us: u64, end_us: Option<u64>) -> bool {
    end_us.is_some_and(|end| signal_us.saturating_add(LIMIT_SLACK_US) >= end)
}

/// Whether a session that ended so, at `ended_us`, continues in a resubmitted job
/// (`--htc-resubmit`): out of time, agents lost, preempted, or SIGTERM at the time limit; not when
/// someone cancelled the job (SIGTERM before its end) or the run ended.
pub fn resubmit_due(end: SessionEnd, ended_us: u64, job_end_us: Option<u64>) -> bool {
    match end {
        SessionEnd::OutOfTime | SessionEnd::AgentsLost | SessionEnd::Preempted => true,
        SessionEnd::Terminated => at_time_limit(ended_us, job_end_us),
        SessionEnd::Complete | SessionEnd::Interrupted | SessionEnd::TooManyFailures | SessionEnd::AgentNotStarted => {
            false
        }
    }
}
