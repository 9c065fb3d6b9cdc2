//! The replica's file format and the journal a ledger writes to (`replica` says what they are
//! for). At the bottom of the store: the ledger appends to the journal and the replica reads and
//! writes the same frames, so both use this and it uses neither.
//!
//! Both files are sequences of frames `[len u32][crc32 u32][op db klen key value]`, so a torn
//! tail (the leader died mid-write) is told from damage (a bad frame with more after it). The
//! first frame is a header with the generation; a snapshot ends with an end frame.

use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The ledger's databases, as frames name them.
pub const DB_TASKS: u8 = 0;
pub const DB_META: u8 = 1;
pub const DB_ATTEMPTS: u8 = 2;
pub const DB_FAILED: u8 = 3;
/// What tasks wait for, the commands of tasks added while a run runs, and the keys they were
/// added under (schema 4 on).
pub const DB_NEEDS: u8 = 4;
pub const DB_COMMANDS: u8 = 5;
pub const DB_KEYS: u8 = 6;
/// Tasks' rules for their attempts (schema 5 on).
pub const DB_RULES: u8 = 7;

pub const OP_PUT: u8 = 1;
const OP_DEL: u8 = 2;
const OP_HEADER: u8 = 3;
pub const OP_END: u8 = 4;
const MAGIC: &[u8] = b"htc-replica-1";
/// No frame is larger (keys are short, values at most a task record or a meta value).
const MAX_FRAME: u32 = 1 << 20;
/// Meta keys rewritten at every commit: the journal takes them at most this often.
const PERIODIC_META: [&str; 5] = ["counts", "heartbeat_us", "leader_cpu_us", "reports", "result_delays"];
const META_EVERY: Duration = Duration::from_secs(1);
/// A journal this much larger than its snapshot (or than this floor) starts a new generation.
const JOURNAL_FLOOR: u64 = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("{path} is damaged at byte {at}: {why}")]
    Damaged { path: String, at: u64, why: String },
}

type Result<T> = std::result::Result<T, JournalError>;

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> JournalError + '_ {
    move |source| JournalError::Io { path: path.display().to_string(), source }
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
pub fn read_frames<E: From<JournalError>>(
    path: &Path,
    f: impl FnMut(Entry) -> std::result::Result<(), E>,
) -> std::result::Result<(u64, Tail), E> {
    let file = File::open(path).map_err(io_err(path))?;
    let len = file.metadata().map_err(io_err(path))?.len();
    decode_frames(BufReader::with_capacity(1 << 20, file), len, path, f)
}

/// Decodes `len` bytes of frames from `r` (named `path` in errors). A bad frame with more bytes
/// after it is damage, not a tear.
pub fn decode_frames<E: From<JournalError>>(
    mut r: impl Read,
    len: u64,
    path: &Path,
    mut f: impl FnMut(Entry) -> std::result::Result<(), E>,
) -> std::result::Result<(u64, Tail), E> {
    let damaged =
        |at: u64, why: &str| E::from(JournalError::Damaged { path: path.display().to_string(), at, why: why.into() });
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
        if 4 + klen > payload.len() || db > DB_RULES {
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

/// Creates the journal file at `path` (0600) with generation `gen`'s header, flushed.
fn create_file(path: &Path, gen: u64) -> Result<File> {
    let mut f =
        OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path).map_err(io_err(path))?;
    f.write_all(&header(gen)).and_then(|()| f.sync_data()).map_err(io_err(path))?;
    Ok(f)
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
    /// A new, empty journal of generation `gen` at `path` (replacing any file there), its header
    /// on disk; `snapshot_bytes` the size of the snapshot it follows.
    pub fn create(path: PathBuf, gen: u64, snapshot_bytes: u64) -> Result<Journal> {
        let file = create_file(&path, gen)?;
        Ok(Journal { file, path, gen, bytes: 0, snapshot_bytes, meta_at: None, meta: Vec::new() })
    }

    /// The journal of generation `gen` at `path`, to append to (a writer after the leader's
    /// session, e.g. the resubmission count); created if it is not there.
    pub fn open_append(path: PathBuf, gen: u64, snapshot_bytes: u64) -> Result<Journal> {
        let file = match OpenOptions::new().append(true).open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => create_file(&path, gen)?,
            Err(e) => return Err(io_err(&path)(e)),
        };
        // A torn last write (its writer died) is cut off first: frames after it would make it
        // look like damage.
        let mut whole = header(gen).len() as u64;
        let (_, tail) = read_frames(&path, |e| {
            whole += 12 + (e.key.len() + e.val.len()) as u64;
            Ok::<_, JournalError>(())
        })?;
        if tail == Tail::Torn {
            file.set_len(whole).map_err(io_err(&path))?;
        }
        let bytes = file.metadata().map_err(io_err(&path))?.len();
        Ok(Journal { file, path, gen, bytes, snapshot_bytes, meta_at: None, meta: Vec::new() })
    }

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
    use std::fs;

    use super::*;

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
                Ok::<_, JournalError>(())
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
        let e = read_frames(&p, |_| Ok::<_, JournalError>(())).unwrap_err().to_string();
        assert!(e.contains("damaged at byte") && e.contains("checksum"), "{e}");
        fs::write(&p, b"not a replica at all").unwrap();
        assert!(read_frames(&p, |_| Ok::<_, JournalError>(())).is_err());
    }

    fn tempdir() -> PathBuf {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let d = std::env::temp_dir().join(format!("htc-journal-test-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }
}
