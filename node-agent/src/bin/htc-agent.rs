//! `htc-agent`: the daemon roles. `lead` is the leader in a Slurm batch step (started by the SPANK
//! plugin in place of the batch script); `work` is a node agent (started by `htc run` locally, or
//! by the leader's one `srun` step on every node).

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use htc::agent::{self, AgentConfig};
use htc::bootstrap::{self, Kvs};
use htc::cli::agent::{Cli, Cmd, LeadArgs, WorkArgs, DEFAULT_FANOUT};
use htc::leader::{self, LeaderConfig};
use htc::liveness::Liveness;
use htc::load::{self, CreateError};
use htc::pmi::Pmi;
use htc::rundir::{RunDir, RunLock};
use htc::{executor, prologue, slurm};
use htc_core::hflow::Params;
use htc_core::taskfile::TaskOptions;
use htc_core::tree::Tree;
use std::sync::Arc;

fn main() -> ExitCode {
    // `--script` ends the options: what follows is the batch step's own argv, verbatim.
    let mut argv: Vec<OsString> = std::env::args_os().collect();
    let script_at = argv.iter().position(|a| a == "--script");
    let script: Vec<OsString> = match script_at {
        Some(i) => {
            let rest = argv.split_off(i);
            rest.into_iter().skip(1).collect()
        }
        None => Vec::new(),
    };
    let cli = Cli::parse_from(argv);
    // The leader's stderr is the job's output file: only what the user should read goes there.
    htc::init_logging(if matches!(cli.cmd, Cmd::Lead(_)) { "warn" } else { "info" });
    let r = match cli.cmd {
        Cmd::Lead(a) => lead(a, script),
        Cmd::Work(a) => work(a).map(|()| 0),
    };
    match r {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("htc-agent: {e:#}");
            ExitCode::FAILURE
        }
    }
}

// Long (about 80 lines): a quarter of it names every option of `WorkArgs`, so that adding one
// that this function ignores fails to compile; the rest is the agent's start, in order.
fn work(a: WorkArgs) -> anyhow::Result<()> {
    // Before any thread: a guard process that stops the tasks should the agent die.
    htc::guard::split().context("starting the agent's guard")?;
    let WorkArgs {
        leader,
        run_dir,
        agent_id,
        slurm,
        slots,
        cpus,
        mem_mb,
        gpus,
        mem_limit,
        output,
        fanout,
        agents,
        first_agent,
        count,
        exec,
        spawners,
        instance_size,
        lost_after_ms,
        keep_daemons,
        await_leader_s,
    } = a;
    let keep_daemons = keep_daemons || std::env::var_os("HTC_KEEP_DAEMONS").is_some_and(|v| v == "1");
    let fanout = fanout.max(1);
    let cpus: Vec<usize> = cpus
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.trim().parse().with_context(|| format!("bad CPU number '{s}' in --cpus")))
        .collect::<anyhow::Result<_>>()?;
    let Share { agent_id, agents, cpus_on_node, agents_on_node, local_index, slots, cpus } =
        Share::of(slurm, agent_id, agents, slots, cpus)?;
    let slots =
        slots.unwrap_or_else(|| if cpus.is_empty() { executor::allowed_cpus().len() } else { cpus.len() }).max(1);
    let mem_mb = mem_mb.unwrap_or_else(|| {
        let facts = htc::memory::detect(slurm, cpus_on_node as u64, agents_on_node as u64);
        let (mb, from) = htc::memory::budget_mb(&facts);
        tracing::info!(agent = agent_id, mem_mb = mb, from, "memory for tasks");
        mb
    });
    let (devices, from) = htc::gpu::detect(gpus.as_deref());
    if !devices.is_empty() {
        tracing::info!(agent = agent_id, gpus = %htc::gpu::visible(&devices), from, "GPUs of the node");
    }
    let run = RunDir::new(run_dir);
    let count = count.max(1);
    if agent_id.saturating_add(count) > agents.max(count) {
        bail!("agents {agent_id}..{} are not all among the job's {agents}", agent_id.saturating_add(count));
    }
    // A joined allocation's agents graft onto the run's tree after the agents before them.
    let tree = std::sync::Arc::new(htc_core::tree::Tree::grafted(first_agent, agents, instance_size, fanout));
    let ids = first_agent + agent_id..first_agent + agent_id + count;
    let places = place(&tree, ids, slurm, leader, &run)?;
    let mut cfgs = Vec::new();
    for (id, place) in places {
        cfgs.push(AgentConfig {
            parent: place.parent,
            leader,
            tree: tree.clone(),
            relay: place.relay,
            run: run.clone(),
            agent_id: id,
            slots,
            cpus: cpus.clone(),
            mem_mb,
            mem_limit,
            // Locally all agents share the machine; under Slurm those of this node do.
            gpus: htc::gpu::share(&devices, agents_on_node, if slurm { local_index } else { id as usize }),
            output,
            kill_grace: Duration::from_secs(3),
            flush_every: agent::FLUSH_EVERY,
            report_gap: agent::report_gap(),
            exec,
            spawners,
            live: Liveness::new(Duration::from_millis(lost_after_ms)),
            keep_daemons,
            await_leader: (await_leader_s > 0).then(|| Duration::from_secs(await_leader_s)),
        });
    }
    if cfgs.len() == 1 {
        agent::run(cfgs.pop().unwrap())
    } else {
        agent::run_many(cfgs)
    }
}

