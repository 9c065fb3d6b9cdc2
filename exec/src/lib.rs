//! slurm-htc executors: how an agent's tasks run. `executor` (the process executor: spawn loops,
//! slots, deadlines, preemption, memory), `spawn` and `capture` (starting a task and keeping its
//! output), `memcg`, `memwatch` and `memory` (memory limits and what a node has), `gpu`,
//! `prologue`, `output` (the output files and their index), `guard` and `leftovers` (nothing a
//! task starts outlives it), `throttle` and `handoff`; `simexec`
//! the simulated executors (`--exec none|sleep`). All speak `htc_core::work`'s messages.
//!
//! May use: `htc-core`, `htc-host` (the clock, free space), processes, files, `libc`. May not use: the store, the engine's machines,
//! the wire format or sockets (but the local one of a node's warm interpreter, `warm`, through
//! which a Python function call's task runs).

pub mod activity;
pub mod capture;
pub mod executor;
pub mod gpu;
pub mod guard;
pub mod handoff;
pub mod leftovers;
pub mod memcg;
pub mod memory;
pub mod memwatch;
pub mod output;
pub mod prologue;
pub mod results;
pub mod simexec;
pub mod spawn;
pub mod stopping;
pub mod throttle;
pub mod warm;
