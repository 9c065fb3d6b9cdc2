//! What users see of a run: the live progress line, the final summary, and `htc status`.
//! Everything is computed from the ledger's counters and meta keys, so it costs no scan.

use htc_core::hist::Summary;
use serde::Serialize;
use std::fmt::Write as _;
use std::io::IsTerminal;
use std::time::Duration;

use crate::leader::core::{Ending, Progress};
use crate::leader::{self, ProgressSink};
use crate::ledger::{Ledger, ReadTxn};
use crate::rundir::{now_us, RunDir};
use htc_core::task::{Counts, State};

pub fn fmt_duration(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{}h{:02}m", s / 3600, s / 60 % 60)
    } else if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

fn rate_eta(finished: u64, elapsed: Duration, remaining: u64) -> (f64, Option<Duration>) {
    let secs = elapsed.as_secs_f64();
    let rate = if secs > 0.0 { finished as f64 / secs } else { 0.0 };
    let eta = (rate > 0.0).then(|| Duration::from_secs_f64(remaining as f64 / rate));
    (rate, eta)
}

/// The allocations that joined a run, in a line: each with its job, nodes, state, time left and
/// what it ran (`htc status`, `htc watch`).
pub fn allocations_line(allocations: &[crate::live::Allocation], now_us: u64) -> String {
    let each: Vec<String> = allocations
        .iter()
        .map(|a| {
            let left = if a.ends_us > 0 && a.state == "running" {
                format!(", {} left", fmt_duration(Duration::from_micros(a.ends_us.saturating_sub(now_us))))
            } else {
                String::new()
            };
            let plural = if a.nodes == 1 { "" } else { "s" };
            format!("job {} ({} node{plural}, {}{left}, {} tasks run)", a.job, a.nodes, a.state, a.tasks)
        })
        .collect();
    each.join("; ")
}

/// The count of cancelled tasks after `label`, or nothing when none was: a run without
/// cancels reads as it always did.
fn cancelled(c: &Counts, label: &str) -> String {
    match c.get(State::Cancelled) {
        0 => String::new(),
        n => format!("{label}{n}"),
    }
}

/// The count of blocked tasks after `label`, or nothing when none is.
fn blocked(n: u64, label: &str) -> String {
    match n {
        0 => String::new(),
        n => format!("{label}{n}"),
    }
}

pub fn progress_line(p: &Progress) -> String {
    let c = p.counts;
    let finished = c.finished();
    let remaining = c.total() - finished;
    let (rate, eta) = rate_eta(p.finished_this_session, p.elapsed, remaining);
    let pct = if c.total() > 0 { 100.0 * finished as f64 / c.total() as f64 } else { 100.0 };
    format!(
        "[htc] {finished}/{} ({pct:.1}%) done={} failed={}{} running={} queued={}{} | {rate:.0} tasks/s | ETA {} | {} agents",
        c.total(),
        c.get(State::Done),
        c.get(State::Failed),
        cancelled(&c, " cancelled="),
        c.get(State::Running),
        c.get(State::Dispatched),
        blocked(p.blocked, " blocked="),
        eta.map(fmt_duration).unwrap_or_else(|| "-".into()),
        p.agents
    )
}

/// The progress display of a run in this process: a bar on a terminal (every 250 ms); elsewhere
/// (e.g. Slurm's output file) a plain line every `plain_every`, or nothing when `None` or `quiet`.
pub fn sink(quiet: bool, plain_every: Option<Duration>) -> Option<Box<dyn ProgressSink>> {
    if quiet {
        return None;
    }
    if std::io::stderr().is_terminal() {
        return Some(Box::new(Bar(progress_bar())));
    }
    plain_every.map(|every| Box::new(Plain(every)) as Box<dyn ProgressSink>)
}

struct Bar(indicatif::ProgressBar);

impl ProgressSink for Bar {
    fn every(&self) -> Duration {
        Duration::from_millis(250)
    }
    fn show(&mut self, p: &Progress) {
        show_progress(&self.0, p)
    }
    fn finish(&mut self) {
        self.0.finish()
    }
}

