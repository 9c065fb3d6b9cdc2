//! The agents' lives: joining and placement, loss (silence, a closed link), rejoining after a
//! relay's loss, revival after being given up, resync of what they hold, and the audit that
//! finds tasks lost in transit.

use super::*;

impl Core<'_> {
    /// How many report to the leader: the instance heads.
    pub(super) fn reporters(&self) -> usize {
        self.layout.as_ref().map_or(self.turnout.expected(), |t| t.heads().len())
    }

    /// The partition index of the instance `agent` heads; `None` for an agent that heads none.
    pub(super) fn instance_of(&self, agent: u32) -> Option<usize> {
        match &self.layout {
            Some(t) => t.instance_index(agent),
            None => Some(agent as usize),
        }
    }

    pub(super) fn lose<E>(
        &mut self,
        t: &mut dyn Tasks<Error = E>,
        agent: u32,
        why: &str,
        now_us: u64,
        out: &mut Effects,
    ) -> Result<(), E> {
        let Some(a) = self.agents.get_mut(&agent).filter(|a| a.alive) else { return Ok(()) };
        a.alive = false;
        let leaving = self.leaving(agent);
        let a = self.agents.get_mut(&agent).expect("checked above");
        if self.told_to_hold || a.drained || leaving {
            tracing::info!(job = %self.job_id, agent, host = %a.hostname, "agent left, as told");
            self.turnout.lost(now_us, None);
        } else {
            tracing::warn!(job = %self.job_id, agent, host = %a.hostname, %why, "agent lost");
            self.turnout.lost(now_us, Some(format!("agent {agent} on {}: {why}", a.hostname)));
        }
        self.requeue_agent(t, agent, now_us)?;
        if self.has_joined() {
            self.replan();
        }
        self.mem.leave(agent);
        for id in self.affinity.leave(agent) {
            self.push_retry(id);
        }
        self.fail_unfit_waiting(t)?;
        self.left_with_node(agent, out);
        self.dispatch_all(t, out)
    }

    /// Tasks waiting for memory that no live agent can ever run (the only big enough one left)
    /// fail as unschedulable rather than wait for ever.
    pub(super) fn fail_unfit_waiting<E>(&mut self, t: &mut dyn Tasks<Error = E>) -> Result<(), E> {
        if self.mem.waiting() == 0 || !self.all_accounted() {
            return Ok(());
        }
        let ids: Vec<u64> = self.mem.waiting_tasks().map(|n| n.task).collect();
        for id in ids {
            let Some(r) = t.get(id)? else { continue };
            if !self.schedulable(&r) {
                self.mem.forget(id, self.now_us);
                self.fail_unschedulable(t, id, r)?;
            }
        }
        Ok(())
    }

    /// Time passed without a tick for longer than a hold: the leader itself stood still (SIGSTOP,
    /// a starved or swapped-out process, a long disk stall). What its agents sent meanwhile waits
    /// unread in its sockets, so the stall is not counted as their silence: an agent is judged
    /// only on time the leader was there to hear it.
    pub(super) fn excuse_own_stall(&mut self, now_us: u64) {
        let gap = now_us.saturating_sub(self.ticked_us);
        self.ticked_us = now_us;
        if gap <= self.live.hold_us {
            return;
        }
        tracing::warn!(
            stalled_s = gap as f64 / 1e6,
            "the leader stood still; its agents' silence in that time is excused"
        );
        self.agents.excuse(gap, now_us);
    }

    /// A lost agent's attempts: those that had started count as lost (the task may be what
    /// killed the agent); those still queued there go back to the queue as if never sent.
    fn requeue_agent<E>(&mut self, t: &mut dyn Tasks<Error = E>, agent: u32, now_us: u64) -> Result<(), E> {
        // In id order, so that the same events always give the same decisions.
        for id in self.in_flight.of_agent(agent) {
            self.recall(t, agent, id, now_us)?;
        }
        Ok(())
    }

    /// Task `id`, in flight with `agent`, will not end there: a started attempt is lost (no
    /// retry used unless it keeps happening), an unstarted one is taken back.
    pub(super) fn recall<E>(
        &mut self,
        t: &mut dyn Tasks<Error = E>,
        agent: u32,
        id: u64,
        now_us: u64,
    ) -> Result<(), E> {
        let start_us = self.in_flight.start_of(id).unwrap_or(0);
        let Some(f) = self.land(id) else { return Ok(()) };
        if f.life.state() == State::Running {
            if let Some(mut r) = t.get(id)? {
                let lost = Ended::new(Outcome::Lost, 0, start_us, now_us);
                self.finish_attempt(t, id, &mut r, f, agent, lost)?;
            }
        } else {
            self.in_flight.insert(id, f);
            self.take_back(t, agent, id)?;
        }
        Ok(())
    }

    /// An agent (and those it relays for) came back around a lost relay: each is asked which
    /// tasks it holds, since frames both ways may have died with the relay.
    pub(super) fn rejoined(&mut self, agent: u32, below: Vec<u32>, now_us: u64, out: &mut Effects) {
        for a in std::iter::once(agent).chain(below) {
            if a == agent && !self.agents.contains_key(&a) && self.member_s_instance(a).is_some() {
                // A member around its lost head: what it holds went back with the head (or will,
                // once the head is found lost), so it stops it and comes back empty.
                let reason = "its instance head is gone: come back empty to the leader".to_string();
                effect::give_up(out, a, reason);
                continue;
            }
            let Some(x) = self.agents.get_mut(&a) else { continue };
            if !x.alive {
                if a == agent {
                    // Given up already: its tasks run elsewhere, so it must not run them too.
                    let why = "rejoined after it was given up".to_string();
                    effect::give_up(out, a, why);
                }
                continue;
            }
            tracing::info!(job = %self.job_id, agent = a, host = %x.hostname, "rejoined around a lost relay");
            x.heard_us = now_us;
            out.push(Effect::ToAgent(a, ToAgent::Resync { seq: x.acked_seq }));
            self.resyncs.insert(a, self.in_flight.of_agent(a));
        }
    }

    /// A given-up agent back, empty. Should the leader not have given it up yet (the agent's
    /// lease ran out first), it does so now: the agent stopped what it held. A black hole stays
    /// drained; an agent that never joined is not a member to revive.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn revived<E>(
        &mut self,
        t: &mut dyn Tasks<Error = E>,
        agent: u32,
        (cores, mem_mb, gpus): (u32, u64, u32),
        hostname: String,
        now_us: u64,
        out: &mut Effects,
    ) -> Result<(), E> {
        if !self.agents.contains_key(&agent) && !self.told_to_hold {
            if let Some(instance) = self.member_s_instance(agent) {
                // Its head is gone (or gave it up): it works on for its instance, from here.
                tracing::info!(job = %self.job_id, agent, %hostname, "a member back without its head: it reports to the leader now");
                self.enroll(agent, instance, (cores, mem_mb, gpus), hostname);
                return Ok(());
            }
        }
        let Some(a) = self.agents.get(&agent) else {
            let reason = "never joined this session".to_string();
            out.push(Effect::stop(agent, Stop::Abort, reason));
            return Ok(());
        };
        if a.drained || self.told_to_hold {
            let reason = if a.drained { "drained as a black hole" } else { "the run starts nothing more" }.to_string();
            out.push(Effect::stop(agent, Stop::Hold, reason));
            return Ok(());
        }
        if a.alive {
            self.lose(t, agent, "came back empty after its lease ran out", now_us, out)?;
        }
        let a = self.agents.get_mut(&agent).expect("checked above");
        tracing::info!(job = %self.job_id, agent, %hostname, "given up before, back as a fresh member");
        (a.alive, a.heard_us, a.cores, a.mem_mb, a.gpus, a.hostname) = (true, now_us, cores, mem_mb, gpus, hostname);
        a.widest = cores;
        (a.credit, a.idle, a.ahead_ms, a.busy) = (0, 0, 0, 0);
        a.streak.succeeded();
        self.place(agent, cores, mem_mb, gpus);
        self.resyncs.remove(&agent);
        Ok(())
    }

    /// An agent (or one given up, back empty) takes part in placement: memory and GPUs to
    /// commit, and a share of the affinity keys.
    pub(super) fn place(&mut self, agent: u32, cores: u32, mem_mb: u64, gpus: u32) {
        self.mem.join(agent, mem_mb, cores, gpus);
        self.affinity.join(agent);
    }

    /// Tasks lost in transit (HTDcr's T_loss): rather than guess from runtimes when a task is
    /// overdue, which would re-run long tasks that are fine, every agent holding tasks is asked
    /// now and then which it holds (one pass over the tasks in flight), and what it does not
    /// hold is re-run (`resynced`). A lost dispatch or result thus costs at most this period.
    pub(super) fn audit(&mut self, out: &mut Effects) {
        let mut by_agent: HashMap<u32, Vec<u64>> = HashMap::new();
        for (id, f) in self.in_flight.by_id.iter().enumerate() {
            if f.agent != u32::MAX {
                by_agent.entry(f.agent).or_default().push(id as u64);
            }
        }
        for (agent, ids) in by_agent {
            let Some(a) = self.agents.get(&agent).filter(|a| a.alive && !a.drained) else { continue };
            if self.resyncs.contains_key(&agent) {
                continue;
            }
            out.push(Effect::ToAgent(agent, ToAgent::Resync { seq: a.acked_seq }));
            self.resyncs.insert(agent, ids);
        }
    }

    /// The answer to a resync: what was in flight with the agent when it was asked and is not in
    /// its hands was lost on the way (a dispatch, or a result), and goes to be run again.
    pub(super) fn resynced<E>(
        &mut self,
        t: &mut dyn Tasks<Error = E>,
        agent: u32,
        holding: &[u64],
        now_us: u64,
    ) -> Result<(), E> {
        let Some(asked) = self.resyncs.remove(&agent) else { return Ok(()) };
        let held: HashSet<u64> = holding.iter().copied().collect();
        let mut lost = 0;
        for id in asked.into_iter().filter(|id| !held.contains(id)) {
            if self.in_flight.get(id).is_some_and(|f| f.agent == agent) {
                self.recall(t, agent, id, now_us)?;
                lost += 1;
            }
        }
        tracing::info!(job = %self.job_id, agent, held = holding.len(), lost, "resynced after a rejoin");
        Ok(())
    }

    /// An instance head joined: it is placed (memory, affinity keys) and waits for its first
    /// report to ask for work.
    pub(super) fn joined(&mut self, agent: u32, resources: (u32, u64, u32), hostname: String) {
        let Some(instance) = self.instance_of(agent) else {
            tracing::warn!(job = %self.job_id, agent, %hostname, "an agent that heads no instance joined; ignored");
            return;
        };
        tracing::info!(job = %self.job_id, agent, cores = resources.0, mem_mb = resources.1, %hostname, "agent joined");
        self.turnout.joined();
        self.enroll(agent, instance, resources, hostname);
        if self.has_joined() {
            self.replan();
        }
    }

    /// The instance a member (not a head) belongs to, if `agent` is one: a member whose head
    /// is gone may come to the leader itself.
    fn member_s_instance(&self, agent: u32) -> Option<usize> {
        let tree = self.layout.as_ref()?;
        let head = tree.head(agent);
        (tree.contains(agent) && head != agent).then(|| tree.instance_index(head)).flatten()
    }

    /// Takes `agent` into placement and dispatch, drawing on `instance`'s share.
    pub(super) fn enroll(
        &mut self,
        agent: u32,
        instance: usize,
        (cores, mem_mb, gpus): (u32, u64, u32),
        hostname: String,
    ) {
        self.place(agent, cores, mem_mb, gpus);
        self.agents.insert(agent, Agent::new(instance, (cores, mem_mb, gpus), hostname, self.now_us));
    }

    /// An agent the launcher started ended, or could not start, before it joined.
    pub(super) fn never_joined(&mut self, agent: u32, why: &str) {
        // Members join their head, not the leader: their absence is the head's to tell.
        if !self.agents.contains_key(&agent) && self.instance_of(agent).is_some() {
            tracing::warn!(job = %self.job_id, agent, %why, "agent never joined");
            self.turnout.never_joined();
            for id in self.affinity.leave(agent) {
                self.push_retry(id);
            }
        }
    }

    /// An agent's process exited badly. One that never joined could not start on its node (its
    /// program missing there, or refusing the node's setup): a node broken, not lost, so the run
    /// stops and says which and why, rather than run on without it and come back to it when
    /// resumed or resubmitted. One that joined is lost the usual way, by its link. Members join
    /// their head, not the leader, which cannot tell whether one did: only heads are judged (a
    /// node's agents fail alike, and every node of the default layout has a head).
    pub(super) fn agent_exited(&mut self, agent: u32, why: String) -> Option<Ending> {
        if self.agents.contains_key(&agent) || self.instance_of(agent).is_none() {
            return None;
        }
        tracing::info!(job = %self.job_id, agent, %why, "an agent could not start");
        Some(Ending::AgentNotStarted(format!("the agent could not start {why}")))
    }
}
