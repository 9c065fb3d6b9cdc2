//! Runs tasks as processes on this node: one OS thread that spawns, reaps and times out.
//!
//! Spawning is a vfork-style clone (`spawn`: no page-table copy, which is most of the cost of a
//! fork+exec loop, and no stack mapped per child as glibc's `posix_spawn` does). Each task gets
//! its own process group, stdin from /dev/null, and stdout/stderr in capture files of its own
//! (`capture`), appended to its slot's stream files when it ends, so no task can touch another's
//! bytes. CPU binding is inherited: the thread pins itself to the task's cores right before
//! spawning. Nothing else is: a task starts with descriptors 0, 1 and 2 only, every signal at its
//! default disposition and an empty signal mask, as it would from a shell on a terminal,
//! whatever the agent inherited.
//!
//! Each child is watched through its own pidfd (Linux >= 5.4: from its clone, else `pidfd_open`;
//! `waitid(P_PIDFD)`) in the thread's epoll set, and only the executor's own children are ever
//! waited for. So several executors can live in one process, next to anything else that starts
//! and waits for processes, and nothing depends on the process-wide SIGCHLD (it may be blocked
//! or not, handled or not; only an ignored SIGCHLD is refused, since the kernel would then
//! discard exit statuses). What happened goes to the agent's main thread in batches under load
//! (`handoff`).
//!
//! Older kernels (RHEL 8's 4.18), and sandboxes whose seccomp filter refuses `pidfd_open`, get a
//! fallback, chosen at start with a one-line warning, that keeps both properties: the executor
//! waits with `waitid(P_ALL, __WNOTHREAD)`, which sees only children of its own thread (all its
//! tasks, and nothing else, since only that thread spawns), woken by SIGCHLD through a signalfd
//! (SIGCHLD blocked in its own thread only). Another thread of the process that leaves SIGCHLD
//! unblocked can take a signal before the signalfd sees it, so a timer bounds what a lost wake-up
//! costs: 1 ms after each spawn, backing off to 64 ms while nothing ends. A child whose
//! `pidfd_open` alone fails (EMFILE) is covered the same way.

use std::collections::HashMap;
use std::ffi::{CString, OsString};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::clock::now_us;
use crate::handoff::{Handoff, When};
use crate::output::{IndexEntry, OutputMode};
use htc_core::orders::{Orders, Todo};
use htc_core::record::Outcome;
use htc_core::slots::{self, Deadlines, Due, Holder, Next, Queue, Room};

pub use htc_core::work::{recall_from, Command, ExecEvent, Finished, TaskToRun};

/// A task's stdout and stderr descriptors, and (per-task output) the files that own them.
type OutputFds = (RawFd, RawFd, Option<(File, File)>);

#[derive(Debug, Clone)]
pub struct ExecConfig {
    pub job_id: String,
    pub agent: u32,
    /// CPU of each slot; empty means no binding. Its length is the number of slots otherwise.
    pub cpus: Vec<usize>,
    pub slots: usize,
    pub out_dir: PathBuf,
    pub output: OutputMode,
    /// The tasks' base environment (HTC_* are added per task).
    pub env: Vec<(OsString, OsString)>,
    /// Time between SIGTERM and SIGKILL for a task that timed out or is aborted.
    pub kill_grace: Duration,
    /// This executor's place among the agent's spawners: its slots are numbered from
    /// `first_slot` in the output directory they share, and it keeps its own index file.
    pub spawner: usize,
    pub first_slot: usize,
    /// The agent's GPUs, shared by its spawn loops.
    pub gpus: crate::gpu::Pool,
    /// Where slots get memory cgroups for tasks with `mem=`; None: the RSS watch enforces it.
    pub memcg: Option<std::sync::Arc<crate::memcg::Root>>,
    /// How long a task's process group outlives the task before it is killed (`--keep-daemons`:
    /// `LINGER`), so that a daemon on its way out of it (`setsid server &` as a task's last
    /// command) gets out; zero: at the task's end.
    pub linger: Duration,
}

/// Time for a daemon that a task started as it ended to leave the task's process group: `setsid`
/// is a fork and an exec away (10 of 10 left within 200 ms here, 3 of 10 with no wait at all).
pub const LINGER: Duration = Duration::from_millis(500);

impl ExecConfig {
    /// The index of output records, one per spawner in the agent's output directory.
    pub fn index_name(&self) -> String {
        index_name(self.spawner)
    }
}

/// `index` for the first spawner, `index.N` for the others (`htc output` reads them in order).
pub fn index_name(spawner: usize) -> String {
    if spawner == 0 {
        "index".into()
    } else {
        format!("index.{spawner}")
    }
}

/// The network side's handle: commands go through a channel, and an eventfd wakes the real
/// executor's thread (the simulated ones wait on the channel itself).
pub struct Handle {
    tx: mpsc::Sender<Command>,
    wake: Option<OwnedFd>,
}

impl Handle {
    pub fn new(tx: mpsc::Sender<Command>) -> Handle {
        Handle { tx, wake: None }
    }

    pub fn send(&self, c: Command) {
        let _ = self.tx.send(c);
        if let Some(wake) = &self.wake {
            let one: u64 = 1;
            // SAFETY: writing 8 bytes from a live u64 to an eventfd we own.
            unsafe { libc::write(wake.as_raw_fd(), &one as *const u64 as *const libc::c_void, 8) };
        }
    }
}

/// How the executor learns that its children ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reaping {
    /// A pidfd per child in the epoll set.
    Pidfd,
    /// No pidfds (old kernel): SIGCHLD through a signalfd, a short timer, `__WNOTHREAD` waits.
    ThreadChildren,
}

impl Reaping {
    fn detect() -> Reaping {
        match pidfds_work() {
            Ok(()) => Reaping::Pidfd,
            Err(e) => {
                tracing::warn!(error = %e, "no pidfds (Linux >= 5.4 needed): executor falls back to SIGCHLD and a short timer");
                Reaping::ThreadChildren
            }
        }
    }
}

/// Starts the executor thread. `sink` receives events in batches, from that thread.
pub fn start(
    cfg: ExecConfig,
    sink: impl FnMut(Vec<ExecEvent>) + Send + 'static,
) -> io::Result<(Handle, std::thread::JoinHandle<io::Result<()>>)> {
    start_with(cfg, Reaping::detect(), sink)
}

fn start_with(
    cfg: ExecConfig,
    reaping: Reaping,
    sink: impl FnMut(Vec<ExecEvent>) + Send + 'static,
) -> io::Result<(Handle, std::thread::JoinHandle<io::Result<()>>)> {
    if sigchld_ignored() {
        return Err(io::Error::other(
            "SIGCHLD is ignored in this process, so the kernel would discard the tasks' exit statuses; \
             start the agent with SIGCHLD at its default",
        ));
    }
    // SAFETY: eventfd takes no pointers; the result is checked below.
    let wake = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if wake < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor eventfd just opened, owned by nothing else.
    let wake = unsafe { OwnedFd::from_raw_fd(wake) };
    let (tx, rx) = mpsc::channel();
    let wake_r = wake.try_clone()?;
    let mut ex = Executor::new(cfg, reaping)?;
    let join = std::thread::Builder::new().name("executor".into()).spawn(move || {
        // Only this thread's mask: signals are the main thread's to take, the fallback's
        // signalfd sees SIGCHLD whatever the others do, and a spawn need not block them itself.
        crate::spawn::block_signals_in_this_thread(ex.reaping == Reaping::ThreadChildren);
        ex.run(rx, wake_r, sink)
    })?;
    Ok((Handle { tx, wake: Some(wake) }, join))
}

fn sigchld_ignored() -> bool {
    // SAFETY: reading the current action into a zeroed struct.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGCHLD, std::ptr::null(), &mut old) == 0
            && (old.sa_sigaction == libc::SIG_IGN || old.sa_flags & libc::SA_NOCLDWAIT != 0)
    }
}

fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes no pointers; the result is checked below.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor pidfd_open just opened (close-on-exec by definition), owned by nothing
    // else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Whether `pidfd_open` (5.3) and `waitid(P_PIDFD)` (5.4) both work here, tried on this process.
fn pidfds_work() -> io::Result<()> {
    let fd = pidfd_open(std::process::id() as libc::pid_t)?;
    // Not our child, so a kernel that knows P_PIDFD answers ECHILD; one that does not, EINVAL.
    match wait_info(libc::P_PIDFD, fd.as_raw_fd() as libc::id_t, libc::WEXITED | libc::WNOHANG) {
        Err(e) if e.raw_os_error() == Some(libc::ECHILD) => Ok(()),
        Err(e) => Err(e),
        Ok(_) => Err(io::Error::other("waitid(P_PIDFD) on this process succeeded")),
    }
}