struct Plain(Duration);

impl ProgressSink for Plain {
    fn every(&self) -> Duration {
        self.0
    }
    fn show(&mut self, p: &Progress) {
        eprintln!("{}", progress_line(p))
    }
}

/// The progress bar of `htc run` on a terminal (the plain `progress_line` elsewhere).
pub fn progress_bar() -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
    let style = indicatif::ProgressStyle::with_template("[htc] {wide_bar} {pos}/{len} ({percent}%) {msg}")
        .expect("a valid template")
        .progress_chars("=> ");
    bar.set_style(style);
    bar
}

pub fn show_progress(bar: &indicatif::ProgressBar, p: &Progress) {
    let c = p.counts;
    let finished = c.finished();
    let (rate, eta) = rate_eta(p.finished_this_session, p.elapsed, c.total() - finished);
    bar.set_length(c.total());
    bar.set_position(finished);
    let failed = c.get(State::Failed);
    bar.set_message(format!(
        "{rate:.0} tasks/s, ETA {}{} | running {} (queued {}) on {} agents",
        eta.map(fmt_duration).unwrap_or_else(|| "-".into()),
        if failed > 0 { format!(" | {failed} failed") } else { String::new() },
        c.get(State::Running),
        c.get(State::Dispatched),
        p.agents
    ));
}

/// Describes why each of the first `limit` failed tasks failed.
fn failures(t: &ReadTxn<'_>, limit: usize, out: &mut String) -> anyhow::Result<()> {
    let ids = t.failed_ids(limit + 1)?;
    if ids.is_empty() {
        return Ok(());
    }
    let _ =
        writeln!(out, "failed tasks{}:", if ids.len() > limit { format!(" (first {limit})") } else { String::new() });
    for id in ids.iter().take(limit) {
        if let Some(r) = t.get(*id)? {
            let _ = writeln!(
                out,
                "  task {id} (line {}): {} after {} attempt{}",
                r.line(),
                r.outcome().describe(r.value()),
                r.attempts(),
                if r.attempts() == 1 { "" } else { "s" }
            );
        }
    }
    Ok(())
}

/// Prints the end-of-run summary and returns the process exit code: 0 only when every task
/// succeeded. `resume_hint`: whether to say how to continue an unfinished run; not when a job
/// that continues it is already on its way (resubmitted, or a joined job takes it over).
pub fn finish(run: &RunDir, outcome: &leader::Outcome, quiet: bool, resume_hint: bool) -> anyhow::Result<i32> {
    let c = outcome.progress.counts;
    // A cancelled task did not succeed either.
    let failed = c.get(State::Failed) + c.get(State::Cancelled);
    // A Slurm job's run is named by its job id: a new job continues it.
    let resume = match resume_hint {
        false => String::new(),
        true if run.id().bytes().all(|b| b.is_ascii_digit()) => format!("; continue with: htc resume {}", run.id()),
        true => format!("; continue with: htc run --resume {}", run.path.display()),
    };
    if !quiet {
        let ledger = Ledger::open(&run.ledger(), true)?;
        eprint!("{}", summary(&ledger, run, &outcome.progress)?);
    }
    Ok(match &outcome.ending {
        Ending::Complete if failed == 0 => 0,
        Ending::Complete => 1,
        Ending::Interrupted(sig) => {
            // Else a joined job takes the run over, and says so.
            if outcome.progress.joined_running == 0 {
                eprintln!("htc: interrupted{resume}");
            }
            128 + sig
        }
        Ending::Preempted(sig) => {
            if outcome.progress.joined_running == 0 {
                eprintln!("htc: preempted; what ran in its grace is recorded{resume}");
            }
            128 + sig
        }
        Ending::TooManyFailures(n) => {
            eprintln!("htc: stopped after {n} failed tasks (--max-fails); the rest did not run{resume}");
            1
        }
        Ending::OutOfTime(n) => {
            eprintln!("htc: {n} tasks cannot finish before the time limit (by their runtime hints){resume}");
            2
        }
        Ending::AgentsLost(why) => {
            eprintln!("htc: {why}{resume}");
            2
        }
        Ending::AgentNotStarted(why) => {
            eprintln!("htc: {why}: the run stopped, for the node's admin to see to{resume}");
            2
        }
    })
}

