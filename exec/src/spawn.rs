//! Starting a task's process: a vfork-style `clone` on a stack kept for reuse, which also hands
//! back the child's pidfd.
//!
//! glibc's `posix_spawn` does the same clone but maps a fresh stack for every child and unmaps
//! it after: in a process with several threads on several CPUs each unmap is a TLB shootdown
//! across them, a tenth of a spawner's CPU per `true` task, and the pidfd then cost one more
//! system call (bench/RESULTS.md §14d). The child does what the executor asked of
//! `posix_spawn` before: every signal at its default and unblocked, a process group of its
//! own, stdin from /dev/null, stdout and stderr on the given descriptors, nothing else open.
//!
//! The child shares this process's memory until its `execve`, with this thread suspended
//! (`CLONE_VFORK`): it may only make raw system calls, and every signal stays blocked until
//! its handlers are reset, so none of this process's handlers can run in it. A spawner thread
//! blocks signals once (`block_signals_in_this_thread`), which saves two system calls a spawn.

use std::cell::Cell;
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::signal::{SigSet, Signal};
use nix::sys::wait::waitpid;
use nix::unistd::Pid;

/// Stack for the child until its `execve`; its frame is a few hundred bytes.
const STACK_BYTES: usize = 64 << 10;
/// Linux's signal numbers run from 1 to 64.
const LAST_SIGNAL: libc::c_int = 64;

thread_local! {
    /// Whether this thread blocks every signal a child could take before its handlers reset.
    static BLOCKED: Cell<bool> = const { Cell::new(false) };
}

/// Blocks every signal in the calling thread for good, but glibc's two internal ones (32 and
/// 33: thread cancellation and the set*id broadcast, which would wait forever on a thread that
/// blocks it) and, unless `sigchld`, SIGCHLD. Those two go to this process's threads only, and
/// SIGCHLD to the thread whose child ended, never to a child. A SIGCHLD at its default
/// (ignored) is dropped at once only where that thread does not block it; blocked, it waits for
/// another thread to take it, which woke the agent's main thread for every task.
pub fn block_signals_in_this_thread(sigchld: bool) {
    // glibc's sigfillset leaves its own 32 and 33 out, and pthread_sigmask would drop them too.
    let mut set = SigSet::all();
    if !sigchld {
        set.remove(Signal::SIGCHLD);
    }
    let _ = set.thread_block();
    BLOCKED.with(|b| b.set(true));
}

/// A started child: its pid, and its pidfd where the kernel gives one.
#[derive(Debug)]
pub struct Child {
    pub pid: libc::pid_t,
    pub pidfd: Option<OwnedFd>,
}

/// One spawner's means to start children; used from one thread at a time.
pub struct Spawner {
    stack: Box<[u128]>,
    dev_null: OwnedFd,
    /// Whether `clone` may be asked for a pidfd (`CLONE_PIDFD`, Linux >= 5.2).
    pidfds: bool,
}

/// What the child needs, read through a pointer (the child has its own stack, the same memory).
struct Plan<'a> {
    prog: &'a CStr,
    argv: &'a [*const libc::c_char],
    envp: &'a [*const libc::c_char],
    dev_null: RawFd,
    out: RawFd,
    err: RawFd,
    /// The errno of the step that failed, or 0: written by the child, read once it is gone.
    errno: libc::c_int,
}

impl Spawner {
    /// `pidfds`: ask the kernel for each child's pidfd (it is refused quietly on old kernels).
    pub fn new(pidfds: bool) -> io::Result<Spawner> {
        let dev_null = std::fs::File::open("/dev/null")?.into();
        if !close_range_works() {
            // No close_range (Linux < 5.9): what this process inherited is closed at exec instead.
            mark_inherited_cloexec();
        }
        Ok(Spawner { stack: vec![0u128; STACK_BYTES / 16].into_boxed_slice(), dev_null, pidfds })
    }

