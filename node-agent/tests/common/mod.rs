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
    /// The only run directory under .htc/.
    pub fn run_dir(&self) -> PathBuf {
        let mut runs: Vec<PathBuf> = fs::read_dir(self.path(".htc")).unwrap().map(|e| e.unwrap().path()).collect();
        assert_eq!(runs.len(), 1, "expected exactly one run: {runs:?}");
        runs.pop().unwrap()
    }
    pub fn run_id(&self) -> String {
        self.run_dir().file_name().unwrap().to_string_lossy().into_owned()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
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
