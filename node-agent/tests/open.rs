//! Open runs through the real `htc`: tasks added while the run runs (one by one, from a stream,
//! with keys and dependencies), their states, a cancel, the close, what a killed leader's resume
//! keeps, and the refusals a client gets.

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::common;
use common::{text, wait_for, Dir, HTC};

/// `htc run --open` in the background, once its leader listens.
fn open_run(d: &Dir, extra: &[&str]) -> (Child, String) {
    let mut args = vec!["run", "--open", "-q"];
    args.extend(extra);
    let leader = d.spawn_htc(&args, &[]);
    let listening = || d.leader_listens();
    assert!(wait_for(listening, Duration::from_secs(30)), "the open run's leader never listened");
    (leader, d.run_id())
}

/// `htc task add` (and the like): its exit status, stdout and stderr.
fn htc(d: &Dir, args: &[&str]) -> (i32, String, String) {
    let o = d.htc(args);
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Task id → state, as `htc task status --all` says.
fn states(d: &Dir, run: &str) -> Vec<(u64, String)> {
    let (rc, out, err) = htc(d, &["task", "status", run, "--all"]);
    assert_eq!(rc, 0, "{err}");
    out.lines()
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            (f[0].parse().unwrap(), f[1].to_string())
        })
        .collect()
}

