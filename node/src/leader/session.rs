//! A leader session's turn, whatever world it runs in: the core fed one input at a time, its task
//! writes in one ledger write transaction committed every `commit_interval` (group commit), acks
//! only after the commit that made their reports durable, the core's timer, and the chores (the
//! ledger's sync, the live view, growing, the progress display). The world gives the time and
//! carries out the core's effects: the node's (`driver::Net`: the wall clock, frames onto the
//! agents' sockets) or `htc simulate`'s (a virtual clock and network). Both run this turn.

use std::time::Duration;

use super::core::{Core, Ending, Input, NewTask, Progress, Tasks};
use super::effect::Effects;
use htc_core::attempts::Rules;
use htc_core::record::{TaskStatus, DAMAGED};
use htc_engine::wire::proto;
use htc_store::ledger::{Adding, Change, Ledger, LedgerError, Reads, Record, WriteTxn};
use htc_store::load::TaskText;
use htc_store::vouch::Found;

type Result<T> = std::result::Result<T, LedgerError>;

/// How often the core hears that time passed (heartbeats, silent agents).
pub const TICK_EVERY: Duration = Duration::from_millis(100);
/// How often the ledger goes to disk (between, commits reach the page cache and the replica).
const SYNC_EVERY: Duration = Duration::from_secs(2);
/// How often the live view for `htc watch` is rewritten.
const LIVE_EVERY: Duration = Duration::from_secs(1);

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
    /// Told when an agent was first signalled (`Effect::Signalled`): under Slurm, asks whether
    /// the job has a grace and feeds the answer back (`Input::Grace`).
    pub signalled: Option<Box<dyn Fn() + Send>>,
    /// Told of the nodes the core gives back (`Effect::GiveBack`): under Slurm, shrinks the job
    /// to the others.
    pub give_back: Option<Box<dyn Fn(Vec<String>) + Send>>,
    /// A run that grows itself (`--htc-grow`).
    pub grow: Option<super::grow::Growing>,
    /// The ledger is synced to disk every `SYNC_EVERY` and at the end; not in a simulation,
    /// where nothing outlives the run.
    pub durable: bool,
}

/// The world a session runs in: its clock, and where the core's effects go.
pub trait World {
    /// Now, in µs since the epoch (the wall clock) or the simulation's start.
    fn now_us(&self) -> u64;
    /// Carries out the effects of the turns so far (frames to agents, agents given up).
    fn carry(&mut self, out: &mut Effects);
}

/// Waiting tasks are made to wait again a slice of the ledger's `needs` at a time
/// (`restore_waits`), never all of them in memory at once.
const WAITS_SLICE: usize = 65_536;

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
        if r.command().is_added() {
            // An added task's command is in the ledger. One that cannot be read (a damaged
            // page) runs as an empty command, which fails to start: the task fails, and says so.
            return match self.txn.added_command(r.cmd_off()) {
                // Its name, if it has one, follows the command.
                Ok(Some(mut c)) => {
                    c.truncate(r.cmd_len() as usize);
                    c
                }
                Ok(None) | Err(_) => {
                    tracing::error!(task = r.cmd_off(), "the command of an added task cannot be read from the ledger");
                    Vec::new()
                }
            };
        }
        self.text.command(r).to_vec()
    }
    fn next_id(&self) -> Result<u64> {
        self.txn.next_id()
    }
    fn add(&mut self, t: &NewTask) -> Result<(u64, Record)> {
        let (shape, shell, command, needs, rules) = (t.shape, t.shell, &t.command[..], &t.needs, &t.rules);
        self.txn.add_task(Adding { shape, shell, command, needs, rules }, t.key.as_deref(), t.name.as_deref())
    }
    fn rules(&self, id: u64) -> Result<Option<Rules>> {
        Reads::rules(&*self.txn, id)
    }
    fn keyed(&self, key: &[u8]) -> Result<Option<u64>> {
        self.txn.keyed(key)
    }
    fn classes(&self) -> Result<Vec<String>> {
        let names = self.txn.meta("classes")?.unwrap_or_else(|| b"default".to_vec());
        Ok(String::from_utf8_lossy(&names).lines().map(Into::into).collect())
    }
    fn set_classes(&mut self, names: &[String]) -> Result<()> {
        self.txn.put_meta("classes", names.join("\n").as_bytes())
    }
}

