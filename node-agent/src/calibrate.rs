//! `htc calibrate`: HFlow's s and d measured through the real path (papers/000 §4.2.2), by
//! running `htc run` itself on `true` tasks in a scratch directory.
//!
//! - d, the time an instance takes to dispatch one task: one agent on every CPU runs N tasks;
//!   d = elapsed / N (the run is dispatch-bound: `true` takes no time of its own).
//! - s, the time to start one more instance: runs with 1 and with K agents of one core each,
//!   one task per agent; the local launcher starts agents one after another, so
//!   s = (wall(K) − wall(1)) / (K − 1).
//!
//! - the leader's cost per report and per task: two `--exec none` runs (the leader busy, as in
//!   a large run) whose reports differ in size; each gives CPU per task = per task + per report /
//!   results per report, and the two are solved for both.
//!
//! Each run is repeated and the median taken: the machine is shared and noisy.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context};

use crate::rundir::RunDir;
use crate::site::{LeaderCost, Site};
use crate::status::Report;

const ROUNDS: usize = 3;
const START_AGENTS: usize = 8;

pub struct Measured {
    pub s: f64,
    pub d: f64,
    pub s_rounds: Vec<f64>,
    pub d_rounds: Vec<f64>,
    pub leader: LeaderCost,
    /// Each layout's median (leader µs per task, results per report).
    pub leader_runs: Vec<(f64, f64)>,
}

/// The `--exec none` layouts (agents, cores): small reports, then large ones.
const LEADER_LAYOUTS: [(usize, usize); 2] = [(16, 1), (2, 64)];

