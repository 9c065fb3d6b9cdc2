//! An agent's executors with no processes, laid out as a real agent lays out its spawners: by
//! default one spawn loop per core and, beside them, the wide spawner for tasks of several
//! cores, with the agent's fan-out (`crate::fanout`) between them. `htc simulate` runs one per
//! agent, so that what a layout does to a run — narrow tasks waiting while a wide one borrows
//! every loop, a wide task held until the loops it borrows are empty, queues stuck behind long
//! tasks — is predicted as it happens, not as one pool of cores would have it.
//!
//! Each loop is a `VirtualExec` (which task gets its slots is `crate::slots`'s, as for a real
//! loop). What it does not model beyond `VirtualExec`: the devices are counted per spawner (a
//! real agent's spawners share one pool; the leader places no more GPU tasks than the agent has).

use std::sync::Arc;

use crate::fanout::{Effect, Fanout, Spread};
use crate::virtual_exec::VirtualExec;
use crate::work::{Command, ExecEvent, TaskToRun};

/// How long a task runs, in µs: shared by the agent's spawners.
pub type Runtime = Arc<dyn Fn(&TaskToRun) -> u64 + Send + Sync>;

pub struct VirtualAgent {
    fanout: Fanout,
    spawners: Vec<VirtualExec>,
    effects: Vec<Effect>,
}

impl VirtualAgent {
    /// An agent of `cores` cores and `gpus` devices as `htc-agent` lays it out by default
    /// (`--spawners 0`): a one-slot loop per core and the wide spawner of all of them; one
    /// spawner when it has one core.
    pub fn per_core(cores: u32, gpus: u32, runtime: Runtime) -> VirtualAgent {
        let cores = cores.max(1);
        let exec = |slots| {
            let runtime = runtime.clone();
            VirtualExec::new(slots, gpus, Box::new(move |t: &TaskToRun| runtime(t)))
        };
        if cores == 1 {
            return VirtualAgent::of(Spread::new(vec![1]), vec![exec(1)]);
        }
        let mut spawners: Vec<VirtualExec> = (0..cores).map(|_| exec(1)).collect();
        spawners.push(exec(cores));
        VirtualAgent::of(Spread::with_wide(cores as usize), spawners)
    }

    /// One spawner holding every core (`--spawners 1`).
    pub fn pooled(cores: u32, gpus: u32, runtime: Runtime) -> VirtualAgent {
        let exec = VirtualExec::new(cores, gpus, Box::new(move |t: &TaskToRun| runtime(t)));
        VirtualAgent::of(Spread::new(vec![cores.max(1) as usize]), vec![exec])
    }

    fn of(spread: Spread, spawners: Vec<VirtualExec>) -> VirtualAgent {
        VirtualAgent { fanout: Fanout::new(spread), spawners, effects: Vec::new() }
    }

    /// A command of the agent's machine at `now_us`; what it causes at once is in `out` (`step`
    /// starts what it lets start).
    pub fn command(&mut self, now_us: u64, c: Command, out: &mut Vec<ExecEvent>) {
        self.fanout.command(c, now_us, &mut self.effects);
        self.carry_out(now_us, out);
    }

    /// Ends what is due by `now_us` and starts what may start, on every spawner, until what
    /// that tells the fan-out starts nothing more.
    pub fn step(&mut self, now_us: u64, out: &mut Vec<ExecEvent>) {
        loop {
            let mut moved = false;
            for i in 0..self.spawners.len() {
                let mut batch = Vec::new();
                self.spawners[i].step(now_us, &mut batch);
                if !batch.is_empty() {
                    moved = true;
                    self.reported(i, batch, now_us, out);
                    self.carry_out(now_us, out);
                }
            }
            if !moved {
                return;
            }
        }
    }

    /// A tick of the agent: tasks stuck behind a busy loop are asked back.
    pub fn tick(&mut self, now_us: u64, out: &mut Vec<ExecEvent>) {
        self.fanout.tick(now_us, &mut self.effects);
        self.carry_out(now_us, out);
    }

    /// Stops (or lets go on) the agent around the spawners: meanwhile tasks end, none starts.
    pub fn set_frozen(&mut self, frozen: bool) {
        self.spawners.iter_mut().for_each(|s| s.set_frozen(frozen));
    }

    /// When the next running task ends, if any runs.
    pub fn next_end_us(&self) -> Option<u64> {
        self.spawners.iter().filter_map(VirtualExec::next_end_us).min()
    }

    /// Every spawner was told to finish and has nothing left (or was aborted).
    pub fn is_done(&self) -> bool {
        self.spawners.iter().all(VirtualExec::is_done)
    }

