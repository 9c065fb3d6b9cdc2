//! Task output: a few stream files per agent (one stdout and one stderr per slot) plus an index of
//! fixed 64-byte records `(task, attempt, slot, out_off, out_len, err_off, err_len, start_us,
//! out_crc, err_crc)`. Millions of small files would hurt a parallel filesystem; this keeps it at
//! 2 files per core. The attempt's start time ties an entry to the attempt the ledger recorded
//! (a killed session and its resume can both leave an entry for the same attempt number), and
//! the checksums let `htc output` and `htc verify` catch damaged bytes.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::Path;

pub use htc_core::output::OutputMode;

pub const INDEX_ENTRY_LEN: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    pub id: u64,
    pub attempt: u32,
    pub slot: u32,
    pub out_off: u64,
    pub out_len: u64,
    pub err_off: u64,
    pub err_len: u64,
    /// When the attempt started, as reported to the leader (the ledger's `start_us`).
    pub start_us: u64,
    pub out_crc: u32,
    pub err_crc: u32,
}

impl IndexEntry {
    pub fn encode(&self) -> [u8; INDEX_ENTRY_LEN] {
        let mut b = [0u8; INDEX_ENTRY_LEN];
        b[0..8].copy_from_slice(&self.id.to_le_bytes());
        b[8..12].copy_from_slice(&self.attempt.to_le_bytes());
        b[12..16].copy_from_slice(&self.slot.to_le_bytes());
        b[16..24].copy_from_slice(&self.out_off.to_le_bytes());
        b[24..32].copy_from_slice(&self.out_len.to_le_bytes());
        b[32..40].copy_from_slice(&self.err_off.to_le_bytes());
        b[40..48].copy_from_slice(&self.err_len.to_le_bytes());
        b[48..56].copy_from_slice(&self.start_us.to_le_bytes());
        b[56..60].copy_from_slice(&self.out_crc.to_le_bytes());
        b[60..64].copy_from_slice(&self.err_crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> IndexEntry {
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        IndexEntry {
            id: u64_at(0),
            attempt: u32_at(8),
            slot: u32_at(12),
            out_off: u64_at(16),
            out_len: u64_at(24),
            err_off: u64_at(32),
            err_len: u64_at(40),
            start_us: u64_at(48),
            out_crc: u32_at(56),
            err_crc: u32_at(60),
        }
    }

    /// Whether this entry is of the attempt a ledger record holds: same attempt number and start.
    pub fn is_of(&self, attempt: u32, start_us: u64) -> bool {
        self.attempt == attempt && self.start_us == start_us
    }
}

/// Opens an output index for appending. A record cut short (a full disk, a crash mid-write) is
/// dropped first: appending after it would shift every later record and make their output
/// unreadable. Its task's end was never reported, so the task runs again anyway.
pub fn open_index(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new().append(true).create(true).custom_flags(libc::O_CLOEXEC).open(path)?;
    let len = f.metadata()?.len();
    let torn = len % INDEX_ENTRY_LEN as u64;
    if torn != 0 {
        tracing::warn!(index = %path.display(), bytes = torn, "dropping a torn output-index record");
        f.set_len(len - torn)?;
    }
    Ok(f)
}

/// The output index files in an agent's output directory, by spawner: `index`, `index.1`, ….
/// A spawner makes its index with its first task's output, so some numbers may be missing.
pub fn index_files(dir: &Path) -> io::Result<Vec<std::path::PathBuf>> {
    let mut found = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let name = e?.file_name();
        let n = match name.to_str() {
            Some("index") => 0,
            Some(n) => match n.strip_prefix("index.").and_then(|k| k.parse::<usize>().ok()) {
                Some(k) if k > 0 => k,
                _ => continue,
            },
            None => continue,
        };
        found.push((n, dir.join(name)));
    }
    found.sort();
    Ok(found.into_iter().map(|(_, p)| p).collect())
}

pub fn read_index(path: &Path) -> io::Result<Vec<IndexEntry>> {
    let mut b = Vec::new();
    File::open(path)?.read_to_end(&mut b)?;
    Ok(b.chunks_exact(INDEX_ENTRY_LEN).map(IndexEntry::decode).collect())
}

/// Finds the newest index entry of `id` that `want` accepts by scanning the index from its end in
/// large blocks: the newest runs are where `htc output` is usually pointed.
pub fn find_entry(index: &Path, id: u64, want: impl Fn(&IndexEntry) -> bool) -> io::Result<Option<IndexEntry>> {
    let mut f = File::open(index)?;
    let len = f.seek(SeekFrom::End(0))? / INDEX_ENTRY_LEN as u64 * INDEX_ENTRY_LEN as u64;
    const BLOCK: u64 = (1 << 20) / INDEX_ENTRY_LEN as u64 * INDEX_ENTRY_LEN as u64;
    let mut end = len;
    let mut buf = vec![0u8; BLOCK as usize];
    while end > 0 {
        let start = end.saturating_sub(BLOCK);
        let n = (end - start) as usize;
        f.read_exact_at(&mut buf[..n], start)?;
        for chunk in buf[..n].chunks_exact(INDEX_ENTRY_LEN).rev() {
            let e = IndexEntry::decode(chunk);
            if e.id == id && want(&e) {
                return Ok(Some(e));
            }
        }
        end = start;
    }
    Ok(None)
}

/// The file in which a spawner notes the outputs it cut (`max_output=`), in its output directory.
pub fn cuts_name(agent: u32, spawner: usize) -> String {
    format!("cuts.{agent}.{spawner}")
}

/// The file in which a spawner notes the GPUs it gave each attempt (`gpus=`).
pub fn devices_name(agent: u32, spawner: usize) -> String {
    format!("devices.{agent}.{spawner}")
}

/// Every attempt's devices noted in `dir`: (task, attempt) -> "0,1".
pub fn read_devices(dir: &Path) -> io::Result<std::collections::HashMap<(u64, u32), String>> {
    let mut out = std::collections::HashMap::new();
    for_lines(dir, "devices.", |l| {
        let mut f = l.splitn(3, '\t');
        let (Some(id), Some(attempt), Some(ids)) = (f.next(), f.next(), f.next()) else { return };
        if let (Ok(id), Ok(attempt)) = (id.parse(), attempt.parse()) {
            out.insert((id, attempt), ids.to_string());
        }
    })?;
    Ok(out)
}

/// Feeds `f` every line of the files in `dir` whose names start with `prefix` (one per spawn
/// loop); a missing directory has none.
fn for_lines(dir: &Path, prefix: &str, mut f: impl FnMut(&str)) -> io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for e in entries {
        let e = e?;
        if e.file_name().to_string_lossy().starts_with(prefix) {
            std::fs::read_to_string(e.path())?.lines().for_each(&mut f);
        }
    }
    Ok(())
}

