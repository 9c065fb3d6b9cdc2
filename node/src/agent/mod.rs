//! A node agent (`htc-agent work`): connects to its parent (the leader, or a relay agent above it
//! in the tree), proves it belongs to the job, asks for tasks, runs them through the executor and
//! reports starts and results in batches. An agent with children also relays: frames from below
//! go up unchanged, frames from above addressed to another agent go down the right branch.
//!
//! The decisions are `machine`'s; this driver moves frames, executor events, signals and timer
//! ticks into it and carries out what it answers (`driver`, `turn`), on one clock (`clock`);
//! `connection` joins and comes back, `spawners` runs the executors, `relay` serves the children.

pub use config::AgentConfig;
pub use htc_engine::agent::{instance, machine, Instance};
pub use htc_engine::pace;
mod clock;
mod config;
mod connection;
mod driver;
mod relay;
mod spawners;
mod turn;

use anyhow::Context;
use std::time::Duration;

use driver::Driver;

/// The default `spawners`: a spawn loop per slot, whatever the tasks' widths; a task needing
/// several cores runs in the wide spawner beside them (`Spread`). `--spawners N` asks for N loops.
pub const LOOP_PER_SLOT: usize = 0;

/// The agents' report timer: short enough that a slot waits little for work, long enough that a
/// busy agent's results travel in batches. `htc simulate` uses it too.
pub const FLUSH_EVERY: Duration = Duration::from_millis(5);
/// The least time between reports under load when not the layout's (`pace::gap_for`):
/// HTC_REPORT_MS from the job's environment, for measuring what the gap costs and gains.
pub fn report_gap() -> Option<Duration> {
    let ms = std::env::var("HTC_REPORT_MS").ok().and_then(|v| v.parse::<u64>().ok());
    ms.map(Duration::from_millis)
}

pub fn run(cfg: AgentConfig) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(run_async(cfg))
}

/// Several agents in one process (simulations: thousands of agents on a few cores). Each keeps
/// its own connection, tree position and executor; the first error is returned after all end.
pub fn run_many(cfgs: Vec<AgentConfig>) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for cfg in cfgs {
            let id = cfg.agent_id;
            set.spawn(async move { run_async(cfg).await.with_context(|| format!("agent {id}")) });
        }
        let mut first = Ok(());
        while let Some(r) = set.join_next().await {
            let r = r.map_err(anyhow::Error::from).and_then(|r| r);
            if first.is_ok() {
                first = r;
            }
        }
        first
    })
}

async fn run_async(cfg: AgentConfig) -> anyhow::Result<()> {
    Driver::start(cfg).await?.run().await
}
