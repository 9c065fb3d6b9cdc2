//! An executor with no processes, on whatever clock its caller keeps: the wall clock for
//! `--exec none|sleep` agents, the virtual clock of `htc simulate`. It takes the real executor's
//! `Command`s and answers with its `ExecEvent`s, and its decisions are the real executor's: one
//! `SpawnLoop` (`crate::spawn_loop`) decides what starts where, what is refused, stopped or
//! preempted, and this carries its effects out with end times instead of processes. A task
//! lasts what `runtime` says; one told to stop (past its `timeout`, preempted, dropped) obeys
//! at once, as a process that takes SIGTERM and goes. What it does not model: memory (nothing
//! is resident), output, a signal's grace.

use crate::record::{Ended, Outcome};
use crate::spawn_loop::{Effect, Exit, SpawnLoop};
use crate::work::{Command, ExecEvent, Finished, TaskToRun};

/// How long a task runs, in µs, from what the agent was told of it.
pub type Runtime = Box<dyn Fn(&TaskToRun) -> u64 + Send>;

pub struct VirtualExec {
    spawn: SpawnLoop,
    /// When each running task ends, by its first slot.
    ends: Vec<(usize, u64)>,
    /// The agent process is stopped (SIGSTOP): its tasks run on and end, it starts nothing.
    frozen: bool,
    /// Every task ends the moment it arrives, slots or not (`--exec none`).
    instant: bool,
    runtime: Runtime,
}

/// What a task stopped by the loop ends with: the signal that stopped it (SIGTERM), as a
/// process that obeys it at once.
const TERMINATED: i32 = 15;

impl VirtualExec {
    /// An executor of `slots` cores and `gpus` devices whose tasks last `runtime`.
    pub fn new(slots: u32, gpus: u32, runtime: Runtime) -> VirtualExec {
        VirtualExec {
            spawn: SpawnLoop::new(slots as usize, gpus, 0),
            ends: Vec::new(),
            frozen: false,
            instant: false,
            runtime,
        }
    }

    /// An executor whose tasks all succeed the moment they arrive.
    pub fn instant() -> VirtualExec {
        VirtualExec { instant: true, ..VirtualExec::new(1, 0, Box::new(|_| 0)) }
    }

    /// Takes a command at `now_us`; what it causes at once is in `out` (`step` starts what it
    /// lets start).
    pub fn command(&mut self, now_us: u64, c: Command, out: &mut Vec<ExecEvent>) {
        let mut effects = Vec::new();
        self.spawn.command(now_us, c, &mut effects);
        self.apply(now_us, effects, out);
    }

    /// Ends the tasks due by `now_us`, then starts what may start, in queue order.
    pub fn step(&mut self, now_us: u64, out: &mut Vec<ExecEvent>) {
        loop {
            self.end_due(now_us, out);
            let mut effects = Vec::new();
            self.spawn.tick(now_us, &mut effects);
            self.apply(now_us, effects, out);
            if self.frozen || !self.spawn.may_start(now_us) {
                return;
            }
            if self.instant {
                for t in self.spawn.drain_queue() {
                    let ended = Ended::new(Outcome::Exited, 0, now_us, now_us);
                    out.push(ExecEvent::Finished(Finished { id: t.id, attempt: t.attempt, ended }));
                }
                return;
            }
            let mut effects = Vec::new();
            while self.spawn.start(now_us, None, &mut effects) {}
            // Tasks stopped for the head end at once, and free their cores for it.
            let stopped = effects.iter().any(|e| matches!(e, Effect::Stop(..)));
            self.apply(now_us, effects, out);
            // Tasks of no length end in the same step, and free their cores for the queue.
            if !stopped && !self.ends.iter().any(|&(_, end)| end <= now_us) {
                return;
            }
        }
    }

    /// Stops (or lets go on) the agent around the executor: meanwhile tasks end, none starts.
    pub fn set_frozen(&mut self, frozen: bool) {
        self.frozen = frozen;
    }

