//! `htc`: the user's command. `htc run tasks.txt` runs a task file on this machine through the
//! same leader, agents and ledger that `sbatch --htc` uses on a cluster.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use htc::cli::htc::{Cli, Cmd, RunArgs, SimulateArgs, TaskCmd};
use htc::leader::{self, launch, LeaderConfig, Planned};
use htc::ledger::Ledger;
use htc::load::{self, CreateError, LoadError};
use htc::output::OutputMode;
use htc::rundir::{self, RunDir};
use htc::simulate::{self, SimConfig};
use htc::site::Site;
use htc::{agent, calibrate, executor, status};
use htc_core::hflow::Params;
use htc_core::taskfile::TaskShape;
use htc_core::tree::Tree;
use std::io::ErrorKind;
use std::sync::Arc;

fn main() -> ExitCode {
    htc::init_logging("warn");
    match real_main() {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        // The reader went away (`htc output … | head`): as for any Unix filter, nothing to say.
        Err(e)
            if e.chain()
                .any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == ErrorKind::BrokenPipe)) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            let msg = format!("{e:#}");
            eprintln!("htc: {msg}");
            if ["is damaged", "MDB_CORRUPTED", "MDB_PAGE_NOTFOUND", "is corrupt"].iter().any(|m| msg.contains(m)) {
                eprintln!("htc: `htc verify RUN` reads the whole ledger and says which tasks it still vouches for");
            }
            ExitCode::from(2)
        }
    }
}

fn real_main() -> anyhow::Result<i32> {
    match Cli::parse().cmd {
        Cmd::Check { file, max_errors } => check(file, max_errors),
        Cmd::Submit { file, sbatch } => submit(&file, &sbatch),
        Cmd::Resume { job, sbatch } => resume(&job, sbatch),
        Cmd::Retry { run, failed, tasks, retries, args } => retry(&run, failed, tasks.as_deref(), retries, args),
        Cmd::Prepare { file, output } => match create_run(Some(&file), None, output, None, None)? {
            Ok(run) => {
                println!("{}", run.path.display());
                Ok(0)
            }
            Err(code) => Ok(code),
        },
        Cmd::Status { run, failures, json } => {
            let run = RunDir::locate(run.as_deref())?;
            let report = status::Report::read(&run, failures)?;
            if json {
                println!("{}", report.json());
            } else {
                print!("{}", report.text());
            }
            Ok(0)
        }
        Cmd::Watch { run, interval } => {
            let dir = RunDir::find(run.as_deref())?;
            let silent = Site::load()?.lost_after.max(Duration::from_secs(3));
            htc::watch::run(&dir, Duration::from_secs_f64(interval.clamp(0.1, 3600.0)), silent)?;
            Ok(0)
        }
        Cmd::Verify { run } => verify(&RunDir::locate(run.as_deref())?),
        Cmd::Task { cmd } => match cmd {
            TaskCmd::Add(a) => htc::task_cmd::add(*a),
            TaskCmd::Status { run, ids, all, format } => htc::task_cmd::status(&run, &ids, all, &format),
            TaskCmd::Cancel { run, ids } => htc::task_cmd::cancel(&run, &ids),
            TaskCmd::Explain { run, ids, format } => htc::explain_cmd::explain(&run, &ids, &format),
            TaskCmd::Wait { run, ids, all, any, timeout } => {
                htc::task_cmd::wait(&run, &ids, all, any, timeout.map(Duration::from_millis))
            }
        },
        Cmd::Close { run, cancel } => htc::task_cmd::close(&run, cancel),
        Cmd::Calibrate { output, tasks, dry_run } => calibrate(output, tasks, dry_run),
        Cmd::Simulate(a) => simulate_cmd(a),
        Cmd::Output { run, task, stdout, stderr, tag, failed } => {
            let run = RunDir::locate(Some(&run))?;
            match task {
                Some(task) => htc::output_view::print_one(&run, task, !stderr, !stdout)?,
                None => {
                    let sel = htc::output_view::Select { stdout: !stderr, stderr: !stdout, failed_only: failed, tag };
                    htc::output_view::print_all(&run, sel)?;
                }
            }
            Ok(0)
        }
        Cmd::Report { run, output } => report(run, output),
        Cmd::Log { run, format } => log(run, format),
        Cmd::Run(a) if a.detach => htc::detach::detach(a.resume.as_deref()),
        Cmd::Run(a) => run(a),
    }
}

