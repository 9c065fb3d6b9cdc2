//! A Python function call's task run without a process of its own. Its command is the client's
//! `htc-call` shim, which would only hand the call to the node's warm interpreter and wait
//! (`htc::warm_call`); where that interpreter already listens, the loop hands the call over
//! itself, as the shim would, and reads how it ended: no clone and exec of the shim (~1.2 ms of
//! CPU here), nothing between the call's end and the loop's.
//!
//! The call keeps what the shim gives it: the task's CPUs (its slots' binding), environment,
//! directory, umask, the agent's cgroups (not a slot's: only a call without `mem=` is handed
//! over) and limits, and its own stdin (/dev/null), stdout and stderr. Signals go to the process
//! that runs it (a stop's SIGTERM reaches the call); SIGKILL ends the task at once, and closing
//! the connection has the warm interpreter kill that process's group, as a shim's death does.
//! Where any of that cannot be done (no warm interpreter yet, a GPU task, `mem=` or `--fork`,
//! a refusal) the shim is spawned instead, and it starts the warm interpreter or runs the call
//! cold; nothing of the call has run then.

use std::ffi::{CString, OsStr, OsString};
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use nix::sys::socket::{self, AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType, UnixAddr};

use super::wait::pidfd_open;
use crate::warm::{self, CallArgs, Ended, Reply, Request};
use htc_core::spawn_loop::Exit;

/// The loop's means to hand calls over: who the agent is, to find its warm interpreters.
pub(super) struct WarmCalls {
    /// `/tmp/htc-warm-UID`; None: calls are never handed over here (the shim runs each).
    dir: Option<PathBuf>,
    uid: u32,
    agent: i32,
    start: u64,
    cwd: OsString,
    umask: u32,
    dev_null: OwnedFd,
}

impl WarmCalls {
    pub(super) fn new(dev_null: OwnedFd) -> WarmCalls {
        // SAFETY: getuid and getpid cannot fail.
        let (uid, agent) = unsafe { (libc::getuid(), libc::getpid()) };
        let known = (warm::start_time(agent), std::env::current_dir(), own_umask());
        let (dir, start, cwd, umask) = match known {
            (Ok(start), Ok(cwd), Some(umask)) if std::env::var_os("HTC_WARM_HANDOVER").is_none_or(|v| v != "0") => {
                (Some(PathBuf::from(format!("/tmp/htc-warm-{uid}"))), start, cwd.into_os_string(), umask)
            }
            _ => (None, 0, OsString::new(), 0),
        };
        WarmCalls { dir, uid, agent, start, cwd, umask, dev_null }
    }

    /// Hands the call that `argv` would run to its warm interpreter, with the task's
    /// environment, CPUs (none: unbound) and output; None where it is not such a call or no
    /// warm interpreter takes it now (the task is spawned then).
    pub(super) fn hand_over(
        &self,
        argv: &[CString],
        env: &[&[u8]],
        cpus: &[usize],
        (out, err): (RawFd, RawFd),
    ) -> Option<Call> {
        let dir = self.dir.as_ref()?;
        if Path::new(OsStr::from_bytes(argv.first()?.as_bytes())).file_name() != Some(OsStr::new("htc-call")) {
            return None;
        }
        let a = CallArgs::parse(argv[1..].iter().map(|w| OsString::from_vec(w.as_bytes().to_vec()))).ok()?;
        if a.mode() != "reuse" {
            return None;
        }
        warm::check_private(dir, self.uid).ok()?;
        let sock = dir.join(format!("{}.sock", warm::stem(self.agent, self.start, a.key())));
        let conn = connect(&sock).ok()?;
        let request = Request {
            pid: self.agent as u32,
            cwd: a.cwd.as_deref().map_or(self.cwd.as_os_str(), Path::as_os_str),
            umask: self.umask,
            base: a.base.as_os_str(),
            mode: "reuse",
            cpus,
            env,
        };
        let data = warm::encode_request(&request);
        let fds = [self.dev_null.as_raw_fd(), out, err];
        let iov = [io::IoSlice::new(&data)];
        let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL;
        // Whole or not at all: a request cut short is dropped by the interpreter, unrun.
        match socket::sendmsg::<()>(conn.as_raw_fd(), &iov, &[ControlMessage::ScmRights(&fds)], flags, None) {
            Ok(n) if n == data.len() => {
                Some(Call { conn, worker: None, worker_pid: None, pending: None, line: Vec::new() })
            }
            _ => None,
        }
    }
}

