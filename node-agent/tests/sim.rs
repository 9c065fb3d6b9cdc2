//! End-to-end runs of the real `htc` with simulated executors (`--exec none|sleep`): the whole
//! scheduling path (leader, tree, agents, ledger) without task processes, at a scale this
//! machine could not run for real.

mod common;

use std::time::{Duration, Instant};

use common::{text, Dir};

fn status_json(d: &Dir) -> serde_json::Value {
    let o = d.htc(&["status", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn exec_none_runs_every_task_through_a_tree_of_many_agents() {
    let d = Dir::new("sim-none");
    let tasks: String = (1..=50_000).map(|i| format!("./never-started {i}\n")).collect();
    d.write("t.txt", tasks);
    // 200 agents > fan-out 32: relays, and agents sharing processes.
    let o = d.htc(&["run", "t.txt", "--exec", "none", "--agents", "200", "--cores-per-agent", "24", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    let s = status_json(&d);
    assert_eq!(s["counts"]["done"], 50_000, "{s}");
    assert!(s["leader_cpu_s"].as_f64().unwrap() > 0.0, "{s}");
    // No process ran: no task wrote output.
    let out = d.htc(&["output", &d.run_id(), "7"]);
    assert!(out.stdout.is_empty(), "{}", text(&out));
}

#[test]
fn exec_sleep_holds_cores_for_each_task_s_runtime() {
    let d = Dir::new("sim-sleep");
    // 64 tasks of 200 ms on 4 agents x 4 cores: 4 rounds, about 0.8 s.
    let tasks: String = (1..=64).map(|i| format!("[runtime=200ms] sleep-for {i}\n")).collect();
    d.write("t.txt", tasks);
    let t0 = Instant::now();
    let o = d.htc(&["run", "t.txt", "--exec", "sleep", "--agents", "4", "--cores-per-agent", "4", "-q"]);
    let took = t0.elapsed();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(status_json(&d)["counts"]["done"], 64);
    assert!(took >= Duration::from_millis(800), "{took:?}: tasks did not hold their cores");
}