/// `htc simulate`: the run of a task file on agents that are not there, on a virtual clock.
fn simulate_cmd(a: SimulateArgs) -> anyhow::Result<i32> {
    let SimulateArgs {
        file,
        agents,
        cores_per_agent,
        instance_agents,
        fanout,
        partition,
        latency_us,
        leader_us_per_report,
        leader_us_per_task,
        join_spread_ms,
        hide_hints,
        mem_per_agent,
        gpus_per_agent,
        faults,
        json,
    } = a;
    let site = Site::load()?;
    let plan = Planned {
        plan: partition.unwrap_or(site.partition),
        instances: agents.max(1) as usize,
        cores: agents.max(1) as u64 * cores_per_agent.max(1) as u64,
        // The simulated launcher's start delay per agent, as eq. 10 should see it.
        params: Params { s: join_spread_ms as f64 / 1000.0 / agents.max(1) as f64, ..site.params },
    };
    let cfg = SimConfig {
        agents: agents.max(1),
        cores_per_agent: cores_per_agent.max(1),
        instance_agents,
        fanout,
        plan,
        latency_us,
        leader: htc::site::LeaderCost {
            per_report_us: leader_us_per_report.unwrap_or(site.leader.per_report_us).max(0.0),
            per_task_us: leader_us_per_task.unwrap_or(site.leader.per_task_us).max(0.0),
        },
        join_spread_us: join_spread_ms * 1000,
        flush_every_us: htc::agent::FLUSH_EVERY.as_micros() as u64,
        hide_hints,
        mem_mb_per_agent: mem_per_agent,
        gpus_per_agent,
        faults,
    };
    let r = match simulate::simulate_file(&file, &cfg) {
        Err(e) if e.downcast_ref::<CreateError>().is_some_and(|e| matches!(e, CreateError::Load(_))) => {
            eprintln!("htc: {e}");
            return Ok(2);
        }
        r => r?,
    };
    print!("{}", if json { simulate::json(&cfg, &r) } else { simulate::text(&cfg, &r) });
    Ok(0)
}

