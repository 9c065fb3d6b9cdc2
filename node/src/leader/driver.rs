//! The leader's session in the node's world: events from the network tasks and the launcher
//! arrive on a channel and are fed to the session's turn (`session`) in batches, so that one
//! commit covers them; frames are encoded onto each agent's socket writer (`Net`).

use std::collections::HashMap;
use std::sync::mpsc;

use tokio::sync::mpsc::UnboundedSender;

use super::core::allocation::Attach;
use super::core::{Answer, Core, Ending, Input, NewTask, Progress};
use super::effect::{Carrier, Effects};
use super::session::{Session, World};
use crate::frame;
use htc_core::record::{Change, Outcome};
use htc_core::salvage::salvage;
pub use htc_core::salvage::Survivors;
use htc_core::task::Counts;
use htc_engine::msg::{Stop, ToAgent};
use htc_host::steady_us;
use htc_store::ledger::{Ledger, LedgerError};
use htc_store::load::TaskText;

pub use super::session::{DriverConfig, LedgerTasks, ProgressSink};

type Result<T> = std::result::Result<T, LedgerError>;

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
    /// A client adds tasks to an open run: the ids (or why not) go to `reply` once committed.
    Add(Vec<NewTask>, tokio::sync::oneshot::Sender<Answer>),
    /// A client closes the run (`cancel`: and cancels what it holds); refused for a run that is
    /// not open.
    Close(bool, tokio::sync::oneshot::Sender<std::result::Result<(), String>>),
    /// A client asks how these tasks stand (all: `None`).
    Status(Option<Vec<u64>>, tokio::sync::oneshot::Sender<Vec<htc_core::record::TaskStatus>>),
    /// Why these tasks are where they are (`htc task explain`), or why that cannot be read.
    Explain(Vec<u64>, tokio::sync::oneshot::Sender<std::result::Result<Vec<htc_engine::wire::proto::TaskWhy>, String>>),
}

/// The node's world: the wall clock, and the agents' connections, each message encoded as its
/// frames (`wire::down`) and gathered into one write per agent; an agent given up is told to
/// `given_up`, the network side, which frees its place; a client's answer goes to the reply
/// its request came with.
pub struct Net {
    links: HashMap<u32, UnboundedSender<Vec<u8>>>,
    given_up: Option<Box<dyn Fn(u32) + Send>>,
    signalled: Option<Box<dyn Fn() + Send>>,
    give_back: Option<Box<dyn Fn(Vec<String>) + Send>>,
    replies: HashMap<u64, tokio::sync::oneshot::Sender<Answer>>,
    next_request: u64,
    /// Status requests being answered, a slice per turn of the loop.
    statuses: std::collections::VecDeque<StatusJob>,
}

/// A client's status request: the ids left to look up, what was found, where it goes.
struct StatusJob {
    ids: StatusIds,
    found: Vec<htc_core::record::TaskStatus>,
    reply: tokio::sync::oneshot::Sender<Vec<htc_core::record::TaskStatus>>,
}

enum StatusIds {
    /// Every task: the whole range is fixed once its first slice is read.
    All(Option<std::ops::Range<u64>>),
    /// These, from `next` on.
    Some(Vec<u64>, usize),
}

/// Ids looked up per turn: a status of a million tasks then holds the loop ~20 ms at a time,
/// never long enough to delay a result, a dispatch or a heartbeat by much.
const STATUS_SLICE: usize = 16_384;

struct Turn<'a> {
    by_agent: HashMap<u32, Vec<u8>>,
    given_up: &'a Option<Box<dyn Fn(u32) + Send>>,
    signalled: &'a Option<Box<dyn Fn() + Send>>,
    give_back: &'a Option<Box<dyn Fn(Vec<String>) + Send>>,
    replies: &'a mut HashMap<u64, tokio::sync::oneshot::Sender<Answer>>,
}

impl Carrier for Turn<'_> {
    fn to_agent(&mut self, agent: u32, msg: ToAgent) {
        let buf = self.by_agent.entry(agent).or_default();
        htc_engine::wire::down::frames(agent, msg, |body| frame::encode_into(body, buf));
    }
    fn given_up(&mut self, agent: u32) {
        if let Some(f) = self.given_up {
            f(agent);
        }
    }
    fn signalled(&mut self) {
        if let Some(f) = self.signalled {
            f();
        }
    }
    fn give_back(&mut self, nodes: Vec<String>) {
        if let Some(f) = self.give_back {
            f(nodes);
        }
    }
    // A client gone before its answer (killed mid-request) finds its tasks added: what was
    // committed stays, and a retry under the same keys gets the same ids.
    fn added(&mut self, request: u64, answer: Answer) {
        if let Some(reply) = self.replies.remove(&request) {
            let _ = reply.send(answer);
        }
    }
}

