//! Scripted: each test feeds the loop what a runner would and reads the effects it answers.

use super::*;
use crate::shape::TaskShape;

const GRACE: u64 = 1_000;

fn task(id: u64, f: impl FnOnce(&mut TaskShape)) -> TaskToRun {
    let mut shape = TaskShape::default();
    f(&mut shape);
    TaskToRun::new(id, 1, b"x".to_vec()).shaped(shape)
}

fn plain(id: u64) -> TaskToRun {
    task(id, |_| {})
}

/// Starts what may start at `now` and says each start went well; the effects, starts first.
fn start_all(l: &mut SpawnLoop, now: u64) -> Vec<Effect> {
    let mut out = Vec::new();
    while l.start(now, None, &mut out) {}
    let starts: Vec<usize> =
        out.iter().filter_map(|e| if let Effect::Start(s) = e { Some(*s) } else { None }).collect();
    for s in starts {
        l.started(s, now, &mut out);
    }
    out
}

fn started_slots(out: &[Effect]) -> Vec<usize> {
    out.iter().filter_map(|e| if let Effect::Start(s) = e { Some(*s) } else { None }).collect()
}

fn ids_in(l: &SpawnLoop) -> Vec<(usize, u64)> {
    l.runs().map(|(s, r)| (s, r.task.id)).collect()
}

#[test]
fn tasks_take_the_first_free_slots_and_a_wide_one_waits_for_all_its_cores() {
    let mut l = SpawnLoop::new(3, 0, GRACE);
    let mut out = Vec::new();
    let wide = task(3, |s| s.cores = 2);
    l.command(0, Command::Run(vec![plain(1), plain(2), wide, task(4, |s| s.cores = 9)]), &mut out);
    let out = start_all(&mut l, 0);
    assert_eq!(started_slots(&out), vec![0, 1]);
    assert_eq!(ids_in(&l), vec![(0, 1), (1, 2)], "task 3 needs two of the three");
    let (_, f) = l.exited(0, 50, Exit::Exited(0), None).unwrap();
    assert_eq!((f.id, f.ended.outcome, f.ended.start_us, f.ended.end_us), (1, Outcome::Exited, 0, 50));
    let out = start_all(&mut l, 50);
    assert_eq!(ids_in(&l), vec![(0, 3), (1, 2)]);
    assert_eq!(l.run(0).unwrap().slots, vec![0, 2], "slots 0 and 2 were free");
    // Task 4 reaches the head and is wider than the loop: refused, not waited for.
    let refused = out.iter().any(|e| {
        matches!(e, Effect::Report(ExecEvent::Finished(f)) if f.id == 4 && f.ended.outcome == Outcome::SpawnFailed && f.ended.value == errno::E2BIG)
    });
    assert!(refused, "{out:?}");
    assert_eq!(l.queued(), 0);
}

#[test]
fn past_its_limit_a_task_is_stopped_then_killed_after_the_grace_and_ends_timed_out() {
    let mut l = SpawnLoop::new(1, 0, GRACE);
    let mut out = Vec::new();
    l.command(0, Command::Run(vec![task(1, |s| s.timeout_ms = 2)]), &mut out);
    start_all(&mut l, 100);
    assert_eq!(l.next_deadline(), Some(2_100), "counted from its start");
    let mut out = Vec::new();
    l.tick(2_099, &mut out);
    assert!(out.is_empty());
    l.tick(2_100, &mut out);
    assert_eq!(out, vec![Effect::Stop(0, Why::TimedOut)]);
    out.clear();
    l.tick(3_100, &mut out);
    assert_eq!(out, vec![Effect::Kill(0)], "still there after the grace");
    let (_, f) = l.exited(0, 3_200, Exit::Signaled(9), None).unwrap();
    assert_eq!((f.ended.outcome, f.ended.value), (Outcome::TimedOut, 9));
}

#[test]
fn a_deadline_of_a_task_that_ended_does_not_touch_the_next_in_its_slot() {
    let mut l = SpawnLoop::new(1, 0, GRACE);
    let mut out = Vec::new();
    l.command(0, Command::Run(vec![task(1, |s| s.timeout_ms = 5), plain(2)]), &mut out);
    start_all(&mut l, 0);
    l.exited(0, 10, Exit::Exited(0), None).unwrap();
    start_all(&mut l, 10);
    assert_eq!(ids_in(&l), vec![(0, 2)]);
    let mut out = Vec::new();
    l.tick(5_000, &mut out);
    assert!(out.is_empty(), "task 1's limit is not task 2's: {out:?}");
}

