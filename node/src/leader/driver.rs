//! Runs the scheduling core (`core.rs`) against the world: events from the network tasks and
//! the launcher arrive on a channel, the core's task writes go into one LMDB write transaction
//! that is committed every `commit_interval` (group commit), acks go out only after the commit
//! that made their reports durable, and frames are encoded onto each agent's socket writer.

use std::collections::HashMap;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;

use super::core::allocation::Attach;
use super::core::{Core, Ending, Input, Progress, Tasks};
use super::effect::{Carrier, Effects};
use crate::frame;
use htc_core::task::Counts;
use htc_core::task::Step;
use htc_engine::msg::{Stop, ToAgent};
use htc_store::ledger::{Change, Ledger, LedgerError, Record, WriteTxn};
use htc_store::load::TaskText;
use htc_store::rundir::now_us;

type Result<T> = std::result::Result<T, LedgerError>;

/// How often the core hears that time passed (heartbeats, silent agents).
const TICK_EVERY: Duration = Duration::from_millis(100);
/// How often the ledger goes to disk (between, commits reach the page cache and the replica).
const SYNC_EVERY: Duration = Duration::from_secs(2);
/// How often the live view for `htc watch` is rewritten.
const LIVE_EVERY: Duration = Duration::from_secs(1);

/// What the network tasks and the launcher tell the leader: the core's inputs, and with a join the
/// link (encoded frames for the agent's connection) that the driver keeps out of the core.
pub enum Event {
    Joined(Input, UnboundedSender<Vec<u8>>),
    Core(Input),
    /// A joining allocation asks for its agents' ids: the first, or why not.
    Attach(Attach, tokio::sync::oneshot::Sender<std::result::Result<u32, String>>),
    /// A joined allocation's launcher is gone (its job ended).
    AllocationGone(String),
    /// A growing run's submission or look at the queue came back.
    Grow(super::grow::Answer),
}

/// Where the run's progress is shown while it runs: the product's terminal bar or plain lines
/// (`status::sink`). The leader only says when; what it looks like is not its business.
pub trait ProgressSink: Send {
    /// How often to be shown the progress.
    fn every(&self) -> Duration;
    fn show(&mut self, p: &Progress);
    /// The run is over; the last `show` came just before.
    fn finish(&mut self) {}
}

pub struct DriverConfig {
    pub commit_interval: Duration,
    pub progress: Option<Box<dyn ProgressSink>>,
    /// The run directory the live view (`live.rs`) is written into every second, if any.
    pub live_dir: Option<std::path::PathBuf>,
    /// Told of each agent the core gives up (`net::NetConfig::give_up`), so that its old
    /// connection does not keep it from coming back.
    pub given_up: Option<Box<dyn Fn(u32) + Send>>,
    /// A run that grows itself (`--htc-grow`).
    pub grow: Option<super::grow::Growing>,
}

/// How a session ended, in the live view's words.
fn ending_state(e: &Ending) -> String {
    match e {
        Ending::Complete => "complete".into(),
        Ending::Interrupted(sig) => format!("interrupted by signal {sig}"),
        Ending::AgentsLost(why) => format!("stopped: {why}"),
        Ending::TooManyFailures(n) => format!("stopped: {n} tasks failed (--max-fails)"),
        Ending::OutOfTime(n) => format!("stopped: {n} tasks cannot finish before the time limit"),
    }
}

/// Rewrites the live view; a failure to is logged once, and never stops the run.
fn write_live(cfg: &mut DriverConfig, core: &Core<'_>, state: &str) {
    let Some(dir) = cfg.live_dir.as_ref() else { return };
    if let Err(e) = crate::livefile::write(dir, &core.live_view(now_us(), state)) {
        tracing::warn!(error = %e, "no live view for htc watch");
        cfg.live_dir = None;
    }
}

/// The ledger's write transaction and the run's task text, as the core's `Tasks`.
pub struct LedgerTasks<'t, 'l> {
    pub txn: &'t mut WriteTxn<'l>,
    pub text: &'t TaskText,
}

