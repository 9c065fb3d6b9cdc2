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

use std::ffi::OsStr;
use std::fs;
use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

/// The shim's command line (written by the client, `slurm_htc.functions.command`):
/// `htc-call --python PY --call-script CALL --zygote WARM [--preload M,N] [--needs-memcg]
/// [--fork] [--cwd DIR] BASE`. Parsed by hand: the shim starts per call, and starts small.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CallWarmArgs {
    /// The interpreter of the call (the client's, or the one it named).
    pub python: PathBuf,
    /// The client's `_call.py`: the cold command is `PYTHON CALL_SCRIPT BASE`.
    pub call_script: PathBuf,
    /// The client's `_warm.py`, the warm interpreter's program.
    pub zygote: PathBuf,
    /// Modules the warm interpreter imports before it forks.
    pub preload: Vec<String>,
    /// The call has a memory limit: warm only where a memory cgroup of its own enforces it.
    pub needs_memcg: bool,
    /// A process forked for this call alone, not a worker that serves the warm interpreter's
    /// calls one after another (as it does for a call with a memory limit).
    pub fork: bool,
    /// The directory the call runs in.
    pub cwd: Option<PathBuf>,
    /// The call's files, `BASE.in` and `BASE.out`.
    pub base: PathBuf,
}

impl CallWarmArgs {
    pub fn parse(args: impl IntoIterator<Item = std::ffi::OsString>) -> Result<CallWarmArgs, String> {
        let mut a = CallWarmArgs::default();
        let mut it = args.into_iter();
        let mut base = None;
        while let Some(w) = it.next() {
            let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
            match w.to_str() {
                Some("--python") => a.python = value("--python")?.into(),
                Some("--call-script") => a.call_script = value("--call-script")?.into(),
                Some("--zygote") => a.zygote = value("--zygote")?.into(),
                Some("--cwd") => a.cwd = Some(value("--cwd")?.into()),
                Some("--needs-memcg") => a.needs_memcg = true,
                Some("--fork") => a.fork = true,
                Some("--preload") => {
                    let v = value("--preload")?;
                    a.preload = v.to_string_lossy().split(',').filter(|m| !m.is_empty()).map(String::from).collect();
                }
                Some(flag) if flag.starts_with("--") => return Err(format!("unknown option {flag}")),
                _ if base.is_none() => base = Some(PathBuf::from(w)),
                _ => return Err(format!("one call base, not also {}", w.to_string_lossy())),
            }
        }
        a.base = base.ok_or("no call base")?;
        for (what, p) in [("--python", &a.python), ("--call-script", &a.call_script), ("--zygote", &a.zygote)] {
            if p.as_os_str().is_empty() {
                return Err(format!("{what} is needed"));
            }
        }
        Ok(a)
    }
}

/// The first word of a request, so that a warm interpreter of another version refuses it.
const PROTOCOL: &str = "htc-warm 2";
/// How long a shim waits for a warm interpreter it started to listen.
const START_WAIT: Duration = Duration::from_secs(20);

/// The child's pid once the warm interpreter reported it; signals go to it.
static CHILD: AtomicI32 = AtomicI32::new(0);
/// A signal that came before the child was known (forwarded then, or ends the shim).
static PENDING: AtomicI32 = AtomicI32::new(0);
const FORWARDED: [libc::c_int; 7] =
    [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT, libc::SIGUSR1, libc::SIGUSR2, libc::SIGALRM];

/// How a call ended, as the warm interpreter saw its child end.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    Exited(i32),
    Signalled(i32),
}

/// What a line of the warm interpreter says.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    /// The child runs the call (its pid).
    Running(i32),
    /// The child could not take the task's place (why); nothing ran.
    Refused(String),
    /// The child ended.
    Ended(Ended),
}

/// Why the warm path was not taken (before anything of the call ran).
#[derive(Debug)]
pub struct Cold(pub String);

impl<E: std::fmt::Display> From<E> for Cold {
    fn from(e: E) -> Self {
        Cold(e.to_string())
    }
}

