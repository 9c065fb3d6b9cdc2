//! What goes down the tree (`msg::Down`) on the wire: a message for one agent as its frames, and
//! a frame read from above as the message it carries. Both ends (the leader's network side, an
//! agent's or a relay's connection to its parent) map by these functions, so no two read a
//! frame differently; the bytes are those of `proto/htc.proto` (`PROTOCOL_VERSION`).

use super::proto::{self, frame::Body};
use crate::msg::{Down, Stop, ToAgent};
use htc_core::work::TaskToRun;

/// The frames that carry `msg` to `agent`, in order, each handed to `put`: a dispatch is cut
/// by bytes as well as count (`dispatches`).
pub fn frames(agent: u32, msg: ToAgent, mut put: impl FnMut(Body)) {
    match msg {
        ToAgent::Dispatch(specs) => {
            let specs = specs.into_iter().map(proto::TaskSpec::from).collect();
            super::dispatches(agent, specs).into_iter().for_each(|d| put(Body::Dispatch(d)));
        }
        ToAgent::Ack { seq } => put(Body::Ack(proto::Ack { seq, agent, resync: false })),
        ToAgent::Resync { seq } => put(Body::Ack(proto::Ack { seq, agent, resync: true })),
        ToAgent::Preempt(ids) => put(Body::Preempt(proto::Preempt { agent, ids })),
        ToAgent::Recall(ids) => put(Body::Recall(proto::Recall { agent, ids })),
        ToAgent::Shutdown { stop, reason } => put(Body::Shutdown(shutdown(agent, stop, reason))),
        ToAgent::Welcome { job_id } => put(Body::Welcome(proto::Welcome { job_id, agent_id: agent })),
        ToAgent::Reject { reason } => put(Body::Reject(proto::Reject { reason, agent_id: agent })),
    }
}

/// A Shutdown's flags as the agent's machine reads them.
fn shutdown(agent: u32, stop: Stop, reason: String) -> proto::Shutdown {
    let (abort, hold, revive) = match stop {
        Stop::Finish => (false, false, false),
        Stop::Abort => (true, false, false),
        Stop::Hold => (false, true, false),
        Stop::Revive => (true, false, true),
    };
    proto::Shutdown { abort, reason, agent, hold, revive }
}

/// A frame from above as the message it carries; `None` for a frame that never goes down (a
/// Hello, a Report), for the reader to refuse.
pub fn down(body: Body) -> Option<Down> {
    let (agent, msg) = match body {
        Body::Dispatch(d) => (d.agent, ToAgent::Dispatch(d.tasks.into_iter().map(TaskToRun::from).collect())),
        Body::Ack(a) if a.resync => (a.agent, ToAgent::Resync { seq: a.seq }),
        Body::Ack(a) => (a.agent, ToAgent::Ack { seq: a.seq }),
        Body::Preempt(p) => (p.agent, ToAgent::Preempt(p.ids)),
        Body::Recall(r) => (r.agent, ToAgent::Recall(r.ids)),
        Body::Shutdown(s) => (s.agent, ToAgent::Shutdown { stop: stop(&s), reason: s.reason }),
        Body::Welcome(w) => (w.agent_id, ToAgent::Welcome { job_id: w.job_id }),
        Body::Reject(r) => (r.agent_id, ToAgent::Reject { reason: r.reason }),
        _ => return None,
    };
    Some(Down { agent, msg })
}

/// A Shutdown's flags read as one way to stop: a revive is an abort too, and an abort outranks
/// a hold.
fn stop(s: &proto::Shutdown) -> Stop {
    match (s.abort, s.revive, s.hold) {
        (true, true, _) => Stop::Revive,
        (true, false, _) => Stop::Abort,
        (false, _, true) => Stop::Hold,
        (false, _, false) => Stop::Finish,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(agent: u32, msg: ToAgent) -> Vec<Body> {
        let mut out = Vec::new();
        frames(agent, msg, |b| out.push(b));
        out
    }

    #[test]
    fn each_way_to_stop_is_the_flags_the_agent_reads() {
        let flags = |stop| match &sent(4, ToAgent::Shutdown { stop, reason: "r".into() })[..] {
            [Body::Shutdown(s)] if s.agent == 4 && s.reason == "r" => (s.abort, s.hold, s.revive),
            other => panic!("{other:?}"),
        };
        assert_eq!(flags(Stop::Finish), (false, false, false));
        assert_eq!(flags(Stop::Abort), (true, false, false));
        assert_eq!(flags(Stop::Hold), (false, true, false));
        assert_eq!(flags(Stop::Revive), (true, false, true));
    }

    #[test]
    fn acks_resyncs_preempts_and_recalls_name_their_agent() {
        assert_eq!(sent(2, ToAgent::Ack { seq: 5 }), [Body::Ack(proto::Ack { seq: 5, agent: 2, resync: false })]);
        assert_eq!(sent(2, ToAgent::Resync { seq: 5 }), [Body::Ack(proto::Ack { seq: 5, agent: 2, resync: true })]);
        assert_eq!(sent(2, ToAgent::Preempt(vec![7])), [Body::Preempt(proto::Preempt { agent: 2, ids: vec![7] })]);
        assert_eq!(sent(2, ToAgent::Recall(vec![7])), [Body::Recall(proto::Recall { agent: 2, ids: vec![7] })]);
        assert!(sent(2, ToAgent::Dispatch(Vec::new())).is_empty(), "no empty Dispatch frame");
    }

    #[test]
    fn every_message_down_reads_back_as_it_was_sent() {
        let task = TaskToRun::new(9, 2, b"echo".to_vec());
        let msgs = [
            ToAgent::Dispatch(vec![task]),
            ToAgent::Ack { seq: 3 },
            ToAgent::Resync { seq: 4 },
            ToAgent::Preempt(vec![1, 2]),
            ToAgent::Recall(vec![3]),
            ToAgent::Shutdown { stop: Stop::Finish, reason: "done".into() },
            ToAgent::Shutdown { stop: Stop::Abort, reason: "a".into() },
            ToAgent::Shutdown { stop: Stop::Hold, reason: "h".into() },
            ToAgent::Shutdown { stop: Stop::Revive, reason: "r".into() },
            ToAgent::Welcome { job_id: "77".into() },
            ToAgent::Reject { reason: "no".into() },
        ];
        for msg in msgs {
            let read: Vec<Down> = sent(6, msg.clone()).into_iter().map(|b| down(b).unwrap()).collect();
            assert_eq!(read, [Down { agent: 6, msg }]);
        }
        assert_eq!(down(Body::Hello(proto::Hello::default())), None, "a Hello never goes down");
    }

    #[test]
    fn a_long_dispatch_is_cut_into_frames_that_keep_its_tasks_in_order() {
        let big = vec![b'x'; super::super::MAX_BATCH_BYTES / 4];
        let specs = (0..10).map(|id| TaskToRun::new(id, 1, big.clone()));
        let frames = sent(3, ToAgent::Dispatch(specs.collect()));
        assert!(frames.len() >= 3, "{}", frames.len());
        let ids: Vec<u64> = frames
            .iter()
            .flat_map(|b| match b {
                Body::Dispatch(d) if d.agent == 3 => d.tasks.iter().map(|t| t.id).collect::<Vec<_>>(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(ids, (0..10).collect::<Vec<_>>());
    }
}
