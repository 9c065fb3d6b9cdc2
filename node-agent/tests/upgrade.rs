//! A run interrupted under an earlier release resumes under this one: the ledger it left is read
//! (through a migration once the record's layout changes), every task it recorded done stays
//! done, and the rest run, each once.
//!
//! `fixtures/interrupted-bb08bd2/` is what the release build of commit bb08bd2 left of a local
//! run of its `tasks.txt` (32 tasks: a sweep of 30 in a class, one of 2 cores with memory,
//! retries, a timeout and a priority, one with an output cap and a negative priority) stopped by
//! SIGINT after 11 tasks ended: the run directory (less LMDB's lock file, which LMDB makes
//! anew) under `runs/` (`.htc/` is ignored by git), and the `ids.txt` its tasks appended to.
//! Git keeps no modes but the executable bit: the run's private ones are set again here.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::common;

use common::{text, Dir};

const RUN: &str = "20261127-095754-20017";

fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dest);
        } else {
            fs::copy(e.path(), &dest).unwrap();
        }
    }
}

/// Task ids in the order `ids.txt` lists them.
fn ids(d: &Dir) -> Vec<u64> {
    let s = fs::read_to_string(d.path("ids.txt")).unwrap();
    s.lines().map(|l| l.split_whitespace().next().unwrap().parse().unwrap()).collect()
}

#[test]
fn a_run_interrupted_by_release_bb08bd2_resumes_and_runs_every_task_once() {
    let d = Dir::new("upgrade-bb08bd2");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/interrupted-bb08bd2");
    for f in ["tasks.txt", "ids.txt"] {
        fs::copy(fixture.join(f), d.path(f)).unwrap();
    }
    copy_tree(&fixture.join("runs"), &d.path(".htc"));
    let run = d.path(".htc").join(RUN);
    fs::set_permissions(&run, fs::Permissions::from_mode(0o700)).unwrap();
    fs::set_permissions(run.join("secret"), fs::Permissions::from_mode(0o600)).unwrap();
    let before = ids(&d);
    assert_eq!(before.len(), 11, "the fixture's tasks that ran before the interruption");

    let o = d.htc(&["status", RUN, "--json"]);
    assert!(o.status.success(), "the old ledger is read: {}", text(&o));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["counts"]["done"], 11, "{s}");

    let o = d.htc(&["run", "--resume", RUN, "-q"]);
    assert!(o.status.success(), "{}", text(&o));

    let mut after = ids(&d);
    assert_eq!(after[..before.len()], before[..], "ids.txt only grew");
    after.sort_unstable();
    assert_eq!(after, (1..=32).collect::<Vec<u64>>(), "every task ran exactly once");

    let o = d.htc(&["status", RUN, "--json"]);
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((s["counts"]["done"].as_u64(), s["counts"]["failed"].as_u64()), (Some(32), Some(0)), "{s}");
    let o = d.htc(&["log", RUN, "--format", "json"]);
    let rows: Vec<serde_json::Value> =
        String::from_utf8(o.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 32, "one attempt per task: {rows:?}");
}
