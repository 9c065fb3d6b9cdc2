//! The kinds of values an `--htc*` option takes ([`Kind`]) and the values themselves
//! ([`Value`]). One parser per kind serves sbatch, slurmstepd and the job-control variables read
//! back in the batch step, and [`Value::to_arg`] writes what that parser reads back unchanged:
//! that is what keeps sbatch's check and the batch step's argv in agreement.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use htc_core::grow::GrowSpec;
use htc_core::output::OutputMode;
use htc_core::partition::Plan;

/// What an option's value must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A whole number from `min` to `max`.
    Number { min: u32, max: u32 },
    /// A job id (1 to 2^32-1).
    JobId,
    /// `streams`, `per-task` or `none` ([`OutputMode`]).
    Output,
    /// `hflow` or `even` ([`Plan`]).
    Plan,
    /// `MAX_JOBS[:NODES[:TIME]]` ([`parse_grow`]).
    Grow,
    /// A task file: any path here; sbatch reads and checks the file (`submit::check`).
    TaskFile,
    /// A run to join: a job id or a run directory ([`parse_join`]); sbatch checks that it runs.
    Run,
    /// How long an open run may have nothing to do before it ends ([`parse_idle`]); the value
    /// may be left out (`--htc-open`), for the default.
    Idle,
    /// On or off: `--NAME` alone or `=yes` is on, `=no` off ([`parse_switch`]).
    Switch,
}

/// A parsed option value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Number(u32),
    Output(OutputMode),
    Plan(Plan),
    Grow(GrowSpec),
    /// Kept as given (not lossily converted): a task file path may be any bytes.
    Path(PathBuf),
    Run(JoinTarget),
    /// Milliseconds; 0: never.
    Idle(u64),
    Switch(bool),
}

/// An open run's idle exit when `--htc-open` names none: as `htc run --open`'s, long enough
/// for a workflow manager's next wave, short enough that a forgotten run gives its nodes back.
pub const IDLE_EXIT_DEFAULT_MS: u64 = 30 * 60 * 1000;

impl Kind {
    /// Every value is parsed from its text as Slurm hands it over; only a task file keeps
    /// bytes that are not UTF-8.
    pub fn parse(&self, arg: &OsStr) -> Result<Value, String> {
        let text = arg.to_string_lossy();
        match *self {
            Kind::Number { min, max } => parse_number(&text, min, max).map(Value::Number),
            Kind::JobId => parse_job_id(&text).map(Value::Number),
            Kind::Output => text.parse::<OutputMode>().map(Value::Output),
            Kind::Plan => parse_partition(&text).map(Value::Plan),
            Kind::Grow => parse_grow(&text).map(Value::Grow),
            Kind::TaskFile => Ok(Value::Path(PathBuf::from(arg))),
            Kind::Run => parse_join(&text).map(Value::Run),
            Kind::Idle => parse_idle(&text).map(Value::Idle),
            Kind::Switch => parse_switch(&text).map(Value::Switch),
        }
    }

    /// Whether the option may be given without a value (`--NAME` alone; `--NAME=VALUE` then
    /// for a value, as getopt reads optional values).
    pub fn value_optional(&self) -> bool {
        matches!(self, Kind::Idle | Kind::Switch)
    }
}

impl Value {
    /// How the job-control environment and the agent's argv carry the value.
    pub fn to_arg(&self) -> OsString {
        match self {
            Value::Number(n) => n.to_string().into(),
            Value::Output(o) => o.name().into(),
            Value::Plan(p) => p.name().into(),
            Value::Grow(g) => g.to_arg().into(),
            Value::Path(p) => p.clone().into_os_string(),
            Value::Run(JoinTarget::Job(j)) => j.to_string().into(),
            Value::Run(JoinTarget::Dir(d)) => d.clone().into_os_string(),
            Value::Idle(ms) => format!("{ms}ms").into(),
            Value::Switch(on) => if *on { "yes" } else { "no" }.into(),
        }
    }
}

/// `yes` (or nothing: the option alone) or `no`.
pub fn parse_switch(s: &str) -> Result<bool, String> {
    match s.trim() {
        "" | "yes" => Ok(true),
        "no" => Ok(false),
        _ => Err(format!("'{s}' is neither yes nor no")),
    }
}

/// A whole number from `min` to `max` (surrounding blanks allowed, as `#SBATCH` lines have).
pub fn parse_number(s: &str, min: u32, max: u32) -> Result<u32, String> {
    let t = s.trim();
    let ok = !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    match t.parse::<u32>() {
        Ok(n) if ok && (min..=max).contains(&n) => Ok(n),
        _ => Err(format!("'{s}' is not a whole number from {min} to {max}")),
    }
}

fn parse_job_id(s: &str) -> Result<u32, String> {
    parse_number(s, 1, u32::MAX).map_err(|_| format!("'{s}' is not a job id"))
}