/// Where each of agents `ids` connects: up to `fanout` agents (or instance heads) talk to the
/// leader directly; more form a tree, and members connect to their head. The addresses travel
/// through the srun step's PMI2 key-value space (or, locally, files in the run directory).
fn place(
    tree: &htc_core::tree::Tree,
    ids: std::ops::Range<u32>,
    slurm: bool,
    leader: std::net::SocketAddr,
    run: &RunDir,
) -> anyhow::Result<Vec<(u32, bootstrap::Place)>> {
    let agents = tree.len();
    let mut kvs = None;
    if (0..agents).any(|a| tree.parent(a).is_some()) {
        let first = tree.heads().first().copied().unwrap_or(0);
        kvs = Some(match Pmi::from_env().context("PMI2 bootstrap")? {
            Some(p) => Kvs::Pmi(p),
            None if slurm => bail!("{agents} agents need the tree, but PMI2 is missing (srun --mpi=pmi2)"),
            None => Kvs::Files(leader::launch::tree_dir(&run.path, first)),
        });
    }
    let ip = if slurm { slurm::node_ip() } else { std::net::Ipv4Addr::LOCALHOST.into() };
    let mut places = Vec::new();
    // In id order: a parent always has a smaller id, so its address is published first.
    for id in ids {
        let place = match kvs.as_mut() {
            Some(kvs) => bootstrap::place(kvs, id, tree, leader, ip)?,
            None => bootstrap::Place { parent: leader, relay: None },
        };
        places.push((id, place));
    }
    if let Some(Kvs::Pmi(p)) = kvs {
        p.finalize().context("PMI2 finalize")?;
    }
    Ok(places)
}

/// This agent's place on its node: its id among the job's agents, the node's CPUs and agents
/// (whose memory and GPUs they share), and its own slots and CPUs. Locally, as given; under
/// Slurm, from the step's environment, the node's CPUs split among the agents on it.
struct Share {
    agent_id: u32,
    agents: u32,
    cpus_on_node: usize,
    agents_on_node: usize,
    local_index: usize,
    slots: Option<usize>,
    cpus: Vec<usize>,
}

impl Share {
    fn of(slurm: bool, agent_id: u32, agents: u32, slots: Option<usize>, cpus: Vec<usize>) -> anyhow::Result<Share> {
        // The node's memory is shared by the agents on it: all of them locally.
        let local = Share {
            agent_id,
            agents,
            cpus_on_node: executor::allowed_cpus().len(),
            agents_on_node: agents as usize,
            local_index: 0,
            slots,
            cpus,
        };
        if !slurm {
            return Ok(local);
        }
        let agent_id = slurm::var("SLURM_PROCID")?.parse().context("$SLURM_PROCID")?;
        let agents = slurm::var("SLURM_NTASKS")?.parse().context("$SLURM_NTASKS")?;
        let node: usize = slurm::var("SLURM_NODEID")?.parse().context("$SLURM_NODEID")?;
        let spec = slurm::var("SLURM_JOB_CPUS_PER_NODE")?;
        let n = slurm::cpus_on_node(&spec, node)
            .with_context(|| format!("node {node} not in SLURM_JOB_CPUS_PER_NODE={spec}"))?;
        // Agents sharing the node split its CPUs (srun --whole gives each all of them).
        let local_index: usize = slurm::var("SLURM_LOCALID")?.parse().context("$SLURM_LOCALID")?;
        let tasks_spec = slurm::var("SLURM_STEP_TASKS_PER_NODE").or_else(|_| slurm::var("SLURM_TASKS_PER_NODE"));
        let on_node = tasks_spec.ok().and_then(|t| slurm::cpus_on_node(&t, node)).unwrap_or(1);
        let (first, mine) = slurm::node_share(n, on_node, local_index);
        let mut cpus = local.cpus;
        if cpus.is_empty() {
            let allowed = executor::allowed_cpus();
            cpus = (first..first + mine).map(|i| allowed[i % allowed.len()]).collect();
        }
        let slots = Some(local.slots.unwrap_or(mine));
        Ok(Share { agent_id, agents, cpus_on_node: n, agents_on_node: on_node, local_index, slots, cpus })
    }
}

