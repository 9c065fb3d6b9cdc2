//! What this session has to show for itself: when it began and what was finished before, its
//! successes and the core time they ran, the results per report and their delays (what the
//! leader's cost per task depends on), the latest failures (for `htc watch`). A part of the
//! core's state of its own: it is told, it decides nothing.

use std::collections::VecDeque;

use htc_core::hist::{Hist, Summary};
use htc_core::task::{Counts, State};

use crate::live;

pub(super) struct Figures {
    started_us: u64,
    /// Tasks finished, and failed, before this session started.
    finished_start: u64,
    failed_start: u64,
    /// Tasks that succeeded in this session (black holes are judged against them), and the
    /// core-microseconds they ran: what a task costs, for a run that grows itself.
    oks: u64,
    ran_core_us: u64,
    /// Results per report, for `htc status`.
    report_sizes: Hist,
    /// How long after its end each result reached the leader, in microseconds.
    result_delays: Hist,
    /// The latest failed attempts, newest last.
    recent_failures: VecDeque<live::Failure>,
    /// Offers of work to every agent with credit (`dispatch_all`), for tests.
    pub(super) scans: u64,
}

impl Figures {
    /// A session that starts at `now_us` on a ledger with these counts.
    pub(super) fn new(now_us: u64, counts: &Counts) -> Figures {
        Figures {
            started_us: now_us,
            finished_start: counts.finished(),
            failed_start: counts.get(State::Failed),
            oks: 0,
            ran_core_us: 0,
            report_sizes: Hist::default(),
            result_delays: Hist::default(),
            recent_failures: VecDeque::new(),
            scans: 0,
        }
    }

    /// A report came, with `results` results.
    pub(super) fn report(&mut self, results: usize) {
        self.report_sizes.record(results as u64);
    }

    /// A result that ended at `end_us` reached the leader at `now_us`. Clocks of other nodes
    /// may differ: only what looks plausible counts.
    pub(super) fn result_arrived(&mut self, now_us: u64, end_us: u64) {
        if end_us > 0 && end_us <= now_us {
            self.result_delays.record(now_us - end_us);
        }
    }

    pub(super) fn succeeded(&mut self) {
        self.oks += 1;
    }

    /// A successful attempt ran `core_us` core-microseconds.
    pub(super) fn ran(&mut self, core_us: u64) {
        self.ran_core_us = self.ran_core_us.saturating_add(core_us);
    }

    pub(super) fn failure(&mut self, f: live::Failure) {
        if self.recent_failures.len() == live::RECENT_FAILURES {
            self.recent_failures.pop_front();
        }
        self.recent_failures.push_back(f);
    }

    pub(super) fn oks(&self) -> u64 {
        self.oks
    }

    /// Core-seconds a successful task ran, on average, once `at_least` have.
    pub(super) fn task_core_s(&self, at_least: u64) -> Option<f64> {
        (self.oks >= at_least).then(|| self.ran_core_us as f64 / 1e6 / self.oks as f64)
    }

    pub(super) fn started_us(&self) -> u64 {
        self.started_us
    }

    pub(super) fn finished_start(&self) -> u64 {
        self.finished_start
    }

    /// Tasks finished, and failed for good, in this session, by the counts now.
    pub(super) fn finished_since(&self, counts: &Counts) -> u64 {
        (counts.finished()).saturating_sub(self.finished_start)
    }

    pub(super) fn failed_since(&self, counts: &Counts) -> u64 {
        counts.get(State::Failed).saturating_sub(self.failed_start)
    }

    pub(super) fn report_sizes(&self) -> Summary {
        self.report_sizes.summary()
    }

    pub(super) fn result_delays(&self) -> Summary {
        self.result_delays.summary()
    }

    pub(super) fn recent_failures(&self) -> impl Iterator<Item = &live::Failure> {
        self.recent_failures.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(task: u64) -> live::Failure {
        live::Failure { task, line: 1, host: "n1".into(), at_us: 0, reason: "exit 1".into(), retrying: false }
    }

    #[test]
    fn only_the_latest_failures_are_kept_newest_last() {
        let mut f = Figures::new(0, &Counts::default());
        for t in 0..live::RECENT_FAILURES as u64 + 3 {
            f.failure(failure(t));
        }
        let kept: Vec<u64> = f.recent_failures().map(|x| x.task).collect();
        assert_eq!(kept.len(), live::RECENT_FAILURES);
        assert_eq!(kept.last(), Some(&(live::RECENT_FAILURES as u64 + 2)));
        assert_eq!(kept[0], 3);
    }

    #[test]
    fn a_task_s_cost_is_known_once_enough_succeeded_and_delays_from_the_future_do_not_count() {
        let mut f = Figures::new(0, &Counts::default());
        f.succeeded();
        f.ran(3_000_000);
        assert_eq!(f.task_core_s(2), None);
        f.succeeded();
        f.ran(1_000_000);
        assert_eq!(f.task_core_s(2), Some(2.0));
        f.result_arrived(100, 40);
        f.result_arrived(100, 400); // another node's clock ahead
        f.result_arrived(100, 0); // no end known
        assert_eq!(f.result_delays().n, 1);
    }
}
