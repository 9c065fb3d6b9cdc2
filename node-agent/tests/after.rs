//! Tasks that wait for others (`after=`, `afterany=`), through the real `htc`: the order they
//! start in, what a failure cancels, and a resume that waits as the first session did.

use std::fs;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use crate::common;
use common::{text, wait_for, Dir, HTC};

/// The task ids in the order their lines reached `log`.
fn order(d: &Dir) -> Vec<u64> {
    fs::read_to_string(d.path("log")).unwrap_or_default().lines().map(|l| l.parse().unwrap()).collect()
}

fn counts(d: &Dir) -> serde_json::Value {
    let o = d.htc(&["status", "--json"]);
    serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()["counts"].clone()
}

#[test]
fn tasks_start_after_what_they_wait_for_and_a_failure_cancels_its_dependents() {
    let d = Dir::new("after");
    let log = d.path("log").display().to_string();
    let note = format!("echo $HTC_TASK_ID >> {log}");
    d.write(
        "t.txt",
        format!(
            "sleep 0.3; {note}\n\
             [after=1] {note}\n\
             [after=2] {note}\n\
             {note}\n\
             [after=1] test -e fixed && {note}\n\
             [after=5] {note}\n\
             [after=6] {note}\n\
             [afterany=5] {note}\n"
        ),
    );
    let o = d.htc(&["run", "t.txt", "--agents", "2", "--retries", "0"]);
    assert!(!o.status.success(), "a task failed: {}", text(&o));
    let ran = order(&d);
    let at = |id: u64| ran.iter().position(|&x| x == id);
    assert!(at(1) < at(2) && at(2) < at(3), "the chain in order: {ran:?}");
    assert!(at(1) < at(8), "{ran:?}");
    assert_eq!((at(5), at(6), at(7)), (None, None, None), "5 failed; cancelled with it: {ran:?}");
    assert_eq!(ran.len(), 5, "{ran:?}");
    let c = counts(&d);
    assert_eq!((c["done"].as_u64(), c["failed"].as_u64(), c["cancelled"].as_u64()), (Some(5), Some(1), Some(2)), "{c}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("2 cancelled"), "{}", text(&o));
    // Fixed, the failure runs again, and what it cancelled waits for it again.
    d.write("fixed", "");
    let o = d.htc(&["retry", &d.run_id(), "--failed"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("3 tasks (1 failed, 2 cancelled, 0 done)"), "{}", text(&o));
    let ran = order(&d);
    assert_eq!(ran[5..], [5, 6, 7], "{ran:?}");
    assert_eq!(counts(&d)["done"].as_u64(), Some(8));
}

#[test]
fn a_resumed_run_waits_as_the_first_session_did() {
    let d = Dir::new("after-resume");
    let log = d.path("log").display().to_string();
    d.write("t.txt", format!("sleep 2; echo 1 >> {log}\n[after=1] echo 2 >> {log}\n[afterany=1] echo 3 >> {log}\n"));
    let leader = Command::new(HTC)
        .args(["run", "t.txt"])
        .current_dir(&d.0)
        .env("HTC_SITE_CONFIG", "/dev/null")
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Task 1 is running: the other two wait for it.
    assert!(wait_for(|| d.path(".htc").exists() && counts(&d)["running"].as_u64() == Some(1), Duration::from_secs(30)));
    let _ = killpg(Pid::from_raw(leader.id() as i32), Signal::SIGINT);
    let o = leader.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(130), "{}", text(&o));
    assert!(order(&d).is_empty(), "nothing ran past what it waited for: {:?}", order(&d));
    let o = d.htc(&["run", "--resume", d.run_dir().to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let ran = order(&d);
    assert_eq!(ran[0], 1, "{ran:?}");
    assert_eq!(ran.len(), 3, "{ran:?}");
}
