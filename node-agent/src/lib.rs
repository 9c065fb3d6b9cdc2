//! slurm-htc, the product: what users and admins run. The command lines (`cli`), what a run
//! shows (`status`, `watch`, `output_view`, `joblog`, `report`), `htc retry` (`rerun`), `htc
//! simulate` and `htc calibrate`, the site's settings (`site`); the binaries `htc` (users) and
//! `htc-agent` (daemon roles) are thin layers over this library.
//!
//! The engine below it is in crates of its own, each allowed only what is below it (Cargo
//! enforces it): `htc-core` (task file, task states, records, partition; pure), `htc-engine`
//! (wire messages, the leader's core and the agents' machines; pure), `htc-store` (ledger,
//! replica, run directory), `htc-exec` (executors), `htc-node` (the drivers, sockets, Slurm).
//! Their modules are re-exported here under the names they had in one crate, for the
//! binaries, the end-to-end tests, the fuzz targets and the man pages.

pub mod calibrate;
pub mod cli;
pub mod detach;
pub mod explain_cmd;
pub mod id_args;
pub mod joblog;
pub mod lead;
pub mod output_view;
pub mod report;
pub mod rerun;
pub mod sessionlog;
pub mod simulate;
pub mod site;
pub mod status;
pub mod task_cmd;
pub mod warm_call;
pub mod watch;

pub use htc_engine::wire::{proto, PROTOCOL_VERSION};
pub use htc_engine::{live, liveness};
pub use htc_exec::{
    capture, executor, gpu, guard, handoff, leftovers, memcg, memory, memwatch, output, prologue, simexec, spawn,
    throttle,
};
pub use htc_host as host;
pub use htc_node::{agent, auth, bootstrap, frame, join, leader, livefile, pmi, slurm, work_args};
pub use htc_store::{layout, ledger, load, mapfault, pagecheck, replica, rundir, verify};

/// Logs to stderr; `HTC_LOG` takes a tracing filter (e.g. `info`, or `htc_engine=debug` for one crate: the
/// engine, store, exec and node crates log under their own names).
pub fn init_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("HTC_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}
