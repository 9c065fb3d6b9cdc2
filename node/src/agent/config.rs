//! What an agent is started with: where it joins, its share of the node, how it runs tasks.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use htc_core::output::OutputMode;
use htc_core::tree::Tree;
use htc_exec::simexec::ExecKind;
use htc_store::rundir::RunDir;

/// One agent's configuration (`htc-agent`'s arguments, or a simulation's).
pub struct AgentConfig {
    /// Where to connect: the leader, or the parent agent in the tree.
    pub parent: SocketAddr,
    /// The leader, to reconnect to when the relay above is lost.
    pub leader: SocketAddr,
    pub run: RunDir,
    pub agent_id: u32,
    pub slots: usize,
    pub cpus: Vec<usize>,
    pub mem_mb: u64,
    /// The GPUs the agent hands to tasks (`gpu`).
    pub gpus: Vec<htc_exec::gpu::Device>,
    /// How tasks' `mem=` is enforced (`memcg`).
    pub mem_limit: htc_exec::memcg::Enforce,
    pub output: OutputMode,
    pub kill_grace: Duration,
    /// How often the agent looks whether a report is due (`FLUSH_EVERY`).
    pub flush_every: Duration,
    /// The least time between reports under load, when not the layout's (`report_gap()`).
    pub report_gap: Option<Duration>,
    /// The job's tree (shared by the agents of one process).
    pub tree: Arc<Tree>,
    /// Set when this agent has children to serve: the bound listener.
    pub relay: Option<std::net::TcpListener>,
    /// Real processes, or a simulation that starts none.
    pub exec: ExecKind,
    /// Executors (spawn loops) splitting the slots; 0 = one per slot.
    pub spawners: usize,
    /// Heartbeats, the lease on the parent, the bound on silent members.
    pub live: htc_engine::liveness::Liveness,
    /// What tasks leave outside their process group lives until the agent ends (`leftovers`).
    pub keep_daemons: bool,
    /// An agent of a joined allocation: should the leader go, how long to wait for the run's
    /// new one (`Machine::with_await_leader`).
    pub await_leader: Option<Duration>,
    /// How long a signalled agent gives back what has not started before it stops what runs
    /// (`Machine::with_give_back`).
    pub give_back: Duration,
}
