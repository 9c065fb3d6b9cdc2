//! What the core is fed and what it answers besides effects: the ledger it writes through
//! (`Tasks`), its inputs, the figures and endings it reports, and the bounds it keeps.

use htc_core::record::{Change, Record};
use htc_core::task::Counts;

use super::open::NewTask;
use crate::msg::{self, Came, Hello, Up};

/// Where task records live: the ledger's write transaction in a real run, a map in tests. Reads
/// see the writes made before them.
pub trait Tasks {
    /// The store's own failure; the core never makes one, it passes the first on and stops.
    type Error;
    fn get(&self, id: u64) -> Result<Option<Record>, Self::Error>;
    /// The records of `ids` that exist, in id order.
    fn range(&self, ids: std::ops::Range<u64>) -> Result<Vec<(u64, Record)>, Self::Error>;
    /// Applies one change the core decided; the core's only way to change the ledger.
    fn apply(&mut self, c: &Change) -> Result<(), Self::Error>;
    /// The task's command line.
    fn command(&self, r: &Record) -> Vec<u8>;
    /// Task `id`'s rules for its attempts, asked only of a record that has some
    /// (`TaskShape::rules`).
    fn rules(&self, id: u64) -> Result<Option<htc_core::attempts::Rules>, Self::Error>;
    /// The id the next added task gets: one past the highest.
    fn next_id(&self) -> Result<u64, Self::Error>;
    /// Adds a task under the next id, with its command, what it waits for and its key.
    fn add(&mut self, t: &NewTask) -> Result<(u64, Record), Self::Error>;
    /// The task added under `key`, if one was.
    fn keyed(&self, key: &[u8]) -> Result<Option<u64>, Self::Error>;
    /// The run's class names (`class=`), by number: 0 is `default`.
    fn classes(&self) -> Result<Vec<String>, Self::Error>;
    /// The run's class names, now with those that added tasks named first.
    fn set_classes(&mut self, names: &[String]) -> Result<(), Self::Error>;
}

/// What happens, as the core sees it.
#[derive(Debug)]
pub enum Input {
    Joined {
        agent: u32,
        cores: u32,
        mem_mb: u64,
        gpus: u32,
        hostname: String,
    },
    Report {
        agent: u32,
        report: msg::Report,
    },
    Lost {
        agent: u32,
        why: String,
    },
    /// An agent whose relay was lost reconnected directly, with the agents it relays for.
    /// An agent given up (hung, cut off) came back, having stopped everything it held: a new
    /// member from here on.
    Revived {
        agent: u32,
        cores: u32,
        mem_mb: u64,
        gpus: u32,
        hostname: String,
    },
    Rejoined {
        agent: u32,
        below: Vec<u32>,
    },
    /// An agent whose leader was lost came to this one, which took the run over, with the tasks
    /// it kept (`handover`).
    HandedOver {
        agent: u32,
        cores: u32,
        mem_mb: u64,
        gpus: u32,
        hostname: String,
    },
    /// An agent's relay was lost: it may rejoin within its lease, or fall silent and be lost.
    Detached {
        agent: u32,
    },
    /// An agent process ended before it ever joined (local launcher), or could not be started.
    NeverJoined {
        agent: u32,
        why: String,
    },
    /// An agent's process exited badly (the srun step says so), `why` naming its node and its
    /// last words.
    AgentExited {
        agent: u32,
        why: String,
    },
    Interrupt {
        signal: i32,
    },
    /// Stopped by a signal, and Slurm ends the job `grace_us` from now (a preemption's
    /// `GraceTime`): the run finishes what runs and starts nothing more until then.
    Grace {
        signal: i32,
        grace_us: u64,
    },
    /// Time passed: heartbeats are due, silent agents are given up.
    Tick,
    /// A user cancelled these tasks.
    Cancel {
        ids: Vec<u64>,
    },
    /// A client adds tasks to an open run; the answer is `Effect::Added` with `request`.
    Add {
        request: u64,
        tasks: Vec<NewTask>,
    },
    /// `htc close`: the open run takes no more tasks; with `cancel`, what it holds is cancelled.
    Close {
        cancel: bool,
    },
}

/// What a Hello tells the core, by why the agent came: the one reading, for every driver.
impl From<Hello> for Input {
    fn from(h: Hello) -> Input {
        let Hello { agent, cores, mem_mb, gpus, hostname, came } = h;
        match came {
            Came::New => Input::Joined { agent, cores, mem_mb, gpus, hostname },
            Came::Rejoin { below } => Input::Rejoined { agent, below },
            Came::Fresh => Input::Revived { agent, cores, mem_mb, gpus, hostname },
            Came::Handover => Input::HandedOver { agent, cores, mem_mb, gpus, hostname },
        }
    }
}

/// What an agent's word tells the core: the one reading, for every driver.
impl From<Up> for Input {
    fn from(up: Up) -> Input {
        match up {
            Up::Hello(h) => Input::from(h),
            Up::Report { agent, report } => Input::Report { agent, report },
            Up::Lost { agent, why } => Input::Lost { agent, why },
        }
    }
}

/// How often agents are asked what they hold (`agents::audit`), in units of the loss bound
/// (`lost_after_s`): every minute by default.
pub const AUDIT_EVERY_LOST_AFTER: u64 = 6;

/// Hinted work per core an agent may hold before it gets only what it can start (`with_horizon`).
pub const HORIZON_MS: u64 = 1_000;

#[derive(Debug, Clone, Copy, Default)]
pub struct Progress {
    pub counts: Counts,
    pub elapsed: std::time::Duration,
    /// Tasks finished (done or failed) in this session, for the rate.
    pub finished_this_session: u64,
    pub agents: usize,
    /// Pending tasks that wait for others.
    pub blocked: u64,
    /// Allocations that joined the run and still run: should the leader's own end, one of them
    /// takes the run over (no resubmission).
    pub joined_running: usize,
}

/// How long before the end of a grace (`Input::Grace`) the run stops what still runs.
pub const GRACE_MARGIN_US: u64 = 2_000_000;

#[derive(Debug, PartialEq, Eq)]
pub enum Ending {
    /// Every task is done or failed.
    Complete,
    /// Stopped by a signal; the run can be resumed.
    Interrupted(i32),
    /// Preempted with a grace (`Input::Grace`), which it used: what ran in it finished, nothing
    /// more started; the run can be resumed, and `--htc-resubmit` continues it.
    Preempted(i32),
    /// No agent is left to run the remaining tasks.
    AgentsLost(String),
    /// `--max-fails`: this many tasks failed for good, so nothing more was started and the
    /// run stopped once what was running ended; it can be resumed.
    TooManyFailures(u64),
    /// What is left (this many tasks) cannot finish before the time limit, by their runtime
    /// hints; it waits for a resume.
    OutOfTime(u64),
    /// An agent could not start on its node (why): the node is broken, and the run stops until
    /// it is fixed; it can be resumed then.
    AgentNotStarted(String),
}