#[test]
fn an_open_run_takes_tasks_while_it_runs_and_ends_when_closed() {
    let d = Dir::new("open");
    let (leader, run) = open_run(&d, &["--agents", "2"]);
    let (rc, out, err) = htc(&d, &["task", "add", &run, "--name", "the first", "--", "sh", "-c", "echo one > one.out"]);
    assert_eq!((rc, out.as_str()), (0, "1\n"), "{err}");
    let (rc, out, _) =
        htc(&d, &["task", "add", &run, "--after", "1", "--", "sh", "-c", "test -e one.out && echo two > two.out"]);
    assert_eq!((rc, out.as_str()), (0, "2\n"));
    // Keys: a client that retries gets the same id.
    let add_keyed = || htc(&d, &["task", "add", &run, "--key", "job-7", "--", "true"]).1;
    assert_eq!((add_keyed(), add_keyed()), ("3\n".to_string(), "3\n".to_string()));
    let (rc, _, err) = htc(&d, &["task", "wait", &run, "1-3", "--timeout", "60s"]);
    assert_eq!(rc, 0, "all three succeeded: {err}");
    let (_, out, _) = htc(&d, &["task", "status", &run, "1"]);
    assert_eq!(out, "1\tdone\t0\t\tthe first\n", "its name, from the leader");
    // A stream: each line added as it comes, the ids in order.
    let mut client = Command::new(HTC)
        .args(["task", "add", &run, "--file", "-"])
        .current_dir(&d.0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = client.stdin.take().unwrap();
    stdin.write_all(b"#HTC retries=0\n[class=quick] echo a\nsleep 612.25\n[after=5] echo never\n").unwrap();
    drop(stdin);
    let o = client.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), "4\n5\n6\n");
    // The leader knows a start before its ledger does.
    let running = || states(&d, &run).get(4).is_some_and(|s| s.1 == "running");
    assert!(wait_for(running, Duration::from_secs(30)), "{:?}", states(&d, &run));
    let st = states(&d, &run);
    assert_eq!(st[5], (6, "blocked".into()), "{st:?}");
    // `htc status` counts it, from what the leader writes with its commits.
    let blocked = || {
        let o = d.htc(&["status", &run, "--json"]);
        String::from_utf8_lossy(&o.stdout).contains("\"blocked\":1,")
    };
    assert!(wait_for(blocked, Duration::from_secs(10)), "{}", text(&d.htc(&["status", &run, "--json"])));
    assert!(wait_for(|| states(&d, &run)[1].1 == "done", Duration::from_secs(30)), "{:?}", states(&d, &run));
    assert!(d.path("two.out").exists(), "2 ran after 1");
    // Cancel the running sleep: what waited for it is cancelled with it.
    let (rc, _, err) = htc(&d, &["task", "cancel", &run, "5"]);
    assert_eq!(rc, 0, "{err}");
    let cancelled = || states(&d, &run)[4..].iter().all(|s| s.1 == "cancelled");
    assert!(wait_for(cancelled, Duration::from_secs(30)), "{:?}", states(&d, &run));
    let (rc, _, _) = htc(&d, &["task", "wait", &run, "5", "6"]);
    assert_eq!(rc, 1, "cancelled is not success");
    let (rc, _, err) = htc(&d, &["close", &run]);
    assert_eq!(rc, 0, "{err}");
    let (rc, _, err) = htc(&d, &["close", &run]);
    // Once closed, a second close is refused: by the core while it still runs, by the ending
    // leader, or (once it is gone) as a run that is not running.
    let refused = rc == 2 && (err.contains("not open") || err.contains("ending")) || rc == 1;
    assert!(refused, "closed twice: {rc} {err}");
    let o = leader.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(1), "two tasks were cancelled: not every task succeeded: {}", text(&o));
    let st = states(&d, &run);
    let done = st.iter().filter(|s| s.1 == "done").count();
    assert_eq!((st.len(), done), (6, 4), "{st:?}");
    // A name is the task's fifth column from the ledger too, once no leader runs.
    let (_, out, _) = htc(&d, &["task", "status", &run, "1", "2"]);
    assert_eq!(out, "1\tdone\t0\t\tthe first\n2\tdone\t0\t\n");
    let (_, out, _) = htc(&d, &["task", "status", &run, "1", "--format", "json"]);
    assert!(out.contains(r#""name":"the first""#), "{out}");
    // An added task's class is the run's: the report counts it by its name.
    let o = d.htc(&["report", &run, "-o", "rep"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(std::fs::read_to_string(d.path("rep/report.html")).unwrap().contains("quick"));
    // Closed and ended: a new task is refused, and says why.
    let (rc, _, err) = htc(&d, &["task", "add", &run, "--", "true"]);
    assert_eq!(rc, 1);
    assert!(err.contains("not running"), "{err}");
}

#[test]
fn a_bad_request_adds_nothing_and_says_where() {
    let d = Dir::new("open-bad");
    let (leader, run) = open_run(&d, &[]);
    d.write("more.txt", "echo fine\n[cores=x] echo bad\n");
    let (rc, out, err) = htc(&d, &["task", "add", &run, "--file", "more.txt"]);
    assert_eq!((rc, out.as_str()), (2, ""), "{err}");
    assert!(err.contains("more.txt:2:"), "{err}");
    let (rc, _, err) = htc(&d, &["task", "add", &run, "--after", "9", "--", "true"]);
    assert_eq!(rc, 2);
    assert!(err.contains("task 9 is not before this one"), "{err}");
    assert!(states(&d, &run).is_empty(), "nothing was added");
    // The caller's environment goes only as asked: named, then `--env` over it.
    let env = [("T_EXPORT_A", std::ffi::OsStr::new("from 'caller'")), ("T_EXPORT_B", std::ffi::OsStr::new("b"))];
    let o = d.htc_env(&["task", "add", &run, "--export", "NOPE_NOT_SET", "--", "true"], &env);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("NOPE_NOT_SET is not set here"), "{}", text(&o));
    let add = ["task", "add", &run, "--export", "T_EXPORT_A", "--env", "C=c", "--", "sh", "-c"];
    let o = d.htc_env(&[&add[..], &["echo \"$T_EXPORT_A|${T_EXPORT_B-unset}|$C\" > env.out"]].concat(), &env);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "1\n", "{}", text(&o));
    let (rc, _, err) = htc(&d, &["task", "wait", &run, "1", "--timeout", "30s"]);
    assert_eq!(rc, 0, "{err}");
    assert_eq!(std::fs::read_to_string(d.path("env.out")).unwrap(), "from 'caller'|unset|c\n");
    let (_, out, _) = htc(&d, &["task", "add", &run, "--", "sleep", "30"]);
    let (rc, _, err) = htc(&d, &["task", "wait", &run, out.trim(), "--timeout", "200ms"]);
    assert_eq!(rc, 124, "{err}");
    let (rc, _, err) = htc(&d, &["task", "wait", &run, "7"]);
    assert_eq!(rc, 2, "no task 7: {err}");
    let (rc, _, err) = htc(&d, &["close", &run, "--cancel"]);
    assert_eq!(rc, 0, "{err}");
    assert_eq!(leader.wait_with_output().unwrap().status.code(), Some(1), "its sleep was cancelled");
}

#[test]
fn an_acknowledged_task_survives_its_leader_killed_and_runs_on_resume() {
    let d = Dir::new("open-kill");
    // One slot, held by task 1: task 2 is acknowledged but cannot have started when the leader
    // dies.
    let (leader, run) = open_run(&d, &["--agents", "1", "--cores-per-agent", "1"]);
    let (rc, out, _) = htc(&d, &["task", "add", &run, "--", "sleep", "1.5"]);
    assert_eq!((rc, out.as_str()), (0, "1\n"));
    let (rc, out, _) = htc(&d, &["task", "add", &run, "--", "sh", "-c", "echo ran > ran.out"]);
    assert_eq!((rc, out.as_str()), (0, "2\n"));
    // The id was printed: the task is in the ledger, whatever happens to the leader now.
    let _ = kill(Pid::from_raw(leader.id() as i32), Signal::SIGKILL);
    let _ = leader.wait_with_output();
    assert!(!d.path("ran.out").exists(), "task 2 started before the leader died");
    let resumed = d.spawn_htc(&["run", "--resume", &run, "-q"], &[]);
    assert!(wait_for(|| d.path("ran.out").exists(), Duration::from_secs(60)), "the added task never ran");
    // The resumed leader listens where its address file says once it says so.
    assert!(wait_for(|| htc(&d, &["close", &run]).0 == 0, Duration::from_secs(30)), "the resumed run never closed");
    let o = resumed.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(states(&d, &run), [(1, "done".to_string()), (2, "done".to_string())]);
}

#[test]
fn a_run_started_from_a_file_alone_is_not_open() {
    let d = Dir::new("not-open");
    d.write("t.txt", "sleep 60\n");
    let leader = d.spawn_htc(&["run", "t.txt", "-q"], &[]);
    let listening = || d.leader_listens();
    assert!(wait_for(listening, Duration::from_secs(30)));
    let run = d.run_id();
    let (rc, _, err) = htc(&d, &["task", "add", &run, "--", "true"]);
    assert_eq!(rc, 2, "{err}");
    assert!(err.contains("not open for new tasks"), "{err}");
    let (rc, _, err) = htc(&d, &["close", &run]);
    assert_eq!(rc, 2, "{err}");
    assert!(err.contains("not open"), "{err}");
    // A cancel works on any run: its only task cancelled, the run ends.
    let (rc, _, err) = htc(&d, &["task", "cancel", &run, "1"]);
    assert_eq!(rc, 0, "{err}");
    let o = leader.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(1), "its one task was cancelled: {}", text(&o));
    assert_eq!(states(&d, &run), [(1, "cancelled".to_string())]);
}