#[test]
fn a_higher_priority_head_stops_the_newest_lower_preemptible_task_and_starts_when_it_ends() {
    let mut l = SpawnLoop::new(2, 0, GRACE);
    let mut out = Vec::new();
    let low = |id| task(id, |s| s.preemptible = true);
    l.command(0, Command::Run(vec![low(1)]), &mut out);
    start_all(&mut l, 0);
    l.command(5, Command::Run(vec![low(2)]), &mut out);
    start_all(&mut l, 5);
    l.command(10, Command::Run(vec![task(3, |s| s.priority = 5)]), &mut out);
    let out = start_all(&mut l, 10);
    assert_eq!(out, vec![Effect::Stop(1, Why::Preempted)], "task 2 is the newest");
    assert!(start_all(&mut l, 11).is_empty(), "what is stopping is counted: nothing more is stopped");
    let (_, f) = l.exited(1, 20, Exit::Signaled(15), None).unwrap();
    assert_eq!((f.id, f.ended.outcome, f.ended.value), (2, Outcome::Preempted, 15));
    start_all(&mut l, 20);
    assert_eq!(ids_in(&l), vec![(0, 1), (1, 3)]);
}

#[test]
fn a_stop_ends_a_queued_task_at_once_and_stops_a_running_one() {
    let mut l = SpawnLoop::new(1, 0, GRACE);
    let mut out = Vec::new();
    l.command(0, Command::Run(vec![plain(1), plain(2), plain(3)]), &mut out);
    start_all(&mut l, 0);
    let mut out = Vec::new();
    l.command(7, Command::Stop(vec![1, 2]), &mut out);
    assert!(matches!(&out[..], [
        Effect::Report(ExecEvent::Finished(f)),
        Effect::Stop(0, Why::Preempted),
    ] if f.id == 2 && f.ended.outcome == Outcome::Preempted && f.ended.start_us == 7));
    out.clear();
    l.command(8, Command::Recall(vec![3]), &mut out);
    assert!(matches!(&out[..], [Effect::Report(ExecEvent::Recalled { id: 3, .. })]), "{out:?}");
    assert_eq!(l.queued(), 0);
}

#[test]
fn an_abort_stops_everything_its_ends_are_no_results_and_the_loop_is_then_done() {
    let mut l = SpawnLoop::new(2, 0, GRACE);
    let mut out = Vec::new();
    l.command(0, Command::Run(vec![plain(1), plain(2), plain(3)]), &mut out);
    start_all(&mut l, 0);
    let mut out = Vec::new();
    l.abandoned(5, &mut out);
    assert_eq!(out, vec![Effect::Stop(0, Why::Dropped), Effect::Stop(1, Why::Dropped)]);
    assert_eq!(l.queued(), 0, "the queue is dropped");
    assert!(!l.is_done(), "two still run");
    l.command(6, Command::Run(vec![plain(4)]), &mut out);
    assert_eq!(l.queued(), 0, "nothing is queued after an abort");
    for s in [0, 1] {
        let (r, _) = l.exited(s, 9, Exit::Signaled(15), None).unwrap();
        assert!(!l.is_result(r.task.id, r.task.attempt));
    }
    assert!(l.is_done());
    assert!(start_all(&mut l, 10).is_empty());
}

#[test]
fn a_reset_is_done_once_the_last_task_ended() {
    let mut l = SpawnLoop::new(1, 0, GRACE);
    let mut out = Vec::new();
    l.command(0, Command::Run(vec![plain(1), plain(2)]), &mut out);
    start_all(&mut l, 0);
    l.command(1, Command::Reset, &mut out);
    assert!(!l.reset_done(), "task 1 still runs");
    l.exited(0, 2, Exit::Signaled(15), None).unwrap();
    assert!(l.reset_done());
    assert!(!l.reset_done(), "said once");
    l.command(3, Command::Run(vec![plain(5)]), &mut out);
    start_all(&mut l, 3);
    assert_eq!(ids_in(&l), vec![(0, 5)], "after a reset the loop takes work again");
}

#[test]
fn a_task_over_its_memory_is_killed_once_and_ends_out_of_memory_whatever_its_limit_says() {
    let mut l = SpawnLoop::new(1, 0, GRACE);
    let mut out = Vec::new();
    l.command(0, Command::Run(vec![task(1, |s| s.timeout_ms = 1)]), &mut out);
    start_all(&mut l, 0);
    let mut out = Vec::new();
    l.out_of_memory(0, 300, &mut out);
    l.out_of_memory(0, 310, &mut out);
    assert_eq!(out, vec![Effect::Kill(0)]);
    out.clear();
    l.tick(1_000, &mut out);
    assert!(out.is_empty(), "being killed, it is not also timed out");
    let (_, f) = l.exited(0, 1_100, Exit::Signaled(9), None).unwrap();
    assert_eq!((f.ended.outcome, f.ended.value), (Outcome::OutOfMemory, 300));
    // The kernel's kill, seen by the runner, counts the same.
    l.command(2, Command::Run(vec![plain(2)]), &mut out);
    start_all(&mut l, 2);
    let (_, f) = l.exited(0, 3, Exit::Signaled(9), Some(64)).unwrap();
    assert_eq!((f.ended.outcome, f.ended.value), (Outcome::OutOfMemory, 64));
}

