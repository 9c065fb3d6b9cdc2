//! An open run through the core: tasks added while it runs (all or nothing, keys, waits), and
//! its end (closed, or idle too long).

use super::*;
use htc_core::after::{Kind, Needs};

fn task(line: u64, cmd: &str) -> NewTask {
    NewTask {
        line,
        command: cmd.as_bytes().to_vec(),
        shell: false,
        shape: TaskShape::default(),
        needs: Needs::default(),
        rules: Default::default(),
        key: None,
        name: None,
        class: None,
    }
}

fn keyed(line: u64, cmd: &str, key: &str) -> NewTask {
    NewTask { key: Some(key.as_bytes().to_vec()), ..task(line, cmd) }
}

fn after(line: u64, cmd: &str, id: u64) -> NewTask {
    let mut needs = Needs::default();
    needs.push(id..=id, Kind::After);
    NewTask { needs, ..task(line, cmd) }
}

/// The answers in `out`, by request.
fn answers(out: &Effects) -> Vec<(u64, Answer)> {
    out.iter()
        .filter_map(|e| match e {
            Effect::Added { request, answer } => Some((*request, answer.clone())),
            _ => None,
        })
        .collect()
}

fn add(request: u64, tasks: Vec<NewTask>) -> Input {
    Input::Add { request, tasks }
}

/// `feed`, then the commit's acks and answers.
fn feed_committed(c: &mut Core<'_>, m: &mut Mem, events: Vec<Input>) -> (Effects, Option<Ending>) {
    let (mut out, end) = feed(c, m, events);
    c.acks(&mut out);
    (out, end)
}

#[test]
fn an_open_run_takes_tasks_runs_them_and_ends_only_once_closed() {
    let mut m = Mem::default();
    let mut c = core(&m, 1).open(None);
    let (out, end) = feed(&mut c, &mut m, vec![join(0, 2), want(0, 8)]);
    assert_eq!((dispatched(&out), end), (vec![], None), "nothing to do is not the end of an open run");
    // The agent asked already: what arrives goes to it at once, not at its next report.
    let (out, _) = feed(&mut c, &mut m, vec![add(7, vec![task(1, "a"), task(2, "b")])]);
    assert!(answers(&out).is_empty(), "no id before its commit");
    let mut acks = Vec::new();
    c.acks(&mut acks);
    assert_eq!(answers(&acks), [(7, Ok(vec![1, 2]))]);
    assert_eq!(dispatched(&out), [(0, vec![(1, 1), (2, 1)])]);
    let Some(Effect::ToAgent(0, ToAgent::Dispatch(sent))) = out.iter().find(|e| matches!(e, Effect::ToAgent(..)))
    else {
        unreachable!()
    };
    assert_eq!(sent[1].command, b"b", "an added task's command is its own");
    let (_, end) = feed(&mut c, &mut m, vec![result(0, 1, 1, 1, 0), result(0, 2, 2, 1, 0)]);
    assert_eq!(end, None, "done, but open");
    let (out, end) = feed(&mut c, &mut m, vec![Input::Close { cancel: false }]);
    assert_eq!(end, Some(Ending::Complete));
    assert!(answers(&out).is_empty());
    let (out, _) = feed(&mut c, &mut m, vec![add(8, vec![task(1, "late")])]);
    assert!(matches!(&answers(&out)[..], [(8, Err(why))] if why.contains("closed")), "{out:?}");
}

#[test]
fn a_request_is_added_all_or_nothing_and_a_key_adds_once() {
    let mut m = Mem::default();
    let mut c = core(&m, 1).open(None);
    // The second line names a task that would come after it: nothing of the request is added.
    let (out, _) = feed(&mut c, &mut m, vec![add(1, vec![task(1, "a"), after(2, "b", 3), task(3, "c")])]);
    assert!(matches!(&answers(&out)[..], [(1, Err(why))] if why.starts_with("2: task 3 is not before")), "{out:?}");
    assert_eq!((m.records.len(), c.counts().total()), (0, 0));
    // Keys: the same key, in one request or the next, is the same task.
    let (out, _) = feed_committed(
        &mut c,
        &mut m,
        vec![
            add(2, vec![keyed(1, "a", "k1"), keyed(2, "a", "k1"), task(3, "b")]),
            add(3, vec![keyed(1, "a", "k1"), after(2, "c", 1)]),
        ],
    );
    assert_eq!(answers(&out), [(2, Ok(vec![1, 1, 2])), (3, Ok(vec![1, 3]))]);
    assert_eq!((m.records.len(), c.counts().total()), (3, 3));
    assert_eq!(c.waiting(), 1, "task 3 waits for task 1");
    // The same key with another command, in a later request or within one, is refused, and
    // nothing of that request is added.
    let (out, _) = feed_committed(
        &mut c,
        &mut m,
        vec![
            add(4, vec![task(1, "d"), keyed(2, "a changed", "k1")]),
            add(5, vec![keyed(1, "e", "k2"), keyed(2, "f", "k2")]),
        ],
    );
    let refused = answers(&out);
    assert!(
        matches!(&refused[..], [(4, Err(a)), (5, Err(b))]
            if a.starts_with("2: key \"k1\" names task 1, added with another command (\"a\")")
            && b.starts_with("2: key \"k2\" names task 4")),
        "{refused:?}"
    );
    assert_eq!(m.records.len(), 3, "nothing of either request was added");
}

