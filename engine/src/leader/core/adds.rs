//! Tasks that arrive while the run runs (an open run, `htc run --open`): a request is added all
//! or nothing, each task under the next id or, with a key seen before, under the id that key got
//! then; a ready task goes to whoever asks next (`Arrivals`), one that waits waits (`deps`). And
//! the run's openness: it ends once it is closed and what it holds is done, or once it has been
//! idle for its idle time.

use super::deps::Added;
use super::open::{Answer, NewTask};
use super::prelude::*;
use super::records;
use htc_core::taskfile::MAX_CLASSES;

/// After each input: an open run with tasks not final is busy.
pub(super) fn note_busy(core: &mut Core<'_>) {
    if core.counts.unfinished() > 0 {
        if let Some(o) = core.open.as_mut() {
            o.busy_us = core.now_us;
        }
    }
}

/// `htc close`: no more tasks; with `cancel`, what is not final is cancelled too.
pub(super) fn close<E>(
    core: &mut Core<'_>,
    t: &mut dyn Tasks<Error = E>,
    cancel: bool,
    out: &mut Effects,
) -> Result<(), E> {
    if let Some(o) = core.open.as_mut() {
        o.closed = true;
    }
    if cancel {
        let mut ids = Vec::new();
        let mut id = 1;
        let next = t.next_id()?;
        while id < next {
            let chunk = t.range(id..(id + 65_536).min(next))?;
            ids.extend(chunk.into_iter().filter(|(_, r)| !r.state().is_final()).map(|(id, _)| id));
            id = (id + 65_536).min(next);
        }
        records::cancel(core, t, &ids, out)?;
    }
    Ok(())
}

/// A client's request: every task added, or none with the reason.
pub(super) fn add<E>(
    core: &mut Core<'_>,
    t: &mut dyn Tasks<Error = E>,
    request: u64,
    tasks: Vec<NewTask>,
    out: &mut Effects,
) -> Result<(), E> {
    let answer = add_all(core, t, tasks)?;
    if let Some(o) = core.open.as_mut() {
        o.busy_us = core.now_us;
    }
    // Ids are given only once their tasks are committed (`acks`); a refusal wrote nothing.
    let answer = Effect::Added { request, answer };
    match answer {
        Effect::Added { answer: Ok(_), .. } => core.answers.push(answer),
        refused => out.push(refused),
    }
    Ok(())
}

fn add_all<E>(core: &mut Core<'_>, t: &mut dyn Tasks<Error = E>, mut tasks: Vec<NewTask>) -> Result<Answer, E> {
    match core.open {
        None => return Ok(Err("the run is not open for new tasks (it was not started with --open)".into())),
        Some(o) if o.closed => return Ok(Err("the run is closed: it takes no new tasks".into())),
        Some(_) => {}
    }
    // Checked first, with the ids they will get, so that a refusal adds nothing.
    let mut next = t.next_id()?;
    let mut plan = Vec::with_capacity(tasks.len());
    let mut keys: HashMap<&[u8], (u64, &[u8])> = HashMap::new();
    for task in &tasks {
        let known = match task.key.as_deref() {
            Some(k) => match keys.get(k) {
                Some(&(id, command)) => Some((id, command.to_vec())),
                None => match t.keyed(k)? {
                    Some(id) => Some((id, t.get(id)?.map(|r| t.command(&r)).unwrap_or_default())),
                    None => None,
                },
            },
            None => None,
        };
        // A key is a promise that a retry is the same task: another command under it is a
        // client's mistake, refused rather than answered with the other task's id.
        if let Some((id, command)) = known.as_ref().filter(|(_, c)| *c != task.command) {
            let key = String::from_utf8_lossy(task.key.as_deref().unwrap_or_default());
            let had = String::from_utf8_lossy(command);
            let why = format!("{}: key {key:?} names task {id}, added with another command ({had:?})", task.line);
            return Ok(Err(why));
        }
        let known = known.map(|(id, _)| id);
        let id = known.unwrap_or(next);
        if known.is_none() {
            if let Some((r, _)) = task.needs.ranges().iter().find(|(r, _)| *r.end() >= id) {
                // The line first: the client names what it sent (`source:line: …`).
                let why = format!("{}: task {} is not before this one (it would be task {id})", task.line, r.end());
                return Ok(Err(why));
            }
            next += 1;
        }
        if let Some(k) = task.key.as_deref() {
            keys.entry(k).or_insert((id, &task.command));
        }
        plan.push(known.is_some());
    }
    // Classes last among the checks: the run's list grows only for a request that is added.
    match class_numbers(t, &tasks)? {
        Ok(Some(numbers)) => tasks.iter_mut().zip(numbers).for_each(|(task, n)| task.shape.class = n),
        Ok(None) => {}
        Err(why) => return Ok(Err(why)),
    }
    let mut ids = Vec::with_capacity(tasks.len());
    let mut made: HashMap<Vec<u8>, u64> = HashMap::new();
    for (task, known) in tasks.iter().zip(plan) {
        if known || task.key.as_ref().is_some_and(|k| made.contains_key(k)) {
            let k = task.key.as_deref().expect("a known task has a key");
            let id = match made.get(k) {
                Some(&id) => id,
                None => t.keyed(k)?.expect("checked above"),
            };
            ids.push(id);
            continue;
        }
        let (id, r) = t.add(task)?;
        core.counts.add(State::Pending);
        if records::depend(core, t, id, &task.needs)? == Added::Ready {
            core.partition.push(id, r.shape().priority);
            core.fresh_arrivals = true;
        }
        if let Some(k) = &task.key {
            made.insert(k.clone(), id);
        }
        ids.push(id);
    }
    Ok(Ok(ids))
}
/// The run's number for each task's class (`None`: every task's is `default`), the run's list
/// grown by the names it did not have; the reason when that would pass `MAX_CLASSES`.
fn class_numbers<E>(t: &mut dyn Tasks<Error = E>, tasks: &[NewTask]) -> Result<Result<Option<Vec<u16>>, String>, E> {
    if tasks.iter().all(|task| task.class.is_none()) {
        return Ok(Ok(None));
    }
    let mut names = t.classes()?;
    let before = names.len();
    let mut number: HashMap<String, u16> = names.iter().enumerate().map(|(i, n)| (n.clone(), i as u16)).collect();
    let mut out = Vec::with_capacity(tasks.len());
    for task in tasks {
        let Some(class) = &task.class else {
            out.push(0);
            continue;
        };
        let n = match number.get(class) {
            Some(&n) => n,
            None if names.len() >= MAX_CLASSES => {
                return Ok(Err(format!("{}: class {class} would be one more than the run's {MAX_CLASSES}", task.line)));
            }
            None => {
                names.push(class.clone());
                number.insert(class.clone(), (names.len() - 1) as u16);
                (names.len() - 1) as u16
            }
        };
        out.push(n);
    }
    if names.len() > before {
        t.set_classes(&names)?;
    }
    Ok(Ok(Some(out)))
}
