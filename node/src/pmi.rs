//! A small synchronous PMI2 client, spoken directly on the socket `srun --mpi=pmi2` hands every
//! task in `$PMI_FD` (no libpmi2). Node agents started as one step use it to swap their listen
//! addresses — `put` own, `fence`, `get` everyone else's — without any controller RPC: Slurm's
//! KVS fence travels slurmstepd → srun and back.
//!
//! Wire protocol, as Slurm 22.05's `mpi/pmi2` plugin speaks it:
//! * one PMI1-style line first: `cmd=init pmi_version=2 pmi_subversion=0\n`, answered by
//!   `cmd=response_to_init rc=0 pmi_version=2 pmi_subversion=0\n`. slurmstepd takes this line
//!   with a single `read(fd, buf, 64)`, so it goes out in one write and nothing follows it
//!   before the answer is in;
//! * then every message either way is a 6-byte decimal length, space-padded (Slurm writes
//!   `%-6d`, i.e. left-justified; it reads with `atoi`), followed by that many bytes of
//!   `cmd=NAME;key=value;…;`. No escaping exists: a `;` in a value would end it, so keys and
//!   values containing `;` or `=` (or NUL) are refused here rather than sent.
//!
//! slurmstepd answers nothing at all to a command it does not know, and a fence only completes
//! once every rank of the step has entered it, so every read has a deadline ([`DEFAULT_TIMEOUT`],
//! settable) instead of blocking forever.

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

/// How long any one exchange may take. Fences wait for the slowest rank of the step, which can
/// be a while on a large or loaded allocation.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
/// Largest message body accepted from the server.
pub const MAX_MESSAGE: usize = 64 << 10;
/// PMI2 limits (`PMI2_MAX_KEYLEN` / `PMI2_MAX_VALLEN`, both counting the C string's NUL).
pub const MAX_KEY_LEN: usize = 63;
pub const MAX_VALUE_LEN: usize = 1023;

const LEN_FIELD: usize = 6;
const INIT_LINE: &[u8] = b"cmd=init pmi_version=2 pmi_subversion=0\n";
const MAX_INIT_LINE: usize = 256;

/// Set once `$PMI_FD` has been taken: owning the same descriptor twice would close it twice.
static FD_TAKEN: AtomicBool = AtomicBool::new(false);

#[derive(Debug, thiserror::Error)]
pub enum PmiError {
    #[error("PMI environment: {0}")]
    Env(String),
    #[error("PMI i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("PMI server did not answer `{cmd}` within {after:?}")]
    Timeout { cmd: &'static str, after: Duration },
    #[error("PMI server closed the connection")]
    Closed,
    #[error("PMI protocol error: {0}")]
    Protocol(String),
    #[error("PMI `{cmd}` failed: rc={rc}{}", msg_suffix(.msg))]
    Rc { cmd: String, rc: i32, msg: Option<String> },
    #[error("invalid PMI {what} {value:?}: {why}")]
    Invalid { what: &'static str, value: String, why: &'static str },
}

fn msg_suffix(msg: &Option<String>) -> String {
    msg.as_deref().map(|m| format!(" ({m})")).unwrap_or_default()
}

/// A PMI2 connection past `fullinit`: one per process, from [`Pmi::from_env`].
#[derive(Debug)]
pub struct Pmi {
    conn: Conn,
    rank: u32,
    size: u32,
    jobid: String,
}

impl Pmi {
    /// Connects to the PMI2 server of this step: `Ok(None)` when `PMI_FD` is unset (not started
    /// by `srun --mpi=pmi2`). Reads `PMI_FD`, `PMI_RANK`, `PMI_SIZE`, `PMI_JOBID`, takes over the
    /// descriptor (close-on-exec from now on, so tasks the agent spawns do not inherit it) and
    /// does the init/fullinit handshake. The environment variables stay set; whoever spawns
    /// children should not pass `PMI_*` on.
    pub fn from_env() -> Result<Option<Pmi>, PmiError> {
        Self::from_env_with_timeout(DEFAULT_TIMEOUT)
    }

    /// [`Pmi::from_env`] with `timeout` for every exchange (handshake included).
    pub fn from_env_with_timeout(timeout: Duration) -> Result<Option<Pmi>, PmiError> {
        let Some(env) = parse_env(|k| std::env::var(k).ok())? else { return Ok(None) };
        let fd = take_fd(env.fd)?;
        Self::init(fd, env.rank, env.size, env.jobid, timeout).map(Some)
    }

