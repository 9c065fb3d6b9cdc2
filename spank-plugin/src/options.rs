//! The `--htc*` options: [`OPTIONS`], one entry per option. Registration with SPANK (and so
//! `sbatch --help`), the parsing in every context, the submit-time messages, the job-control
//! variables, the `--htc-join` conflicts and the agent's argv all follow from an entry, in the
//! table's order. Adding an option is adding an entry (and a [`Kind`] if none fits).

use std::ffi::CStr;
use std::os::raw::c_int;

use crate::plugstack::{PluginConfig, FANOUT_MAX, FANOUT_MIN};
use crate::value::{Kind, Value};

/// `plugin_name`: also the middle part of Slurm's option env names (`_SLURM_SPANK_OPTION_htc_…`).
pub const PLUGIN_NAME: &str = "htc";

pub const RETRIES_MAX: u32 = htc_core::taskfile::MAX_RETRIES;
pub const AGENTS_PER_NODE_MAX: u32 = 4096;
pub const INSTANCE_NODES_MAX: u32 = 65536;
/// Automatic resubmissions of one run, at most.
pub const RESUBMIT_MAX: u32 = 100;

/// One option.
pub struct OptionDef {
    /// `--NAME` on sbatch's command line; Slurm names the option's environment copies after it.
    pub name: &'static CStr,
    /// How `sbatch --help` names the value (`--NAME=ARGINFO`).
    pub arginfo: &'static CStr,
    /// The help text.
    pub usage: &'static CStr,
    pub kind: Kind,
    pub role: Role,
    /// The name sbatch stores the value under with `spank_job_control_setenv` (the batch step
    /// reads it back as `SLURM_SPANK_` + this).
    pub job_control: &'static str,
    /// The agent's flag, followed by [`Value::to_arg`].
    pub agent_flag: &'static str,
    /// The value the agent gets from plugstack.conf when the user gave none.
    pub site_default: Option<fn(&PluginConfig) -> Option<Value>>,
}

