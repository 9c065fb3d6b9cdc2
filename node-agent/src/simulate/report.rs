//! What `htc simulate` prints: text, or one JSON object (`--json`, `docs/simulate.md`).

use serde::Serialize;

use super::{SimConfig, SimReport};

/// The report as `htc simulate` prints it.
pub fn text(cfg: &SimConfig, r: &SimReport) -> String {
    let mut t = format!(
        "htc simulate: {} tasks on {} agents x {} cores in instances of {} ({}), latency {} us, \
         leader {:.2} us/report + {:.2} us/task\n\
         makespan     {:.3} s (virtual)\n\
         lower bound  {:.3} s ({:.1}% above)\n",
        r.tasks,
        cfg.agents,
        cfg.cores_per_agent,
        cfg.instance_agents,
        cfg.plan.plan.name(),
        cfg.latency_us,
        cfg.leader.per_report_us,
        cfg.leader.per_task_us,
        r.makespan_s,
        r.bound_s,
        r.above_bound() * 100.0,
    );
    if cfg.hide_hints {
        t += "  (runtime hints hidden from the run: each task lasts its hint, unannounced)\n";
    }
    if !cfg.faults.is_empty() {
        t += &format!(
            "faults       {}: {} tasks started again; {} were running and {} queued where the faults hit\n",
            cfg.faults.len(),
            r.reruns,
            r.running_at_faults,
            r.queued_at_faults
        );
    }
    if cfg.join_spread_us > 0 {
        let above = (r.makespan_s / r.bound_joined_s - 1.0) * 100.0;
        t += &format!(
            "  from joins {:.3} s ({above:.1}% above; each agent's cores counted from its join)\n",
            r.bound_joined_s
        );
    }
    t + &format!(
        "leader busy  {:.3} s\nfailed       {}\nmoved back   {} (queued tasks asked back for idle slots)\nloaded in    {:.2} s, planned in {:.2} s, simulated in {:.1} s ({} events)\n",
        r.leader_busy_s,
        r.failed,
        r.moved_back,
        r.load_s,
        r.plan_s,
        r.wall.as_secs_f64(),
        r.events
    )
}

/// The report as one JSON object (`--json`), in the order `docs/simulate.md` lists it: the
/// model, then the outcome. Virtual times to the microsecond, wall times to the millisecond.
#[derive(Serialize)]
struct Json<'a> {
    tasks: u64,
    agents: u32,
    cores_per_agent: u32,
    instance_agents: u32,
    partition: &'a str,
    latency_us: u64,
    leader_us_per_report: f64,
    leader_us_per_task: f64,
    makespan_s: f64,
    bound_s: f64,
    above_bound: f64,
    bound_joined_s: f64,
    leader_busy_s: f64,
    failed: u64,
    events: u64,
    moved_back: u64,
    faults: usize,
    reruns: u64,
    running_at_faults: u64,
    queued_at_faults: u64,
    hide_hints: bool,
    wall_s: f64,
    load_s: f64,
    plan_s: f64,
}

/// `v` to `places` decimals, as the JSON shows it.
fn rounded(v: f64, places: i32) -> f64 {
    let scale = 10f64.powi(places);
    (v * scale).round() / scale
}

pub fn json(cfg: &SimConfig, r: &SimReport) -> String {
    let us = |v: f64| rounded(v, 6);
    let ms = |v: f64| rounded(v, 3);
    let j = Json {
        tasks: r.tasks,
        agents: cfg.agents,
        cores_per_agent: cfg.cores_per_agent,
        instance_agents: cfg.instance_agents,
        partition: cfg.plan.plan.name(),
        latency_us: cfg.latency_us,
        leader_us_per_report: cfg.leader.per_report_us,
        leader_us_per_task: cfg.leader.per_task_us,
        makespan_s: us(r.makespan_s),
        bound_s: us(r.bound_s),
        above_bound: us(r.above_bound()),
        bound_joined_s: us(r.bound_joined_s),
        leader_busy_s: us(r.leader_busy_s),
        failed: r.failed,
        events: r.events,
        moved_back: r.moved_back,
        faults: cfg.faults.len(),
        reruns: r.reruns,
        running_at_faults: r.running_at_faults,
        queued_at_faults: r.queued_at_faults,
        hide_hints: cfg.hide_hints,
        wall_s: ms(r.wall.as_secs_f64()),
        load_s: ms(r.load_s),
        plan_s: ms(r.plan_s),
    };
    serde_json::to_string(&j).expect("a struct of numbers and strings serializes") + "\n"
}
