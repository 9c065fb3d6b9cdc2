//! Attempts that grow and ends that are not retried (`attempts::Rules`), through the core: each
//! attempt placed by what it asks, one that outgrows every agent failed at once, and `retry_on=`
//! deciding which failures get another attempt.

use super::*;
use htc_core::attempts::{Growing, RetryOn, Rules};

/// Task `id` of `m` asks `mem_mb` and has `rules`.
fn with_rules(m: &mut Mem, id: u64, mem_mb: u32, rules: Rules) {
    let s = m.records.get_mut(&id).unwrap().shape_mut();
    s.mem_mb = mem_mb;
    s.rules = true;
    m.rules.insert(id, rules);
}

fn doubling(first_mb: u64) -> Rules {
    Rules { mem: Some(Growing::Times { first: first_mb, tenths: 20 }), ..Rules::default() }
}

/// Attempt `attempt` of task `id` ended as `outcome` (`value`), on `agent`.
fn ended(agent: u32, id: u64, attempt: u32, outcome: Outcome, value: i32) -> Input {
    let r = msg::TaskResult { id, attempt, ended: Ended { outcome, value, ..Ended::NONE }, ..Default::default() };
    Input::Report { agent, report: msg::Report { want: 1, results: vec![r], ..Default::default() } }
}

/// (id, attempt, mem_mb) of every task sent in `out`.
fn sent_asks(out: &Effects) -> Vec<(u64, u32, u32)> {
    sent(out)
        .filter_map(|(_, m)| match m {
            ToAgent::Dispatch(tasks) => {
                Some(tasks.iter().map(|t| (t.id, t.attempt, t.shape.mem_mb)).collect::<Vec<_>>())
            }
            _ => None,
        })
        .flatten()
        .collect()
}

fn agent(cores: u32, mem_mb: u64) -> Input {
    Input::Joined { agent: 0, cores, mem_mb, gpus: 0, hostname: "n0".into() }
}

#[test]
fn an_attempt_out_of_memory_is_retried_asking_twice_and_waits_for_the_room() {
    // One agent of 4 cores and 1000 MiB; task 1 asks 400 MiB, doubling; 2 and 3 ask 300.
    let mut m = Mem::with(3, 2, 1);
    with_rules(&mut m, 1, 400, doubling(400));
    m.records.get_mut(&2).unwrap().shape_mut().mem_mb = 300;
    m.records.get_mut(&3).unwrap().shape_mut().mem_mb = 300;
    let mut c = core(&m, 1);
    let (out, _) = feed(&mut c, &mut m, vec![agent(4, 1000), want(0, 4)]);
    assert_eq!(sent_asks(&out), [(1, 1, 400), (2, 1, 300), (3, 1, 300)]);
    // Its first attempt runs out: the second asks 800, which waits while 2 and 3 hold 600.
    let (out, _) = feed(&mut c, &mut m, vec![ended(0, 1, 1, Outcome::OutOfMemory, 420)]);
    assert_eq!(sent_asks(&out), []);
    assert_eq!(m.records[&1].shape().mem_mb, 800, "the record holds the next attempt's ask");
    let (out, _) = feed(&mut c, &mut m, vec![report(0, 1, 1, &[(2, 1)])]);
    assert_eq!(sent_asks(&out), [], "800 beside 3's 300 does not fit");
    let (out, _) = feed(&mut c, &mut m, vec![report(0, 1, 2, &[(3, 1)])]);
    assert_eq!(sent_asks(&out), [(1, 2, 800)]);
    assert_eq!(c.mem.committed(0), Some((800, 1000)));
    let (_, end) = feed(&mut c, &mut m, vec![report(0, 1, 4, &[(1, 2)])]);
    assert_eq!(end, Some(Ending::Complete));
    assert_eq!(m.state(1), State::Done);
    let first = m.attempts.iter().find(|(id, _)| *id == 1).map(|(_, a)| a.ended.outcome);
    assert_eq!(first, Some(Outcome::OutOfMemory), "its first attempt is in the history");
}

#[test]
fn an_attempt_that_outgrows_every_agent_fails_at_once_as_unschedulable() {
    let mut m = Mem::with(1, 5, 1);
    with_rules(&mut m, 1, 600, doubling(600));
    let mut c = core(&m, 1);
    let (out, _) = feed(&mut c, &mut m, vec![agent(2, 1000), want(0, 2)]);
    assert_eq!(sent_asks(&out), [(1, 1, 600)]);
    let (out, end) = feed(&mut c, &mut m, vec![ended(0, 1, 1, Outcome::OutOfMemory, 610)]);
    assert_eq!(sent_asks(&out), []);
    assert_eq!(end, Some(Ending::Complete), "its 1200 MiB fits no agent: it is not kept waiting");
    let r = m.records[&1];
    assert_eq!((r.state(), r.outcome(), r.shape().mem_mb), (State::Failed, Outcome::Unschedulable, 1200));
    assert_eq!(m.failed, [1]);
}

#[test]
fn retry_on_retries_the_ends_it_names_and_fails_the_others_for_good() {
    let oom_only = Rules { retry_on: Some(RetryOn::parse("oom/75").unwrap()), ..Rules::default() };
    let mut m = Mem::with(3, 3, 1);
    for id in 1..=3 {
        with_rules(&mut m, id, 0, oom_only.clone());
    }
    let mut c = core(&m, 1);
    let (out, _) = feed(&mut c, &mut m, vec![agent(3, 0), want(0, 3)]);
    assert_eq!(sent_asks(&out).len(), 3);
    let (out, _) = feed(
        &mut c,
        &mut m,
        vec![
            ended(0, 1, 1, Outcome::Exited, 1),
            ended(0, 2, 1, Outcome::OutOfMemory, 10),
            ended(0, 3, 1, Outcome::Exited, 75),
        ],
    );
    let again: Vec<u64> = sent_asks(&out).iter().map(|&(id, ..)| id).collect();
    assert_eq!(again, [2, 3], "out of memory and exit 75 are named; exit 1 is not");
    assert_eq!((m.state(1), m.records[&1].attempts()), (State::Failed, 1), "with retries left, it failed for good");
}

#[test]
fn tasks_without_rules_have_none_read() {
    let mut m = Mem::with(4, 1, 1);
    let mut c = core(&m, 1);
    feed(&mut c, &mut m, vec![join(0, 4), want(0, 4)]);
    feed(&mut c, &mut m, vec![result(0, 1, 1, 1, 3), report(0, 1, 1, &[(2, 1), (3, 1), (4, 1)])]);
    assert_eq!(m.rules_read.get(), 0);
}