/// `waitid`, retried when a signal handler interrupts it.
fn wait_info(idtype: libc::idtype_t, id: libc::id_t, options: libc::c_int) -> io::Result<libc::siginfo_t> {
    loop {
        // SAFETY: waitid fills a zeroed siginfo out-parameter.
        let (rc, info) = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            (libc::waitid(idtype, id, &mut info, options), info)
        };
        if rc == 0 {
            return Ok(info);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// epoll tokens; every other token is a child's pid.
const WAKE: u64 = u64::MAX;
const SIGNAL: u64 = u64::MAX - 1;
/// In the fallback, the first and the longest wait for an exit that SIGCHLD may not announce.
const SCAN_FIRST: Duration = Duration::from_millis(1);
const SCAN_MAX: Duration = Duration::from_millis(64);
/// Free space is looked at this often while plentiful, and before every report once below `SPACE_LOW`.
const SPACE_CHECK_EVERY: Duration = Duration::from_secs(2);
const SPACE_LOW: u64 = 256 << 20;

struct Running {
    task: TaskToRun,
    slots: Vec<usize>,
    start_us: u64,
    timed_out: bool,
    /// Stopped for higher-priority work.
    preempted: bool,
    /// Killed for passing its `mem=`, with the resident MiB seen then.
    oom_mb: Option<u64>,
    /// In its slot's memory cgroup: the cgroup's count of OOM kills when the task started.
    oom_kills_before: Option<u64>,
    /// Set when SIGTERM went out; SIGKILL follows at this instant.
    kill_at: Option<Instant>,
    serial: u64,
    /// None when the child is found by the fallback's scan instead.
    pidfd: Option<OwnedFd>,
}

struct Slot {
    out: File,
    err: File,
    /// Where the next task's output starts: only the executor appends to a slot's files.
    out_end: u64,
    err_end: u64,
    /// The running task's stdout and stderr captures (streams mode): descriptors whose numbers
    /// stay, pointed at fresh files before each spawn.
    capture: Option<(crate::capture::Capture, crate::capture::Capture)>,
}

impl Slot {
    fn new(out: File, err: File, capture: Option<(crate::capture::Capture, crate::capture::Capture)>) -> Slot {
        let (out_end, err_end) = (end_of(out.as_raw_fd()), end_of(err.as_raw_fd()));
        Slot { out, err, out_end, err_end, capture }
    }
}

struct Executor {
    cfg: ExecConfig,
    slots: Vec<Slot>,
    free: Vec<bool>,
    free_count: usize,
    queue: Queue,
    running: HashMap<libc::pid_t, Running>,
    /// By pid and spawn serial: the serial tells a stale entry from a new task that reused the pid.
    deadlines: Deadlines<Instant, libc::pid_t>,
    serial: u64,
    events: Vec<ExecEvent>,
    index: Option<BufWriter<File>>,
    /// Set when output storage failed (a full disk, a failed index write): the loop then stops
    /// with it, reporting only what was recorded whole.
    fault: Option<io::Error>,
    /// When free space was last looked at, and whether it was low then.
    space_checked: Option<Instant>,
    /// When what happened goes to the agent's main thread.
    handoff: Handoff,
    space_low: bool,
    /// When running tasks' memory was last looked at.
    mem_checked: Option<Instant>,
    /// Each slot's memory cgroup, made when it first runs a task with `mem=` (`cfg.memcg`).
    cgroups: Vec<Option<crate::memcg::Slot>>,
    /// Running tasks that may be preempted: while none, the queue's head never looks for any.
    preemptible_running: usize,
    /// "No pidfd" lines, at most one a minute (out of descriptors, every spawn would log).
    pidfd_log: crate::throttle::Throttle,
    env: Vec<CString>,
    path_dirs: Vec<Vec<u8>>,
    resolved: HashMap<Vec<u8>, Option<CString>>,
    bound_mask: Option<Vec<usize>>,
    binding: bool,
    /// The CPUs the thread may use when it binds nothing.
    unbound: Vec<usize>,
    spawner: crate::spawn::Spawner,
    /// Where tasks' capture files are made.
    scratch: crate::capture::Scratch,
    copy_buf: Vec<u8>,
    /// "No new capture" lines, at most one a minute.
    capture_log: crate::throttle::Throttle,
    reaping: Reaping,
    epoll: OwnedFd,
    /// SIGCHLD of the fallback.
    sigfd: Option<OwnedFd>,
    /// Children without a pidfd: while there are any, the fallback's scan and timer run.
    unwatched: usize,
    scan_wait: Duration,
    /// Children whose pidfds the last epoll_wait reported.
    ready: Vec<libc::pid_t>,
    /// Pidfds of reaped children, closed once the freed slots have their next tasks, so that
    /// tearing them down (a pidfs inode each) is not on the way from an exit to the next spawn.
    closing: Vec<OwnedFd>,
    /// Ended tasks whose groups are killed at the time given (`cfg.linger`): their zombies are
    /// held, by pidfd, until then, so the group's id cannot be reused meanwhile.
    lingering: std::collections::VecDeque<(Instant, libc::pid_t, OwnedFd)>,
}

impl Executor {
    // Long (about 110 lines): the descriptors it opens (epoll, signalfd, captures, the index) are
    // set up in order, each undone by the ones before it if a later one fails; split, the order
    // would be spread over functions that each need most of the struct.
    fn new(cfg: ExecConfig, reaping: Reaping) -> io::Result<Executor> {
        // SAFETY: epoll_create1 takes no pointers; the result is checked below.
        let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epoll < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor epoll_create1 just opened, owned by nothing else.
        let epoll = unsafe { OwnedFd::from_raw_fd(epoll) };
        let sigfd = if reaping == Reaping::ThreadChildren {
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
        let dir = &cfg.out_dir;
        let mut slots = Vec::new();
        let mut index = None;
        let scratch = crate::capture::Scratch::find();
        if cfg.output == OutputMode::Streams {
            fs::create_dir_all(dir)?;
            let open = |name: String| {
                OpenOptions::new().append(true).create(true).custom_flags(libc::O_CLOEXEC).open(dir.join(name))
            };
            for s in cfg.first_slot..cfg.first_slot + cfg.slots {
                use crate::capture::Capture;
                let capture = Some((Capture::new(&scratch)?, Capture::new(&scratch)?));
                slots.push(Slot::new(open(format!("slot-{s}.out"))?, open(format!("slot-{s}.err"))?, capture));
            }
            index = Some(BufWriter::with_capacity(64 << 10, crate::output::open_index(&dir.join(cfg.index_name()))?));
        } else {
            if cfg.output == OutputMode::PerTask {
                fs::create_dir_all(dir)?;
            }
            for _ in 0..cfg.slots {
                let null = || OpenOptions::new().write(true).custom_flags(libc::O_CLOEXEC).open("/dev/null");
                slots.push(Slot::new(null()?, null()?, None));
            }
        }
        let mut env = Vec::new();
        let mut path = b"/usr/local/bin:/usr/bin:/bin".to_vec();
        for (k, v) in &cfg.env {
            if is_private_var(k.as_bytes()) || k.as_bytes().contains(&b'=') {
                continue;
            }
            if k == "PATH" {
                path = v.as_bytes().to_vec();
            }
            let mut kv = k.clone().into_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            if let Ok(c) = CString::new(kv) {
                env.push(c);
            }
        }
        let path_dirs =
            path.split(|&b| b == b':').map(|d| if d.is_empty() { b".".to_vec() } else { d.to_vec() }).collect();
        Ok(Executor {
            free: vec![true; cfg.slots],
            free_count: cfg.slots,
            binding: !cfg.cpus.is_empty(),
            unbound: allowed_cpus(),
            slots,
            queue: Queue::default(),
            running: HashMap::new(),
            deadlines: Deadlines::default(),
            serial: 0,
            events: Vec::new(),
            index,
            fault: None,
            space_checked: None,
            handoff: Handoff::default(),
            space_low: false,
            mem_checked: None,
            cgroups: Vec::new(),
            preemptible_running: 0,
            pidfd_log: crate::throttle::Throttle::new(Duration::from_secs(60)),
            env,
            path_dirs,
            resolved: HashMap::new(),
            bound_mask: None,
            spawner: crate::spawn::Spawner::new(reaping == Reaping::Pidfd)?,
            scratch,
            copy_buf: Vec::new(),
            capture_log: crate::throttle::Throttle::new(Duration::from_secs(60)),
            cfg,
            reaping,
            epoll,
            sigfd,
            unwatched: 0,
            scan_wait: SCAN_FIRST,
            ready: Vec::new(),
            closing: Vec::new(),
            lingering: Default::default(),
        })
    }

    // Long (about 140 lines): the spawn loop, one pass per wakeup over every source (commands,
    // ended children, deadlines, memory, the queue), in the order that keeps a slot from being
    // handed out twice; each source's work is a method, the order is kept here in one place.
    fn run(
        &mut self,
        rx: mpsc::Receiver<Command>,
        wake: OwnedFd,
        mut sink: impl FnMut(Vec<ExecEvent>),
    ) -> io::Result<()> {
        epoll_add(&self.epoll, wake.as_raw_fd(), WAKE)?;
        // What it was told, apart from the tasks (`htc_core::orders`, as `VirtualExec` keeps it).
        let mut orders = Orders::default();
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 64];
        loop {
            loop {
                let todo = match rx.try_recv() {
                    Ok(c) => orders.take(c),
                    Err(mpsc::TryRecvError::Empty) => break,
                    // The network side is gone: nobody will read results, so stop everything.
                    Err(mpsc::TryRecvError::Disconnected) => {
                        if orders.abort() == Todo::DropAll {
                            self.queue.clear();
                            self.abort_all();
                        }
                        break;
                    }
                };
                match todo {
                    Todo::Nothing => {}
                    Todo::Queue(v) => self.queue.add(v),
                    Todo::Stop(ids) => self.stop(&ids),
                    Todo::Recall(ids) => self.queue.recall(&ids, &mut self.events),
                    Todo::DropAll => {
                        self.queue.clear();
                        self.abort_all();
                    }
                }
            }
            self.reap_ready();
            self.reap_unwatched();
            if let Some(e) = self.fault.take() {
                return Err(self.stop_on_fault(e));
            }
            self.enforce_deadlines();
            self.end_lingering(orders.aborted());
            self.enforce_memory();
            if orders.reset_done(self.running.len()) {
                self.events.push(ExecEvent::Reset);
            }
            if orders.may_start(now_us()) {
                self.start_queued();
            }
            // Closed without taking them out of the epoll set: their watches have fired and fire
            // no more, even while a child another thread is spawning holds a copy until its exec.
            self.closing.clear();
            let mut hand_off_at = None;
            if !self.events.is_empty() {
                let urgent = orders.finishing()
                    || orders.resetting()
                    || orders.held()
                    || self.queue.is_empty()
                    || self.events.iter().any(needs_answer);
                let now = Instant::now();
                match self.handoff.when(now, urgent) {
                    When::Now => {
                        if let Some(e) = self.space_fault() {
                            return Err(self.stop_on_fault(e));
                        }
                        if let Err(e) = self.flush_index() {
                            return Err(self.stop_on_fault(e));
                        }
                        sink(std::mem::take(&mut self.events));
                        self.handoff.handed(now);
                    }
                    When::At(t) => hand_off_at = Some(t),
                }
            }
            if orders.done(self.running.len(), self.queue.len()) {
                self.end_lingering(true);
                return self.flush_index();
            }
            let mut timeout = self
                .deadlines
                .next()
                .map(|t| t.saturating_duration_since(Instant::now()))
                .unwrap_or(Duration::from_millis(100))
                .min(Duration::from_millis(100));
            if self.unwatched > 0 {
                timeout = timeout.min(self.scan_wait);
            }
            if let Some(t) = hand_off_at {
                timeout = timeout.min(t.saturating_duration_since(Instant::now()));
            }
            if let Some((t, ..)) = self.lingering.front() {
                timeout = timeout.min(t.saturating_duration_since(Instant::now()));
            }
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
                    // SAFETY: reads 8 bytes (an eventfd's counter) into the local buffer of
                    // 1024, from the nonblocking eventfd `wake` owns.
                    WAKE => unsafe {
                        libc::read(wake.as_raw_fd(), buf.as_mut_ptr() as *mut libc::c_void, 8);
                    },
                    SIGNAL => {
                        if let Some(fd) = &self.sigfd {
                            // SAFETY: reads at most `buf.len()` bytes into the local buffer, from
                            // the nonblocking signalfd `self.sigfd` owns; drained until empty.
                            while unsafe {
                                libc::read(fd.as_raw_fd(), buf.as_mut_ptr() as *mut libc::c_void, buf.len())
                            } > 0
                            {}
                        }
                    }
                    pid => self.ready.push(pid as libc::pid_t),
                }
            }
            if n == 0 && self.unwatched > 0 {
                // Nothing announced itself for a whole wait: most likely nothing ended, so wait
                // longer; a spawn starts again from the shortest wait.
                self.scan_wait = (self.scan_wait * 2).min(SCAN_MAX);
            }
        }
    }

    /// Starts what `slots` says may start. Memory and GPUs are the leader's to commit
    /// (`htc_core::backfill`): it never sends more than the agent has, and releases them only
    /// once the result is back.
    fn start_queued(&mut self) {
        loop {
            let room = Room {
                cores: self.cfg.slots as u32,
                gpus: self.cfg.gpus.len() as u32,
                free_cores: self.free_count as u32,
                free_gpus: if self.cfg.gpus.is_empty() { 0 } else { self.cfg.gpus.free() as u32 },
            };
            // Without a preemptible task running, the head never looks through the others.
            let holders = (self.preemptible_running > 0)
                .then(|| self.running.values().map(|r| Holder::of(&r.task, r.start_us, r.kill_at.is_some())))
                .into_iter()
                .flatten();
            match self.queue.next(&room, holders) {
                Next::Start(t) => {
                    let devices = match t.shape.gpus {
                        0 => Vec::new(),
                        n => match self.cfg.gpus.take(t.id, n as usize) {
                            Some(d) => d,
                            // Another spawn loop of the agent took them first.
                            None => return self.queue.put_back(t),
                        },
                    };
                    let slots = self.take_slots(t.shape.cores.max(1) as usize);
                    self.spawn(t, slots, devices);
                }
                Next::Refuse(t) => {
                    let now = now_us();
                    let f = Finished {
                        id: t.id,
                        attempt: t.attempt,
                        outcome: Outcome::SpawnFailed,
                        value: libc::E2BIG,
                        start_us: now,
                        end_us: now,
                    };
                    self.events.push(ExecEvent::Finished(f));
                }
                // Their cores come back when they end, after at most the grace.
                Next::Stop(ids) => return self.stop(&ids),
                Next::Wait | Next::Idle => return,
            }
        }
    }

    /// The first `cores` free slots, now held.
    fn take_slots(&mut self, cores: usize) -> Vec<usize> {
        let mut slots = Vec::with_capacity(cores);
        for (i, f) in self.free.iter_mut().enumerate() {
            if *f && slots.len() < cores {
                *f = false;
                slots.push(i);
            }
        }
        self.free_count -= cores;
        slots
    }

    fn release(&mut self, t: &TaskToRun, slots: &[usize]) {
        for &s in slots {
            self.free[s] = true;
        }
        self.free_count += slots.len();
        if t.shape.gpus > 0 {
            self.cfg.gpus.give_back(t.id);
        }
    }

    fn resolve(&mut self, prog: &[u8]) -> Option<CString> {
        if prog.contains(&b'/') {
            return CString::new(prog).ok();
        }
        if let Some(r) = self.resolved.get(prog) {
            return r.clone();
        }
        let found = self.path_dirs.iter().find_map(|d| {
            let mut p = d.clone();
            p.push(b'/');
            p.extend_from_slice(prog);
            let c = CString::new(p).ok()?;
            // SAFETY: c is a valid NUL-terminated path.
            let ok = unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0;
            let is_file = fs::metadata(std::ffi::OsStr::from_bytes(c.as_bytes())).map(|m| m.is_file()).unwrap_or(false);
            (ok && is_file).then_some(c)
        });
        // Only hits are cached: a miss may be a passing filesystem hiccup (NFS), not a fact.
        if let Some(f) = &found {
            self.resolved.insert(prog.to_vec(), Some(f.clone()));
        }
        found
    }

    /// Binds the spawning thread (and so the next child) to the slots' CPUs, or to `near` (the
    /// CPUs nearest the task's GPUs) when known.
    fn bind(&mut self, slots: &[usize], near: Option<Vec<usize>>) {
        let cpus: Vec<usize> = match near {
            Some(c) => c,
            None if self.binding => slots.iter().map(|&s| self.cfg.cpus[s % self.cfg.cpus.len()]).collect(),
            // Not binding, but a GPU task was bound: back to the CPUs the thread started with.
            None if self.bound_mask.is_some() => self.unbound.clone(),
            None => return,
        };
        if self.bound_mask.as_deref() == Some(&cpus[..]) {
            return;
        }
        // SAFETY: cpu_set_t is plain data; CPU_SET bounds are checked against CPU_SETSIZE.
        let rc = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for &c in &cpus {
                if c < libc::CPU_SETSIZE as usize {
                    libc::CPU_SET(c, &mut set);
                }
            }
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
        };
        if rc != 0 {
            tracing::warn!(agent = self.cfg.agent, error = %io::Error::last_os_error(), "CPU binding not possible here; tasks run unbound");
            self.binding = false;
            self.bound_mask = None;
        } else {
            self.bound_mask = Some(cpus);
        }
    }

    fn spawn(&mut self, t: TaskToRun, slots: Vec<usize>, devices: Vec<crate::gpu::Device>) {
        let slot = slots[0];
        let start_us = now_us();
        let (prog, argv_owned) = match self.command_line(&t) {
            Ok(c) => c,
            Err((errno, msg)) => return self.spawn_failed(t, slots, start_us, errno, msg),
        };
        let mut argv: Vec<*const libc::c_char> = argv_owned.iter().map(|a| a.as_ptr()).collect();
        argv.push(std::ptr::null());
        let extra = self.task_env(&t, slots.len(), &devices);
        let gpu_env = !self.cfg.gpus.is_empty();
        let mut envp: Vec<*const libc::c_char> = Vec::with_capacity(self.env.len() + extra.len() + 1);
        envp.extend(
            self.env
                .iter()
                .filter(|e| !gpu_env || !crate::gpu::VISIBLE_VARS.iter().any(|v| crate::gpu::sets(e.as_bytes(), v)))
                .map(|e| e.as_ptr()),
        );
        envp.extend(extra.iter().map(|e| e.as_ptr()));
        envp.push(std::ptr::null());
        let (out_fd, err_fd, per_task) = match self.output_fds(&t, slot) {
            Ok(fds) => fds,
            Err((errno, msg)) => return self.spawn_failed(t, slots, start_us, errno, msg),
        };

        self.bind(&slots, crate::gpu::nearest_cpus(&devices));
        let oom_kills_before = self.limit_memory(slot, t.shape.mem_mb);
        let (prog, argv, _wrapper) = match oom_kills_before.and(self.cgroup_wrapper(slot)) {
            Some(w) => (CString::from(c"/bin/sh"), w.argv(&argv), Some(w)),
            None => (prog, argv, None),
        };
        let v1 = self.cfg.memcg.as_ref().is_some_and(|r| r.version() == crate::memcg::Version::V1);
        let inside = v1 && oom_kills_before.is_some() && self.enter_cgroup(slot);
        // Not born in its cgroup (v1): the watch enforces its mem= instead.
        let oom_kills_before = oom_kills_before.filter(|_| inside || !v1);
        let spawned = self.spawner.spawn(&prog, &argv, &envp, out_fd, err_fd);
        if inside {
            self.leave_cgroup(slot);
        }
        drop(per_task);
        match spawned {
            Ok(crate::spawn::Child { pid, pidfd }) => self.started(t, slots, start_us, pid, pidfd, oom_kills_before),
            Err(errno) => {
                let name = String::from_utf8_lossy(prog.as_bytes()).into_owned();
                let msg = format!("htc: {name}: {}\n", io::Error::from_raw_os_error(errno));
                self.spawn_failed(t, slots, start_us, errno, msg)
            }
        }
    }

    /// The program and argv of `t`: `/bin/sh -c` for a shell task, else its words with the
    /// program found on the PATH; why not, as an errno and a line for its stderr.
    fn command_line(&mut self, t: &TaskToRun) -> Result<(CString, Vec<CString>), (i32, String)> {
        if t.shell {
            let Ok(cmd) = CString::new(t.command.clone()) else {
                return Err((libc::EINVAL, "htc: command contains a NUL byte\n".into()));
            };
            return Ok((CString::from(c"/bin/sh"), vec![CString::from(c"/bin/sh"), CString::from(c"-c"), cmd]));
        }
        let argv: Vec<CString> =
            t.command.split(|&b| b == b' ').filter(|w| !w.is_empty()).filter_map(|w| CString::new(w).ok()).collect();
        match argv.first().and_then(|a| self.resolve(a.as_bytes())) {
            Some(prog) => Ok((prog, argv)),
            None => {
                let name = String::from_utf8_lossy(argv.first().map(|a| a.as_bytes()).unwrap_or(b"")).into_owned();
                Err((libc::ENOENT, format!("htc: {name}: command not found\n")))
            }
        }
    }

    /// What a task finds in its environment besides the agent's: who it is, and on an agent
    /// with GPUs exactly its own devices (none unless it asked).
    fn task_env(&mut self, t: &TaskToRun, cores: usize, devices: &[crate::gpu::Device]) -> Vec<CString> {
        let mut extra = vec![
            CString::new(format!("HTC_TASK_ID={}", t.id)).unwrap(),
            CString::new(format!("HTC_ATTEMPT={}", t.attempt)).unwrap(),
            CString::new(format!("HTC_CORES={cores}")).unwrap(),
            CString::new(format!("HTC_JOB_ID={}", self.cfg.job_id)).unwrap_or_default(),
            CString::new(format!("HTC_AGENT={}", self.cfg.agent)).unwrap(),
        ];
        if !self.cfg.gpus.is_empty() {
            let ids = crate::gpu::visible(devices);
            for var in crate::gpu::VISIBLE_VARS {
                extra.push(CString::new(format!("{var}={ids}")).unwrap_or_default());
            }
            if !devices.is_empty() {
                self.note_devices(t, &ids);
            }
        }
        extra
    }

    /// Where the task's stdout and stderr go (with the files to keep open until it is spawned,
    /// per-task mode); why not, as an errno and a line for its stderr.
    #[allow(clippy::type_complexity)]
    fn output_fds(&mut self, t: &TaskToRun, slot: usize) -> Result<OutputFds, (i32, String)> {
        match self.cfg.output {
            OutputMode::PerTask => {
                let open = |ext: &str| {
                    OpenOptions::new()
                        .write(true)
                        .create(true)
                        .truncate(true)
                        .custom_flags(libc::O_CLOEXEC)
                        .open(self.cfg.out_dir.join(format!("{}.{ext}", t.id)))
                };
                match (open("out"), open("err")) {
                    (Ok(o), Ok(e)) => Ok((o.as_raw_fd(), e.as_raw_fd(), Some((o, e)))),
                    (Err(e), _) | (_, Err(e)) => {
                        Err((e.raw_os_error().unwrap_or(libc::EIO), format!("htc: cannot open output file: {e}\n")))
                    }
                }
            }
            OutputMode::Streams => {
                if let Err((e, usable)) = self.renew_captures(slot) {
                    if !usable {
                        let errno = e.raw_os_error().unwrap_or(libc::EIO);
                        return Err((errno, format!("htc: cannot make its output capture: {e}\n")));
                    }
                }
                let Some((out, err)) = &self.slots[slot].capture else { unreachable!("streams mode has captures") };
                Ok((out.task_fd(), err.task_fd(), None))
            }
            OutputMode::None => Ok((self.slots[slot].out.as_raw_fd(), self.slots[slot].err.as_raw_fd(), None)),
        }
    }

    /// A task's process is running: its deadline, its watch, its slots.
    fn started(
        &mut self,
        t: TaskToRun,
        slots: Vec<usize>,
        start_us: u64,
        pid: libc::pid_t,
        pidfd: Option<OwnedFd>,
        oom_kills_before: Option<u64>,
    ) {
        self.events.push(ExecEvent::Started { id: t.id, attempt: t.attempt, start_us });
        self.serial += 1;
        let serial = self.serial;
        if t.shape.timeout_ms > 0 {
            self.deadlines.limit(Instant::now() + Duration::from_millis(t.shape.timeout_ms as u64), pid, serial);
        }
        self.preemptible_running += t.shape.preemptible as usize;
        let pidfd = self.watch(pid, pidfd);
        if pidfd.is_none() {
            self.unwatched += 1;
            self.scan_wait = SCAN_FIRST;
        }
        let r = Running {
            task: t,
            slots,
            start_us,
            timed_out: false,
            preempted: false,
            oom_mb: None,
            oom_kills_before,
            kill_at: None,
            serial,
            pidfd,
        };
        self.running.insert(pid, r);
    }

    /// The task could not be started: the reason goes where its stderr would have gone, so
    /// `htc output` shows it, and it ends as a spawn failure with `errno`.
    fn spawn_failed(&mut self, t: TaskToRun, slots: Vec<usize>, start_us: u64, errno: i32, msg: String) {
        let slot = slots[0];
        if let Some(s) = self.slots.get_mut(slot) {
            let (out_off, err_off) = (s.out_end, s.err_end);
            let kept = (&s.err).write_all(msg.as_bytes()).is_ok();
            if kept {
                s.err_end += msg.len() as u64;
            }
            if let Some(ix) = self.index.as_mut() {
                let e = IndexEntry {
                    id: t.id,
                    attempt: t.attempt,
                    slot: (self.cfg.first_slot + slot) as u32,
                    out_off,
                    out_len: 0,
                    err_off,
                    err_len: if kept { msg.len() as u64 } else { 0 },
                    start_us,
                    out_crc: 0,
                    err_crc: if kept { crc32fast::hash(msg.as_bytes()) } else { 0 },
                };
                if let Err(e) = ix.write_all(&e.encode()) {
                    let e = self.storage_error("writing the output index", e);
                    self.fault.get_or_insert(e);
                }
            }
        }
        self.release(&t, &slots);
        self.events.push(ExecEvent::Finished(Finished {
            id: t.id,
            attempt: t.attempt,
            outcome: Outcome::SpawnFailed,
            value: errno,
            start_us,
            end_us: now_us(),
        }));
    }

    /// The pidfd of `pid` (the one its clone gave, else a new one) in the epoll set, or None if
    /// the fallback's scan must find it.
    fn watch(&mut self, pid: libc::pid_t, pidfd: Option<OwnedFd>) -> Option<OwnedFd> {
        if self.reaping != Reaping::Pidfd {
            return None;
        }
        let fd = match pidfd {
            Some(fd) => Ok(fd),
            None => pidfd_open(pid),
        };
        let r = fd.and_then(|fd| epoll_watch(&self.epoll, fd.as_raw_fd(), pid, libc::EPOLL_CTL_ADD).map(|()| fd));
        match r {
            Ok(fd) => Some(fd),
            Err(e) => {
                if let Some(more) = self.pidfd_log.allow(Instant::now()) {
                    tracing::warn!(agent = self.cfg.agent, pid, error = %e, not_logged = more, "no pidfd for a task; it is reaped by polling");
                }
                None
            }
        }
    }

    /// Finishes the children whose pidfds became readable.
    fn reap_ready(&mut self) {
        let mut ready = std::mem::take(&mut self.ready);
        for &pid in &ready {
            let Some(fd) = self.running.get(&pid).and_then(|r| r.pidfd.as_ref()) else { continue };
            let options = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
            match wait_info(libc::P_PIDFD, fd.as_raw_fd() as libc::id_t, options) {
                // SAFETY: waitid filled the SIGCHLD fields of info.
                Ok(info) if unsafe { info.si_pid() } == 0 => {
                    // Not gone after all: watch it again (the watch fires once).
                    let _ = epoll_watch(&self.epoll, fd.as_raw_fd(), pid, libc::EPOLL_CTL_MOD);
                }
                Ok(_) => self.finish(pid, None),
                Err(e) => self.finish(pid, Some(e)),
            }
        }
        ready.clear();
        self.ready = ready;
    }

    /// Finishes every exited child of this thread, while any child lacks a pidfd. `__WNOTHREAD`
    /// leaves the children of every other thread (another executor's above all) to their owners.
    fn reap_unwatched(&mut self) {
        while self.unwatched > 0 {
            let options = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT | libc::__WNOTHREAD;
            let Ok(info) = wait_info(libc::P_ALL, 0, options) else { return };
            // SAFETY: waitid filled the SIGCHLD fields of info.
            let pid = unsafe { info.si_pid() };
            if pid == 0 {
                return;
            }
            self.finish(pid, None);
        }
    }

    /// Records the end of child `pid`, an unreaped zombie; or, with `lost`, a child that some
    /// other code of this process reaped. The group is killed before the zombie is released, so
    /// nothing the task left behind outlives it and the group id cannot have been reused.
    fn finish(&mut self, pid: libc::pid_t, lost: Option<io::Error>) {
        let mut r = self.running.remove(&pid);
        let linger = !self.cfg.linger.is_zero() && r.as_ref().is_some_and(|r| r.pidfd.is_some());
        let status = match lost {
            // Its status read, the zombie kept: the group is killed and the zombie released later.
            None if linger => {
                let fd = r.as_mut().and_then(|r| r.pidfd.take()).expect("a pidfd, looked at above");
                let status = wait_info(libc::P_PIDFD, fd.as_raw_fd() as libc::id_t, libc::WEXITED | libc::WNOWAIT);
                self.lingering.push_back((Instant::now() + self.cfg.linger, pid, fd));
                status
            }
            None => {
                // SAFETY: kill takes no pointers; pid is our exited child, not reaped until below,
                // so the id of the group it led cannot have been reused.
                unsafe { libc::kill(-pid, libc::SIGKILL) };
                match r.as_ref().and_then(|r| r.pidfd.as_ref()) {
                    Some(fd) => wait_info(libc::P_PIDFD, fd.as_raw_fd() as libc::id_t, libc::WEXITED),
                    None => wait_info(libc::P_PID, pid as libc::id_t, libc::WEXITED),
                }
            }
            Some(e) => Err(e),
        };
        let Some(mut r) = r else { return };
        self.preemptible_running -= r.task.shape.preemptible as usize;
        if let Some(before) = r.oom_kills_before {
            // The kernel's kill usually ends the task before the next look. Read even when the
            // watch killed it, so the next task in the slot starts from the count as it is.
            let oom = self.cgroup_oom(r.slots[0], before);
            r.oom_mb = r.oom_mb.or(oom);
        }
        match r.pidfd.take() {
            Some(fd) => self.closing.push(fd),
            None if linger => {}
            None => self.unwatched -= 1,
        }
        let end_us = now_us();
        let (outcome, value) = match status {
            Ok(info) => {
                // SAFETY: waitid filled the SIGCHLD fields of info.
                let v = unsafe { info.si_status() };
                slots::ending(r.oom_mb, r.preempted, r.timed_out, info.si_code == libc::CLD_EXITED, v)
            }
            Err(e) => {
                tracing::warn!(agent = self.cfg.agent, task = r.task.id, pid, error = %e, "exit status lost: the task was reaped by someone else");
                (Outcome::Lost, e.raw_os_error().unwrap_or(0))
            }
        };
        match self.cfg.output {
            OutputMode::Streams => self.store_capture(&r),
            OutputMode::PerTask if r.task.shape.max_output > 0 => self.cut_per_task(&r),
            _ => {}
        }
        self.release(&r.task, &r.slots);
        if outcome != Outcome::Exited || value != 0 {
            if let Some(full) = self.disk_full() {
                // Not the task's fault: its end is not reported, so it runs again on resume
                // without using up a retry.
                self.fault.get_or_insert(full);
                return;
            }
        }
        self.events.push(ExecEvent::Finished(Finished {
            id: r.task.id,
            attempt: r.task.attempt,
            outcome,
            value,
            start_us: r.start_us,
            end_us,
        }));
    }

    /// Kills the groups of ended tasks whose time to linger is up (`all`: every one, as the loop
    /// ends or aborts), then releases their zombies.
    fn end_lingering(&mut self, all: bool) {
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

    /// Preempted tasks: a queued one ends at once, a running one gets SIGTERM now and SIGKILL
    /// after the grace (as a timeout), and ends as preempted.
    fn stop(&mut self, ids: &[u64]) {
        self.queue.preempt(ids, now_us(), &mut self.events);
        let kill_at = Instant::now() + self.cfg.kill_grace;
        for (&pid, r) in self.running.iter_mut().filter(|(_, r)| ids.contains(&r.task.id) && r.kill_at.is_none()) {
            tracing::info!(job = %self.cfg.job_id, task = r.task.id, "preempted");
            r.preempted = true;
            terminate(pid, r, kill_at, &mut self.deadlines);
        }
    }

    /// Tasks past their `mem=` are killed, and end as out of memory; looked at every
    /// `memwatch::EVERY` while any such task runs. A task in a memory cgroup was stopped by the
    /// kernel (one process of it): the rest of its group goes. Others are watched: the resident
    /// memory of their whole process group.
    fn enforce_memory(&mut self) {
        let now = Instant::now();
        if self.mem_checked.is_some_and(|t| now.duration_since(t) < crate::memwatch::EVERY) {
            return;
        }
        self.mem_checked = Some(now);
        let mut groups = Vec::new();
        let mut killed = Vec::new();
        let v1 = self.cfg.memcg.as_ref().is_some_and(|r| r.version() == crate::memcg::Version::V1);
        let limited: Vec<(libc::pid_t, usize, Option<u64>)> = self
            .running
            .iter()
            .filter(|(_, r)| r.task.shape.mem_mb > 0 && r.oom_mb.is_none())
            .map(|(&pid, r)| (pid, r.slots[0], r.oom_kills_before))
            .collect();
        for (pid, slot, before) in limited {
            match before {
                Some(before) => match self.cgroup_oom(slot, before) {
                    Some(mb) => killed.push((pid, mb)),
                    // v2 tasks moved themselves in, or tried to: the watch backs them up.
                    None if !v1 => groups.push(pid),
                    None => {}
                },
                None => groups.push(pid),
            }
        }
        if !groups.is_empty() {
            let watched = crate::memwatch::group_rss_mb(&groups);
            let over = |&(pid, mb): &(libc::pid_t, u64)| {
                self.running.get(&pid).is_some_and(|r| mb > r.task.shape.mem_mb as u64)
            };
            killed.extend(watched.into_iter().filter(over));
        }
        for (pid, mb) in killed {
            let Some(r) = self.running.get_mut(&pid) else { continue };
            tracing::warn!(job = %self.cfg.job_id, task = r.task.id, rss_mb = mb, mem_mb = r.task.shape.mem_mb, "out of memory: killed");
            r.oom_mb = Some(mb);
            // Being killed: neither preempted nor timed out on top of it.
            r.kill_at = Some(now);
            // SAFETY: kill takes no pointers. The task is in `running`, so not reaped yet: its
            // pid, the id of the group it leads, cannot have been reused.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
    }

    /// Sets slot `slot`'s memory cgroup up for a task of `mem_mb` (none: 0), and returns its
    /// count of OOM kills so far; None when the task is to be watched instead.
    fn limit_memory(&mut self, slot: usize, mem_mb: u32) -> Option<u64> {
        let root = self.cfg.memcg.as_ref().filter(|_| mem_mb > 0)?;
        if self.cgroups.len() <= slot {
            self.cgroups.resize_with(slot + 1, || None);
        }
        let n = self.cfg.first_slot + slot;
        let made = match self.cgroups[slot].take() {
            Some(cg) => Ok(cg),
            None => root.slot(n),
        };
        let r = made.and_then(|mut cg| {
            cg.limit(mem_mb)?;
            let before = cg.kills();
            self.cgroups[slot] = Some(cg);
            Ok(before)
        });
        match r {
            Ok(before) => Some(before),
            Err(e) => {
                tracing::warn!(job = %self.cfg.job_id, slot = n, error = %e, "memory cgroup unusable: this task's mem= is watched instead");
                None
            }
        }
    }

    /// v1: moves this thread into slot `slot`'s memory cgroup, so the task it spawns next is
    /// born there; true if it did (then `leave_cgroup` after the spawn).
    fn enter_cgroup(&mut self, slot: usize) -> bool {
        let Some(cg) = self.cgroups.get(slot).and_then(Option::as_ref) else { return false };
        match cg.enter_thread() {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(job = %self.cfg.job_id, error = %e, "cannot spawn into the slot's memory cgroup");
                false
            }
        }
    }

    fn leave_cgroup(&mut self, slot: usize) {
        let Some(root) = self.cfg.memcg.as_ref() else { return };
        if let Err(e) = root.leave_thread() {
            // Tasks spawned from here on are born in this slot's cgroup: it must not limit
            // them, and its count of kills must not be read as theirs.
            tracing::error!(job = %self.cfg.job_id, error = %e, "the spawn loop cannot leave a task's memory cgroup; memory cgroups are off for it, their mem= is watched");
            if let Some(Err(e)) = self.cgroups.get_mut(slot).and_then(Option::as_mut).map(|cg| cg.unlimit()) {
                tracing::error!(job = %self.cfg.job_id, error = %e, "and its limit could not be lifted");
            }
            self.cfg.memcg = None;
        }
    }

    /// v2: the command that moves the task into slot `slot`'s cgroup before it runs.
    fn cgroup_wrapper(&self, slot: usize) -> Option<crate::memcg::Wrapper> {
        self.cfg.memcg.as_ref().filter(|r| r.version() == crate::memcg::Version::V2)?;
        let cg = self.cgroups.get(slot)?.as_ref()?;
        crate::memcg::Wrapper::new(cg)
    }

    /// The peak MiB of slot `slot`'s cgroup if the kernel killed there for memory since its
    /// count was `before`.
    fn cgroup_oom(&mut self, slot: usize, before: u64) -> Option<u64> {
        self.cgroups.get_mut(slot)?.as_mut()?.oom_since(before)
    }

    fn enforce_deadlines(&mut self) {
        let now = Instant::now();
        while let Some((pid, serial, due)) = self.deadlines.due(now) {
            let grace = self.cfg.kill_grace;
            let Some(r) = self.running.get_mut(&pid).filter(|r| r.serial == serial) else { continue };
            match (due, r.kill_at) {
                (Due::Stop, None) => {
                    r.timed_out = true;
                    terminate(pid, r, now + grace, &mut self.deadlines);
                }
                // SAFETY: kill takes no pointers. The task is in `running`, so not reaped yet: its
                // pid, the id of the group it leads, cannot have been reused.
                (Due::Kill, Some(_)) => unsafe {
                    libc::kill(-pid, libc::SIGKILL);
                },
                // Its limit came while it was already stopping: the kill is due anyway.
                _ => {}
            }
        }
    }

    /// Notes which devices the task got in the spawner's `devices` file (`htc log` shows them).
    fn note_devices(&self, t: &TaskToRun, ids: &str) {
        let line = format!("{}\t{}\t{ids}\n", t.id, t.attempt);
        let path = self.cfg.out_dir.join(crate::output::devices_name(self.cfg.agent, self.cfg.spawner));
        let w = OpenOptions::new().append(true).create(true).custom_flags(libc::O_CLOEXEC).open(&path);
        if let Err(e) = w.and_then(|mut f| f.write_all(line.as_bytes())) {
            tracing::warn!(agent = self.cfg.agent, task = t.id, error = %e, "its devices are not recorded");
        }
    }

    /// Fresh capture files for the task about to start in `slot`; where none can be made, the
    /// old ones emptied (logged at most once a minute).
    fn renew_captures(&mut self, slot: usize) -> Result<(), (io::Error, bool)> {
        let Some((out, err)) = &mut self.slots[slot].capture else { return Ok(()) };
        let r = out.renew(&self.scratch).and(err.renew(&self.scratch));
        if let Err((e, true)) = &r {
            if let Some(more) = self.capture_log.allow(Instant::now()) {
                tracing::warn!(agent = self.cfg.agent, error = %e, not_logged = more, "no new output capture; the slot's last one is emptied and reused");
            }
        }
        r
    }

    /// Appends an ended task's captures to its slot's streams (at most its `max_output=` of
    /// each) and indexes them with their checksums; a cut is noted for `htc output`.
    fn store_capture(&mut self, r: &Running) {
        let s = &mut self.slots[r.slots[0]];
        let Some((cap_out, cap_err)) = &s.capture else { return };
        let (out_off, err_off) = (s.out_end, s.err_end);
        let cap = r.task.shape.max_output_bytes();
        let copied = cap_out.append_to(&mut &s.out, cap, &mut self.copy_buf).and_then(|o| {
            s.out_end += o.kept;
            let e = cap_err.append_to(&mut &s.err, cap, &mut self.copy_buf)?;
            s.err_end += e.kept;
            Ok((o, e))
        });
        let (o, e) = match copied {
            Ok(oe) => oe,
            Err(e) => {
                // Re-read the ends: a partial append must not shift the next task's offsets.
                (s.out_end, s.err_end) = (end_of(s.out.as_raw_fd()), end_of(s.err.as_raw_fd()));
                let e = self.storage_error("appending a task's output", e);
                self.fault.get_or_insert(e);
                return;
            }
        };
        let entry = IndexEntry {
            id: r.task.id,
            attempt: r.task.attempt,
            slot: (self.cfg.first_slot + r.slots[0]) as u32,
            out_off,
            out_len: o.kept,
            err_off,
            err_len: e.kept,
            start_us: r.start_us,
            out_crc: o.crc,
            err_crc: e.crc,
        };
        if let Some(ix) = self.index.as_mut() {
            if let Err(e) = ix.write_all(&entry.encode()) {
                let e = self.storage_error("writing the output index", e);
                self.fault.get_or_insert(e);
            }
        }
        let cuts: Vec<(&str, u64)> = [("stdout", o), ("stderr", e)]
            .into_iter()
            .filter(|(_, a)| a.written > a.kept)
            .map(|(n, a)| (n, a.written))
            .collect();
        self.note_cuts(r, &cuts);
    }

    /// `max_output=` with a file per task: what the task wrote past its cap is cut off.
    fn cut_per_task(&mut self, r: &Running) {
        let cap = r.task.shape.max_output_bytes();
        let mut cuts = Vec::new();
        for (name, ext) in [("stdout", "out"), ("stderr", "err")] {
            let p = self.cfg.out_dir.join(format!("{}.{ext}", r.task.id));
            let Ok(f) = OpenOptions::new().write(true).custom_flags(libc::O_CLOEXEC).open(&p) else { continue };
            let written = f.metadata().map(|m| m.len()).unwrap_or(0);
            if written > cap && f.set_len(cap).is_ok() {
                cuts.push((name, written));
            }
        }
        self.note_cuts(r, &cuts);
    }

    /// Notes outputs cut at their cap in the spawner's `cuts` file, for `htc output`.
    fn note_cuts(&self, r: &Running, cuts: &[(&str, u64)]) {
        if cuts.is_empty() {
            return;
        }
        let cap = r.task.shape.max_output_bytes();
        let mut line = String::new();
        for (name, written) in cuts {
            line.push_str(&format!("{}\t{}\t{name}\t{written}\t{cap}\n", r.task.id, r.task.attempt));
        }
        let path = self.cfg.out_dir.join(crate::output::cuts_name(self.cfg.agent, self.cfg.spawner));
        let w = OpenOptions::new().append(true).create(true).custom_flags(libc::O_CLOEXEC).open(&path);
        if let Err(e) = w.and_then(|mut f| f.write_all(line.as_bytes())) {
            tracing::warn!(agent = self.cfg.agent, task = r.task.id, error = %e, "the cut of its output is not recorded");
        }
    }

    fn flush_index(&mut self) -> io::Result<()> {
        let Some(ix) = self.index.as_mut() else { return Ok(()) };
        ix.flush().map_err(|e| self.storage_error("writing the output index", e))
    }

    /// Some(error) when the disk holding the output is full: tasks that fail then most likely
    /// failed writing their output.
    fn disk_full(&self) -> Option<io::Error> {
        let dir = &self.cfg.out_dir;
        let free = crate::disk::free_bytes(dir).filter(|&b| b < crate::disk::NEARLY_FULL)?;
        Some(io::Error::new(
            io::ErrorKind::StorageFull,
            format!("the disk holding {} is full ({free} bytes free)", dir.display()),
        ))
    }

    fn storage_error(&self, what: &str, e: io::Error) -> io::Error {
        let path = self.cfg.out_dir.join(self.cfg.index_name());
        io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
    }

    /// Output storage failed: stop every task. The ends not yet reported are dropped (their
    /// output may be cut short or unindexed), so those tasks run again on resume.
    fn stop_on_fault(&mut self, e: io::Error) -> io::Error {
        self.queue.clear();
        self.abort_all();
        self.events.clear();
        // A full disk is the likeliest cause of any write error, and the most useful to name.
        let e = self.disk_full().unwrap_or(e);
        tracing::error!(agent = self.cfg.agent, error = %e, "output storage failed");
        e
    }

    /// Before ends are reported: is the disk holding the output full? A task that wrote to a
    /// full disk may still exit 0 (dash's printf does), its output cut short. Checked before
    /// every report while space is low, and every few seconds otherwise (statfs can be a
    /// server round trip on a network filesystem).
    fn space_fault(&mut self) -> Option<io::Error> {
        if self.cfg.output == OutputMode::None {
            return None;
        }
        let now = Instant::now();
        if !self.space_low && self.space_checked.is_some_and(|t| now.duration_since(t) < SPACE_CHECK_EVERY) {
            return None;
        }
        self.space_checked = Some(now);
        let free = crate::disk::free_bytes(&self.cfg.out_dir)?;
        self.space_low = free < SPACE_LOW;
        self.disk_full()
    }

    fn abort_all(&mut self) {
        let now = Instant::now();
        for (&pid, r) in self.running.iter_mut() {
            if r.kill_at.is_none() {
                r.kill_at = Some(now + self.cfg.kill_grace);
                // SAFETY: kill takes no pointers. The task is in `running`, so not reaped yet:
                // its pid, the id of the group it leads, cannot have been reused.
                unsafe { libc::kill(-pid, libc::SIGTERM) };
                self.deadlines.kill_at(now + self.cfg.kill_grace, pid, r.serial);
            }
        }
    }
}

