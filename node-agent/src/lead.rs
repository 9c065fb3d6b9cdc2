//! What `htc-agent lead` does with a run, apart from the run's life (`htc_engine::lifecycle`,
//! driven in the binary): prepare this job's run (a requeued job's own, an earlier one's, or a new
//! one from the task file), and lead a session of it with this job's nodes.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use htc_core::hflow::Params;
use htc_core::taskfile::TaskShape;
use htc_core::tree::Tree;
use htc_engine::lifecycle;
use htc_node::continuation::{self, adopt, is_complete};
use htc_node::joined::Survivors;
use htc_node::submit;

use crate::cli::agent::{LeadArgs, DEFAULT_FANOUT};
use crate::leader::{self, LeaderConfig};
use crate::liveness::Liveness;
use crate::load::{self, CreateError};
use crate::rundir::{now_us, RunDir};
use crate::slurm;

/// How long a leader that took the run over waits for its agents to say what they kept before
/// it hands out anything (`LeaderConfig::handover`).
const HANDOVER_SETTLE: Duration = Duration::from_secs(20);

/// This job's run, ready to lead: a requeued job's own, an earlier job's (`--htc-resume`), or a
/// new one from the task file; with what to tell the user. `Err`: why there is none.
pub fn prepare(a: &LeadArgs, job_id: &str, nodes: usize) -> anyhow::Result<Result<(RunDir, String), String>> {
    // The ledger on this node's disk; the run directory (shared) keeps its replica.
    let local = match crate::replica::node_local(a.ledger_dir.as_deref(), job_id) {
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

pub fn prepare_with(
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
        let n = leader::driver::reset_interrupted(&run, leader::driver::Survivors::None)?;
        let said = format!("htc: job {job_id} restarted; continuing its run ({})", n.said());
        return Ok(Ok((run, said)));
    }
    if let Some(earlier) = a.resume_run {
        return continuation::resume_run(&base, earlier, job_id, local, a.ledger_dir.as_deref());
    }
    let mut defaults = TaskShape::default();
    if let Some(r) = a.retries {
        defaults.retries = r;
    }
    let file = a.task_file.as_deref();
    if file.is_none() && a.open.is_none() {
        anyhow::bail!("missing --task-file");
    }
    let open = a.open.map(|ms| load::OpenRun { idle_exit_ms: (ms > 0).then_some(ms) });
    match load::create_run(&base, job_id, file, a.output, defaults, Some(local.to_path_buf()), open) {
        Ok((run, loaded)) => {
            let what = match file {
                Some(f) => format!("{} tasks from {}", loaded.tasks, f.display()),
                None => "no tasks yet".to_string(),
            };
            let open = match a.open {
                None => String::new(),
                Some(0) => format!("; open: htc task add {job_id} … adds tasks, htc close {job_id} ends it"),
                Some(ms) => format!(
                    "; open: htc task add {job_id} … adds tasks, htc close {job_id} ends it, as do {} with nothing to do",
                    crate::status::fmt_duration(Duration::from_millis(ms))
                ),
            };
            Ok(Ok((run, format!("htc: job {job_id}: {what} on {nodes} node(s){open}"))))
        }
        Err(CreateError::Load(e)) => Ok(Err(e.to_string())),
        Err(e) => Err(e.into()),
    }
}

/// When the last session of `run` ended (the leader writes it as it stops): on a signal, its
/// arrival within a commit, which is what the time limit is judged by.
pub fn session_end_us(run: &RunDir) -> u64 {
    let ledger = crate::ledger::Ledger::open(&run.ledger(), true).ok();
    ledger.and_then(|l| l.read().ok()?.meta_u64("session_end_us").ok()?).unwrap_or_else(now_us)
}

/// Whether the run gives back the nodes nothing is left for (`--htc-keep-nodes`): by default
/// on the Slurm releases where that is known to free them at once (`slurm::GIVES_BACK_FROM`);
/// never after a hand-over, whose agents may be another job's.
fn gives_back(keep_nodes: Option<bool>, handed_over: bool) -> bool {
    let gives = match keep_nodes {
        Some(keep) => !keep,
        None => slurm::release().is_some_and(|r| r >= slurm::GIVES_BACK_FROM),
    };
    gives && !handed_over
}

/// Leads a session of `run` with this job's nodes, holding the run's lock: one srun step of
/// agents (or, after a hand-over, the agents this job already runs, with their tasks), the
/// leader until the run ends or this job does.
// Long (about 80 lines): most of it is the `LeaderConfig` and `Srun` literals, every field named,
// so that an option added to either is decided here or fails to compile.
pub fn lead_session(
    a: &LeadArgs,
    job_id: &str,
    nodes: usize,
    run: &RunDir,
    end_us: Option<u64>,
    survivors: Option<Survivors>,
) -> anyhow::Result<leader::Outcome> {
    let every = std::env::var("HTC_PROGRESS_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(30u64);
    let fanout = a.fanout.unwrap_or(DEFAULT_FANOUT).max(1);
    let site = crate::site::Site::load()?;
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
        spawners: crate::agent::LOOP_PER_SLOT,
        output: a.output,
        fanout,
        instance_size,
        lost_after: site.lost_after,
        mem_limit: site.mem_limit,
        first_agent: 0,
        await_leader_s: 0,
    };
    let cfg = LeaderConfig {
        run: run.clone(),
        job_id: job_id.to_string(),
        bind: std::net::SocketAddr::new(slurm::node_ip(), 0),
        advertise: Some(slurm::node_ip()),
        commit_interval: Duration::from_millis(10),
        progress: crate::status::sink(false, Some(Duration::from_secs(every.max(1)))),
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
        give_back_from: gives_back(a.keep_nodes, survivors.is_some())
            .then(|| slurm::var("SLURMD_NODENAME").ok())
            .flatten(),
        open_idle_give_back: site.open_idle_give_back,
        grow: a.grow.map(|spec| {
            let own_minutes = end_us.map_or(60, |e| e.saturating_sub(now_us()).div_ceil(60_000_000));
            let submit = Arc::new(submit::SbatchJoin { run: run.clone(), own_options: slurm::own_job_options() });
            let grower = htc_core::grow::Grower::new(spec).with_quiet(site.grow_gap.as_micros() as u64);
            leader::grow::Growing::new(grower, own_minutes, submit)
        }),
        handover: survivors.as_ref().map(|_| leader::Handover {
            wait: HANDOVER_SETTLE,
            others: continuation::others_kept(run, job_id),
            awaiting: continuation::awaited_starts(run),
        }),
        // A Slurm run's id is its job's, known before it starts.
        published: None,
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
