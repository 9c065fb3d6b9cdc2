//! What a task inherits from the engine. A task of `htc run` must see itself as `sh -c` sees
//! itself when started from a plain shell on a terminal: descriptors 0, 1 and 2 only, no signal
//! ignored, none blocked. And every descriptor the engine opens is close-on-exec, so nothing of
//! the run (the ledger above all: a task that wrote to it broke the run) reaches what it starts.
//!
//! The reference is `sh -c LINE` started by this test in the state a login shell leaves its
//! children: every signal at its default, an empty mask, nothing open above 2. The test process
//! itself is not such a parent (cargo starts it with posix_spawn, which leaves glibc's signals
//! 32 and 33 ignored, and it may hold descriptors its own parent leaked), so that state is made
//! explicitly in `plain`. `htc run`, on the contrary, is started from a deliberately dirty
//! parent: signals ignored and blocked, a stray descriptor open, so the test also shows that
//! none of that reaches a task.

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::fcntl::{open, OFlag};
use nix::sys::signal::{sigprocmask, SigSet, SigmaskHow, Signal};
use nix::sys::stat::Mode;
use nix::unistd::dup2_raw;
use std::os::fd::IntoRawFd;

use crate::common;
use common::{agent_pids, guard_pids, text, wait_some, Dir, HTC};

/// The two views compared, as task lines. The first has no shell syntax, so `htc` execs `ls`
/// itself; the second runs under `/bin/sh -c`. The reference runs both as `sh -c LINE`.
const LS_FD: &str = "ls -l /proc/self/fd";
const SIG: &str = "grep -E 'Sig(Ign|Blk)' /proc/self/status";

/// A descriptor the dirty parent leaves open, without close-on-exec, to `htc run`.
const STRAY_FD: i32 = 37;

/// Sets every signal's disposition, 1 to 64 (SIGKILL and SIGSTOP excepted), with the raw system
/// call: glibc's `sigaction` refuses its internal signals 32 and 33, which are the point here.
/// Async-signal-safe: runs between fork and exec.
fn set_all_dispositions(handler: usize) {
    // The kernel's struct sigaction starts with the handler; the rest zero: no flags, no mask.
    let mut act = [0u64; 8];
    act[0] = handler as u64;
    for sig in 1..=64 {
        if sig != libc::SIGKILL && sig != libc::SIGSTOP {
            // SAFETY: a valid struct pointer, no old-action pointer.
            unsafe { libc::syscall(libc::SYS_rt_sigaction, sig, act.as_ptr(), std::ptr::null_mut::<u64>(), 8usize) };
        }
    }
}

/// Async-signal-safe (nix's set and sigprocmask allocate nothing).
fn set_mask(signals: &[Signal]) {
    let mut set = SigSet::empty();
    for &s in signals {
        set.add(s);
    }
    let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&set), None);
}

