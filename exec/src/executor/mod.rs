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

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::handoff::{Handoff, When};
use htc_core::record::Outcome;
use htc_core::spawn_loop::{Effect, Exit, SpawnLoop, Why};
use htc_host::steady_us;

pub use htc_core::work::{recall_from, Command, ExecEvent, Finished, TaskToRun};

mod config;
mod memory;
mod output;
mod reaping;
mod spawning;
mod wait;
mod warm_calls;

pub use config::{ExecConfig, LINGER};
pub use spawning::allowed_cpus;

use reaping::{Reaper, Reaping};
use spawning::{Launcher, Started};
use wait::sigchld_ignored;

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
        crate::spawn::block_signals_in_this_thread(reaping == Reaping::ThreadChildren);
        ex.run(rx, wake_r, sink)
    })?;
    Ok((Handle { tx, wake: Some(wake) }, join))
}

/// One spawn loop: its decisions (`SpawnLoop`) carried out with processes. Each part owns its
/// fields: the reaper the children, the launcher how they start, the store their output.
struct Executor {
    cfg: ExecConfig,
    decide: SpawnLoop,
    reaper: Reaper,
    launcher: Launcher,
    store: output::Store,
    /// What happened, not yet handed to the agent's main thread.
    events: Vec<ExecEvent>,
    /// When what happened goes to the agent's main thread.
    handoff: Handoff,
}

impl Executor {
    fn new(cfg: ExecConfig, reaping: Reaping) -> io::Result<Executor> {
        let grace_us = cfg.kill_grace.as_micros() as u64;
        Ok(Executor {
            decide: SpawnLoop::new(cfg.slots, cfg.gpus.len() as u32, grace_us),
            reaper: Reaper::new(reaping, cfg.slots.max(1), cfg.linger, cfg.agent)?,
            launcher: Launcher::new(&cfg, reaping == Reaping::Pidfd)?,
            store: output::Store::new(&cfg)?,
            events: Vec::new(),
            handoff: Handoff::default(),
            cfg,
        })
    }

    // Long (about 60 lines): one pass per wakeup over every source (commands, ended children,
    // deadlines, memory, stuck watches, the queue, the hand-off), in the order that keeps a slot from being
    // handed out twice; each source's work is a method, the order is kept here in one place.
    fn run(
        &mut self,
        rx: mpsc::Receiver<Command>,
        wake: OwnedFd,
        mut sink: impl FnMut(Vec<ExecEvent>),
    ) -> io::Result<()> {
        self.reaper.add_wake(&wake)?;
        let mut effects = Vec::new();
        let mut ended = Vec::new();
        loop {
            loop {
                match rx.try_recv() {
                    Ok(c) => self.decide.command(steady_us(), c, &mut effects),
                    Err(mpsc::TryRecvError::Empty) => break,
                    // The network side is gone: nobody will read results, so stop everything.
                    Err(mpsc::TryRecvError::Disconnected) => {
                        self.decide.abandoned(steady_us(), &mut effects);
                        break;
                    }
                }
            }
            self.apply(&mut effects);
            self.reaper.reap(&mut ended);
            for slot in self.reaper.take_refused() {
                self.relaunch(slot);
            }
            for (slot, exit) in ended.drain(..) {
                self.ended(slot, exit);
            }
            if let Some(e) = self.store.take_fault() {
                return Err(self.stop_on_fault(e));
            }
            self.decide.tick(steady_us(), &mut effects);
            self.apply(&mut effects);
            self.reaper.end_lingering(self.decide.aborted());
            self.enforce_memory();
            self.watch_stuck();
            if self.decide.reset_done() {
                self.events.push(ExecEvent::Reset);
            }
            if !crate::stopping::requested() {
                self.start_queued();
            }
            self.reaper.close_reaped();
            let hand_off_at = match self.hand_off(&mut sink) {
                Ok(at) => at,
                Err(e) => return Err(self.stop_on_fault(e)),
            };
            if self.decide.is_done() {
                self.reaper.end_lingering(true);
                // What was not handed off (the network side gone) is journaled all the same:
                // the next session learns from it what ended and what was interrupted.
                return self.store.flush_index().and(self.journal());
            }
            let now = steady_us();
            let mut timeout = Duration::from_millis(100);
            for t in [self.decide.next_deadline(), self.decide.next_look()].into_iter().flatten() {
                timeout = timeout.min(Duration::from_micros(t.saturating_sub(now)));
            }
            if let Some(t) = hand_off_at {
                timeout = timeout.min(t.saturating_duration_since(Instant::now()));
            }
            self.reaper.wait(self.reaper.wait_at_most(timeout), &wake);
        }
    }