/// `htc run`: a run on this machine, its leader in this process and its agents as children.
// Long (about 85 lines): a quarter of it names every option of `RunArgs`, so that adding one
// that this function ignores fails to compile; the rest is the run's steps, in order.
fn run(a: RunArgs) -> anyhow::Result<i32> {
    let RunArgs {
        file,
        open,
        idle_exit,
        resume,
        join,
        agents,
        cores_per_agent,
        spawners,
        fanout,
        instance_agents,
        output,
        retries,
        max_fails,
        time_limit,
        quiet,
        exec,
        partition,
        commit_ms,
        ledger_dir,
        mem_per_agent,
        mem_policy,
        gpus,
        mem_limit,
        no_steal,
        keep_daemons,
        detach: _,
    } = a;
    let site = Site::load()?;
    // Options are checked before a run is made, so a refused one leaves nothing behind.
    let cpus = executor::allowed_cpus();
    let (agents, slots) = local_layout(agents, cores_per_agent, cpus.len());
    if spawners.is_some_and(|s| s > slots) {
        bail!(
            "--spawners {}: more spawn loops than the agent's {slots} cores (0: one per core)",
            spawners.unwrap_or(0)
        );
    }
    let local = |run: &RunDir, output, spawners| launch::Local {
        agent_bin: launch::agent_binary(),
        agents,
        first_agent: 0,
        slots_per_agent: slots,
        cpus: cpus.clone(),
        output,
        log_dir: run.path.join("log"),
        fanout: fanout.max(1),
        exec,
        spawners,
        instance_size: instance_agents,
        lost_after: site.lost_after,
        gpus: gpus.clone(),
        mem_limit,
        keep_daemons,
        mem_mb: match mem_policy {
            htc_core::backfill::Policy::Ignore => Some(0),
            _ => mem_per_agent,
        },
    };
    if let Some(r) = join {
        // Absolute: the agents run where the run's tasks run, which may be elsewhere.
        let run = RunDir::new(std::path::absolute(RunDir::find(Some(&r))?)?);
        let ends_us = time_limit.map(|s| rundir::now_us() + s * 1_000_000);
        let (tx, _ignored) = std::sync::mpsc::channel();
        return join_run(local(&run, output, spawners.unwrap_or(0)), &run, ends_us, quiet, spawners, tx);
    }
    let open = open.then_some(load::OpenRun { idle_exit_ms: (idle_exit > 0).then_some(idle_exit) });
    let (run, output, lock) = match open_run(resume, file, open, output, retries, ledger_dir.as_deref(), quiet)? {
        Ok(opened) => opened,
        Err(code) => return Ok(code),
    };
    let widest = load::widest_task(&Ledger::open(&run.ledger(), true)?)?;
    let spawners = spawn_loops(spawners, slots, widest)?;
    let local = local(&run, output, spawners);
    let cfg = LeaderConfig {
        run: run.clone(),
        job_id: run.id(),
        bind: "127.0.0.1:0".parse().unwrap(),
        advertise: None,
        commit_interval: Duration::from_millis(commit_ms.max(1)),
        progress: htc::status::sink(quiet, None),
        partition: partition.unwrap_or(site.partition),
        params: Params { s: local.start_delay_s(site.params.s), ..site.params },
        cores: (agents * slots) as u64,
        layout: Arc::new(Tree::instances(agents as u32, instance_agents, fanout.max(1))),
        fanout: fanout.max(1),
        live: htc::liveness::Liveness::new(site.lost_after),
        max_fails,
        deadline_us: time_limit.map(|s| rundir::now_us() + s * 1_000_000),
        mem_policy,
        no_steal,
        give_back_from: None,
        open_idle_give_back: site.open_idle_give_back,
        grow: None,
        handover: None,
        published: open.is_some().then(|| say_id(run.id())),
    };
    let outcome = leader::run(cfg, |addr, tx| local.start(&run, addr, tx))?;
    let code = htc::status::finish(&run, &outcome, quiet, true);
    if run.replicated() {
        htc::replica::remove_node_local(&run.ledger());
    }
    drop(lock);
    code
}

/// What `htc run --open` does once its leader listens: prints the run's id on stdout, the one
/// line it writes there, as `--detach` does (`RUN=$(htc run --open --detach)`), so a program
/// that keeps the run as its child (the Python client) reads the id of the run it started. A
/// reader gone already is no error: the run goes on.
fn say_id(id: String) -> Box<dyn FnOnce() + Send> {
    Box::new(move || {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{id}").and_then(|()| out.flush());
    })
}

