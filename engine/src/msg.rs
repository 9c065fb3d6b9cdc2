//! The tree's messages as the engine's own plain types: what goes down to an agent (`Down`: a
//! `ToAgent` for it) and what comes up (`Up`: a `Hello`, a `Report`, a loss). The leader, the
//! agents' machines and the instance heads decide in these; `wire` maps them to and from the
//! prost frames of `proto/htc.proto`, so a field added to the wire touches the mapping, not the
//! decisions. They stand beside `leader` and `agent`, as both speak them.

use htc_core::record::Ended;
use htc_core::work::TaskToRun;

/// What the leader says to one agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToAgent {
    /// Tasks to run, in order (the wire cuts them into frames of a bounded size). Each shape is
    /// what an agent is told of it (`TaskShape::for_agent`).
    Dispatch(Vec<TaskToRun>),
    /// Every report up to and including `seq` is committed; with nothing new, a heartbeat.
    Ack {
        seq: u64,
    },
    /// As `Ack`, and: say what you hold (a Report with `holding`), since frames may have been
    /// lost on the way.
    Resync {
        seq: u64,
    },
    /// Stop these preemptible tasks for higher-priority work.
    Preempt(Vec<u64>),
    /// Give these tasks back if they have not started.
    Recall(Vec<u64>),
    Shutdown {
        stop: Stop,
        reason: String,
    },
    /// The answer to a Hello the leader (or an instance head) took.
    Welcome {
        job_id: String,
    },
    /// The answer to a Hello refused.
    Reject {
        reason: String,
    },
}

/// A frame down the tree: `msg` for `agent`, the reader or one below it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Down {
    pub agent: u32,
    pub msg: ToAgent,
}

/// A frame up the tree: what an agent says (its own, or one relayed for an agent below it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Up {
    Hello(Hello),
    Report {
        agent: u32,
        report: Report,
    },
    /// An agent is gone: one below a relay that lost its connection, or an agent that says why
    /// it stops before it closes its own.
    Lost {
        agent: u32,
        why: String,
    },
}

impl Up {
    /// The agent it speaks for.
    pub fn agent(&self) -> u32 {
        match self {
            Up::Hello(h) => h.agent,
            Up::Report { agent, .. } | Up::Lost { agent, .. } => *agent,
        }
    }
}

/// How an agent is told to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The run is complete: finish and exit.
    Finish,
    /// Kill what runs and exit.
    Abort,
    /// Start nothing more: finish what runs, hand back what is queued, and leave.
    Hold,
    /// Given up by the leader: stop everything, then come back as a fresh member.
    Revive,
}

/// An agent's first word to the leader (or a relay's for one below it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub agent: u32,
    pub cores: u32,
    /// Memory it may hand out to tasks, 0: unlimited.
    pub mem_mb: u64,
    pub gpus: u32,
    pub hostname: String,
    pub came: Came,
}

/// Why an agent says Hello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Came {
    /// A new member.
    New,
    /// Around a lost relay, keeping its tasks, with the agents it relays for.
    Rejoin { below: Vec<u32> },
    /// Given up before, it stopped everything and comes back empty.
    Fresh,
    /// Its leader was lost: it comes to the run's new one with the tasks it kept.
    Handover,
}

/// An agent's (or an instance head's) report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Increases by one per report that carries results, or that probes (`agent::stall`).
    pub seq: u64,
    pub started: Vec<Started>,
    pub results: Vec<TaskResult>,
    /// How many more tasks it wants.
    pub want: u32,
    /// Slots with nothing to run.
    pub idle: u32,
    /// An instance head: its instance's slots now (0: unchanged).
    pub cores: u32,
    /// An instance head: tasks a lost member had not reported started.
    pub returned: Vec<u64>,
    /// The answer to a `ToAgent::Resync`: every task it holds, queued or running.
    pub holding: Option<Vec<u64>>,
    /// An instance head whose members changed: what the instance has for tasks.
    pub capacity: Option<Capacity>,
    /// Tasks given back unstarted on a Recall.
    pub recalled: Vec<u64>,
    /// Nothing queued and nothing running (read by nobody: the leader counts for itself).
    pub drained: bool,
    /// The agent (or a member of the head's) was signalled: SIGTERM, under Slurm a cancel or
    /// a preemption.
    pub signalled: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Started {
    pub id: u64,
    pub attempt: u32,
    pub start_us: u64,
}

/// How an attempt ended, as the agent reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskResult {
    pub id: u64,
    pub attempt: u32,
    pub ended: Ended,
    /// The member agent that ran it, when not the reporting agent.
    pub ran_on: Option<u32>,
}

/// As the wire's: zeros, and no outcome (which fails the task).
impl Default for TaskResult {
    fn default() -> TaskResult {
        TaskResult { id: 0, attempt: 0, ended: Ended::NONE, ran_on: None }
    }
}

/// An instance's resources: sums over its members, and its largest member's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capacity {
    /// 0: memory not accounted.
    pub mem_mb: u64,
    pub largest_mem_mb: u64,
    pub gpus: u32,
    pub largest_gpus: u32,
    pub largest_cores: u32,
}