impl Tasks for LedgerTasks<'_, '_> {
    type Error = LedgerError;
    fn get(&self, id: u64) -> Result<Option<Record>> {
        self.txn.get(id)
    }
    fn range(&self, ids: std::ops::Range<u64>) -> Result<Vec<(u64, Record)>> {
        self.txn.range(ids)
    }
    fn apply(&mut self, c: &Change) -> Result<()> {
        self.txn.apply(c)
    }
    fn command(&self, r: &Record) -> Vec<u8> {
        self.text.command(r).to_vec()
    }
}

/// The core's effects of a turn, carried out: each agent's messages encoded as frames
/// (`wire::leader`) and gathered into one write per agent; an agent given up is told to
/// `given_up`, the network side, which frees its place.
struct Turn<'a> {
    by_agent: HashMap<u32, Vec<u8>>,
    given_up: &'a Option<Box<dyn Fn(u32) + Send>>,
}

impl Carrier for Turn<'_> {
    fn to_agent(&mut self, agent: u32, msg: ToAgent) {
        let buf = self.by_agent.entry(agent).or_default();
        htc_engine::wire::leader::frames(agent, msg, |body| frame::encode_into(body, buf));
    }
    fn given_up(&mut self, agent: u32) {
        if let Some(f) = self.given_up {
            f(agent);
        }
    }
}

/// Carries out the core's effects so far and sends their frames to the agents' connections.
fn send(out: &mut Effects, links: &HashMap<u32, UnboundedSender<Vec<u8>>>, given_up: &Option<Box<dyn Fn(u32) + Send>>) {
    let mut turn = Turn { by_agent: HashMap::new(), given_up };
    out.drain(..).for_each(|e| e.carry_out(&mut turn));
    for (agent, bytes) in turn.by_agent {
        if let Some(tx) = links.get(&agent) {
            let _ = tx.send(bytes);
        }
    }
}

/// Runs until every task is finished, a signal arrives, or no agent is left.
pub fn run(
    core: Core<'_>,
    ledger: &Ledger,
    text: &TaskText,
    job_id: &str,
    rx: mpsc::Receiver<Event>,
    cfg: DriverConfig,
) -> Result<(Ending, Progress)> {
    let mut s = Session::new(core, ledger, text, cfg);
    s.begin(job_id)?;
    let mut ending = (s.core.counts().unfinished() == 0).then_some(Ending::Complete);
    while ending.is_none() {
        ending = match rx.recv_timeout(s.wait()) {
            Ok(first) => s.take(first, &rx)?,
            Err(mpsc::RecvTimeoutError::Timeout) => None,
            Err(mpsc::RecvTimeoutError::Disconnected) => Some(Ending::AgentsLost("network side stopped".into())),
        };
        if ending.is_none() && s.last.tick.elapsed() >= TICK_EVERY {
            ending = s.tick()?;
        }
        ending = ending.or_else(|| s.core.ending());
        s.commit(ending.as_ref())?;
        s.chores()?;
    }
    let ended = s.end(ending.unwrap());
    dismiss_queued_joins(rx);
    ended
}

/// Agents whose join was still queued when the run ended (a short run, a resume with nothing
/// left) are told to go as the others were; dropping the queue then makes the network side tell
/// any later one itself. Else they reconnect, refused as still connected, until the leader's
/// last wait kills them (15 s).
fn dismiss_queued_joins(rx: mpsc::Receiver<Event>) {
    for ev in rx.try_iter() {
        let Event::Joined(input, tx) = ev else { continue };
        let (Input::Joined { agent, .. } | Input::Revived { agent, .. } | Input::HandedOver { agent, .. }) = input
        else {
            continue;
        };
        let bye = ToAgent::Shutdown { stop: Stop::Finish, reason: "the run has ended".into() };
        htc_engine::wire::leader::frames(agent, bye, |body| {
            let mut b = Vec::new();
            frame::encode_into(body, &mut b);
            let _ = tx.send(b);
        });
    }
}

/// When each of the driver's periodic chores was last done.
struct Last {
    commit: Instant,
    sync: Instant,
    progress: Instant,
    tick: Instant,
    live: Option<Instant>,
}