/// A call handed over: the connection its end comes on, and the process that runs it.
pub(super) struct Call {
    conn: OwnedFd,
    /// The pidfd of the process that runs the call, once the interpreter said which.
    worker: Option<OwnedFd>,
    /// That process's id, for reading its counters (the pidfd is what signals it).
    worker_pid: Option<libc::pid_t>,
    /// A signal sent before that.
    pending: Option<libc::c_int>,
    /// A reply read in part.
    line: Vec<u8>,
}

/// What a call's connection said.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum News {
    Nothing,
    Ended(Exit),
    /// Nothing of the call ran: its shim is to run instead (why).
    Refused(String),
}

impl Call {
    pub(super) fn fd(&self) -> RawFd {
        self.conn.as_raw_fd()
    }

    /// Reads what the interpreter said since last asked.
    pub(super) fn read(&mut self) -> News {
        let mut buf = [0u8; 512];
        loop {
            // SAFETY: reads at most `buf.len()` bytes into the local buffer from our nonblocking socket.
            let n = unsafe { libc::read(self.conn.as_raw_fd(), buf.as_mut_ptr() as *mut libc::c_void, buf.len()) };
            match n {
                0 => return self.closed(),
                n if n > 0 => self.line.extend_from_slice(&buf[..n as usize]),
                _ if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => continue,
                _ if io::Error::last_os_error().kind() == io::ErrorKind::WouldBlock => break,
                _ => return self.closed(),
            }
            while let Some(end) = self.line.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.line.drain(..=end).collect();
                let news = self.said(warm::parse_reply(String::from_utf8_lossy(&line).trim_end()));
                if news != News::Nothing {
                    return news;
                }
            }
        }
        News::Nothing
    }

    fn said(&mut self, reply: Option<Reply>) -> News {
        match reply {
            Some(Reply::Running(pid)) => {
                self.worker = pidfd_open(pid).ok();
                self.worker_pid = self.worker.as_ref().map(|_| pid);
                if let Some(sig) = self.pending.take() {
                    self.send(sig);
                }
                News::Nothing
            }
            Some(Reply::Refused(why)) if self.worker.is_none() => News::Refused(why),
            Some(Reply::Ended(Ended::Exited(code))) => News::Ended(Exit::Exited(code)),
            Some(Reply::Ended(Ended::Signalled(sig))) => News::Ended(Exit::Signaled(sig)),
            // Not understood, or a refusal once running: the call's end cannot be known.
            _ => self.closed(),
        }
    }

    /// The interpreter went (it dies with the agent, or was killed): before the call ran, its
    /// shim runs it; after, the process that ran it is gone with it (PR_SET_PDEATHSIG).
    fn closed(&mut self) -> News {
        if self.worker.is_none() {
            return News::Refused("the warm interpreter closed the connection".into());
        }
        self.send(libc::SIGKILL);
        News::Ended(Exit::Signaled(libc::SIGKILL))
    }

    /// The process that runs the call, once known.
    pub(super) fn worker_pid(&self) -> Option<libc::pid_t> {
        self.worker_pid
    }

    /// Sends SIG to the process that runs the call; SIGKILL ends the task now (the end of the
    /// connection has the interpreter kill that process's group).
    pub(super) fn signal(&mut self, sig: libc::c_int) -> Option<Exit> {
        if sig == libc::SIGKILL {
            self.send(sig);
            return Some(Exit::Signaled(sig));
        }
        match self.worker {
            Some(_) => self.send(sig),
            None => self.pending = Some(sig),
        }
        None
    }

    fn send(&self, sig: libc::c_int) {
        if let Some(fd) = &self.worker {
            // SAFETY: pidfd_send_signal takes no pointers but the null siginfo; a pidfd names
            // its process alone, never one that reused its pid.
            unsafe { libc::syscall(libc::SYS_pidfd_send_signal, fd.as_raw_fd(), sig, std::ptr::null::<u8>(), 0) };
        }
    }
}

