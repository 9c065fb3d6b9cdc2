//! A run that grows itself (`--htc-grow=MAX_JOBS[:NODES[:TIME]]`): while the work left is more
//! than the run's allocations can finish in their time, the leader submits another allocation
//! that joins the run (`sbatch --htc-join`), never more than MAX_JOBS of them pending or running,
//! and none once the tail is in sight. Pure: fed the run's situation with the time, it answers
//! whether to submit and why; the leader's driver submits and says what came of it.

use std::collections::BTreeMap;

/// The user's bound and shape of the allocations a run may submit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrowSpec {
    /// Grown jobs pending or running at once, at most.
    pub max_jobs: u32,
    /// Nodes of each (default 1).
    pub nodes: u32,
    /// Each one's time limit in minutes; `None`: the run's own job's.
    pub minutes: Option<u64>,
}

pub const MAX_JOBS_MAX: u32 = 1000;
pub const NODES_MAX: u32 = 100_000;

impl GrowSpec {
    /// `MAX_JOBS[:NODES[:TIME]]`, TIME as sbatch writes it (`MM`, `MM:SS`, `HH:MM:SS`, `D-HH`,
    /// `D-HH:MM`, `D-HH:MM:SS`).
    pub fn parse(s: &str) -> Result<GrowSpec, String> {
        let mut parts = s.trim().splitn(3, ':');
        let count = |what: &str, v: Option<&str>, max: u32, default: u32| -> Result<u32, String> {
            match v {
                None => Ok(default),
                Some(v) => match v.parse::<u32>() {
                    Ok(n) if (1..=max).contains(&n) => Ok(n),
                    _ => Err(format!("'{v}' is not a number of {what} (1 to {max})")),
                },
            }
        };
        let max_jobs = count("jobs", Some(parts.next().unwrap_or_default()), MAX_JOBS_MAX, 1)?;
        let nodes = count("nodes", parts.next(), NODES_MAX, 1)?;
        let minutes = parts.next().map(slurm_minutes).transpose()?;
        Ok(GrowSpec { max_jobs, nodes, minutes })
    }

    /// As `parse` reads it.
    pub fn to_arg(&self) -> String {
        match self.minutes {
            Some(m) => format!("{}:{}:{}", self.max_jobs, self.nodes, m),
            None => format!("{}:{}", self.max_jobs, self.nodes),
        }
    }
}

/// A Slurm time limit in whole minutes (rounded up), at least one.
fn slurm_minutes(t: &str) -> Result<u64, String> {
    let bad = || format!("'{t}' is not a time limit (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS)");
    let (days, rest) = match t.split_once('-') {
        Some((d, r)) => (Some(d.parse::<u64>().map_err(|_| bad())?), r),
        None => (None, t),
    };
    let f: Vec<u64> = rest.split(':').map(|x| x.parse::<u64>().map_err(|_| bad())).collect::<Result<_, _>>()?;
    // Checked: a time written with absurd numbers is refused, not wrapped into a wrong one.
    let sum = |parts: &[(u64, u64)]| parts.iter().try_fold(0u64, |t, &(v, unit)| t.checked_add(v.checked_mul(unit)?));
    let secs = match (days, f.as_slice()) {
        (None, [m]) => sum(&[(*m, 60)]),
        (None, [m, s]) => sum(&[(*m, 60), (*s, 1)]),
        (None, [h, m, s]) => sum(&[(*h, 3600), (*m, 60), (*s, 1)]),
        (Some(d), [h]) => sum(&[(d, 86_400), (*h, 3600)]),
        (Some(d), [h, m]) => sum(&[(d, 86_400), (*h, 3600), (*m, 60)]),
        (Some(d), [h, m, s]) => sum(&[(d, 86_400), (*h, 3600), (*m, 60), (*s, 1)]),
        _ => return Err(bad()),
    }
    .ok_or_else(bad)?;
    if secs == 0 {
        return Err(bad());
    }
    Ok(secs.div_ceil(60))
}

