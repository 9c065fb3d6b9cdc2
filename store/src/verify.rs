//! `htc verify`: reads a whole ledger and says which tasks it can still vouch for. LMDB keeps no
//! page checksums, so a damaged page shows only when something reads it; this reads everything.
//! A page that breaks the tree hides the tasks under it: those are probed one by one, and the
//! walk goes on after them. A record that decodes is also checked against what loading wrote
//! (lines grow with ids, the command lies inside the run's copy of the task file).
//!
//! Some damage does not fail a read but crashes it (an LMDB assertion, a pointer followed out of
//! every map) or sends LMDB round a loop of pages for ever. `verify_apart` therefore reads in a
//! child process that reports as it goes: a crash or a stall ends the child, not `htc`, and what
//! it had vouched for until then still counts.

use std::io::{BufRead, Write};
use std::path::Path;
use std::time::Duration;

use htc_core::task::Counts;

use crate::ledger::{Ledger, LedgerError, Record};

/// Consecutive task ids.
pub type Span = std::ops::RangeInclusive<u64>;

#[derive(Debug, Default)]
pub struct Verdict {
    /// Tasks the loaded file had, from the ledger's meta (None: unreadable).
    pub total: Option<u64>,
    /// Tasks whose records read back whole and plausible.
    pub good: Vec<Span>,
    pub good_count: u64,
    /// Tasks that cannot be read, each span with the first reason seen.
    pub bad: Vec<(Span, String)>,
    pub bad_count: u64,
    /// Other damage: the attempt history, stored counts that disagree with the records.
    pub notes: Vec<String>,
}

/// How the note about a record past the last task begins.
const BEYOND: &str = "a task record lies past the last task";

/// How the note about stored counts begins: the one damage a resume mends (it counts again).
const COUNTS_DIFFER: &str = "the stored counts differ";

impl Verdict {
    pub fn intact(&self) -> bool {
        self.bad.is_empty() && self.notes.is_empty() && self.total.is_some()
    }

    /// Why a resume must not build on this ledger, if it must not: a record that does not read
    /// back, a lost total, a broken history (stored counts it writes again).
    pub fn unresumable(&self) -> Option<String> {
        if self.bad_count > 0 {
            return Some(format!("{} task records cannot be read", self.bad_count));
        }
        if let Some(n) = self.notes.iter().find(|n| !n.starts_with(COUNTS_DIFFER)) {
            return Some(n.clone());
        }
        self.total.is_none().then(|| "the number of tasks cannot be read".into())
    }

    fn good(&mut self, id: u64) {
        self.add_good(id..=id);
    }

    fn bad(&mut self, id: u64, why: impl FnOnce() -> String) {
        self.add_bad(id..=id, why);
    }

    /// Adds consecutive good ids (one, or a span another process read), merged with the span
    /// before them.
    fn add_good(&mut self, s: Span) {
        self.good_count += s.end() - s.start() + 1;
        match self.good.last_mut() {
            Some(last) if *last.end() + 1 == *s.start() => *last = *last.start()..=*s.end(),
            _ => self.good.push(s),
        }
    }

    /// As `add_good`; a merged span keeps its first reason (`why` is asked only for a new one).
    fn add_bad(&mut self, s: Span, why: impl FnOnce() -> String) {
        self.bad_count += s.end() - s.start() + 1;
        match self.bad.last_mut() {
            Some((last, _)) if *last.end() + 1 == *s.start() => *last = *last.start()..=*s.end(),
            _ => self.bad.push((s, why())),
        }
    }
}

/// Where a reading starts: at the first task, or, after a reader crashed, at `id` looked up one
/// by one (`probe`) until one reads.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Start {
    id: u64,
    probe: bool,
}

