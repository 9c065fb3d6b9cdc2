//! The site's calibration (HFlow §4.2.2): what starting an instance (`s`) and dispatching one task
//! (`d`) cost on this cluster, measured by `htc calibrate` and kept in a small `key = value` file
//! that an admin can ship for everyone (docs/site-config.md). Without one, defaults measured on a
//! small machine apply.

use std::path::{Path, PathBuf};

use htc_core::hflow::Params;
use htc_core::partition::Plan;

/// Where the site file is looked for, first found wins: `$HTC_SITE_CONFIG`, the user's own
/// (`htc calibrate` writes there by default), the admin's.
pub const ADMIN_PATH: &str = "/etc/slurm-htc/site.conf";

#[derive(Debug, Clone, PartialEq)]
pub struct Site {
    pub params: Params,
    /// The plan used when `--partition` is not given.
    pub partition: Plan,
    /// An agent silent this long is lost (`liveness`).
    pub lost_after: std::time::Duration,
    /// What the leader's CPU costs per report and per task (`htc simulate` charges it).
    pub leader: LeaderCost,
    /// How the agents of Slurm jobs enforce tasks' `mem=` (`htc run --mem-limit`'s choices):
    /// `cgroup` makes an agent that cannot use its node's memory cgroups fail to start, and so
    /// stop the run saying where and why, rather than fall back to watching resident memory.
    pub mem_limit: crate::memcg::Enforce,
    /// The least time between two jobs a run submits to grow (`--htc-grow`): how fast a run may
    /// add to the controller's queue.
    pub grow_gap: std::time::Duration,
    /// How long a node of an open run stands idle before it goes back to Slurm: the longer,
    /// the likelier the run's next tasks find it still there.
    pub open_idle_give_back: std::time::Duration,
    /// The file these came from, if any.
    pub source: Option<PathBuf>,
}

impl Default for Site {
    /// Measured by `htc calibrate` on a 2-core VM (bench/RESULTS.md §5): starting a local agent
    /// and dispatching a `true` through it. `t` is used only for tasks without a runtime hint.
    fn default() -> Self {
        Site {
            params: Params { s: 0.002, d: 0.0005, t: 1.0 },
            partition: Plan::Hflow,
            lost_after: crate::liveness::DEFAULT_LOST_AFTER,
            leader: LeaderCost::default(),
            mem_limit: crate::memcg::Enforce::Auto,
            grow_gap: std::time::Duration::from_micros(htc_core::grow::QUIET_US),
            open_idle_give_back: std::time::Duration::from_micros(htc_engine::leader::core::OPEN_IDLE_US),
            source: None,
        }
    }
}

/// The leader's CPU per report it handles (whatever the report carries: reading, decoding, the
/// ledger transaction, the ack) and per task (its records, its dispatch), busy: what `htc
/// calibrate` measures from two `--exec none` runs whose reports differ in size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LeaderCost {
    pub per_report_us: f64,
    pub per_task_us: f64,
}

impl Default for LeaderCost {
    /// `htc calibrate` on the 2-core VM of bench/RESULTS.md §5.
    fn default() -> Self {
        LeaderCost { per_report_us: DEFAULT_PER_REPORT_US, per_task_us: DEFAULT_PER_TASK_US }
    }
}

const DEFAULT_PER_REPORT_US: f64 = 36.3;
const DEFAULT_PER_TASK_US: f64 = 0.549;

impl LeaderCost {
    /// The leader's CPU for one input carrying `results` results, in microseconds.
    pub fn of(&self, results: u64) -> f64 {
        self.per_report_us + self.per_task_us * results as f64
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SiteError {
    #[error("{path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path}:{line}: {msg}")]
    Bad { path: String, line: usize, msg: String },
}

impl Site {
    /// The site file in force, or the defaults when there is none.
    pub fn load() -> Result<Site, SiteError> {
        match Site::path() {
            Some(p) => Site::read(&p),
            None => Ok(Site::default()),
        }
    }

    /// The first of `$HTC_SITE_CONFIG`, `~/.config/htc/site.conf`, `/etc/slurm-htc/site.conf`
    /// that exists (`$HTC_SITE_CONFIG` is taken even when missing, so a typo is an error).
    pub fn path() -> Option<PathBuf> {
        if let Some(p) = std::env::var_os("HTC_SITE_CONFIG").filter(|p| !p.is_empty()) {
            return Some(PathBuf::from(p));
        }
        [Site::user_path(), Some(PathBuf::from(ADMIN_PATH))].into_iter().flatten().find(|p| p.exists())
    }

    /// `$XDG_CONFIG_HOME/htc/site.conf`, else `~/.config/htc/site.conf`.
    pub fn user_path() -> Option<PathBuf> {
        let base = std::env::var_os("XDG_CONFIG_HOME")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").filter(|p| !p.is_empty()).map(|h| PathBuf::from(h).join(".config")))?;
        Some(base.join("htc").join("site.conf"))
    }

    pub fn read(path: &Path) -> Result<Site, SiteError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| SiteError::Read { path: shown.clone(), source })?;
        Site::parse(&text, &shown).map(|s| Site { source: Some(path.to_path_buf()), ..s })
    }