/// What the batch step of an HTC job does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Lead a run of its own (`--htc=FILE`).
    Run,
    /// Join a running run (`--htc-join=RUN`).
    Join,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Makes the job an HTC job of this mode; the agent gets it first. Exactly one entry per
    /// mode.
    Activates(Mode),
    /// A setting of the run: nothing without an option that activates the plugin.
    Setting(WithJoin),
    /// A setting of `Run` jobs that also makes a job one without a task file: `--htc-open`
    /// alone starts a run whose tasks all come later. Refused with `--htc-join` (a joining
    /// job's run decides when it ends).
    Opens,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WithJoin {
    /// It shapes this job's own agents, so a joining job passes it on too.
    Passed,
    /// The run's own setting applies: refused with `--htc-join`, for this reason.
    Refused(&'static str),
}

pub const OPTIONS: &[OptionDef] = &[
    OptionDef {
        name: c"htc",
        arginfo: c"FILE",
        usage: c"High-throughput mode: run the tasks listed in FILE (one command per line) inside this one allocation, with node-local agents, instead of running the batch script as the job. The script still runs once, first, to set up every task's environment. FILE is checked now; see `htc check FILE`.",
        kind: Kind::TaskFile,
        role: Role::Activates(Mode::Run),
        job_control: "HTC_FILE",
        agent_flag: "--task-file",
        site_default: None,
    },
    OptionDef {
        name: c"htc-retries",
        arginfo: c"N",
        usage: c"With --htc: retry a failed task up to N times (0-100; overrides the task file's default).",
        kind: Kind::Number { min: 0, max: RETRIES_MAX },
        role: Role::Setting(WithJoin::Refused("the run's retries apply")),
        job_control: "HTC_RETRIES",
        agent_flag: "--retries",
        site_default: None,
    },
    OptionDef {
        name: c"htc-fanout",
        arginfo: c"K",
        usage: c"With --htc: children per node in the agents' tree (2-1024).",
        kind: Kind::Number { min: FANOUT_MIN, max: FANOUT_MAX },
        role: Role::Setting(WithJoin::Refused("the run's fan-out applies")),
        job_control: "HTC_FANOUT",
        agent_flag: "--fanout",
        site_default: Some(|cfg| cfg.fanout.map(Value::Number)),
    },
    OptionDef {
        name: c"htc-output",
        arginfo: c"MODE",
        usage: c"With --htc: task output as 'streams' (default: a few indexed files per node, read with `htc output`), 'per-task' (one file per task) or 'none'.",
        kind: Kind::Output,
        role: Role::Setting(WithJoin::Refused("the run's output mode applies")),
        job_control: "HTC_OUTPUT",
        agent_flag: "--output",
        site_default: None,
    },
    OptionDef {
        name: c"htc-partition",
        arginfo: c"PLAN",
        usage: c"With --htc: how tasks are split among the nodes: 'hflow' (default: each runtime class on its own, long tasks first) or 'even' (one even split of the file).",
        kind: Kind::Plan,
        role: Role::Setting(WithJoin::Refused("the run's partition plan applies")),
        job_control: "HTC_PARTITION",
        agent_flag: "--partition",
        site_default: None,
    },
    OptionDef {
        name: c"htc-agents-per-node",
        arginfo: c"N",
        usage: c"With --htc: agents on each node, splitting its CPUs (1-4096; default 1, whose spawn loop per CPU keeps them busy).",
        kind: Kind::Number { min: 1, max: AGENTS_PER_NODE_MAX },
        role: Role::Setting(WithJoin::Passed),
        job_control: "HTC_AGENTS_PER_NODE",
        agent_flag: "--agents-per-node",
        site_default: None,
    },
    OptionDef {
        name: c"htc-instance-nodes",
        arginfo: c"N",
        usage: c"With --htc: nodes per scheduling instance, whose first agent takes work from the leader for all of them (default 1: every node's agents on their own).",
        kind: Kind::Number { min: 1, max: INSTANCE_NODES_MAX },
        role: Role::Setting(WithJoin::Passed),
        job_control: "HTC_INSTANCE_NODES",
        agent_flag: "--instance-nodes",
        site_default: None,
    },
    OptionDef {
        name: c"htc-max-fails",
        arginfo: c"N",
        usage: c"With --htc: fail fast: once N tasks have failed for good, start nothing more and end the job (resumable).",
        kind: Kind::Number { min: 1, max: u32::MAX },
        role: Role::Setting(WithJoin::Refused("the run's limit applies")),
        job_control: "HTC_MAX_FAILS",
        agent_flag: "--max-fails",
        site_default: None,
    },
    OptionDef {
        name: c"htc-resume",
        arginfo: c"JOBID",
        usage: c"With --htc: continue the run of job JOBID (its unfinished tasks) instead of starting a new one; `htc resume JOBID` submits this.",
        kind: Kind::JobId,
        role: Role::Setting(WithJoin::Refused(
            "--htc-resume continues a run that ended, --htc-join joins one that is running",
        )),
        job_control: "HTC_RESUME",
        agent_flag: "--resume-run",
        site_default: None,
    },
    OptionDef {
        name: c"htc-resubmit",
        arginfo: c"N",
        usage: c"With --htc: when the job ends at its time limit or loses every agent with tasks unfinished, submit the job that continues it, at most N times in all.",
        kind: Kind::Number { min: 1, max: RESUBMIT_MAX },
        role: Role::Setting(WithJoin::Refused("only the run's own job resubmits the run")),
        job_control: "HTC_RESUBMIT",
        agent_flag: "--resubmit",
        site_default: None,
    },
    OptionDef {
        name: c"htc-grow",
        arginfo: c"MAX_JOBS[:NODES[:TIME]]",
        usage: c"With --htc: while the work left is more than the run's jobs can do in their time, submit up to MAX_JOBS more jobs of NODES nodes (default 1) for TIME (default: this job's) that join the run.",
        kind: Kind::Grow,
        role: Role::Setting(WithJoin::Refused("the run's own job grows it")),
        job_control: "HTC_GROW",
        agent_flag: "--grow",
        site_default: None,
    },
    OptionDef {
        name: c"htc-keep-nodes",
        arginfo: c"yes|no",
        usage: c"With --htc: keep every node of the job to its end (=no: give them back, also before Slurm 24.11, where the default keeps them). By default, once all the run has left is running, the nodes with nothing left to run go back to Slurm for the jobs that wait (an open run's after 30 s with nothing to do).",
        kind: Kind::Switch,
        role: Role::Setting(WithJoin::Refused("the run's own job decides what it gives back")),
        job_control: "HTC_KEEP_NODES",
        agent_flag: "--keep-nodes",
        site_default: None,
    },
    OptionDef {
        name: c"htc-open",
        arginfo: c"IDLE",
        usage: c"An open run: it takes tasks while it runs (`htc task add`), with or without --htc=FILE, and ends on `htc close`, or after IDLE with nothing to do (--htc-open=IDLE, e.g. 2h; 0: never; default 30m), or at its time limit (continued by --htc-resubmit, still open).",
        kind: Kind::Idle,
        role: Role::Opens,
        job_control: "HTC_OPEN",
        agent_flag: "--open",
        site_default: None,
    },
    OptionDef {
        name: c"htc-join",
        arginfo: c"RUN",
        usage: c"Join the running run of job RUN (same user, submitted from this directory), or the one in run directory RUN, with this job's nodes: they take a share of its remaining tasks. Takes no --htc=FILE; goes with --htc-agents-per-node and --htc-instance-nodes only (the run's other settings apply).",
        kind: Kind::Run,
        role: Role::Activates(Mode::Join),
        job_control: "HTC_JOIN",
        agent_flag: "--join-run",
        site_default: None,
    },
];

/// How many options there are.
pub const COUNT: usize = OPTIONS.len();

/// The `val` option `i` is registered with (Slurm hands it back to the option callback). It is
/// never sent anywhere: Slurm carries option values by name.
pub fn val(i: usize) -> c_int {
    i as c_int + 1
}

/// The option registered with `val`.
pub fn from_val(val: c_int) -> Option<usize> {
    usize::try_from(val).ok()?.checked_sub(1).filter(|&i| i < COUNT)
}

/// The option called `--name`.
pub fn by_name(name: &str) -> Option<usize> {
    OPTIONS.iter().position(|o| o.name.to_bytes() == name.as_bytes())
}

/// The option that activates `mode`.
pub fn activator(mode: Mode) -> usize {
    OPTIONS.iter().position(|o| o.role == Role::Activates(mode)).expect("one option activates each mode")
}

impl OptionDef {
    /// `--NAME`, as messages write it.
    pub fn flag(&self) -> String {
        format!("--{}", self.name.to_string_lossy())
    }

    pub fn activates(&self) -> Option<Mode> {
        match self.role {
            Role::Activates(m) => Some(m),
            Role::Setting(_) | Role::Opens => None,
        }
    }

    /// Whether giving it alone makes an HTC job (an activator, or `--htc-open`): it needs a
    /// usable plugin, as an activator does.
    pub fn starts_a_job(&self) -> bool {
        !matches!(self.role, Role::Setting(_))
    }

    /// Whether a job of `mode` hands this setting to its agent (never for an activator, which
    /// the agent gets first, on its own).
    pub fn goes_with(&self, mode: Mode) -> bool {
        match (self.role, mode) {
            (Role::Activates(_), _) | (Role::Opens, Mode::Join) => false,
            (Role::Setting(_) | Role::Opens, Mode::Run) => true,
            (Role::Setting(with_join), Mode::Join) => with_join == WithJoin::Passed,
        }
    }

    /// The job-environment name under which Slurm hands the option's value to srun and
    /// slurmstepd: `SLURM_SPANK__SLURM_SPANK_OPTION_<plugin>_<name, '-' as '_'>`.
    pub fn option_job_env(&self) -> String {
        let name = self.name.to_string_lossy().replace('-', "_");
        format!("SLURM_SPANK__SLURM_SPANK_OPTION_{PLUGIN_NAME}_{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::is_private_env;
    use crate::argv::agent_argv_prefix;
    use crate::config::UserOptions;
    use crate::request::{job_env_name, BatchRequest};
    use crate::submit::{self, Refusal};
    use std::ffi::{OsStr, OsString};

    /// Per option, in table order: a value sbatch takes and the agent's argv for it; a value
    /// sbatch refuses and the reason it prints (after "htc: --NAME=VALUE: ").
    const CASES: &[(&str, &str, [&str; 2], &str, &str)] = &[
        ("htc", "/home/u/t.txt", ["--task-file", "/home/u/t.txt"], "", "--htc needs a task file: --htc=FILE"),
        ("htc-retries", " 3 ", ["--retries", "3"], "101", "'101' is not a whole number from 0 to 100"),
        ("htc-fanout", "16", ["--fanout", "16"], "1", "'1' is not a whole number from 2 to 1024"),
        (
            "htc-output",
            "per-task",
            ["--output", "per-task"],
            "files",
            "'files' is not an output mode (streams, per-task or none)",
        ),
        (
            "htc-partition",
            " even ",
            ["--partition", "even"],
            "fluxp",
            "'fluxp' is not a partition plan (hflow or even)",
        ),
        ("htc-agents-per-node", "24", ["--agents-per-node", "24"], "0", "'0' is not a whole number from 1 to 4096"),
        (
            "htc-instance-nodes",
            "8",
            ["--instance-nodes", "8"],
            "65537",
            "'65537' is not a whole number from 1 to 65536",
        ),
        ("htc-max-fails", "5", ["--max-fails", "5"], "0", "'0' is not a whole number from 1 to 4294967295"),
        ("htc-resume", "4711", ["--resume-run", "4711"], "../x", "'../x' is not a job id"),
        ("htc-resubmit", "2", ["--resubmit", "2"], "101", "'101' is not a whole number from 1 to 100"),
        ("htc-grow", "2:2:1-00:30", ["--grow", "2:2:1470"], "0", "'0' is not a number of jobs (1 to 1000)"),
        ("htc-keep-nodes", "", ["--keep-nodes", "yes"], "always", "'always' is neither yes nor no"),
        ("htc-open", "2h", ["--open", "7200000ms"], "soon", "'soon' is not a duration like 90s, 30m, 2h (0: never)"),
        ("htc-join", "/home/u/.htc/9", ["--join-run", "/home/u/.htc/9"], "0", "'0' is not a job id"),
    ];

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    /// The options as sbatch keeps them after its checks (for a task file and a run, the
    /// checks' results are given here).
    fn accepted(given: &[(usize, &str)]) -> UserOptions {
        let mut o = UserOptions::new();
        for &(i, text) in given {
            o.set(i, Some(OPTIONS[i].kind.parse(OsStr::new(text)).unwrap()));
        }
        o
    }

    #[test]
    fn every_option_has_a_case() {
        let names: Vec<String> = OPTIONS.iter().map(|o| o.name.to_string_lossy().into_owned()).collect();
        assert_eq!(names, CASES.iter().map(|c| c.0).collect::<Vec<_>>());
    }

    #[test]
    fn accepted_values_reach_the_agent() {
        let agent = PluginConfig::default().agent.into_os_string();
        for &(name, good, piece, _, _) in CASES {
            let i = by_name(name).unwrap();
            let def = &OPTIONS[i];
            // A setting goes with the mode it is allowed in; an activator alone.
            let mode = def.activates().unwrap_or(if def.goes_with(Mode::Run) { Mode::Run } else { Mode::Join });
            let mut given = vec![(i, good)];
            if def.activates().is_none() {
                given.insert(0, (activator(Mode::Run), "/t"));
            }
            let opts = accepted(&given);
            assert!(opts.orphans().is_empty() && opts.join_conflicts().is_empty(), "{name}");
            let req = BatchRequest::from_allocator(&opts).unwrap().unwrap();
            assert_eq!(req.mode, mode);
            let argv = agent_argv_prefix(&PluginConfig::default(), &req);
            let at = if def.activates().is_some() { 2 } else { 4 };
            assert_eq!(argv[..2], [agent.clone(), "lead".into()], "{name}");
            assert_eq!(argv[at..at + 2], os(&piece), "{name}: {argv:?}");
            assert_eq!(argv.len(), at + 3, "{name}: {argv:?}");
            // sbatch stores the value as the agent gets it, and the batch step reads it back.
            let vars = req.job_control_vars();
            assert_eq!(vars.last().unwrap(), &(def.job_control, OsString::from(piece[1])), "{name}");
            let env: Vec<(String, OsString)> = vars.iter().map(|(n, v)| (job_env_name(n), v.clone())).collect();
            let back = BatchRequest::from_job_env(|n| env.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone()));
            assert_eq!(back, Ok(Some(req)), "{name}");
        }
    }

    #[test]
    fn refused_values_say_why() {
        for &(name, _, _, bad, error) in CASES {
            let def = &OPTIONS[by_name(name).unwrap()];
            let refusal = match def.kind.parse(OsStr::new(bad)) {
                Err(e) => Refusal::Value(e),
                // A task file is refused by its check, with messages of their own.
                Ok(v) => submit::check(def.kind, v).unwrap_err(),
            };
            let want = match def.kind {
                crate::value::Kind::TaskFile => Refusal::Lines(vec![error.to_string()]),
                _ => Refusal::Value(error.to_string()),
            };
            assert_eq!(refusal, want, "{name}={bad}");
            // The batch step refuses a corrupt job-control variable with the same reason.
            if def.activates().is_none() {
                let var = job_env_name(def.job_control);
                let back = BatchRequest::from_job_env(|n| match n {
                    "SLURM_SPANK_HTC_FILE" => Some("/t".into()),
                    _ if n == var => Some(bad.into()),
                    _ => None,
                });
                assert_eq!(back, Err(format!("{var}: {error}")), "{name}");
            }
        }
    }

    #[test]
    fn settings_with_join_are_passed_or_refused() {
        let join = activator(Mode::Join);
        for &(name, good, piece, _, _) in CASES {
            let i = by_name(name).unwrap();
            let Role::Setting(with_join) = OPTIONS[i].role else { continue };
            let opts = accepted(&[(join, "/r/9"), (i, good)]);
            match with_join {
                WithJoin::Passed => {
                    let req = BatchRequest::from_allocator(&opts).unwrap().unwrap();
                    let argv = agent_argv_prefix(&PluginConfig::default(), &req);
                    assert_eq!(argv[2..], os(&["--join-run", "/r/9", piece[0], piece[1], "--script"]), "{name}");
                }
                WithJoin::Refused(why) => {
                    let e = format!("--{name} cannot be used with --htc-join ({why})");
                    assert_eq!(opts.join_conflicts(), vec![e.clone()]);
                    assert_eq!(BatchRequest::from_allocator(&opts), Err(vec![e]));
                }
            }
        }
    }

    /// README.md documents the agent's argv contract: the table must keep its flag order.
    #[test]
    fn argv_order_is_the_documented_one() {
        let readme = include_str!("../README.md");
        for mode in [Mode::Run, Mode::Join] {
            let first = OPTIONS[activator(mode)].agent_flag;
            let line = readme
                .lines()
                .find(|l| l.trim_start().starts_with(&format!("AGENT lead {first} ")))
                .unwrap_or_else(|| panic!("README.md has no `AGENT lead {first}` line"));
            let documented: Vec<&str> = line.split([' ', '[', ']']).filter(|w| w.starts_with("--")).collect();
            let mut table = vec![first];
            table.extend(OPTIONS.iter().filter(|o| o.goes_with(mode)).map(|o| o.agent_flag));
            table.extend(["--ledger-dir", "--script"]);
            assert_eq!(documented, table, "{mode:?}");
        }
    }

    #[test]
    fn entries_are_consistent() {
        for (i, def) in OPTIONS.iter().enumerate() {
            let name = def.name.to_str().unwrap();
            assert!(name == PLUGIN_NAME || name.starts_with("htc-"), "{name}");
            assert!(name.bytes().all(|b| b.is_ascii_lowercase() || b == b'-'), "{name}");
            assert_eq!(from_val(val(i)), Some(i));
            assert_eq!(by_name(name), Some(i));
            assert!(def.job_control.starts_with("HTC_") && def.agent_flag.starts_with("--"), "{name}");
            // What the plugin must keep from the agent (and from everything it starts).
            assert!(is_private_env(def.option_job_env().as_bytes()), "{name}");
            assert!(is_private_env(job_env_name(def.job_control).as_bytes()), "{name}");
            if matches!(def.role, Role::Setting(_)) {
                assert!(def.usage.to_str().unwrap().starts_with("With --htc: "), "{name}");
            }
            // A range the help states is the one the value is held to.
            if let crate::value::Kind::Number { min, max } = def.kind {
                let help = def.usage.to_str().unwrap();
                if help.contains(&format!("({min}-")) {
                    assert!(help.contains(&format!("({min}-{max}")), "{name}: {help}");
                }
            }
            for other in &OPTIONS[i + 1..] {
                assert!(def.name != other.name && def.job_control != other.job_control, "{name}");
                assert_ne!(def.agent_flag, other.agent_flag, "{name}");
            }
        }
        assert_eq!(from_val(0), None);
        assert_eq!(from_val(val(COUNT)), None);
        assert_eq!(from_val(-1), None);
        for mode in [Mode::Run, Mode::Join] {
            assert_eq!(OPTIONS.iter().filter(|o| o.activates() == Some(mode)).count(), 1);
        }
        assert_eq!(OPTIONS[activator(Mode::Run)].option_job_env(), "SLURM_SPANK__SLURM_SPANK_OPTION_htc_htc");
        assert_eq!(OPTIONS[activator(Mode::Join)].option_job_env(), "SLURM_SPANK__SLURM_SPANK_OPTION_htc_htc_join");
    }
}