#[test]
fn an_added_task_waits_for_a_running_one_and_a_cancel_of_what_it_needs_cancels_it() {
    let mut m = Mem::default();
    let mut c = core(&m, 1).open(None);
    let (out, _) = feed_committed(&mut c, &mut m, vec![join(0, 2), add(1, vec![task(1, "a")]), want(0, 8)]);
    assert_eq!(dispatched(&out), [(0, vec![(1, 1)])]);
    assert_eq!(answers(&out), [(1, Ok(vec![1]))]);
    let (out, _) = feed_committed(&mut c, &mut m, vec![add(2, vec![after(1, "b", 1), after(2, "c", 2)]), want(0, 8)]);
    assert_eq!(answers(&out), [(2, Ok(vec![2, 3]))]);
    assert!(dispatched(&out).is_empty(), "both wait: {out:?}");
    let (out, _) = feed(&mut c, &mut m, vec![result(0, 1, 1, 1, 0), want(0, 8)]);
    assert_eq!(dispatched(&out), [(0, vec![(2, 1)])]);
    let (out, _) = feed(&mut c, &mut m, vec![Input::Cancel { ids: vec![2] }]);
    assert_eq!(sent(&out).collect::<Vec<_>>(), [(0, &ToAgent::Preempt(vec![2]))]);
    assert_eq!((m.state(2), m.state(3)), (State::Cancelled, State::Cancelled));
    assert_eq!(m.records[&3].cancelled_by(), Some(2));
    assert_eq!(m.records[&2].cancelled_by(), None, "a user's");
}

#[test]
fn an_open_run_idle_for_its_idle_time_ends_and_close_with_cancel_stops_what_it_holds() {
    let mut m = Mem::default();
    let mut c = core(&m, 1).open(Some(1_000_000));
    let (_, end) = feed_at(&mut c, &mut m, 0, vec![join(0, 1), add(1, vec![task(1, "a")])]);
    assert_eq!(end, None);
    // Busy with task 1 (pending) for longer than the idle time: not idle.
    let (_, end) = feed_at(&mut c, &mut m, 5_000_000, vec![Input::Tick]);
    assert_eq!(end, None);
    let (_, end) = feed_at(&mut c, &mut m, 5_000_001, vec![Input::Close { cancel: true }]);
    assert_eq!((end, m.state(1)), (Some(Ending::Complete), State::Cancelled));

    let mut m = Mem::default();
    let mut c = core(&m, 1).open(Some(1_000_000));
    let (_, end) = feed_at(&mut c, &mut m, 0, vec![join(0, 1)]);
    assert_eq!(end, None);
    let (_, end) = feed_at(&mut c, &mut m, 999_000, vec![Input::Tick]);
    assert_eq!(end, None);
    let (_, end) = feed_at(&mut c, &mut m, 1_000_000, vec![Input::Tick]);
    assert_eq!(end, Some(Ending::Complete), "idle for its idle time");
}

fn classed(line: u64, cmd: &str, class: &str) -> NewTask {
    NewTask { class: Some(class.into()), ..task(line, cmd) }
}

#[test]
fn an_added_task_s_class_is_the_run_s_by_name_and_a_request_past_the_last_class_adds_nothing() {
    let mut m = Mem { classes: vec!["long".into()], ..Default::default() };
    let mut c = core(&m, 1).open(None);
    let (out, _) = feed_committed(
        &mut c,
        &mut m,
        vec![add(1, vec![classed(1, "a", "short"), task(2, "b"), classed(3, "c", "long"), classed(4, "d", "short")])],
    );
    assert_eq!(answers(&out), [(1, Ok(vec![1, 2, 3, 4]))]);
    let class = |m: &Mem, id| m.records[&id].shape().class;
    assert_eq!((class(&m, 1), class(&m, 2), class(&m, 3), class(&m, 4)), (2, 0, 1, 2));
    assert_eq!(m.classes, ["long", "short"], "a new name is the run's next class");
    m.classes = (1..htc_core::taskfile::MAX_CLASSES).map(|i| format!("c{i}")).collect();
    let (out, _) = feed_committed(&mut c, &mut m, vec![add(2, vec![task(1, "e"), classed(2, "f", "one-more")])]);
    let [(2, Err(why))] = &answers(&out)[..] else { panic!("{:?}", answers(&out)) };
    assert!(why.starts_with("2: class one-more would be one more"), "{why}");
    assert_eq!((m.records.len(), m.classes.len()), (4, htc_core::taskfile::MAX_CLASSES - 1), "nothing added");
}
