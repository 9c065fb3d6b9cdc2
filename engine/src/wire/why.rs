//! `htc task explain`'s answer on the wire: a `Why` (`leader::core::explain`) as a `TaskWhy`.

use super::proto;
use crate::leader::core::explain::{Ask, Why};

fn parts(a: &Ask) -> Vec<u64> {
    vec![a.cores, a.mem_mb, a.gpus]
}

impl proto::TaskWhy {
    /// Task `id`, in state `state` (as `TaskState` says it), for the reason `why`.
    pub fn of(id: u64, state: &str, why: &Why) -> proto::TaskWhy {
        let mut w = proto::TaskWhy {
            id,
            state: state.into(),
            kind: why.kind().into(),
            words: why.words(),
            ..Default::default()
        };
        match why {
            Why::Running { agent, host } | Why::Held { agent, host } => {
                (w.agent, w.host) = (Some(*agent), host.clone());
            }
            Why::After { open, more } => (w.ids, w.more) = (open.clone(), *more),
            Why::NoRoom { ask, free: room } | Why::TooBig { ask, largest: room } => {
                (w.ask, w.room) = (parts(ask), parts(room));
            }
            Why::Reserved { behind, agent } => (w.ids, w.agent) = (vec![*behind], Some(*agent)),
            Why::Late { runtime_ms, left_ms } => (w.runtime_ms, w.left_ms) = (*runtime_ms, *left_ms),
            Why::Ended | Why::Preempted | Why::NoAgent | Why::Queued { .. } => {}
        }
        w
    }
}