    /// Handshake on an already owned descriptor.
    fn init(fd: OwnedFd, rank: u32, size: u32, jobid: String, timeout: Duration) -> Result<Pmi, PmiError> {
        check_token("job id", &jobid, MAX_VALUE_LEN)?;
        let mut conn = Conn { file: File::from(fd), timeout, broken: None };
        conn.write_all("init", INIT_LINE)?;
        let line = conn.read_line("init")?;
        parse_init_response(&line)?;

        let r = rank.to_string();
        let resp = conn.call("fullinit", &[("pmijobid", &jobid), ("pmirank", &r), ("threaded", "FALSE")])?;
        // The server's idea of rank and size must be the environment's.
        for (key, ours) in [("rank", rank), ("size", size)] {
            if let Some(v) = lookup(&resp, key) {
                if v.parse::<u32>().ok() != Some(ours) {
                    return Err(PmiError::Protocol(format!(
                        "fullinit-response says {key}={v}, PMI_{} is {ours}",
                        key.to_uppercase()
                    )));
                }
            }
        }
        tracing::debug!(rank, size, jobid = %jobid, "PMI2 initialised");
        Ok(Pmi { conn, rank, size, jobid })
    }

    /// This process's rank in the step, `0..size()`.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Number of ranks (tasks) in the step.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// `PMI_JOBID`, e.g. `12.0` (job 12, step 0).
    pub fn jobid(&self) -> &str {
        &self.jobid
    }

    /// Deadline for each later exchange.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.conn.timeout = timeout;
    }

    /// Publishes `key=value`; other ranks see it after the next [`Pmi::fence`].
    pub fn put(&mut self, key: &str, value: &str) -> Result<(), PmiError> {
        check_token("key", key, MAX_KEY_LEN)?;
        check_value(value)?;
        self.conn.call("kvs-put", &[("key", key), ("value", value)])?;
        Ok(())
    }

    /// Waits until every rank of the step has entered the fence; afterwards every rank's puts
    /// (up to this fence) are visible to [`Pmi::get`]. On `Timeout` slurmstepd has still counted
    /// this rank as entered, and the connection is unusable: give up on the exchange.
    pub fn fence(&mut self) -> Result<(), PmiError> {
        self.conn.call("kvs-fence", &[])?;
        Ok(())
    }

    /// Value of `key` as of the last fence, `None` if no rank had put it by then (this rank's own
    /// puts included: before a fence even those read as `None`).
    pub fn get(&mut self, key: &str) -> Result<Option<String>, PmiError> {
        check_token("key", key, MAX_KEY_LEN)?;
        let resp = self.conn.call("kvs-get", &[("jobid", &self.jobid), ("srcid", "-1"), ("key", key)])?;
        match lookup(&resp, "found") {
            Some(f) if f.eq_ignore_ascii_case("TRUE") => match lookup(&resp, "value") {
                Some(v) => Ok(Some(v.to_owned())),
                None => Err(PmiError::Protocol("kvs-get-response with found=TRUE but no value".into())),
            },
            Some(f) if f.eq_ignore_ascii_case("FALSE") => Ok(None),
            _ => Err(PmiError::Protocol("kvs-get-response without found=TRUE|FALSE".into())),
        }
    }

    /// Says goodbye; slurmstepd closes its end afterwards. Dropping a `Pmi` without this just
    /// closes the descriptor.
    pub fn finalize(mut self) -> Result<(), PmiError> {
        self.conn.call("finalize", &[])?;
        Ok(())
    }
}

/// What the PMI2 environment says, before anything is opened.
#[derive(Debug, PartialEq)]
struct EnvVars {
    fd: RawFd,
    rank: u32,
    size: u32,
    jobid: String,
}

fn parse_env(get: impl Fn(&str) -> Option<String>) -> Result<Option<EnvVars>, PmiError> {
    let Some(fd) = get("PMI_FD") else { return Ok(None) };
    let need = |k: &str| get(k).ok_or_else(|| PmiError::Env(format!("PMI_FD is set but {k} is not")));
    let num =
        |k: &str, v: &str| v.trim().parse::<u32>().map_err(|_| PmiError::Env(format!("{k}={v:?} is not a number")));
    let fd = match fd.trim().parse::<RawFd>() {
        Ok(n) if n >= 0 => n,
        _ => return Err(PmiError::Env(format!("PMI_FD={fd:?} is not a file descriptor number"))),
    };
    let rank = num("PMI_RANK", &need("PMI_RANK")?)?;
    let size = num("PMI_SIZE", &need("PMI_SIZE")?)?;
    let jobid = need("PMI_JOBID")?;
    if rank >= size {
        return Err(PmiError::Env(format!("PMI_RANK={rank} is not below PMI_SIZE={size}")));
    }
    if jobid.is_empty() {
        return Err(PmiError::Env("PMI_JOBID is empty".into()));
    }
    Ok(Some(EnvVars { fd, rank, size, jobid }))
}

