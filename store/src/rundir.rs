//! Where one run keeps its files: `<base>/.htc/<run-id>/` with the ledger, a copy of the task
//! file (the ledger's records point into it), the job secret and the output streams.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

pub const SECRET_LEN: usize = 32;

/// The run's leader lock (`RunDir::lock`): its open `leader.lock`, locked until dropped.
pub type RunLock = nix::fcntl::Flock<fs::File>;

#[derive(Debug, Clone)]
pub struct RunDir {
    pub path: PathBuf,
    /// The ledger: in the run directory, or (a Slurm job's) on the leader's node-local disk, with
    /// a replica in the run directory (`replica`).
    ledger: PathBuf,
    /// A copy of the ledger restored from the replica for reading, removed with the last clone.
    _restored: Option<std::sync::Arc<Restored>>,
}

/// A ledger file rebuilt in this host's temporary directory; removed when dropped.
#[derive(Debug)]
struct Restored(PathBuf);

impl Drop for Restored {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
        let _ = fs::remove_file(crate::replica::lock_path(&self.0));
        // The scratch directory too, unless another reader's copy is in it: nothing is left in
        // the temporary directory after a read.
        if let Some(dir) = self.0.parent() {
            let _ = fs::remove_dir(dir);
        }
    }
}

/// Whether `path`, or a directory on the way to it, exists but may not be read by this user.
fn denied(path: &Path) -> bool {
    let kind = |r: io::Result<()>| r.err().map(|e| e.kind());
    kind(fs::metadata(path).map(drop)) == Some(io::ErrorKind::PermissionDenied)
        || (path.is_dir() && kind(fs::read_dir(path).map(drop)) == Some(io::ErrorKind::PermissionDenied))
}

/// The suffix of the hidden name a run has while `RunDir::create` makes it.
const MAKING: &str = ".new";

/// Where the run at `path` is made (`RunDir::create`).
fn making(path: &Path) -> PathBuf {
    let id = path.file_name().unwrap_or_default().to_string_lossy();
    path.with_file_name(format!(".{id}{MAKING}"))
}

/// Whether `dir` holds a run: its ledger, or a replica of one kept elsewhere.
fn is_run(dir: &Path) -> bool {
    dir.join("ledger.mdb").exists() || crate::replica::Replica::of(dir).exists()
}