    /// `key = value` lines; `#` starts a comment. Unknown keys are errors: a misspelt key would
    /// otherwise be silently ignored.
    pub fn parse(text: &str, shown: &str) -> Result<Site, SiteError> {
        let mut site = Site::default();
        for (i, raw) in text.lines().enumerate() {
            let bad = |msg: String| SiteError::Bad { path: shown.to_string(), line: i + 1, msg };
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let Some((key, value)) = line.split_once('=') else {
                return Err(bad(format!("expected `key = value`, found {line:?}")));
            };
            let (key, value) = (key.trim(), value.trim());
            let seconds = || -> Result<f64, SiteError> {
                match value.parse::<f64>() {
                    Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
                    _ => Err(bad(format!("{key}: expected seconds (a number ≥ 0), found {value:?}"))),
                }
            };
            match key {
                "instance_start_s" => site.params.s = seconds()?,
                "dispatch_s" => site.params.d = seconds()?,
                "task_runtime_s" => site.params.t = seconds()?,
                "partition" => site.partition = value.parse().map_err(bad)?,
                "leader_per_report_s" => site.leader.per_report_us = seconds()? * 1e6,
                "leader_per_task_s" => site.leader.per_task_us = seconds()? * 1e6,
                "mem_limit" => {
                    site.mem_limit = <crate::memcg::Enforce as clap::ValueEnum>::from_str(value, false)
                        .map_err(|_| bad(format!("mem_limit: expected auto, cgroup or watch, found {value:?}")))?
                }
                "lost_after_s" => match seconds()? {
                    v if v >= 0.1 => site.lost_after = std::time::Duration::from_secs_f64(v),
                    _ => return Err(bad(format!("lost_after_s: at least 0.1 s, found {value:?}"))),
                },
                // At least a second: a grown job is counted in the queue before the next is
                // considered (the queue is looked at every few seconds).
                "grow_gap_s" => match seconds()? {
                    v if v >= 1.0 => site.grow_gap = std::time::Duration::from_secs_f64(v),
                    _ => return Err(bad(format!("grow_gap_s: at least 1 s, found {value:?}"))),
                },
                "open_idle_give_back_s" => site.open_idle_give_back = std::time::Duration::from_secs_f64(seconds()?),
                _ => {
                    return Err(bad(format!(
                        "unknown key {key:?} (known: instance_start_s, dispatch_s, task_runtime_s, partition, \
                         lost_after_s, leader_per_report_s, leader_per_task_s, mem_limit, grow_gap_s, open_idle_give_back_s)"
                    )))
                }
            }
        }
        Ok(site)
    }

    /// The file's text, with a header saying where the numbers came from.
    pub fn render(&self, header: &str) -> String {
        let mut s = String::new();
        for line in header.lines() {
            s.push_str(&format!("# {line}\n"));
        }
        let Params { s: start, d, t } = self.params;
        s.push_str(&format!("instance_start_s = {start:.6}\ndispatch_s = {d:.9}\ntask_runtime_s = {t}\n"));
        s.push_str(&format!("partition = {}\n", self.partition.name()));
        s.push_str(&format!("lost_after_s = {}\n", self.lost_after.as_secs_f64()));
        let LeaderCost { per_report_us, per_task_us } = self.leader;
        s.push_str(&format!("leader_per_report_s = {:.9}\n", per_report_us / 1e6));
        s.push_str(&format!("leader_per_task_s = {:.9}\n", per_task_us / 1e6));
        s.push_str(&format!("mem_limit = {}\n", self.mem_limit.name()));
        s.push_str(&format!("grow_gap_s = {}\n", self.grow_gap.as_secs_f64()));
        s.push_str(&format!("open_idle_give_back_s = {}\n", self.open_idle_give_back.as_secs_f64()));
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_it_renders() {
        let site = Site {
            params: Params { s: 0.5, d: 0.000125, t: 3.0 },
            partition: Plan::Even,
            lost_after: std::time::Duration::from_millis(2500),
            leader: LeaderCost { per_report_us: 21.5, per_task_us: 0.75 },
            mem_limit: crate::memcg::Enforce::Cgroup,
            grow_gap: std::time::Duration::from_secs(5),
            open_idle_give_back: std::time::Duration::from_secs(7),
            source: None,
        };
        let text = site.render("htc calibrate\non host x");
        assert!(text.starts_with("# htc calibrate\n# on host x\n"));
        let back = Site::parse(&text, "f").unwrap();
        // Kept in seconds: microseconds come back to within rounding.
        let l = back.leader;
        assert!((l.per_report_us - 21.5).abs() < 1e-6 && (l.per_task_us - 0.75).abs() < 1e-6, "{l:?}");
        assert_eq!(Site { leader: site.leader, ..back }, site);
    }

    #[test]
    fn errors_name_the_line() {
        let e = Site::parse("# ok\ndispatch_s = 0.1\ninstance_start_s = fast\n", "site.conf").unwrap_err();
        assert_eq!(e.to_string(), "site.conf:3: instance_start_s: expected seconds (a number ≥ 0), found \"fast\"");
        let e = Site::parse("dispach_s = 1", "s").unwrap_err().to_string();
        assert!(e.starts_with("s:1: unknown key \"dispach_s\""), "{e}");
        assert!(Site::parse("partition = fluxp", "s").unwrap_err().to_string().contains("expected hflow or even"));
        assert!(Site::parse("just words", "s").unwrap_err().to_string().contains("expected `key = value`"));
        assert!(Site::parse("dispatch_s = -1", "s").is_err());
        assert!(Site::parse("dispatch_s = NaN", "s").is_err());
        let e = Site::parse("mem_limit = kernel", "s").unwrap_err().to_string();
        assert_eq!(e, "s:1: mem_limit: expected auto, cgroup or watch, found \"kernel\"");
        let e = Site::parse("\ngrow_gap_s = 0.5", "s").unwrap_err().to_string();
        assert_eq!(e, "s:2: grow_gap_s: at least 1 s, found \"0.5\"");
    }

    #[test]
    fn empty_file_means_defaults() {
        assert_eq!(Site::parse("\n# nothing\n", "s").unwrap(), Site::default());
    }
}
