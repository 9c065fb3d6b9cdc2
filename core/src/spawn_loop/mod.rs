//! One spawn loop's decisions, with no processes: its queue, what it was told (`orders`), which
//! of its slots are free, the tasks running in them, their deadlines, and which to stop for
//! higher-priority work. Fed the time, the agent's commands, how each start and each task
//! ended, and ticks; it answers with effects for a runner to carry out: start this task in
//! these slots, signal or kill that one, report this. The process executor
//! (`htc_exec::executor`) carries them out with processes and `VirtualExec` with end times, so
//! the two never differ in which task gets the cores or when one is stopped.
//!
//! A running task is named by its first slot (no two running tasks share one): the runner keeps
//! what it needs of the task (its process, its output) by the same index. Time is µs on the
//! runner's one clock (the wall clock on an agent, the virtual one in `htc simulate`).

use std::collections::HashSet;

use crate::orders::{Orders, Todo};
use crate::record::{errno, Ended, Outcome};
use crate::slots::{self, Deadlines, Due, Holder, Next, Queue, Room};
use crate::stuck;
use crate::work::{Command, ExecEvent, Finished, TaskToRun};

#[cfg(test)]
mod tests;

/// What the runner is to do.
#[derive(Debug, PartialEq, Eq)]
pub enum Effect {
    /// Start the task now held in this slot (`SpawnLoop::run`), and tell `started` or
    /// `spawn_failed` how it went.
    Start(usize),
    /// Ask the task in this slot to stop (SIGTERM to its group); a kill follows after the grace.
    Stop(usize, Why),
    /// Kill the task in this slot (SIGKILL to its group).
    Kill(usize),
    /// Say this to the agent.
    Report(ExecEvent),
}

/// Why a running task is told to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    TimedOut,
    /// The stuck watch found it idle for its `stuck=`.
    Stuck,
    /// For higher-priority work, or by the leader's `Stop`.
    Preempted,
    /// Everything was dropped (an abort, a reset, the agent gone).
    Dropped,
}

/// How a task's process ended, as the runner saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// It exited with this value.
    Exited(i32),
    /// A signal ended it.
    Signaled(i32),
    /// Its status is gone (reaped by other code of the process): the errno of the failed wait.
    Lost(i32),
}

/// A task holding slots.
#[derive(Debug)]
pub struct Run {
    pub task: TaskToRun,
    /// Its slots, the first naming it.
    pub slots: Vec<usize>,
    pub start_us: u64,
    /// Why the loop stopped it, if it did.
    why: slots::Stopped,
    /// Its stuck watch (`stuck=`), from its start.
    watch: Option<stuck::Watch>,
    /// Told to stop (timed out, stuck, preempted, aborted or killed for memory): its slots are
    /// on their way back.
    stopping: bool,
    /// Tells this run's deadlines from those of an earlier task in the same slot.
    serial: u64,
}

pub struct SpawnLoop {
    free: Vec<bool>,
    free_count: usize,
    /// Devices this loop may use (the agent's, shared by its loops), and those it counts free
    /// itself when the runner does not say.
    gpus: u32,
    free_gpus: u32,
    queue: Queue,
    orders: Orders,
    /// By first slot.
    running: Vec<Option<Run>>,
    counts: Counts,
    deadlines: Deadlines<u64, usize>,
    grace_us: u64,
    /// Tasks stopped because everything was dropped: their ends are no results (they were
    /// interrupted), so the runner journals them as such.
    aborted: HashSet<(u64, u32)>,
}

/// Running tasks counted, so that looking for room to preempt costs nothing while none could give it.
#[derive(Debug, Default)]
struct Counts {
    running: usize,
    preemptible: usize,
    /// Running tasks with a stuck watch: none, and the watch costs a comparison.
    watched: usize,
    serial: u64,
}

impl SpawnLoop {
    /// A loop over `slots` slots and `gpus` devices; a task it stops is killed `grace_us` later.
    pub fn new(slots: usize, gpus: u32, grace_us: u64) -> SpawnLoop {
        let slots = slots.max(1);
        SpawnLoop {
            free: vec![true; slots],
            free_count: slots,
            gpus,
            free_gpus: gpus,
            queue: Queue::default(),
            orders: Orders::default(),
            running: (0..slots).map(|_| None).collect(),
            counts: Counts::default(),
            deadlines: Deadlines::default(),
            grace_us,
            aborted: HashSet::new(),
        }
    }