    /// Starts `prog` with `argv` and `envp` (NULL-terminated), stdout on `out` and stderr on
    /// `err`. Err(errno) when it could not start, the child already reaped.
    pub fn spawn(
        &mut self,
        prog: &CStr,
        argv: &[*const libc::c_char],
        envp: &[*const libc::c_char],
        out: RawFd,
        err: RawFd,
    ) -> Result<Child, i32> {
        debug_assert!(argv.last().is_some_and(|p| p.is_null()) && envp.last().is_some_and(|p| p.is_null()));
        let mut plan = Plan { prog, argv, envp, dev_null: self.dev_null.as_raw_fd(), out, err, errno: 0 };
        let (pid, pidfd) = match self.clone_child(&mut plan, self.pidfds) {
            Err(e @ (libc::EINVAL | libc::EPERM | libc::ENOSYS | libc::EMFILE | libc::ENFILE)) if self.pidfds => {
                // Out of descriptors, the child starts without a pidfd this time (the executor
                // then reaps it by polling); a kernel or sandbox without CLONE_PIDFD for good.
                if !matches!(e, libc::EMFILE | libc::ENFILE) {
                    self.pidfds = false;
                }
                self.clone_child(&mut plan, false)?
            }
            r => r?,
        };
        // SAFETY: the kernel stored a new descriptor of ours there (CLONE_PIDFD) or left -1.
        let pidfd = (pidfd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(pidfd) });
        if plan.errno != 0 {
            // It exited without exec: reap it here, where it is known.
            let _ = waitpid(Pid::from_raw(pid), None);
            return Err(plan.errno);
        }
        Ok(Child { pid, pidfd })
    }

    /// One clone: (pid, pidfd or -1), returning once the child has exec'd or exited.
    fn clone_child(&mut self, plan: &mut Plan, pidfd: bool) -> Result<(libc::pid_t, RawFd), i32> {
        let mut fd: libc::c_int = -1;
        let mut flags = libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD;
        if pidfd {
            flags |= libc::CLONE_PIDFD;
        }
        let all: u64 = !0;
        let mut old: u64 = 0;
        let blocked = BLOCKED.with(|b| b.get());
        // SAFETY: the stack is ours and unused while this thread waits (CLONE_VFORK); the plan
        // outlives the child's use of it; signals are blocked around the clone (raw syscall,
        // so glibc's own two are too) unless this thread blocks them for good.
        let pid = unsafe {
            let top = self.stack.as_mut_ptr().add(self.stack.len()) as *mut libc::c_void;
            if !blocked {
                sigprocmask(libc::SIG_SETMASK, &all, &mut old);
            }
            let pid =
                libc::clone(child, top, flags, plan as *mut Plan as *mut libc::c_void, &mut fd as *mut libc::c_int);
            let e = io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
            if !blocked {
                sigprocmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
            }
            if pid < 0 {
                return Err(e);
            }
            pid
        };
        Ok((pid, fd))
    }
}

/// Raw `rt_sigprocmask`: all 64 signals, glibc's internal ones included.
///
/// # Safety
///
/// `set` is null or points to a readable u64 and `old` null or to a writable one (the kernel
/// reads and writes 8 bytes). While a thread blocks glibc's own signals (32 and 33), another's
/// set*id call waits for it: block them only briefly (around a clone) or in a child to exec.
unsafe fn sigprocmask(how: libc::c_int, set: *const u64, old: *mut u64) -> libc::c_long {
    libc::syscall(libc::SYS_rt_sigprocmask, how, set, old, 8usize)
}

/// The child, on the spawner's stack: only raw system calls until `execve`. Returns (exits)
/// 127 with `plan.errno` set when a step fails.
extern "C" fn child(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: arg is the parent's Plan, alive and untouched while the parent is suspended;
    // every call below is a plain system call on descriptors and memory the plan names.
    unsafe {
        let plan = &mut *(arg as *mut Plan);
        // Handlers are this process's code: default them all before anything is unblocked.
        // Zeroed, the kernel's sigaction is SIG_DFL with no flags and an empty mask.
        let dfl = [0u64; 4];
        for sig in 1..=LAST_SIGNAL {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::syscall(libc::SYS_rt_sigaction, sig, dfl.as_ptr(), std::ptr::null_mut::<u64>(), 8usize);
            }
        }
        let step = |r: libc::c_long| r >= 0;
        let ok = step(libc::setpgid(0, 0) as libc::c_long)
            && step(onto(plan.dev_null, 0))
            && step(onto(plan.out, 1))
            && step(onto(plan.err, 2));
        if ok {
            // Whatever this process holds without close-on-exec (a descriptor its own parent
            // leaked to it: slurmstepd, a shell, a test harness) stops here.
            libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
            let none: u64 = 0;
            sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            libc::execve(plan.prog.as_ptr(), plan.argv.as_ptr(), plan.envp.as_ptr());
        }
        plan.errno = *libc::__errno_location();
        if plan.errno == 0 {
            plan.errno = libc::EIO;
        }
        libc::_exit(127)
    }
}

/// `fd` onto `to`, open across exec (dup2 onto itself would keep close-on-exec).
///
/// # Safety
///
/// Whatever owns `to` loses it (dup2 closes it first): only for the child's standard
/// descriptors before exec, where nothing else of this process will use them.
unsafe fn onto(fd: RawFd, to: RawFd) -> libc::c_long {
    if fd == to {
        libc::fcntl(fd, libc::F_SETFD, 0) as libc::c_long
    } else {
        libc::dup2(fd, to) as libc::c_long
    }
}

/// Whether `close_range` (Linux >= 5.9) exists, tried on a range that holds nothing.
fn close_range_works() -> bool {
    // SAFETY: closes no descriptor (the range is past any this process can hold).
    unsafe { libc::syscall(libc::SYS_close_range, u32::MAX - 1, u32::MAX, 0u32) == 0 }
}