fn take_fd(fd: RawFd) -> Result<OwnedFd, PmiError> {
    // SAFETY: fcntl on an arbitrary number only reads or sets descriptor flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    if flags < 0 {
        return Err(PmiError::Env(format!(
            "PMI_FD={fd} is not an open descriptor: {}",
            std::io::Error::last_os_error()
        )));
    }
    if FD_TAKEN.swap(true, Ordering::SeqCst) {
        return Err(PmiError::Env(format!("PMI_FD={fd} is already owned by another Pmi in this process")));
    }
    // SAFETY: the descriptor is open (checked above), and FD_TAKEN guarantees this process
    // wraps it only once; slurmstepd meant it for this process alone.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let cloexec = FdFlag::from_bits_retain(flags) | FdFlag::FD_CLOEXEC;
    if let Err(e) = fcntl(&owned, FcntlArg::F_SETFD(cloexec)) {
        // Left open, as found: the error is the caller's to report, not a reason to close it.
        let _ = owned.into_raw_fd();
        return Err(PmiError::Io(e.into()));
    }
    Ok(owned)
}

/// Refuses what the wire format cannot carry.
fn check_token(what: &'static str, s: &str, max: usize) -> Result<(), PmiError> {
    let bad = |why| Err(PmiError::Invalid { what, value: s.chars().take(80).collect(), why });
    if s.is_empty() {
        return bad("empty");
    }
    check_chars(what, s, max)
}

fn check_value(s: &str) -> Result<(), PmiError> {
    check_chars("value", s, MAX_VALUE_LEN)
}

fn check_chars(what: &'static str, s: &str, max: usize) -> Result<(), PmiError> {
    let bad = |why| Err(PmiError::Invalid { what, value: s.chars().take(80).collect(), why });
    if s.len() > max {
        return bad("too long for PMI2");
    }
    if s.contains(';') || s.contains('=') {
        return bad("contains ';' or '=', which PMI2 cannot carry");
    }
    if s.contains('\0') || s.contains('\n') {
        return bad("contains NUL or newline");
    }
    Ok(())
}

/// One request: the length field, then `k=v;` for every pair. Pairs were validated already.
fn encode(pairs: &[(&str, &str)]) -> Vec<u8> {
    let mut body = String::new();
    for (k, v) in pairs {
        body.push_str(k);
        body.push('=');
        body.push_str(v);
        body.push(';');
    }
    let mut out = format!("{:<width$}", body.len(), width = LEN_FIELD).into_bytes();
    debug_assert_eq!(out.len(), LEN_FIELD, "body too long for the length field");
    out.extend_from_slice(body.as_bytes());
    out
}

/// The 6-byte length field: digits with spaces on either side, at most [`MAX_MESSAGE`].
fn parse_len(field: &[u8]) -> Result<usize, PmiError> {
    let bad = || PmiError::Protocol(format!("bad length field {:?}", String::from_utf8_lossy(field)));
    let s = std::str::from_utf8(field).map_err(|_| bad())?.trim_matches(' ');
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: usize = s.parse().map_err(|_| bad())?;
    if n > MAX_MESSAGE {
        return Err(PmiError::Protocol(format!("message of {n} bytes exceeds the {MAX_MESSAGE}-byte limit")));
    }
    Ok(n)
}

/// `cmd=NAME;k=v;…;` into its pairs, `cmd` first.
fn parse_body(body: &str) -> Result<Vec<(String, String)>, PmiError> {
    if !body.starts_with("cmd=") {
        return Err(PmiError::Protocol(format!("message does not start with cmd=: {body:?}")));
    }
    let Some(inner) = body.strip_suffix(';') else {
        return Err(PmiError::Protocol(format!("message not terminated by ';': {body:?}")));
    };
    inner
        .split(';')
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
            _ => Err(PmiError::Protocol(format!("bad key=value {kv:?} in {body:?}"))),
        })
        .collect()
}

