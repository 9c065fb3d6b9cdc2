//! The leader's messages (`msg`) on the wire: what it says to an agent as frames, and the
//! frames it reads (Hello, Report) as what it understands of them. The only place the leader's
//! words meet prost; the bytes are those of `proto/htc.proto` (`PROTOCOL_VERSION`).

use super::proto::{self, frame::Body};
use crate::msg::{Came, Capacity, Hello, Report, Started, Stop, TaskResult, ToAgent};
use htc_core::record::Outcome;

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

/// Why the agent says Hello; a rejoin first, as it brings the agents below it.
impl From<proto::Hello> for Hello {
    fn from(h: proto::Hello) -> Hello {
        let came = if h.rejoin {
            Came::Rejoin { below: h.below }
        } else if h.handover {
            Came::Handover
        } else if h.fresh {
            Came::Fresh
        } else {
            Came::New
        };
        Hello { agent: h.agent_id, cores: h.cores, mem_mb: h.mem_mb, gpus: h.gpus, hostname: h.hostname, came }
    }
}

impl From<proto::Report> for Report {
    fn from(r: proto::Report) -> Report {
        Report {
            seq: r.seq,
            started: r.started.into_iter().map(Started::from).collect(),
            results: r.results.into_iter().map(TaskResult::from).collect(),
            want: r.want,
            idle: r.idle,
            cores: r.cores,
            returned: r.returned,
            holding: r.resync.then_some(r.holding),
            capacity: r.capacity.map(Capacity::from),
            recalled: r.recalled,
        }
    }
}

impl From<proto::TaskStarted> for Started {
    fn from(s: proto::TaskStarted) -> Started {
        Started { id: s.id, attempt: s.attempt, start_us: s.start_us }
    }
}

/// An outcome this end does not know reads as none (`Outcome::None`), which fails the task.
impl From<proto::TaskResult> for TaskResult {
    fn from(r: proto::TaskResult) -> TaskResult {
        TaskResult {
            id: r.id,
            attempt: r.attempt,
            outcome: Outcome::from(proto::Outcome::try_from(r.outcome).unwrap_or(proto::Outcome::Unspecified)),
            value: r.value,
            start_us: r.start_us,
            end_us: r.end_us,
            ran_on: r.ran_on,
        }
    }
}

impl From<proto::Capacity> for Capacity {
    fn from(c: proto::Capacity) -> Capacity {
        Capacity {
            mem_mb: c.mem_mb,
            largest_mem_mb: c.largest_mem_mb,
            gpus: c.gpus,
            largest_gpus: c.largest_gpus,
            largest_cores: c.largest_cores,
        }
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
    fn a_long_dispatch_is_cut_into_frames_that_keep_its_tasks_in_order() {
        let big = vec![b'x'; super::super::MAX_BATCH_BYTES / 4];
        let specs =
            (0..10).map(|id| crate::msg::TaskSpec { id, attempt: 1, command: big.clone(), ..Default::default() });
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

    #[test]
    fn a_hello_says_why_it_came_a_rejoin_before_all_else() {
        let h = proto::Hello { agent_id: 3, cores: 4, mem_mb: 5, gpus: 1, hostname: "n".into(), ..Default::default() };
        let came = |h: proto::Hello| Hello::from(h).came;
        assert_eq!(
            Hello::from(h.clone()),
            Hello { agent: 3, cores: 4, mem_mb: 5, gpus: 1, hostname: "n".into(), came: Came::New }
        );
        assert_eq!(came(proto::Hello { fresh: true, ..h.clone() }), Came::Fresh);
        assert_eq!(came(proto::Hello { handover: true, fresh: true, ..h.clone() }), Came::Handover);
        let rejoin = proto::Hello { rejoin: true, handover: true, below: vec![5, 6], ..h };
        assert_eq!(came(rejoin), Came::Rejoin { below: vec![5, 6] });
    }

    #[test]
    fn a_report_holds_what_it_was_asked_only_when_it_answers_a_resync() {
        let r = proto::Report { holding: vec![1], ..Default::default() };
        assert_eq!(Report::from(r.clone()).holding, None);
        assert_eq!(Report::from(proto::Report { resync: true, ..r }).holding, Some(vec![1]));
        let unknown = proto::TaskResult { outcome: 99, ..Default::default() };
        assert_eq!(TaskResult::from(unknown).outcome, Outcome::None);
    }
}
