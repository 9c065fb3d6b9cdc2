//! The leader's decisions: `core` (the scheduling state machine: agents, flights, dispatch,
//! preemption, memory, liveness, the live view), the `effect`s it answers with, and `plan` (the
//! partition it starts from). The node agent's driver runs the core against the ledger and the
//! agents' connections.

pub mod core;
pub mod effect;
pub mod plan;
