//! The agent's spawners as it runs them: their threads and handles, the events they send, and
//! the commands `htc_core::fanout::Fanout` decides, carried out. Every decision about which
//! spawner runs a task, holds or finishes is the fan-out's; this file only starts, sends,
//! joins and says what failed.

use std::sync::Arc;
use std::time::Duration;

use htc_core::fanout::{Effect, Fanout, Spread};
use htc_core::output::OutputMode;
use htc_exec::executor::{self, Command, ExecConfig, ExecEvent, Handle};
use htc_exec::simexec::{self, ExecKind};
use tokio::sync::mpsc::UnboundedSender;

use super::config::AgentConfig;

/// Events of spawner `i`; `None` once it stopped.
pub(super) type Spawned = (usize, Option<Vec<ExecEvent>>);

/// Hands a spawner's events to the agent's loop, and says so when the spawner's thread ends
/// (the sink is dropped with it), however it ends.
struct Sink {
    i: usize,
    tx: UnboundedSender<Spawned>,
}

impl Sink {
    fn send(&self, batch: Vec<ExecEvent>) {
        let _ = self.tx.send((self.i, Some(batch)));
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        let _ = self.tx.send((self.i, None));
    }
}

/// The agent's executors: one simulated one, or real spawn loops splitting the slots and CPUs
/// (and the wide spawner beside them), fanned out over by `Fanout`.
pub(super) struct Executors {
    handles: Vec<Handle>,
    threads: Vec<Option<std::thread::JoinHandle<std::io::Result<()>>>>,
    fanout: Fanout,
    /// What became of tasks that waited in the fan-out, for the machine (`own_events`).
    own: Vec<ExecEvent>,
    effects: Vec<Effect>,
}

impl Executors {
    /// No spawner yet, tasks spread as `spread` says.
    fn with(spread: Spread) -> Executors {
        Executors {
            handles: Vec::new(),
            threads: Vec::new(),
            fanout: Fanout::new(spread),
            own: Vec::new(),
            effects: Vec::new(),
        }
    }

    pub(super) fn start(
        cfg: &AgentConfig,
        job_id: &str,
        memcg: Option<Arc<htc_exec::memcg::Root>>,
        events: UnboundedSender<Spawned>,
    ) -> anyhow::Result<Executors> {
        let sink = |i: usize| {
            let sink = Sink { i, tx: events.clone() };
            move |batch| sink.send(batch)
        };
        if cfg.exec != ExecKind::Real {
            let (h, t) = simexec::start(cfg.exec, cfg.slots, sink(0))?;
            let mut x = Executors::with(Spread::new(vec![cfg.slots]));
            x.handles.push(h);
            x.threads.push(Some(t));
            return Ok(x);
        }
        let k = match cfg.spawners {
            0 => cfg.slots,
            n => n,
        }
        .clamp(1, cfg.slots.max(1));
        let mut x = Executors::with(Spread::new(Vec::new()));
        // One pool for all the spawn loops: a task gets devices whichever loop runs it.
        let gpus = htc_exec::gpu::Pool::new(cfg.gpus.clone());
        // (spawner, its CPUs, its slots, its first slot): the loops, then beside them one for
        // tasks that need several of their CPUs, its slots numbered after theirs for its own
        // output files.
        let mut specs: Vec<(usize, Vec<usize>, usize, usize)> = (0..k)
            .map(|i| {
                let (first, n) = crate::slurm::node_share(cfg.slots, k, i);
                let cpus = if cfg.cpus.is_empty() { Vec::new() } else { cfg.cpus[first..first + n].to_vec() };
                (i, cpus, n, first)
            })
            .collect();
        let loops: Vec<usize> = specs.iter().map(|s| s.2).collect();
        let wide = cfg.spawners == 0 && k > 1;
        if wide {
            specs.push((k, cfg.cpus.clone(), k, k));
        }
        for (i, cpus, slots, first_slot) in specs {
            let ec = ExecConfig {
                cpus,
                slots,
                spawner: i,
                first_slot,
                results: Some(cfg.run.agent_out(cfg.agent_id).join(htc_exec::results::file_name(i))),
                gpus: gpus.clone(),
                memcg: memcg.clone(),
                ..exec_config(cfg, job_id)
            };
            let (h, t) = executor::start(ec, sink(i))?;
            x.handles.push(h);
            x.threads.push(Some(t));
        }
        x.fanout = Fanout::new(if wide { Spread::with_wide(k) } else { Spread::new(loops) });
        Ok(x)
    }

    /// Events of tasks that waited in the fan-out, not in any spawner: the agent's loop feeds
    /// them to the machine before it waits for anything else.
    pub(super) fn own_events(&mut self) -> Option<Vec<ExecEvent>> {
        (!self.own.is_empty()).then(|| std::mem::take(&mut self.own))
    }

    /// A command of the agent's machine.
    pub(super) fn send(&mut self, c: Command) {
        self.fanout.command(c, htc_host::steady_us(), &mut self.effects);
        self.carry_out();
    }