fn lookup<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// Checks a parsed response: the expected command, and rc=0 (else the server's `errmsg`).
fn check_response(pairs: Vec<(String, String)>, cmd: &str) -> Result<Vec<(String, String)>, PmiError> {
    let want = format!("{cmd}-response");
    let got = &pairs[0].1;
    if *got != want {
        return Err(PmiError::Protocol(format!("expected {want}, got {got}")));
    }
    let rc = match lookup(&pairs, "rc") {
        Some(v) => v.trim().parse::<i32>().map_err(|_| PmiError::Protocol(format!("{want} with rc={v:?}")))?,
        None => return Err(PmiError::Protocol(format!("{want} without rc"))),
    };
    if rc != 0 {
        let msg = lookup(&pairs, "errmsg").or(lookup(&pairs, "msg")).map(str::to_owned);
        return Err(PmiError::Rc { cmd: cmd.to_owned(), rc, msg });
    }
    Ok(pairs)
}

/// `cmd=response_to_init rc=0 pmi_version=2 pmi_subversion=0`
fn parse_init_response(line: &str) -> Result<(), PmiError> {
    let mut it = line.split_ascii_whitespace();
    if it.next() != Some("cmd=response_to_init") {
        return Err(PmiError::Protocol(format!("unexpected answer to init: {line:?}")));
    }
    let (mut rc, mut ver, mut sub) = (None, None, None);
    for tok in it {
        match tok.split_once('=') {
            Some(("rc", v)) => rc = v.parse::<i32>().ok(),
            Some(("pmi_version", v)) => ver = Some(v),
            Some(("pmi_subversion", v)) => sub = Some(v),
            _ => {}
        }
    }
    match rc {
        Some(0) => {}
        Some(rc) => return Err(PmiError::Rc { cmd: "init".into(), rc, msg: Some(line.to_owned()) }),
        None => return Err(PmiError::Protocol(format!("answer to init without rc: {line:?}"))),
    }
    if (ver, sub) != (Some("2"), Some("0")) {
        return Err(PmiError::Protocol(format!("server does not speak PMI 2.0: {line:?}")));
    }
    Ok(())
}

/// Fuzzing entry point (see `fuzz/`): one server message, length field included, through the
/// same checks `Conn::exchange` applies to the bytes it reads. A message shorter than its
/// length field says is `Closed`, as a server hanging up mid-message would be.
#[doc(hidden)]
pub fn fuzz_parse_response(msg: &[u8], cmd: &str) -> Result<Vec<(String, String)>, PmiError> {
    if msg.len() < LEN_FIELD {
        return Err(PmiError::Closed);
    }
    let (len, rest) = msg.split_at(LEN_FIELD);
    let body = rest.get(..parse_len(len)?).ok_or(PmiError::Closed)?;
    let body = std::str::from_utf8(body).map_err(|_| PmiError::Protocol(format!("{cmd}: answer is not UTF-8")))?;
    check_response(parse_body(body)?, cmd)
}

/// Fuzzing entry point (see `fuzz/`): the answer to `init`, as `Conn::read_line` hands it on
/// (without its newline).
#[doc(hidden)]
pub fn fuzz_parse_init_response(line: &[u8]) -> Result<(), PmiError> {
    if line.len() > MAX_INIT_LINE {
        return Err(PmiError::Protocol(format!("answer to init longer than {MAX_INIT_LINE} bytes")));
    }
    let line = std::str::from_utf8(line).map_err(|_| PmiError::Protocol("answer to init is not UTF-8".into()))?;
    parse_init_response(line)
}

/// The descriptor plus deadline-bounded blocking I/O (poll before every read and write, so it
/// works on whatever kind of descriptor `PMI_FD` is).
#[derive(Debug)]
struct Conn {
    file: File,
    timeout: Duration,
    /// Set by a failed exchange that may have left the stream mid-message (i/o, timeout,
    /// protocol error): a late or partial answer must never be taken for the next one.
    broken: Option<String>,
}

impl Conn {
    /// One request/response exchange. After a failure other than `Rc` the connection is
    /// unusable and every later call fails at once.
    fn call(&mut self, cmd: &'static str, args: &[(&str, &str)]) -> Result<Vec<(String, String)>, PmiError> {
        if let Some(e) = &self.broken {
            return Err(PmiError::Protocol(format!("connection unusable after an earlier error ({e})")));
        }
        let r = self.exchange(cmd, args);
        if let Err(e) = &r {
            if !matches!(e, PmiError::Rc { .. }) {
                self.broken = Some(e.to_string());
            }
        }
        r
    }

