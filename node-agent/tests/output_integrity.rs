//! Each task's output is its own and is the recorded attempt's: an attempt killed with its session
//! shows nowhere, a task that truncates or reopens its stdout touches no other task's bytes, and
//! a damaged byte of the stream files is refused by `htc output` and reported by `htc verify`.

use crate::common;

use std::fs;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{text, wait_for, Dir, HTC};

/// What `sh -c` of each line, one after the other, prints on stdout.
fn serial_stdout(lines: &[&str]) -> String {
    lines
        .iter()
        .map(|l| String::from_utf8(Command::new("sh").arg("-c").arg(l).output().unwrap().stdout).unwrap())
        .collect()
}

fn stdout(d: &Dir, args: &[&str]) -> String {
    let o = d.htc(args);
    assert!(o.status.success(), "{args:?}: {}", text(&o));
    String::from_utf8(o.stdout).unwrap()
}

/// Starts `htc run ARGS`, kills it with SIGKILL once `ready` holds, and resumes the run.
fn kill_and_resume(d: &Dir, args: &[&str], ready: impl FnMut() -> bool) {
    let mut leader =
        Command::new(HTC).args(args).current_dir(&d.0).stdin(Stdio::null()).stdout(Stdio::null()).spawn().unwrap();
    assert!(wait_for(ready, Duration::from_secs(30)), "the run did not get going");
    leader.kill().unwrap();
    leader.wait().unwrap();
    let o = d.htc(&["run", "-q", "--resume"]);
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn after_kill_9_and_resume_htc_output_shows_the_recorded_attempts_never_a_killed_fragment() {
    // The reproduction: task 2 is cut in the middle by the kill and runs again whole.
    let d = Dir::new("fragment");
    let lines = ["sleep 1; echo t1", "echo t2-start; sleep 4; echo t2-end", "echo t3"];
    d.write("tasks.txt", lines.join("\n") + "\n");
    let t0 = std::time::Instant::now();
    kill_and_resume(&d, &["run", "tasks.txt"], || t0.elapsed() > Duration::from_millis(2500));
    let run = d.run_id();
    assert_eq!(stdout(&d, &["output", &run, "2"]), "t2-start\nt2-end\n");
    assert_eq!(stdout(&d, &["output", &run]), serial_stdout(&lines));
    assert_eq!(stdout(&d, &["output", &run, "--tag"]), "1\tt1\n2\tt2-start\n2\tt2-end\n3\tt3\n");

    // Its second form: one spawner, the killed attempt's fragment first in the index.
    let d = Dir::new("fragment-one-loop");
    let lines = ["sleep 4", "echo k-start; sleep 4; echo k-end"];
    d.write("tasks.txt", lines.join("\n") + "\n");
    let t0 = std::time::Instant::now();
    kill_and_resume(&d, &["run", "tasks.txt", "--spawners", "1"], || t0.elapsed() > Duration::from_secs(2));
    let run = d.run_id();
    assert_eq!(stdout(&d, &["output", &run, "2"]), "k-start\nk-end\n");
    let v = d.htc(&["verify", &run]);
    assert_eq!(v.status.code(), Some(0), "{}", text(&v));
}

#[test]
fn a_killed_and_resumed_run_prints_what_a_serial_run_prints() {
    let d = Dir::new("kill9-serial");
    let marks = d.path("marks");
    fs::create_dir(&marks).unwrap();
    let lines: Vec<String> = (1..=40)
        .map(|i| format!("echo a-{i}; echo e-{i} >&2; sleep 0.3; echo b-{i}; touch {}/{i}", marks.display()))
        .collect();
    d.write("tasks.txt", lines.join("\n") + "\n");
    let dir_len = || fs::read_dir(&marks).map(|r| r.count()).unwrap_or(0);
    kill_and_resume(&d, &["run", "tasks.txt", "--agents", "2", "--cores-per-agent", "2"], || dir_len() >= 10);
    let run = d.run_id();
    let want: String = (1..=40).map(|i| format!("a-{i}\nb-{i}\n")).collect();
    assert_eq!(stdout(&d, &["output", &run, "--stdout"]), want);
    let want_err: String = (1..=40).map(|i| format!("e-{i}\n")).collect();
    let o = d.htc(&["output", &run, "--stderr"]);
    assert_eq!(String::from_utf8_lossy(&o.stderr), want_err);
    for i in [1, 17, 40] {
        assert_eq!(stdout(&d, &["output", &run, &i.to_string(), "--stdout"]), format!("a-{i}\nb-{i}\n"));
    }
}

#[test]
fn a_task_that_truncates_or_reopens_its_stdout_touches_no_other_task_s_output() {
    let d = Dir::new("truncate");
    let lines = [
        "echo task-1-out",
        "echo task-2-out",
        "echo task-3-out",
        "echo x > /dev/stdout",
        "echo task-5-out",
        "echo gone; : > /proc/self/fd/1; echo kept",
        "echo task-7-out",
        "echo aaaa; echo b 1<> /dev/stdout",
        "echo task-9-out",
        "echo late; (sleep 0.5; echo after-its-end) & exit 0",
        "echo task-11-out",
    ];
    d.write("tasks.txt", lines.join("\n") + "\n");
    let o = d.htc(&["run", "-q", "tasks.txt", "--agents", "1", "--cores-per-agent", "1"]);
    assert!(o.status.success(), "{}", text(&o));
    let run = d.run_id();
    let out = stdout(&d, &["output", &run]);
    for i in [1, 2, 3, 5, 7, 9, 11] {
        assert!(out.contains(&format!("task-{i}-out\n")), "task {i}'s output is gone: {out:?}");
    }
    assert_eq!(stdout(&d, &["output", &run, "1"]), "task-1-out\n");
    assert_eq!(stdout(&d, &["output", &run, "4"]), "x\n");
    assert_eq!(stdout(&d, &["output", &run, "6"]), "kept\n");
    assert_eq!(stdout(&d, &["output", &run, "8"]), "b\naa\n");
    assert_eq!(stdout(&d, &["output", &run, "10"]), "late\n", "what it wrote after its end is not its output");
    let v = d.htc(&["verify", &run]);
    assert_eq!(v.status.code(), Some(0), "{}", text(&v));
    assert!(String::from_utf8_lossy(&v.stdout).contains("output: intact, 11 tasks"), "{}", text(&v));
}

#[test]
fn a_damaged_byte_of_the_output_is_refused_and_reported_never_printed() {
    let d = Dir::new("damaged-output");
    d.write("tasks.txt", "echo first\necho second\necho third\n");
    let o = d.htc(&["run", "-q", "tasks.txt", "--agents", "1", "--cores-per-agent", "1"]);
    assert!(o.status.success(), "{}", text(&o));
    let run = d.run_id();
    let stream = d.run_dir().join("out/agent-0/slot-0.out");
    let mut bytes = fs::read(&stream).unwrap();
    let at = bytes.windows(6).position(|w| w == b"second").unwrap();
    bytes[at] = b'S';
    fs::write(&stream, bytes).unwrap();
    for args in [vec!["output", &run, "2"], vec!["output", &run]] {
        let o = d.htc(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(!String::from_utf8_lossy(&o.stdout).contains("Second"), "{args:?} printed the damaged bytes");
        assert!(String::from_utf8_lossy(&o.stderr).contains("checksum"), "{args:?}: {}", text(&o));
    }
    let v = d.htc(&["verify", &run]);
    assert_eq!(v.status.code(), Some(1), "{}", text(&v));
    let said = String::from_utf8_lossy(&v.stdout);
    assert!(said.contains("output: damaged") && said.contains("task 2:"), "{said}");
}
