//! Allocations that join a running run (`htc run --join`): the real `htc` and `htc-agent`
//! binaries, a leader and the agents of a second command working on one run.

use crate::common;
use common::*;
use std::collections::HashMap;
use std::time::Duration;

/// Agent of each attempt, by task id, from `htc log --format json`.
fn attempts(d: &Dir, run: &str) -> Vec<(u64, u64)> {
    let o = d.htc(&["log", run, "--format", "json"]);
    assert!(o.status.success(), "{}", text(&o));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| {
            let num = |k: &str| {
                let at = l.find(&format!("\"{k}\":")).unwrap_or_else(|| panic!("no {k} in {l}")) + k.len() + 3;
                l[at..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse::<u64>().unwrap()
            };
            (num("Seq"), num("Agent"))
        })
        .collect()
}

#[test]
fn agents_that_join_a_running_run_share_its_tasks_and_each_task_runs_once() {
    let d = Dir::new("join-share");
    let n = 300;
    d.write("t.txt", "sleep 0.05\n".repeat(n));
    let mut lead = d.spawn_htc(&["run", "t.txt", "--agents", "1", "--cores-per-agent", "1", "-q"], &[]);
    // Alone on one core the run takes 15 s: the join comes as soon as the leader is there.
    assert!(wait_for(|| d.leader_listens(), Duration::from_secs(30)));
    let run = d.run_dir();
    let join = d.htc(&["run", "--join", run.to_str().unwrap(), "--agents", "2", "--cores-per-agent", "2"]);
    assert!(join.status.success(), "{}", text(&join));
    assert!(text(&join).contains("joined run"), "{}", text(&join));
    let status = lead.wait().unwrap();
    assert!(status.success(), "the leader: {status:?}");
    assert!(!run.join("leader.addr").exists(), "nobody may join a finished run");
    let runs = attempts(&d, run.to_str().unwrap());
    let mut per_task: HashMap<u64, u32> = HashMap::new();
    let mut per_agent: HashMap<u64, u32> = HashMap::new();
    for (task, agent) in runs {
        *per_task.entry(task).or_default() += 1;
        *per_agent.entry(agent).or_default() += 1;
    }
    assert_eq!(per_task.len(), n, "every task ran");
    assert!(per_task.values().all(|&c| c == 1), "each exactly once");
    // The joined agents are 1 and 2, with four cores to the leader's agent's one.
    let joined = per_agent.get(&1).copied().unwrap_or(0) + per_agent.get(&2).copied().unwrap_or(0);
    assert!(joined as usize > n / 2, "the joined agents ran most of the tasks: {per_agent:?}");
    // Their logs are named and written by their ids in the run, after the leader's agent 0.
    let mut logs: Vec<String> = std::fs::read_dir(run.join("log-1"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    logs.sort();
    assert_eq!(logs, ["agent-1.log", "agent-2.log"], "{logs:?}");
    let log = std::fs::read_to_string(run.join("log-1/agent-1.log")).unwrap();
    let first = log.lines().next().unwrap_or_default();
    assert!(first.contains("memory for tasks agent=1 "), "agent 1's log starts as another's: {log}");
}

#[test]
fn joins_that_cannot_be_taken_are_refused_and_the_run_goes_on_unharmed() {
    let d = Dir::new("join-refused");
    // A finished run has no leader to join.
    d.write("one.txt", "true\n");
    let o = d.htc(&["run", "one.txt", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    let done = d.run_dir();
    let o = d.htc(&["run", "--join", done.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("the run is not running"), "{}", text(&o));
    std::fs::remove_dir_all(d.path(".htc")).unwrap();

    // A running run, its tasks held at a gate.
    let gate = d.path("gate");
    d.write("t.txt", format!("while [ ! -e {} ]; do sleep 0.05; done\n", gate.display()).repeat(4));
    let mut lead = d.spawn_htc(&["run", "t.txt", "--agents", "1", "--cores-per-agent", "2", "-q"], &[]);
    assert!(wait_for(|| d.leader_listens(), Duration::from_secs(30)));
    let run = d.run_dir();
    // A run directory that points at the leader but holds another secret.
    let fake = d.path("fake");
    std::fs::create_dir_all(&fake).unwrap();
    std::fs::copy(run.join("leader.addr"), fake.join("leader.addr")).unwrap();
    std::fs::write(fake.join("secret"), [7u8; 32]).unwrap();
    std::fs::write(fake.join("ledger.mdb"), b"").unwrap();
    let o = d.htc(&["run", "--join", fake.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("did not accept this run's secret"), "{}", text(&o));
    // A run of another cluster.
    let addr = std::fs::read_to_string(run.join("leader.addr")).unwrap();
    std::fs::write(run.join("leader.addr"), addr.replace("cluster=", "cluster=elsewhere")).unwrap();
    let o = d.htc(&["run", "--join", run.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("on cluster 'elsewhere'"), "{}", text(&o));
    // The run was not disturbed: its tasks end once the gate opens.
    d.write("gate", "");
    let status = lead.wait().unwrap();
    assert!(status.success(), "the leader: {status:?}");
    let o = d.htc(&["status", run.to_str().unwrap()]);
    assert!(text(&o).contains("done=4 failed=0"), "{}", text(&o));
}

#[test]
fn joined_agents_leave_in_good_order_at_their_time_limit_and_the_run_finishes_without_them() {
    let d = Dir::new("join-leave");
    let n = 200;
    d.write("t.txt", "sleep 0.05\n".repeat(n));
    let lead = d.spawn_htc(&["run", "t.txt", "--agents", "1", "--cores-per-agent", "1", "-q"], &[]);
    assert!(wait_for(|| d.leader_listens(), Duration::from_secs(30)));
    let run = d.run_dir();
    // Two seconds of work, then they must go: they hand back what is queued and end.
    let join = d.htc(&[
        "run",
        "--join",
        run.to_str().unwrap(),
        "--agents",
        "1",
        "--cores-per-agent",
        "2",
        "--time-limit",
        "2",
    ]);
    assert!(join.status.success(), "{}", text(&join));
    let led = lead.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&led.stderr).into_owned();
    assert!(led.status.success(), "{said}");
    assert!(!said.contains("agent lost"), "leaving at its time is no loss: {said}");
    let status = d.htc(&["status", run.to_str().unwrap()]);
    assert!(text(&status).contains(&format!("done={n} failed=0")), "{}", text(&status));
    assert!(text(&status).contains("joined:   job local-"), "the joined job is listed: {}", text(&status));
    let runs = attempts(&d, run.to_str().unwrap());
    let mut per_task: HashMap<u64, u32> = HashMap::new();
    runs.iter().for_each(|&(t, _)| *per_task.entry(t).or_default() += 1);
    assert!(per_task.values().all(|&c| c == 1), "leaving re-ran nothing: {} attempts", runs.len());
    assert!(runs.iter().any(|&(_, a)| a == 1), "the joined agent ran tasks before it left");
}