impl World for Net {
    fn now_us(&self) -> u64 {
        steady_us()
    }

    fn carry(&mut self, out: &mut Effects) {
        let mut turn = Turn {
            by_agent: HashMap::new(),
            given_up: &self.given_up,
            signalled: &self.signalled,
            give_back: &self.give_back,
            replies: &mut self.replies,
        };
        out.drain(..).for_each(|e| e.carry_out(&mut turn));
        for (agent, bytes) in turn.by_agent {
            if let Some(tx) = self.links.get(&agent) {
                let _ = tx.send(bytes);
            }
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
    mut cfg: DriverConfig,
) -> Result<(Ending, Progress)> {
    let net = Net {
        links: HashMap::new(),
        given_up: cfg.given_up.take(),
        signalled: cfg.signalled.take(),
        give_back: cfg.give_back.take(),
        replies: HashMap::new(),
        next_request: 0,
        statuses: Default::default(),
    };
    let mut s = Session::new(core, ledger, text, cfg, net);
    s.begin(job_id)?;
    let mut ending = (s.core.counts().unfinished() == 0 && !s.core.is_open()).then_some(Ending::Complete);
    while ending.is_none() {
        // A status waits for the commit of what the turns wrote (`status_slice`).
        let due = if s.world.statuses.is_empty() { s.next_due_us() } else { s.commit_due_us().unwrap_or(0) };
        let wait = std::time::Duration::from_micros(due.saturating_sub(steady_us()));
        ending = match rx.recv_timeout(wait) {
            Ok(first) => take(&mut s, first, &rx)?,
            Err(mpsc::RecvTimeoutError::Timeout) => None,
            Err(mpsc::RecvTimeoutError::Disconnected) => Some(Ending::AgentsLost("network side stopped".into())),
        };
        if ending.is_none() && s.tick_due() {
            ending = s.tick()?;
        }
        ending = ending.or_else(|| s.core.ending());
        s.commit(ending.as_ref())?;
        s.chores()?;
        status_slice(&mut s)?;
    }
    let (ending, progress, _) = s.end(ending.unwrap())?;
    dismiss_queued_joins(rx);
    Ok((ending, progress))
}

/// Answers a slice of the first status request; the whole of it once its last slice is read.
fn status_slice(s: &mut Session<'_, '_, Net>) -> Result<()> {
    // Only what is committed: a task said `done` has its record and output in the ledger (a
    // client reads its output next), and a leader killed now would not run it again.
    if s.commit_due_us().is_some() {
        return Ok(());
    }
    let Some(first) = s.world.statuses.front() else { return Ok(()) };
    let end = match first.ids {
        StatusIds::All(None) => Some(s.next_task_id()?),
        _ => None,
    };
    let job = s.world.statuses.front_mut().expect("looked at above");
    let mut found = match &mut job.ids {
        StatusIds::All(range) => {
            let r = range.get_or_insert(1..end.unwrap_or(1));
            let slice = r.start..r.end.min(r.start + STATUS_SLICE as u64);
            r.start = slice.end;
            s.statuses_in(slice)?
        }
        StatusIds::Some(ids, next) => {
            let slice = *next..ids.len().min(*next + STATUS_SLICE);
            *next = slice.end;
            let ids = ids[slice].to_vec();
            s.statuses_of(&ids)?
        }
    };
    let job = s.world.statuses.front_mut().expect("still there");
    job.found.append(&mut found);
    let done = match &job.ids {
        StatusIds::All(r) => r.as_ref().is_some_and(|r| r.is_empty()),
        StatusIds::Some(ids, next) => *next == ids.len(),
    };
    if done {
        let job = s.world.statuses.pop_front().expect("still there");
        let _ = job.reply.send(job.found);
    }
    Ok(())
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
        htc_engine::wire::down::frames(agent, bye, |body| {
            let mut b = Vec::new();
            frame::encode_into(body, &mut b);
            let _ = tx.send(b);
        });
    }
}

/// Feeds the session `first` and what else is queued, up to a bound, so that one commit covers
/// it all.
fn take(s: &mut Session<'_, '_, Net>, first: Event, rx: &mpsc::Receiver<Event>) -> Result<Option<Ending>> {
    let mut next = Some(first);
    let mut budget = 4096;
    while let Some(ev) = next {
        let input = match ev {
            Event::Joined(input, tx) => Some(link(s, input, tx)?),
            Event::Core(input) => Some(input),
            Event::Attach(req, reply) => {
                let _ = reply.send(s.core.attach(req, steady_us()));
                None
            }
            Event::AllocationGone(job) => {
                s.core.allocation_gone(&job, steady_us());
                None
            }
            Event::Grow(a) => {
                if let Some(g) = s.cfg.grow.as_mut() {
                    g.answer(a, steady_us());
                }
                None
            }
            // Closing a closed run again is no error, and with `cancel` cancels what it holds.
            Event::Close(cancel, reply) => {
                if s.core.is_open_run() {
                    let _ = reply.send(Ok(()));
                    Some(Input::Close { cancel })
                } else {
                    let _ = reply.send(Err("the run is not open (it was not started with --open)".into()));
                    None
                }
            }
            Event::Status(ids, reply) => {
                let ids = match ids {
                    Some(ids) => StatusIds::Some(ids, 0),
                    None => StatusIds::All(None),
                };
                s.world.statuses.push_back(StatusJob { ids, found: Vec::new(), reply });
                None
            }
            // Answered at once, from the core's state as it stands and the ledger's view.
            Event::Explain(ids, reply) => {
                let _ = reply.send(s.explain(&ids).map_err(|e| e.to_string()));
                None
            }
            Event::Add(tasks, reply) => {
                let request = s.world.next_request;
                s.world.next_request += 1;
                s.world.replies.insert(request, reply);
                Some(Input::Add { request, tasks })
            }
        };
        if let Some(input) = input {
            if let Some(e) = s.turn(input)? {
                return Ok(Some(e));
            }
        }
        budget -= 1;
        next = if budget > 0 { rx.try_recv().ok() } else { None };
    }
    Ok(None)
}

/// An agent's connection: its link, and for `htc log` and `htc report` its host and cores.
fn link(s: &mut Session<'_, '_, Net>, input: Input, tx: UnboundedSender<Vec<u8>>) -> Result<Input> {
    // Frames the core made so far were for the agents as they were: a Dispatch for an agent
    // that was then lost must not reach it once it has come back fresh (its tasks were taken
    // back already; it would run them a second time).
    s.world.carry(&mut s.out);
    match &input {
        Input::Joined { agent, hostname, cores, .. }
        | Input::Revived { agent, hostname, cores, .. }
        | Input::HandedOver { agent, hostname, cores, .. } => {
            s.world.links.insert(*agent, tx);
            s.put_meta(&format!("host.{agent}"), hostname.as_bytes())?;
            s.put_meta(&format!("cores.{agent}"), &(*cores as u64).to_le_bytes())?;
        }
        Input::Rejoined { agent, below } => {
            for a in std::iter::once(agent).chain(below) {
                s.world.links.insert(*a, tx.clone());
            }
        }
        _ => {}
    }
    Ok(input)
}

/// What preparing a ledger for another session found (`reset_interrupted`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reset {
    /// Tasks left to run.
    pub left: u64,
    /// Tasks whose attempts had ended, as their agents journaled, without the stopped leader
    /// recording it: recorded now, they do not run again.
    pub recovered: u64,
    /// Attempts that were running when the session stopped: they run again, as new attempts.
    pub interrupted: u64,
    /// Journal entries that failed their checksum (not believed: their tasks run again).
    pub unbelieved: u64,
}

