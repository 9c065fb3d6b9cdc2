//! The ledger's copy on shared storage, so that it survives the node that holds it.
//!
//! Under Slurm the LMDB ledger lives on the leader's node-local disk (LMDB's locks and memory
//! map do not belong on NFS or Lustre). The run directory in the submit directory keeps, in
//! `ledger/`, a snapshot (every entry of the ledger's databases) and a journal of what changed
//! since: every record of a task that ended, the attempt history, the index of failed tasks, and
//! the leader's meta (counts and heartbeat at most once a second). The journal is written and
//! flushed before the commit whose acknowledgements it covers, so whatever an agent was told is
//! recorded survives the loss of the leader's node; tasks merely dispatched or running are not
//! journaled (a resume runs them again anyway).
//!
//! Both files are sequences of frames `[len u32][crc32 u32][op db klen key value]`, so a torn
//! tail (the leader died mid-write) is told from damage (a bad frame with more after it).
//! Generation `g` is `snapshot.g` plus `journal.g`; a new snapshot starts a new generation and
//! removes the older ones, so the replica holds at most twice the snapshot's size.
//! `restore` rebuilds a ledger from the newest snapshot and its journal, on any host.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::ledger::{Ledger, LedgerError};

pub const DB_TASKS: u8 = 0;
pub const DB_META: u8 = 1;
pub const DB_ATTEMPTS: u8 = 2;
pub const DB_FAILED: u8 = 3;

const OP_PUT: u8 = 1;
const OP_DEL: u8 = 2;
const OP_HEADER: u8 = 3;
const OP_END: u8 = 4;
const MAGIC: &[u8] = b"htc-replica-1";
/// No frame is larger (keys are short, values at most a task record or a meta value).
const MAX_FRAME: u32 = 1 << 20;
/// Meta keys rewritten at every commit: the journal takes them at most this often.
const PERIODIC_META: [&str; 5] = ["counts", "heartbeat_us", "leader_cpu_us", "reports", "result_delays"];
const META_EVERY: Duration = Duration::from_secs(1);
/// A journal this much larger than its snapshot (or than this floor) starts a new generation.
const JOURNAL_FLOOR: u64 = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("{path} is damaged at byte {at}: {why}")]
    Damaged { path: String, at: u64, why: String },
    #[error("{0} holds no snapshot of the ledger")]
    NoSnapshot(String),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

type Result<T> = std::result::Result<T, ReplicaError>;

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> ReplicaError + '_ {
    move |source| ReplicaError::Io { path: path.display().to_string(), source }
}

/// CRC-32 (IEEE): a torn or flipped frame must not pass for a good one.
fn crc32(data: &[u8]) -> u32 {
    crc32fast::hash(data)
}

/// One change to one of the ledger's databases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub op: u8,
    pub db: u8,
    pub key: Vec<u8>,
    pub val: Vec<u8>,
}