/// A leader session: the core, the ledger transaction its turns write into (one per turn, its
/// commit grouped up to `commit_interval`), and the agents' links.
struct Session<'c, 'l> {
    core: Core<'c>,
    ledger: &'l Ledger,
    text: &'l TaskText,
    cfg: DriverConfig,
    links: HashMap<u32, UnboundedSender<Vec<u8>>>,
    out: Effects,
    txn: Option<WriteTxn<'l>>,
    last: Last,
    progress_every: Duration,
    /// The cost of leading, not of loading the task file (a fresh `htc run` does both).
    cpu_start: u64,
}

impl<'c, 'l> Session<'c, 'l> {
    fn new(core: Core<'c>, ledger: &'l Ledger, text: &'l TaskText, cfg: DriverConfig) -> Self {
        let now = Instant::now();
        // No sink: a wakeup an hour, which costs nothing (an `Instant` cannot take `Duration::MAX`).
        let progress_every = cfg.progress.as_ref().map_or(Duration::from_secs(3600), |s| s.every());
        Session {
            core,
            ledger,
            text,
            cfg,
            links: HashMap::new(),
            out: Vec::new(),
            txn: None,
            last: Last { commit: now, sync: now, progress: now, tick: now, live: None },
            progress_every,
            cpu_start: cpu_us(),
        }
    }

    fn led_us(&self) -> u64 {
        cpu_us().saturating_sub(self.cpu_start)
    }

    /// What `htc status` needs to know of this session from its start.
    fn begin(&self, job_id: &str) -> Result<()> {
        let mut t = self.ledger.write()?;
        t.put_meta("leader_pid", &(std::process::id() as u64).to_le_bytes())?;
        t.put_meta("session_start_us", &now_us().to_le_bytes())?;
        t.put_meta("session_finished_start", &self.core.finished_start().to_le_bytes())?;
        t.put_meta("job_id", job_id.as_bytes())?;
        t.put_meta("leader_host", htc_store::host::hostname().as_bytes())?;
        // The Slurm job this session runs in (a resumed run's differs from its first): status
        // asks Slurm about it when the heartbeat alone cannot tell a dead leader yet.
        t.put_meta("session_slurm_job", std::env::var("SLURM_JOB_ID").unwrap_or_default().as_bytes())?;
        t.put_meta("heartbeat_us", &now_us().to_le_bytes())?;
        t.commit()
    }

    /// How long to sleep: until an event or the next thing due. Each wakeup of an idle leader
    /// costs it more than handling a report (caches gone cold; bench/RESULTS.md §14).
    fn wait(&self) -> Duration {
        let last = &self.last;
        let due = [
            last.tick + TICK_EVERY,
            last.commit + if self.txn.is_some() { self.cfg.commit_interval } else { Duration::from_secs(1) },
            last.sync + SYNC_EVERY,
            last.live.map_or(Instant::now(), |t| t + LIVE_EVERY),
            last.progress + self.progress_every,
        ];
        due.into_iter().min().unwrap().saturating_duration_since(Instant::now())
    }

    /// Feeds the core `first` and what else is queued, up to a bound, so that one commit covers
    /// it all.
    fn take(&mut self, first: Event, rx: &mpsc::Receiver<Event>) -> Result<Option<Ending>> {
        let mut next = Some(first);
        let mut budget = 4096;
        while let Some(ev) = next {
            let input = match ev {
                Event::Joined(input, tx) => Some(self.link(input, tx)?),
                Event::Core(input) => Some(input),
                Event::Attach(req, reply) => {
                    let _ = reply.send(self.core.attach(req, now_us()));
                    None
                }
                Event::AllocationGone(job) => {
                    self.core.allocation_gone(&job, now_us());
                    None
                }
                Event::Grow(a) => {
                    if let Some(g) = self.cfg.grow.as_mut() {
                        g.answer(a, now_us());
                    }
                    None
                }
            };
            if let Some(input) = input {
                let t = match self.txn.as_mut() {
                    Some(t) => t,
                    None => self.txn.insert(self.ledger.write()?),
                };
                let mut tasks = LedgerTasks { txn: t, text: self.text };
                if let Some(e) = self.core.handle(now_us(), &mut tasks, input, &mut self.out)? {
                    return Ok(Some(e));
                }
            }
            budget -= 1;
            next = if budget > 0 { rx.try_recv().ok() } else { None };
        }
        Ok(None)
    }

