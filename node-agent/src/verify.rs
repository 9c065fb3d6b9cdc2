//! `htc verify`: reads a whole ledger and says which tasks it can still vouch for. LMDB keeps no
//! page checksums, so a damaged page shows only when something reads it; this reads everything.
//! A page that breaks the tree hides the tasks under it: those are probed one by one, and the
//! walk goes on after them. A record that decodes is also checked against what loading wrote
//! (lines grow with ids, the command lies inside the run's copy of the task file).

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
    /// Other damage: the attempt history, stored counts that disagree with the records.
    pub notes: Vec<String>,
}

impl Verdict {
    pub fn intact(&self) -> bool {
        self.bad.is_empty() && self.notes.is_empty() && self.total.is_some()
    }

    fn mark(spans: &mut Vec<Span>, id: u64) {
        match spans.last_mut() {
            Some(s) if *s.end() + 1 == id => *s = *s.start()..=id,
            _ => spans.push(id..=id),
        }
    }

    fn good(&mut self, id: u64) {
        Self::mark(&mut self.good, id);
        self.good_count += 1;
    }

    fn bad(&mut self, id: u64, why: impl FnOnce() -> String) {
        match self.bad.last_mut() {
            Some((s, _)) if *s.end() + 1 == id => *s = *s.start()..=id,
            _ => self.bad.push((id..=id, why())),
        }
    }
}

/// Reads every task record and the history. `text_len` is the size of the run's copy of the task
/// file (commands must lie inside it). After an error LMDB refuses the rest of a transaction, so
/// every step after one starts a new transaction.
pub fn verify(l: &Ledger, text_len: u64) -> Result<Verdict, LedgerError> {
    let mut v = Verdict::default();
    let txn = l.read()?;
    // Each task's record takes 64 bytes of the file at least: a count beyond that is damage.
    let most = std::fs::metadata(l.path()).map(|m| m.len() / 64).unwrap_or(u64::MAX);
    match txn.meta_u64("total") {
        Ok(Some(t)) if t > most => v.notes.push(format!("the stored number of tasks ({t}) cannot fit in the file")),
        Ok(Some(t)) => v.total = Some(t),
        Ok(None) => v.notes.push("the number of tasks is missing from the ledger's meta".into()),
        Err(e) => v.notes.push(format!("the ledger's meta cannot be read: {e}")),
    }
    let mut w = Walk { expect: 1, last_line: 0, counts: Counts::default(), text_len };
    let end = v.total.unwrap_or(most);
    let mut from = 1u64;
    drop(txn);
    let readable = |id: u64| l.read().and_then(|t| t.get(id)).is_ok_and(|r| r.is_some());
    while from <= end {
        let Err(e) = l.read().and_then(|t| t.walk_tasks(from, |id, r| w.see(&mut v, id, r))) else { break };
        // The tree broke after `expect - 1`: probe each id until one reads again.
        let why = e.to_string();
        let mut id = w.expect;
        if id == from && readable(id) {
            // The walk could not even start where a lookup can: count the id bad and move on,
            // so that the probe always makes progress.
            v.bad(id, || why.clone());
            id += 1;
        }
        while id <= end {
            match l.read().and_then(|t| t.get(id)) {
                Ok(Some(_)) => break,
                Ok(None) if v.total.is_none() => break,
                _ => v.bad(id, || why.clone()),
            }
            id += 1;
        }
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
    let counts = w.counts;
    if let Err(e) = l.read().and_then(|t| t.check_history()) {
        v.notes.push(format!("the attempt history is damaged: {e}"));
    }
    match l.read().and_then(|t| t.counts()) {
        Ok(stored) if v.bad.is_empty() && stored != counts => {
            v.notes.push(format!("the stored counts {stored:?} differ from the records' {counts:?}"))
        }
        Ok(_) => {}
        Err(e) => v.notes.push(format!("the stored counts cannot be read: {e}")),
    }
    Ok(v)
}

/// Where the walk is: the id it should see next, the last good line, the states seen.
struct Walk {
    expect: u64,
    last_line: u32,
    counts: Counts,
    text_len: u64,
}

impl Walk {
    fn see(&mut self, v: &mut Verdict, id: u64, r: Result<Record, LedgerError>) {
        for missing in self.expect..id {
            v.bad(missing, || "no record".into());
        }
        self.expect = id + 1;
        match r.map_err(|e| e.to_string()).and_then(|r| plausible(&r, self.last_line, self.text_len).map(|()| r)) {
            Ok(r) => {
                self.last_line = r.line;
                self.counts.add(r.state());
                v.good(id);
            }
            Err(why) => v.bad(id, || why),
        }
    }
}

/// What loading wrote and running never changes: lines grow with ids, commands lie inside the
/// task file, a task has cores.
fn plausible(r: &Record, last_line: u32, text_len: u64) -> Result<(), String> {
    if r.line <= last_line {
        return Err(format!("line {} does not follow line {last_line}", r.line));
    }
    if r.cmd_off.checked_add(r.cmd_len as u64).is_none_or(|e| e > text_len) {
        return Err("its command lies outside the task file".into());
    }
    if r.cores == 0 {
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
