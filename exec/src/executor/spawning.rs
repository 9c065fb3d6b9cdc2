//! Starting a task: its program resolved on PATH, its CPUs bound, its environment and output
//! descriptors made, the child cloned and watched; or its spawn failure reported.

use super::*;
use crate::spawn::{Child, IntoError};
use std::ffi::CStr;

/// What a spawn starts: the program, its argv and environment (NULL-terminated), and where its
/// stdout and stderr go.
pub(super) struct Program<'a> {
    prog: &'a CStr,
    argv: &'a [*const libc::c_char],
    envp: &'a [*const libc::c_char],
    out: RawFd,
    err: RawFd,
}

impl Executor {
    pub(super) fn resolve(&mut self, prog: &[u8]) -> Option<CString> {
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
    pub(super) fn bind(&mut self, slots: &[usize], near: Option<Vec<usize>>) {
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

    pub(super) fn spawn(&mut self, t: TaskToRun, slots: Vec<usize>, devices: Vec<crate::gpu::Device>) {
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
        let what = Program { prog: &prog, argv: &argv, envp: &envp, out: out_fd, err: err_fd };
        let (spawned, inside) = match oom_kills_before.and_then(|_| self.born_into(slot)) {
            Some(handle) => {
                match self.spawner.spawn_into(what.prog, what.argv, what.envp, what.out, what.err, handle) {
                    Ok(c) => (Ok(c), true),
                    Err(IntoError::Failed(errno)) => (Err(errno), true),
                    Err(IntoError::Refused(errno)) => {
                        self.refused_into(errno);
                        self.spawn_moved(slot, oom_kills_before, &what)
                    }
                }
            }
            None => self.spawn_moved(slot, oom_kills_before, &what),
        };
        let v1 = self.cfg.memcg.as_ref().is_some_and(|r| r.version() == crate::memcg::Version::V1);
        // Not born in its cgroup (v1): the watch enforces its mem= instead.
        let oom_kills_before = oom_kills_before.filter(|_| inside || !v1);
        drop(per_task);
        match spawned {
            Ok(crate::spawn::Child { pid, pidfd }) => {
                self.started(t, slots, start_us, pid, pidfd, (oom_kills_before, inside))
            }
            Err(errno) => {
                let name = String::from_utf8_lossy(prog.as_bytes()).into_owned();
                let msg = format!("htc: {name}: {}\n", io::Error::from_raw_os_error(errno));
                self.spawn_failed(t, slots, start_us, errno, msg)
            }
        }
    }

    /// Starts `what` without `CLONE_INTO_CGROUP`: where the task has a memory cgroup, v1 moves
    /// this thread in for the spawn, v2 has the task move itself in (`memcg::Wrapper`). With
    /// whether it was born inside.
    fn spawn_moved(
        &mut self,
        slot: usize,
        oom_kills_before: Option<u64>,
        what: &Program,
    ) -> (Result<Child, i32>, bool) {
        let wrapper = oom_kills_before.and(self.cgroup_wrapper(slot));
        let wrapped = wrapper.as_ref().map(|w| w.argv(what.argv));
        let (prog, argv) = match &wrapped {
            Some(argv) => (c"/bin/sh", &argv[..]),
            None => (what.prog, what.argv),
        };
        let v1 = self.cfg.memcg.as_ref().is_some_and(|r| r.version() == crate::memcg::Version::V1);
        let inside = v1 && oom_kills_before.is_some() && self.enter_cgroup(slot);
        let spawned = self.spawner.spawn(prog, argv, what.envp, what.out, what.err);
        if inside {
            self.leave_cgroup(slot);
        }
        (spawned, inside)
    }

    /// The program and argv of `t`: `/bin/sh -c` for a shell task, else its words with the
    /// program found on the PATH; why not, as an errno and a line for its stderr.
    pub(super) fn command_line(&mut self, t: &TaskToRun) -> Result<(CString, Vec<CString>), (i32, String)> {
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
    pub(super) fn task_env(&mut self, t: &TaskToRun, cores: usize, devices: &[crate::gpu::Device]) -> Vec<CString> {
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
    pub(super) fn output_fds(&mut self, t: &TaskToRun, slot: usize) -> Result<OutputFds, (i32, String)> {
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
            OutputMode::None => Ok((self.null.as_raw_fd(), self.null.as_raw_fd(), None)),
        }
    }

    /// A task's process is running: its deadline, its watch, its slots.
    pub(super) fn started(
        &mut self,
        t: TaskToRun,
        slots: Vec<usize>,
        start_us: u64,
        pid: libc::pid_t,
        pidfd: Option<OwnedFd>,
        (oom_kills_before, born_in_cgroup): (Option<u64>, bool),
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
            born_in_cgroup,
            kill_at: None,
            serial,
            pidfd,
        };
        self.running.insert(pid, r);
    }

    /// The task could not be started: the reason goes where its stderr would have gone, so
    /// `htc output` shows it, and it ends as a spawn failure with `errno`.
    pub(super) fn spawn_failed(&mut self, t: TaskToRun, slots: Vec<usize>, start_us: u64, errno: i32, msg: String) {
        let slot = slots[0];
        if self.cfg.output == OutputMode::Streams {
            // The reason goes where its stderr would have gone, for `htc output`.
            if let Ok(s) = self.streams(slot) {
                let (out_off, (err_off, kept)) = (s.out_end, s.append_err(msg.as_bytes()));
                self.write_index(&IndexEntry {
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
                });
            }
        }
        self.release(&t, &slots);
        self.events.push(ExecEvent::Finished(Finished {
            id: t.id,
            attempt: t.attempt,
            ended: Ended::new(Outcome::SpawnFailed, errno, start_us, now_us()),
        }));
    }

    /// Notes which devices the task got in the spawner's `devices` file (`htc log` shows them).
    pub(super) fn note_devices(&self, t: &TaskToRun, ids: &str) {
        let line = format!("{}\t{}\t{ids}\n", t.id, t.attempt);
        let path = self.cfg.out_dir.join(crate::output::devices_name(self.cfg.agent, self.cfg.spawner));
        let w = OpenOptions::new().append(true).create(true).custom_flags(libc::O_CLOEXEC).open(&path);
        if let Err(e) = w.and_then(|mut f| f.write_all(line.as_bytes())) {
            tracing::warn!(agent = self.cfg.agent, task = t.id, error = %e, "its devices are not recorded");
        }
    }
}
