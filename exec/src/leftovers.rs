//! What a task leaves running ends with it (issue 24, D7), as Slurm ends what a step leaves.
//!
//! At a task's end its process group is killed (`executor::finish`), but a process that left
//! the group — `setsid`, a double-forked daemon, `nohup … &` followed by `setsid` — is not in
//! it. The agent is a child subreaper (`become_subreaper`): when such a process loses its
//! parent it becomes a child of the agent's main thread instead of init, where nothing else
//! lives (the tasks are children of the spawn-loop threads). `Sweeper::sweep` looks at those
//! orphans now and then: each one names its task in its environment (`HTC_TASK_ID`, inherited
//! from the task), and once that task is no longer held by the agent (ended, or taken back) the
//! orphan's group and the orphan are killed. Exited orphans are reaped.
//!
//! An orphan that cleared its environment names no task: it is left alone until the agent ends,
//! when the guard (`guard.rs`) kills whatever the agent leaves. `--keep-daemons` keeps every
//! orphan until then. Without cgroups this is how far the agent can see: a process that is
//! re-parented elsewhere (a subreaper of its own, a container) is out of its reach.

use std::collections::HashMap;
use std::io;

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::{getpgid, Pid};

/// Makes this process a child subreaper: processes its tasks leave behind come to it. Not where
/// the kernel cannot list a thread's children (no `CONFIG_PROC_CHILDREN`): the sweeper could
/// neither find nor reap them, so they go on to the guard as before.
pub fn become_subreaper() -> io::Result<()> {
    let me = std::process::id();
    if !std::path::Path::new(&format!("/proc/{me}/task/{me}/children")).exists() {
        return Ok(());
    }
    Ok(nix::sys::prctl::set_child_subreaper(true)?)
}

/// What the sweeper knows of an orphan it saw alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// Left behind by this task of this agent.
    Task(u64),
    /// Another agent's (several agents in one process), or nameless: not ours to kill.
    Other,
}

#[derive(Debug)]
pub struct Sweeper {
    agent: u32,
    keep: bool,
    /// Orphans seen alive, by pid, with their start time (a pid another agent of the process
    /// reaped may come back as another process): their environment is read once.
    seen: HashMap<libc::pid_t, (u64, Seen)>,
    /// Orphans killed, by task, for the log.
    pub killed: u64,
}

impl Sweeper {
    /// The sweeper of agent `agent`; with `keep`, orphans live until the agent ends.
    pub fn new(agent: u32, keep: bool) -> Sweeper {
        Sweeper { agent, keep, seen: HashMap::new(), killed: 0 }
    }

    /// Looks at this process's orphans: reaps those that exited, kills those whose task `held`
    /// no longer holds. Returns (pid, task) of each one killed.
    pub fn sweep(&mut self, held: impl Fn(u64) -> bool) -> Vec<(libc::pid_t, u64)> {
        let orphans = orphans();
        self.seen.retain(|pid, _| orphans.contains(pid));
        let mut killed = Vec::new();
        for pid in orphans {
            let Some((zombie, started)) = stat(pid) else { continue };
            if zombie {
                reap(pid);
                self.seen.remove(&pid);
                continue;
            }
            let seen = match self.seen.get(&pid) {
                Some(&(at, seen)) if at == started => seen,
                _ => {
                    let seen = match task_of(pid) {
                        Some((agent, task)) if agent == self.agent => Seen::Task(task),
                        _ => Seen::Other,
                    };
                    self.seen.insert(pid, (started, seen));
                    seen
                }
            };
            let Seen::Task(task) = seen else { continue };
            if self.keep || held(task) {
                continue;
            }
            // Our own child (it cannot be reaped and reused meanwhile: only this thread reaps
            // orphans), and the group it leads, if it leads one.
            let p = Pid::from_raw(pid);
            if getpgid(Some(p)) == Ok(p) {
                let _ = killpg(p, Signal::SIGKILL);
            }
            let _ = kill(p, Signal::SIGKILL);
            self.killed += 1;
            killed.push((pid, task));
        }
        killed
    }
}

/// Children of this process's main thread, where orphans are re-parented (the guard's too).
pub fn orphans() -> Vec<libc::pid_t> {
    let me = std::process::id();
    std::fs::read_to_string(format!("/proc/{me}/task/{me}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Whether `pid` is a zombie, and when it started (clock ticks since boot); `None` when gone.
fn stat(pid: libc::pid_t) -> Option<(bool, u64)> {
    parse_stat(&std::fs::read(format!("/proc/{pid}/stat")).ok()?)
}

/// "pid (comm) S ppid … starttime …": the fields after the last ')' (comm may hold anything);
/// the state is the first of them, the start time the 20th.
fn parse_stat(stat: &[u8]) -> Option<(bool, u64)> {
    let rest = &stat[stat.iter().rposition(|&b| b == b')')? + 1..];
    let mut fields = std::str::from_utf8(rest).ok()?.split_whitespace();
    let state = fields.next()?;
    let started = fields.nth(18)?.parse().ok()?;
    Some((state == "Z", started))
}

fn reap(pid: libc::pid_t) {
    use nix::sys::wait::{waitid, Id, WaitPidFlag};
    // How it ended does not matter (nor that nix cannot name a real-time signal: it is reaped).
    let _ = waitid(Id::Pid(Pid::from_raw(pid)), WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG);
}

/// The agent and task an orphan was started for, from its environment.
fn task_of(pid: libc::pid_t) -> Option<(u32, u64)> {
    parse_environ(&std::fs::read(format!("/proc/{pid}/environ")).ok()?)
}

/// `HTC_AGENT` and `HTC_TASK_ID` from a NUL-separated environment.
fn parse_environ(env: &[u8]) -> Option<(u32, u64)> {
    let var = |name: &[u8]| {
        env.split(|&b| b == 0)
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix(b"="))
            .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u64>().ok())
    };
    Some((u32::try_from(var(b"HTC_AGENT")?).ok()?, var(b"HTC_TASK_ID")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_orphan_names_its_agent_and_task_by_its_environment() {
        assert_eq!(parse_environ(b"PATH=/bin\0HTC_TASK_ID=42\0HTC_AGENT=3\0"), Some((3, 42)));
        assert_eq!(parse_environ(b"HTC_TASK_ID=42\0"), None, "no agent");
        assert_eq!(parse_environ(b"HTC_AGENT=1\0HTC_TASK_ID=x\0"), None);
        assert_eq!(parse_environ(b"XHTC_TASK_ID=4\0HTC_AGENT=1\0"), None, "a longer name is not it");
    }

    #[test]
    fn the_state_and_start_time_are_read_past_any_command_name() {
        let line = b"4242 (a) b) (c) S 1 4242 4242 0 -1 4194560 90 0 0 0 0 0 0 0 20 0 1 0 987654 1 2 3";
        assert_eq!(parse_stat(line), Some((false, 987654)));
        let zombie = b"7 (sh) Z 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 55 0 0";
        assert_eq!(parse_stat(zombie), Some((true, 55)));
        assert_eq!(parse_stat(b"7 (sh) Z 1 7"), None, "cut short");
        let own = std::fs::read(format!("/proc/{}/stat", std::process::id())).unwrap();
        assert!(matches!(parse_stat(&own), Some((false, t)) if t > 0));
    }
}