/// Runs the measurements with the `htc` binary at `htc`, in a scratch directory under `scratch`.
pub fn measure(htc: &Path, scratch: &Path, tasks: u64, cpus: usize) -> anyhow::Result<Measured> {
    let dir = tempdir(scratch)?;
    let result = (|| {
        let many = dir.join("true.txt");
        std::fs::write(&many, "true\n".repeat(tasks.max(1) as usize))?;
        let mut d_rounds = Vec::new();
        for _ in 0..ROUNDS {
            let elapsed = run_elapsed(htc, &dir, &many, 1, cpus)?;
            d_rounds.push(elapsed / tasks.max(1) as f64);
        }
        let mut s_rounds = Vec::new();
        for _ in 0..ROUNDS {
            let one = wall(htc, &dir, 1)?;
            let k = wall(htc, &dir, START_AGENTS)?;
            s_rounds.push(((k - one) / (START_AGENTS - 1) as f64).max(0.0));
        }
        let mut leader_runs = Vec::new();
        for (agents, cores) in LEADER_LAYOUTS {
            let mut rounds = Vec::new();
            for _ in 0..ROUNDS {
                rounds.push(leader_run(htc, &dir, &many, agents, cores)?);
            }
            let us: Vec<f64> = rounds.iter().map(|r| r.0).collect();
            let size: Vec<f64> = rounds.iter().map(|r| r.1).collect();
            leader_runs.push((median(&us), median(&size)));
        }
        let leader = solve_leader(leader_runs[0], leader_runs[1]);
        Ok(Measured { s: median(&s_rounds), d: median(&d_rounds), s_rounds, d_rounds, leader, leader_runs })
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// The site file for a measurement: `t` and the plan are kept from `base`.
pub fn site(base: &Site, m: &Measured) -> Site {
    let mut site = base.clone();
    site.params.s = m.s;
    site.params.d = m.d;
    site.leader = m.leader;
    site.source = None;
    site
}

fn tempdir(under: &Path) -> anyhow::Result<PathBuf> {
    let dir = under.join(format!("htc-calibrate.{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

fn htc_run(htc: &Path, dir: &Path, file: &Path, agents: usize, cores: usize) -> Command {
    let _ = std::fs::remove_dir_all(dir.join(".htc"));
    let mut c = Command::new(htc);
    c.current_dir(dir)
        .arg("run")
        .arg(file)
        .args(["--agents", &agents.to_string(), "--cores-per-agent", &cores.to_string()])
        .args(["--output", "none", "-q"]);
    c
}

/// The run's own elapsed time (first dispatch to last result), from its status.
fn run_elapsed(htc: &Path, dir: &Path, file: &Path, agents: usize, cores: usize) -> anyhow::Result<f64> {
    let status = htc_run(htc, dir, file, agents, cores).status().context("running htc run")?;
    if !status.success() {
        bail!("htc run of {} failed: {status}", file.display());
    }
    Ok(Report::read(&last_run(dir)?, 0)?.elapsed_s)
}

/// The scratch directory holds one run only (`htc_run` removed the last).
fn last_run(dir: &Path) -> anyhow::Result<RunDir> {
    let path = std::fs::read_dir(dir.join(".htc"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.join("ledger.mdb").exists())
        .context("the run left no run directory")?;
    Ok(RunDir::new(path))
}

/// One `--exec none` run: the leader's CPU per task and the results per report it saw.
fn leader_run(htc: &Path, dir: &Path, file: &Path, agents: usize, cores: usize) -> anyhow::Result<(f64, f64)> {
    let status = htc_run(htc, dir, file, agents, cores).args(["--exec", "none"]).status().context("running htc run")?;
    if !status.success() {
        bail!("htc run --exec none of {} failed: {status}", file.display());
    }
    let r = Report::read(&last_run(dir)?, 0)?;
    let per_task = r.leader_cpu_s * 1e6 / r.finished_this_session.max(1) as f64;
    Ok((per_task, r.reports.mean().unwrap_or(1.0)))
}

/// Per task and per report from two runs' (µs per task, results per report): c = t + r / n.
/// A noisy pair that gives a negative part is read as all per task (or all per report).
fn solve_leader((c1, n1): (f64, f64), (c2, n2): (f64, f64)) -> LeaderCost {
    let (a, b) = (1.0 / n1.max(1.0), 1.0 / n2.max(1.0));
    if (a - b).abs() < 1e-9 {
        return LeaderCost { per_report_us: 0.0, per_task_us: c1.min(c2) };
    }
    let per_report = ((c1 - c2) / (a - b)).max(0.0);
    let per_task = (c1 - per_report * a).max(0.0);
    LeaderCost { per_report_us: per_report, per_task_us: per_task }
}

/// Wall time of a whole `htc run` of one task per agent, agents of one core.
fn wall(htc: &Path, dir: &Path, agents: usize) -> anyhow::Result<f64> {
    let file = dir.join(format!("start-{agents}.txt"));
    std::fs::write(&file, "true\n".repeat(agents))?;
    let t0 = Instant::now();
    let status = htc_run(htc, dir, &file, agents, 1).status().context("running htc run")?;
    if !status.success() {
        bail!("htc run of {} failed: {status}", file.display());
    }
    Ok(t0.elapsed().as_secs_f64())
}

/// The current time as `YYYY-MM-DDTHH:MM:SSZ`, for the file's header.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rest) = ((secs / 86_400) as i64, secs % 86_400);
    // Days to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rest / 3600, rest % 3600 / 60, rest % 60)
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_leader_s_cost_per_report_and_per_task_from_two_runs() {
        // 0.6 us per task and 20 us per report, seen through reports of 50 and of 400.
        let c = super::solve_leader((0.6 + 20.0 / 50.0, 50.0), (0.6 + 20.0 / 400.0, 400.0));
        assert!((c.per_task_us - 0.6).abs() < 1e-9 && (c.per_report_us - 20.0).abs() < 1e-9, "{c:?}");
        // Noise that says larger reports cost more per task: no negative per-report cost.
        let c = super::solve_leader((1.0, 50.0), (1.2, 400.0));
        assert_eq!(c.per_report_us, 0.0);
    }

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(super::median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(super::median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(super::median(&[]), 0.0);
    }
}
