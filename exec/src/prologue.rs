//! The batch script as the tasks' environment prologue: it runs once, in the batch step, before
//! any task; what it exports, the directory it ends in and its umask become every task's.
//!
//! Shell scripts are sourced by bash under an EXIT trap that dumps the environment (so `exit 0`
//! in the script still counts as success). A script for another interpreter (a `#!` naming e.g.
//! python) runs as itself: its exit status gates the tasks, but its environment cannot be seen.

use std::ffi::OsString;
use std::io::Read;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::sys::resource::{getrlimit, Resource};
use nix::sys::signal::SigSet;
use nix::sys::stat::{umask, Mode};

#[derive(Debug)]
pub struct Prologue {
    pub env: Vec<(OsString, OsString)>,
    pub cwd: PathBuf,
    pub umask: u32,
    /// False when the script was not a shell script: `env`, `cwd`, `umask` are the leader's own.
    pub captured: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum PrologueError {
    #[error("the batch script {script} failed ({status}); no task was run")]
    Failed { script: String, status: String },
    #[error("cannot run the batch script {script}: {source}")]
    Spawn { script: String, source: std::io::Error },
    #[error("cannot read the environment the batch script left: {0}")]
    State(String),
}

/// Set (to 1) for the batch script while it runs as the run's prologue, and only then: a script
/// can tell it runs under slurm-htc, not as a plain job on a node without the plugin (`htc
/// submit`'s script fails there saying so). Not passed on to the tasks.
pub const MARK: &str = "HTC_PROLOGUE";

const WRAPPER: &str = r#"__htc_state=$1; __htc_script=$2; shift 2
__htc_dump() {
  __htc_rc=$?
  if [ "$__htc_rc" -eq 0 ]; then
    { printf '%s\0%s\0' "$PWD" "$(umask)" && env -0; } > "$__htc_state" || __htc_rc=1
  fi
  exit "$__htc_rc"
}
trap __htc_dump EXIT
. "$__htc_script"
"#;

/// Shell scripts (no `#!`, or one naming sh, bash, dash, ksh or zsh) are sourced.
pub fn is_shell_script(script: &Path) -> bool {
    let mut head = [0u8; 256];
    let n = std::fs::File::open(script).and_then(|mut f| f.read(&mut head)).unwrap_or(0);
    let head = &head[..n];
    if !head.starts_with(b"#!") {
        return true;
    }
    let line = head[2..].split(|&b| b == b'\n').next().unwrap_or(b"");
    let words: Vec<&[u8]> = line.split(|b| b.is_ascii_whitespace()).filter(|w| !w.is_empty()).collect();
    let interp = match words.as_slice() {
        [env, prog, ..] if env.ends_with(b"/env") => *prog,
        [prog, ..] => prog.rsplit(|&b| b == b'/').next().unwrap_or(prog),
        [] => return true,
    };
    matches!(interp, b"sh" | b"bash" | b"dash" | b"ksh" | b"zsh")
}

/// Runs `script` with `args`; `state` is a scratch file path (in the run directory).
pub fn run(script: &Path, args: &[OsString], state: &Path) -> Result<Prologue, PrologueError> {
    let shown = script.display().to_string();
    let captured = is_shell_script(script);
    let mut cmd = if captured {
        let _ = std::fs::remove_file(state);
        let mut c = Command::new("/bin/bash");
        c.arg("-c").arg(WRAPPER).arg("htc-prologue").arg(state).arg(script);
        c
    } else {
        Command::new(script)
    };
    cmd.args(args).stdin(std::process::Stdio::null()).env(MARK, "1");
    // SAFETY: clean_child_state makes only async-signal-safe system calls.
    unsafe {
        cmd.pre_exec(|| {
            clean_child_state();
            Ok(())
        })
    };
    let status = cmd.status().map_err(|source| PrologueError::Spawn { script: shown.clone(), source })?;
    if !status.success() {
        return Err(PrologueError::Failed { script: shown, status: status.to_string() });
    }
    if !captured {
        // Reading the process-wide umask requires setting it; restored at once.
        let mask = umask(Mode::from_bits_truncate(0o022));
        umask(mask);
        return Ok(Prologue {
            env: std::env::vars_os().collect(),
            cwd: std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
            umask: mask.bits(),
            captured: false,
        });
    }
    let raw = std::fs::read(state).map_err(|e| PrologueError::State(e.to_string()))?;
    let _ = std::fs::remove_file(state);
    let mut parts = raw.split(|&b| b == 0);
    let cwd = PathBuf::from(OsString::from_vec(parts.next().unwrap_or_default().to_vec()));
    let umask_s = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let umask =
        u32::from_str_radix(umask_s.trim(), 8).map_err(|_| PrologueError::State(format!("bad umask '{umask_s}'")))?;
    let env = parts
        .filter(|kv| !kv.is_empty())
        .filter_map(|kv| {
            let i = kv.iter().position(|&b| b == b'=')?;
            let (k, v) = (&kv[..i], &kv[i + 1..]);
            // Bash's own bookkeeping, not the user's environment; the mark is the prologue's.
            (!matches!(k, b"_" | b"SHLVL" | b"OLDPWD") && k != MARK.as_bytes())
                .then(|| (OsString::from_vec(k.to_vec()), OsString::from_vec(v.to_vec())))
        })
        .collect();
    Ok(Prologue { env, cwd, umask, captured: true })
}

/// In the forked child, before exec: what a script started from a shell on a terminal gets, as
/// the tasks do (see `executor`). The leader may have inherited descriptors (slurmstepd's) and
/// ignored signals (Rust's and glibc's posix_spawn leave glibc's internal signals 32 and 33
/// ignored in every child), and the batch script must see neither.
///
/// Only async-signal-safe system calls: this runs between fork and exec. glibc's `sigaction`
/// refuses signals 32 and 33, so the dispositions are reset with the raw system call.
fn clean_child_state() {
    // A zeroed kernel `struct sigaction` is SIG_DFL with no flags and an empty mask on every
    // architecture; 64 bytes cover its largest layout.
    let dfl = [0u64; 8];
    // nix's wrappers below allocate nothing: async-signal-safe as the calls they make.
    for sig in 1..=64 {
        if sig != libc::SIGKILL && sig != libc::SIGSTOP {
            // SAFETY: a raw syscall with a valid struct pointer and no old-action pointer;
            // failures (SIGKILL, SIGSTOP) change nothing.
            unsafe { libc::syscall(libc::SYS_rt_sigaction, sig, dfl.as_ptr(), std::ptr::null_mut::<u64>(), 8usize) };
        }
    }
    let _ = SigSet::empty().thread_set_mask();
    // Marked, not closed: std's own exec-error pipe is among them and must survive a failed
    // exec to report it.
    // SAFETY: close_range takes no pointers and only marks descriptors (nix has no wrapper).
    if unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) } != 0 {
        // Kernels before 5.11: every number the descriptor limit allows.
        let max = getrlimit(Resource::RLIMIT_NOFILE).map_or(1024, |(soft, _)| soft.min(1 << 16));
        for fd in 3..max as libc::c_int {
            // Raw: these numbers are owned by nothing here, many are not open at all, so there
            // is no descriptor to lend nix.
            // SAFETY: fcntl takes no pointers; only descriptor flags change, and a number that
            // is not open fails harmlessly.
            unsafe {
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags >= 0 {
                    libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
                }
            }
        }
    }
}