/// `htc resume`'s job: continues the run of job `earlier` in `base/.htc`, reachable under this
/// job's id too (a link), so that `htc status` and `htc output` work with either id.
fn resume_run(
    base: &std::path::Path,
    earlier: u32,
    job_id: &str,
    local: &std::path::Path,
    ledger_dir: Option<&std::path::Path>,
) -> anyhow::Result<Result<(RunDir, String), String>> {
    let runs = base.join(".htc");
    let Ok(path) = std::fs::canonicalize(runs.join(earlier.to_string())) else {
        return Ok(Err(format!("job {earlier} left no run in {} to resume", runs.display())));
    };
    let run = RunDir::new(path);
    if !is_complete(&run) {
        return Ok(Err(format!("{} is not a complete run; nothing to resume", run.path.display())));
    }
    let (run, n) = {
        let _lock = run.lock()?;
        let run = adopt(run, local)?;
        let n = leader::driver::reset_interrupted(&run)?;
        // What a killed leader of this run left on this node's disk is behind the replica now.
        let earlier: Vec<String> = run.job_ids().into_iter().filter(|id| id != job_id).collect();
        for d in htc::replica::remove_stale_node_local(ledger_dir, &earlier) {
            tracing::info!(job = job_id, dir = %d.display(), "removed an earlier session's node-local ledger");
        }
        (run, n)
    };
    link_job(&run, job_id)?;
    let said =
        format!("htc: job {job_id} continues the run of job {earlier} ({n} tasks left to run, those in flight when it stopped among them)");
    Ok(Ok((run, said)))
}

/// Whether a Slurm job's run finished loading: its replica has a snapshot (written once the
/// tasks are in), or, in a run directory from before the ledger moved to the node, the ledger in
/// it has its total.
/// `.htc/JOB` beside the run, naming it: the job continuing it is another name of the run.
fn link_job(run: &RunDir, job_id: &str) -> anyhow::Result<()> {
    let link = run.path.with_file_name(job_id);
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(run.path.file_name().unwrap_or_default(), &link)
        .with_context(|| format!("linking {} to the run", link.display()))
}

fn is_complete(run: &RunDir) -> bool {
    let legacy = || {
        run.ledger().exists()
            && htc::ledger::Ledger::open(&run.ledger(), true)
                .ok()
                .and_then(|l| l.read().ok()?.meta_u64("total").ok()?)
                .is_some()
    };
    run.secret().exists() && (htc::replica::Replica::of(&run.path).exists() || legacy())
}

/// `RunDir::take_over`, with the run named in its error.
fn adopt(run: RunDir, local: &std::path::Path) -> anyhow::Result<RunDir> {
    let path = run.path.clone();
    run.take_over(local).with_context(|| format!("rebuilding the ledger of {} on this node", path.display()))
}