/// Runs the call; returns the exit status only where it cannot end otherwise.
pub fn main(a: &CallWarmArgs) -> i32 {
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

fn warm(a: &CallWarmArgs) -> Result<Ended, Cold> {
    let agent = nix::unistd::getppid().as_raw();
    if agent == 1 {
        return Err(Cold("no agent above this task".into()));
    }
    if a.needs_memcg && !in_own_memory_cgroup(agent) {
        return Err(Cold("a memory limit and no memory cgroup of the task's own".into()));
    }
    let dir = private_dir()?;
    let name = format!("{agent}-{}-{:016x}", start_time(agent)?, key(&a.python, &a.zygote, &a.preload));
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
fn cold(a: &CallWarmArgs) -> i32 {
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

/// `/tmp/htc-warm-UID`, made 0700, and refused unless it is this user's and no one else's.
fn private_dir() -> Result<PathBuf, Cold> {
    let uid = nix::unistd::getuid().as_raw();
    let dir = PathBuf::from(format!("/tmp/htc-warm-{uid}"));
    match fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(Cold(format!("cannot make {}: {e}", dir.display()))),
    }
    let m = fs::symlink_metadata(&dir)?;
    if !m.is_dir() || m.uid() != uid || m.mode() & 0o077 != 0 {
        return Err(Cold(format!("{} is not a directory of this user's alone", dir.display())));
    }
    Ok(dir)
}

/// Starts the warm interpreter (one shim at a time, under the lock) and connects to it.
fn start(a: &CallWarmArgs, dir: &Path, name: &str, agent: i32) -> Result<UnixStream, Cold> {
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

/// The agent pid and start time a warm interpreter's file is named for (`PID-START-KEY.END`).
pub fn agent_of(name: &str) -> Option<(i32, u64)> {
    let mut parts = name.splitn(3, '-');
    let pid = parts.next()?.parse().ok()?;
    let start = parts.next()?.parse().ok()?;
    parts.next()?;
    Some((pid, start))
}

/// The request: its length, then NUL-separated fields (protocol, pid, directory, umask, call
/// base, how the call runs: `fork` or `reuse`, `KEY=VALUE` environment), with the task's
/// descriptors 0-2 beside it. A call with a memory limit is forked: a worker's pages stay
/// charged to the memory cgroup it first touched them in, which a reused one would carry
/// from slot to slot.
fn send_request(conn: &UnixStream, a: &CallWarmArgs) -> Result<(), Cold> {
    let cwd = std::env::current_dir()?;
    let env: Vec<Vec<u8>> = std::env::vars_os().map(|(k, v)| [k.as_bytes(), b"=", v.as_bytes()].concat()).collect();
    let mode = if a.fork || a.needs_memcg { "fork" } else { "reuse" };
    let data = encode_request(std::process::id(), cwd.as_os_str(), umask(), a.base.as_os_str(), mode, &env);
    let fds = [0, 1, 2];
    let cmsg = [nix::sys::socket::ControlMessage::ScmRights(&fds)];
    let iov = [io::IoSlice::new(&data)];
    let sent =
        nix::sys::socket::sendmsg::<()>(conn.as_raw_fd(), &iov, &cmsg, nix::sys::socket::MsgFlags::empty(), None)?;
    (&*conn).write_all(&data[sent..])?;
    Ok(())
}

pub fn encode_request(pid: u32, cwd: &OsStr, umask: u32, base: &OsStr, mode: &str, env: &[Vec<u8>]) -> Vec<u8> {
    let mut body = Vec::new();
    for field in [
        PROTOCOL.as_bytes(),
        pid.to_string().as_bytes(),
        cwd.as_bytes(),
        format!("{umask:o}").as_bytes(),
        base.as_bytes(),
        mode.as_bytes(),
    ]
    .into_iter()
    .chain(env.iter().map(|e| e.as_slice()))
    {
        body.extend_from_slice(field);
        body.push(0);
    }
    let mut data = (body.len() as u32).to_le_bytes().to_vec();
    data.extend(body);
    data
}

fn read_reply(r: &mut impl BufRead) -> io::Result<Option<Reply>> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    parse_reply(line.trim_end()).map(Some).ok_or_else(|| io::Error::other(format!("a reply not understood: {line:?}")))
}

/// `P<pid>`, `R<why>`, `S<code>` (a negative code: killed by that signal).
pub fn parse_reply(line: &str) -> Option<Reply> {
    let (kind, rest) = line.split_at_checked(1)?;
    match kind {
        "P" => rest.parse().ok().map(Reply::Running),
        "R" => Some(Reply::Refused(rest.to_string())),
        "S" => {
            rest.parse::<i32>().ok().map(|c| Reply::Ended(if c < 0 { Ended::Signalled(-c) } else { Ended::Exited(c) }))
        }
        _ => None,
    }
}

fn umask() -> u32 {
    // SAFETY: umask cannot fail; the mask is put back at once (no thread of this process makes files).
    unsafe {
        let m = libc::umask(0);
        libc::umask(m);
        m
    }
}

/// The agent's start time (field 22 of /proc/PID/stat), so that a pid used again is another name.
fn start_time(pid: i32) -> Result<u64, Cold> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    after
        .split_whitespace()
        .nth(19)
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| Cold("no start time of the agent".into()))
}

/// Which warm interpreter: FNV-1a over the interpreter, the script and the preload list.
pub fn key(python: &Path, zygote: &Path, preload: &[String]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    let words = [python.as_os_str().as_bytes(), zygote.as_os_str().as_bytes()];
    for w in words.into_iter().chain(preload.iter().map(|p| p.as_bytes())) {
        for b in w.iter().chain([&0u8]) {
            h = (h ^ *b as u64).wrapping_mul(0x100000001b3);
        }
    }
    h
}

/// Whether this process's memory cgroup is not the agent's: a slot of its own that enforces
/// `mem=` (the agent's `memcg`).
fn in_own_memory_cgroup(agent: i32) -> bool {
    let mine = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let its = fs::read_to_string(format!("/proc/{agent}/cgroup")).unwrap_or_default();
    matches!((memory_cgroup(&mine), memory_cgroup(&its)), (Some(a), Some(b)) if a != b)
}