    fn exchange(&mut self, cmd: &'static str, args: &[(&str, &str)]) -> Result<Vec<(String, String)>, PmiError> {
        let mut pairs = Vec::with_capacity(args.len() + 1);
        pairs.push(("cmd", cmd));
        pairs.extend_from_slice(args);
        let msg = encode(&pairs);
        tracing::trace!(msg = %String::from_utf8_lossy(&msg), "PMI2 send");
        let deadline = Instant::now() + self.timeout;
        self.write_until(cmd, &msg, deadline)?;
        let mut len = [0u8; LEN_FIELD];
        self.read_until(cmd, &mut len, deadline)?;
        let mut body = vec![0u8; parse_len(&len)?];
        self.read_until(cmd, &mut body, deadline)?;
        let body = String::from_utf8(body).map_err(|_| PmiError::Protocol(format!("{cmd}: answer is not UTF-8")))?;
        tracing::trace!(%body, "PMI2 recv");
        check_response(parse_body(&body)?, cmd)
    }

    fn write_all(&mut self, cmd: &'static str, buf: &[u8]) -> Result<(), PmiError> {
        let deadline = Instant::now() + self.timeout;
        self.write_until(cmd, buf, deadline)
    }

    /// The init answer: one line, read byte by byte so nothing past it is consumed.
    fn read_line(&mut self, cmd: &'static str) -> Result<String, PmiError> {
        let deadline = Instant::now() + self.timeout;
        let mut line = Vec::new();
        loop {
            let mut b = [0u8; 1];
            self.read_until(cmd, &mut b, deadline)?;
            if b[0] == b'\n' {
                break;
            }
            if line.len() >= MAX_INIT_LINE {
                return Err(PmiError::Protocol(format!("answer to {cmd} longer than {MAX_INIT_LINE} bytes")));
            }
            line.push(b[0]);
        }
        String::from_utf8(line).map_err(|_| PmiError::Protocol(format!("answer to {cmd} is not UTF-8")))
    }

