//! One allocation of the run as the core keeps it: what a joining one asks for (`Attach`), the
//! ids of its agents, its end, and where it is in its life (`Stage`). Plain data of its own; the
//! core's decisions about allocations are in `allocations`.

use std::ops::Range;

/// A joining allocation's request (an Attach frame, read by the node's network side).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attach {
    /// The joining Slurm job (or a local name).
    pub job: String,
    pub agents: u32,
    /// Agents per 2nd-level instance among its agents.
    pub instance_size: u32,
    /// The fan-out of its heads' tree (the run's).
    pub fanout: u32,
    pub nodes: u32,
    /// When it must be gone (its time limit less the grace), unix µs.
    pub ends_us: Option<u64>,
    /// Its agents outlived the run's previous leader and keep their ids from this one on
    /// (`handover`): `None` for new ids.
    pub keep_first: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Its agents run tasks.
    Running,
    /// Told to leave (its end is near): its agents start nothing more and go.
    Leaving,
    /// Its launcher is gone: whatever of it is left is lost.
    Gone,
}

impl Stage {
    pub fn name(self) -> &'static str {
        match self {
            Stage::Running => "running",
            Stage::Leaving => "leaving",
            Stage::Gone => "gone",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Allocation {
    pub job: String,
    /// Its agents' ids.
    pub agents: Range<u32>,
    pub nodes: u32,
    pub ends_us: Option<u64>,
    pub stage: Stage,
}