/// Appends one frame to `out`.
pub fn encode(out: &mut Vec<u8>, op: u8, db: u8, key: &[u8], val: &[u8]) {
    let len = 4 + key.len() + val.len();
    out.extend_from_slice(&(len as u32).to_le_bytes());
    let crc_at = out.len();
    out.extend_from_slice(&[0; 4]);
    let start = out.len();
    out.push(op);
    out.push(db);
    out.extend_from_slice(&(key.len() as u16).to_le_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(val);
    let crc = crc32(&out[start..]);
    out[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
}

/// How a sequence of frames ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tail {
    /// An end frame, then nothing.
    End,
    /// The bytes simply stopped after a whole frame.
    Clean,
    /// The last frame was cut short or its checksum fails, with nothing after it: a write the
    /// writer did not finish. Those bytes are ignored.
    Torn,
}

/// Reads the frames of the file at `path`, handing each change to `f` and returning the header's
/// generation and how the file ended.
pub fn read_frames(path: &Path, f: impl FnMut(Entry) -> Result<()>) -> Result<(u64, Tail)> {
    let file = File::open(path).map_err(io_err(path))?;
    let len = file.metadata().map_err(io_err(path))?.len();
    decode_frames(BufReader::with_capacity(1 << 20, file), len, path, f)
}

/// Decodes `len` bytes of frames from `r` (named `path` in errors). A bad frame with more bytes
/// after it is damage, not a tear.
pub fn decode_frames(
    mut r: impl Read,
    len: u64,
    path: &Path,
    mut f: impl FnMut(Entry) -> Result<()>,
) -> Result<(u64, Tail)> {
    let damaged = |at: u64, why: &str| ReplicaError::Damaged { path: path.display().to_string(), at, why: why.into() };
    let mut at = 0u64;
    let mut gen = None;
    let mut payload = Vec::new();
    loop {
        let mut head = [0u8; 8];
        match read_full(&mut r, &mut head).map_err(io_err(path))? {
            0 => return gen.map(|g| (g, Tail::Clean)).ok_or_else(|| damaged(0, "no header")),
            8 => {}
            _ => return gen.map(|g| (g, Tail::Torn)).ok_or_else(|| damaged(0, "no header")),
        }
        let n = u32::from_le_bytes(head[..4].try_into().unwrap());
        let crc = u32::from_le_bytes(head[4..].try_into().unwrap());
        let end = at + 8 + n as u64;
        if !(4..=MAX_FRAME).contains(&n) || end > len {
            // A length that cannot be right: the tail of an unfinished write, or damage.
            return match gen {
                Some(g) if n <= MAX_FRAME && end > len => Ok((g, Tail::Torn)),
                _ => Err(damaged(at, "a frame of impossible length")),
            };
        }
        payload.resize(n as usize, 0);
        r.read_exact(&mut payload).map_err(io_err(path))?;
        if crc32(&payload) != crc {
            return match gen {
                Some(g) if end == len => Ok((g, Tail::Torn)),
                _ => Err(damaged(at, "a frame's checksum does not match")),
            };
        }
        let (op, db) = (payload[0], payload[1]);
        let klen = u16::from_le_bytes([payload[2], payload[3]]) as usize;
        if 4 + klen > payload.len() || db > DB_FAILED {
            return Err(damaged(at, "a frame that does not parse"));
        }
        let (key, val) = payload[4..].split_at(klen);
        match (op, gen) {
            (OP_HEADER, None) if key == MAGIC && val.len() == 8 => {
                gen = Some(u64::from_le_bytes(val.try_into().unwrap()));
            }
            (_, None) => return Err(damaged(at, "not a ledger replica (no header)")),
            (OP_END, Some(g)) => {
                return if end == len { Ok((g, Tail::End)) } else { Err(damaged(end, "bytes after the end")) };
            }
            (OP_PUT | OP_DEL, Some(_)) => f(Entry { op, db, key: key.to_vec(), val: val.to_vec() })?,
            _ => return Err(damaged(at, "an unknown frame")),
        }
        at = end;
    }
}

/// Reads until `buf` is full or the input ends; how many bytes it got.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// The first frame of every snapshot and journal: the format and the generation.
pub fn header(gen: u64) -> Vec<u8> {
    let mut b = Vec::new();
    encode(&mut b, OP_HEADER, 0, MAGIC, &gen.to_le_bytes());
    b
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_err(dir))
}

/// The replica of one run: `RUN/ledger/`.
#[derive(Debug, Clone)]
pub struct Replica {
    pub dir: PathBuf,
}

impl Replica {
    pub fn of(run_dir: &Path) -> Replica {
        Replica { dir: run_dir.join("ledger") }
    }

    fn snapshot(&self, gen: u64) -> PathBuf {
        self.dir.join(format!("snapshot.{gen}"))
    }
    fn journal(&self, gen: u64) -> PathBuf {
        self.dir.join(format!("journal.{gen}"))
    }
    fn where_file(&self) -> PathBuf {
        self.dir.join("where")
    }

