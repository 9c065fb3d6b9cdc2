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

use crate::handoff::{Handoff, When};
use crate::output::{IndexEntry, OutputMode};
use htc_core::orders::{Orders, Todo};
use htc_core::record::{Ended, Outcome};
use htc_core::slots::{self, Deadlines, Due, Holder, Next, Queue, Room};
use htc_host::now_us;

pub use htc_core::work::{recall_from, Command, ExecEvent, Finished, TaskToRun};

mod memory;
mod output;
mod reaping;
mod spawning;
mod wait;

use wait::{pidfd_open, pidfds_work, sigchld_ignored, wait_info};

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
    /// This loop's results journal (`crate::results`): every start and end it reports is
    /// written there first. None: not kept (tests of the loop alone).
    pub results: Option<PathBuf>,
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

/// `index` for the first spawner, `index.N` for the others (`output::index_files` finds them).
fn index_name(spawner: usize) -> String {
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
    /// Started inside that cgroup (not moved in by itself afterwards): no RSS watch needed.
    born_in_cgroup: bool,
    /// Set when SIGTERM went out; SIGKILL follows at this instant.
    kill_at: Option<Instant>,
    serial: u64,
    /// None when the child is found by the fallback's scan instead.
    pidfd: Option<OwnedFd>,
}

struct Slot {
    /// Its stream files (streams mode), made when it first stores a task's output: a slot that
    /// never runs a task (most of the wide spawner's, in a run without wide tasks) leaves none.
    streams: Option<Streams>,
    /// The running task's stdout and stderr captures (streams mode): descriptors whose numbers
    /// stay, pointed at fresh files before each spawn.
    capture: Option<(crate::capture::Capture, crate::capture::Capture)>,
}

/// A slot's stream files: every task that ran in it appends its stdout and stderr to them.
struct Streams {
    out: File,
    err: File,
    /// Where the next task's output starts: only the executor appends to a slot's files.
    out_end: u64,
    err_end: u64,
}

impl Streams {
    fn open(dir: &std::path::Path, slot: usize) -> io::Result<Streams> {
        let open = |name: String| {
            OpenOptions::new().append(true).create(true).custom_flags(libc::O_CLOEXEC).open(dir.join(name))
        };
        let (out, err) = (open(format!("slot-{slot}.out"))?, open(format!("slot-{slot}.err"))?);
        let (out_end, err_end) = (end_of(out.as_raw_fd()), end_of(err.as_raw_fd()));
        Ok(Streams { out, err, out_end, err_end })
    }

    /// Appends `msg` to stderr: (where it starts, whether it was written).
    fn append_err(&mut self, msg: &[u8]) -> (u64, bool) {
        let at = self.err_end;
        let kept = (&self.err).write_all(msg).is_ok();
        if kept {
            self.err_end += msg.len() as u64;
        }
        (at, kept)
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
    /// The output index (streams mode), made with the first entry, as the slots' files are.
    index: Option<BufWriter<File>>,
    /// Starts and ends, journaled before they are reported (`cfg.results`).
    journal: Option<crate::results::Journal>,
    /// Tasks this loop stopped because it was told to drop everything: their ends are no
    /// results, so they are never journaled as such (they ran, and did not end: interrupted).
    aborted: std::collections::HashSet<(u64, u32)>,
    /// Where tasks' stdout and stderr go with no output kept.
    null: File,
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
    /// Tasks are started in their v2 memory cgroup (`clone3`), until the kernel refuses it.
    into_cgroup: bool,
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
        let mut slots = Vec::new();
        let scratch = crate::capture::Scratch::find();
        if cfg.output != OutputMode::None {
            fs::create_dir_all(&cfg.out_dir)?;
        }
        if let Some(dir) = cfg.results.as_ref().and_then(|p| p.parent()) {
            fs::create_dir_all(dir)?;
        }
        for _ in 0..cfg.slots {
            use crate::capture::Capture;
            let streams = cfg.output == OutputMode::Streams;
            let capture = if streams { Some((Capture::new(&scratch)?, Capture::new(&scratch)?)) } else { None };
            slots.push(Slot { streams: None, capture });
        }
        let null = OpenOptions::new().write(true).custom_flags(libc::O_CLOEXEC).open("/dev/null")?;
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
            index: None,
            journal: cfg.results.clone().map(crate::results::Journal::new),
            aborted: Default::default(),
            null,
            fault: None,
            space_checked: None,
            handoff: Handoff::default(),
            space_low: false,
            mem_checked: None,
            cgroups: Vec::new(),
            into_cgroup: true,
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
            if orders.may_start(now_us()) && !crate::stopping::requested() {
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
                        if let Err(e) = self.flush_index().and_then(|()| self.journal_events()) {
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
                // What was not handed off (the network side gone) is journaled all the same:
                // the next session learns from it what ended and what was interrupted.
                return self.flush_index().and(self.journal_events());
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
                        ended: Ended::new(Outcome::SpawnFailed, libc::E2BIG, now, now),
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

    fn abort_all(&mut self) {
        let now = Instant::now();
        for (&pid, r) in self.running.iter_mut() {
            self.aborted.insert((r.task.id, r.task.attempt));
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
            results: Some(dir.join("results")),
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
        assert_eq!((f[0].ended.outcome, f[0].ended.value), (Outcome::Exited, 0));
        assert_eq!((f[1].ended.outcome, f[1].ended.value), (Outcome::Exited, 3));
        assert_eq!((f[2].ended.outcome, f[2].ended.value), (Outcome::Signaled, libc::SIGSEGV));
        assert_eq!((f[3].ended.outcome, f[3].ended.value), (Outcome::TimedOut, libc::SIGTERM));
        assert_eq!((f[4].ended.outcome, f[4].ended.value), (Outcome::SpawnFailed, libc::ENOENT));
        assert_eq!((f[6].ended.outcome, f[6].ended.value), (Outcome::TimedOut, libc::SIGKILL));
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
        assert_eq!(f[0].ended.outcome, Outcome::OutOfMemory, "{:?}", f[0]);
        assert!((50..400).contains(&f[0].ended.value), "resident MiB seen: {}", f[0].ended.value);
        assert!(f[0].ended.end_us - f[0].ended.start_us < 1_900_000, "killed before its sleep ended");
        assert_eq!((f[1].ended.outcome, f[1].ended.value), (Outcome::Exited, 0));
        assert_eq!((f[2].ended.outcome, f[2].ended.value), (Outcome::Exited, 0));
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
        assert_eq!(f[0].ended.outcome, Outcome::Exited);
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
            let of = |i: u64| f.iter().find(|f| f.id == base + i).map(|f| (f.ended.outcome, f.ended.value)).unwrap();
            assert_eq!(of(200), (Outcome::Exited, 0));
            assert_eq!(of(201), (Outcome::TimedOut, libc::SIGTERM));
            assert_eq!(of(202), (Outcome::Exited, (base / 1000) as i32 + 3));
            assert!(f
                .iter()
                .filter(|f| ![base + 201, base + 202].contains(&f.id))
                .all(|f| f.ended.outcome == Outcome::Exited && f.ended.value == 0));
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
        assert!(f.iter().all(|f| f.ended.outcome == Outcome::Exited));
        assert_eq!(child.wait().unwrap().code(), Some(7));
    }
}
