//! A run that grows itself (`--htc-grow`): the driver's side of `htc_core::grow`. Once a second
//! the policy is shown the run as the core sees it; a submission it asks for runs on a thread of
//! its own (a slow controller must not hold up the leader), and its job id comes back as an
//! event. Grown jobs still pending when the run ends are cancelled.

use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use htc_core::grow::{Decision, GrowSpec, Grower};

use super::core::{Core, Outbox};
use super::driver::Event;

/// How grown jobs are submitted and cancelled (`sbatch --htc-join`, `scancel`): the product's.
pub trait Submit: Send + Sync {
    /// Submits a job of `nodes` nodes for `minutes` that joins the run; its job id, or why not.
    fn submit(&self, nodes: u32, minutes: u64, reason: &str) -> Result<String, String>;
    fn cancel(&self, jobs: &[String]);
    /// Ids of the jobs that wait for nodes now (pending for resources or priority): one
    /// controller RPC. `None` when it cannot be told.
    fn waiting(&self) -> Option<Vec<String>>;
}

/// How often the queue is asked whether other jobs wait for nodes: its cost grows with the
/// run's time, not its tasks.
const LOOK_EVERY: Duration = Duration::from_secs(10);

const EVERY: Duration = Duration::from_secs(1);

pub struct Growing {
    grower: Grower,
    /// The run's own job's time limit, the default for grown jobs.
    own_minutes: u64,
    submit: Arc<dyn Submit>,
    events: Option<mpsc::Sender<Event>>,
    last: Option<Instant>,
    /// When the queue was last asked, and whether jobs not grown by this run wait for nodes.
    looked: Option<Instant>,
    others_waiting: bool,
}

impl Growing {
    pub fn new(spec: GrowSpec, own_minutes: u64, submit: Arc<dyn Submit>) -> Growing {
        Growing {
            grower: Grower::new(spec),
            own_minutes,
            submit,
            events: None,
            last: None,
            looked: None,
            others_waiting: false,
        }
    }

    /// Where a submission's outcome goes: the driver's events.
    pub fn answer_to(&mut self, events: mpsc::Sender<Event>) {
        self.events = Some(events);
    }

    /// Shows the policy the run, at most once a second: grown jobs leave while other jobs wait
    /// for nodes (frames for them go to `out`), and a submission it asks for starts.
    pub fn turn(&mut self, core: &mut Core<'_>, now_us: u64, out: &mut Outbox) {
        if self.last.is_some_and(|t| t.elapsed() < EVERY) {
            return;
        }
        self.last = Some(Instant::now());
        self.look();
        let over: Vec<String> = core.allocations_over().map(String::from).collect();
        for job in over {
            self.grower.ended(&job);
        }
        let situation = htc_core::grow::Situation {
            others_waiting: self.others_waiting,
            ..core.grow_situation(now_us, self.own_minutes)
        };
        for job in self.grower.yielding(&situation) {
            println!("htc: grow: other jobs wait for nodes; job {job} gives its nodes back");
            core.leave_allocation(&job, "gives its nodes back to jobs that wait for them", out);
        }
        let Decision::Submit { nodes, minutes, reason } = self.grower.decide(&situation) else { return };
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

    /// Asks the queue, on a thread of its own, whether other jobs wait for nodes.
    fn look(&mut self) {
        if self.looked.is_some_and(|t| t.elapsed() < LOOK_EVERY) {
            return;
        }
        self.looked = Some(Instant::now());
        let (submit, events) = (self.submit.clone(), self.events.clone());
        std::thread::spawn(move || {
            if let (Some(waiting), Some(tx)) = (submit.waiting(), events) {
                let _ = tx.send(Event::Waiting(waiting));
            }
        });
    }

    /// The jobs that wait for nodes now: are any of them not this run's own?
    pub fn waiting(&mut self, jobs: Vec<String>) {
        self.others_waiting = jobs.iter().any(|j| !self.grower.grew(j));
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
