//! `htc-agent work`'s command line: parsed by the agent, and written back by the leader's
//! launchers (local and `srun`), one definition for both. It sits below the CLI so that the
//! node side (launchers, Slurm glue) does not reach up into the product's command lines.

use std::path::PathBuf;

use htc_core::output::OutputMode;
use htc_exec::simexec::ExecKind;

/// Tree fan-out when none is asked for: agents per parent (the leader included).
pub const DEFAULT_FANOUT: u32 = 32;

/// `htc-agent work`: parsed here, and written back as a command line by the leader's
/// launchers (`argv`), so the two can never disagree.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
pub struct WorkArgs {
    #[arg(long)]
    pub leader: std::net::SocketAddr,
    #[arg(long)]
    pub run_dir: PathBuf,
    /// This agent's id (under --slurm: $SLURM_PROCID).
    #[arg(long, default_value_t = 0)]
    pub agent_id: u32,
    /// Take id, slots and CPUs from the Slurm step's environment.
    #[arg(long)]
    pub slurm: bool,
    /// Tasks run at once (cores handed out); default: the CPUs this process may use.
    #[arg(long)]
    pub slots: Option<usize>,
    /// CPUs to bind slots to, e.g. 0,1,2,3 (empty: no binding).
    #[arg(long, default_value = "")]
    pub cpus: String,
    /// Memory handed out to tasks that declare mem=, in MiB (0: not accounted). Default:
    /// learned from the node (the Slurm allocation, else the machine; see `memory.rs`).
    #[arg(long)]
    pub mem_mb: Option<u64>,
    /// GPUs of this node for tasks that ask for them (`gpus=`), e.g. 0,1,2,3; the agents on
    /// the node share them. Default: the step's (CUDA_VISIBLE_DEVICES, ...), else nvidia-smi.
    #[arg(long, value_name = "LIST")]
    pub gpus: Option<String>,
    /// How a task's `mem=` is enforced: auto, cgroup (a memory cgroup per slot, required),
    /// watch (the resident memory of its process group).
    #[arg(long, default_value = "auto", value_name = "auto|cgroup|watch")]
    pub mem_limit: htc_exec::memcg::Enforce,
    #[arg(long, default_value = "streams")]
    pub output: OutputMode,
    /// Tree fan-out: agents per parent (the leader included).
    #[arg(long, default_value_t = DEFAULT_FANOUT)]
    pub fanout: u32,
    /// Agents in the job (under --slurm: $SLURM_NTASKS).
    #[arg(long, default_value_t = 1)]
    pub agents: u32,
    /// The run-wide id of this allocation's first agent: 0 for the leader's own, the leader's
    /// answer for an allocation that joined the run (`--join`). Agent ids above are the
    /// allocation's own; in the run they are offset by this.
    #[arg(long, default_value_t = 0)]
    pub first_agent: u32,
    /// Run this many agents in this process, ids from --agent-id on (simulations).
    #[arg(long, default_value_t = 1, conflicts_with = "slurm")]
    pub count: u32,
    /// Real processes, or a simulation: none (tasks succeed at once), sleep (after their
    /// `runtime` hint).
    #[arg(long, default_value = "real")]
    pub exec: ExecKind,
    /// Executors (spawn loops, one thread each) splitting the slots; 0 = one per slot.
    #[arg(long, default_value_t = 1)]
    pub spawners: usize,
    /// Agents per 2nd-level instance (consecutive ids; the first is the head).
    #[arg(long, default_value_t = 1)]
    pub instance_size: u32,
    /// A peer silent this long is lost; the lease on the parent is half of it.
    #[arg(long, default_value_t = 10_000)]
    pub lost_after_ms: u64,
    /// Leave what tasks start outside their process group running until the agent ends
    /// (also HTC_KEEP_DAEMONS=1).
    #[arg(long)]
    pub keep_daemons: bool,
    /// Should the leader go (its job ended), wait this long for the run's new leader (a joined
    /// job that takes the run over) and go to it with the tasks held; 0: stop with the leader.
    #[arg(long, default_value_t = 0, value_name = "SECS")]
    pub await_leader_s: u64,
}

impl WorkArgs {
    /// The arguments after `htc-agent`, starting with `work`.
    pub fn argv(&self) -> Vec<std::ffi::OsString> {
        let mut v: Vec<std::ffi::OsString> = vec!["work".into(), "--leader".into(), self.leader.to_string().into()];
        v.extend(["--run-dir".into(), self.run_dir.clone().into_os_string()]);
        let mut opt = |name: &str, value: String| v.extend([format!("--{name}").into(), value.into()]);
        opt("agent-id", self.agent_id.to_string());
        if let Some(n) = self.slots {
            opt("slots", n.to_string());
        }
        opt("cpus", self.cpus.clone());
        if let Some(m) = self.mem_mb {
            opt("mem-mb", m.to_string());
        }
        if let Some(g) = &self.gpus {
            opt("gpus", g.clone());
        }
        opt("mem-limit", self.mem_limit.name().to_string());
        opt("output", self.output.name().to_string());
        opt("fanout", self.fanout.to_string());
        opt("agents", self.agents.to_string());
        if self.first_agent > 0 {
            opt("first-agent", self.first_agent.to_string());
        }
        if !self.slurm {
            opt("count", self.count.to_string());
        }
        opt("exec", self.exec.name().to_string());
        opt("spawners", self.spawners.to_string());
        opt("instance-size", self.instance_size.to_string());
        opt("lost-after-ms", self.lost_after_ms.to_string());
        if self.await_leader_s > 0 {
            opt("await-leader-s", self.await_leader_s.to_string());
        }
        if self.keep_daemons {
            v.push("--keep-daemons".into());
        }
        if self.slurm {
            v.push("--slurm".into());
        }
        v
    }
}
