//! Dependencies and cancels through the core: tasks that wait are never handed out, the end of
//! what they wait for sends them to whoever asks next or cancels them, and a user's cancel stops
//! what runs without a retry.

use super::*;
use crate::leader::core::deps::{Added, Kind};

/// `list` as a task line's `after=`/`afterany=`.
fn on(list: &[(u64, Kind)]) -> htc_core::after::Needs {
    let mut n = htc_core::after::Needs::default();
    for &(id, k) in list {
        n.push(id..=id, k);
    }
    n
}

/// The ids in `out`'s dispatches, in order.
fn ids(out: &Effects) -> Vec<u64> {
    dispatched(out).into_iter().flat_map(|(_, t)| t.into_iter().map(|(id, _)| id)).collect()
}

#[test]
fn a_waiting_task_is_handed_out_only_once_what_it_waits_for_succeeded() {
    let mut m = Mem::with(3, 0, 1);
    let mut c = core(&m, 1);
    // 3 after 1, 2 after 3: the file's order, 1 3 2, is what the dependencies allow.
    assert_eq!(c.depend(&mut m, 3, &on(&[(1, Kind::After)])).unwrap(), Added::Waiting(1));
    assert_eq!(c.depend(&mut m, 2, &on(&[(3, Kind::After)])).unwrap(), Added::Waiting(1));
    assert_eq!(c.waiting(), 2);
    let (out, _) = feed(&mut c, &mut m, vec![join(0, 4), want(0, 8)]);
    assert_eq!(ids(&out), [1], "the others wait");
    let (out, _) = feed(&mut c, &mut m, vec![result(0, 1, 1, 1, 0), want(0, 8)]);
    assert_eq!(ids(&out), [3]);
    let (out, _) = feed(&mut c, &mut m, vec![result(0, 2, 3, 1, 0), want(0, 8)]);
    assert_eq!(ids(&out), [2]);
    let (_, end) = feed(&mut c, &mut m, vec![result(0, 3, 2, 1, 0)]);
    assert_eq!((end, c.waiting()), (Some(Ending::Complete), 0));
}

#[test]
fn a_range_of_dependencies_is_read_in_one_walk_and_what_it_releases_goes_out_in_order() {
    let mut m = Mem::with(7, 0, 1);
    let mut c = core(&m, 1);
    feed(&mut c, &mut m, vec![join(0, 1), want(0, 1), result(0, 1, 1, 1, 9)]);
    assert_eq!(m.state(1), State::Failed);
    for id in (3..=6).rev() {
        assert_eq!(c.depend(&mut m, id, &on(&[(2, Kind::After)])).unwrap(), Added::Waiting(1));
    }
    // 1 failed already (an afterany= end), 2 to 6 are open.
    let mut all = htc_core::after::Needs::default();
    all.push(1..=6, Kind::AfterAny);
    assert_eq!(c.depend(&mut m, 7, &all).unwrap(), Added::Waiting(5));
    let (out, _) = feed(&mut c, &mut m, vec![want(0, 8)]);
    assert_eq!(ids(&out), [2]);
    let (out, _) = feed(&mut c, &mut m, vec![result(0, 2, 2, 1, 0), want(0, 8)]);
    assert_eq!(ids(&out), [3, 4, 5, 6], "released together, handed out in id order");
}

#[test]
fn a_failure_for_good_cancels_after_dependents_and_releases_afterany_ones() {
    let mut m = Mem::with(4, 0, 1);
    let mut c = core(&m, 1);
    c.depend(&mut m, 2, &on(&[(1, Kind::After)])).unwrap();
    c.depend(&mut m, 3, &on(&[(2, Kind::After)])).unwrap();
    c.depend(&mut m, 4, &on(&[(1, Kind::AfterAny)])).unwrap();
    let (out, _) = feed(&mut c, &mut m, vec![join(0, 4), want(0, 8)]);
    assert_eq!(ids(&out), [1]);
    // No retries: its failure is final.
    let (out, _) = feed(&mut c, &mut m, vec![result(0, 1, 1, 1, 3), want(0, 8)]);
    assert_eq!((m.state(1), m.state(2), m.state(3)), (State::Failed, State::Cancelled, State::Cancelled));
    assert_eq!(ids(&out), [4], "afterany= runs whatever the end");
    assert_eq!(c.counts().get(State::Cancelled), 2);
    let (_, end) = feed(&mut c, &mut m, vec![result(0, 2, 4, 1, 0)]);
    assert_eq!(end, Some(Ending::Complete));
    assert_eq!(c.counts(), m.counts());
}

#[test]
fn a_dependency_on_a_task_that_failed_already_cancels_at_once() {
    let mut m = Mem::with(3, 0, 1);
    let mut c = core(&m, 1);
    feed(&mut c, &mut m, vec![join(0, 1), want(0, 1), result(0, 1, 1, 1, 9)]);
    assert_eq!(m.state(1), State::Failed);
    assert_eq!(c.depend(&mut m, 3, &on(&[(1, Kind::After)])).unwrap(), Added::Cancelled { because: 1 });
    assert_eq!(m.state(3), State::Cancelled);
    assert_eq!(c.depend(&mut m, 2, &on(&[(1, Kind::AfterAny)])).unwrap(), Added::Ready);
}

#[test]
fn a_user_s_cancel_stops_what_runs_and_its_late_result_changes_nothing() {
    let mut m = Mem::with(4, 3, 1);
    let mut c = core(&m, 1);
    c.depend(&mut m, 4, &on(&[(2, Kind::After)])).unwrap();
    let (out, _) = feed(&mut c, &mut m, vec![join(0, 2), want(0, 2)]);
    assert_eq!(ids(&out), [1, 2]);
    // 2 runs, 3 waits in the plan, 4 waits for 2.
    let (out, _) = feed(&mut c, &mut m, vec![Input::Cancel { ids: vec![2, 3, 99] }]);
    assert_eq!(sent(&out).collect::<Vec<_>>(), [(0, &ToAgent::Preempt(vec![2]))], "only what runs is stopped");
    assert_eq!((m.state(2), m.state(3), m.state(4)), (State::Cancelled, State::Cancelled, State::Cancelled));
    // The agent says it stopped 2: that attempt has landed already, nothing is retried.
    let preempted = msg::TaskResult {
        id: 2,
        attempt: 1,
        ended: Ended { outcome: Outcome::Preempted, ..Ended::NONE },
        ..Default::default()
    };
    let stop =
        Input::Report { agent: 0, report: msg::Report { seq: 1, results: vec![preempted], ..Default::default() } };
    let (out, _) = feed(&mut c, &mut m, vec![stop, want(0, 8)]);
    assert!(ids(&out).is_empty(), "nothing left to run but task 1: {out:?}");
    assert_eq!(m.state(2), State::Cancelled);
    let (_, end) = feed(&mut c, &mut m, vec![result(0, 2, 1, 1, 0)]);
    assert_eq!(end, Some(Ending::Complete));
    assert_eq!((c.counts().get(State::Cancelled), c.counts().get(State::Done)), (3, 1));
    // A finished task is not cancelled.
    feed(&mut c, &mut m, vec![Input::Cancel { ids: vec![1] }]);
    assert_eq!(m.state(1), State::Done);
}