#[test]
fn a_client_killed_mid_stream_leaves_what_was_acknowledged_and_no_half_line() {
    use std::io::{BufRead, BufReader};
    let d = Dir::new("open-client-killed");
    let (leader, run) = open_run(&d, &[]);
    let mut client = Command::new(HTC)
        .args(["task", "add", &run, "--file", "-"])
        .current_dir(&d.0)
        .env("HTC_SITE_CONFIG", "/dev/null")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = client.stdin.take().unwrap();
    let mut ids = BufReader::new(client.stdout.take().unwrap()).lines();
    stdin.write_all(b"true\n".repeat(5).as_slice()).unwrap();
    stdin.flush().unwrap();
    let acked: Vec<String> = (0..5).map(|_| ids.next().unwrap().unwrap()).collect();
    assert_eq!(acked, ["1", "2", "3", "4", "5"]);
    // Two more lines and half of a third, then the client dies.
    stdin.write_all(b"true\ntrue\necho half").unwrap();
    stdin.flush().unwrap();
    std::thread::sleep(Duration::from_millis(5));
    let _ = kill(Pid::from_raw(client.id() as i32), Signal::SIGKILL);
    let _ = client.wait();
    let (rc, _, err) = htc(&d, &["task", "wait", &run, "--all", "--timeout", "30s"]);
    assert_eq!(rc, 0, "{err}");
    let st = states(&d, &run);
    let n = st.len() as u64;
    // The acknowledged five, and the whole lines it may have sent before it died: no half line.
    assert!((5..=7).contains(&n), "{st:?}");
    assert!(st.iter().enumerate().all(|(i, s)| s.0 == i as u64 + 1 && s.1 == "done"), "{st:?}");
    let (rc, _, err) = htc(&d, &["close", &run]);
    assert_eq!(rc, 0, "{err}");
    assert_eq!(leader.wait_with_output().unwrap().status.code(), Some(0));
}

