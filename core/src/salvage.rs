//! What a session that ended badly (its leader killed, its job requeued, a full disk) had been
//! told but had not committed, salvaged when the run goes on.
//!
//! The leader commits results in groups and acknowledges them after: a leader killed between an
//! agent's report and the commit loses what that report said, and in-flight tasks are the
//! leader's memory, not its disk. So every agent journals each start and end before the report
//! that carries it leaves (`htc_exec::results`). The next session reads those journals before it
//! opens the ledger for work, and [`salvage`] decides, task by task, what the ledger must say:
//!
//! - an attempt that ended is recorded as it ended (done, failed, or failed and retried), as if
//!   its report had been committed: it does not run again;
//! - an attempt that started and did not end was interrupted: its number stays used and the
//!   attempt history gets a row for it (`Outcome::Interrupted`), so that its re-run is a new
//!   attempt that `$HTC_ATTEMPT` and `htc log` show; it costs the task no retry.
//!
//! Pure: records and journal entries in, the record and the changes out.

use crate::record::{Attempt, Change, Ended, Outcome, Record};
use crate::task::{Effect, State, Step};

/// One journal entry: an agent started an attempt of a task, or told how it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Told {
    pub agent: u32,
    pub id: u64,
    pub attempt: u32,
    pub start_us: u64,
    /// How it ended, and when; `None` for a start.
    pub end: Option<(Outcome, i32, u64)>,
}

/// Whether agents of the session that ended may still hold its tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Survivors {
    /// None do (a resume, a requeue): what started and did not end was interrupted.
    None,
    /// Some may (a hand-over: agents that kept running come to the new leader with what they
    /// hold): only ends are salvaged, and what started waits for its agent's word.
    Maybe,
}

/// Attempt `t.attempt` ended as `t` says, having started at `start_us`: the record moved to its
/// end, a retry's attempt row and a failure written. Says whether the task is now final.
fn finish(id: u64, rec: &mut Record, out: &mut Vec<Change>, t: &Told, start_us: u64) -> Option<bool> {
    let (outcome, value, end_us) = t.end.expect("an end");
    if rec.state() == State::Dispatched && outcome.ran() {
        take(rec, Step::Start)?;
    }
    let before = rec.life();
    let (life, effect) = crate::task::step(before, Step::Finish(outcome.end(value))).ok()?;
    rec.set_ended(t.agent, Ended::new(outcome, value, start_us, end_us));
    if effect == Effect::Retry {
        let row = Attempt { attempt: before.attempt_no().min(255) as u8, agent: t.agent, ended: rec.ended() };
        out.push(Change::Attempt(id, row));
    }
    rec.set_life(life);
    if life.state() == State::Failed {
        out.push(Change::Failed(id, true));
    }
    Some(life.state().is_final())
}

/// What the ledger must say of task `r` given what its agents journaled (`told`, in any order,
/// only this task's). `None` when the record stands as it is. `now_us` ends an interrupted
/// attempt. The changes are in the order to apply; the record's own change is the last.
pub fn salvage(id: u64, r: &Record, told: &[Told], survivors: Survivors, now_us: u64) -> Option<Vec<Change>> {
    let from = r.state();
    if from.is_final() {
        return None;
    }
    let mut rec = *r;
    let mut out = Vec::new();
    // The attempt the ledger has in flight, else the last it counted.
    let mut at = rec.attempt_no();
    let mut told: Vec<&Told> = told.iter().filter(|t| t.id == id).collect();
    // By attempt, an end after a start of the same attempt.
    told.sort_by_key(|t| (t.attempt, t.end.is_some()));
    let mut i = 0;
    while i < told.len() {
        let a = told[i].attempt;
        let mut group = told[i..].iter().take_while(|t| t.attempt == a);
        let start = group.clone().map(|t| t.start_us).find(|&s| s != 0).unwrap_or(0);
        let ended = group.find(|t| t.end.is_some()).copied();
        i += told[i..].iter().take_while(|t| t.attempt == a).count();
        let in_flight = rec.state().in_flight();
        if a < at || (a == at && !in_flight) {
            continue; // recorded already
        }
        if in_flight && a > at {
            // The attempt in flight in the ledger left no word: interrupted before a later one.
            let started = (rec.state() == State::Running).then(|| (rec.agent(), rec.start_us()));
            interrupt(id, &mut rec, &mut out, started, now_us)?;
        }
        // Numbers between the last counted and this one were dispatches that came back
        // unstarted (reclaims the ledger never saw): they stay used.
        while !rec.state().in_flight() && rec.attempt_no() + 1 < a {
            take(&mut rec, Step::Dispatch)?;
            take(&mut rec, Step::Reclaim)?;
        }
        // What an agent that brings this attempt to a new leader finds: adopted, it is `a`.
        let held = rec;
        if !rec.state().in_flight() {
            take(&mut rec, Step::Dispatch)?;
        }
        if rec.attempt_no() != a {
            // A journal this ledger cannot place: what came before it stands, and this is left.
            return changed(id, held, r, out);
        }
        match ended {
            Some(t) => {
                if finish(id, &mut rec, &mut out, t, start)? {
                    break;
                }
            }
            None => {
                if rec.state() == State::Dispatched {
                    take(&mut rec, Step::Start)?;
                }
                if survivors == Survivors::Maybe && !held.state().in_flight() {
                    // Its agent may bring it to the new leader, which adopts it as this very
                    // attempt: nothing is decided for it here.
                    return changed(id, held, r, out);
                }
                let agent = told.iter().find(|t| t.attempt == a).map_or(0, |t| t.agent);
                interrupt(id, &mut rec, &mut out, Some((agent, start)), now_us)?;
            }
        }
        at = rec.attempt_no();
    }
    if rec.state().in_flight() {
        // In flight in the ledger with no end journaled (a ledger written by an older leader).
        let started = (rec.state() == State::Running).then(|| (rec.agent(), rec.start_us()));
        interrupt(id, &mut rec, &mut out, started, now_us)?;
    }
    changed(id, rec, r, out)
}