#[test]
fn a_task_idle_for_its_stuck_is_stopped_then_killed_and_ends_stuck_and_a_busy_one_is_not() {
    const S: u64 = 1_000_000;
    let mut l = SpawnLoop::new(3, 0, GRACE);
    let mut out = Vec::new();
    let tasks = vec![task(1, |s| s.stuck_s = 2), task(2, |s| s.stuck_s = 2), plain(3)];
    l.command(0, Command::Run(tasks), &mut out);
    start_all(&mut l, 0);
    let mut due = Vec::new();
    l.looks_due(S - 1, &mut due);
    assert!(due.is_empty(), "first looked at one interval after the start");
    assert_eq!(l.next_look(), Some(S));
    let idle = Some(crate::stuck::Sample { cpu_us: 1_000, io_bytes: 0 });
    let mut busy = crate::stuck::Sample::default();
    for t in 1..=2 {
        due.clear();
        l.looks_due(t * S, &mut due);
        assert_eq!(due, [0, 1], "the watched ones, not task 3");
        let mut out = Vec::new();
        busy.cpu_us += 500_000;
        l.looked(t * S, 0, idle, &mut out);
        l.looked(t * S, 1, Some(busy), &mut out);
        if t == 2 {
            assert_eq!(out, vec![Effect::Stop(0, Why::Stuck)]);
        } else {
            assert!(out.is_empty());
        }
    }
    due.clear();
    l.looks_due(10 * S, &mut due);
    assert_eq!(due, [1], "a task being stopped is looked at no more");
    let mut out = Vec::new();
    l.tick(2 * S + GRACE, &mut out);
    assert_eq!(out, vec![Effect::Kill(0)], "still there after the grace");
    let (_, f) = l.exited(0, 2 * S + GRACE + 5, Exit::Signaled(9), None).unwrap();
    assert_eq!((f.ended.outcome, f.ended.value), (Outcome::Stuck, 2));
    l.exited(1, 3 * S, Exit::Exited(0), None).unwrap();
    assert_eq!(l.next_look(), None, "no watch left");
}

#[test]
fn a_start_that_takes_devices_ends_the_batch_and_one_put_back_keeps_its_place() {
    let mut l = SpawnLoop::new(4, 2, GRACE);
    let mut out = Vec::new();
    l.command(0, Command::Run(vec![task(1, |s| s.gpus = 1), plain(2), plain(3)]), &mut out);
    let mut out = Vec::new();
    assert!(l.start(0, Some(2), &mut out), "stops after the device task");
    assert_eq!(out, vec![Effect::Start(0)]);
    // Another loop took the devices first: back to the head, and nothing behind it jumps ahead.
    l.put_back(0);
    assert_eq!((l.running(), l.queued()), (0, 3));
    out.clear();
    assert!(!l.start(0, Some(0), &mut out));
    assert!(out.is_empty(), "task 1 waits for a device, at the head: {out:?}");
    assert!(l.start(0, Some(1), &mut out));
    assert!(!l.start(0, Some(0), &mut out));
    assert_eq!(started_slots(&out), vec![0, 1, 2]);
}

#[test]
fn a_lost_status_is_recorded_lost_and_a_failed_spawn_frees_its_slots() {
    let mut l = SpawnLoop::new(2, 0, GRACE);
    let mut out = Vec::new();
    l.command(0, Command::Run(vec![plain(1), task(2, |s| s.cores = 2)]), &mut out);
    let mut out = Vec::new();
    l.start(0, None, &mut out);
    let (_, f) = l.spawn_failed(0, 4, errno::ENOENT).unwrap();
    assert_eq!((f.id, f.ended.outcome, f.ended.value), (1, Outcome::SpawnFailed, errno::ENOENT));
    start_all(&mut l, 4);
    assert_eq!(ids_in(&l), vec![(0, 2)], "both slots were free again");
    let (_, f) = l.exited(0, 5, Exit::Lost(10), None).unwrap();
    assert_eq!((f.ended.outcome, f.ended.value), (Outcome::Lost, 10));
    assert!(l.exited(0, 6, Exit::Exited(0), None).is_none(), "told twice, it knows the slot is free");
}
