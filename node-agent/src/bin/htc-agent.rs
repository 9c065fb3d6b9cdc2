//! `htc-agent`: the daemon roles. `lead` is the leader in a Slurm batch step (started by the SPANK
//! plugin in place of the batch script); `work` is a node agent (started by `htc run` locally, or
//! by the leader's one `srun` step on every node: `htc_node::work`).
//!
//! What a job does in a run that spans allocations (join, keep or let go, wait for a new leader,
//! take over, leave near its time limit, resubmit) is `htc_engine::lifecycle`'s machine; `Driver`
//! below carries out its effects, preparing a run and leading a session through `htc::lead`.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use htc::cli::agent::{Cli, Cmd, LeadArgs};
use htc::lead::{lead_session, prepare, session_end_us};
use htc::leader;
use htc::rundir::{now_us, RunDir, RunLock};
use htc::{prologue, slurm};
use htc_engine::lifecycle::{Carrier, Effect, Exit, Input, Job, Life, Report, SessionEnd};
use htc_node::continuation::{self, release_node_local};
use htc_node::joined::{Shape, Stay};
use htc_node::submit;

fn main() -> ExitCode {
    // `--script` ends the options: what follows is the batch step's own argv, verbatim.
    let mut argv: Vec<OsString> = std::env::args_os().collect();
    let script: Vec<OsString> = match argv.iter().position(|a| a == "--script") {
        Some(i) => argv.split_off(i).into_iter().skip(1).collect(),
        None => Vec::new(),
    };
    let cli = Cli::parse_from(argv);
    // The leader's stderr is the job's output file: only what the user should read goes there.
    htc::init_logging(if matches!(cli.cmd, Cmd::Lead(_)) { "warn" } else { "info" });
    let r = match cli.cmd {
        Cmd::Lead(a) => lead(a, script),
        Cmd::Work(a) => htc_node::work::work(a).map(|()| 0),
    };
    match r {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("htc-agent: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The batch step: load the tasks, run the script as the prologue, start the agents with one
/// srun, lead until every task is finished. The exit code is the job's.
fn lead(a: LeadArgs, script: Vec<OsString>) -> anyhow::Result<i32> {
    let Some((script, script_args)) = script.split_first() else {
        bail!("missing --script SCRIPT (the plugin passes the batch script)");
    };
    let job_id = slurm::var("SLURM_JOB_ID")?;
    let nodes: usize =
        slurm::var("SLURM_JOB_NUM_NODES").or_else(|_| slurm::var("SLURM_NNODES"))?.parse().context("node count")?;
    // The job's end, to the second: its start plus its time limit.
    let end_us = slurm::time_left().map(|left| now_us() + left);
    let join_run = a.join_run.clone();
    let mut d = Driver::new(a, &job_id, nodes, end_us);
    if let Some(run) = join_run {
        let run = RunDir::new(continuation::join_run_dir(&run, &std::env::current_dir()?));
        return join(d, run, script, script_args);
    }
    let (run, said) = match prepare(&d.a, &job_id, nodes)? {
        Ok(r) => r,
        Err(why) => {
            eprintln!("htc: {why}");
            return Ok(2);
        }
    };
    let restarts = std::env::var("SLURM_RESTART_COUNT").unwrap_or_else(|_| "0".into());
    let header = format!(
        "== job {job_id} (restart {restarts}) on {}, {}",
        slurm::var("SLURMD_NODENAME").unwrap_or_default(),
        htc::calibrate::utc_now()
    );
    let kept = htc::sessionlog::keep(&run.path.join("job.out"), &header)
        .map_err(|e| tracing::warn!(error = %e, "the job's output is not kept in the run directory"))
        .ok();
    println!("{said}");
    d.run = Some(run.clone());
    let code = lead_run(d, &run, script, script_args);
    if let Some(k) = kept {
        k.end();
    }
    release_node_local(&run);
    code
}

/// The run's own session: the batch script as the prologue, then the machine from its lead.
fn lead_run(mut d: Driver, run: &RunDir, script: &OsString, script_args: &[OsString]) -> anyhow::Result<i32> {
    let p = match prologue::run(Path::new(script), script_args, &run.path.join("prologue.env")) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("htc: {e}");
            return Ok(1);
        }
    };
    if !p.captured {
        println!("htc: the batch script is not a shell script: it ran, but its environment does not reach the tasks");
    }
    prologue::adopt(&p).context("entering the batch script's environment")?;
    d.lock = Some(run.lock()?);
    let life = Life::leading(d.job(run));
    d.drive(life, vec![Effect::Lead])
}

/// `--htc-join`: this job's nodes join the running run: the batch script runs as this job's
/// prologue, then the machine from its join.
fn join(mut d: Driver, run: RunDir, script: &OsString, script_args: &[OsString]) -> anyhow::Result<i32> {
    let env = run.path.join(format!("prologue-{}.env", d.job_id));
    let p = match prologue::run(Path::new(script), script_args, &env) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("htc: {e}");
            return Ok(1);
        }
    };
    prologue::adopt(&p).context("entering the batch script's environment")?;
    let agents_per_node = d.a.agents_per_node.unwrap_or(1).max(1);
    let instance_size = (d.a.instance_nodes.unwrap_or(1).max(1) * agents_per_node) as u32;
    let mut job = d.job(&run);
    job.agents_wait = instance_size == 1;
    let site = htc::site::Site::load().unwrap_or_default();
    let shape = Shape {
        nodes: d.nodes,
        agents_per_node,
        instance_size,
        output: d.a.output,
        lost_after: site.lost_after,
        mem_limit: site.mem_limit,
        leave_us: job.leave_us(),
    };
    d.stay = Some(Stay::new(run.clone(), &d.job_id, shape));
    d.run = Some(run);
    let mut first = Vec::new();
    let life = Life::joining(job, &mut first);
    let code = d.drive(life, first);
    if let (true, Some(run)) = (d.led, &d.run) {
        release_node_local(run);
    }
    code
}