fn parse_partition(s: &str) -> Result<Plan, String> {
    s.trim().parse::<Plan>().map_err(|_| format!("'{s}' is not a partition plan (hflow or even)"))
}

/// The longest TIME of `--htc-grow`, in minutes: Slurm's time limits are 32-bit minutes, of
/// which `INFINITE` (0xffffffff) and `NO_VAL` (0xfffffffe) are reserved.
pub const GROW_MINUTES_MAX: u64 = 0xffff_fffd;

/// `MAX_JOBS[:NODES[:TIME]]` ([`GrowSpec::parse`]). A TIME longer than Slurm takes is refused
/// here, before htc-core's arithmetic sees a field that would overflow it.
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

/// An idle time as task files write durations (`90s`, `30m`, `2h`); empty for the default, `0`
/// for never.
pub fn parse_idle(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t.is_empty() {
        return Ok(IDLE_EXIT_DEFAULT_MS);
    }
    htc_core::taskfile::parse_duration_ms(t)
        .map(u64::from)
        .ok_or_else(|| format!("'{s}' is not a duration like 90s, 30m, 2h (0: never)"))
}

/// The run to join: digits are a job id, anything else a run directory.
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
    pub fn name(&self, base: &Path) -> String {
        match self {
            JoinTarget::Job(j) => format!("the run .htc/{j} in {}", base.display()),
            JoinTarget::Dir(_) => format!("the run directory {}", self.dir(base).display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(kind: Kind, s: &str) -> Result<Value, String> {
        kind.parse(OsStr::new(s))
    }

    #[test]
    fn numbers() {
        let k = Kind::Number { min: 0, max: 100 };
        assert_eq!(parse(k, "0"), Ok(Value::Number(0)));
        assert_eq!(parse(k, " 3 "), Ok(Value::Number(3)));
        assert_eq!(parse(k, "100"), Ok(Value::Number(100)));
        for bad in ["", "-1", "+1", "1.5", "x", "101", "99999999999999"] {
            assert_eq!(parse(k, bad), Err(format!("'{bad}' is not a whole number from 0 to 100")), "{bad}");
        }
        assert_eq!(parse(Kind::JobId, "4711"), Ok(Value::Number(4711)));
        assert_eq!(parse(Kind::JobId, "../x"), Err("'../x' is not a job id".to_string()));
        assert_eq!(parse(Kind::JobId, "0"), Err("'0' is not a job id".to_string()));
    }

    #[test]
    fn names() {
        for m in OutputMode::ALL {
            assert_eq!(parse(Kind::Output, m.name()), Ok(Value::Output(m)));
        }
        assert!(parse(Kind::Output, "files").unwrap_err().contains("streams, per-task or none"));
        assert_eq!(parse(Kind::Plan, " even "), Ok(Value::Plan(Plan::Even)));
        assert_eq!(parse(Kind::Plan, "fluxp"), Err("'fluxp' is not a partition plan (hflow or even)".to_string()));
    }

    #[test]
    fn idle_times_default_and_round_trip() {
        assert_eq!(parse(Kind::Idle, ""), Ok(Value::Idle(IDLE_EXIT_DEFAULT_MS)));
        assert_eq!(parse(Kind::Idle, " 2h "), Ok(Value::Idle(7_200_000)));
        assert_eq!(parse(Kind::Idle, "0"), Ok(Value::Idle(0)));
        assert_eq!(parse(Kind::Idle, "soon"), Err("'soon' is not a duration like 90s, 30m, 2h (0: never)".into()));
        for ms in [0, 1, 90_000, IDLE_EXIT_DEFAULT_MS] {
            assert_eq!(Kind::Idle.parse(&Value::Idle(ms).to_arg()), Ok(Value::Idle(ms)));
        }
        assert!(Kind::Idle.value_optional() && !Kind::TaskFile.value_optional());
        assert_eq!(parse(Kind::Switch, ""), Ok(Value::Switch(true)));
        assert_eq!(parse(Kind::Switch, " no"), Ok(Value::Switch(false)));
        assert_eq!(parse(Kind::Switch, "on"), Err("'on' is neither yes nor no".into()));
        for on in [true, false] {
            assert_eq!(Kind::Switch.parse(&Value::Switch(on).to_arg()), Ok(Value::Switch(on)));
        }
    }

    #[test]
    fn task_files_keep_their_bytes() {
        use std::os::unix::ffi::OsStrExt;
        let raw = OsStr::from_bytes(b"t\xff.txt");
        assert_eq!(Kind::TaskFile.parse(raw), Ok(Value::Path(PathBuf::from(raw))));
        assert_eq!(Value::Path(PathBuf::from(raw)).to_arg(), raw);
    }

    #[test]
    fn grow_values() {
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
    }

    #[test]
    fn join_values() {
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
    }
}