    /// The newest generation with a whole snapshot (a snapshot is renamed into place only once
    /// written and flushed).
    pub fn latest(&self) -> Result<Option<u64>> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err(&self.dir)(e)),
        };
        let mut best = None;
        for e in entries {
            let name = e.map_err(io_err(&self.dir))?.file_name();
            let gen = name.to_str().and_then(|n| n.strip_prefix("snapshot.")).and_then(|g| g.parse::<u64>().ok());
            best = best.max(gen);
        }
        Ok(best)
    }

    /// Whether the run keeps its ledger this way (and its load was completed).
    pub fn exists(&self) -> bool {
        self.latest().ok().flatten().is_some()
    }

    /// Records where the live ledger is: `htc status` on that host reads it directly.
    pub fn set_where(&self, ledger: &Path) -> Result<()> {
        let text = format!("{}\n{}\n", crate::host::hostname(), ledger.display());
        let tmp = self.dir.join("where.tmp");
        fs::write(&tmp, text).and_then(|()| fs::rename(&tmp, self.where_file())).map_err(io_err(&self.dir))
    }

    /// The live ledger's path when it is on this host and still there.
    pub fn local_ledger(&self) -> Option<PathBuf> {
        let text = fs::read_to_string(self.where_file()).ok()?;
        let mut lines = text.lines();
        let (host, path) = (lines.next()?, PathBuf::from(lines.next()?));
        (host == crate::host::hostname() && path.exists()).then_some(path)
    }

    /// Starts a new generation: a snapshot of `ledger` as it is now (no write transaction may be
    /// open), and an empty journal after it. Older generations are removed.
    pub fn begin(&self, ledger: &Ledger) -> Result<Journal> {
        fs::create_dir_all(&self.dir).map_err(io_err(&self.dir))?;
        let gen = self.latest()?.map_or(1, |g| g + 1);
        let tmp = self.dir.join(format!("snapshot.{gen}.tmp"));
        let snapshot_bytes = match write_snapshot(&tmp, gen, ledger) {
            Ok(n) => n,
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                return Err(e);
            }
        };
        let journal = self.create_journal(gen)?;
        fs::rename(&tmp, self.snapshot(gen)).map_err(io_err(&tmp))?;
        sync_dir(&self.dir)?;
        // A reader still restoring an older generation finds it gone and starts again (`restore`).
        for old in 1..gen {
            let _ = fs::remove_file(self.snapshot(old));
            let _ = fs::remove_file(self.journal(old));
        }
        Ok(Journal {
            file: journal,
            path: self.journal(gen),
            gen,
            bytes: 0,
            snapshot_bytes,
            meta_at: None,
            meta: Vec::new(),
        })
    }

    fn create_journal(&self, gen: u64) -> Result<File> {
        let path = self.journal(gen);
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
            .map_err(io_err(&path))?;
        f.write_all(&header(gen)).and_then(|()| f.sync_data()).map_err(io_err(&path))?;
        Ok(f)
    }

    /// The journal of the newest generation, to append to (a writer after the leader's session,
    /// e.g. the resubmission count).
    pub fn writer(&self) -> Result<Journal> {
        let gen = self.latest()?.ok_or_else(|| ReplicaError::NoSnapshot(self.dir.display().to_string()))?;
        let path = self.journal(gen);
        let snapshot_bytes = fs::metadata(self.snapshot(gen)).map_err(io_err(&path))?.len();
        let file = match OpenOptions::new().append(true).open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => self.create_journal(gen)?,
            Err(e) => return Err(io_err(&path)(e)),
        };
        // A torn last write (its writer died) is cut off first: frames after it would make it
        // look like damage.
        let mut whole = header(gen).len() as u64;
        let (_, tail) = read_frames(&path, |e| {
            whole += 12 + (e.key.len() + e.val.len()) as u64;
            Ok(())
        })?;
        if tail == Tail::Torn {
            file.set_len(whole).map_err(io_err(&path))?;
        }
        let bytes = file.metadata().map_err(io_err(&path))?.len();
        Ok(Journal { file, path, gen, bytes, snapshot_bytes, meta_at: None, meta: Vec::new() })
    }

    /// Builds a new ledger at `dest` (replacing any file there) from the newest snapshot and its
    /// journal. A generation that a live leader replaces while this reads is read again.
    pub fn restore(&self, dest: &Path) -> Result<Ledger> {
        for _ in 0..3 {
            let gen = self.latest()?.ok_or_else(|| ReplicaError::NoSnapshot(self.dir.display().to_string()))?;
            match self.restore_gen(gen, dest) {
                Err(ReplicaError::Io { source, .. })
                    if source.kind() == io::ErrorKind::NotFound && self.latest()? != Some(gen) =>
                {
                    continue
                }
                r => return r,
            }
        }
        Err(ReplicaError::Io {
            path: self.dir.display().to_string(),
            source: io::Error::other("its generations changed three times while being read"),
        })
    }

    fn restore_gen(&self, gen: u64, dest: &Path) -> Result<Ledger> {
        for p in [dest.to_path_buf(), lock_path(dest)] {
            match fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(&p)(e)),
            }
        }
        let ledger = Ledger::create(dest)?;
        let snap = self.snapshot(gen);
        self.replay(gen, &snap, &ledger)?;
        ledger.sync()?;
        Ok(ledger)
    }

    /// Applies snapshot `gen` and its journal to the empty `ledger`.
    fn replay(&self, gen: u64, snap: &Path, ledger: &Ledger) -> Result<()> {
        let mut txn = Some(ledger.write()?);
        let mut n = 0u64;
        let mut apply = |e: Entry| -> Result<()> {
            let t = match txn.as_mut() {
                Some(t) => t,
                None => txn.insert(ledger.write()?),
            };
            t.apply_entry(e.op == OP_PUT, e.db, &e.key, &e.val)?;
            n += 1;
            // LMDB spills a huge transaction's dirty pages anyway; smaller ones are faster.
            if n.is_multiple_of(100_000) {
                txn.take().unwrap().commit()?;
            }
            Ok(())
        };
        let (g, tail) = read_frames(snap, &mut apply)?;
        if g != gen || tail != Tail::End {
            let why = if g != gen { "of another generation" } else { "cut short" };
            return Err(ReplicaError::Damaged { path: snap.display().to_string(), at: 0, why: why.into() });
        }
        let journal = self.journal(gen);
        if journal.exists() {
            let (g, tail) = read_frames(&journal, &mut apply)?;
            if g != gen {
                let why = "of another generation".into();
                return Err(ReplicaError::Damaged { path: journal.display().to_string(), at: 0, why });
            }
            if tail == Tail::Torn {
                tracing::info!(journal = %journal.display(), "the journal's last write was cut short; it is ignored");
            }
        } else if self.latest()? != Some(gen) {
            return Err(io_err(&journal)(io::ErrorKind::NotFound.into()));
        }
        if let Some(t) = txn.take() {
            t.commit()?;
        }
        Ok(())
    }
}