/// `htc run --join RUN`: this machine's agents join a running run and work on its tasks until
/// it ends (or `ends_us`, when they hand back what they hold and leave). Exit 0 once they have
/// ended; 2 when the run cannot be joined.
fn join_run(
    mut local: launch::Local,
    run: &RunDir,
    ends_us: Option<u64>,
    quiet: bool,
    spawners: Option<usize>,
    // Agents that never join are the leader's to notice: nobody here listens for them.
    never_joined: std::sync::mpsc::Sender<htc::leader::driver::Event>,
) -> anyhow::Result<i32> {
    let req = htc::join::Request {
        job: format!("local-{}", std::process::id()),
        agents: local.agents as u32,
        instance_size: local.instance_size,
        nodes: 1,
        cores: (local.agents * local.slots_per_agent) as u64,
        ends_us,
        cluster: String::new(),
        keep_first: None,
    };
    let joined = match htc::join::attach(run, &req) {
        Ok(j) => j,
        Err(e) => {
            eprintln!("htc: cannot join: {e}");
            return Ok(2);
        }
    };
    if let Err(e) = joined.enter_workdir() {
        eprintln!("htc: the run's tasks run in {}, which cannot be entered here ({e}); these run here", joined.workdir);
    }
    let first = joined.first_agent;
    (local.first_agent, local.fanout) = (first, joined.fanout);
    // The run's output mode and widest task, not this command's defaults.
    local.output = joined.output.parse().unwrap_or(local.output);
    local.spawners = spawn_loops(spawners, local.slots_per_agent, joined.widest_task)?;
    local.log_dir = run.path.join(format!("log-{first}"));
    if !quiet {
        eprintln!(
            "htc: joined run {} (job {}) with agents {first}..{}",
            run.path.display(),
            joined.run_job,
            first as usize + local.agents - 1
        );
    }
    let mut agents = local.start(run, joined.leader, never_joined)?;
    agents.wait(Duration::from_secs(365 * 86_400));
    drop(joined);
    if !quiet {
        eprintln!("htc: the joined agents have ended");
    }
    Ok(0)
}

/// The spawn loops of each agent of `slots` cores: as asked, else one per slot. Asked loops run
/// a task on their own slots only: ones too narrow for the widest task are refused here.
fn spawn_loops(asked: Option<usize>, slots: usize, widest: u64) -> anyhow::Result<usize> {
    let spawners = asked.unwrap_or(agent::LOOP_PER_SLOT);
    // With a loop per core (0), a wider task runs in the wide spawner beside them.
    let loop_slots = slots / spawners.clamp(1, slots);
    if spawners > 0 && widest > loop_slots as u64 && widest <= slots as u64 {
        bail!(
            "--spawners {spawners}: a task needs {widest} cores, but each of the agent's spawn loops would \
             have {loop_slots}; use --spawners 1"
        );
    }
    Ok(spawners)
}

/// A run, its output mode, and the open file that holds its lock (`RunDir::lock`).
type Opened = (RunDir, OutputMode, rundir::RunLock);

/// The run `htc run` leads: a new one from the task file, or the one `--resume` names (its
/// ledger rebuilt from the replica where it was on a node, what was in flight made pending); its
/// output mode; and its lock, held to the end. An exit code instead when the file is refused.
fn open_run(
    resume: Option<String>,
    file: Option<PathBuf>,
    open: Option<load::OpenRun>,
    output: OutputMode,
    retries: Option<u8>,
    ledger_dir: Option<&std::path::Path>,
    quiet: bool,
) -> anyhow::Result<Result<Opened, i32>> {
    Ok(Ok(match (resume, file) {
        (Some(r), None) => {
            let run = RunDir::new(RunDir::find(if r.is_empty() { None } else { Some(&r) })?);
            let lock = run.lock()?;
            // A run whose ledger was on a node: rebuilt from its replica, here.
            let local = || htc::replica::node_local(ledger_dir, &run.id()).map_err(anyhow::Error::msg);
            let run = if run.ledger().exists() { run } else { run.clone().take_over(&local()?)? };
            // Verified (apart) before this process maps the ledger at all.
            let n = leader::driver::reset_interrupted(&run, leader::driver::Survivors::None)?;
            let mode = stored_output_mode(&run)?.unwrap_or(output);
            if !quiet {
                eprintln!("htc: resuming {} ({})", run.path.display(), n.said());
            }
            (run, mode, lock)
        }
        (Some(_), Some(_)) => bail!("give either a task file or --resume, not both"),
        (None, None) if open.is_none() => bail!("missing task file (or --resume, or --open)"),
        (None, file) => match create_run(file.as_deref(), open, output, retries, ledger_dir)? {
            Ok(run) => {
                let lock = run.lock()?;
                (run, output, lock)
            }
            Err(code) => return Ok(Err(code)),
        },
    }))
}