pub fn summary(ledger: &Ledger, run: &RunDir, p: &Progress) -> anyhow::Result<String> {
    let t = ledger.read()?;
    let c = t.counts()?;
    let mut s = String::new();
    let (rate, _) = rate_eta(p.finished_this_session, p.elapsed, 0);
    let _ = writeln!(
        s,
        "htc: {} tasks: {} done, {} failed, {}{} unfinished in {} ({rate:.0} tasks/s)",
        c.total(),
        c.get(State::Done),
        c.get(State::Failed),
        match c.get(State::Cancelled) {
            0 => String::new(),
            n => format!("{n} cancelled, "),
        },
        c.unfinished(),
        fmt_duration(p.elapsed),
    );
    failures(&t, 10, &mut s)?;
    let _ = writeln!(
        s,
        "htc: run directory {} (htc status {} / htc output {} TASK)",
        run.path.display(),
        run.id(),
        run.id()
    );
    Ok(s)
}

fn pid_alive(pid: u64) -> bool {
    use nix::{errno::Errno, sys::signal::kill, unistd::Pid};
    // No signal sends nothing: it only checks that the pid exists (and may be signalled).
    pid > 0 && pid < i32::MAX as u64 && matches!(kill(Pid::from_raw(pid as i32), None), Ok(()) | Err(Errno::EPERM))
}

/// What `htc status` knows of a run's leader.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    finished: bool,
    failed: bool,
    /// Since the leader's last heartbeat in the ledger; `None` if it never started.
    heartbeat_age_us: Option<u64>,
    /// The leader recorded the end of its session (a signal, agents lost, fail fast).
    ended: bool,
    /// Whether the leader's process exists, when it ran on this host.
    leader_alive: Option<bool>,
    leader_host: String,
    /// The Slurm job id, for a run made by `sbatch --htc`.
    slurm_job: Option<String>,
    /// Slurm says the job of the leader's session is over (it was killed with its node, say):
    /// a heartbeat that is still fresh then does not mean a live leader.
    job_over: bool,
    /// A joined job that still runs while the leader's session is over: it takes the run over
    /// (a hand-over takes it a moment before the new session starts).
    taking_over: Option<String>,
    /// How long the leader may stay silent (it writes its heartbeat every second) before it is
    /// taken for gone: the site's `lost_after_s`, at least 3 s.
    silent_after_us: u64,
}

/// The run's state (a stable word, and words for people with what to do), from what is seen. A
/// leader on another host (a Slurm job seen from a login node) is judged by its heartbeat alone;
/// one on this host also by its process, so that a stopped leader is not advised to be resumed
/// (the resume would find the run locked).
fn judge(s: &Seen) -> (&'static str, String) {
    let resume = match &s.slurm_job {
        Some(j) => format!("htc resume {j}, from the directory the job was submitted from"),
        None => "htc run --resume RUN".to_string(),
    };
    let fresh = s.heartbeat_age_us.is_some_and(|a| a < s.silent_after_us);
    let silent_s = s.heartbeat_age_us.unwrap_or(0) as f64 / 1e6;
    match (s.finished, s.heartbeat_age_us, s.leader_alive) {
        (true, _, _) if s.failed => ("failed", "finished with failures".into()),
        (true, _, _) => ("succeeded", "finished, all tasks succeeded".into()),
        (_, None, _) => ("not_started", "not started".into()),
        _ if s.ended || s.job_over => match &s.taking_over {
            Some(j) => ("running", format!("running (joined job {j} takes the run over)")),
            None => ("interrupted", format!("interrupted (continue with: {resume})")),
        },
        (_, _, Some(true)) if fresh => ("running", "running".into()),
        (_, _, None) if fresh => ("running", format!("running (leader on {})", s.leader_host)),
        (_, _, Some(true)) => (
            "not_responding",
            format!("not responding: the leader's process is there but silent for {silent_s:.0} s (stopped?)"),
        ),
        _ => ("interrupted", format!("interrupted (continue with: {resume})")),
    }
}