    /// Takes a command; what it causes at once is in `out` (`start` starts what it lets start).
    pub fn command(&mut self, now_us: u64, c: Command, out: &mut Vec<Effect>) {
        match self.orders.take(c) {
            Todo::Nothing => {}
            Todo::Queue(v) => self.queue.add(v),
            Todo::Stop(ids) => self.preempt(now_us, &ids, out),
            Todo::Recall(ids) => reports(out, |ev| self.queue.recall(&ids, ev)),
            Todo::DropAll => self.drop_all(now_us, out),
        }
    }

    /// Whoever gave the commands is gone: nobody will read results, so everything stops.
    pub fn abandoned(&mut self, now_us: u64, out: &mut Vec<Effect>) {
        if self.orders.abort() == Todo::DropAll {
            self.drop_all(now_us, out);
        }
    }

    /// Starts what may start, in queue order, on its free slots and on `free_gpus` devices (the
    /// runner's count, where devices are shared; None: its own). Returns true when it stopped at
    /// a task that takes devices: the runner takes them, then calls again (another loop of the
    /// agent may have taken them first: `put_back`).
    pub fn start(&mut self, now_us: u64, free_gpus: Option<u32>, out: &mut Vec<Effect>) -> bool {
        if !self.orders.may_start(now_us) {
            return false;
        }
        loop {
            let room = Room {
                cores: self.free.len() as u32,
                gpus: self.gpus,
                free_cores: self.free_count as u32,
                free_gpus: free_gpus.unwrap_or(self.free_gpus),
            };
            let running = &self.running;
            let holders = (self.counts.preemptible > 0)
                .then(|| running.iter().flatten().map(|r| Holder::of(&r.task, r.start_us, r.stopping)))
                .into_iter()
                .flatten();
            match self.queue.next(&room, holders) {
                Next::Start(t) => {
                    let devices = t.shape.gpus > 0;
                    out.push(Effect::Start(self.hold(now_us, t)));
                    if devices {
                        return true;
                    }
                }
                Next::Refuse(t) => out.push(report_end(&t, Outcome::SpawnFailed, errno::E2BIG, now_us, now_us)),
                // Their slots come back when they end, after at most the grace.
                Next::Stop(ids) => {
                    self.preempt(now_us, &ids, out);
                    return false;
                }
                Next::Wait | Next::Idle => return false,
            }
        }
    }

    /// The task given to start in `slot` could not get its devices: back to the head of the queue.
    pub fn put_back(&mut self, slot: usize) {
        if let Some(r) = self.release(slot) {
            self.queue.put_back(r.task);
        }
    }

    /// Its process runs: its time limit counts from `now_us`.
    pub fn started(&mut self, slot: usize, now_us: u64, out: &mut Vec<Effect>) {
        let Some(r) = self.running[slot].as_mut() else { return };
        r.start_us = now_us;
        if r.task.shape.timeout_ms > 0 {
            self.deadlines.limit(now_us + r.task.shape.timeout_ms as u64 * 1000, slot, r.serial);
        }
        if r.task.shape.stuck_s > 0 && r.watch.is_none() {
            r.watch = Some(stuck::Watch::new(now_us, r.task.shape.stuck_s));
            self.counts.watched += 1;
        }
        out.push(Effect::Report(ExecEvent::Started { id: r.task.id, attempt: r.task.attempt, start_us: now_us }));
    }

    /// It could not be started (`errno`): its slots are free, and its end is a spawn failure.
    pub fn spawn_failed(&mut self, slot: usize, now_us: u64, errno: i32) -> Option<(Run, Finished)> {
        let r = self.release(slot)?;
        let f = finished(&r.task, Ended::new(Outcome::SpawnFailed, errno, r.start_us, now_us));
        Some((r, f))
    }

    /// The task in `slot` ended: its slots are free; how it is recorded (why it was stopped
    /// comes before how it ended), with what it was, for the runner to store its output and
    /// report the end (`oom_mb`: the kernel killed it for memory, seen by the runner).
    pub fn exited(&mut self, slot: usize, now_us: u64, exit: Exit, oom_mb: Option<u64>) -> Option<(Run, Finished)> {
        let r = self.release(slot)?;
        let why = slots::Stopped { oom_mb: r.why.oom_mb.or(oom_mb), ..r.why };
        let (outcome, value) = match exit {
            Exit::Exited(v) => slots::ending(why, true, v),
            Exit::Signaled(v) => slots::ending(why, false, v),
            Exit::Lost(errno) => (Outcome::Lost, errno),
        };
        let f = finished(&r.task, Ended::new(outcome, value, r.start_us, now_us));
        Some((r, f))
    }