/// `htc submit FILE -- SBATCH_ARGS`: `sbatch --htc=FILE`, with nothing to run but the tasks.
fn submit(file: &std::path::Path, sbatch: &[std::ffi::OsString]) -> anyhow::Result<i32> {
    let mut htc = std::ffi::OsString::from("--htc=");
    htc.push(file.as_os_str());
    let status = std::process::Command::new("sbatch")
        .arg(htc)
        .args(sbatch)
        .arg(htc::slurm::GUARD_SCRIPT)
        .status()
        .context("running sbatch (is Slurm's client installed?)")?;
    Ok(status.code().unwrap_or(1))
}

/// `htc report`: the run's HTML report and charts.
fn report(run: Option<String>, output: Option<PathBuf>) -> anyhow::Result<i32> {
    let run = RunDir::locate(run.as_deref())?;
    let dir = output.unwrap_or_else(|| PathBuf::from(format!("htc-report-{}", run.id())));
    let t = std::time::Instant::now();
    let w = htc::report::write(&run, &dir)?;
    println!("{}", w.html.display());
    eprintln!(
        "htc: report of {} tasks in {:.1} s: {} (charts: {})",
        w.tasks,
        t.elapsed().as_secs_f64(),
        w.html.display(),
        w.svgs.iter().map(|p| p.file_name().unwrap_or_default().to_string_lossy()).collect::<Vec<_>>().join(", ")
    );
    Ok(0)
}

/// `htc log`: one line per attempt, as GNU parallel's joblog or JSON.
fn log(run: Option<String>, format: htc::joblog::Format) -> anyhow::Result<i32> {
    let run = RunDir::locate(run.as_deref())?;
    let ledger = Ledger::open(&run.ledger(), true)?;
    let text = htc::load::TaskText::open(&run.tasks()).context("mapping the run's task file")?;
    let devices = htc::output_view::all_devices(&run)?;
    htc::joblog::write(&ledger, &text, format, &devices, &mut std::io::BufWriter::new(std::io::stdout().lock()))?;
    Ok(0)
}

/// `htc resume JOBID`: checks that the job's run can be continued and submits the job that does.
fn resume(job: &str, mut sbatch: Vec<std::ffi::OsString>) -> anyhow::Result<i32> {
    let run = RunDir::locate(Some(job))?;
    let path = std::fs::canonicalize(&run.path)?;
    let first = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
    if !first.bytes().all(|b| b.is_ascii_digit()) {
        bail!("{} is a local run, not a Slurm job's: continue it with `htc run --resume {job}`", run.path.display());
    }
    let report = status::Report::read(&run, 0)?;
    match report.state_key() {
        "running" | "not_responding" => {
            eprintln!("htc: job {job}'s run is still going ({}); nothing to resume", report.state);
            return Ok(1);
        }
        "succeeded" => {
            eprintln!("htc: every task of job {job} succeeded; nothing to resume");
            return Ok(0);
        }
        "failed" => {
            eprintln!("htc: every task of job {job} finished (some failed); nothing is left to resume");
            return Ok(0);
        }
        _ => {}
    }
    if sbatch.is_empty() {
        // The first job's shape: nodes, CPUs on each, the --htc-* layout options.
        let l = Ledger::open(&run.ledger(), true)?;
        let t = l.read()?;
        if let Some(args) = t.meta("resume_sbatch")?.filter(|a| !a.is_empty()) {
            sbatch = String::from_utf8_lossy(args).lines().map(Into::into).collect();
        } else if let Some(n) = t.meta_u64("slurm_nodes")? {
            sbatch = vec!["-N".into(), n.to_string().into()];
        }
    }
    // sbatch checks the file it is given; the new job continues the ledger and loads nothing.
    // A run with sweeps is checked through its original file, whose `rows=` tables resolve
    // beside it (the run's copy has them elsewhere).
    let file = htc::load::sbatch_run_option(&RunDir::new(&path), &Ledger::open(&run.ledger(), true)?)?;
    let mut cmd = std::process::Command::new("sbatch");
    cmd.arg(file).arg(format!("--htc-resume={first}")).args(&sbatch).arg(htc::slurm::GUARD_SCRIPT);
    eprintln!("htc: {} unfinished tasks of job {job}: {cmd:?}", report.counts.unfinished());
    let status = cmd.status().context("running sbatch (is Slurm's client installed?)")?;
    Ok(status.code().unwrap_or(1))
}

