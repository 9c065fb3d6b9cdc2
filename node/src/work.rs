//! `htc-agent work`'s start: the agent's place on its node (its id, CPUs, memory and GPUs,
//! under Slurm from the step's environment), its place in the tree (its parent's address, through
//! the srun step's PMI2 key-value space or, locally, files in the run directory), then the
//! agent itself (`agent::run`).

use std::time::Duration;

use anyhow::{bail, Context};
use htc_engine::liveness::Liveness;
use htc_exec::executor;
use htc_store::rundir::RunDir;

use crate::agent::{self, AgentConfig};
use crate::bootstrap::{self, Kvs};
use crate::pmi::Pmi;
use crate::work_args::WorkArgs;
use crate::{leader, slurm};

// Long (about 80 lines): a quarter of it names every option of `WorkArgs`, so that adding one
// that this function ignores fails to compile; the rest is the agent's start, in order.
pub fn work(a: WorkArgs) -> anyhow::Result<()> {
    // Before any thread: a guard process that stops the tasks should the agent die.
    htc_exec::guard::split().context("starting the agent's guard")?;
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
    // Logs name an agent by its id in the run, not its index in this allocation.
    let first_id = first_agent + agent_id;
    let slots =
        slots.unwrap_or_else(|| if cpus.is_empty() { executor::allowed_cpus().len() } else { cpus.len() }).max(1);
    let mem_mb = mem_mb.unwrap_or_else(|| {
        let facts = htc_exec::memory::detect(slurm, cpus_on_node as u64, agents_on_node as u64);
        let (mb, from) = htc_exec::memory::budget_mb(&facts);
        tracing::info!(agent = first_id, mem_mb = mb, from, "memory for tasks");
        mb
    });
    let (devices, from) = htc_exec::gpu::detect(gpus.as_deref());
    if !devices.is_empty() {
        tracing::info!(agent = first_id, gpus = %htc_exec::gpu::visible(&devices), from, "GPUs of the node");
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
    // The leader asks Slurm about a signal's grace when it runs in a job (`leader::ask_grace`),
    // as the agents, spawned by it or by srun, then do too; elsewhere no word is to come.
    let give_back = Duration::from_micros(if std::env::var_os("SLURM_JOB_ID").is_some() {
        htc_engine::agent::machine::GIVE_BACK_US
    } else {
        htc_engine::agent::machine::GIVE_BACK_UNASKED_US
    });
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
            gpus: htc_exec::gpu::share(&devices, agents_on_node, if slurm { local_index } else { id as usize }),
            output,
            kill_grace: Duration::from_secs(3),
            flush_every: agent::FLUSH_EVERY,
            report_gap: agent::report_gap(),
            exec,
            spawners,
            live: Liveness::new(Duration::from_millis(lost_after_ms)),
            keep_daemons,
            await_leader: (await_leader_s > 0).then(|| Duration::from_secs(await_leader_s)),
            give_back,
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