/// Reads every task record from `start` and the history, calling `tick(verdict, at)` now and
/// then with every id below `at` judged. `text_len` is the size of the run's copy of the task
/// file (commands must lie inside it). After an error LMDB refuses the rest of a transaction, so
/// every step after one starts a new transaction.
fn verify_ticking(
    l: &Ledger,
    text_len: u64,
    start: Start,
    tick: &mut dyn FnMut(&mut Verdict, u64),
) -> Result<Verdict, LedgerError> {
    let mut v = Verdict::default();
    let mut tick = Ticker::new(tick, start);
    let txn = l.read()?;
    // Each task's record takes 64 bytes of the file at least: a count beyond that is damage.
    let most = std::fs::metadata(l.path()).map(|m| m.len() / 64).unwrap_or(u64::MAX);
    match txn.meta_u64("total") {
        Ok(Some(t)) if t > most => v.notes.push(format!("the stored number of tasks ({t}) cannot fit in the file")),
        Ok(Some(t)) => v.total = Some(t),
        Ok(None) => v.notes.push("the number of tasks is missing from the ledger's meta".into()),
        Err(e) => v.notes.push(format!("the ledger's meta cannot be read: {e}")),
    }
    drop(txn);
    let end = v.total.unwrap_or(most);
    let mut w = Walk { expect: start.id, last_line: 0, counts: Counts::default(), text_len, end };
    tick.now(&mut v, start.id);
    let mut from = start.id;
    if start.probe {
        from = probe(l, &mut v, &mut tick, from, end);
        w.expect = from;
    }
    while from <= end {
        let Err(e) = l.read().and_then(|t| {
            t.walk_tasks(from, |id, r| {
                w.see(&mut v, id, r);
                tick.maybe(&mut v, w.expect);
            })
        }) else {
            break;
        };
        // The tree broke after `expect - 1`: probe each id until one reads again.
        let mut id = w.expect;
        if id == from && l.read().and_then(|t| t.get(id)).is_ok_and(|r| r.is_some()) {
            // The walk could not even start where a lookup can: count the id bad and move on,
            // so that the probe always makes progress.
            v.bad(id, || e.to_string());
            id += 1;
        }
        let id = probe(l, &mut v, &mut tick, id, end);
        (w.expect, from) = (id, id);
        if v.total.is_none() {
            break;
        }
    }
    if let Some(t) = v.total {
        for id in w.expect..=t {
            v.bad(id, || "no record".into());
        }
    }
    let at = v.total.map_or(w.expect, |t| t + 1);
    tick.now(&mut v, at);
    if let Err(e) = l.read().and_then(|t| t.check_history()) {
        v.notes.push(format!("the attempt history, failed-task index or meta is damaged: {e}"));
    }
    // Damage LMDB does not see: a pointer that leads to an intact value in the wrong place.
    if start.id == 1 {
        if let Err(e) = l.read().and_then(|t| t.check_structure(None)) {
            v.notes.push(e.to_string());
        }
    }
    // Not a task's, but what a resume's first write would follow.
    if let Err(e) = l.read().and_then(|t| t.check_freelist()) {
        v.notes.push(e.to_string());
    }
    // Stored counts are checked against a whole walk only.
    match l.read().and_then(|t| t.counts()) {
        Ok(stored) if start.id == 1 && v.bad_count == 0 && stored != w.counts => {
            v.notes.push(format!("{COUNTS_DIFFER} from the records': {stored:?} against {:?}", w.counts))
        }
        Ok(_) => {}
        Err(e) => v.notes.push(format!("the stored counts cannot be read: {e}")),
    }
    Ok(v)
}

/// Looks ids up one by one from `id` until one reads; the ones before it are bad. Returns it.
fn probe(l: &Ledger, v: &mut Verdict, tick: &mut Ticker, mut id: u64, end: u64) -> u64 {
    while id <= end {
        match l.read().and_then(|t| t.get(id)) {
            Ok(Some(_)) => break,
            Ok(None) if v.total.is_none() => break,
            Ok(None) => v.bad(id, || "no record".into()),
            Err(e) => v.bad(id, || e.to_string()),
        }
        id += 1;
        tick.maybe(v, id);
    }
    id
}

/// How long a healthy read can go without finishing a batch of records, with room for a slow
/// shared file system.
pub const STALL: Duration = Duration::from_secs(10);

