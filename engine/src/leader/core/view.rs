//! What the core shows: progress, the live view that `htc watch` reads, and the figures that
//! `htc status` reports (report sizes, result delays, tasks moved back).

use super::*;

impl Core<'_> {
    /// Reports handled in this session and the results they carried.
    pub fn report_sizes(&self) -> Summary {
        self.figures.report_sizes()
    }

    /// How long results took from their end to the leader, in microseconds, in this session.
    pub fn result_delays(&self) -> Summary {
        self.figures.result_delays()
    }

    /// Tasks moved from an agent that was behind to idle slots, in this session.
    pub fn moved_back(&self) -> u64 {
        self.asking.recalls.moved
    }

    /// Pending tasks that wait for others (`after=`).
    pub fn blocked(&self) -> u64 {
        self.deps.waiting() as u64
    }

    pub fn progress(&self, now_us: u64) -> Progress {
        Progress {
            counts: self.counts,
            elapsed: std::time::Duration::from_micros(now_us.saturating_sub(self.figures.started_us())),
            finished_this_session: self.figures.finished_since(&self.counts),
            agents: self.agents.values().filter(|a| a.alive).count(),
            blocked: self.blocked(),
            joined_running: self.allocations.iter().filter(|a| a.stage == Stage::Running).count(),
        }
    }

    /// What `htc watch` shows: the counts, every instance, the latest failures.
    pub fn live_view(&self, now_us: u64, state: &str) -> live::View {
        let mut nodes: Vec<live::Node> = self
            .agents
            .iter()
            .map(|(&agent, a)| live::Node {
                agent,
                host: a.hostname.clone(),
                cores: a.cores,
                busy: if a.alive { a.busy } else { 0 },
                done: a.done,
                failed: a.failed,
                heard_us: a.heard_us,
                state: (if a.drained {
                    "drained"
                } else if a.alive {
                    "up"
                } else {
                    "lost"
                })
                .into(),
            })
            .collect();
        nodes.sort_by_key(|n| n.agent);
        live::View {
            job: self.job_id.clone(),
            now_us,
            session_start_us: self.figures.started_us(),
            state: state.into(),
            counts: self.counts,
            finished_start: self.figures.finished_start(),
            blocked: self.blocked(),
            nodes,
            failures: self.figures.recent_failures().cloned().collect(),
            allocations: self.allocations.iter().map(|a| self.allocation_view(a)).collect(),
        }
    }

    fn allocation_view(&self, a: &Allocation) -> live::Allocation {
        let tasks = self.agents.iter().filter(|(id, _)| a.agents.contains(id)).map(|(_, x)| x.done + x.failed).sum();
        live::Allocation {
            job: a.job.clone(),
            first_agent: a.agents.start,
            agents: a.agents.len() as u32,
            nodes: a.nodes,
            ends_us: a.ends_us.unwrap_or(0),
            state: a.stage.name().into(),
            tasks,
        }
    }
}
