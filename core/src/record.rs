//! A task's record and the outcomes of its attempts: what the ledger stores of each task, as
//! plain values. How they are laid out on disk is the store's business (`ledger.rs` in the node
//! agent); the engine and the product read and change them here.

use crate::shape::TaskShape;
use crate::task::{Life, State};

/// The errno values a failed spawn reports, as Linux numbers them (the agents' and the leader's
/// platform). Kept here so that this crate needs no `libc`; the node agent's tests check them
/// against it.
pub mod errno {
    pub const ENOENT: i32 = 2;
    pub const E2BIG: i32 = 7;
    pub const ENOEXEC: i32 = 8;
    pub const EACCES: i32 = 13;
}

/// How an attempt ended; mirrors `proto::Outcome`, plus `Lost` for an attempt whose agent vanished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Outcome {
    None = 0,
    Exited = 1,
    Signaled = 2,
    TimedOut = 3,
    SpawnFailed = 4,
    Lost = 5,
    /// Needs more cores or memory than any agent has.
    Unschedulable = 6,
    /// Killed for using more memory than its `mem=`; the value is the resident MiB seen.
    OutOfMemory = 7,
    /// Stopped for higher-priority work; it runs again without using a retry.
    Preempted = 8,
}

impl Outcome {
    /// The stored byte back to an outcome; an unknown byte reads as `None`.
    pub fn from_u8(v: u8) -> Outcome {
        match v {
            1 => Outcome::Exited,
            2 => Outcome::Signaled,
            3 => Outcome::TimedOut,
            4 => Outcome::SpawnFailed,
            5 => Outcome::Lost,
            6 => Outcome::Unschedulable,
            7 => Outcome::OutOfMemory,
            8 => Outcome::Preempted,
            _ => Outcome::None,
        }
    }

    /// Whether an attempt that ended so would end so again: a command that cannot be found or
    /// executed (spawn errors, or a shell's exit 126/127). Retrying it only burns time.
    pub fn is_permanent(self, value: i32) -> bool {
        match self {
            Outcome::SpawnFailed => [errno::ENOENT, errno::EACCES, errno::ENOEXEC, errno::E2BIG].contains(&value),
            Outcome::Exited => value == 126 || value == 127,
            _ => false,
        }
    }

    /// Human description of an attempt's end, e.g. "exit 3", "signal 9 (KILL)", "timed out".
    pub fn describe(self, value: i32) -> String {
        match self {
            Outcome::None => "-".into(),
            Outcome::Exited => format!("exit {value}"),
            Outcome::Signaled => format!("killed by signal {value}{}", signal_name(value)),
            Outcome::TimedOut => "timed out".into(),
            Outcome::SpawnFailed => {
                // What a shell would have reported: 126 for "cannot execute", 127 for "not found".
                let code = if value == errno::EACCES || value == errno::ENOEXEC { 126 } else { 127 };
                let err = std::io::Error::from_raw_os_error(value).to_string();
                let err = err.split(" (os error").next().unwrap_or(&err).to_string();
                format!("exit {code}: could not start: {err}")
            }
            Outcome::Lost => "lost with its agent".into(),
            Outcome::Unschedulable => "needs more cores, memory or GPUs than any agent has".into(),
            Outcome::OutOfMemory => format!("out of memory ({value} MiB resident, past its mem=)"),
            Outcome::Preempted => "preempted for higher-priority work".into(),
        }
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        1 => " (HUP)",
        2 => " (INT)",
        6 => " (ABRT)",
        9 => " (KILL)",
        11 => " (SEGV)",
        13 => " (PIPE)",
        15 => " (TERM)",
        _ => "",
    }
}

