//! `htc retry`: finished tasks put back to pending as a new round of attempts of the same run,
//! in the ledger the next session reads: the run directory's own, or, for a run whose ledger
//! lived on a node, its replica (rebuilt, changed, and written back as a new generation).

use std::ops::RangeInclusive;
use std::path::Path;

use anyhow::{bail, Context};
use htc_core::attempts::AttemptEnd;
use htc_core::task::Step;

use crate::ledger::{Change, Ledger, Reads, State, WriteTxn};
use crate::replica::Replica;
use crate::rundir::RunDir;

/// Which tasks run again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pick {
    /// Every task that failed for good, and the tasks cancelled because one of them did not
    /// succeed (`after=`): they wait for it again.
    Failed,
    /// These ids (those not finished are left as they are: they run anyway).
    Tasks(Vec<RangeInclusive<u64>>),
}

/// What a reopening did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reopened {
    pub done: u64,
    pub failed: u64,
    pub cancelled: u64,
    /// Chosen, but not finished (pending): left to run as they are.
    pub unfinished: u64,
    /// Chosen ids without a record (a damaged ledger).
    pub missing: u64,
    /// Finished, but with no attempts left to give (`task::MAX_ATTEMPTS`).
    pub worn_out: u64,
}

impl Reopened {
    pub fn total(&self) -> u64 {
        self.done + self.failed + self.cancelled
    }
}

/// Puts the picked finished tasks back to pending, each with `retries` retries of its own.
pub fn reopen(t: &mut WriteTxn<'_>, ids: impl Iterator<Item = u64>, retries: u8) -> anyhow::Result<Reopened> {
    let mut counts = t.meta("counts")?.and_then(|b| crate::ledger::decode_counts(&b)).unwrap_or_default();
    let mut n = Reopened::default();
    for id in ids {
        let Some(mut r) = t.get(id)? else {
            n.missing += 1;
            continue;
        };
        let from = r.state();
        let Ok((life, _)) = counts.step(r.life(), Step::Rerun { retries }) else {
            if from.is_final() {
                n.worn_out += 1;
            } else {
                n.unfinished += 1;
            }
            continue;
        };
        // The record holds the last attempt only: into the history with it, as a retry does
        // (not a refusal: the task needed more than any node has, and its last run, if any,
        // is in the history already; nor a task cancelled before it started).
        use crate::ledger::Outcome::{Cancelled, Unschedulable};
        if r.outcome() != Unschedulable && (r.start_us() != 0 || r.outcome() != Cancelled) {
            t.apply(&Change::Attempt(id, r.last_attempt()))?;
        }
        // A task whose attempts grow and that failed of its own (out of memory, say) starts
        // its new round asking what its next attempt does; one that never ran keeps its ask.
        if r.shape().rules && from == State::Failed && AttemptEnd::of(r.outcome(), r.value() as u32).is_some() {
            if let Some(rules) = Reads::rules(t, id)? {
                *r.shape_mut() = rules.shape_at(r.shape(), life.attempts() as u32 + 1);
            }
        }
        r.set_life(life);
        match from {
            State::Failed => {
                t.apply(&Change::Failed(id, false))?;
                n.failed += 1;
            }
            State::Cancelled => n.cancelled += 1,
            _ => n.done += 1,
        }
        t.apply(&Change::Record(id, r))?;
    }
    t.put_counts(&counts)?;
    Ok(n)
}

/// The ids `pick` names in `ledger`, in order.
fn picked(ledger: &Ledger, pick: &Pick) -> anyhow::Result<Vec<u64>> {
    let t = ledger.read()?;
    Ok(match pick {
        Pick::Failed => {
            let mut ids = t.failed_ids(usize::MAX)?;
            if t.counts()?.get(State::Cancelled) > 0 {
                // Cancelled for a failure (each names the failure that began it): they wait
                // for its new round, as the ledger's needs say.
                let failed: std::collections::HashSet<u64> = ids.iter().copied().collect();
                t.for_each(|id, r| {
                    if r.state() == State::Cancelled && r.cancelled_by().is_some_and(|f| failed.contains(&f)) {
                        ids.push(id);
                    }
                })?;
                ids.sort_unstable();
            }
            ids
        }
        Pick::Tasks(ranges) => {
            let total = t.meta_u64("total")?.unwrap_or(0);
            if let Some(r) = ranges.iter().find(|r| *r.end() > total) {
                bail!("no task {}: the run has {total} tasks", if *r.start() > total { *r.start() } else { total + 1 });
            }
            let mut v: Vec<u64> = ranges.iter().flat_map(|r| r.clone()).collect();
            v.sort_unstable();
            v.dedup();
            v
        }
    })
}

fn reopen_in(path: &Path, pick: &Pick, retries: u8) -> anyhow::Result<(Ledger, Reopened)> {
    let ledger = Ledger::open(path, false).with_context(|| format!("opening {}", path.display()))?;
    let ids = picked(&ledger, pick)?;
    let mut t = ledger.write()?;
    let n = reopen(&mut t, ids.into_iter(), retries)?;
    t.commit()?;
    ledger.sync()?;
    Ok((ledger, n))
}