/// Marks every descriptor above 2 that this process holds now close-on-exec (the engine's own
/// are already; these came from its parent).
fn mark_inherited_cloexec() {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return };
    let fds: Vec<RawFd> = dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).filter(|&fd| fd > 2).collect();
    for fd in fds {
        // SAFETY: only descriptor flags change; a number that is no longer open fails harmlessly.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;
    use std::io::{Read, Seek, SeekFrom};

    fn run(sp: &mut Spawner, prog: &str, args: &[&str], out: RawFd) -> Result<Child, i32> {
        let prog = CString::new(prog).unwrap();
        let owned: Vec<CString> = args.iter().map(|a| CString::new(*a).unwrap()).collect();
        let mut argv: Vec<*const libc::c_char> = owned.iter().map(|a| a.as_ptr()).collect();
        argv.push(std::ptr::null());
        let env = [c"PATH=/usr/bin:/bin".as_ptr(), std::ptr::null()];
        sp.spawn(&prog, &argv, &env, out, out)
    }

    /// The exit code of our child `pid`, or -1 when a signal ended it (or it cannot be waited for).
    fn wait(pid: libc::pid_t) -> i32 {
        match waitpid(Pid::from_raw(pid), None) {
            Ok(nix::sys::wait::WaitStatus::Exited(_, code)) => code,
            _ => -1,
        }
    }

    #[test]
    fn a_child_runs_in_its_own_group_with_its_output_where_asked() {
        let mut sp = Spawner::new(true).unwrap();
        let mut f = tempfile_in_memory();
        let c = run(
            &mut sp,
            "/bin/sh",
            &["sh", "-c", "echo $$ $(cut -d' ' -f5 /proc/$$/stat); ls /proc/self/fd"],
            f.as_raw_fd(),
        )
        .unwrap();
        assert!(c.pidfd.is_some(), "this kernel gives pidfds");
        assert_eq!(wait(c.pid), 0);
        let s = read_all(&mut f);
        let fds: Vec<&str> = s.lines().skip(1).collect();
        assert_eq!(fds, ["0", "1", "2", "3"], "0-2 and ls's own directory: {s}");
        let first: Vec<&str> = s.lines().next().unwrap().split_whitespace().collect();
        assert_eq!(first[0], first[1], "its own process group: {s}");
    }

    #[test]
    fn out_of_descriptors_a_child_starts_without_its_pidfd() {
        let mut sp = Spawner::new(true).unwrap();
        let f = tempfile_in_memory();
        let argv = [c"true".as_ptr(), std::ptr::null()];
        let env = [std::ptr::null()];
        // Every descriptor up to the limit taken, in a forked copy of this test (the limit is
        // process-wide, and other tests run in parallel threads); it only makes system calls.
        // SAFETY: fork in a test; the child allocates nothing and leaves by _exit.
        let pid = match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Parent { child } => child.as_raw(),
            nix::unistd::ForkResult::Child => {
                use nix::sys::resource::{setrlimit, Resource};
                // Its own limit lowered, and filled with copies (kept open: leaked, not dropped).
                let _ = setrlimit(Resource::RLIMIT_NOFILE, 64, 64);
                while nix::unistd::dup(&f).map(std::os::fd::IntoRawFd::into_raw_fd).is_ok() {}
                let ok = match sp.spawn(c"/bin/true", &argv, &env, f.as_raw_fd(), f.as_raw_fd()) {
                    Ok(c) => c.pidfd.is_none() && wait(c.pid) == 0,
                    Err(_) => false,
                };
                // SAFETY: _exit leaves without running the test harness's code in this copy.
                unsafe { libc::_exit(if ok { 0 } else { 1 }) }
            }
        };
        assert_eq!(wait(pid), 0, "the child started without a pidfd and exited 0");
    }

    #[test]
    fn a_missing_program_is_its_errno() {
        let mut sp = Spawner::new(false).unwrap();
        let f = tempfile_in_memory();
        assert_eq!(run(&mut sp, "/nonexistent/prog", &["prog"], f.as_raw_fd()).unwrap_err(), libc::ENOENT);
    }

    #[test]
    fn signals_start_at_their_defaults_and_unblocked() {
        // This process ignores SIGPIPE (Rust's start-up does); a task must not. Also from a
        // thread that blocks signals for good, as the executor's do.
        std::thread::spawn(signals_at_default).join().unwrap();
        std::thread::spawn(|| {
            block_signals_in_this_thread(true);
            signals_at_default();
        })
        .join()
        .unwrap();
    }

    fn signals_at_default() {
        let mut sp = Spawner::new(true).unwrap();
        let mut f = tempfile_in_memory();
        let c =
            run(&mut sp, "/bin/sh", &["sh", "-c", "grep -E '^Sig(Ign|Blk)' /proc/self/status"], f.as_raw_fd()).unwrap();
        assert_eq!(wait(c.pid), 0);
        let s = read_all(&mut f);
        assert_eq!(s.lines().count(), 2, "{s}");
        for line in s.lines() {
            assert!(line.ends_with("0000000000000000"), "{line}");
        }
    }

    fn read_all(f: &mut std::fs::File) -> String {
        let mut s = String::new();
        f.seek(SeekFrom::Start(0)).unwrap();
        f.read_to_string(&mut s).unwrap();
        s
    }

    fn tempfile_in_memory() -> std::fs::File {
        crate::capture::Scratch::Memory.file().unwrap()
    }
}
