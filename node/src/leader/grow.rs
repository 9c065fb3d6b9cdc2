//! A run that grows itself (`--htc-grow`): the driver's side of `htc_core::grow`. Once a second
//! the policy is shown the run as the core sees it; a submission it asks for runs on a thread of
//! its own (a slow controller must not hold up the leader), and its job id comes back as an
//! `Answer`, which the driver hands back to `Growing::answer` on its own thread. Grown jobs still
//! pending when the run ends are cancelled.

use std::sync::Arc;
use std::time::{Duration, Instant};

use htc_core::grow::{Decision, Grower};

use super::core::Core;
use super::effect::Effects;

/// How grown jobs are submitted and cancelled (`sbatch --htc-join`, `scancel`): the product's.
pub trait Submit: Send + Sync {
    /// Submits a job of `nodes` nodes for `minutes` that joins the run; its job id, or why not.
    fn submit(&self, nodes: u32, minutes: u64, reason: &str) -> Result<String, String>;
    fn cancel(&self, jobs: &[String]);
    /// What the queue holds now: one controller RPC. `None` when it cannot be told.
    fn queue(&self) -> Option<Queue>;
}

/// The queue as a growing run looks at it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Queue {
    /// Jobs that wait for nodes (pending for resources or priority).
    pub waiting: Vec<String>,
    /// Every job in it, whatever its state.
    pub present: Vec<String>,
    /// Grown jobs that had not joined when the queue was asked (filled in by `Growing`).
    pub asked: Vec<String>,
}

impl Queue {
    /// Reads `squeue -h -o "%i %t %r"`: job id, compact state, reason.
    pub fn parse(text: &str) -> Queue {
        let mut q = Queue::default();
        for line in text.lines() {
            let mut f = line.split_whitespace();
            let (Some(id), Some(state)) = (f.next(), f.next()) else { continue };
            // Only jobs held up by nodes: not those waiting for a dependency, a hold or a time.
            if state == "PD" && matches!(f.next(), Some("Resources" | "Priority")) {
                q.waiting.push(id.to_string());
            }
            q.present.push(id.to_string());
        }
        q
    }

    /// The grown jobs asked about (not joined then) that are in the queue no more.
    pub fn gone(&self) -> impl Iterator<Item = &String> {
        self.asked.iter().filter(|j| !self.present.contains(j))
    }
}

/// What comes back from the threads that submit jobs and ask the queue.
#[derive(Debug)]
pub enum Answer {
    /// A grown job was submitted (its id), or could not be.
    Submitted(Result<String, String>),
    /// What the queue holds now (a growing run yields to the jobs that wait for nodes, and
    /// counts its grown jobs gone from it no more).
    Queue(Queue),
}

/// Where answers go (`Growing::answer_to`).
type Tell = Arc<dyn Fn(Answer) + Send + Sync>;

/// How often the queue is asked whether other jobs wait for nodes: its cost grows with the
/// run's time, not its tasks.
const LOOK_EVERY: Duration = Duration::from_secs(10);

const EVERY: Duration = Duration::from_secs(1);

pub struct Growing {
    grower: Grower,
    /// The run's own job's time limit, the default for grown jobs.
    own_minutes: u64,
    submit: Arc<dyn Submit>,
    tell: Option<Tell>,
    last: Option<Instant>,
    /// When the queue was last asked, and whether jobs not grown by this run wait for nodes.
    looked: Option<Instant>,
    others_waiting: bool,
}

impl Growing {
    pub fn new(grower: Grower, own_minutes: u64, submit: Arc<dyn Submit>) -> Growing {
        Growing { grower, own_minutes, submit, tell: None, last: None, looked: None, others_waiting: false }
    }

    /// Where the answers of submissions and of the queue go: to the driver, which hands them
    /// back to `answer`.
    pub fn answer_to(&mut self, tell: impl Fn(Answer) + Send + Sync + 'static) {
        self.tell = Some(Arc::new(tell));
    }

    /// An answer from a submission or the queue.
    pub fn answer(&mut self, a: Answer, now_us: u64) {
        match a {
            Answer::Submitted(r) => self.submitted(r, now_us),
            Answer::Queue(q) => self.queue(q),
        }
    }

    /// Shows the policy the run, at most once a second: grown jobs leave while other jobs wait
    /// for nodes (what their agents are told goes to `out`), and a submission it asks for starts.
    pub fn turn(&mut self, core: &mut Core<'_>, now_us: u64, out: &mut Effects) {
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
        let (why, reason) = if situation.others_waiting {
            ("other jobs wait for nodes", "gives its nodes back to jobs that wait for them")
        } else {
            ("the open run has had nothing to do for a while", "gives its nodes back: the open run has nothing to do")
        };
        for job in self.grower.yielding(&situation) {
            println!("htc: grow: {why}; job {job} gives its nodes back");
            core.leave_allocation(&job, reason, out);
        }
        let Decision::Submit { nodes, minutes, reason } = self.grower.decide(&situation) else { return };
        // Quiet from now: the job id comes back later.
        self.grower.failed(now_us);
        let (submit, tell) = (self.submit.clone(), self.tell.clone());
        std::thread::spawn(move || {
            let r = submit.submit(nodes, minutes, &reason);
            if let Some(tell) = tell {
                tell(Answer::Submitted(r));
            }
        });
    }

    /// Asks the queue, on a thread of its own, whether other jobs wait for nodes, and whether
    /// the grown jobs not joined yet are still in it.
    fn look(&mut self) {
        if self.looked.is_some_and(|t| t.elapsed() < LOOK_EVERY) {
            return;
        }
        self.looked = Some(Instant::now());
        let (submit, tell, asked) = (self.submit.clone(), self.tell.clone(), self.grower.pending());
        std::thread::spawn(move || {
            if let (Some(q), Some(tell)) = (submit.queue(), tell) {
                tell(Answer::Queue(Queue { asked, ..q }));
            }
        });
    }

    /// What the queue holds: are jobs not this run's own waiting for nodes? A grown job that
    /// left it without joining (cancelled by its owner or an admin, failed) counts no more.
    fn queue(&mut self, q: Queue) {
        self.others_waiting = q.waiting.iter().any(|j| !self.grower.grew(j));
        for job in q.gone() {
            if self.grower.pending().contains(job) {
                println!("htc: grow: job {job} left the queue without joining the run; it counts no more");
                self.grower.ended(job);
            }
        }
    }

    /// A submission's outcome.
    fn submitted(&mut self, r: Result<String, String>, now_us: u64) {
        match r {
            Ok(job) => {
                tracing::info!(%job, "submitted a job to join the run");
                self.grower.submitted(job, now_us);
            }
            // A limit of the site's: said once, and not asked again until a grown job ends.
            Err(why) if htc_core::grow::refused_by_limit(&why) => {
                if self.grower.refused(now_us) {
                    println!("htc: grow: the site's limits refuse another job; the run goes on with the nodes it has ({why})");
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_tells_jobs_waiting_for_nodes_and_grown_jobs_gone_from_it() {
        let text = "101 R None\n102 PD Resources\n103 PD Priority\n104 PD Dependency\n105 PD (null)\n7_3 CG None\n";
        let q = Queue { asked: vec!["102".into(), "99".into()], ..Queue::parse(text) };
        assert_eq!(q.waiting, ["102", "103"]);
        assert_eq!(q.present, ["101", "102", "103", "104", "105", "7_3"]);
        assert_eq!(q.gone().collect::<Vec<_>>(), ["99"], "job 99 was cancelled before it joined");
        assert_eq!(Queue::parse("garbage\n\n"), Queue::default());
    }
}