/// `htc retry`: the picked tasks back to pending in the run's ledger (or replica), then the run
/// continued: here by `htc run --resume`, for a Slurm job by a new job.
fn retry(
    arg: &str,
    failed: bool,
    tasks: Option<&str>,
    retries: u8,
    args: Vec<std::ffi::OsString>,
) -> anyhow::Result<i32> {
    use htc::rerun::{self, Pick};
    let pick = match tasks {
        Some(t) => Pick::Tasks(htc_core::idset::parse(t).map_err(|e| anyhow::anyhow!("--tasks: {e}"))?),
        None if failed => Pick::Failed,
        None => bail!("say which tasks: --failed or --tasks IDS"),
    };
    let dir = std::fs::canonicalize(RunDir::find(Some(arg))?)?;
    let lock = RunDir::new(&dir).lock()?;
    let report = status::Report::read(&RunDir::open_for_reading(dir.clone())?, 0)?;
    if matches!(report.state_key(), "running" | "not_responding") {
        eprintln!("htc: {arg} is still running ({}); retry it once it ended", report.state);
        return Ok(1);
    }
    let n = rerun::reopen_run(&dir, &pick, retries)?;
    drop(lock);
    let picked =
        if pick == Pick::Failed { "failed tasks".to_string() } else { format!("tasks {}", tasks.unwrap_or("")) };
    if n.worn_out > 0 {
        eprintln!(
            "htc: {} of the {picked} used up the {} attempts a task can have; left as they are",
            n.worn_out,
            htc_core::task::MAX_ATTEMPTS
        );
    }
    if n.total() == 0 && n.unfinished == 0 {
        eprintln!("htc: no {picked} to run again in {}", dir.display());
        return Ok(if n.worn_out > 0 { 1 } else { 0 });
    }
    eprintln!(
        "htc: {} tasks ({} failed, {}{} done) go back to pending as new attempts{}",
        n.total(),
        n.failed,
        match n.cancelled {
            0 => String::new(),
            c => format!("{c} cancelled, "),
        },
        n.done,
        if n.unfinished > 0 {
            format!("; {} chosen were not finished and run anyway", n.unfinished)
        } else {
            String::new()
        }
    );
    let id = dir.file_name().unwrap_or_default().to_string_lossy().into_owned();
    if id.bytes().all(|b| b.is_ascii_digit()) {
        // By its path: the run just changed, whatever the current directory holds.
        return resume(&dir.to_string_lossy(), args);
    }
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().context("locating the htc binary")?;
    let err = std::process::Command::new(exe).arg("run").arg("--resume").arg(&dir).args(&args).exec();
    Err(anyhow::Error::from(err).context("continuing the run with htc run --resume"))
}

