//! Issue 24, finding 11: a machine busy with other work does not make the run's liveness
//! checks fire. Two `yes > /dev/null` per CPU compete with the leader and the agents for the
//! whole run; heartbeats and acks go out from the network side, not behind the ledger's commits,
//! so no lease expires, no agent is given up and no task runs twice. Its own test binary: the
//! load it makes would slow every test that ran beside it.

use crate::common;

use std::collections::HashMap;
use std::fs;
use std::process::{Command, Stdio};

use common::{text, Dir};

/// Stops the load however the test ends.
struct Load(Vec<std::process::Child>);

impl Drop for Load {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn under_other_work_on_every_cpu_no_lease_expires_and_no_task_runs_twice() {
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let yes =
        (0..2 * cpus).map(|_| Command::new("yes").stdout(Stdio::null()).spawn().expect("yes runs")).collect::<Vec<_>>();
    let _load = Load(yes);
    let d = Dir::new("under-load");
    let ids = d.path("ids.txt");
    // About 10 s of work on 2 agents of 1 core, tasks that spawn a few processes each.
    let n = 400;
    let tasks: String = (0..n).map(|_| format!("sleep 0.05; echo $HTC_TASK_ID >> {}\n", ids.display())).collect();
    d.write("tasks.txt", tasks);
    let o =
        d.htc_env(&["run", "--agents", "2", "--cores-per-agent", "1", "tasks.txt"], &[("HTC_LOG", "info".as_ref())]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains(&format!("{n} tasks: {n} done, 0 failed")), "{}", text(&o));
    let mut ran: HashMap<u64, usize> = HashMap::new();
    for l in fs::read_to_string(&ids).unwrap().lines() {
        *ran.entry(l.trim().parse().unwrap()).or_default() += 1;
    }
    let twice: Vec<_> = ran.iter().filter(|(_, &c)| c > 1).collect();
    assert_eq!((ran.len(), twice.len()), (n, 0), "ran twice: {twice:?}");
    let mut logs = text(&o);
    for a in 0..2 {
        logs += &fs::read_to_string(d.run_dir().join(format!("log/agent-{a}.log"))).unwrap_or_default();
    }
    for sign in ["agent lost", "lease", "given up", "silent for"] {
        assert!(!logs.contains(sign), "{sign:?} under load:\n{logs}");
    }
}
