//! `htc-agent`: the daemon roles. `lead` is the leader in a Slurm batch step (started by the SPANK
//! plugin in place of the batch script); `work` is a node agent (started by `htc run` locally, or
//! by the leader's one `srun` step on every node: `htc_node::work`).
//!
//! What a job does in a run that spans allocations (join, keep or let go, wait for a new leader,
//! take over, leave near its time limit, resubmit) is `htc_engine::lifecycle`'s machine; `Driver`
//! below carries out its effects.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use htc::cli::agent::{Cli, Cmd, LeadArgs, DEFAULT_FANOUT};
use htc::leader::{self, LeaderConfig};
use htc::liveness::Liveness;
use htc::load::{self, CreateError};
use htc::rundir::{now_us, RunDir, RunLock};
use htc::{prologue, slurm};
use htc_core::hflow::Params;
use htc_core::taskfile::TaskShape;
use htc_core::tree::Tree;
use htc_engine::lifecycle::{self, Carrier, Effect, Exit, Input, Job, Life, Report, SessionEnd};
use htc_node::continuation::{self, adopt, is_complete, release_node_local};
use htc_node::joined::{Shape, Stay, Survivors};
use htc_node::submit;

fn main() -> ExitCode {
    // `--script` ends the options: what follows is the batch step's own argv, verbatim.
    let mut argv: Vec<OsString> = std::env::args_os().collect();
    let script: Vec<OsString> = match argv.iter().position(|a| a == "--script") {
        Some(i) => argv.split_off(i).into_iter().skip(1).collect(),
        None => Vec::new(),
    };
    let cli = Cli::parse_from(argv);
    // The leader's stderr is the job's output file: only what the user should read goes there.
    htc::init_logging(if matches!(cli.cmd, Cmd::Lead(_)) { "warn" } else { "info" });
    let r = match cli.cmd {
        Cmd::Lead(a) => lead(a, script),
        Cmd::Work(a) => htc_node::work::work(a).map(|()| 0),
    };
    match r {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("htc-agent: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// How long a leader that took the run over waits for its agents to say what they kept before
/// it hands out anything (`LeaderConfig::handover`).
const HANDOVER_SETTLE: Duration = Duration::from_secs(20);

/// The batch step: load the tasks, run the script as the prologue, start the agents with one
/// srun, lead until every task is finished. The exit code is the job's.
fn lead(a: LeadArgs, script: Vec<OsString>) -> anyhow::Result<i32> {
    let Some((script, script_args)) = script.split_first() else {
        bail!("missing --script SCRIPT (the plugin passes the batch script)");
    };
    let job_id = slurm::var("SLURM_JOB_ID")?;
    let nodes: usize =
        slurm::var("SLURM_JOB_NUM_NODES").or_else(|_| slurm::var("SLURM_NNODES"))?.parse().context("node count")?;
    // The job's end, to the second: its start plus its time limit.
    let end_us = slurm::time_left().map(|left| now_us() + left);
    let join_run = a.join_run.clone();
    let mut d = Driver::new(a, &job_id, nodes, end_us);
    if let Some(run) = join_run {
        let run = RunDir::new(continuation::join_run_dir(&run, &std::env::current_dir()?));
        return join(d, run, script, script_args);
    }
    let (run, said) = match prepare(&d.a, &job_id, nodes)? {
        Ok(r) => r,
        Err(why) => {
            eprintln!("htc: {why}");
            return Ok(2);
        }
    };
    let restarts = std::env::var("SLURM_RESTART_COUNT").unwrap_or_else(|_| "0".into());
    let header = format!(
        "== job {job_id} (restart {restarts}) on {}, {}",
        slurm::var("SLURMD_NODENAME").unwrap_or_default(),
        htc::calibrate::utc_now()
    );
    let kept = htc::sessionlog::keep(&run.path.join("job.out"), &header)
        .map_err(|e| tracing::warn!(error = %e, "the job's output is not kept in the run directory"))
        .ok();
    println!("{said}");
    d.run = Some(run.clone());
    let code = lead_run(d, &run, script, script_args);
    if let Some(k) = kept {
        k.end();
    }
    release_node_local(&run);
    code
}

/// This job's run, ready to lead: a requeued job's own, an earlier job's (`--htc-resume`), or a
/// new one from the task file; with what to tell the user. `Err`: why there is none.
fn prepare(a: &LeadArgs, job_id: &str, nodes: usize) -> anyhow::Result<Result<(RunDir, String), String>> {
    // The ledger on this node's disk; the run directory (shared) keeps its replica.
    let local = match htc::replica::node_local(a.ledger_dir.as_deref(), job_id) {
        Ok(p) => p,
        Err(why) => return Ok(Err(why.to_string())),
    };
    let prepared = prepare_with(a, job_id, nodes, &local);
    if !matches!(prepared, Ok(Ok(_))) {
        // Nothing to lead (a run in use by its leader, nothing to resume): the directory made
        // for this job's ledger is not left empty on the node's disk. Only if empty: a ledger
        // there belongs to a session of this job id that may still hold it.
        if let Some(dir) = local.parent() {
            let _ = std::fs::remove_dir(dir);
        }
    }
    prepared
}

fn prepare_with(
    a: &LeadArgs,
    job_id: &str,
    nodes: usize,
    local: &Path,
) -> anyhow::Result<Result<(RunDir, String), String>> {
    let base = std::env::current_dir()?;
    let existing = RunDir::new(base.join(".htc").join(job_id));
    // A requeue that interrupted the first load finds no snapshot: start over.
    let complete = is_complete(&existing);
    if existing.path.exists() && !complete {
        std::fs::remove_dir_all(&existing.path)
            .with_context(|| format!("removing the incomplete {}", existing.path.display()))?;
    }
    if complete {
        let _lock = existing.lock()?;
        let run = adopt(existing, local)?;
        let n = leader::driver::reset_interrupted(&run)?;
        let said = format!("htc: job {job_id} restarted; continuing its run ({n} tasks left to run, those in flight when it stopped among them)");
        return Ok(Ok((run, said)));
    }
    if let Some(earlier) = a.resume_run {
        return continuation::resume_run(&base, earlier, job_id, local, a.ledger_dir.as_deref());
    }
    let mut defaults = TaskShape::default();
    if let Some(r) = a.retries {
        defaults.retries = r;
    }
    let file = a.task_file.clone().context("missing --task-file")?;
    match load::create_run(&base, job_id, &file, a.output, defaults, Some(local.to_path_buf())) {
        Ok((run, loaded)) => Ok(Ok((
            run,
            format!("htc: job {job_id}: {} tasks from {} on {nodes} node(s)", loaded.tasks, file.display()),
        ))),
        Err(CreateError::Load(e)) => Ok(Err(e.to_string())),
        Err(e) => Err(e.into()),
    }
}

/// The run's own session: the batch script as the prologue, then the machine from its lead.
fn lead_run(mut d: Driver, run: &RunDir, script: &OsString, script_args: &[OsString]) -> anyhow::Result<i32> {
    let p = match prologue::run(Path::new(script), script_args, &run.path.join("prologue.env")) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("htc: {e}");
            return Ok(1);
        }
    };
    if !p.captured {
        println!("htc: the batch script is not a shell script: it ran, but its environment does not reach the tasks");
    }
    prologue::adopt(&p).context("entering the batch script's environment")?;
    d.lock = Some(run.lock()?);
    let life = Life::leading(d.job(run));
    d.drive(life, vec![Effect::Lead])
}

/// `--htc-join`: this job's nodes join the running run: the batch script runs as this job's
/// prologue, then the machine from its join.
fn join(mut d: Driver, run: RunDir, script: &OsString, script_args: &[OsString]) -> anyhow::Result<i32> {
    let env = run.path.join(format!("prologue-{}.env", d.job_id));
    let p = match prologue::run(Path::new(script), script_args, &env) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("htc: {e}");
            return Ok(1);
        }
    };
    prologue::adopt(&p).context("entering the batch script's environment")?;
    let agents_per_node = d.a.agents_per_node.unwrap_or(1).max(1);
    let instance_size = (d.a.instance_nodes.unwrap_or(1).max(1) * agents_per_node) as u32;
    let mut job = d.job(&run);
    job.agents_wait = instance_size == 1;
    let shape = Shape {
        nodes: d.nodes,
        agents_per_node,
        instance_size,
        output: d.a.output,
        lost_after: htc::site::Site::load().unwrap_or_default().lost_after,
        leave_us: job.leave_us(),
    };
    d.stay = Some(Stay::new(run.clone(), &d.job_id, shape));
    d.run = Some(run);
    let mut first = Vec::new();
    let life = Life::joining(job, &mut first);
    let code = d.drive(life, first);
    if let (true, Some(run)) = (d.led, &d.run) {
        release_node_local(run);
    }
    code
}