    /// An agent's connection: its link, and for `htc log` and `htc report` its host and cores.
    fn link(&mut self, input: Input, tx: UnboundedSender<Vec<u8>>) -> Result<Input> {
        // Frames the core made so far were for the agents as they were: a Dispatch for an agent
        // that was then lost must not reach it once it has come back fresh (its tasks were taken
        // back already; it would run them a second time).
        send(&mut self.out, &self.links, &self.cfg.given_up);
        match &input {
            Input::Joined { agent, hostname, cores, .. }
            | Input::Revived { agent, hostname, cores, .. }
            | Input::HandedOver { agent, hostname, cores, .. } => {
                self.links.insert(*agent, tx);
                let t = match self.txn.as_mut() {
                    Some(t) => t,
                    None => self.txn.insert(self.ledger.write()?),
                };
                t.put_meta(&format!("host.{agent}"), hostname.as_bytes())?;
                t.put_meta(&format!("cores.{agent}"), &(*cores as u64).to_le_bytes())?;
            }
            Input::Rejoined { agent, below } => {
                for a in std::iter::once(agent).chain(below) {
                    self.links.insert(*a, tx.clone());
                }
            }
            _ => {}
        }
        Ok(input)
    }

    /// The core's timer: heartbeats, silent agents.
    fn tick(&mut self) -> Result<Option<Ending>> {
        self.last.tick = Instant::now();
        let fresh = self.txn.is_none();
        let before = self.core.counts();
        let t = match self.txn.as_mut() {
            Some(t) => t,
            None => self.txn.insert(self.ledger.write()?),
        };
        let ending =
            self.core.handle(now_us(), &mut LedgerTasks { txn: t, text: self.text }, Input::Tick, &mut self.out)?;
        // A tick that gave up no agent wrote nothing: no commit for it (an idle leader would
        // otherwise commit ten times a second).
        if fresh && ending.is_none() && self.core.counts() == before {
            self.txn = None;
        }
        Ok(ending)
    }

    /// Commits what the turns wrote once the interval has passed (or the run ended), and acks
    /// it; with nothing written, a heartbeat for `htc status` every second.
    fn commit(&mut self, ending: Option<&Ending>) -> Result<()> {
        let now = Instant::now();
        if self.txn.is_some() && (now - self.last.commit >= self.cfg.commit_interval || ending.is_some()) {
            let mut t = self.txn.take().unwrap();
            t.put_counts(&self.core.counts())?;
            t.put_meta("heartbeat_us", &now_us().to_le_bytes())?;
            t.put_meta("leader_cpu_us", &self.led_us().to_le_bytes())?;
            t.put_meta("reports", &self.core.report_sizes().to_bytes())?;
            t.put_meta("result_delays", &self.core.result_delays().to_bytes())?;
            if matches!(ending, Some(Ending::Complete)) {
                t.put_meta("finished_us", &now_us().to_le_bytes())?;
            }
            t.commit()?;
            self.last.commit = now;
            self.core.acks(&mut self.out);
            // Amortized: a snapshot as large as what the journal wrote since the last one.
            if self.ledger.journal_wants_snapshot() {
                htc_store::replica::new_generation(self.ledger);
            }
        } else if self.txn.is_none() && now - self.last.commit >= Duration::from_secs(1) {
            let mut t = self.ledger.write()?;
            t.put_meta("heartbeat_us", &now_us().to_le_bytes())?;
            t.put_meta("leader_cpu_us", &self.led_us().to_le_bytes())?;
            t.commit()?;
            self.last.commit = now;
        }
        Ok(())
    }