    /// Hands what happened to the agent, now or (under load, in batches) when the returned
    /// time comes; storage is checked and the journal written first.
    fn hand_off(&mut self, sink: &mut impl FnMut(Vec<ExecEvent>)) -> io::Result<Option<Instant>> {
        if self.events.is_empty() {
            return Ok(None);
        }
        let urgent = self.decide.waited_for() || self.events.iter().any(needs_answer);
        let now = Instant::now();
        match self.handoff.when(now, urgent) {
            When::Now => {
                if let Some(e) = self.store.space_fault() {
                    return Err(e);
                }
                self.store.flush_index()?;
                self.journal()?;
                sink(std::mem::take(&mut self.events));
                self.handoff.handed(now);
                Ok(None)
            }
            When::At(t) => Ok(Some(t)),
        }
    }

    fn journal(&mut self) -> io::Result<()> {
        let decide = &self.decide;
        self.store.journal(&self.events, |id, attempt| decide.is_result(id, attempt))
    }

    /// Carries out the loop's effects (and those they cause), in order; false when a task
    /// given to start found its devices gone (it went back to the queue).
    fn apply(&mut self, effects: &mut Vec<Effect>) -> bool {
        let mut all_started = true;
        let mut i = 0;
        while i < effects.len() {
            match std::mem::replace(&mut effects[i], Effect::Report(ExecEvent::Reset)) {
                Effect::Start(slot) => all_started &= self.launch(slot, effects),
                Effect::Stop(slot, why) => {
                    if why == Why::Preempted {
                        let task = self.decide.run(slot).map(|r| r.task.id);
                        tracing::info!(job = %self.cfg.job_id, task, "preempted");
                    }
                    self.reaper.signal(slot, libc::SIGTERM);
                }
                Effect::Kill(slot) => self.reaper.signal(slot, libc::SIGKILL),
                Effect::Report(e) => self.events.push(e),
            }
            i += 1;
        }
        effects.clear();
        all_started
    }

    /// Starts what the loop lets start. Memory and GPUs are the leader's to commit
    /// (`htc_core::backfill`): it never sends more than the agent has, and releases them only
    /// once the result is back. The devices are shared by the agent's loops, so a start that
    /// takes some is carried out before the next is decided; if another loop took them first,
    /// nothing more starts now.
    fn start_queued(&mut self) {
        let mut effects = Vec::new();
        loop {
            let free_gpus = if self.cfg.gpus.is_empty() { 0 } else { self.cfg.gpus.free() as u32 };
            let more = self.decide.start(steady_us(), Some(free_gpus), &mut effects);
            if !self.apply(&mut effects) || !more {
                return;
            }
        }
    }

    /// Starts the task the loop holds in `slot`; false when its devices were gone (it went
    /// back to the queue).
    fn launch(&mut self, slot: usize, effects: &mut Vec<Effect>) -> bool {
        // The parts borrowed one by one: the task stays where the loop holds it, uncopied.
        let Executor { decide, launcher, store, cfg, reaper, events, .. } = self;
        let r = decide.run(slot).expect("a task held for its start");
        let t = &r.task;
        let devices = match t.shape.gpus {
            0 => Vec::new(),
            n => match cfg.gpus.take(t.id, n as usize) {
                Some(d) => d,
                None => {
                    decide.put_back(slot);
                    return false;
                }
            },
        };
        if !devices.is_empty() {
            store.note_devices(t, &crate::gpu::visible(&devices));
        }
        let spawned = launcher.command_line(t).and_then(|cmd| {
            let (out, err, per_task) = store.fds(t, slot)?;
            let child = launcher.spawn(t, &r.slots, &devices, &cmd, (out, err), true);
            drop(per_task);
            child
        });
        match spawned {
            Ok(Started::Process(child)) => {
                reaper.watch(slot, child);
                decide.started(slot, steady_us(), effects);
            }
            Ok(Started::Call(call)) => {
                reaper.watch_call(slot, call);
                decide.started(slot, steady_us(), effects);
            }
            Err((errno, msg)) => {
                store.spawn_failed(t, slot, r.start_us, &msg);
                if t.shape.gpus > 0 {
                    cfg.gpus.give_back(t.id);
                }
                if let Some((_, f)) = decide.spawn_failed(slot, steady_us(), errno) {
                    events.push(ExecEvent::Finished(f));
                }
            }
        }
        true
    }

    /// The call of the task in `slot` was handed to its warm interpreter, which could not run
    /// it (nothing of it ran): its shim is spawned instead, in the same slot, which runs it
    /// warm or cold. Not a GPU task, which is never handed over.
    fn relaunch(&mut self, slot: usize) {
        let Executor { decide, launcher, store, reaper, cfg, .. } = self;
        let Some(r) = decide.run(slot) else { return };
        let t = &r.task;
        let spawned = launcher.command_line(t).and_then(|cmd| {
            let (out, err, per_task) = store.fds(t, slot)?;
            let started = launcher.spawn(t, &r.slots, &[], &cmd, (out, err), false);
            drop(per_task);
            started
        });
        match spawned {
            Ok(Started::Process(child)) => reaper.watch(slot, child),
            Ok(Started::Call(_)) => unreachable!("a spawn that may not hand over"),
            Err((errno, msg)) => {
                tracing::warn!(agent = cfg.agent, task = t.id, errno, "{}", msg.trim_end());
                self.ended(slot, Exit::Exited(127));
            }
        }
    }