#[test]
fn a_client_is_told_what_its_cancel_close_key_and_cwd_did_and_a_wait_after_close_ends_well() {
    let d = Dir::new("open-small");
    let (leader, run) = open_run(&d, &[]);
    let (rc, out, err) = htc(&d, &["task", "add", &run, "--key", "k", "--", "true"]);
    assert_eq!((rc, out.as_str()), (0, "1\n"), "{err}");
    // The same key with another command is a mistake, not the old id.
    let (rc, out, err) = htc(&d, &["task", "add", &run, "--key", "k", "--", "false"]);
    assert_eq!((rc, out.as_str()), (2, ""), "{err}");
    assert!(err.contains("key \"k\" names task 1, added with another command"), "{err}");
    // A directory that is not there is refused before anything is sent.
    let (rc, _, err) = htc(&d, &["task", "add", &run, "--cwd", "no/such/dir", "--", "true"]);
    assert_eq!(rc, 2, "{err}");
    assert!(err.contains("no such directory"), "{err}");
    let (rc, out, _) = htc(&d, &["task", "add", &run, "--", "sleep", "600"]);
    assert_eq!((rc, out.as_str()), (0, "2\n"));
    let (rc, _, err) = htc(&d, &["task", "wait", &run, "1", "--timeout", "60s"]);
    assert_eq!(rc, 0, "{err}");
    // A cancel says what it cancelled, what had ended, and what the run does not have.
    let (rc, _, err) = htc(&d, &["task", "cancel", &run, "1-2", "9"]);
    assert_eq!(rc, 2, "{err}");
    assert!(
        err.contains("1 cancelled (2)") && err.contains("1 had ended already") && err.contains("no task 9"),
        "{err}"
    );
    let (rc, _, err) = htc(&d, &["task", "cancel", &run, "1"]);
    assert_eq!(rc, 0, "a cancel of ended tasks only is no error: {err}");
    // A close, then a close that cancels: both taken; a wait right after ends with the run.
    let (rc, out, _) = htc(&d, &["task", "add", &run, "--", "sleep", "600"]);
    assert_eq!((rc, out.as_str()), (0, "3\n"));
    let (rc, _, err) = htc(&d, &["close", &run]);
    assert_eq!(rc, 0, "{err}");
    let (rc, _, err) = htc(&d, &["close", &run, "--cancel"]);
    assert_eq!(rc, 0, "closing again, with --cancel: {err}");
    let (rc, _, err) = htc(&d, &["task", "wait", &run, "3", "--timeout", "60s"]);
    assert_eq!(rc, 1, "task 3 was cancelled: {err}");
    let o = leader.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(1), "a cancelled task: the run did not succeed");
    let (rc, out, err) = htc(&d, &["task", "status", &run, "1-3"]);
    assert_eq!(rc, 0, "{err}");
    let states: Vec<&str> = out.lines().map(|l| l.split('\t').nth(1).unwrap()).collect();
    assert_eq!(states, ["done", "cancelled", "cancelled"]);
}

