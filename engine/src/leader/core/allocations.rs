//! The run's allocations: the leader's own, and those that joined it (`--htc-join`, `htc run
//! --join`). A joining allocation asks for agent ids (`attach`), its agents graft onto the tree
//! as new instances, and what is not handed out yet is re-planned over the live instances
//! (`replan`). Near its end an allocation is told to leave in good order (`leave_due`): its
//! agents start nothing more, hand back what is queued, finish what runs, and go; their going is
//! not a loss.

use std::ops::Range;

use super::allocation::Attach;
use super::*;

impl Core<'_> {
    /// Takes a joining allocation into the run: its agents get the next ids, grafted onto the
    /// tree as instances of their own, whose shares come with the re-plan when each head joins.
    /// Refused once the run is ending, or without a tree to graft onto.
    pub fn attach(&mut self, req: Attach, now_us: u64) -> Result<u32, String> {
        self.now_us = now_us;
        if self.counts.unfinished() == 0 || self.told_to_hold {
            return Err("the run is ending: nothing is left to share".into());
        }
        if req.agents == 0 {
            return Err("an allocation of no agents".into());
        }
        let Some(tree) = self.layout.as_mut() else { return Err("this run takes no joins".into()) };
        let tree = Arc::make_mut(tree);
        let before = tree.heads().len();
        let base = match req.keep_first {
            Some(first) => self.keep_ids(first, &req)?,
            None => tree.graft(req.agents, req.instance_size, req.fanout),
        };
        let tree = self.layout.as_ref().expect("checked above");
        let new_heads: Vec<u32> = tree.heads()[before..].to_vec();
        self.turnout.expect_more(new_heads.len());
        new_heads.iter().for_each(|&h| self.affinity.join(h));
        tracing::info!(job = %self.job_id, joined = %req.job, agents = req.agents, nodes = req.nodes, first = base, "an allocation joined the run");
        self.allocations.push(Allocation {
            job: req.job,
            agents: base..base + req.agents,
            nodes: req.nodes,
            ends_us: req.ends_us,
            stage: Stage::Running,
        });
        Ok(base)
    }

    /// An allocation whose agents outlived the run's previous leader keeps their ids: those
    /// that came back already stand as instances (`handover`), the others are grafted where
    /// they were. Refused where another agent of this leader has one of the ids.
    fn keep_ids(&mut self, first: u32, req: &Attach) -> Result<u32, String> {
        if req.instance_size != 1 {
            return Err("only one-agent instances keep their ids".into());
        }
        let ids = first..first.saturating_add(req.agents);
        let tree = self.layout.as_ref().expect("checked by the caller");
        let taken = |a: &u32| (tree.holds(*a) && !self.strays.contains(a)) || self.allocation_of(*a).is_some();
        if let Some(a) = ids.clone().find(taken) {
            return Err(format!("agent {a} is another allocation's here"));
        }
        let free: Vec<u32> = ids.filter(|a| !tree.holds(*a)).collect();
        let tree = Arc::make_mut(self.layout.as_mut().expect("checked by the caller"));
        for a in free {
            tree.graft_at(a, 1, 1, req.fanout).expect("checked free");
        }
        Ok(first)
    }

    /// The allocation `agent` belongs to: `None` for the leader's own.
    pub(super) fn allocation_of(&self, agent: u32) -> Option<usize> {
        self.allocations.iter().position(|a| a.agents.contains(&agent))
    }

    /// The run's allocations besides the leader's own, as they stand.
    pub fn allocations(&self) -> &[Allocation] {
        &self.allocations
    }

    /// When `agent` must be done: its allocation's end, or the run's time limit.
    pub(super) fn ends_of(&self, agent: u32) -> Option<u64> {
        match self.allocation_of(agent) {
            Some(i) => self.allocations[i].ends_us,
            None => self.deadline_us,
        }
    }

    /// The latest end of the allocations still running: a task that cannot finish before it
    /// waits for the next session. `None` while one has no end.
    pub(super) fn run_ends_us(&self) -> Option<u64> {
        let joined = self.allocations.iter().filter(|a| a.stage == Stage::Running).map(|a| a.ends_us);
        std::iter::once(self.deadline_us).chain(joined).try_fold(0, |m, e| e.map(|e| m.max(e)))
    }

    /// Whether `agent` was told to leave with its allocation, or with its node (`give_back`).
    pub(super) fn leaving(&self, agent: u32) -> bool {
        self.give_back.leaving(agent)
            || self.allocation_of(agent).is_some_and(|i| self.allocations[i].stage != Stage::Running)
    }

    /// Allocations whose end has come are told to leave: each of their live agents starts
    /// nothing more, hands back what is queued and goes once what runs has ended.
    pub(super) fn leave_due<E>(&mut self, t: &mut dyn Tasks<Error = E>, out: &mut Effects) -> Result<(), E> {
        let now = self.now_us;
        let due: Vec<usize> = (0..self.allocations.len())
            .filter(|&i| self.allocations[i].stage == Stage::Running)
            .filter(|&i| self.allocations[i].ends_us.is_some_and(|e| now >= e))
            .collect();
        if due.is_empty() {
            return Ok(());
        }
        for i in due {
            let reason = format!("its allocation (job {}) reaches its time limit", self.allocations[i].job);
            self.leave(i, reason, out);
        }
        self.dispatch_all(t, out)
    }

    /// Tells a joined allocation to leave now (a grown job giving its nodes back to jobs that
    /// wait for them): as at its time limit.
    pub fn leave_allocation(&mut self, job: &str, reason: &str, out: &mut Effects) {
        if let Some(i) = self.allocations.iter().position(|a| a.job == job && a.stage == Stage::Running) {
            self.leave(i, format!("its allocation (job {job}) {reason}"), out);
        }
    }

    fn leave(&mut self, i: usize, reason: String, out: &mut Effects) {
        let a = &mut self.allocations[i];
        a.stage = Stage::Leaving;
        tracing::info!(job = %self.job_id, allocation = %a.job, %reason, "an allocation leaves");
        let range = a.agents.clone();
        for agent in range.filter(|x| self.agents.get(x).is_some_and(|a| a.alive)) {
            out.push(Effect::stop(agent, Stop::Hold, reason.clone()));
        }
        self.replan();
    }

    /// The launcher of a joined allocation ended (its job ended): its agents that never joined
    /// never will, and those still here go as its job's end takes them.
    pub fn allocation_gone(&mut self, job: &str, now_us: u64) {
        self.now_us = now_us;
        let Some(i) = self.allocations.iter().position(|a| a.job == job && a.stage != Stage::Gone) else { return };
        self.allocations[i].stage = Stage::Gone;
        tracing::info!(job = %self.job_id, allocation = %job, "a joined allocation ended");
        let heads: Vec<u32> = match &self.layout {
            Some(t) => self.allocations[i].agents.clone().filter(|&a| t.head(a) == a).collect(),
            None => Vec::new(),
        };
        for agent in heads {
            self.never_joined(agent, "its allocation ended before it joined");
        }
        self.replan();
    }

    /// Splits what is not handed out yet over the live instances by their cores (eq. 10 once
    /// every instance runs). An instance expected but not joined yet counts as an average one,
    /// unless its allocation is gone; a lost, drained or leaving one gets nothing.
    pub(super) fn replan(&mut self) {
        let Some(tree) = &self.layout else { return };
        let live: Vec<u64> = self.agents.values().filter(|a| a.alive && !a.drained).map(|a| a.cores as u64).collect();
        let average = (live.iter().sum::<u64>() / live.len().max(1) as u64).max(1);
        let weights: Vec<u64> = tree
            .heads()
            .iter()
            .map(|&h| match self.agents.get(&h) {
                Some(a) if a.alive && !a.drained && !self.leaving(h) => a.cores.max(1) as u64,
                Some(_) => 0,
                None if self.leaving(h) => 0,
                None => average,
            })
            .collect();
        tracing::debug!(job = %self.job_id, instances = weights.len(), left = self.partition.remaining(), "re-planned the partition");
        self.partition.replan(&htc_core::partition::live_weights(&weights));
    }

    /// Whether the run has allocations beyond the leader's own (re-plans happen only then: a
    /// single allocation keeps HFlow's static plan, its lost instances' shares stolen).
    pub(super) fn has_joined(&self) -> bool {
        !self.allocations.is_empty()
    }

    /// The run as a growing run's policy sees it (`htc_core::grow`): tasks left and what one
    /// costs (measured once a few ran), the allocations working and their ends.
    pub fn grow_situation(&self, now_us: u64, own_minutes: u64) -> htc_core::grow::Situation {
        let alive = |range: Option<&Range<u32>>| -> u64 {
            self.agents
                .iter()
                .filter(|(id, a)| a.alive && range.map_or(self.allocation_of(**id).is_none(), |r| r.contains(id)))
                .map(|(_, a)| a.cores as u64)
                .sum()
        };
        let mut live = vec![(alive(None), self.deadline_us)];
        for a in self.allocations.iter().filter(|a| a.stage == Stage::Running) {
            live.push((alive(Some(&a.agents)), a.ends_us));
        }
        htc_core::grow::Situation {
            now_us,
            tasks_left: self.counts.unfinished(),
            task_core_s: self.figures.task_core_s(htc_core::partition::LEARN_AFTER),
            live,
            joined: self.allocations.iter().map(|a| a.job.clone()).collect(),
            cores_per_node: self.agents.values().filter(|a| a.alive).map(|a| a.cores as u64).max().unwrap_or(1),
            own_minutes,
            others_waiting: false,
            idle_us: self.idle_us(),
        }
    }

    /// Joined allocations that are over (left, or their job ended): a grown job among them no
    /// longer counts against the run's bound.
    pub fn allocations_over(&self) -> impl Iterator<Item = &str> {
        self.allocations.iter().filter(|a| a.stage != Stage::Running).map(|a| a.job.as_str())
    }
}