/// A nonblocking connection to SOCK, or why not (none listens; its backlog is full).
fn connect(sock: &Path) -> io::Result<OwnedFd> {
    let fd =
        socket::socket(AddressFamily::Unix, SockType::Stream, SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC, None)?;
    socket::connect(fd.as_raw_fd(), &UnixAddr::new(sock)?)?;
    Ok(fd)
}

/// This process's umask, from /proc (calling umask() to read it would change it for a moment,
/// under the agent's other threads).
fn own_umask() -> Option<u32> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("Umask:"))?;
    u32::from_str_radix(line.trim(), 8).ok()
}

/// The pidfd a test process can be held by, for tests of `Call`.
#[cfg(test)]
fn held(pid: libc::pid_t) -> OwnedFd {
    pidfd_open(pid).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::FromRawFd;
    use std::os::unix::net::UnixStream;

    fn call() -> (Call, UnixStream) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        // SAFETY: a descriptor into_raw_fd just gave up.
        let conn = unsafe { OwnedFd::from_raw_fd(std::os::fd::IntoRawFd::into_raw_fd(ours)) };
        (Call { conn, worker: None, worker_pid: None, pending: None, line: Vec::new() }, theirs)
    }

    #[test]
    fn a_call_ends_as_the_interpreter_says_across_reads() {
        let (mut c, mut z) = call();
        assert_eq!(c.read(), News::Nothing);
        let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        write!(z, "P{}\nS", child.id()).unwrap();
        assert_eq!(c.read(), News::Nothing);
        assert!(c.worker.is_some());
        z.write_all(b"-11\n").unwrap();
        assert_eq!(c.read(), News::Ended(Exit::Signaled(11)));
        let _ = child.kill();
        let _ = child.wait();
        let (mut c, mut z) = call();
        z.write_all(b"S3\n").unwrap();
        assert_eq!(c.read(), News::Ended(Exit::Exited(3)));
    }

    #[test]
    fn a_refusal_or_a_close_before_the_call_runs_has_the_shim_run_it() {
        let (mut c, mut z) = call();
        z.write_all(b"Rcannot join x\n").unwrap();
        assert_eq!(c.read(), News::Refused("cannot join x".into()));
        let (mut c, z) = call();
        drop(z);
        assert!(matches!(c.read(), News::Refused(_)));
    }

    #[test]
    fn a_signal_reaches_the_process_once_known_and_a_close_after_kills_it() {
        // Both children first: a child spawned after the pair may still hold a copy of the
        // interpreter's end for a moment after spawn returns (its close-on-exec runs after
        // the parent is let go), and then dropping that end closes nothing yet.
        let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        let mut second = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        let (mut c, mut z) = call();
        assert_eq!(c.signal(libc::SIGTERM), None);
        writeln!(z, "P{}", child.id()).unwrap();
        assert_eq!(c.read(), News::Nothing);
        let st = child.wait().unwrap();
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&st), Some(libc::SIGTERM));
        c.worker = Some(held(second.id() as i32));
        drop(z);
        assert_eq!(c.read(), News::Ended(Exit::Signaled(libc::SIGKILL)));
        let st = second.wait().unwrap();
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&st), Some(libc::SIGKILL));
    }

    #[test]
    fn sigkill_ends_the_task_at_once() {
        let (mut c, _z) = call();
        assert_eq!(c.signal(libc::SIGKILL), Some(Exit::Signaled(libc::SIGKILL)));
    }

    #[test]
    fn only_a_reused_call_of_the_shim_is_handed_over() {
        let dev_null = fs::File::open("/dev/null").unwrap().into();
        let w = WarmCalls::new(dev_null);
        let argv = |s: &str| s.split(' ').map(|w| CString::new(w).unwrap()).collect::<Vec<_>>();
        // No warm interpreter listens for this agent (the test process): every one is spawned.
        for line in [
            "/bin/echo --python /p --call-script /c --zygote /w /b",
            "/x/htc-call --python /p --call-script /c --zygote /w --fork /b",
            "/x/htc-call --python /p --call-script /c --zygote /w /b",
        ] {
            assert!(w.hand_over(&argv(line), &[], &[], (1, 2)).is_none(), "{line}");
        }
        assert_eq!(own_umask().is_some(), w.dir.is_some() || std::env::var_os("HTC_WARM_HANDOVER").is_some());
    }
}