/// Where a Slurm job's leader keeps the ledger: `DIR/htc-UID-JOBID/ledger.mdb` on this node's
/// local disk, DIR being the admin's `ledger_dir` or the job's temporary directory (`$TMPDIR`,
/// which Slurm points at the node's `TmpFS`). The directory is this user's alone; a shared
/// filesystem is refused, since LMDB's lock and map are not safe there.
pub fn node_local(dir: Option<&Path>, job_id: &str) -> std::result::Result<PathBuf, String> {
    let base = dir.map(Path::to_path_buf).unwrap_or_else(std::env::temp_dir);
    if let Some(kind) = crate::storage::network_fs(&base) {
        return Err(format!(
            "the ledger directory {} is on {kind}; the ledger needs node-local storage (plugin argument ledger_dir=)",
            base.display()
        ));
    }
    let own = node_local_dir(&base, job_id);
    private_dir(&own)?;
    Ok(own.join("ledger.mdb"))
}

/// Where `node_local` keeps job `job_id`'s ledger under `base`.
fn node_local_dir(base: &Path, job_id: &str) -> PathBuf {
    base.join(format!("htc-{}-{job_id}", nix::unistd::getuid()))
}

/// Removes the node-local ledgers that earlier sessions of a run (`job_ids`) left on this
/// node's disk: a leader that was killed never removed its own. The run's new leader calls it
/// with the run locked, so no leader uses them, and once the replica was rebuilt here: they are
/// behind it. A folder that is not this user's private one is left alone. Returns those removed.
pub fn remove_stale_node_local(dir: Option<&Path>, job_ids: &[String]) -> Vec<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let base = dir.map(Path::to_path_buf).unwrap_or_else(std::env::temp_dir);
    let mut removed = Vec::new();
    for id in job_ids {
        let d = node_local_dir(&base, id);
        let Ok(m) = fs::symlink_metadata(&d) else { continue };
        if !m.is_dir() || m.uid() != nix::unistd::getuid().as_raw() || m.mode() & 0o077 != 0 {
            continue;
        }
        // Job ids start over with the controller: an old id of this run may be a live run's now.
        let ledger = d.join("ledger.mdb");
        if in_use(&ledger) {
            continue;
        }
        remove_node_local(&ledger);
        if !d.exists() {
            removed.push(d);
        }
    }
    removed
}