impl Reset {
    /// What a resume tells its user, after "resuming RUN".
    pub fn said(&self) -> String {
        let mut s = format!("{} tasks left to run", self.left);
        if self.recovered > 0 {
            s.push_str(&format!("; {} ended that the stopped leader had not recorded, recorded now", self.recovered));
        }
        if self.interrupted > 0 {
            s.push_str(&format!("; {} were running and run again as new attempts", self.interrupted));
        }
        if self.unbelieved > 0 {
            s.push_str(&format!(
                "; {} damaged entries of the agents' results journals were not believed",
                self.unbelieved
            ));
        }
        s
    }
}

/// A record left in flight that salvage could not place: interrupted, as before journals, so
/// that no task stays in flight in the ledger of a new session.
fn interrupted(id: u64, r: &htc_core::record::Record) -> Option<Vec<Change>> {
    let mut r = *r;
    r.take(htc_core::task::Step::Interrupt).ok()?;
    Some(vec![Change::Record(id, r)])
}

/// Prepares a ledger for another session after an interruption. What the agents journaled
/// (`htc_exec::results`) that the ledger had not committed is salvaged (`htc_core::salvage`):
/// attempts that ended are recorded as they ended, and attempts that were running (or were in
/// flight in the ledger) are recorded interrupted, so that they run again as new attempts with a
/// row in the history. With `Survivors::Maybe` (a hand-over), what started and did not end waits
/// for its agent instead. Done and failed tasks are never touched.
///
/// The whole ledger is read back first, in a child process (`verify_apart`), before this process
/// opens it: writing into a damaged one would follow its broken pages, a resume must not spread
/// damage or re-run what it cannot vouch for, and some damage crashes or hangs a read.
pub fn reset_interrupted(run: &htc_store::rundir::RunDir, survivors: Survivors) -> Result<Reset> {
    let text_len = htc_store::load::text_len(run);
    let v = htc_store::verify::verify_apart(&run.ledger(), text_len, htc_store::verify::STALL)?;
    // Counts are rewritten below; unreadable records, a lost total or a broken history are what a
    // resume must not build on.
    if let Some(why) = v.unresumable() {
        let why = format!("{why}; it is not resumed");
        return Err(htc_store::ledger::LedgerError::Damaged { path: run.ledger().display().to_string(), why });
    }
    let (mut told, unbelieved) = htc_exec::results::read_run(&run.out()).unwrap_or_else(|e| {
        // Without them the resume is what it was before journals: in-flight work runs again.
        tracing::warn!(run = %run.path.display(), error = %e, "the agents' results journals cannot be read");
        (Vec::new(), 0)
    });
    told.sort_by_key(|t| t.id);
    let ledger = Ledger::open(&run.ledger(), false)?;
    let mut t = ledger.write()?;
    // Counted from the records as they are (what mends stored counts that differ), then moved
    // with each record salvaged.
    let mut counts = Counts::default();
    let mut in_flight = Vec::new();
    t.update_all(|id, r| {
        counts.add(r.state());
        if r.state().in_flight() {
            in_flight.push(id);
        }
        false
    })?;
    let mut ids: Vec<u64> = told.iter().map(|t| t.id).chain(in_flight).collect();
    ids.sort_unstable();
    ids.dedup();
    let mut reset = Reset { unbelieved, ..Reset::default() };
    let now = steady_us();
    for id in ids {
        let Some(r) = t.get(id)? else { continue };
        let lo = told.partition_point(|t| t.id < id);
        let hi = told.partition_point(|t| t.id <= id);
        let Some(changes) = salvage(id, &r, &told[lo..hi], survivors, now).or_else(|| interrupted(id, &r)) else {
            continue;
        };
        for c in &changes {
            match c {
                Change::Record(_, after) => {
                    counts.0[r.state() as usize] -= 1;
                    counts.0[after.state() as usize] += 1;
                    if after.state().is_final() || after.attempts() > r.attempts() {
                        reset.recovered += 1;
                    }
                }
                Change::Attempt(_, a) if a.ended.outcome == Outcome::Interrupted => reset.interrupted += 1,
                _ => {}
            }
            t.apply(c)?;
        }
    }
    t.put_counts(&counts)?;
    t.commit()?;
    reset.left = counts.unfinished();
    Ok(reset)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::leader::{new_core, Planned};
    use htc_core::record::{Ended, Outcome};
    use htc_engine::msg;
    use htc_engine::wire::proto::frame::Body;
    use std::time::{Duration, Instant};

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
        let (rd, _) = htc_store::load::create_run(
            &dir,
            "job",
            Some(&file),
            htc_core::output::OutputMode::None,
            defaults,
            None,
            None,
        )
        .unwrap();
        let ledger = Ledger::open(&rd.ledger(), false).unwrap();
        let text = TaskText::open(&rd.tasks()).unwrap();
        let params = htc_core::hflow::Params { s: 0.002, d: 0.0005, t: 1.0 };
        let planned = Planned { plan: htc_core::partition::Plan::Hflow, instances: 2, cores: 4, params };
        let core = new_core(&ledger, &planned, "job", steady_us()).unwrap();
        let (tx, rx) = mpsc::channel();
        // A commit interval no turn reaches: only the end of the run commits what came.
        let cfg = DriverConfig {
            commit_interval: Duration::from_secs(600),
            progress: None,
            live_dir: None,
            given_up: None,
            signalled: None,
            give_back: None,
            grow: None,
            durable: true,
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
                        ended: Ended { outcome: Outcome::Exited, end_us: steady_us(), ..Ended::NONE },
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
