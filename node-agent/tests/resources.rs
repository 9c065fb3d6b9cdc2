//! Resources end to end with real processes: tasks that really hold memory (perl touching the
//! pages it asks for), agents with a memory budget, and the policies side by side.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{text, Dir};

/// A command that holds `mb` MiB resident for `secs`, marked so the sampler can find it.
fn hold(mb: u32, secs: f64, mark: &str) -> String {
    format!("perl -e 'my $x; vec($x, ({mb} << 20) - 1, 8) = 1; select(undef, undef, undef, {secs})' {mark}")
}

/// The largest sum of resident memory of the processes whose command line holds `mark`,
/// sampled every 10 ms until `stop`.
fn sample_peak_mb(mark: String, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut peak = 0;
        while !stop.load(Ordering::Relaxed) {
            let mut kb = 0;
            for e in std::fs::read_dir("/proc").unwrap().flatten() {
                let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else { continue };
                if !cmd.windows(mark.len()).any(|w| w == mark.as_bytes()) {
                    continue;
                }
                let status = std::fs::read_to_string(e.path().join("status")).unwrap_or_default();
                kb += status
                    .lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                    .unwrap_or(0);
            }
            peak = peak.max(kb / 1024);
            std::thread::sleep(Duration::from_millis(10));
        }
        peak
    })
}

struct Row {
    task: u64,
    start: f64,
    end: f64,
    exit: i64,
}

fn rows(d: &Dir, run: &str) -> Vec<Row> {
    let o = d.htc(&["log", run, "--format", "json"]);
    assert!(o.status.success(), "{}", text(&o));
    String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let start = v["Starttime"].as_f64().unwrap();
            Row {
                task: v["Seq"].as_u64().unwrap(),
                start,
                end: start + v["JobRuntime"].as_f64().unwrap(),
                exit: v["Exitval"].as_i64().unwrap(),
            }
        })
        .collect()
}