    /// Tasks running now.
    pub fn running(&self) -> usize {
        self.spawners.iter().map(VirtualExec::running).sum()
    }

    /// Tasks waiting in the spawners' queues.
    pub fn queued(&self) -> usize {
        self.spawners.iter().map(VirtualExec::queued).sum()
    }

    /// Carries out the fan-out's effects, and its answers to what they cause, until it has none.
    fn carry_out(&mut self, now_us: u64, out: &mut Vec<ExecEvent>) {
        while !self.effects.is_empty() {
            for e in std::mem::take(&mut self.effects) {
                match e {
                    Effect::Ended(ev) => out.push(ev),
                    Effect::Send(i, c) => {
                        let mut batch = Vec::new();
                        self.spawners[i].command(now_us, c, &mut batch);
                        self.reported(i, batch, now_us, out);
                    }
                }
            }
        }
    }

    /// Spawner `i`'s events go to the fan-out and out; a reset is said once, when every
    /// spawner has dropped everything (as the agent's driver says it).
    fn reported(&mut self, i: usize, batch: Vec<ExecEvent>, now_us: u64, out: &mut Vec<ExecEvent>) {
        if batch.is_empty() {
            return;
        }
        let reset = self.fanout.reported(i, &batch, now_us, &mut self.effects);
        out.extend(batch.into_iter().filter(|e| !matches!(e, ExecEvent::Reset)));
        if reset {
            out.push(ExecEvent::Reset);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shape::TaskShape;

    fn task(id: u64, cores: u16, ms: u32) -> TaskToRun {
        TaskToRun::new(id, 1, Vec::new()).shaped(TaskShape { cores, runtime_ms: ms, ..Default::default() })
    }

    fn by_hint() -> Runtime {
        Arc::new(|t: &TaskToRun| t.shape.runtime_ms as u64 * 1000)
    }

    /// Runs `tasks` to their end on `a`; (id, start, end) of each, in ms, by id.
    fn run(mut a: VirtualAgent, tasks: Vec<TaskToRun>) -> Vec<(u64, u64, u64)> {
        let mut out = Vec::new();
        a.command(0, Command::Run(tasks), &mut out);
        a.command(0, Command::Finish, &mut out);
        let mut now = 0;
        loop {
            a.step(now, &mut out);
            match a.next_end_us() {
                Some(t) => now = t,
                None => break,
            }
        }
        assert!(a.is_done());
        let mut ends: Vec<(u64, u64, u64)> = out
            .iter()
            .filter_map(|e| match e {
                ExecEvent::Finished(f) => Some((f.id, f.ended.start_us / 1000, f.ended.end_us / 1000)),
                _ => None,
            })
            .collect();
        ends.sort();
        ends
    }

    #[test]
    fn a_wide_task_waits_for_the_loops_it_borrows_where_one_pool_would_start_it_at_once() {
        // Two cores: a 1 s task on loop 0, then a task of two cores and a narrow one.
        let tasks = || vec![task(1, 1, 1000), task(2, 2, 500), task(3, 1, 200)];
        let laid_out = run(VirtualAgent::per_core(2, 0, by_hint()), tasks());
        // The wide task borrows both loops: task 3 waits for them, task 2 for task 1's end.
        assert_eq!(laid_out, [(1, 0, 1000), (2, 1000, 1500), (3, 1500, 1700)]);
        // One pool: task 3 takes the free core at once (the head of the queue, task 2, does not fit).
        let pooled = run(VirtualAgent::pooled(2, 0, by_hint()), tasks());
        assert_eq!(pooled[0], (1, 0, 1000));
        assert_eq!(pooled[1].0, 2);
        assert!(pooled[1].1 >= 1000);
    }

    #[test]
    fn narrow_tasks_spread_over_the_loops_by_load() {
        let ends = run(VirtualAgent::per_core(2, 0, by_hint()), (1..=4).map(|i| task(i, 1, 100)).collect());
        assert_eq!(ends, [(1, 0, 100), (2, 0, 100), (3, 100, 200), (4, 100, 200)]);
    }

    #[test]
    fn a_reset_is_said_once_all_spawners_dropped_everything() {
        let mut a = VirtualAgent::per_core(2, 0, by_hint());
        let mut out = Vec::new();
        a.command(0, Command::Run(vec![task(1, 1, 100), task(2, 2, 100)]), &mut out);
        a.step(0, &mut out);
        out.clear();
        a.command(10, Command::Reset, &mut out);
        assert_eq!(out.iter().filter(|e| matches!(e, ExecEvent::Reset)).count(), 1);
        assert_eq!((a.running(), a.queued()), (0, 0));
    }
}
