//! A run that grows itself (`--htc-grow`): the driver's side of `htc_core::grow`. Once a second
//! the policy is shown the run as the core sees it; a submission it asks for runs on a thread of
//! its own (a slow controller must not hold up the leader), and its job id comes back as an
//! event. Grown jobs still pending when the run ends are cancelled.

use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use htc_core::grow::{Decision, GrowSpec, Grower};

use super::core::Core;
use super::driver::Event;

/// How grown jobs are submitted and cancelled (`sbatch --htc-join`, `scancel`): the product's.
pub trait Submit: Send + Sync {
    /// Submits a job of `nodes` nodes for `minutes` that joins the run; its job id, or why not.
    fn submit(&self, nodes: u32, minutes: u64, reason: &str) -> Result<String, String>;
    fn cancel(&self, jobs: &[String]);
}

const EVERY: Duration = Duration::from_secs(1);

pub struct Growing {
    grower: Grower,
    /// The run's own job's time limit, the default for grown jobs.
    own_minutes: u64,
    submit: Arc<dyn Submit>,
    events: Option<mpsc::Sender<Event>>,
    last: Option<Instant>,
}

impl Growing {
    pub fn new(spec: GrowSpec, own_minutes: u64, submit: Arc<dyn Submit>) -> Growing {
        Growing { grower: Grower::new(spec), own_minutes, submit, events: None, last: None }
    }

    /// Where a submission's outcome goes: the driver's events.
    pub fn answer_to(&mut self, events: mpsc::Sender<Event>) {
        self.events = Some(events);
    }

    /// Shows the policy the run, at most once a second, and starts a submission it asks for.
    pub fn turn(&mut self, core: &Core<'_>, now_us: u64) {
        if self.last.is_some_and(|t| t.elapsed() < EVERY) {
            return;
        }
        self.last = Some(Instant::now());
        for job in core.allocations_over() {
            self.grower.ended(job);
        }
        let Decision::Submit { nodes, minutes, reason } =
            self.grower.decide(&core.grow_situation(now_us, self.own_minutes))
        else {
            return;
        };
        // Quiet from now: the job id comes back later.
        self.grower.failed(now_us);
        let (submit, events) = (self.submit.clone(), self.events.clone());
        std::thread::spawn(move || {
            let r = submit.submit(nodes, minutes, &reason);
            if let Some(tx) = events {
                let _ = tx.send(Event::Grown(r));
            }
        });
    }

    /// A submission's outcome.
    pub fn submitted(&mut self, r: Result<String, String>, now_us: u64) {
        match r {
            Ok(job) => {
                tracing::info!(%job, "submitted a job to join the run");
                self.grower.submitted(job, now_us);
            }
            Err(why) => tracing::warn!(%why, "could not submit a job to join the run"),
        }
    }

    /// The run is over: grown jobs that never started would only find it ended.
    pub fn end(&self) {
        let pending = self.grower.pending();
        if !pending.is_empty() {
            self.submit.cancel(&pending);
        }
    }
}
