//! A task's stdout and stderr, captured apart from every other task's: each task writes to fresh
//! anonymous files of its own, which the agent appends to its slot's stream files once the task
//! has ended. Whatever a task does with its descriptors (truncate them, reopen `/dev/stdout`,
//! seek, write after its end from a process it left behind) reaches only its own capture, never
//! the bytes of the tasks before it. The copy also yields each stream's checksum for the index.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{fcntl, FcntlArg, OFlag};

/// Where capture files are made: unnamed files (`O_TMPFILE`: gone the moment their last
/// descriptor closes, so nothing is left behind by a killed agent) in a memory file system
/// (`/dev/shm`) where there is one, else in the node-local temporary directory, else memory
/// files. A new file on a disk's file system costs a journaled inode per stream and task, which
/// took 10% of the throughput of `true` tasks on ext4 (measured, bench/RESULTS.md in git's
/// history); in memory a task's output stays in RAM only while it runs (it counts against the task's memory, as its
/// cgroup sees it), then goes to the stream files. `HTC_CAPTURE_DIR` chooses the directory.
/// Memory files (`memfd_create`) would cost less to make (4.7 against 6.3 µs a file, measured), but
/// they are always readable: a task's stdout would not be the write-only file a shell's
/// redirection gives (`tests/task_view.rs`).
#[derive(Debug, Clone)]
pub enum Scratch {
    Dir(PathBuf),
    Memory,
}

impl Scratch {
    /// The first of `$HTC_CAPTURE_DIR`, `/dev/shm`, the node-local temporary directory (`$TMPDIR`,
    /// else `/tmp`) that can hold unnamed files; else memory files.
    pub fn find() -> Scratch {
        let mut dirs: Vec<PathBuf> = std::env::var_os("HTC_CAPTURE_DIR").map(PathBuf::from).into_iter().collect();
        dirs.extend([PathBuf::from("/dev/shm"), std::env::temp_dir()]);
        for dir in dirs {
            if unnamed_in(&dir).is_ok() {
                return Scratch::Dir(dir);
            }
        }
        tracing::info!("task output is captured in memory files (no directory here holds unnamed files)");
        Scratch::Memory
    }

    /// A new empty capture file for a task to write to, in append mode as a task's output file
    /// usually is (what a task writes after truncating its own output lands at the start, not
    /// after a hole), and write-only as a shell's redirection would give it (memory files are
    /// always readable too).
    pub fn file(&self) -> io::Result<File> {
        match self {
            Scratch::Dir(d) => unnamed_in(d),
            Scratch::Memory => {
                let f = memory_file()?;
                fcntl(&f, FcntlArg::F_SETFL(OFlag::O_APPEND))?;
                Ok(f)
            }
        }
    }
}

fn unnamed_in(dir: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().append(true).custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC).mode(0o600).open(dir)
}

fn memory_file() -> io::Result<File> {
    use nix::sys::memfd::{memfd_create, MFdFlags};
    Ok(memfd_create(c"htc-task-output", MFdFlags::MFD_CLOEXEC)?.into())
}

/// One stream (stdout or stderr) of a slot: the file its next task writes to, a fresh one
/// before each task. The agent reads a capture back through /proc only when the task wrote
/// something, so a task that prints nothing costs two system calls a stream (a new file, and
/// closing the last one).
pub struct Capture {
    task: File,
}

impl Capture {
    pub fn new(scratch: &Scratch) -> io::Result<Capture> {
        Ok(Capture { task: scratch.file()? })
    }

    /// The descriptor the task writes to.
    pub fn task_fd(&self) -> std::os::fd::RawFd {
        self.task.as_raw_fd()
    }

    /// A fresh file for the next task. Where none can be made (out of descriptors, a full
    /// scratch disk), the old one is emptied instead: its bytes are in the stream already, and
    /// only a process the last task left behind could still write into it. Err(why) then, for a
    /// log line, with whether the capture is usable all the same.
    pub fn renew(&mut self, scratch: &Scratch) -> Result<(), (io::Error, bool)> {
        match scratch.file() {
            // The old file goes with its descriptor (and any the last task left behind).
            Ok(file) => {
                self.task = file;
                Ok(())
            }
            Err(e) => Err((e, self.task.set_len(0).is_ok())),
        }
    }

