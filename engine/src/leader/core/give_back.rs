//! Nodes given back: once everything the run has left runs (nothing waits to be handed out,
//! nothing sits queued behind a busy slot), the nodes of the leader's own allocation whose
//! agents hold nothing can never get work again but a failed task's retry, which the nodes that
//! stay take. Their agents are told to leave (`Stop::Hold`: an empty agent just goes), and when
//! every agent of a node has gone, the node goes back to Slurm (`Effect::GiveBack`: the driver
//! shrinks the job, `scontrol update JobId=… NodeList=…`), so that a run's uneven tail holds one
//! node, not all of them, and jobs queued behind it start. An open run that is not closed may
//! get tasks at any time: its node goes only after standing idle `OPEN_IDLE_US` (also when the
//! run has nothing at all to do, waiting for its next tasks); another's after
//! `IDLE_US`, so that a run of short tasks, whose tail is over in a moment, costs the
//! controller nothing more.
//!
//! Never the leader's node (the batch step runs there), nor a joined allocation's (those leave
//! with their own job), nor an agent that relays for others or heads an instance of several.

use super::prelude::*;

/// How long a node of an open run (one that takes tasks) stands idle before it is given back,
/// unless the site says otherwise (`Core::open_idle_before_give_back`).
pub const OPEN_IDLE_US: u64 = 30_000_000;

/// How long a node of any other run stands idle before it is given back.
pub const IDLE_US: u64 = 1_000_000;

/// Whether everything the run has left is running: nothing to hand out, nothing queued.
fn all_left_runs(core: &Core<'_>) -> bool {
    let held = core.in_flight.held_total();
    held == core.counts.unfinished() && core.in_flight.running() as u64 >= held
}

/// Tells the agents of each node with nothing left for it to leave (see the module).
pub(super) fn give_back_idle(core: &mut Core<'_>, out: &mut Effects) {
    let Some(leader_node) = core.give_back.leader_node.clone() else { return };
    // A closed run with nothing unfinished is ending; an open one may wait for its next
    // tasks for hours, and its nodes with nothing to do go back while it waits.
    let ending = core.counts.unfinished() == 0 && !core.is_open();
    if core.told_to_hold || core.grace.is_some() || core.settling() || ending {
        return;
    }
    if !all_left_runs(core) {
        core.give_back.idle_since.clear();
        return;
    }
    let mut nodes: HashMap<&str, bool> = HashMap::new();
    for (&id, a) in core.agents.iter().filter(|(_, a)| a.alive) {
        let empty = core.allocation_of(id).is_none()
            && !core.give_back.leaving(id)
            && core.in_flight.held(id) == 0
            && stands_alone(core, id);
        *nodes.entry(a.hostname.as_str()).or_insert(true) &= empty;
    }
    let mut idle: Vec<String> = nodes
        .into_iter()
        .filter(|&(node, empty)| empty && node != leader_node && !core.give_back.told.iter().any(|t| t == node))
        .map(|(node, _)| node.to_string())
        .collect();
    idle.sort();
    let wait = if core.is_open() { core.give_back.open_idle_us.unwrap_or(OPEN_IDLE_US) } else { IDLE_US };
    let now = core.now_us;
    let since = &mut core.give_back.idle_since;
    since.retain(|n, _| idle.contains(n));
    idle.retain(|n| now.saturating_sub(*since.entry(n.clone()).or_insert(now)) >= wait);
    for node in idle {
        let agents: Vec<u32> =
            core.agents.iter().filter(|(_, a)| a.alive && a.hostname == node).map(|(&id, _)| id).collect();
        tracing::info!(job = %core.job_id, %node, agents = agents.len(), "nothing is left for a node: it goes back to Slurm");
        for agent in agents {
            core.give_back.leaving.insert(agent);
            out.push(Effect::stop(
                agent,
                Stop::Hold,
                format!("nothing is left for node {node}: it goes back to Slurm"),
            ));
        }
        core.give_back.told.push(node);
    }
}

/// Whether `agent` has no one below it: no live agent it relays for, no instance members.
fn stands_alone(core: &Core<'_>, agent: u32) -> bool {
    let Some(tree) = &core.layout else { return true };
    tree.instance_len(agent) <= 1 && tree.children(Some(agent)).all(|c| !core.agents.get(&c).is_some_and(|a| a.alive))
}

/// An agent told to leave with its node went: when it was the node's last, the node goes
/// back (`Effect::GiveBack`, with every node given back so far).
pub(super) fn left_with_node(core: &mut Core<'_>, agent: u32, out: &mut Effects) {
    if !core.give_back.leaving(agent) {
        return;
    }
    let node = core.agents[&agent].hostname.clone();
    if core.agents.values().any(|a| a.alive && a.hostname == node) || core.give_back.given.contains(&node) {
        return;
    }
    tracing::warn!(job = %core.job_id, %node, "node given back to Slurm: nothing was left for it");
    core.give_back.given.push(node);
    out.push(Effect::GiveBack { nodes: core.give_back.given.clone() });
}
