//! The ledger's copy on shared storage, so that it survives the node that holds it.
//!
//! Under Slurm the LMDB ledger lives on the leader's node-local disk (LMDB's locks and memory
//! map do not belong on NFS or Lustre). The run directory in the submit directory keeps, in
//! `ledger/`, a snapshot (every entry of the ledger's databases) and a journal of what changed
//! since: every task added to an open run (its record, command, dependencies and key), every
//! record of a task that ended, the attempt history, the index of failed tasks, and the leader's
//! meta (counts and heartbeat at most once a second). The journal is written and
//! flushed before the commit whose acknowledgements it covers, so whatever an agent was told is
//! recorded survives the loss of the leader's node; tasks merely dispatched or running are not
//! journaled (a resume runs them again anyway).
//!
//! Both files are sequences of frames (`journal`: their format, and the journal a ledger writes).
//! Generation `g` is `snapshot.g` plus `journal.g`; a new snapshot starts a new generation and
//! removes the older ones, so the replica holds at most twice the snapshot's size.
//! `restore` rebuilds a ledger from the newest snapshot and its journal, on any host.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

pub use crate::journal::{encode, header};
use crate::journal::{read_frames, Entry, Journal, JournalError, Tail, OP_END, OP_PUT};
use crate::ledger::{Ledger, LedgerError};

/// Generations `restore` reads before it gives up on a leader that keeps replacing them.
const RESTORE_TRIES: usize = 8;

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

impl From<JournalError> for ReplicaError {
    fn from(e: JournalError) -> Self {
        match e {
            JournalError::Io { path, source } => ReplicaError::Io { path, source },
            JournalError::Damaged { path, at, why } => ReplicaError::Damaged { path, at, why },
        }
    }
}

