//! An instance head's decisions without I/O (HFlow's 2nd level): the leader deals with the head
//! alone, handing it tasks for the whole instance; the head keeps them in its queue and hands
//! them to its members (the agents directly below it that belong to its instance) and to its
//! own slots as each asks, so no task costs the leader a round trip per member. Members report
//! to the head; it folds their starts and results into its own reports (each result naming the
//! member that ran it), acknowledges a member's report once the leader acknowledged the report
//! that carried it, and tells the leader of a lost member's started tasks as lost, and gives
//! back those it had not reported started (it may have started them after all: the leader
//! re-dispatches them as new attempts).
//!
//! The head's own slots are run by an ordinary agent [`Machine`], treated as one more member: its
//! reports and requests go to the instance instead of up. An agent that heads no members is its
//! machine and nothing else.
//!
//! Memory and GPUs: the head tells the leader what its instance has (sums, and the largest
//! member's, as members join and are lost), and the leader commits tasks against that. The head
//! places each task with `mem=` or `gpus=` on a member where it fits beside what that member
//! holds; one that fits nowhere now keeps the member with the most memory free for itself
//! (smaller tasks go there only beside it), as the leader's backfill keeps an agent.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use htc_core::tree::Tree;

use super::machine::{queue_target, Effect, Input, Machine, Wake};
use super::stall::Stall;
use crate::liveness::Liveness;
use crate::msg::{Capacity, Down, Report, Stop, TaskResult, ToAgent, Up};
use crate::pace::{self, Pace, REPORT_BATCH};
use htc_core::record::{Ended, Outcome};
use htc_core::work::TaskToRun;

/// A member as the head sees it (the head's own machine included).
#[derive(Debug)]
struct Member {
    slots: u32,
    /// Memory (MiB; 0: not accounted) and GPUs for tasks, and what tasks it holds have of them.
    mem_mb: u64,
    gpus: u32,
    mem_used: u64,
    gpus_used: u32,
    /// Tasks it asked for and was not given yet.
    credit: u64,
    /// Slots it last said had nothing to run, less what it was given since.
    idle: u64,
    /// Tasks it holds (given and not finished).
    held: u64,
    /// When it was last heard from.
    heard_us: u64,
    /// The last report's sequence number: a report with a new one and no results is a probe
    /// (`stall`), to be acknowledged as results are.
    seq: u64,
}

/// A task handed to a member and not finished.
#[derive(Debug)]
struct Held {
    holder: u32,
    attempt: u32,
    started: bool,
    /// What it has of its holder's memory and GPUs.
    mem_mb: u64,
    gpus: u32,
}

impl Member {
    fn new(slots: u32, mem_mb: u64, gpus: u32, heard_us: u64) -> Member {
        Member { slots, mem_mb, gpus, mem_used: 0, gpus_used: 0, credit: 0, idle: 0, held: 0, heard_us, seq: 0 }
    }

    /// What `t` takes of this member's memory and GPUs.
    fn cost(&self, t: &TaskToRun) -> (u64, u32) {
        (if self.mem_mb == 0 { 0 } else { t.shape.mem_mb as u64 }, t.shape.gpus as u32)
    }

    /// Whether `t` fits beside what it holds, with `keep` kept free besides.
    fn fits(&self, t: &TaskToRun, keep: (u64, u32)) -> bool {
        let (mem, gpus) = self.cost(t);
        (mem == 0 || self.mem_used + mem + keep.0 <= self.mem_mb)
            && (gpus == 0 || self.gpus_used + gpus + keep.1 <= self.gpus)
    }

    /// Whether it could ever hold `t`.
    fn could_hold(&self, t: &TaskToRun) -> bool {
        let (mem, gpus) = self.cost(t);
        mem <= self.mem_mb && gpus <= self.gpus && t.shape.cores.max(1) as u32 <= self.slots
    }
}

/// Whether a task needs placing: by memory, GPUs, or more cores than one.
fn sized(t: &TaskToRun) -> bool {
    t.shape.mem_mb > 0 || t.shape.gpus > 0 || t.shape.cores > 1
}

pub struct Instance {
    id: u32,
    job_id: String,
    tree: Arc<Tree>,
    own: Machine,
    /// Whether the tree gives this agent members; if not, `own` does everything.
    heads: bool,
    members: BTreeMap<u32, Member>,
    queue: VecDeque<TaskToRun>,
    /// Queued tasks with `mem=` or `gpus=` (none: the queue is handed out in order, unlooked at).
    sized: usize,
    /// A queued task that fit no member, and the member kept for it.
    kept: Option<(u64, u32)>,
    /// The instance's resources as last told to the leader.
    told: Option<Capacity>,
    /// Slots, and idle member slots, as the last report said (the leader remembers them:
    /// `Machine`'s `told_idle`).
    told_slots: u32,
    told_idle: u64,
    held: HashMap<u64, Held>,
    /// Requested from the leader and not yet received.
    asked: u64,
    seq: u64,
    started: Vec<crate::msg::Started>,
    results: Vec<TaskResult>,
    /// Tasks a lost member had not reported started, for the leader to take back.
    returned: Vec<u64>,
    /// Tasks given back unstarted on the leader's Recall (from the queue, or by their holder).
    recalled: Vec<u64>,
    /// Member reports with results, or probes, that wait for the next report of the head:
    /// (member, seq).
    pending: Vec<(u32, u64)>,
    /// A member's probe is among `pending`: it cannot wait for the report gap.
    probed: bool,
    /// A member (or the head) was signalled (`Report::signalled`); said in every report after.
    signalled: bool,
    /// ... and the leader has not heard it yet: it cannot wait for the report gap.
    signal_untold: bool,
    /// The head's own standing still, between ticks: its members' silence then is excused.
    stall: Stall,
    /// Member reports carried by the head's reports not acknowledged yet: (head seq, member, seq).
    carried: VecDeque<(u64, u32, u64)>,
    shutting_down: bool,
    /// Members that joined and were lost since.
    left: u64,
    live: Liveness,
    /// When the head reports to the leader (`pace`), and how much work the instance keeps.
    pace: Pace,
    /// The gap between the head's reports, when not the layout's (`pace::gap_for`).
    report_gap: Option<u64>,
    /// When the head last sent its members a heartbeat.
    last_down_us: u64,
    /// The leader asked for a resync (after a rejoin, or its periodic audit): the next report
    /// lists what the instance holds.
    resync: bool,
    /// Rejoined and not resynced yet: requests for work may have died with the relay.
    rejoined: bool,
}

impl Instance {
    pub fn new(id: u32, slots: usize, tree: Arc<Tree>, job_id: &str) -> Instance {
        let heads = tree.head(id) == id && tree.instance_len(id) > 1;
        // The head's own reports go to the instance in-process, at once: the head's pace is the
        // one that counts.
        let own = Machine::new(id, slots, tree.clone());
        let own = if heads { own.with_report_gap(0) } else { own };
        let me = Member::new(slots as u32, 0, 0, 0);
        let gap = pace::gap_for(tree.heads().len(), Liveness::default().heartbeat_us);
        Instance {
            id,
            job_id: job_id.to_string(),
            tree,
            own,
            heads,
            members: BTreeMap::from([(id, me)]),
            queue: VecDeque::new(),
            sized: 0,
            kept: None,
            told: None,
            told_slots: 0,
            told_idle: 0,
            held: HashMap::new(),
            asked: 0,
            seq: 0,
            started: Vec::new(),
            results: Vec::new(),
            returned: Vec::new(),
            recalled: Vec::new(),
            pending: Vec::new(),
            probed: false,
            signalled: false,
            signal_untold: false,
            stall: Stall::default(),
            carried: VecDeque::new(),
            shutting_down: false,
            left: 0,
            live: Liveness::default(),
            pace: Pace::new(queue_target(slots), gap).for_head(),
            report_gap: None,
            last_down_us: 0,
            resync: false,
            rejoined: false,
        }
    }