/// Reopens the picked tasks of the run at `dir`, whose leader must not be running (the caller
/// holds the run's lock). A replicated ledger is rebuilt from its replica in a private scratch
/// directory and written back as the replica's next generation.
pub fn reopen_run(dir: &Path, pick: &Pick, retries: u8) -> anyhow::Result<Reopened> {
    let run = RunDir::new(dir);
    if run.ledger().exists() {
        return Ok(reopen_in(&run.ledger(), pick, retries)?.1);
    }
    let replica = Replica::of(dir);
    if !replica.exists() {
        bail!("{} has no ledger (neither ledger.mdb nor a replica in ledger/)", dir.display());
    }
    let scratch = std::env::temp_dir().join(format!("htc-{}", nix::unistd::getuid()));
    crate::replica::private_dir(&scratch).map_err(anyhow::Error::msg)?;
    let copy = scratch.join(format!("retry-{}-{}.mdb", run.id(), std::process::id()));
    let result = (|| {
        drop(replica.restore(&copy)?);
        let (ledger, n) = reopen_in(&copy, pick, retries)?;
        // The journal it starts is empty: nothing more is written to this copy.
        drop(replica.begin(&ledger).context("writing the ledger's new snapshot into the run directory")?);
        Ok(n)
    })();
    crate::replica::remove_node_local(&copy);
    // Unless another copy is in it, as `RunDir::open_for_reading`'s readers leave it.
    let _ = std::fs::remove_dir(&scratch);
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{Counts, Record};
    use htc_core::task::{End, Step};

    /// A task with 2 retries whose third attempt ends it as `s` (none for a pending one).
    fn three_attempts_to(s: State) -> Vec<Step> {
        let fail = Step::Finish(End::Failed { permanent: false });
        let last = match s {
            State::Pending => return Vec::new(),
            State::Done => Step::Finish(End::Succeeded),
            _ => fail,
        };
        [Step::Dispatch, Step::Start, fail, Step::Dispatch, Step::Start, fail, Step::Dispatch, Step::Start, last]
            .to_vec()
    }

    fn ledger_with(states: &[State]) -> (Ledger, std::path::PathBuf) {
        let d = std::env::temp_dir().join(format!("htc-rerun-{}-{}", std::process::id(), states.len()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let l = Ledger::create(&d.join("ledger.mdb")).unwrap();
        let mut t = l.write().unwrap();
        let mut c = Counts::default();
        for (i, &s) in states.iter().enumerate() {
            let r = Record::default().walked(&three_attempts_to(s)).unwrap();
            t.append(i as u64 + 1, &r).unwrap();
            if s == State::Failed {
                t.apply(&Change::Failed(i as u64 + 1, true)).unwrap();
            }
            c.add(s);
        }
        t.put_counts(&c).unwrap();
        t.put_meta("total", &(states.len() as u64).to_le_bytes()).unwrap();
        t.commit().unwrap();
        (l, d)
    }

    #[test]
    fn failed_tasks_go_back_to_pending_with_a_round_of_their_own() {
        use State::*;
        let (l, d) = ledger_with(&[Done, Failed, Pending, Failed]);
        let ids = picked(&l, &Pick::Failed).unwrap();
        assert_eq!(ids, [2, 4]);
        let mut t = l.write().unwrap();
        let n = reopen(&mut t, ids.into_iter(), 0).unwrap();
        t.commit().unwrap();
        assert_eq!(n, Reopened { done: 0, failed: 2, ..Default::default() });
        let r = l.read().unwrap();
        assert_eq!(r.counts().unwrap(), Counts([3, 0, 0, 1, 0, 0]));
        assert!(r.failed_ids(10).unwrap().is_empty());
        let rec = r.get(2).unwrap().unwrap();
        assert_eq!((rec.state(), rec.attempts(), rec.shape().retries), (Pending, 3, 3), "one more attempt, the 4th");
        assert_eq!(r.attempts(2).unwrap().last().map(|a| a.attempt), Some(3), "the 3rd kept in the history");
        drop(r);
        // By id: a done one reruns, a pending one is left, an id past the end is not there.
        let e = picked(&l, &Pick::Tasks(htc_core::idset::parse("1,3-9").unwrap())).unwrap_err();
        assert_eq!(e.to_string(), "no task 5: the run has 4 tasks");
        let ids = picked(&l, &Pick::Tasks(htc_core::idset::parse("3,1,1-1").unwrap())).unwrap();
        assert_eq!(ids, [1, 3]);
        let mut t = l.write().unwrap();
        let n = reopen(&mut t, [1, 3, 9].into_iter(), 2).unwrap();
        assert_eq!(n, Reopened { done: 1, failed: 0, cancelled: 0, unfinished: 1, missing: 1, worn_out: 0 });
        drop(t);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