/// The batch step: load the tasks, run the script as the prologue, start the agents with one
/// srun, lead until every task is finished. The exit code is the job's.
fn lead(a: LeadArgs, script: Vec<OsString>) -> anyhow::Result<i32> {
    let Some((script, script_args)) = script.split_first() else {
        bail!("missing --script SCRIPT (the plugin passes the batch script)");
    };
    let job_id = slurm::var("SLURM_JOB_ID")?;
    let nodes: usize =
        slurm::var("SLURM_JOB_NUM_NODES").or_else(|_| slurm::var("SLURM_NNODES"))?.parse().context("node count")?;
    if let Some(run) = &a.join_run {
        let run = join_run_dir(run, &std::env::current_dir()?);
        return join(&a, &run, &job_id, nodes, script, script_args);
    }
    // The ledger on this node's disk; the run directory (shared) keeps its replica.
    let local = match htc::replica::node_local(a.ledger_dir.as_deref(), &job_id) {
        Ok(p) => p,
        Err(why) => {
            eprintln!("htc: {why}");
            return Ok(2);
        }
    };
    let base = std::env::current_dir()?;
    let existing = RunDir::new(base.join(".htc").join(&job_id));
    // A requeue that interrupted the first load finds no snapshot: start over.
    let complete = is_complete(&existing);
    if existing.path.exists() && !complete {
        std::fs::remove_dir_all(&existing.path)
            .with_context(|| format!("removing the incomplete {}", existing.path.display()))?;
    }
    let (run, said) = if complete {
        let _lock = existing.lock()?;
        // A requeued job: continue from its ledger.
        let run = adopt(existing, &local)?;
        let n = leader::driver::reset_interrupted(&run)?;
        (run, format!("htc: job {job_id} restarted; continuing its run ({n} tasks left to run, those in flight when it stopped among them)"))
    } else if let Some(earlier) = a.resume_run {
        match resume_run(&base, earlier, &job_id, &local, a.ledger_dir.as_deref())? {
            Ok(run) => run,
            Err(why) => {
                eprintln!("htc: {why}");
                return Ok(2);
            }
        }
    } else {
        let mut defaults = TaskOptions::default();
        if let Some(r) = a.retries {
            defaults.retries = r;
        }
        let file = a.task_file.clone().context("missing --task-file")?;
        match load::create_run(&base, &job_id, &file, a.output, defaults, Some(local.clone())) {
            Ok((run, loaded)) => {
                (run, format!("htc: job {job_id}: {} tasks from {} on {nodes} node(s)", loaded.tasks, file.display()))
            }
            Err(CreateError::Load(e)) => {
                eprintln!("htc: {e}");
                return Ok(2);
            }
            Err(e) => return Err(e.into()),
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
    let code = lead_run(a, &job_id, nodes, &run, script, script_args);
    if let Some(k) = kept {
        k.end();
    }
    // The replica holds everything now (its last snapshot); the node's disk is the admin's.
    if run.replicated() && htc::replica::Replica::of(&run.path).exists() {
        htc::replica::remove_node_local(&run.ledger());
    }
    code
}

/// `--htc-join`: this job's nodes join the running run of job `run_job` (in the submit
/// directory's `.htc/`): the batch script runs as this job's prologue, the leader gives its
/// agents their ids, and one srun step starts them. When they end, so does the job: the run
/// ended, or this job's time came (the leader told them to leave). Should the leader's own job
/// end first (its time limit, `scancel`, its node lost), this job takes the run over and leads it
/// from its replica; should another joined job have done so already, it joins that one.
fn join(
    a: &LeadArgs,
    run: &std::path::Path,
    job_id: &str,
    nodes: usize,
    script: &OsString,
    script_args: &[OsString],
) -> anyhow::Result<i32> {
    let run = RunDir::new(run.to_path_buf());
    let p = match prologue::run(
        std::path::Path::new(script),
        script_args,
        &run.path.join(format!("prologue-{job_id}.env")),
    ) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("htc: {e}");
            return Ok(1);
        }
    };
    prologue::adopt(&p).context("entering the batch script's environment")?;
    // Its agents hand back and leave before Slurm's KillWait would cut them off.
    let ends_us = slurm::time_left().map(|left| htc::rundir::now_us() + left.saturating_sub(30_000_000));
    let mut kept = None;
    loop {
        let survivors = match join_once(a, &run, job_id, nodes, ends_us, kept.take()) {
            // The leader that took this job in still leads: it told the agents to leave (this
            // job's time, or other jobs waiting for its nodes).
            Ok(Stay::Ended { leader }) if still_leads(&run, &leader) => {
                println!("htc: job {job_id}: its leader let it go; it has left the run");
                return Ok(0);
            }
            Ok(Stay::Ended { .. }) => None,
            Ok(Stay::LeaderGone(s)) => {
                println!(
                    "htc: job {job_id}: the run's leader is gone; its agents wait, with their tasks, for the next"
                );
                Some(s)
            }
            // The leader went before this job could join: perhaps for good.
            Err(e @ (htc::join::JoinError::NotRunning { .. } | htc::join::JoinError::NoAnswer { .. })) => {
                println!("htc: job {job_id}: {e}");
                None
            }
            Err(e) => {
                eprintln!("htc: job {job_id} cannot join: {e}");
                return Ok(2);
            }
        };
        if ends_us.is_some_and(|end| htc::rundir::now_us() >= end) {
            println!("htc: job {job_id}: its time is up; it has left the run");
            return Ok(0);
        }
        match next_leader(&run)? {
            Next::Ended => {
                println!("htc: job {job_id}: the run has ended");
                return Ok(0);
            }
            Next::Join => {
                // Another job leads now: this one attaches to it again, keeping its agents' ids
                // (they go to that leader with their tasks by themselves); without hammering
                // one that does not answer yet.
                kept = survivors;
                if kept.is_none() {
                    std::thread::sleep(Duration::from_secs(1));
                }
                continue;
            }
            Next::Lead(lock) => return take_over(a, &run, job_id, nodes, lock, survivors),
        }
    }
}

/// The run directory `--join-run` names: a job id is `.htc/JOBID` in the submit directory
/// (`base`), anything else a path.
fn join_run_dir(run: &std::path::Path, base: &std::path::Path) -> std::path::PathBuf {
    match run.to_str().filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())) {
        Some(job) => base.join(".htc").join(job),
        None => base.join(run),
    }
}

/// How long a joined job's agents wait, with their tasks, for the run's next leader when theirs
/// goes (`WorkArgs::await_leader_s`): a job of theirs takes the run over within seconds.
const AWAIT_LEADER_S: u64 = 60;

/// How long a leader that took the run over waits for its agents to say what they kept before
/// it hands out anything (`LeaderConfig::handover`).
const HANDOVER_SETTLE: Duration = Duration::from_secs(20);

/// How a stay in the run ended.
enum Stay {
    /// This job's agents ended: the run ended, or `leader` (the job that led it) let them go.
    Ended { leader: String },
    /// The leader's link closed while this job's agents still run: they wait for a new leader.
    LeaderGone(Survivors),
}

