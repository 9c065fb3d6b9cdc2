//! What comes up the tree (`msg::Up`) on the wire: an agent's Hello, Report or loss as its
//! frame, and a frame read from below as what it says. The leader's network side, a relay's
//! child connections and `htc simulate` read by these, so no two read a frame differently.

use super::proto::{self, frame::Body};
use super::PROTOCOL_VERSION;
use crate::msg::{Came, Capacity, Hello, Report, Started, TaskResult, Up};
use htc_core::record::{Ended, Outcome};

/// The frame that carries `up`. A Hello carries this end's protocol (a relay checked its
/// child's before it passed it on) and no process id (the sender's own connection says it).
pub fn frame(up: Up) -> Body {
    match up {
        Up::Hello(h) => Body::Hello(h.into()),
        Up::Report { agent, report } => Body::Report(report_frame(agent, report)),
        Up::Lost { agent, why } => Body::Lost(proto::Lost { agent, reason: why }),
    }
}

/// A frame from below as what it says; `None` for a frame that never goes up, for the reader
/// to refuse.
pub fn up(body: Body) -> Option<Up> {
    Some(match body {
        Body::Hello(h) => Up::Hello(h.into()),
        Body::Report(r) => Up::Report { agent: r.agent, report: r.into() },
        Body::Lost(l) => Up::Lost { agent: l.agent, why: l.reason },
        _ => return None,
    })
}

impl From<Hello> for proto::Hello {
    fn from(h: Hello) -> proto::Hello {
        let Hello { agent, cores, mem_mb, gpus, hostname, came } = h;
        let mut p = proto::Hello {
            agent_id: agent,
            cores,
            mem_mb,
            gpus,
            hostname,
            protocol: PROTOCOL_VERSION,
            ..Default::default()
        };
        match came {
            Came::New => {}
            Came::Rejoin { below } => (p.rejoin, p.below) = (true, below),
            Came::Fresh => p.fresh = true,
            Came::Handover => p.handover = true,
        }
        p
    }
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

fn report_frame(agent: u32, r: Report) -> proto::Report {
    let Report { seq, started, results, want, idle, cores, returned, holding, capacity, recalled, drained, signalled } =
        r;
    proto::Report {
        seq,
        started: started
            .into_iter()
            .map(|s| proto::TaskStarted { id: s.id, attempt: s.attempt, start_us: s.start_us })
            .collect(),
        results: results.into_iter().map(proto::TaskResult::from).collect(),
        want,
        drained,
        agent,
        idle,
        cores,
        returned,
        resync: holding.is_some(),
        holding: holding.unwrap_or_default(),
        capacity: capacity.map(proto::Capacity::from),
        recalled,
        signalled,
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
            drained: r.drained,
            signalled: r.signalled,
        }
    }
}

impl From<proto::TaskStarted> for Started {
    fn from(s: proto::TaskStarted) -> Started {
        Started { id: s.id, attempt: s.attempt, start_us: s.start_us }
    }
}

impl From<TaskResult> for proto::TaskResult {
    fn from(r: TaskResult) -> proto::TaskResult {
        let TaskResult { id, attempt, ended: Ended { outcome, value, start_us, end_us }, ran_on } = r;
        proto::TaskResult {
            id,
            attempt,
            outcome: proto::Outcome::from(outcome) as i32,
            value,
            start_us,
            end_us,
            ran_on,
        }
    }
}

/// An outcome this end does not know reads as none (`Outcome::None`), which fails the task.
impl From<proto::TaskResult> for TaskResult {
    fn from(r: proto::TaskResult) -> TaskResult {
        TaskResult {
            id: r.id,
            attempt: r.attempt,
            ended: Ended {
                outcome: Outcome::from(proto::Outcome::try_from(r.outcome).unwrap_or(proto::Outcome::Unspecified)),
                value: r.value,
                start_us: r.start_us,
                end_us: r.end_us,
            },
            ran_on: r.ran_on,
        }
    }
}

impl From<Capacity> for proto::Capacity {
    fn from(c: Capacity) -> proto::Capacity {
        let Capacity { mem_mb, largest_mem_mb, gpus, largest_gpus, largest_cores } = c;
        proto::Capacity { mem_mb, largest_mem_mb, gpus, largest_gpus, largest_cores }
    }
}

impl From<proto::Capacity> for Capacity {
    fn from(c: proto::Capacity) -> Capacity {
        let proto::Capacity { mem_mb, largest_mem_mb, gpus, largest_gpus, largest_cores } = c;
        Capacity { mem_mb, largest_mem_mb, gpus, largest_gpus, largest_cores }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(TaskResult::from(unknown).ended.outcome, Outcome::None);
    }

    #[test]
    fn everything_an_agent_says_reads_back_as_it_was_said() {
        let hello = |came| Hello { agent: 4, cores: 2, mem_mb: 100, gpus: 1, hostname: "n4".into(), came };
        let result = TaskResult { id: 8, attempt: 2, ran_on: Some(5), ended: Ended::new(Outcome::Signaled, 9, 10, 11) };
        let report = Report {
            seq: 3,
            started: vec![Started { id: 7, attempt: 1, start_us: 6 }],
            results: vec![result],
            want: 12,
            idle: 1,
            cores: 4,
            returned: vec![13],
            holding: Some(vec![7, 14]),
            capacity: Some(Capacity { mem_mb: 1, largest_mem_mb: 2, gpus: 3, largest_gpus: 4, largest_cores: 5 }),
            recalled: vec![15],
            drained: true,
            signalled: true,
        };
        let ups = [
            Up::Hello(hello(Came::New)),
            Up::Hello(hello(Came::Fresh)),
            Up::Hello(hello(Came::Handover)),
            Up::Hello(hello(Came::Rejoin { below: vec![5, 6] })),
            Up::Report { agent: 4, report: report.clone() },
            Up::Report { agent: 4, report: Report { holding: Some(Vec::new()), ..Default::default() } },
            Up::Report { agent: 4, report: Report::default() },
            Up::Lost { agent: 5, why: "gone".into() },
        ];
        for u in ups {
            let body = frame(u.clone());
            if let Body::Hello(h) = &body {
                assert_eq!(h.protocol, PROTOCOL_VERSION);
            }
            assert_eq!(up(body), Some(u));
        }
        assert_eq!(up(Body::Ack(proto::Ack::default())), None, "an Ack never goes up");
    }
}
