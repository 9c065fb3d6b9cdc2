//! Starting a task's process: a vfork-style `clone` on a stack kept for reuse, which also hands
//! back the child's pidfd.
//!
//! glibc's `posix_spawn` does the same clone but maps a fresh stack for every child and unmaps
//! it after: in a process with several threads on several CPUs each unmap is a TLB shootdown
//! across them, a tenth of a spawner's CPU per `true` task, and the pidfd then cost one more
//! system call (bench/RESULTS.md §20). The child does what the executor asked of
//! `posix_spawn` before: every signal at its default and unblocked, a process group of its
//! own, stdin from /dev/null, stdout and stderr on the given descriptors, nothing else open.
//!
//! A task with a memory limit on cgroup v2 is born in its slot's cgroup: `clone3` with
//! `CLONE_INTO_CGROUP` (Linux >= 5.7), which takes no global lock, where moving a process in
//! afterwards takes the kernel's `cgroup_threadgroup_rwsem` for writing, against every fork on
//! the node. glibc has no wrapper for it that runs a function on a given stack, so the few
//! instructions that do are here (x86_64; elsewhere `spawn_into` says it cannot, and the
//! executor moves the task in as before).
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

/// Why a child was not started in its cgroup (`Spawner::spawn_into`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntoError {
    /// The kernel would not start it there (no `clone3` or `CLONE_INTO_CGROUP`, a sandbox that
    /// refuses it, no right to the cgroup: the errno): nothing was started.
    Refused(i32),
    /// It started there but could not run its program (the errno), as `spawn`'s error.
    Failed(i32),
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
        started(pid, pidfd, &plan)
    }

    /// As `spawn`, with the child born in the cgroup v2 directory `cgroup` (an open descriptor
    /// of it). `Refused` when the kernel will not: then nothing started, and the caller may
    /// start it another way.
    pub fn spawn_into(
        &mut self,
        prog: &CStr,
        argv: &[*const libc::c_char],
        envp: &[*const libc::c_char],
        out: RawFd,
        err: RawFd,
        cgroup: RawFd,
    ) -> Result<Child, IntoError> {
        debug_assert!(argv.last().is_some_and(|p| p.is_null()) && envp.last().is_some_and(|p| p.is_null()));
        let mut plan = Plan { prog, argv, envp, dev_null: self.dev_null.as_raw_fd(), out, err, errno: 0 };
        let (pid, pidfd) = self.clone3_child(&mut plan, cgroup).map_err(IntoError::Refused)?;
        started(pid, pidfd, &plan).map_err(IntoError::Failed)
    }

    /// One clone3 into `cgroup`: (pid, pidfd or -1), once the child has exec'd or exited.
    fn clone3_child(&mut self, plan: &mut Plan, cgroup: RawFd) -> Result<(libc::pid_t, RawFd), i32> {
        let mut fd: libc::c_int = -1;
        let mut flags = (libc::CLONE_VM | libc::CLONE_VFORK) as u64 | CLONE_INTO_CGROUP;
        if self.pidfds {
            flags |= libc::CLONE_PIDFD as u64;
        }
        let mut args = CloneArgs {
            flags,
            pidfd: &mut fd as *mut libc::c_int as u64,
            exit_signal: libc::SIGCHLD as u64,
            stack: self.stack.as_mut_ptr() as u64,
            stack_size: std::mem::size_of_val(&*self.stack) as u64,
            cgroup: cgroup as u64,
            ..CloneArgs::default()
        };
        let all: u64 = !0;
        let mut old: u64 = 0;
        let blocked = BLOCKED.with(|b| b.get());
        // SAFETY: as in clone_child: the stack is ours and unused while this thread waits
        // (CLONE_VFORK), the plan outlives the child's use of it, and signals are blocked
        // around the clone unless this thread blocks them for good.
        let r = unsafe {
            if !blocked {
                sigprocmask(libc::SIG_SETMASK, &all, &mut old);
            }
            let r = clone3_run(&mut args, child, plan as *mut Plan as *mut libc::c_void);
            if !blocked {
                sigprocmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
            }
            r
        };
        if r < 0 {
            return Err(-r as i32);
        }
        Ok((r as libc::pid_t, fd))
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

/// A clone returned `pid` (and `pidfd`, or -1): the child, or the errno of the step it failed
/// at before its exec, the child then reaped here, where it is known.
fn started(pid: libc::pid_t, pidfd: RawFd, plan: &Plan) -> Result<Child, i32> {
    // SAFETY: the kernel stored a new descriptor of ours there (CLONE_PIDFD) or left -1.
    let pidfd = (pidfd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(pidfd) });
    if plan.errno != 0 {
        let _ = waitpid(Pid::from_raw(pid), None);
        return Err(plan.errno);
    }
    Ok(Child { pid, pidfd })
}

