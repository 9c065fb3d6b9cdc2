//! Starting node agents. Locally: N `htc-agent work` child processes on this machine. (Under
//! Slurm the same agents are started by one `srun` step; see `slurm`.)

use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context;

use super::core::Input;
use super::driver::Event;
use crate::output::OutputMode;
use crate::rundir::RunDir;

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

    /// Waits up to `limit` for every started process to exit.
    pub fn wait(&mut self, limit: Duration) {
        let end = Instant::now() + limit;
        while self.children > 0 {
            let left = end.saturating_duration_since(Instant::now());
            match self.exits.recv_timeout(left) {
                Ok(()) => self.children -= 1,
                Err(_) => return,
            }
        }
    }
}

/// Watches a child: when it exits, tells the core (in case it never joined) and `Agents::wait`.
pub fn watch(mut child: Child, agent: Option<u32>, core: mpsc::Sender<Event>, exits: mpsc::Sender<()>, what: String) {
    std::thread::spawn(move || {
        let status = child.wait();
        if let Some(agent) = agent {
            let why = match status {
                Ok(s) => format!("{what} exited ({s})"),
                Err(e) => format!("{what}: {e}"),
            };
            let _ = core.send(Event::Core(Input::NeverJoined { agent, why }));
        }
        let _ = exits.send(());
    });
}

pub struct Local {
    pub agent_bin: PathBuf,
    pub agents: usize,
    pub slots_per_agent: usize,
    pub cpus: Vec<usize>,
    pub output: OutputMode,
    pub log_dir: PathBuf,
    pub fanout: u32,
}

impl Local {
    pub fn start(&self, run: &RunDir, leader: SocketAddr, core: mpsc::Sender<Event>) -> anyhow::Result<Agents> {
        let (etx, erx) = mpsc::channel();
        std::fs::create_dir_all(&self.log_dir)?;
        // Addresses of an earlier session's relays would be stale.
        let _ = std::fs::remove_dir_all(run.path.join("tree"));
        for i in 0..self.agents {
            // Agent i's slots sit on consecutive CPUs, wrapping when agents oversubscribe.
            let cpus: Vec<String> = (0..self.slots_per_agent)
                .filter_map(|s| self.cpus.get((i * self.slots_per_agent + s) % self.cpus.len().max(1)))
                .map(|c| c.to_string())
                .collect();
            let log = std::fs::File::create(self.log_dir.join(format!("agent-{i}.log")))?;
            // Own process group: a Ctrl-C on the terminal reaches the leader only, which then
            // stops the agents cleanly (they stop their tasks) instead of orphaning the tasks.
            let child = Command::new(&self.agent_bin)
                .process_group(0)
                .arg("work")
                .arg("--leader")
                .arg(leader.to_string())
                .arg("--run-dir")
                .arg(&run.path)
                .arg("--agent-id")
                .arg(i.to_string())
                .arg("--slots")
                .arg(self.slots_per_agent.to_string())
                .arg("--cpus")
                .arg(cpus.join(","))
                .arg("--output")
                .arg(self.output.name())
                .arg("--fanout")
                .arg(self.fanout.to_string())
                .arg("--agents")
                .arg(self.agents.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .with_context(|| format!("starting {}", self.agent_bin.display()))?;
            watch(child, Some(i as u32), core.clone(), etx.clone(), format!("agent {i}"));
        }
        Ok(Agents { count: self.agents, exits: erx, children: self.agents })
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