/// A joined job's agents, still running after their leader went, with the tasks they hold:
/// should this job take the run over, they are its agents (`lead_session`).
struct Survivors {
    agents: leader::launch::Agents,
    /// What the srun step's watcher says (its end), for the new leader's core.
    events: std::sync::mpsc::Receiver<leader::driver::Event>,
    layout: Arc<Tree>,
    first: u32,
    fanout: u32,
}

/// One stay in the run: attach, start this job's agents (or, after a hand-over, go on with
/// those that kept their tasks: `kept`), wait for them to end or for the leader to go.
fn join_once(
    a: &LeadArgs,
    run: &RunDir,
    job_id: &str,
    nodes: usize,
    ends_us: Option<u64>,
    kept: Option<Survivors>,
) -> Result<Stay, htc::join::JoinError> {
    let agents_per_node = a.agents_per_node.unwrap_or(1).max(1);
    let instance_size = (a.instance_nodes.unwrap_or(1).max(1) * agents_per_node) as u32;
    let req = htc::join::Request {
        job: job_id.to_string(),
        agents: (nodes * agents_per_node) as u32,
        instance_size,
        nodes: nodes as u32,
        cores: slurm::job_cpus().unwrap_or(nodes as u64),
        ends_us,
        cluster: slurm::cluster_name(),
        keep_first: kept.as_ref().map(|s| s.first),
    };
    let joined = match htc::join::attach(run, &req) {
        Ok(j) => j,
        // Its agents work on for the leader as they are (their own links held: it was only this
        // launcher's that broke), or stop: either way they end first, and then so does this
        // stay, as one its leader let go.
        Err(e) if kept.is_some() => {
            println!("htc: job {job_id}: its agents could not keep their places ({e}); they finish first");
            if let Some(mut s) = kept {
                s.agents.wait(Duration::from_secs(365 * 86_400));
            }
            let leader = run.leader_at().ok().flatten().map(|at| at.job).unwrap_or_default();
            return Ok(Stay::Ended { leader });
        }
        Err(e) => return Err(e),
    };
    if let Err(e) = joined.enter_workdir() {
        println!(
            "htc: job {job_id}: the run's tasks run in {}, which it cannot enter ({e}); its own run here",
            joined.workdir
        );
    }
    let first = joined.first_agent;
    let last = first as usize + nodes * agents_per_node - 1;
    let gone = joined.leader_gone().ok();
    let (mut agents, events, fanout) = match kept {
        Some(s) => {
            println!(
                "htc: job {job_id} stays in run {} with its agents {first}..{last}, which kept their tasks",
                run.path.display()
            );
            (s.agents, s.events, s.fanout)
        }
        None => {
            println!(
                "htc: job {job_id} joins run {} (job {}) with {nodes} node(s): agents {first}..{last}",
                run.path.display(),
                joined.run_job,
            );
            let site = htc::site::Site::load().unwrap_or_default();
            let srun = leader::srun::Srun {
                agent_bin: leader::launch::agent_binary(),
                nodes,
                agents_per_node,
                spawners: agent::default_spawners(joined.widest_task),
                output: joined.output.parse().unwrap_or(a.output),
                fanout: joined.fanout,
                instance_size,
                lost_after: site.lost_after,
                first_agent: first,
                // Agents with members would have to carry theirs through a hand-over too: they
                // do not wait (`Instance::with_await_leader`), and a new leader starts its own.
                await_leader_s: if instance_size == 1 { AWAIT_LEADER_S } else { 0 },
            };
            // Agents that never join are the leader's to notice (this allocation's end tells
            // it); after a hand-over, this job's own leader's.
            let (tx, events) = std::sync::mpsc::channel();
            match srun.start(run, joined.leader, tx) {
                Ok(agents) => (agents, events, joined.fanout),
                Err(e) => {
                    println!("htc: job {job_id}: its agents did not start: {e:#}");
                    return Ok(Stay::Ended { leader: joined.leader_job.clone() });
                }
            }
        }
    };
    while !agents.wait(Duration::from_millis(250)) {
        if instance_size == 1 && gone.as_ref().is_some_and(|g| g.try_recv().is_ok()) {
            let layout = Arc::new(Tree::grafted(first, req.agents, 1, fanout));
            return Ok(Stay::LeaderGone(Survivors { agents, events, layout, first, fanout }));
        }
    }
    let leader = joined.leader_job.clone();
    drop(joined);
    println!("htc: job {job_id}: its agents have ended");
    Ok(Stay::Ended { leader })
}

