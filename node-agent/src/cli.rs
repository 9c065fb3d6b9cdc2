//! The command lines of `htc` and `htc-agent`. They live in the library, not in the binaries, so
//! that the man pages are generated from the very definitions the binaries parse with
//! (`packaging/mangen`), and cannot drift from them.

/// `htc`: the user's command.
pub mod htc {
    use std::path::PathBuf;

    use clap::{Parser, Subcommand};

    use htc_core::partition::Plan;

    use crate::simexec::ExecKind;
    use htc_core::output::OutputMode;

    #[derive(Parser)]
    #[command(
        name = "htc",
        version,
        about = "Run many small tasks fast: locally, or inside one Slurm allocation (sbatch --htc)"
    )]
    pub struct Cli {
        #[command(subcommand)]
        pub cmd: Cmd,
    }

    #[derive(Subcommand)]
    pub enum Cmd {
        /// Run a task file on this machine (one task per line; see docs/task-file.md).
        Run(RunArgs),
        /// Load a task file into a new run without starting it (start it with `htc run --resume RUN`).
        Prepare {
            file: PathBuf,
            #[arg(long, default_value = "streams")]
            output: OutputMode,
        },
        /// Submit a task file to Slurm: `sbatch --htc=FILE [SBATCH OPTIONS]` with a batch script that
        /// runs only where the plugin is not loaded, and fails the job saying so.
        Submit {
            file: PathBuf,
            /// Options passed to sbatch as they are (e.g. -N 4 -t 1:00:00).
            #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
            sbatch: Vec<std::ffi::OsString>,
        },
        /// Submit a new Slurm job that continues the run of an earlier one (cancelled, timed out,
        /// its leader lost): only its unfinished tasks run; `htc status` and `htc output` work
        /// with either job id. Run it in the directory the first job was submitted from.
        Resume {
            /// The earlier job's id.
            job: String,
            /// Options passed to sbatch as they are (default: -N as many nodes as before).
            #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
            sbatch: Vec<std::ffi::OsString>,
        },
        /// Write a report of a run: one self-contained HTML page (figures, cores busy over time
        /// for the job and per node, tasks per second, runtimes per class, failures by reason,
        /// nodes) and each chart as an SVG file.
        Report {
            /// A run directory or id, or a Slurm job id (default: the newest in ./.htc).
            run: Option<String>,
            /// Directory to write into (default: htc-report-RUN in the current directory).
            #[arg(long, short)]
            output: Option<PathBuf>,
        },
        /// Run finished tasks of a run again, as new attempts of the same run (the rest stays
        /// done): locally through `htc run --resume`, for a Slurm job as a new job (`htc resume`).
        Retry {
            /// A run directory or id, or a Slurm job id.
            run: String,
            /// Every task that failed.
            #[arg(long, required_unless_present = "tasks")]
            failed: bool,
            /// These tasks, e.g. 5,17-20 (done or failed ones; unfinished ones run anyway).
            #[arg(long, value_name = "IDS")]
            tasks: Option<String>,
            /// Retries of each task in this round (default 0: one more attempt each).
            #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=100))]
            retries: u8,
            /// Options for `htc run --resume` (a local run, e.g. --agents 4) or for sbatch (a
            /// Slurm job; default: as many nodes as before), after `--`.
            #[arg(last = true, allow_hyphen_values = true)]
            args: Vec<std::ffi::OsString>,
        },
        /// Check a task file: counts, classes and the first errors with file:line:column.
        Check {
            file: PathBuf,
            /// Most errors to list.
            #[arg(long, default_value_t = 20)]
            max_errors: usize,
        },
        /// Progress of a run: counts by state, rate, ETA and failed tasks.
        Status {
            /// A run directory or id (default: the newest in ./.htc).
            run: Option<String>,
            /// Most failed tasks to list.
            #[arg(long, default_value_t = 20)]
            failures: usize,
            /// One JSON object instead of text (fields in docs/status-json.md).
            #[arg(long)]
            json: bool,
        },
        /// A live dashboard of a run (progress, rate, ETA, every node, recent failures); for a
        /// Slurm job, from the directory it was submitted from. q quits.
        Watch {
            /// A run directory or id, or a Slurm job id (default: the newest in ./.htc).
            run: Option<String>,
            /// Seconds between refreshes.
            #[arg(long, default_value_t = 1.0)]
            interval: f64,
        },
        /// Read a run's whole ledger and say which tasks it can still vouch for (after a crash,
        /// a full disk or damaged storage). Exit status 0 when intact, 1 when damaged.
        Verify {
            /// A run directory or id (default: the newest in ./.htc).
            run: Option<String>,
        },
        /// Measure what starting an agent and dispatching a task cost here (HFlow's s and d) and
        /// write them to the site file that plans partitions (docs/site-config.md).
        Calibrate {
            /// Where to write (default: ~/.config/htc/site.conf; an admin: /etc/slurm-htc/site.conf).
            #[arg(long, short)]
            output: Option<PathBuf>,
            /// Tasks per measurement run.
            #[arg(long, default_value_t = 20_000)]
            tasks: u64,
            /// Print the file instead of writing it.
            #[arg(long)]
            dry_run: bool,
        },
        /// Tasks of an open run (`htc run --open`): add, see, cancel.
        Task {
            #[command(subcommand)]
            cmd: TaskCmd,
        },
        /// Close an open run: it takes no more tasks, and ends once what it holds is done.
        Close {
            /// A run directory or id.
            run: String,
            /// Cancel what it holds that is not finished, too.
            #[arg(long)]
            cancel: bool,
        },
        /// Predict a run on a machine that is not there: the real leader and agent logic on a
        /// virtual clock, tasks lasting their `runtime` hints (default 1 s, or the site's).
        Simulate(SimulateArgs),
        /// Print task output: one task's, or every task's in task order (its last attempt's);
        /// stdout to stdout, stderr to stderr.
        Output {
            /// A run directory or id, or a Slurm job id.
            run: String,
            /// The task id (1 = the first task of the file); none: every task.
            task: Option<u64>,
            /// Only stdout.
            #[arg(long, conflicts_with = "stderr")]
            stdout: bool,
            /// Only stderr.
            #[arg(long)]
            stderr: bool,
            /// Every task: prefix each line with the task id and a tab (as parallel --tag).
            #[arg(long, conflicts_with = "task")]
            tag: bool,
            /// Every task: only the tasks that failed.
            #[arg(long, conflicts_with = "task")]
            failed: bool,
        },
        /// One row per attempt (task id, host, start, runtime, exit value, signal, command): a
        /// TSV with the columns of GNU parallel's --joblog, or JSON lines with the attempt too.
        Log {
            /// A run directory or id, or a Slurm job id (default: the newest in ./.htc).
            run: Option<String>,
            /// tsv or json.
            #[arg(long, default_value = "tsv")]
            format: crate::joblog::Format,
        },
    }

    #[derive(clap::Args, Debug)]
    pub struct SimulateArgs {
        pub file: PathBuf,
        /// Agents (nodes) to simulate.
        #[arg(long, default_value_t = 1000)]
        pub agents: u32,
        /// Cores per agent.
        #[arg(long, default_value_t = 24)]
        pub cores_per_agent: u32,
        /// Agents per 2nd-level instance (its head takes work for all; default 1).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        pub instance_agents: u32,
        /// Heads per parent: more form a tree of relays, as in `htc run` (default: every head
        /// talks to the leader).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        pub fanout: Option<u32>,
        /// hflow or even (default: the site file's, else hflow).
        #[arg(long)]
        pub partition: Option<Plan>,
        /// One-way network latency per frame, microseconds (assumed, not measured).
        #[arg(long, default_value_t = 100)]
        pub latency_us: u64,
        /// Leader CPU per report it handles, microseconds (default: the site's, which `htc
        /// calibrate` measures).
        #[arg(long)]
        pub leader_us_per_report: Option<f64>,
        /// Leader CPU per task, microseconds, on top of its report's (default: the site's).
        #[arg(long)]
        pub leader_us_per_task: Option<f64>,
        /// Agents join one after another over this many milliseconds.
        #[arg(long, default_value_t = 0)]
        pub join_spread_ms: u64,
        /// Tasks last their runtime hints, but the run never sees them: what a run of the same
        /// file without hints would do (write the hints for the simulation only).
        #[arg(long)]
        pub hide_hints: bool,
        /// Memory each agent has for tasks, MiB (tasks' `mem=` are committed against it;
        /// 0: not accounted).
        #[arg(long, default_value_t = 0, value_name = "MB")]
        pub mem_per_agent: u64,
        /// GPUs each agent has for tasks that ask for them (`gpus=`).
        #[arg(long, default_value_t = 0)]
        pub gpus_per_agent: u32,
        /// A fault at a virtual time (repeatable): `lose:AGENT@SECONDS` (its node dies),
        /// `stop:AGENT@SECONDS+SECONDS` (the agent is stopped that long, as by SIGSTOP),
        /// `cut:AGENT@SECONDS+SECONDS` (its link to its parent breaks; it can reconnect after
        /// the second time) or `slow:AGENT@SECONDS*FACTOR` (tasks that start on it from then
        /// on take FACTOR times their runtime).
        #[arg(long = "fault", value_name = "FAULT")]
        pub faults: Vec<crate::simulate::Fault>,
        /// Print a JSON object instead of text.
        #[arg(long)]
        pub json: bool,
    }

    #[derive(Subcommand, Debug)]
    pub enum TaskCmd {
        /// Add a task (`-- CMD ARGS…`) or a task file's lines (`--file F`, `-` for stdin, added
        /// as they come) to an open run; prints each new task's id on a line of its own.
        Add(Box<TaskAddArgs>),
        /// The state of tasks, a line each: id, state (waiting, blocked, running, done,
        /// failed, cancelled; damaged for a task whose ledger record cannot be vouched for, and
        /// then exit 3), exit value, reason. Read from the run's ledger.
        Status {
            /// A run directory or id.
            run: String,
            /// Task ids and ranges (5 17-20); none with --all.
            ids: Vec<String>,
            /// Every task of the run.
            #[arg(long, conflicts_with = "ids")]
            all: bool,
            /// tsv (id, state, exit value, reason; tab-separated), json (one object per line), or
            /// word (`success`, `failed` or `running`, a line each: a status command for
            /// Snakemake's cluster-generic executor and tools like it).
            #[arg(long, default_value = "tsv", value_name = "tsv|json|word")]
            format: String,
        },
        /// Why tasks are where they are: running, held by an agent, or what they wait for
        /// (other tasks, room no agent has free and the most any has, a reservation, the time
        /// limit, a preemption, an agent big enough). Asked of the run's leader; without one,
        /// what the ledger tells. Exit 2 for an unknown task.
        Explain {
            /// A run directory or id.
            run: String,
            /// Task ids and ranges (5 17-20).
            #[arg(required = true)]
            ids: Vec<String>,
            /// tsv (id, state, why; tab-separated) or json (one object per line: kind, why, and
            /// the data: ids waited for, ask and room, agent).
            #[arg(long, default_value = "tsv", value_name = "tsv|json")]
            format: String,
        },
        /// Wait until tasks have ended: exit 0 when every one succeeded, 1 when one failed or
        /// was cancelled, 2 for an unknown task, 3 for a damaged one, 124 at --timeout.
        Wait {
            /// A run directory or id.
            run: String,
            /// Task ids and ranges (5 17-20); none with --all.
            ids: Vec<String>,
            /// Every task of the run.
            #[arg(long, conflicts_with = "ids")]
            all: bool,
            /// Until any one of them has ended (its success decides the exit status).
            #[arg(long)]
            any: bool,
            /// Give up after this long (e.g. 90s, 10m).
            #[arg(long, value_name = "DURATION", value_parser = super::duration_ms)]
            timeout: Option<u64>,
        },
        /// Cancel tasks of an open run: what is queued never starts, what runs is stopped;
        /// recorded as cancelled (no retry).
        Cancel {
            /// A run directory or id.
            run: String,
            /// Task ids and ranges (5 17-20).
            #[arg(required = true)]
            ids: Vec<String>,
        },
    }

    #[derive(clap::Args, Debug)]
    pub struct TaskAddArgs {
        /// A run directory or id.
        pub run: String,
        /// Add every line of this task file (the task file's syntax), `-` for stdin.
        #[arg(long, value_name = "F", conflicts_with = "command")]
        pub file: Option<PathBuf>,
        /// Cores, as `cores=` (4; or growing from attempt to attempt: 2*2, 2/4/16).
        #[arg(long)]
        pub cores: Option<String>,
        /// Memory, as `mem=` (512M, 4G; or growing: 4G*2, 4G+2G, 4G/8G/32G).
        #[arg(long)]
        pub mem: Option<String>,
        #[arg(long)]
        pub gpus: Option<u32>,
        /// Wall-clock limit, as `timeout=` (90s, 10m; or growing: 10m*2).
        #[arg(long)]
        pub timeout: Option<String>,
        #[arg(long)]
        pub retries: Option<u8>,
        /// The failed ends that are retried, as `retry_on=` (oom/timeout/signal/stuck/104/130-145).
        #[arg(long, value_name = "ENDS")]
        pub retry_on: Option<String>,
        /// Killed as stuck after this long with almost no CPU and no I/O, as `stuck=` (30m).
        #[arg(long, value_name = "DURATION")]
        pub stuck: Option<String>,
        #[arg(long, allow_hyphen_values = true)]
        pub priority: Option<i16>,
        /// Start once these tasks succeeded (ids and ranges: 3,7-9).
        #[arg(long, value_name = "IDS")]
        pub after: Option<String>,
        /// Start once these tasks ended, however.
        #[arg(long, value_name = "IDS")]
        pub afterany: Option<String>,
        /// Run the task in this directory (default: the run's, where `htc run` started). It
        /// must exist; a relative one is taken from where this command runs.
        #[arg(long, value_name = "DIR")]
        pub cwd: Option<PathBuf>,
        /// Set this variable for the task (repeatable); the task otherwise sees the run's
        /// environment, as every task of the run does.
        #[arg(long, value_name = "NAME=VALUE")]
        pub env: Vec<String>,
        /// Send variables of this shell's environment with the task, as `sbatch --export`:
        /// `ALL` (all of them but `SLURM_*` and `HTC_*`, which belong to where the task runs)
        /// or names (`PATH,OMP_NUM_THREADS`). Default: none; the task sees the run's.
        #[arg(long, value_name = "ALL|NAMES")]
        pub export: Option<String>,
        /// Add the task once: adding again under the same key (a client that retries) gives
        /// the same id.
        #[arg(long)]
        pub key: Option<String>,
        /// A name for the task, shown by `htc task status` (up to 255 bytes, no control
        /// characters). Names need not be unique.
        #[arg(long)]
        pub name: Option<String>,
        /// The command and its arguments, after `--`.
        #[arg(last = true)]
        pub command: Vec<std::ffi::OsString>,
    }

    #[derive(clap::Args, Debug)]
    pub struct RunArgs {
        /// The task file. Not needed with --resume, nor with --open (tasks may all come later).
        pub file: Option<PathBuf>,
        /// An open run: it takes tasks while it runs (`htc task add RUN`), and does not end when
        /// its tasks are done, but on `htc close RUN` or after --idle-exit with nothing to do.
        /// Its id is printed on stdout (one line) once its leader listens.
        #[arg(long)]
        pub open: bool,
        /// With --open: end after this long with nothing to do (e.g. 30m, 2h; 0: never).
        #[arg(long, value_name = "DURATION", requires = "open", default_value = "30m", value_parser = super::duration_ms)]
        pub idle_exit: u64,
        /// Continue an interrupted run (a run directory or id; default: the newest in ./.htc).
        #[arg(long, value_name = "RUN", num_args = 0..=1, default_missing_value = "")]
        pub resume: Option<String>,
        /// Join a running run (a run directory or id) with this command's agents, instead of
        /// starting one: they take a share of its remaining tasks until it ends, or until
        /// --time-limit when they hand back what they hold and leave.
        #[arg(long, value_name = "RUN", conflicts_with_all = ["file", "resume"])]
        pub join: Option<String>,
        /// Number of node agents (processes) to start. Default: one, with every CPU and a
        /// spawn loop per CPU (see --spawners).
        #[arg(long, value_parser = super::positive)]
        pub agents: Option<usize>,
        /// Cores (task slots) per agent; default: this machine's CPUs divided among the agents.
        #[arg(long, value_parser = super::positive)]
        pub cores_per_agent: Option<usize>,
        /// Spawn loops (executor threads) per agent, splitting its cores. Default (0): one per
        /// core, and beside them one for tasks that need several cores, which borrows the loops
        /// of as many cores while it runs them (open runs too: a task added later may need them).
        #[arg(long)]
        pub spawners: Option<usize>,
        /// Tree fan-out: agents per parent; more agents than this form a tree of relays.
        #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..))]
        pub fanout: u32,
        /// Agents per 2nd-level instance: the first of each group (its head) takes work from
        /// the leader for all of them and hands it out (default 1: every agent an instance).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        pub instance_agents: u32,
        /// Task output: streams (per-slot files + index), per-task (one file each), none.
        #[arg(long, default_value = "streams")]
        pub output: OutputMode,
        /// Default retries for tasks that set none (the file's own `#HTC retries=` wins).
        #[arg(long, value_parser = clap::value_parser!(u8).range(0..=100))]
        pub retries: Option<u8>,
        /// Fail fast: once N tasks have failed for good, start nothing more, let what runs
        /// end, and stop (resumable).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        pub max_fails: Option<u64>,
        /// Start no task whose `runtime` hint would not end within this many seconds from
        /// the start; when only such tasks are left, stop (resumable).
        #[arg(long, value_name = "SECS")]
        pub time_limit: Option<u64>,
        /// No progress line and no summary.
        #[arg(long, short)]
        pub quiet: bool,
        /// Memory each agent hands out to tasks that declare `mem=` (e.g. 4G; 0: memory is
        /// not accounted). Default: what the machine has available, shared by the agents.
        #[arg(long, value_name = "SIZE", value_parser = super::parse_size_mb)]
        pub mem_per_agent: Option<u64>,
        /// How memory decides what starts: backfill (a task that waits keeps a node, smaller
        /// ones fill around it without delaying it), fcfs (strict order), ignore.
        #[arg(long, default_value = "backfill", value_name = "backfill|fcfs|ignore")]
        pub mem_policy: htc_core::backfill::Policy,
        /// The GPUs tasks may be given (`gpus=`), e.g. 0,1,2,3, shared by the agents; for
        /// testing without GPUs too. Default: CUDA_VISIBLE_DEVICES, else nvidia-smi.
        #[arg(long, value_name = "LIST", value_parser = super::gpu_list)]
        pub gpus: Option<String>,
        /// How a task's `mem=` is enforced: auto (a memory cgroup per slot where the agents
        /// may make them, else watching the resident memory), cgroup (required), watch.
        #[arg(long, default_value = "auto", value_name = "auto|cgroup|watch")]
        pub mem_limit: crate::memcg::Enforce,
        /// No agent takes work from another's share, even when idle (for measuring what
        /// balancing gains: bench/balance.sh).
        #[arg(long, hide = true)]
        pub no_steal: bool,
        /// How agents run tasks: real processes, or a simulation of the scheduling path alone
        /// (none: every task succeeds at once; sleep: after its `runtime` hint, on its cores).
        #[arg(long, default_value = "real")]
        pub exec: ExecKind,
        /// How tasks are split among agents: hflow (each runtime class on its own, longest
        /// first) or even (one even split of the file). Default: the site file's, else hflow.
        #[arg(long, value_name = "hflow|even")]
        pub partition: Option<Plan>,
        /// Group-commit interval of the ledger, in milliseconds.
        #[arg(long, default_value_t = 10, hide = true)]
        pub commit_ms: u64,
        /// Keep the ledger in this node-local directory (e.g. /tmp when the current directory
        /// is on NFS), with its replica in the run directory; a resume rebuilds it from there.
        #[arg(long, value_name = "DIR")]
        pub ledger_dir: Option<PathBuf>,
        /// Leave what a task starts outside its process group (setsid, a double-forked
        /// daemon) running after the task ends, until the agent ends; by default it is killed
        /// with its task. Under Slurm: HTC_KEEP_DAEMONS=1 in the job's environment.
        #[arg(long)]
        pub keep_daemons: bool,
        /// Run in the background: print the run's id once its leader listens, and exit
        /// (`RUN=$(htc run --open --detach)`); the leader's stderr goes to RUN/leader.err.
        #[arg(long)]
        pub detach: bool,
    }
}