/// Carries out the run life's effects: each answers with the machine's next input.
struct Driver {
    a: LeadArgs,
    job_id: String,
    nodes: usize,
    end_us: Option<u64>,
    /// The run, once known (after a take-over: as rebuilt on this node).
    run: Option<RunDir>,
    /// A joined job's hold on the run.
    stay: Option<Stay>,
    lock: Option<RunLock>,
    /// The last session's outcome, for its summary, and the summary's exit code.
    outcome: Option<leader::Outcome>,
    code: i32,
    /// Whether this job led a session (its node holds a ledger).
    led: bool,
    inputs: VecDeque<Input>,
    exit: Option<Exit>,
}

impl Driver {
    fn new(a: LeadArgs, job_id: &str, nodes: usize, end_us: Option<u64>) -> Driver {
        Driver {
            a,
            job_id: job_id.to_string(),
            nodes,
            end_us,
            run: None,
            stay: None,
            lock: None,
            outcome: None,
            code: 0,
            led: false,
            inputs: VecDeque::new(),
            exit: None,
        }
    }

    fn job(&self, run: &RunDir) -> Job {
        Job {
            id: self.job_id.clone(),
            run_id: run.id(),
            run: run.path.display().to_string(),
            nodes: self.nodes,
            end_us: self.end_us,
            resubmit: self.a.resubmit,
            agents_wait: false,
        }
    }

    fn drive(&mut self, mut life: Life, mut effects: Vec<Effect>) -> anyhow::Result<i32> {
        loop {
            for e in std::mem::take(&mut effects) {
                e.carry_out(self)?;
            }
            match self.exit {
                Some(Exit::Code(c)) => return Ok(c),
                Some(Exit::Session) => return Ok(self.code),
                None => {}
            }
            let Some(input) = self.inputs.pop_front() else { bail!("the run's life stopped short of its end") };
            life.handle(now_us(), input, &mut effects);
        }
    }

    fn run(&self) -> anyhow::Result<&RunDir> {
        self.run.as_ref().context("no run yet")
    }

    fn stay(&mut self) -> anyhow::Result<&mut Stay> {
        self.stay.as_mut().context("not a joined job")
    }

    /// What the joined job's hold on the run answers, for the machine.
    fn answer(&mut self, f: impl FnOnce(&mut Stay) -> anyhow::Result<Input>) -> anyhow::Result<()> {
        let input = f(self.stay()?)?;
        self.inputs.push_back(input);
        Ok(())
    }
}

impl Carrier for Driver {
    type Error = anyhow::Error;

    fn attach(&mut self, keep: bool) -> anyhow::Result<()> {
        self.answer(|s| Ok(s.attach(keep)))
    }

