//! `htc-call`: a Python function call of the client (`slurm_htc`) run by a warm interpreter
//! instead of a new one. A new interpreter with cloudpickle costs ~40 ms here before the call
//! starts; a worker of one already started takes the call in well under a millisecond.
//!
//! The task's command is this shim. It hands the call to the node's warm interpreter (the
//! client's `_warm.py`, one per agent, per interpreter and preload list; started by the first
//! shim that finds none) with the task's stdin, stdout and stderr (`SCM_RIGHTS`), environment,
//! directory, umask and its own pid. A worker of the interpreter runs it (calls one after
//! another, as a process pool's workers do), or, for a call with a memory limit or `--fork`, a
//! child forked for it alone, which joins the shim's memory cgroup too (so a slot's limit and
//! its OOM count hold for it as for a task). Either takes the task's CPU affinity and limits and
//! dies if the shim dies (a `kill -9` on a timeout); the shim forwards the signals it gets and
//! ends as the call did: the same exit status or signal, so that the run records the call's end
//! as it records a task's.
//!
//! Where the warm path cannot keep those promises it is not taken and the shim becomes the cold
//! command (`exec PYTHON CALL_SCRIPT BASE`): no warm interpreter could start or it refused
//! (it could not leave the first task's cgroups), the child could not join the shim's
//! cgroups, or the call has a memory limit that no memory cgroup enforces (the RSS watch counts
//! the task's process group, which a forked child is not in). Nothing of the call has run then.

use std::fs;
use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

pub use htc_exec::warm::CallArgs;
use htc_exec::warm::{
    agent_of, encode_request, memory_cgroup, parse_reply, private_dir, start_time, stem, Ended, Reply, Request,
};

/// How long a shim waits for a warm interpreter it started to listen.
const START_WAIT: Duration = Duration::from_secs(20);

/// The child's pid once the warm interpreter reported it; signals go to it.
static CHILD: AtomicI32 = AtomicI32::new(0);
/// A signal that came before the child was known (forwarded then, or ends the shim).
static PENDING: AtomicI32 = AtomicI32::new(0);
const FORWARDED: [libc::c_int; 7] =
    [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT, libc::SIGUSR1, libc::SIGUSR2, libc::SIGALRM];

/// Why the warm path was not taken (before anything of the call ran).
#[derive(Debug)]
pub struct Cold(pub String);

impl<E: std::fmt::Display> From<E> for Cold {
    fn from(e: E) -> Self {
        Cold(e.to_string())
    }
}

/// Runs the call; returns the exit status only where it cannot end otherwise.
pub fn main(a: &CallArgs) -> i32 {
    for s in FORWARDED {
        // SAFETY: the handler only reads and writes atomics and calls kill, both async-signal-safe.
        unsafe { libc::signal(s, forward as *const () as libc::sighandler_t) };
    }
    if let Some(dir) = &a.cwd {
        if let Err(e) = std::env::set_current_dir(dir) {
            eprintln!("htc-call: cannot change to {}: {e}", dir.display());
            return 1;
        }
    }
    match warm(a) {
        Ok(Ended::Exited(code)) => code,
        Ok(Ended::Signalled(sig)) => die_by(sig),
        Err(Cold(why)) => {
            if std::env::var_os("HTC_CALL_DEBUG").is_some() {
                eprintln!("htc-call: {} run cold: {why}", a.base.display());
            }
            match PENDING.load(Ordering::SeqCst) {
                0 => cold(a),
                sig => die_by(sig),
            }
        }
    }
}

extern "C" fn forward(sig: libc::c_int) {
    match CHILD.load(Ordering::SeqCst) {
        0 => PENDING.store(sig, Ordering::SeqCst),
        // SAFETY: kill is async-signal-safe.
        pid => unsafe {
            libc::kill(pid, sig);
        },
    }
}

fn warm(a: &CallArgs) -> Result<Ended, Cold> {
    let agent = nix::unistd::getppid().as_raw();
    if agent == 1 {
        return Err(Cold("no agent above this task".into()));
    }
    if a.needs_memcg && !in_own_memory_cgroup(agent) {
        return Err(Cold("a memory limit and no memory cgroup of the task's own".into()));
    }
    let dir = private_dir()?;
    let name = stem(agent, start_time(agent)?, a.key());
    let sock = dir.join(format!("{name}.sock"));
    if let Ok(why) = fs::read_to_string(dir.join(format!("{name}.refused"))) {
        return Err(Cold(format!("the warm interpreter refused: {why}")));
    }
    let conn = match UnixStream::connect(&sock) {
        Ok(c) => c,
        Err(_) => start(a, &dir, &name, agent)?,
    };
    send_request(&conn, a)?;
    let mut lines = BufReader::new(&conn);
    match read_reply(&mut lines)? {
        Some(Reply::Running(pid)) => {
            CHILD.store(pid, Ordering::SeqCst);
            if let sig @ 1.. = PENDING.swap(0, Ordering::SeqCst) {
                // SAFETY: plain kill of the child that runs the call.
                unsafe { libc::kill(pid, sig) };
            }
        }
        Some(Reply::Refused(why)) => return Err(Cold(why)),
        Some(Reply::Ended(_)) | None => return Err(Cold("the warm interpreter ended before the call started".into())),
    }
    match read_reply(&mut lines) {
        Ok(Some(Reply::Ended(e))) => Ok(e),
        other => {
            // The call has started: running it again cold could run it twice.
            eprintln!("htc-call: the warm interpreter ended before reporting how the call ended ({other:?})");
            Ok(Ended::Exited(1))
        }
    }
}