/// `htc-agent`: the daemon roles, started by `htc` or by the Slurm plugin.
pub mod agent {
    use std::path::PathBuf;

    use clap::{Parser, Subcommand};

    use htc_core::output::OutputMode;

    pub use crate::work_args::{WorkArgs, DEFAULT_FANOUT};

    #[derive(Parser)]
    #[command(
        name = "htc-agent",
        version,
        about = "slurm-htc agent (started by htc or by the Slurm plugin, not by hand)"
    )]
    pub struct Cli {
        #[command(subcommand)]
        pub cmd: Cmd,
    }

    #[derive(Subcommand)]
    pub enum Cmd {
        /// Lead an HTC job from its batch step: `lead [OPTIONS] --script SCRIPT [ARGS...]`.
        Lead(LeadArgs),
        /// Run tasks for a leader.
        Work(WorkArgs),
    }

    #[derive(clap::Args, Clone)]
    pub struct LeadArgs {
        /// The task file (absolute; checked at submit time by the plugin). Not needed for an
        /// open run (`--open`), whose tasks may all come later.
        #[arg(long, required_unless_present_any = ["join_run", "open", "resume_run"])]
        pub task_file: Option<PathBuf>,
        /// Join this running run (`--htc-join`: its run directory, or the job id of one in
        /// `.htc/` here) with this job's nodes, instead of leading a run: its agents take a
        /// share of the run's remaining tasks.
        #[arg(long, value_name = "RUN", conflicts_with_all = ["task_file", "resume_run"])]
        pub join_run: Option<PathBuf>,
        /// Default retries for tasks that set none.
        #[arg(long, value_parser = clap::value_parser!(u8).range(0..=100))]
        pub retries: Option<u8>,
        /// Tree fan-out (agents per parent).
        #[arg(long)]
        pub fanout: Option<u32>,
        #[arg(long, default_value = "streams")]
        pub output: OutputMode,
        /// Node-local directory for the ledger (admin setting; default: $TMPDIR, else /tmp).
        /// The run directory keeps its replica.
        #[arg(long)]
        pub ledger_dir: Option<PathBuf>,
        /// How tasks are split among agents (hflow or even; default: the site file's, else hflow).
        #[arg(long)]
        pub partition: Option<htc_core::partition::Plan>,
        /// Agents on each node, splitting its CPUs (default 1: one agent runs a spawn loop per
        /// CPU).
        #[arg(long)]
        pub agents_per_node: Option<usize>,
        /// Nodes per 2nd-level instance (default 1: every node's agents are instances of their
        /// own); an instance's head takes work for all of its agents.
        #[arg(long)]
        pub instance_nodes: Option<usize>,
        /// Fail fast: start nothing more once this many tasks failed for good.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        pub max_fails: Option<u64>,
        /// Continue the run of this earlier job (its unfinished tasks) instead of a new run.
        #[arg(long, value_name = "JOBID")]
        pub resume_run: Option<u32>,
        /// When the job ends at its time limit or loses every agent with tasks unfinished,
        /// submit the job that continues the run; at most this many times for the run.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100))]
        pub resubmit: Option<u32>,
        /// A run that grows itself: while the work left is more than its jobs can do in their
        /// time, submit up to MAX_JOBS jobs of NODES nodes for TIME that join it.
        #[arg(long, value_name = "MAX_JOBS[:NODES[:TIME]]", value_parser = htc_core::grow::GrowSpec::parse)]
        pub grow: Option<htc_core::grow::GrowSpec>,
        /// An open run (`--htc-open`): it takes tasks while it runs and ends on `htc close`, or
        /// after this long with nothing to do (0: never). A run that continues keeps what its
        /// ledger says.
        #[arg(long, value_name = "IDLE", value_parser = super::duration_ms, conflicts_with = "join_run")]
        pub open: Option<u64>,
        /// Keep every node to the end (`--htc-keep-nodes`), or (`no`) give back, once all that
        /// is left runs, the nodes whose agents hold nothing (an open run's after 30 s idle).
        /// Without it: given back on Slurm 24.11 and later (`slurm::GIVES_BACK_FROM`).
        #[arg(long, value_name = "yes|no", num_args = 0..=1, default_missing_value = "yes", value_parser = super::yes_no)]
        pub keep_nodes: Option<bool>,
    }
}