/// Makes the prologue's result the current process's: directory, umask and environment. Call
/// before any thread starts (the environment is process-global).
pub fn adopt(p: &Prologue) -> std::io::Result<()> {
    std::env::set_current_dir(&p.cwd)?;
    // The mask is process-wide, which is what adopting the prologue's means.
    umask(Mode::from_bits_truncate(p.umask as libc::mode_t));
    if p.captured {
        let keep: std::collections::HashSet<&OsString> = p.env.iter().map(|(k, _)| k).collect();
        for (k, _) in std::env::vars_os() {
            if !keep.contains(&k) {
                std::env::remove_var(&k);
            }
        }
        for (k, v) in &p.env {
            std::env::set_var(k, v);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script(name: &str, body: &str) -> (PathBuf, PathBuf) {
        let d = std::env::temp_dir().join(format!("htc-prologue-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join("job.sh");
        std::fs::write(&p, body).unwrap();
        (p, d.join("state"))
    }

    #[test]
    fn exports_directory_and_umask_are_captured() {
        let (p, st) = script(
            "ok",
            "#!/bin/bash\nexport FOO=bar\nexport ARG1=\"$1\"\nNOT_EXPORTED=1\ncd /tmp\numask 027\nexit 0\n",
        );
        let r = run(&p, &["first arg".into()], &st).unwrap();
        let get = |k: &str| r.env.iter().find(|(kk, _)| kk == k).map(|(_, v)| v.to_string_lossy().into_owned());
        assert_eq!(get("FOO").as_deref(), Some("bar"));
        assert_eq!(get("ARG1").as_deref(), Some("first arg"));
        assert_eq!(get("NOT_EXPORTED"), None);
        assert_eq!(get(MARK), None, "the prologue's mark is not the tasks'");
        assert_eq!(r.cwd, PathBuf::from("/tmp"));
        assert_eq!(r.umask, 0o027);
        assert!(r.captured);
    }

    #[test]
    fn a_failing_script_fails_the_prologue() {
        let (p, st) = script("fail", "#!/bin/sh\necho preparing\nfalse_command_htc_missing\nexit 3\n");
        let e = run(&p, &[], &st).unwrap_err();
        assert!(e.to_string().contains("exit status: 3"), "{e}");
        let (p, st) = script("sete", "set -e\nfalse\nexport NEVER=1\n");
        assert!(run(&p, &[], &st).is_err());
    }

    #[test]
    fn the_script_inherits_no_descriptor_and_no_signal_state() {
        // The test binary is a careless parent: cargo's posix_spawn left signals 32 and 33
        // ignored in it, and this descriptor is open without close-on-exec.
        use nix::fcntl::{open, OFlag};
        use std::os::fd::AsRawFd;
        let stray = open(c"/dev/null", OFlag::O_RDONLY, Mode::empty()).unwrap();
        assert!(stray.as_raw_fd() > 2);
        let (p, st) = script("view", "ls /proc/self/fd > \"$1\"; grep -E 'Sig(Ign|Blk)' /proc/self/status >> \"$1\"\n");
        let out = p.with_file_name("view.txt");
        run(&p, &[out.clone().into()], &st).unwrap();
        let view = std::fs::read_to_string(&out).unwrap();
        drop(stray);
        // 0-2 and the directory `ls` reads, as from a shell on a terminal.
        assert_eq!(view, "0\n1\n2\n3\nSigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n");
    }

    #[test]
    fn the_script_knows_it_runs_as_the_prologue() {
        let (p, st) = script("mark", "[ \"$HTC_PROLOGUE\" = 1 ] || exit 7\n");
        run(&p, &[], &st).unwrap();
        assert!(std::process::Command::new("sh").arg(&p).status().unwrap().code() == Some(7), "not elsewhere");
    }

    #[test]
    fn interpreters() {
        let (p, _) = script("py", "#!/usr/bin/env python3\nprint(1)\n");
        assert!(!is_shell_script(&p));
        let (p, _) = script("bash", "#!/usr/bin/env bash\n");
        assert!(is_shell_script(&p));
        let (p, _) = script("none", "echo hi\n");
        assert!(is_shell_script(&p));
    }
}
