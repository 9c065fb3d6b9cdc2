//! Starting the agents under Slurm: one `srun` step for all of them, beside `launch`, which starts
//! them as child processes on this machine.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::core::Input;
use super::driver::Event;
use super::launch::{watch, Agents};
use super::srun_output::{read, Exits, LastWords, Line};
use crate::work_args::WorkArgs;
use htc_core::output::OutputMode;
use htc_exec::simexec::ExecKind;
use htc_store::rundir::RunDir;

/// One `srun --overlap` step with `agents_per_node` agents on every allocated node: O(1)
/// controller RPCs whatever the number of tasks or agents.
pub struct Srun {
    pub agent_bin: PathBuf,
    pub nodes: usize,
    pub agents_per_node: usize,
    /// Spawn loops per agent (0: one per slot).
    pub spawners: usize,
    pub output: OutputMode,
    pub fanout: u32,
    /// Agents per 2nd-level instance.
    pub instance_size: u32,
    /// The site's bound on silent peers (`liveness`).
    pub lost_after: Duration,
    /// How the agents enforce tasks' `mem=`: the site's choice (`auto` unless it says).
    pub mem_limit: htc_exec::memcg::Enforce,
    /// The run-wide id of the first agent: 0, or what the leader gave a joining allocation.
    pub first_agent: u32,
    /// How long the agents wait for a new leader when theirs goes (`WorkArgs::await_leader_s`).
    pub await_leader_s: u64,
}

impl Srun {
    pub fn start(&self, run: &RunDir, leader: SocketAddr, core: mpsc::Sender<Event>) -> anyhow::Result<Agents> {
        if self.nodes == 0 {
            bail!("no nodes in the allocation");
        }
        let per_node = self.agents_per_node.max(1);
        let agents = self.nodes * per_node;
        let mut cmd = Command::new("srun");
        cmd.arg("--overlap")
            .arg(format!("--nodes={}", self.nodes))
            .arg(format!("--ntasks={agents}"))
            .arg(format!("--ntasks-per-node={per_node}"))
            .arg("--kill-on-bad-exit=0")
            // Every CPU of the job on each node to every step task; the agents split them.
            .arg("--whole")
            // PMI2 carries the tree's addresses when there are more agents than the fan-out, or
            // members that connect to their instance's head.
            .arg(if agents as u32 > self.fanout || self.instance_size > 1 { "--mpi=pmi2" } else { "--mpi=none" })
            .arg("--input=none")
            // Each agent's lines carry its rank: an agent that exits before it joins is said
            // with its own last words (`srun_output`).
            .arg("--label")
            .arg("--job-name=htc-agents")
            .arg(&self.agent_bin)
            .args(self.work_args(run, leader).argv())
            .stdin(Stdio::null())
            .stderr(Stdio::piped());
        // Agents log to the job's output; keep it to what matters unless the user asked.
        if std::env::var_os("HTC_LOG").is_none() {
            cmd.env("HTC_LOG", "warn");
        }
        let mut child = cmd.spawn().context("starting srun (is it on PATH?)")?;
        let (etx, erx) = mpsc::channel();
        let (first, never) = (self.first_agent, agents as u32);
        // Closed when the relay has told every exit srun said.
        let (told_tx, told) = mpsc::channel::<()>();
        if let Some(err) = child.stderr.take() {
            let core = core.clone();
            let program = self.agent_bin.display().to_string();
            std::thread::spawn(move || {
                relay(err, first, &program, &core);
                drop(told_tx);
            });
        }
        // If srun ends, any agent that never joined is gone for good: said after the relay has
        // told how each exited (why one could not start), which would otherwise race it and
        // lose to "all agents are gone". Bounded, should a stray child keep srun's stderr open.
        let core2 = core.clone();
        let (ltx, lrx) = mpsc::channel();
        watch(child, Vec::new(), core, ltx, "srun".into());
        std::thread::spawn(move || {
            if lrx.recv().is_ok() {
                let _ = told.recv_timeout(Duration::from_secs(2));
                for agent in first..first + never {
                    let _ = core2.send(Event::Core(Input::NeverJoined { agent, why: "the srun step ended".into() }));
                }
            }
            let _ = etx.send(());
        });
        Ok(Agents::new(agents, erx, 1))
    }

    /// What each agent of the step is started with: its rank and share come from Slurm.
    fn work_args(&self, run: &RunDir, leader: SocketAddr) -> WorkArgs {
        WorkArgs {
            leader,
            run_dir: run.path.clone(),
            agent_id: 0,
            slurm: true,
            slots: None,
            cpus: String::new(),
            mem_mb: None,
            gpus: None,
            mem_limit: self.mem_limit,
            output: self.output,
            fanout: self.fanout,
            agents: 1,
            first_agent: self.first_agent,
            count: 1,
            exec: ExecKind::Real,
            spawners: self.spawners,
            instance_size: self.instance_size,
            lost_after_ms: self.lost_after.as_millis() as u64,
            // The agents read HTC_KEEP_DAEMONS from the job's environment.
            keep_daemons: false,
            await_leader_s: self.await_leader_s,
        }
    }
}

/// Passes srun's stderr on to the leader's, each agent's lines without their label, and tells
/// the core of every agent that exited badly, with its last line (the cause, if it never joined).
fn relay(err: std::process::ChildStderr, first: u32, program: &str, core: &mpsc::Sender<Event>) {
    use std::io::{BufRead, Write};
    let (tx, lines) = mpsc::channel::<Vec<u8>>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(err).split(b'\n') {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut words = LastWords::default();
    // The first node Slurm could not launch on: why every agent of the aborted step ended.
    let mut launch: Option<String> = None;
    let mut exits = Exits::default();
    let t0 = Instant::now();
    let now_us = || t0.elapsed().as_micros() as u64;
    let mut out = std::io::stderr();
    loop {
        let wait = exits.next_in_us(now_us()).map_or(Duration::from_secs(3600), Duration::from_micros);
        let next = lines.recv_timeout(wait);
        let ended = matches!(next, Err(mpsc::RecvTimeoutError::Disconnected));
        for e in exits.due(now_us(), ended) {
            let why = launch.clone().unwrap_or_else(|| words.why(e.rank, &e.nodes, &e.how, program));
            let _ = core.send(Event::Core(Input::AgentExited { agent: first + e.rank, why }));
        }
        let line = match next {
            Ok(line) => line,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        };
        let line = String::from_utf8_lossy(&line);
        // The job's output file: nothing to do when it cannot be written.
        let _ = match read(&line) {
            Line::Task { rank, text } => {
                words.said(rank, text);
                writeln!(out, "{text}")
            }
            Line::LaunchFailed { node, why } => {
                launch
                    .get_or_insert_with(|| format!("on {node}: Slurm could not launch the agents' step there ({why})"));
                writeln!(out, "{line}")
            }
            Line::Exited { nodes, ranks, how } => {
                exits.said(now_us(), nodes, ranks, how);
                writeln!(out, "{line}")
            }
            Line::Other(text) => writeln!(out, "{text}"),
        };
    }
}
