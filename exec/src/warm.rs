//! The warm interpreter's protocol: how a Python function call of the client (`slurm_htc`) is
//! handed to the interpreter kept warm on the node (the client's `_warm.py`), by the task's
//! `htc-call` shim (`htc::warm_call`) or by the executor itself (`executor::warm_calls`), which
//! then needs no process of its own for the call.
//!
//! A call's task command is `htc-call --python PY --call-script CALL --zygote WARM [--preload
//! M,N] [--needs-memcg] [--fork] [--cwd DIR] BASE`. The warm interpreter of an agent listens on
//! `/tmp/htc-warm-UID/AGENT-START-KEY.sock` (a 0700 directory of the user's; `START`: the
//! agent's start time, so that a pid used again is another name; `KEY`: which interpreter,
//! script and preloads). A request is its length, then NUL-ended fields, with the task's
//! descriptors 0-2 beside it; the replies are lines: `P<pid>` (the call runs), `R<why>` (it
//! could not take the task's place: nothing ran), `S<code>` (it ended; negative: that signal).

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The first word of a request, so that a warm interpreter of another version refuses it.
pub const PROTOCOL: &str = "htc-warm 3";

/// A call's command line, as the client writes it (`slurm_htc.functions.command`). Parsed by
/// hand: the shim starts per call, and starts small.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CallArgs {
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
    /// The call's word: its base (`BASE.in`, `BASE.out`), then `@` and its bytes where they
    /// travel in the line (the Python client's `_call.split_word`); passed on as it is.
    pub base: PathBuf,
}

impl CallArgs {
    pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<CallArgs, String> {
        let mut a = CallArgs::default();
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

    /// How the call runs: `fork` (a process of its own: a memory limit's charges stay with it)
    /// or `reuse` (a worker that serves calls one after another).
    pub fn mode(&self) -> &'static str {
        if self.fork || self.needs_memcg {
            "fork"
        } else {
            "reuse"
        }
    }

    /// Which warm interpreter serves the call.
    pub fn key(&self) -> u64 {
        key(&self.python, &self.zygote, &self.preload)
    }
}

/// How a call ended, as the warm interpreter saw it end.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum Ended {
    Exited(i32),
    Signalled(i32),
}

/// What a line of the warm interpreter says.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    /// A process runs the call (its pid).
    Running(i32),
    /// The process could not take the task's place (why); nothing ran.
    Refused(String),
    /// The call ended.
    Ended(Ended),
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

/// What a request says besides the call's files: the process whose place the call takes (its
/// cgroups, and its limits), the directory, umask, mode, CPUs (empty: the process's own
/// affinity) and environment (`KEY=VALUE`).
pub struct Request<'a> {
    pub pid: u32,
    pub cwd: &'a OsStr,
    pub umask: u32,
    pub base: &'a OsStr,
    pub mode: &'a str,
    pub cpus: &'a [usize],
    pub env: &'a [&'a [u8]],
}

/// A request's bytes: its length, then NUL-ended fields (protocol, pid, directory, umask, call
/// base, mode, CPUs, then the environment).
pub fn encode_request(r: &Request) -> Vec<u8> {
    let cpus = r.cpus.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(",");
    let mut body = Vec::with_capacity(256 + r.env.iter().map(|e| e.len() + 1).sum::<usize>());
    for field in [
        PROTOCOL.as_bytes(),
        r.pid.to_string().as_bytes(),
        r.cwd.as_bytes(),
        format!("{:o}", r.umask).as_bytes(),
        r.base.as_bytes(),
        r.mode.as_bytes(),
        cpus.as_bytes(),
    ]
    .into_iter()
    .chain(r.env.iter().copied())
    {
        body.extend_from_slice(field);
        body.push(0);
    }
    let mut data = (body.len() as u32).to_le_bytes().to_vec();
    data.extend(body);
    data
}

/// `/tmp/htc-warm-UID`, made 0700, and refused unless it is this user's and no one else's.
pub fn private_dir() -> io::Result<PathBuf> {
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let dir = PathBuf::from(format!("/tmp/htc-warm-{uid}"));
    match fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io::Error::new(e.kind(), format!("cannot make {}: {e}", dir.display()))),
    }
    check_private(&dir, uid)?;
    Ok(dir)
}

