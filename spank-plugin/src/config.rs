//! The plugin's pure logic: plugstack arguments, `--htc-*` option values, the job-control
//! variables that carry the options to the batch step, the agent's argv, and the environment
//! filter. Nothing here touches Slurm, so all of it is unit-tested.

use htc_core::partition::Plan;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// `plugin_name`: also the middle part of Slurm's option env names (`_SLURM_SPANK_OPTION_htc_…`).
pub const PLUGIN_NAME: &str = "htc";

/// Step id of the batch step (`SLURM_BATCH_SCRIPT` in <slurm/slurm.h>).
pub const BATCH_STEP_ID: u32 = 0xffff_fffb;

/// Agent used when plugstack.conf gives no `agent=`; set at build time by `HTC_DEFAULT_AGENT`.
pub const DEFAULT_AGENT: &str = env!("HTC_BUILD_DEFAULT_AGENT");

/// How many task-file errors sbatch prints before giving up.
pub const MAX_REPORTED_ERRORS: usize = 5;

pub const RETRIES_MAX: u32 = htc_core::taskfile::MAX_RETRIES;
pub const FANOUT_MIN: u32 = 2;
pub const FANOUT_MAX: u32 = 1024;
pub const AGENTS_PER_NODE_MAX: u32 = 4096;
pub const INSTANCE_NODES_MAX: u32 = 65536;
pub const MAX_FAILS_MAX: u32 = u32::MAX;
/// Automatic resubmissions of one run, at most.
pub const RESUBMIT_MAX: u32 = 100;

/// Option `val`s given to `spank_option_register`.
pub const OPT_FILE: i32 = 1;
pub const OPT_RETRIES: i32 = 2;
pub const OPT_FANOUT: i32 = 3;
pub const OPT_OUTPUT: i32 = 4;
pub const OPT_PARTITION: i32 = 5;
pub const OPT_AGENTS_PER_NODE: i32 = 6;
pub const OPT_INSTANCE_NODES: i32 = 7;
pub const OPT_MAX_FAILS: i32 = 8;
pub const OPT_RESUME: i32 = 9;
pub const OPT_RESUBMIT: i32 = 10;
pub const OPT_JOIN: i32 = 11;
pub const OPT_GROW: i32 = 12;

/// Names given to `spank_job_control_setenv` in sbatch. Slurm puts them into the job's
/// environment with a `SLURM_SPANK_` prefix (and into prolog/epilog with `SPANK_`).
pub const JC_FILE: &str = "HTC_FILE";
pub const JC_RETRIES: &str = "HTC_RETRIES";
pub const JC_FANOUT: &str = "HTC_FANOUT";
pub const JC_OUTPUT: &str = "HTC_OUTPUT";
pub const JC_PARTITION: &str = "HTC_PARTITION";
pub const JC_AGENTS_PER_NODE: &str = "HTC_AGENTS_PER_NODE";
pub const JC_INSTANCE_NODES: &str = "HTC_INSTANCE_NODES";
pub const JC_MAX_FAILS: &str = "HTC_MAX_FAILS";
pub const JC_RESUBMIT: &str = "HTC_RESUBMIT";
pub const JC_RESUME: &str = "HTC_RESUME";
/// `--htc-grow=SPEC`, as [`GrowSpec::to_arg`] writes it.
pub const JC_GROW: &str = "HTC_GROW";
/// `--htc-join=RUN`: the job joins that run instead of starting one (no `HTC_FILE` then); the
/// value is the run directory, absolute.
pub const JC_JOIN: &str = "HTC_JOIN";
/// Prefix Slurm adds to job-control names in the job environment.
pub const JOB_ENV_PREFIX: &str = "SLURM_SPANK_";

pub fn job_env_name(jc_name: &str) -> String {
    format!("{JOB_ENV_PREFIX}{jc_name}")
}

/// `--htc-output=MODE`.
pub use htc_core::output::OutputMode;

/// `--htc-grow=MAX_JOBS[:NODES[:TIME]]`.
pub use htc_core::grow::GrowSpec;

/// Plugin arguments from the plugstack.conf line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginConfig {
    /// Absolute path of `htc-agent`.
    pub agent: PathBuf,
    /// Passed to the agent as `--ledger-dir` (node-local directory for the LMDB ledger).
    pub ledger_dir: Option<PathBuf>,
    /// Site default for the tree fan-out; `--htc-fanout` overrides it.
    pub fanout: Option<u32>,
    /// `disabled`: `--htc` is refused at submit time, and HTC jobs already queued fail.
    pub disabled: bool,
}

impl Default for PluginConfig {
    fn default() -> Self {
        PluginConfig { agent: PathBuf::from(DEFAULT_AGENT), ledger_dir: None, fanout: None, disabled: false }
    }
}

/// Parses the plugin arguments (`agent=PATH ledger_dir=DIR fanout=K disabled`). Every bad
/// argument is reported; any error means the configuration must not be used.
pub fn parse_plugin_args<S: AsRef<str>>(args: &[S]) -> Result<PluginConfig, Vec<String>> {
    let mut cfg = PluginConfig::default();
    let mut errors = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    for arg in args {
        let arg = arg.as_ref();
        let (key, value) = match arg.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (arg, None),
        };
        let known = ["agent", "ledger_dir", "fanout", "disabled"];
        if let Some(k) = known.iter().find(|k| **k == key) {
            if seen.contains(k) {
                errors.push(format!("plugin argument '{key}' given twice"));
                continue;
            }
            seen.push(k);
        }
        match (key, value) {
            ("agent", Some(v)) => match absolute_path("agent", v) {
                Ok(p) => cfg.agent = p,
                Err(e) => errors.push(e),
            },
            ("ledger_dir", Some(v)) => match absolute_path("ledger_dir", v) {
                Ok(p) => cfg.ledger_dir = Some(p),
                Err(e) => errors.push(e),
            },
            ("fanout", Some(v)) => match parse_fanout(v) {
                Ok(k) => cfg.fanout = Some(k),
                Err(e) => errors.push(format!("plugin argument fanout={v}: {e}")),
            },
            ("disabled", None) => cfg.disabled = true,
            ("disabled", Some(v)) => match v {
                "1" | "yes" | "true" => cfg.disabled = true,
                "0" | "no" | "false" => cfg.disabled = false,
                _ => errors.push(format!("plugin argument disabled={v}: expected yes or no")),
            },
            ("agent" | "ledger_dir" | "fanout", None) => {
                errors.push(format!("plugin argument '{key}' needs a value ({key}=…)"))
            }
            _ => errors.push(format!(
                "unknown plugin argument '{arg}' (known: agent=PATH, ledger_dir=DIR, fanout=K, disabled)"
            )),
        }
    }
    if errors.is_empty() {
        Ok(cfg)
    } else {
        Err(errors)
    }
}

fn absolute_path(key: &str, v: &str) -> Result<PathBuf, String> {
    if v.is_empty() {
        return Err(format!("plugin argument {key}= is empty"));
    }
    if !v.starts_with('/') {
        return Err(format!("plugin argument {key}={v}: must be an absolute path"));
    }
    Ok(PathBuf::from(v))
}

fn parse_number(s: &str, min: u32, max: u32) -> Result<u32, String> {
    let t = s.trim();
    let ok = !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    match t.parse::<u32>() {
        Ok(n) if ok && (min..=max).contains(&n) => Ok(n),
        _ => Err(format!("'{s}' is not a whole number from {min} to {max}")),
    }
}

/// `--htc-retries=N`: how often a failed task is retried (overrides the task file's default).
pub fn parse_retries(s: &str) -> Result<u32, String> {
    parse_number(s, 0, RETRIES_MAX)
}

/// `--htc-fanout=K` and `fanout=K`: children per node of the agents' tree.
pub fn parse_fanout(s: &str) -> Result<u32, String> {
    parse_number(s, FANOUT_MIN, FANOUT_MAX)
}

/// `--htc-output=MODE`.
pub fn parse_output(s: &str) -> Result<OutputMode, String> {
    s.parse()
}

/// `--htc-agents-per-node=N`: agents (spawn loops) on each node, splitting its CPUs.
pub fn parse_agents_per_node(s: &str) -> Result<u32, String> {
    parse_number(s, 1, AGENTS_PER_NODE_MAX)
}

/// `--htc-instance-nodes=N`: nodes per 2nd-level instance, whose head takes work for all.
pub fn parse_instance_nodes(s: &str) -> Result<u32, String> {
    parse_number(s, 1, INSTANCE_NODES_MAX)
}

/// `--htc-max-fails=N`: fail fast after N tasks failed for good.
pub fn parse_max_fails(s: &str) -> Result<u32, String> {
    parse_number(s, 1, MAX_FAILS_MAX)
}

/// `--htc-resubmit=N`: when the job ends at its time limit or loses all its agents, submit the
/// job that continues it, up to N times.
pub fn parse_resubmit(s: &str) -> Result<u32, String> {
    parse_number(s, 1, RESUBMIT_MAX)
}

/// The longest TIME of `--htc-grow`, in minutes: Slurm's time limits are 32-bit minutes, of
/// which `INFINITE` (0xffffffff) and `NO_VAL` (0xfffffffe) are reserved.
pub const GROW_MINUTES_MAX: u64 = 0xffff_fffd;

/// `--htc-grow=MAX_JOBS[:NODES[:TIME]]`: while the work left outgrows the run's allocations,
/// the leader submits up to MAX_JOBS jobs of NODES nodes for TIME that join the run
/// ([`GrowSpec::parse`]). A TIME longer than Slurm takes is refused here, before htc-core's
/// arithmetic sees a field that would overflow it.
pub fn parse_grow(s: &str) -> Result<GrowSpec, String> {
    let t = s.trim();
    if let Some(time) = t.splitn(3, ':').nth(2) {
        // Each field alone over this is beyond GROW_MINUTES_MAX (as seconds too); below it no
        // sum of the fields overflows.
        const FIELD_MAX: u64 = 1_000_000_000_000;
        if time.split(['-', ':']).any(|f| f.parse::<u64>().is_ok_and(|n| n > FIELD_MAX)) {
            // MAX_JOBS and NODES are reported first, as GrowSpec::parse does.
            GrowSpec::parse(&t[..t.len() - time.len() - 1])?;
            return Err(grow_time_too_long(time));
        }
        let spec = GrowSpec::parse(t)?;
        if spec.minutes.is_some_and(|m| m > GROW_MINUTES_MAX) {
            return Err(grow_time_too_long(time));
        }
        return Ok(spec);
    }
    GrowSpec::parse(t)
}

fn grow_time_too_long(time: &str) -> String {
    format!("'{time}' is longer than Slurm's longest time limit ({GROW_MINUTES_MAX} minutes)")
}

/// `--htc-resume=JOBID`: continue the run of an earlier job (written by `htc resume`).
pub fn parse_resume(s: &str) -> Result<u32, String> {
    parse_number(s, 1, u32::MAX).map_err(|_| format!("'{s}' is not a job id"))
}

