//! `htc retry`: finished tasks of a run run again as new attempts of the same run; the rest
//! stays as it was.

use crate::common;

use common::{text, Dir};

fn log_rows(d: &Dir, run: &str) -> Vec<serde_json::Value> {
    let o = d.htc(&["log", run, "--format", "json"]);
    assert!(o.status.success(), "{}", text(&o));
    String::from_utf8(o.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn attempts_of(rows: &[serde_json::Value], task: u64) -> Vec<(u64, i64)> {
    rows.iter()
        .filter(|r| r["Seq"] == task)
        .map(|r| (r["Attempt"].as_u64().unwrap(), r["Exitval"].as_i64().unwrap()))
        .collect()
}

/// Tasks 3 and 6 fail until `fixed` exists; the others succeed.
fn flaky(d: &Dir) {
    let mut t = String::from("#HTC retries=0\n");
    for i in 1..=8 {
        if i == 3 || i == 6 {
            t.push_str(&format!("test -e fixed || exit {i}; echo fixed {i}\n"));
        } else {
            t.push_str(&format!("echo task {i}\n"));
        }
    }
    d.write("tasks.txt", t);
}

fn check_retry_of_failed(d: &Dir, run_args: &[&str]) {
    let mut args = vec!["run", "tasks.txt", "-q"];
    args.extend_from_slice(run_args);
    let o = d.htc(&args);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let run = d.run_id();
    let before = log_rows(d, &run);
    assert_eq!(attempts_of(&before, 3), [(1, 3)]);
    d.write("fixed", "");
    let o = d.htc(&["retry", &run, "--failed"]);
    assert_eq!(o.status.code(), Some(0), "every task now succeeds: {}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("2 tasks (2 failed, 0 done) go back to pending as new attempts"), "{err}");
    assert!(err.contains("8 tasks: 8 done, 0 failed"), "{err}");
    let after = log_rows(d, &run);
    assert_eq!(attempts_of(&after, 3), [(1, 3), (2, 0)], "the failed attempt kept, the new one after it");
    assert_eq!(attempts_of(&after, 6), [(1, 6), (2, 0)]);
    // The tasks that were done did not run again.
    for t in [1, 2, 4, 5, 7, 8] {
        let (b, a): (Vec<_>, Vec<_>) =
            (before.iter().filter(|r| r["Seq"] == t).collect(), after.iter().filter(|r| r["Seq"] == t).collect());
        assert_eq!(a, b, "task {t} untouched");
    }
    let o = d.htc(&["output", &run, "3"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "fixed 3\n", "{}", text(&o));
    let o = d.htc(&["status", &run, "--json"]);
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((s["state"].as_str(), s["counts"]["done"].as_u64()), (Some("succeeded"), Some(8)), "{s}");
}

#[test]
fn failed_tasks_run_again_as_new_attempts_and_done_ones_stay_done() {
    let d = Dir::new("retry-failed");
    flaky(&d);
    check_retry_of_failed(&d, &["--agents", "2"]);
}

#[test]
fn a_run_whose_ledger_was_node_local_is_retried_through_its_replica() {
    let d = Dir::new("retry-replica");
    flaky(&d);
    let local = d.path("node-local");
    std::fs::create_dir(&local).unwrap();
    std::fs::set_permissions(&local, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    check_retry_of_failed(&d, &["--ledger-dir", local.to_str().unwrap()]);
    assert!(!d.run_dir().join("ledger.mdb").exists(), "the ledger stayed a replica");
    // Reading it restores a copy in the temporary directory, which is left as it was found.
    let tmp = d.path("tmp");
    std::fs::create_dir(&tmp).unwrap();
    for args in [["verify", &d.run_id()], ["status", &d.run_id()]] {
        let o = d.htc_env(&args, &[("TMPDIR", tmp.as_os_str())]);
        assert!(o.status.success(), "{args:?}: {}", text(&o));
        let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().map(|e| e.unwrap().path()).collect();
        assert!(left.is_empty(), "htc {args:?} left {left:?} in the temporary directory");
    }
}

#[test]
fn chosen_tasks_run_again_with_retries_of_their_own_and_bad_lists_are_refused() {
    let d = Dir::new("retry-tasks");
    d.write(
        "tasks.txt",
        "echo a\n[retries=0] n=$(cat n 2>/dev/null || echo 0); echo $((n+1)) > n; test $n -ge 2\necho c\necho d\n",
    );
    let o = d.htc(&["run", "tasks.txt", "-q"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let run = d.run_id();
    for (bad, why) in [
        ("0", "'0': task ids start at 1"),
        ("2-1", "'2-1': the range ends before it starts"),
        ("3,9", "no task 9: the run has 4 tasks"),
    ] {
        let o = d.htc(&["retry", &run, "--tasks", bad]);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(String::from_utf8_lossy(&o.stderr).contains(why), "{bad}: {}", text(&o));
    }
    // Task 2 fails on its 1st and 2nd run: with one retry of its own, the round ends done.
    let o = d.htc(&["retry", &run, "--tasks", "2,4", "--retries", "1"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let rows = log_rows(&d, &run);
    assert_eq!(attempts_of(&rows, 2), [(1, 1), (2, 1), (3, 0)]);
    assert_eq!(attempts_of(&rows, 4), [(1, 0), (2, 0)], "a done task reran when asked");
    assert_eq!(attempts_of(&rows, 1), [(1, 0)]);
    // Nothing failed is left: --failed has nothing to do.
    let o = d.htc(&["retry", &run, "--failed"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no failed tasks to run again"), "{}", text(&o));
}
