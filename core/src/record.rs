//! A task's record and the outcomes of its attempts: what the ledger stores of each task, as
//! plain values. How they are laid out on disk is the store's business (`layout.rs` in
//! `htc-store`); the engine and the product read them here, and change a record's life only by
//! the steps of `task::step`.

use crate::shape::TaskShape;
use crate::task::{step, Effect, End, Invalid, Life, State, Step};

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
    /// Cancelled: by a user (value 0), or because the task it waited for with `after=` did not
    /// succeed (value: that task's id, as `u32` bits).
    Cancelled = 9,
    /// The session that ran it ended while it ran (its leader killed, its job requeued): it runs
    /// again as a new attempt, at no cost to its retries.
    Interrupted = 10,
    /// Killed by the stuck watch (`stuck=`): it used almost no CPU and did no I/O for that
    /// long; the value is the seconds it sat so.
    Stuck = 11,
}

impl Outcome {
    /// Whether the task's process was started to end this way (a queued task can end only as
    /// a spawn failure, unschedulable, preempted or cancelled).
    pub fn ran(self) -> bool {
        matches!(self, Outcome::Exited | Outcome::Signaled | Outcome::TimedOut | Outcome::OutOfMemory | Outcome::Stuck)
    }

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
            9 => Outcome::Cancelled,
            10 => Outcome::Interrupted,
            11 => Outcome::Stuck,
            _ => Outcome::None,
        }
    }

    /// What an attempt that ended so means for the task's life (`task::step`).
    pub fn end(self, value: i32) -> End {
        match self {
            Outcome::Exited if value == 0 => End::Succeeded,
            Outcome::Lost => End::Lost,
            Outcome::Preempted => End::Preempted,
            _ => End::Failed { permanent: self.is_permanent(value) },
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
            Outcome::Cancelled if value == 0 => "cancelled".into(),
            Outcome::Cancelled => format!("cancelled: task {} did not succeed (after=)", value as u32),
            Outcome::Interrupted => "interrupted: the session running it stopped".into(),
            Outcome::Stuck => format!("stuck: no CPU or I/O for {value}s (stuck=)"),
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

/// Where a task's command is: a span of the run's copy of the task file (or of the commands
/// its sweeps made), the line it came from, and whether it needs a shell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CommandAt {
    pub off: u64,
    pub len: u32,
    pub line: u32,
    pub shell: bool,
}

impl CommandAt {
    /// The command of a task added while the run ran: kept in the ledger under the task's id
    /// (`off`), from no line of a file (`line` 0).
    pub fn added(id: u64, len: u32, shell: bool) -> CommandAt {
        CommandAt { off: id, len, line: 0, shell }
    }

    /// Whether the command is in the ledger (an added task's) rather than in the task file.
    pub fn is_added(&self) -> bool {
        self.line == 0
    }
}

/// How one attempt ended, and when it ran: what every report of an end carries — an agent's
/// `Finished`, the wire's `TaskResult`, a record's last attempt, an earlier `Attempt`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    pub outcome: Outcome,
    pub value: i32,
    /// Unix time, microseconds; 0: it never started (a record keeps an earlier start then), or
    /// not known (a head telling of a member's lost task).
    pub start_us: u64,
    pub end_us: u64,
}

impl Ended {
    /// No end yet: what a record holds before its first attempt ends.
    pub const NONE: Ended = Ended { outcome: Outcome::None, value: 0, start_us: 0, end_us: 0 };

    pub fn new(outcome: Outcome, value: i32, start_us: u64, end_us: u64) -> Ended {
        Ended { outcome, value, start_us, end_us }
    }
}

/// One task: where its command is and what it asks (set at load), and its life with the end of
/// its last attempt (moved by the leader). The life changes only by `task::step`'s answers
/// (`set_life`), so no code outside the life can put a task in a state it could not reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    cmd: CommandAt,
    /// Its `retries` is the task's budget as its life moved it.
    shape: TaskShape,
    state: State,
    attempts: u8,
    /// Attempts lost with their agent (they cost no retry until `task::MAX_LOSSES`).
    losses: u8,
    /// Dispatches that came back unstarted (a lost agent's queue, a refund): each took an
    /// attempt number of its own, so `$HTC_ATTEMPT` of the last attempt counts them too.
    returns: u8,
    /// The agent that ran its last attempt.
    agent: u32,
    last: Ended,
}

impl Default for Record {
    /// A pending one-core task with an empty command.
    fn default() -> Self {
        Record::new(CommandAt::default(), TaskShape::default())
    }
}

impl Record {
    /// A task as loaded: pending, never tried.
    pub fn new(cmd: CommandAt, shape: TaskShape) -> Record {
        Record { cmd, shape, state: State::Pending, attempts: 0, losses: 0, returns: 0, agent: 0, last: Ended::NONE }
    }

    /// A record as stored: the ledger's layout gives each part back as it was written.
    pub fn from_parts(cmd: CommandAt, shape: TaskShape, life: Life, agent: u32, last: Ended) -> Record {
        let mut r = Record::new(cmd, shape);
        r.set_life(life);
        r.set_ended(agent, last);
        r
    }

