//! `Core::explain` through scripted runs: each answer where the core's state gives it.

use super::*;
use crate::leader::core::explain::{Ask, Why};

fn why(c: &Core<'_>, m: &Mem, id: u64) -> Why {
    c.explain(id, &m.records[&id], None)
}

#[test]
fn a_waiting_task_is_told_what_holds_it_and_the_most_room_free() {
    // One agent of 4 cores and 1000 MiB: 1 and 2 (400 MiB each) are sent, 3 (400) waits with
    // the reservation, 4 (400) behind it, 5 asks more than the agent has (it fails), 6 asks nothing (and
    // goes out beside 1 and 2).
    let mut m = Mem::with(6, 0, 1);
    for (id, mb) in [(1, 400), (2, 400), (3, 400), (4, 400), (5, 5000)] {
        m.records.get_mut(&id).unwrap().shape_mut().mem_mb = mb;
    }
    let mut c = core(&m, 1);
    assert_eq!(why(&c, &m, 1), Why::NoAgent);
    let joined = Input::Joined { agent: 0, cores: 4, mem_mb: 1000, gpus: 0, hostname: "n0".into() };
    let (out, _) = feed(&mut c, &mut m, vec![joined, want(0, 2)]);
    assert_eq!(dispatched(&out), vec![(0, vec![(1, 1), (2, 1)])]);
    assert_eq!(why(&c, &m, 1), Why::Held { agent: 0, host: "n0".into() });
    feed(&mut c, &mut m, vec![want(0, 4)]);
    let ask = Ask { cores: 1, mem_mb: 400, gpus: 0 };
    assert_eq!(why(&c, &m, 3), Why::NoRoom { ask, free: Ask { cores: 1, mem_mb: 200, gpus: 0 } });
    assert_eq!(why(&c, &m, 4), Why::Reserved { behind: 3, agent: 0 });
    assert_eq!(why(&c, &m, 5), Why::Ended, "with every agent there, it failed at once");
    assert_eq!(why(&c, &m, 6), Why::Held { agent: 0, host: "n0".into() }, "it fits beside them");
    let (_, _) = feed(&mut c, &mut m, vec![report(0, 1, 1, &[(1, 1)])]);
    assert_eq!(why(&c, &m, 1), Why::Ended);
}

#[test]
fn a_task_waiting_for_others_is_told_which() {
    let mut m = Mem::with(3, 0, 1);
    let mut c = core(&m, 1);
    let mut needs = htc_core::after::Needs::default();
    needs.push(1..=2, crate::leader::core::deps::Kind::After);
    c.depend(&mut m, 3, &needs).unwrap();
    assert!(c.waits_for_others(3) && !c.waits_for_others(2));
    feed(&mut c, &mut m, vec![join(0, 1)]);
    assert!(matches!(why(&c, &m, 1), Why::Queued { .. }), "not asked for yet: {:?}", why(&c, &m, 1));
    assert_eq!(c.explain(3, &m.records[&3], Some((vec![1, 2], 0))), Why::After { open: vec![1, 2], more: 0 });
    assert_eq!(Why::After { open: vec![1, 2], more: 0 }.words(), "waiting for tasks 1-2 to end");
    assert_eq!(Why::After { open: vec![7], more: 40 }.words(), "waiting for tasks 7 and 40 more to end");
}

#[test]
fn a_task_bigger_than_every_agent_so_far_waits_for_one_that_can_hold_it() {
    // Two agents expected, one joined: a bigger one may join yet.
    let mut m = Mem::with(1, 0, 1);
    m.records.get_mut(&1).unwrap().shape_mut().mem_mb = 5000;
    let mut c = core(&m, 2);
    let joined = Input::Joined { agent: 0, cores: 4, mem_mb: 1000, gpus: 0, hostname: "n0".into() };
    feed(&mut c, &mut m, vec![joined, want(0, 2)]);
    let big = Ask { cores: 1, mem_mb: 5000, gpus: 0 };
    assert_eq!(why(&c, &m, 1), Why::TooBig { ask: big, largest: Ask { cores: 4, mem_mb: 1000, gpus: 0 } });
    assert!(why(&c, &m, 1).words().contains("1 core, 5000 MiB (the largest has 4 cores, 1000 MiB)"));
}
