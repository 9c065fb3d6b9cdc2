//! `htc output RUN` (every task) and `htc log`, against what users compare them with: the same
//! lines run one by one by `sh -c`, and GNU parallel's `--joblog` of the same commands.

use crate::common;

use std::process::Command;

use common::{text, Dir};

/// Lines with output of every shape: none, several lines, no final newline, large, on stderr,
/// failing ones.
fn varied_tasks(n: usize) -> Vec<String> {
    (1..=n)
        .map(|i| match i % 9 {
            0 => format!("echo out {i}; echo err {i} >&2; exit {}", i % 4),
            1 => format!("printf 'no newline {i}'"),
            2 => format!("seq {i} $(({i} + 3))"),
            3 => "true".into(),
            4 => format!("head -c 70000 /dev/zero | tr '\\0' '{}'", (b'a' + (i % 26) as u8) as char),
            5 => format!("printf 'a\\n\\nb {i}\\n' >&2"),
            6 => format!("echo \"tab\there {i}\""),
            7 => "kill -9 $$".into(),
            _ => format!("echo {i}"),
        })
        .collect()
}

fn serial_sh(lines: &[String]) -> (Vec<u8>, Vec<u8>) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    for l in lines {
        let o = Command::new("sh").arg("-c").arg(l).output().unwrap();
        out.extend_from_slice(&o.stdout);
        err.extend_from_slice(&o.stderr);
    }
    (out, err)
}

/// `sh -c` outputs, each line prefixed with the task id and a tab, a last line ended.
fn tagged(lines: &[String], stderr: bool) -> Vec<u8> {
    let mut all = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let o = Command::new("sh").arg("-c").arg(l).output().unwrap();
        let bytes = if stderr { o.stderr } else { o.stdout };
        for line in bytes.split_inclusive(|&b| b == b'\n') {
            all.extend_from_slice(format!("{}\t", i + 1).as_bytes());
            all.extend_from_slice(line);
        }
        if bytes.last().is_some_and(|&b| b != b'\n') {
            all.push(b'\n');
        }
    }
    all
}

#[test]
fn every_task_s_output_in_order_equals_a_serial_sh_run() {
    let lines = varied_tasks(200);
    let (want_out, want_err) = serial_sh(&lines);
    for mode in ["streams", "per-task"] {
        let d = Dir::new(&format!("output-all-{mode}"));
        d.write("tasks.txt", format!("#HTC retries=0\n{}\n", lines.join("\n")));
        let o = d.htc(&["run", "tasks.txt", "--agents", "2", "--output", mode, "-q"]);
        assert_eq!(o.status.code(), Some(1), "some tasks fail: {}", text(&o));
        let run = d.run_id();
        let o = d.htc(&["output", &run]);
        assert!(o.status.success(), "{}", text(&o));
        assert!(
            o.stdout == want_out,
            "{mode}: stdout differs from sh -c's ({} vs {} bytes)",
            o.stdout.len(),
            want_out.len()
        );
        assert!(o.stderr == want_err, "{mode}: stderr differs: {}", String::from_utf8_lossy(&o.stderr));
        let o = d.htc(&["output", &run, "--stdout", "--tag"]);
        assert!(o.stderr.is_empty() && o.stdout == tagged(&lines, false), "{mode} --tag: {}", text(&o));
        let o = d.htc(&["output", &run, "--stderr", "--tag"]);
        assert!(o.stdout.is_empty() && o.stderr == tagged(&lines, true), "{mode} --stderr --tag: {}", text(&o));
        // --failed: the tasks that exited non-zero or were killed, and only those.
        let failing: Vec<String> = lines
            .iter()
            .enumerate()
            .map(
                |(i, l)| {
                    if (i + 1) % 9 == 7 || ((i + 1) % 9 == 0 && (i + 1) % 4 != 0) {
                        l.clone()
                    } else {
                        "true".into()
                    }
                },
            )
            .collect();
        let o = d.htc(&["output", &run, "--failed", "--stdout", "--tag"]);
        assert!(o.status.success(), "{}", text(&o));
        let got = String::from_utf8(o.stdout).unwrap();
        assert_eq!(got.as_bytes(), tagged(&failing, false), "{mode} --failed");
        assert!(got.lines().count() > 10, "{got}");
    }
}

#[test]
fn outputs_past_max_output_are_cut_and_the_cut_is_shown() {
    // Task i writes 3000 + 100 i bytes to stdout and half that to stderr; the cap is 4K.
    let lines: Vec<String> = (1..=30)
        .map(|i| {
            format!(
                "head -c {} /dev/zero | tr '\\0' o; head -c {} /dev/zero | tr '\\0' e >&2",
                3000 + 100 * i,
                1500 + 50 * i
            )
        })
        .collect();
    let cap = 4096;
    let (mut want_out, mut want_err, mut cut) = (Vec::new(), Vec::new(), 0);
    for i in 1..=30usize {
        let (o, e) = (3000 + 100 * i, 1500 + 50 * i);
        want_out.extend(std::iter::repeat_n(b'o', o.min(cap)));
        want_err.extend(std::iter::repeat_n(b'e', e.min(cap)));
        cut += (o > cap) as usize + (e > cap) as usize;
    }
    for mode in ["streams", "per-task"] {
        let d = Dir::new(&format!("max-output-{mode}"));
        d.write("tasks.txt", format!("#HTC max_output=4K\n{}\n", lines.join("\n")));
        let o = d.htc(&["run", "tasks.txt", "--agents", "2", "--output", mode, "-q"]);
        assert!(o.status.success(), "{}", text(&o));
        let run = d.run_id();
        let o = d.htc(&["output", &run]);
        assert!(o.status.success(), "{}", text(&o));
        assert!(o.stdout == want_out, "{mode}: {} bytes of stdout, want {}", o.stdout.len(), want_out.len());
        let err = String::from_utf8_lossy(&o.stderr);
        let (body, note) = err.split_at(err.find("htc: ").unwrap_or_else(|| panic!("no note: {err}")));
        assert!(body.as_bytes() == want_err, "{mode}: stderr");
        assert!(
            note.starts_with(&format!(
                "htc: {cut} outputs were cut at their max_output: task 11 stdout: cut at 4096 bytes of 4100 written"
            )),
            "{note}"
        );
        let o = d.htc(&["output", &run, "30", "--stdout"]);
        assert_eq!(o.stdout.len(), cap);
        assert_eq!(
            String::from_utf8_lossy(&o.stderr),
            "htc: task 30 stdout: cut at 4096 bytes of 6000 written (max_output)\n"
        );
        let o = d.htc(&["output", &run, "2"]);
        assert!(o.stdout.len() == 3200 && o.stderr.len() == 1600, "under the cap: whole, no note: {}", text(&o));
    }
}

