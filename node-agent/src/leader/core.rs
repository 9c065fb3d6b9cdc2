//! The leader's scheduling core: one thread that owns the ledger's write transaction, the
//! partition and the in-flight set. Network tasks feed it `Event`s; it answers with encoded frames
//! on each agent's channel. Updates accumulate in one open transaction that is committed every
//! `commit_interval` (group commit); acks for reports go out only after their commit.

use std::collections::{HashMap, VecDeque};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use htc_core::partition::Partition;
use htc_core::task::{self, Effect, End, Life, Step};
use tokio::sync::mpsc::UnboundedSender;

use crate::frame::{self, MAX_BATCH_BYTES};
use crate::ledger::{Attempt, Counts, Ledger, LedgerError, Outcome, Record, State, WriteTxn};
use crate::load::TaskText;
use crate::proto::{self, frame::Body};
use crate::rundir::now_us;

pub enum Event {
    Joined {
        agent: u32,
        cores: u32,
        mem_mb: u64,
        hostname: String,
        tx: UnboundedSender<Vec<u8>>,
    },
    Report {
        agent: u32,
        report: proto::Report,
    },
    Lost {
        agent: u32,
        why: String,
    },
    /// An agent process ended before it ever joined (local launcher), or could not be started.
    NeverJoined {
        agent: u32,
        why: String,
    },
    Interrupt {
        signal: i32,
    },
}

/// Called with the run's counts every `progress_every`.
pub type ProgressFn = Box<dyn FnMut(&Progress) + Send>;

pub struct CoreConfig {
    pub commit_interval: Duration,
    /// Agents the launcher started; the run fails when all of them are gone with work left.
    pub expected_agents: usize,
    pub progress: Option<ProgressFn>,
    pub progress_every: Duration,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Progress {
    pub counts: Counts,
    pub elapsed: Duration,
    /// Tasks finished (done or failed) in this session, for the rate.
    pub finished_this_session: u64,
    pub agents: usize,
}

#[derive(Debug)]
pub enum Ending {
    /// Every task is done or failed.
    Complete,
    /// Stopped by a signal; the run can be resumed.
    Interrupted(i32),
    /// No agent is left to run the remaining tasks.
    AgentsLost(String),
}

struct Agent {
    tx: UnboundedSender<Vec<u8>>,
    cores: u32,
    mem_mb: u64,
    credit: u64,
    last_seq: u64,
    acked_seq: u64,
    alive: bool,
    hostname: String,
}

pub struct Core<'a> {
    ledger: &'a Ledger,
    text: &'a TaskText,
    partition: Box<dyn Partition + 'a>,
    cfg: CoreConfig,
    job_id: String,
    agents: HashMap<u32, Agent>,
    ever_seen: usize,
    never_joined: usize,
    retry: VecDeque<u64>,
    in_flight: HashMap<u64, u32>,
    counts: Counts,
    finished_start: u64,
    started: Instant,
}

type Result<T> = std::result::Result<T, LedgerError>;