/// One task: what it asks for (set at load) and where it stands (updated by the leader).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Record {
    pub cmd_off: u64,
    pub cmd_len: u32,
    pub line: u32,
    pub cores: u16,
    pub retries: u8,
    pub shell: bool,
    pub timeout_ms: u32,
    pub mem_mb: u32,
    pub class: u16,
    pub runtime_ms: u32,
    pub state: u8,
    pub attempts: u8,
    /// Attempts lost with their agent (they cost no retry until `task::MAX_LOSSES`).
    pub losses: u8,
    /// `max_output=`, encoded (`htc_core::taskfile::output_cap`); 0 = no cap.
    pub max_output: u16,
    pub outcome: u8,
    pub value: i32,
    pub agent: u32,
    pub start_us: u64,
    pub end_us: u64,
    /// `gpus=`: devices the task gets to itself.
    pub gpus: u8,
    /// `Record::EXCLUSIVE`, `Record::PREEMPTIBLE`.
    pub flags: u8,
    /// `priority=`: higher starts first.
    pub priority: i16,
    /// `affinity=KEY`, hashed (`htc_core::taskfile::affinity_hash`); 0 = none.
    pub affinity: u32,
    /// Dispatches that came back unstarted (a lost agent's queue, a refund): each took an
    /// attempt number of its own, so `$HTC_ATTEMPT` of the last attempt counts them too.
    pub returns: u8,
}

impl Record {
    /// The task wants a node to itself.
    pub const EXCLUSIVE: u8 = 1;
    /// The task may be stopped and requeued for higher-priority work.
    pub const PREEMPTIBLE: u8 = 2;

    pub fn state(&self) -> State {
        State::from_u8(self.state).unwrap_or(State::Pending)
    }
    pub fn set_state(&mut self, s: State) {
        self.state = s as u8;
    }
    /// The fields `task::step` reads and moves.
    pub fn life(&self) -> Life {
        Life {
            state: self.state,
            attempts: self.attempts,
            retries: self.retries,
            losses: self.losses,
            returns: self.returns,
        }
    }
    pub fn set_life(&mut self, l: Life) {
        self.state = l.state;
        self.attempts = l.attempts;
        self.retries = l.retries;
        self.losses = l.losses;
        self.returns = l.returns;
    }
    /// What the task asks.
    pub fn shape(&self) -> TaskShape {
        TaskShape {
            cores: self.cores,
            mem_mb: self.mem_mb,
            gpus: self.gpus,
            timeout_ms: self.timeout_ms,
            retries: self.retries,
            class: self.class,
            runtime_ms: self.runtime_ms,
            max_output: self.max_output,
            priority: self.priority,
            exclusive: self.flags & Record::EXCLUSIVE != 0,
            preemptible: self.flags & Record::PREEMPTIBLE != 0,
            affinity: self.affinity,
        }
    }
    pub fn outcome(&self) -> Outcome {
        Outcome::from_u8(self.outcome)
    }

    /// The number of the attempt the record holds (its last), as its task saw it in `$HTC_ATTEMPT`.
    pub fn attempt_no(&self) -> u32 {
        self.life().attempt_no()
    }

    /// The attempt the record holds (its last), numbered as its agent was told.
    pub fn last_attempt(&self) -> Attempt {
        Attempt {
            attempt: self.attempt_no().min(255) as u8,
            outcome: self.outcome(),
            value: self.value,
            agent: self.agent,
            start_us: self.start_us,
            end_us: self.end_us,
        }
    }
}

/// One change to the task ledger. The leader's core and `htc retry` decide them; the store
/// applies each to the ledger and to its journal, so the two cannot tell different stories.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// The task's record as it now is.
    Record(u64, Record),
    /// An ended attempt that did not end the task, appended to its history.
    Attempt(u64, Attempt),
    /// Into (true) or out of (false) the index of failed tasks.
    Failed(u64, bool),
}

/// One earlier attempt of a task that did not end it (the record holds the last one): failed
/// attempts that were retried, and attempts lost with their agent. Stored in order under
/// (task id, n) for n = 0, 1, …
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempt {
    pub attempt: u8,
    pub outcome: Outcome,
    pub value: i32,
    pub agent: u32,
    pub start_us: u64,
    pub end_us: u64,
}
