//! Preemption: stopping lower-priority preemptible tasks for higher-priority work that no
//! agent can take, and for memory that a waiting task needs.

use super::*;

impl Core<'_> {
    /// Higher-priority work that no agent can take now (every one is busy) stops preemptible
    /// tasks of lower priority, lowest and newest first, one per waiting task; they run again
    /// later without using a retry. Tasks already handed to an agent are its executor's to
    /// preempt (it knows what waits in its queue).
    pub(super) fn preempt_for_waiting<E>(&mut self, t: &dyn Tasks<Error = E>, out: &mut Effects) -> Result<(), E> {
        if !self.preemption.any_to_stop() {
            return Ok(());
        }
        self.preempt_for_memory(t, out)?;
        let Some((p, waiting)) = self.top_waiting(t)? else { return Ok(()) };
        if self.agents.values().any(|a| a.alive && !a.drained && a.idle > 0) {
            return Ok(()); // an agent can take it: no need to stop anything
        }
        let n = (waiting as usize).min(64).saturating_sub(self.preemption.stopping());
        let victims: Vec<u64> = self.preemption.candidates(p).take(n).collect();
        let mut by_agent: HashMap<u32, Vec<u64>> = HashMap::new();
        for id in victims {
            if let Some(f) = self.in_flight.get(id) {
                self.preemption.stop(id, None);
                by_agent.entry(f.agent).or_default().push(id);
            }
        }
        for (agent, ids) in by_agent {
            tracing::info!(job = %self.job_id, agent, tasks = ?ids, priority = p, "preempting for higher-priority work");
            out.push(Effect::ToAgent(agent, ToAgent::Preempt(ids)));
        }
        Ok(())
    }

    /// Tasks waiting for memory or GPUs (the oldest few) stop preemptible tasks of lower
    /// priority on the agent where the fewest stops make room, which is then kept for them.
    fn preempt_for_memory<E>(&mut self, t: &dyn Tasks<Error = E>, out: &mut Effects) -> Result<(), E> {
        let waiting: Vec<u64> = self.mem.waiting_tasks().take(8).map(|n| n.task).collect();
        for w in waiting {
            let Some(r) = t.get(w)? else { continue };
            let stoppable: HashSet<u64> = self.preemption.candidates(r.shape().priority).collect();
            // Only what is stopped for this task makes room for it: room made for another
            // waiting task is that one's.
            let stopping = |id: u64| self.preemption.stopped_for(id) == Some(w);
            let may_stop = |id: u64| stoppable.contains(&id);
            let Some((agent, ids)) = self.mem.room_for(w, &may_stop, &stopping, self.now_us) else { continue };
            // A node kept for a task of the same or higher priority stays kept for it.
            if let Some(kept) = self.mem.reservation(agent).filter(|&k| k != w) {
                if t.get(kept)?.is_none_or(|k| k.shape().priority >= r.shape().priority) {
                    continue;
                }
            }
            self.mem.reserve_on(w, agent, self.now_us);
            if ids.is_empty() {
                continue;
            }
            for &id in &ids {
                self.preemption.stop(id, Some(w));
            }
            tracing::info!(job = %self.job_id, agent, tasks = ?ids, task = w, priority = r.shape().priority, "preempting to make room for a task waiting for memory or GPUs");
            out.push(Effect::ToAgent(agent, ToAgent::Preempt(ids)));
        }
        Ok(())
    }

    /// The highest priority of work waiting to be handed out (the partition's, the retries'),
    /// and how many tasks have it.
    pub(super) fn top_waiting<E>(&self, t: &dyn Tasks<Error = E>) -> Result<Option<(i16, u64)>, E> {
        let mut top = self.partition.top_priority();
        for &id in self.retry.iter().take(64) {
            let Some(r) = t.get(id)? else { continue };
            top = match top {
                Some((p, n)) if p == r.shape().priority => Some((p, n + 1)),
                Some((p, _)) if p > r.shape().priority => top,
                _ => Some((r.shape().priority, 1)),
            };
        }
        Ok(top)
    }
}