    /// Spawner `i` reported these events. True when that completes a reset.
    pub(super) fn ran(&mut self, i: usize, batch: &[ExecEvent]) -> bool {
        let reset = self.fanout.reported(i, batch, htc_host::steady_us(), &mut self.effects);
        self.carry_out();
        reset
    }

    /// Spawner `i`'s thread ended. Unasked, that is a failure: the others are stopped too, and
    /// the reason is returned for the agent (the thread's own error, when it returned one).
    pub(super) fn ended(&mut self, i: usize) -> Option<String> {
        let failed = self.fanout.ended(i, &mut self.effects);
        self.carry_out();
        if !failed {
            return None;
        }
        // The thread dropped its sink on the way out: joining waits for its last instructions.
        Some(match self.threads.get_mut(i).and_then(Option::take).map(|t| t.join()) {
            Some(Ok(Err(e))) => format!("spawn loop {i} failed: {e}"),
            Some(Err(_)) => format!("spawn loop {i} panicked"),
            _ => format!("spawn loop {i} stopped unexpectedly"),
        })
    }

    /// The agent's tick: tasks stuck behind a busy spawner's slots are asked back.
    pub(super) fn tick(&mut self) {
        self.fanout.tick(htc_host::steady_us(), &mut self.effects);
        for e in &self.effects {
            if let Effect::Send(j, Command::Recall(ids)) = e {
                tracing::debug!(spawner = j, tasks = ids.len(), "tasks queued behind busy slots given back");
            }
        }
        self.carry_out();
    }

    fn carry_out(&mut self) {
        for e in self.effects.drain(..) {
            match e {
                Effect::Send(i, c) => {
                    if let Some(h) = self.handles.get(i) {
                        h.send(c);
                    }
                }
                Effect::Ended(ev) => self.own.push(ev),
            }
        }
    }

    pub(super) fn join(self) {
        for (i, t) in self.threads.into_iter().enumerate() {
            let Some(t) = t else { continue };
            match t.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::error!(spawner = i, error = %e, "spawn loop failed"),
                Err(_) => tracing::error!(spawner = i, "spawn loop panicked"),
            }
        }
    }
}

fn exec_config(cfg: &AgentConfig, job_id: &str) -> ExecConfig {
    ExecConfig {
        job_id: job_id.to_string(),
        agent: cfg.agent_id,
        cpus: cfg.cpus.clone(),
        slots: cfg.slots,
        out_dir: match cfg.output {
            OutputMode::PerTask => cfg.run.out().join("tasks"),
            _ => cfg.run.agent_out(cfg.agent_id),
        },
        output: cfg.output,
        env: std::env::vars_os().collect(),
        kill_grace: cfg.kill_grace,
        spawner: 0,
        first_slot: 0,
        gpus: htc_exec::gpu::Pool::default(),
        memcg: None,
        linger: if cfg.keep_daemons { htc_exec::executor::LINGER } else { Duration::ZERO },
        results: Some(cfg.run.agent_out(cfg.agent_id).join(htc_exec::results::file_name(0))),
    }
}

/// The agent's memory cgroups for its slots, shared by its spawn loops, per `--mem-limit`.
pub(super) fn memory_cgroups(cfg: &AgentConfig) -> anyhow::Result<Option<Arc<htc_exec::memcg::Root>>> {
    use htc_exec::memcg::{Enforce, Root};
    if cfg.mem_limit == Enforce::Watch {
        // The log says which way it enforces, chosen or not (docs/resources.md).
        tracing::info!(
            agent = cfg.agent_id,
            why = "--mem-limit watch",
            "tasks' mem= enforced by watching their resident memory"
        );
        return Ok(None);
    }
    match Root::create() {
        Ok(root) => {
            tracing::info!(agent = cfg.agent_id, dir = %root.dir().display(), version = ?root.version(), "tasks' mem= enforced by memory cgroups");
            Ok(Some(Arc::new(root)))
        }
        Err(why) if cfg.mem_limit == Enforce::Cgroup => anyhow::bail!("--mem-limit cgroup: {why}"),
        Err(why) => {
            tracing::info!(agent = cfg.agent_id, why, "tasks' mem= enforced by watching their resident memory");
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc::unbounded_channel;

    #[test]
    fn a_spawner_says_when_its_thread_ends_and_unasked_that_is_a_failure() {
        let (tx, mut rx) = unbounded_channel::<Spawned>();
        let sink = {
            let sink = Sink { i: 1, tx };
            move |batch| sink.send(batch)
        };
        sink(Vec::new());
        drop(sink); // as when the executor's thread ends, however it ends
        assert!(matches!(rx.try_recv(), Ok((1, Some(_)))));
        assert!(matches!(rx.try_recv(), Ok((1, None))));
        assert!(rx.try_recv().is_err(), "and then the channel is closed");

        let idle = || Executors::with(Spread::new(Vec::new()));
        let mut x = idle();
        assert_eq!(x.ended(1).as_deref(), Some("spawn loop 1 stopped unexpectedly"));
        assert!(x.ended(0).is_none(), "the others were told to stop");
        let mut x = idle();
        x.send(Command::Finish);
        assert!(x.ended(0).is_none(), "told to finish: the normal end");
    }
}
