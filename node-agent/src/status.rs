//! What users see of a run: the live progress line, the final summary, and `htc status`.
//! Everything is computed from the ledger's counters and meta keys, so it costs no scan.

use std::fmt::Write as _;
use std::time::Duration;

use crate::leader::core::Progress;
use crate::ledger::{Ledger, ReadTxn, State};
use crate::rundir::{now_us, RunDir};

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

pub fn progress_line(p: &Progress) -> String {
    let c = p.counts;
    let finished = c.get(State::Done) + c.get(State::Failed);
    let remaining = c.total() - finished;
    let (rate, eta) = rate_eta(p.finished_this_session, p.elapsed, remaining);
    let pct = if c.total() > 0 { 100.0 * finished as f64 / c.total() as f64 } else { 100.0 };
    format!(
        "[htc] {finished}/{} ({pct:.1}%) done={} failed={} running={} | {rate:.0} tasks/s | ETA {} | {} agents",
        c.total(),
        c.get(State::Done),
        c.get(State::Failed),
        c.get(State::Dispatched) + c.get(State::Running),
        eta.map(fmt_duration).unwrap_or_else(|| "-".into()),
        p.agents
    )
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
                r.line,
                r.outcome().describe(r.value),
                r.attempts,
                if r.attempts == 1 { "" } else { "s" }
            );
        }
    }
    Ok(())
}

pub fn summary(ledger: &Ledger, run: &RunDir, p: &Progress) -> anyhow::Result<String> {
    let t = ledger.read()?;
    let c = t.counts()?;
    let mut s = String::new();
    let (rate, _) = rate_eta(p.finished_this_session, p.elapsed, 0);
    let _ = writeln!(
        s,
        "htc: {} tasks: {} done, {} failed, {} unfinished in {} ({rate:.0} tasks/s)",
        c.total(),
        c.get(State::Done),
        c.get(State::Failed),
        c.get(State::Pending) + c.get(State::Dispatched) + c.get(State::Running),
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
    // SAFETY: kill with signal 0 only checks for existence.
    pid > 0
        && pid < i32::MAX as u64
        && unsafe { libc::kill(pid as i32, 0) == 0 || *libc::__errno_location() == libc::EPERM }
}

/// The `htc status` report.
pub fn report(run: &RunDir, failures_limit: usize) -> anyhow::Result<String> {
    let ledger = Ledger::open(&run.ledger(), true)?;
    let t = ledger.read()?;
    let c = t.counts()?;
    let mut s = String::new();
    let job = t.meta("job_id")?.map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default();
    let file = t.meta("task_file")?.map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default();
    let finished_us = t.meta_u64("finished_us")?;
    let heartbeat = t.meta_u64("heartbeat_us")?.unwrap_or(0);
    let leader = t.meta_u64("leader_pid")?.unwrap_or(0);
    let fresh = now_us().saturating_sub(heartbeat) < 10_000_000;
    let unfinished = c.get(State::Pending) + c.get(State::Dispatched) + c.get(State::Running);
    let state = if finished_us.is_some() && unfinished == 0 {
        if c.get(State::Failed) == 0 {
            "finished, all tasks succeeded"
        } else {
            "finished with failures"
        }
    } else if fresh && pid_alive(leader) {
        "running"
    } else if heartbeat == 0 {
        "not started"
    } else {
        "interrupted (continue with: htc run --resume RUN)"
    };
    let _ = writeln!(s, "run:      {} (job {job})", run.path.display());
    let _ = writeln!(s, "tasks:    {file}");
    let _ = writeln!(s, "state:    {state}");
    let _ = writeln!(
        s,
        "counts:   total={} done={} failed={} pending={} dispatched={} running={}",
        c.total(),
        c.get(State::Done),
        c.get(State::Failed),
        c.get(State::Pending),
        c.get(State::Dispatched),
        c.get(State::Running)
    );
    let start = t.meta_u64("session_start_us")?.unwrap_or(0);
    let f0 = t.meta_u64("session_finished_start")?.unwrap_or(0);
    if start > 0 {
        let end = finished_us.unwrap_or(if state == "running" { now_us() } else { heartbeat });
        let elapsed = Duration::from_micros(end.saturating_sub(start));
        let finished = c.get(State::Done) + c.get(State::Failed);
        let (rate, eta) = rate_eta(finished.saturating_sub(f0), elapsed, unfinished);
        let _ = writeln!(
            s,
            "rate:     {rate:.0} tasks/s over {} (this session){}",
            fmt_duration(elapsed),
            match eta {
                Some(e) if state == "running" => format!(", ETA {}", fmt_duration(e)),
                _ => String::new(),
            }
        );
    }
    failures(&t, failures_limit, &mut s)?;
    Ok(s)
}
