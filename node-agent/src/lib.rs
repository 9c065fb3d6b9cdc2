//! slurm-htc node agent: the leader (ledger, partition, tree root), the node agents that run
//! tasks, and the pieces both share. The binaries `htc` (users) and `htc-agent` (daemon roles)
//! are thin layers over this library.

pub mod agent;
pub mod auth;
pub mod bootstrap;
pub mod calibrate;
pub use htc_exec::capture;
pub mod cli;
pub use htc_exec::executor;
pub mod frame;
pub use htc_exec::gpu;
pub use htc_exec::guard;
pub use htc_exec::handoff;
pub use htc_store::host;
pub mod joblog;
pub mod leader;
pub use htc_engine::live;
pub use htc_exec::leftovers;
pub use htc_store::ledger;
pub mod livefile;
pub use htc_engine::liveness;
pub use htc_exec::memcg;
pub use htc_exec::memory;
pub use htc_exec::memwatch;
pub use htc_exec::output;
pub use htc_store::load;
pub use htc_store::mapfault;
pub mod output_view;
pub use htc_store::pagecheck;
pub mod pmi;
pub use htc_exec::prologue;
pub use htc_store::replica;
pub mod report;
pub mod rerun;
pub use htc_store::rundir;
pub mod sessionlog;
pub use htc_exec::simexec;
pub mod simulate;
pub mod site;
pub mod slurm;
pub use htc_exec::spawn;
pub mod status;
pub use htc_exec::throttle;
pub use htc_store::storage;
pub use htc_store::verify;
pub mod watch;
pub mod work_args;

/// The wire messages (`htc_engine::wire`), under the name the node's modules know them by.
pub use htc_engine::wire::proto;
pub use htc_engine::wire::PROTOCOL_VERSION;

/// Logs to stderr; `HTC_LOG` takes a tracing filter (e.g. `info`, `htc=debug`).
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
