//! Nodes given back at the run's tail (`core::give_back`).

use super::*;
use crate::leader::core::give_back::{IDLE_US, OPEN_IDLE_US};

fn started(agent: u32, seq: u64, ids: &[u64]) -> Input {
    let started = ids.iter().map(|&id| msg::Started { id, attempt: 1, start_us: 1 }).collect();
    Input::Report { agent, report: msg::Report { seq, started, ..Default::default() } }
}

fn given_back(out: &Effects) -> Option<Vec<String>> {
    out.iter().rev().find_map(|e| match e {
        Effect::GiveBack { nodes } => Some(nodes.clone()),
        _ => None,
    })
}

/// Three one-core agents on node0 (the leader's), node1 and node2, each running one of the
/// three tasks: the run's core and the id of the task each agent runs.
fn three_running(m: &mut Mem) -> (Core<'static>, BTreeMap<u32, u64>) {
    let mut c = core(m, 3).giving_back_nodes("node0".into());
    let (out, _) = feed(&mut c, m, vec![join(0, 1), join(1, 1), join(2, 1), want(0, 1), want(1, 1), want(2, 1)]);
    let on: BTreeMap<u32, u64> = dispatched(&out).into_iter().map(|(a, t)| (a, t[0].0)).collect();
    assert_eq!(on.len(), 3, "{out:?}");
    let starts: Vec<Input> = on.iter().map(|(&a, &id)| started(a, 0, &[id])).collect();
    feed_at(&mut c, m, 2_000, starts);
    (c, on)
}

/// Once all that is left runs, a node whose agents hold nothing is told to leave; when they
/// have gone (not a loss), the node goes back. The leader's node stays, idle or not.
#[test]
fn an_idle_node_goes_back_once_all_that_is_left_runs() {
    let mut m = Mem::with(3, 0, 1);
    let (mut c, on) = three_running(&mut m);
    let (out, _) = feed_at(&mut c, &mut m, 3_000, vec![result(2, 1, on[&2], 1, 0), Input::Tick]);
    assert!(stopped(&out).is_empty(), "not before it stood idle for IDLE_US: {out:?}");
    let (out, _) = feed_at(&mut c, &mut m, 3_001 + IDLE_US, vec![Input::Tick]);
    assert!(told(&out, 2, Stop::Hold), "{out:?}");
    assert!(!stopped(&out).contains(&1) && !stopped(&out).contains(&0), "{out:?}");
    assert_eq!(given_back(&out), None, "not before its agent has gone");
    let (out, end) =
        feed_at(&mut c, &mut m, 4_000 + IDLE_US, vec![Input::Lost { agent: 2, why: "connection closed".into() }]);
    assert_eq!(given_back(&out), Some(vec!["node2".to_string()]));
    assert_eq!(end, None);
    assert_eq!(c.turnout.last_loss(), None, "its going is not a loss");
    // The leader's node holds nothing now either: it stays; node1 goes when it is done.
    let (out, _) = feed_at(&mut c, &mut m, 5_000 + IDLE_US, vec![result(0, 1, on[&0], 1, 0), Input::Tick]);
    let (out2, _) = feed_at(&mut c, &mut m, 6_000 + 3 * IDLE_US, vec![Input::Tick]);
    assert!(stopped(&out).is_empty() && stopped(&out2).is_empty(), "{out:?} {out2:?}");
    let (out, _) = feed_at(&mut c, &mut m, 7_000 + 3 * IDLE_US, vec![result(1, 1, on[&1], 1, 0), Input::Tick]);
    assert_eq!(c.ending(), Some(Ending::Complete), "{out:?}");
    assert_eq!(c.nodes_given_back(), ["node2"]);
}

/// While a task waits (to be handed out, or queued behind a busy slot), an idle node may get it:
/// nothing goes back.
#[test]
fn nothing_goes_back_while_a_task_waits() {
    let mut m = Mem::with(4, 0, 1);
    let (mut c, on) = three_running(&mut m);
    let (out, _) = feed_at(&mut c, &mut m, 3_000, vec![result(2, 1, on[&2], 1, 0), Input::Tick]);
    let (out2, _) = feed_at(&mut c, &mut m, 3_001 + IDLE_US, vec![Input::Tick]);
    assert!(stopped(&out).is_empty() && stopped(&out2).is_empty(), "task 4 is not handed out yet: {out:?} {out2:?}");
    // Now every task is out: the one handed to agent 2 queued, not started.
    let (out, _) = feed_at(&mut c, &mut m, 3_500, vec![want(2, 1)]);
    assert_eq!(dispatched(&out).len(), 1, "the last task goes to the idle agent: {out:?}");
    let (out, _) = feed_at(&mut c, &mut m, 4_000 + IDLE_US, vec![Input::Tick]);
    assert!(stopped(&out).is_empty(), "it is queued there, not started: {out:?}");
    let (out, _) = feed_at(&mut c, &mut m, 4_500 + IDLE_US, vec![result(1, 1, on[&1], 1, 0), Input::Tick]);
    feed_at(&mut c, &mut m, 5_000 + 3 * IDLE_US, vec![Input::Tick]);
    assert!(stopped(&out).is_empty(), "agent 2's task has not started: {out:?}");
}