    /// The turn's frames out, and the chores that are due: the ledger's sync, the live view,
    /// the progress display.
    fn chores(&mut self) -> Result<()> {
        // One write per agent per turn: its dispatches (which may go out before their commit: a
        // lost dispatch is re-sent after a restart) and its ack, which must not.
        send(&mut self.out, &self.links, &self.cfg.given_up);
        let now = Instant::now();
        if now - self.last.sync >= SYNC_EVERY {
            self.ledger.sync()?;
            self.last.sync = now;
        }
        if self.last.live.is_none_or(|t| now - t >= LIVE_EVERY) {
            write_live(&mut self.cfg, &self.core, "running");
            self.last.live = Some(now);
        }
        if let Some(g) = self.cfg.grow.as_mut() {
            g.turn(&mut self.core, now_us(), &mut self.out);
        }
        if now - self.last.progress >= self.progress_every {
            if let Some(sink) = self.cfg.progress.as_mut() {
                sink.show(&self.core.progress(now_us()));
            }
            self.last.progress = now;
        }
        Ok(())
    }

    /// The session is over, however it ended: what is written is committed, `htc status` need
    /// not wait for the heartbeat to age, the agents are told.
    fn end(mut self, ending: Ending) -> Result<(Ending, Progress)> {
        if let Some(g) = &self.cfg.grow {
            g.end();
        }
        if let Some(t) = self.txn.take() {
            t.commit()?;
        }
        let mut t = self.ledger.write()?;
        t.put_meta("session_end_us", &now_us().to_le_bytes())?;
        t.commit()?;
        self.ledger.sync()?;
        write_live(&mut self.cfg, &self.core, &ending_state(&ending));
        self.core.shutdown(&ending, &mut self.out);
        send(&mut self.out, &self.links, &self.cfg.given_up);
        let p = self.core.progress(now_us());
        if let Some(sink) = self.cfg.progress.as_mut() {
            sink.show(&p);
            sink.finish();
        }
        Ok((ending, p))
    }
}

/// CPU time (user + system) of this process so far, in microseconds: the leader's cost, which
/// `htc status` divides by the tasks finished.
fn cpu_us() -> u64 {
    use nix::sys::resource::{getrusage, UsageWho};
    use nix::sys::time::TimeVal;
    let Ok(u) = getrusage(UsageWho::RUSAGE_SELF) else { return 0 };
    let us = |t: TimeVal| t.tv_sec() as u64 * 1_000_000 + t.tv_usec() as u64;
    us(u.user_time()) + us(u.system_time())
}