    fn write_until(&mut self, cmd: &'static str, mut buf: &[u8], deadline: Instant) -> Result<(), PmiError> {
        while !buf.is_empty() {
            self.wait(cmd, PollFlags::POLLOUT, deadline)?;
            match self.file.write(buf) {
                Ok(0) => return Err(PmiError::Closed),
                Ok(n) => buf = &buf[n..],
                Err(e) if matches!(e.kind(), ErrorKind::Interrupted | ErrorKind::WouldBlock) => {}
                Err(e) if e.kind() == ErrorKind::BrokenPipe => return Err(PmiError::Closed),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    fn read_until(&mut self, cmd: &'static str, mut buf: &mut [u8], deadline: Instant) -> Result<(), PmiError> {
        while !buf.is_empty() {
            self.wait(cmd, PollFlags::POLLIN, deadline)?;
            match self.file.read(buf) {
                Ok(0) => return Err(PmiError::Closed),
                Ok(n) => buf = &mut buf[n..],
                Err(e) if matches!(e.kind(), ErrorKind::Interrupted | ErrorKind::WouldBlock) => {}
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return Err(PmiError::Closed),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Blocks until the descriptor is ready for `events` (or hung up: the read or write that
    /// follows reports that), or fails with `Timeout` at `deadline`.
    fn wait(&self, cmd: &'static str, events: PollFlags, deadline: Instant) -> Result<(), PmiError> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(PmiError::Timeout { cmd, after: self.timeout });
            }
            // Round up so a sub-millisecond rest does not spin with timeout 0.
            let ms = PollTimeout::try_from(left.as_micros().div_ceil(1000)).unwrap_or(PollTimeout::MAX);
            let mut pfd = [PollFd::new(self.file.as_fd(), events)];
            match poll(&mut pfd, ms) {
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(PmiError::Io(e.into())),
                Ok(0) => {}
                Ok(_) => {
                    if pfd[0].revents().is_some_and(|r| r.contains(PollFlags::POLLNVAL)) {
                        return Err(PmiError::Io(std::io::Error::from_raw_os_error(libc::EBADF)));
                    }
                    return Ok(());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;
    use std::thread;

    #[test]
    fn encodes_requests() {
        assert_eq!(encode(&[("cmd", "kvs-fence")]), b"14    cmd=kvs-fence;");
        assert_eq!(
            encode(&[("cmd", "kvs-put"), ("key", "addr-0"), ("value", "10.0.0.1:4000")]),
            b"43    cmd=kvs-put;key=addr-0;value=10.0.0.1:4000;".to_vec()
        );
        let long = "v".repeat(MAX_VALUE_LEN);
        let m = encode(&[("cmd", "kvs-put"), ("key", "k"), ("value", &long)]);
        assert_eq!(parse_len(&m[..LEN_FIELD]).unwrap(), m.len() - LEN_FIELD);
    }

    #[test]
    fn length_field() {
        assert_eq!(parse_len(b"45    ").unwrap(), 45);
        assert_eq!(parse_len(b"    45").unwrap(), 45);
        assert_eq!(parse_len(b"65536 ").unwrap(), MAX_MESSAGE);
        assert_eq!(parse_len(b"0     ").unwrap(), 0);
        for bad in [
            &b"65537 "[..],
            b"999999",
            b"      ",
            b"4 5   ",
            b"-1    ",
            b"+5    ",
            b"abc   ",
            b"12\n   ",
            b"\xff\xfe    ",
        ] {
            assert!(matches!(parse_len(bad), Err(PmiError::Protocol(_))), "{bad:?}");
        }
    }

    #[test]
    fn parses_responses() {
        let p = parse_body("cmd=kvs-get-response;rc=0;found=TRUE;value=127.0.0.1:7000;").unwrap();
        assert_eq!(lookup(&p, "value"), Some("127.0.0.1:7000"));
        let p = check_response(p, "kvs-get").unwrap();
        assert_eq!(lookup(&p, "found"), Some("TRUE"));
        // Empty values are values.
        assert_eq!(lookup(&parse_body("cmd=x;value=;").unwrap(), "value"), Some(""));

        for bad in ["rc=0;cmd=x;", "cmd=x;rc=0", "cmd=x;rc0;", "cmd=x;=1;", "", "cmd=x;;"] {
            assert!(matches!(parse_body(bad), Err(PmiError::Protocol(_))), "{bad:?}");
        }

        let wrong = parse_body("cmd=kvs-put-response;rc=0;").unwrap();
        assert!(matches!(check_response(wrong, "kvs-fence"), Err(PmiError::Protocol(_))));
        let norc = parse_body("cmd=kvs-put-response;").unwrap();
        assert!(matches!(check_response(norc, "kvs-put"), Err(PmiError::Protocol(_))));
        let failed = parse_body("cmd=kvs-fence-response;rc=14;errmsg=mpi/pmi2: failed to send temp kvs;").unwrap();
        match check_response(failed, "kvs-fence") {
            Err(e @ PmiError::Rc { rc: 14, .. }) => assert!(e.to_string().contains("failed to send temp kvs"), "{e}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn fuzz_wrappers_parse_like_the_connection() {
        let p = fuzz_parse_response(b"26    cmd=kvs-put-response;rc=0;", "kvs-put").unwrap();
        assert_eq!(lookup(&p, "rc"), Some("0"));
        // Bytes past the announced length are the next message's, not this one's.
        assert!(fuzz_parse_response(b"26    cmd=kvs-put-response;rc=0;junk", "kvs-put").is_ok());
        for short in [&b""[..], b"26   ", b"26    cmd=kvs-put-response;"] {
            assert!(matches!(fuzz_parse_response(short, "kvs-put"), Err(PmiError::Closed)), "{short:?}");
        }
        assert!(matches!(fuzz_parse_response(b"2     \xff;", "kvs-put"), Err(PmiError::Protocol(_))));
        fuzz_parse_init_response(b"cmd=response_to_init rc=0 pmi_version=2 pmi_subversion=0").unwrap();
        assert!(matches!(fuzz_parse_init_response(b"cmd=response_to_init \xff"), Err(PmiError::Protocol(_))));
        assert!(matches!(fuzz_parse_init_response(&[b' '; MAX_INIT_LINE + 1]), Err(PmiError::Protocol(_))));
    }

    #[test]
    fn init_line() {
        parse_init_response("cmd=response_to_init rc=0 pmi_version=2 pmi_subversion=0").unwrap();
        assert!(matches!(
            parse_init_response("cmd=response_to_init rc=1 pmi_version=2 pmi_subversion=0"),
            Err(PmiError::Rc { rc: 1, .. })
        ));
        assert!(matches!(
            parse_init_response("cmd=response_to_init rc=0 pmi_version=1 pmi_subversion=1"),
            Err(PmiError::Protocol(_))
        ));
        assert!(matches!(parse_init_response("cmd=nope"), Err(PmiError::Protocol(_))));
    }

    #[test]
    fn validates_keys_and_values() {
        check_token("key", "addr-17", MAX_KEY_LEN).unwrap();
        check_value("10.1.2.3:45678").unwrap();
        check_value("[::1]:80").unwrap();
        check_value("").unwrap();
        check_token("key", &"k".repeat(MAX_KEY_LEN), MAX_KEY_LEN).unwrap();
        for k in ["", "a;b", "a=b", "a\0b", "a\nb", &"k".repeat(MAX_KEY_LEN + 1)] {
            assert!(matches!(check_token("key", k, MAX_KEY_LEN), Err(PmiError::Invalid { .. })), "{k:?}");
        }
        for v in ["1.2.3.4:5;cmd=kvs-fence", "a=b", &"v".repeat(MAX_VALUE_LEN + 1)] {
            assert!(matches!(check_value(v), Err(PmiError::Invalid { .. })), "{v:?}");
        }
    }

    #[test]
    fn environment() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        assert_eq!(parse_env(env(&[])).unwrap(), None);
        assert_eq!(
            parse_env(env(&[("PMI_FD", "7"), ("PMI_RANK", "1"), ("PMI_SIZE", "2"), ("PMI_JOBID", "12.0")])).unwrap(),
            Some(EnvVars { fd: 7, rank: 1, size: 2, jobid: "12.0".into() })
        );
        for bad in [
            &[("PMI_FD", "7")][..],
            &[("PMI_FD", "x"), ("PMI_RANK", "0"), ("PMI_SIZE", "1"), ("PMI_JOBID", "1.0")],
            &[("PMI_FD", "-3"), ("PMI_RANK", "0"), ("PMI_SIZE", "1"), ("PMI_JOBID", "1.0")],
            &[("PMI_FD", "7"), ("PMI_RANK", "2"), ("PMI_SIZE", "2"), ("PMI_JOBID", "1.0")],
            &[("PMI_FD", "7"), ("PMI_RANK", "zero"), ("PMI_SIZE", "2"), ("PMI_JOBID", "1.0")],
            &[("PMI_FD", "7"), ("PMI_RANK", "0"), ("PMI_SIZE", "2"), ("PMI_JOBID", "")],
        ] {
            assert!(matches!(parse_env(env(bad)), Err(PmiError::Env(_))), "{bad:?}");
        }
    }

    /// The server end of a socket pair: reads framed requests, answers from a script.
    struct Peer(UnixStream);

    impl Peer {
        fn expect_line(&mut self, want: &[u8]) {
            let mut got = vec![0u8; want.len()];
            self.0.read_exact(&mut got).unwrap();
            assert_eq!(got, want, "{}", String::from_utf8_lossy(&got));
        }
        fn expect(&mut self, want: &str) {
            let mut len = [0u8; 6];
            self.0.read_exact(&mut len).unwrap();
            let mut body = vec![0u8; std::str::from_utf8(&len).unwrap().trim().parse().unwrap()];
            self.0.read_exact(&mut body).unwrap();
            assert_eq!(String::from_utf8(body).unwrap(), want);
        }
        fn send(&mut self, body: &str) {
            // Slurm's own padding: "%-6d".
            write!(self.0, "{:<6}{body}", body.len()).unwrap();
        }
        /// Init and fullinit of rank 1 of 2; the server claims `rank`.
        fn handshake(&mut self, rank: u32) {
            self.expect_line(INIT_LINE);
            self.0.write_all(b"cmd=response_to_init rc=0 pmi_version=2 pmi_subversion=0\n").unwrap();
            self.expect("cmd=fullinit;pmijobid=5.0;pmirank=1;threaded=FALSE;");
            self.send(&format!("cmd=fullinit-response;rc=0;pmi-version=2;pmi-subversion=0;rank={rank};size=2;appnum=-1;debugged=FALSE;pmiverbose=FALSE;"));
        }
    }

    fn connect(
        script: impl FnOnce(Peer) + Send + 'static,
        timeout: Duration,
    ) -> (Result<Pmi, PmiError>, thread::JoinHandle<()>) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let peer = thread::spawn(move || script(Peer(theirs)));
        (Pmi::init(OwnedFd::from(ours), 1, 2, "5.0".into(), timeout), peer)
    }

    #[test]
    fn session_against_scripted_server() {
        let (pmi, peer) = connect(
            |mut p| {
                p.handshake(1);
                p.expect("cmd=kvs-put;key=addr-1;value=127.0.0.1:4001;");
                p.send("cmd=kvs-put-response;rc=0;");
                p.expect("cmd=kvs-fence;");
                thread::sleep(Duration::from_millis(50)); // the fence takes its time
                p.send("cmd=kvs-fence-response;rc=0;");
                p.expect("cmd=kvs-get;jobid=5.0;srcid=-1;key=addr-0;");
                p.send("cmd=kvs-get-response;rc=0;found=TRUE;value=127.0.0.1:4000;");
                p.expect("cmd=kvs-get;jobid=5.0;srcid=-1;key=addr-9;");
                p.send("cmd=kvs-get-response;rc=0;found=FALSE;");
                p.expect("cmd=finalize;");
                p.send("cmd=finalize-response;rc=0;");
            },
            Duration::from_secs(10),
        );
        let mut pmi = pmi.unwrap();
        assert_eq!((pmi.rank(), pmi.size(), pmi.jobid()), (1, 2, "5.0"));
        pmi.put("addr-1", "127.0.0.1:4001").unwrap();
        assert!(matches!(pmi.put("addr-1", "x;cmd=abort"), Err(PmiError::Invalid { .. })));
        pmi.fence().unwrap();
        assert_eq!(pmi.get("addr-0").unwrap().as_deref(), Some("127.0.0.1:4000"));
        assert_eq!(pmi.get("addr-9").unwrap(), None);
        pmi.finalize().unwrap();
        peer.join().unwrap();
    }

    #[test]
    fn server_errors() {
        // fullinit refused (what Slurm does without pmijobid).
        let (pmi, peer) = connect(
            |mut p| {
                p.expect_line(INIT_LINE);
                p.0.write_all(b"cmd=response_to_init rc=0 pmi_version=2 pmi_subversion=0\n").unwrap();
                p.expect("cmd=fullinit;pmijobid=5.0;pmirank=1;threaded=FALSE;");
                p.send("cmd=fullinit-response;rc=3;pmi-version=2;pmi-subversion=0;rank=0;size=0;appnum=-1;debugged=FALSE;pmiverbose=FALSE;");
            },
            Duration::from_secs(10),
        );
        assert!(matches!(pmi, Err(PmiError::Rc { rc: 3, .. })), "{pmi:?}");
        peer.join().unwrap();

        // A rank that disagrees with the environment.
        let (pmi, peer) = connect(|mut p| p.handshake(0), Duration::from_secs(10));
        assert!(matches!(pmi, Err(PmiError::Protocol(_))), "{pmi:?}");
        peer.join().unwrap();

        // Oversized and garbage length fields, a closed connection; each breaks the connection.
        for (answer, want) in [(&b"999999"[..], "exceeds"), (b"cmd=kv", "bad length"), (b"", "closed")] {
            let (pmi, peer) = connect(
                move |mut p| {
                    p.handshake(1);
                    p.expect("cmd=kvs-fence;");
                    p.0.write_all(answer).unwrap();
                },
                Duration::from_secs(10),
            );
            let mut pmi = pmi.unwrap();
            let e = pmi.fence().unwrap_err();
            assert!(e.to_string().contains(want), "{e}");
            peer.join().unwrap();
            assert!(matches!(pmi.get("k"), Err(PmiError::Protocol(m)) if m.contains("unusable")));
        }
    }

    #[test]
    fn silent_server_times_out() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (pmi, peer) = connect(
            move |mut p| {
                p.handshake(1);
                p.expect("cmd=kvs-fence;");
                let _ = rx.recv(); // hold the connection open, answer nothing
            },
            Duration::from_secs(10),
        );
        let mut pmi = pmi.unwrap();
        pmi.set_timeout(Duration::from_millis(200));
        let t = Instant::now();
        assert!(matches!(pmi.fence(), Err(PmiError::Timeout { cmd: "kvs-fence", .. })));
        assert!(t.elapsed() >= Duration::from_millis(200) && t.elapsed() < Duration::from_secs(5));
        drop(tx);
        peer.join().unwrap();
    }
}