/// The run's `htc log --format json` rows.
fn json_rows(d: &Dir) -> Vec<serde_json::Value> {
    let o = d.htc(&["log", &d.run_id(), "--format", "json"]);
    assert!(o.status.success(), "{}", text(&o));
    String::from_utf8(o.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// Runs the mixed file under `policy`; returns the rows and the sampled peak.
fn mixed_run(policy: &str) -> (Vec<Row>, u64) {
    let d = Dir::new(&format!("mixed-memory-{policy}"));
    let mark = format!("htc-mem-{}-{policy}", std::process::id());
    // Four long small tasks, then a big one that cannot start beside them (400 + 1024 > 1200),
    // then a stream of short small ones.
    let mut t = String::from("#HTC retries=0\n");
    for _ in 0..4 {
        t.push_str(&format!("[mem=100M runtime=2s] {}\n", hold(60, 2.0, &mark)));
    }
    t.push_str(&format!("[mem=1G runtime=1s] {}\n", hold(700, 1.0, &mark)));
    // Backfill trusts hints, and a short task past its own would hold the big task's memory
    // past its start: these only sleep, well within their hint however loaded the machine (a
    // perl that allocates took over a second to start beside the whole suite). What they hold
    // is the leader's to count; the long ones and the big one hold theirs for the sampler.
    for _ in 0..16 {
        t.push_str("[mem=100M runtime=1s] sleep 0.1\n");
    }
    let file = format!("{policy}.txt");
    d.write(&file, t);
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample_peak_mb(mark, stop.clone());
    let o = d.htc(&["run", &file, "-q", "--cores-per-agent", "6", "--mem-per-agent", "1200M", "--mem-policy", policy]);
    stop.store(true, Ordering::Relaxed);
    let peak = sampler.join().unwrap();
    assert!(o.status.success(), "{policy}: {}", text(&o));
    let run = d.run_id();
    (rows(&d, &run), peak)
}

#[test]
fn mixed_memory_never_passes_the_budget_and_the_big_task_is_not_delayed_by_the_small_ones_filling_around_it() {
    let (fcfs, fcfs_peak) = mixed_run("fcfs");
    let (bf, bf_peak) = mixed_run("backfill");
    for (name, rows, peak) in [("fcfs", &fcfs, fcfs_peak), ("backfill", &bf, bf_peak)] {
        assert_eq!(rows.len(), 21, "{name}: every task ran once");
        assert!(rows.iter().all(|r| r.exit == 0), "{name}: every task done");
        // 1200 MiB for tasks, and each perl's own few MiB beyond what it holds.
        assert!(peak <= 1200 + 6 * 8, "{name}: peak {peak} MiB resident against 1200 MiB");
        assert!(peak >= 700, "{name}: the sampler saw the big task ({peak} MiB)");
    }
    let big = |rows: &[Row]| rows.iter().find(|r| r.task == 5).map(|r| (r.start, r.end)).unwrap();
    // How long the big task waited once the long ones had freed its memory: what the short
    // tasks filling around it could add to. Its own run time is left out, as it is the
    // machine's (a perl touching 700 MiB beside the whole suite takes one to four seconds).
    let waited = |rows: &[Row]| {
        let freed = rows.iter().filter(|r| r.task <= 4).map(|r| r.end).fold(f64::MIN, f64::max);
        // Below 0, it started at once: an end is recorded once its task is reaped, which on a
        // loaded machine comes later than the exit that freed the memory (-0.66 s seen).
        (big(rows).0 - freed).max(0.0)
    };
    let (bf_big, fcfs_big) = (big(&bf), big(&fcfs));
    let (bf_wait, fcfs_wait) = (waited(&bf), waited(&fcfs));
    let shorts_before = |rows: &[Row], big_start: f64| rows.iter().filter(|r| r.task > 5 && r.end <= big_start).count();
    eprintln!(
        "peak {fcfs_peak} / {bf_peak} MiB; big task waits {fcfs_wait:.2} / {bf_wait:.2} s after the long ones; short tasks before it: {} / {} (FCFS / backfill)",
        shorts_before(&fcfs, fcfs_big.0),
        shorts_before(&bf, bf_big.0)
    );
    // The big task waits for the long ones (2 s) in both; backfill may not delay it further.
    let rows_of =
        |rows: &[Row]| rows.iter().map(|r| format!("{}:{:.2}-{:.2}", r.task, r.start, r.end)).collect::<Vec<_>>();
    assert!(
        bf_wait <= fcfs_wait + 0.5,
        "big task starts {bf_wait:.2} s after the long ones end with backfill, {fcfs_wait:.2} s with FCFS; backfill's tasks {:?}",
        rows_of(&bf)
    );
    assert_eq!(shorts_before(&fcfs, fcfs_big.0), 0, "FCFS starts nothing after the waiting big task");
    // Those sent in the first second may go (their 1 s hint ends before the long ones' 2 s);
    // that any do is what FCFS never does.
    assert!(
        shorts_before(&bf, bf_big.0) >= 1,
        "backfill runs short tasks on the idle cores meanwhile ({} did)",
        shorts_before(&bf, bf_big.0)
    );
}

/// A task past its `mem=` is stopped and recorded as out of memory, whichever way `mem=` is
/// enforced; the others run on. The one that allocates is a child of the task's shell, which
/// goes on after it: the whole task must be stopped, not only the process that allocated.
fn out_of_memory(limit: &str) -> u64 {
    let d = Dir::new(&format!("oom-{limit}"));
    let mark = format!("htc-oom-{limit}-{}", std::process::id());
    let t = format!(
        "#HTC retries=0\n[mem=50M] {}; sleep 5\n[mem=200M] {}\n{}\n",
        hold(300, 5.0, &mark),
        hold(100, 0.5, &mark),
        hold(100, 0.5, &mark)
    );
    d.write("tasks.txt", t);
    let o = d.htc(&["run", "tasks.txt", "-q", "--mem-limit", limit]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let run = d.run_id();
    let rows = rows(&d, &run);
    let of = |task| rows.iter().find(|r| r.task == task).unwrap();
    assert_eq!(of(1).exit, -1, "killed");
    assert!(of(1).end - of(1).start < 4.0, "stopped well before its 5 s");
    assert_eq!((of(2).exit, of(3).exit), (0, 0));
    let o = d.htc(&["status", &run]);
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(s.contains("task 1 (line 2): out of memory ("), "{s}");
    assert!(s.contains("MiB resident, past its mem=)"), "{s}");
    let o = d.htc(&["log", &run, "--format", "json"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("\"Signal\":9"), "{}", text(&o));
    let log = std::fs::read_to_string(d.run_dir().join("log/agent-0.log")).unwrap();
    let by_cgroup = log.contains("tasks' mem= enforced by memory cgroups");
    assert_eq!(by_cgroup, limit == "cgroup", "{log}");
    let by_watch = log.contains("tasks' mem= enforced by watching their resident memory");
    assert_eq!(by_watch, limit == "watch", "the log says which way, as docs/resources.md promises: {log}");
    let seen = s.split("out of memory (").nth(1).and_then(|r| r.split(' ').next()).and_then(|n| n.parse().ok());
    seen.unwrap_or_else(|| panic!("resident MiB in {s}"))
}

#[test]
fn a_task_past_its_mem_is_stopped_as_out_of_memory_and_nothing_else_is_affected() {
    // The RSS watch looks every 100 ms: it sees the task past its limit.
    let seen = out_of_memory("watch");
    assert!(seen > 50, "{seen} MiB");
}

#[test]
fn a_memory_cgroup_stops_a_task_at_its_mem() {
    // The kernel stops it at the byte: it never holds more than its limit. The tests run as
    // root on a machine whose cgroup v1 memory hierarchy is writable; `--mem-limit cgroup`
    // fails the run (and this test) where the agent cannot make memory cgroups.
    let seen = out_of_memory("cgroup");
    assert!(seen <= 50, "{seen} MiB");
}

#[test]
fn gpu_tasks_get_distinct_devices_at_most_as_many_at_once_as_the_agent_has_and_the_assignment_is_recorded() {
    let d = Dir::new("gpus");
    let mut t = String::new();
    for _ in 0..12 {
        t.push_str("[gpus=1] echo $CUDA_VISIBLE_DEVICES $ROCR_VISIBLE_DEVICES $HIP_VISIBLE_DEVICES; sleep 0.4\n");
    }
    t.push_str("echo \"none:[$CUDA_VISIBLE_DEVICES]\"\n");
    t.push_str("[gpus=2] echo $CUDA_VISIBLE_DEVICES\n");
    t.push_str("[gpus=5 retries=0] echo too many\n");
    d.write("tasks.txt", t);
    // The step's own variable is not what the tasks see: each sees its devices only.
    let o = d.htc_env(
        &["run", "tasks.txt", "-q", "--gpus", "0,1,2,3", "--cores-per-agent", "8"],
        &[("CUDA_VISIBLE_DEVICES", std::ffi::OsStr::new("7"))],
    );
    assert_eq!(o.status.code(), Some(1), "task 15 cannot run: {}", text(&o));
    let run = d.run_id();
    let rows = json_rows(&d);
    let gpu_rows: Vec<(String, f64, f64)> = rows
        .iter()
        .filter(|r| r["Seq"].as_u64().unwrap() <= 12)
        .map(|r| {
            let s = r["Starttime"].as_f64().unwrap();
            (
                r["Devices"].as_str().expect("the assignment is recorded").to_string(),
                s,
                s + r["JobRuntime"].as_f64().unwrap(),
            )
        })
        .collect();
    assert_eq!(gpu_rows.len(), 12);
    // Never two tasks on one device at once, and never more than 4. The log has millisecond
    // times, start and runtime each rounded: an end up to 2 ms after a start is the same instant.
    for (i, (dev, s, e)) in gpu_rows.iter().enumerate() {
        assert!(["0", "1", "2", "3"].contains(&dev.as_str()), "{dev}");
        for (dev2, s2, e2) in &gpu_rows[i + 1..] {
            assert!(dev != dev2 || s2 >= &(e - 0.002) || s >= &(e2 - 0.002), "device {dev} shared");
        }
    }
    // Running at each start (an end within 2 ms of it taken as before it).
    let most = gpu_rows
        .iter()
        .map(|(_, s, _)| gpu_rows.iter().filter(|(_, s2, e2)| s2 <= s && *s < e2 - 0.002).count())
        .max()
        .unwrap();
    assert_eq!(most, 4, "four devices: four at a time");
    // Each saw its own device, under the three names.
    for task in 1..=12u64 {
        let dev = &gpu_rows[task as usize - 1].0;
        let o = d.htc(&["output", &run, &task.to_string()]);
        assert_eq!(String::from_utf8_lossy(&o.stdout), format!("{dev} {dev} {dev}\n"), "task {task}");
    }
    let o = d.htc(&["output", &run, "13"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "none:[]\n", "a task without gpus= sees none");
    let two = rows.iter().find(|r| r["Seq"] == 14).unwrap();
    let o = d.htc(&["output", &run, "14"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), two["Devices"].as_str().unwrap());
    assert_eq!(two["Devices"].as_str().unwrap().split(',').count(), 2);
    let o = d.htc(&["status", &run]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("task 15 (line 15): needs more cores, memory or GPUs"),
        "{}",
        text(&o)
    );
}

/// (task, start) of each attempt of the run, in start order.
fn starts(d: &Dir, run: &str) -> Vec<(u64, f64)> {
    let mut v: Vec<(u64, f64)> = rows(d, run).iter().map(|r| (r.task, r.start)).collect();
    v.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
    v
}

#[test]
fn higher_priority_tasks_start_first_on_every_agent_and_file_order_holds_within_a_priority() {
    // Odd lines priority 0, even lines priority 5, and two of priority -1 at the top.
    let mut t = String::from("[priority=-1] sleep 0.05\n[priority=-1] sleep 0.05\n");
    for i in 1..=8 {
        let p = if i % 2 == 0 { 5 } else { 0 };
        t.push_str(&format!("[priority={p} runtime=1s] sleep 0.3\n"));
    }
    let prio = |task: u64| match task {
        1 | 2 => -1,
        t if t % 2 == 0 => 5,
        _ => 0,
    };
    // One agent, one core: strictly by priority, then by line.
    let d = Dir::new("priority-1");
    d.write("tasks.txt", &t);
    let o = d.htc(&["run", "tasks.txt", "-q", "--agents", "1", "--cores-per-agent", "1"]);
    assert!(o.status.success(), "{}", text(&o));
    let order: Vec<u64> = starts(&d, &d.run_id()).iter().map(|s| s.0).collect();
    assert_eq!(order, [4, 6, 8, 10, 3, 5, 7, 9, 1, 2]);
    // Two agents (instances): every priority-5 task starts before any other.
    let d = Dir::new("priority-2");
    d.write("tasks.txt", &t);
    let o = d.htc(&["run", "tasks.txt", "-q", "--agents", "2", "--cores-per-agent", "1"]);
    assert!(o.status.success(), "{}", text(&o));
    let s = starts(&d, &d.run_id());
    let last_high = s.iter().filter(|(t, _)| prio(*t) == 5).map(|s| s.1).fold(0.0, f64::max);
    let first_other = s.iter().filter(|(t, _)| prio(*t) != 5).map(|s| s.1).fold(f64::MAX, f64::min);
    assert!(last_high < first_other, "order across the agents: {s:?}");
    let last_mid = s.iter().filter(|(t, _)| prio(*t) == 0).map(|s| s.1).fold(0.0, f64::max);
    let first_low = s.iter().filter(|(t, _)| prio(*t) == -1).map(|s| s.1).fold(f64::MAX, f64::min);
    assert!(last_mid < first_low, "priority 0 before -1: {s:?}");
}

#[test]
fn an_exclusive_task_has_its_agent_to_itself_and_the_others_keep_running() {
    let d = Dir::new("exclusive");
    let mut t = String::new();
    for i in 1..=24 {
        if i == 6 || i == 16 {
            t.push_str("[exclusive] sleep 0.6\n");
        } else {
            t.push_str("sleep 0.15\n");
        }
    }
    d.write("tasks.txt", t);
    let o = d.htc(&["run", "tasks.txt", "-q", "--agents", "2", "--cores-per-agent", "2"]);
    assert!(o.status.success(), "{}", text(&o));
    let run = d.run_id();
    let o = d.htc(&["log", &run, "--format", "json"]);
    let rows: Vec<(u64, u64, f64, f64)> = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let s = v["Starttime"].as_f64().unwrap();
            (v["Seq"].as_u64().unwrap(), v["Agent"].as_u64().unwrap(), s, s + v["JobRuntime"].as_f64().unwrap())
        })
        .collect();
    assert_eq!(rows.len(), 24, "every task ran once");
    for &(task, agent, s, e) in rows.iter().filter(|r| r.0 == 6 || r.0 == 16) {
        let beside: Vec<u64> = rows
            .iter()
            .filter(|r| r.0 != task && r.1 == agent && r.2 < e - 0.002 && s < r.3 - 0.002)
            .map(|r| r.0)
            .collect();
        assert!(beside.is_empty(), "task {task} on agent {agent} ran beside {beside:?}");
        // The other agent kept running meanwhile.
        assert!(rows.iter().any(|r| r.1 != agent && r.2 < e && s < r.3), "the other agent idled during {task}");
    }
}

#[test]
fn tasks_sharing_an_affinity_key_run_where_the_key_ran_before_and_no_agent_idles() {
    let d = Dir::new("affinity");
    let mut t = String::new();
    for i in 0..48 {
        t.push_str(&format!("[affinity=sample-{}] sleep 0.05\n", ["a", "b", "c", "d"][i % 4]));
    }
    d.write("tasks.txt", t);
    let o = d.htc(&["run", "tasks.txt", "-q", "--agents", "2", "--cores-per-agent", "1"]);
    assert!(o.status.success(), "{}", text(&o));
    let run = d.run_id();
    let o = d.htc(&["log", &run, "--format", "json"]);
    let rows: Vec<(u64, u64)> = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (v["Seq"].as_u64().unwrap(), v["Agent"].as_u64().unwrap())
        })
        .collect();
    assert_eq!(rows.len(), 48);
    let mut homes = Vec::new();
    for key in 0..4u64 {
        let agents: Vec<u64> = rows.iter().filter(|r| (r.0 - 1) % 4 == key).map(|r| r.1).collect();
        let on0 = agents.iter().filter(|&&a| a == 0).count();
        let most = on0.max(agents.len() - on0);
        assert!(most * 4 >= agents.len() * 3, "key {key}: agents {agents:?}");
        homes.push(if on0 * 2 >= agents.len() { 0 } else { 1 });
    }
    homes.sort_unstable();
    assert_eq!(homes, [0, 0, 1, 1], "two keys on each agent");
}

/// A low task's wait for the high-priority one to have run (its file `high-ran`), 30 s at most:
/// it cannot end first unless stopped, and a broken preemption fails the test rather than hang it.
const WAIT_FOR_HIGH: &str = "for i in $(seq 600); do test -e high-ran && break; sleep 0.05; done";

#[test]
fn a_preemptible_task_is_stopped_for_higher_priority_work_and_runs_again_without_using_a_retry() {
    let d = Dir::new("preempt");
    // The high-priority task fails once after 0.5 s; its retry then finds both cores taken by
    // preemptible tasks of priority 0 (they have no retries to spare), which wait for it to
    // have run (at most 30 s): only a preemption lets it run, whatever the machine's speed.
    let t = format!(
        "[priority=5 retries=1] test -e marker || {{ touch marker; sleep 0.5; exit 1; }}; echo high; touch high-ran\n\
         [preemptible retries=0] {WAIT_FOR_HIGH}; echo low\n\
         [preemptible retries=0] {WAIT_FOR_HIGH}; echo low\n"
    );
    d.write("tasks.txt", t);
    let o = d.htc(&["run", "tasks.txt", "-q", "--agents", "1", "--cores-per-agent", "2", "--spawners", "1"]);
    assert!(o.status.success(), "every task done in the end: {}", text(&o));
    let run = d.run_id();
    let rows = json_rows(&d);
    let of = |task: u64| rows.iter().filter(|r| r["Seq"] == task).collect::<Vec<_>>();
    let outcome = |r: &serde_json::Value| r["Outcome"].as_str().unwrap().to_string();
    let (high, low2, low3) = (of(1), of(2), of(3));
    assert_eq!(high.iter().map(|r| outcome(r)).collect::<Vec<_>>(), ["exit 1", "exit 0"]);
    // One of the low tasks was preempted (the newest), then ran again to the end.
    let (preempted, other) = if low3.len() == 2 { (low3, low2) } else { (low2, low3) };
    assert_eq!(
        preempted.iter().map(|r| outcome(r)).collect::<Vec<_>>(),
        ["preempted for higher-priority work", "exit 0"],
        "{rows:?}"
    );
    assert_eq!(other.iter().map(|r| outcome(r)).collect::<Vec<_>>(), ["exit 0"]);
    // The retry of the high task started before the other low task's end: that end waited for
    // the high task to have run.
    let start = |r: &serde_json::Value| r["Starttime"].as_f64().unwrap();
    let end = |r: &serde_json::Value| start(r) + r["JobRuntime"].as_f64().unwrap();
    assert!(start(high[1]) < end(other[0]), "the high task did not wait for a low task's end: {rows:?}");
    assert_eq!(preempted[0]["Attempt"], 1);
    assert_eq!(preempted[1]["Attempt"], 2, "a new attempt number");
    let o = d.htc(&["status", &run]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("done=3 failed=0"), "{}", text(&o));
}

#[test]
fn a_task_waiting_for_memory_stops_preemptible_lower_priority_tasks_holding_it() {
    let d = Dir::new("preempt-mem");
    // 1000 MiB for tasks and 4 cores: cores are never short. The high-priority task fails once
    // after 0.5 s; meanwhile the two preemptible ones took 800 MiB, so its retry (600 MiB)
    // waits for memory, and one of them must make room: they wait for it to have run.
    let t = format!(
        "[priority=5 retries=1 mem=600M] test -e marker || {{ touch marker; sleep 0.5; exit 1; }}; echo high; touch high-ran\n\
         [preemptible retries=0 mem=400M] {WAIT_FOR_HIGH}; echo low\n\
         [preemptible retries=0 mem=400M] {WAIT_FOR_HIGH}; echo low\n"
    );
    d.write("tasks.txt", t);
    let o = d.htc(&["run", "tasks.txt", "-q", "--agents", "1", "--cores-per-agent", "4", "--mem-per-agent", "1000M"]);
    assert!(o.status.success(), "every task done in the end: {}", text(&o));
    let run = d.run_id();
    let rows = json_rows(&d);
    let of = |task: u64| rows.iter().filter(|r| r["Seq"] == task).collect::<Vec<_>>();
    let outcome = |r: &serde_json::Value| r["Outcome"].as_str().unwrap().to_string();
    let (high, low2, low3) = (of(1), of(2), of(3));
    assert_eq!(high.iter().map(|r| outcome(r)).collect::<Vec<_>>(), ["exit 1", "exit 0"], "{rows:?}");
    let preempted: Vec<_> = [&low2, &low3].into_iter().filter(|l| l.len() == 2).collect();
    assert_eq!(preempted.len(), 1, "exactly one low task made room: {rows:?}");
    let p = preempted[0];
    assert_eq!(outcome(p[0]), "preempted for higher-priority work");
    assert_eq!(outcome(p[1]), "exit 0", "and ran again to its end");
    let start = |r: &serde_json::Value| r["Starttime"].as_f64().unwrap();
    let end = |r: &serde_json::Value| start(r) + r["JobRuntime"].as_f64().unwrap();
    // The other low task waited for the high one to have run: the retry started before its end.
    let other = [&low2, &low3].into_iter().find(|l| l.len() == 1).expect("the other low task ran once");
    assert!(start(high[1]) < end(other[0]), "the retry did not wait for a low task's end: {rows:?}");
    assert!(start(high[1]) >= end(p[0]) - 0.05, "it started once the memory was free: {rows:?}");
    let o = d.htc(&["status", &run]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("done=3 failed=0"), "{}", text(&o));
}

/// The most rows of `rows` that overlap at one instant, in all and on one agent, from
/// (agent, start, end) intervals. The log's times are rounded to the millisecond: one that
/// starts within 2 ms of another's end on its slot is not taken for overlapping it.
fn most_at_once(rows: &[(u64, f64, f64)]) -> (usize, usize) {
    let at = |t: f64, agent: Option<u64>| {
        rows.iter().filter(|r| agent.is_none_or(|a| r.0 == a) && r.1 <= t && t < r.2 - 0.002).count()
    };
    let mut most = (0, 0);
    for r in rows {
        let t = r.1 + 0.001;
        most = (most.0.max(at(t, None)), most.1.max(at(t, Some(r.0))));
    }
    most
}

fn intervals(rows: &[serde_json::Value]) -> Vec<(u64, f64, f64)> {
    rows.iter()
        .filter(|r| r["Exitval"] == 0)
        .map(|r| {
            let s = r["Starttime"].as_f64().unwrap();
            (r["Agent"].as_u64().unwrap(), s, s + r["JobRuntime"].as_f64().unwrap())
        })
        .collect()
}

#[test]
fn an_instance_of_two_agents_places_memory_and_gpu_tasks_on_the_member_they_fit() {
    // One instance of two agents (its head takes the work for both), 1000 MiB and two of the
    // four devices each. A task of 600 MiB fits one agent at a time: two run at once, one on
    // each; before, the instance was held to its head's 1000 MiB.
    let d = Dir::new("instance-memory");
    let mark = format!("htc-inst-{}", std::process::id());
    let mut t = String::from("#HTC retries=0\n");
    for _ in 0..6 {
        t.push_str(&format!("[mem=600M] {}\n", hold(100, 0.6, &mark)));
    }
    for _ in 0..6 {
        t.push_str("[gpus=2] echo $CUDA_VISIBLE_DEVICES; sleep 0.6\n");
    }
    t.push_str("[gpus=3] echo no agent has three\n");
    d.write("tasks.txt", t);
    let args = ["--agents", "2", "--instance-agents", "2", "--cores-per-agent", "2", "--spawners", "1"];
    let res = ["--mem-per-agent", "1000M", "--gpus", "0,1,2,3"];
    let o = d.htc(&[&["run", "tasks.txt", "-q"][..], &args[..], &res[..]].concat());
    assert_eq!(o.status.code(), Some(1), "all but the gpus=3 task: {}", text(&o));
    let rows = json_rows(&d);
    let seq = |r: &serde_json::Value| r["Seq"].as_u64().unwrap();
    let (mem_rows, gpu_rows): (Vec<_>, Vec<_>) =
        rows.iter().filter(|r| seq(r) <= 12).cloned().partition(|r| seq(r) <= 6);
    assert_eq!(mem_rows.len() + gpu_rows.len(), 12, "each ran once: {rows:?}");
    let (all, one) = most_at_once(&intervals(&mem_rows));
    assert_eq!((all, one), (2, 1), "two at once, never two on one agent: {mem_rows:?}");
    let (all, one) = most_at_once(&intervals(&gpu_rows));
    assert_eq!((all, one), (2, 1), "{gpu_rows:?}");
    // Three devices would fit the instance's four, but no one agent has them.
    let o = d.htc(&["status", &d.run_id()]);
    let status = String::from_utf8_lossy(&o.stdout);
    assert!(status.contains("task 13 (line 14): needs more cores, memory or GPUs than any agent has"), "{status}");
}

#[test]
fn a_task_that_outgrows_its_mem_succeeds_on_the_retry_that_grows_it_once_there_is_room() {
    // One agent of 200 MiB for tasks. Task 1 needs 100 MiB but first asks 50 (times 3 on a
    // retry); task 2 holds its 100 for 3 s, so task 1's second attempt (150) waits for it;
    // task 3's second attempt would ask 5000 MiB, more than the agent has: it fails at once.
    let d = Dir::new("grows-on-retry");
    let mark = format!("htc-grow-{}", std::process::id());
    let t = format!(
        "#HTC retries=2\n[mem=50M*3 retry_on=oom] {}\n[mem=100M] {}\n[mem=50M*100] {}\n",
        hold(100, 0.3, &mark),
        hold(60, 3.0, &mark),
        hold(100, 3.0, &mark)
    );
    d.write("tasks.txt", t);
    let o = d.htc(&["run", "tasks.txt", "-q", "--agents", "1", "--cores-per-agent", "4", "--mem-per-agent", "200M"]);
    assert_eq!(o.status.code(), Some(1), "task 3 fails: {}", text(&o));
    let rows = json_rows(&d);
    let of = |task: u64| rows.iter().filter(|r| r["Seq"] == task).collect::<Vec<_>>();
    let one = of(1);
    let asked: Vec<(u64, &str)> =
        one.iter().map(|r| (r["MemMiB"].as_u64().unwrap(), r["Outcome"].as_str().unwrap())).collect();
    assert_eq!(asked.len(), 2, "{rows:?}");
    assert_eq!(asked[0].0, 50);
    assert!(asked[0].1.starts_with("out of memory"), "{asked:?}");
    assert_eq!(asked[1], (150, "exit 0"), "the retry asked three times as much and succeeded");
    let start = |r: &serde_json::Value| r["Starttime"].as_f64().unwrap();
    let two = of(2);
    assert!(
        start(one[1]) >= start(two[0]) + 2.0,
        "the retry waited for task 2's memory: it started {:.2} s after task 2",
        start(one[1]) - start(two[0])
    );
    assert_eq!(two[0]["Exitval"], 0, "task 2 ran as it would have");
    let three = of(3);
    assert_eq!(three.len(), 1, "only its first attempt ran: {three:?}");
    let o = d.htc(&["status", &d.run_id()]);
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(s.contains("task 3 (line 4): needs more cores, memory or GPUs than any agent has"), "{s}");
}

#[test]
fn a_task_that_sits_idle_past_its_stuck_is_killed_recorded_stuck_and_retried_and_a_busy_one_is_not() {
    // Task 1 sleeps with stuck=1s: killed each attempt (one retry), recorded stuck. Task 2
    // spins for 3 s under the same watch and ends well; task 3 sleeps as long with no watch.
    let d = Dir::new("stuck");
    let t = "#HTC stuck=1s retries=1\nsleep 30\nend=$(($(date +%s) + 3)); while [ $(date +%s) -lt $end ]; do :; done\n[stuck=0] sleep 3\n";
    d.write("tasks.txt", t);
    let o = d.htc(&["run", "tasks.txt", "-q", "--agents", "1", "--cores-per-agent", "3"]);
    assert_eq!(o.status.code(), Some(1), "task 1 fails: {}", text(&o));
    let rows = json_rows(&d);
    let of = |task: u64| rows.iter().filter(|r| r["Seq"] == task).collect::<Vec<_>>();
    let one = of(1);
    assert_eq!(one.len(), 2, "retried once: {rows:?}");
    for r in &one {
        assert!(r["Outcome"].as_str().unwrap().starts_with("stuck: no CPU or I/O for"), "{r}");
        assert!(r["JobRuntime"].as_f64().unwrap() < 10.0, "stopped long before its sleep ended: {r}");
    }
    assert_eq!((of(2).len(), &of(2)[0]["Exitval"]), (1, &serde_json::json!(0)), "busy is not stuck: {rows:?}");
    assert_eq!((of(3).len(), &of(3)[0]["Exitval"]), (1, &serde_json::json!(0)), "no watch: {rows:?}");
    let o = d.htc(&["status", &d.run_id()]);
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(s.contains("stuck: no CPU or I/O"), "{s}");
}