/// A task output cut at its `max_output=`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cut {
    pub id: u64,
    pub attempt: u32,
    pub stream: String,
    pub written: u64,
    pub kept: u64,
}

/// Every cut noted in `dir` (any agent's, any spawner's), by (task, attempt, stream).
pub fn read_cuts(dir: &Path) -> io::Result<Vec<Cut>> {
    let mut cuts = Vec::new();
    for_lines(dir, "cuts.", |l| {
        let f: Vec<&str> = l.split('\t').collect();
        let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
        if let (Some(id), Some(attempt), Some(stream), Some(written), Some(kept)) = (n(0), n(1), f.get(2), n(3), n(4)) {
            cuts.push(Cut { id, attempt: attempt as u32, stream: stream.to_string(), written, kept });
        }
    })?;
    cuts.sort_by(|a, b| (a.id, a.attempt, &a.stream).cmp(&(b.id, b.attempt, &b.stream)));
    Ok(cuts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_torn_last_record_is_dropped_before_appending_so_later_records_stay_aligned() {
        let path = std::env::temp_dir().join(format!("htc-index-torn-{}", std::process::id()));
        let rec = |id| IndexEntry {
            id,
            attempt: 1,
            slot: 0,
            out_off: id * 10,
            out_len: 10,
            err_off: 0,
            err_len: 0,
            start_us: id,
            out_crc: 7,
            err_crc: 0,
        };
        let mut bytes = [rec(1).encode(), rec(2).encode()].concat();
        bytes.extend_from_slice(&rec(3).encode()[..20]); // cut short by a full disk
        std::fs::write(&path, &bytes).unwrap();
        open_index(&path).unwrap().write_all(&rec(4).encode()).unwrap();
        let ids: Vec<u64> = read_index(&path).unwrap().iter().map(|e| e.id).collect();
        assert_eq!(ids, [1, 2, 4]);
        assert_eq!(find_entry(&path, 4, |_| true).unwrap(), Some(rec(4)));
        assert_eq!(find_entry(&path, 2, |e| e.is_of(1, 2)).unwrap(), Some(rec(2)));
        assert_eq!(find_entry(&path, 2, |e| e.is_of(1, 3)).unwrap(), None);
        std::fs::remove_file(&path).unwrap();
    }
}