    /// The task in `slot` ended: its output stored, its devices back, its end reported unless
    /// the disk is full (then it is the loop's fault, not the task's).
    fn ended(&mut self, slot: usize, exit: Exit) {
        let oom_mb = self.launcher.memory.ended(slot);
        if let Exit::Lost(errno) = exit {
            let task = self.decide.run(slot).map(|r| r.task.id);
            let error = io::Error::from_raw_os_error(errno);
            tracing::warn!(agent = self.cfg.agent, task, error = %error, "exit status lost: the task was reaped by someone else");
        }
        let Some((r, f)) = self.decide.exited(slot, steady_us(), exit, oom_mb) else { return };
        self.store.store(&r);
        if r.task.shape.gpus > 0 {
            self.cfg.gpus.give_back(r.task.id);
        }
        let failed = f.ended.outcome != Outcome::Exited || f.ended.value != 0;
        if failed && self.store.blame_full_disk() {
            return;
        }
        self.events.push(ExecEvent::Finished(f));
    }

    /// Tasks past their `mem=` are killed, and end as out of memory.
    fn enforce_memory(&mut self) {
        let mut effects = Vec::new();
        for (slot, mb) in self.launcher.memory.over() {
            let before = effects.len();
            self.decide.out_of_memory(slot, mb, &mut effects);
            if let Some(r) = self.decide.run(slot).filter(|_| effects.len() > before) {
                tracing::warn!(job = %self.cfg.job_id, task = r.task.id, rss_mb = mb, mem_mb = r.task.shape.mem_mb, "out of memory: killed");
            }
        }
        self.apply(&mut effects);
    }

    /// Tasks with a stuck watch due a look have their counters read; one idle for its `stuck=`
    /// is stopped, and ends stuck.
    fn watch_stuck(&mut self) {
        let now = steady_us();
        let mut due = Vec::new();
        self.decide.looks_due(now, &mut due);
        if due.is_empty() {
            return;
        }
        let mut effects = Vec::new();
        for slot in due {
            let seen = self.reaper.pid_of(slot).and_then(crate::activity::tree_sample);
            let before = effects.len();
            self.decide.looked(now, slot, seen, &mut effects);
            if let Some(r) = self.decide.run(slot).filter(|_| effects.len() > before) {
                tracing::warn!(job = %self.cfg.job_id, task = r.task.id, stuck_s = r.task.shape.stuck_s, "stuck: almost no CPU and no I/O for its stuck=, stopped");
            }
        }
        self.apply(&mut effects);
    }

    /// Output storage failed: every task stops, and the loop with it, reporting only what was
    /// recorded whole.
    fn stop_on_fault(&mut self, e: io::Error) -> io::Error {
        let mut effects = Vec::new();
        self.decide.abandoned(steady_us(), &mut effects);
        self.apply(&mut effects);
        let e = self.store.fail(&self.events, e);
        self.events.clear();
        e
    }
}

/// Events the agent waits on, so they are handed off at once: recalls answer the leader,
/// a reset ends a rejoin.
fn needs_answer(e: &ExecEvent) -> bool {
    matches!(e, ExecEvent::Recalled { .. } | ExecEvent::Reset)
}

#[cfg(test)]
mod tests {
    use super::wait::pidfds_work;
    use super::*;
    use crate::output::OutputMode;
    use std::collections::HashSet;
    use std::fs;
    use std::path::PathBuf;

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
    fn a_task_that_sits_idle_for_its_stuck_is_stopped_and_a_busy_or_writing_one_is_not() {
        let stuck = |mut t: TaskToRun| {
            t.shape.stuck_s = 1;
            t
        };
        let tasks = vec![
            stuck(task(1, "sleep 20; true", 0)),
            stuck(task(2, "(while :; do :; done); true", 2500)),
            stuck(task(3, "for i in $(seq 25); do head -c 8192 /dev/zero; sleep 0.1; done > /dev/null", 0)),
            task(4, "sleep 2.5", 0),
        ];
        let (f, dir) = run_tasks(tasks, 4, "stuck", Reaping::detect());
        assert_eq!((f[0].ended.outcome, f[0].ended.value), (Outcome::Stuck, 1), "{:?}", f[0]);
        let took = f[0].ended.end_us - f[0].ended.start_us;
        assert!((1_000_000..2_900_000).contains(&took), "stopped after a second or two idle: {took} us");
        assert_eq!(f[1].ended.outcome, Outcome::TimedOut, "busy until its timeout: {:?}", f[1]);
        assert_eq!((f[2].ended.outcome, f[2].ended.value), (Outcome::Exited, 0), "I/O is not idle");
        assert_eq!((f[3].ended.outcome, f[3].ended.value), (Outcome::Exited, 0), "no watch, no stop");
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
