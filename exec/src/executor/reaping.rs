//! A task's end: its exit seen through its pidfd (or, without one, `waitid(P_ALL, __WNOTHREAD)`),
//! its group killed and its zombie released (at once, or after `ExecConfig::linger`). The
//! reaper owns the loop's children and its epoll set, and answers which slot's task ended how.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use super::wait::{pidfd_open, pidfds_work, wait_info};
use super::warm_calls::{Call, News};
use crate::spawn::Child;
use htc_core::spawn_loop::Exit;

/// epoll tokens; every other token is a slot whose task's pidfd fired.
const WAKE: u64 = u64::MAX;
const SIGNAL: u64 = u64::MAX - 1;
/// Marks the token of a slot whose task's call (`warm_calls`) has news.
const CALL: u64 = 1 << 40;
/// In the fallback, the first and the longest wait for an exit that SIGCHLD may not announce.
const SCAN_FIRST: Duration = Duration::from_millis(1);
const SCAN_MAX: Duration = Duration::from_millis(64);

/// How the executor learns that its children ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reaping {
    /// A pidfd per child in the epoll set.
    Pidfd,
    /// No pidfds (old kernel): SIGCHLD through a signalfd, a short timer, `__WNOTHREAD` waits.
    ThreadChildren,
}

impl Reaping {
    pub(super) fn detect() -> Reaping {
        match pidfds_work() {
            Ok(()) => Reaping::Pidfd,
            Err(e) => {
                tracing::warn!(error = %e, "no pidfds (Linux >= 5.4 needed): executor falls back to SIGCHLD and a short timer");
                Reaping::ThreadChildren
            }
        }
    }
}

pub(super) struct Reaper {
    mode: Reaping,
    epoll: OwnedFd,
    /// SIGCHLD of the fallback.
    sigfd: Option<OwnedFd>,
    /// Each running task's process, by its first slot.
    procs: Vec<Option<Proc>>,
    /// Each running task's call handed to its warm interpreter, by its first slot.
    calls: Vec<Option<Call>>,
    /// Slots whose calls' connections the last epoll_wait reported.
    ready_calls: Vec<usize>,
    /// Calls ended without word from their interpreter (SIGKILL), not yet reported.
    call_ends: Vec<(usize, Exit)>,
    /// Slots whose calls their interpreter could not run: their shims are to run them.
    refused: Vec<usize>,
    /// Children without a pidfd: while there are any, the fallback's scan and timer run.
    unwatched: usize,
    scan_wait: Duration,
    /// Slots whose pidfds the last epoll_wait reported.
    ready: Vec<usize>,
    /// Pidfds of reaped children, closed once the freed slots have their next tasks, so that
    /// tearing them down (a pidfs inode each) is not on the way from an exit to the next spawn.
    closing: Vec<OwnedFd>,
    /// Ended tasks whose groups are killed at the time given (`linger`): their zombies are
    /// held, by pidfd, until then, so the group's id cannot be reused meanwhile.
    lingering: VecDeque<(Instant, libc::pid_t, OwnedFd)>,
    linger: Duration,
    /// "No pidfd" lines, at most one a minute (out of descriptors, every spawn would log).
    pidfd_log: crate::throttle::Throttle,
    agent: u32,
}

struct Proc {
    pid: libc::pid_t,
    /// None when the child is found by the fallback's scan instead.
    pidfd: Option<OwnedFd>,
}

