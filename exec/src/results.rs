//! The results journal: every start and end a spawn loop tells its leader, appended to a file in
//! the agent's output directory before the report that carries it leaves. The ledger stays the
//! truth; this is what the next session reads when a leader died between a report and its commit
//! (`htc_core::salvage`), so that a result reported is not lost with the leader, and a task that
//! was running then runs again as a new attempt.
//!
//! Fixed 40-byte entries `(task, attempt, kind, outcome, value, crc, start_us, end_us)`, one file
//! per spawn loop (`results`, `results.1`, …), never rewritten: a torn last entry (a crash
//! mid-write) is dropped before appending, and an entry whose checksum fails is not believed (its
//! task then runs again, as it would have without the journal).

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use htc_core::record::Outcome;
use htc_core::salvage::Told;
use htc_core::work::ExecEvent;

pub const ENTRY_LEN: usize = 40;
const STARTED: u8 = 1;
const ENDED: u8 = 2;

/// `results` for the first spawner, `results.N` for the others.
pub fn file_name(spawner: usize) -> String {
    if spawner == 0 {
        "results".into()
    } else {
        format!("results.{spawner}")
    }
}

fn encode(
    id: u64,
    attempt: u32,
    kind: u8,
    outcome: Outcome,
    value: i32,
    start_us: u64,
    end_us: u64,
) -> [u8; ENTRY_LEN] {
    let mut b = [0u8; ENTRY_LEN];
    b[0..8].copy_from_slice(&id.to_le_bytes());
    b[8..12].copy_from_slice(&attempt.to_le_bytes());
    b[12] = kind;
    b[13] = outcome as u8;
    b[16..20].copy_from_slice(&value.to_le_bytes());
    b[24..32].copy_from_slice(&start_us.to_le_bytes());
    b[32..40].copy_from_slice(&end_us.to_le_bytes());
    let crc = checksum(&b);
    b[20..24].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Over every byte but the checksum's own.
fn checksum(b: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&b[..20]);
    h.update(&b[24..ENTRY_LEN]);
    h.finalize()
}

/// An entry as `agent` wrote it; `None` when its checksum or its kind is wrong.
pub fn decode(agent: u32, b: &[u8]) -> Option<Told> {
    if b.len() != ENTRY_LEN || u32::from_le_bytes(b[20..24].try_into().ok()?) != checksum(b) {
        return None;
    }
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    let (id, start_us, end_us) = (u64_at(0), u64_at(24), u64_at(32));
    let attempt = u32::from_le_bytes(b[8..12].try_into().ok()?);
    let value = i32::from_le_bytes(b[16..20].try_into().ok()?);
    let end = match b[12] {
        STARTED => None,
        ENDED => Some((Outcome::from_u8(b[13]), value, end_us)),
        _ => return None,
    };
    Some(Told { agent, id, attempt, start_us, end })
}

/// One spawn loop's journal, opened with its first entry.
pub struct Journal {
    path: PathBuf,
    file: Option<File>,
    buf: Vec<u8>,
}

impl Journal {
    pub fn new(path: PathBuf) -> Journal {
        Journal { path, file: None, buf: Vec::new() }
    }

    /// Notes the starts and ends among `events` (`keep` says which ends count: an end the loop
    /// caused itself by aborting is no result).
    pub fn note<'a>(&mut self, events: impl IntoIterator<Item = &'a ExecEvent>, keep: impl Fn(u64, u32) -> bool) {
        for e in events {
            let b = match *e {
                ExecEvent::Started { id, attempt, start_us } => {
                    encode(id, attempt, STARTED, Outcome::None, 0, start_us, 0)
                }
                ExecEvent::Finished(f) if keep(f.id, f.attempt) => {
                    encode(f.id, f.attempt, ENDED, f.ended.outcome, f.ended.value, f.ended.start_us, f.ended.end_us)
                }
                _ => continue,
            };
            self.buf.extend_from_slice(&b);
        }
    }

    /// Writes what was noted, in one write: before the report that tells it leaves.
    pub fn write(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        if self.file.is_none() {
            self.file = Some(open(&self.path)?);
        }
        let f = self.file.as_mut().expect("opened above");
        let r = f.write_all(&self.buf);
        self.buf.clear();
        r.map_err(|e| io::Error::new(e.kind(), format!("writing the results journal {}: {e}", self.path.display())))
    }
}