/// Prepares a ledger for another session after an interruption: tasks that were dispatched or
/// running when the leader died go back to pending (they may run again: the ledger cannot know
/// whether they finished; most are recorded pending already, as in flight is the leader's memory,
/// not its disk). Done and failed tasks are never touched. Returns the tasks left to run.
///
/// The whole ledger is read back first, in a child process (`verify_apart`), before this process
/// opens it: writing into a damaged one would follow its broken pages, a resume must not spread
/// damage or re-run what it cannot vouch for, and some damage crashes or hangs a read.
pub fn reset_interrupted(run: &htc_store::rundir::RunDir) -> Result<u64> {
    let text_len = htc_store::load::text_len(run);
    let v = htc_store::verify::verify_apart(&run.ledger(), text_len, htc_store::verify::STALL)?;
    // Counts are rewritten below; unreadable records, a lost total or a broken history are what a
    // resume must not build on.
    if let Some(why) = v.unresumable() {
        let why = format!("{why}; it is not resumed");
        return Err(htc_store::ledger::LedgerError::Damaged { path: run.ledger().display().to_string(), why });
    }
    let ledger = Ledger::open(&run.ledger(), false)?;
    let mut t = ledger.write()?;
    let mut counts = Counts::default();
    t.update_all(|_, r| {
        // Counted from the records as they are (what mends stored counts that differ), then
        // moved with the task by the one step function.
        counts.add(r.state());
        // The interrupted attempt is not a failure of the task: it does not use up a retry.
        match counts.step(r.life(), Step::Interrupt) {
            Ok((life, _)) => {
                r.set_life(life);
                true
            }
            Err(_) => false,
        }
    })?;
    t.put_counts(&counts)?;
    t.commit()?;
    Ok(counts.unfinished())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::leader::{new_core, Planned};
    use htc_core::record::Outcome;
    use htc_engine::msg;
    use htc_engine::proto::frame::Body;

    /// Frames sent so far on an agent's link.
    fn frames(rx: &mut tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>) -> Vec<Body> {
        let mut out = Vec::new();
        while let Ok(bytes) = rx.try_recv() {
            let mut b = &bytes[..];
            while b.len() >= 4 {
                let len = u32::from_be_bytes(b[..4].try_into().unwrap()) as usize;
                out.push(frame::decode(&b[4..4 + len]).unwrap());
                b = &b[4 + len..];
            }
        }
        out
    }

    /// Group commit (issue 25): the results of several agents' reports go into one write
    /// transaction, and each agent's ack leaves only after it is committed.
    #[test]
    fn reports_of_several_agents_are_committed_together_and_acked_after() {
        let dir = std::env::temp_dir().join(format!("htc-driver-test.{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("t.txt");
        std::fs::write(&file, "true\n".repeat(4)).unwrap();
        let defaults = htc_core::taskfile::TaskShape::default();
        let (rd, _) =
            htc_store::load::create_run(&dir, "job", &file, htc_core::output::OutputMode::None, defaults, None)
                .unwrap();
        let ledger = Ledger::open(&rd.ledger(), false).unwrap();
        let text = TaskText::open(&rd.tasks()).unwrap();
        let params = htc_core::hflow::Params { s: 0.002, d: 0.0005, t: 1.0 };
        let planned = Planned { plan: htc_core::partition::Plan::Hflow, instances: 2, cores: 4, params };
        let core = new_core(&ledger, &planned, "job", now_us()).unwrap();
        let (tx, rx) = mpsc::channel();
        // A commit interval no turn reaches: only the end of the run commits what came.
        let cfg = DriverConfig {
            commit_interval: Duration::from_secs(600),
            progress: None,
            live_dir: None,
            given_up: None,
            grow: None,
        };
        let mut links = Vec::new();
        let before = ledger.read().unwrap().txn_id();
        std::thread::scope(|s| {
            let driver = s.spawn(|| run(core, &ledger, &text, "job", rx, cfg));
            for agent in 0..2u32 {
                let (link, link_rx) = tokio::sync::mpsc::unbounded_channel();
                links.push(link_rx);
                let hello = Input::Joined { agent, cores: 2, mem_mb: 0, gpus: 0, hostname: "h".into() };
                tx.send(Event::Joined(hello, link)).unwrap();
                let want = msg::Report { want: 2, idle: 2, ..Default::default() };
                tx.send(Event::Core(Input::Report { agent, report: want })).unwrap();
            }
            // Each agent gets its two tasks, and nothing is acked yet.
            let mut sent = Vec::new();
            for link in links.iter_mut() {
                let deadline = Instant::now() + Duration::from_secs(10);
                let ids = loop {
                    let ids: Vec<u64> = frames(link)
                        .into_iter()
                        .flat_map(|b| match b {
                            Body::Dispatch(d) => d.tasks.into_iter().map(|t| t.id).collect(),
                            Body::Ack(a) => panic!("an ack before any result: {a:?}"),
                            _ => Vec::new(),
                        })
                        .collect();
                    if !ids.is_empty() || Instant::now() > deadline {
                        break ids;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                };
                assert_eq!(ids.len(), 2);
                sent.push(ids);
            }
            for (agent, ids) in sent.iter().enumerate() {
                let results = ids
                    .iter()
                    .map(|&id| msg::TaskResult {
                        id,
                        attempt: 1,
                        outcome: Outcome::Exited,
                        end_us: now_us(),
                        ..Default::default()
                    })
                    .collect();
                let report = msg::Report { seq: 1, results, ..Default::default() };
                tx.send(Event::Core(Input::Report { agent: agent as u32, report })).unwrap();
            }
            let (ending, _) = driver.join().unwrap().unwrap();
            assert_eq!(ending, Ending::Complete);
        });
        // The session's start, one transaction for the joins, the dispatches and both reports,
        // the session's end.
        let t = ledger.read().unwrap();
        assert_eq!(t.txn_id() - before, 3, "one commit for both reports");
        assert_eq!(t.counts().unwrap().get(htc_core::task::State::Done), 4);
        for link in links.iter_mut() {
            let acks: Vec<u64> = frames(link)
                .into_iter()
                .filter_map(|b| if let Body::Ack(a) = b { Some(a.seq) } else { None })
                .collect();
            assert_eq!(acks, [1], "one ack, after the commit");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