/// A job that joined the run and that Slurm says still runs (one `squeue` each, asked only of
/// the jobs the last live view calls running): it takes the run over from a leader that ended.
fn joined_still_running(v: &crate::live::View, leader_job: &str) -> Option<String> {
    v.allocations
        .iter()
        .filter(|a| a.state == "running" && a.job != leader_job && a.job.bytes().all(|b| b.is_ascii_digit()))
        .find(|a| crate::slurm::job_over(&a.job) == Some(false))
        .map(|a| a.job.clone())
}

/// A run as `htc status` describes it, read from the ledger's counters and meta keys.
pub struct Report {
    pub run: String,
    pub job: String,
    pub task_file: String,
    /// One stable word (`state_key`): running, not_responding, succeeded, failed, interrupted,
    /// not_started.
    pub key: &'static str,
    /// The same for people, with what to do.
    pub state: String,
    pub counts: Counts,
    /// This session: seconds from its start to its end (or now, while running).
    pub elapsed_s: f64,
    /// Tasks finished per second in this session.
    pub rate: f64,
    pub eta_s: Option<f64>,
    /// CPU seconds the leader process spent leading this session (user + system).
    pub leader_cpu_s: f64,
    /// CPU seconds it spent before (loading the task file, for a fresh run).
    pub load_cpu_s: f64,
    /// Pending tasks that wait for others (`after=`), as the leader last wrote.
    pub blocked: u64,
    /// Tasks finished (done or failed) in this session.
    pub finished_this_session: u64,
    /// The agents' reports the leader handled in this session: results per report.
    pub reports: Summary,
    /// How long results took from their end to the leader in this session, in microseconds.
    pub result_delays: Summary,
    /// (task id, line, attempts, reason) of the first failed tasks.
    pub failures: Vec<(u64, u32, u8, String)>,
    /// More tasks failed than `failures` lists.
    pub more_failures: bool,
    /// The allocations that joined the run, as its live view last said.
    pub allocations: Vec<crate::live::Allocation>,
    /// When the live view was written (unix µs).
    pub live_us: u64,
}

/// The first `limit` failed tasks (id, line, attempts, how the last ended), and whether there
/// are more.
type Failures = (Vec<(u64, u32, u8, String)>, bool);
fn first_failures(t: &ReadTxn<'_>, limit: usize) -> anyhow::Result<Failures> {
    let mut failures = Vec::new();
    let ids = t.failed_ids(limit + 1)?;
    for &id in ids.iter().take(limit) {
        if let Some(r) = t.get(id)? {
            failures.push((id, r.line(), r.attempts(), r.outcome().describe(r.value())));
        }
    }
    Ok((failures, ids.len() > limit))
}