/// Readers a damaged ledger may crash before the rest of it is given up as unread.
const MOST_READERS: u32 = 32;
/// Readers that may stall (each costs `stall`) before the rest is given up.
const MOST_STALLS: u32 = 2;

/// Reads the whole ledger in a child process (see the module's comment). A reader that stops making progress
/// for `stall` is taken to be looping in a damaged page and killed. After a crash or a stall a
/// new reader goes on where the last one stopped, looking ids up one by one; where even that
/// crashes it skips a stretch that doubles each time (counted unread), so that a broken region
/// costs a few readers, not one per task.
pub fn verify_apart(path: &Path, text_len: u64, stall: Duration) -> Result<Verdict, LedgerError> {
    let mut heard = Heard::default();
    let mut start = Start { id: 1, probe: false };
    let (mut readers, mut stalls, mut in_row) = (0u32, 0u32, 0u32);
    loop {
        readers += 1;
        let why = match read_apart(path, text_len, start, stall, &mut heard)? {
            Ended::Done => return Ok(heard.v),
            Ended::Error(e) => return Err(LedgerError::Apart(e)),
            Ended::Crashed(why) => why,
            Ended::Stalled => {
                stalls += 1;
                format!("reading it made no progress for {} s (a damaged page loops)", stall.as_secs())
            }
        };
        let v = &mut heard.v;
        let at = heard.at.max(start.id);
        let total = match v.total {
            Some(t) if at <= t => t,
            Some(_) => {
                v.notes.push(format!("after the task records, {why}"));
                return Ok(heard.v);
            }
            None => {
                v.notes.push(format!("after task {}, {why}; the tasks after it are unknown", at - 1));
                return Ok(heard.v);
            }
        };
        if readers >= MOST_READERS || stalls >= MOST_STALLS {
            v.add_bad(at..=total, || format!("{why}; not read after that"));
            return Ok(heard.v);
        }
        start = if start.probe && at == start.id {
            // Even the first lookup failed: give up a stretch, longer each time.
            let last = at.saturating_add((1u64 << in_row.min(40)) - 1).min(total);
            in_row += 1;
            v.add_bad(at..=last, || why);
            if last == total {
                return Ok(heard.v);
            }
            Start { id: last + 1, probe: true }
        } else {
            in_row = 0;
            Start { id: at, probe: true }
        };
    }
}

/// How a reader ended.
enum Ended {
    Done,
    /// An error it returned (the ledger does not open, say).
    Error(String),
    Crashed(String),
    Stalled,
}

/// One reader from `start`; what it judged is added to `heard`.
fn read_apart(
    path: &Path,
    text_len: u64,
    start: Start,
    stall: Duration,
    heard: &mut Heard,
) -> Result<Ended, LedgerError> {
    use nix::unistd::ForkResult;
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| apart_error(path, e.into()))?;
    // SAFETY: the child only reads the ledger and writes to the pipe, then _exits; htc forks here
    // before it starts threads, and glibc's malloc stays usable after fork even where not.
    let pid = match unsafe { nix::unistd::fork() } {
        Ok(ForkResult::Child) => {
            drop(read);
            let code = child(write, path, text_len, start);
            // SAFETY: _exit skips the parent's atexit and stdio state.
            unsafe { libc::_exit(code) }
        }
        Ok(ForkResult::Parent { child }) => child,
        Err(e) => return Err(apart_error(path, e.into())),
    };
    // The write end is the child's alone now: the pipe ends when the child does.
    drop(write);
    let read = std::fs::File::from(read);
    (heard.at, heard.done, heard.error, heard.last_words) = (start.id, false, None, None);
    let stalled = listen(read, stall, heard);
    if stalled {
        // pid is our child, not reaped until below, so it cannot have been reused.
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
    }
    // Raw waitpid: nix's would fail (EINVAL) for a child a real-time signal killed, after
    // reaping it, and its status would be lost.
    let mut status = 0;
    // SAFETY: a live status out-parameter; pid is our child, reaped only here.
    unsafe { libc::waitpid(pid.as_raw(), &mut status, 0) };
    Ok(if stalled {
        Ended::Stalled
    } else if heard.done && status == 0 {
        Ended::Done
    } else if let (Some(e), true) = (heard.error.take(), libc::WIFEXITED(status)) {
        Ended::Error(e)
    } else {
        let how = match heard.last_words.take() {
            // The fault handler's message, without what the parent's own message adds.
            Some(w) => w.split_once(" is damaged: ").map_or(w.clone(), |(_, r)| r.to_string()),
            None if libc::WIFSIGNALED(status) => format!("signal {}", libc::WTERMSIG(status)),
            None => format!("exit status {}", libc::WEXITSTATUS(status)),
        };
        let how = how.split_once("; it cannot be read safely").map_or(how.clone(), |(h, _)| h.to_string());
        Ended::Crashed(format!("reading it crashed ({how})"))
    })
}