/// Without `giving_back_nodes` (a local run, `--htc-keep-nodes`), every node stays.
#[test]
fn a_run_that_keeps_its_nodes_gives_none_back() {
    let mut m = Mem::with(3, 0, 1);
    let mut c = core(&m, 3);
    let (out, _) = feed(&mut c, &mut m, vec![join(0, 1), join(1, 1), join(2, 1), want(0, 1), want(1, 1), want(2, 1)]);
    let on: BTreeMap<u32, u64> = dispatched(&out).into_iter().map(|(a, t)| (a, t[0].0)).collect();
    feed_at(&mut c, &mut m, 2_000, on.iter().map(|(&a, &id)| started(a, 0, &[id])).collect());
    let (out, _) = feed_at(&mut c, &mut m, 3_000, vec![result(2, 1, on[&2], 1, 0), Input::Tick]);
    let (out2, _) = feed_at(&mut c, &mut m, 4_000 + 2 * OPEN_IDLE_US, vec![Input::Tick]);
    assert!(stopped(&out).is_empty() && stopped(&out2).is_empty(), "{out:?} {out2:?}");
}

/// An open run that takes tasks gives an idle node back only after `OPEN_IDLE_US`: the next
/// add may need it.
#[test]
fn an_open_run_gives_a_node_back_after_it_stood_idle() {
    let mut m = Mem::with(3, 0, 1);
    let (c, on) = three_running(&mut m);
    let mut c = c.open(None);
    let (out, _) = feed_at(&mut c, &mut m, 3_000, vec![result(2, 1, on[&2], 1, 0), Input::Tick]);
    assert!(stopped(&out).is_empty(), "{out:?}");
    let (out, _) = feed_at(&mut c, &mut m, 3_001 + OPEN_IDLE_US - 10, vec![Input::Tick]);
    assert!(stopped(&out).is_empty(), "{out:?}");
    let (out, _) = feed_at(&mut c, &mut m, 3_001 + OPEN_IDLE_US, vec![Input::Tick]);
    assert!(told(&out, 2, Stop::Hold), "{out:?}");
}

/// The site may have an open run's nodes stand idle longer or shorter than `OPEN_IDLE_US`
/// (`open_idle_before_give_back`): the node goes after that, not before, and a closed run's
/// `IDLE_US` is not changed by it.
#[test]
fn an_open_run_s_idle_time_is_the_site_s() {
    let mut m = Mem::with(3, 0, 1);
    let (c, on) = three_running(&mut m);
    let mut c = c.open(None).open_idle_before_give_back(5_000_000);
    let (out, _) = feed_at(&mut c, &mut m, 3_000, vec![result(2, 1, on[&2], 1, 0), Input::Tick]);
    assert!(stopped(&out).is_empty(), "{out:?}");
    let (out, _) = feed_at(&mut c, &mut m, 3_001 + 5_000_000 - 10, vec![Input::Tick]);
    assert!(stopped(&out).is_empty(), "not before the site's 5 s: {out:?}");
    let (out, _) = feed_at(&mut c, &mut m, 3_001 + 5_000_000, vec![Input::Tick]);
    assert!(told(&out, 2, Stop::Hold), "after 5 s, not OPEN_IDLE_US: {out:?}");

    let mut m = Mem::with(3, 0, 1);
    let (c, on) = three_running(&mut m);
    let mut c = c.open_idle_before_give_back(60_000_000);
    let (out, _) = feed_at(&mut c, &mut m, 3_000, vec![result(2, 1, on[&2], 1, 0), Input::Tick]);
    assert!(stopped(&out).is_empty(), "{out:?}");
    let (out, _) = feed_at(&mut c, &mut m, 3_001 + IDLE_US, vec![Input::Tick]);
    assert!(told(&out, 2, Stop::Hold), "a run that takes no tasks keeps IDLE_US: {out:?}");
}

/// An open run with every task done waits for its next ones: its nodes but the leader's go
/// back after standing idle `OPEN_IDLE_US`, and what is added then runs on the node it kept.
#[test]
fn an_open_run_with_nothing_to_do_gives_back_all_but_the_leader_s_node() {
    let mut m = Mem::with(3, 0, 1);
    let (c, on) = three_running(&mut m);
    let mut c = c.open(None);
    let ends: Vec<Input> = on.iter().map(|(&a, &id)| result(a, 1, id, 1, 0)).chain([Input::Tick]).collect();
    let (out, _) = feed_at(&mut c, &mut m, 3_000, ends);
    assert!(stopped(&out).is_empty(), "not before they stood idle: {out:?}");
    let (out, _) = feed_at(&mut c, &mut m, 3_010 + OPEN_IDLE_US, vec![Input::Tick]);
    assert!(told(&out, 1, Stop::Hold) && told(&out, 2, Stop::Hold), "{out:?}");
    assert!(!stopped(&out).contains(&0), "the leader's node stays: {out:?}");
    let lost = |a: u32| Input::Lost { agent: a, why: "connection closed".into() };
    let (out, end) = feed_at(&mut c, &mut m, 4_010 + OPEN_IDLE_US, vec![lost(1), lost(2)]);
    assert_eq!(given_back(&out), Some(vec!["node1".to_string(), "node2".to_string()]));
    assert_eq!(end, None, "the open run goes on");
    assert_eq!(c.turnout.last_loss(), None, "their going is no loss");
}