impl Report {
    pub fn read(run: &RunDir, failures_limit: usize) -> anyhow::Result<Report> {
        // Only for what the ledger does not keep (the joined allocations): a bad file is no error.
        let live = crate::livefile::read(&run.path).ok().flatten();
        let ledger = Ledger::open(&run.ledger(), true)?;
        let t = ledger.read()?;
        let c = t.counts()?;
        let text = |k| -> anyhow::Result<String> {
            Ok(t.meta(k)?.map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default())
        };
        let finished_us = t.meta_u64("finished_us")?;
        let heartbeat = t.meta_u64("heartbeat_us")?.unwrap_or(0);
        let leader = t.meta_u64("leader_pid")?.unwrap_or(0);
        let host = text("leader_host")?;
        let here = host.is_empty() || host == crate::host::hostname();
        let fresh = heartbeat > 0 && now_us().saturating_sub(heartbeat) < 60_000_000;
        let session_job = text("session_slurm_job")?;
        // Only when it matters: a leader elsewhere whose heartbeat looks alive.
        let job_over = fresh && !here && !session_job.is_empty() && crate::slurm::job_over(&session_job) == Some(true);
        let finished = finished_us.is_some() && c.unfinished() == 0;
        let ended = t.meta_u64("session_end_us")?.unwrap_or(0) >= t.meta_u64("session_start_us")?.unwrap_or(u64::MAX);
        // Only for a session that is over with work left: is a joined job about to lead?
        let taking_over = (!finished && (ended || job_over))
            .then(|| live.as_ref().and_then(|v| joined_still_running(v, &session_job)))
            .flatten();
        let seen = Seen {
            finished,
            failed: c.get(State::Failed) > 0,
            heartbeat_age_us: (heartbeat > 0).then(|| now_us().saturating_sub(heartbeat)),
            ended,
            leader_alive: here.then(|| pid_alive(leader)),
            leader_host: host,
            slurm_job: run.id().bytes().all(|b| b.is_ascii_digit()).then(|| run.id()),
            job_over,
            taking_over,
            silent_after_us: (crate::site::Site::load().map(|s| s.lost_after).unwrap_or_default().as_micros() as u64)
                .max(3_000_000),
        };
        let (key, state) = judge(&seen);
        let start = t.meta_u64("session_start_us")?.unwrap_or(0);
        let f0 = t.meta_u64("session_finished_start")?.unwrap_or(0);
        let (mut elapsed_s, mut rate, mut eta_s) = (0.0, 0.0, None);
        let finished_this_session = (c.finished()).saturating_sub(f0);
        if start > 0 {
            let end = finished_us.unwrap_or(if key == "running" { now_us() } else { heartbeat });
            let elapsed = Duration::from_micros(end.saturating_sub(start));
            let finished = c.finished();
            let (r, eta) = rate_eta(finished.saturating_sub(f0), elapsed, c.unfinished());
            elapsed_s = elapsed.as_secs_f64();
            rate = r;
            eta_s = eta.filter(|_| key == "running").map(|e| e.as_secs_f64());
        }
        let (failures, more_failures) = first_failures(&t, failures_limit)?;
        Ok(Report {
            run: std::fs::canonicalize(&run.path).unwrap_or_else(|_| run.path.clone()).display().to_string(),
            job: text("job_id")?,
            task_file: text("task_file")?,
            key,
            state,
            counts: c,
            elapsed_s,
            rate,
            eta_s,
            leader_cpu_s: t.meta_u64("leader_cpu_us")?.unwrap_or(0) as f64 / 1e6,
            load_cpu_s: t.meta_u64("load_cpu_us")?.unwrap_or(0) as f64 / 1e6,
            blocked: t.meta_u64("blocked")?.unwrap_or(0),
            finished_this_session,
            reports: t.meta("reports")?.and_then(Summary::from_bytes).unwrap_or_default(),
            result_delays: t.meta("result_delays")?.and_then(Summary::from_bytes).unwrap_or_default(),
            failures,
            more_failures,
            allocations: live.as_ref().map(|v| v.allocations.clone()).unwrap_or_default(),
            live_us: live.map_or(0, |v| v.now_us),
        })
    }