/// The cold command in this process's place; returns only if it could not start.
fn cold(a: &CallArgs) -> i32 {
    // SAFETY: the signals this process changed, back at their defaults for the interpreter.
    unsafe {
        for s in FORWARDED.into_iter().chain([libc::SIGPIPE]) {
            libc::signal(s, libc::SIG_DFL);
        }
    }
    let err = Command::new(&a.python).arg(&a.call_script).arg(&a.base).exec();
    eprintln!("htc-call: cannot run {}: {err}", a.python.display());
    127
}

fn die_by(sig: i32) -> i32 {
    // SAFETY: the default action of the signal the call died of, without a core file of the shim.
    unsafe {
        let none = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        libc::setrlimit(libc::RLIMIT_CORE, &none);
        libc::signal(sig, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(sig);
    }
    128 + sig
}

/// Starts the warm interpreter (one shim at a time, under the lock) and connects to it.
fn start(a: &CallArgs, dir: &Path, name: &str, agent: i32) -> Result<UnixStream, Cold> {
    let sock = dir.join(format!("{name}.sock"));
    let lock = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(dir.join(format!("{name}.lock")))?;
    // SAFETY: flock on a descriptor this function owns; released when `lock` is dropped.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(Cold(format!("cannot lock: {}", io::Error::last_os_error())));
    }
    if let Ok(c) = UnixStream::connect(&sock) {
        return Ok(c);
    }
    let _ = fs::remove_file(&sock);
    sweep(dir);
    let log = fs::File::create(dir.join(format!("{name}.log")))?;
    let mut cmd = Command::new(&a.python);
    cmd.arg(&a.zygote).arg(&sock).arg(agent.to_string()).arg(&a.base).args(&a.preload);
    cmd.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
    // The agent ends what a task leaves behind by the task id in its environment
    // (`leftovers`); the warm interpreter serves the agent's tasks, and ends with the agent.
    cmd.env_remove("HTC_TASK_ID").env_remove("HTC_ATTEMPT");
    // SAFETY: setsid is async-signal-safe; the interpreter leaves the task's session and group,
    // so that the signals of this task's end do not reach it.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    let since = Instant::now();
    loop {
        if let Ok(c) = UnixStream::connect(&sock) {
            return Ok(c);
        }
        if let Some(st) = child.try_wait()? {
            let why = fs::read_to_string(dir.join(format!("{name}.refused")))
                .unwrap_or_else(|_| format!("it ended ({st}) before listening; see {name}.log"));
            return Err(Cold(why));
        }
        if since.elapsed() > START_WAIT {
            return Err(Cold("the warm interpreter did not listen in time".into()));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Removes the files of warm interpreters whose agent is gone: one killed with its agent (the
/// agent's guard kills what it leaves) could not remove them itself.
fn sweep(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some((pid, start)) = agent_of(&name.to_string_lossy()) else { continue };
        if start_time(pid).ok() != Some(start) {
            let _ = fs::remove_file(e.path());
        }
    }
}

/// The request (`htc_exec::warm::encode_request`), in this process's place, with its
/// descriptors 0-2 beside it. A call with a memory limit is forked: a worker's pages stay
/// charged to the memory cgroup it first touched them in, which a reused one would carry
/// from slot to slot.
fn send_request(conn: &UnixStream, a: &CallArgs) -> Result<(), Cold> {
    let cwd = std::env::current_dir()?;
    let env: Vec<Vec<u8>> = std::env::vars_os().map(|(k, v)| [k.as_bytes(), b"=", v.as_bytes()].concat()).collect();
    let env: Vec<&[u8]> = env.iter().map(|e| e.as_slice()).collect();
    let request = Request {
        pid: std::process::id(),
        cwd: cwd.as_os_str(),
        umask: umask(),
        base: a.base.as_os_str(),
        mode: a.mode(),
        cpus: &[],
        env: &env,
    };
    let data = encode_request(&request);
    let fds = [0, 1, 2];
    let cmsg = [nix::sys::socket::ControlMessage::ScmRights(&fds)];
    let iov = [io::IoSlice::new(&data)];
    let sent =
        nix::sys::socket::sendmsg::<()>(conn.as_raw_fd(), &iov, &cmsg, nix::sys::socket::MsgFlags::empty(), None)?;
    (&*conn).write_all(&data[sent..])?;
    Ok(())
}

fn read_reply(r: &mut impl BufRead) -> io::Result<Option<Reply>> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    parse_reply(line.trim_end()).map(Some).ok_or_else(|| io::Error::other(format!("a reply not understood: {line:?}")))
}

fn umask() -> u32 {
    // SAFETY: umask cannot fail; the mask is put back at once (no thread of this process makes files).
    unsafe {
        let m = libc::umask(0);
        libc::umask(m);
        m
    }
}

/// Whether this process's memory cgroup is not the agent's: a slot of its own that enforces
/// `mem=` (the agent's `memcg`).
fn in_own_memory_cgroup(agent: i32) -> bool {
    let mine = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let its = fs::read_to_string(format!("/proc/{agent}/cgroup")).unwrap_or_default();
    matches!((memory_cgroup(&mine), memory_cgroup(&its)), (Some(a), Some(b)) if a != b)
}