/// Whether the leader of job `leader` still leads the run: its address is published and its
/// live view is fresh (a leader killed outright leaves the one, not the other).
fn still_leads(run: &RunDir, leader: &str) -> bool {
    let published = run.leader_at().ok().flatten().is_some_and(|at| at.job == leader);
    let fresh = htc::livefile::read(&run.path).ok().flatten().is_some_and(|v| {
        v.job == leader && v.state == "running" && htc::rundir::now_us().saturating_sub(v.now_us) < 5_000_000
    });
    published && fresh
}

/// What a joined job does once its agents have ended and its time is not up.
enum Next {
    /// The run has no task left.
    Ended,
    /// Another job leads the run now: join it.
    Join,
    /// Nobody leads it: this job does, holding the run's lock.
    Lead(RunLock),
}

/// Who leads the run now: the lock is held by whoever leads (the old leader while it writes its
/// last snapshot, or a joined job that took over); once it is free, the run is this job's.
fn next_leader(run: &RunDir) -> anyhow::Result<Next> {
    let end = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        match run.lock() {
            Ok(lock) => {
                let left = htc::ledger::Ledger::open(&RunDir::open_for_reading(run.path.clone())?.ledger(), true)?
                    .read()?
                    .counts()?
                    .unfinished();
                return Ok(if left == 0 { Next::Ended } else { Next::Lead(lock) });
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                // A leader that has published its address takes joins: this job's, too.
                if run.leader_at().ok().flatten().is_some() {
                    return Ok(Next::Join);
                }
                if std::time::Instant::now() > end {
                    bail!("the run's lock is held, but nobody leads it, for 120 s");
                }
                std::thread::sleep(Duration::from_millis(250));
            }
            Err(e) => return Err(e).context("locking the run"),
        }
    }
}

/// The run's leader is gone and this job has its lock: it rebuilds the ledger from the replica on
/// this node, makes what was in flight pending again, and leads the run with its own nodes.
fn take_over(
    a: &LeadArgs,
    run: &RunDir,
    job_id: &str,
    nodes: usize,
    lock: RunLock,
    survivors: Option<Survivors>,
) -> anyhow::Result<i32> {
    let local = match htc::replica::node_local(a.ledger_dir.as_deref(), job_id) {
        Ok(p) => p,
        Err(why) => {
            eprintln!("htc: {why}");
            return Ok(2);
        }
    };
    let run = adopt(run.clone(), &local)?;
    let n = leader::driver::reset_interrupted(&run)?;
    link_job(&run, job_id)?;
    println!(
        "htc: job {job_id} takes the run over ({n} tasks left to run, those in flight when its leader went among them)"
    );
    // The run's own settings, not the joining job's defaults.
    let mut a = a.clone();
    let l = htc::ledger::Ledger::open(&run.ledger(), true)?;
    if let Some(mode) = l.read()?.meta("output")?.and_then(|b| std::str::from_utf8(b).ok()?.parse().ok()) {
        a.output = mode;
    }
    drop(l);
    let code = lead_session(&a, job_id, nodes, &run, lock, survivors);
    if run.replicated() && htc::replica::Replica::of(&run.path).exists() {
        htc::replica::remove_node_local(&run.ledger());
    }
    code
}

