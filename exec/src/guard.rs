//! Task processes never outlive their agent. `htc-agent work` forks before it starts any thread:
//! the parent becomes the agent's guard, a child subreaper that does nothing but wait; the child
//! is the agent. When the agent dies in any way (SIGKILL, the OOM killer, a crash), its task
//! processes are re-parented to the guard, which kills each one's process group and exits with
//! the agent's status. When the guard dies instead, the kernel sends the agent SIGTERM
//! (`PR_SET_PDEATHSIG`), and the agent stops its tasks and leaves as for any SIGTERM. Signals
//! sent to the guard (scancel, Ctrl-C, kill) are passed on to the agent.

use std::io;

/// Signals the guard passes on to the agent.
const FORWARDED: [libc::c_int; 4] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT];

/// Forks the guard. Returns in the agent (the child); in the guard it never returns. Must be
/// called before any thread starts: only the calling thread survives a fork.
pub fn split() -> io::Result<()> {
    // SAFETY: prctl/fork/getppid with valid arguments; the process is single-threaded here, so
    // the child may run arbitrary code after fork.
    unsafe {
        if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        let guard = libc::getpid();
        match libc::fork() {
            -1 => Err(io::Error::last_os_error()),
            0 => {
                // The agent: a subreaper itself, so that what its tasks leave outside their
                // process groups comes to it (`leftovers`), and reaches the guard only when the
                // agent is gone; and told when the guard goes.
                crate::leftovers::become_subreaper()?;
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM, 0, 0, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // The guard may have died before the prctl: then nobody would tell us.
                if libc::getppid() != guard {
                    libc::raise(libc::SIGTERM);
                }
                Ok(())
            }
            agent => std::process::exit(watch(agent)),
        }
    }
}

/// The guard's life: pass signals on, reap, and when the agent is gone, stop what it left.
fn watch(agent: libc::pid_t) -> i32 {
    // SAFETY: signal-set calls on a local set; sigwaitinfo/waitpid/kill with valid arguments.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in FORWARDED.iter().chain(&[libc::SIGCHLD]) {
            libc::sigaddset(&mut set, *s);
        }
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        loop {
            if let Some(code) = reap(agent) {
                stop_orphans();
                return code;
            }
            let sig = libc::sigwaitinfo(&set, std::ptr::null_mut());
            if FORWARDED.contains(&sig) {
                libc::kill(agent, sig);
            }
        }
    }
}

/// Reaps every exited child; the agent's exit code once it is among them.
fn reap(agent: libc::pid_t) -> Option<i32> {
    let mut code = None;
    loop {
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
        for pid in children {
            // SAFETY: signalling processes that are our own children, and their groups.
            unsafe {
                libc::kill(-pid, libc::SIGKILL);
                libc::kill(pid, libc::SIGKILL);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        reap(0);
    }
}
