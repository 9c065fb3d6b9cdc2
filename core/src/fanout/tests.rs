//! The fan-out's decisions, scripted: what each spawner is told, in order, for the commands
//! the agent's machine gives and what the spawners report.

use super::*;
use crate::record::{Ended, Outcome};
use crate::shape::TaskShape;
use crate::work::Finished;

/// Task `id` asking `cores`.
fn task(id: u64, cores: u16) -> TaskToRun {
    TaskToRun::new(id, 1, Vec::new()).shaped(TaskShape { cores, ..Default::default() })
}

/// Effects as one word each: `2:run 5 6`, `4:hold`, `4:go`, `1:finish`, `ended 7`.
fn said(out: Vec<Effect>) -> Vec<String> {
    out.into_iter()
        .map(|e| match e {
            Effect::Send(i, Command::Run(ts)) => {
                format!("{i}:run {}", ts.iter().map(|t| t.id.to_string()).collect::<Vec<_>>().join(" "))
            }
            Effect::Send(i, Command::Hold(true)) => format!("{i}:hold"),
            Effect::Send(i, Command::Hold(false)) => format!("{i}:go"),
            Effect::Send(i, c) => format!("{i}:{}", format!("{c:?}").to_lowercase()),
            Effect::Ended(ExecEvent::Finished(f)) => format!("ended {} {:?}", f.id, f.ended.outcome),
            Effect::Ended(e) => format!("ended {e:?}"),
        })
        .collect()
}

fn cmd(f: &mut Fanout, c: Command) -> Vec<String> {
    let mut out = Vec::new();
    f.command(c, 1_000, &mut out);
    said(out)
}

fn report(f: &mut Fanout, i: usize, batch: &[ExecEvent]) -> Vec<String> {
    let mut out = Vec::new();
    f.reported(i, batch, 2_000, &mut out);
    said(out)
}

fn done(id: u64) -> ExecEvent {
    ExecEvent::Finished(Finished { id, attempt: 1, ended: Ended::new(Outcome::Exited, 0, 1, 2) })
}

fn started(id: u64) -> ExecEvent {
    ExecEvent::Started { id, attempt: 1, start_us: 1 }
}

#[test]
fn one_spawner_takes_everything_as_it_comes() {
    let mut f = Fanout::new(Spread::new(vec![4]));
    assert_eq!(cmd(&mut f, Command::Run(vec![task(1, 2), task(2, 8)])), ["0:run 1 2"]);
    assert_eq!(cmd(&mut f, Command::Finish), ["0:finish"]);
}

#[test]
fn a_wide_task_holds_its_spawner_until_the_loops_it_borrows_are_empty() {
    // Four one-CPU loops (0-3) and the wide spawner (4).
    let mut f = Fanout::new(Spread::with_wide(4));
    assert_eq!(cmd(&mut f, Command::Run(vec![task(1, 1), task(2, 1)])), ["0:run 1", "1:run 2"]);
    // Two cores: loops 0 and 1 are lent, and they still run tasks 1 and 2.
    assert_eq!(cmd(&mut f, Command::Run(vec![task(3, 2)])), ["4:hold", "4:run 3"]);
    // New narrow tasks go to the loops not lent.
    assert_eq!(cmd(&mut f, Command::Run(vec![task(4, 1), task(5, 1)])), ["2:run 4", "3:run 5"]);
    assert_eq!(report(&mut f, 0, &[started(1), done(1)]), Vec::<String>::new(), "loop 1 still runs");
    assert_eq!(report(&mut f, 1, &[started(2), done(2)]), ["4:go"], "both lent loops are empty");
    // Its task ended: the loops are the loops' again, the first one the least loaded.
    assert_eq!(report(&mut f, 4, &[started(3), done(3)]), Vec::<String>::new());
    assert_eq!(cmd(&mut f, Command::Run(vec![task(6, 1)])), ["0:run 6"]);
}

#[test]
fn told_to_finish_while_its_gate_is_shut_the_wide_spawner_is_told_once_it_opens() {
    let mut f = Fanout::new(Spread::with_wide(2));
    cmd(&mut f, Command::Run(vec![task(1, 1)]));
    assert_eq!(cmd(&mut f, Command::Run(vec![task(2, 2)])), ["2:hold", "2:run 2"]);
    assert_eq!(cmd(&mut f, Command::Finish), ["0:finish", "1:finish"], "not the wide one yet");
    assert_eq!(report(&mut f, 0, &[started(1), done(1)]), ["2:go", "2:finish"]);
}