/// What a shell on a terminal gives the commands it starts: every signal at its default, an
/// empty mask, nothing open above 2 (marked close-on-exec rather than closed: std's exec-error
/// pipe is one of them).
fn plain(cmd: &mut Command) -> &mut Command {
    // SAFETY: only async-signal-safe system calls in the child.
    unsafe {
        cmd.pre_exec(|| {
            set_all_dispositions(libc::SIG_DFL);
            set_mask(&[]);
            if libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// A careless parent: every signal ignored (SIGCHLD excepted: the agents must see their
/// children), SIGUSR2 and SIGWINCH blocked, and `STRAY_FD` open without close-on-exec.
fn dirty(cmd: &mut Command) -> &mut Command {
    // SAFETY: only async-signal-safe system calls in the child; nothing there owns STRAY_FD, so
    // dup2 may put /dev/null in its place.
    unsafe {
        cmd.pre_exec(|| {
            set_all_dispositions(libc::SIG_IGN);
            let mut dfl = [0u64; 8];
            dfl[0] = libc::SIG_DFL as u64;
            libc::syscall(libc::SYS_rt_sigaction, libc::SIGCHLD, dfl.as_ptr(), std::ptr::null_mut::<u64>(), 8usize);
            set_mask(&[Signal::SIGUSR2, Signal::SIGWINCH]);
            let fd = open(c"/dev/null", OFlag::O_RDONLY, Mode::empty())?;
            // Left open (not owned: no close-on-exec); `fd` is closed on the way out.
            let _ = dup2_raw(&fd, STRAY_FD)?.into_raw_fd();
            Ok(())
        })
    }
}

/// One `ls -l /proc/self/fd` line as "fd mode target", or None for the "total" line. The mode is
/// the link's permission bits (how the descriptor was opened: `r-x` read, `-wx` write). Targets
/// that necessarily differ between a task and the reference are reduced to their kind: a regular
/// file (the task's stdout and stderr are its slot's stream files, the reference's are files of
/// this test), `ls`'s own directory descriptor `/proc/PID/fd`, and the inode numbers of pipes,
/// sockets and other anonymous files. Anything else, `/dev/null` included, is kept as it is.
fn fd_line(line: &str) -> Option<String> {
    let (left, target) = line.split_once(" -> ")?;
    let fields: Vec<&str> = left.split_whitespace().collect();
    let (mode, fd) = (fields.first()?, fields.last()?);
    let kind = if target.starts_with("/proc/") && target.ends_with("/fd") {
        "/proc/PID/fd".to_string()
    } else if let Some(i) = target.find(":[") {
        format!("{}:[…]", &target[..i])
    } else if fs::metadata(target).is_ok_and(|m| m.is_file()) {
        "regular file".to_string()
    } else if target.ends_with(" (deleted)") && (target.contains("/#") || target.starts_with("/memfd:")) {
        // A task's stdout and stderr: an unnamed regular file of its own (the agent's capture),
        // which /proc names by its inode.
        "regular file".to_string()
    } else {
        target.to_string()
    };
    Some(format!("{fd} {mode} {kind}"))
}

fn fd_view(ls: &str) -> Vec<String> {
    let mut v: Vec<String> = ls.lines().filter_map(fd_line).collect();
    v.sort_by_key(|l| l.split(' ').next().and_then(|n| n.parse::<i32>().ok()));
    v
}

/// `sh -c LINE` from a plain parent, with stdin from /dev/null and stdout/stderr to files (as a
/// task's are): what it printed.
fn reference(d: &Dir, name: &str, line: &str) -> String {
    let out = d.path(&format!("{name}.out"));
    let err = d.path(&format!("{name}.err"));
    let status = plain(
        Command::new("sh")
            .arg("-c")
            .arg(line)
            .stdin(Stdio::null())
            .stdout(fs::File::create(&out).unwrap())
            .stderr(fs::File::create(&err).unwrap()),
    )
    .status()
    .unwrap();
    assert!(status.success(), "reference `sh -c {line}`: {status}: {}", fs::read_to_string(&err).unwrap());
    fs::read_to_string(out).unwrap()
}

#[test]
fn a_task_sees_what_sh_from_a_plain_shell_sees() {
    let d = Dir::new("view");
    fs::write(d.path("tasks.txt"), format!("{LS_FD}\n{SIG}\n")).unwrap();
    let o = dirty(Command::new(HTC).args(["run", "--agents", "1", "--cores-per-agent", "2", "tasks.txt"]))
        .current_dir(&d.0)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let run = d.run_id();
    let output = |task: &str| {
        let o = Command::new(HTC).args(["output", &run, task]).current_dir(&d.0).output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
        String::from_utf8(o.stdout).unwrap()
    };
    let (task_ls, task_sig) = (output("1"), output("2"));
    let (ref_ls, ref_sig) = (reference(&d, "ls", LS_FD), reference(&d, "sig", SIG));

    // The reference is what a shell on a terminal shows: nothing ignored, nothing blocked, and
    // 0-2 plus the directory `ls` is reading.
    assert_eq!(ref_sig, "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n");
    assert_eq!(
        fd_view(&ref_ls),
        [
            "0 lr-x------ /dev/null",
            "1 l-wx------ regular file",
            "2 l-wx------ regular file",
            "3 lr-x------ /proc/PID/fd"
        ],
        "{ref_ls}"
    );

    // The Sig lines are compared exactly; the fd listings by number, open mode and target (or
    // its kind, see fd_line).
    assert_eq!(
        (fd_view(&task_ls), task_sig.as_str()),
        (fd_view(&ref_ls), ref_sig.as_str()),
        "a task's view (left) differs from a plain shell's (right); `ls -l` of the task:\n{task_ls}"
    );
}

/// Process ids whose parent is `pid`.
fn children(pid: u32) -> Vec<u32> {
    let mut v = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(stat) = fs::read_to_string(format!("/proc/{p}/stat")) else { continue };
        // The command name may hold spaces and parentheses: the fields after the last ')'.
        let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
        if ppid == Some(pid) {
            v.push(p);
        }
    }
    v
}

/// Descriptors above 2 of `pid` without close-on-exec, as "fd -> target".
fn inheritable(pid: u32) -> Vec<String> {
    let mut v = Vec::new();
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fd")) else { return v };
    for e in dir.flatten() {
        let fd = e.file_name().to_string_lossy().into_owned();
        if fd.parse::<i32>().is_ok_and(|n| n <= 2) {
            continue;
        }
        let Ok(info) = fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")) else { continue };
        let flags = info
            .lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
            .unwrap_or(0);
        if flags & libc::O_CLOEXEC as u32 == 0 {
            let target = fs::read_link(e.path()).map(|t| t.display().to_string()).unwrap_or_default();
            v.push(format!("{fd} -> {target}"));
        }
    }
    v
}

#[test]
fn every_descriptor_of_the_leader_and_its_agents_is_close_on_exec() {
    let d = Dir::new("cloexec");
    // Long enough to look at every process while the run is in full swing.
    fs::write(d.path("tasks.txt"), "sleep 4\nsleep 4\nsleep 4\n").unwrap();
    // A plain parent: whatever is found open and inheritable is the engine's own doing. Fan-out
    // 2 makes agent 0 a relay for agent 2, so a relay's listener and links are looked at too.
    let args = ["run", "--agents", "3", "--cores-per-agent", "1", "--fanout", "2", "tasks.txt"];
    let mut leader = plain(Command::new(HTC).args(args))
        .current_dir(&d.0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lid = leader.id();
    // The leader's children are the agents' guards (`htc::guard`), which hold little; the agents
    // and relays are the guards' children. So each agent is found by its command line, as the
    // child of its guard, and must be running a task: then it has joined (its sockets, and agent
    // 0's relay listener and links, are open) and its stream files are open.
    let running_task = |agent: i32| {
        children(agent as u32)
            .into_iter()
            .any(|t| fs::read_to_string(format!("/proc/{t}/comm")).is_ok_and(|c| c == "sleep\n"))
    };
    let procs = wait_some(Duration::from_secs(20), || {
        let run = fs::read_dir(d.path(".htc")).ok()?.flatten().next()?.path();
        let mut procs = vec![("leader", lid as i32)];
        for a in 0..3 {
            let (guard, agent) = (guard_pids(&run, a), agent_pids(&run, a));
            if guard.len() != 1 || agent.len() != 1 || !running_task(agent[0]) {
                return None;
            }
            procs.extend([("guard", guard[0]), ("agent", agent[0])]);
        }
        Some(procs)
    });
    let mut found = Vec::new();
    for &(what, pid) in procs.iter().flatten() {
        found.extend(inheritable(pid as u32).into_iter().map(|f| format!("{what} {pid}: {f}")));
    }
    let status = leader.wait().unwrap();
    assert!(procs.is_some(), "not every agent was seen, as its guard's child, running a task");
    assert!(status.success(), "htc run: {status}");
    assert!(found.is_empty(), "descriptors a child would inherit:\n{}", found.join("\n"));
    // The run still reads back after its tasks had every chance to touch the ledger.
    let st = Command::new(HTC).arg("status").current_dir(&d.0).output().unwrap();
    assert!(String::from_utf8_lossy(&st.stdout).contains("done=3"), "{}", text(&st));
    assert!(Path::new(&d.path(".htc")).is_dir());
}
