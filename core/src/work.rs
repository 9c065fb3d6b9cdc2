//! What an agent and its executors say to each other: the tasks it hands them, the commands it
//! gives, the events they answer with. Every executor (real processes, `--exec none|sleep`, the
//! simulator) speaks this, and the agent's machine is tested against it without processes.

use crate::record::Ended;
use crate::shape::TaskShape;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskToRun {
    pub id: u64,
    pub attempt: u32,
    pub command: Vec<u8>,
    pub shell: bool,
    /// What it asks. Of the leader's own asks (retries, class, exclusive, affinity) the agent
    /// is told nothing: they hold their defaults here.
    pub shape: TaskShape,
}

impl TaskToRun {
    /// A one-core task with no limits, no devices and no priority: what a task file line of
    /// only a command is.
    pub fn new(id: u64, attempt: u32, command: Vec<u8>) -> TaskToRun {
        TaskToRun { id, attempt, command, shell: false, shape: TaskShape::default() }
    }

    /// The same task asking `shape`.
    pub fn shaped(self, shape: TaskShape) -> TaskToRun {
        TaskToRun { shape, ..self }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finished {
    pub id: u64,
    pub attempt: u32,
    pub ended: Ended,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecEvent {
    Started {
        id: u64,
        attempt: u32,
        start_us: u64,
    },
    Finished(Finished),
    /// Taken out of the queue unstarted on `Command::Recall`: it never ran here.
    Recalled {
        id: u64,
        attempt: u32,
    },
    /// After `Command::Reset`: nothing runs or waits any more.
    Reset,
}

#[derive(Debug)]
pub enum Command {
    Run(Vec<TaskToRun>),
    /// Run what is queued, then stop.
    Finish,
    /// Kill everything running, drop the queue, stop.
    Abort,
    /// Kill everything running and drop the queue, then say `ExecEvent::Reset` and go on: the
    /// agent was given up and comes back empty.
    Reset,
    /// Start nothing more from the queue (`true`) until told otherwise (`false`): the agent has
    /// not heard from its parent for a while, and what it starts now may be re-run elsewhere.
    Hold(bool),
    /// Stop these tasks (preempted): running ones get SIGTERM then SIGKILL, queued ones are
    /// dropped; each ends as `Outcome::Preempted`.
    Stop(Vec<u64>),
    /// Give back those of these tasks that have not started (`ExecEvent::Recalled`); a started
    /// one runs on as if never asked for.
    Recall(Vec<u64>),
    /// Start nothing from the queue past this time (µs, the executor's clock) until a later
    /// lease comes: the agent's last word from its parent vouches for its queue until then. An
    /// agent stopped (SIGSTOP) past it may have been given up meanwhile and its queue sent
    /// elsewhere; its executor, running again before the agent reads that news, must not start
    /// that queue. Ignored once told to finish (the parent may fall silent then).
    Lease(u64),
}

/// Takes the tasks named in `ids` out of `queue`, each said as `ExecEvent::Recalled`: every
/// executor's (real or simulated) answer to `Command::Recall`.
pub fn recall_from(queue: &mut std::collections::VecDeque<TaskToRun>, ids: &[u64], events: &mut Vec<ExecEvent>) {
    let ids: std::collections::HashSet<u64> = ids.iter().copied().collect();
    queue.retain(|t| {
        let keep = !ids.contains(&t.id);
        if !keep {
            events.push(ExecEvent::Recalled { id: t.id, attempt: t.attempt });
        }
        keep
    });
}