impl Reaper {
    pub(super) fn new(mode: Reaping, slots: usize, linger: Duration, agent: u32) -> io::Result<Reaper> {
        // SAFETY: epoll_create1 takes no pointers; the result is checked below.
        let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epoll < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor epoll_create1 just opened, owned by nothing else.
        let epoll = unsafe { OwnedFd::from_raw_fd(epoll) };
        let sigfd = if mode == Reaping::ThreadChildren {
            // SAFETY: the set is a local sigset_t (all zeroes is a valid value before
            // sigemptyset) that outlives the calls; signalfd(-1) makes a new descriptor and
            // keeps no pointer to it.
            let fd = unsafe {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, libc::SIGCHLD);
                libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK)
            };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: a descriptor signalfd just opened, owned by nothing else.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            epoll_add(&epoll, fd.as_raw_fd(), SIGNAL)?;
            Some(fd)
        } else {
            None
        };
        Ok(Reaper {
            mode,
            epoll,
            sigfd,
            procs: (0..slots).map(|_| None).collect(),
            calls: (0..slots).map(|_| None).collect(),
            ready_calls: Vec::new(),
            call_ends: Vec::new(),
            refused: Vec::new(),
            unwatched: 0,
            scan_wait: SCAN_FIRST,
            ready: Vec::new(),
            closing: Vec::new(),
            lingering: VecDeque::new(),
            linger,
            pidfd_log: crate::throttle::Throttle::new(Duration::from_secs(60)),
            agent,
        })
    }

    /// The eventfd that wakes the loop for commands, in the epoll set.
    pub(super) fn add_wake(&self, wake: &OwnedFd) -> io::Result<()> {
        epoll_add(&self.epoll, wake.as_raw_fd(), WAKE)
    }

    /// The task in `slot` runs as `child`: its pidfd (the one its clone gave, else a new one) in
    /// the epoll set, or left to the fallback's scan.
    pub(super) fn watch(&mut self, slot: usize, child: Child) {
        let pidfd = if self.mode == Reaping::Pidfd { self.pidfd_of(slot, child.pid, child.pidfd) } else { None };
        if pidfd.is_none() {
            self.unwatched += 1;
            self.scan_wait = SCAN_FIRST;
        }
        self.procs[slot] = Some(Proc { pid: child.pid, pidfd });
    }

    /// The task in `slot` runs as `call`, whose connection's news the epoll set reports.
    pub(super) fn watch_call(&mut self, slot: usize, call: Call) {
        let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: CALL | slot as u64 };
        // SAFETY: both descriptors are open; ev is a valid event.
        if unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, call.fd(), &mut ev) } != 0 {
            // Dropped unread, the call goes unrun (the interpreter sees its end); its shim runs it.
            self.refused.push(slot);
            return;
        }
        self.calls[slot] = Some(call);
    }

    /// Slots whose calls are to run by their shims instead, since last asked.
    pub(super) fn take_refused(&mut self) -> Vec<usize> {
        std::mem::take(&mut self.refused)
    }

    fn pidfd_of(&mut self, slot: usize, pid: libc::pid_t, given: Option<OwnedFd>) -> Option<OwnedFd> {
        let fd = match given {
            Some(fd) => Ok(fd),
            None => pidfd_open(pid),
        };
        match fd.and_then(|fd| epoll_watch(&self.epoll, fd.as_raw_fd(), slot, libc::EPOLL_CTL_ADD).map(|()| fd)) {
            Ok(fd) => Some(fd),
            Err(e) => {
                if let Some(more) = self.pidfd_log.allow(Instant::now()) {
                    tracing::warn!(agent = self.agent, pid, error = %e, not_logged = more, "no pidfd for a task; it is reaped by polling");
                }
                None
            }
        }
    }

    /// The process of the task in `slot`: its group's leader, or the process that runs its call.
    pub(super) fn pid_of(&self, slot: usize) -> Option<libc::pid_t> {
        if let Some(c) = self.calls.get(slot).and_then(Option::as_ref) {
            return c.worker_pid();
        }
        self.procs.get(slot)?.as_ref().map(|p| p.pid)
    }

    /// Sends `signal` to the process group of the task in `slot` (a call: to the process that
    /// runs it; SIGKILL ends it at once).
    pub(super) fn signal(&mut self, slot: usize, signal: libc::c_int) {
        if let Some(c) = self.calls.get_mut(slot).and_then(Option::as_mut) {
            if let Some(exit) = c.signal(signal) {
                self.calls[slot] = None;
                self.call_ends.push((slot, exit));
            }
            return;
        }
        let Some(p) = self.procs.get(slot).and_then(Option::as_ref) else { return };
        // SAFETY: kill takes no pointers. The task is in `procs`, so not reaped yet: its pid,
        // the id of the group it leads, cannot have been reused.
        unsafe { libc::kill(-p.pid, signal) };
    }

    /// The tasks whose processes ended since last asked, by slot, with how.
    pub(super) fn reap(&mut self, ended: &mut Vec<(usize, Exit)>) {
        self.reap_calls(ended);
        self.reap_ready(ended);
        self.reap_unwatched(ended);
    }

    /// Reads the calls whose connections have news.
    fn reap_calls(&mut self, ended: &mut Vec<(usize, Exit)>) {
        ended.append(&mut self.call_ends);
        for slot in std::mem::take(&mut self.ready_calls) {
            let Some(c) = self.calls[slot].as_mut() else { continue };
            match c.read() {
                News::Nothing => {}
                News::Ended(exit) => {
                    self.calls[slot] = None;
                    ended.push((slot, exit));
                }
                News::Refused(why) => {
                    tracing::debug!(agent = self.agent, slot, why, "a call handed over was refused; its shim runs it");
                    self.calls[slot] = None;
                    self.refused.push(slot);
                }
            }
        }
    }

    /// Finishes the children whose pidfds became readable.
    fn reap_ready(&mut self, ended: &mut Vec<(usize, Exit)>) {
        let mut ready = std::mem::take(&mut self.ready);
        for &slot in &ready {
            let Some(fd) = self.procs[slot].as_ref().and_then(|p| p.pidfd.as_ref()) else { continue };
            let options = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
            match wait_info(libc::P_PIDFD, fd.as_raw_fd() as libc::id_t, options) {
                // SAFETY: waitid filled the SIGCHLD fields of info.
                Ok(info) if unsafe { info.si_pid() } == 0 => {
                    // Not gone after all: watch it again (the watch fires once).
                    let _ = epoll_watch(&self.epoll, fd.as_raw_fd(), slot, libc::EPOLL_CTL_MOD);
                }
                Ok(_) => ended.push((slot, self.finish(slot, None))),
                Err(e) => ended.push((slot, self.finish(slot, Some(e)))),
            }
        }
        ready.clear();
        self.ready = ready;
    }

    /// Finishes every exited child of this thread, while any child lacks a pidfd. `__WNOTHREAD`
    /// leaves the children of every other thread (another executor's above all) to their owners.
    fn reap_unwatched(&mut self, ended: &mut Vec<(usize, Exit)>) {
        while self.unwatched > 0 {
            let options = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT | libc::__WNOTHREAD;
            let Ok(info) = wait_info(libc::P_ALL, 0, options) else { return };
            // SAFETY: waitid filled the SIGCHLD fields of info.
            let pid = unsafe { info.si_pid() };
            if pid == 0 {
                return;
            }
            match self.procs.iter().position(|p| p.as_ref().is_some_and(|p| p.pid == pid)) {
                Some(slot) => ended.push((slot, self.finish(slot, None))),
                // Not a task's (cannot be: only this thread spawns): released all the same, so
                // the scan does not find it again.
                None => {
                    let _ = wait_info(libc::P_PID, pid as libc::id_t, libc::WEXITED);
                }
            }
        }
    }

    /// How the task in `slot`, an unreaped zombie, ended; or, with `lost`, a child that some
    /// other code of this process reaped. The group is killed before the zombie is released, so
    /// nothing the task left behind outlives it and the group id cannot have been reused.
    fn finish(&mut self, slot: usize, lost: Option<io::Error>) -> Exit {
        let mut p = self.procs[slot].take().expect("a running task's process");
        let pid = p.pid;
        let linger = !self.linger.is_zero() && p.pidfd.is_some();
        let status = match lost {
            // Its status read, the zombie kept: the group is killed and the zombie released later.
            None if linger => {
                let fd = p.pidfd.take().expect("a pidfd, looked at above");
                let status = wait_info(libc::P_PIDFD, fd.as_raw_fd() as libc::id_t, libc::WEXITED | libc::WNOWAIT);
                self.lingering.push_back((Instant::now() + self.linger, pid, fd));
                status
            }
            None => {
                // SAFETY: kill takes no pointers; pid is our exited child, not reaped until below,
                // so the id of the group it led cannot have been reused.
                unsafe { libc::kill(-pid, libc::SIGKILL) };
                match &p.pidfd {
                    Some(fd) => wait_info(libc::P_PIDFD, fd.as_raw_fd() as libc::id_t, libc::WEXITED),
                    None => wait_info(libc::P_PID, pid as libc::id_t, libc::WEXITED),
                }
            }
            Some(e) => Err(e),
        };
        match p.pidfd.take() {
            Some(fd) => self.closing.push(fd),
            None if linger => {}
            None => self.unwatched -= 1,
        }
        match status {
            // SAFETY: waitid filled the SIGCHLD fields of info.
            Ok(info) if info.si_code == libc::CLD_EXITED => Exit::Exited(unsafe { info.si_status() }),
            // SAFETY: as above.
            Ok(info) => Exit::Signaled(unsafe { info.si_status() }),
            Err(e) => Exit::Lost(e.raw_os_error().unwrap_or(0)),
        }
    }

    /// Kills the groups of ended tasks whose time to linger is up (`all`: every one, as the loop
    /// ends or aborts), then releases their zombies.
    pub(super) fn end_lingering(&mut self, all: bool) {
        let now = Instant::now();
        while self.lingering.front().is_some_and(|(t, ..)| all || *t <= now) {
            let (_, pid, fd) = self.lingering.pop_front().expect("looked at above");
            // SAFETY: kill takes no pointers; pid is our exited child, held as a zombie until
            // the waitid below, so the id of the group it led cannot have been reused.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
            let _ = wait_info(libc::P_PIDFD, fd.as_raw_fd() as libc::id_t, libc::WEXITED);
            self.closing.push(fd);
        }
    }

    /// Closes the pidfds of reaped children. Closed without taking them out of the epoll set:
    /// their watches have fired and fire no more, even while a child another thread is
    /// spawning holds a copy until its exec.
    pub(super) fn close_reaped(&mut self) {
        self.closing.clear();
    }

    /// The longest the loop may sleep, at most `limit`: the fallback's scan, a group to kill.
    pub(super) fn wait_at_most(&self, mut limit: Duration) -> Duration {
        if self.unwatched > 0 {
            limit = limit.min(self.scan_wait);
        }
        if let Some((t, ..)) = self.lingering.front() {
            limit = limit.min(t.saturating_duration_since(Instant::now()));
        }
        if !self.call_ends.is_empty() || !self.refused.is_empty() {
            limit = Duration::ZERO;
        }
        limit
    }

    /// Sleeps until a child ends, `wake` is written, or `timeout` passes.
    pub(super) fn wait(&mut self, timeout: Duration, wake: &OwnedFd) {
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 64];
        // SAFETY: the kernel writes at most `events.len()` entries into `events`, which this
        // thread owns for the call; the epoll descriptor is ours and open.
        let n = unsafe {
            libc::epoll_wait(
                self.epoll.as_raw_fd(),
                events.as_mut_ptr(),
                events.len() as i32,
                timeout.as_millis().max(1) as i32,
            )
        };
        let mut buf = [0u8; 8 * 128];
        for e in &events[..n.max(0) as usize] {
            let token = e.u64;
            match token {
                // SAFETY: reads 8 bytes (an eventfd's counter) into the local buffer of 1024,
                // from the nonblocking eventfd `wake` owns.
                WAKE => unsafe {
                    libc::read(wake.as_raw_fd(), buf.as_mut_ptr() as *mut libc::c_void, 8);
                },
                SIGNAL => {
                    if let Some(fd) = &self.sigfd {
                        // SAFETY: reads at most `buf.len()` bytes into the local buffer, from
                        // the nonblocking signalfd `self.sigfd` owns; drained until empty.
                        while unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr() as *mut libc::c_void, buf.len()) }
                            > 0
                        {}
                    }
                }
                t if t & CALL != 0 => self.ready_calls.push((t & !CALL) as usize),
                slot => self.ready.push(slot as usize),
            }
        }
        if n == 0 && self.unwatched > 0 {
            // Nothing announced itself for a whole wait: most likely nothing ended, so wait
            // longer; a spawn starts again from the shortest wait.
            self.scan_wait = (self.scan_wait * 2).min(SCAN_MAX);
        }
    }
}

/// A child's pidfd in the epoll set (`op`: add, or re-arm) under its slot, reported once: when
/// it has exited.
fn epoll_watch(epoll: &OwnedFd, fd: RawFd, slot: usize, op: libc::c_int) -> io::Result<()> {
    let mut ev = libc::epoll_event { events: (libc::EPOLLIN | libc::EPOLLONESHOT) as u32, u64: slot as u64 };
    // SAFETY: both descriptors are open; ev is a valid event.
    if unsafe { libc::epoll_ctl(epoll.as_raw_fd(), op, fd, &mut ev) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn epoll_add(epoll: &OwnedFd, fd: RawFd, token: u64) -> io::Result<()> {
    let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: token };
    // SAFETY: both descriptors are open; ev is a valid event.
    if unsafe { libc::epoll_ctl(epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