fn yes_no(s: &str) -> Result<bool, String> {
    match s {
        "yes" => Ok(true),
        "no" => Ok(false),
        _ => Err(format!("'{s}' is neither yes nor no")),
    }
}

/// A size as task files write it (`512M`, `4G`), in MiB; `0` is allowed.
/// A count of at least one.
fn positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// `--gpus`: device indexes (`0,1`) or device UUIDs (`GPU-…`, `MIG-…`), comma-separated, or
/// empty for none.
fn gpu_list(s: &str) -> Result<String, String> {
    for id in s.split(',').map(str::trim).filter(|id| !id.is_empty()) {
        let uuid = ["GPU-", "MIG-"].iter().any(|p| id.starts_with(p))
            && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !uuid && !id.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("'{id}' is not a device index (0, 1, …) or a device UUID (GPU-…)"));
        }
    }
    Ok(s.to_string())
}

/// A duration as task files write them (`90s`, `30m`, `2h`, `1h30m`; a bare number is seconds).
fn duration_ms(s: &str) -> Result<u64, String> {
    htc_core::taskfile::parse_duration_ms(s)
        .map(u64::from)
        .ok_or_else(|| format!("'{s}' is not a duration like 90s, 30m, 2h"))
}

fn parse_size_mb(s: &str) -> Result<u64, String> {
    if s.trim() == "0" {
        return Ok(0);
    }
    htc_core::taskfile::parse_mem_mb(s).map(u64::from).ok_or_else(|| format!("'{s}' is not a size like 512M or 4G"))
}

