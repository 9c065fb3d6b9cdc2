//! The state of the nodes given back (`give_back`): which agents were told to leave with their
//! node, which nodes went. A part of the core's state of its own: it knows agents and nodes by
//! their ids and names, nothing of the core.

use std::collections::HashMap;

use htc_core::idmap::IdSet;

/// The give-back's state: off unless the driver says where the leader runs.
#[derive(Debug, Default)]
pub(super) struct GiveBack {
    /// The leader's node; `None`: nodes are not given back (a local run, `--htc-keep-nodes`).
    pub(super) leader_node: Option<String>,
    /// Agents told to leave with their node.
    pub(super) leaving: IdSet<u32>,
    /// Nodes told to leave, and those given back, in the order they went.
    pub(super) told: Vec<String>,
    pub(super) given: Vec<String>,
    /// Since when each node has held nothing, all that is left running.
    pub(super) idle_since: HashMap<String, u64>,
    /// How long an open run's node stands idle before it goes, if not `OPEN_IDLE_US` (the
    /// site's `open_idle_give_back_s`).
    pub(super) open_idle_us: Option<u64>,
}

impl GiveBack {
    pub(super) fn leaving(&self, agent: u32) -> bool {
        self.leaving.contains(&agent)
    }
}