/// Creates `dir` (0700), or accepts it if it is already this user's private directory: in a
/// shared `/tmp` anyone could have made it first, or put a symlink there.
pub fn private_dir(dir: &Path) -> std::result::Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let m = fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            if !m.is_dir() || m.uid() != nix::unistd::getuid().as_raw() || m.mode() & 0o077 != 0 {
                return Err(format!("{} exists and is not this user's private directory", dir.display()));
            }
            Ok(())
        }
        Err(e) => Err(format!("creating {}: {e}", dir.display())),
    }
}

/// Writes every entry of `ledger` to `tmp` as snapshot `gen`, flushed; its size.
fn write_snapshot(tmp: &Path, gen: u64, ledger: &Ledger) -> Result<u64> {
    let file = OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(tmp);
    let mut w = BufWriter::with_capacity(1 << 20, file.map_err(io_err(tmp))?);
    let mut buf = header(gen);
    let mut count = 0u64;
    let mut failed = None;
    ledger.dump(|db, k, v| {
        encode(&mut buf, OP_PUT, db, k, v);
        count += 1;
        if buf.len() >= 1 << 16 && failed.is_none() {
            failed = w.write_all(&buf).err();
            buf.clear();
        }
    })?;
    encode(&mut buf, OP_END, 0, &[], &count.to_le_bytes());
    if let Some(e) = failed {
        return Err(io_err(tmp)(e));
    }
    w.write_all(&buf).map_err(io_err(tmp))?;
    let file = w.into_inner().map_err(|e| io_err(tmp)(e.into_error()))?;
    file.sync_all().map_err(io_err(tmp))?;
    Ok(file.metadata().map_err(io_err(tmp))?.len())
}

/// Takes over a run whose leader is gone: with a replica, its ledger rebuilt from it at `local`
/// on this node's disk (the old one went with its node, or is behind the journal); a run whose
/// ledger is in its directory (a local run, or a Slurm run from before) is taken as it is.
pub fn take_over(run: crate::rundir::RunDir, local: &Path) -> Result<crate::rundir::RunDir> {
    if run.ledger().exists() {
        return Ok(run);
    }
    Replica::of(&run.path).restore(local)?;
    Ok(run.with_ledger(local.to_path_buf()))
}

/// Whether a process has the LMDB environment at `ledger` open: LMDB holds a shared lock on the
/// first byte of its lock file for as long as it has the environment open.
pub fn in_use(ledger: &Path) -> bool {
    let Ok(f) = OpenOptions::new().read(true).write(true).open(lock_path(ledger)) else { return false };
    // SAFETY: flock is plain integers (and, on some targets, padding), for which all zeroes is a
    // valid value; the fields F_GETLK reads are filled in below.
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = libc::F_WRLCK as libc::c_short;
    l.l_whence = libc::SEEK_SET as libc::c_short;
    l.l_start = 0;
    l.l_len = 1;
    nix::fcntl::fcntl(&f, nix::fcntl::FcntlArg::F_GETLK(&mut l)).is_ok() && l.l_type != libc::F_UNLCK as libc::c_short
}

/// Removes the node-local ledger (and its directory) once its replica holds everything.
pub fn remove_node_local(ledger: &Path) {
    let _ = fs::remove_file(ledger);
    let _ = fs::remove_file(lock_path(ledger));
    if let Some(dir) = ledger.parent() {
        let _ = fs::remove_dir(dir);
    }
}

pub fn lock_path(ledger: &Path) -> PathBuf {
    let mut p = ledger.as_os_str().to_owned();
    p.push("-lock");
    PathBuf::from(p)
}

/// The open journal of one generation, appended to at each commit.
pub struct Journal {
    file: File,
    path: PathBuf,
    gen: u64,
    bytes: u64,
    snapshot_bytes: u64,
    /// When periodic meta last went out, and their newest values not yet written.
    meta_at: Option<Instant>,
    meta: Vec<(String, Vec<u8>)>,
}

/// What one write transaction changed, for the journal.
#[derive(Default)]
pub struct Log {
    buf: Vec<u8>,
    /// Holds a change that must be on disk before the commit is acknowledged.
    durable: bool,
    meta: Vec<(String, Vec<u8>)>,
    /// Tasks taken out of the failed index in this transaction: their next record is journaled
    /// whatever its state, or a restore would keep them failed.
    pub reopened: Vec<u64>,
}

