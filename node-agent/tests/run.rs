//! End-to-end tests of `htc run` against the real binaries: real processes, real LMDB, real
//! signals, loopback TCP only.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{kill, killpg, Signal};
use nix::sys::stat::Mode;
use nix::unistd::Pid;

use htc::ledger::{Ledger, State};

use crate::common;
use common::{agent_pids, agents_alive, processes_naming, text, wait_for, Dir, HTC};

fn id_counts(path: &Path) -> HashMap<u64, usize> {
    let mut m = HashMap::new();
    for l in fs::read_to_string(path).unwrap_or_default().lines() {
        *m.entry(l.trim().parse::<u64>().unwrap()).or_insert(0) += 1;
    }
    m
}

fn ledger_states(run: &Path) -> HashMap<u64, State> {
    let l = Ledger::open(&run.join("ledger.mdb"), true).unwrap();
    let t = l.read().unwrap();
    let mut m = HashMap::new();
    t.for_each(|id, r| {
        m.insert(id, r.state());
    })
    .unwrap();
    m
}

#[test]
fn twenty_thousand_tasks_on_four_agents_each_run_once() {
    let d = Dir::new("20k");
    let ids = d.path("ids.txt");
    let tasks: String = (0..20_000).map(|_| format!("echo $HTC_TASK_ID >> {}\n", ids.display())).collect();
    d.write("tasks.txt", tasks);
    let o = d.htc(&["run", "--agents", "4", "tasks.txt"]);
    assert!(o.status.success(), "{}", text(&o));
    let counts = id_counts(&ids);
    assert_eq!(counts.len(), 20_000);
    assert!(counts.values().all(|&c| c == 1), "some task ran twice");
    assert!((1..=20_000).all(|i| counts.contains_key(&i)));

    let run = d.run_dir();
    let states = ledger_states(&run);
    assert_eq!(states.len(), 20_000);
    assert!(states.values().all(|s| *s == State::Done));
    let st = d.htc(&["status"]);
    let s = String::from_utf8_lossy(&st.stdout);
    assert!(s.contains("total=20000 done=20000 failed=0 pending=0"), "{}", text(&st));
    assert!(s.contains("finished, all tasks succeeded"), "{s}");
    // Every agent got work (the even partition splits the ids 4 ways).
    let l = Ledger::open(&run.join("ledger.mdb"), true).unwrap();
    let mut agents = HashSet::new();
    l.read()
        .unwrap()
        .for_each(|_, r| {
            agents.insert(r.agent());
        })
        .unwrap();
    assert_eq!(agents.len(), 4, "agents used: {agents:?}");
}