/// `--htc-join=RUN`: join the running run of that job, or in that run directory.
pub fn parse_join(s: &str) -> Result<JoinTarget, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("the run to join is missing (a job id or a run directory)".into());
    }
    if t.bytes().all(|b| b.is_ascii_digit()) {
        return parse_number(t, 1, u32::MAX).map(JoinTarget::Job).map_err(|_| format!("'{s}' is not a job id"));
    }
    Ok(JoinTarget::Dir(PathBuf::from(s)))
}

/// `--htc-join=RUN`: the run to join, by its job id (its directory `.htc/JOBID` in the submit
/// directory) or by its run directory (any path, relative to the submit directory).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JoinTarget {
    Job(u32),
    Dir(PathBuf),
}

impl JoinTarget {
    /// The run directory, for the submit directory `base`.
    pub fn dir(&self, base: &Path) -> PathBuf {
        match self {
            JoinTarget::Job(j) => base.join(".htc").join(j.to_string()),
            JoinTarget::Dir(d) => base.join(d),
        }
    }

    /// How the messages name it.
    fn name(&self, base: &Path) -> String {
        match self {
            JoinTarget::Job(j) => format!("the run .htc/{j} in {}", base.display()),
            JoinTarget::Dir(_) => format!("the run directory {}", self.dir(base).display()),
        }
    }
}

/// `--htc-partition=PLAN`: how the leader splits the tasks among the agents.
pub fn parse_partition(s: &str) -> Result<Plan, String> {
    s.trim().parse::<Plan>().map_err(|_| format!("'{s}' is not a partition plan (hflow or even)"))
}

/// What the option callbacks collected in this process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserOptions {
    /// In sbatch: the canonical absolute path (after the check). In slurmstepd: the raw value.
    pub file: Option<OsString>,
    pub retries: Option<u32>,
    pub fanout: Option<u32>,
    pub output: Option<OutputMode>,
    pub partition: Option<Plan>,
    pub agents_per_node: Option<u32>,
    pub instance_nodes: Option<u32>,
    pub max_fails: Option<u32>,
    pub resume: Option<u32>,
    pub resubmit: Option<u32>,
    /// `--htc-join=RUN` (in sbatch, after the check: the absolute run directory).
    pub join: Option<JoinTarget>,
    /// `--htc-grow=SPEC`.
    pub grow: Option<GrowSpec>,
}

impl UserOptions {
    /// The `--htc-*` options given without `--htc` or `--htc-join` (they do nothing then).
    pub fn orphans(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        if self.file.is_none() && self.join.is_none() {
            if self.retries.is_some() {
                v.push("--htc-retries");
            }
            if self.fanout.is_some() {
                v.push("--htc-fanout");
            }
            if self.output.is_some() {
                v.push("--htc-output");
            }
            if self.partition.is_some() {
                v.push("--htc-partition");
            }
            if self.agents_per_node.is_some() {
                v.push("--htc-agents-per-node");
            }
            if self.instance_nodes.is_some() {
                v.push("--htc-instance-nodes");
            }
            if self.max_fails.is_some() {
                v.push("--htc-max-fails");
            }
            if self.resume.is_some() {
                v.push("--htc-resume");
            }
            if self.resubmit.is_some() {
                v.push("--htc-resubmit");
            }
            if self.grow.is_some() {
                v.push("--htc-grow");
            }
        }
        v
    }

    /// Why these options cannot go together with `--htc-join`: one message per conflicting
    /// option (empty without `--htc-join`, or when nothing conflicts). A joining job has no task
    /// file and takes the run's settings; only `--htc-agents-per-node` and
    /// `--htc-instance-nodes`, which shape this job's own agents, go with it.
    pub fn join_conflicts(&self) -> Vec<String> {
        let mut v = Vec::new();
        if self.join.is_none() {
            return v;
        }
        if self.file.is_some() {
            v.push("--htc-join joins a running run; it takes no --htc=FILE".to_string());
        }
        let refused = [
            (self.retries.is_some(), "--htc-retries", "the run's retries apply"),
            (self.fanout.is_some(), "--htc-fanout", "the run's fan-out applies"),
            (self.output.is_some(), "--htc-output", "the run's output mode applies"),
            (self.partition.is_some(), "--htc-partition", "the run's partition plan applies"),
            (self.max_fails.is_some(), "--htc-max-fails", "the run's limit applies"),
            (
                self.resume.is_some(),
                "--htc-resume",
                "--htc-resume continues a run that ended, --htc-join joins one that is running",
            ),
            (self.resubmit.is_some(), "--htc-resubmit", "only the run's own job resubmits the run"),
            (self.grow.is_some(), "--htc-grow", "the run's own job grows it"),
        ];
        for (given, name, why) in refused {
            if given {
                v.push(format!("{name} cannot be used with --htc-join ({why})"));
            }
        }
        v
    }
}

/// Submit-time check of `--htc-join=RUN` against `base`, the submit directory (sbatch's cwd,
/// as for a relative `--htc=FILE`): the run directory (`base/.htc/JOBID`, or the one named) must
/// exist, be readable by this user, and hold the running leader's `leader.addr`. Returns the
/// run directory, absolute; the messages follow "htc: --htc-join=RUN: ".
pub fn check_join_run(base: &Path, run: &JoinTarget) -> Result<PathBuf, String> {
    let dir = run.dir(base);
    let name = run.name(base);
    let no_run = || {
        match run {
        JoinTarget::Job(j) => format!(
            "no run .htc/{j} in {} (run sbatch from the directory the run was submitted from, or give the run directory)",
            base.display()
        ),
        JoinTarget::Dir(_) => format!("there is no run directory {}", dir.display()),
    }
    };
    let not_running = || format!("{name} is not running (it ended, or has not started yet)");
    match std::fs::metadata(&dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(format!("{} is not a run directory", dir.display())),
        Err(e) => return Err(join_io_error(&name, &e, no_run)),
    }
    let leader = dir.join("leader.addr");
    // Only a regular file is opened (a FIFO there would block sbatch in open).
    match std::fs::metadata(&leader) {
        Ok(m) if m.is_file() => {}
        Ok(_) => return Err(not_running()),
        Err(e) => return Err(join_io_error(&name, &e, not_running)),
    }
    // The joining agent reads it as this user: so must this check.
    match std::fs::File::open(&leader) {
        Ok(_) => Ok(dir),
        Err(e) => Err(join_io_error(&name, &e, not_running)),
    }
}

/// The message for a failed look at the run directory of `--htc-join` (`name`: how it is
/// called; `missing`: the message for a path that does not exist).
fn join_io_error(name: &str, e: &std::io::Error, missing: impl FnOnce() -> String) -> String {
    use std::io::ErrorKind;
    match e.kind() {
        ErrorKind::NotFound | ErrorKind::NotADirectory => missing(),
        ErrorKind::PermissionDenied => format!("cannot read {name}: permission denied (belongs to another user?)"),
        _ => format!("cannot read {name}: {e}"),
    }
}

/// A validated HTC request, as the batch step needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRequest {
    /// Absolute path of the task file.
    pub task_file: PathBuf,
    pub retries: Option<u32>,
    pub fanout: Option<u32>,
    pub output: Option<OutputMode>,
    pub partition: Option<Plan>,
    pub agents_per_node: Option<u32>,
    pub instance_nodes: Option<u32>,
    pub max_fails: Option<u32>,
    pub resume: Option<u32>,
    pub resubmit: Option<u32>,
    pub grow: Option<GrowSpec>,
}

impl JobRequest {
    /// The request sbatch stores in the job-control environment: `None` without `--htc`.
    /// `opts.file` must already be the canonical absolute path.
    pub fn from_allocator(opts: &UserOptions) -> Option<JobRequest> {
        Some(JobRequest {
            task_file: PathBuf::from(opts.file.clone()?),
            retries: opts.retries,
            fanout: opts.fanout,
            output: opts.output,
            partition: opts.partition,
            agents_per_node: opts.agents_per_node,
            instance_nodes: opts.instance_nodes,
            max_fails: opts.max_fails,
            resume: opts.resume,
            resubmit: opts.resubmit,
            grow: opts.grow,
        })
    }

    /// `(name, value)` pairs for `spank_job_control_setenv`.
    pub fn job_control_vars(&self) -> Vec<(&'static str, OsString)> {
        let mut v = vec![(JC_FILE, self.task_file.clone().into_os_string())];
        if let Some(r) = self.retries {
            v.push((JC_RETRIES, r.to_string().into()));
        }
        if let Some(k) = self.fanout {
            v.push((JC_FANOUT, k.to_string().into()));
        }
        if let Some(o) = self.output {
            v.push((JC_OUTPUT, o.name().into()));
        }
        if let Some(p) = self.partition {
            v.push((JC_PARTITION, p.name().into()));
        }
        if let Some(n) = self.agents_per_node {
            v.push((JC_AGENTS_PER_NODE, n.to_string().into()));
        }
        if let Some(n) = self.instance_nodes {
            v.push((JC_INSTANCE_NODES, n.to_string().into()));
        }
        if let Some(n) = self.max_fails {
            v.push((JC_MAX_FAILS, n.to_string().into()));
        }
        if let Some(j) = self.resume {
            v.push((JC_RESUME, j.to_string().into()));
        }
        if let Some(n) = self.resubmit {
            v.push((JC_RESUBMIT, n.to_string().into()));
        }
        if let Some(g) = self.grow {
            v.push((JC_GROW, g.to_arg().into()));
        }
        v
    }

    /// Reads the request back from the job environment (`SLURM_SPANK_HTC_*`), `getenv`
    /// being `spank_getenv`. `Ok(None)`: not an HTC job. `Err`: present but corrupt.
    pub fn from_job_env(getenv: impl Fn(&str) -> Option<OsString>) -> Result<Option<JobRequest>, String> {
        let Some(file) = getenv(&job_env_name(JC_FILE)) else { return Ok(None) };
        let task_file = PathBuf::from(file);
        if !task_file.is_absolute() {
            return Err(format!("{}={}: not an absolute path", job_env_name(JC_FILE), task_file.display()));
        }
        let num = |name: &str, parse: fn(&str) -> Result<u32, String>| -> Result<Option<u32>, String> {
            match getenv(&job_env_name(name)) {
                None => Ok(None),
                Some(v) => {
                    let v = v.to_string_lossy().into_owned();
                    parse(&v).map(Some).map_err(|e| format!("{}: {e}", job_env_name(name)))
                }
            }
        };
        let retries = num(JC_RETRIES, parse_retries)?;
        let fanout = num(JC_FANOUT, parse_fanout)?;
        let output = match getenv(&job_env_name(JC_OUTPUT)) {
            None => None,
            Some(v) => {
                Some(parse_output(&v.to_string_lossy()).map_err(|e| format!("{}: {e}", job_env_name(JC_OUTPUT)))?)
            }
        };
        let partition = match getenv(&job_env_name(JC_PARTITION)) {
            None => None,
            Some(v) => Some(
                parse_partition(&v.to_string_lossy()).map_err(|e| format!("{}: {e}", job_env_name(JC_PARTITION)))?,
            ),
        };
        let agents_per_node = num(JC_AGENTS_PER_NODE, parse_agents_per_node)?;
        let instance_nodes = num(JC_INSTANCE_NODES, parse_instance_nodes)?;
        let max_fails = num(JC_MAX_FAILS, parse_max_fails)?;
        let resume = num(JC_RESUME, parse_resume)?;
        let resubmit = num(JC_RESUBMIT, parse_resubmit)?;
        let grow = match getenv(&job_env_name(JC_GROW)) {
            None => None,
            Some(v) => Some(parse_grow(&v.to_string_lossy()).map_err(|e| format!("{}: {e}", job_env_name(JC_GROW)))?),
        };
        Ok(Some(JobRequest {
            task_file,
            retries,
            fanout,
            output,
            partition,
            agents_per_node,
            instance_nodes,
            max_fails,
            resume,
            resubmit,
            grow,
        }))
    }