    /// The task in `slot` passed its `mem=` (`mb` resident): it is killed, and ends out of memory.
    pub fn out_of_memory(&mut self, slot: usize, mb: u64, out: &mut Vec<Effect>) {
        let Some(r) = self.running[slot].as_mut().filter(|r| r.why.oom_mb.is_none()) else { return };
        r.why.oom_mb = Some(mb);
        // Being killed: neither preempted nor timed out on top of it.
        r.stopping = true;
        out.push(Effect::Kill(slot));
    }

    /// Running tasks whose stuck watches want a look at their counters by `now_us` (tell
    /// `looked` what was seen), by first slot.
    pub fn looks_due(&self, now_us: u64, due: &mut Vec<usize>) {
        if self.counts.watched == 0 {
            return;
        }
        let want = |r: &Run| !r.stopping && r.watch.as_ref().is_some_and(|w| w.next_us() <= now_us);
        due.extend(self.runs().filter(|(_, r)| want(r)).map(|(s, _)| s));
    }

    /// When a stuck watch next wants a look.
    pub fn next_look(&self) -> Option<u64> {
        if self.counts.watched == 0 {
            return None;
        }
        self.runs().filter(|(_, r)| !r.stopping).filter_map(|(_, r)| Some(r.watch.as_ref()?.next_us())).min()
    }

    /// The counters of the task in `slot` at `now_us` (None: unreadable). One idle for its
    /// `stuck=` is stopped as a timed-out one is, and ends stuck.
    pub fn looked(&mut self, now_us: u64, slot: usize, seen: Option<stuck::Sample>, out: &mut Vec<Effect>) {
        let Some(r) = self.running[slot].as_mut().filter(|r| !r.stopping) else { return };
        let Some(w) = r.watch.as_mut() else { return };
        if let stuck::Verdict::Stuck { idle_s } = w.sampled(now_us, seen) {
            r.why.stuck_s = Some(idle_s);
            self.stop(now_us, slot, Why::Stuck, out);
        }
    }

    /// Time limits due by `now_us`: a task past its limit is stopped, one still there after
    /// the grace killed.
    pub fn tick(&mut self, now_us: u64, out: &mut Vec<Effect>) {
        while let Some((slot, serial, due)) = self.deadlines.due(now_us) {
            let Some(r) = self.running[slot].as_mut().filter(|r| r.serial == serial) else { continue };
            match (due, r.stopping) {
                (Due::Stop, false) => {
                    r.why.timed_out = true;
                    self.stop(now_us, slot, Why::TimedOut, out);
                }
                (Due::Kill, true) => out.push(Effect::Kill(slot)),
                // Its limit came while it was already stopping: the kill is due anyway.
                _ => {}
            }
        }
    }

    /// When `tick` next has something to do.
    pub fn next_deadline(&self) -> Option<u64> {
        self.deadlines.next()
    }

    /// Whether the orders let anything start now (not held, aborted, or past the lease).
    pub fn may_start(&self, now_us: u64) -> bool {
        self.orders.may_start(now_us)
    }

    /// A reset asked for is done (nothing runs any more): true once, and the runner says so.
    pub fn reset_done(&mut self) -> bool {
        self.orders.reset_done(self.counts.running)
    }

    /// Told to finish and nothing is left that it would run (or aborted): the loop's end.
    pub fn is_done(&self) -> bool {
        self.orders.done(self.counts.running, self.queue.len())
    }

    /// What happened should reach the agent at once rather than in a batch: it is waiting for
    /// the end (finishing, resetting, held) or the queue ran dry.
    pub fn waited_for(&self) -> bool {
        self.orders.finishing() || self.orders.resetting() || self.orders.held() || self.queue.is_empty()
    }

    pub fn aborted(&self) -> bool {
        self.orders.aborted()
    }

    /// Whether this end is a result: false for a task stopped because everything was dropped.
    pub fn is_result(&self, id: u64, attempt: u32) -> bool {
        !self.aborted.contains(&(id, attempt))
    }

    /// The task running in `slot`.
    pub fn run(&self, slot: usize) -> Option<&Run> {
        self.running.get(slot)?.as_ref()
    }