/// How a session ended, in the live view's words.
fn ending_state(e: &Ending) -> String {
    match e {
        Ending::Complete => "complete".into(),
        Ending::Interrupted(sig) => format!("interrupted by signal {sig}"),
        Ending::Preempted(sig) => format!("preempted (signal {sig}); what ran in its grace is recorded"),
        Ending::AgentsLost(why) => format!("stopped: {why}"),
        Ending::TooManyFailures(n) => format!("stopped: {n} tasks failed (--max-fails)"),
        Ending::OutOfTime(n) => format!("stopped: {n} tasks cannot finish before the time limit"),
        Ending::AgentNotStarted(why) => format!("stopped: {why}"),
    }
}

/// When each of the session's periodic chores was last done, µs on the world's clock.
struct Last {
    commit: u64,
    sync: u64,
    progress: u64,
    tick: u64,
    live: Option<u64>,
}

fn us(d: Duration) -> u64 {
    d.as_micros() as u64
}

/// A leader session: the core, the ledger transaction its turns write into (one per turn, its
/// commit grouped up to `commit_interval`), and the world it runs in.
pub struct Session<'c, 'l, W: World> {
    pub(super) core: Core<'c>,
    ledger: &'l Ledger,
    text: &'l TaskText,
    pub(super) cfg: DriverConfig,
    pub world: W,
    pub(super) out: Effects,
    txn: Option<WriteTxn<'l>>,
    last: Last,
    progress_every: u64,
    /// The cost of leading, not of loading the task file (a fresh `htc run` does both).
    cpu_start: u64,
}

impl<'c, 'l, W: World> Session<'c, 'l, W> {
    pub fn new(core: Core<'c>, ledger: &'l Ledger, text: &'l TaskText, cfg: DriverConfig, world: W) -> Self {
        let now = world.now_us();
        // No sink: a wakeup an hour, which costs nothing.
        let progress_every = cfg.progress.as_ref().map_or(3_600_000_000, |s| us(s.every()));
        Session {
            core,
            ledger,
            text,
            cfg,
            world,
            out: Vec::new(),
            txn: None,
            last: Last { commit: now, sync: now, progress: now, tick: now, live: None },
            progress_every,
            cpu_start: cpu_us(),
        }
    }

