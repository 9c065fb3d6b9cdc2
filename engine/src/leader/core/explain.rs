//! Why a task is where it is (`htc task explain`): running or held by its agent's spawn loops,
//! or, while it waits, for what: the tasks it waits for, room (memory, GPUs, cores) no agent has
//! free now and the most any has, an agent's room reserved for a task that waited longer, the
//! run's time limit too near for its `runtime=` hint, a preemption, no agent big enough or none
//! at all. Read from the core's own state in a few lookups, none over the run's tasks: the
//! answer costs the same in a run of a million.

use super::prelude::*;
use htc_core::shape::TaskShape;

/// Why a task is where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Why {
    /// Done, failed or cancelled: its status says how.
    Ended,
    Running {
        agent: u32,
        host: String,
    },
    /// Sent to an agent that has not started it: its spawn loops hold it behind others.
    Held {
        agent: u32,
        host: String,
    },
    /// It waits for these tasks to end (`after=`, `afterany=`); `more` besides those listed.
    After {
        open: Vec<u64>,
        more: u64,
    },
    /// No agent has this much free now; `free_*` are the most any agent has.
    NoRoom {
        ask: Ask,
        free: Ask,
    },
    /// It would fit agent `agent`, whose room is reserved for task `behind`, waiting longer.
    Reserved {
        behind: u64,
        agent: u32,
    },
    /// Its `runtime=` hint ends after the run's time limit: it is left for the next session.
    Late {
        runtime_ms: u64,
        left_ms: u64,
    },
    /// Stopped for higher-priority work; it runs again once none waits.
    Preempted,
    /// No agent joined so far can hold it (largest: the most any has); it waits for one that can.
    TooBig {
        ask: Ask,
        largest: Ask,
    },
    /// No agent is connected: those the run had are gone, or none joined yet.
    NoAgent,
    /// Nothing holds it but its turn: `idle` slots are free.
    Queued {
        idle: u64,
    },
}

/// Cores, MiB and GPUs: what a task asks or what an agent has.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ask {
    pub cores: u64,
    pub mem_mb: u64,
    pub gpus: u64,
}