fn apart_error(path: &Path, e: std::io::Error) -> LedgerError {
    LedgerError::Damaged { path: path.display().to_string(), why: format!("cannot start reading it apart: {e}") }
}

/// The child: its stderr goes to the pipe too, so that the fault handler's message (a broken
/// page's last words) reaches the parent as a line.
fn child(fd: std::os::fd::OwnedFd, path: &Path, text_len: u64, start: Start) -> i32 {
    let _ = nix::unistd::dup2_stderr(&fd);
    let mut out = std::io::BufWriter::new(std::fs::File::from(fd));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let l = Ledger::open(path, true)?;
        let mut total_sent = false;
        verify_ticking(&l, text_len, start, &mut |v, at| send(&mut out, v, at, &mut total_sent))
    }));
    let code = match r {
        Ok(Ok(mut v)) => {
            send(&mut out, &mut v, u64::MAX, &mut false);
            let _ = writeln!(out, "done");
            0
        }
        Ok(Err(e)) => {
            let _ = writeln!(out, "error {}", one_line(&e.to_string()));
            1
        }
        Err(_) => 3,
    };
    let _ = out.flush();
    code
}

fn one_line(s: &str) -> String {
    s.replace('\n', " ")
}

/// Sends what was judged since the last call (spans end where a call falls; the parent merges).
fn send(out: &mut impl Write, v: &mut Verdict, at: u64, total_sent: &mut bool) {
    if let (Some(t), false) = (v.total, *total_sent) {
        let _ = writeln!(out, "total {t}");
        *total_sent = true;
    }
    for n in v.notes.drain(..) {
        let _ = writeln!(out, "note {}", one_line(&n));
    }
    for s in v.good.drain(..) {
        let _ = writeln!(out, "good {} {}", s.start(), s.end());
    }
    for (s, why) in v.bad.drain(..) {
        let _ = writeln!(out, "bad {} {} {}", s.start(), s.end(), one_line(&why));
    }
    let _ = writeln!(out, "at {at}");
    let _ = out.flush();
}

/// What the parent heard from the child.
#[derive(Default)]
struct Heard {
    v: Verdict,
    /// Every id below this was judged.
    at: u64,
    done: bool,
    error: Option<String>,
    /// A line the child did not write itself: the fault handler's or LMDB's message.
    last_words: Option<String>,
}

/// Reads the child's lines until it closes the pipe (false) or is silent for `stall` (true).
fn listen(read: std::fs::File, stall: Duration, heard: &mut Heard) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let timeout = PollTimeout::try_from(stall.as_millis()).unwrap_or(PollTimeout::MAX);
    let mut lines = std::io::BufReader::new(read);
    let mut line = String::new();
    loop {
        if lines.buffer().is_empty() {
            match poll(&mut [PollFd::new(lines.get_ref().as_fd(), PollFlags::POLLIN)], timeout) {
                Ok(0) => return true,
                Err(nix::errno::Errno::EINTR) => continue,
                _ => {}
            }
        }
        line.clear();
        match lines.read_line(&mut line) {
            Ok(0) | Err(_) => return false,
            Ok(_) => heard.take(line.trim_end()),
        }
    }
}

