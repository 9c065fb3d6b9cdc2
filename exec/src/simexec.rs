//! Executors that start no process, for measuring the scheduling path alone (the way HyperQueue
//! measures its overhead): `none` finishes every task the moment it arrives, `sleep` finishes it
//! after its `runtime` hint on a slot of its own, as a real task would occupy it. Both speak the
//! real executor's `Command`s and `ExecEvent`s, so an agent cannot tell them apart.

use std::collections::{BinaryHeap, VecDeque};
use std::io;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::executor::Handle;
use htc_core::record::Outcome;
use htc_core::work::{recall_from, Command, ExecEvent, Finished, TaskToRun};
use htc_store::host::now_us;

/// How an agent runs its tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ExecKind {
    /// Real processes.
    #[default]
    Real,
    /// No process: each task succeeds at once.
    None,
    /// No process: each task succeeds after its `runtime` hint, holding its cores meanwhile.
    Sleep,
}

impl ExecKind {
    pub fn name(self) -> &'static str {
        match self {
            ExecKind::Real => "real",
            ExecKind::None => "none",
            ExecKind::Sleep => "sleep",
        }
    }
}

/// Starts a simulated executor thread with `slots` cores; `sink` receives events in batches.
pub fn start(
    kind: ExecKind,
    slots: usize,
    sink: impl FnMut(Vec<ExecEvent>) + Send + 'static,
) -> io::Result<(Handle, std::thread::JoinHandle<io::Result<()>>)> {
    let (tx, rx) = mpsc::channel();
    let mut sim = Sim { instant: kind == ExecKind::None, free: slots.max(1) as u32, ..Default::default() };
    let join = std::thread::Builder::new().name("sim-executor".into()).spawn(move || {
        sim.run(rx, sink);
        Ok(())
    })?;
    Ok((Handle::new(tx), join))
}

/// A task holding its cores: (end, id, attempt, cores, start_us), earliest end first.
type Busy = std::cmp::Reverse<(Instant, u64, u32, u32, u64)>;

#[derive(Default)]
struct Sim {
    instant: bool,
    free: u32,
    queue: VecDeque<TaskToRun>,
    running: BinaryHeap<Busy>,
    events: Vec<ExecEvent>,
}

impl Sim {
    fn run(&mut self, rx: mpsc::Receiver<Command>, mut sink: impl FnMut(Vec<ExecEvent>)) {
        let mut finishing = false;
        let mut held = false;
        loop {
            let next = self.running.peek().map(|r| r.0 .0);
            let cmd = match next {
                _ if finishing && self.running.is_empty() && (self.queue.is_empty() || held) => return,
                Some(at) => match rx.recv_timeout(at.saturating_duration_since(Instant::now())) {
                    Ok(c) => Some(c),
                    Err(mpsc::RecvTimeoutError::Timeout) => None,
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                },
                None => match rx.recv() {
                    Ok(c) => Some(c),
                    Err(_) => return,
                },
            };
            // Take whatever else is waiting, so one batch of events answers it.
            for c in cmd.into_iter().chain(std::iter::from_fn(|| rx.try_recv().ok())) {
                match c {
                    Command::Run(v) => self.queue.extend(v),
                    Command::Finish => finishing = true,
                    Command::Hold(h) => held = h,
                    // Simulated tasks are not preempted: they end as they would.
                    Command::Stop(_) => {}
                    Command::Recall(ids) => recall_from(&mut self.queue, &ids, &mut self.events),
                    Command::Abort => return,
                    // Simulated tasks have no processes: dropping them stops them.
                    Command::Reset => {
                        self.queue.clear();
                        self.running.clear();
                        self.events.push(ExecEvent::Reset);
                    }
                }
            }
            self.step(Instant::now(), held);
            if !self.events.is_empty() {
                sink(std::mem::take(&mut self.events));
            }
        }
    }