/// What the run looks like now, as the leader sees it.
#[derive(Debug, Clone, Default)]
pub struct Situation {
    pub now_us: u64,
    /// Tasks not finished (pending, or in flight).
    pub tasks_left: u64,
    /// Mean core-seconds per task, as measured (or hinted); `None` before the run knows.
    pub task_core_s: Option<f64>,
    /// Allocations working on the run now: their cores and when each must be gone.
    pub live: Vec<(u64, Option<u64>)>,
    /// Jobs that joined the run (allocations' job ids), to tell grown jobs that arrived.
    pub joined: Vec<String>,
    /// Cores of one node, for what a grown job will bring.
    pub cores_per_node: u64,
    /// The run's own job's time limit in minutes, for grown jobs without a TIME.
    pub own_minutes: u64,
    /// Other jobs wait for nodes (pending for resources or priority, not grown by this run):
    /// the run takes no more nodes, and gives back those it grew.
    pub others_waiting: bool,
    /// How long an open run has had nothing to do (no task unfinished, no add); `None` while it
    /// has, or for a run that is not open (it ends when it has nothing left).
    pub idle_us: Option<u64>,
}

/// What the leader should do now.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Submit one allocation of `nodes` nodes for `minutes`; `reason` for the log.
    Submit {
        nodes: u32,
        minutes: u64,
        reason: String,
    },
    Wait,
}

/// A grown job's life as the grower sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Grown {
    /// Submitted; not in the run yet.
    Pending,
    /// Its agents joined the run.
    Joined,
    /// Joined and left, or ended without joining.
    Over,
}

/// Decides when to submit; remembers what it submitted.
#[derive(Debug, Clone)]
pub struct Grower {
    spec: GrowSpec,
    jobs: BTreeMap<String, Grown>,
    /// When it last submitted (or a submission failed): one submission per `quiet_us`, so
    /// that a job just submitted is counted before the next is considered.
    last_us: Option<u64>,
    /// The least time between two submissions: [`QUIET_US`] unless the site says otherwise.
    quiet_us: u64,
    /// The site's limits refused a submission while this many grown jobs were active: none is
    /// asked for again until fewer are (one of them ended, which may make room under a limit
    /// such as MaxSubmitJobsPerUser), so a refusal is never asked again in a loop.
    refused_at: Option<u32>,
}

/// The least time between two submissions, by default: one grown job is counted in the queue
/// before the next is considered, and a run's submissions stay a trickle to the controller.
pub const QUIET_US: u64 = 30_000_000;

/// How long an open run may have nothing to do before its grown jobs go.
pub const IDLE_GRACE_US: u64 = 60_000_000;

impl Grower {
    pub fn new(spec: GrowSpec) -> Grower {
        Grower { spec, jobs: BTreeMap::new(), last_us: None, quiet_us: QUIET_US, refused_at: None }
    }

    /// With another least time between two submissions (the site's `grow_gap_s`).
    pub fn with_quiet(self, quiet_us: u64) -> Grower {
        Grower { quiet_us, ..self }
    }

    /// A grown job was submitted as `job`.
    pub fn submitted(&mut self, job: String, now_us: u64) {
        self.jobs.insert(job, Grown::Pending);
        self.last_us = Some(now_us);
    }

    /// A submission failed: try again after the quiet time.
    pub fn failed(&mut self, now_us: u64) {
        self.last_us = Some(now_us);
    }

    /// The site's limits refused a submission (`refused_by_limit`): none again until one of the
    /// grown jobs active now ends. True the first time (while not already held back), to be
    /// said once.
    pub fn refused(&mut self, now_us: u64) -> bool {
        self.last_us = Some(now_us);
        let first = self.refused_at.is_none();
        self.refused_at = Some(self.active());
        first
    }

    /// A grown job ended (its allocation left the run, or it never came).
    pub fn ended(&mut self, job: &str) {
        if let Some(g) = self.jobs.get_mut(job) {
            *g = Grown::Over;
        }
    }