    fn start_agents(&mut self, await_leader: bool) -> anyhow::Result<()> {
        self.answer(|s| Ok(s.start_agents(await_leader)))
    }

    fn watch(&mut self, link: bool) -> anyhow::Result<()> {
        self.answer(|s| Ok(s.watch(link)))
    }

    fn detach(&mut self, keep_agents: bool) -> anyhow::Result<()> {
        self.stay()?.detach(keep_agents);
        Ok(())
    }

    fn drain_agents(&mut self) -> anyhow::Result<()> {
        self.answer(|s| Ok(s.drain_agents()))
    }

    fn look_for_leader(&mut self) -> anyhow::Result<()> {
        self.answer(|s| Ok(s.look_for_leader()))
    }

    fn take_lock(&mut self) -> anyhow::Result<()> {
        self.answer(Stay::take_lock)
    }

    fn sleep(&mut self, us: u64) -> anyhow::Result<()> {
        std::thread::sleep(Duration::from_micros(us));
        self.inputs.push_back(Input::Woke);
        Ok(())
    }

    fn take_over(&mut self) -> anyhow::Result<()> {
        let input = match continuation::take_over(self.run()?, &self.job_id, self.a.ledger_dir.as_deref())? {
            Ok((run, left)) => {
                // The run's own settings, not the joining job's defaults.
                if let Some(mode) = continuation::output_mode(&run)? {
                    self.a.output = mode;
                }
                self.run = Some(run);
                let stay = self.stay.as_mut().context("not a joined job")?;
                self.lock = stay.lock();
                Input::TookOver { left, kept_agents: stay.kept_agents() }
            }
            Err(why) => Input::CannotTakeOver(why),
        };
        self.inputs.push_back(input);
        Ok(())
    }

    fn lead(&mut self) -> anyhow::Result<()> {
        let survivors = self.stay.as_mut().and_then(Stay::survivors);
        let run = self.run()?.clone();
        self.led = true;
        let outcome = lead_session(&self.a, &self.job_id, self.nodes, &run, self.end_us, survivors)?;
        let end = match outcome.ending {
            leader::Ending::Complete => SessionEnd::Complete,
            leader::Ending::Interrupted(libc::SIGTERM) => SessionEnd::Terminated,
            leader::Ending::Interrupted(_) => SessionEnd::Interrupted,
            leader::Ending::Preempted(_) => SessionEnd::Preempted,
            leader::Ending::AgentsLost(_) => SessionEnd::AgentsLost,
            leader::Ending::TooManyFailures(_) => SessionEnd::TooManyFailures,
            leader::Ending::OutOfTime(_) => SessionEnd::OutOfTime,
            leader::Ending::AgentNotStarted(_) => SessionEnd::AgentNotStarted,
        };
        let joined_running = outcome.progress.joined_running;
        self.outcome = Some(outcome);
        self.inputs.push_back(Input::SessionEnded { end, joined_running, at_us: session_end_us(&run) });
        Ok(())
    }

    fn summarize(&mut self, resume_hint: bool) -> anyhow::Result<()> {
        let outcome = self.outcome.as_ref().context("no session to summarize")?;
        self.code = htc::status::finish(self.run()?, outcome, false, resume_hint)?;
        // Whoever leads next may take the lock now.
        self.lock = None;
        Ok(())
    }

    fn count_resubmits(&mut self) -> anyhow::Result<()> {
        let input = match submit::resubmits(self.run()?) {
            Ok(n) => Input::Resubmits(n),
            Err(e) => Input::ResubmitFailed(format!("{e:#}")),
        };
        self.inputs.push_back(input);
        Ok(())
    }

    fn resubmit(&mut self, nth: u64) -> anyhow::Result<()> {
        let input = match submit::resubmit(self.run()?, nth) {
            Ok(said) => Input::Resubmitted(said),
            Err(e) => Input::ResubmitFailed(format!("{e:#}")),
        };
        self.inputs.push_back(input);
        Ok(())
    }

    fn print(&mut self, report: Report) -> anyhow::Result<()> {
        if report.to_stderr() {
            eprintln!("{report}");
        } else {
            println!("{report}");
        }
        Ok(())
    }

    fn exit(&mut self, exit: Exit) -> anyhow::Result<()> {
        self.exit = Some(exit);
        Ok(())
    }
}
