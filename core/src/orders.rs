//! What an executor was told, apart from its tasks: to finish, to abort, to reset, to hold, and
//! until when its lease lets it start tasks. The process executor (`htc-exec`) and
//! `VirtualExec` keep this one state and decide by it alike what may start and when they are
//! done; what a command does to the queue and the running tasks (`Todo`) is each one's own.

use crate::work::{Command, TaskToRun};

#[derive(Debug, Default, Clone)]
pub struct Orders {
    finishing: bool,
    aborted: bool,
    /// Told to reset: done once nothing runs (`reset_done`).
    resetting: bool,
    held: bool,
    /// Nothing starts from this time on (µs, the executor's clock) until a later lease.
    lease_until: Option<u64>,
}

/// What a command leaves the executor to do with its tasks.
#[derive(Debug, PartialEq, Eq)]
pub enum Todo {
    Nothing,
    /// Queue these tasks.
    Queue(Vec<TaskToRun>),
    /// Stop these tasks: they end as preempted.
    Stop(Vec<u64>),
    /// Give back those of these tasks that have not started.
    Recall(Vec<u64>),
    /// Drop the queue and stop everything running (an abort, a reset).
    DropAll,
}

impl Orders {
    /// Takes a command: the state it changes, and what it leaves to do.
    pub fn take(&mut self, c: Command) -> Todo {
        match c {
            Command::Run(_) if self.aborted => Todo::Nothing,
            Command::Run(tasks) => Todo::Queue(tasks),
            Command::Finish => {
                self.finishing = true;
                Todo::Nothing
            }
            Command::Hold(h) => {
                self.held = h;
                Todo::Nothing
            }
            Command::Lease(until) => {
                self.lease_until = Some(until);
                Todo::Nothing
            }
            Command::Stop(ids) => Todo::Stop(ids),
            Command::Recall(ids) => Todo::Recall(ids),
            Command::Abort => self.abort(),
            Command::Reset => {
                self.resetting = true;
                Todo::DropAll
            }
        }
    }

    /// Stops everything, for good: told to, or nobody is left to read results (the agent's
    /// side of the channel is gone). A second abort has nothing left to do.
    pub fn abort(&mut self) -> Todo {
        if self.aborted {
            return Todo::Nothing;
        }
        self.aborted = true;
        self.finishing = true;
        Todo::DropAll
    }

    /// Whether a queued task may start at `now_us`: not aborted, not held, and within the lease
    /// (which no longer binds once told to finish: the parent may fall silent then).
    pub fn may_start(&self, now_us: u64) -> bool {
        !self.aborted && !self.held && (self.finishing || self.lease_until.is_none_or(|l| now_us < l))
    }

    /// Whether a reset is complete, with `running` tasks still running: once, when none is (the
    /// executor then says `ExecEvent::Reset`).
    pub fn reset_done(&mut self, running: usize) -> bool {
        let done = self.resetting && running == 0;
        if done {
            self.resetting = false;
        }
        done
    }

    /// Told to finish, and nothing is left that it would run: the executor's end. Held, the
    /// queue never starts: finishing ends with what runs.
    pub fn done(&self, running: usize, queued: usize) -> bool {
        self.finishing && running == 0 && (queued == 0 || self.held)
    }

    pub fn finishing(&self) -> bool {
        self.finishing
    }

    pub fn aborted(&self) -> bool {
        self.aborted
    }

    pub fn resetting(&self) -> bool {
        self.resetting
    }

    pub fn held(&self) -> bool {
        self.held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_bounds_starts_until_told_to_finish_and_a_hold_stops_them() {
        let mut o = Orders::default();
        assert!(o.may_start(0));
        assert_eq!(o.take(Command::Lease(100)), Todo::Nothing);
        assert!(o.may_start(99) && !o.may_start(100));
        o.take(Command::Finish);
        assert!(o.may_start(1_000), "finishing, the lease no longer binds");
        o.take(Command::Hold(true));
        assert!(!o.may_start(0));
        assert!(o.done(0, 5), "held and finishing: what is queued never starts");
        assert!(!o.done(1, 0), "a task still runs");
        o.take(Command::Hold(false));
        assert!(!o.done(0, 5));
    }

    #[test]
    fn after_an_abort_nothing_is_queued_or_started_and_a_second_has_nothing_to_do() {
        let mut o = Orders::default();
        assert_eq!(o.take(Command::Abort), Todo::DropAll);
        assert!(o.aborted() && o.finishing() && !o.may_start(0));
        let t = TaskToRun { id: 1, attempt: 1, command: b"true".to_vec(), shell: false, shape: Default::default() };
        assert_eq!(o.take(Command::Run(vec![t])), Todo::Nothing);
        assert_eq!(o.abort(), Todo::Nothing);
        assert!(o.done(0, 0));
    }

    #[test]
    fn a_reset_drops_all_and_is_done_once_nothing_runs() {
        let mut o = Orders::default();
        assert_eq!(o.take(Command::Reset), Todo::DropAll);
        assert!(o.resetting() && o.may_start(0), "the agent comes back empty and works on");
        assert!(!o.reset_done(2));
        assert!(o.reset_done(0));
        assert!(!o.reset_done(0), "said once");
    }
}
