//! Starting node agents. Locally: N `htc-agent work` child processes on this machine. (Under
//! Slurm the same agents are started by one `srun` step; see `srun`.)

use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context;

use super::core::Input;
use super::driver::Event;
use crate::work_args::WorkArgs;
use htc_core::output::OutputMode;
use htc_exec::simexec::ExecKind;
use htc_store::rundir::RunDir;

/// The started agent processes (or the one launcher process, e.g. srun).
pub struct Agents {
    pub count: usize,
    exits: mpsc::Receiver<()>,
    children: usize,
}

impl Agents {
    /// `count` agents whose launcher processes (`children` of them) report their exit on `exits`.
    pub fn new(count: usize, exits: mpsc::Receiver<()>, children: usize) -> Agents {
        Agents { count, exits, children }
    }

    /// Waits up to `limit` for every started process to exit; says whether they all have.
    pub fn wait(&mut self, limit: Duration) -> bool {
        let end = Instant::now() + limit;
        while self.children > 0 {
            let left = end.saturating_duration_since(Instant::now());
            match self.exits.recv_timeout(left) {
                Ok(()) => self.children -= 1,
                Err(_) => return false,
            }
        }
        true
    }
}

/// Watches a child that hosts `agents`: when it exits, tells the core (in case they never
/// joined) and `Agents::wait`.
pub fn watch(mut child: Child, agents: Vec<u32>, core: mpsc::Sender<Event>, exits: mpsc::Sender<()>, what: String) {
    std::thread::spawn(move || {
        let status = child.wait();
        let why = match status {
            Ok(s) => format!("{what} exited ({s})"),
            Err(e) => format!("{what}: {e}"),
        };
        for agent in agents {
            let _ = core.send(Event::Core(Input::NeverJoined { agent, why: why.clone() }));
        }
        let _ = exits.send(());
    });
}

pub struct Local {
    pub agent_bin: PathBuf,
    pub agents: usize,
    /// The run-wide id of the first agent: 0, or what the leader gave a joining allocation.
    pub first_agent: u32,
    pub slots_per_agent: usize,
    pub cpus: Vec<usize>,
    pub output: OutputMode,
    pub log_dir: PathBuf,
    pub fanout: u32,
    pub exec: ExecKind,
    /// Spawn loops per agent (0: one per slot).
    pub spawners: usize,
    /// Agents per 2nd-level instance.
    pub instance_size: u32,
    /// The site's bound on silent peers (`liveness`).
    pub lost_after: Duration,
    /// Memory each agent hands out to tasks, in MiB (`None`: learned from the machine).
    pub mem_mb: Option<u64>,
    /// The machine's GPUs for tasks (`--gpus`), which the agents share (`None`: detected).
    pub gpus: Option<String>,
    /// What tasks leave outside their process group lives until the agent ends (`leftovers`).
    pub keep_daemons: bool,
    /// How the agents enforce tasks' `mem=` (`--mem-limit`).
    pub mem_limit: htc_exec::memcg::Enforce,
}

impl Local {
    /// Real agents get a process each; simulated ones share one process per CPU, so that a
    /// thousand of them fit on a laptop.
    fn per_process(&self) -> usize {
        match self.exec {
            ExecKind::Real => 1,
            _ => self.agents.div_ceil(self.cpus.len().clamp(1, self.agents.max(1))),
        }
    }

    /// Eq. 10's instance start delay as this launcher starts agents: processes one after
    /// another, each costing `s` (the site's calibration); agents sharing a process connect
    /// back to back at almost no cost, so they share its delay.
    pub fn start_delay_s(&self, s: f64) -> f64 {
        s / self.per_process() as f64
    }

    pub fn start(&self, run: &RunDir, leader: SocketAddr, core: mpsc::Sender<Event>) -> anyhow::Result<Agents> {
        let (etx, erx) = mpsc::channel();
        std::fs::create_dir_all(&self.log_dir)?;
        // Addresses of an earlier session's relays would be stale.
        let _ = std::fs::remove_dir_all(tree_dir(&run.path, self.first_agent));
        let per_process = self.per_process();
        let mut processes = 0;
        for i in (0..self.agents).step_by(per_process) {
            let count = per_process.min(self.agents - i);
            // Agent i's slots sit on consecutive CPUs, wrapping when agents oversubscribe.
            let cpus: Vec<String> = if self.exec == ExecKind::Real {
                (0..self.slots_per_agent)
                    .filter_map(|s| self.cpus.get((i * self.slots_per_agent + s) % self.cpus.len().max(1)))
                    .map(|c| c.to_string())
                    .collect()
            } else {
                Vec::new()
            };
            // Named by the agent's id in the run (a joined allocation's start after the run's).
            let log = std::fs::File::create(self.log_dir.join(format!("agent-{}.log", self.first_agent as usize + i)))?;
            // Own process group: a Ctrl-C on the terminal reaches the leader only, which then
            // stops the agents cleanly (they stop their tasks) instead of orphaning the tasks.
            let argv = WorkArgs {
                leader,
                run_dir: run.path.clone(),
                agent_id: i as u32,
                first_agent: self.first_agent,
                slurm: false,
                slots: Some(self.slots_per_agent),
                cpus: cpus.join(","),
                mem_mb: self.mem_mb,
                gpus: self.gpus.clone(),
                mem_limit: self.mem_limit,
                output: self.output,
                fanout: self.fanout,
                agents: self.agents as u32,
                count: count as u32,
                exec: self.exec,
                spawners: self.spawners,
                instance_size: self.instance_size,
                lost_after_ms: self.lost_after.as_millis() as u64,
                keep_daemons: self.keep_daemons,
                await_leader_s: 0,
            }
            .argv();
            let child = Command::new(&self.agent_bin)
                .process_group(0)
                .args(argv)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .with_context(|| format!("starting {}", self.agent_bin.display()))?;
            let what = if count == 1 { format!("agent {i}") } else { format!("agents {i}-{}", i + count - 1) };
            let ids = (i as u32..(i + count) as u32).map(|a| a + self.first_agent).collect();
            watch(child, ids, core.clone(), etx.clone(), what);
            processes += 1;
        }
        Ok(Agents { count: self.agents, exits: erx, children: processes })
    }
}

/// Where local agents of the allocation whose first agent is `first` publish their relays'
/// addresses (`bootstrap::Kvs::Files`): one directory per allocation, so that a joining one
/// does not clear the first one's.
pub fn tree_dir(run: &Path, first: u32) -> PathBuf {
    if first == 0 {
        run.join("tree")
    } else {
        run.join(format!("tree-{first}"))
    }
}

/// `htc-agent` next to the running executable, else on PATH.
pub fn agent_binary() -> PathBuf {
    if let Ok(exe) = std::env::current_exe() {
        let p = exe.with_file_name("htc-agent");
        if p.exists() {
            return p;
        }
    }
    Path::new("htc-agent").to_path_buf()
}