    /// The least time between reports to the parent under load (`pace`).
    pub fn with_report_gap(mut self, gap_us: u64) -> Self {
        if self.heads {
            self.report_gap = Some(gap_us);
            self.pace.set_gap(gap_us);
        } else {
            self.own = self.own.with_report_gap(gap_us);
        }
        self
    }

    /// The head's own memory and GPUs for tasks (as in its Hello).
    pub fn with_resources(mut self, mem_mb: u64, gpus: u32) -> Self {
        let me = self.members.get_mut(&self.id).expect("the head is a member");
        (me.mem_mb, me.gpus) = (mem_mb, gpus);
        self
    }

    /// See `Machine::with_clock`: the head's reports, or its own machine's when it heads no one.
    pub fn with_clock(mut self, phase_us: u64) -> Self {
        self.own = self.own.with_clock(phase_us);
        self.pace.align(phase_us);
        self
    }

    /// Heartbeats, the lease on the leader and the bound on silent members (`liveness`).
    pub fn with_liveness(mut self, live: Liveness) -> Self {
        self.own = self.own.with_liveness(live);
        self.live = live;
        let gap = self.report_gap.unwrap_or_else(|| pace::gap_for(self.tree.heads().len(), live.heartbeat_us));
        self.pace.set_gap(gap);
        self
    }

    /// See `Machine::with_rejoin`: the head's own machine handles its parent connection.
    pub fn with_rejoin(mut self, can: bool) -> Self {
        self.own = self.own.with_rejoin(can);
        self
    }

    /// See `Machine::with_revive`: only an agent that heads no members comes back fresh (its
    /// members would be lost with it).
    pub fn with_revive(mut self, can: bool) -> Self {
        self.own = self.own.with_revive(can && !self.heads);
        self
    }

    /// See `Machine::with_give_back`: a head's signal goes to its own machine too.
    pub fn with_give_back(mut self, us: u64) -> Self {
        self.own = self.own.with_give_back(us);
        self
    }

    /// See `Machine::with_await_leader`: only an agent that heads no members waits for a new
    /// leader with its tasks (a head would have to carry its members' through as well).
    pub fn with_await_leader(mut self, can: bool) -> Self {
        self.own = self.own.with_await_leader(can && !self.heads);
        self
    }

    /// `None` while running; then how the agent ended (its own machine's account).
    pub fn outcome(&self) -> Option<Result<(), String>> {
        self.own.outcome()
    }

    /// Whether this agent's own executor holds task `id` (queued or running).
    pub fn holds(&self, id: u64) -> bool {
        self.own.holds(id)
    }

    /// When the carrier must next tick (`Machine::wake`): an agent alone in its instance knows;
    /// a head watches its members every tick.
    pub fn wake(&self) -> Wake {
        if self.members.len() == 1 && !self.shutting_down {
            self.own.wake()
        } else {
            Wake::Soon
        }
    }

    /// The heartbeat this instance keeps (`Liveness`).
    pub fn heartbeat_us(&self) -> u64 {
        self.own.heartbeat_us()
    }

    pub fn handle(&mut self, now_us: u64, input: Input, out: &mut Vec<Effect>) {
        if !self.heads {
            return self.own.handle(now_us, input, out);
        }
        match input {
            Input::Parent(down) if down.agent == self.id => self.on_parent(now_us, down.msg, out),
            Input::ChildFrame(up) => match Some(up.agent()).filter(|&a| self.tree.is_member(a, self.id)) {
                Some(member) => self.on_member(now_us, member, up, out),
                None => self.own(now_us, Input::ChildFrame(up), out),
            },
            Input::ChildClosed { child, agents: _, why } if self.tree.is_member(child, self.id) => {
                self.member_lost(child, &why);
                // The leader never knew the member: nothing to tell it beyond the lost tasks.
                self.own(now_us, Input::ChildClosed { child, agents: Vec::new(), why }, out);
            }
            Input::Rejoined => {
                self.rejoined = true;
                (self.told_slots, self.told_idle) = (0, 0);
                self.own(now_us, Input::Rejoined, out);
            }
            Input::Tick => {
                self.own(now_us, Input::Tick, out);
                self.watch_members(now_us, out);
            }
            other => self.own(now_us, other, out),
        }
        self.distribute(now_us, out);
        self.report(now_us, false, out);
    }

    /// Heartbeats to the members, and members silent past the bound given up: their started
    /// tasks are lost, and they are told to stop (a hung one does so when it resumes).
    fn watch_members(&mut self, now_us: u64, out: &mut Vec<Effect>) {
        if let Some(gap) = self.stall.stood_still(now_us, self.live.hold_us) {
            // What the members sent meanwhile waits unread: they are judged only on time the
            // head was there to hear them, as the leader judges its agents.
            tracing::warn!(
                head = self.id,
                stood_s = gap as f64 / 1e6,
                "the head stood still; its members' silence in that time is excused"
            );
            for m in self.members.values_mut() {
                m.heard_us = m.heard_us.saturating_add(gap).min(now_us);
            }
        }
        let silent: Vec<u32> = self
            .members
            .iter()
            .filter(|(&m, mem)| m != self.id && now_us.saturating_sub(mem.heard_us) >= self.live.lost_after_us)
            .map(|(&m, _)| m)
            .collect();
        for m in silent {
            let secs = now_us.saturating_sub(self.members[&m].heard_us) as f64 / 1e6;
            let why = format!("silent for {secs:.1} s");
            self.member_lost(m, &why);
            let stop = ToAgent::Shutdown { stop: Stop::Abort, reason: why };
            out.push(Effect::Down { child: m, msg: Down { agent: m, msg: stop } });
        }
        if now_us.saturating_sub(self.last_down_us) >= self.live.heartbeat_us && !self.shutting_down {
            self.last_down_us = now_us;
            for &m in self.members.keys().filter(|&&m| m != self.id) {
                out.push(Effect::Down { child: m, msg: Down { agent: m, msg: ToAgent::Ack { seq: 0 } } });
            }
        }
    }

    /// Feeds the head's own machine; its reports come to the instance, not up.
    fn own(&mut self, now_us: u64, input: Input, out: &mut Vec<Effect>) {
        let mut mine = Vec::new();
        self.own.handle(now_us, input, &mut mine);
        for e in mine {
            match e {
                Effect::Up(Up::Report { report, .. }) => self.merge(now_us, self.id, report),
                Effect::CloseUp => {
                    self.report(now_us, true, out);
                    out.push(Effect::CloseUp);
                }
                e => out.push(e),
            }
        }
    }