#[cfg(test)]
mod tests {
    use super::agent::{Cli, Cmd, WorkArgs};
    use crate::simexec::ExecKind;
    use clap::Parser;
    use htc_core::output::OutputMode;

    fn round_trip(w: &WorkArgs) -> WorkArgs {
        let mut argv: Vec<std::ffi::OsString> = vec!["htc-agent".into()];
        argv.extend(w.argv());
        match Cli::try_parse_from(argv).expect("the launchers' argv parses").cmd {
            Cmd::Work(back) => back,
            Cmd::Lead(_) => panic!("parsed as lead"),
        }
    }

    #[test]
    fn the_agent_command_line_written_by_the_launchers_parses_back_to_the_same_arguments() {
        let local = WorkArgs {
            leader: "127.0.0.1:4711".parse().unwrap(),
            run_dir: "/tmp/run dir/x".into(),
            agent_id: 3,
            slurm: false,
            slots: Some(4),
            cpus: "0,1,2,3".into(),
            mem_mb: Some(512),
            gpus: Some("0,1".into()),
            mem_limit: crate::memcg::Enforce::Cgroup,
            output: OutputMode::PerTask,
            fanout: 8,
            agents: 16,
            first_agent: 12,
            count: 2,
            exec: ExecKind::Sleep,
            spawners: 0,
            instance_size: 4,
            lost_after_ms: 2500,
            keep_daemons: true,
            await_leader_s: 0,
        };
        assert_eq!(round_trip(&local), local);
        let slurm = WorkArgs {
            slurm: true,
            slots: None,
            cpus: String::new(),
            count: 1,
            exec: ExecKind::Real,
            spawners: 3,
            keep_daemons: false,
            await_leader_s: 60,
            ..local
        };
        assert_eq!(round_trip(&slurm), slurm);
    }
}