impl RunDir {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        RunDir { ledger: path.join("ledger.mdb"), path, _restored: None }
    }

    /// The same run with its ledger at `ledger` (a node-local path).
    pub fn with_ledger(mut self, ledger: PathBuf) -> Self {
        self.ledger = ledger;
        self
    }

    /// Takes over a run whose leader is gone: with a replica, its ledger rebuilt from it at `local`
    /// on this node's disk (the old one went with its node, or is behind the journal); a run whose
    /// ledger is in its directory (a local run, or a Slurm run from before) is taken as it is.
    pub fn take_over(self, local: &Path) -> Result<RunDir, crate::replica::ReplicaError> {
        if self.ledger().exists() {
            return Ok(self);
        }
        crate::replica::Replica::of(&self.path).restore(local)?;
        Ok(self.with_ledger(local.to_path_buf()))
    }

    /// Whether the ledger lives outside the run directory, which then holds its replica.
    pub fn replicated(&self) -> bool {
        self.ledger != self.path.join("ledger.mdb")
    }

    /// The run at `path`, with a ledger to read: its own, the live node-local one when this is
    /// the leader's host, or else a copy rebuilt from the replica (any host that sees the run).
    pub fn open_for_reading(path: PathBuf) -> io::Result<RunDir> {
        let run = RunDir::new(path);
        let replica = crate::replica::Replica::of(&run.path);
        if run.ledger.exists() || !replica.exists() {
            return Ok(run);
        }
        if let Some(live) = replica.local_ledger() {
            return Ok(run.with_ledger(live));
        }
        let dir = std::env::temp_dir().join(format!("htc-{}", nix::unistd::getuid()));
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let copy = dir.join(format!("{}-{}-{n}.mdb", run.id(), std::process::id()));
        let restored = Restored(copy.clone());
        // Another reader that ends removes the scratch directory once it is empty, which may be
        // just after this one made it: then it is made again.
        let mut tries = 0;
        loop {
            crate::replica::private_dir(&dir).map_err(io::Error::other)?;
            match replica.restore(&copy) {
                Ok(_) => break,
                Err(_) if tries == 0 && !dir.exists() => tries += 1,
                Err(e) => return Err(io::Error::other(format!("reading the run's ledger replica: {e}"))),
            }
        }
        Ok(RunDir { _restored: Some(std::sync::Arc::new(restored)), ..run.with_ledger(copy) })
    }

    /// Creates a fresh run directory (0700: it holds the secret) for `base/.htc/id`: under a
    /// hidden name, `.htc/.id.new`, until `publish` gives it its own, so that a reader (`htc
    /// status`, a script that lists `.htc/`) never finds a run whose ledger is still loading.
    /// One left by a process killed while making it is made afresh (ids are not reused while a
    /// run of that id is being made).
    pub fn create(base: &Path, id: &str) -> io::Result<RunDir> {
        let path = base.join(".htc").join(id);
        if path.exists() {
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, format!("{} exists", path.display())));
        }
        fs::DirBuilder::new().recursive(true).mode(0o700).create(path.parent().unwrap())?;
        let making = making(&path);
        if making.exists() {
            fs::remove_dir_all(&making)?;
        }
        fs::DirBuilder::new().mode(0o700).create(&making)?;
        fs::DirBuilder::new().mode(0o700).create(making.join("out"))?;
        Ok(RunDir::new(making))
    }

    /// A run `create` made, renamed to its own name once whole: its ledger and files appear
    /// together. Its ledger must be closed (a node-local one stays where it is). Refused when a
    /// run of that name appeared meanwhile.
    pub fn publish(self) -> io::Result<RunDir> {
        let name = self.path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let id = name.strip_prefix('.').and_then(|n| n.strip_suffix(MAKING)).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("{} is not a run being made", self.path.display()))
        })?;
        let path = self.path.with_file_name(id);
        use nix::fcntl::{renameat2, RenameFlags, AT_FDCWD};
        renameat2(AT_FDCWD, &self.path, AT_FDCWD, &path, RenameFlags::RENAME_NOREPLACE).map_err(io::Error::from)?;
        let ledger = if self.replicated() { self.ledger } else { path.join("ledger.mdb") };
        Ok(RunDir::new(path).with_ledger(ledger))
    }

    /// Finds a run by directory path, by id under `./.htc/`, or (no argument) the newest run
    /// there, with a ledger to read (`open_for_reading`).
    pub fn locate(arg: Option<&str>) -> io::Result<RunDir> {
        RunDir::open_for_reading(RunDir::find(arg)?)
    }

    /// The directory `locate` finds, its ledger not opened.
    ///
    /// A run directory another user made cannot be read (0700, as `create` makes it): that is
    /// said as such, not as a run that does not exist.
    pub fn find(arg: Option<&str>) -> io::Result<PathBuf> {
        let runs = Path::new(".htc");
        let path = match arg {
            Some(a) if is_run(Path::new(a)) => PathBuf::from(a),
            Some(a) if is_run(&runs.join(a)) => runs.join(a),
            Some(a) if denied(Path::new(a)) || denied(&runs.join(a)) => {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("'{a}': permission denied: the run is another user's (its directory is theirs alone)"),
                ))
            }
            Some(a) => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("no run '{a}' (looked for a ledger.mdb or ledger/ in {a}/ and .htc/{a}/)"),
                ))
            }
            None => {
                let mut best: Option<(std::time::SystemTime, PathBuf)> = None;
                for e in
                    fs::read_dir(runs).map_err(|e| io::Error::new(e.kind(), format!("no runs here (.htc/: {e})")))?
                {
                    let e = e?;
                    if !is_run(&e.path()) {
                        continue;
                    }
                    let t = e.metadata()?.modified()?;
                    if best.as_ref().is_none_or(|(bt, _)| t > *bt) {
                        best = Some((t, e.path()));
                    }
                }
                best.map(|(_, p)| p).ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no runs in .htc/"))?
            }
        };
        Ok(path)
    }

    pub fn id(&self) -> String {
        self.path.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
    }

    /// Every id the run is known by: its own (the first job's), and those of the jobs that
    /// continued it (`htc resume`), each a link beside it naming it.
    pub fn job_ids(&self) -> Vec<String> {
        let own = self.id();
        let mut ids = vec![own.clone()];
        let Some(Ok(entries)) = self.path.parent().map(fs::read_dir) else { return ids };
        for e in entries.flatten() {
            let link = fs::read_link(e.path());
            if link.is_ok_and(|l| l.as_os_str() == own.as_str()) {
                ids.push(e.file_name().to_string_lossy().into_owned());
            }
        }
        ids.sort();
        ids
    }
    pub fn ledger(&self) -> PathBuf {
        self.ledger.clone()
    }
    pub fn tasks(&self) -> PathBuf {
        self.path.join("tasks.txt")
    }
    pub fn secret(&self) -> PathBuf {
        self.path.join("secret")
    }
    pub fn out(&self) -> PathBuf {
        self.path.join("out")
    }
    pub fn agent_out(&self, agent: u32) -> PathBuf {
        self.out().join(format!("agent-{agent}"))
    }

    /// Takes the run's leader lock: one leader per run, so a second `htc run --resume` (or a
    /// requeued job whose first incarnation still runs) cannot dispatch the same tasks twice.
    /// Held until the returned file is dropped (or the process dies).
    pub fn lock(&self) -> io::Result<RunLock> {
        use nix::fcntl::{Flock, FlockArg};
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(self.path.join("leader.lock"))?;
        Flock::lock(f, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| {
            if e == nix::errno::Errno::EWOULDBLOCK {
                io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!("{} is in use by a running leader", self.path.display()),
                )
            } else {
                e.into()
            }
        })
    }

    /// Writes a new random secret, readable only by the owner.
    pub fn write_secret(&self) -> io::Result<Vec<u8>> {
        let mut s = vec![0u8; SECRET_LEN];
        fs::File::open("/dev/urandom")?.read_exact(&mut s)?;
        let mut f = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(self.secret())?;
        f.write_all(&s)?;
        Ok(s)
    }

    /// Where a joining allocation finds the running leader (`publish_leader`).
    pub fn leader_file(&self) -> PathBuf {
        self.path.join("leader.addr")
    }

    /// Says where the running leader listens, for allocations that join the run; written whole
    /// (a rename), readable only by the run's owner as the directory is.
    pub fn publish_leader(&self, at: &LeaderAt) -> io::Result<()> {
        let tmp = self.path.join(".leader.addr.tmp");
        let text = format!("addr={}\njob={}\ncluster={}\n", at.addr, at.job, at.cluster);
        fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&tmp)?
            .write_all(text.as_bytes())?;
        fs::rename(tmp, self.leader_file())
    }

    /// The leader's session ended: nobody may join any more.
    pub fn unpublish_leader(&self) {
        let _ = fs::remove_file(self.leader_file());
    }

    /// Where the running leader listens; `None` when no session runs (or ran to its end).
    pub fn leader_at(&self) -> io::Result<Option<LeaderAt>> {
        let text = match fs::read_to_string(self.leader_file()) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let field = |name: &str| text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix('=')).map(str::to_string);
        let bad = || {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: not a leader address", self.leader_file().display()),
            )
        };
        let addr = field("addr").and_then(|a| a.parse().ok()).ok_or_else(bad)?;
        Ok(Some(LeaderAt {
            addr,
            job: field("job").unwrap_or_default(),
            cluster: field("cluster").unwrap_or_default(),
        }))
    }

    pub fn read_secret(&self) -> io::Result<Vec<u8>> {
        let s = fs::read(self.secret())?;
        if s.len() != SECRET_LEN {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "job secret has the wrong length"));
        }
        Ok(s)
    }
}