    /// When the next running task ends or a time limit is due, if any.
    pub fn next_end_us(&self) -> Option<u64> {
        let end = self.ends.iter().map(|&(_, end)| end).min();
        match (end, self.spawn.next_deadline().filter(|_| !self.ends.is_empty())) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Told to finish and nothing is left that it would run (or aborted): the executor's end.
    pub fn is_done(&self) -> bool {
        self.spawn.is_done()
    }

    /// Tasks running now.
    pub fn running(&self) -> usize {
        self.spawn.running()
    }

    /// Tasks waiting in the queue.
    pub fn queued(&self) -> usize {
        self.spawn.queued()
    }

    /// Carries out the loop's effects, and those they cause, in order.
    fn apply(&mut self, now_us: u64, mut effects: Vec<Effect>, out: &mut Vec<ExecEvent>) {
        let mut i = 0;
        while i < effects.len() {
            match std::mem::replace(&mut effects[i], Effect::Report(ExecEvent::Reset)) {
                Effect::Start(slot) => {
                    let run = self.spawn.run(slot).expect("a task held for the start");
                    self.ends.push((slot, now_us + (self.runtime)(&run.task)));
                    self.spawn.started(slot, now_us, &mut effects);
                }
                Effect::Stop(slot, _) | Effect::Kill(slot) => self.end(slot, now_us, Exit::Signaled(TERMINATED), out),
                Effect::Report(e) => out.push(e),
            }
            i += 1;
        }
        if self.spawn.reset_done() {
            out.push(ExecEvent::Reset);
        }
    }

    fn end_due(&mut self, now_us: u64, out: &mut Vec<ExecEvent>) {
        let due: Vec<usize> = self.ends.iter().filter(|&&(_, end)| end <= now_us).map(|&(slot, _)| slot).collect();
        for slot in due {
            let end = self.ends.iter().find(|&&(s, _)| s == slot).map(|&(_, end)| end).unwrap_or(now_us);
            self.end(slot, end, Exit::Exited(0), out);
        }
    }

    /// The task in `slot` ended at `end_us`; the end of one that was dropped is not told.
    fn end(&mut self, slot: usize, end_us: u64, exit: Exit, out: &mut Vec<ExecEvent>) {
        self.ends.retain(|&(s, _)| s != slot);
        if let Some((r, f)) = self.spawn.exited(slot, end_us, exit, None) {
            if self.spawn.is_result(r.task.id, r.task.attempt) {
                out.push(ExecEvent::Finished(f));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::errno;
    use crate::shape::TaskShape;

    fn task(id: u64, cores: u16, runtime_ms: u32) -> TaskToRun {
        TaskToRun::new(id, 1, b"x".to_vec()).shaped(TaskShape { cores, runtime_ms, ..Default::default() })
    }

    /// `t` with its shape changed by `f`.
    fn with(mut t: TaskToRun, f: impl FnOnce(&mut TaskShape)) -> TaskToRun {
        f(&mut t.shape);
        t
    }

    fn by_hint() -> Runtime {
        Box::new(|t| t.shape.runtime_ms as u64 * 1000)
    }

    /// Runs the executor on its own clock until it is done; returns the ends in order.
    fn run_out(x: &mut VirtualExec, tasks: Vec<TaskToRun>) -> Vec<Finished> {
        let mut ev = Vec::new();
        x.command(0, Command::Run(tasks), &mut ev);
        x.command(0, Command::Finish, &mut ev);
        x.step(0, &mut ev);
        while let Some(t) = x.next_end_us() {
            x.step(t, &mut ev);
        }
        assert!(x.is_done());
        ev.into_iter()
            .filter_map(|e| match e {
                ExecEvent::Finished(f) => Some(f),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn instant_finishes_everything_at_once() {
        let done = run_out(&mut VirtualExec::instant(), (1..=1000).map(|i| task(i, 1, 60_000)).collect());
        assert_eq!(done.len(), 1000);
        assert!(done.iter().all(|f| f.ended.outcome == Outcome::Exited && f.ended.end_us == 0));
    }

    #[test]
    fn tasks_hold_their_slots_for_their_runtime() {
        // 6 tasks of 100 ms on 2 slots: three rounds, the last ending at 300 ms.
        let done = run_out(&mut VirtualExec::new(2, 0, by_hint()), (1..=6).map(|i| task(i, 1, 100)).collect());
        let ends: Vec<u64> = done.iter().map(|f| f.ended.end_us).collect();
        assert_eq!(ends, vec![100_000, 100_000, 200_000, 200_000, 300_000, 300_000]);
    }

    #[test]
    fn a_wide_task_waits_for_its_cores_and_one_wider_than_the_agent_is_refused() {
        // On 2 slots: a 1-core task, a 2-core task that waits for both, an 8-core one refused.
        let done =
            run_out(&mut VirtualExec::new(2, 0, by_hint()), vec![task(1, 1, 100), task(2, 2, 100), task(3, 8, 0)]);
        let by_id = |id| done.iter().find(|f| f.id == id).unwrap();
        assert_eq!((by_id(2).ended.start_us, by_id(2).ended.end_us), (100_000, 200_000));
        assert_eq!((by_id(3).ended.outcome, by_id(3).ended.value), (Outcome::SpawnFailed, errno::E2BIG));
        assert_eq!(by_id(3).ended.end_us, 100_000, "refused when it reaches the head of the queue");
    }

    #[test]
    fn higher_priority_runs_first_and_stops_lower_preemptible_work_for_its_cores() {
        let mut x = VirtualExec::new(2, 0, by_hint());
        let mut ev = Vec::new();
        let low = |id| with(task(id, 1, 1_000), |s| s.preemptible = true);
        x.command(0, Command::Run(vec![low(1), low(2)]), &mut ev);
        x.step(0, &mut ev);
        x.command(10_000, Command::Run(vec![with(task(3, 2, 100), |s| s.priority = 5)]), &mut ev);
        x.step(10_000, &mut ev);
        let preempted: Vec<u64> = ev
            .iter()
            .filter_map(|e| match e {
                ExecEvent::Finished(f) if f.ended.outcome == Outcome::Preempted => Some(f.id),
                _ => None,
            })
            .collect();
        assert_eq!(preempted.len(), 2, "both low tasks stop for the 2-core one: {ev:?}");
        assert!(ev.iter().any(|e| matches!(e, ExecEvent::Started { id: 3, start_us: 10_000, .. })));
        // Priority orders the queue: 5 before 0, stable within one.
        let mut x = VirtualExec::new(1, 0, by_hint());
        let p = |id, priority| with(task(id, 1, 10), |s| s.priority = priority);
        let done = run_out(&mut x, vec![p(1, 0), p(2, 5), p(3, 0), p(4, 5)]);
        assert_eq!(done.iter().map(|f| f.id).collect::<Vec<_>>(), vec![2, 4, 1, 3]);
    }

    #[test]
    fn a_task_past_its_time_limit_ends_then_as_timed_out_and_frees_its_core() {
        // One slot: a 1 s task with a 300 ms limit, then a 100 ms one that starts when it is cut.
        let limited = with(task(1, 1, 1_000), |s| s.timeout_ms = 300);
        let within = with(task(3, 1, 100), |s| s.timeout_ms = 300);
        let done = run_out(&mut VirtualExec::new(1, 0, by_hint()), vec![limited, task(2, 1, 100), within]);
        let by_id = |id| done.iter().find(|f| f.id == id).unwrap();
        assert_eq!(
            (by_id(1).ended.outcome, by_id(1).ended.value, by_id(1).ended.end_us),
            (Outcome::TimedOut, TERMINATED, 300_000)
        );
        assert_eq!((by_id(2).ended.start_us, by_id(2).ended.outcome), (300_000, Outcome::Exited));
        assert_eq!((by_id(3).ended.end_us, by_id(3).ended.outcome), (500_000, Outcome::Exited), "within its limit");
    }

    #[test]
    fn past_its_lease_nothing_starts_until_a_new_one_and_a_finish_needs_none() {
        let mut x = VirtualExec::new(1, 0, by_hint());
        let mut ev = Vec::new();
        x.command(0, Command::Lease(150_000), &mut ev);
        x.command(0, Command::Run(vec![task(1, 1, 100), task(2, 1, 100), task(3, 1, 100)]), &mut ev);
        x.step(0, &mut ev);
        x.step(100_000, &mut ev);
        // Task 1 ended at 100 ms and task 2 started then; at 200 ms the lease is over.
        x.step(200_000, &mut ev);
        let started = |ev: &[ExecEvent]| ev.iter().filter(|e| matches!(e, ExecEvent::Started { .. })).count();
        assert_eq!((started(&ev), x.running(), x.queued()), (2, 0, 1), "{ev:?}");
        x.command(300_000, Command::Lease(500_000), &mut ev);
        x.step(300_000, &mut ev);
        assert_eq!(started(&ev), 3, "a new lease lets the queue go on");
        let mut x = VirtualExec::new(1, 0, by_hint());
        x.command(0, Command::Lease(1), &mut ev);
        assert_eq!(
            run_out(&mut x, vec![task(1, 1, 10), task(2, 1, 10)]).len(),
            2,
            "told to finish, it runs its queue out"
        );
    }

    #[test]
    fn hold_starts_nothing_new_stop_recall_and_reset_say_what_happened() {
        let mut x = VirtualExec::new(1, 0, by_hint());
        let mut ev = Vec::new();
        x.command(0, Command::Run(vec![task(1, 1, 100), task(2, 1, 100), task(3, 1, 100), task(4, 1, 100)]), &mut ev);
        x.command(0, Command::Hold(true), &mut ev);
        x.step(0, &mut ev);
        assert!(ev.is_empty(), "held: nothing starts");
        x.command(1, Command::Hold(false), &mut ev);
        x.step(1, &mut ev);
        assert!(matches!(ev[..], [ExecEvent::Started { id: 1, .. }]));
        ev.clear();
        x.command(2, Command::Recall(vec![2]), &mut ev);
        x.command(2, Command::Stop(vec![1, 3]), &mut ev);
        let ended: Vec<(u64, Outcome)> = ev
            .iter()
            .filter_map(|e| match e {
                ExecEvent::Finished(f) => Some((f.id, f.ended.outcome)),
                _ => None,
            })
            .collect();
        assert!(ev.iter().any(|e| matches!(e, ExecEvent::Recalled { id: 2, .. })));
        assert_eq!(ended, vec![(3, Outcome::Preempted), (1, Outcome::Preempted)]);
        ev.clear();
        x.command(3, Command::Reset, &mut ev);
        assert!(matches!(ev[..], [ExecEvent::Reset]));
        assert_eq!((x.running(), x.next_end_us()), (0, None), "task 4 dropped with the rest");
        x.step(3, &mut ev);
        assert_eq!(ev.len(), 1, "nothing left to start");
    }
}
