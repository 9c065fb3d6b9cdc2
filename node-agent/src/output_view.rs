//! `htc output`: a run's task output read back, one task's or every task's in task order (the
//! last attempt of each), as `sh -c` run serially would have printed it.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use crate::ledger::{Ledger, Record, State};
use crate::output::{self, IndexEntry, OutputMode};
use crate::rundir::RunDir;

/// What `htc output RUN` (every task) prints.
#[derive(Debug, Clone, Copy, Default)]
pub struct Select {
    pub stdout: bool,
    pub stderr: bool,
    /// Only tasks that failed for good.
    pub failed_only: bool,
    /// Each line prefixed with the task id and a tab (as `parallel --tag`).
    pub tag: bool,
}

pub fn stored_mode(ledger: &Ledger) -> anyhow::Result<OutputMode> {
    let t = ledger.read()?;
    Ok(t.meta("output")?.and_then(|b| std::str::from_utf8(b).ok()?.parse().ok()).unwrap_or(OutputMode::Streams))
}

/// Every index entry of the run's agents, sorted by task, then attempt: one pass over the indexes
/// instead of a search per task.
fn all_entries(run: &RunDir) -> io::Result<Vec<(IndexEntry, u32)>> {
    let mut all = Vec::new();
    let dir = match std::fs::read_dir(run.out()) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(all),
        Err(e) => return Err(e),
    };
    for e in dir {
        let e = e?;
        let name = e.file_name();
        let Some(agent) = name.to_str().and_then(|n| n.strip_prefix("agent-")).and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        for ix in output::index_files(&e.path())? {
            all.extend(output::read_index(&ix)?.into_iter().map(|x| (x, agent)));
        }
    }
    all.sort_by_key(|(x, _)| (x.id, x.attempt));
    Ok(all)
}

/// Task `id`'s entries among all (sorted by task), walking on from `next`: the ledger visits tasks
/// in id order, so one pass over the entries serves every task.
fn entries_of<'e>(entries: &'e [(IndexEntry, u32)], next: &mut usize, id: u64) -> &'e [(IndexEntry, u32)] {
    let start = *next;
    while *next < entries.len() && entries[*next].0.id <= id {
        *next += 1;
    }
    let group = &entries[start..*next];
    &group[group.iter().position(|(x, _)| x.id == id).unwrap_or(group.len())..]
}

/// The entry of the attempt the ledger recorded among a task's entries: the same attempt number,
/// start time and agent. Never another one: an attempt killed with its session (and run again
/// under the same number) left only a fragment.
fn pick(entries: &[(IndexEntry, u32)], r: &Record) -> Option<(IndexEntry, u32)> {
    // Numbered as the agent was told ($HTC_ATTEMPT): lost runs count too.
    let want = r.attempt_no();
    entries.iter().rev().find(|(x, a)| x.is_of(want, r.start_us()) && *a == r.agent()).copied()
}

/// Copies bytes to `out`, prefixing every line with `tag` when there is one.
struct Tagged<W: Write> {
    out: W,
    at_line_start: bool,
}

impl<W: Write> Tagged<W> {
    fn copy(&mut self, mut bytes: &[u8], tag: Option<&[u8]>) -> io::Result<()> {
        let Some(tag) = tag else { return self.out.write_all(bytes) };
        while !bytes.is_empty() {
            if self.at_line_start {
                self.out.write_all(tag)?;
            }
            let end = bytes.iter().position(|&b| b == b'\n').map_or(bytes.len(), |i| i + 1);
            self.out.write_all(&bytes[..end])?;
            self.at_line_start = bytes[end - 1] == b'\n';
            bytes = &bytes[end..];
        }
        Ok(())
    }

    /// A task's tagged output that did not end its last line: end it, so the next tag starts one.
    fn end_task(&mut self, tagged: bool) -> io::Result<()> {
        if tagged && !self.at_line_start {
            self.out.write_all(b"\n")?;
        }
        self.at_line_start = true;
        Ok(())
    }
}

/// Open stream files, a bounded number at a time (a big run has two per core).
struct Files(HashMap<PathBuf, File>);