#[test]
fn htc_log_reads_like_parallels_joblog_of_the_same_commands() {
    let d = Dir::new("joblog");
    let lines: Vec<String> = (1..=40)
        .map(|i| match i % 5 {
            0 => format!("exit {}", i % 7),
            1 => "kill -9 $$".into(),
            2 => format!("sleep 0.0{i}"),
            _ => format!("echo {i}"),
        })
        .collect();
    d.write("tasks.txt", format!("#HTC retries=0\n{}\n", lines.join("\n")));
    d.write("cmds.txt", format!("{}\n", lines.join("\n")));
    let o = d.htc(&["run", "tasks.txt", "--agents", "2", "-q"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let o = Command::new("parallel")
        .args(["--joblog", "parallel.log", "-j2", "-a", "cmds.txt"])
        .current_dir(&d.0)
        .output()
        .expect("GNU parallel is needed for this test (Debian: apt-get install parallel)");
    assert!(o.status.code().is_some(), "{}", text(&o));
    let theirs = std::fs::read_to_string(d.path("parallel.log")).unwrap();
    let o = d.htc(&["log", &d.run_id(), "--format", "tsv"]);
    assert!(o.status.success(), "{}", text(&o));
    let ours = String::from_utf8(o.stdout).unwrap();

    // The same header; every row has as many fields, with the same numeric columns.
    let parse = |t: &str| -> (Vec<String>, Vec<Vec<String>>) {
        let mut l = t.lines();
        let head: Vec<String> = l.next().unwrap().split('\t').map(Into::into).collect();
        let mut rows: Vec<Vec<String>> = l.map(|r| r.splitn(head.len(), '\t').map(Into::into).collect()).collect();
        rows.sort_by_key(|r| r[0].parse::<u64>().unwrap());
        (head, rows)
    };
    let (h1, r1) = parse(&ours);
    let (h2, r2) = parse(&theirs);
    assert_eq!(h1, h2, "column names");
    assert_eq!((r1.len(), r2.len()), (40, 40));
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    for (a, b) in r1.iter().zip(&r2) {
        assert_eq!(a.len(), 9, "{a:?}");
        // Seq, Exitval, Signal and Command agree; times are numbers of the same shape.
        assert_eq!((&a[0], &a[6], &a[7], &a[8]), (&b[0], &b[6], &b[7], &b[8]), "ours {a:?}, parallel's {b:?}");
        assert_eq!(a[1], host.trim());
        for (x, y) in [(&a[2], &b[2]), (&a[3], &b[3])] {
            let frac = |s: &str| s.trim().split('.').nth(1).map(str::len);
            assert!(x.trim().parse::<f64>().is_ok() && frac(x) == Some(3) && frac(y) == Some(3), "{x} / {y}");
        }
        assert_eq!(a[3].len(), b[3].len(), "JobRuntime padded as parallel's %10.3f");
    }
    // Sleeps took their time; the start is now-ish.
    let sleep = &r1[1];
    assert!(sleep[3].trim().parse::<f64>().unwrap() >= 0.02, "{sleep:?}");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    assert!((now - sleep[2].parse::<f64>().unwrap()).abs() < 120.0, "{sleep:?}");

    // JSON lines: the same names, plus the attempt and what happened.
    let o = d.htc(&["log", &d.run_id(), "--format", "json"]);
    let rows: Vec<serde_json::Value> =
        String::from_utf8(o.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 40);
    for name in h2.iter().map(String::as_str).chain(["Attempt", "Line", "Outcome"]) {
        assert!(rows.iter().all(|r| r.get(name).is_some()), "{name} missing in {:?}", rows[0]);
    }
    assert_eq!(rows[0]["Outcome"], "killed by signal 9 (KILL)");
    assert_eq!((rows[4]["Exitval"].as_i64(), rows[4]["Line"].as_u64()), (Some(5), Some(6)));
}

#[test]
fn a_retried_task_has_a_row_per_attempt() {
    let d = Dir::new("joblog-retries");
    d.write("tasks.txt", "[retries=2] exit 4\necho fine\n");
    let o = d.htc(&["run", "tasks.txt", "-q"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let o = d.htc(&["log", &d.run_id(), "--format", "json"]);
    let rows: Vec<serde_json::Value> =
        String::from_utf8(o.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let seq_attempt: Vec<(u64, u64)> =
        rows.iter().map(|r| (r["Seq"].as_u64().unwrap(), r["Attempt"].as_u64().unwrap())).collect();
    assert_eq!(seq_attempt, [(1, 1), (1, 2), (1, 3), (2, 1)]);
    assert!(rows[..3].iter().all(|r| r["Exitval"] == 4));
}