impl Heard {
    fn take(&mut self, line: &str) {
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        let mut nums = rest.splitn(3, ' ');
        let mut num = || nums.next().and_then(|n| n.parse::<u64>().ok());
        match word {
            "total" => self.v.total = num(),
            // A reader after a crash reads the meta again.
            "note" if !self.v.notes.iter().any(|n| n == rest) => self.v.notes.push(rest.to_string()),
            "note" => {}
            "good" => {
                if let (Some(a), Some(b)) = (num(), num()) {
                    self.v.add_good(a..=b);
                }
            }
            "bad" => {
                if let (Some(a), Some(b)) = (num(), num()) {
                    self.v.add_bad(a..=b, || nums.next().unwrap_or_default().to_string());
                }
            }
            "at" => self.at = num().unwrap_or(self.at),
            "done" => self.done = true,
            "error" => self.error = Some(rest.to_string()),
            _ => self.last_words = Some(line.strip_prefix("htc: ").unwrap_or(line).to_string()),
        }
    }
}

/// When a reader reports. A crashed reader's judgements since its last report are lost and read
/// again by the next one, so reports come every `EVERY` records; and, after a crash, at every
/// record for a while, so that a reader stopped again at the same broken page still shows how far
/// it got.
struct Ticker<'a> {
    f: &'a mut dyn FnMut(&mut Verdict, u64),
    last_at: u64,
    each_until: u64,
}

impl Ticker<'_> {
    const EVERY: u64 = 128;
    /// Ids after a restart reported one by one.
    const CLOSE: u64 = 4096;

    fn new(f: &mut dyn FnMut(&mut Verdict, u64), start: Start) -> Ticker<'_> {
        let each_until = if start.probe { start.id.saturating_add(Self::CLOSE) } else { 0 };
        Ticker { f, last_at: 0, each_until }
    }

    fn maybe(&mut self, v: &mut Verdict, at: u64) {
        if at < self.each_until || at >= self.last_at.saturating_add(Self::EVERY) {
            self.now(v, at);
        }
    }

    fn now(&mut self, v: &mut Verdict, at: u64) {
        (self.f)(v, at);
        self.last_at = at;
    }
}

/// Where the walk is: the id it should see next, the last good line, the states seen, the last
/// id there can be.
struct Walk {
    expect: u64,
    last_line: u32,
    counts: Counts,
    text_len: u64,
    end: u64,
}

impl Walk {
    fn see(&mut self, v: &mut Verdict, id: u64, r: Result<Record, LedgerError>) {
        if id > self.end {
            // A damaged key: the ids it skipped are counted as missing at the end of the walk.
            if !v.notes.iter().any(|n| n.starts_with(BEYOND)) {
                v.notes.push(format!("{BEYOND} (id {id}, the last is {})", self.end));
            }
            return;
        }
        for missing in self.expect..id {
            v.bad(missing, || "no record".into());
        }
        self.expect = id + 1;
        match r.map_err(|e| e.to_string()).and_then(|r| plausible(id, &r, self.last_line, self.text_len).map(|()| r)) {
            Ok(r) => {
                self.last_line = self.last_line.max(r.line());
                self.counts.add(r.state());
                v.good(id);
            }
            Err(why) => v.bad(id, || why),
        }
    }
}

/// What loading wrote and running never changes: lines grow with ids, commands lie inside the
/// task file, a task has cores. A task added while the run ran (no line: its command is in the
/// ledger, under its own id) comes after the file's.
fn plausible(id: u64, r: &Record, last_line: u32, text_len: u64) -> Result<(), String> {
    if r.command().is_added() {
        if r.cmd_off() != id {
            return Err(format!("its command is kept under task {}", r.cmd_off()));
        }
        return if r.shape().cores == 0 { Err("it asks for no cores".into()) } else { Ok(()) };
    }
    // Tasks of one sweep share their template's line.
    if r.line() < last_line {
        return Err(format!("line {} does not follow line {last_line}", r.line()));
    }
    if r.cmd_off().checked_add(r.cmd_len() as u64).is_none_or(|e| e > text_len) {
        return Err("its command lies outside the task file".into());
    }
    if r.shape().cores == 0 {
        return Err("it asks for no cores".into());
    }
    Ok(())
}