/// Carries out the run life's effects: each answers with the machine's next input.
struct Driver {
    a: LeadArgs,
    job_id: String,
    nodes: usize,
    end_us: Option<u64>,
    /// The run, once known (after a take-over: as rebuilt on this node).
    run: Option<RunDir>,
    /// A joined job's hold on the run.
    stay: Option<Stay>,
    lock: Option<RunLock>,
    /// The last session's outcome, for its summary, and the summary's exit code.
    outcome: Option<leader::Outcome>,
    code: i32,
    /// Whether this job led a session (its node holds a ledger).
    led: bool,
    inputs: VecDeque<Input>,
    exit: Option<Exit>,
}

impl Driver {
    fn new(a: LeadArgs, job_id: &str, nodes: usize, end_us: Option<u64>) -> Driver {
        Driver {
            a,
            job_id: job_id.to_string(),
            nodes,
            end_us,
            run: None,
            stay: None,
            lock: None,
            outcome: None,
            code: 0,
            led: false,
            inputs: VecDeque::new(),
            exit: None,
        }
    }

    fn job(&self, run: &RunDir) -> Job {
        Job {
            id: self.job_id.clone(),
            run_id: run.id(),
            run: run.path.display().to_string(),
            nodes: self.nodes,
            end_us: self.end_us,
            resubmit: self.a.resubmit,
            agents_wait: false,
        }
    }