type Result<T> = std::result::Result<T, ReplicaError>;

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> ReplicaError + '_ {
    move |source| ReplicaError::Io { path: path.display().to_string(), source }
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
        let text = format!("{}\n{}\n", htc_host::hostname(), ledger.display());
        let tmp = self.dir.join("where.tmp");
        fs::write(&tmp, text).and_then(|()| fs::rename(&tmp, self.where_file())).map_err(io_err(&self.dir))
    }

    /// The live ledger's path when it is on this host and still there.
    pub fn local_ledger(&self) -> Option<PathBuf> {
        let text = fs::read_to_string(self.where_file()).ok()?;
        let mut lines = text.lines();
        let (host, path) = (lines.next()?, PathBuf::from(lines.next()?));
        (host == htc_host::hostname() && path.exists()).then_some(path)
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
        let journal = Journal::create(self.journal(gen), gen, snapshot_bytes)?;
        fs::rename(&tmp, self.snapshot(gen)).map_err(io_err(&tmp))?;
        sync_dir(&self.dir)?;
        // A reader still restoring an older generation finds it gone and starts again (`restore`).
        for old in 1..gen {
            let _ = fs::remove_file(self.snapshot(old));
            let _ = fs::remove_file(self.journal(old));
        }
        Ok(journal)
    }

    /// The journal of the newest generation, to append to (a writer after the leader's session,
    /// e.g. the resubmission count).
    pub fn writer(&self) -> Result<Journal> {
        let gen = self.latest()?.ok_or_else(|| ReplicaError::NoSnapshot(self.dir.display().to_string()))?;
        let path = self.journal(gen);
        let snapshot_bytes = fs::metadata(self.snapshot(gen)).map_err(io_err(&path))?.len();
        Ok(Journal::open_append(path, gen, snapshot_bytes)?)
    }

    /// Builds a new ledger at `dest` (replacing any file there) from the newest snapshot and its
    /// journal. A generation that a live leader replaces while this reads is read again, up to
    /// `RESTORE_TRIES` generations: a leader starts one when its journal has grown as large as
    /// its snapshot, so only a reader starved of CPU is overtaken more than once or twice.
    pub fn restore(&self, dest: &Path) -> Result<Ledger> {
        for _ in 0..RESTORE_TRIES {
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
            source: io::Error::other(format!("its generations changed {RESTORE_TRIES} times while being read")),
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
        let mut ledger = Ledger::create(dest)?;
        let snap = self.snapshot(gen);
        self.replay(gen, &snap, &ledger)?;
        // A replica an older release wrote names its schema: its records are migrated as an
        // opened ledger's are.
        ledger.upgrade(true)?;
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
    if let Some(kind) = htc_host::network_fs(&base) {
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

/// Starts the replica's next generation for `ledger`, which writes to its journal: a snapshot of
/// the ledger as committed now (no write transaction may be open) and a fresh journal. Nothing
/// without a journal. A snapshot that cannot be written costs nothing but time: the journal goes
/// on, and it is tried again once the journal doubled.
pub fn new_generation(ledger: &Ledger) {
    let Some(dir) = ledger.journal_dir() else { return };
    match (Replica { dir }).begin(ledger) {
        Ok(next) => ledger.replace_journal(next),
        Err(e) => {
            tracing::warn!(error = %e, "no new snapshot of the ledger; its journal goes on");
            ledger.defer_snapshot();
        }
    }
}

/// Reads `len` bytes of frames from `r` (named `path` in errors) as the replica does
/// (`journal::decode_frames`, with the replica's errors).
pub fn decode_frames(r: impl Read, len: u64, path: &Path, f: impl FnMut(Entry) -> Result<()>) -> Result<(u64, Tail)> {
    crate::journal::decode_frames(r, len, path, f)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{Attempt, Change, Outcome, Record, State};
    use htc_core::record::Ended;

    fn record(state: State, value: i32) -> Record {
        let cmd = htc_core::record::CommandAt { len: 4, ..Default::default() };
        let mut r = Record::new(cmd, Default::default()).walked(htc_core::task::path_to(state)).unwrap();
        r.set_ended(0, Ended { value, ..Ended::NONE });
        r
    }

    #[test]
    fn a_replica_of_an_older_schema_restores_through_the_migration() {
        let d = tempdir();
        let old = d.join("old.mdb");
        let written = crate::ledger::tests::schema_2_ledger(&old, 40);
        // The older release's replica: its snapshot holds the schema-2 entries as they are.
        let replica = Replica::of(&d);
        replica.begin(&Ledger::open(&old, true).unwrap()).unwrap();
        let restored = replica.restore(&d.join("restored.mdb")).unwrap();
        let t = restored.read().unwrap();
        assert_eq!(t.schema().unwrap(), crate::ledger::SCHEMA_VERSION);
        let mut got = Vec::new();
        t.for_each(|_, r| got.push(*r)).unwrap();
        assert_eq!(got, written);
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
            let a = Attempt { attempt: 1, agent: 2, ended: Ended::new(Outcome::Exited, 1, 1, 2) };
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
    fn tasks_added_after_the_snapshot_are_restored_whole_whatever_their_state() {
        use crate::ledger::{Adding, Reads};
        use htc_core::after::{Kind, Needs};
        use htc_core::attempts::{RetryOn, Rules};
        use htc_core::shape::TaskShape;
        // An open run: the snapshot is taken before any task exists.
        let d = tempdir();
        let mut live = Ledger::create(&d.join("live.mdb")).unwrap();
        let replica = Replica::of(&d);
        live.attach_journal(replica.begin(&live).unwrap());
        {
            let mut t = live.write().unwrap();
            let mut needs = Needs::default();
            t.add_task(
                Adding { needs: &needs, ..Adding::plain(TaskShape::default(), true, b"echo one") },
                Some(b"k1"),
                None,
            )
            .unwrap();
            needs.push(1..=1, Kind::After);
            t.add_task(
                Adding { needs: &needs, ..Adding::plain(TaskShape { cores: 2, ..Default::default() }, false, b"two") },
                None,
                Some(b"n2"),
            )
            .unwrap();
            let rules = Rules { retry_on: Some(RetryOn::parse("oom").unwrap()), ..Rules::default() };
            t.add_task(Adding { rules: &rules, ..Adding::plain(TaskShape::default(), true, b"three") }, None, None)
                .unwrap();
            t.commit().unwrap();
        }
        // Task 1 ends, task 2 is dispatched (not journaled), task 3 never starts.
        {
            let mut t = live.write().unwrap();
            t.apply(&Change::Record(1, record(State::Done, 0))).unwrap();
            t.apply(&Change::Record(2, record(State::Dispatched, 0))).unwrap();
            t.commit().unwrap();
        }
        let copy = replica.restore(&d.join("copy.mdb")).unwrap();
        let r = copy.read().unwrap();
        assert_eq!(r.meta_u64("total").unwrap(), Some(3));
        let states: Vec<_> = r.range(1..10).unwrap().iter().map(|(id, rec)| (*id, rec.state())).collect();
        assert_eq!(states, [(1, State::Done), (2, State::Pending), (3, State::Pending)], "every added task is there");
        let two = r.get(2).unwrap().unwrap();
        assert!(two.command().is_added());
        assert_eq!((two.shape().cores, two.cmd_len()), (2, 3));
        assert_eq!(r.added_command(2).unwrap().as_deref(), Some(&b"twon2"[..]), "its command, then its name");
        assert_eq!(r.added_command(3).unwrap().as_deref(), Some(&b"three"[..]));
        let mut waiting = Vec::new();
        r.for_each_needs(|id, _| waiting.push(id)).unwrap();
        assert_eq!(waiting, [2], "what it waits for");
        assert!(r.get(3).unwrap().unwrap().shape().rules, "it has rules");
        assert!(r.rules(3).unwrap().unwrap().stops(Outcome::Exited, 1), "and they are its own");
        assert_eq!(r.rules(2).unwrap(), None);
        drop(r);
        assert_eq!(copy.write().unwrap().keyed(b"k1").unwrap(), Some(1), "the key it was added under");
    }

    #[test]
    fn a_snapshot_that_cannot_be_written_leaves_the_journal_going() {
        let d = tempdir();
        let (live, replica) = journaled(&d);
        // Generation 2's snapshot cannot be created (a directory is in its way).
        fs::create_dir_all(d.join("ledger/snapshot.2.tmp/x")).unwrap();
        new_generation(&live);
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
                new_generation(&live);
                // A leader starts a generation once its journal has grown as large as its
                // snapshot, far less often than this; back to back, a reader on a loaded machine
                // could see every try overtaken (`restore` tries `RESTORE_TRIES` generations).
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