/// Opens a journal for appending, dropping a torn last entry first: appending after it would
/// shift every later entry.
fn open(path: &Path) -> io::Result<File> {
    let f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| io::Error::new(e.kind(), format!("opening the results journal {}: {e}", path.display())))?;
    let len = f.metadata()?.len();
    let torn = len % ENTRY_LEN as u64;
    if torn != 0 {
        tracing::warn!(journal = %path.display(), bytes = torn, "dropping a torn results-journal entry");
        f.set_len(len - torn)?;
    }
    Ok(f)
}

/// Every entry of every agent's journals under a run's output directory (`out/agent-N/results*`),
/// and how many entries were not believed (damaged). A run without journals has none.
pub fn read_run(out: &Path) -> io::Result<(Vec<Told>, u64)> {
    let mut told = Vec::new();
    let mut damaged = 0;
    let dirs = match std::fs::read_dir(out) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((told, 0)),
        Err(e) => return Err(e),
    };
    for d in dirs {
        let d = d?;
        let name = d.file_name();
        let Some(agent) = name.to_str().and_then(|n| n.strip_prefix("agent-")).and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        for f in std::fs::read_dir(d.path())? {
            let f = f?;
            let name = f.file_name();
            let Some(n) = name.to_str() else { continue };
            let journal = n == "results" || n.strip_prefix("results.").is_some_and(|k| k.parse::<usize>().is_ok());
            if !journal {
                continue;
            }
            let mut b = Vec::new();
            File::open(f.path())?.read_to_end(&mut b)?;
            for chunk in b.chunks_exact(ENTRY_LEN) {
                match decode(agent, chunk) {
                    Some(t) => told.push(t),
                    None => damaged += 1,
                }
            }
        }
    }
    Ok((told, damaged))
}

#[cfg(test)]
mod tests {
    use super::*;
    use htc_core::record::Ended;
    use htc_core::work::Finished;

    #[test]
    fn entries_come_back_as_written_and_damage_is_not_believed() {
        let dir = std::env::temp_dir().join(format!("htc-results-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("agent-3")).unwrap();
        let mut j = Journal::new(dir.join("agent-3").join(file_name(1)));
        let fin = |id, outcome, value| {
            ExecEvent::Finished(Finished { id, attempt: 2, ended: Ended::new(outcome, value, 10, 20) })
        };
        let events = [
            ExecEvent::Started { id: 5, attempt: 2, start_us: 10 },
            fin(5, Outcome::Exited, 3),
            fin(6, Outcome::Signaled, 15),
            ExecEvent::Reset,
        ];
        j.note(&events, |id, _| id != 6);
        j.write().unwrap();
        let (told, damaged) = read_run(&dir).unwrap();
        assert_eq!(damaged, 0);
        assert_eq!(
            told,
            [
                Told { agent: 3, id: 5, attempt: 2, start_us: 10, end: None },
                Told { agent: 3, id: 5, attempt: 2, start_us: 10, end: Some((Outcome::Exited, 3, 20)) },
            ]
        );
        // A flipped byte anywhere in an entry: not believed. A torn tail: dropped on the next open.
        let path = dir.join("agent-3/results.1");
        let mut b = std::fs::read(&path).unwrap();
        for i in 0..ENTRY_LEN {
            let mut c = b.clone();
            c[ENTRY_LEN + i] ^= 0x10;
            assert!(decode(3, &c[ENTRY_LEN..]).is_none(), "flip at {i}");
        }
        b.extend_from_slice(&[1, 2, 3]);
        std::fs::write(&path, &b).unwrap();
        let mut j = Journal::new(path.clone());
        j.note(&[ExecEvent::Started { id: 9, attempt: 1, start_us: 1 }], |_, _| true);
        j.write().unwrap();
        let (told, damaged) = read_run(&dir).unwrap();
        assert_eq!((told.len(), damaged, told[2].id), (3, 0, 9));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