/// Events the agent waits on, so they are handed off at once: recalls answer the leader,
/// a reset ends a rejoin.
fn needs_answer(e: &ExecEvent) -> bool {
    matches!(e, ExecEvent::Recalled { .. } | ExecEvent::Reset)
}

/// A child's pidfd in the epoll set (`op`: add, or re-arm), reported once: when it has exited.
fn epoll_watch(epoll: &OwnedFd, fd: RawFd, pid: libc::pid_t, op: libc::c_int) -> io::Result<()> {
    let mut ev = libc::epoll_event { events: (libc::EPOLLIN | libc::EPOLLONESHOT) as u32, u64: pid as u64 };
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

/// Variables a task must not inherit from its agent: the per-task HTC_* set (added fresh),
/// the agent's own log filter, and the PMI channel of the agents' srun step (its fd is not the
/// task's, and an MPI program started as a task would try to use it).
fn is_private_var(k: &[u8]) -> bool {
    const RESERVED: &[&[u8]] = &[b"HTC_TASK_ID", b"HTC_JOB_ID", b"HTC_ATTEMPT", b"HTC_CORES", b"HTC_AGENT", b"HTC_LOG"];
    RESERVED.contains(&k) || k.starts_with(b"PMI_") || k.starts_with(b"PMIX_")
}

fn end_of(fd: RawFd) -> u64 {
    // SAFETY: lseek on a valid fd; -1 maps to 0.
    let off = unsafe { libc::lseek(fd, 0, libc::SEEK_END) };
    off.max(0) as u64
}

/// When to act on a running task (its timeout, or SIGKILL after SIGTERM): (when, pid, serial).
/// SIGTERM to a task's process group now, and SIGKILL at `kill_at` (a deadline) unless it ended.
fn terminate(pid: libc::pid_t, r: &mut Running, kill_at: Instant, deadlines: &mut Deadlines<Instant, libc::pid_t>) {
    r.kill_at = Some(kill_at);
    // SAFETY: kill takes no pointers. Callers pass a task of `running` (`r`), not reaped yet:
    // its pid, the id of the group it leads, cannot have been reused.
    unsafe { libc::kill(-pid, libc::SIGTERM) };
    deadlines.kill_at(kill_at, pid, r.serial);
}

/// CPUs this process may run on, in order.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: sched_getaffinity fills a zeroed cpu_set_t.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return (0..std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)).collect();
        }
        (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn config(slots: usize, name: &str) -> (ExecConfig, PathBuf) {
        let dir = std::env::temp_dir().join(format!("htc-exec-test-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let cfg = ExecConfig {
            job_id: "j1".into(),
            agent: 0,
            cpus: vec![],
            slots,
            out_dir: dir.clone(),
            output: OutputMode::Streams,
            env: std::env::vars_os().collect(),
            kill_grace: Duration::from_millis(300),
            spawner: 0,
            first_slot: 0,
            gpus: crate::gpu::Pool::default(),
            memcg: None,
            linger: Duration::ZERO,
        };
        (cfg, dir)
    }

    /// An executor started on `tasks`: its handle (dropping it aborts the run), its results.
    struct Launched {
        _handle: Handle,
        rx: mpsc::Receiver<Finished>,
        join: std::thread::JoinHandle<io::Result<()>>,
        tasks: usize,
    }

    fn launch(tasks: Vec<TaskToRun>, slots: usize, name: &str, reaping: Reaping) -> (Launched, PathBuf) {
        let (cfg, dir) = config(slots, name);
        let (tx, rx) = mpsc::channel();
        let (h, join) = start_with(cfg, reaping, move |ev| {
            for e in ev {
                if let ExecEvent::Finished(f) = e {
                    let _ = tx.send(f);
                }
            }
        })
        .unwrap();
        let n = tasks.len();
        h.send(Command::Run(tasks));
        h.send(Command::Finish);
        (Launched { _handle: h, rx, join, tasks: n }, dir)
    }

    /// One result per task (a missing one fails the test rather than hanging it), then
    /// whatever else came until the executor stopped; sorted by task id.
    fn collect(l: Launched) -> Vec<Finished> {
        let mut out: Vec<Finished> = (0..l.tasks)
            .map(|i| {
                l.rx.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|_| panic!("{i} of {} results", l.tasks))
            })
            .collect();
        l.join.join().unwrap().unwrap();
        out.extend(l.rx.try_iter());
        out.sort_by_key(|f| f.id);
        out
    }

    fn run_tasks(tasks: Vec<TaskToRun>, slots: usize, name: &str, reaping: Reaping) -> (Vec<Finished>, PathBuf) {
        let n = tasks.len();
        let (l, dir) = launch(tasks, slots, name, reaping);
        let out = collect(l);
        assert_eq!(out.len(), n);
        (out, dir)
    }

    fn task(id: u64, cmd: &str, timeout_ms: u32) -> TaskToRun {
        let shell = htc_core::taskfile::needs_shell(cmd.as_bytes());
        let shape = htc_core::shape::TaskShape { timeout_ms, ..Default::default() };
        TaskToRun { shell, ..TaskToRun::new(id, 1, cmd.as_bytes().to_vec()).shaped(shape) }
    }

    fn outcomes(reaping: Reaping, name: &str) {
        let (f, dir) = run_tasks(
            vec![
                task(1, "true", 0),
                task(2, "exit 3", 0),
                task(3, "kill -SEGV $$", 0),
                task(4, "sleep 5", 200),
                task(5, "no-such-binary-htc", 0),
                task(6, "echo out-$HTC_TASK_ID; echo err >&2", 0),
                task(7, "trap '' TERM; sleep 5", 200),
            ],
            3,
            name,
            reaping,
        );
        assert_eq!((f[0].outcome, f[0].value), (Outcome::Exited, 0));
        assert_eq!((f[1].outcome, f[1].value), (Outcome::Exited, 3));
        assert_eq!((f[2].outcome, f[2].value), (Outcome::Signaled, libc::SIGSEGV));
        assert_eq!((f[3].outcome, f[3].value), (Outcome::TimedOut, libc::SIGTERM));
        assert_eq!((f[4].outcome, f[4].value), (Outcome::SpawnFailed, libc::ENOENT));
        assert_eq!((f[6].outcome, f[6].value), (Outcome::TimedOut, libc::SIGKILL));
        let idx = crate::output::read_index(&dir.join("index")).unwrap();
        let e = idx.iter().find(|e| e.id == 6).unwrap();
        let out = fs::read(dir.join(format!("slot-{}.out", e.slot))).unwrap();
        assert_eq!(&out[e.out_off as usize..(e.out_off + e.out_len) as usize], b"out-6\n");
        assert_eq!(e.err_len, 4);
    }

    #[test]
    fn a_task_past_its_mem_is_killed_as_out_of_memory_and_the_others_are_not() {
        // Task 1 holds 200 MiB (in a child of the shell: the group counts) against mem=50M;
        // task 2 holds 20 MiB against mem=100M; task 3 declares nothing.
        let hold = |mb: u32| format!("perl -e '$x = \"a\" x ({mb} << 20); sleep 2'; true");
        let with_mem = |mut t: TaskToRun, mem_mb| {
            t.shape.mem_mb = mem_mb;
            t
        };
        let tasks =
            vec![with_mem(task(1, &hold(200), 0), 50), with_mem(task(2, &hold(20), 0), 100), task(3, &hold(30), 0)];
        let (f, dir) = run_tasks(tasks, 3, "oom", Reaping::detect());
        assert_eq!(f[0].outcome, Outcome::OutOfMemory, "{:?}", f[0]);
        assert!((50..400).contains(&f[0].value), "resident MiB seen: {}", f[0].value);
        assert!(f[0].end_us - f[0].start_us < 1_900_000, "killed before its sleep ended");
        assert_eq!((f[1].outcome, f[1].value), (Outcome::Exited, 0));
        assert_eq!((f[2].outcome, f[2].value), (Outcome::Exited, 0));
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn outcomes_are_recorded() {
        outcomes(Reaping::detect(), "outcomes");
    }

    #[test]
    fn outcomes_are_recorded_without_pidfds() {
        outcomes(Reaping::ThreadChildren, "outcomes-fallback");
    }

    #[test]
    fn pidfds_are_used_where_the_kernel_has_them() {
        // Otherwise a sandbox that refuses them would leave every test above on the fallback.
        // SAFETY: uname fills a zeroed struct with NUL-terminated strings.
        let release = unsafe {
            let mut u: libc::utsname = std::mem::zeroed();
            assert_eq!(libc::uname(&mut u), 0);
            std::ffi::CStr::from_ptr(u.release.as_ptr()).to_string_lossy().into_owned()
        };
        let mut v = release.split(|c: char| !c.is_ascii_digit()).map(|n| n.parse::<u32>().unwrap_or(0));
        let (major, minor) = (v.next().unwrap_or(0), v.next().unwrap_or(0));
        if (major, minor) >= (5, 4) {
            pidfds_work().unwrap_or_else(|e| panic!("kernel {release}: no pidfds: {e}"));
        } else {
            assert!(pidfds_work().is_err(), "kernel {release} has pidfds after all");
        }
    }

    #[test]
    fn background_children_are_killed_with_the_task() {
        let marker = std::env::temp_dir().join(format!("htc-bg-{}", std::process::id()));
        let cmd = format!("(sleep 1; touch {}) & exit 0", marker.display());
        let (f, _) = run_tasks(vec![task(1, &cmd, 0)], 1, "bg", Reaping::detect());
        assert_eq!(f[0].outcome, Outcome::Exited);
        std::thread::sleep(Duration::from_millis(1500));
        assert!(!marker.exists(), "a straggler of the task outlived it");
    }

    /// Two executors at once in this process, each on its own tasks: quick ones, failures, one
    /// that leaves a background child, one that times out. Each must report exactly its own.
    fn two_at_once(reaping: [Reaping; 2], name: &str) {
        let mut runs = Vec::new();
        let mut markers = Vec::new();
        for (k, &mode) in reaping.iter().enumerate() {
            let base = 1000 * (k as u64 + 1);
            let marker = std::env::temp_dir().join(format!("htc-bg-{}-{name}-{k}", std::process::id()));
            let _ = fs::remove_file(&marker);
            let mut tasks: Vec<TaskToRun> = (0..200).map(|i| task(base + i, "true", 0)).collect();
            tasks.push(task(base + 200, &format!("(sleep 1; touch {}) & exit 0", marker.display()), 0));
            tasks.push(task(base + 201, "sleep 5", 300));
            tasks.push(task(base + 202, &format!("exit {}", k + 4), 0));
            tasks.extend((203..300).map(|i| task(base + i, "true", 0)));
            runs.push((base, launch(tasks, 2, &format!("{name}-{k}"), mode).0));
            markers.push(marker);
        }
        for (base, l) in runs {
            let f = collect(l);
            let ids: HashSet<u64> = f.iter().map(|f| f.id).collect();
            assert_eq!(f.len(), 300, "executor {base}: one result per task");
            assert_eq!(ids, (base..base + 300).collect(), "executor {base}: exactly its own tasks");
            let of = |i: u64| f.iter().find(|f| f.id == base + i).map(|f| (f.outcome, f.value)).unwrap();
            assert_eq!(of(200), (Outcome::Exited, 0));
            assert_eq!(of(201), (Outcome::TimedOut, libc::SIGTERM));
            assert_eq!(of(202), (Outcome::Exited, (base / 1000) as i32 + 3));
            assert!(f
                .iter()
                .filter(|f| ![base + 201, base + 202].contains(&f.id))
                .all(|f| f.outcome == Outcome::Exited && f.value == 0));
        }
        std::thread::sleep(Duration::from_millis(1500));
        for m in markers {
            assert!(!m.exists(), "a straggler of a task outlived it");
        }
    }

    #[test]
    fn two_executors_in_one_process_get_their_own_results() {
        two_at_once([Reaping::detect(), Reaping::detect()], "two");
    }

    #[test]
    fn the_fallback_shares_a_process_with_pidfds_and_with_itself() {
        two_at_once([Reaping::ThreadChildren, Reaping::detect()], "mixed");
        two_at_once([Reaping::ThreadChildren, Reaping::ThreadChildren], "fallbacks");
    }

    #[test]
    fn other_children_of_the_process_are_left_alone() {
        // What the process starts on its own must still be its to wait for.
        let mut child = std::process::Command::new("sh").args(["-c", "sleep 0.3; exit 7"]).spawn().unwrap();
        let (f, _) = run_tasks((1..=50).map(|i| task(i, "true", 0)).collect(), 2, "others", Reaping::detect());
        assert!(f.iter().all(|f| f.outcome == Outcome::Exited));
        assert_eq!(child.wait().unwrap().code(), Some(7));
    }
}
