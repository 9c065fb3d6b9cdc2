//! `htc calibrate`: HFlow's s and d measured through the real path (papers/000 §4.2.2), by
//! running `htc run` itself on `true` tasks in a scratch directory.
//!
//! - d, the time an instance takes to dispatch one task: one agent on every CPU runs N tasks;
//!   d = elapsed / N (the run is dispatch-bound: `true` takes no time of its own).
//! - s, the time to start one more instance: runs with 1 and with K agents of one core each,
//!   one task per agent; the local launcher starts agents one after another, so
//!   s = (wall(K) − wall(1)) / (K − 1).
//!
//! Each run is repeated and the median taken: the machine is shared and noisy.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context};

use crate::rundir::RunDir;
use crate::site::Site;
use crate::status::Report;

const ROUNDS: usize = 3;
const START_AGENTS: usize = 8;

pub struct Measured {
    pub s: f64,
    pub d: f64,
    pub s_rounds: Vec<f64>,
    pub d_rounds: Vec<f64>,
}

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
        Ok(Measured { s: median(&s_rounds), d: median(&d_rounds), s_rounds, d_rounds })
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// The site file for a measurement: `t` and the plan are kept from `base`.
pub fn site(base: &Site, m: &Measured) -> Site {
    let mut site = base.clone();
    site.params.s = m.s;
    site.params.d = m.d;
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
    // The scratch directory holds this one run only (`htc_run` removed the last).
    let path = std::fs::read_dir(dir.join(".htc"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.join("ledger.mdb").exists())
        .context("the run left no run directory")?;
    Ok(Report::read(&RunDir::new(path), 0)?.elapsed_s)
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
    fn median_of_odd_and_even() {
        assert_eq!(super::median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(super::median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(super::median(&[]), 0.0);
    }
}
