//! One pass over a run's ledger (every task's last attempt and the attempt history) into what
//! the report draws: busy cores and finishes over time, for the job and per node, runtimes per
//! class, failures by reason, per-node totals.

use std::collections::{BTreeMap, HashMap};

use super::timeline::{self, Axis, BINS};
use crate::ledger::{Attempt, Ledger, Outcome, Record, State};

/// Runtime histogram buckets: bucket k holds runtimes in [2^(k-1), 2^k) ms (bucket 0: < 1 ms).
pub const RUNTIME_BUCKETS: usize = 32;

/// Task ids kept per failure reason.
pub const IDS_PER_REASON: usize = 20;

#[derive(Debug, Clone, Default)]
pub struct Class {
    pub name: String,
    pub tasks: u64,
    pub sum_ms: f64,
    pub min_ms: u64,
    pub max_ms: u64,
    pub buckets: [u64; RUNTIME_BUCKETS],
}

impl Class {
    /// The runtime below which `q` of the tasks finished, from the buckets (its upper bound).
    pub fn quantile_ms(&self, q: f64) -> u64 {
        let want = (self.tasks as f64 * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (k, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= want {
                return (1u64 << k).min(self.max_ms.max(1));
            }
        }
        self.max_ms
    }
}

#[derive(Debug, Clone, Default)]
pub struct Node {
    pub agent: u32,
    pub host: String,
    pub cores: Option<u64>,
    pub done: u64,
    pub failed: u64,
    pub busy_core_us: f64,
    /// Core-µs per time bin.
    pub busy: Vec<f64>,
}

#[derive(Debug, Clone, Default)]
pub struct Reason {
    pub tasks: u64,
    pub ids: Vec<u64>,
}

#[derive(Debug, Default)]
pub struct Gathered {
    pub run: String,
    pub task_file: String,
    pub tasks: u64,
    pub done: u64,
    pub failed: u64,
    /// Cancelled: by a user, or because what they waited for did not succeed.
    pub cancelled: u64,
    pub unfinished: u64,
    /// Among the unfinished: those that wait for other tasks, as the leader last wrote.
    pub blocked: u64,
    pub attempts: u64,
    pub axis: Axis,
    /// Core-µs per bin, the whole job.
    pub busy: Vec<f64>,
    /// Tasks finished (done or failed) per bin.
    pub finished: Vec<f64>,
    pub first_start_us: u64,
    pub last_end_us: u64,
    pub classes: Vec<Class>,
    pub nodes: BTreeMap<u32, Node>,
    pub reasons: BTreeMap<String, Reason>,
    pub leader_cpu_us: Option<u64>,
    /// Tasks with an output cut at their `max_output=` (from the agents' notes, not the ledger).
    pub outputs_cut: u64,
}

impl Gathered {
    pub fn makespan_s(&self) -> f64 {
        self.last_end_us.saturating_sub(self.first_start_us) as f64 / 1e6
    }

    /// Every node's cores, when all are known.
    pub fn cores(&self) -> Option<u64> {
        self.nodes.values().map(|n| n.cores).sum()
    }

    pub fn busy_core_s(&self) -> f64 {
        self.busy.iter().sum::<f64>() / 1e6
    }

    /// Busy core-seconds over the cores the job had for its makespan.
    pub fn utilization(&self) -> Option<f64> {
        let span = self.makespan_s();
        self.cores().filter(|&c| c > 0 && span > 0.0).map(|c| self.busy_core_s() / (c as f64 * span))
    }

    fn place(&mut self, t0: u64, t1: u64) {
        for g in self.axis.fit(t0, t1) {
            timeline::grow(&mut self.busy, g);
            timeline::grow(&mut self.finished, g);
            for n in self.nodes.values_mut() {
                timeline::grow(&mut n.busy, g);
            }
        }
    }

    fn node(&mut self, agent: u32) -> &mut Node {
        self.nodes.entry(agent).or_insert_with(|| Node { agent, busy: vec![0.0; BINS], ..Default::default() })
    }

    /// One ended attempt of a task of `cores` cores; `last` when it ended the task.
    fn attempt(&mut self, a: &Attempt, cores: u16, last: bool) {
        self.attempts += 1;
        if a.ended.outcome == Outcome::Unschedulable {
            return; // no node ever ran it
        }
        let ok = a.ended.outcome == Outcome::Exited && a.ended.value == 0;
        let n = self.node(a.agent);
        if ok {
            n.done += 1;
        } else {
            n.failed += 1;
        }
        // Never started, or times no clock gives (a damaged record): not on the timeline.
        if a.ended.start_us == 0 || a.ended.end_us < a.ended.start_us || a.ended.end_us > i64::MAX as u64 / 4 {
            return;
        }
        self.place(a.ended.start_us, a.ended.end_us);
        self.first_start_us =
            if self.first_start_us == 0 { a.ended.start_us } else { self.first_start_us.min(a.ended.start_us) };
        self.last_end_us = self.last_end_us.max(a.ended.end_us);
        let (ax, c) = (self.axis.clone(), cores.max(1) as f64);
        ax.spread(&mut self.busy, a.ended.start_us, a.ended.end_us, c);
        let n = self.nodes.get_mut(&a.agent).expect("made above");
        ax.spread(&mut n.busy, a.ended.start_us, a.ended.end_us, c);
        n.busy_core_us += (a.ended.end_us - a.ended.start_us) as f64 * c;
        if last {
            let b = ax.bin(a.ended.end_us);
            self.finished[b] += 1.0;
        }
    }