impl Log {
    pub fn put(&mut self, db: u8, key: &[u8], val: &[u8]) {
        encode(&mut self.buf, OP_PUT, db, key, val);
        self.durable = true;
    }
    pub fn del(&mut self, db: u8, key: &[u8]) {
        encode(&mut self.buf, OP_DEL, db, key, &[]);
        self.durable = true;
    }
    pub fn meta(&mut self, key: &str, val: &[u8]) {
        match self.meta.iter_mut().find(|(k, _)| k == key) {
            Some(e) => e.1 = val.to_vec(),
            None => self.meta.push((key.to_string(), val.to_vec())),
        }
    }
}

impl Journal {
    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn gen(&self) -> u64 {
        self.gen
    }

    /// Writes what a transaction changed, flushed, before it commits; periodic meta alone
    /// (counts, heartbeat) at most once a second.
    pub fn append(&mut self, log: Log) -> Result<()> {
        let Log { mut buf, durable, meta, .. } = log;
        let mut forced = durable;
        for (k, v) in meta {
            forced |= !PERIODIC_META.contains(&k.as_str());
            match self.meta.iter_mut().find(|(mk, _)| *mk == k) {
                Some(e) => e.1 = v,
                None => self.meta.push((k, v)),
            }
        }
        let due = self.meta_at.is_none_or(|t| t.elapsed() >= META_EVERY);
        if !self.meta.is_empty() && (forced || due) {
            for (k, v) in self.meta.drain(..) {
                encode(&mut buf, OP_PUT, DB_META, k.as_bytes(), &v);
            }
            self.meta_at = Some(Instant::now());
        }
        if buf.is_empty() {
            return Ok(());
        }
        // Flushed every time: what ended must be on disk before it is acknowledged, and on NFS
        // other hosts see a heartbeat only once the server has it.
        self.file.write_all(&buf).and_then(|()| self.file.sync_data()).map_err(io_err(&self.path))?;
        self.bytes += buf.len() as u64;
        Ok(())
    }

    /// Whether the journal has grown enough that a new snapshot is cheaper to restore from.
    pub fn wants_snapshot(&self) -> bool {
        self.bytes > self.snapshot_bytes.max(JOURNAL_FLOOR)
    }