    /// Ends what is due and starts what fits, in queue order (nothing new while `held`).
    fn step(&mut self, now: Instant, held: bool) {
        while let Some(r) = self.running.peek() {
            let (end, id, attempt, cores, start_us) = r.0;
            if end > now {
                break;
            }
            self.running.pop();
            self.free += cores;
            self.events.push(finished(id, attempt, start_us));
        }
        if held {
            return;
        }
        if self.instant {
            for t in self.queue.drain(..) {
                self.events.push(finished(t.id, t.attempt, now_us()));
            }
            return;
        }
        while let Some(t) = self.queue.front() {
            // A task wider than the agent runs alone rather than never.
            let cores = t.cores.max(1);
            if cores > self.free && !self.running.is_empty() {
                break;
            }
            let t = self.queue.pop_front().unwrap();
            let start_us = now_us();
            self.free = self.free.saturating_sub(cores);
            let end = now + Duration::from_millis(t.runtime_ms as u64);
            self.events.push(ExecEvent::Started { id: t.id, attempt: t.attempt, start_us });
            self.running.push(std::cmp::Reverse((end, t.id, t.attempt, cores, start_us)));
        }
        // Zero-length tasks end in the same step.
        if self.running.peek().is_some_and(|r| r.0 .0 <= now) {
            self.step(now, false);
        }
    }
}

fn finished(id: u64, attempt: u32, start_us: u64) -> ExecEvent {
    ExecEvent::Finished(Finished { id, attempt, outcome: Outcome::Exited, value: 0, start_us, end_us: now_us() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(id: u64, cores: u32, runtime_ms: u32) -> TaskToRun {
        TaskToRun {
            id,
            attempt: 1,
            command: b"x".to_vec(),
            shell: false,
            cores,
            mem_mb: 0,
            timeout_ms: 0,
            runtime_ms,
            max_output: 0,
            gpus: 0,
            priority: 0,
            preemptible: false,
        }
    }

    fn run(kind: ExecKind, slots: usize, tasks: Vec<TaskToRun>) -> (Vec<Finished>, Duration) {
        let (tx, rx) = mpsc::channel();
        let t0 = Instant::now();
        let (h, join) = start(kind, slots, move |b| {
            let _ = tx.send(b);
        })
        .unwrap();
        h.send(Command::Run(tasks));
        h.send(Command::Finish);
        join.join().unwrap().unwrap();
        let took = t0.elapsed();
        let done = rx
            .try_iter()
            .flatten()
            .filter_map(|e| match e {
                ExecEvent::Finished(f) => Some(f),
                _ => None,
            })
            .collect();
        (done, took)
    }

    #[test]
    fn none_finishes_everything_at_once() {
        let (done, _) = run(ExecKind::None, 1, (1..=1000).map(|i| task(i, 1, 60_000)).collect());
        assert_eq!(done.len(), 1000);
        assert!(done.iter().all(|f| f.outcome == Outcome::Exited && f.value == 0));
    }

    #[test]
    fn sleep_holds_slots_for_the_runtime() {
        // 6 tasks of 100 ms on 2 slots: three rounds, about 300 ms, not 100 and not 600.
        let (done, took) = run(ExecKind::Sleep, 2, (1..=6).map(|i| task(i, 1, 100)).collect());
        assert_eq!(done.len(), 6);
        assert!(took >= Duration::from_millis(290) && took < Duration::from_millis(550), "{took:?}");
        let mut ids: Vec<u64> = done.iter().map(|f| f.id).collect();
        ids.sort();
        assert_eq!(ids, (1..=6).collect::<Vec<_>>());
    }

    #[test]
    fn a_wide_task_waits_for_its_cores() {
        // A 2-core task behind a 1-core one on 2 slots starts only when both cores are free.
        let (done, took) = run(ExecKind::Sleep, 2, vec![task(1, 1, 100), task(2, 2, 100), task(3, 8, 0)]);
        assert_eq!(done.len(), 3);
        assert!(took >= Duration::from_millis(190), "{took:?}");
    }
}