    fn drive(&mut self, mut life: Life, mut effects: Vec<Effect>) -> anyhow::Result<i32> {
        loop {
            for e in std::mem::take(&mut effects) {
                e.carry_out(self)?;
            }
            match self.exit {
                Some(Exit::Code(c)) => return Ok(c),
                Some(Exit::Session) => return Ok(self.code),
                None => {}
            }
            let Some(input) = self.inputs.pop_front() else { bail!("the run's life stopped short of its end") };
            life.handle(now_us(), input, &mut effects);
        }
    }

    fn run(&self) -> anyhow::Result<&RunDir> {
        self.run.as_ref().context("no run yet")
    }

    fn stay(&mut self) -> anyhow::Result<&mut Stay> {
        self.stay.as_mut().context("not a joined job")
    }

    /// What the joined job's hold on the run answers, for the machine.
    fn answer(&mut self, f: impl FnOnce(&mut Stay) -> anyhow::Result<Input>) -> anyhow::Result<()> {
        let input = f(self.stay()?)?;
        self.inputs.push_back(input);
        Ok(())
    }
}

impl Carrier for Driver {
    type Error = anyhow::Error;

    fn attach(&mut self, keep: bool) -> anyhow::Result<()> {
        self.answer(|s| Ok(s.attach(keep)))
    }

    fn start_agents(&mut self, await_leader: bool) -> anyhow::Result<()> {
        self.answer(|s| Ok(s.start_agents(await_leader)))
    }

    fn watch(&mut self, link: bool) -> anyhow::Result<()> {
        self.answer(|s| Ok(s.watch(link)))
    }

    fn detach(&mut self, keep_agents: bool) -> anyhow::Result<()> {
        self.stay()?.detach(keep_agents);
        Ok(())
    }

    fn drain_agents(&mut self) -> anyhow::Result<()> {
        self.answer(|s| Ok(s.drain_agents()))
    }

    fn look_for_leader(&mut self) -> anyhow::Result<()> {
        self.answer(|s| Ok(s.look_for_leader()))
    }

    fn take_lock(&mut self) -> anyhow::Result<()> {
        self.answer(Stay::take_lock)
    }