impl<'a> Core<'a> {
    pub fn new(
        ledger: &'a Ledger,
        text: &'a TaskText,
        partition: Box<dyn Partition + 'a>,
        job_id: String,
        cfg: CoreConfig,
    ) -> Result<Core<'a>> {
        let counts = ledger.read()?.counts()?;
        Ok(Core {
            ledger,
            text,
            partition,
            cfg,
            job_id,
            agents: HashMap::new(),
            ever_seen: 0,
            never_joined: 0,
            retry: VecDeque::new(),
            in_flight: HashMap::new(),
            finished_start: counts.get(State::Done) + counts.get(State::Failed),
            counts,
            started: Instant::now(),
        })
    }

    fn unfinished(&self) -> u64 {
        self.counts.get(State::Pending) + self.counts.get(State::Dispatched) + self.counts.get(State::Running)
    }

    fn progress(&self) -> Progress {
        Progress {
            counts: self.counts,
            elapsed: self.started.elapsed(),
            finished_this_session: self.counts.get(State::Done) + self.counts.get(State::Failed) - self.finished_start,
            agents: self.agents.values().filter(|a| a.alive).count(),
        }
    }

    /// Runs until every task is finished, a signal arrives, or no agent is left.
    pub fn run(mut self, rx: mpsc::Receiver<Event>) -> Result<(Ending, Progress)> {
        let mut txn: Option<WriteTxn<'a>> = None;
        let mut last_commit = Instant::now();
        let mut last_sync = Instant::now();
        let mut last_progress = Instant::now();
        let mut dirty_acks = false;
        let mut ending: Option<Ending> = None;
        {
            let mut t = self.ledger.write()?;
            t.put_meta("leader_pid", &(std::process::id() as u64).to_le_bytes())?;
            t.put_meta("session_start_us", &now_us().to_le_bytes())?;
            t.put_meta("session_finished_start", &self.finished_start.to_le_bytes())?;
            t.put_meta("job_id", self.job_id.as_bytes())?;
            t.put_meta("heartbeat_us", &now_us().to_le_bytes())?;
            t.commit()?;
        }
        if self.unfinished() == 0 {
            ending = Some(Ending::Complete);
        }
        while ending.is_none() {
            let wait = self.cfg.commit_interval.min(Duration::from_millis(200));
            let first = match rx.recv_timeout(wait) {
                Ok(e) => Some(e),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    ending = Some(Ending::AgentsLost("network side stopped".into()));
                    None
                }
            };
            let mut budget = 4096;
            let mut next = first;
            while let Some(ev) = next {
                let t = match txn.as_mut() {
                    Some(t) => t,
                    None => txn.insert(self.ledger.write()?),
                };
                if let Some(e) = self.handle(t, ev)? {
                    ending = Some(e);
                    break;
                }
                budget -= 1;
                next = if budget > 0 { rx.try_recv().ok() } else { None };
            }
            if ending.is_none() && self.unfinished() == 0 {
                ending = Some(Ending::Complete);
            }
            if ending.is_none() && self.all_agents_gone() {
                ending = Some(Ending::AgentsLost(format!(
                    "all {} agents are gone with {} tasks unfinished",
                    self.cfg.expected_agents,
                    self.unfinished()
                )));
            }
            dirty_acks |= txn.is_some();
            let now = Instant::now();
            if txn.is_some() && (now - last_commit >= self.cfg.commit_interval || ending.is_some()) {
                let mut t = txn.take().unwrap();
                t.put_counts(&self.counts)?;
                t.put_meta("heartbeat_us", &now_us().to_le_bytes())?;
                t.put_meta("leader_cpu_us", &cpu_us().to_le_bytes())?;
                if matches!(ending, Some(Ending::Complete)) {
                    t.put_meta("finished_us", &now_us().to_le_bytes())?;
                }
                t.commit()?;
                last_commit = now;
                if dirty_acks {
                    self.send_acks();
                    dirty_acks = false;
                }
            } else if txn.is_none() && now - last_commit >= Duration::from_secs(1) {
                // Heartbeat for `htc status` while nothing changes.
                let mut t = self.ledger.write()?;
                t.put_meta("heartbeat_us", &now_us().to_le_bytes())?;
                t.put_meta("leader_cpu_us", &cpu_us().to_le_bytes())?;
                t.commit()?;
                last_commit = now;
            }
            if now - last_sync >= Duration::from_secs(2) {
                self.ledger.sync()?;
                last_sync = now;
            }
            if now - last_progress >= self.cfg.progress_every {
                let p = self.progress();
                if let Some(f) = self.cfg.progress.as_mut() {
                    f(&p);
                }
                last_progress = now;
            }
        }
        self.ledger.sync()?;
        let ending = ending.unwrap();
        let shutdown = proto::Shutdown {
            agent: 0,
            abort: !matches!(ending, Ending::Complete),
            reason: match &ending {
                Ending::Complete => "all tasks finished".into(),
                Ending::Interrupted(s) => format!("leader got signal {s}"),
                Ending::AgentsLost(w) => w.clone(),
            },
        };
        for (&id, a) in self.agents.iter().filter(|(_, a)| a.alive) {
            let mut buf = Vec::new();
            frame::encode_into(Body::Shutdown(proto::Shutdown { agent: id, ..shutdown.clone() }), &mut buf);
            let _ = a.tx.send(buf);
        }
        let p = self.progress();
        if let Some(f) = self.cfg.progress.as_mut() {
            f(&p);
        }
        Ok((ending, p))
    }

    fn all_agents_gone(&self) -> bool {
        let alive = self.agents.values().filter(|a| a.alive).count();
        let gone = (self.ever_seen - alive) + self.never_joined;
        alive == 0 && gone >= self.cfg.expected_agents.max(1)
    }

    fn send_acks(&mut self) {
        for (&id, a) in self.agents.iter_mut() {
            if a.alive && a.last_seq > a.acked_seq {
                a.acked_seq = a.last_seq;
                let mut buf = Vec::new();
                frame::encode_into(Body::Ack(proto::Ack { seq: a.last_seq, agent: id }), &mut buf);
                let _ = a.tx.send(buf);
            }
        }
    }

    fn handle(&mut self, t: &mut WriteTxn<'a>, ev: Event) -> Result<Option<Ending>> {
        match ev {
            Event::Joined { agent, cores, mem_mb, hostname, tx } => {
                tracing::info!(job = %self.job_id, agent, cores, %hostname, "agent joined");
                self.ever_seen += 1;
                self.agents.insert(
                    agent,
                    Agent { tx, cores, mem_mb, credit: 0, last_seq: 0, acked_seq: 0, alive: true, hostname },
                );
            }
            Event::Report { agent, report } => {
                if !self.agents.get(&agent).is_some_and(|a| a.alive) {
                    return Ok(None);
                }
                let done_ids: std::collections::HashSet<u64> = report.results.iter().map(|r| r.id).collect();
                for s in &report.started {
                    if !done_ids.contains(&s.id) {
                        self.on_started(t, agent, s)?;
                    }
                }
                for r in &report.results {
                    self.on_result(t, agent, r)?;
                }
                let a = self.agents.get_mut(&agent).unwrap();
                a.last_seq = a.last_seq.max(report.seq);
                a.credit += report.want as u64;
                self.dispatch(t, agent)?;
                // Retries can go to any agent with credit, not only the one that reported.
                if !self.retry.is_empty() {
                    self.dispatch_all(t)?;
                }
            }
            Event::Lost { agent, why } => {
                if let Some(a) = self.agents.get_mut(&agent) {
                    if a.alive {
                        a.alive = false;
                        tracing::warn!(job = %self.job_id, agent, host = %a.hostname, %why, "agent lost");
                        self.requeue_agent(t, agent)?;
                        self.dispatch_all(t)?;
                    }
                }
            }
            Event::NeverJoined { agent, why } => {
                if !self.agents.contains_key(&agent) {
                    tracing::warn!(job = %self.job_id, agent, %why, "agent never joined");
                    self.never_joined += 1;
                }
            }
            Event::Interrupt { signal } => return Ok(Some(Ending::Interrupted(signal))),
        }
        Ok(None)
    }

    fn on_started(&mut self, t: &mut WriteTxn<'a>, agent: u32, s: &proto::TaskStarted) -> Result<()> {
        if self.in_flight.get(&s.id) != Some(&agent) {
            return Ok(());
        }
        let Some(mut r) = t.get(s.id)? else { return Ok(()) };
        if r.attempts as u32 != s.attempt {
            return Ok(());
        }
        let Ok((life, _)) = task::step(r.life(), Step::Start) else { return Ok(()) };
        r.start_us = s.start_us;
        self.apply(t, s.id, &mut r, life)
    }

    /// Writes a record whose life `task::step` moved, and moves the counts with it: the one
    /// place a task changes state.
    fn apply(&mut self, t: &mut WriteTxn<'a>, id: u64, r: &mut Record, life: Life) -> Result<()> {
        let from = r.state();
        r.set_life(life);
        t.put(id, r)?;
        self.counts.moved(from, r.state());
        Ok(())
    }

    fn on_result(&mut self, t: &mut WriteTxn<'a>, agent: u32, res: &proto::TaskResult) -> Result<()> {
        // A result from an agent that no longer holds the task (it was lost and the task re-sent)
        // or for an old attempt is stale: the ledger already moved on.
        if self.in_flight.get(&res.id) != Some(&agent) {
            return Ok(());
        }
        let Some(mut r) = t.get(res.id)? else { return Ok(()) };
        if r.attempts as u32 != res.attempt {
            return Ok(());
        }
        self.in_flight.remove(&res.id);
        let outcome = match proto::Outcome::try_from(res.outcome).unwrap_or(proto::Outcome::Unspecified) {
            proto::Outcome::Exited => Outcome::Exited,
            proto::Outcome::Signaled => Outcome::Signaled,
            proto::Outcome::TimedOut => Outcome::TimedOut,
            proto::Outcome::SpawnFailed => Outcome::SpawnFailed,
            proto::Outcome::Unspecified => Outcome::None,
        };
        self.finish_attempt(t, res.id, &mut r, agent, outcome, res.value, res.start_us, res.end_us)
    }

    /// Records how an attempt ended and moves the task to done, failed, or back to pending.
    #[allow(clippy::too_many_arguments)]
    fn finish_attempt(
        &mut self,
        t: &mut WriteTxn<'a>,
        id: u64,
        r: &mut Record,
        agent: u32,
        outcome: Outcome,
        value: i32,
        start_us: u64,
        end_us: u64,
    ) -> Result<()> {
        let end = match outcome {
            Outcome::Exited if value == 0 => End::Succeeded,
            Outcome::Lost => End::Lost,
            // Exit 126/127 and spawn failures mean "not executable / not found": deterministic,
            // so retrying only burns time.
            _ => End::Failed {
                permanent: (outcome == Outcome::SpawnFailed
                    && [libc::ENOENT, libc::EACCES, libc::ENOEXEC, libc::E2BIG].contains(&value))
                    || (outcome == Outcome::Exited && (value == 126 || value == 127)),
            },
        };
        let Ok((life, effect)) = task::step(r.life(), Step::Finish(end)) else { return Ok(()) };
        r.outcome = outcome as u8;
        r.value = value;
        r.agent = agent;
        if start_us != 0 {
            r.start_us = start_us;
        }
        r.end_us = end_us;
        if effect == Effect::Retry {
            let a = Attempt { attempt: r.attempts, outcome, value, agent, start_us: r.start_us, end_us };
            t.put_attempt(id, &a)?;
            self.retry.push_back(id);
        }
        if life.state() == State::Failed {
            t.mark_failed(id)?;
            tracing::debug!(job = %self.job_id, task = id, attempts = life.attempts, outcome = %outcome.describe(value), "task failed");
        }
        self.apply(t, id, r, life)
    }

    fn requeue_agent(&mut self, t: &mut WriteTxn<'a>, agent: u32) -> Result<()> {
        let lost: Vec<u64> = self.in_flight.iter().filter(|(_, a)| **a == agent).map(|(id, _)| *id).collect();
        for id in lost {
            self.in_flight.remove(&id);
            if let Some(mut r) = t.get(id)? {
                let now = now_us();
                self.finish_attempt(t, id, &mut r, agent, Outcome::Lost, 0, 0, now)?;
            }
        }
        Ok(())
    }

    fn dispatch_all(&mut self, t: &mut WriteTxn<'a>) -> Result<()> {
        let ids: Vec<u32> = self.agents.iter().filter(|(_, a)| a.alive && a.credit > 0).map(|(id, _)| *id).collect();
        for agent in ids {
            self.dispatch(t, agent)?;
        }
        Ok(())
    }

    fn fits(&self, agent: u32, r: &Record) -> bool {
        let a = &self.agents[&agent];
        r.cores as u32 <= a.cores && (a.mem_mb == 0 || r.mem_mb == 0 || r.mem_mb as u64 <= a.mem_mb)
    }

    /// Whether some live agent could ever run the task. Meaningful only once every agent the
    /// launcher started has joined or is known gone (`all_accounted`): a big node may join last.
    fn schedulable(&self, r: &Record) -> bool {
        self.agents.values().any(|a| a.alive) && self.agents.iter().any(|(id, a)| a.alive && self.fits(*id, r))
    }

    fn all_accounted(&self) -> bool {
        self.ever_seen + self.never_joined >= self.cfg.expected_agents
    }

    fn fail_unschedulable(&mut self, t: &mut WriteTxn<'a>, id: u64, mut r: Record) -> Result<()> {
        tracing::warn!(job = %self.job_id, task = id, cores = r.cores, mem_mb = r.mem_mb, "task needs more than any agent has");
        let Ok((life, _)) = task::step(r.life(), Step::Refuse) else { return Ok(()) };
        t.mark_failed(id)?;
        r.outcome = Outcome::Unschedulable as u8;
        self.apply(t, id, &mut r, life)
    }

    fn dispatch(&mut self, t: &mut WriteTxn<'a>, agent: u32) -> Result<()> {
        let mut want = self.agents[&agent].credit;
        let mut specs: Vec<proto::TaskSpec> = Vec::new();
        // Retries first: they are the oldest work.
        let mut skipped = VecDeque::new();
        while want > 0 {
            let Some(id) = self.retry.pop_front() else { break };
            let Some(r) = t.get(id)? else { continue };
            if r.state() != State::Pending {
                continue;
            }
            if self.fits(agent, &r) {
                self.take_task(t, agent, id, r, &mut specs)?;
                want -= 1;
            } else if self.all_accounted() && !self.schedulable(&r) {
                self.fail_unschedulable(t, id, r)?;
            } else {
                skipped.push_back(id);
            }
        }
        skipped.append(&mut self.retry);
        self.retry = skipped;
        while want > 0 {
            let Some(range) = self.partition.take(agent as usize, want) else { break };
            for id in range {
                let Some(r) = t.get(id)? else { continue };
                if r.state() != State::Pending {
                    continue; // done in an earlier session, or queued for retry already
                }
                if self.fits(agent, &r) {
                    self.take_task(t, agent, id, r, &mut specs)?;
                    want = want.saturating_sub(1);
                } else {
                    self.retry.push_back(id);
                }
            }
        }
        let a = self.agents.get_mut(&agent).unwrap();
        a.credit = want;
        if specs.is_empty() {
            return Ok(());
        }
        let mut buf = Vec::new();
        let mut batch = Vec::new();
        let mut bytes = 0;
        for s in specs {
            bytes += s.command.len() + 32;
            batch.push(s);
            if bytes >= MAX_BATCH_BYTES {
                frame::encode_into(
                    Body::Dispatch(proto::Dispatch { tasks: std::mem::take(&mut batch), agent }),
                    &mut buf,
                );
                bytes = 0;
            }
        }
        if !batch.is_empty() {
            frame::encode_into(Body::Dispatch(proto::Dispatch { tasks: batch, agent }), &mut buf);
        }
        let _ = a.tx.send(buf);
        Ok(())
    }

    fn take_task(
        &mut self,
        t: &mut WriteTxn<'a>,
        agent: u32,
        id: u64,
        mut r: Record,
        specs: &mut Vec<proto::TaskSpec>,
    ) -> Result<()> {
        let Ok((life, _)) = task::step(r.life(), Step::Dispatch) else { return Ok(()) };
        r.agent = agent;
        self.apply(t, id, &mut r, life)?;
        self.in_flight.insert(id, agent);
        specs.push(proto::TaskSpec {
            id,
            attempt: r.attempts as u32,
            command: self.text.command(&r).to_vec(),
            shell: r.shell,
            cores: r.cores as u32,
            mem_mb: r.mem_mb,
            timeout_ms: r.timeout_ms,
        });
        Ok(())
    }
}

/// CPU time (user + system) of this process so far, in microseconds: the leader's cost, which
/// `htc status` divides by the tasks finished.
fn cpu_us() -> u64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0;
    }
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    us(u.ru_utime) + us(u.ru_stime)
}

/// Prepares a ledger for another session after an interruption: tasks that were dispatched or
/// running when the leader died go back to pending (they may run again: the ledger cannot know
/// whether they finished). Done and failed tasks are never touched.
pub fn reset_interrupted(ledger: &Ledger) -> Result<u64> {
    let mut t = ledger.write()?;
    let mut counts = Counts::default();
    let mut n = 0;
    t.update_all(|_, r| {
        // The interrupted attempt is not a failure of the task: it does not use up a retry.
        let changed = match task::step(r.life(), Step::Interrupt) {
            Ok((life, _)) => {
                r.set_life(life);
                n += 1;
                true
            }
            Err(_) => false,
        };
        counts.add(r.state());
        changed
    })?;
    t.put_counts(&counts)?;
    t.commit()?;
    Ok(n)
}
