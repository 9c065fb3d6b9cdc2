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
            Role::Setting(_) => None,
        }
    }

    /// Whether a job of `mode` hands this setting to its agent (never for an activator, which
    /// the agent gets first, on its own).
    pub fn goes_with(&self, mode: Mode) -> bool {
        match (self.role, mode) {
            (Role::Activates(_), _) => false,
            (Role::Setting(_), Mode::Run) => true,
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