#[test]
fn while_every_loop_is_lent_narrow_tasks_wait_here_and_the_loops_finish_after_them() {
    let mut f = Fanout::new(Spread::with_wide(2));
    // The wide task borrows both loops: nothing runs on them, so its gate is open at once.
    assert_eq!(cmd(&mut f, Command::Run(vec![task(1, 2)])), ["2:run 1"]);
    assert_eq!(cmd(&mut f, Command::Run(vec![task(2, 1), task(3, 1)])), Vec::<String>::new(), "they wait");
    assert_eq!(cmd(&mut f, Command::Finish), ["2:finish"], "the loops wait for the tasks waiting for them");
    assert_eq!(report(&mut f, 2, &[started(1), done(1)]), ["0:run 2", "1:run 3", "0:finish", "1:finish"]);
}

#[test]
fn tasks_waiting_here_end_here_when_stopped_or_asked_back() {
    let mut f = Fanout::new(Spread::with_wide(2));
    cmd(&mut f, Command::Run(vec![task(1, 2)]));
    cmd(&mut f, Command::Run(vec![task(2, 1), task(3, 1)]));
    assert_eq!(cmd(&mut f, Command::Stop(vec![2])), ["ended 2 Preempted", "0:stop([2])", "1:stop([2])", "2:stop([2])"]);
    assert_eq!(
        cmd(&mut f, Command::Recall(vec![3])),
        ["ended Recalled { id: 3, attempt: 1 }", "0:recall([3])", "1:recall([3])", "2:recall([3])"]
    );
    // Nothing waits any more: the wide task's end brings nothing to the loops.
    assert_eq!(report(&mut f, 2, &[started(1), done(1)]), Vec::<String>::new());
}

#[test]
fn the_agent_s_hold_holds_the_wide_spawner_too_and_is_said_once() {
    let mut f = Fanout::new(Spread::with_wide(2));
    assert_eq!(cmd(&mut f, Command::Hold(true)), ["0:hold", "1:hold", "2:hold"]);
    assert_eq!(cmd(&mut f, Command::Run(vec![task(1, 2)])), ["2:run 1"], "already held: not said again");
    assert_eq!(cmd(&mut f, Command::Hold(false)), ["0:go", "1:go", "2:go"]);
}

#[test]
fn a_reset_is_done_once_every_spawner_said_so_and_drops_what_waits() {
    let mut f = Fanout::new(Spread::with_wide(2));
    cmd(&mut f, Command::Run(vec![task(1, 2)]));
    cmd(&mut f, Command::Run(vec![task(2, 1)]));
    assert_eq!(cmd(&mut f, Command::Reset), ["0:reset", "1:reset", "2:reset"]);
    let mut out = Vec::new();
    assert!(!f.reported(0, &[ExecEvent::Reset], 0, &mut out));
    assert!(!f.reported(2, &[ExecEvent::Reset], 0, &mut out));
    assert!(f.reported(1, &[ExecEvent::Reset], 0, &mut out));
    assert!(out.is_empty(), "the waiting task went with the reset: {:?}", said(out));
    // The loops are back: a narrow task goes to one.
    assert_eq!(cmd(&mut f, Command::Run(vec![task(3, 1)])), ["0:run 3"]);
}

#[test]
fn a_spawner_that_ends_unasked_is_a_failure_and_the_others_are_aborted() {
    let mut f = Fanout::new(Spread::with_wide(2));
    let mut out = Vec::new();
    assert!(f.ended(1, &mut out));
    assert_eq!(said(out), ["0:abort", "1:abort", "2:abort"]);
    let mut out = Vec::new();
    assert!(!f.ended(0, &mut out), "the others were told to stop");
    let mut f = Fanout::new(Spread::new(vec![2]));
    cmd(&mut f, Command::Finish);
    assert!(!f.ended(0, &mut Vec::new()), "told to finish: the normal end");
}

#[test]
fn tasks_stuck_behind_a_busy_loop_are_asked_back_on_a_tick_when_another_idles() {
    let mut f = Fanout::new(Spread::new(vec![1, 1]));
    assert_eq!(cmd(&mut f, Command::Run(vec![task(1, 1), task(2, 1), task(3, 1)])), ["0:run 1 3", "1:run 2"]);
    report(&mut f, 0, &[started(1)]);
    report(&mut f, 1, &[started(2), done(2)]);
    let tick = |f: &mut Fanout, now_us| {
        let mut out = Vec::new();
        f.tick(now_us, &mut out);
        said(out)
    };
    assert_eq!(tick(&mut f, 2_000 + STUCK_AFTER_US - 1), Vec::<String>::new(), "not long enough");
    assert_eq!(tick(&mut f, 2_000 + STUCK_AFTER_US), ["0:recall([3])"]);
    assert_eq!(tick(&mut f, 3_000 + STUCK_AFTER_US), Vec::<String>::new(), "asked once");
}
