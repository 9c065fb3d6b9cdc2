//! slurm-htc engine: what the leader and the agents decide, apart from how they do it. The
//! tree's messages as plain types (`msg`), the wire's (`wire`: prost, nowhere else) and the
//! mapping between them, the leader's core and the agents' machines, each fed `(now, event)`
//! and answering with effects in `msg`'s terms; and a job's life in a run across allocations
//! (`lifecycle`).
//!
//! May use: `htc-core`, `prost` (message types only), `tracing` (a facade). May not use: sockets,
//! files, clocks, threads, `libc`, `lmdb`, `tokio`: those are the node's and the store's, above.

pub mod agent;
pub mod leader;
pub mod lifecycle;
pub mod live;
pub mod liveness;
pub mod msg;
pub mod pace;
pub mod wire;
