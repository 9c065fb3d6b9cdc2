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

/// How many tasks each agent ran, from the ledger's records.
fn tasks_per_agent(d: &Dir) -> std::collections::BTreeMap<u32, usize> {
    let l = htc::ledger::Ledger::open(&d.run_dir().join("ledger.mdb"), true).unwrap();
    let mut m = std::collections::BTreeMap::new();
    l.read()
        .unwrap()
        .for_each(|_, r| {
            assert_eq!(r.state(), htc::ledger::State::Done);
            *m.entry(r.agent).or_default() += 1;
        })
        .unwrap();
    m
}

#[test]
fn long_tasks_spread_over_every_agent_instead_of_queueing_at_the_first() {
    // 8 tasks of 3 s on 4 agents x 2 cores: one round on every agent. The first agent to ask
    // used to take all 8 (its prefetch is 32) and run them in 4 rounds.
    let d = Dir::new("sim-spread");
    let tasks: String = (1..=8).map(|i| format!("[runtime=3s] long {i}\n")).collect();
    d.write("t.txt", tasks);
    let o = d.htc(&["run", "t.txt", "--exec", "sleep", "--agents", "4", "--cores-per-agent", "2", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    let per_agent = tasks_per_agent(&d);
    assert_eq!(per_agent.values().copied().collect::<Vec<_>>(), vec![2, 2, 2, 2], "{per_agent:?}");
}
