//! A joined job's hold on the run (`htc-agent lead --join-run`): its link to the leader that took
//! it in, its agents (one srun step, or those that kept their tasks through a hand-over), the
//! run's lock once nobody leads. What to do when is `htc_engine::lifecycle`'s; these are the
//! I/O it asks for, each answering with the machine's next input.

use std::sync::{mpsc, Arc};
use std::time::Duration;

use anyhow::Context;
use htc_core::output::OutputMode;
use htc_core::tree::Tree;
use htc_engine::lifecycle::{Input, LiveSeen};
use htc_store::rundir::{RunDir, RunLock};

use crate::join::{self, JoinError, Joined};
use crate::leader::{driver::Event, launch, srun::Srun};
use crate::{agent, slurm};

/// How long a joined job's agents wait, with their tasks, for the run's next leader when theirs
/// goes (`WorkArgs::await_leader_s`): a job of theirs takes the run over within seconds.
const AWAIT_LEADER_S: u64 = 60;

/// How often the agents' end and the leader's link are looked at.
const WATCH_EVERY: Duration = Duration::from_millis(250);

/// This job's shape in the run.
#[derive(Debug, Clone)]
pub struct Shape {
    pub nodes: usize,
    pub agents_per_node: usize,
    pub instance_size: u32,
    /// The output mode when the run does not say its own.
    pub output: OutputMode,
    /// The site's bound on silent agents.
    pub lost_after: Duration,
    /// How the site has the agents enforce tasks' `mem=`.
    pub mem_limit: htc_exec::memcg::Enforce,
    /// When this job must be gone from the run (its end less KillWait), unix µs.
    pub leave_us: Option<u64>,
}

impl Shape {
    fn agents(&self) -> u32 {
        (self.nodes * self.agents_per_node) as u32
    }
}

/// A joined job's agents, still running after their leader went, with the tasks they hold:
/// should this job take the run over, they are its agents.
pub struct Survivors {
    pub agents: launch::Agents,
    /// What the srun step's watcher says (its end), for the new leader's core.
    pub events: mpsc::Receiver<Event>,
    pub layout: Arc<Tree>,
    pub first: u32,
    pub fanout: u32,
}

/// This job's agents while they run.
struct Running {
    agents: launch::Agents,
    events: mpsc::Receiver<Event>,
    first: u32,
    fanout: u32,
}

pub struct Stay {
    run: RunDir,
    job: String,
    shape: Shape,
    joined: Option<Joined>,
    /// Says when the leader's end of the link closes.
    gone: Option<mpsc::Receiver<()>>,
    agents: Option<Running>,
    lock: Option<RunLock>,
}

impl Stay {
    pub fn new(run: RunDir, job: &str, shape: Shape) -> Stay {
        Stay { run, job: job.to_string(), shape, joined: None, gone: None, agents: None, lock: None }
    }

    /// Asks the run's leader for a place; with `keep`, for the agents this job kept.
    pub fn attach(&mut self, keep: bool) -> Input {
        let req = join::Request {
            job: self.job.clone(),
            agents: self.shape.agents(),
            instance_size: self.shape.instance_size,
            nodes: self.shape.nodes as u32,
            cores: slurm::job_cpus().unwrap_or(self.shape.nodes as u64),
            ends_us: self.shape.leave_us,
            cluster: slurm::cluster_name(),
            keep_first: self.agents.as_ref().filter(|_| keep).map(|a| a.first),
        };
        self.attach_as(req)
    }

    fn attach_as(&mut self, req: join::Request) -> Input {
        let joined = match join::attach(&self.run, &req) {
            Ok(j) => j,
            Err(e) => {
                let leader_went = matches!(e, JoinError::NotRunning { .. } | JoinError::NoAnswer { .. });
                return Input::AttachFailed { why: e.to_string(), leader_went };
            }
        };
        // The job is another name of the run from now on (`htc status JOB`), as a job that
        // continues it is.
        if let Err(e) = crate::continuation::link_job(&self.run, &self.job) {
            tracing::warn!(job = %self.job, error = %format!("{e:#}"), "the run cannot be named by this job's id");
        }
        let workdir_refused = joined.enter_workdir().err().map(|e| (joined.workdir.clone(), e.to_string()));
        let first = joined.first_agent;
        let input = Input::Attached {
            first,
            last: first + req.agents - 1,
            run_job: joined.run_job.clone(),
            leader_job: joined.leader_job.clone(),
            workdir_refused,
        };
        self.gone = joined.leader_gone().ok();
        self.joined = Some(joined);
        input
    }