/// Where a running leader listens, and for which job and cluster (`RunDir::publish_leader`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderAt {
    pub addr: std::net::SocketAddr,
    pub job: String,
    /// The Slurm cluster's name; "" for a local run.
    pub cluster: String,
}

/// A sortable local run id: `YYYYMMDD-HHMMSS-PID` (UTC).
pub fn new_run_id() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let s = secs % 86_400;
    format!("{y:04}{m:02}{d:02}-{:02}{:02}{:02}-{}", s / 3600, s / 60 % 60, s % 60, std::process::id())
}

/// Days since 1970-01-01 to (year, month, day), Howard Hinnant's algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + (m <= 2) as i64, m, d)
}

pub use htc_host::now_us;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_779), (2026, 11, 22));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }

    #[test]
    fn a_run_is_found_only_once_published_and_never_over_another() {
        let base = std::env::temp_dir().join(format!("htc-rundir-publish-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        // A process killed while making run 7 left its hidden directory: made afresh.
        fs::create_dir_all(base.join(".htc/.7.new/out")).unwrap();
        fs::write(base.join(".htc/.7.new/stale"), b"x").unwrap();
        let run = RunDir::create(&base, "7").unwrap();
        assert!(!run.path.join("stale").exists());
        fs::write(run.ledger(), b"a ledger").unwrap();
        let seen = || fs::read_dir(base.join(".htc")).unwrap().flatten().filter(|e| is_run(&e.path())).count();
        let at = base.join(".htc/7").to_string_lossy().into_owned();
        assert!(RunDir::find(Some(&at)).is_err(), "not found while being made");
        let run = run.publish().unwrap();
        assert_eq!(run.path, base.join(".htc/7"));
        assert_eq!(run.ledger(), base.join(".htc/7/ledger.mdb"));
        assert_eq!(fs::read(run.ledger()).unwrap(), b"a ledger");
        assert_eq!(RunDir::find(Some(&at)).unwrap(), base.join(".htc/7"));
        assert_eq!(seen(), 1);
        assert_eq!(RunDir::create(&base, "7").unwrap_err().kind(), io::ErrorKind::AlreadyExists);
        // One of the same name that appeared meanwhile (even empty) is not replaced.
        let other = RunDir::create(&base, "8").unwrap();
        fs::create_dir(base.join(".htc/8")).unwrap();
        assert!(other.clone().publish().is_err());
        assert!(other.path.exists());
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_run_is_known_by_its_own_id_and_its_continuations_links() {
        let runs = std::env::temp_dir().join(format!("htc-rundir-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&runs);
        fs::create_dir_all(runs.join("11")).unwrap();
        fs::create_dir_all(runs.join("12")).unwrap();
        std::os::unix::fs::symlink("11", runs.join("13")).unwrap();
        std::os::unix::fs::symlink("12", runs.join("14")).unwrap();
        assert_eq!(RunDir::new(runs.join("11")).job_ids(), ["11", "13"]);
        let _ = fs::remove_dir_all(&runs);
    }
}