    fn task(&mut self, id: u64, r: &Record, earlier: &[Attempt]) {
        self.tasks += 1;
        for a in earlier {
            self.attempt(a, r.shape().cores, false);
        }
        match r.state() {
            State::Done => self.done += 1,
            State::Failed => self.failed += 1,
            State::Cancelled => self.cancelled += 1,
            _ => {
                self.unfinished += 1;
                return;
            }
        }
        if r.attempts() == 0 && r.outcome() == Outcome::None {
            return;
        }
        self.attempt(&r.last_attempt(), r.shape().cores, true);
        if r.state() == State::Failed {
            let reason = self.reasons.entry(r.outcome().describe(r.value())).or_default();
            reason.tasks += 1;
            if reason.ids.len() < IDS_PER_REASON {
                reason.ids.push(id);
            }
        } else if r.start_us() > 0 && r.end_us() >= r.start_us() {
            let ms = (r.end_us() - r.start_us()) / 1000;
            let c = self.class(r.shape().class);
            if c.tasks == 0 || ms < c.min_ms {
                c.min_ms = ms;
            }
            c.max_ms = c.max_ms.max(ms);
            c.tasks += 1;
            c.sum_ms += ms as f64;
            let k = (64 - ms.leading_zeros() as usize).min(RUNTIME_BUCKETS - 1);
            c.buckets[k] += 1;
        }
    }

    fn class(&mut self, i: u16) -> &mut Class {
        let i = i as usize;
        if self.classes.len() <= i {
            self.classes.resize_with(i + 1, Class::default);
        }
        &mut self.classes[i]
    }
}

/// Reads the ledger once into a `Gathered`.
pub fn gather(ledger: &Ledger, run: &str) -> anyhow::Result<Gathered> {
    let t = ledger.read()?;
    // Every record is read anyway: check the pages that lead to them too.
    t.check_structure(None)?;
    let mut g = Gathered { run: run.into(), busy: vec![0.0; BINS], finished: vec![0.0; BINS], ..Default::default() };
    let text = |k: &str| -> anyhow::Result<String> {
        Ok(t.meta(k)?.map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default())
    };
    g.task_file = text("task_file")?;
    let names: Vec<String> = text("classes")?.lines().map(Into::into).collect();
    g.leader_cpu_us = t.meta_u64("leader_cpu_us")?;
    g.blocked = t.meta_u64("blocked")?.unwrap_or(0);
    let mut earlier: HashMap<u64, Vec<Attempt>> = HashMap::new();
    t.for_each_attempt(|id, a| earlier.entry(id).or_default().push(a))?;
    t.for_each(|id, r| {
        let e = earlier.remove(&id).unwrap_or_default();
        g.task(id, r, &e);
    })?;
    for (i, c) in g.classes.iter_mut().enumerate() {
        c.name = names.get(i).cloned().unwrap_or_else(|| format!("class {i}"));
    }
    g.classes.retain(|c| c.tasks > 0);
    for n in g.nodes.values_mut() {
        n.host = text(&format!("host.{}", n.agent))?;
        if n.host.is_empty() {
            n.host = format!("agent-{}", n.agent);
        }
        n.cores = t.meta_u64(&format!("cores.{}", n.agent))?;
    }
    Ok(g)
}

#[cfg(test)]
mod tests {
    use super::*;
    use htc_core::record::Ended;

    fn rec(state: State, outcome: Outcome, value: i32, agent: u32, s: u64, e: u64) -> Record {
        use htc_core::task::{End, Step};
        let end = match state {
            State::Done => End::Succeeded,
            State::Failed => End::Failed { permanent: true },
            // A pending task that ran once failed and waits for its retry.
            _ => End::Failed { permanent: false },
        };
        let steps = [Step::Dispatch, Step::Start, Step::Finish(end)];
        let mut r = Record::default().walked(&steps).unwrap();
        assert_eq!(r.state(), state);
        r.set_ended(agent, htc_core::record::Ended::new(outcome, value, s, e));
        r
    }

    #[test]
    fn attempts_are_counted_binned_and_failures_grouped_by_reason() {
        let mut g = Gathered { busy: vec![0.0; BINS], finished: vec![0.0; BINS], ..Default::default() };
        let s = 1_000_000_000;
        g.task(1, &rec(State::Done, Outcome::Exited, 0, 0, s, s + 2_000_000), &[]);
        let retried = Attempt { attempt: 1, agent: 1, ended: Ended::new(Outcome::Exited, 3, s, s + 1_000_000) };
        g.task(2, &rec(State::Failed, Outcome::Exited, 3, 1, s + 1_000_000, s + 4_000_000), &[retried]);
        g.task(3, &rec(State::Pending, Outcome::None, 0, 0, 0, 0), &[]);
        assert_eq!((g.tasks, g.done, g.failed, g.unfinished, g.attempts), (3, 1, 1, 1, 3));
        assert_eq!(g.makespan_s(), 4.0);
        assert_eq!(g.busy_core_s(), 6.0, "2 + 1 + 3 core-seconds");
        assert_eq!(g.finished.iter().sum::<f64>(), 2.0);
        assert_eq!((g.nodes[&0].done, g.nodes[&1].failed), (1, 2));
        assert_eq!(g.reasons["exit 3"].ids, [2]);
        assert_eq!(g.classes[0].tasks, 1);
        assert_eq!((g.classes[0].min_ms, g.classes[0].quantile_ms(0.5)), (2000, 2000));
        assert_eq!(g.utilization(), None, "cores unknown");
        for n in g.nodes.values_mut() {
            n.cores = Some(1);
        }
        assert_eq!(g.utilization(), Some(6.0 / 8.0));
    }
}