    /// Grown jobs in the run that should leave it now: all of them while other jobs wait for
    /// nodes (a grown job holds nodes only while nobody else wants them), and when an open run
    /// has had nothing to do for [`IDLE_GRACE_US`] (a grown job holds nodes only while there is
    /// work for them; the grace keeps them across the pause between two waves of adds).
    pub fn yielding(&self, s: &Situation) -> Vec<String> {
        let idle = s.idle_us.is_some_and(|t| t >= IDLE_GRACE_US);
        if !s.others_waiting && !idle {
            return Vec::new();
        }
        self.jobs.iter().filter(|(j, g)| **g == Grown::Joined && s.joined.contains(j)).map(|(j, _)| j.clone()).collect()
    }

    /// Whether `job` is one this run grew.
    pub fn grew(&self, job: &str) -> bool {
        self.jobs.contains_key(job)
    }

    /// Grown jobs submitted and not joined yet: cancelled when the run ends.
    pub fn pending(&self) -> Vec<String> {
        self.jobs.iter().filter(|(_, g)| **g == Grown::Pending).map(|(j, _)| j.clone()).collect()
    }

    fn active(&self) -> u32 {
        self.jobs.values().filter(|g| **g != Grown::Over).count() as u32
    }

    /// Whether to submit now, and why (or why not, for the log: `Wait` needs no reason).
    pub fn decide(&mut self, s: &Situation) -> Decision {
        for job in &s.joined {
            if let Some(g) = self.jobs.get_mut(job).filter(|g| **g == Grown::Pending) {
                *g = Grown::Joined;
            }
        }
        if self.refused_at.is_some_and(|n| self.active() < n) {
            self.refused_at = None;
        }
        if s.others_waiting
            || self.refused_at.is_some()
            || self.active() >= self.spec.max_jobs
            || self.last_us.is_some_and(|t| s.now_us < t + self.quiet_us)
        {
            return Decision::Wait;
        }
        let Some(per_task) = s.task_core_s else { return Decision::Wait };
        let work = s.tasks_left as f64 * per_task;
        let minutes = self.spec.minutes.unwrap_or(s.own_minutes).max(1);
        // What the live allocations can do before they must go, and what the pending ones will
        // (as if they started now: the safe side, since a late start only means a later tail).
        let live: f64 = s
            .live
            .iter()
            .map(|&(cores, end)| cores as f64 * end.map_or(f64::INFINITY, |e| e.saturating_sub(s.now_us) as f64 / 1e6))
            .sum();
        let pending = self.jobs.values().filter(|g| **g == Grown::Pending).count() as f64;
        let coming = pending * (self.spec.nodes as u64 * s.cores_per_node.max(1)) as f64 * minutes as f64 * 60.0;
        if work <= live + coming {
            return Decision::Wait;
        }
        let reason = format!(
            "{} tasks left (~{:.0} core-s) are more than the run's allocations can do in their time (~{:.0} core-s{})",
            s.tasks_left,
            work,
            live + coming,
            if pending > 0.0 { format!(", {pending} job(s) pending among them") } else { String::new() }
        );
        Decision::Submit { nodes: self.spec.nodes, minutes, reason }
    }
}

/// Whether sbatch's refusal (its message) is one of the site's limits: an association's or a
/// QOS's (MaxSubmitJobs and the like), or an account or QOS the user may not use. Asking again
/// changes nothing until one of the user's jobs ends, unlike a controller that did not answer.
pub fn refused_by_limit(why: &str) -> bool {
    const SIGNS: [&str; 6] =
        ["MaxSubmitJob", "violates accounting/QOS policy", "Invalid account", "Invalid qos", "QOSMax", "AssocMax"];
    SIGNS.iter().any(|s| why.contains(s))
}

/// A grown job's shape: nodes, and its time limit in minutes.
pub type Shape = (u32, u64);

/// The shortest a grown job is cut to when fitting a hole in the schedule: a shorter one spends
/// much of its time starting its agents and leaving.
pub const MIN_FIT_MINUTES: u64 = 5;