    fn on_parent(&mut self, now_us: u64, msg: ToAgent, out: &mut Vec<Effect>) {
        match msg {
            ToAgent::Dispatch(tasks) => {
                self.asked = self.asked.saturating_sub(tasks.len() as u64);
                self.sized += tasks.iter().filter(|t| sized(t)).count();
                self.queue.extend(tasks);
            }
            ToAgent::Ack { seq } => self.acked(now_us, seq, out),
            ToAgent::Resync { seq } => {
                self.resync = true;
                if std::mem::take(&mut self.rejoined) {
                    // What was asked for may have died with the relay: ask afresh.
                    self.asked = 0;
                }
                self.acked(now_us, seq, out)
            }
            ToAgent::Preempt(ids) => self.preempt(now_us, ids, out),
            ToAgent::Recall(ids) => self.recall(now_us, ids, out),
            ToAgent::Shutdown { stop, reason } => {
                self.shutting_down = true;
                // A member is never revived by its head's revival: it has a head to go back to.
                let theirs = if stop == Stop::Revive { Stop::Abort } else { stop };
                for &m in self.members.keys().filter(|&&m| m != self.id) {
                    let msg = ToAgent::Shutdown { stop: theirs, reason: reason.clone() };
                    out.push(Effect::Down { child: m, msg: Down { agent: m, msg } });
                }
                self.own_msg(now_us, ToAgent::Shutdown { stop, reason }, out);
            }
            other => self.own_msg(now_us, other, out),
        }
    }

    /// A message for the head's own machine.
    fn own_msg(&mut self, now_us: u64, msg: ToAgent, out: &mut Vec<Effect>) {
        self.own(now_us, Input::Parent(Down { agent: self.id, msg }), out);
    }

    /// Stops preempted tasks where they are: one still in the queue goes back to the leader
    /// (never started); one handed out is stopped by its holder, the head's own machine or a
    /// member.
    fn preempt(&mut self, now_us: u64, ids: Vec<u64>, out: &mut Vec<Effect>) {
        let mut by_holder: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        for id in ids {
            if let Some(i) = self.queue.iter().position(|t| t.id == id) {
                let t = self.queue.remove(i).expect("found");
                self.sized -= sized(&t) as usize;
                self.returned.push(id);
            } else if let Some(h) = self.held.get(&id) {
                by_holder.entry(h.holder).or_default().push(id);
            }
        }
        for (holder, ids) in by_holder {
            self.send_holder(now_us, holder, ToAgent::Preempt(ids), out);
        }
    }

    /// A message for `holder`: the head's own machine, or a member.
    fn send_holder(&mut self, now_us: u64, holder: u32, msg: ToAgent, out: &mut Vec<Effect>) {
        if holder == self.id {
            self.own_msg(now_us, msg, out);
        } else {
            out.push(Effect::Down { child: holder, msg: Down { agent: holder, msg } });
        }
    }

    /// The leader wants these tasks back if they have not started: those still in the queue
    /// come out at once, those handed out are asked of their holder (which gives back what it
    /// has not started).
    fn recall(&mut self, now_us: u64, ids: Vec<u64>, out: &mut Vec<Effect>) {
        let wanted: HashSet<u64> = ids.iter().copied().collect();
        let mut sized_out = 0;
        let recalled = &mut self.recalled;
        self.queue.retain(|t| {
            let keep = !wanted.contains(&t.id);
            if !keep {
                sized_out += sized(t) as usize;
                recalled.push(t.id);
            }
            keep
        });
        self.sized -= sized_out;
        let mut by_holder: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        for id in ids {
            if let Some(h) = self.held.get(&id).filter(|h| !h.started) {
                by_holder.entry(h.holder).or_default().push(id);
            }
        }
        for (holder, ids) in by_holder {
            self.send_holder(now_us, holder, ToAgent::Recall(ids), out);
        }
    }

    /// The leader recorded every head report up to `seq`: so are the member reports they carried.
    /// The head's own machine hears every Ack (the leader's heartbeat), with what it acknowledges
    /// of its reports or nothing: its lease is on the leader.
    fn acked(&mut self, now_us: u64, seq: u64, out: &mut Vec<Effect>) {
        let mut last: BTreeMap<u32, u64> = BTreeMap::from([(self.id, 0)]);
        while self.carried.front().is_some_and(|&(s, _, _)| s <= seq) {
            let (_, m, mseq) = self.carried.pop_front().unwrap();
            last.insert(m, mseq);
        }
        for (m, mseq) in last {
            if m == self.id || self.members.contains_key(&m) {
                self.send_holder(now_us, m, ToAgent::Ack { seq: mseq }, out);
            }
        }
    }

    fn on_member(&mut self, now_us: u64, member: u32, up: Up, out: &mut Vec<Effect>) {
        match up {
            Up::Hello(h) => {
                tracing::info!(head = self.id, member, slots = h.cores, host = %h.hostname, "member joined");
                let heard_us = now_us;
                self.members.insert(member, Member::new(h.cores, h.mem_mb, h.gpus, heard_us));
                let welcome = ToAgent::Welcome { job_id: self.job_id.clone() };
                out.push(Effect::Down { child: member, msg: Down { agent: member, msg: welcome } });
            }
            Up::Report { report, .. } => {
                if let Some(m) = self.members.get_mut(&member) {
                    m.heard_us = now_us;
                }
                self.merge(now_us, member, report)
            }
            // The member says why it stops; its connection closing follows and hands its tasks back.
            Up::Lost { why, .. } => tracing::warn!(head = self.id, member, %why, "member stopping"),
        }
    }

    /// A member's (or the head's own) report: its news joins the head's next report.
    fn merge(&mut self, now_us: u64, member: u32, r: Report) {
        let Some(m) = self.members.get_mut(&member) else { return };
        m.credit += r.want as u64;
        m.idle = r.idle as u64;
        for s in r.started {
            if let Some(h) = self.held.get_mut(&s.id).filter(|h| h.holder == member && h.attempt == s.attempt) {
                h.started = true;
                self.started.push(s);
            }
        }
        let probe = r.results.is_empty() && r.seq > m.seq;
        m.seq = m.seq.max(r.seq);
        if !r.results.is_empty() || probe {
            self.pending.push((member, r.seq));
        }
        self.probed |= probe;
        if r.signalled && !self.signalled {
            (self.signalled, self.signal_untold) = (true, true);
        }
        for id in r.recalled {
            if self.held.get(&id).is_some_and(|h| h.holder == member && !h.started) {
                self.release(member, id);
                self.recalled.push(id);
            }
        }
        let before = self.results.len();
        for mut res in r.results {
            if self.held.get(&res.id).is_some_and(|h| h.holder == member && h.attempt == res.attempt) {
                self.release(member, res.id);
                res.ran_on = (member != self.id).then_some(member);
                self.results.push(res);
            }
        }
        self.pace.finished(now_us, (self.results.len() - before) as u64);
    }

    /// Task `id` is no longer `member`'s: what it held of the member's room is free again.
    fn release(&mut self, member: u32, id: u64) {
        let Some(h) = self.held.remove(&id) else { return };
        if let Some(m) = self.members.get_mut(&member) {
            m.held = m.held.saturating_sub(1);
            m.mem_used = m.mem_used.saturating_sub(h.mem_mb);
            m.gpus_used = m.gpus_used.saturating_sub(h.gpus);
        }
    }