    /// A snapshot could not be written: go on with this journal, and try again once it doubled.
    pub fn defer_snapshot(&mut self) {
        self.snapshot_bytes = self.bytes.saturating_mul(2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{Attempt, Change, Outcome, Record, State};

    fn record(state: State, value: i32) -> Record {
        Record { cmd_len: 4, state: state as u8, value, ..Default::default() }
    }

    #[test]
    fn crc32_of_a_known_string() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn a_journal_with_a_torn_tail_is_read_up_to_it_and_damage_before_the_end_is_refused() {
        let d = tempdir();
        let p = d.join("j");
        let mut b = header(7);
        encode(&mut b, OP_PUT, DB_TASKS, &1u64.to_be_bytes(), b"one");
        encode(&mut b, OP_PUT, DB_TASKS, &2u64.to_be_bytes(), b"two");
        let whole = b.len();
        for cut in [whole, whole - 1, whole - 7, whole - 12] {
            fs::write(&p, &b[..cut]).unwrap();
            let mut seen = Vec::new();
            let (g, tail) = read_frames(&p, |e| {
                seen.push(e.val);
                Ok(())
            })
            .unwrap();
            assert_eq!(g, 7);
            let want: Vec<&[u8]> = if cut == whole { vec![b"one", b"two"] } else { vec![b"one"] };
            assert_eq!(seen, want, "cut at {cut}");
            assert_eq!(tail, if cut == whole { Tail::Clean } else { Tail::Torn });
        }
        // A flipped byte in the first record, with a good one after it: damage, named.
        let mut bad = b.clone();
        bad[header(7).len() + 9] ^= 0x40;
        fs::write(&p, &bad).unwrap();
        let e = read_frames(&p, |_| Ok(())).unwrap_err().to_string();
        assert!(e.contains("damaged at byte") && e.contains("checksum"), "{e}");
        fs::write(&p, b"not a replica at all").unwrap();
        assert!(read_frames(&p, |_| Ok(())).is_err());
    }

    #[test]
    fn restore_rebuilds_ended_tasks_history_and_meta_across_generations() {
        let d = tempdir();
        let live = Ledger::create(&d.join("live.mdb")).unwrap();
        {
            let mut t = live.write().unwrap();
            for id in 0..10 {
                t.append(id, &record(State::Pending, 0)).unwrap();
            }
            t.put_meta("total", &10u64.to_le_bytes()).unwrap();
            t.commit().unwrap();
        }
        let replica = Replica::of(&d);
        let mut live = live;
        live.attach_journal(replica.begin(&live).unwrap());
        // Task 3 ends, task 4 is only dispatched, task 5 fails for good; a retried attempt of 3.
        {
            let mut t = live.write().unwrap();
            let a = Attempt { attempt: 1, outcome: Outcome::Exited, value: 1, agent: 2, start_us: 1, end_us: 2 };
            t.apply(&Change::Attempt(3, a)).unwrap();
            t.apply(&Change::Record(3, record(State::Done, 0))).unwrap();
            t.apply(&Change::Record(4, record(State::Dispatched, 0))).unwrap();
            t.apply(&Change::Record(5, record(State::Failed, 9))).unwrap();
            t.apply(&Change::Failed(5, true)).unwrap();
            t.put_meta("heartbeat_us", &42u64.to_le_bytes()).unwrap();
            t.commit().unwrap();
        }
        // A new generation, then task 5 goes back to pending (a refund) and 6 ends.
        let j = replica.begin(&live).unwrap();
        assert_eq!(j.gen(), 2);
        live.attach_journal(j);
        {
            let mut t = live.write().unwrap();
            t.apply(&Change::Failed(5, false)).unwrap();
            t.apply(&Change::Record(5, record(State::Pending, 0))).unwrap();
            t.apply(&Change::Record(6, record(State::Done, 0))).unwrap();
            t.apply(&Change::Record(8, record(State::Running, 0))).unwrap();
            t.put_meta("session_end_us", &7u64.to_le_bytes()).unwrap();
            t.commit().unwrap();
        }
        // A transaction that is dropped leaves nothing in the journal.
        {
            let mut t = live.write().unwrap();
            t.apply(&Change::Record(7, record(State::Done, 0))).unwrap();
        }
        let copy = replica.restore(&d.join("copy.mdb")).unwrap();
        let r = copy.read().unwrap();
        assert_eq!(r.get(3).unwrap().unwrap().state(), State::Done);
        assert_eq!(r.attempts(3).unwrap().len(), 1, "the retried attempt's history");
        assert_eq!(r.get(4).unwrap().unwrap().state(), State::Dispatched, "as the second snapshot saw it");
        assert_eq!(r.get(8).unwrap().unwrap().state(), State::Pending, "starts are not journaled");
        assert_eq!(r.get(5).unwrap().unwrap().state(), State::Pending);
        assert_eq!(r.failed_ids(10).unwrap(), Vec::<u64>::new());
        assert_eq!(r.get(6).unwrap().unwrap().state(), State::Done);
        assert_eq!(r.get(7).unwrap().unwrap().state(), State::Pending);
        assert_eq!(r.meta_u64("total").unwrap(), Some(10));
        assert_eq!(r.meta_u64("heartbeat_us").unwrap(), Some(42));
        assert_eq!(r.meta_u64("session_end_us").unwrap(), Some(7));
        // A torn last write of the journal costs only that write.
        drop(r);
        let mut f = OpenOptions::new().append(true).open(replica.journal(2)).unwrap();
        f.write_all(&[9, 0, 0]).unwrap();
        let copy = replica.restore(&d.join("copy.mdb")).unwrap();
        assert_eq!(copy.read().unwrap().get(6).unwrap().unwrap().state(), State::Done);
        // A later writer cuts the torn write off before it appends.
        drop((live, copy));
        let mut live = Ledger::open(&d.join("live.mdb"), false).unwrap();
        live.attach_journal(replica.writer().unwrap());
        let mut t = live.write().unwrap();
        t.put_meta("resubmits", &1u64.to_le_bytes()).unwrap();
        t.commit().unwrap();
        let copy = replica.restore(&d.join("copy.mdb")).unwrap();
        assert_eq!(copy.read().unwrap().meta_u64("resubmits").unwrap(), Some(1));
        assert_eq!(copy.read().unwrap().get(6).unwrap().unwrap().state(), State::Done);
    }

    #[test]
    fn a_snapshot_that_cannot_be_written_leaves_the_journal_going() {
        let d = tempdir();
        let (live, replica) = journaled(&d);
        // Generation 2's snapshot cannot be created (a directory is in its way).
        fs::create_dir_all(d.join("ledger/snapshot.2.tmp/x")).unwrap();
        live.new_generation().unwrap();
        assert_eq!(replica.latest().unwrap(), Some(1));
        {
            let mut t = live.write().unwrap();
            t.apply(&Change::Record(1, record(State::Done, 0))).unwrap();
            t.commit().unwrap();
        }
        let copy = replica.restore(&d.join("copy.mdb")).unwrap();
        assert_eq!(copy.read().unwrap().get(1).unwrap().unwrap().state(), State::Done);
    }

    #[test]
    fn readers_restore_while_the_leader_starts_generation_after_generation() {
        let d = tempdir();
        let (live, replica) = journaled(&d);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (replica, stop, dest) = (replica.clone(), stop.clone(), d.join("copy.mdb"));
            std::thread::spawn(move || {
                let (mut reads, mut last) = (0, 0);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) || reads == 0 {
                    let copy = replica.restore(&dest).expect("a restore during rotations");
                    let mut done = 0;
                    copy.read().unwrap().for_each(|_, r| done += (r.state() == State::Done) as usize).unwrap();
                    assert!(done >= last, "a later restore saw less done ({done} < {last})");
                    (reads, last) = (reads + 1, done);
                }
                reads
            })
        };
        for id in 0..300u64 {
            let mut t = live.write().unwrap();
            t.apply(&Change::Record(id, record(State::Done, 0))).unwrap();
            t.commit().unwrap();
            if id % 10 == 0 {
                live.new_generation().unwrap();
                // A leader starts a generation once its journal has grown as large as its
                // snapshot, far less often than this; back to back, a reader on a loaded machine
                // could see every try overtaken (`restore` tries three generations).
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let reads = reader.join().unwrap();
        println!("{reads} restores during 30 generations");
        assert!(reads > 0);
        let left: Vec<_> = fs::read_dir(&replica.dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left.len(), 2, "one generation left: {left:?}");
    }

    #[test]
    fn a_private_directory_is_made_or_refused_when_someone_else_could_use_it() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempdir();
        private_dir(&d.join("mine")).unwrap();
        private_dir(&d.join("mine")).unwrap();
        fs::create_dir(d.join("open")).unwrap();
        fs::set_permissions(d.join("open"), fs::Permissions::from_mode(0o755)).unwrap();
        assert!(private_dir(&d.join("open")).unwrap_err().contains("not this user's private directory"));
        std::os::unix::fs::symlink(d.join("mine"), d.join("link")).unwrap();
        assert!(private_dir(&d.join("link")).is_err(), "a symlink is not followed");
    }

    /// A new ledger in `d` whose replica has its first generation.
    fn journaled(d: &Path) -> (Ledger, Replica) {
        let mut live = Ledger::create(&d.join("live.mdb")).unwrap();
        let replica = Replica::of(d);
        live.attach_journal(replica.begin(&live).unwrap());
        (live, replica)
    }

    /// Finding 12 of issue 24: a killed leader's node-local ledger is removed by the leader that
    /// continues its run, and nothing else is.
    #[test]
    fn earlier_sessions_node_local_ledgers_are_removed_and_nothing_else() {
        use std::os::unix::fs::PermissionsExt;
        let base = tempdir();
        let killed = node_local(Some(&base), "101").unwrap();
        fs::write(&killed, b"ledger").unwrap();
        fs::write(lock_path(&killed), b"").unwrap();
        // Not this user's private folder (anyone may have made it in a shared /tmp): left alone.
        let open = node_local_dir(&base, "102");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o755)).unwrap();
        let removed = remove_stale_node_local(Some(&base), &["101".into(), "102".into(), "103".into()]);
        assert_eq!(removed, vec![killed.parent().unwrap().to_path_buf()]);
        assert!(!killed.parent().unwrap().exists() && open.exists());
        let _ = fs::remove_dir_all(&base);
    }

    fn tempdir() -> PathBuf {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let d = std::env::temp_dir().join(format!("htc-replica-test-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }
}
