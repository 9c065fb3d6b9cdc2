//! A hand-over (`--htc-join`): the run's leader went with its job, a joined job took the run
//! over from the replica, and that job's agents, which kept running what they held, come to the
//! new leader (`Hello.handover`). The replica records no dispatches, so every task not recorded
//! ended is pending here. The new leader therefore hands nothing out until each agent it expects
//! has said what it holds (or the wait is over), takes what they hold as in flight with them
//! (`adopt`), and records the results they bring for tasks it had as pending: none of it runs a
//! second time.

use super::*;

impl Core<'_> {
    /// The layout's heads, and `others` agents of other allocations, come from a hand-over
    /// holding tasks: nothing is handed out until each has said what it holds, or `wait_us`
    /// has passed.
    pub fn expecting_handover(mut self, wait_us: u64, others: usize) -> Self {
        let heads = self.layout.as_ref().map(|t| t.heads().to_vec()).unwrap_or_default();
        self.settling = Some(Settling::new(heads, others, self.now_us + wait_us));
        self
    }

    /// Whether the leader still waits for the agents of a hand-over.
    pub(super) fn settling(&self) -> bool {
        self.settling.is_some()
    }

    /// An agent back from a hand-over: placed as any joining head, then asked what it holds.
    /// One of another allocation (an id this leader's tree does not hold) stands as an instance
    /// of its own until its launcher attaches again keeping the ids (`keep_ids`). One this leader
    /// has no place for (here already, or a member of an instance) stops.
    pub(super) fn handed_over(&mut self, agent: u32, resources: (u32, u64, u32), hostname: String, out: &mut Effects) {
        let stray = self.layout.as_ref().is_some_and(|t| !t.holds(agent));
        if stray {
            let tree = Arc::make_mut(self.layout.as_mut().expect("checked"));
            tree.graft_at(agent, 1, 1, 1).expect("checked free");
            self.strays.insert(agent);
            self.turnout.expect_more(1);
            self.affinity.join(agent);
        }
        let Some(instance) = self.instance_of(agent).filter(|_| !self.agents.contains_key(&agent)) else {
            tracing::warn!(job = %self.job_id, agent, %hostname, "an agent this leader has no place for came from a hand-over");
            let reason = "the run's new leader has no place for this agent".to_string();
            out.push(Effect::stop(agent, Stop::Abort, reason));
            return;
        };
        tracing::info!(job = %self.job_id, agent, %hostname, "agent came back from the hand-over, with its tasks");
        self.turnout.joined();
        self.enroll(agent, instance, resources, hostname);
        self.adoptees.insert(agent);
        out.push(Effect::ToAgent(agent, ToAgent::Resync { seq: 0 }));
        self.resyncs.insert(agent, Vec::new());
        if stray {
            // A new instance: it gets a share of what is not handed out.
            self.replan();
        }
    }

    /// Whether `agent` came from a hand-over: what it holds or ran may be pending here.
    pub(super) fn is_adoptee(&self, agent: u32) -> bool {
        !self.adoptees.is_empty() && self.adoptees.contains(&agent)
    }

    /// Takes task `id`, which `agent` holds or ran, as in flight with it, where the ledger has it
    /// pending and nobody else holds it. Says whether it did.
    pub(super) fn adopt<E>(&mut self, t: &mut dyn Tasks<Error = E>, agent: u32, id: u64) -> Result<bool, E> {
        if self.in_flight.contains(id) {
            return Ok(false);
        }
        let Some(r) = t.get(id)? else { return Ok(false) };
        if r.state() != State::Pending {
            return Ok(false);
        }
        let Some((life, _)) = self.move_life(r.life(), Step::Dispatch) else { return Ok(false) };
        self.in_flight.insert(id, Flight { agent, life });
        if let Some(a) = self.agents.get_mut(&agent) {
            a.ahead_ms += r.shape().runtime_ms as u64 * r.shape().cores as u64;
        }
        if let Some(s) = self.settling.as_mut() {
            s.adopted_one();
        }
        Ok(true)
    }

    /// `agent` said what it holds: that is in flight with it now.
    pub(super) fn adopt_held<E>(&mut self, t: &mut dyn Tasks<Error = E>, agent: u32, held: &[u64]) -> Result<(), E> {
        let mut n = 0;
        for &id in held {
            n += self.adopt(t, agent, id)? as u64;
        }
        tracing::info!(job = %self.job_id, agent, held = held.len(), adopted = n, "tasks kept through the hand-over");
        let stray = self.strays.contains(&agent);
        if let Some(s) = self.settling.as_mut() {
            s.answered(agent, stray);
        }
        Ok(())
    }

    /// Ends the wait once every expected agent has said what it holds (or is lost), or the time
    /// is up; then work goes out.
    pub(super) fn settle<E>(&mut self, t: &mut dyn Tasks<Error = E>, out: &mut Effects) -> Result<(), E> {
        let Some(s) = self.settling.as_mut() else { return Ok(()) };
        let agents = &self.agents;
        s.forget(|a| agents.get(&a).is_some_and(|x| !x.alive));
        if !s.over(self.now_us) {
            return Ok(());
        }
        let s = self.settling.take().expect("checked above");
        tracing::info!(
            job = %self.job_id,
            back = self.adoptees.len(),
            adopted = s.adopted(),
            missing = s.missing(),
            "hand-over settled: work goes out"
        );
        self.dispatch_all(t, out)
    }
}
