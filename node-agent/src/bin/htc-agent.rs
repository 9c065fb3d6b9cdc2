//! `htc-agent`: the daemon roles. `work` is a node agent; the leader role under Slurm (`lead`)
//! comes with the SPANK plugin.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use htc::agent::{self, AgentConfig};
use htc::executor;
use htc::output::OutputMode;
use htc::rundir::RunDir;

#[derive(Parser)]
#[command(name = "htc-agent", version, about = "slurm-htc node agent (started by htc or by the Slurm plugin, not by hand)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run tasks for a leader.
    Work {
        #[arg(long)]
        leader: std::net::SocketAddr,
        #[arg(long)]
        run_dir: PathBuf,
        #[arg(long)]
        agent_id: u32,
        /// Tasks run at once (cores handed out); default: the CPUs this process may use.
        #[arg(long)]
        slots: Option<usize>,
        /// CPUs to bind slots to, e.g. 0,1,2,3 (empty: no binding).
        #[arg(long, default_value = "")]
        cpus: String,
        /// Memory handed out to tasks that declare mem=, in MiB (0: not accounted).
        #[arg(long, default_value_t = 0)]
        mem_mb: u64,
        #[arg(long, default_value = "streams")]
        output: OutputMode,
    },
}

fn main() -> std::process::ExitCode {
    match real_main() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn real_main() -> anyhow::Result<()> {
    // Before any thread exists, so every thread inherits it (see executor).
    executor::block_sigchld();
    htc::init_logging("info");
    match Cli::parse().cmd {
        Cmd::Work { leader, run_dir, agent_id, slots, cpus, mem_mb, output } => {
            let cpus: Vec<usize> = cpus
                .split(',')
                .filter(|s| !s.is_empty())
                .map(|s| s.trim().parse().with_context(|| format!("bad CPU number '{s}' in --cpus")))
                .collect::<anyhow::Result<_>>()?;
            let slots = slots.unwrap_or_else(|| if cpus.is_empty() { executor::allowed_cpus().len() } else { cpus.len() }).max(1);
            agent::run(AgentConfig {
                leader,
                run: RunDir::new(run_dir),
                agent_id,
                slots,
                cpus,
                mem_mb,
                output,
                kill_grace: Duration::from_secs(3),
                flush_every: Duration::from_millis(5),
            })
        }
    }
}