    /// Starts this job's agents with one srun step, ids from the place the leader gave.
    pub fn start_agents(&mut self, await_leader: bool) -> Input {
        let Some(joined) = &self.joined else { return Input::AgentsNotStarted("not in the run".into()) };
        let srun = Srun {
            agent_bin: launch::agent_binary(),
            nodes: self.shape.nodes,
            agents_per_node: self.shape.agents_per_node,
            spawners: agent::LOOP_PER_SLOT,
            output: joined.output.parse().unwrap_or(self.shape.output),
            fanout: joined.fanout,
            instance_size: self.shape.instance_size,
            lost_after: self.shape.lost_after,
            mem_limit: self.shape.mem_limit,
            first_agent: joined.first_agent,
            // Agents with members would have to carry theirs through a hand-over too: they do
            // not wait (`Instance::with_await_leader`), and a new leader starts its own.
            await_leader_s: if await_leader { AWAIT_LEADER_S } else { 0 },
        };
        // Agents that never join are the leader's to notice (this allocation's end tells it);
        // after a hand-over, this job's own leader's.
        let (tx, events) = mpsc::channel();
        match srun.start(&self.run, joined.leader, tx) {
            Ok(agents) => {
                let (first, fanout) = (joined.first_agent, joined.fanout);
                self.agents = Some(Running { agents, events, first, fanout });
                Input::AgentsStarted
            }
            Err(e) => Input::AgentsNotStarted(format!("{e:#}")),
        }
    }

    /// Waits for the agents to end, or, with `link`, for the leader's link to close.
    pub fn watch(&mut self, link: bool) -> Input {
        let Some(running) = self.agents.as_mut() else { return Input::AgentsEnded };
        while !running.agents.wait(WATCH_EVERY) {
            if link && self.gone.as_ref().is_some_and(|g| g.try_recv().is_ok()) {
                return Input::LeaderLinkClosed;
            }
        }
        Input::AgentsEnded
    }

    /// Closes the link to the leader; the agents run on with their tasks only with `keep_agents`.
    pub fn detach(&mut self, keep_agents: bool) {
        self.joined = None;
        self.gone = None;
        if !keep_agents {
            self.agents = None;
        }
    }

    /// Lets the kept agents finish what they hold.
    pub fn drain_agents(&mut self) -> Input {
        if let Some(mut r) = self.agents.take() {
            r.agents.wait(Duration::from_secs(365 * 86_400));
        }
        Input::AgentsEnded
    }

    /// Who the run's files say leads: the job in its address file, and its live view.
    pub fn look_for_leader(&self) -> Input {
        let published = self.run.leader_at().ok().flatten().map(|at| at.job);
        let live = crate::livefile::read(&self.run.path).ok().flatten().map(|v| LiveSeen {
            job: v.job,
            state: v.state,
            written_us: v.now_us,
        });
        Input::LeaderSeen { published, live }
    }

    /// Tries the run's lock: held by whoever leads (the old leader while it writes its last
    /// snapshot, or a joined job that took over).
    pub fn take_lock(&mut self) -> anyhow::Result<Input> {
        match self.run.lock() {
            Ok(lock) => {
                let reading = RunDir::open_for_reading(self.run.path.clone())?;
                let unfinished =
                    htc_store::ledger::Ledger::open(&reading.ledger(), true)?.read()?.counts()?.unfinished();
                self.lock = Some(lock);
                Ok(Input::LockTaken { unfinished })
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                Ok(Input::LockBusy { published: self.run.leader_at().ok().flatten().is_some() })
            }
            Err(e) => Err(e).context("locking the run"),
        }
    }

    /// The run's lock, once `take_lock` got it.
    pub fn lock(&mut self) -> Option<RunLock> {
        self.lock.take()
    }

    /// The agents this job kept, if its leader went while they ran, with the tree they are
    /// grafted on.
    pub fn survivors(&mut self) -> Option<Survivors> {
        let r = self.agents.take()?;
        let layout = Arc::new(Tree::grafted(r.first, self.shape.agents(), 1, r.fanout));
        Some(Survivors { agents: r.agents, events: r.events, layout, first: r.first, fanout: r.fanout })
    }

    /// How many agents this job kept.
    pub fn kept_agents(&self) -> Option<usize> {
        self.agents.as_ref().map(|r| r.agents.count)
    }
}