#[test]
fn failures_timeouts_signals_and_missing_binaries_are_recorded() {
    let d = Dir::new("failures");
    let good = d.path("good.txt");
    let tasks = format!(
        "#HTC retries=2\n\
         echo ok >> {g}\n\
         exit 3\n\
         [timeout=300ms retries=0] sleep 10\n\
         kill -TERM $$\n\
         /no/such/binary --flag\n\
         no-such-command-htc-test\n\
         [retries=0] exit 4\n\
         sh -c 'test $HTC_ATTEMPT -ge 2' && echo ok >> {g}\n\
         echo ok >> {g}\n",
        g = good.display()
    );
    d.write("tasks.txt", tasks);
    let o = d.htc(&["run", "tasks.txt"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let run = d.run_dir();
    let l = Ledger::open(&run.join("ledger.mdb"), true).unwrap();
    let t = l.read().unwrap();
    let rec = |id| t.get(id).unwrap().unwrap();
    use htc::ledger::Outcome;
    // (state, outcome, value, attempts)
    let expect = [
        (1, State::Done, Outcome::Exited, 0, 1),
        (2, State::Failed, Outcome::Exited, 3, 3),
        (3, State::Failed, Outcome::TimedOut, libc::SIGTERM, 1),
        (4, State::Failed, Outcome::Signaled, libc::SIGTERM, 3),
        (5, State::Failed, Outcome::SpawnFailed, libc::ENOENT, 1),
        (6, State::Failed, Outcome::SpawnFailed, libc::ENOENT, 1),
        (7, State::Failed, Outcome::Exited, 4, 1),
        (8, State::Done, Outcome::Exited, 0, 2),
        (9, State::Done, Outcome::Exited, 0, 1),
    ];
    for (id, state, outcome, value, attempts) in expect {
        let r = rec(id);
        assert_eq!(
            (r.state(), r.outcome(), r.value(), r.attempts()),
            (state, outcome, value, attempts),
            "task {id}: {r:?}"
        );
    }
    // Each retried attempt is kept.
    assert_eq!(t.attempts(2).unwrap().len(), 2);
    assert_eq!(t.attempts(8).unwrap().len(), 1);
    assert_eq!(fs::read_to_string(&good).unwrap(), "ok\nok\nok\n");
    let st = d.htc(&["status"]);
    let s = String::from_utf8_lossy(&st.stdout);
    assert!(s.contains("done=3 failed=6"), "{s}");
    assert!(s.contains("task 3 (line 4): timed out after 1 attempt"), "{s}");
    assert!(s.contains("task 2 (line 3): exit 3 after 3 attempts"), "{s}");
    assert!(s.contains("leader:   ") && s.contains("CPU s this session"), "{s}");

    // The same, for scripts (docs/status-json.md).
    let st = d.htc(&["status", "--json", "--failures", "2"]);
    let j: serde_json::Value = serde_json::from_slice(&st.stdout).expect("status --json is JSON");
    assert_eq!(j["version"], 1);
    assert_eq!(j["state"], "failed");
    assert_eq!(j["run"], fs::canonicalize(&run).unwrap().to_str().unwrap());
    assert_eq!(j["task_file"], "tasks.txt");
    assert_eq!(j["counts"]["total"], 9);
    assert_eq!((j["counts"]["done"].as_u64(), j["counts"]["failed"].as_u64()), (Some(3), Some(6)));
    assert!(j["leader_cpu_s"].as_f64().unwrap() > 0.0, "{j}");
    let per_task = j["leader_cpu_us_per_task"].as_f64().unwrap();
    assert!((per_task - j["leader_cpu_s"].as_f64().unwrap() * 1e6 / 9.0).abs() < 1e-3 * per_task.max(1.0), "{j}");
    assert!(j["eta_s"].is_null());
    assert_eq!(j["failures"].as_array().unwrap().len(), 2);
    assert_eq!(j["failures"][0]["reason"], "exit 3");
    assert_eq!(j["more_failures"], true);
    let out = d.htc(&["output", run.to_str().unwrap(), "6"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no-such-command-htc-test: command not found"),
        "{}",
        text(&out)
    );
}

#[test]
fn task_environment_output_and_cpu_binding() {
    let d = Dir::new("env");
    d.write(
        "tasks.txt",
        "echo id=$HTC_TASK_ID job=$HTC_JOB_ID attempt=$HTC_ATTEMPT cores=$HTC_CORES; echo to-stderr >&2\n\
         cat; grep Cpus_allowed_list /proc/self/status\n\
         /bin/echo direct exec\n\
         printf 'caf\\303\\251\\n'\n",
    );
    let o = d.htc(&["run", "--cores-per-agent", "1", "tasks.txt"]);
    assert!(o.status.success(), "{}", text(&o));
    let run = d.run_dir();
    let job = run.file_name().unwrap().to_str().unwrap().to_string();
    let out = |task: &str| d.htc(&["output", &job, task]);
    let o1 = out("1");
    assert_eq!(String::from_utf8_lossy(&o1.stdout), format!("id=1 job={job} attempt=1 cores=1\n"));
    assert_eq!(String::from_utf8_lossy(&o1.stderr), "to-stderr\n");
    // stdin is /dev/null (cat ends at once) and the task is bound to one CPU.
    let o2 = String::from_utf8_lossy(&out("2").stdout).to_string();
    let cpus = o2.trim().rsplit('\t').next().unwrap().to_string();
    assert!(!cpus.contains(',') && !cpus.contains('-'), "task not bound to one CPU: {o2}");
    assert_eq!(String::from_utf8_lossy(&out("3").stdout), "direct exec\n");
    assert_eq!(out("4").stdout, "caf\u{e9}\n".as_bytes());
    assert!(!out("99").status.success());
}

#[test]
fn per_task_output_files_on_request() {
    let d = Dir::new("pertask");
    d.write("tasks.txt", "echo one\necho two >&2\n");
    let o = d.htc(&["run", "--output", "per-task", "tasks.txt"]);
    assert!(o.status.success(), "{}", text(&o));
    let run = d.run_dir();
    assert_eq!(fs::read_to_string(run.join("out/tasks/1.out")).unwrap(), "one\n");
    assert_eq!(fs::read_to_string(run.join("out/tasks/2.err")).unwrap(), "two\n");
    let o = d.htc(&["output", run.to_str().unwrap(), "2", "--stderr"]);
    assert_eq!(String::from_utf8_lossy(&o.stderr), "two\n");
}

#[test]
fn malformed_task_files_are_rejected_with_their_place_and_nothing_runs() {
    let d = Dir::new("malformed");
    let marker = d.path("ran");
    let touch = format!("touch {}\n", marker.display());
    let mut long = touch.clone().into_bytes();
    long.extend(std::iter::repeat_n(b'x', 10 << 20));
    long.push(b'\n');
    let mut garbage = touch.clone().into_bytes();
    let mut x: u32 = 12345;
    for _ in 0..4096 {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
        garbage.push((x >> 16) as u8);
    }
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("long.txt", long, "long.txt:2: line longer than 131072 bytes"),
        (
            "toolong.txt",
            format!("{touch}echo {}\n", "x".repeat(131_067)).into_bytes(),
            "toolong.txt:2:1: command of 131072 bytes; the longest a shell can be given is 131071 bytes",
        ),
        ("quote.txt", format!("{touch}echo 'it''s\n").into_bytes(), "quote.txt:2:10: shell syntax: single quote"),
        ("subst.txt", format!("{touch}echo $(date\n").into_bytes(), "subst.txt:2:6: shell syntax: '$(' is not closed"),
        (
            "cont.txt",
            format!("{touch}echo a \\\n").into_bytes(),
            "cont.txt:2:8: shell syntax: the line ends with a backslash",
        ),
        ("garbage.txt", garbage, "garbage.txt:"),
        ("badopt.txt", format!("{touch}[cores=zero] x\n").into_bytes(), "badopt.txt:2:2: bad value 'zero' for cores"),
        ("unknown.txt", format!("{touch}[colour=red] x\n").into_bytes(), "unknown.txt:2:2: unknown option 'colour'"),
        (
            "timeout.txt",
            format!("{touch}[timeout=soon] x\n").into_bytes(),
            "timeout.txt:2:2: bad value 'soon' for timeout",
        ),
        ("unclosed.txt", format!("{touch}[cores=2 x\n").into_bytes(), "unclosed.txt:2:1: option block"),
        ("empty.txt", Vec::new(), "empty.txt: no tasks in file"),
        ("comments.txt", b"# nothing\n\n".to_vec(), "comments.txt: no tasks in file"),
    ];
    for (name, content, expect) in cases {
        d.write(name, content);
        for cmd in ["check", "run"] {
            let o = d.htc(&[cmd, name]);
            assert!(!o.status.success(), "{cmd} {name} succeeded: {}", text(&o));
            assert!(
                String::from_utf8_lossy(&o.stderr).contains(expect),
                "{cmd} {name}: want '{expect}' in {}",
                text(&o)
            );
        }
        assert!(!marker.exists(), "{name}: a task ran");
    }
    let o = d.htc(&["run", "missing.txt"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("missing.txt"), "{}", text(&o));
    // Rejected runs leave no run directory behind.
    assert_eq!(fs::read_dir(d.path(".htc")).map(|r| r.count()).unwrap_or(0), 0);
}

/// Lines that look like shell syntax errors but are not, and a command of the longest length a
/// shell can be given: accepted, and each task's output is what `sh -c` prints for its line.
#[test]
fn tricky_but_valid_lines_run_as_sh_runs_them() {
    let d = Dir::new("tricky");
    let long = format!("echo {}", "y".repeat(131_071 - 5));
    let lines = [
        r#"echo "a'b""#,
        r"echo \$\(",
        "echo a#b # in a word, then a comment",
        r#"echo "${HOME:+set}" ${x:-"}"} `echo hi` $(echo "(")"#,
        "case a in a) echo matched;; esac",
        &long,
    ];
    d.write("tasks.txt", lines.join("\n") + "\n");
    let o = d.htc(&["check", "tasks.txt"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = d.htc(&["run", "-q", "tasks.txt"]);
    assert!(o.status.success(), "{}", text(&o));
    for (i, line) in lines.iter().enumerate() {
        let want = std::process::Command::new("/bin/sh").args(["-c", line]).output().unwrap();
        let got = d.htc(&["output", &d.run_id(), &(i + 1).to_string()]);
        assert!(got.status.success(), "{}", text(&got));
        assert_eq!(got.stdout, want.stdout, "task {}: {line:.80}", i + 1);
    }
}

/// As with other Unix tools: a reader that stops early ends `htc output` quietly, and a device
/// or FIFO given as the task file is refused at once instead of read for ever or waited on.
#[test]
fn pipes_and_odd_files_behave_as_in_other_unix_tools() {
    use std::io::Read;
    let d = Dir::new("pipes");
    d.write("tasks.txt", "seq 1 300000\n");
    assert!(d.htc(&["run", "-q", "tasks.txt"]).status.success());
    let mut out = std::process::Command::new(common::HTC)
        .args(["output", &d.run_id(), "1"])
        .current_dir(&d.0)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 2];
    out.stdout.take().unwrap().read_exact(&mut first).unwrap();
    // The pipe is closed here, with most of the output unread (like `| head -c 2`).
    let o = out.wait_with_output().unwrap();
    assert_eq!(&first, b"1\n");
    assert!(o.status.success() && o.stderr.is_empty(), "{}", text(&o));

    let fifo = d.path("fifo.txt");
    nix::unistd::mkfifo(&fifo, Mode::from_bits_truncate(0o600)).unwrap();
    for (file, what) in [("/dev/zero", "is a device"), (fifo.to_str().unwrap(), "is a FIFO")] {
        for cmd in ["check", "run"] {
            let o = d.htc(&[cmd, file]);
            assert!(!o.status.success(), "{cmd} {file}");
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(err.contains(&format!("{file}: {what}")) && err.contains("regular file"), "{cmd} {file}: {err}");
        }
    }
}

#[test]
fn kill_9_of_the_leader_then_resume_runs_every_task_and_no_done_task_twice() {
    let d = Dir::new("kill9");
    let ids = d.path("ids.txt");
    let n = 3000u64;
    let tasks: String = (0..n).map(|_| format!("sleep 0.01; echo $HTC_TASK_ID >> {}\n", ids.display())).collect();
    d.write("tasks.txt", tasks);
    let mut leader = Command::new(HTC)
        .args(["run", "--agents", "2", "tasks.txt"])
        .current_dir(&d.0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_for(|| id_counts(&ids).len() >= 600, Duration::from_secs(60)), "tasks did not start");
    assert!(agents_alive(&d.run_dir(), 2), "the agents are found while they run");
    // Our own child.
    let _ = kill(Pid::from_raw(leader.id() as i32), Signal::SIGKILL);
    leader.wait().unwrap();
    let run = d.run_dir();
    // The agents notice the leader's death, stop their tasks and exit: then nothing is left
    // that could write (every task's command line names the ids file).
    let gone = || !agents_alive(&run, 2) && processes_naming(ids.as_os_str()).is_empty();
    assert!(wait_for(gone, Duration::from_secs(30)), "tasks kept running after the leader died");
    let done_at_kill: HashSet<u64> =
        ledger_states(&run).into_iter().filter(|(_, s)| *s == State::Done).map(|(id, _)| id).collect();
    assert!(
        !done_at_kill.is_empty() && (done_at_kill.len() as u64) < n,
        "kill came too late or too early: {}",
        done_at_kill.len()
    );
    let st = String::from_utf8_lossy(&d.htc(&["status"]).stdout).to_string();
    assert!(st.contains("interrupted"), "{st}");

    let o = d.htc(&["run", "--resume"]);
    assert!(o.status.success(), "{}", text(&o));
    let counts = id_counts(&ids);
    assert_eq!(counts.len() as u64, n, "some task never ran");
    for id in &done_at_kill {
        assert_eq!(counts[id], 1, "task {id} was recorded done before the kill and ran again");
    }
    let twice = counts.values().filter(|&&c| c > 1).count();
    // Only tasks in flight at the kill (at most a few agents' backlogs) may have run twice.
    assert!(twice <= 200, "{twice} tasks ran twice");
    assert!(ledger_states(&run).values().all(|s| *s == State::Done));
}

#[test]
fn sigint_interrupts_cleanly_and_resume_finishes() {
    let d = Dir::new("sigint");
    let ids = d.path("ids.txt");
    let tasks: String = (0..400).map(|_| format!("sleep 0.02; echo $HTC_TASK_ID >> {}\n", ids.display())).collect();
    d.write("tasks.txt", tasks);
    // Its own process group, as a shell job: Ctrl-C on a terminal signals the whole group.
    let leader = Command::new(HTC)
        .args(["run", "--agents", "2", "tasks.txt"])
        .current_dir(&d.0)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(wait_for(|| id_counts(&ids).len() >= 20, Duration::from_secs(30)));
    // The process group of our own child.
    let _ = killpg(Pid::from_raw(leader.id() as i32), Signal::SIGINT);
    let o = leader.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(130), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("htc run --resume"), "{}", text(&o));
    // No task outlives the interrupted run: its agents and every task process go.
    let gone = || !agents_alive(&d.run_dir(), 2) && processes_naming(ids.as_os_str()).is_empty();
    assert!(wait_for(gone, Duration::from_secs(30)), "tasks kept running after Ctrl-C");
    let o = d.htc(&["run", "--resume", d.run_dir().to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(id_counts(&ids).len(), 400);
}

#[test]
fn check_prints_counts_classes_and_core_seconds() {
    let d = Dir::new("check");
    d.write("t.txt", "#HTC class=short runtime=2s\nx 1\nx 2\n[class=long runtime=1m cores=4] y\n# end\n");
    let o = d.htc(&["check", "t.txt"]);
    assert!(o.status.success(), "{}", text(&o));
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(s.contains("t.txt: 3 tasks"), "{s}");
    assert!(s.contains("classes: 2"), "{s}");
    assert!(s.contains("requested: 244.0 core-seconds"), "{s}");
}

/// The `text` blocks of `docs/task-file.md` after the heading `heading`, in order.
fn doc_blocks(heading: &str) -> Vec<String> {
    let doc = fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/task-file.md")).unwrap();
    let section = doc.split(heading).nth(1).expect("the heading is in the doc");
    let section = section.split("\n## ").next().unwrap();
    section.split("```text\n").skip(1).map(|b| b.split("```").next().unwrap().to_string()).collect()
}

#[test]
fn check_shows_each_set_of_rules_for_attempts_as_the_docs_say() {
    let d = Dir::new("check-attempts");
    let blocks = doc_blocks("## Attempts that grow");
    assert_eq!(blocks.len(), 2, "the example and what htc check says of it");
    d.write("t.txt", &blocks[0]);
    let o = d.htc(&["check", "t.txt"]);
    assert!(o.status.success(), "{}", text(&o));
    let s = String::from_utf8_lossy(&o.stdout);
    let said = s.split_once("attempts:").map(|(_, r)| format!("attempts:{r}")).unwrap_or_default();
    assert_eq!(said, blocks[1], "docs/task-file.md says what htc check prints");
}

#[test]
fn agents_form_a_tree_of_relays_and_every_agent_runs_tasks() {
    let d = Dir::new("tree");
    let ids = d.path("ids.txt");
    let tasks: String = (0..3000).map(|_| format!("echo $HTC_TASK_ID $HTC_AGENT >> {}\n", ids.display())).collect();
    d.write("tasks.txt", tasks);
    // Fan-out 2 with 7 agents: the leader serves agents 0 and 1, which relay for 2..6.
    let o = d.htc(&["run", "--agents", "7", "--fanout", "2", "--cores-per-agent", "1", "tasks.txt"]);
    assert!(o.status.success(), "{}", text(&o));
    let lines = fs::read_to_string(&ids).unwrap();
    let mut seen = HashSet::new();
    let mut agents = HashSet::new();
    for l in lines.lines() {
        let mut w = l.split(' ');
        assert!(seen.insert(w.next().unwrap().to_string()), "task ran twice: {l}");
        agents.insert(w.next().unwrap().to_string());
    }
    assert_eq!(seen.len(), 3000);
    assert_eq!(agents.len(), 7, "agents that ran tasks: {agents:?}");
    // Relays published their addresses; leaves did not need to.
    let tree = d.run_dir().join("tree");
    assert!(tree.join("htc-addr-0").exists() && tree.join("htc-addr-1").exists() && tree.join("htc-addr-2").exists());
    assert!(!tree.join("htc-addr-6").exists());
}

/// Runs `n` short tasks with `args`, kills agent `agent` with SIGKILL once 200 ran, and checks
/// that the run still completes with every task run; returns the run directory.
fn kill_agent_mid_run(d: &Dir, n: usize, args: &[&str], agent: u32) -> std::path::PathBuf {
    let ids = d.path("ids.txt");
    let tasks: String = (0..n).map(|_| format!("sleep 0.01; echo $HTC_TASK_ID >> {}\n", ids.display())).collect();
    d.write("tasks.txt", tasks);
    let leader = d.spawn_htc(&[args, &["tasks.txt"]].concat(), &[]);
    assert!(wait_for(|| id_counts(&ids).len() >= 200, Duration::from_secs(60)), "tasks did not start");
    let run = d.run_dir();
    let pids = agent_pids(&run, agent);
    assert_eq!(pids.len(), 1, "agent {agent} not found");
    // A process this test started (through htc).
    let _ = kill(Pid::from_raw(pids[0]), Signal::SIGKILL);
    let o = leader.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(id_counts(&ids).len(), n, "some task never ran");
    run
}

/// The tree heals: agent 0 relays for agents 2 and 3; when it is killed they reconnect to the
/// leader within their lease, keeping their running tasks, and go on working. Only what was in
/// flight runs again: the relay's running task (a lost attempt in the ledger), what had ended
/// there but was not reported yet (at most a report gap's worth), and the reports of its
/// children that it had not passed on (a gap's worth each: a relay starved of CPU reads them
/// late, and their starts travel with their results, so the leader never saw those run).
#[test]
fn losing_a_relay_its_children_rejoin_the_leader_and_keep_working() {
    let d = Dir::new("relayloss");
    let run = kill_agent_mid_run(&d, 1500, &["run", "--agents", "5", "--fanout", "2", "--cores-per-agent", "1"], 0);
    let l = Ledger::open(&run.join("ledger.mdb"), true).unwrap();
    let t = l.read().unwrap();
    let (mut lost, mut last_on_0) = (0, 0);
    let mut ends: Vec<(u32, u64)> = Vec::new();
    t.for_each(|id, r| {
        assert_eq!(r.state(), State::Done, "task {id}");
        lost += t.attempts(id).unwrap().iter().filter(|a| a.ended.outcome == htc::ledger::Outcome::Lost).count();
        if r.agent() == 0 {
            last_on_0 = last_on_0.max(r.end_us());
        }
        ends.push((r.agent(), r.start_us()));
    })
    .unwrap();
    assert!(lost > 0, "the relay's running task was recorded as lost");
    // Agents 2 and 3 worked on after their relay died (agent 0's last end is about then).
    for a in [2, 3] {
        let after = ends.iter().filter(|&&(agent, start)| agent == a && start > last_on_0 + 100_000).count();
        assert!(after > 10, "agent {a} ran {after} tasks after its relay was killed");
    }
    let runs = id_counts(&d.path("ids.txt"));
    let again: usize = runs.values().map(|&c| c - 1).sum();
    // Five instances: a report gap of 125 ms, of 10 ms tasks on each one-slot agent: the
    // relay's own and one report of each of its two children.
    if again > lost + 3 * (125 / 10 + 1) {
        // Where the re-runs came from: which agents ran them last, and what the relay's
        // children said of their way around it.
        let mut by: std::collections::BTreeMap<u32, usize> = Default::default();
        t.for_each(|id, r| {
            if runs.get(&id).is_some_and(|&c| c > 1) {
                *by.entry(r.agent()).or_default() += 1;
            }
        })
        .unwrap();
        let said: Vec<String> = [2, 3]
            .iter()
            .flat_map(|a| {
                let log = fs::read_to_string(run.join(format!("log/agent-{a}.log"))).unwrap_or_default();
                log.lines()
                    .filter(|l| !l.contains(" INFO ") || l.contains("rejoin"))
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .collect();
        panic!(
            "{again} re-runs but only {lost} lost attempts recorded; re-run tasks by agent {by:?}; children:\n{}",
            said.join("\n")
        );
    }
}

/// The agents that ran the finished tasks, from the ledger.
fn agents_used(run: &Path) -> HashSet<u32> {
    let l = Ledger::open(&run.join("ledger.mdb"), true).unwrap();
    let mut agents = HashSet::new();
    l.read().unwrap().for_each(|_, r| _ = agents.insert(r.agent())).unwrap();
    agents
}

/// The output slots that tasks of agent 0 wrote to, from all its spawners' index files.
fn slots_used(run: &Path) -> std::collections::BTreeSet<u32> {
    let dir = run.join("out/agent-0");
    htc::output::index_files(&dir)
        .unwrap()
        .into_iter()
        .flat_map(|p| htc::output::read_index(&p).unwrap())
        .map(|e| e.slot)
        .collect()
}

/// Index files (one per spawner that stored output) of agent 0.
fn index_files(d: &Dir) -> usize {
    htc::output::index_files(&d.run_dir().join("out/agent-0")).unwrap().len()
}

#[test]
fn the_default_layout_is_one_agent_with_a_spawn_loop_per_cpu_and_one_for_wide_tasks_beside_them() {
    let cpus = htc::executor::allowed_cpus().len();
    let d = Dir::new("layout-narrow");
    d.write("tasks.txt", "true\n".repeat(400));
    let o = d.htc(&["run", "tasks.txt", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(agents_used(&d.run_dir()), HashSet::from([0]), "one agent");
    assert_eq!(slots_used(&d.run_dir()), (0..cpus as u32).collect(), "every CPU's spawn loop ran tasks");
    // The wide spawner makes its files with its first task: none ran here.
    assert_eq!(index_files(&d), cpus, "one spawner (and index file) per CPU, none yet for wide tasks");
    let slot_files = std::fs::read_dir(d.run_dir().join("out/agent-0"))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("slot-"))
        .count();
    assert_eq!(slot_files, 2 * cpus, "a stdout and a stderr file per CPU");
    // `htc output` finds a task's output in whichever spawner's index holds it.
    let last = d.htc(&["output", &d.run_id(), "400"]);
    assert!(last.status.success(), "{}", text(&last));

    if cpus < 2 {
        return; // a two-core task cannot run here at all
    }
    // A wide task among narrow ones: it runs in the wide spawner, whose slots follow the loops'
    // (its first is numbered `cpus`), and the narrow ones keep every CPU's loop.
    let d = Dir::new("layout-wide");
    let narrow = "true\n".repeat(200);
    d.write("tasks.txt", format!("{narrow}[cores=2] test \"$HTC_CORES\" = 2\n{narrow}"));
    let o = d.htc(&["run", "tasks.txt", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(agents_used(&d.run_dir()), HashSet::from([0]), "one agent with every CPU");
    let used = slots_used(&d.run_dir());
    assert!((0..cpus as u32).all(|s| used.contains(&s)), "every loop still ran tasks: {used:?}");
    assert!(used.contains(&(cpus as u32)), "the wide task ran in the wide spawner: {used:?}");
    assert_eq!(index_files(&d), cpus + 1, "the wide spawner made its index with its task");
    let out = d.htc(&["output", &d.run_id(), "201"]);
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn spawn_loops_too_narrow_for_a_task_are_refused_before_anything_runs() {
    if htc::executor::allowed_cpus().len() < 2 {
        return; // a two-core task cannot run here at all
    }
    let d = Dir::new("spawners-narrow");
    d.write("tasks.txt", "true\n[cores=2] true\n");
    let o = d.htc(&["run", "tasks.txt", "--agents", "1", "--cores-per-agent", "2", "--spawners", "2", "-q"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("a task needs 2 cores") && text(&o).contains("--spawners 1"), "{}", text(&o));
}

/// Each line of `ids.txt` is "TASK AGENT": every task ran exactly once; the agents that ran them.
fn ran_once_by(ids: &Path, n: usize) -> HashMap<u64, u32> {
    let mut by = HashMap::new();
    for l in fs::read_to_string(ids).unwrap().lines() {
        let mut w = l.split(' ');
        let (task, agent) = (w.next().unwrap().parse().unwrap(), w.next().unwrap().parse().unwrap());
        assert!(by.insert(task, agent).is_none(), "task ran twice: {l}");
    }
    assert_eq!(by.len(), n, "some task never ran");
    by
}

#[test]
fn instances_of_several_agents_share_their_head_s_tasks_and_the_ledger_names_who_ran_each() {
    let d = Dir::new("instances");
    let ids = d.path("ids.txt");
    let tasks: String = (0..300)
        .map(|_| format!("sleep 0.02; echo $HTC_TASK_ID $HTC_AGENT >> {}; echo out-$HTC_TASK_ID\n", ids.display()))
        .collect();
    d.write("tasks.txt", tasks);
    // Instances of three: heads 0 and 3 deal with the leader, 1, 2, 4 and 5 with their heads,
    // and agent 6 is an instance alone.
    let o = d.htc(&["run", "--agents", "7", "--instance-agents", "3", "--cores-per-agent", "1", "tasks.txt"]);
    assert!(o.status.success(), "{}", text(&o));
    let by = ran_once_by(&ids, 300);
    let agents: HashSet<u32> = by.values().copied().collect();
    assert_eq!(agents.len(), 7, "agents that ran tasks: {agents:?}");
    let run = d.run_dir();
    let l = Ledger::open(&run.join("ledger.mdb"), true).unwrap();
    l.read().unwrap().for_each(|id, r| assert_eq!(r.agent(), by[&id], "the ledger's agent of task {id}")).unwrap();
    // The output of a task a member ran is found where that member wrote it.
    let (&task, _) = by.iter().find(|(_, &a)| a == 4).unwrap();
    let o = d.htc(&["output", &d.run_id(), &task.to_string()]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), format!("out-{task}\n"), "{}", text(&o));
    // Members connect to their head, which publishes its address; the leader hears from 3 heads.
    let tree = run.join("tree");
    assert!(tree.join("htc-addr-0").exists() && tree.join("htc-addr-3").exists());
    assert!(!tree.join("htc-addr-1").exists() && !tree.join("htc-addr-6").exists());
    let log = fs::read_to_string(run.join("log/agent-0.log")).unwrap();
    assert!(log.contains("member joined head=0 member=1") && log.contains("member=2"), "{log}");
}

#[test]
fn a_killed_member_costs_its_started_tasks_which_run_again_and_its_head_carries_on() {
    let d = Dir::new("memberloss");
    let args = ["run", "--agents", "4", "--instance-agents", "2", "--cores-per-agent", "1"];
    let run = kill_agent_mid_run(&d, 1200, &args, 1);
    let l = Ledger::open(&run.join("ledger.mdb"), true).unwrap();
    let t = l.read().unwrap();
    let (mut lost_on_1, mut after_by_0) = (0, 0);
    t.for_each(|id, r| {
        assert_eq!(r.state(), State::Done, "task {id}");
        for a in t.attempts(id).unwrap().iter().filter(|a| a.ended.outcome == htc::ledger::Outcome::Lost) {
            assert_eq!(a.agent, 1, "task {id} lost on agent {}", a.agent);
            lost_on_1 += 1;
            after_by_0 += (r.agent() != 1) as u32;
        }
    })
    .unwrap();
    assert!(lost_on_1 > 0, "no attempt was recorded as lost with the member");
    assert_eq!(after_by_0, lost_on_1, "each lost task ran again on another agent");
    let log = fs::read_to_string(run.join("log/agent-0.log")).unwrap();
    assert!(log.contains("member lost head=0 member=1"), "{log}");
}

/// A head killed mid-run: its member, cut off, stops what it held (it went back with the head)
/// and comes back to the leader empty, then works on for its instance.
#[test]
fn a_killed_head_s_member_comes_back_to_the_leader_and_works_on() {
    let d = Dir::new("headloss");
    let args = ["run", "--agents", "4", "--instance-agents", "2", "--cores-per-agent", "1"];
    let run = kill_agent_mid_run(&d, 1200, &args, 2);
    let log = fs::read_to_string(run.join("log/agent-3.log")).unwrap();
    assert!(log.contains("lost its instance head") && log.contains("back with the leader as a fresh member"), "{log}");
    let l = Ledger::open(&run.join("ledger.mdb"), true).unwrap();
    let t = l.read().unwrap();
    let mut lost_at = u64::MAX;
    t.for_each(|id, _| {
        for a in t.attempts(id).unwrap().iter().filter(|a| a.ended.outcome == htc::ledger::Outcome::Lost) {
            lost_at = lost_at.min(a.ended.end_us);
        }
    })
    .unwrap();
    assert!(lost_at < u64::MAX, "no attempt was recorded as lost with the head");
    let mut by_member_after = 0;
    t.for_each(|id, r| {
        assert_eq!(r.state(), State::Done, "task {id}");
        by_member_after += (r.agent() == 3 && r.start_us() > lost_at) as u32;
    })
    .unwrap();
    assert!(by_member_after > 0, "the member ran nothing after its head was lost");
}

#[test]
fn options_that_make_no_sense_are_refused_by_name_and_leave_no_run_behind() {
    let d = Dir::new("bad-options");
    d.write("tasks.txt", "echo a\n");
    let ledgers = d.path("ledgers");
    let ledger_dir = ledgers.to_str().unwrap();
    for (args, says) in [
        (vec!["--agents", "0"], "--agents"),
        (vec!["--cores-per-agent", "0"], "--cores-per-agent"),
        (vec!["--fanout", "0"], "--fanout"),
        (vec!["--spawners", "99999", "--cores-per-agent", "2"], "--spawners 99999"),
        (vec!["--gpus", "x,y"], "'x' is not a device index"),
    ] {
        let mut all = vec!["run", "tasks.txt", "--ledger-dir", ledger_dir];
        all.extend(&args);
        let o = d.htc(&all);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!d.path(".htc").exists(), "{args:?} left .htc/ behind");
        assert!(fs::read_dir(&ledgers).map_or(true, |mut r| r.next().is_none()), "{args:?} left a ledger folder");
    }
    // A task file with an error is refused the same way, leaving nothing behind either.
    d.write("bad.txt", "[cores=x] echo a\n");
    let o = d.htc(&["run", "bad.txt", "--ledger-dir", ledger_dir]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(!d.path(".htc").exists(), "a refused task file left .htc/ behind");
    assert!(
        fs::read_dir(&ledgers).map_or(true, |mut r| r.next().is_none()),
        "a refused task file left a ledger folder"
    );
    // GPU UUIDs are device names too.
    let o = d.htc(&["run", "-q", "tasks.txt", "--gpus", "GPU-8f2a1c3e-0000-1111-2222-333344445555"]);
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn htc_watch_without_a_terminal_says_so_and_what_to_use_instead() {
    let d = Dir::new("watch-no-tty");
    d.write("tasks.txt", "echo a\n");
    assert!(d.htc(&["run", "-q", "tasks.txt"]).status.success());
    let o = d.htc(&["watch", &d.run_id()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("needs a terminal") && err.contains("htc status"), "{err}");
}

/// Issue 24, D7: a process a task starts outside its process group (`setsid`, as a daemon
/// does) ends with its task, while the agent goes on: a later task of the same run no longer
/// finds it. With `--keep-daemons` it lives until the agent ends, and not past that, even when
/// the task ends as it starts it (`setsid` still on its way out of the task's group then).
#[test]
fn what_a_task_leaves_outside_its_group_ends_with_it_unless_daemons_are_kept() {
    let n = std::process::id() % 100 + 100;
    // The task looks for "slee[p] 30N", which matches the daemon and not its own command line.
    let (marker, pattern) = (format!("sleep 30{n}"), format!("slee[p] 30{n}"));
    let alive = || {
        let o = Command::new("pgrep").args(["-f", &marker]).output().unwrap();
        !o.stdout.is_empty()
    };
    let d = Dir::new("leftovers");
    for (keep, seen) in [(false, "gone"), (true, "alive")] {
        // Without --keep-daemons the daemon is given time to leave the task's group, so that
        // what ends it is the sweeper; with it, none: the task ends as it starts the daemon.
        let wait = if keep { "" } else { " sleep 0.3;" };
        d.write(
            "t.txt",
            format!(
                "echo started; setsid {marker} &{wait}\n\
                 sleep 1.5; if pgrep -f '{pattern}' >/dev/null; then echo alive; else echo gone; fi\n"
            ),
        );
        let _ = fs::remove_dir_all(d.path(".htc"));
        let mut args = vec!["run", "t.txt", "--agents", "1", "--cores-per-agent", "1", "-q"];
        if keep {
            args.push("--keep-daemons");
        }
        let o = d.htc(&args);
        assert!(o.status.success(), "{}", text(&o));
        let out = d.htc(&["output", &d.run_id(), "2"]);
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), seen, "keep_daemons={keep}: {}", text(&out));
        assert!(wait_for(|| !alive(), Duration::from_secs(5)), "{marker} outlived the agent (keep_daemons={keep})");
        if !keep {
            let log = fs::read_to_string(d.run_dir().join("log/agent-0.log")).unwrap();
            assert!(log.contains("killed a process the task left behind") && log.contains("task=1"), "{log}");
        }
    }
}

/// A node-local ledger is removed only when no process has it open (a job id of an old session
/// may be a live run's after the controller started ids over): a live run's ledger is in use,
/// a finished run's is not.
#[test]
fn a_ledger_a_live_run_has_open_is_seen_in_use() {
    let d = Dir::new("in-use");
    d.write("t.txt", "sleep 3\n");
    let mut leader = d.spawn_htc(&["run", "t.txt", "-q"], &[]);
    let ledger = || fs::read_dir(d.path(".htc")).ok()?.flatten().next().map(|e| e.path().join("ledger.mdb"));
    assert!(wait_for(|| ledger().is_some_and(|l| htc::replica::in_use(&l)), Duration::from_secs(10)));
    assert!(leader.wait().unwrap().success());
    assert!(!htc::replica::in_use(&ledger().unwrap()), "the run ended: nobody holds it");
}

/// A run that ends before every agent it started has joined (one task, eight agents; a resume
/// with nothing left) tells those agents to go too: it ends at once, not after the leader's
/// last wait for its agents (15 s), with none of them reconnecting, refused as still connected.
#[test]
fn a_run_that_ends_before_its_agents_joined_lets_them_go_at_once() {
    let d = Dir::new("ends-first");
    d.write("one.txt", "true\n");
    for args in [&["run", "one.txt", "--agents", "8", "--cores-per-agent", "1"][..], &["run", "--resume"][..]] {
        let t = std::time::Instant::now();
        let o = d.htc(args);
        assert!(o.status.success(), "{args:?}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains("already connected"), "{args:?}: agents were left to reconnect: {err}");
        assert!(t.elapsed() < Duration::from_secs(10), "{args:?} took {:?}: {err}", t.elapsed());
        assert!(!agents_alive(&d.run_dir(), 8), "{args:?} left agents running");
    }
}