/// The session, once its run is ready: the batch script as the prologue, the agents, the tasks.
fn lead_run(
    a: LeadArgs,
    job_id: &str,
    nodes: usize,
    run: &RunDir,
    script: &OsString,
    script_args: &[OsString],
) -> anyhow::Result<i32> {
    let p = match prologue::run(std::path::Path::new(script), script_args, &run.path.join("prologue.env")) {
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
    let lock = run.lock()?;
    lead_session(&a, job_id, nodes, run, lock, None)
}

/// Leads a session of `run` with this job's nodes, holding the run's lock: one srun step of
/// agents (or, after a hand-over, the agents this job already runs, with their tasks), the
/// leader until the run ends or this job does; then the resubmission, if due.
fn lead_session(
    a: &LeadArgs,
    job_id: &str,
    nodes: usize,
    run: &RunDir,
    lock: RunLock,
    survivors: Option<Survivors>,
) -> anyhow::Result<i32> {
    let every = std::env::var("HTC_PROGRESS_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(30u64);
    let fanout = a.fanout.unwrap_or(DEFAULT_FANOUT).max(1);
    let site = htc::site::Site::load()?;
    let widest = load::widest_task(&htc::ledger::Ledger::open(&run.ledger(), true)?)?;
    // One agent per node by default: its spawn loops keep the node's CPUs busy, and the leader
    // hears from one agent per node.
    let agents_per_node = a.agents_per_node.unwrap_or(1).max(1);
    let spawners = agent::default_spawners(widest);
    let instance_size = (a.instance_nodes.unwrap_or(1).max(1) * agents_per_node) as u32;
    let layout = match &survivors {
        Some(s) => s.layout.clone(),
        None => Arc::new(Tree::instances((nodes * agents_per_node) as u32, instance_size, fanout)),
    };
    let srun = leader::srun::Srun {
        agent_bin: leader::launch::agent_binary(),
        nodes,
        agents_per_node,
        spawners,
        output: a.output,
        fanout,
        instance_size,
        lost_after: site.lost_after,
        first_agent: 0,
        await_leader_s: 0,
    };
    // The job's end, less Slurm's default KillWait for the session to end well.
    let deadline_us = slurm::time_left().map(|left| htc::rundir::now_us() + left.saturating_sub(30_000_000));
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
        deadline_us,
        mem_policy: Default::default(),
        no_steal: false,
        grow: a.grow.map(|spec| {
            let own_minutes = slurm::time_left().map_or(60, |us| us.div_ceil(60_000_000));
            let submit = Arc::new(SbatchJoin { run: run.clone(), own_options: slurm::own_job_options() });
            leader::grow::Growing::new(spec, own_minutes, submit)
        }),
        handover: survivors
            .as_ref()
            .map(|_| leader::Handover { wait: HANDOVER_SETTLE, others: others_kept(run, job_id) }),
    };
    note_resume_args(run, nodes, a)?;
    if let Some(s) = &survivors {
        println!("htc: job {job_id} leads the run with its {} agent(s), which kept their tasks", s.agents.count);
    }
    let outcome = leader::run(cfg, |addr, tx| match survivors {
        // They find this leader through the address it publishes.
        Some(s) => {
            let events = s.events;
            std::thread::spawn(move || events.iter().for_each(|e| drop(tx.send(e))));
            Ok(s.agents)
        }
        None => srun.start(run, addr, tx),
    })?;
    let code = htc::status::finish(run, &outcome, false);
    drop(lock);
    let at_limit = deadline_us.is_some_and(|d| htc::rundir::now_us() >= d);
    let joined = outcome.progress.joined_running;
    if joined > 0 && outcome.ending != leader::Ending::Complete {
        // One of them takes the run over (`join`): no resubmission.
        println!("htc: {joined} joined job(s) still run: one of them takes the run over");
    } else if let Some(max) = a.resubmit.filter(|_| resubmit_due(&outcome.ending, at_limit)) {
        if let Err(e) = resubmit(run, max) {
            println!("htc: could not resubmit: {e:#}");
        }
    }
    code
}

/// Agents of the run's other joined jobs that may come to a leader taking the run over with
/// their tasks: those of one-agent instances (the only ones that wait for a new leader) of jobs
/// still running when the old leader last wrote its live view.
fn others_kept(run: &RunDir, job_id: &str) -> usize {
    let Ok(Some(view)) = htc::livefile::read(&run.path) else { return 0 };
    view.allocations
        .iter()
        .filter(|a| a.job != job_id && a.state == "running" && a.agents == a.nodes)
        .map(|a| a.agents as usize)
        .sum()
}

/// Grown jobs (`--htc-grow`): `sbatch --htc-join=RUN` from the submit directory with the run's
/// own job's options (its partition, account, memory, ...) but the grown shape, and `scancel`.
struct SbatchJoin {
    run: RunDir,
    own_options: Vec<String>,
}

impl SbatchJoin {
    /// sbatch from the submit directory with the run's own job's options but `shape`.
    fn sbatch(&self, (nodes, minutes): htc_core::grow::Shape) -> anyhow::Result<std::process::Command> {
        let mut cmd = sbatch_for(&self.run)?;
        cmd.args(self.own_options.iter().filter(|o| !o.starts_with("--time=") && !o.starts_with("--nodes=")))
            .arg(format!("--nodes={nodes}"))
            .arg(format!("--time={minutes}"));
        Ok(cmd)
    }

    /// The shape to submit: the asked one, or a smaller one that the scheduler says starts
    /// sooner (a hole in its plan): one `sbatch --test-only` per shape it asks about.
    fn fit(&self, asked: htc_core::grow::Shape) -> htc_core::grow::Shape {
        let starts: Vec<_> = htc_core::grow::fit_shapes(asked)
            .into_iter()
            .map(|shape| {
                let out = self.sbatch(shape).ok().and_then(|mut c| c.arg("--test-only").arg("--wrap=:").output().ok());
                (shape, out.and_then(|o| slurm::test_only_start(&String::from_utf8_lossy(&o.stderr))))
            })
            .collect();
        let Some(shape) = htc_core::grow::pick_fit(&starts, 60) else { return asked };
        if shape != asked {
            let when = |s| starts.iter().find(|(x, _)| *x == s).and_then(|(_, t)| *t).unwrap_or(0);
            println!(
                "htc: grow: cut to {} node(s) for {} min to fit a hole: it starts {} s sooner",
                shape.0,
                shape.1,
                when(asked).saturating_sub(when(shape))
            );
        }
        shape
    }
}

impl leader::grow::Submit for SbatchJoin {
    fn submit(&self, nodes: u32, minutes: u64, reason: &str) -> Result<String, String> {
        println!("htc: grow: submitting a job of {nodes} node(s) for {minutes} min to join the run: {reason}");
        let (nodes, minutes) = self.fit((nodes, minutes));
        let mut cmd = self.sbatch((nodes, minutes)).map_err(|e| e.to_string())?;
        cmd.arg("--parsable").arg(format!("--htc-join={}", self.run.id())).arg("--wrap=:");
        let out = cmd.output().map_err(|e| format!("running sbatch: {e}"))?;
        if !out.status.success() {
            let why = format!("sbatch: {}", String::from_utf8_lossy(&out.stderr).trim());
            println!("htc: grow: {why}");
            return Err(why);
        }
        let job = String::from_utf8_lossy(&out.stdout).trim().split(';').next().unwrap_or_default().to_string();
        println!("htc: grow: submitted job {job}");
        Ok(job)
    }

    fn cancel(&self, jobs: &[String]) {
        println!("htc: grow: the run has ended; cancelling job(s) {} that never joined it", jobs.join(" "));
        let _ = std::process::Command::new("scancel").args(jobs).status();
    }

    fn queue(&self) -> Option<leader::grow::Queue> {
        let out = std::process::Command::new("squeue").args(["-h", "-o", "%i %t %r"]).output().ok()?;
        out.status.success().then(|| leader::grow::Queue::parse(&String::from_utf8_lossy(&out.stdout)))
    }
}

/// What `htc resume` asks for when told nothing else: the run's shape, and the job's own options
/// as the user gave them (an `htc resume -- OPTIONS` or resubmission puts what it is told after
/// them, and sbatch takes the last).
fn note_resume_args(run: &RunDir, nodes: usize, a: &LeadArgs) -> anyhow::Result<()> {
    let l = htc::ledger::Ledger::open(&run.ledger(), false)?;
    let mut t = l.write()?;
    t.put_meta("slurm_nodes", &(nodes as u64).to_le_bytes())?;
    let mut args = slurm::own_job_options();
    args.extend(resume_args(nodes, a));
    t.put_meta("resume_sbatch", args.join("\n").as_bytes())?;
    t.commit()?;
    Ok(())
}

/// Whether a session that ended so continues in a resubmitted job (`--htc-resubmit`): out of
/// time, agents lost, or SIGTERM at the time limit; not when someone cancelled the job (SIGTERM
/// before the limit) or the run ended.
fn resubmit_due(ending: &leader::Ending, at_limit: bool) -> bool {
    match ending {
        leader::Ending::OutOfTime(_) | leader::Ending::AgentsLost(_) => true,
        leader::Ending::Interrupted(sig) => *sig == libc::SIGTERM && at_limit,
        _ => false,
    }
}

/// An `sbatch` for a job of `run`: from its submit directory (the run lives in its .htc/),
/// without this job's variables (they would shape the new job like this one).
fn sbatch_for(run: &RunDir) -> anyhow::Result<std::process::Command> {
    let submit_dir = run.path.parent().and_then(|p| p.parent()).context("the run directory has no parent")?;
    let mut cmd = std::process::Command::new("sbatch");
    cmd.current_dir(submit_dir);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if (k.starts_with("SLURM_") || k.starts_with("SBATCH_")) && k != "SLURM_CONF" {
            cmd.env_remove(k.as_ref());
        }
    }
    Ok(cmd)
}