impl Why {
    /// One word for scripts.
    pub fn kind(&self) -> &'static str {
        match self {
            Why::Ended => "ended",
            Why::Running { .. } => "running",
            Why::Held { .. } => "held",
            Why::After { .. } => "after",
            Why::NoRoom { .. } => "no_room",
            Why::Reserved { .. } => "reserved",
            Why::Late { .. } => "time_limit",
            Why::Preempted => "preempted",
            Why::TooBig { .. } => "too_big",
            Why::NoAgent => "no_agent",
            Why::Queued { .. } => "queued",
        }
    }

    /// The answer in words.
    pub fn words(&self) -> String {
        let ids = |v: &[u64]| htc_core::idset::format(v);
        match self {
            Why::Ended => "it has ended".into(),
            Why::Running { agent, host } => format!("running on agent {agent} ({host})"),
            Why::Held { agent, host } => {
                format!("sent to agent {agent} ({host}), whose spawn loops have not started it yet")
            }
            Why::After { open, more: 0 } => format!("waiting for task{} {} to end", plural(open.len()), ids(open)),
            Why::After { open, more } => format!("waiting for tasks {} and {more} more to end", ids(open)),
            Why::NoRoom { ask, free } => {
                format!("no agent has {} free now (the most free on one: {})", ask.describe(), free.describe_as(ask))
            }
            Why::Reserved { behind, agent } => {
                format!("agent {agent}'s room is reserved for task {behind}, which has waited longer")
            }
            Why::Late { runtime_ms, left_ms } => format!(
                "its runtime= hint ({} s) ends after the run's time limit ({} s left): it is left for the next session",
                runtime_ms / 1000,
                left_ms / 1000
            ),
            Why::Preempted => "stopped for higher-priority work: it runs again once none waits".into(),
            Why::TooBig { ask, largest } => format!(
                "no agent so far can hold {} (the largest has {}): it waits for one that can",
                ask.describe(),
                largest.describe_as(ask)
            ),
            Why::NoAgent => "no agent is connected".into(),
            Why::Queued { idle: 0 } => "queued: every slot is busy".into(),
            Why::Queued { idle } => format!("queued: next to go ({idle} slots idle)"),
        }
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

impl Ask {
    fn of(s: &TaskShape) -> Ask {
        Ask { cores: s.cores as u64, mem_mb: s.mem_mb as u64, gpus: s.gpus as u64 }
    }

    /// The parts a task asks: `4 cores, 8192 MiB, 1 GPU`.
    fn describe(&self) -> String {
        self.describe_as(self)
    }

    /// This one's values of the parts `ask` has.
    fn describe_as(&self, ask: &Ask) -> String {
        let mut parts = vec![format!("{} core{}", self.cores, plural(self.cores as usize))];
        if ask.mem_mb > 0 {
            parts.push(format!("{} MiB", self.mem_mb));
        }
        if ask.gpus > 0 {
            parts.push(format!("{} GPU{}", self.gpus, plural(self.gpus as usize)));
        }
        parts.join(", ")
    }
}

/// Why task `id` (its record `r`) is where it is (`Core::explain`).
pub(super) fn explain(core: &Core<'_>, id: u64, r: &Record, after: Option<(Vec<u64>, u64)>) -> Why {
    let host = |agent: u32| core.agents.get(&agent).map_or_else(|| format!("agent-{agent}"), |a| a.hostname.clone());
    if let Some(f) = core.in_flight.get(id) {
        let (agent, host) = (f.agent, host(f.agent));
        return match f.life.state() {
            State::Running => Why::Running { agent, host },
            _ => Why::Held { agent, host },
        };
    }
    if r.state().is_final() {
        return Why::Ended;
    }
    if let Some((open, more)) = after.filter(|_| core.deps.is_waiting(id)) {
        return Why::After { open, more };
    }
    if !core.agents.values().any(|a| a.usable()) {
        return Why::NoAgent;
    }
    if core.late.contains(&id) {
        let left_ms = core.run_ends_us().map_or(0, |end| end.saturating_sub(core.now_us) / 1000);
        return Why::Late { runtime_ms: r.shape().runtime_ms as u64, left_ms };
    }
    if core.preemption.waits_again(id) {
        return Why::Preempted;
    }
    let ask = Ask::of(r.shape());
    if !core.agents.could_run(r.shape()) {
        return Why::TooBig { ask, largest: largest(core) };
    }
    if core.mem.waiting_tasks().any(|n| n.task == id) {
        return waiting_for_room(core, id, r, ask);
    }
    let idle = core.agents.values().filter(|a| a.usable()).map(|a| a.idle).sum();
    Why::Queued { idle }
}

/// A task waiting for memory or GPUs: reserved behind another on an agent it fits, or no room
/// anywhere now (and the most free on one agent).
fn waiting_for_room(core: &Core<'_>, id: u64, r: &Record, ask: Ask) -> Why {
    let mut free = Ask::default();
    for (&agent, a) in core.agents.iter().filter(|(_, a)| a.usable()) {
        if let Some(behind) = core.mem.reservation(agent).filter(|&t| t != id && a.fits(r.shape())) {
            return Why::Reserved { behind, agent };
        }
        let (used, budget) = core.mem.committed(agent).unwrap_or((0, a.mem_mb));
        let (gpus_used, gpus) = core.mem.gpus_committed(agent).unwrap_or((0, a.gpus));
        let cores = (a.cores as u64).saturating_sub(core.in_flight.held(agent));
        free.mem_mb = free.mem_mb.max(budget.saturating_sub(used));
        free.gpus = free.gpus.max(gpus.saturating_sub(gpus_used) as u64);
        free.cores = free.cores.max(cores);
    }
    Why::NoRoom { ask, free }
}

/// The most cores, memory and GPUs any live agent has.
fn largest(core: &Core<'_>) -> Ask {
    let live = || core.agents.values().filter(|a| a.usable());
    Ask {
        cores: live().map(|a| a.widest as u64).max().unwrap_or(0),
        mem_mb: live().map(|a| a.mem_mb).max().unwrap_or(0),
        gpus: live().map(|a| a.gpus as u64).max().unwrap_or(0),
    }
}