/// The attempt in flight was interrupted: its number stays used, and a row says so when it is
/// known to have started (`started`: its agent and start).
fn interrupt(id: u64, rec: &mut Record, out: &mut Vec<Change>, started: Option<(u32, u64)>, now_us: u64) -> Option<()> {
    let attempt = rec.attempt_no().min(255) as u8;
    take(rec, Step::Interrupt)?;
    if let Some((agent, start_us)) = started {
        let ended = Ended::new(Outcome::Interrupted, 0, start_us, now_us.max(start_us));
        rec.set_ended(agent, ended);
        out.push(Change::Attempt(id, Attempt { attempt, agent, ended }));
    }
    Some(())
}

fn take(rec: &mut Record, s: Step) -> Option<()> {
    rec.take(s).ok().map(|_| ())
}

fn changed(id: u64, rec: Record, before: &Record, mut out: Vec<Change>) -> Option<Vec<Change>> {
    if rec == *before && out.is_empty() {
        return None;
    }
    out.push(Change::Record(id, rec));
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::path_to;

    fn pending() -> Record {
        Record::default()
    }
    fn start(agent: u32, attempt: u32, at: u64) -> Told {
        Told { agent, id: 7, attempt, start_us: at, end: None }
    }
    fn end(agent: u32, attempt: u32, at: u64, outcome: Outcome, value: i32) -> Told {
        Told { agent, id: 7, attempt, start_us: at, end: Some((outcome, value, at + 5)) }
    }
    fn record_of(changes: &[Change]) -> Record {
        match changes.last() {
            Some(Change::Record(7, r)) => *r,
            other => panic!("the record's change comes last: {other:?}"),
        }
    }
    fn rows(changes: &[Change]) -> Vec<Attempt> {
        changes.iter().filter_map(|c| if let Change::Attempt(7, a) = c { Some(*a) } else { None }).collect()
    }

    #[test]
    fn an_end_the_ledger_never_committed_is_recorded_and_does_not_run_again() {
        let told = [start(1, 1, 100), end(1, 1, 100, Outcome::Exited, 0)];
        let c = salvage(7, &pending(), &told, Survivors::None, 999).expect("changed");
        let r = record_of(&c);
        assert_eq!((r.state(), r.attempt_no(), r.agent(), r.start_us(), r.end_us()), (State::Done, 1, 1, 100, 105));
        assert!(rows(&c).is_empty(), "the last attempt is the record's");
    }

    #[test]
    fn a_start_without_an_end_is_an_interrupted_attempt_with_its_row_and_its_number_used() {
        let c = salvage(7, &pending(), &[start(2, 1, 100)], Survivors::None, 999).expect("changed");
        let r = record_of(&c);
        assert_eq!((r.state(), r.attempts()), (State::Pending, 0), "it costs no retry");
        assert_eq!(r.attempt_no(), 1, "number 1 is used: the re-run is attempt 2");
        let row = rows(&c);
        assert_eq!(row.len(), 1);
        assert_eq!(
            (row[0].attempt, row[0].ended.outcome, row[0].agent, row[0].ended.start_us, row[0].ended.end_us),
            (1, Outcome::Interrupted, 2, 100, 999)
        );
    }

    #[test]
    fn a_failed_end_is_retried_with_its_row_then_a_later_start_is_interrupted() {
        let told = [end(0, 1, 100, Outcome::Exited, 3), start(0, 1, 100), start(1, 2, 200)];
        let mut r = pending();
        r.set_life(crate::task::Life::new(2));
        let c = salvage(7, &r, &told, Survivors::None, 999).expect("changed");
        let rows = rows(&c);
        assert_eq!(
            rows.iter().map(|a| (a.attempt, a.ended.outcome)).collect::<Vec<_>>(),
            [(1, Outcome::Exited), (2, Outcome::Interrupted)]
        );
        let r = record_of(&c);
        assert_eq!(
            (r.state(), r.attempts(), r.attempt_no()),
            (State::Pending, 1, 2),
            "one retry used; next is attempt 3"
        );
    }

    #[test]
    fn a_final_failure_goes_into_the_failed_index() {
        let mut r = pending();
        r.set_life(crate::task::Life::new(0));
        let c = salvage(7, &r, &[end(0, 1, 100, Outcome::Exited, 1)], Survivors::None, 999).expect("changed");
        assert!(c.contains(&Change::Failed(7, true)));
        assert_eq!(record_of(&c).state(), State::Failed);
    }

    #[test]
    fn what_the_ledger_recorded_already_is_left_alone() {
        let done = pending().walked(path_to(State::Done)).unwrap();
        assert_eq!(salvage(7, &done, &[start(0, 1, 1), end(0, 1, 1, Outcome::Exited, 0)], Survivors::None, 9), None);
        // Retried once and recorded pending: the journal's attempt 1 is old news.
        let mut r = pending();
        r.set_life(crate::task::Life::new(2));
        let r = r
            .walked(&[Step::Dispatch, Step::Start, Step::Finish(crate::task::End::Failed { permanent: false })])
            .unwrap();
        assert_eq!(salvage(7, &r, &[end(0, 1, 1, Outcome::Exited, 1)], Survivors::None, 9), None);
        assert_eq!(salvage(7, &pending(), &[], Survivors::None, 9), None);
    }

    #[test]
    fn numbers_of_dispatches_that_came_back_unseen_stay_used() {
        // Attempt 3 ran and ended: 1 and 2 were reclaimed unstarted in memory only.
        let c = salvage(7, &pending(), &[end(4, 3, 100, Outcome::Exited, 0)], Survivors::None, 9).expect("changed");
        let r = record_of(&c);
        assert_eq!((r.state(), r.attempt_no(), r.attempts(), r.agent()), (State::Done, 3, 1, 4));
    }

    #[test]
    fn in_flight_in_the_ledger_with_no_word_is_interrupted() {
        let running = pending().walked(&[Step::Dispatch, Step::Start]).unwrap();
        let c = salvage(7, &running, &[], Survivors::None, 9).expect("changed");
        assert_eq!(rows(&c).len(), 1, "it had started: a row");
        assert_eq!((record_of(&c).state(), record_of(&c).attempt_no()), (State::Pending, 1));
        let dispatched = pending().walked(&[Step::Dispatch]).unwrap();
        let c = salvage(7, &dispatched, &[], Survivors::None, 9).expect("changed");
        assert!(rows(&c).is_empty(), "never known to start: no row");
        // With the ledger's own attempt ended in the journal, it is recorded.
        let c = salvage(7, &running, &[end(0, 1, 1, Outcome::Exited, 0)], Survivors::None, 9).expect("changed");
        assert_eq!(record_of(&c).state(), State::Done);
    }

    #[test]
    fn with_agents_that_may_survive_only_ends_are_salvaged() {
        assert_eq!(salvage(7, &pending(), &[start(0, 1, 1)], Survivors::Maybe, 9), None, "its agent may bring it");
        let c = salvage(7, &pending(), &[end(0, 1, 1, Outcome::Exited, 0)], Survivors::Maybe, 9).expect("changed");
        assert_eq!(record_of(&c).state(), State::Done);
    }

    #[test]
    fn a_stale_end_is_not_believed_and_nothing_stays_in_flight() {
        // The ledger's attempt 2 is in flight and journaled as started; a stray entry names 1.
        let r = pending().walked(&[Step::Dispatch, Step::Reclaim, Step::Dispatch, Step::Start]).unwrap();
        assert_eq!(r.attempt_no(), 2);
        let c = salvage(7, &r, &[end(0, 1, 1, Outcome::Exited, 0)], Survivors::None, 9).expect("changed");
        let after = record_of(&c);
        assert!(!after.state().in_flight(), "nothing is left in flight: {after:?}");
        assert_ne!(after.state(), State::Done, "the stray end is not believed");
    }

    #[test]
    fn a_queued_refusal_without_a_start_is_recorded() {
        let told = [Told { agent: 0, id: 7, attempt: 1, start_us: 5, end: Some((Outcome::SpawnFailed, 7, 5)) }];
        let c = salvage(7, &pending(), &told, Survivors::None, 9).expect("changed");
        assert_eq!(record_of(&c).state(), State::Failed, "E2BIG is permanent");
    }
}