    /// Running tasks, with their first slots.
    pub fn runs(&self) -> impl Iterator<Item = (usize, &Run)> {
        self.running.iter().enumerate().filter_map(|(s, r)| Some((s, r.as_ref()?)))
    }

    /// Tasks running now.
    pub fn running(&self) -> usize {
        self.counts.running
    }

    /// Tasks waiting in the queue.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Takes the queue out, for a runner whose tasks end as they arrive (`--exec none`).
    pub fn drain_queue(&mut self) -> Vec<TaskToRun> {
        self.queue.drain().collect()
    }

    /// Holds the first free slots for `t`; returns the first.
    fn hold(&mut self, now_us: u64, t: TaskToRun) -> usize {
        let cores = t.shape.cores.max(1) as usize;
        let mut slots = Vec::with_capacity(cores);
        for (i, f) in self.free.iter_mut().enumerate() {
            if *f && slots.len() < cores {
                *f = false;
                slots.push(i);
            }
        }
        self.free_count -= cores;
        self.free_gpus = self.free_gpus.saturating_sub(t.shape.gpus as u32);
        self.counts.running += 1;
        self.counts.preemptible += t.shape.preemptible as usize;
        self.counts.serial += 1;
        let first = slots[0];
        let serial = self.counts.serial;
        let run = Run {
            task: t,
            slots,
            start_us: now_us,
            why: slots::Stopped::default(),
            watch: None,
            stopping: false,
            serial,
        };
        self.running[first] = Some(run);
        first
    }

    /// Takes the task in `slot` off its slots and devices.
    fn release(&mut self, slot: usize) -> Option<Run> {
        let r = self.running.get_mut(slot)?.take()?;
        for &s in &r.slots {
            self.free[s] = true;
        }
        self.free_count += r.slots.len();
        self.free_gpus = (self.free_gpus + r.task.shape.gpus as u32).min(self.gpus);
        self.counts.running -= 1;
        self.counts.preemptible -= r.task.shape.preemptible as usize;
        self.counts.watched -= r.watch.is_some() as usize;
        Some(r)
    }

    /// Preempted tasks: a queued one ends at once, unstarted; a running one is stopped, and
    /// ends as preempted.
    fn preempt(&mut self, now_us: u64, ids: &[u64], out: &mut Vec<Effect>) {
        reports(out, |ev| self.queue.preempt(ids, now_us, ev));
        let hit: Vec<usize> =
            self.runs().filter(|(_, r)| ids.contains(&r.task.id) && !r.stopping).map(|(s, _)| s).collect();
        for &slot in &hit {
            let r = self.running[slot].as_mut().expect("found above");
            r.why.preempted = true;
            self.stop(now_us, slot, Why::Preempted, out);
        }
    }

    /// Drops the queue and stops every running task; their ends are no results.
    fn drop_all(&mut self, now_us: u64, out: &mut Vec<Effect>) {
        self.queue.clear();
        let slots: Vec<usize> = self.runs().map(|(s, _)| s).collect();
        for slot in slots {
            let r = self.running[slot].as_ref().expect("found above");
            self.aborted.insert((r.task.id, r.task.attempt));
            if !r.stopping {
                self.stop(now_us, slot, Why::Dropped, out);
            }
        }
    }

    /// SIGTERM now, SIGKILL after the grace unless it ended.
    fn stop(&mut self, now_us: u64, slot: usize, why: Why, out: &mut Vec<Effect>) {
        let r = self.running[slot].as_mut().expect("a running task");
        r.stopping = true;
        self.deadlines.kill_at(now_us + self.grace_us, slot, r.serial);
        out.push(Effect::Stop(slot, why));
    }
}

/// What `f` says (recalls, ends of queued tasks) as reports.
fn reports(out: &mut Vec<Effect>, f: impl FnOnce(&mut Vec<ExecEvent>)) {
    let mut ev = Vec::new();
    f(&mut ev);
    out.extend(ev.into_iter().map(Effect::Report));
}

fn finished(t: &TaskToRun, ended: Ended) -> Finished {
    Finished { id: t.id, attempt: t.attempt, ended }
}

fn report_end(t: &TaskToRun, outcome: Outcome, value: i32, start_us: u64, end_us: u64) -> Effect {
    Effect::Report(ExecEvent::Finished(finished(t, Ended::new(outcome, value, start_us, end_us))))
}