/// Shapes to ask the scheduler about (`sbatch --test-only`) for a grown job of `asked`: the
/// asked one first, then half its time, half its nodes, and both (never shorter than
/// `MIN_FIT_MINUTES` unless asked for less): a smaller job may fit a hole the asked one does
/// not (a node free until a reservation, a limit on a partition's time).
pub fn fit_shapes(asked: Shape) -> Vec<Shape> {
    let (n, m) = asked;
    let half_m = (m / 2).max(MIN_FIT_MINUTES.min(m));
    let half_n = (n / 2).max(1);
    let mut v = vec![asked];
    for s in [(n, half_m), (half_n, m), (half_n, half_m)] {
        if !v.contains(&s) {
            v.push(s);
        }
    }
    v
}

/// Of the shapes asked about and when the scheduler says each would start (seconds on its
/// clock; `None`: it would not say), the one to submit: the earliest to start; among those that
/// start within `slack_s` of it, the most node-minutes (the first such in `starts` on a tie, so
/// the asked shape when all start alike). `None` when no answer came.
pub fn pick_fit(starts: &[(Shape, Option<u64>)], slack_s: u64) -> Option<Shape> {
    let earliest = starts.iter().filter_map(|(_, s)| *s).min()?;
    let soon = starts.iter().filter(|(_, s)| s.is_some_and(|s| s <= earliest + slack_s));
    soon.fold(None, |best: Option<Shape>, &(s, _)| match best {
        Some((n, m)) if n as u64 * m >= s.0 as u64 * s.1 => best,
        _ => Some(s),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_option_reads_jobs_nodes_and_time() {
        assert_eq!(GrowSpec::parse("3"), Ok(GrowSpec { max_jobs: 3, nodes: 1, minutes: None }));
        assert_eq!(GrowSpec::parse("3:2"), Ok(GrowSpec { max_jobs: 3, nodes: 2, minutes: None }));
        assert_eq!(GrowSpec::parse("3:1:30"), Ok(GrowSpec { max_jobs: 3, nodes: 1, minutes: Some(30) }));
        assert_eq!(GrowSpec::parse("3:1:1:30:00").unwrap().minutes, Some(90));
        assert_eq!(GrowSpec::parse("3:1:2-12").unwrap().minutes, Some(2 * 1440 + 720));
        assert_eq!(GrowSpec::parse("3:1:0:30").unwrap().minutes, Some(1), "30 s rounds up to a minute");
        assert!(GrowSpec::parse("0").unwrap_err().contains("number of jobs"));
        assert!(GrowSpec::parse("").unwrap_err().contains("number of jobs"));
        assert!(GrowSpec::parse("2:x").unwrap_err().contains("'x' is not a number of nodes"));
        assert!(GrowSpec::parse("2:1:soon").unwrap_err().contains("not a time limit"));
        assert!(GrowSpec::parse("2:1:0").unwrap_err().contains("not a time limit"));
        assert!(GrowSpec::parse("1:1:999999999999999-1").unwrap_err().contains("not a time limit"), "no overflow");
        assert!(GrowSpec::parse("1:1:999999999999999999").unwrap_err().contains("not a time limit"));
        let s = GrowSpec::parse("4:2:45").unwrap();
        assert_eq!(GrowSpec::parse(&s.to_arg()), Ok(s));
    }

    const S: u64 = 1_000_000;

    /// One node of 4 cores with 10 minutes left; tasks of 6 core-seconds.
    fn situation(now_s: u64, tasks_left: u64, joined: &[&str]) -> Situation {
        Situation {
            now_us: now_s * S,
            tasks_left,
            task_core_s: Some(6.0),
            live: vec![(4, Some(600 * S))],
            joined: joined.iter().map(|j| j.to_string()).collect(),
            cores_per_node: 4,
            own_minutes: 10,
            others_waiting: false,
            idle_us: None,
        }
    }

    #[test]
    fn the_site_s_gap_between_two_submissions_replaces_the_default() {
        let mut g = Grower::new(GrowSpec { max_jobs: 3, nodes: 1, minutes: Some(10) }).with_quiet(5 * S);
        assert!(matches!(g.decide(&situation(0, 1000, &[])), Decision::Submit { .. }));
        g.submitted("101".into(), 0);
        assert_eq!(g.decide(&situation(4, 1000, &[])), Decision::Wait, "within the site's 5 s");
        assert!(matches!(g.decide(&situation(5, 1000, &[])), Decision::Submit { .. }), "after 5 s, not 30");
    }

    #[test]
    fn it_submits_while_the_work_outgrows_the_allocations_and_never_more_than_max_jobs() {
        let mut g = Grower::new(GrowSpec { max_jobs: 2, nodes: 1, minutes: Some(10) });
        // 1,000 tasks × 6 s = 6,000 core-s; the node can do 4 × 600 = 2,400 in its time.
        let d = g.decide(&situation(0, 1000, &[]));
        assert!(
            matches!(&d, Decision::Submit { nodes: 1, minutes: 10, reason } if reason.contains("1000 tasks left")),
            "{d:?}"
        );
        g.submitted("101".into(), 0);
        assert_eq!(g.decide(&situation(10, 1000, &[])), Decision::Wait, "quiet after a submission");
        // The pending job counts as 2,400 more: 4,800 < 6,000, so a second one.
        assert!(matches!(g.decide(&situation(31, 1000, &[])), Decision::Submit { .. }));
        g.submitted("102".into(), 31);
        // Two active: the bound, however much work is left.
        assert_eq!(g.decide(&situation(100, 100_000, &["101"])), Decision::Wait);
        // One ends: room for another.
        g.ended("101");
        assert!(matches!(g.decide(&situation(200, 100_000, &["102"])), Decision::Submit { .. }));
    }

    #[test]
    fn a_refusal_by_the_site_s_limits_is_not_asked_again_until_a_grown_job_ends() {
        let mut g = Grower::new(GrowSpec { max_jobs: 3, nodes: 1, minutes: Some(10) });
        assert!(matches!(g.decide(&situation(0, 100_000, &[])), Decision::Submit { .. }));
        g.submitted("101".into(), 0);
        assert!(matches!(g.decide(&situation(31, 100_000, &["101"])), Decision::Submit { .. }));
        assert!(g.refused(31), "the first refusal is said");
        // Long after the quiet time, with work to spare and room under max_jobs: nothing.
        for t in [62, 600, 6_000] {
            assert_eq!(g.decide(&situation(t, 100_000, &["101"])), Decision::Wait, "at {t} s");
        }
        // 101 ends: its place under the limit may be free again; one more try.
        g.ended("101");
        assert!(matches!(g.decide(&situation(6_001, 100_000, &[])), Decision::Submit { .. }));
        assert!(g.refused(6_001), "held back again: said again, once");
        assert!(!g.refused(6_002), "while held back, not said again");
        assert_eq!(g.decide(&situation(9_000, 100_000, &[])), Decision::Wait);
        // A plain failure (no limit) is tried again after the quiet time.
        let mut g = Grower::new(GrowSpec { max_jobs: 3, nodes: 1, minutes: Some(10) });
        g.failed(0);
        assert!(matches!(g.decide(&situation(31, 100_000, &[])), Decision::Submit { .. }));
    }

    #[test]
    fn the_site_s_limits_are_told_from_other_refusals() {
        for why in [
            "sbatch: error: QOSMaxSubmitJobPerUserLimit\nsbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, user's size and/or time limits)",
            "sbatch: error: AssocMaxSubmitJobLimit",
            "sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified",
            "sbatch: error: Batch job submission failed: Invalid qos specification",
        ] {
            assert!(refused_by_limit(why), "{why}");
        }
        for why in [
            "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)",
            "sbatch: error: Batch job submission failed: Requested node configuration is not available",
            "running sbatch: No such file or directory (os error 2)",
        ] {
            assert!(!refused_by_limit(why), "{why}");
        }
    }

    #[test]
    fn none_once_the_tail_is_in_sight_nor_before_runtimes_are_known() {
        let mut g = Grower::new(GrowSpec { max_jobs: 5, nodes: 1, minutes: None });
        // 300 tasks × 6 s = 1,800 core-s: the live node finishes them in time.
        assert_eq!(g.decide(&situation(0, 300, &[])), Decision::Wait);
        let unknown = Situation { task_core_s: None, ..situation(0, 1_000_000, &[]) };
        assert_eq!(g.decide(&unknown), Decision::Wait, "no estimate, no submission");
        // An allocation without an end can do anything in its time: nothing to add.
        let endless = Situation { live: vec![(4, None)], ..situation(0, 1_000_000, &[]) };
        assert_eq!(g.decide(&endless), Decision::Wait);
    }

    #[test]
    fn a_joined_grown_job_is_counted_by_its_cores_not_as_pending() {
        let mut g = Grower::new(GrowSpec { max_jobs: 3, nodes: 1, minutes: Some(10) });
        g.submitted("7".into(), 0);
        assert_eq!(g.pending(), ["7"]);
        let mut s = situation(60, 1000, &["7"]);
        s.live.push((4, Some(660 * S)));
        // Live: 4 × 540 + 4 × 600 = 4,560 < 6,000: another.
        assert!(matches!(g.decide(&s), Decision::Submit { .. }));
        assert!(g.pending().is_empty(), "7 joined");
    }

    #[test]
    fn while_other_jobs_wait_for_nodes_it_submits_nothing_and_its_grown_jobs_leave() {
        let mut g = Grower::new(GrowSpec { max_jobs: 3, nodes: 1, minutes: Some(10) });
        g.submitted("7".into(), 0);
        let calm = situation(60, 100_000, &["7"]);
        assert!(g.yielding(&calm).is_empty());
        let busy = Situation { others_waiting: true, ..situation(61, 100_000, &["7"]) };
        assert_eq!(g.decide(&busy), Decision::Wait, "however much work is left");
        assert_eq!(g.yielding(&busy), ["7"]);
        assert!(g.grew("7") && !g.grew("8"));
        // They went; once nobody waits, it grows again.
        g.ended("7");
        assert!(g.yielding(&busy).is_empty());
        assert!(matches!(g.decide(&situation(200, 100_000, &["7"])), Decision::Submit { .. }));
    }

    #[test]
    fn an_open_run_idle_past_the_grace_lets_its_grown_jobs_go() {
        let mut g = Grower::new(GrowSpec { max_jobs: 3, nodes: 1, minutes: Some(10) });
        g.submitted("7".into(), 0);
        g.submitted("8".into(), 0);
        let idle = |us| Situation { idle_us: Some(us), ..situation(60, 0, &["7"]) };
        assert_eq!(g.decide(&idle(IDLE_GRACE_US)), Decision::Wait, "no work, no growth");
        assert!(g.yielding(&idle(IDLE_GRACE_US - 1)).is_empty(), "a pause between waves keeps them");
        assert_eq!(g.yielding(&idle(IDLE_GRACE_US)), ["7"], "8 has not joined: nothing to let go");
    }

    #[test]
    fn a_grown_job_is_cut_to_the_shape_that_starts_soonest() {
        assert_eq!(fit_shapes((4, 60)), [(4, 60), (4, 30), (2, 60), (2, 30)]);
        assert_eq!(fit_shapes((1, 8)), [(1, 8), (1, 5)], "never shorter than 5 min");
        assert_eq!(fit_shapes((1, 3)), [(1, 3)], "one asked for less stays as asked");
        // All start alike: the asked shape.
        let alike = [((4, 60), Some(100)), ((4, 30), Some(100)), ((2, 60), Some(130)), ((2, 30), None)];
        assert_eq!(pick_fit(&alike, 60), Some((4, 60)));
        // A hole of half an hour on 4 nodes now; 4 nodes for an hour only in an hour.
        let hole = [((4, 60), Some(3_700)), ((4, 30), Some(100)), ((2, 60), Some(3_700)), ((2, 30), Some(100))];
        assert_eq!(pick_fit(&hole, 60), Some((4, 30)));
        // Two nodes now for an hour, four only later: the more node-minutes among the soonest.
        let narrow = [((4, 60), Some(5_000)), ((4, 30), Some(5_000)), ((2, 60), Some(100)), ((2, 30), Some(100))];
        assert_eq!(pick_fit(&narrow, 60), Some((2, 60)));
        assert_eq!(pick_fit(&[((1, 10), None)], 60), None);
    }
}