    fn sleep(&mut self, us: u64) -> anyhow::Result<()> {
        std::thread::sleep(Duration::from_micros(us));
        self.inputs.push_back(Input::Woke);
        Ok(())
    }

    fn take_over(&mut self) -> anyhow::Result<()> {
        let input = match continuation::take_over(self.run()?, &self.job_id, self.a.ledger_dir.as_deref())? {
            Ok((run, left)) => {
                // The run's own settings, not the joining job's defaults.
                if let Some(mode) = continuation::output_mode(&run)? {
                    self.a.output = mode;
                }
                self.run = Some(run);
                let stay = self.stay.as_mut().context("not a joined job")?;
                self.lock = stay.lock();
                Input::TookOver { left, kept_agents: stay.kept_agents() }
            }
            Err(why) => Input::CannotTakeOver(why),
        };
        self.inputs.push_back(input);
        Ok(())
    }

    fn lead(&mut self) -> anyhow::Result<()> {
        let survivors = self.stay.as_mut().and_then(Stay::survivors);
        let run = self.run()?.clone();
        self.led = true;
        let outcome = lead_session(&self.a, &self.job_id, self.nodes, &run, self.end_us, survivors)?;
        let end = match outcome.ending {
            leader::Ending::Complete => SessionEnd::Complete,
            leader::Ending::Interrupted(libc::SIGTERM) => SessionEnd::Terminated,
            leader::Ending::Interrupted(_) => SessionEnd::Interrupted,
            leader::Ending::AgentsLost(_) => SessionEnd::AgentsLost,
            leader::Ending::TooManyFailures(_) => SessionEnd::TooManyFailures,
            leader::Ending::OutOfTime(_) => SessionEnd::OutOfTime,
        };
        let joined_running = outcome.progress.joined_running;
        self.outcome = Some(outcome);
        self.inputs.push_back(Input::SessionEnded { end, joined_running, at_us: session_end_us(&run) });
        Ok(())
    }

    fn summarize(&mut self, resume_hint: bool) -> anyhow::Result<()> {
        let outcome = self.outcome.as_ref().context("no session to summarize")?;
        self.code = htc::status::finish(self.run()?, outcome, false, resume_hint)?;
        // Whoever leads next may take the lock now.
        self.lock = None;
        Ok(())
    }

    fn count_resubmits(&mut self) -> anyhow::Result<()> {
        let input = match submit::resubmits(self.run()?) {
            Ok(n) => Input::Resubmits(n),
            Err(e) => Input::ResubmitFailed(format!("{e:#}")),
        };
        self.inputs.push_back(input);
        Ok(())
    }

    fn resubmit(&mut self, nth: u64) -> anyhow::Result<()> {
        let input = match submit::resubmit(self.run()?, nth) {
            Ok(said) => Input::Resubmitted(said),
            Err(e) => Input::ResubmitFailed(format!("{e:#}")),
        };
        self.inputs.push_back(input);
        Ok(())
    }

    fn print(&mut self, report: Report) -> anyhow::Result<()> {
        if report.to_stderr() {
            eprintln!("{report}");
        } else {
            println!("{report}");
        }
        Ok(())
    }

    fn exit(&mut self, exit: Exit) -> anyhow::Result<()> {
        self.exit = Some(exit);
        Ok(())
    }
}

/// When the last session of `run` ended (the leader writes it as it stops): on a signal, its
/// arrival within a commit, which is what the time limit is judged by.
fn session_end_us(run: &RunDir) -> u64 {
    let ledger = htc::ledger::Ledger::open(&run.ledger(), true).ok();
    ledger.and_then(|l| l.read().ok()?.meta_u64("session_end_us").ok()?).unwrap_or_else(now_us)
}