/// `1-1203, 1334-3000`.
pub fn spans(s: &[Span]) -> String {
    let show =
        |r: &Span| if r.start() == r.end() { r.start().to_string() } else { format!("{}-{}", r.start(), r.end()) };
    let mut out: Vec<String> = s.iter().take(20).map(show).collect();
    if s.len() > 20 {
        out.push(format!("… ({} spans more)", s.len() - 20));
    }
    out.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::Record;

    fn ledger(name: &str, n: u64) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("htc-verify-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let path = d.join("ledger.mdb");
        let l = Ledger::create(&path).unwrap();
        let mut t = l.write().unwrap();
        for id in 1..=n {
            let cmd = htc_core::record::CommandAt { line: id as u32, off: id, len: 1, shell: false };
            t.append(id, &Record::new(cmd, Default::default())).unwrap();
        }
        t.put_meta("total", &n.to_le_bytes()).unwrap();
        t.put_counts(&Counts([n, 0, 0, 0, 0, 0])).unwrap();
        t.commit().unwrap();
        path
    }

    #[test]
    fn an_intact_ledger_reads_back_whole() {
        let path = ledger("intact", 3000);
        let v = verify_apart(&path, 1 << 20, STALL).unwrap();
        assert!(v.intact(), "{v:?}");
        assert_eq!((v.good, v.good_count), (vec![1..=3000], 3000));
        // A command past the end of the task file is damage, named per record.
        let v = verify_apart(&path, 2000, STALL).unwrap();
        assert_eq!(v.good, vec![1..=1999]);
        assert_eq!(v.bad.len(), 1, "{v:?}");
        assert_eq!(v.bad[0].0, 2000..=3000);
        assert!(v.unresumable().is_some());
    }

    #[test]
    fn a_ruined_page_costs_its_tasks_and_the_rest_is_still_vouched_for() {
        let path = ledger("ruined", 20_000);
        let pages = std::fs::metadata(&path).unwrap().len() / 4096;
        let mut bytes = std::fs::read(&path).unwrap();
        // A leaf in the middle (LMDB's page header: flags at byte 10, 2 = leaf).
        let leaf = |p: usize| u16::from_le_bytes([bytes[p * 4096 + 10], bytes[p * 4096 + 11]]) & 2 != 0;
        let page = (pages as usize / 2..pages as usize).find(|&p| leaf(p)).expect("a leaf page");
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for b in &mut bytes[page * 4096..][..4096] {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        std::fs::write(&path, bytes).unwrap();
        let v = verify_apart(&path, 1 << 20, STALL).unwrap();
        assert!(!v.intact());
        assert!(v.bad_count > 0 && v.good_count > 10_000, "{v:?}");
        assert_eq!(v.good_count + v.bad_count, 20_000, "every task judged once: {v:?}");
        assert!(v.unresumable().unwrap().contains("cannot be read"));
    }

    #[test]
    fn what_readers_report_in_pieces_is_merged() {
        let mut h = Heard::default();
        for l in [
            "total 10",
            "note n",
            "good 1 3",
            "at 4",
            "good 4 6",
            "bad 7 7 x",
            "at 8",
            "note n",
            "bad 8 8 y",
            "good 9 10",
        ] {
            h.take(l);
        }
        h.take("htc: ledger l is damaged: it broke");
        assert_eq!(h.v.total, Some(10));
        assert_eq!(h.v.good, vec![1..=6, 9..=10]);
        assert_eq!(h.v.bad, vec![(7..=8, "x".to_string())]);
        assert_eq!((h.v.good_count, h.v.bad_count, h.at), (8, 2, 8));
        assert_eq!(h.v.notes, vec!["n".to_string()]);
        assert_eq!(h.last_words.as_deref(), Some("ledger l is damaged: it broke"));
    }
}