    /// Fallback when the job-control variables are missing: the values seen by the remote
    /// option callback (only called with `--export=ALL`). A relative file is resolved against
    /// the submit directory, else against `cwd`.
    pub fn from_remote_options(opts: &UserOptions, submit_dir: Option<&Path>, cwd: &Path) -> Option<JobRequest> {
        let file = opts.file.as_ref()?;
        if file.is_empty() {
            return None;
        }
        Some(JobRequest {
            task_file: resolve_against(submit_dir.unwrap_or(cwd), file),
            retries: opts.retries,
            fanout: opts.fanout,
            output: opts.output,
            partition: opts.partition,
            agents_per_node: opts.agents_per_node,
            instance_nodes: opts.instance_nodes,
            max_fails: opts.max_fails,
            resume: opts.resume,
            resubmit: opts.resubmit,
            grow: opts.grow,
        })
    }
}

/// A validated `--htc-join` request, as the batch step needs it: the job's nodes join the
/// running run of job `run` (no task file; the run's own settings apply).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinRequest {
    /// The run directory of the run to join (absolute, as sbatch checked it).
    pub run: PathBuf,
    pub agents_per_node: Option<u32>,
    pub instance_nodes: Option<u32>,
}

impl JoinRequest {
    /// The request sbatch stores in the job-control environment: `None` without `--htc-join`.
    /// `opts` must have passed [`UserOptions::join_conflicts`] and, for a job id, `base` is
    /// the submit directory.
    pub fn from_allocator(opts: &UserOptions, base: &Path) -> Option<JoinRequest> {
        Some(JoinRequest {
            run: opts.join.as_ref()?.dir(base),
            agents_per_node: opts.agents_per_node,
            instance_nodes: opts.instance_nodes,
        })
    }

    /// `(name, value)` pairs for `spank_job_control_setenv`.
    pub fn job_control_vars(&self) -> Vec<(&'static str, OsString)> {
        let mut v = vec![(JC_JOIN, self.run.clone().into_os_string())];
        if let Some(n) = self.agents_per_node {
            v.push((JC_AGENTS_PER_NODE, n.to_string().into()));
        }
        if let Some(n) = self.instance_nodes {
            v.push((JC_INSTANCE_NODES, n.to_string().into()));
        }
        v
    }

    /// Reads the request back from the job environment. `Ok(None)`: no `SLURM_SPANK_HTC_JOIN`.
    pub fn from_job_env(getenv: impl Fn(&str) -> Option<OsString>) -> Result<Option<JoinRequest>, String> {
        let num = |name: &str, parse: fn(&str) -> Result<u32, String>| -> Result<Option<u32>, String> {
            match getenv(&job_env_name(name)) {
                None => Ok(None),
                Some(v) => parse(&v.to_string_lossy()).map(Some).map_err(|e| format!("{}: {e}", job_env_name(name))),
            }
        };
        let Some(run) = getenv(&job_env_name(JC_JOIN)).map(PathBuf::from) else { return Ok(None) };
        if !run.is_absolute() {
            return Err(format!("{}: {} is not an absolute run directory", job_env_name(JC_JOIN), run.display()));
        }
        Ok(Some(JoinRequest {
            run,
            agents_per_node: num(JC_AGENTS_PER_NODE, parse_agents_per_node)?,
            instance_nodes: num(JC_INSTANCE_NODES, parse_instance_nodes)?,
        }))
    }

    /// Fallback when the job-control variables are missing: the remote option callback's values
    /// (a job id or relative directory is the submit directory's, `base`).
    pub fn from_remote_options(opts: &UserOptions, base: &Path) -> Option<JoinRequest> {
        JoinRequest::from_allocator(opts, base)
    }
}

/// What the batch step of an HTC job does: lead a run of its own (`--htc=FILE`) or join a
/// running one (`--htc-join=RUN`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchRequest {
    Run(JobRequest),
    Join(JoinRequest),
}

impl BatchRequest {
    /// What sbatch stores: `Ok(None)` without `--htc` and `--htc-join`; `Err` with the
    /// messages when the options conflict (the option callbacks already refused that).
    pub fn from_allocator(opts: &UserOptions) -> Result<Option<BatchRequest>, Vec<String>> {
        let conflicts = opts.join_conflicts();
        if !conflicts.is_empty() {
            return Err(conflicts);
        }
        // sbatch stored the run directory as it checked it: absolute.
        if let Some(j) = JoinRequest::from_allocator(opts, Path::new("/")) {
            return Ok(Some(BatchRequest::Join(j)));
        }
        Ok(JobRequest::from_allocator(opts).map(BatchRequest::Run))
    }

    pub fn job_control_vars(&self) -> Vec<(&'static str, OsString)> {
        match self {
            BatchRequest::Run(r) => r.job_control_vars(),
            BatchRequest::Join(j) => j.job_control_vars(),
        }
    }

    /// The request in the job environment: `Ok(None)` when it is not an HTC job, `Err` when
    /// the variables are corrupt (both a task file and a run to join among them).
    pub fn from_job_env(getenv: impl Fn(&str) -> Option<OsString>) -> Result<Option<BatchRequest>, String> {
        let run = JobRequest::from_job_env(&getenv)?;
        let join = JoinRequest::from_job_env(&getenv)?;
        match (run, join) {
            (Some(_), Some(_)) => Err(format!("both {} and {} are set", job_env_name(JC_FILE), job_env_name(JC_JOIN))),
            (Some(r), None) => Ok(Some(BatchRequest::Run(r))),
            (None, Some(j)) => Ok(Some(BatchRequest::Join(j))),
            (None, None) => Ok(None),
        }
    }

    /// Fallback when the job-control variables are missing (see
    /// [`JobRequest::from_remote_options`]); `Err` when the values conflict, which sbatch
    /// refuses.
    pub fn from_remote_options(
        opts: &UserOptions,
        submit_dir: Option<&Path>,
        cwd: &Path,
    ) -> Result<Option<BatchRequest>, String> {
        match (opts.file.is_some(), JoinRequest::from_remote_options(opts, submit_dir.unwrap_or(cwd))) {
            (true, Some(_)) => Err("both --htc and --htc-join were given".into()),
            (_, Some(j)) => Ok(Some(BatchRequest::Join(j))),
            (_, None) => Ok(JobRequest::from_remote_options(opts, submit_dir, cwd).map(BatchRequest::Run)),
        }
    }

    /// The agent's argv up to and including `--script` ([`agent_argv_prefix`],
    /// [`join_argv_prefix`]).
    pub fn argv_prefix(&self, cfg: &PluginConfig) -> Vec<OsString> {
        match self {
            BatchRequest::Run(r) => agent_argv_prefix(cfg, r),
            BatchRequest::Join(j) => join_argv_prefix(cfg, j),
        }
    }

    /// The complete argv for `execve`: the prefix, then the batch step's argv.
    pub fn argv(&self, cfg: &PluginConfig, job_argv: &[OsString]) -> Result<Vec<OsString>, String> {
        with_job_argv(self.argv_prefix(cfg), job_argv)
    }
}

/// `base/p` unless `p` is absolute.
pub fn resolve_against(base: &Path, p: &OsStr) -> PathBuf {
    let p = Path::new(p);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

/// The token after which the agent's argv holds the batch script and its arguments.
pub const SCRIPT_FLAG: &str = "--script";

/// The agent's argv up to and including `--script`:
/// `AGENT lead --task-file FILE [--retries N] [--fanout K] [--output MODE] [--partition PLAN]
/// [--agents-per-node N] [--instance-nodes N] [--max-fails N] [--resume-run JOBID] [--resubmit N]
/// [--grow SPEC] [--ledger-dir DIR] --script`, SPEC being `--htc-grow`'s as [`GrowSpec::to_arg`]
/// writes it.
/// The batch script's own argv (script path, then its arguments) follows; with
/// `spank_prepend_task_argv` Slurm appends it, with `execve` the plugin does.
pub fn agent_argv_prefix(cfg: &PluginConfig, req: &JobRequest) -> Vec<OsString> {
    let mut v: Vec<OsString> =
        vec![cfg.agent.clone().into(), "lead".into(), "--task-file".into(), req.task_file.clone().into()];
    if let Some(r) = req.retries {
        v.push("--retries".into());
        v.push(r.to_string().into());
    }
    if let Some(k) = req.fanout.or(cfg.fanout) {
        v.push("--fanout".into());
        v.push(k.to_string().into());
    }
    if let Some(o) = req.output {
        v.push("--output".into());
        v.push(o.name().into());
    }
    if let Some(p) = req.partition {
        v.push("--partition".into());
        v.push(p.name().into());
    }
    if let Some(n) = req.agents_per_node {
        v.push("--agents-per-node".into());
        v.push(n.to_string().into());
    }
    if let Some(n) = req.instance_nodes {
        v.push("--instance-nodes".into());
        v.push(n.to_string().into());
    }
    if let Some(n) = req.max_fails {
        v.push("--max-fails".into());
        v.push(n.to_string().into());
    }
    if let Some(j) = req.resume {
        v.push("--resume-run".into());
        v.push(j.to_string().into());
    }
    if let Some(n) = req.resubmit {
        v.push("--resubmit".into());
        v.push(n.to_string().into());
    }
    if let Some(g) = req.grow {
        v.push("--grow".into());
        v.push(g.to_arg().into());
    }
    if let Some(d) = &cfg.ledger_dir {
        v.push("--ledger-dir".into());
        v.push(d.clone().into());
    }
    v.push(SCRIPT_FLAG.into());
    v
}

/// The agent's argv of a joining job, up to and including `--script`:
/// `AGENT lead --join-run RUNDIR [--agents-per-node N] [--instance-nodes N] [--ledger-dir DIR]
/// --script`. No `--fanout`, not even the site's: the run's fan-out applies.
pub fn join_argv_prefix(cfg: &PluginConfig, req: &JoinRequest) -> Vec<OsString> {
    let mut v: Vec<OsString> =
        vec![cfg.agent.clone().into(), "lead".into(), "--join-run".into(), req.run.clone().into_os_string()];
    if let Some(n) = req.agents_per_node {
        v.push("--agents-per-node".into());
        v.push(n.to_string().into());
    }
    if let Some(n) = req.instance_nodes {
        v.push("--instance-nodes".into());
        v.push(n.to_string().into());
    }
    if let Some(d) = &cfg.ledger_dir {
        v.push("--ledger-dir".into());
        v.push(d.clone().into());
    }
    v.push(SCRIPT_FLAG.into());
    v
}

/// The complete argv for `execve`: the prefix, then the batch step's argv (`S_JOB_ARGV`).
pub fn agent_argv(cfg: &PluginConfig, req: &JobRequest, job_argv: &[OsString]) -> Result<Vec<OsString>, String> {
    with_job_argv(agent_argv_prefix(cfg, req), job_argv)
}

fn with_job_argv(mut prefix: Vec<OsString>, job_argv: &[OsString]) -> Result<Vec<OsString>, String> {
    match job_argv.first() {
        None => Err("the batch step has no script (empty S_JOB_ARGV)".into()),
        Some(s) if s.is_empty() => Err("the batch step's script path is empty".into()),
        Some(_) => {
            prefix.extend(job_argv.iter().cloned());
            Ok(prefix)
        }
    }
}

/// Job-environment entries (`NAME=value`) the agent must not inherit: our job-control
/// variables and Slurm's copies of our option values. Left in place they would leak into
/// every `srun`/`sbatch` run below the agent, which would then re-process `--htc` (a nested
/// `sbatch` would turn into an HTC job, an `srun` would re-run the option callbacks).
pub fn is_private_env(entry: &[u8]) -> bool {
    let name = match entry.iter().position(|&b| b == b'=') {
        Some(i) => &entry[..i],
        None => entry,
    };
    let opt = format!("_SLURM_SPANK_OPTION_{PLUGIN_NAME}_");
    let jc = format!("{JOB_ENV_PREFIX}HTC_");
    name.starts_with(jc.as_bytes())
        || name.starts_with(opt.as_bytes())
        || strip(name, b"SLURM_SPANK_").is_some_and(|n| n.starts_with(opt.as_bytes()))
        || strip(name, b"SPANK_").is_some_and(|n| n.starts_with(opt.as_bytes()) || n.starts_with(b"HTC_"))
}

fn strip<'a>(s: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
    s.strip_prefix(prefix)
}

