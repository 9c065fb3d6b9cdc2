//! An agent's spawners seen as one executor: which spawner runs each task (`Spread`), when the
//! wide spawner may start what it holds (the loops it borrowed are empty), which tasks wait
//! here while every loop is lent, and when each spawner may be told to finish. Pure: the agent
//! feeds it the commands its machine gives, what each spawner reports, and ticks, and carries
//! out what it answers — a command for a spawner, or the end of a task that never reached one.
//!
//! A task wider than a loop goes to the wide spawner (the last, holding every loop's CPU),
//! which borrows as many loops from the first: they take nothing new, and the wide spawner is
//! held until they are empty. Told to finish meanwhile, it is told once they are; loops are
//! told to finish once no narrow task waits here for one of them.

pub mod spread;
#[cfg(test)]
mod tests;

pub use spread::{Spread, STUCK_AFTER_US};

use crate::slots::Queue;
use crate::work::{Command, ExecEvent, TaskToRun};

/// What the agent does for the fan-out.
#[derive(Debug)]
pub enum Effect {
    /// Tells spawner `.0` this.
    Send(usize, Command),
    /// A task that waited here, in no spawner, ended (stopped or asked back): for the agent's
    /// machine, as a spawner's events are.
    Ended(ExecEvent),
}

/// The fan-out's decisions over an agent's spawners.
#[derive(Debug)]
pub struct Fanout {
    spread: Spread,
    /// Told to finish or abort: from then on a spawner that stops is expected to.
    stopping: bool,
    /// Spawners told to reset that have not said so yet.
    resetting: usize,
    /// The agent's own hold (its parent silent), and whether the wide spawner was told to hold:
    /// also while the loops lent to it still run.
    held: bool,
    wide_held: bool,
    /// Told to finish while the wide spawner's gate was shut: it is told once the gate opens.
    finish_wide: bool,
    /// Narrow tasks that found every loop lent to the wide spawner, until one is back; and
    /// told to finish meanwhile, the loops are told once none waits.
    waiting: Queue,
    finish_loops: bool,
}

impl Fanout {
    /// Over spawners holding tasks as `spread` says.
    pub fn new(spread: Spread) -> Fanout {
        Fanout {
            spread,
            stopping: false,
            resetting: 0,
            held: false,
            wide_held: false,
            finish_wide: false,
            waiting: Queue::default(),
            finish_loops: false,
        }
    }

    /// How many spawners it fans out over.
    pub fn spawners(&self) -> usize {
        self.spread.spawners()
    }

    /// Whether it spreads tasks at all: one spawner takes everything as it comes.
    fn several(&self) -> bool {
        self.spawners() > 1
    }

    /// A command of the agent's machine for its executor, at `now_us`.
    pub fn command(&mut self, c: Command, now_us: u64, out: &mut Vec<Effect>) {
        let all = 0..self.spawners();
        let wide = self.spread.wide();
        match c {
            Command::Run(tasks) if self.several() => self.run(tasks, out),
            Command::Run(tasks) => out.push(Effect::Send(0, Command::Run(tasks))),
            Command::Finish => {
                self.stopping = true;
                for i in all {
                    if Some(i) == wide && !self.spread.gate_open() {
                        self.finish_wide = true;
                    } else if Some(i) != wide && !self.waiting.is_empty() {
                        self.finish_loops = true;
                    } else {
                        out.push(Effect::Send(i, Command::Finish));
                    }
                }
            }
            Command::Abort => {
                self.stopping = true;
                self.drop_waiting();
                out.extend(all.map(|i| Effect::Send(i, Command::Abort)));
            }
            Command::Hold(held) => {
                self.held = held;
                out.extend(all.filter(|&i| Some(i) != wide).map(|i| Effect::Send(i, Command::Hold(held))));
                self.regate(out);
            }
            Command::Lease(until) => out.extend(all.map(|i| Effect::Send(i, Command::Lease(until)))),
            // Each spawner stops those it has and ignores the others; so do the waiting here.
            Command::Stop(ids) => {
                let mut ended = Vec::new();
                self.waiting.preempt(&ids, now_us, &mut ended);
                out.extend(ended.into_iter().map(Effect::Ended));
                out.extend(all.map(|i| Effect::Send(i, Command::Stop(ids.clone()))));
            }
            Command::Recall(ids) => {
                let mut ended = Vec::new();
                self.waiting.recall(&ids, &mut ended);
                out.extend(ended.into_iter().map(Effect::Ended));
                out.extend(all.map(|i| Effect::Send(i, Command::Recall(ids.clone()))));
            }
            Command::Reset => {
                self.drop_waiting();
                self.resetting = self.spawners();
                out.extend(all.map(|i| Effect::Send(i, Command::Reset)));
            }
        }
    }