/// The memory cgroup in a `/proc/PID/cgroup` text: the v1 line naming `memory`, else v2's `0::`.
pub fn memory_cgroup(text: &str) -> Option<&str> {
    let lines = || text.lines().filter_map(|l| l.splitn(3, ':').collect::<Vec<_>>().try_into().ok());
    let v1 = lines().find(|[_, ctl, _]: &[&str; 3]| ctl.split(',').any(|c| c == "memory"));
    v1.or_else(|| lines().find(|[id, ctl, _]: &[&str; 3]| *id == "0" && ctl.is_empty())).map(|[_, _, path]| path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_reads_as_the_client_writes_it() {
        let w = |s: &str| s.split(' ').map(std::ffi::OsString::from).collect::<Vec<_>>();
        let a = CallWarmArgs::parse(w(
            "--python /p --call-script /c.py --zygote /w.py --preload parsl,numpy --needs-memcg --fork --cwd /d /r/calls/k",
        ))
        .unwrap();
        assert_eq!(
            (a.python.to_str(), a.preload.as_slice(), a.needs_memcg, a.fork),
            (Some("/p"), ["parsl".to_string(), "numpy".to_string()].as_slice(), true, true)
        );
        assert_eq!((a.cwd.as_deref(), a.base.to_str()), (Some(Path::new("/d")), Some("/r/calls/k")));
        assert_eq!(CallWarmArgs::parse(w("--python /p --call-script /c --zygote /w")), Err("no call base".into()));
        assert_eq!(CallWarmArgs::parse(w("--python /p --zygote /w /b")), Err("--call-script is needed".into()));
        assert_eq!(
            CallWarmArgs::parse(w("--python /p --call-script /c --zygote /w --fast /b")),
            Err("unknown option --fast".into())
        );
        assert_eq!(
            CallWarmArgs::parse(w("--python /p --call-script /c --zygote /w /b /b2")),
            Err("one call base, not also /b2".into())
        );
        assert_eq!(CallWarmArgs::parse(w("--python")), Err("--python needs a value".into()));
    }

    #[test]
    fn a_file_names_the_agent_it_served() {
        assert_eq!(agent_of("4242-998877-5d019681181b5a01.sock"), Some((4242, 998877)));
        assert_eq!(agent_of("4242-998877"), None);
        assert_eq!(agent_of("notes.txt"), None);
    }

    #[test]
    fn replies_read_as_the_warm_interpreter_writes_them() {
        assert_eq!(parse_reply("P4242"), Some(Reply::Running(4242)));
        assert_eq!(
            parse_reply("Rcannot join /sys/fs/cgroup/memory/x"),
            Some(Reply::Refused("cannot join /sys/fs/cgroup/memory/x".into()))
        );
        assert_eq!(parse_reply("S3"), Some(Reply::Ended(Ended::Exited(3))));
        assert_eq!(parse_reply("S-6"), Some(Reply::Ended(Ended::Signalled(6))));
        assert_eq!(parse_reply("Sx"), None);
        assert_eq!(parse_reply(""), None);
        assert_eq!(parse_reply("Q1"), None);
    }

    #[test]
    fn a_request_is_its_length_then_nul_ended_fields() {
        let env = vec![b"A=1".to_vec(), b"B=x y".to_vec()];
        let d = encode_request(77, OsStr::new("/w d"), 0o22, OsStr::new("/r/calls/k"), "reuse", &env);
        let len = u32::from_le_bytes(d[..4].try_into().unwrap()) as usize;
        assert_eq!(len, d.len() - 4);
        let fields: Vec<&[u8]> = d[4..d.len() - 1].split(|b| *b == 0).collect();
        assert_eq!(
            fields,
            [b"htc-warm 2".as_slice(), b"77", b"/w d", b"22", b"/r/calls/k", b"reuse", b"A=1", b"B=x y"]
        );
    }

    #[test]
    fn the_memory_cgroup_is_found_in_v1_and_v2() {
        let v1 = "12:pids:/a\n4:memory:/slurm/uid_0/job_7/step_0/htc-9/s3\n1:name=systemd:/\n";
        assert_eq!(memory_cgroup(v1), Some("/slurm/uid_0/job_7/step_0/htc-9/s3"));
        assert_eq!(memory_cgroup("0::/user.slice/htc-9/s0\n"), Some("/user.slice/htc-9/s0"));
        assert_eq!(memory_cgroup("3:cpu,cpuacct:/x\n"), None);
    }

    #[test]
    fn the_key_tells_interpreters_and_preloads_apart() {
        let k = |p: &str, pre: &[&str]| {
            key(Path::new(p), Path::new("/z.py"), &pre.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        };
        assert_eq!(k("/usr/bin/python3", &[]), k("/usr/bin/python3", &[]));
        assert_ne!(k("/usr/bin/python3", &[]), k("/venv/bin/python", &[]));
        assert_ne!(k("/usr/bin/python3", &["parsl"]), k("/usr/bin/python3", &[]));
        assert_ne!(k("/p", &["ab"]), k("/p", &["a", "b"]));
    }
}