    pub fn text(&self) -> String {
        let c = &self.counts;
        let mut s = String::new();
        let _ = writeln!(s, "run:      {} (job {})", self.run, self.job);
        let _ = writeln!(s, "tasks:    {}", self.task_file);
        let _ = writeln!(s, "state:    {}", self.state);
        let _ = writeln!(
            s,
            "counts:   total={} done={} failed={}{} pending={}{} dispatched={} running={}",
            c.total(),
            c.get(State::Done),
            c.get(State::Failed),
            cancelled(c, " cancelled="),
            c.get(State::Pending),
            blocked(self.blocked, " blocked="),
            c.get(State::Dispatched),
            c.get(State::Running)
        );
        if self.elapsed_s > 0.0 {
            let _ = writeln!(
                s,
                "rate:     {:.0} tasks/s over {} (this session){}",
                self.rate,
                fmt_duration(Duration::from_secs_f64(self.elapsed_s)),
                self.eta_s.map(|e| format!(", ETA {}", fmt_duration(Duration::from_secs_f64(e)))).unwrap_or_default()
            );
        }
        if self.leader_cpu_s > 0.0 {
            let reports = match self.reports.mean() {
                Some(mean) => format!(
                    ", {} reports of {mean:.1} results on average (99% at most {}); results reached it \
                     {:.1} ms after their end (99% within {:.1} ms)",
                    self.reports.n,
                    self.reports.p99,
                    self.result_delays.p50 as f64 / 1e3,
                    self.result_delays.p99 as f64 / 1e3
                ),
                None => String::new(),
            };
            let _ = writeln!(s, "leader:   {:.2} CPU s this session{reports}", self.leader_cpu_s);
        }
        if !self.allocations.is_empty() {
            let _ = writeln!(s, "joined:   {}", allocations_line(&self.allocations, self.live_us));
        }
        if !self.failures.is_empty() {
            let first = if self.more_failures { format!(" (first {})", self.failures.len()) } else { String::new() };
            let _ = writeln!(s, "failed tasks{first}:");
            for (id, line, attempts, why) in &self.failures {
                let plural = if *attempts == 1 { "" } else { "s" };
                let _ = writeln!(s, "  task {id} (line {line}): {why} after {attempts} attempt{plural}");
            }
        }
        s
    }

    /// The state as one stable word.
    pub fn state_key(&self) -> &'static str {
        self.key
    }

    /// One JSON object; its fields are documented in `docs/status-json.md` and only ever added to.
    pub fn json(&self) -> String {
        let c = &self.counts;
        let num = |v: f64| rounded(v, 6);
        let json = Json {
            version: 1,
            run: &self.run,
            job: &self.job,
            task_file: &self.task_file,
            state: self.state_key(),
            counts: JsonCounts {
                total: c.total(),
                done: c.get(State::Done),
                failed: c.get(State::Failed),
                cancelled: c.get(State::Cancelled),
                pending: c.get(State::Pending),
                blocked: self.blocked,
                dispatched: c.get(State::Dispatched),
                running: c.get(State::Running),
            },
            elapsed_s: num(self.elapsed_s),
            rate: num(self.rate),
            eta_s: self.eta_s.map(num),
            leader_cpu_s: num(self.leader_cpu_s),
            load_cpu_s: num(self.load_cpu_s),
            leader_cpu_us_per_task: (self.finished_this_session > 0)
                .then(|| num(self.leader_cpu_s * 1e6 / self.finished_this_session as f64)),
            reports: self.reports.n,
            results_per_report: self.reports.mean().map(num),
            results_per_report_p99: self.reports.p99,
            result_delay_ms_p50: num(self.result_delays.p50 as f64 / 1e3),
            result_delay_ms_p99: num(self.result_delays.p99 as f64 / 1e3),
            failures: self
                .failures
                .iter()
                .map(|(id, line, attempts, why)| JsonFailure { id: *id, line: *line, attempts: *attempts, reason: why })
                .collect(),
            more_failures: self.more_failures,
        };
        serde_json::to_string(&json).expect("plain data serializes")
    }
}

/// `htc status --json`, its fields in the order they have always had (serde keeps the order of
/// declaration). A float that is not finite is written as null, as before.
#[derive(Serialize)]
struct Json<'a> {
    version: u32,
    run: &'a str,
    job: &'a str,
    task_file: &'a str,
    state: &'a str,
    counts: JsonCounts,
    elapsed_s: f64,
    rate: f64,
    eta_s: Option<f64>,
    leader_cpu_s: f64,
    load_cpu_s: f64,
    leader_cpu_us_per_task: Option<f64>,
    reports: u64,
    results_per_report: Option<f64>,
    results_per_report_p99: u64,
    result_delay_ms_p50: f64,
    result_delay_ms_p99: f64,
    failures: Vec<JsonFailure<'a>>,
    more_failures: bool,
}

