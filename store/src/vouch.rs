//! What a reader of task states may say of each task it is asked about: its record, or that the
//! ledger cannot vouch for it. A reader (`htc task status|wait`, the leader answering a client)
//! that skipped a task whose record is missing or fails its checksum would tell a workflow
//! manager that fewer tasks exist, or that all it waits for succeeded; so every id the run has
//! gets an answer, and damage is one of the answers.

use crate::ledger::{LedgerError, Reads, Record};

/// One asked task, as the ledger has it.
#[derive(Debug, Clone, PartialEq)]
pub enum Found {
    Record(Record),
    /// The run has this task (its id is within the run's count) but its record is missing or
    /// does not decode: why, in words.
    Damaged(&'static str),
    /// No such task: its id is beyond the run's count.
    Unknown,
}

/// What a missing record of a task the run has means.
pub const MISSING: &str = "its record is missing from the ledger";
/// What a record that fails its checksum means.
pub const CORRUPT: &str = "its record in the ledger is damaged";

/// Tasks `ids` (any order, repeats allowed) of a run of `total` tasks. Damage confined to one
/// record is that task's answer; damage to the tree itself (an LMDB error, keys out of order) is
/// the whole read's error, since no answer read through it can be trusted.
pub fn tasks(t: &dyn Reads, ids: &[u64], total: u64) -> Result<Vec<(u64, Found)>, LedgerError> {
    ids.iter().map(|&id| Ok((id, one(t, id, total)?))).collect()
}

/// Every task with an id in `ids` that the run has (`1..=total`), in id order: one cursor walk,
/// then a lookup each only where the walk met damage or a gap.
pub fn range(t: &dyn Reads, ids: std::ops::Range<u64>, total: u64) -> Result<Vec<(u64, Found)>, LedgerError> {
    let ids = ids.start.max(1)..ids.end.min(total.saturating_add(1));
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let walked = match t.range(ids.clone()) {
        Ok(records) => records,
        // One record failed its checksum: the slice goes id by id, so that only it is damaged.
        Err(LedgerError::Corrupt { .. } | LedgerError::Sum { .. }) => {
            return tasks(t, &ids.collect::<Vec<_>>(), total);
        }
        Err(e) => return Err(e),
    };
    let mut out = Vec::with_capacity(walked.len());
    let mut next = ids.start;
    for (id, r) in walked {
        if id < next {
            // A key met twice or backwards: the tree is damaged.
            return tasks(t, &ids.collect::<Vec<_>>(), total);
        }
        // A gap: records the walk did not meet, which the run has.
        out.extend((next..id).map(|gap| (gap, Found::Damaged(MISSING))));
        out.push((id, Found::Record(r)));
        next = id + 1;
    }
    out.extend((next..ids.end).map(|gap| (gap, Found::Damaged(MISSING))));
    Ok(out)
}

fn one(t: &dyn Reads, id: u64, total: u64) -> Result<Found, LedgerError> {
    match t.get(id) {
        Ok(Some(r)) if id >= 1 && id <= total => Ok(Found::Record(r)),
        // A record beyond the count: the count or the key is damaged; neither can be vouched for.
        Ok(Some(_)) => Ok(Found::Unknown),
        Ok(None) if id >= 1 && id <= total => Ok(Found::Damaged(MISSING)),
        Ok(None) => Ok(Found::Unknown),
        Err(LedgerError::Corrupt { .. } | LedgerError::Sum { .. }) if id >= 1 && id <= total => {
            Ok(Found::Damaged(CORRUPT))
        }
        Err(LedgerError::Corrupt { .. } | LedgerError::Sum { .. }) => Ok(Found::Unknown),
        Err(e) => Err(e),
    }
}

/// The run's task count as a reader may trust it: the ledger's `total`, or an error when it is
/// missing while task records exist (a damaged key would otherwise make every task vanish).
pub fn total(t: &crate::ledger::ReadTxn<'_>) -> Result<u64, LedgerError> {
    if let Some(n) = t.meta_u64("total")? {
        return Ok(n);
    }
    // No count: an empty run, or damage. Only the damaged case walks far.
    if t.range(1..u64::MAX).map_or(true, |r| !r.is_empty()) {
        return Err(LedgerError::Damaged {
            path: t.path().into(),
            why: "it holds task records but no task count".into(),
        });
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::{DB_META, DB_TASKS};
    use crate::ledger::Ledger;

    /// A ledger of tasks 1..=5, with 2's record damaged in place and 4's gone (a key flipped
    /// elsewhere), as a flipped bit on disk leaves them.
    fn damaged(name: &str) -> (std::path::PathBuf, Ledger) {
        let d = std::env::temp_dir().join(format!("htc-vouch-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let l = Ledger::create(&d.join("ledger.mdb")).unwrap();
        let mut t = l.write().unwrap();
        for id in 1..=5 {
            t.append(id, &Record::default()).unwrap();
        }
        t.put_meta("total", &5u64.to_le_bytes()).unwrap();
        t.commit().unwrap();
        let mut t = l.write().unwrap();
        t.apply_entry(true, DB_TASKS, &2u64.to_be_bytes(), &[7; 12]).unwrap();
        t.apply_entry(false, DB_TASKS, &4u64.to_be_bytes(), &[]).unwrap();
        t.commit().unwrap();
        (d, l)
    }

    fn words(found: &[(u64, Found)]) -> Vec<(u64, &'static str)> {
        let w = |f: &Found| match f {
            Found::Record(_) => "ok",
            Found::Damaged(why) => why,
            Found::Unknown => "unknown",
        };
        found.iter().map(|(id, f)| (*id, w(f))).collect()
    }

    #[test]
    fn every_task_the_run_has_gets_an_answer_and_damage_is_one() {
        let (d, l) = damaged("answers");
        let r = l.read().unwrap();
        assert_eq!(total(&r).unwrap(), 5);
        let expect = [(1, "ok"), (2, CORRUPT), (3, "ok"), (4, MISSING), (5, "ok")];
        assert_eq!(words(&range(&r, 0..u64::MAX, 5).unwrap()), expect, "the walk");
        assert_eq!(words(&range(&r, 3..5, 5).unwrap()), expect[2..4], "a slice of it");
        assert_eq!(
            words(&tasks(&r, &[4, 2, 9, 1], 5).unwrap()),
            [(4, MISSING), (2, CORRUPT), (9, "unknown"), (1, "ok")]
        );
        drop(r);
        let _ = std::fs::remove_dir_all(d);
    }

    #[test]
    fn records_without_a_count_are_damage_and_no_records_an_empty_run() {
        let (d, l) = damaged("count");
        let mut t = l.write().unwrap();
        t.apply_entry(false, DB_META, b"total", &[]).unwrap();
        t.commit().unwrap();
        let e = total(&l.read().unwrap()).unwrap_err().to_string();
        assert!(e.contains("no task count"), "{e}");
        let mut t = l.write().unwrap();
        for id in 1..=5u64 {
            t.apply_entry(false, DB_TASKS, &id.to_be_bytes(), &[]).unwrap();
        }
        t.commit().unwrap();
        assert_eq!(total(&l.read().unwrap()).unwrap(), 0);
        let _ = std::fs::remove_dir_all(d);
    }
}
