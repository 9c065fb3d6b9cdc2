//! The run's allocations: the leader's own, and those that joined it (`--htc-join`, `htc run
//! --join`). A joining allocation asks for agent ids (`attach`), its agents graft onto the tree
//! as new instances, and what is not handed out yet is re-planned over the live instances
//! (`replan`). Near its end an allocation is told to leave in good order (`leave_due`): its
//! agents start nothing more, hand back what is queued, finish what runs, and go; their going is
//! not a loss.

use super::allocation::Attach;
use super::prelude::*;
use super::{agents, dispatch};

/// Takes a joining allocation into the run: its agents get the next ids, grafted onto the
/// tree as instances of their own, whose shares come with the re-plan when each head joins.
/// Refused once the run is ending, or without a tree to graft onto.
pub(super) fn attach(core: &mut Core<'_>, req: Attach, now_us: u64) -> Result<u32, String> {
    core.now_us = now_us;
    if core.counts.unfinished() == 0 || core.told_to_hold {
        return Err("the run is ending: nothing is left to share".into());
    }
    if req.agents == 0 {
        return Err("an allocation of no agents".into());
    }
    let Some(tree) = core.layout.as_mut() else { return Err("this run takes no joins".into()) };
    let tree = Arc::make_mut(tree);
    let before = tree.heads().len();
    let base = match req.keep_first {
        Some(first) => keep_ids(core, first, &req)?,
        None => tree.graft(req.agents, req.instance_size, req.fanout),
    };
    let tree = core.layout.as_ref().expect("checked above");
    let new_heads: Vec<u32> = tree.heads()[before..].to_vec();
    core.turnout.expect_more(new_heads.len());
    new_heads.iter().for_each(|&h| core.affinity.join(h));
    tracing::info!(job = %core.job_id, joined = %req.job, agents = req.agents, nodes = req.nodes, first = base, "an allocation joined the run");
    core.allocations.push(Allocation {
        job: req.job,
        agents: base..base + req.agents,
        nodes: req.nodes,
        ends_us: req.ends_us,
        stage: Stage::Running,
    });
    Ok(base)
}

/// An allocation whose agents outlived the run's previous leader keeps their ids: those
/// that came back already stand as instances (`handover`), the others are grafted where
/// they were. Refused where another agent of this leader has one of the ids.
fn keep_ids(core: &mut Core<'_>, first: u32, req: &Attach) -> Result<u32, String> {
    if req.instance_size != 1 {
        return Err("only one-agent instances keep their ids".into());
    }
    let ids = first..first.saturating_add(req.agents);
    let tree = core.layout.as_ref().expect("checked by the caller");
    let taken = |a: &u32| (tree.holds(*a) && !core.strays.contains(a)) || core.allocation_of(*a).is_some();
    if let Some(a) = ids.clone().find(taken) {
        return Err(format!("agent {a} is another allocation's here"));
    }
    let free: Vec<u32> = ids.filter(|a| !tree.holds(*a)).collect();
    let tree = Arc::make_mut(core.layout.as_mut().expect("checked by the caller"));
    for a in free {
        tree.graft_at(a, 1, 1, req.fanout).expect("checked free");
    }
    Ok(first)
}

/// Allocations whose end has come are told to leave: each of their live agents starts
/// nothing more, hands back what is queued and goes once what runs has ended.
pub(super) fn leave_due<E>(core: &mut Core<'_>, t: &mut dyn Tasks<Error = E>, out: &mut Effects) -> Result<(), E> {
    let now = core.now_us;
    let due: Vec<usize> = (0..core.allocations.len())
        .filter(|&i| core.allocations[i].stage == Stage::Running)
        .filter(|&i| core.allocations[i].ends_us.is_some_and(|e| now >= e))
        .collect();
    if due.is_empty() {
        return Ok(());
    }
    for i in due {
        let reason = format!("its allocation (job {}) reaches its time limit", core.allocations[i].job);
        leave(core, i, reason, out);
    }
    dispatch::dispatch_all(core, t, out)
}

/// Tells a joined allocation to leave now (a grown job giving its nodes back to jobs that
/// wait for them): as at its time limit.
pub(super) fn leave_allocation(core: &mut Core<'_>, job: &str, reason: &str, out: &mut Effects) {
    if let Some(i) = core.allocations.iter().position(|a| a.job == job && a.stage == Stage::Running) {
        leave(core, i, format!("its allocation (job {job}) {reason}"), out);
    }
}

fn leave(core: &mut Core<'_>, i: usize, reason: String, out: &mut Effects) {
    let a = &mut core.allocations[i];
    a.stage = Stage::Leaving;
    tracing::info!(job = %core.job_id, allocation = %a.job, %reason, "an allocation leaves");
    let range = a.agents.clone();
    for agent in range.filter(|x| core.agents.get(x).is_some_and(|a| a.alive)) {
        out.push(Effect::stop(agent, Stop::Hold, reason.clone()));
    }
    core.replan();
}

/// The launcher of a joined allocation ended (its job ended): its agents that never joined
/// never will, and those still here go as its job's end takes them.
pub(super) fn allocation_gone(core: &mut Core<'_>, job: &str, now_us: u64) {
    core.now_us = now_us;
    let Some(i) = core.allocations.iter().position(|a| a.job == job && a.stage != Stage::Gone) else { return };
    core.allocations[i].stage = Stage::Gone;
    tracing::info!(job = %core.job_id, allocation = %job, "a joined allocation ended");
    let heads: Vec<u32> = match &core.layout {
        Some(t) => core.allocations[i].agents.clone().filter(|&a| t.head(a) == a).collect(),
        None => Vec::new(),
    };
    for agent in heads {
        agents::never_joined(core, agent, "its allocation ended before it joined");
    }
    core.replan();
}