/// Creates a run in the current directory, its ledger there or in `ledger_dir` (then with its
/// replica in the run directory). A bad task file yields the exit code instead, after the error
/// was printed; nothing ran.
fn create_run(
    file: Option<&std::path::Path>,
    open: Option<load::OpenRun>,
    output: OutputMode,
    retries: Option<u8>,
    ledger_dir: Option<&std::path::Path>,
) -> anyhow::Result<Result<RunDir, i32>> {
    let mut defaults = TaskShape::default();
    if let Some(r) = retries {
        defaults.retries = r;
    }
    let id = rundir::new_run_id();
    let ledger = ledger_dir.map(|d| htc::replica::node_local(Some(d), &id)).transpose().map_err(anyhow::Error::msg)?;
    match load::create_run(&std::env::current_dir()?, &id, file, output, defaults, ledger, open) {
        Ok((run, _)) => Ok(Ok(run)),
        Err(CreateError::Load(e @ (LoadError::TaskFile(_) | LoadError::Copy { .. } | LoadError::TooMany { .. }))) => {
            eprintln!("htc: {e}");
            Ok(Err(2))
        }
        Err(e) => Err(e.into()),
    }
}

fn stored_output_mode(run: &RunDir) -> anyhow::Result<Option<OutputMode>> {
    let l = Ledger::open(&run.ledger(), true)?;
    let t = l.read()?;
    Ok(t.meta("output")?.and_then(|b| std::str::from_utf8(b).ok()?.parse().ok()))
}

fn check(file: PathBuf, max_errors: usize) -> anyhow::Result<i32> {
    match htc_core::taskfile::check_path(&file, max_errors.max(1)) {
        Ok(s) => {
            println!(
                "{}: {} tasks ({} through /bin/sh, {} exec'd directly)",
                file.display(),
                s.tasks,
                s.shell_tasks,
                s.tasks - s.shell_tasks
            );
            for (line, n) in &s.sweeps {
                println!("sweep: line {line} makes {n} tasks");
            }
            println!("classes: {}", s.classes.len());
            for c in &s.classes {
                let hint = if c.without_runtime > 0 {
                    format!(", {} without runtime hint", c.without_runtime)
                } else {
                    String::new()
                };
                println!("  {:<16} {:>10} tasks  {:>14.1} core-seconds{hint}", c.name, c.tasks, c.core_seconds);
            }
            println!(
                "requested: {:.1} core-seconds (from runtime hints); largest task: {} cores",
                s.core_seconds(),
                s.max_cores
            );
            if s.with_rules > 0 {
                println!("attempts: {} tasks have rules for their retries", s.with_rules);
                for r in &s.rule_sets {
                    let asks = if r.asks.is_empty() { String::new() } else { format!("; attempts ask {}", r.asks) };
                    println!("  {:>10} tasks  {}{asks}", r.tasks, r.rules);
                }
            }
            Ok(0)
        }
        Err(errs) => {
            for e in &errs {
                eprintln!("{e}");
            }
            eprintln!("htc: {} error{} in {}", errs.len(), if errs.len() == 1 { "" } else { "s" }, file.display());
            Ok(1)
        }
    }
}

