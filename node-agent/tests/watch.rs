//! `htc watch` and `htc run`'s progress bar in a real terminal: tmux runs both, and the test
//! reads their screens (`capture-pane`) as a user would see them.

use crate::common;

use std::process::Command;
use std::time::Duration;

use common::{wait_some, Dir, HTC};

/// A tmux server of the test's own (its own socket), killed when the test ends.
struct Tmux(String);

impl Tmux {
    fn new(name: &str) -> Tmux {
        let t = Tmux(format!("htc-test-{}-{name}", std::process::id()));
        let ok = Command::new("tmux").arg("-V").output().is_ok_and(|o| o.status.success());
        assert!(ok, "tmux is needed for this test (Debian: apt-get install tmux)");
        t
    }
    fn cmd(&self, args: &[&str]) -> String {
        let o = Command::new("tmux").arg("-L").arg(&self.0).args(args).output().unwrap();
        assert!(o.status.success(), "tmux {args:?}: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }
    /// A window running `shell` in `dir`, 120 x 40, kept on screen after its command ends.
    fn window(&self, name: &str, dir: &std::path::Path, shell: &str) {
        let first = self.cmd_ok(&["has-session", "-t", "t"]);
        let mut args = if first {
            vec!["new-window", "-t", "t", "-n", name]
        } else {
            vec!["new-session", "-d", "-s", "t", "-x", "120", "-y", "40", "-n", name]
        };
        let dir = dir.to_str().unwrap();
        args.extend(["-c", dir, shell]);
        self.cmd(&args);
        self.cmd(&["set-option", "-t", &format!("t:{name}"), "remain-on-exit", "on"]);
    }
    fn cmd_ok(&self, args: &[&str]) -> bool {
        Command::new("tmux").arg("-L").arg(&self.0).args(args).output().is_ok_and(|o| o.status.success())
    }
    fn screen(&self, name: &str) -> String {
        self.cmd(&["capture-pane", "-p", "-t", &format!("t:{name}")])
    }
    /// Waits until the window's screen satisfies `f`; the last screen in the panic message.
    fn wait_screen(&self, name: &str, limit: Duration, what: &str, f: impl Fn(&str) -> bool) -> String {
        let mut last = String::new();
        wait_some(limit, || {
            last = self.screen(name);
            f(&last).then(|| last.clone())
        })
        .unwrap_or_else(|| panic!("window {name} never showed {what}; its screen:\n{last}"))
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux").arg("-L").arg(&self.0).arg("kill-server").output();
    }
}

#[test]
fn watch_shows_progress_nodes_and_failures_of_a_running_run() {
    let d = Dir::new("watch");
    // 2 agents, 240 tasks of 0.1 s: about 12 s on this machine's two cores, and two that fail.
    let mut tasks = String::from("#HTC retries=0\n");
    for i in 1..=240 {
        match i {
            30 => tasks.push_str("echo boom >&2; exit 7\n"),
            90 => tasks.push_str("kill -9 $$\n"),
            _ => tasks.push_str("sleep 0.1\n"),
        }
    }
    d.write("tasks.txt", tasks);
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim().to_string();
    let t = Tmux::new("watch");
    let env = format!("HTC_SITE_CONFIG=/dev/null XDG_CONFIG_HOME={}", d.0.display());
    t.window("run", &d.0, &format!("env {env} {HTC} run tasks.txt --agents 2"));
    let bar = t.wait_screen("run", Duration::from_secs(30), "a progress bar", |s| {
        s.contains("[htc] =") && s.contains("=> ") && s.contains("/240 (") && s.contains("tasks/s, ETA")
    });
    assert!(bar.contains("running") && bar.contains("on 2 agents"), "{bar}");
    let run = d.run_id();

    t.window("watch", &d.0, &format!("env {env} {HTC} watch {run}"));
    let s = t.wait_screen("watch", Duration::from_secs(30), "a running run with one failure", |s| {
        s.contains("running") && s.contains(&format!("task 30 (line 31) on {host}: exit 7"))
    });
    assert!(s.contains(&format!("htc watch  run {run}")), "{s}");
    assert!(s.contains("nodes (2)") && s.contains("nodes 2 up of 2"), "{s}");
    // Per-node rows: agent, host, busy/cores, done, failed, last heard, state.
    for agent in ["0", "1"] {
        let row = s.lines().find(|l| l.trim_start_matches('│').starts_with(&format!("{agent}      {host}")));
        let row = row.unwrap_or_else(|| panic!("no row for agent {agent}:\n{s}"));
        assert!(row.contains("/1") && row.contains("ago") && row.contains("up"), "{row}");
    }
    let pct = s.lines().find(|l| l.contains("/240 (")).unwrap_or_else(|| panic!("no progress:\n{s}"));
    assert!(pct.contains('█'), "no bar: {pct}");
    assert!(s.contains("tasks/s") && s.contains("ETA"), "{s}");

    // To the end: both failures listed with their reasons, everything counted.
    let s = t.wait_screen("watch", Duration::from_secs(60), "the finished run", |s| s.contains("complete"));
    assert!(s.contains("complete, 2 tasks failed"), "a run with failures is not said plainly complete: {s}");
    assert!(s.contains("240/240 (100.0%)"), "{s}");
    // The count stands beside the bar, not drawn through it.
    let pct = s.lines().find(|l| l.contains("240/240 (")).unwrap();
    assert!(pct.rfind('█').unwrap() < pct.find("240/240").unwrap(), "{pct}");
    // The full bar is one unbroken run of cells up to the count.
    let drawn = pct[..pct.find(" 240/240").unwrap()].trim_start();
    assert!(!drawn.is_empty() && drawn.chars().all(|c| c == '█'), "a broken bar: {pct}");
    assert!(s.contains("nodes 2, ended with the run") && !s.contains("up of"), "{s}");
    // The agents ended with the run: no row still says "up".
    for agent in ["0", "1"] {
        let row = s.lines().find(|l| l.trim_start_matches('│').starts_with(&format!("{agent}      {host}"))).unwrap();
        assert!(row.contains("ended") && !row.contains(" up"), "{row}");
    }
    assert!(s.contains("failed attempts"), "the per-node column says what it counts: {s}");
    assert!(s.contains("done 238  failed 2"), "{s}");
    assert!(s.contains("killed by signal 9 (KILL)") && s.contains("exit 7"), "{s}");
    assert!(s.contains("recent failures (tasks failed: 2)"), "{s}");

    // q leaves the dashboard and gives the terminal back.
    t.cmd(&["send-keys", "-t", "t:watch", "q"]);
    let dead = wait_some(Duration::from_secs(10), || {
        (t.cmd(&["display-message", "-p", "-t", "t:watch", "#{pane_dead}"]).trim() == "1").then_some(())
    });
    assert!(dead.is_some(), "q did not end htc watch:\n{}", t.screen("watch"));
    let after = t.screen("run");
    assert!(after.contains("htc: 240 tasks: 238 done, 2 failed"), "{after}");
}