    /// A member's connection ended: what it had started is lost (the leader decides the retry),
    /// what it had not reported started goes back to the leader.
    fn member_lost(&mut self, member: u32, why: &str) {
        if self.members.remove(&member).is_none() {
            return;
        }
        self.left += 1;
        let mut ids: Vec<u64> = self.held.iter().filter(|(_, h)| h.holder == member).map(|(&id, _)| id).collect();
        ids.sort_unstable();
        if self.shutting_down && ids.is_empty() {
            tracing::debug!(head = self.id, member, "member left");
        } else {
            tracing::warn!(head = self.id, member, tasks = ids.len(), %why, "member lost");
        }
        for id in ids {
            let h = self.held.remove(&id).unwrap();
            if h.started {
                self.results.push(TaskResult {
                    id,
                    attempt: h.attempt,
                    ran_on: Some(member),
                    ended: Ended { outcome: Outcome::Lost, ..Ended::NONE },
                });
            } else {
                self.returned.push(id);
            }
        }
    }

    /// Hands queued tasks to those who asked: first to fill idle slots (so long tasks spread),
    /// then, to queue ahead, no more than a member's share of the instance's tasks by its slots
    /// (members not joined yet counted with the head's slots), so that one member's queue does
    /// not hold what another could start. Shares of members that never join go to idle slots.
    fn distribute(&mut self, now_us: u64, out: &mut Vec<Effect>) {
        self.keep_for_waiting();
        let own_slots = self.members[&self.id].slots as u64;
        let joined = self.members.len() as u64 + self.left;
        let missing = (self.tree.instance_len(self.id) as u64).saturating_sub(joined);
        let slots = self.members.values().map(|m| m.slots as u64).sum::<u64>() + missing * own_slots;
        let total = (self.queue.len() + self.held.len()) as u64;
        for fill_idle in [true, false] {
            let ids: Vec<u32> = self.members.keys().copied().collect();
            for m in ids {
                if self.queue.is_empty() {
                    return;
                }
                let mem = &self.members[&m];
                let n = if fill_idle {
                    mem.credit.min(mem.idle)
                } else {
                    let share = (total * mem.slots as u64).div_ceil(slots.max(1));
                    mem.credit.min(share.saturating_sub(mem.held))
                };
                let n = n.min(self.queue.len() as u64) as usize;
                if n > 0 {
                    self.give(now_us, m, n, out);
                }
            }
        }
    }

    fn give(&mut self, now_us: u64, member: u32, n: usize, out: &mut Vec<Effect>) {
        let specs = self.take_for(member, n);
        if specs.is_empty() {
            return;
        }
        let n = specs.len();
        let m = self.members.get_mut(&member).unwrap();
        for s in &specs {
            let (mem_mb, gpus) = m.cost(s);
            (m.mem_used, m.gpus_used) = (m.mem_used + mem_mb, m.gpus_used + gpus);
            self.held.insert(s.id, Held { holder: member, attempt: s.attempt, started: false, mem_mb, gpus });
        }
        m.credit -= n as u64;
        m.idle = m.idle.saturating_sub(n as u64);
        m.held += n as u64;
        self.send_holder(now_us, member, ToAgent::Dispatch(specs), out);
    }

    /// Up to `n` queued tasks for `member`, in order: those with `mem=` or `gpus=` only where
    /// they fit beside what it holds (and beside the task it is kept for).
    fn take_for(&mut self, member: u32, n: usize) -> Vec<TaskToRun> {
        if self.sized == 0 {
            return self.queue.drain(..n).collect();
        }
        let m = &self.members[&member];
        let kept = self.kept.filter(|&(_, on)| on == member).map(|(id, _)| id);
        let keep = kept.and_then(|id| self.queue.iter().find(|t| t.id == id)).map_or((0, 0), |t| m.cost(t));
        let (mut mem_used, mut gpus_used) = (m.mem_used, m.gpus_used);
        let mut picked = Vec::new();
        for (i, t) in self.queue.iter().enumerate() {
            if picked.len() == n {
                break;
            }
            if sized(t) {
                let own = kept == Some(t.id);
                let room = Member { mem_used, gpus_used, ..Member::new(m.slots, m.mem_mb, m.gpus, 0) };
                if !m.could_hold(t) || !room.fits(t, if own { (0, 0) } else { keep }) {
                    continue;
                }
                let (mem, gpus) = m.cost(t);
                (mem_used, gpus_used) = (mem_used + mem, gpus_used + gpus);
            }
            picked.push(i);
        }
        let mut taken = Vec::with_capacity(picked.len());
        for i in picked.into_iter().rev() {
            let t = self.queue.remove(i).expect("picked from the queue");
            self.sized -= sized(&t) as usize;
            if self.kept.is_some_and(|(id, _)| id == t.id) {
                self.kept = None;
            }
            taken.push(t);
        }
        taken.reverse();
        taken
    }

    /// The first queued task that fits no member now keeps the member that could hold it with
    /// the most memory free, until it is given out: smaller ones go there only beside it, so a
    /// stream of them does not keep it waiting for ever.
    fn keep_for_waiting(&mut self) {
        if self.sized == 0 {
            self.kept = None;
            return;
        }
        self.return_unfit();
        if let Some((id, on)) = self.kept {
            if self.members.contains_key(&on) && self.queue.iter().any(|t| t.id == id) {
                return;
            }
            self.kept = None;
        }
        let none = (0, 0);
        let unfit = |t: &&TaskToRun| !self.members.values().any(|m| m.could_hold(t) && m.fits(t, none));
        let waiting = self.queue.iter().filter(|t| sized(t)).find(unfit);
        let Some(t) = waiting else { return };
        let best = self
            .members
            .iter()
            .filter(|(_, m)| m.could_hold(t))
            .max_by_key(|(_, m)| (m.mem_mb.saturating_sub(m.mem_used), m.gpus.saturating_sub(m.gpus_used)));
        self.kept = best.map(|(&on, _)| (t.id, on));
    }

    /// Queued tasks that no member can ever hold (the only one that could was lost) go back to
    /// the leader, which sends them elsewhere or fails them as unschedulable.
    fn return_unfit(&mut self) {
        let members = &self.members;
        let holdable = |t: &TaskToRun| !sized(t) || members.values().any(|m| m.could_hold(t));
        if self.queue.iter().all(holdable) {
            return;
        }
        let (keep, back): (VecDeque<_>, VecDeque<_>) = self.queue.drain(..).partition(holdable);
        self.queue = keep;
        self.sized -= back.len();
        self.returned.extend(back.iter().map(|t| t.id));
    }

    /// What the instance has for tasks now: sums, and the largest member's.
    fn capacity(&self) -> Capacity {
        let ms = self.members.values();
        Capacity {
            mem_mb: ms.clone().map(|m| m.mem_mb).sum(),
            largest_mem_mb: ms.clone().map(|m| m.mem_mb).max().unwrap_or(0),
            gpus: ms.clone().map(|m| m.gpus).sum(),
            largest_gpus: ms.clone().map(|m| m.gpus).max().unwrap_or(0),
            largest_cores: ms.map(|m| m.slots).max().unwrap_or(0),
        }
    }