    /// Spawner `i` reported `batch` at `now_us`. True when that completes a reset: every
    /// spawner stopped what it ran and dropped its queue.
    pub fn reported(&mut self, i: usize, batch: &[ExecEvent], now_us: u64, out: &mut Vec<Effect>) -> bool {
        if batch.iter().any(|e| matches!(e, ExecEvent::Reset)) {
            self.spread.emptied(i);
            self.resetting = self.resetting.saturating_sub(1);
            self.regate(out);
            return self.resetting == 0;
        }
        let ended = batch.iter().filter(|e| matches!(e, ExecEvent::Finished(_) | ExecEvent::Recalled { .. })).count();
        self.spread.finished(i, ended);
        if !self.several() {
            return false;
        }
        let wide = Some(i) == self.spread.wide();
        for e in batch {
            match e {
                ExecEvent::Started { id, .. } | ExecEvent::Recalled { id, .. } => {
                    self.spread.left_queue(i, *id, now_us)
                }
                // Its process ran, so it left the queue when it started: looking for it there
                // again was a walk of the whole queue for every task.
                ExecEvent::Finished(f) if f.ended.outcome.ran() => self.spread.moved(i, now_us),
                ExecEvent::Finished(f) => self.spread.left_queue(i, f.id, now_us),
                ExecEvent::Reset => {}
            }
            match e {
                ExecEvent::Finished(f) if wide => self.spread.wide_ended(f.id),
                ExecEvent::Recalled { id, .. } if wide => self.spread.wide_ended(*id),
                _ => {}
            }
        }
        self.regate(out);
        false
    }

    /// Spawner `i`'s thread ended. True when nothing asked it to: a failure, and every spawner
    /// is told to abort.
    pub fn ended(&mut self, _i: usize, out: &mut Vec<Effect>) -> bool {
        if self.stopping {
            return false;
        }
        self.command(Command::Abort, 0, out);
        true
    }

    /// A spawner's queue is its own: what waits behind its long tasks while another spawner
    /// idles goes back up, and the leader sends it again, to the idle one. On each tick, not on
    /// each hand-off: it looks at every spawner, and a wait of `STUCK_AFTER_US` is seconds.
    pub fn tick(&mut self, now_us: u64, out: &mut Vec<Effect>) {
        if !self.several() {
            return;
        }
        if let Some((j, ids)) = self.spread.stuck(now_us) {
            out.push(Effect::Send(j, Command::Recall(ids)));
        }
    }

    /// Tasks to the spawners `Spread` picks; those with no loop free wait here.
    fn run(&mut self, tasks: Vec<TaskToRun>, out: &mut Vec<Effect>) {
        let (parts, wait) = self.spread.assign(tasks);
        // The wide spawner hears of its gate before of its tasks: it must not start one on CPUs
        // whose loops still run.
        self.gate(out);
        for (i, part) in parts.into_iter().enumerate() {
            if !part.is_empty() {
                out.push(Effect::Send(i, Command::Run(part)));
            }
        }
        self.waiting.add(wait);
    }

    /// After what changed the lent loops: the waiting tasks go to loops back from the wide
    /// spawner, which holds while lent loops still run tasks (or the agent holds), and finishes
    /// held back go once nothing stands in their way.
    fn regate(&mut self, out: &mut Vec<Effect>) {
        let Some(wide) = self.spread.wide() else { return };
        if !self.waiting.is_empty() && !self.spread.lent_out() {
            let tasks: Vec<TaskToRun> = self.waiting.drain().collect();
            self.run(tasks, out);
        }
        self.gate(out);
        if self.finish_loops && self.waiting.is_empty() {
            self.finish_loops = false;
            out.extend((0..self.spawners()).filter(|&i| i != wide).map(|i| Effect::Send(i, Command::Finish)));
        }
    }

    /// The wide spawner holds while the loops lent to it hold tasks, or the agent holds; told
    /// to finish meanwhile, it is told once they are empty.
    fn gate(&mut self, out: &mut Vec<Effect>) {
        let Some(w) = self.spread.wide() else { return };
        let open = self.spread.gate_open();
        let hold = self.held || !open;
        if hold != self.wide_held {
            self.wide_held = hold;
            out.push(Effect::Send(w, Command::Hold(hold)));
        }
        if self.finish_wide && open {
            self.finish_wide = false;
            out.push(Effect::Send(w, Command::Finish));
        }
    }

    /// The waiting tasks are dropped with everything else (an abort, a reset), and so are the
    /// finishes held back for them.
    fn drop_waiting(&mut self) {
        self.waiting.clear();
        self.finish_wide = false;
        self.finish_loops = false;
    }
}