/// Whether DIR is a directory of UID's alone (no one else may place a socket in it).
pub fn check_private(dir: &Path, uid: u32) -> io::Result<()> {
    let m = fs::symlink_metadata(dir)?;
    if !m.is_dir() || m.uid() != uid || m.mode() & 0o077 != 0 {
        return Err(io::Error::other(format!("{} is not a directory of this user's alone", dir.display())));
    }
    Ok(())
}

/// The name of the files of an agent's warm interpreter, without the ending (`.sock`, `.lock`,
/// `.log`, `.refused`).
pub fn stem(agent: i32, start: u64, key: u64) -> String {
    format!("{agent}-{start}-{key:016x}")
}

/// The agent pid and start time a warm interpreter's file is named for (`PID-START-KEY.END`).
pub fn agent_of(name: &str) -> Option<(i32, u64)> {
    let mut parts = name.splitn(3, '-');
    let pid = parts.next()?.parse().ok()?;
    let start = parts.next()?.parse().ok()?;
    parts.next()?;
    Some((pid, start))
}

/// A process's start time (field 22 of /proc/PID/stat), so that a pid used again is another name.
pub fn start_time(pid: i32) -> io::Result<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    after
        .split_whitespace()
        .nth(19)
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| io::Error::other(format!("no start time of process {pid}")))
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
        let w = |s: &str| s.split(' ').map(OsString::from).collect::<Vec<_>>();
        let a = CallArgs::parse(w(
            "--python /p --call-script /c.py --zygote /w.py --preload parsl,numpy --needs-memcg --fork --cwd /d /r/calls/k",
        ))
        .unwrap();
        assert_eq!(
            (a.python.to_str(), a.preload.as_slice(), a.needs_memcg, a.fork, a.mode()),
            (Some("/p"), ["parsl".to_string(), "numpy".to_string()].as_slice(), true, true, "fork")
        );
        assert_eq!((a.cwd.as_deref(), a.base.to_str()), (Some(Path::new("/d")), Some("/r/calls/k")));
        assert_eq!(CallArgs::parse(w("--python /p --call-script /c --zygote /w /b")).unwrap().mode(), "reuse");
        assert_eq!(CallArgs::parse(w("--python /p --call-script /c --zygote /w")), Err("no call base".into()));
        assert_eq!(CallArgs::parse(w("--python /p --zygote /w /b")), Err("--call-script is needed".into()));
        assert_eq!(
            CallArgs::parse(w("--python /p --call-script /c --zygote /w --fast /b")),
            Err("unknown option --fast".into())
        );
        assert_eq!(
            CallArgs::parse(w("--python /p --call-script /c --zygote /w /b /b2")),
            Err("one call base, not also /b2".into())
        );
        assert_eq!(CallArgs::parse(w("--python")), Err("--python needs a value".into()));
    }

    #[test]
    fn a_file_names_the_agent_it_served() {
        assert_eq!(agent_of(&format!("{}.sock", stem(4242, 998877, 0x5d019681181b5a01))), Some((4242, 998877)));
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
        let env: [&[u8]; 2] = [b"A=1", b"B=x y"];
        let r = Request {
            pid: 77,
            cwd: OsStr::new("/w d"),
            umask: 0o22,
            base: OsStr::new("/r/calls/k"),
            mode: "reuse",
            cpus: &[0, 3],
            env: &env,
        };
        let d = encode_request(&r);
        let len = u32::from_le_bytes(d[..4].try_into().unwrap()) as usize;
        assert_eq!(len, d.len() - 4);
        let fields: Vec<&[u8]> = d[4..d.len() - 1].split(|b| *b == 0).collect();
        assert_eq!(
            fields,
            [b"htc-warm 3".as_slice(), b"77", b"/w d", b"22", b"/r/calls/k", b"reuse", b"0,3", b"A=1", b"B=x y"]
        );
        let d = encode_request(&Request { cpus: &[], env: &[], ..r });
        assert_eq!(d[4..].split(|b| *b == 0).nth(6), Some(b"".as_slice()));
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