impl Files {
    /// Hands `len` bytes at `off` of `path` to `to`, a block at a time (a task may have written
    /// gigabytes), once they match their checksum `crc` when there is one: damaged bytes are an
    /// error, never printed.
    fn copy(
        &mut self,
        path: &Path,
        mut off: u64,
        len: u64,
        crc: Option<u32>,
        buf: &mut Vec<u8>,
        to: &mut dyn FnMut(&[u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        if !self.0.contains_key(path) {
            if self.0.len() >= 256 {
                self.0.clear();
            }
            self.0.insert(path.to_path_buf(), File::open(path)?);
        }
        let f = &self.0[path];
        let damaged =
            || io::Error::new(io::ErrorKind::InvalidData, format!("{len} bytes at {off}: damaged (checksum)"));
        const BLOCK: u64 = 1 << 20;
        if len <= BLOCK {
            buf.resize(len as usize, 0);
            f.read_exact_at(buf, off)?;
            if crc.is_some_and(|c| c != crc32fast::hash(buf)) {
                return Err(damaged());
            }
            return to(buf);
        }
        if crc.is_some_and(|c| crate::capture::crc_of(f, off, len).is_ok_and(|got| got != c)) {
            return Err(damaged());
        }
        let end = off + len;
        while off < end {
            buf.resize(((end - off) as usize).min(BLOCK as usize), 0);
            f.read_exact_at(buf, off)?;
            to(buf)?;
            off += buf.len() as u64;
        }
        Ok(())
    }
}

/// The GPUs each attempt in the run was given: (task, attempt) -> "0,1".
pub fn all_devices(run: &RunDir) -> io::Result<std::collections::HashMap<(u64, u32), String>> {
    let mut all = std::collections::HashMap::new();
    for dir in output_dirs(run) {
        all.extend(output::read_devices(&dir)?);
    }
    Ok(all)
}

/// Every output cut at its `max_output=` in the run, by task.
pub fn all_cuts(run: &RunDir) -> io::Result<Vec<output::Cut>> {
    let mut cuts = Vec::new();
    for dir in output_dirs(run) {
        cuts.extend(output::read_cuts(&dir)?);
    }
    cuts.sort_by_key(|c| (c.id, c.attempt));
    Ok(cuts)
}

/// The directories agents write their notes to: per-task output's, and each agent's.
fn output_dirs(run: &RunDir) -> Vec<std::path::PathBuf> {
    let mut dirs = vec![run.out().join("tasks")];
    if let Ok(dir) = std::fs::read_dir(run.out()) {
        let agents = dir.flatten().filter(|e| e.file_name().to_string_lossy().starts_with("agent-"));
        dirs.extend(agents.map(|e| e.path()));
    }
    dirs
}

fn cut_note(c: &output::Cut) -> String {
    format!("task {} {}: cut at {} bytes of {} written (max_output)", c.id, c.stream, c.kept, c.written)
}

/// Prints every task's output in task order; returns how many tasks had output to print.
pub fn print_all(run: &RunDir, sel: Select) -> anyhow::Result<u64> {
    let ledger = Ledger::open(&run.ledger(), true)?;
    let mode = stored_mode(&ledger)?;
    if mode == OutputMode::None {
        bail!("this run discarded task output (--output none)");
    }
    let entries = if mode == OutputMode::Streams { all_entries(run)? } else { Vec::new() };
    let stdout: Box<dyn Write> = Box::new(BufWriter::with_capacity(1 << 16, io::stdout().lock()));
    let stderr: Box<dyn Write> = Box::new(BufWriter::new(io::stderr().lock()));
    let (mut so, mut se) = (Tagged { out: stdout, at_line_start: true }, Tagged { out: stderr, at_line_start: true });
    let (mut files, mut buf) = (Files(HashMap::new()), Vec::new());
    let mut next = 0usize;
    let mut printed = 0u64;
    let mut result: anyhow::Result<()> = Ok(());
    let txn = ledger.read()?;
    // Every record is read anyway: check the pages that lead to them too.
    txn.check_structure(None)?;
    txn.for_each(|id, r| {
        if result.is_err() {
            return;
        }
        let group = entries_of(&entries, &mut next, id);
        if r.attempts() == 0 || (sel.failed_only && r.state() != State::Failed) {
            return;
        }
        let tag = format!("{id}\t");
        let tag = sel.tag.then_some(tag.as_bytes());
        result = (|| -> anyhow::Result<()> {
            let mut any = false;
            let mut emit =
                |path: PathBuf, off: u64, len: u64, crc: Option<u32>, to: &mut dyn FnMut(&[u8]) -> io::Result<()>| {
                    any = true;
                    files
                        .copy(&path, off, len, crc, &mut buf, to)
                        .with_context(|| format!("task {id}'s output in {}", path.display()))
                };
            match mode {
                OutputMode::Streams => {
                    let Some((x, agent)) = pick(group, r) else { return Ok(()) };
                    let dir = run.agent_out(agent);
                    if sel.stdout {
                        let path = dir.join(format!("slot-{}.out", x.slot));
                        emit(path, x.out_off, x.out_len, Some(x.out_crc), &mut |b| so.copy(b, tag))?;
                    }
                    if sel.stderr {
                        let path = dir.join(format!("slot-{}.err", x.slot));
                        emit(path, x.err_off, x.err_len, Some(x.err_crc), &mut |b| se.copy(b, tag))?;
                    }
                }
                OutputMode::PerTask => {
                    let dir = run.out().join("tasks");
                    for (want, ext) in [(sel.stdout, "out"), (sel.stderr, "err")] {
                        let path = dir.join(format!("{id}.{ext}"));
                        let len = match std::fs::metadata(&path) {
                            Ok(m) => m.len(),
                            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
                        };
                        if want {
                            let to = if ext == "out" { &mut so } else { &mut se };
                            emit(path, 0, len, None, &mut |b| to.copy(b, tag))?;
                        }
                    }
                }
                OutputMode::None => {}
            }
            so.end_task(sel.tag)?;
            se.end_task(sel.tag)?;
            printed += any as u64;
            Ok(())
        })();
    })?;
    result?;
    so.out.flush()?;
    se.out.flush()?;
    drop((so, se));
    note_cuts(run, &txn, &sel)?;
    Ok(printed)
}

/// The cuts of the attempts shown, after the output rather than inside it.
fn note_cuts(run: &RunDir, txn: &crate::ledger::ReadTxn<'_>, sel: &Select) -> anyhow::Result<()> {
    let mut cut = Vec::new();
    for c in all_cuts(run)? {
        let r = txn.get(c.id)?;
        if r.is_some_and(|r| r.attempt_no() == c.attempt && (!sel.failed_only || r.state() == State::Failed)) {
            cut.push(c);
        }
    }
    if !cut.is_empty() {
        let first: Vec<String> = cut.iter().take(10).map(cut_note).collect();
        eprintln!(
            "htc: {} outputs were cut at their max_output: {}{}",
            cut.len(),
            first.join("; "),
            if cut.len() > 10 { "; …" } else { "" }
        );
    }
    Ok(())
}

/// What `htc verify` found of a run's output: each finished task's recorded attempt, its bytes
/// read back against their checksums.
#[derive(Debug, Default)]
pub struct OutputCheck {
    pub checked: u64,
    /// Finished tasks whose recorded attempt has no index entry.
    pub missing: Vec<u64>,
    /// Tasks whose bytes are damaged or unreadable, with why.
    pub damaged: Vec<(u64, String)>,
}

/// Reads back the output of every finished task's recorded attempt (streams mode; None for the
/// other modes, which keep no checksums).
pub fn check_all(run: &RunDir) -> anyhow::Result<Option<OutputCheck>> {
    let ledger = Ledger::open(&run.ledger(), true)?;
    if stored_mode(&ledger)? != OutputMode::Streams {
        return Ok(None);
    }
    let entries = all_entries(run)?;
    let mut c = OutputCheck::default();
    let (mut files, mut buf, mut next) = (Files(HashMap::new()), Vec::new(), 0usize);
    ledger.read()?.for_each(|id, r| {
        let group = entries_of(&entries, &mut next, id);
        let finished = r.state().is_final();
        if !finished || r.attempts() == 0 || r.outcome() == crate::ledger::Outcome::Lost {
            return;
        }
        let Some((x, agent)) = pick(group, r) else { return c.missing.push(id) };
        c.checked += 1;
        let dir = run.agent_out(agent);
        for (ext, off, len, crc) in [("out", x.out_off, x.out_len, x.out_crc), ("err", x.err_off, x.err_len, x.err_crc)]
        {
            let path = dir.join(format!("slot-{}.{ext}", x.slot));
            if let Err(e) = files.copy(&path, off, len, Some(crc), &mut buf, &mut |_| Ok(())) {
                c.damaged.push((id, format!("{}: {e}", path.display())));
                break;
            }
        }
    })?;
    Ok(Some(c))
}

/// Prints one task's output (its last attempt's): stdout to stdout, stderr to stderr.
pub fn print_one(run: &RunDir, task: u64, want_out: bool, want_err: bool) -> anyhow::Result<()> {
    let ledger = Ledger::open(&run.ledger(), true)?;
    let mode = stored_mode(&ledger)?;
    let txn = ledger.read()?;
    let Some(r): Option<Record> = txn.get(task)? else {
        // Ids run from 1 to the number loaded: a missing one inside that range is damage.
        let total = txn.meta_u64("total")?.unwrap_or(0);
        if (1..=total).contains(&task) {
            bail!("ledger {} is damaged: it lost the record of task {task} (of {total})", run.ledger().display());
        }
        bail!("no task {task} in {} (it has {total})", run.path.display());
    };
    drop(txn);
    if r.attempts() == 0 {
        bail!("task {task} has not run yet");
    }
    let (mut so, mut se) = (io::stdout().lock(), io::stderr().lock());
    match mode {
        OutputMode::None => bail!("this run discarded task output (--output none)"),
        OutputMode::PerTask => {
            let dir = run.out().join("tasks");
            if want_out {
                so.write_all(&std::fs::read(dir.join(format!("{task}.out")))?)?;
            }
            if want_err {
                se.write_all(&std::fs::read(dir.join(format!("{task}.err")))?)?;
            }
        }
        OutputMode::Streams => {
            let dir = run.agent_out(r.agent());
            let attempt = r.attempt_no();
            let e = find_output(&dir, task, attempt, r.start_us())?.with_context(|| {
                format!("no output recorded for attempt {attempt} of task {task} (it may still be running)")
            })?;
            let (mut files, mut buf) = (Files(HashMap::new()), Vec::new());
            for (want, ext, off, len, crc, to) in [
                (want_out, "out", e.out_off, e.out_len, e.out_crc, &mut so as &mut dyn Write),
                (want_err, "err", e.err_off, e.err_len, e.err_crc, &mut se),
            ] {
                if want {
                    let path = dir.join(format!("slot-{}.{ext}", e.slot));
                    files
                        .copy(&path, off, len, Some(crc), &mut buf, &mut |b| to.write_all(b))
                        .with_context(|| format!("task {task}'s output in {}", path.display()))?;
                }
            }
        }
    }
    so.flush()?;
    for c in all_cuts(run)?.iter().filter(|c| c.id == task && c.attempt == r.attempt_no()) {
        eprintln!("htc: {}", cut_note(c));
    }
    Ok(())
}

/// The index entry of the recorded attempt of `task` (number and start time) in an agent's
/// output directory, in any of the agent's spawners' index files.
fn find_output(dir: &Path, task: u64, attempt: u32, start_us: u64) -> anyhow::Result<Option<IndexEntry>> {
    let indexes = match output::index_files(dir) {
        Ok(ix) => ix,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    for ix in indexes {
        if let Some(e) = output::find_entry(&ix, task, |e| e.is_of(attempt, start_us))? {
            return Ok(Some(e));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_start_every_line_and_end_a_task_s_last() {
        let mut t = Tagged { out: Vec::new(), at_line_start: true };
        t.copy(b"a\nb", Some(b"7\t")).unwrap();
        t.copy(b"c\nd\n", Some(b"7\t")).unwrap();
        t.end_task(true).unwrap();
        t.copy(b"e", Some(b"8\t")).unwrap();
        t.end_task(true).unwrap();
        assert_eq!(String::from_utf8(t.out).unwrap(), "7\ta\n7\tbc\n7\td\n8\te\n");
        let mut plain = Tagged { out: Vec::new(), at_line_start: true };
        plain.copy(b"x", None).unwrap();
        plain.end_task(false).unwrap();
        plain.copy(b"y\n", None).unwrap();
        assert_eq!(plain.out, b"xy\n");
    }

    /// A record in its `attempts`th attempt (after one lost, if `lost`), started by `agent`.
    fn ran(attempts: u8, lost: bool, agent: u32, start_us: u64) -> Record {
        use htc_core::record::{CommandAt, Ended};
        use htc_core::task::{End, Step};
        let mut steps = Vec::new();
        if lost {
            steps.extend([Step::Dispatch, Step::Start, Step::Finish(End::Lost)]);
        }
        for _ in 1..attempts {
            steps.extend([Step::Dispatch, Step::Start, Step::Finish(End::Failed { permanent: false })]);
        }
        steps.push(Step::Dispatch);
        let shape = htc_core::shape::TaskShape { retries: 10, ..Default::default() };
        let mut r = Record::new(CommandAt::default(), shape).walked(&steps).unwrap();
        r.set_ended(agent, Ended { start_us, ..Ended::NONE });
        r
    }

    #[test]
    fn the_recorded_attempt_s_entry_is_picked_and_no_other() {
        let e = |attempt, slot, start_us| IndexEntry {
            id: 1,
            attempt,
            slot,
            out_off: 0,
            out_len: 0,
            err_off: 0,
            err_len: 0,
            start_us,
            out_crc: 0,
            err_crc: 0,
        };
        // Attempt 2 ran twice on agent 1: in a session that was killed (start 20), then again (30).
        let group = [(e(1, 0, 10), 0), (e(2, 1, 20), 0), (e(2, 2, 20), 1), (e(2, 4, 30), 1), (e(3, 3, 40), 0)];
        let r = ran(2, false, 1, 30);
        assert_eq!(pick(&group, &r).map(|(x, a)| (x.slot, a)), Some((4, 1)));
        let r = ran(2, false, 1, 20);
        assert_eq!(pick(&group, &r).map(|(x, a)| (x.slot, a)), Some((2, 1)));
        let r = ran(9, false, 1, 30);
        assert_eq!(pick(&group, &r), None, "none of that attempt: nothing, not another attempt's");
        // A lost run counts in the numbers agents are given: after a loss, attempt 1 is run 2.
        let r = ran(1, true, 0, 20);
        assert_eq!(pick(&group, &r).map(|(x, a)| (x.slot, a)), Some((1, 0)));
    }
}