/// `--htc-resubmit=N`: submits the job that continues this run, as `htc resume` would, unless
/// the run was resubmitted N times already (the count is kept in the ledger).
fn resubmit(run: &RunDir, max: u32) -> anyhow::Result<()> {
    let mut ledger = htc::ledger::Ledger::open(&run.ledger(), false)?;
    if run.replicated() {
        ledger.attach_journal(htc::replica::Replica::of(&run.path).writer()?);
    }
    let done = ledger.read()?.meta_u64("resubmits")?.unwrap_or(0);
    if done >= max as u64 {
        println!("htc: not resubmitting: the run was resubmitted {done} times already (--htc-resubmit={max})");
        return Ok(());
    }
    let args: Vec<String> = ledger
        .read()?
        .meta("resume_sbatch")?
        .map(|a| String::from_utf8_lossy(a).lines().map(String::from).collect())
        .unwrap_or_default();
    let mut t = ledger.write()?;
    t.put_meta("resubmits", &(done + 1).to_le_bytes())?;
    t.commit()?;
    let mut file = OsString::from("--htc=");
    file.push(htc::load::file_for_sbatch(run, &ledger)?);
    let mut cmd = sbatch_for(run)?;
    cmd.arg(file).arg(format!("--htc-resume={}", run.id())).args(&args).arg("--wrap=:");
    let out = cmd.output().context("running sbatch")?;
    let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() {
        bail!("sbatch: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    println!("htc: resubmitted ({} of {max}): {said}", done + 1);
    Ok(())
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