/// Names (before `=`) of the entries of `env` that `is_private_env` selects.
pub fn private_env_names<'a>(env: impl IntoIterator<Item = &'a [u8]>) -> Vec<OsString> {
    env.into_iter()
        .filter(|e| is_private_env(e))
        .map(|e| {
            let n = e.iter().position(|&b| b == b'=').unwrap_or(e.len());
            OsString::from_vec(e[..n].to_vec())
        })
        .collect()
}

/// Which allocator runs the plugin (both are "allocator context" for SPANK).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocator {
    Sbatch,
    Salloc,
    Other,
}

pub fn allocator_from_exe(exe: &Path) -> Allocator {
    match exe.file_name().and_then(|n| n.to_str()) {
        Some("sbatch") => Allocator::Sbatch,
        Some("salloc") => Allocator::Salloc,
        _ => Allocator::Other,
    }
}

/// Submit-time check of `--htc=FILE` (relative paths resolve against the process's cwd,
/// i.e. the submit directory). Returns the canonical absolute path and the task count, or
/// the messages to print (`file:line:col: reason`, at most `MAX_REPORTED_ERRORS` + a note).
pub fn check_task_file(arg: &OsStr) -> Result<(PathBuf, u64), Vec<String>> {
    if arg.is_empty() {
        return Err(vec!["--htc needs a task file: --htc=FILE".into()]);
    }
    let path = Path::new(arg);
    match htc_core::taskfile::check_path(path, MAX_REPORTED_ERRORS) {
        Ok(summary) => match std::fs::canonicalize(path) {
            Ok(abs) => Ok((abs, summary.tasks)),
            Err(e) => Err(vec![format!("{}: cannot resolve the path: {e}", path.display())]),
        },
        Err(errors) => {
            let mut msgs: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
            if errors.len() >= MAX_REPORTED_ERRORS {
                msgs.push(format!(
                    "(stopped after {MAX_REPORTED_ERRORS} errors; `htc check {}` lists them all)",
                    path.display()
                ));
            }
            Err(msgs)
        }
    }
}

/// Why the plugin will not start the configured agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentPathError {
    /// The path (or a directory on it) does not exist.
    NotFound(String),
    /// The path cannot be resolved for another reason (e.g. a directory the user cannot
    /// search).
    Inaccessible(String),
    /// Someone other than root could change what gets executed, or the file is set-id.
    Unsafe(String),
}

impl fmt::Display for AgentPathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AgentPathError::NotFound(m) | AgentPathError::Inaccessible(m) | AgentPathError::Unsafe(m) => f.write_str(m),
        }
    }
}

/// What [`check_agent_path`] needs to know about one path (from `stat`, symlinks followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathMeta {
    pub uid: u32,
    /// `st_mode`, file type bits included.
    pub mode: u32,
}

const S_IFMT: u32 = 0o170000;
const S_IFREG: u32 = 0o100000;
const S_IFDIR: u32 = 0o040000;

/// The agent that an HTC batch step executes as the job's user must be one only root can
/// change: otherwise whoever can write the file, or rename entries in a directory on its
/// path, would run code as every other user who submits an HTC job. The rule is sshd's
/// `StrictModes` for its own files: the symlink-free (canonical) path and every directory
/// above it owned by root and writable by nobody else; the file a regular file without the
/// set-user-ID or set-group-ID bit (the agent always runs as the job's user, never as its
/// owner). Returns the canonical path, which is what gets executed (a symlink on the
/// configured path could otherwise be re-pointed between this check and the exec).
pub fn check_agent_path(agent: &Path) -> Result<PathBuf, AgentPathError> {
    use std::os::unix::fs::MetadataExt;
    // Only std here: the fuzz target compiles this file on its own.
    let canon = std::fs::canonicalize(agent).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory => AgentPathError::NotFound(e.to_string()),
        _ => AgentPathError::Inaccessible(e.to_string()),
    })?;
    check_agent_path_with(agent, &canon, |p| {
        std::fs::metadata(p).map(|m| PathMeta { uid: m.uid(), mode: m.mode() }).map_err(|e| e.to_string())
    })?;
    Ok(canon)
}

/// [`check_agent_path`] on an already canonical path, `stat` being injectable for tests.
pub fn check_agent_path_with(
    configured: &Path,
    canon: &Path,
    stat: impl Fn(&Path) -> Result<PathMeta, String>,
) -> Result<(), AgentPathError> {
    // Messages follow "cannot start the agent <configured path>: ".
    let via = if configured == canon { String::new() } else { format!("resolves to {}: ", canon.display()) };
    let unsafe_ = |what: &str| AgentPathError::Unsafe(format!("{via}{what}"));
    if !canon.is_absolute() {
        return Err(unsafe_("not an absolute path"));
    }
    let meta = stat(canon).map_err(AgentPathError::Inaccessible)?;
    if meta.mode & S_IFMT != S_IFREG {
        return Err(unsafe_(&format!("{} is not a regular file", canon.display())));
    }
    if meta.mode & 0o6000 != 0 {
        return Err(unsafe_(&format!(
            "file {} is set-user-ID or set-group-ID (mode {:04o}); the agent must run as the job's user, never as its owner",
            canon.display(),
            meta.mode & 0o7777
        )));
    }
    let owned_by_root_only = |p: &Path, m: PathMeta, kind: &str| -> Result<(), AgentPathError> {
        if m.uid != 0 {
            return Err(unsafe_(&format!(
                "{kind} {} is owned by uid {}, not root; only root may be able to change the agent",
                p.display(),
                m.uid
            )));
        }
        if m.mode & 0o022 != 0 {
            return Err(unsafe_(&format!(
                "{kind} {} is writable by group or others (mode {:04o}); only root may be able to change the agent",
                p.display(),
                m.mode & 0o7777
            )));
        }
        Ok(())
    };
    owned_by_root_only(canon, meta, "file")?;
    for dir in canon.ancestors().skip(1) {
        let m = stat(dir).map_err(|e| AgentPathError::Inaccessible(format!("{}: {e}", dir.display())))?;
        if m.mode & S_IFMT != S_IFDIR {
            return Err(unsafe_(&format!("{} is not a directory", dir.display())));
        }
        owned_by_root_only(dir, m, "directory")?;
    }
    Ok(())
}

/// The credentials of the task process that is about to become the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Real, effective, saved user id.
    pub uids: [u32; 3],
    /// Real, effective, saved group id.
    pub gids: [u32; 3],
    /// Supplementary groups (`getgroups`).
    pub groups: Vec<u32>,
}

/// The agent may only start with exactly the job's credentials: uid and gid (real, effective
/// and saved, so nothing can switch back to root), and no supplementary group that Slurm did
/// not give the job (slurmstepd sets them with `setgroups(job->gids)`). `job_groups` is
/// `S_JOB_SUPPLEMENTARY_GIDS` (empty when unknown, which then allows only the job's gid).
pub fn check_identity(id: &Identity, job_uid: u32, job_gid: u32, job_groups: &[u32]) -> Result<(), String> {
    if id.uids.iter().any(|&u| u != job_uid) {
        return Err(format!(
            "uid {}/{}/{} (real/effective/saved) is not the job's uid {job_uid}",
            id.uids[0], id.uids[1], id.uids[2]
        ));
    }
    if id.gids.iter().any(|&g| g != job_gid) {
        return Err(format!(
            "gid {}/{}/{} (real/effective/saved) is not the job's gid {job_gid}",
            id.gids[0], id.gids[1], id.gids[2]
        ));
    }
    if let Some(g) = id.groups.iter().find(|&&g| g != job_gid && !job_groups.contains(&g)) {
        return Err(format!("supplementary group {g} is not one of the job's groups {job_groups:?}"));
    }
    Ok(())
}

/// A byte string for C: interior NULs become '?' (only used for messages and paths that
/// came from C strings, which cannot hold NUL anyway).
pub fn c_bytes(s: &[u8]) -> Vec<u8> {
    s.iter().map(|&b| if b == 0 { b'?' } else { b }).collect()
}

/// Human-readable argv, for logs.
pub fn display_argv(argv: &[OsString]) -> String {
    let mut s = String::new();
    for (i, a) in argv.iter().enumerate() {
        if i > 0 {
            s.push(' ');
        }
        let a = a.to_string_lossy();
        if !a.is_empty() && a.bytes().all(|b| b.is_ascii_alphanumeric() || b"/._-=+,:@%".contains(&b)) {
            s.push_str(&a);
        } else {
            s.push('\'');
            s.push_str(&a.replace('\'', "'\\''"));
            s.push('\'');
        }
    }
    s
}

