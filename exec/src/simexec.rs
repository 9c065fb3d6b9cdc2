//! Executors that start no process, for measuring the scheduling path alone (the way HyperQueue
//! measures its overhead): `none` finishes every task the moment it arrives, `sleep` finishes it
//! after its `runtime` hint on a slot of its own, as a real task would occupy it. Both speak the
//! real executor's `Command`s and `ExecEvent`s, so an agent cannot tell them apart; both are
//! `htc_core::virtual_exec`, the executor `htc simulate` runs on its virtual clock.

use std::io;
use std::sync::mpsc;
use std::time::Duration;

use crate::executor::Handle;
use htc_core::virtual_exec::VirtualExec;
use htc_core::work::{Command, ExecEvent};
use htc_host::steady_us;

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
/// The decisions are `VirtualExec`'s (the same as `htc simulate`'s); this thread only keeps it
/// on the wall clock.
pub fn start(
    kind: ExecKind,
    slots: usize,
    sink: impl FnMut(Vec<ExecEvent>) + Send + 'static,
) -> io::Result<(Handle, std::thread::JoinHandle<io::Result<()>>)> {
    let (tx, rx) = mpsc::channel();
    let x = match kind {
        ExecKind::None => VirtualExec::instant(),
        // GPUs are the leader's to hand out and the agent's to check; a sleep needs none, so
        // any number fits.
        _ => VirtualExec::new(slots as u32, u32::MAX, Box::new(|t| t.shape.runtime_ms as u64 * 1000)),
    };
    let join = std::thread::Builder::new().name("sim-executor".into()).spawn(move || {
        run(x, rx, sink);
        Ok(())
    })?;
    Ok((Handle::new(tx), join))
}

fn run(mut x: VirtualExec, rx: mpsc::Receiver<Command>, mut sink: impl FnMut(Vec<ExecEvent>)) {
    let mut events = Vec::new();
    loop {
        if x.is_done() {
            return;
        }
        let cmd = match x.next_end_us() {
            Some(at) => match rx.recv_timeout(Duration::from_micros(at.saturating_sub(steady_us()))) {
                Ok(c) => Some(c),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            },
            None => match rx.recv() {
                Ok(c) => Some(c),
                Err(_) => return,
            },
        };
        let now = steady_us();
        // Take whatever else is waiting, so one batch of events answers it.
        for c in cmd.into_iter().chain(std::iter::from_fn(|| rx.try_recv().ok())) {
            x.command(now, c, &mut events);
        }
        x.step(now, &mut events);
        if !events.is_empty() {
            sink(std::mem::take(&mut events));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use htc_core::record::Outcome;
    use htc_core::work::{Finished, TaskToRun};
    use std::time::Instant;

    fn task(id: u64, cores: u16, runtime_ms: u32) -> TaskToRun {
        let shape = htc_core::shape::TaskShape { cores, runtime_ms, ..Default::default() };
        TaskToRun::new(id, 1, b"x".to_vec()).shaped(shape)
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
        assert!(done.iter().all(|f| f.ended.outcome == Outcome::Exited && f.ended.value == 0));
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
}
