//! Sweeps: `#HTC sweep` makes one ordinary task per combination of its parameters, with ids in the
//! ledger; `htc check` counts them without making them, and making ten million costs no memory
//! per task.

use crate::common;

use std::process::Command;

use common::{text, Dir, HTC};

#[test]
fn a_sweep_runs_one_task_per_combination_as_ordinary_tasks() {
    let d = Dir::new("sweep");
    std::fs::create_dir(d.path("in")).unwrap();
    d.write("in/params.csv", "alpha,label\n0.5,\"two words\"\n1.5,it's\n");
    d.write(
        "in/tasks.txt",
        "echo before\n#HTC sweep rows=params.csv seed=1..2\n[class=fit] echo fit {alpha} {label} {seed}\n\
         #HTC sweep x=0..1:0.5 +y=a,b,c\necho {x}/{y}\necho after\n",
    );
    // Run from elsewhere: `rows=` is found beside the task file, not in the current directory.
    let o = d.htc(&["check", "in/tasks.txt"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("in/tasks.txt: 9 tasks")
            && out.contains("sweep: line 3 makes 4 tasks")
            && out.contains("sweep: line 5 makes 3 tasks"),
        "{out}"
    );
    let o = d.htc(&["run", "in/tasks.txt", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    let run = d.run_id();
    let o = d.htc(&["output", &run, "--tag"]);
    let want = "1\tbefore\n2\tfit 0.5 two words 1\n3\tfit 0.5 two words 2\n4\tfit 1.5 it's 1\n5\tfit 1.5 it's 2\n\
                6\t0.0/a\n7\t0.5/b\n8\t1.0/c\n9\tafter\n";
    assert_eq!(String::from_utf8_lossy(&o.stdout), want);
    // Ordinary tasks: in the log with their commands (values quoted for the shell), their class
    // and line, and `htc retry` takes them by id.
    let o = d.htc(&["log", &run, "--format", "json"]);
    let rows: Vec<serde_json::Value> =
        String::from_utf8(o.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows[1]["Command"], "echo fit 0.5 'two words' 1");
    assert_eq!(rows[3]["Command"], r"echo fit 1.5 'it'\''s' 1");
    assert_eq!((rows[3]["Line"].as_u64(), rows[7]["Line"].as_u64()), (Some(3), Some(5)));
    let o = d.htc(&["status", &run, "--json"]);
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["counts"]["total"], 9);
    let o = d.htc(&["retry", &run, "--tasks", "7"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = d.htc(&["output", &run, "7"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "0.5/b\n");
    let o = d.htc(&["verify", &run]);
    assert!(o.status.success(), "{}", text(&o));
    // The made commands are found by the offset recorded at load, whatever the copy's size now.
    let before = d.htc(&["log", &run]).stdout;
    let copy = d.run_dir().join("tasks.txt");
    let mut f = std::fs::OpenOptions::new().append(true).open(&copy).unwrap();
    std::io::Write::write_all(&mut f, b"# a longer copy\n").unwrap();
    assert_eq!(d.htc(&["log", &run]).stdout, before);
}

#[test]
fn bad_sweeps_are_refused_at_check_and_run_with_their_place() {
    let d = Dir::new("sweep-bad");
    d.write("a.txt", "#HTC sweep x=1..3 +y=1,2\necho {x} {y}\n");
    for cmd in ["check", "run"] {
        let o = d.htc(&[cmd, "a.txt"]);
        assert!(!o.status.success());
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("a.txt:1:19: sweep: y has 2 values, x linked to it has 3"),
            "{}",
            text(&o)
        );
    }
    assert!(!d.path(".htc").exists() || std::fs::read_dir(d.path(".htc")).unwrap().next().is_none(), "nothing queued");
    d.write("b.txt", "#HTC sweep rows=missing.csv\necho {a}\n");
    let o = d.htc(&["check", "b.txt"]);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("b.txt:1:12: sweep: missing.csv: No such file"),
        "{}",
        text(&o)
    );
}

#[test]
fn checking_a_ten_million_task_sweep_takes_no_memory_per_task() {
    let d = Dir::new("sweep-big");
    d.write("big.txt", "#HTC sweep i=1..10000 j=1..1000\n./model --i {i} --j {j}\n");
    let o = Command::new("/usr/bin/time")
        .args(["-f", "maxrss_kb=%M"])
        .arg(HTC)
        .args(["check", "big.txt"])
        .current_dir(&d.0)
        .output()
        .expect("GNU time is needed (Debian: apt-get install time)");
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("big.txt: 10000000 tasks"), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    let kb: u64 = err.lines().find_map(|l| l.strip_prefix("maxrss_kb=")).unwrap().trim().parse().unwrap();
    // Ten million commands of ~25 bytes would be 250 MB; the parser holds one.
    assert!(kb < 30_000, "htc check of 10 M sweep tasks used {kb} kB");
}
