//! Task processes never outlive their agent. `htc-agent work` forks before it starts any thread:
//! the parent becomes the agent's guard, a child subreaper that does nothing but wait; the child
//! is the agent. When the agent dies in any way (SIGKILL, the OOM killer, a crash), its task
//! processes are re-parented to the guard, which kills each one's process group and exits with
//! the agent's status. When the guard dies instead, the kernel sends the agent SIGTERM
//! (`PR_SET_PDEATHSIG`), and the agent stops its tasks and leaves as for any SIGTERM. Signals
//! sent to the guard (scancel, Ctrl-C, kill) are passed on to the agent. Once the agent and its
//! tasks are gone, the guard removes the agent's memory cgroups (`memcg::remove_left_by`).

use std::io;

use nix::sys::prctl;
use nix::sys::signal::{kill, killpg, raise, sigprocmask, SigSet, SigmaskHow, Signal};
use nix::unistd::{fork, getpid, getppid, ForkResult, Pid};

/// Signals the guard passes on to the agent.
const FORWARDED: [Signal; 4] = [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP, Signal::SIGQUIT];

/// Forks the guard. Returns in the agent (the child); in the guard it never returns. Must be
/// called before any thread starts: only the calling thread survives a fork.
pub fn split() -> io::Result<()> {
    prctl::set_child_subreaper(true)?;
    let guard = getpid();
    // SAFETY: the process is single-threaded here (see above), so the child may run arbitrary
    // code after fork.
    match unsafe { fork() }? {
        ForkResult::Child => {
            // The agent: a subreaper itself, so that what its tasks leave outside their
            // process groups comes to it (`leftovers`), and reaches the guard only when the
            // agent is gone; and told when the guard goes.
            crate::leftovers::become_subreaper()?;
            prctl::set_pdeathsig(Signal::SIGTERM)?;
            // The guard may have died before the prctl: then nobody would tell us.
            if getppid() != guard {
                let _ = raise(Signal::SIGTERM);
            }
            Ok(())
        }
        ForkResult::Parent { child: agent } => std::process::exit(watch(agent)),
    }
}

/// The guard's life: pass signals on, reap, and when the agent is gone, stop what it left.
fn watch(agent: Pid) -> i32 {
    let mut set = SigSet::empty();
    for s in FORWARDED.into_iter().chain([Signal::SIGCHLD]) {
        set.add(s);
    }
    let _ = sigprocmask(SigmaskHow::SIG_BLOCK, Some(&set), None);
    loop {
        if let Some(code) = reap(agent.as_raw()) {
            stop_orphans();
            crate::memcg::remove_left_by(agent.as_raw() as u32);
            return code;
        }
        if let Ok(sig) = set.wait() {
            if FORWARDED.contains(&sig) {
                let _ = kill(agent, sig);
            }
        }
    }
}

/// Reaps every exited child; the agent's exit code once it is among them.
fn reap(agent: libc::pid_t) -> Option<i32> {
    let mut code = None;
    loop {
        // Raw waitpid: nix's fails (EINVAL) for a child that a real-time signal killed, after
        // reaping it, and the agent's status would be lost with it.
        let mut status = 0;
        // SAFETY: waitpid with a valid status pointer.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return code;
        }
        if pid == agent {
            code = Some(if libc::WIFSIGNALED(status) {
                let sig = libc::WTERMSIG(status);
                eprintln!("htc-agent: the agent (pid {agent}) was killed by signal {sig}; stopping the tasks it left");
                128 + sig
            } else {
                libc::WEXITSTATUS(status)
            });
        }
    }
}

/// Kills the process group of every remaining child (tasks re-parented here when their agent
/// died; each task leads its own group) and waits for them, briefly.
fn stop_orphans() {
    for _ in 0..50 {
        // The guard has one thread: its main thread's children are all of its children.
        let children = crate::leftovers::orphans();
        if children.is_empty() {
            return;
        }
        for pid in children.into_iter().map(Pid::from_raw) {
            // Our own children (not reaped until below), and the groups they lead.
            let _ = killpg(pid, Signal::SIGKILL);
            let _ = kill(pid, Signal::SIGKILL);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        reap(0);
    }
}