    /// Appends at most `cap` bytes (0: all) of what the task wrote to `stream`.
    pub fn append_to(&self, stream: &mut impl Write, cap: u64, buf: &mut Vec<u8>) -> io::Result<Appended> {
        if self.task.metadata()?.len() == 0 {
            return Ok(Appended::default());
        }
        let file = std::fs::File::open(format!("/proc/self/fd/{}", self.task.as_raw_fd()))?;
        append(&file, stream, cap, buf)
    }
}

/// What one capture added to its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Appended {
    /// Bytes the task wrote.
    pub written: u64,
    /// Bytes kept in the stream (at most the cap).
    pub kept: u64,
    /// CRC-32 of the bytes kept.
    pub crc: u32,
}

/// Appends at most `cap` bytes (0: all) of capture `from` to `stream`, a block at a time.
pub fn append(from: &File, stream: &mut impl Write, cap: u64, buf: &mut Vec<u8>) -> io::Result<Appended> {
    let written = from.metadata()?.len();
    let keep = if cap > 0 { written.min(cap) } else { written };
    let mut h = crc32fast::Hasher::new();
    let mut at = 0u64;
    while at < keep {
        buf.resize(((keep - at) as usize).min(1 << 16), 0);
        let n = from.read_at(buf, at)?;
        if n == 0 {
            break; // shrunk meanwhile (something it left behind truncated it)
        }
        h.update(&buf[..n]);
        stream.write_all(&buf[..n])?;
        at += n as u64;
    }
    Ok(Appended { written, kept: at, crc: h.finalize() })
}

/// CRC-32 of `len` bytes at `off` of `f` (`htc output`, `htc verify`).
pub fn crc_of(f: &File, mut off: u64, len: u64) -> io::Result<u32> {
    let mut h = crc32fast::Hasher::new();
    let mut buf = vec![0u8; (len as usize).min(1 << 20)];
    let end = off + len;
    while off < end {
        let n = ((end - off) as usize).min(buf.len());
        f.read_exact_at(&mut buf[..n], off)?;
        h.update(&buf[..n]);
        off += n as u64;
    }
    Ok(h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_capture_truncated_by_its_task_costs_only_its_own_bytes() {
        for scratch in [Scratch::Dir(std::env::temp_dir()), Scratch::Memory] {
            let mut stream = b"earlier task\n".to_vec();
            let mut c = Capture::new(&scratch).unwrap();
            c.renew(&scratch).map_err(|(e, _)| e).unwrap();
            let task = &c.task;
            (&*task).write_all(b"lost\n").unwrap();
            task.set_len(0).unwrap(); // the task truncates its stdout, and writes on
            (&*task).write_all(b"x\n").unwrap();
            let a = c.append_to(&mut stream, 0, &mut Vec::new()).unwrap();
            assert_eq!(stream, b"earlier task\nx\n");
            assert_eq!(a, Appended { written: 2, kept: 2, crc: crc32fast::hash(b"x\n") });
            // The next task starts from an empty capture; nothing written, nothing appended.
            c.renew(&scratch).map_err(|(e, _)| e).unwrap();
            assert_eq!(c.task.metadata().unwrap().len(), 0);
            assert_eq!(c.append_to(&mut stream, 0, &mut Vec::new()).unwrap(), Appended::default());
            // A process the last task left behind still holds its file: what it writes now is
            // nobody's output.
            let straggler = c.task.try_clone().unwrap();
            let before = c.task.metadata().unwrap().ino();
            c.renew(&scratch).map_err(|(e, _)| e).unwrap();
            (&straggler).write_all(b"late\n").unwrap();
            assert_ne!(c.task.metadata().unwrap().ino(), before, "a fresh file");
            assert_eq!(c.task.metadata().unwrap().len(), 0);
        }
        // In a directory, the task's descriptor is write-only, as a redirection's.
        {
            let c = Capture::new(&Scratch::Dir(std::env::temp_dir())).unwrap();
            let flags = OFlag::from_bits_retain(fcntl(&c.task, FcntlArg::F_GETFL).unwrap());
            assert_eq!(flags & OFlag::O_ACCMODE, OFlag::O_WRONLY);
        }
    }

    #[test]
    fn a_cap_keeps_the_first_bytes() {
        let scratch = Scratch::Memory;
        let f = scratch.file().unwrap();
        (&f).write_all(b"0123456789").unwrap();
        let mut out = Vec::new();
        let a = append(&f, &mut out, 4, &mut Vec::new()).unwrap();
        assert_eq!((out.as_slice(), a.written, a.kept), (&b"0123"[..], 10, 4));
        assert_eq!(crc_of(&f, 0, 4).unwrap(), a.crc);
    }
}