    pub fn core(&self) -> &Core<'c> {
        &self.core
    }

    fn led_us(&self) -> u64 {
        cpu_us().saturating_sub(self.cpu_start)
    }

    /// What `htc status` needs to know of this session from its start, and what the run's
    /// tasks wait for (`restore_waits`).
    pub fn begin(&mut self, job_id: &str) -> Result<()> {
        let now = self.world.now_us();
        let mut t = self.ledger.write()?;
        self.restore_waits(&mut t)?;
        t.put_meta("leader_pid", &(std::process::id() as u64).to_le_bytes())?;
        // What the process spent before leading: for a fresh `htc run FILE`, reading the file
        // into the ledger (an open run's tasks are read while it leads, and counted there).
        t.put_meta("load_cpu_us", &self.cpu_start.to_le_bytes())?;
        t.put_meta("session_start_us", &now.to_le_bytes())?;
        t.put_meta("session_finished_start", &self.core.finished_start().to_le_bytes())?;
        t.put_meta("job_id", job_id.as_bytes())?;
        t.put_meta("leader_host", htc_host::hostname().as_bytes())?;
        // The Slurm job this session runs in (a resumed run's differs from its first): status
        // asks Slurm about it when the heartbeat alone cannot tell a dead leader yet.
        t.put_meta("session_slurm_job", std::env::var("SLURM_JOB_ID").unwrap_or_default().as_bytes())?;
        t.put_meta("heartbeat_us", &now.to_le_bytes())?;
        t.commit()
    }

    /// Tasks not final that wait for others wait again in this session's core. A task whose
    /// dependency failed was cancelled in the failure's own transaction, so none is found
    /// cancelled here unless the ledger says so.
    fn restore_waits(&mut self, t: &mut WriteTxn<'l>) -> Result<()> {
        // Nothing to read when the task file said none waits.
        if t.meta("waits")?.is_some_and(|w| w == 0u64.to_le_bytes()) {
            return Ok(());
        }
        let mut next = 0;
        loop {
            let slice = t.needs_from(next, WAITS_SLICE)?;
            let Some(&(last, _)) = slice.last() else { return Ok(()) };
            next = last + 1;
            let mut tasks = LedgerTasks { txn: t, text: self.text };
            // Records read with one walk per run of consecutive ids, not a lookup each.
            let mut records = Vec::new();
            for run in slice.chunk_by(|(a, _), (b, _)| *b == a + 1) {
                records.extend(tasks.txn.range(run[0].0..run[run.len() - 1].0 + 1)?);
            }
            let mut records = records.into_iter().peekable();
            for (id, needs) in slice {
                let r = records.next_if(|(r, _)| *r == id).map(|(_, r)| r);
                if r.is_some_and(|r| !r.state().is_final()) {
                    self.core.depend(&mut tasks, id, &needs)?;
                }
            }
        }
    }

    /// When the next chore is due, on the world's clock. Each wakeup of an idle leader costs it
    /// more than handling a report (caches gone cold; bench/RESULTS.md §14).
    pub fn next_due_us(&self) -> u64 {
        let (last, now) = (&self.last, self.world.now_us());
        let commit_every = if self.txn.is_some() { us(self.cfg.commit_interval) } else { 1_000_000 };
        let sync = self.cfg.durable.then(|| last.sync + us(SYNC_EVERY));
        let live = self.cfg.live_dir.as_ref().map(|_| last.live.map_or(now, |t| t + us(LIVE_EVERY)));
        [last.tick + us(TICK_EVERY), last.commit + commit_every, last.progress + self.progress_every]
            .into_iter()
            .chain(sync)
            .chain(live)
            .min()
            .unwrap_or(now)
    }

    /// When the open transaction's commit is due, if one is open.
    pub fn commit_due_us(&self) -> Option<u64> {
        self.txn.as_ref().map(|_| self.last.commit + us(self.cfg.commit_interval))
    }

    /// Whether the core's timer is due.
    pub fn tick_due(&self) -> bool {
        self.world.now_us() >= self.last.tick + us(TICK_EVERY)
    }

    /// The ledger's write transaction for this turn, begun if none is open.
    fn txn(&mut self) -> Result<&mut WriteTxn<'l>> {
        match self.txn {
            Some(ref mut t) => Ok(t),
            None => Ok(self.txn.insert(self.ledger.write()?)),
        }
    }

    /// Feeds the core one input; its writes go into the open transaction.
    pub fn turn(&mut self, input: Input) -> Result<Option<Ending>> {
        let now = self.world.now_us();
        if self.txn.is_none() {
            self.txn = Some(self.ledger.write()?);
        }
        let t = self.txn.as_mut().expect("opened above");
        let mut tasks = LedgerTasks { txn: t, text: self.text };
        self.core.handle(now, &mut tasks, input, &mut self.out)
    }

    /// The core's timer: heartbeats, silent agents.
    pub fn tick(&mut self) -> Result<Option<Ending>> {
        self.last.tick = self.world.now_us();
        let fresh = self.txn.is_none();
        let before = self.core.counts();
        let ending = self.turn(Input::Tick)?;
        // A tick that gave up no agent wrote nothing: no commit for it (an idle leader would
        // otherwise commit ten times a second).
        if fresh && ending.is_none() && self.core.counts() == before {
            self.txn = None;
        }
        Ok(ending)
    }

    /// Tasks `ids` as a client sees them, from their records and the core; ids with no task
    /// are left out, and a task whose record is damaged is said to be (`vouch`).
    pub fn statuses_of(&self, ids: &[u64]) -> Result<Vec<TaskStatus>> {
        let total = self.next_task_id()? - 1;
        self.with_reads(|t| self.statuses(t, &htc_store::vouch::tasks(t, ids, total)?))
    }

    /// The tasks with ids in `ids` as a client sees them, read with one walk of the ledger.
    pub fn statuses_in(&self, ids: std::ops::Range<u64>) -> Result<Vec<TaskStatus>> {
        let total = self.next_task_id()? - 1;
        self.with_reads(|t| self.statuses(t, &htc_store::vouch::range(t, ids, total)?))
    }

    /// Tasks as found in the ledger, as a client sees them, with their names when any task
    /// has one.
    fn statuses(&self, t: &dyn Reads, found: &[(u64, Found)]) -> Result<Vec<TaskStatus>> {
        let named = t.has_names()?;
        let mut out = Vec::with_capacity(found.len());
        for (id, f) in found {
            let r = match f {
                Found::Record(r) => r,
                Found::Damaged(why) => {
                    out.push(TaskStatus::damaged(*id, why));
                    continue;
                }
                Found::Unknown => continue,
            };
            let mut s = self.core.status_of(*id, r);
            if named {
                s.name = t.added_name(*id, r)?.map(|n| String::from_utf8_lossy(&n).into_owned());
            }
            out.push(s);
        }
        Ok(out)
    }

    /// Why each of `ids` is where it is (`htc task explain`); an id the run has not is left
    /// out, and one whose record cannot be read is said to be damaged.
    pub fn explain(&self, ids: &[u64]) -> Result<Vec<proto::TaskWhy>> {
        self.with_reads(|t| {
            let mut out = Vec::with_capacity(ids.len());
            for &id in ids {
                let r = match t.get(id) {
                    Ok(Some(r)) => r,
                    Ok(None) => continue,
                    Err(e) => {
                        let (state, kind, words) = (DAMAGED.into(), "damaged".into(), e.to_string());
                        out.push(proto::TaskWhy { id, state, kind, words, ..Default::default() });
                        continue;
                    }
                };
                let after = if self.core.waits_for_others(id) { Some(open_needs(t, id)?) } else { None };
                let why = self.core.explain(id, &r, after);
                out.push(proto::TaskWhy::of(id, self.core.status_of(id, &r).state, &why));
            }
            Ok(out)
        })
    }

    /// `f` given the open transaction's view (what this session wrote, committed or not), else
    /// the ledger's last commit: never a second transaction beside the open one on this thread.
    fn with_reads<T>(&self, f: impl FnOnce(&dyn Reads) -> Result<T>) -> Result<T> {
        match &self.txn {
            Some(t) => f(t),
            None => f(&self.ledger.read()?),
        }
    }

    /// The id the next task added would get: the run's tasks are `1..` it.
    pub fn next_task_id(&self) -> Result<u64> {
        match &self.txn {
            Some(t) => t.next_id(),
            None => Ok(self.ledger.read()?.meta_u64("total")?.unwrap_or(0) + 1),
        }
    }

    /// Writes a meta value in the open transaction.
    pub fn put_meta(&mut self, key: &str, value: &[u8]) -> Result<()> {
        self.txn()?.put_meta(key, value)
    }

    /// Commits what the turns wrote once the interval has passed (or the run ended), and acks
    /// it; with nothing written, a heartbeat for `htc status` every second.
    pub fn commit(&mut self, ending: Option<&Ending>) -> Result<()> {
        let now = self.world.now_us();
        let since = now.saturating_sub(self.last.commit);
        if matches!(ending, Some(Ending::Complete)) {
            // The end is recorded even when nothing else changed since the last commit (an open
            // run that ends idle): `htc status` tells a finished run from an interrupted one by it.
            self.txn()?;
        }
        if self.txn.is_some() && (since >= us(self.cfg.commit_interval) || ending.is_some()) {
            let mut t = self.txn.take().expect("checked above");
            t.put_counts(&self.core.counts())?;
            t.put_meta("heartbeat_us", &now.to_le_bytes())?;
            t.put_meta("leader_cpu_us", &self.led_us().to_le_bytes())?;
            t.put_meta("blocked", &self.core.blocked().to_le_bytes())?;
            t.put_meta("reports", &self.core.report_sizes().to_bytes())?;
            t.put_meta("result_delays", &self.core.result_delays().to_bytes())?;
            if matches!(ending, Some(Ending::Complete)) {
                t.put_meta("finished_us", &now.to_le_bytes())?;
            }
            t.commit()?;
            self.last.commit = now;
            self.core.acks(&mut self.out);
            // Amortized: a snapshot as large as what the journal wrote since the last one.
            if self.ledger.journal_wants_snapshot() {
                htc_store::replica::new_generation(self.ledger);
            }
        } else if self.txn.is_none() && since >= 1_000_000 {
            let mut t = self.ledger.write()?;
            t.put_meta("heartbeat_us", &now.to_le_bytes())?;
            t.put_meta("leader_cpu_us", &self.led_us().to_le_bytes())?;
            t.put_meta("blocked", &self.core.blocked().to_le_bytes())?;
            t.commit()?;
            self.last.commit = now;
        }
        Ok(())
    }

    /// The turn's effects out, and the chores that are due: the ledger's sync, the live view,
    /// growing, the progress display.
    pub fn chores(&mut self) -> Result<()> {
        // One write per agent per turn: its dispatches (which may go out before their commit: a
        // lost dispatch is re-sent after a restart) and its ack, which must not.
        self.world.carry(&mut self.out);
        let now = self.world.now_us();
        if self.cfg.durable && now.saturating_sub(self.last.sync) >= us(SYNC_EVERY) {
            self.ledger.sync()?;
            self.last.sync = now;
        }
        if self.cfg.live_dir.is_some() && self.last.live.is_none_or(|t| now.saturating_sub(t) >= us(LIVE_EVERY)) {
            self.write_live("running");
            self.last.live = Some(now);
        }
        if let Some(g) = self.cfg.grow.as_mut() {
            g.turn(&mut self.core, now, &mut self.out);
        }
        if now.saturating_sub(self.last.progress) >= self.progress_every {
            if let Some(sink) = self.cfg.progress.as_mut() {
                sink.show(&self.core.progress(now));
            }
            self.last.progress = now;
        }
        Ok(())
    }

    /// Rewrites the live view; a failure to is logged once, and never stops the run.
    fn write_live(&mut self, state: &str) {
        let Some(dir) = self.cfg.live_dir.as_ref() else { return };
        if let Err(e) = crate::livefile::write(dir, &self.core.live_view(self.world.now_us(), state)) {
            tracing::warn!(error = %e, "no live view for htc watch");
            self.cfg.live_dir = None;
        }
    }

    /// The session is over, however it ended: what is written is committed, `htc status` need
    /// not wait for the heartbeat to age, the agents are told.
    pub fn end(mut self, ending: Ending) -> Result<(Ending, Progress, Core<'c>)> {
        if let Some(g) = &self.cfg.grow {
            g.end();
        }
        if let Some(t) = self.txn.take() {
            t.commit()?;
        }
        let now = self.world.now_us();
        let mut t = self.ledger.write()?;
        t.put_meta("session_end_us", &now.to_le_bytes())?;
        t.commit()?;
        if self.cfg.durable {
            self.ledger.sync()?;
        }
        self.write_live(&ending_state(&ending));
        self.core.shutdown(&ending, &mut self.out);
        self.world.carry(&mut self.out);
        let p = self.core.progress(now);
        if let Some(sink) = self.cfg.progress.as_mut() {
            sink.show(&p);
            sink.finish();
        }
        Ok((ending, p, self.core))
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

/// Tasks an answer lists of those a task waits for, and the most it looks at: a fan-in that
/// names a million answers as fast as one of three.
const LISTED: usize = 20;
const LOOKED_AT: u64 = 10_000;

/// The tasks `id` waits for that have not ended (the first `LISTED`), and how many more, those
/// past the first `LOOKED_AT` it names counted as open.
fn open_needs(t: &dyn Reads, id: u64) -> Result<(Vec<u64>, u64)> {
    let Some(needs) = t.needs(id)? else { return Ok((Vec::new(), 0)) };
    let (mut open, mut more, mut looked) = (Vec::new(), 0u64, 0u64);
    for (range, _) in needs.ranges() {
        let (first, last) = (*range.start(), *range.end());
        let end = last.min(first.saturating_add(LOOKED_AT.saturating_sub(looked)).saturating_sub(1));
        if end >= first {
            for (dep, r) in t.range(first..end + 1)? {
                if r.state().is_final() {
                    continue;
                }
                if open.len() < LISTED {
                    open.push(dep);
                } else {
                    more += 1;
                }
            }
            looked += end + 1 - first;
        }
        more += last.saturating_sub(end.max(first.saturating_sub(1)));
    }
    Ok((open, more))
}