/// Start the child in the cgroup whose directory descriptor is `CloneArgs::cgroup`.
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// The kernel's `struct clone_args`, as of Linux 5.7 (with `cgroup`).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// `clone3(args)` whose child runs `f(arg)` on `args.stack` and exits with what it returns:
/// the child's pid, or -errno.
///
/// # Safety
///
/// `args.stack`..`+stack_size` is memory the child may use as its stack, 16-byte aligned at
/// its top, and nothing else uses it until the child is gone or has exec'd (CLONE_VFORK); `f`
/// is safe to run in the child (with CLONE_VM: raw system calls only).
#[cfg(target_arch = "x86_64")]
unsafe fn clone3_run(
    args: &mut CloneArgs,
    f: extern "C" fn(*mut libc::c_void) -> libc::c_int,
    arg: *mut libc::c_void,
) -> libc::c_long {
    let ret: libc::c_long;
    // The child comes back from the system call with 0 in rax, on its new stack (the kernel
    // sets rsp to its top), every other register as the parent had it: it calls f(arg) from
    // r12 and r13 and exits with its result; it never reaches the parent's code again.
    std::arch::asm!(
        "syscall",
        "test rax, rax",
        "jnz 2f",
        "xor ebp, ebp",
        "mov rdi, r12",
        "call r13",
        "mov edi, eax",
        "mov eax, {exit}",
        "syscall",
        "ud2",
        "2:",
        exit = const libc::SYS_exit,
        inlateout("rax") libc::SYS_clone3 => ret,
        in("rdi") args as *mut CloneArgs,
        in("rsi") std::mem::size_of::<CloneArgs>(),
        in("r12") arg,
        in("r13") f,
        lateout("rcx") _,
        lateout("r11") _,
    );
    ret
}

/// Elsewhere the executor moves the task into its cgroup itself.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn clone3_run(
    _args: &mut CloneArgs,
    _f: extern "C" fn(*mut libc::c_void) -> libc::c_int,
    _arg: *mut libc::c_void,
) -> libc::c_long {
    -(libc::ENOSYS as libc::c_long)
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

    /// Born in a cgroup v2 directory made for the test, where this machine has a v2
    /// hierarchy the test may write to (the executor's tests run the memory limits).
    #[test]
    fn a_child_is_born_in_the_cgroup_asked_for() {
        let Some(dir) = v2_test_cgroup() else {
            return eprintln!("no writable cgroup v2 hierarchy here");
        };
        let cg = std::fs::File::open(&dir).unwrap();
        let mut sp = Spawner::new(true).unwrap();
        let mut f = tempfile_in_memory();
        let prog = CString::new("/bin/cat").unwrap();
        let owned = [CString::new("cat").unwrap(), CString::new("/proc/self/cgroup").unwrap()];
        let argv = [owned[0].as_ptr(), owned[1].as_ptr(), std::ptr::null()];
        let env = [std::ptr::null()];
        let c = sp.spawn_into(&prog, &argv, &env, f.as_raw_fd(), f.as_raw_fd(), cg.as_raw_fd()).unwrap();
        assert_eq!(wait(c.pid), 0);
        let s = read_all(&mut f);
        let name = dir.file_name().unwrap().to_str().unwrap();
        assert!(s.lines().any(|l| l.starts_with("0::/") && l.ends_with(name)), "{s}");
        // A missing program is still its errno; a descriptor that is no cgroup, refused.
        let missing = CString::new("/nonexistent").unwrap();
        let r = sp.spawn_into(&missing, &argv, &env, f.as_raw_fd(), f.as_raw_fd(), cg.as_raw_fd());
        assert_eq!(r.unwrap_err(), IntoError::Failed(libc::ENOENT));
        let r = sp.spawn_into(&prog, &argv, &env, f.as_raw_fd(), f.as_raw_fd(), f.as_raw_fd());
        assert!(matches!(r, Err(IntoError::Refused(_))), "{r:?}");
        let _ = std::fs::remove_dir(&dir);
    }

    /// A new cgroup in this machine's v2 hierarchy, where there is one and it may be written.
    fn v2_test_cgroup() -> Option<std::path::PathBuf> {
        let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        let (mount, _) = crate::memcg::mount_of(&info, crate::memcg::Version::V2)?;
        let dir = mount.join(format!("htc-spawn-test-{}", std::process::id()));
        std::fs::create_dir(&dir).ok()?;
        Some(dir)
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