/// `htc calibrate`: measure s and d, then write (or print) the site file.
fn calibrate(output: Option<PathBuf>, tasks: u64, dry_run: bool) -> anyhow::Result<i32> {
    let base = Site::load()?;
    let htc = std::env::current_exe().context("locating the htc binary")?;
    let cpus = executor::allowed_cpus().len().max(1);
    eprintln!(
        "htc: calibrating: {tasks} `true` tasks on one agent of {cpus} cores, agent start-up, then the \
         leader's cost with --exec none (3 rounds each)"
    );
    let m = calibrate::measure(&htc, &std::env::temp_dir(), tasks, cpus)?;
    let site = calibrate::site(&base, &m);
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let header = format!(
        "slurm-htc site calibration: htc calibrate, {} on {} ({cpus} CPUs)\n\
         instance_start_s rounds: {}\ndispatch_s rounds: {}\n\
         leader (us per task, results per report; medians): {}",
        calibrate::utc_now(),
        host.trim(),
        rounds(&m.s_rounds),
        rounds(&m.d_rounds),
        m.leader_runs.iter().map(|(c, n)| format!("{c:.3} at {n:.1}")).collect::<Vec<_>>().join(", ")
    );
    let text = site.render(&header);
    if dry_run {
        print!("{text}");
        return Ok(0);
    }
    let path = match output.or_else(Site::user_path) {
        Some(p) => p,
        None => bail!("no HOME to write ~/.config/htc/site.conf under; give --output"),
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let tmp = path.with_extension("conf.tmp");
    std::fs::write(&tmp, &text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
    eprintln!(
        "htc: s = {:.4} s per agent start, d = {:.1} us per dispatch, leader {:.2} us per report + {:.3} us \
         per task; written to {}",
        m.s,
        m.d * 1e6,
        m.leader.per_report_us,
        m.leader.per_task_us,
        path.display()
    );
    Ok(0)
}

fn rounds(v: &[f64]) -> String {
    v.iter().map(|x| format!("{x:.6}")).collect::<Vec<_>>().join(" ")
}

/// Agents and slots per agent for a local run. Unless told otherwise, one agent with every CPU:
/// its executor runs a spawn loop per CPU (`--spawners`), which keeps pace with the raw spawn
/// loop as one agent per CPU did (bench/RESULTS.md §1) while the leader hears from one agent.
fn local_layout(agents: Option<usize>, cores: Option<usize>, cpus: usize) -> (usize, usize) {
    let cpus = cpus.max(1);
    let agents = match (agents, cores) {
        (Some(a), _) => a.max(1),
        (None, Some(c)) => (cpus / c.max(1)).max(1),
        (None, None) => 1,
    };
    (agents, cores.unwrap_or((cpus / agents).max(1)).max(1))
}

/// `htc verify`'s second half, on an intact ledger: every finished task's output against its
/// checksums.
fn verify_output(run: &RunDir) -> anyhow::Result<i32> {
    let Some(c) = htc::output_view::check_all(run)? else { return Ok(0) };
    if c.damaged.is_empty() && c.missing.is_empty() {
        println!("output: intact, {} tasks' output read back whole", c.checked);
        return Ok(0);
    }
    println!("output: damaged ({} tasks' output read back whole)", c.checked - c.damaged.len() as u64);
    for (id, why) in c.damaged.iter().take(20) {
        println!("  task {id}: {why}");
    }
    if c.damaged.len() > 20 {
        println!("  … and {} more damaged", c.damaged.len() - 20);
    }
    if !c.missing.is_empty() {
        let spans = htc::verify::spans(&c.missing.iter().map(|&i| i..=i).collect::<Vec<_>>());
        println!("  no output recorded for {} finished tasks: {spans}", c.missing.len());
    }
    Ok(1)
}

/// `htc verify`: the whole ledger read back, and what it still vouches for.
fn verify(run: &RunDir) -> anyhow::Result<i32> {
    let text_len = htc::load::text_len(run);
    let shown = run.ledger().display().to_string();
    if !run.ledger().exists() {
        bail!("{} has no ledger ({shown})", run.path.display());
    }
    let v = match htc::verify::verify_apart(&run.ledger(), text_len, htc::verify::STALL) {
        Ok(v) => v,
        Err(e) => {
            // The file is there but does not open: nothing in it can be vouched for.
            println!("ledger {shown}: damaged, it does not open: {e}");
            println!("  tasks it vouches for: none");
            return Ok(1);
        }
    };
    let total = v.total.map(|t| t.to_string()).unwrap_or_else(|| "?".into());
    if v.intact() {
        println!("ledger {shown}: intact, all {total} task records read back whole");
        return verify_output(run);
    }
    println!("ledger {shown}: damaged");
    println!("  tasks it vouches for: {} of {total} ({})", v.good_count, htc::verify::spans(&v.good));
    for (span, why) in &v.bad {
        let n = span.end() - span.start() + 1;
        println!("  not readable: {n} ({}): {why}", htc::verify::spans(std::slice::from_ref(span)));
    }
    for n in &v.notes {
        println!("  {n}");
    }
    Ok(1)
}