#[test]
fn a_detached_run_prints_its_own_id_once_it_listens_even_beside_another() {
    let d = Dir::new("open-detach");
    let detach = || {
        Command::new(HTC)
            .args(["run", "--open", "--detach"])
            .current_dir(&d.0)
            .env("HTC_SITE_CONFIG", "/dev/null")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    // Two at once in one directory: each learns its own run, not the newest.
    let (a, b) = (detach(), detach());
    let ids: Vec<String> = [a, b]
        .into_iter()
        .map(|c| {
            let o = c.wait_with_output().unwrap();
            assert!(o.status.success(), "{}", text(&o));
            String::from_utf8_lossy(&o.stdout).trim().to_string()
        })
        .collect();
    assert_ne!(ids[0], ids[1]);
    for run in &ids {
        assert!(d.0.join(".htc").join(run).join("leader.addr").exists(), "{run} listens");
        let (rc, out, err) = htc(&d, &["task", "add", run, "--", "true"]);
        assert_eq!((rc, out.as_str()), (0, "1\n"), "{err}");
        let (rc, _, err) = htc(&d, &["close", run]);
        assert_eq!(rc, 0, "{err}");
    }
    let ended = || ids.iter().all(|r| !d.0.join(".htc").join(r).join("leader.addr").exists());
    assert!(wait_for(ended, Duration::from_secs(30)), "both runs ended once closed");
    // A run that cannot start says why, and the detaching command fails.
    let o = d.htc(&["run", "no-such-file.txt", "--detach"]);
    assert_ne!(o.status.code(), Some(0));
    assert!(text(&o).contains("no-such-file.txt"), "{}", text(&o));
}

/// A leader killed while a stream of short tasks runs (issue 52): the resume records what the
/// agents journaled as ended though the leader had not committed it, so only what was running
/// runs again, and every re-run is a new attempt (`$HTC_ATTEMPT`) with a row in `htc log` for the
/// attempt that was cut short.
#[test]
fn a_killed_leader_s_resume_reruns_only_what_ran_each_as_a_new_logged_attempt() {
    killed_leader_s_stream(&Dir::new("open-kill-stream"), false);
}

/// The same with the ledger on node-local storage, as under Slurm, and that node lost with the
/// leader: the resume rebuilds the ledger from its replica in the run directory, which must hold
/// every added task (their records, not only their commands), the ones not yet run included.
#[test]
fn a_killed_leader_s_tasks_are_all_resumed_from_the_replica_when_its_node_local_ledger_is_lost() {
    killed_leader_s_stream(&Dir::new("open-kill-replica"), true);
}

fn killed_leader_s_stream(d: &Dir, lose_the_node: bool) {
    let local = d.path("node-local");
    std::fs::create_dir(&local).unwrap();
    std::fs::set_permissions(&local, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let mut args = vec!["--agents", "2", "--cores-per-agent", "1"];
    if lose_the_node {
        args.extend(["--ledger-dir", local.to_str().unwrap()]);
    }
    let (leader, run) = open_run(d, &args);
    let runs = d.path("runs.txt");
    let n = 3000;
    let line = format!("echo $HTC_TASK_ID $HTC_ATTEMPT >> {}\n", runs.display());
    let mut client = Command::new(HTC)
        .args(["task", "add", &run, "--file", "-"])
        .current_dir(&d.0)
        .env("HTC_SITE_CONFIG", "/dev/null")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    client.stdin.take().unwrap().write_all(line.repeat(n).as_bytes()).unwrap();
    assert!(client.wait().unwrap().success());
    let started = || std::fs::read_to_string(&runs).map(|s| s.lines().count()).unwrap_or(0);
    assert!(wait_for(|| started() >= n / 3, Duration::from_secs(120)), "the tasks never ran");
    let _ = kill(Pid::from_raw(leader.id() as i32), Signal::SIGKILL);
    let _ = leader.wait_with_output();
    let dir = d.run_dir();
    assert!(wait_for(|| !common::agents_alive(&dir, 2), Duration::from_secs(30)), "the agents outlived their leader");
    if lose_the_node {
        assert!(!dir.join("ledger.mdb").exists(), "the ledger is node-local");
        std::fs::remove_dir_all(&local).unwrap();
        std::fs::create_dir(&local).unwrap();
        std::fs::set_permissions(&local, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    }
    let resumed = std::cell::RefCell::new(d.spawn_htc(&["run", "--resume", &run], &[]));
    // A resume that refuses the run ends at once: no waiting out the timeout for it.
    let finished = || {
        let gone = resumed.borrow_mut().try_wait().unwrap().is_some_and(|s| !s.success());
        gone || htc(d, &["task", "wait", &run, "--all", "--timeout", "5s"]).0 == 0
    };
    assert!(wait_for(finished, Duration::from_secs(180)), "the resumed run never finished");
    let mut resumed = resumed.into_inner();
    if resumed.try_wait().unwrap().is_some() {
        panic!("the resume ended before its close: {}", text(&resumed.wait_with_output().unwrap()));
    }
    let (rc, _, err) = htc(d, &["close", &run]);
    assert_eq!(rc, 0, "{err}");
    let o = resumed.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let mut seen: std::collections::BTreeMap<u64, Vec<u32>> = Default::default();
    for l in std::fs::read_to_string(&runs).unwrap().lines() {
        let (id, attempt) = l.split_once(' ').unwrap();
        seen.entry(id.parse().unwrap()).or_default().push(attempt.parse().unwrap());
    }
    assert_eq!(seen.len(), n, "every task ran");
    let again: Vec<(&u64, &Vec<u32>)> = seen.iter().filter(|(_, a)| a.len() > 1).collect();
    // Two slots: at most two tasks can have been running when the agents stopped.
    assert!(again.len() <= 2, "{} tasks ran again: {again:?}; {}", again.len(), text(&o));
    let (_, log, _) = htc(d, &["log", &run, "--format", "json"]);
    for (id, attempts) in &again {
        let mut distinct = attempts.to_vec();
        distinct.dedup();
        assert_eq!(distinct.len(), attempts.len(), "task {id} ran twice as the same attempt: {attempts:?}");
        for a in attempts.iter() {
            let row = format!("\"Seq\":{id},");
            let attempt = format!("\"Attempt\":{a},");
            assert!(
                log.lines().any(|l| l.contains(&row) && l.contains(&attempt)),
                "no log row for task {id}'s attempt {a}:\n{log}"
            );
        }
    }
    assert!(states(d, &run).iter().all(|(_, s)| s == "done"));
}

/// Arguments and `--env` values holding newlines (first, last, several) reach the task byte for
/// byte: a task's command is one line, and `htc task add` quotes a newline so that it stays one.
#[test]
fn arguments_holding_newlines_reach_the_task_as_given() {
    let d = Dir::new("open-newlines");
    let (leader, run) = open_run(&d, &[]);
    let words = ["a\nb", "\nx\n\n", "it's\n", "plain"];
    let mut args =
        vec!["task", "add", &run, "--env", "V=p\nq", "--", "sh", "-c", r#"printf '[%s]' "$V" "$@" > out.txt"#, "sh"];
    args.extend(words);
    let (rc, out, err) = htc(&d, &args);
    assert_eq!((rc, out.as_str()), (0, "1\n"), "{err}");
    let (rc, _, err) = htc(&d, &["task", "wait", &run, "1", "--timeout", "60s"]);
    assert_eq!(rc, 0, "{err}");
    let want: String = std::iter::once("p\nq").chain(words).map(|w| format!("[{w}]")).collect();
    assert_eq!(std::fs::read_to_string(d.path("out.txt")).unwrap(), want);
    // `htc log` shows an added task's command, as it shows a file's.
    let (_, log, _) = htc(&d, &["log", &run]);
    assert!(log.contains("sh -c 'printf") && log.contains("$htc_nl"), "{log}");
    let (rc, _, err) = htc(&d, &["close", &run]);
    assert_eq!(rc, 0, "{err}");
    assert_eq!(leader.wait_with_output().unwrap().status.code(), Some(0));
}

/// An open run's idle time counts from its last task's end or its client's last add, whichever
/// is later: an empty add (`--file -` of nothing) keeps it, and without one it ends on time.
#[test]
fn an_empty_add_keeps_an_open_run_past_its_idle_time_and_without_it_the_run_ends() {
    let d = Dir::new("open-kept");
    let (leader, run) = open_run(&d, &["--idle-exit", "2s"]);
    let empty_add = || {
        let mut c = Command::new(HTC)
            .args(["task", "add", &run, "--file", "-"])
            .current_dir(&d.0)
            .env("HTC_SITE_CONFIG", "/dev/null")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        c.stdout.append(&mut c.stderr);
        (c.status.code(), String::from_utf8_lossy(&c.stdout).into_owned())
    };
    let t0 = std::time::Instant::now();
    for _ in 0..4 {
        std::thread::sleep(Duration::from_millis(800));
        assert_eq!(empty_add(), (Some(0), String::new()), "kept at {:?}", t0.elapsed());
    }
    let heard = std::time::Instant::now();
    let o = leader.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let after = heard.elapsed();
    assert!(
        after >= Duration::from_millis(1500) && after < Duration::from_secs(6),
        "ended {after:?} after the last add"
    );
    // Ended idle, with nothing written since its last commit: finished, not interrupted.
    let (_, status, _) = htc(&d, &["status", &run, "--json"]);
    assert!(status.contains("\"state\":\"succeeded\""), "{status}");
}

#[test]
fn explain_says_why_each_task_is_where_it_is_from_the_leader_and_without_one() {
    let d = Dir::new("explain");
    let (mut leader, run) = open_run(&d, &["--agents", "1", "--cores-per-agent", "2", "--mem-per-agent", "500M"]);
    for (opts, cmd) in [("--mem=300M", &["sleep", "30"][..]), ("--mem=400M", &["true"]), ("--after=1", &["true"])] {
        let (rc, _, err) = htc(&d, &[&["task", "add", &run, opts, "--"][..], cmd].concat());
        assert_eq!(rc, 0, "{err}");
    }
    let running = || states(&d, &run).first().is_some_and(|(_, s)| s == "running");
    assert!(
        wait_for(running, Duration::from_secs(30)),
        "task 1 never started: {}",
        htc(&d, &["task", "status", &run, "--all"]).1
    );
    let (rc, out, err) = htc(&d, &["task", "explain", &run, "1-3", "--format", "json"]);
    assert_eq!(rc, 0, "{err}");
    let rows: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows[0]["kind"], "running", "{out}");
    assert_eq!(rows[0]["agent"], 0);
    assert_eq!(rows[1]["kind"], "no_room", "{out}");
    assert_eq!(rows[1]["ask"]["mem_mib"], 400);
    assert_eq!(rows[1]["room"]["mem_mib"], 200, "the most free on one agent: {out}");
    assert!(rows[1]["why"].as_str().unwrap().contains("no agent has 1 core, 400 MiB free now"), "{out}");
    assert_eq!((rows[2]["kind"].as_str(), rows[2]["ids"].clone()), (Some("after"), serde_json::json!([1])));
    let (rc, out, _) = htc(&d, &["task", "status", &run, "2", "--format", "json"]);
    let row: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        (rc, row["state"].as_str(), row["why"]["kind"].as_str()),
        (0, Some("waiting"), Some("no_room")),
        "{out}"
    );
    let (rc, out, _) = htc(&d, &["task", "explain", &run, "3"]);
    assert_eq!((rc, out.as_str()), (0, "3\tblocked\twaiting for task 1 to end\n"));
    let (rc, _, err) = htc(&d, &["task", "explain", &run, "2", "99"]);
    assert_eq!(rc, 2);
    assert!(err.contains("no task 99"), "{err}");
    // Without a leader, the ledger answers: task 1 was cut short by the kill and will run again.
    leader.kill().unwrap();
    leader.wait().unwrap();
    let (rc, out, err) = htc(&d, &["task", "explain", &run, "2-3"]);
    assert_eq!(rc, 0, "{err}");
    assert!(out.starts_with("2\twaiting\tno leader runs the run"), "{out}");
    assert!(out.contains("3\tblocked\twaiting for task(s) 1 to end, once the run goes on"), "{out}");
}
