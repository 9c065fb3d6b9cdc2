//! A requeued job starts again under the same id, and Slurm truncates its output file
//! (`slurm-%j.out`) on the way: what the earlier sessions printed (why they ended, what they
//! lost) would be gone. Every session of a run therefore also appends what it prints, and what
//! the processes it starts print to the same descriptors, to the run's `job.out`, after a line
//! that says which session it is.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Copies of stdout and stderr in flight; `end` puts the descriptors back.
pub struct Kept {
    /// (descriptor, its original, the copier's end-of-input signal)
    copies: Vec<(RawFd, &'static File, mpsc::Receiver<()>)>,
}

/// Points standard descriptor `fd` (stdout or stderr) at `from`'s file. The descriptor itself
/// stays inheritable (dup2 clears close-on-exec).
fn onto(fd: RawFd, from: impl AsFd) -> nix::Result<()> {
    if fd == libc::STDOUT_FILENO {
        nix::unistd::dup2_stdout(from)
    } else {
        nix::unistd::dup2_stderr(from)
    }
}

/// From here on, what this process writes to stdout and stderr goes both where it went and to
/// the end of `path`, after `header`.
pub fn keep(path: &Path, header: &str) -> io::Result<Kept> {
    let mut log = std::fs::OpenOptions::new().create(true).append(true).mode(0o644).open(path)?;
    writeln!(log, "{header}")?;
    let mut copies = Vec::new();
    for fd in [libc::STDOUT_FILENO, libc::STDERR_FILENO] {
        io::stdout().flush()?;
        // The original, close-on-exec above 2 (F_DUPFD_CLOEXEC from 3).
        let orig = if fd == libc::STDOUT_FILENO {
            io::stdout().as_fd().try_clone_to_owned()?
        } else {
            io::stderr().as_fd().try_clone_to_owned()?
        };
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        // What this process starts (the batch script, srun) writes into the copy too.
        onto(fd, &write)?;
        drop(write);
        // The duplicate of the original stays open for the process's life (`end` dup2s from it,
        // and a copier may outlive `end`).
        let orig: &'static File = Box::leak(Box::new(File::from(orig)));
        let read = File::from(read);
        let log = log.try_clone()?;
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new().name(format!("keep-fd{fd}")).spawn(move || {
            copy(read, orig, log);
            let _ = tx.send(());
        })?;
        copies.push((fd, orig, rx));
    }
    Ok(Kept { copies })
}

/// Copies until every writer closes the pipe. A log that cannot be written (a full disk) does
/// not stop the output from reaching where it went.
fn copy(mut read: File, mut out: &File, mut log: File) {
    let mut buf = [0u8; 8192];
    let mut log_ok = true;
    loop {
        let n = match read.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        let _ = out.write_all(&buf[..n]);
        log_ok = log_ok && log.write_all(&buf[..n]).is_ok();
    }
}

impl Kept {
    /// Puts stdout and stderr back and waits (briefly) for the copies to drain. A process this
    /// session started may still hold the pipe (a daemon the batch script left behind): then
    /// the copy ends with this process.
    pub fn end(self) {
        let _ = io::stdout().flush();
        let _ = io::stderr().flush();
        for (fd, orig, _) in &self.copies {
            let _ = onto(*fd, orig);
        }
        let until = Instant::now() + Duration::from_secs(2);
        for (_, _, done) in &self.copies {
            let _ = done.recv_timeout(until.saturating_duration_since(Instant::now()));
        }
    }
}
