//! The agents' decisions: `machine` (one agent: what to run, when to report, when to ask for
//! more), `instance` (a head folding its members' reports into one), `pace` (when a report goes
//! up). The node agent's driver (`agent/mod.rs` there) feeds them events and carries out their
//! effects.

pub mod instance;
pub mod machine;
pub mod pace;

pub use instance::Instance;