    /// The instance's report to the leader, when one is due (`pace`): news, and enough work
    /// asked for to fill what every member keeps queued (`machine::queue_target`, or more at
    /// the instance's rate), so that members are fed at the pace they ask and do not report
    /// every task for want of work.
    fn report(&mut self, now_us: u64, last: bool, out: &mut Vec<Effect>) {
        let slots: u32 = self.members.values().map(|m| m.slots).sum();
        self.pace.set_base(self.members.values().map(|m| queue_target(m.slots as usize)).sum());
        let target = self.pace.target();
        let have = (self.queue.len() + self.held.len()) as u64 + self.asked;
        let want = if self.shutting_down || last { 0 } else { target.saturating_sub(have) };
        let want = if want >= target / 4 || have == 0 { want } else { 0 };
        let news = !self.results.is_empty()
            || self.probed
            || self.signal_untold
            || !self.started.is_empty()
            || !self.returned.is_empty()
            || !self.recalled.is_empty();
        let beat = !self.shutting_down && self.pace.beat_due(now_us, self.live.heartbeat_us);
        let capacity = Some(self.capacity()).filter(|c| self.resync || self.told.as_ref() != Some(c));
        let idle = self.members.values().map(|m| m.idle).sum::<u64>().saturating_sub(self.queue.len() as u64);
        // Recalled tasks are wanted now by idle slots elsewhere; members about to run dry, or
        // with a slot the instance has nothing for, cannot wait for the gap.
        let idle_news = idle > 0 && (idle > self.told_idle || !self.results.is_empty());
        let urgent = last
            || idle_news
            || slots != self.told_slots
            || beat
            || self.resync
            || capacity.is_some()
            || self.probed
            || self.signal_untold
            || !self.recalled.is_empty()
            || self.results.len() >= REPORT_BATCH
            || (want > 0 && have < target / 4);
        if !(want > 0 || news || urgent) || !self.pace.due(now_us, news || want > 0, urgent) {
            return;
        }
        if capacity.is_some() {
            self.told = capacity;
        }
        (self.told_slots, self.told_idle) = (slots, idle);
        self.pace.sent(now_us, want == 0 && !news && !self.resync);
        self.probed = false;
        self.signal_untold = false;
        if !self.results.is_empty() || !self.pending.is_empty() {
            self.seq += 1;
            let seq = self.seq;
            self.carried.extend(self.pending.drain(..).map(|(m, s)| (seq, m, s)));
            let done: std::collections::HashSet<u64> = self.results.iter().map(|r| r.id).collect();
            self.started.retain(|s| !done.contains(&s.id));
        }
        self.asked += want;
        let resync = std::mem::take(&mut self.resync);
        let holding = resync.then(|| {
            let mut h: Vec<u64> = self.queue.iter().map(|t| t.id).chain(self.held.keys().copied()).collect();
            h.sort_unstable();
            h
        });
        let report = Report {
            seq: self.seq,
            started: std::mem::take(&mut self.started),
            results: std::mem::take(&mut self.results),
            want: want as u32,
            drained: last || have == 0,
            idle: idle as u32,
            cores: slots,
            returned: std::mem::take(&mut self.returned),
            holding,
            capacity,
            recalled: std::mem::take(&mut self.recalled),
            signalled: self.signalled,
        };
        out.push(Effect::Up(Up::Report { agent: self.id, report }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use htc_core::record::Outcome;
    use htc_core::work::{Command, ExecEvent, Finished};

    /// The least time between the head's reports (`pace`).
    const GAP: u64 = pace::REPORT_GAP_US;

    fn spec(id: u64) -> TaskToRun {
        TaskToRun::new(id, 1, b"sleep 9".to_vec())
    }

    /// Task `id` asking `mem_mb` MiB and `gpus` devices.
    fn shaped(id: u64, mem_mb: u32, gpus: u8) -> TaskToRun {
        let shape = htc_core::shape::TaskShape { mem_mb, gpus, ..Default::default() };
        spec(id).shaped(shape)
    }

    /// `msg` from the parent for `agent`.
    fn down(agent: u32, msg: ToAgent) -> Input {
        Input::Parent(Down { agent, msg })
    }

    fn hello(agent: u32, cores: u32, mem_mb: u64, gpus: u32) -> Up {
        let came = crate::msg::Came::New;
        Up::Hello(crate::msg::Hello { agent, cores, mem_mb, gpus, hostname: String::new(), came })
    }

    /// Task `id`'s first attempt ended well on the head's own machine.
    fn finished(id: u64) -> ExecEvent {
        ExecEvent::Finished(Finished { id, attempt: 1, ended: Ended::new(Outcome::Exited, 0, 1, 2) })
    }

    fn step(i: &mut Instance, now: u64, input: Input) -> Vec<Effect> {
        let mut out = Vec::new();
        i.handle(now, input, &mut out);
        out
    }

    /// Ticks every 50 ms after `from` and up to `to`, and the leader's heartbeat every 250 ms,
    /// as they come while the head runs (so that it never stands still).
    fn beats_to(i: &mut Instance, from: u64, to: u64) -> Vec<Effect> {
        let mut out = Vec::new();
        let mut now = from;
        while now < to {
            now = (now + 50_000).min(to);
            if now.is_multiple_of(250_000) {
                i.handle(now, down(0, ToAgent::Ack { seq: 0 }), &mut out);
            }
            i.handle(now, Input::Tick, &mut out);
        }
        out
    }

    /// Four agents in instances of two: head 0 with member 1, head 2 with member 3.
    fn head() -> Instance {
        Instance::new(0, 2, Arc::new(Tree::instances(4, 2, 2)), "job")
    }

    /// Head 0 with `head_mb` MiB for tasks, after a first tick, and member 1 (2 slots, `member_mb`)
    /// joined.
    fn head_and_member(head_mb: u64, member_mb: u64) -> Instance {
        let mut h = head().with_resources(head_mb, 0);
        step(&mut h, 0, Input::Tick);
        step(&mut h, 1, Input::ChildOpened(1));
        let hello = hello(1, 2, member_mb, 0);
        step(&mut h, 2, Input::ChildFrame(hello));
        h
    }

    fn member_report(agent: u32, seq: u64, want: u32, idle: u32, started: &[u64], done: &[u64]) -> Input {
        let started = started.iter().map(|&id| crate::msg::Started { id, attempt: 1, start_us: 5 }).collect();
        let results = done
            .iter()
            .map(|&id| TaskResult {
                id,
                attempt: 1,
                ended: Ended { outcome: Outcome::Exited, ..Ended::NONE },
                ..Default::default()
            })
            .collect();
        let report = Report { seq, started, results, want, idle, ..Default::default() };
        Input::ChildFrame(Up::Report { agent, report })
    }

    fn ups(out: &[Effect]) -> Vec<&Report> {
        out.iter()
            .filter_map(|e| match e {
                Effect::Up(Up::Report { report, .. }) => Some(report),
                _ => None,
            })
            .collect()
    }

    /// Task ids sent to the head's own executor, and down to member `m`.
    fn ran_here(out: &[Effect]) -> Vec<u64> {
        out.iter()
            .filter_map(|e| match e {
                Effect::Exec(Command::Run(t)) => Some(t.iter().map(|t| t.id)),
                _ => None,
            })
            .flatten()
            .collect()
    }

    fn sent_to(out: &[Effect], m: u32) -> Vec<u64> {
        out.iter()
            .filter_map(|e| match e {
                Effect::Down { child, msg: Down { agent, msg: ToAgent::Dispatch(d) } }
                    if *child == m && *agent == m =>
                {
                    Some(d.iter().map(|t| t.id))
                }
                _ => None,
            })
            .flatten()
            .collect()
    }

    /// A Recall reaches each task where it is: the head's queue gives it back at once, a member
    /// or the head's own executor is asked; only what they did not start goes up as recalled.
    #[test]
    fn a_recall_takes_tasks_out_of_the_head_s_queue_and_asks_their_holders() {
        let mut h = head_and_member(0, 0);
        let d = Down { agent: 0, msg: ToAgent::Dispatch((1..=12).map(spec).collect()) };
        let out = step(&mut h, 3, Input::Parent(d));
        assert_eq!(ran_here(&out), vec![1, 2, 3, 4, 5, 6]);
        let out = step(&mut h, 4, member_report(1, 0, 4, 2, &[], &[]));
        assert_eq!(sent_to(&out, 1), vec![7, 8, 9, 10]);
        // 11 and 12 wait in the head's queue; 6 at its own executor; 9 and 10 at the member.
        let recall = Down { agent: 0, msg: ToAgent::Recall(vec![6, 9, 10, 11, 12]) };
        let out = step(&mut h, 5, Input::Parent(recall));
        let asked: Vec<(Option<u32>, Vec<u64>)> = out
            .iter()
            .filter_map(|e| match e {
                Effect::Exec(Command::Recall(ids)) => Some((None, ids.clone())),
                Effect::Down { child, msg: Down { msg: ToAgent::Recall(ids), .. } } => {
                    Some((Some(*child), ids.clone()))
                }
                _ => None,
            })
            .collect();
        assert_eq!(asked, vec![(None, vec![6]), (Some(1), vec![9, 10])]);
        assert_eq!(ups(&out)[0].recalled, [11, 12], "the queue's at once");
        // The member had started 9; it gives back 10. The head's executor gives back 6.
        let back = Report { recalled: vec![10], ..Default::default() };
        let out = step(&mut h, 6, Input::ChildFrame(Up::Report { agent: 1, report: back }));
        assert_eq!(ups(&out)[0].recalled, [10]);
        let out = step(&mut h, 7, Input::Exec(vec![ExecEvent::Recalled { id: 6, attempt: 1 }]));
        assert_eq!(ups(&out)[0].recalled, [6]);
        // A task the member gave back is no longer the instance's: a resync does not list it.
        let mut out = step(&mut h, 8, down(0, ToAgent::Resync { seq: 0 }));
        out.extend(step(&mut h, 9, Input::Tick));
        assert_eq!(ups(&out)[0].holding.as_deref(), Some(&[1, 2, 3, 4, 5, 7, 8, 9][..]));
    }

    #[test]
    fn a_head_welcomes_its_member_shares_the_instance_s_tasks_and_reports_for_both() {
        let mut h = head();
        let out = step(&mut h, 0, Input::Tick);
        let r = ups(&out);
        assert_eq!((r.len(), r[0].want, r[0].cores), (1, 32, 2), "asks for its own slots first");

        step(&mut h, 1, Input::ChildOpened(1));
        let hello = hello(1, 2, 0, 0);
        let out = step(&mut h, 2, Input::ChildFrame(hello));
        assert!(
            matches!(&out[0], Effect::Down { child: 1, msg: Down { agent: 1, msg: ToAgent::Welcome { job_id } } } if job_id == "job"),
            "the head admits its member: {out:?}"
        );
        // The leader never hears of the member, only of the instance's slots, idle, to fill now.
        let r = ups(&out);
        assert_eq!((out.len(), r[0].cores, r[0].idle, r[0].want), (2, 4, 2, 32));
        assert!(matches!(out[1], Effect::Up(Up::Report { agent: 0, .. })), "it reports as itself");

        // Eight tasks for the instance: the head's two idle slots, then its share of 4 (of 4 slots).
        let d = Down { agent: 0, msg: ToAgent::Dispatch((1..=8).map(spec).collect()) };
        let out = step(&mut h, 3, Input::Parent(d));
        assert_eq!(ran_here(&out), vec![1, 2, 3, 4]);
        // The member asks: it gets the other four.
        let out = step(&mut h, 4, member_report(1, 0, 16, 2, &[], &[]));
        assert_eq!(sent_to(&out, 1), vec![5, 6, 7, 8]);

        // Its starts and results go up in the head's next report, a gap after that one, each
        // result naming it.
        step(&mut h, 5, member_report(1, 1, 0, 0, &[5], &[6]));
        let own_done = finished(1);
        assert!(ups(&step(&mut h, 6, Input::Exec(vec![own_done]))).is_empty(), "waits for the gap");
        let out = step(&mut h, 4 + GAP, Input::Tick);
        let r = ups(&out);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].started.iter().map(|s| s.id).collect::<Vec<_>>(), vec![5]);
        let mut res: Vec<(u64, Option<u32>)> = r[0].results.iter().map(|r| (r.id, r.ran_on)).collect();
        res.sort_unstable();
        assert_eq!(res, vec![(1, None), (6, Some(1))]);
        assert_eq!((r[0].seq, r[0].cores), (1, 4));

        // The leader recorded it: so is the member's report that it carried.
        let out = step(&mut h, 5 + GAP, down(0, ToAgent::Ack { seq: 1 }));
        assert!(
            out.iter()
                .any(|e| matches!(e, Effect::Down { child: 1, msg: Down { agent: 1, msg: ToAgent::Ack { seq: 1 } } })),
            "{out:?}"
        );
    }

    /// Issue 25: what the members report within a gap goes up in one report of the head's, so
    /// the leader hears from an instance once per gap however many members it has.
    #[test]
    fn a_head_folds_its_members_reports_into_one_per_gap() {
        let mut h = Instance::new(0, 2, Arc::new(Tree::instances(3, 3, 2)), "job");
        step(&mut h, 0, Input::Tick);
        for m in [1, 2] {
            step(&mut h, 1, Input::ChildOpened(m));
            step(&mut h, 1, Input::ChildFrame(hello(m, 2, 0, 0)));
        }
        let d = Down { agent: 0, msg: ToAgent::Dispatch((1..=12).map(spec).collect()) };
        step(&mut h, 2, Input::Parent(d));
        let mut got = Vec::new();
        for m in [1, 2] {
            got.push(sent_to(&step(&mut h, 3, member_report(m, 0, 16, 2, &[], &[])), m));
        }
        // A gap later the first result goes at once (the leading edge); the next three, from
        // both members and the head's own slots, wait and go up together a gap after it.
        let t = 3 + GAP;
        let (a, b) = (got[0].clone(), got[1].clone());
        let inputs = vec![
            member_report(1, 1, 0, 0, &[], &a[..1]),
            member_report(2, 1, 0, 0, &[], &b[..1]),
            Input::Exec(vec![finished(1)]),
            member_report(1, 2, 0, 0, &[], &a[1..2]),
        ];
        let mut sizes = Vec::new();
        for (k, input) in inputs.into_iter().enumerate() {
            sizes.extend(ups(&step(&mut h, t + k as u64, input)).iter().map(|r| r.results.len()));
        }
        assert_eq!(sizes, [1], "the first at once, the rest wait");
        assert!(ups(&step(&mut h, t + GAP - 1, Input::Tick)).is_empty());
        let r = ups(&step(&mut h, t + GAP, Input::Tick)).into_iter().cloned().collect::<Vec<_>>();
        assert_eq!((r.len(), r[0].results.len()), (1, 3), "three results of three agents in one report");
    }

    #[test]
    fn tasks_with_memory_go_to_members_they_fit_and_the_leader_hears_the_instance_s_sums() {
        let mut h = head().with_resources(1000, 0);
        let r = step(&mut h, 0, Input::Tick);
        let c = ups(&r)[0].capacity.expect("the head's own at first");
        assert_eq!((c.mem_mb, c.largest_mem_mb, c.largest_cores), (1000, 1000, 2));
        step(&mut h, 1, Input::ChildOpened(1));
        let hello = hello(1, 2, 1000, 0);
        let r = step(&mut h, 2, Input::ChildFrame(hello));
        let c = ups(&r)[0].capacity.expect("changed: the member joined; said at once");
        assert_eq!((c.mem_mb, c.largest_mem_mb), (2000, 1000));
        assert_eq!(ups(&step(&mut h, 4, Input::Tick)).first().and_then(|r| r.capacity), None, "said once");

        // Three tasks of 600 MiB and one without mem=: the head's machine can hold one of them.
        let big = |id| shaped(id, 600, 0);
        let d = Down { agent: 0, msg: ToAgent::Dispatch(vec![big(1), big(2), big(3), spec(4)]) };
        let out = step(&mut h, 5, Input::Parent(d));
        assert_eq!(ran_here(&out), vec![1, 4], "2 and 3 do not fit beside 1");
        let out = step(&mut h, 6, member_report(1, 0, 16, 2, &[], &[]));
        assert_eq!(sent_to(&out, 1), vec![2], "one fits the member; 3 fits nowhere now");
        // Task 1 ends: 3 fits the head's machine.
        let done = finished(1);
        let out = step(&mut h, 7, Input::Exec(vec![done]));
        assert_eq!(ran_here(&out), vec![3]);
    }

    #[test]
    fn gpu_tasks_go_where_gpus_are_free_and_never_more_at_once_than_a_member_has() {
        // The head's own slots have one GPU, member 1 two.
        let mut h = head().with_resources(0, 1);
        step(&mut h, 0, Input::Tick);
        step(&mut h, 1, Input::ChildOpened(1));
        let hello = hello(1, 2, 0, 2);
        let r = step(&mut h, 2, Input::ChildFrame(hello));
        let c = ups(&r)[0].capacity.expect("the member joined: said at once");
        assert_eq!((c.gpus, c.largest_gpus), (3, 2));
        // Task 1 wants both of the member's GPUs, 2-4 one each.
        let gpu = |id, gpus| shaped(id, 0, gpus);
        let d = Down { agent: 0, msg: ToAgent::Dispatch(vec![gpu(1, 2), gpu(2, 1), gpu(3, 1), gpu(4, 1)]) };
        let mut out = step(&mut h, 3, Input::Parent(d));
        out.extend(step(&mut h, 4, member_report(1, 0, 16, 2, &[], &[])));
        assert_eq!(sent_to(&out, 1), vec![1], "only the member can hold task 1; then its GPUs are taken");
        assert_eq!(ran_here(&out), vec![2], "one GPU here: one task");
        // Task 1 ends: 3 and 4 take the member's two GPUs.
        let out = step(&mut h, 5, member_report(1, 1, 1, 2, &[1], &[1]));
        assert_eq!(sent_to(&out, 1), vec![3, 4]);
    }

    #[test]
    fn a_task_that_fits_no_member_keeps_one_and_smaller_ones_go_there_only_beside_it() {
        let mut h = head_and_member(1000, 1000);
        let sized = |id, mem_mb| shaped(id, mem_mb, 0);
        // 600 on each member, then a task of 800 that fits neither, then small ones of 300.
        let d = Down { agent: 0, msg: ToAgent::Dispatch(vec![sized(1, 600), sized(2, 600)]) };
        step(&mut h, 3, Input::Parent(d));
        step(&mut h, 4, member_report(1, 0, 16, 2, &[], &[]));
        let d = Down { agent: 0, msg: ToAgent::Dispatch(vec![sized(3, 800), sized(4, 300), sized(5, 300)]) };
        let out = step(&mut h, 5, Input::Parent(d));
        let (here, there) = (ran_here(&out), sent_to(&out, 1));
        // One member is kept for task 3: only the other takes a small one (600 + 300 fits).
        assert_eq!(here.len() + there.len(), 1, "{here:?} {there:?}");
        assert!(!here.contains(&3) && !there.contains(&3));
    }

    #[test]
    fn a_task_only_a_lost_member_could_hold_goes_back_to_the_leader() {
        let mut h = head().with_resources(500, 0);
        step(&mut h, 0, Input::Tick);
        step(&mut h, 1, Input::ChildOpened(1));
        let hello = hello(1, 2, 1000, 0);
        let r = ups(&step(&mut h, 2, Input::ChildFrame(hello))).into_iter().cloned().collect::<Vec<_>>();
        assert_eq!(r[0].capacity.map(|c| c.largest_mem_mb), Some(1000), "said when the member joined");
        let d = Down { agent: 0, msg: ToAgent::Dispatch(vec![shaped(1, 800, 0)]) };
        let out = step(&mut h, 3, Input::Parent(d));
        assert!(ran_here(&out).is_empty(), "800 MiB never fits the head's 500");
        let out = step(&mut h, 4, Input::ChildClosed { child: 1, agents: vec![1], why: "gone".into() });
        let r = ups(&out).into_iter().cloned().collect::<Vec<_>>();
        assert_eq!(r[0].returned, vec![1], "the instance shrank: said at once");
        let c = r[0].capacity.expect("the instance shrank");
        assert_eq!((c.mem_mb, c.largest_mem_mb), (500, 500));
    }

    #[test]
    fn a_lost_member_s_started_tasks_are_reported_lost_and_its_queued_ones_given_back() {
        let mut h = head();
        step(&mut h, 0, Input::Tick);
        step(&mut h, 1, Input::ChildOpened(1));
        step(&mut h, 2, Input::ChildFrame(hello(1, 2, 0, 0)));
        let d = Down { agent: 0, msg: ToAgent::Dispatch((1..=8).map(spec).collect()) };
        step(&mut h, 3, Input::Parent(d));
        step(&mut h, 4, member_report(1, 0, 16, 2, &[], &[]));
        step(&mut h, 5, member_report(1, 0, 0, 0, &[5, 6], &[]));
        step(&mut h, 6, Input::Tick);

        let closed = step(&mut h, 7, Input::ChildClosed { child: 1, agents: vec![1], why: "gone".into() });
        assert!(!closed.iter().any(|e| matches!(e, Effect::Up(Up::Lost { .. }))), "the leader never knew agent 1");
        // The instance shrank: said at once, with what the member held.
        let r = ups(&closed);
        let lost: Vec<(u64, Outcome, Option<u32>)> =
            r[0].results.iter().map(|r| (r.id, r.ended.outcome, r.ran_on)).collect();
        let l = Outcome::Lost;
        assert_eq!(lost, vec![(5, l, Some(1)), (6, l, Some(1))], "started there: lost, the leader retries them");
        assert_eq!(r[0].cores, 2);

        // Tasks 7 and 8 were not reported started: back to the leader, to go out as new attempts.
        assert!(ran_here(&closed).is_empty());
        assert_eq!(r[0].returned, vec![7, 8]);
    }

    #[test]
    fn shutdown_reaches_the_members_and_an_agent_without_members_is_its_machine() {
        let mut h = head();
        step(&mut h, 0, Input::ChildOpened(1));
        step(&mut h, 1, Input::ChildFrame(hello(1, 2, 0, 0)));
        let s = Down { agent: 0, msg: ToAgent::Shutdown { stop: Stop::Finish, reason: "done".into() } };
        let out = step(&mut h, 2, Input::Parent(s));
        let finish = ToAgent::Shutdown { stop: Stop::Finish, reason: "done".into() };
        assert!(out
            .iter()
            .any(|e| matches!(e, Effect::Down { child: 1, msg } if *msg == Down { agent: 1, msg: finish.clone() })));
        assert!(out.iter().any(|e| matches!(e, Effect::Exec(Command::Finish))));

        // Agent 1 is a member: it reports to its head as an agent reports to the leader.
        let mut m = Instance::new(1, 2, Arc::new(Tree::instances(4, 2, 2)), "job");
        let out = step(&mut m, 0, Input::Tick);
        assert!(matches!(out[..], [Effect::Up(Up::Report { agent: 1, .. })]), "{out:?}");
        assert_eq!((ups(&out)[0].want, ups(&out)[0].cores), (32, 0));
    }

    #[test]
    fn a_silent_member_is_given_up_and_the_members_hear_from_their_head() {
        let live = Liveness::new(std::time::Duration::from_secs(10));
        let mut h = head().with_liveness(live);
        step(&mut h, 0, Input::ChildOpened(1));
        step(&mut h, 0, Input::ChildFrame(hello(1, 2, 0, 0)));
        let d = Down { agent: 0, msg: ToAgent::Dispatch((1..=8).map(spec).collect()) };
        step(&mut h, 1, Input::Parent(d));
        // The head's own slots asked first: they run 1-4; the member gets 5-8, and starts 5.
        assert_eq!(sent_to(&step(&mut h, 2, member_report(1, 0, 16, 2, &[], &[])), 1), vec![5, 6, 7, 8]);
        step(&mut h, 3, member_report(1, 0, 0, 0, &[5], &[]));
        // A heartbeat a second to the member, an Ack of nothing.
        let out = step(&mut h, 1_000_000, Input::Tick);
        assert!(
            out.iter().any(|e| matches!(e, Effect::Down { child: 1, msg: Down { msg: ToAgent::Ack { seq: 0 }, .. } })),
            "{out:?}"
        );
        // Silent for the bound: lost, told to stop, its started task reported lost.
        let out = beats_to(&mut h, 1_000_000, 10_000_002);
        assert!(
            !out.iter()
                .any(|e| matches!(e, Effect::Down { child: 1, msg: Down { msg: ToAgent::Shutdown { .. }, .. } })),
            "not yet"
        );
        let out = step(&mut h, 10_000_003, Input::Tick);
        assert!(
            out.iter().any(|e| matches!(
                e,
                Effect::Down { child: 1, msg: Down { msg: ToAgent::Shutdown { stop: Stop::Abort, .. }, .. } }
            )),
            "{out:?}"
        );
        // Its started task goes up as lost at once: the instance shrank.
        let lost: Vec<u64> = ups(&out)
            .iter()
            .flat_map(|r| r.results.iter().filter(|r| r.ended.outcome == Outcome::Lost).map(|r| r.id))
            .collect();
        assert_eq!(lost, vec![5]);
        // Its late report changes nothing.
        step(&mut h, 10_000_004 + GAP, member_report(1, 1, 0, 0, &[], &[6]));
        assert!(ups(&step(&mut h, 10_000_005 + 2 * GAP, Input::Tick)).iter().all(|r| r.results.is_empty()));
    }

    /// A member that stood still past its lease probes (`stall`): a report with a new sequence
    /// number and no results. The head carries it up at once, not after the report gap, and the
    /// leader's ack of the head's report answers it, as it answers results.
    #[test]
    fn a_member_s_probe_goes_up_at_once_and_the_leader_s_ack_answers_it() {
        let live = Liveness::new(std::time::Duration::from_secs(10));
        let mut h = head().with_liveness(live);
        step(&mut h, 0, Input::Tick);
        step(&mut h, 0, Input::ChildOpened(1));
        step(&mut h, 0, Input::ChildFrame(hello(1, 2, 0, 0)));
        step(&mut h, 1, down(0, ToAgent::Dispatch((1..=8).map(spec).collect())));
        step(&mut h, 2, member_report(1, 0, 16, 2, &[], &[]));
        step(&mut h, 3, member_report(1, 0, 0, 0, &[5], &[]));
        let out = step(&mut h, 4, member_report(1, 1, 0, 0, &[], &[]));
        let r = ups(&out);
        assert_eq!(r.iter().map(|r| r.seq).collect::<Vec<_>>(), [1], "at once, with a sequence number: {out:?}");
        let out = step(&mut h, 5, down(0, ToAgent::Ack { seq: 1 }));
        assert!(
            out.iter()
                .any(|e| matches!(e, Effect::Down { child: 1, msg: Down { agent: 1, msg: ToAgent::Ack { seq: 1 } } })),
            "{out:?}"
        );
        // A report of nothing new with the same number is no probe.
        assert!(ups(&step(&mut h, 6, member_report(1, 1, 0, 0, &[], &[]))).is_empty());
    }

    /// A whole job suspended: the head stood still with its members, and their frames of before
    /// wait unread. Their silence in that time is excused, as the leader excuses its agents'.
    #[test]
    fn a_head_that_stood_still_gives_up_no_member_for_that_time() {
        let live = Liveness::new(std::time::Duration::from_secs(10));
        let mut h = head().with_liveness(live);
        step(&mut h, 0, Input::Tick);
        step(&mut h, 0, Input::ChildOpened(1));
        step(&mut h, 0, Input::ChildFrame(hello(1, 2, 0, 0)));
        beats_to(&mut h, 0, 1_000_000);
        let out = step(&mut h, 30_000_000, Input::Tick);
        assert!(
            !out.iter()
                .any(|e| matches!(e, Effect::Down { child: 1, msg: Down { msg: ToAgent::Shutdown { .. }, .. } })),
            "{out:?}"
        );
        // Its silence counts again from then: the bound after, it is lost.
        let out = beats_to(&mut h, 30_000_000, 40_000_000);
        assert!(
            out.iter().any(|e| matches!(e, Effect::Down { child: 1, msg: Down { msg: ToAgent::Shutdown { .. }, .. } })),
            "{out:?}"
        );
    }

    #[test]
    fn the_head_s_own_slots_keep_their_lease_on_the_leader_s_heartbeats_alone() {
        let live = Liveness::new(std::time::Duration::from_secs(10));
        let mut h = head().with_liveness(live);
        step(&mut h, 0, Input::Tick);
        let d = Down { agent: 0, msg: ToAgent::Dispatch((1..=2).map(spec).collect()) };
        step(&mut h, 1, Input::Parent(d));
        // Long tasks: for 20 s the leader sends only its heartbeat, an Ack of nothing new.
        for k in 1..=80u64 {
            let now = k * 250_000;
            step(&mut h, now, down(0, ToAgent::Ack { seq: 0 }));
            let out = step(&mut h, now + 1, Input::Tick);
            assert!(
                !out.iter().any(|e| matches!(e, Effect::Exec(Command::Abort | Command::Hold(true)))),
                "at {now} µs: {out:?}"
            );
        }
        assert!(h.outcome().is_none());
    }
}