#[derive(Serialize)]
struct JsonCounts {
    total: u64,
    done: u64,
    failed: u64,
    cancelled: u64,
    pending: u64,
    /// Among `pending`: those that wait for other tasks.
    blocked: u64,
    dispatched: u64,
    running: u64,
}

#[derive(Serialize)]
struct JsonFailure<'a> {
    id: u64,
    line: u32,
    attempts: u8,
    reason: &'a str,
}

/// `v` as printed with `decimals` places: the value the hand-written JSON showed (`{:.N}` rounds
/// the exact binary value, which `(v * 10^N).round()` does not always match); serde_json then
/// prints it without trailing zeros. Not finite stays as it is (null in JSON).
pub(crate) fn rounded(v: f64, decimals: usize) -> f64 {
    format!("{v:.decimals$}").parse().unwrap_or(v)
}

/// The `htc status` report.
pub fn report(run: &RunDir, failures_limit: usize) -> anyhow::Result<String> {
    Ok(Report::read(run, failures_limit)?.text())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(age_s: Option<u64>, alive: Option<bool>) -> Seen {
        Seen {
            finished: false,
            failed: false,
            heartbeat_age_us: age_s.map(|s| s * 1_000_000),
            ended: false,
            leader_alive: alive,
            leader_host: "n1".into(),
            slurm_job: None,
            job_over: false,
            taking_over: None,
            silent_after_us: 10_000_000,
        }
    }

    #[test]
    fn a_live_leader_is_told_from_a_stopped_or_dead_one_from_any_host() {
        assert_eq!(judge(&seen(Some(1), Some(true))).0, "running");
        // Seen from another host (a login node): the heartbeat alone says it lives.
        assert_eq!(judge(&seen(Some(1), None)), ("running", "running (leader on n1)".to_string()));
        assert_eq!(judge(&seen(Some(60), None)).0, "interrupted");
        // Its heartbeat still fresh, but Slurm says the job is over: the leader died with it.
        assert_eq!(judge(&Seen { job_over: true, ..seen(Some(1), None) }).0, "interrupted");
        // Here, its process gone: interrupted at once; there but silent: stopped, no resume advice.
        assert_eq!(judge(&seen(Some(1), Some(false))).0, "interrupted");
        let (key, text) = judge(&seen(Some(60), Some(true)));
        assert_eq!(key, "not_responding");
        assert!(!text.contains("resume"), "{text}");
        assert_eq!(judge(&seen(None, None)).0, "not_started");
        // The leader recorded its end (scancel): no need to wait for its heartbeat to age.
        assert_eq!(judge(&Seen { ended: true, ..seen(Some(1), None) }).0, "interrupted");
        // Ended, but a joined job still runs: it takes the run over; nothing to resume.
        let handing = Seen { ended: true, taking_over: Some("7".into()), ..seen(Some(1), None) };
        assert_eq!(judge(&handing), ("running", "running (joined job 7 takes the run over)".to_string()));
        let killed = Seen { job_over: true, taking_over: Some("7".into()), ..seen(Some(1), None) };
        assert_eq!(judge(&killed).0, "running");
        // A Slurm job's advice names what works for it.
        let slurm = Seen { slurm_job: Some("42".into()), ..seen(Some(60), None) };
        assert!(judge(&slurm).1.contains("htc resume 42"), "{:?}", judge(&slurm));
        let done = Seen { finished: true, ..seen(Some(600), None) };
        assert_eq!(judge(&done).0, "succeeded");
        assert_eq!(judge(&Seen { failed: true, ..done }).0, "failed");
    }
}