/// Names of SPANK error codes (spank_err_t), for messages.
pub struct EspankName(pub u32);

impl fmt::Display for EspankName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = match self.0 {
            0 => "ESPANK_SUCCESS",
            3000 => "ESPANK_ERROR",
            3001 => "ESPANK_BAD_ARG",
            3002 => "ESPANK_NOT_TASK",
            3003 => "ESPANK_ENV_EXISTS",
            3004 => "ESPANK_ENV_NOEXIST",
            3005 => "ESPANK_NOSPACE",
            3006 => "ESPANK_NOT_REMOTE",
            3007 => "ESPANK_NOEXIST",
            3008 => "ESPANK_NOT_EXECD",
            3009 => "ESPANK_NOT_AVAIL",
            3010 => "ESPANK_NOT_LOCAL",
            c => return write!(f, "spank error {c}"),
        };
        f.write_str(n)
    }
}

/// Bytes of an OsStr (Unix).
pub fn os_bytes(s: &OsStr) -> &[u8] {
    s.as_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn plugin_args_defaults_and_values() {
        let none: [&str; 0] = [];
        let c = parse_plugin_args(&none).unwrap();
        assert_eq!(c.agent, PathBuf::from(DEFAULT_AGENT));
        assert!(c.agent.is_absolute());
        assert!(!c.disabled);
        let c =
            parse_plugin_args(&["agent=/opt/htc/bin/htc-agent", "ledger_dir=/var/tmp/htc", "fanout=16", "disabled"])
                .unwrap();
        assert_eq!(c.agent, PathBuf::from("/opt/htc/bin/htc-agent"));
        assert_eq!(c.ledger_dir, Some(PathBuf::from("/var/tmp/htc")));
        assert_eq!(c.fanout, Some(16));
        assert!(c.disabled);
        assert!(!parse_plugin_args(&["disabled=no"]).unwrap().disabled);
        assert!(parse_plugin_args(&["disabled=yes"]).unwrap().disabled);
    }

    #[test]
    fn plugin_args_errors_are_all_reported() {
        let e = parse_plugin_args(&["agent=htc-agent", "fanout=1", "colour=blue", "ledger_dir", "disabled=maybe"])
            .unwrap_err();
        assert_eq!(e.len(), 5, "{e:?}");
        assert!(e[0].contains("absolute"), "{}", e[0]);
        assert!(e[1].contains("fanout=1") && e[1].contains("2 to 1024"), "{}", e[1]);
        assert!(e[2].contains("unknown plugin argument 'colour=blue'"), "{}", e[2]);
        assert!(e[3].contains("needs a value"), "{}", e[3]);
        assert!(e[4].contains("disabled=maybe"), "{}", e[4]);
        let e = parse_plugin_args(&["agent=/a", "agent=/b"]).unwrap_err();
        assert!(e[0].contains("twice"));
        assert!(parse_plugin_args(&["agent="]).is_err());
    }

    #[test]
    fn option_values() {
        assert_eq!(parse_retries("0"), Ok(0));
        assert_eq!(parse_retries("3"), Ok(3));
        assert_eq!(parse_retries(&RETRIES_MAX.to_string()), Ok(RETRIES_MAX));
        for bad in ["", "-1", "+1", "1.5", "x", "101", "99999999999999"] {
            let e = parse_retries(bad).unwrap_err();
            assert!(e.contains("whole number from 0 to 100"), "{bad}: {e}");
        }
        assert_eq!(parse_fanout("2"), Ok(2));
        assert_eq!(parse_fanout("1024"), Ok(1024));
        assert!(parse_fanout("1").is_err());
        assert!(parse_fanout("0").is_err());
        assert!(parse_fanout("1025").is_err());
        assert_eq!(parse_output("streams"), Ok(OutputMode::Streams));
        assert_eq!(parse_output("per-task"), Ok(OutputMode::PerTask));
        assert_eq!(parse_output("none"), Ok(OutputMode::None));
        assert!(parse_output("files").unwrap_err().contains("streams, per-task or none"));
        for m in [OutputMode::Streams, OutputMode::PerTask, OutputMode::None] {
            assert_eq!(parse_output(m.name()), Ok(m));
        }
    }

    #[test]
    fn orphan_options() {
        let o = UserOptions { retries: Some(1), output: Some(OutputMode::None), ..Default::default() };
        assert_eq!(o.orphans(), vec!["--htc-retries", "--htc-output"]);
        let o = UserOptions { partition: Some(Plan::Hflow), ..Default::default() };
        assert_eq!(o.orphans(), vec!["--htc-partition"]);
        assert_eq!(parse_partition(" even "), Ok(Plan::Even));
        assert!(parse_partition("fluxp").unwrap_err().contains("hflow or even"));
        let o = UserOptions { agents_per_node: Some(2), ..Default::default() };
        assert_eq!(o.orphans(), vec!["--htc-agents-per-node"]);
        assert_eq!(parse_agents_per_node("24"), Ok(24));
        assert!(parse_agents_per_node("0").unwrap_err().contains("from 1 to 4096"));
        let o = UserOptions { instance_nodes: Some(4), ..Default::default() };
        assert_eq!(o.orphans(), vec!["--htc-instance-nodes"]);
        assert_eq!(parse_instance_nodes("8"), Ok(8));
        assert!(parse_instance_nodes("0").unwrap_err().contains("from 1 to 65536"));
        let o = UserOptions { max_fails: Some(5), ..Default::default() };
        assert_eq!(o.orphans(), vec!["--htc-max-fails"]);
        assert_eq!(parse_max_fails("5"), Ok(5));
        assert!(parse_max_fails("0").is_err() && parse_max_fails("many").is_err());
        assert_eq!(parse_resume("4711"), Ok(4711));
        assert!(parse_resume("../x").unwrap_err().contains("not a job id"));
        let o = UserOptions { file: Some("/t".into()), retries: Some(1), ..Default::default() };
        assert!(o.orphans().is_empty());
    }

    #[test]
    fn grow_option_values() {
        let g = |max_jobs, nodes, minutes| GrowSpec { max_jobs, nodes, minutes };
        assert_eq!(parse_grow("3"), Ok(g(3, 1, None)));
        assert_eq!(parse_grow(" 3:2 "), Ok(g(3, 2, None)));
        assert_eq!(parse_grow("3:1:30"), Ok(g(3, 1, Some(30))));
        assert_eq!(parse_grow("4:2:1-00:30"), Ok(g(4, 2, Some(1470))));
        assert_eq!(parse_grow("1:1:0:30"), Ok(g(1, 1, Some(1))));
        // What sbatch stores (to_arg) reads back the same in the batch step.
        for v in ["3", "3:2", "3:1:30", "4:2:1-00:30", "1000:100000:7-00:00:01"] {
            let spec = parse_grow(v).unwrap();
            assert_eq!(parse_grow(&spec.to_arg()), Ok(spec), "{v}");
        }
        assert_eq!(parse_grow("3:1:30").unwrap().to_arg(), "3:1:30");
        assert_eq!(parse_grow("0"), Err("'0' is not a number of jobs (1 to 1000)".to_string()));
        assert_eq!(parse_grow(""), Err("'' is not a number of jobs (1 to 1000)".to_string()));
        assert_eq!(parse_grow("2:0"), Err("'0' is not a number of nodes (1 to 100000)".to_string()));
        assert_eq!(
            parse_grow("2:1:soon"),
            Err("'soon' is not a time limit (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS)".to_string())
        );
        // Times beyond Slurm's 32-bit minutes are refused, including those whose fields would
        // overflow htc-core's arithmetic (a panic there, or a wrapped value in a release build).
        let too_long = |t: &str| Err(format!("'{t}' is longer than Slurm's longest time limit (4294967293 minutes)"));
        assert_eq!(parse_grow("1:1:4294967293"), Ok(g(1, 1, Some(GROW_MINUTES_MAX))));
        for t in ["4294967294", "999999999999999-1", "999999999999999999", "1-999999999999999:0", "1000000000001:0"] {
            assert_eq!(parse_grow(&format!("1:1:{t}")), too_long(t), "{t}");
        }
        // Leading zeros are no overflow.
        assert_eq!(parse_grow("1:1:00000000000000000000000001"), Ok(g(1, 1, Some(1))));
        // MAX_JOBS and NODES are still reported first.
        assert!(parse_grow("0:1:999999999999999-1").unwrap_err().contains("number of jobs"));
        assert!(parse_grow("1:x:999999999999999-1").unwrap_err().contains("number of nodes"));

        // Through the options: --htc-grow rides with --htc to the batch step.
        let opts = UserOptions { file: Some("/t".into()), grow: parse_grow("3:1:30").ok(), ..Default::default() };
        assert!(opts.orphans().is_empty() && opts.join_conflicts().is_empty());
        let Ok(Some(BatchRequest::Run(req))) = BatchRequest::from_allocator(&opts) else { panic!("{opts:?}") };
        assert_eq!(req.grow, Some(g(3, 1, Some(30))));
        assert_eq!(req.job_control_vars(), vec![("HTC_FILE", OsString::from("/t")), ("HTC_GROW", "3:1:30".into())]);
        let get = |n: &str| match n {
            "SLURM_SPANK_HTC_FILE" => Some("/t".into()),
            "SLURM_SPANK_HTC_GROW" => Some("3:1:30".into()),
            _ => None,
        };
        assert_eq!(BatchRequest::from_job_env(get), Ok(Some(BatchRequest::Run(req.clone()))));
        // ... and, without the job-control variables, from the remote option values.
        assert_eq!(JobRequest::from_remote_options(&opts, None, Path::new("/")), Some(req));
    }

    #[test]
    fn grow_without_htc_is_an_orphan() {
        let o = UserOptions { grow: Some(GrowSpec { max_jobs: 2, nodes: 1, minutes: None }), ..Default::default() };
        assert_eq!(o.orphans(), vec!["--htc-grow"]);
        assert!(o.join_conflicts().is_empty());
        assert_eq!(BatchRequest::from_allocator(&o), Ok(None));
        let o = UserOptions { resubmit: Some(1), ..o };
        assert_eq!(o.orphans(), vec!["--htc-resubmit", "--htc-grow"]);
    }

    #[test]
    fn job_control_round_trip() {
        let opts = UserOptions {
            file: Some("/home/u/t.txt".into()),
            retries: Some(4),
            fanout: None,
            output: Some(OutputMode::PerTask),
            partition: Some(Plan::Even),
            agents_per_node: Some(3),
            instance_nodes: Some(2),
            max_fails: Some(9),
            resume: Some(77),
            resubmit: Some(3),
            join: None,
            grow: Some(GrowSpec { max_jobs: 5, nodes: 2, minutes: Some(90) }),
        };
        let req = JobRequest::from_allocator(&opts).unwrap();
        let vars = req.job_control_vars();
        assert_eq!(
            vars,
            vec![
                ("HTC_FILE", OsString::from("/home/u/t.txt")),
                ("HTC_RETRIES", "4".into()),
                ("HTC_OUTPUT", "per-task".into()),
                ("HTC_PARTITION", "even".into()),
                ("HTC_AGENTS_PER_NODE", "3".into()),
                ("HTC_INSTANCE_NODES", "2".into()),
                ("HTC_MAX_FAILS", "9".into()),
                ("HTC_RESUME", "77".into()),
                ("HTC_RESUBMIT", "3".into()),
                ("HTC_GROW", "5:2:90".into())
            ]
        );
        let env: Vec<(String, OsString)> = vars.iter().map(|(n, v)| (job_env_name(n), v.clone())).collect();
        let get = |n: &str| env.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
        assert_eq!(JobRequest::from_job_env(get), Ok(Some(req)));
        assert_eq!(JobRequest::from_allocator(&UserOptions::default()), None);
        assert_eq!(JobRequest::from_job_env(|_| None), Ok(None));
    }

    #[test]
    fn join_values_and_orphans() {
        assert_eq!(parse_join("1234"), Ok(JoinTarget::Job(1234)));
        assert_eq!(parse_join(" 42 "), Ok(JoinTarget::Job(42)));
        for bad in ["0", "99999999999"] {
            assert_eq!(parse_join(bad), Err(format!("'{bad}' is not a job id")), "{bad}");
        }
        assert!(parse_join(" ").unwrap_err().contains("missing"));
        // Anything else names a run directory (relative to the submit directory).
        for dir in ["../proj/.htc/12", "/scratch/u/.htc/7", "12a", "-1"] {
            assert_eq!(parse_join(dir), Ok(JoinTarget::Dir(dir.into())), "{dir}");
        }
        let base = Path::new("/home/u/p");
        assert_eq!(JoinTarget::Job(7).dir(base), Path::new("/home/u/p/.htc/7"));
        assert_eq!(JoinTarget::Dir("../q/.htc/7".into()).dir(base), Path::new("/home/u/p/../q/.htc/7"));
        assert_eq!(JoinTarget::Dir("/s/.htc/7".into()).dir(base), Path::new("/s/.htc/7"));
        // --htc-join activates on its own: its companions are not orphans.
        let o = UserOptions {
            join: Some(JoinTarget::Job(7)),
            agents_per_node: Some(2),
            instance_nodes: Some(3),
            ..Default::default()
        };
        assert!(o.orphans().is_empty());
        assert!(o.join_conflicts().is_empty());
        // Without --htc-join nothing conflicts.
        let o = UserOptions { file: Some("/t".into()), retries: Some(1), resume: Some(3), ..Default::default() };
        assert!(o.join_conflicts().is_empty());
    }

    #[test]
    fn join_refuses_a_task_file_and_the_run_s_settings() {
        let o = UserOptions { join: Some(JoinTarget::Job(1234)), file: Some("tasks.txt".into()), ..Default::default() };
        assert_eq!(o.join_conflicts(), vec!["--htc-join joins a running run; it takes no --htc=FILE"]);
        assert_eq!(BatchRequest::from_allocator(&o), Err(o.join_conflicts()));
        let each: [(&str, UserOptions); 8] = [
            ("--htc-retries", UserOptions { retries: Some(1), ..Default::default() }),
            ("--htc-fanout", UserOptions { fanout: Some(4), ..Default::default() }),
            ("--htc-output", UserOptions { output: Some(OutputMode::None), ..Default::default() }),
            ("--htc-partition", UserOptions { partition: Some(Plan::Even), ..Default::default() }),
            ("--htc-max-fails", UserOptions { max_fails: Some(3), ..Default::default() }),
            ("--htc-resume", UserOptions { resume: Some(99), ..Default::default() }),
            ("--htc-resubmit", UserOptions { resubmit: Some(2), ..Default::default() }),
            ("--htc-grow", UserOptions { grow: parse_grow("2").ok(), ..Default::default() }),
        ];
        for (name, o) in each {
            let o = UserOptions { join: Some(JoinTarget::Job(1234)), ..o };
            let e = o.join_conflicts();
            assert_eq!(e.len(), 1, "{name}: {e:?}");
            assert!(e[0].starts_with(&format!("{name} cannot be used with --htc-join (")), "{e:?}");
            assert!(BatchRequest::from_allocator(&o).is_err());
        }
        assert_eq!(
            UserOptions { join: Some(JoinTarget::Job(1)), resume: Some(2), ..Default::default() }.join_conflicts(),
            vec!["--htc-resume cannot be used with --htc-join (--htc-resume continues a run that ended, --htc-join joins one that is running)"]
        );
        let o = UserOptions { join: Some(JoinTarget::Job(1)), grow: parse_grow("3:1:30").ok(), ..Default::default() };
        assert_eq!(o.join_conflicts(), vec!["--htc-grow cannot be used with --htc-join (the run's own job grows it)"]);
        assert_eq!(BatchRequest::from_allocator(&o), Err(o.join_conflicts()));
        assert!(o.orphans().is_empty());
        // All of them are reported.
        let o = UserOptions {
            join: Some(JoinTarget::Job(1)),
            file: Some("/t".into()),
            retries: Some(1),
            resubmit: Some(1),
            agents_per_node: Some(2),
            ..Default::default()
        };
        assert_eq!(o.join_conflicts().len(), 3, "{:?}", o.join_conflicts());
    }

    #[test]
    fn join_request_round_trip_and_argv() {
        let opts = UserOptions {
            join: Some(JoinTarget::Job(1234)),
            agents_per_node: Some(2),
            instance_nodes: Some(4),
            ..Default::default()
        };
        // sbatch stores the run directory it checked, absolute.
        let opts = UserOptions { join: Some(JoinTarget::Dir("/home/u/.htc/1234".into())), ..opts };
        let req = BatchRequest::from_allocator(&opts).unwrap().unwrap();
        let want = JoinRequest { run: "/home/u/.htc/1234".into(), agents_per_node: Some(2), instance_nodes: Some(4) };
        assert_eq!(req, BatchRequest::Join(want.clone()));
        let vars = req.job_control_vars();
        assert_eq!(
            vars,
            vec![
                ("HTC_JOIN", OsString::from("/home/u/.htc/1234")),
                ("HTC_AGENTS_PER_NODE", "2".into()),
                ("HTC_INSTANCE_NODES", "4".into())
            ]
        );
        let env: Vec<(String, OsString)> = vars.iter().map(|(n, v)| (job_env_name(n), v.clone())).collect();
        let get = |n: &str| env.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
        assert_eq!(BatchRequest::from_job_env(get), Ok(Some(req.clone())));
        // A joining job is not a --htc job: the --htc reader leaves it alone.
        assert_eq!(JobRequest::from_job_env(get), Ok(None));
        // Its private variables are filtered from the agent's environment.
        assert!(is_private_env(b"SLURM_SPANK_HTC_JOIN=1234"));
        assert!(is_private_env(b"SLURM_SPANK_HTC_GROW=3:1:30"));
        assert!(is_private_env(b"_SLURM_SPANK_OPTION_htc_htc_grow=3:1:30"));
        assert!(is_private_env(b"_SLURM_SPANK_OPTION_htc_htc_join=1234"));
        assert!(is_private_env(b"SLURM_SPANK__SLURM_SPANK_OPTION_htc_htc_join=1234"));

        let job_argv = os(&["/var/spool/slurmd/job00042/slurm_script", "a1", "--flag"]);
        let argv = req.argv(&PluginConfig::default(), &job_argv).unwrap();
        assert_eq!(
            argv,
            os(&[
                DEFAULT_AGENT,
                "lead",
                "--join-run",
                "/home/u/.htc/1234",
                "--agents-per-node",
                "2",
                "--instance-nodes",
                "4",
                "--script",
                "/var/spool/slurmd/job00042/slurm_script",
                "a1",
                "--flag"
            ])
        );
        // The site's fanout is not passed (the run's applies); its ledger_dir is.
        let cfg = PluginConfig {
            agent: "/opt/a".into(),
            ledger_dir: Some("/tmp/l".into()),
            fanout: Some(8),
            disabled: false,
        };
        let minimal =
            BatchRequest::Join(JoinRequest { run: "/r/7".into(), agents_per_node: None, instance_nodes: None });
        assert_eq!(
            minimal.argv(&cfg, &os(&["/s"])).unwrap(),
            os(&["/opt/a", "lead", "--join-run", "/r/7", "--ledger-dir", "/tmp/l", "--script", "/s"])
        );
        assert_eq!(minimal.argv_prefix(&cfg).last().unwrap(), SCRIPT_FLAG);
        assert!(minimal.argv(&cfg, &[]).is_err());
        assert!(minimal.argv(&cfg, &os(&[""])).is_err());
        // A --htc request goes through the same path unchanged.
        let run = JobRequest::from_allocator(&UserOptions { file: Some("/t".into()), ..Default::default() }).unwrap();
        let job_argv = os(&["/s"]);
        assert_eq!(BatchRequest::Run(run.clone()).argv(&cfg, &job_argv), agent_argv(&cfg, &run, &job_argv));
    }

    #[test]
    fn join_job_env_and_remote_fallback() {
        assert_eq!(BatchRequest::from_job_env(|_| None), Ok(None));
        let e = BatchRequest::from_job_env(|n| match n {
            "SLURM_SPANK_HTC_FILE" => Some("/t".into()),
            "SLURM_SPANK_HTC_JOIN" => Some("/r/12".into()),
            _ => None,
        })
        .unwrap_err();
        assert!(e.contains("both SLURM_SPANK_HTC_FILE and SLURM_SPANK_HTC_JOIN"), "{e}");
        let e = BatchRequest::from_job_env(|n| (n == "SLURM_SPANK_HTC_JOIN").then(|| "x/../1".into())).unwrap_err();
        assert!(e.starts_with("SLURM_SPANK_HTC_JOIN: "), "{e}");
        let e = BatchRequest::from_job_env(|n| match n {
            "SLURM_SPANK_HTC_JOIN" => Some("/r/12".into()),
            "SLURM_SPANK_HTC_INSTANCE_NODES" => Some("0".into()),
            _ => None,
        })
        .unwrap_err();
        assert!(e.starts_with("SLURM_SPANK_HTC_INSTANCE_NODES"), "{e}");
        // --htc alone still reads back as before.
        let r = BatchRequest::from_job_env(|n| (n == "SLURM_SPANK_HTC_FILE").then(|| "/t".into())).unwrap().unwrap();
        assert!(matches!(r, BatchRequest::Run(ref j) if j.task_file == Path::new("/t")));

        let cwd = Path::new("/cwd");
        let o = UserOptions { join: Some(JoinTarget::Job(5)), agents_per_node: Some(3), ..Default::default() };
        assert_eq!(
            BatchRequest::from_remote_options(&o, None, cwd),
            Ok(Some(BatchRequest::Join(JoinRequest {
                run: "/cwd/.htc/5".into(),
                agents_per_node: Some(3),
                instance_nodes: None
            })))
        );
        let o2 = UserOptions { join: Some(JoinTarget::Dir("../p/.htc/5".into())), ..o.clone() };
        assert!(matches!(
            BatchRequest::from_remote_options(&o2, Some(Path::new("/sub")), cwd),
            Ok(Some(BatchRequest::Join(ref j))) if j.run == Path::new("/sub/../p/.htc/5")
        ));
        let both = UserOptions { file: Some("t.txt".into()), ..o };
        assert!(BatchRequest::from_remote_options(&both, None, cwd).is_err());
        let run = UserOptions { file: Some("t.txt".into()), ..Default::default() };
        assert!(matches!(
            BatchRequest::from_remote_options(&run, None, cwd),
            Ok(Some(BatchRequest::Run(ref j))) if j.task_file == Path::new("/cwd/t.txt")
        ));
        assert_eq!(BatchRequest::from_remote_options(&UserOptions::default(), None, cwd), Ok(None));
    }

    #[test]
    fn join_run_directory_checks() {
        use std::os::unix::fs::PermissionsExt;
        let base = std::env::temp_dir().join(format!("spank-htc-join-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        let b = base.display();

        // No .htc at all, then no .htc/1234.
        let e = check_join_run(&base, &JoinTarget::Job(1234)).unwrap_err();
        assert_eq!(e, format!("no run .htc/1234 in {b} (run sbatch from the directory the run was submitted from, or give the run directory)"));
        std::fs::create_dir_all(base.join(".htc/99")).unwrap();
        assert_eq!(check_join_run(&base, &JoinTarget::Job(1234)).unwrap_err(), e);

        // The run is there, but no leader has published its address.
        let run = base.join(".htc/1234");
        std::fs::create_dir_all(&run).unwrap();
        let not_running = format!("the run .htc/1234 in {b} is not running (it ended, or has not started yet)");
        assert_eq!(check_join_run(&base, &JoinTarget::Job(1234)).unwrap_err(), not_running);
        std::fs::create_dir(run.join("leader.addr")).unwrap();
        assert_eq!(check_join_run(&base, &JoinTarget::Job(1234)).unwrap_err(), not_running);
        std::fs::remove_dir(run.join("leader.addr")).unwrap();

        // Running.
        std::fs::write(
            run.join("leader.addr"),
            "addr=127.0.0.1:5000
job=1234
cluster=
",
        )
        .unwrap();
        assert_eq!(check_join_run(&base, &JoinTarget::Job(1234)), Ok(run.clone()));
        // The same run by its directory, from another one.
        let elsewhere = base.join("elsewhere");
        std::fs::create_dir_all(&elsewhere).unwrap();
        let by_dir = JoinTarget::Dir("../.htc/1234".into());
        assert_eq!(check_join_run(&elsewhere, &by_dir), Ok(elsewhere.join("../.htc/1234")));
        let e = check_join_run(&elsewhere, &JoinTarget::Dir("../.htc/5".into())).unwrap_err();
        assert_eq!(e, format!("there is no run directory {}", elsewhere.join("../.htc/5").display()));
        // A run reached through a link (`htc resume` links the new job id to the run).
        std::os::unix::fs::symlink("1234", base.join(".htc/1300")).unwrap();
        assert_eq!(check_join_run(&base, &JoinTarget::Job(1300)), Ok(base.join(".htc/1300")));

        // Not a directory.
        std::fs::write(base.join(".htc/77"), "").unwrap();
        assert!(check_join_run(&base, &JoinTarget::Job(77)).unwrap_err().contains("is not a run directory"));

        // Unreadable (another user's): root reads everything, so only checked as a user.
        let denied = format!("cannot read the run .htc/1234 in {b}: permission denied (belongs to another user?)");
        let eacces = std::io::Error::from_raw_os_error(13);
        let name = format!("the run .htc/1234 in {b}");
        assert_eq!(join_io_error(&name, &eacces, || unreachable!()), denied);
        let eio = std::io::Error::from_raw_os_error(5);
        assert!(join_io_error(&name, &eio, || unreachable!())
            .starts_with(&format!("cannot read the run .htc/1234 in {b}: ")));
        let uid = std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m)).unwrap_or(0);
        if uid != 0 {
            std::fs::set_permissions(run.join("leader.addr"), std::fs::Permissions::from_mode(0o000)).unwrap();
            assert_eq!(check_join_run(&base, &JoinTarget::Job(1234)).unwrap_err(), denied);
            std::fs::set_permissions(run.join("leader.addr"), std::fs::Permissions::from_mode(0o600)).unwrap();
            std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o000)).unwrap();
            assert_eq!(check_join_run(&base, &JoinTarget::Job(1234)).unwrap_err(), denied);
            std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o700)).unwrap();
            std::fs::set_permissions(base.join(".htc"), std::fs::Permissions::from_mode(0o000)).unwrap();
            assert_eq!(check_join_run(&base, &JoinTarget::Job(1234)).unwrap_err(), denied);
            std::fs::set_permissions(base.join(".htc"), std::fs::Permissions::from_mode(0o700)).unwrap();
        }
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn job_env_corruption_is_an_error() {
        let e = JobRequest::from_job_env(|n| (n == "SLURM_SPANK_HTC_FILE").then(|| "rel.txt".into())).unwrap_err();
        assert!(e.contains("absolute"));
        for (var, bad) in [
            ("SLURM_SPANK_HTC_FANOUT", "1"),
            ("SLURM_SPANK_HTC_AGENTS_PER_NODE", "lots"),
            ("SLURM_SPANK_HTC_INSTANCE_NODES", "0"),
            ("SLURM_SPANK_HTC_GROW", "0:1"),
            ("SLURM_SPANK_HTC_GROW", "1:1:999999999999999-1"),
        ] {
            let e = JobRequest::from_job_env(|n| match n {
                "SLURM_SPANK_HTC_FILE" => Some("/t".into()),
                _ if n == var => Some(bad.into()),
                _ => None,
            })
            .unwrap_err();
            assert!(e.starts_with(var), "{e}");
        }
    }

    #[test]
    fn remote_fallback_resolves_relative_files() {
        let opts = UserOptions { file: Some("sub/t.txt".into()), ..Default::default() };
        let r =
            JobRequest::from_remote_options(&opts, Some(Path::new("/home/u/proj")), Path::new("/elsewhere")).unwrap();
        assert_eq!(r.task_file, PathBuf::from("/home/u/proj/sub/t.txt"));
        let r = JobRequest::from_remote_options(&opts, None, Path::new("/cwd")).unwrap();
        assert_eq!(r.task_file, PathBuf::from("/cwd/sub/t.txt"));
        let abs = UserOptions { file: Some("/data/t.txt".into()), ..Default::default() };
        let r = JobRequest::from_remote_options(&abs, Some(Path::new("/x")), Path::new("/y")).unwrap();
        assert_eq!(r.task_file, PathBuf::from("/data/t.txt"));
        assert_eq!(JobRequest::from_remote_options(&UserOptions::default(), None, Path::new("/")), None);
    }

    #[test]
    fn argv_minimal_and_full() {
        let cfg = PluginConfig::default();
        let req = JobRequest {
            task_file: "/home/u/t.txt".into(),
            retries: None,
            fanout: None,
            output: None,
            partition: None,
            agents_per_node: None,
            instance_nodes: None,
            max_fails: None,
            resume: None,
            resubmit: None,
            grow: None,
        };
        let argv = agent_argv(&cfg, &req, &os(&["/var/spool/slurmd/job00042/slurm_script"])).unwrap();
        assert_eq!(
            argv,
            os(&[
                DEFAULT_AGENT,
                "lead",
                "--task-file",
                "/home/u/t.txt",
                "--script",
                "/var/spool/slurmd/job00042/slurm_script"
            ])
        );

        let cfg = PluginConfig {
            agent: "/opt/a".into(),
            ledger_dir: Some("/tmp/l".into()),
            fanout: Some(8),
            disabled: false,
        };
        let req = JobRequest {
            task_file: "/t".into(),
            retries: Some(0),
            fanout: Some(4),
            output: Some(OutputMode::None),
            partition: Some(Plan::Even),
            agents_per_node: Some(2),
            instance_nodes: Some(3),
            max_fails: Some(4),
            resume: Some(12),
            resubmit: Some(2),
            grow: Some(GrowSpec { max_jobs: 3, nodes: 2, minutes: Some(30) }),
        };
        let argv = agent_argv(&cfg, &req, &os(&["/s", "arg1", "--flag"])).unwrap();
        assert_eq!(
            argv,
            os(&[
                "/opt/a",
                "lead",
                "--task-file",
                "/t",
                "--retries",
                "0",
                "--fanout",
                "4",
                "--output",
                "none",
                "--partition",
                "even",
                "--agents-per-node",
                "2",
                "--instance-nodes",
                "3",
                "--max-fails",
                "4",
                "--resume-run",
                "12",
                "--resubmit",
                "2",
                "--grow",
                "3:2:30",
                "--ledger-dir",
                "/tmp/l",
                "--script",
                "/s",
                "arg1",
                "--flag"
            ])
        );
        // The site's fanout applies when the user gave none.
        let req2 = JobRequest { fanout: None, ..req.clone() };
        let p = agent_argv_prefix(&cfg, &req2);
        assert!(p.windows(2).any(|w| w == os(&["--fanout", "8"]).as_slice()));
        assert_eq!(p.last().unwrap(), SCRIPT_FLAG);
        // --script is the first occurrence: everything after it belongs to the script.
        let pos = argv.iter().position(|a| a == SCRIPT_FLAG).unwrap();
        assert_eq!(&argv[pos + 1..], os(&["/s", "arg1", "--flag"]).as_slice());
        assert!(agent_argv(&cfg, &req, &[]).is_err());
        assert!(agent_argv(&cfg, &req, &os(&[""])).is_err());
    }

    #[test]
    fn argv_with_grow() {
        let opts = UserOptions {
            file: Some("/home/u/proj/tasks.txt".into()),
            grow: parse_grow("3:1:30").ok(),
            ..Default::default()
        };
        let req = BatchRequest::from_allocator(&opts).unwrap().unwrap();
        let job_argv = os(&["/var/spool/slurmd/job00042/slurm_script", "a1"]);
        assert_eq!(
            req.argv(&PluginConfig::default(), &job_argv).unwrap(),
            os(&[
                DEFAULT_AGENT,
                "lead",
                "--task-file",
                "/home/u/proj/tasks.txt",
                "--grow",
                "3:1:30",
                "--script",
                "/var/spool/slurmd/job00042/slurm_script",
                "a1"
            ])
        );
        // After --resubmit, before --ledger-dir; NODES and TIME as to_arg writes them.
        let cfg = PluginConfig { ledger_dir: Some("/tmp/l".into()), ..PluginConfig::default() };
        let opts = UserOptions { resubmit: Some(2), grow: parse_grow("4:2:1-00:30").ok(), ..opts };
        let req = BatchRequest::from_allocator(&opts).unwrap().unwrap();
        assert_eq!(
            req.argv(&cfg, &job_argv).unwrap(),
            os(&[
                DEFAULT_AGENT,
                "lead",
                "--task-file",
                "/home/u/proj/tasks.txt",
                "--resubmit",
                "2",
                "--grow",
                "4:2:1470",
                "--ledger-dir",
                "/tmp/l",
                "--script",
                "/var/spool/slurmd/job00042/slurm_script",
                "a1"
            ])
        );
        let opts = UserOptions { grow: parse_grow("5").ok(), ..opts };
        let argv = BatchRequest::from_allocator(&opts).unwrap().unwrap().argv_prefix(&cfg);
        assert!(argv.windows(2).any(|w| w == os(&["--grow", "5:1"]).as_slice()), "{argv:?}");
    }

    #[test]
    fn private_env_filter() {
        for e in [
            "SLURM_SPANK_HTC_FILE=/t",
            "SLURM_SPANK_HTC_RETRIES=2",
            "_SLURM_SPANK_OPTION_htc_htc=t.txt",
            "_SLURM_SPANK_OPTION_htc_htc_retries=2",
            "SLURM_SPANK__SLURM_SPANK_OPTION_htc_htc=t.txt",
            "SPANK__SLURM_SPANK_OPTION_htc_htc=t.txt",
            "SPANK_HTC_FILE=/t",
        ] {
            assert!(is_private_env(e.as_bytes()), "{e}");
        }
        for e in [
            "HTC_FILE=/t",
            "PATH=/bin",
            "SLURM_JOB_ID=1",
            "SLURM_SPANK__SLURM_SPANK_OPTION_other_htc=x",
            "SLURM_SPANK_HTCX=1",
            "_SLURM_SPANK_OPTION_htcx_a=1",
            "HOME",
        ] {
            assert!(!is_private_env(e.as_bytes()), "{e}");
        }
        let env: Vec<&[u8]> = vec![b"A=1", b"SLURM_SPANK_HTC_FILE=/x=y", b"B=2", b"_SLURM_SPANK_OPTION_htc_htc=t"];
        assert_eq!(private_env_names(env), os(&["SLURM_SPANK_HTC_FILE", "_SLURM_SPANK_OPTION_htc_htc"]));
    }

    #[test]
    fn allocator_detection() {
        assert_eq!(allocator_from_exe(Path::new("/usr/bin/sbatch")), Allocator::Sbatch);
        assert_eq!(allocator_from_exe(Path::new("/opt/slurm/bin/salloc")), Allocator::Salloc);
        assert_eq!(allocator_from_exe(Path::new("/usr/bin/scrun")), Allocator::Other);
    }

    #[test]
    fn task_file_check() {
        let dir = std::env::temp_dir().join(format!("spank-htc-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.txt");
        std::fs::File::create(&good).unwrap().write_all(b"# c\necho 1\necho 2\n").unwrap();
        let (abs, n) = check_task_file(good.as_os_str()).unwrap();
        assert_eq!(n, 2);
        assert_eq!(abs, std::fs::canonicalize(&good).unwrap());

        let missing = dir.join("missing.txt");
        let e = check_task_file(missing.as_os_str()).unwrap_err();
        assert_eq!(e.len(), 1);
        assert!(e[0].starts_with(&missing.display().to_string()) && e[0].contains("No such file"), "{e:?}");

        let bad = dir.join("bad.txt");
        std::fs::File::create(&bad).unwrap().write_all(b"echo ok\n[nope=1] x\n").unwrap();
        let e = check_task_file(bad.as_os_str()).unwrap_err();
        assert!(e[0].starts_with(&format!("{}:2", bad.display())), "{e:?}");

        let many = dir.join("many.txt");
        let mut f = std::fs::File::create(&many).unwrap();
        for _ in 0..20 {
            f.write_all(b"[bad] x\n").unwrap();
        }
        let e = check_task_file(many.as_os_str()).unwrap_err();
        assert_eq!(e.len(), MAX_REPORTED_ERRORS + 1, "{e:?}");
        assert!(e.last().unwrap().contains("htc check"));

        let empty = dir.join("empty.txt");
        std::fs::File::create(&empty).unwrap();
        assert!(check_task_file(empty.as_os_str()).is_err());
        assert!(check_task_file(dir.as_os_str()).unwrap_err()[0].contains("directory"));
        assert!(check_task_file(OsStr::new("")).unwrap_err()[0].contains("--htc=FILE"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn meta_table<'a>(entries: &'a [(&'a str, u32, u32)]) -> impl Fn(&Path) -> Result<PathMeta, String> + 'a {
        move |p: &Path| {
            entries
                .iter()
                .find(|(q, _, _)| Path::new(q) == p)
                .map(|&(_, uid, mode)| PathMeta { uid, mode })
                .ok_or_else(|| format!("{}: No such file or directory", p.display()))
        }
    }

    #[test]
    fn agent_path_rules() {
        let safe =
            [("/", 0, 0o040755), ("/opt", 0, 0o040755), ("/opt/htc", 0, 0o040755), ("/opt/htc/htc-agent", 0, 0o100755)];
        let p = Path::new("/opt/htc/htc-agent");
        assert_eq!(check_agent_path_with(p, p, meta_table(&safe)), Ok(()));

        let with = |path: &str, uid: u32, mode: u32| {
            let mut t = safe.to_vec();
            for e in t.iter_mut() {
                if e.0 == path {
                    *e = (e.0, uid, mode);
                }
            }
            match check_agent_path_with(p, p, meta_table(&t)) {
                Err(AgentPathError::Unsafe(m)) => m,
                other => panic!("{path} {uid} {mode:o}: {other:?}"),
            }
        };
        assert!(with("/opt/htc/htc-agent", 1001, 0o100755).contains("file /opt/htc/htc-agent is owned by uid 1001"));
        assert!(with("/opt/htc/htc-agent", 0, 0o100775).contains("writable by group or others (mode 0775)"));
        assert!(with("/opt/htc/htc-agent", 0, 0o100757).contains("writable by group or others"));
        assert!(with("/opt/htc/htc-agent", 0, 0o104755).contains("set-user-ID"));
        assert!(with("/opt/htc/htc-agent", 0, 0o102755).contains("set-group-ID"));
        assert!(with("/opt/htc/htc-agent", 0, 0o040755).contains("not a regular file"));
        assert!(with("/opt/htc", 1001, 0o040755).contains("directory /opt/htc is owned by uid 1001"));
        assert!(with("/opt", 0, 0o041777).contains("directory /opt is writable by group or others (mode 1777)"));
        assert!(with("/", 0, 0o040775).contains("directory / is writable"));

        // The message names both the configured and the resolved path.
        let link = Path::new("/usr/local/bin/htc-agent");
        let t = [
            ("/", 0, 0o040755),
            ("/opt", 0, 0o040755),
            ("/opt/htc", 1001, 0o040755),
            ("/opt/htc/htc-agent", 0, 0o100755),
        ];
        let e = check_agent_path_with(link, p, meta_table(&t)).unwrap_err().to_string();
        assert!(e.starts_with("resolves to /opt/htc/htc-agent: directory /opt/htc is owned by uid 1001"), "{e}");
        // A directory that cannot be examined is not "safe".
        let t = [("/opt/htc/htc-agent", 0, 0o100755)];
        assert!(matches!(check_agent_path_with(p, p, meta_table(&t)), Err(AgentPathError::Inaccessible(_))));
        assert!(matches!(
            check_agent_path_with(p, Path::new("rel"), meta_table(&safe)),
            Err(AgentPathError::Unsafe(_))
        ));
    }

    #[test]
    fn agent_path_on_this_machine() {
        match check_agent_path(Path::new("/nonexistent/htc-agent")) {
            Err(AgentPathError::NotFound(m)) => assert!(m.contains("No such file"), "{m}"),
            other => panic!("{other:?}"),
        }
        // A file in a world-writable directory (the temp dir) is never acceptable.
        let dir = std::env::temp_dir().join(format!("spank-htc-agent-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("htc-agent");
        std::fs::write(&f, b"#!/bin/sh\n").unwrap();
        assert!(matches!(check_agent_path(&f), Err(AgentPathError::Unsafe(_))));
        std::fs::remove_dir_all(&dir).unwrap();
        // /bin/sh is root's on any sane system (and /bin may be a symlink to usr/bin).
        let sh = check_agent_path(Path::new("/bin/sh"));
        assert!(sh.is_ok(), "{sh:?}");
        assert!(!sh.unwrap().as_os_str().is_empty());
    }

    #[test]
    fn identity_rules() {
        let id = Identity { uids: [1001; 3], gids: [1001; 3], groups: vec![1001, 2000] };
        assert_eq!(check_identity(&id, 1001, 1001, &[1001, 2000]), Ok(()));
        assert_eq!(check_identity(&id, 1001, 1001, &[2000]), Ok(()));
        let e = check_identity(&id, 1001, 1001, &[]).unwrap_err();
        assert!(e.contains("supplementary group 2000"), "{e}");
        let e = check_identity(&Identity { uids: [1001, 1001, 0], ..id.clone() }, 1001, 1001, &[2000]).unwrap_err();
        assert!(e.contains("uid 1001/1001/0 (real/effective/saved) is not the job's uid 1001"), "{e}");
        let e = check_identity(&Identity { uids: [0; 3], ..id.clone() }, 1001, 1001, &[2000]).unwrap_err();
        assert!(e.contains("is not the job's uid"), "{e}");
        let e = check_identity(&Identity { gids: [1001, 0, 1001], ..id.clone() }, 1001, 1001, &[2000]).unwrap_err();
        assert!(e.contains("gid 1001/0/1001"), "{e}");
        let e =
            check_identity(&Identity { groups: vec![0, 1001], ..id.clone() }, 1001, 1001, &[1001, 2000]).unwrap_err();
        assert!(e.contains("supplementary group 0"), "{e}");
        // root's own job (submitted by root) is root's business.
        let root = Identity { uids: [0; 3], gids: [0; 3], groups: vec![0] };
        assert_eq!(check_identity(&root, 0, 0, &[0]), Ok(()));
    }

    #[test]
    fn misc_helpers() {
        assert_eq!(c_bytes(b"a\0b"), b"a?b");
        assert_eq!(display_argv(&os(&["/a", "x y", "it's", ""])), "/a 'x y' 'it'\\''s' ''");
        assert_eq!(EspankName(3004).to_string(), "ESPANK_ENV_NOEXIST");
        assert_eq!(EspankName(7).to_string(), "spank error 7");
        assert_eq!(BATCH_STEP_ID, 0xfffffffb);
    }
}