/// Leads a session of `run` with this job's nodes, holding the run's lock: one srun step of
/// agents (or, after a hand-over, the agents this job already runs, with their tasks), the
/// leader until the run ends or this job does.
fn lead_session(
    a: &LeadArgs,
    job_id: &str,
    nodes: usize,
    run: &RunDir,
    end_us: Option<u64>,
    survivors: Option<Survivors>,
) -> anyhow::Result<leader::Outcome> {
    let every = std::env::var("HTC_PROGRESS_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(30u64);
    let fanout = a.fanout.unwrap_or(DEFAULT_FANOUT).max(1);
    let site = htc::site::Site::load()?;
    let widest = load::widest_task(&htc::ledger::Ledger::open(&run.ledger(), true)?)?;
    // One agent per node by default: its spawn loops keep the node's CPUs busy, and the leader
    // hears from one agent per node.
    let agents_per_node = a.agents_per_node.unwrap_or(1).max(1);
    let instance_size = (a.instance_nodes.unwrap_or(1).max(1) * agents_per_node) as u32;
    let layout = match &survivors {
        Some(s) => s.layout.clone(),
        None => Arc::new(Tree::instances((nodes * agents_per_node) as u32, instance_size, fanout)),
    };
    let srun = leader::srun::Srun {
        agent_bin: leader::launch::agent_binary(),
        nodes,
        agents_per_node,
        spawners: htc::agent::default_spawners(widest),
        output: a.output,
        fanout,
        instance_size,
        lost_after: site.lost_after,
        first_agent: 0,
        await_leader_s: 0,
    };
    let cfg = LeaderConfig {
        run: run.clone(),
        job_id: job_id.to_string(),
        bind: std::net::SocketAddr::new(slurm::node_ip(), 0),
        advertise: Some(slurm::node_ip()),
        commit_interval: Duration::from_millis(10),
        progress: htc::status::sink(false, Some(Duration::from_secs(every.max(1)))),
        partition: a.partition.unwrap_or(site.partition),
        // One srun step starts every node's agent at once: instances do not start one after
        // another as eq. 10's s assumes, so the plan skews nothing for it.
        params: Params { s: 0.0, ..site.params },
        cores: slurm::job_cpus().unwrap_or(nodes as u64),
        layout,
        fanout,
        live: Liveness::new(site.lost_after),
        max_fails: a.max_fails,
        // Tasks end, and the session with them, before Slurm's KillWait would cut them off.
        deadline_us: end_us.map(|e| e.saturating_sub(lifecycle::KILL_WAIT_US)),
        mem_policy: Default::default(),
        no_steal: false,
        grow: a.grow.map(|spec| {
            let own_minutes = end_us.map_or(60, |e| e.saturating_sub(now_us()).div_ceil(60_000_000));
            let submit = Arc::new(submit::SbatchJoin { run: run.clone(), own_options: slurm::own_job_options() });
            leader::grow::Growing::new(spec, own_minutes, submit)
        }),
        handover: survivors
            .as_ref()
            .map(|_| leader::Handover { wait: HANDOVER_SETTLE, others: continuation::others_kept(run, job_id) }),
    };
    submit::note_resume_args(run, nodes, resume_args(nodes, a))?;
    leader::run(cfg, |addr, tx| match survivors {
        // They find this leader through the address it publishes.
        Some(s) => {
            let events = s.events;
            std::thread::spawn(move || events.iter().for_each(|e| drop(tx.send(e))));
            Ok(s.agents)
        }
        None => srun.start(run, addr, tx),
    })
}

/// The sbatch arguments that ask for this job's shape again (`htc resume` without arguments):
/// as many nodes, as many CPUs on each, and the same `--htc-*` layout options.
fn resume_args(nodes: usize, a: &LeadArgs) -> Vec<String> {
    let mut v = vec![format!("--nodes={nodes}")];
    if let Some(c) = slurm::min_cpus_per_node() {
        v.extend(["--ntasks-per-node=1".to_string(), format!("--cpus-per-task={c}")]);
    }
    let opt = |name: &str, x: Option<String>| x.map(|x| format!("--htc-{name}={x}"));
    v.extend(
        [
            opt("agents-per-node", a.agents_per_node.map(|n| n.to_string())),
            opt("fanout", a.fanout.map(|n| n.to_string())),
            opt("instance-nodes", a.instance_nodes.map(|n| n.to_string())),
            opt("max-fails", a.max_fails.map(|n| n.to_string())),
            opt("partition", a.partition.map(|p| p.name().to_string())),
            opt("resubmit", a.resubmit.map(|n| n.to_string())),
            opt("grow", a.grow.map(|g| g.to_arg())),
        ]
        .into_iter()
        .flatten(),
    );
    v
}
