//! What the end-to-end tests share: a scratch directory per test that drives the real `htc`
//! binary, and waiting for a condition with a deadline.
#![allow(dead_code)] // each test file uses its own part of this

use std::fs;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const HTC: &str = env!("CARGO_BIN_EXE_htc");

/// A fresh directory under the system temp dir, removed when the test passes (kept for a look
/// when it fails).
pub struct Dir(pub PathBuf);

impl Dir {
    pub fn new(name: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("htc-e2e-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
    pub fn path(&self, f: &str) -> PathBuf {
        self.0.join(f)
    }
    pub fn write(&self, f: &str, content: impl AsRef<[u8]>) -> PathBuf {
        let p = self.path(f);
        fs::write(&p, content).unwrap();
        p
    }
    pub fn htc(&self, args: &[&str]) -> Output {
        self.htc_env(args, &[])
    }
    /// `htc` with extra environment. No site file applies unless `HTC_SITE_CONFIG` is given:
    /// a calibration on the test machine must not change what the tests see.
    pub fn htc_env(&self, args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> Output {
        let mut c = Command::new(HTC);
        c.args(args).current_dir(&self.0).stdin(Stdio::null()).env("XDG_CONFIG_HOME", &self.0);
        if !env.iter().any(|(k, _)| *k == "HTC_SITE_CONFIG") {
            c.env("HTC_SITE_CONFIG", "/dev/null");
        }
        c.envs(env.iter().copied()).output().unwrap()
    }
    /// `htc` started in the background (a run to disturb while it goes), with `htc_env`'s
    /// environment; its stderr is piped for the assertion messages.
    pub fn spawn_htc(&self, args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> std::process::Child {
        let mut c = Command::new(HTC);
        c.args(args).current_dir(&self.0).stdin(Stdio::null()).env("XDG_CONFIG_HOME", &self.0);
        if !env.iter().any(|(k, _)| *k == "HTC_SITE_CONFIG") {
            c.env("HTC_SITE_CONFIG", "/dev/null");
        }
        c.envs(env.iter().copied()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap()
    }
    /// The only run directory under .htc/.
    pub fn run_dir(&self) -> PathBuf {
        let mut runs: Vec<PathBuf> = fs::read_dir(self.path(".htc")).unwrap().map(|e| e.unwrap().path()).collect();
        assert_eq!(runs.len(), 1, "expected exactly one run: {runs:?}");
        runs.pop().unwrap()
    }
    /// Whether the one run under `.htc/` has a leader that listens. The run directory is made
    /// a moment after `.htc/`: none there yet is not listening (`run_dir` would panic).
    pub fn leader_listens(&self) -> bool {
        let runs: Vec<PathBuf> =
            fs::read_dir(self.path(".htc")).map(|r| r.flatten().map(|e| e.path()).collect()).unwrap_or_default();
        matches!(&runs[..], [one] if one.join("leader.addr").exists())
    }
    pub fn run_id(&self) -> String {
        self.run_dir().file_name().unwrap().to_string_lossy().into_owned()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        // A failed test may leave its run going: stop every process working in the directory
        // (leader, agents, guards, tasks), so that it does not slow the tests after it.
        for e in fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
            if pid as u32 != std::process::id()
                && fs::read_link(e.path().join("cwd")).is_ok_and(|c| c.starts_with(&self.0))
            {
                // A process of this test, found by its working directory.
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            }
        }
        if !std::thread::panicking() {
            let _ = fs::remove_dir_all(&self.0);
        }
    }
}

/// A finished command's status and output, for assertion messages.
pub fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Polls `f` until it yields a value or `limit` passes.
pub fn wait_some<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let end = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `f` until it holds or `limit` passes.
pub fn wait_for(mut f: impl FnMut() -> bool, limit: Duration) -> bool {
    wait_some(limit, || f().then_some(())).is_some()
}

/// Processes of the run whose command line says agent `agent` (its guard, the agent, and a task
/// between posix_spawn's vfork and its exec), with their parents.
fn agent_processes(run: &std::path::Path, agent: u32) -> Vec<(i32, i32)> {
    let mut found = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(cmd) = fs::read(e.path().join("cmdline")) else { continue };
        let args: Vec<&[u8]> = cmd.split(|&b| b == 0).collect();
        let has = |a: &[u8], b: &[u8]| args.windows(2).any(|w| w[0] == a && w[1] == b);
        if has(b"--run-dir", run.as_os_str().as_encoded_bytes()) && has(b"--agent-id", agent.to_string().as_bytes()) {
            let status = fs::read_to_string(e.path().join("status")).unwrap_or_default();
            let ppid = status.lines().find_map(|l| l.strip_prefix("PPid:")).and_then(|v| v.trim().parse().ok());
            found.push((pid, ppid.unwrap_or(0)));
        }
    }
    found
}

/// Pids of the processes whose command line has `part` in one of its arguments (a task's, by a
/// path only it names).
#[allow(dead_code)]
pub fn processes_naming(part: &std::ffi::OsStr) -> Vec<i32> {
    let part = part.as_encoded_bytes();
    let mut found = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(cmd) = fs::read(e.path().join("cmdline")) else { continue };
        if cmd.split(|&b| b == 0).any(|a| a.windows(part.len()).any(|w| w == part)) {
            found.push(pid);
        }
    }
    found
}

/// Whether any process of agents `0..agents` of the run is left: guards, agents, or a task
/// between the agent's vfork and its exec.
#[allow(dead_code)]
pub fn agents_alive(run: &std::path::Path, agents: u32) -> bool {
    (0..agents).any(|a| !agent_processes(run, a).is_empty())
}

/// Pids of the guard processes of agent `agent` (`htc::guard`: the parent that stops the
/// agent's tasks should the agent die): the matches whose parent is not one.
pub fn guard_pids(run: &std::path::Path, agent: u32) -> Vec<i32> {
    let found = agent_processes(run, agent);
    let matched = |p: i32| found.iter().any(|&(q, _)| q == p);
    found.iter().filter(|&&(_, pp)| !matched(pp)).map(|&(p, _)| p).collect()
}

/// Pids of agent `agent` itself: the child of its guard.
pub fn agent_pids(run: &std::path::Path, agent: u32) -> Vec<i32> {
    let guards = guard_pids(run, agent);
    agent_processes(run, agent).into_iter().filter(|(_, pp)| guards.contains(pp)).map(|(p, _)| p).collect()
}
