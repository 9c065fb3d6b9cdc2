//! The agents' decisions: `machine` (one agent: what to run, when to report, when to ask for
//! more), `instance` (a head folding its members' reports into one), `stall` (an agent that stood
//! still asks its parent before it fences itself); when a report goes up is
//! `crate::pace`'s, beside `liveness`, which sizes heartbeats by it. The node agent's driver (`agent/mod.rs` there) feeds them events and carries out their
//! effects.

pub mod instance;
pub mod machine;
pub mod stall;

pub use instance::Instance;