    pub fn command(&self) -> CommandAt {
        self.cmd
    }
    pub fn cmd_off(&self) -> u64 {
        self.cmd.off
    }
    pub fn cmd_len(&self) -> u32 {
        self.cmd.len
    }
    pub fn line(&self) -> u32 {
        self.cmd.line
    }
    pub fn shell(&self) -> bool {
        self.cmd.shell
    }
    /// What the task asks.
    pub fn shape(&self) -> &TaskShape {
        &self.shape
    }
    /// What the task asks, to change before it runs (a test's setting, a load's hint).
    pub fn shape_mut(&mut self) -> &mut TaskShape {
        &mut self.shape
    }
    pub fn state(&self) -> State {
        self.state
    }
    pub fn attempts(&self) -> u8 {
        self.attempts
    }
    pub fn losses(&self) -> u8 {
        self.losses
    }
    pub fn returns(&self) -> u8 {
        self.returns
    }
    pub fn outcome(&self) -> Outcome {
        self.last.outcome
    }
    pub fn value(&self) -> i32 {
        self.last.value
    }
    pub fn agent(&self) -> u32 {
        self.agent
    }
    pub fn start_us(&self) -> u64 {
        self.last.start_us
    }
    pub fn end_us(&self) -> u64 {
        self.last.end_us
    }

    /// The fields `task::step` reads and moves.
    pub fn life(&self) -> Life {
        Life::of(self.state, self.attempts, self.shape.retries, self.losses, self.returns)
    }

    /// Takes the life `task::step` answered with: the one way a record changes state.
    pub fn set_life(&mut self, l: Life) {
        self.state = l.state();
        self.attempts = l.attempts();
        self.shape.retries = l.retries();
        self.losses = l.losses();
        self.returns = l.returns();
    }

    /// Moves the record's own life by `s`, for a change decided outside the leader's core
    /// (`htc retry`, tests): what `task::step` answers, and nothing changed when it refuses.
    pub fn take(&mut self, s: Step) -> Result<Effect, Invalid> {
        let (life, effect) = step(self.life(), s)?;
        self.set_life(life);
        Ok(effect)
    }

    /// The record after `steps` of its life, in order: a record in a given state as only its
    /// life could have brought it there (tests, tools).
    pub fn walked(mut self, steps: &[Step]) -> Result<Record, Invalid> {
        for &s in steps {
            self.take(s)?;
        }
        Ok(self)
    }

    /// Keeps how its last attempt, run by `agent`, ended; an end without a start keeps the
    /// start known before.
    pub fn set_ended(&mut self, agent: u32, e: Ended) {
        let start_us = if e.start_us != 0 { e.start_us } else { self.last.start_us };
        self.agent = agent;
        self.last = Ended { start_us, ..e };
    }

    /// No instance can ever run it: its end says why (its life's `Step::Refuse` fails it).
    pub fn set_unschedulable(&mut self) {
        self.last.outcome = Outcome::Unschedulable;
    }

    /// Cancelled by a user (`None`), or because task `because` did not succeed: its end says
    /// which (its life's `Step::Cancel` makes it final).
    pub fn set_cancelled(&mut self, because: Option<u64>) {
        self.last.outcome = Outcome::Cancelled;
        self.last.value = because.map_or(0, |id| id as u32 as i32);
    }

    /// The task whose failure cancelled this one, if that is how it ended.
    pub fn cancelled_by(&self) -> Option<u64> {
        (self.last.outcome == Outcome::Cancelled && self.last.value != 0).then_some(self.last.value as u32 as u64)
    }

    /// The number of the attempt the record holds (its last), as its task saw it in `$HTC_ATTEMPT`.
    pub fn attempt_no(&self) -> u32 {
        self.life().attempt_no()
    }

    /// The attempt the record holds (its last), numbered as its agent was told.
    pub fn last_attempt(&self) -> Attempt {
        Attempt { attempt: self.attempt_no().min(255) as u8, agent: self.agent, ended: self.last }
    }

    /// How its last attempt ended.
    pub fn ended(&self) -> Ended {
        self.last
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
    pub agent: u32,
    pub ended: Ended,
}

/// The state of a task whose record is damaged.
pub const DAMAGED: &str = "damaged";

/// A task as `htc task status` shows it: its state in a client's words (`waiting`: not started,
/// ready or out to an agent; `blocked`: waiting for other tasks), its exit value once it ended
/// by exiting, and why it failed or was cancelled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskStatus {
    pub id: u64,
    pub state: &'static str,
    pub exit: Option<i32>,
    pub reason: String,
    /// The name it was added with (`htc task add --name`), if any.
    pub name: Option<String>,
}

impl TaskStatus {
    /// Task `id` whose record is `r`, in state `now` (the leader knows a start before the ledger
    /// does), `blocked` when it waits for others.
    pub fn of(id: u64, r: &Record, now: State, blocked: bool) -> TaskStatus {
        let state = match now {
            State::Pending if blocked => "blocked",
            State::Pending | State::Dispatched => "waiting",
            State::Running => "running",
            State::Done => "done",
            State::Failed => "failed",
            State::Cancelled => "cancelled",
        };
        let exit = (now.is_final() && r.outcome() == Outcome::Exited).then_some(r.value());
        let reason = match now {
            State::Failed | State::Cancelled => r.outcome().describe(r.value()),
            _ => String::new(),
        };
        TaskStatus { id, state, exit, reason, name: None }
    }

    /// Task `id`, which the run has, but whose record the ledger cannot vouch for (`why`): a
    /// reader says so rather than leave it out.
    pub fn damaged(id: u64, why: &str) -> TaskStatus {
        TaskStatus { id, state: DAMAGED, exit: None, reason: format!("{why} (htc verify tells more)"), name: None }
    }
}
