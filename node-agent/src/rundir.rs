//! Where one run keeps its files: `<base>/.htc/<run-id>/` with the ledger, a copy of the task
//! file (the ledger's records point into it), the job secret and the output streams.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

pub const SECRET_LEN: usize = 32;

#[derive(Debug, Clone)]
pub struct RunDir {
    pub path: PathBuf,
}

impl RunDir {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        RunDir { path: path.into() }
    }

    /// Creates a fresh run directory (0700: it holds the secret) under `base/.htc/`.
    pub fn create(base: &Path, id: &str) -> io::Result<RunDir> {
        let path = base.join(".htc").join(id);
        fs::DirBuilder::new().recursive(true).mode(0o700).create(path.parent().unwrap())?;
        fs::DirBuilder::new().mode(0o700).create(&path)?;
        fs::DirBuilder::new().mode(0o700).create(path.join("out"))?;
        Ok(RunDir { path })
    }

    /// Finds a run by directory path, by id under `./.htc/`, or (no argument) the newest run there.
    pub fn locate(arg: Option<&str>) -> io::Result<RunDir> {
        let runs = Path::new(".htc");
        let path = match arg {
            Some(a) if Path::new(a).join("ledger.mdb").exists() => PathBuf::from(a),
            Some(a) if runs.join(a).join("ledger.mdb").exists() => runs.join(a),
            Some(a) => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("no run '{a}' (looked for {a}/ledger.mdb and .htc/{a}/ledger.mdb)"),
                ))
            }
            None => {
                let mut best: Option<(std::time::SystemTime, PathBuf)> = None;
                for e in
                    fs::read_dir(runs).map_err(|e| io::Error::new(e.kind(), format!("no runs here (.htc/: {e})")))?
                {
                    let e = e?;
                    if !e.path().join("ledger.mdb").exists() {
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
        Ok(RunDir { path })
    }

    pub fn id(&self) -> String {
        self.path.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
    }
    pub fn ledger(&self) -> PathBuf {
        self.path.join("ledger.mdb")
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
    pub fn lock(&self) -> io::Result<fs::File> {
        use std::os::fd::AsRawFd;
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(self.path.join("leader.lock"))?;
        // SAFETY: flock on an fd we own.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = io::Error::last_os_error();
            return Err(if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!("{} is in use by a running leader", self.path.display()),
                )
            } else {
                e
            });
        }
        Ok(f)
    }

    /// Writes a new random secret, readable only by the owner.
    pub fn write_secret(&self) -> io::Result<Vec<u8>> {
        let mut s = vec![0u8; SECRET_LEN];
        fs::File::open("/dev/urandom")?.read_exact(&mut s)?;
        let mut f = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(self.secret())?;
        f.write_all(&s)?;
        Ok(s)
    }

    pub fn read_secret(&self) -> io::Result<Vec<u8>> {
        let s = fs::read(self.secret())?;
        if s.len() != SECRET_LEN {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "job secret has the wrong length"));
        }
        Ok(s)
    }
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

pub fn now_us() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_779), (2026, 11, 22));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }
}
