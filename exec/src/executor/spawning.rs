//! Starting a task: its program resolved on PATH, its CPUs bound, its environment made, its
//! memory cgroup set up, and the child cloned; or why it could not start.

use std::collections::HashMap;
use std::ffi::{CStr, CString, OsStr};
use std::fs;
use std::io;
use std::os::fd::RawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use super::config::ExecConfig;
use super::memory::Memory;
use super::warm_calls::{Call, WarmCalls};
use crate::gpu::Device;
use crate::spawn::{Child, IntoError, Spawner};
use htc_core::work::TaskToRun;

/// What a spawn starts: the program, its argv and environment (NULL-terminated), and where its
/// stdout and stderr go.
pub(super) struct Program<'a> {
    prog: &'a CStr,
    argv: &'a [*const libc::c_char],
    envp: &'a [*const libc::c_char],
    out: RawFd,
    err: RawFd,
}

/// What runs a started task: its process, or (a function call's) the warm interpreter.
pub(super) enum Started {
    Process(Child),
    Call(Call),
}

/// A task's program and its words, found before anything else is made for it.
pub(super) type CommandLine = (CString, Vec<CString>);

/// How a loop starts its tasks' processes.
pub(super) struct Launcher {
    /// The tasks' base environment, without what is each task's own.
    env: Vec<CString>,
    path_dirs: Vec<Vec<u8>>,
    /// Programs found on the PATH.
    resolved: HashMap<Vec<u8>, Option<CString>>,
    binding: Binding,
    spawner: Spawner,
    pub(super) memory: Memory,
    job_id: String,
    agent: u32,
    /// The agent has GPUs: every task is told which (none, unless it asked).
    gpu_env: bool,
    warm: WarmCalls,
}

/// Where the spawning thread (and so its next child) may run.
struct Binding {
    /// CPU of each slot; empty: no binding.
    cpus: Vec<usize>,
    /// The mask set last, if any.
    bound: Option<Vec<usize>>,
    /// The CPUs the thread may use when it binds nothing.
    unbound: Vec<usize>,
}

impl Launcher {
    pub(super) fn new(cfg: &ExecConfig, pidfds: bool) -> io::Result<Launcher> {
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
        Ok(Launcher {
            env,
            path_dirs,
            resolved: HashMap::new(),
            binding: Binding { cpus: cfg.cpus.clone(), bound: None, unbound: allowed_cpus() },
            spawner: Spawner::new(pidfds)?,
            memory: Memory::new(cfg.memcg.clone(), cfg.slots, cfg.job_id.clone(), cfg.first_slot),
            job_id: cfg.job_id.clone(),
            agent: cfg.agent,
            gpu_env: !cfg.gpus.is_empty(),
            warm: WarmCalls::new(fs::File::open("/dev/null")?.into()),
        })
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
            let is_file = fs::metadata(OsStr::from_bytes(c.as_bytes())).map(|m| m.is_file()).unwrap_or(false);
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
        let Some(cpus) = self.cpus_for(slots, near) else { return };
        if self.binding.bound.as_deref() == Some(&cpus[..]) {
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
            tracing::warn!(agent = self.agent, error = %io::Error::last_os_error(), "CPU binding not possible here; tasks run unbound");
            self.binding.cpus.clear();
            self.binding.bound = None;
        } else {
            self.binding.bound = Some(cpus);
        }
    }

    /// The CPUs a task in `slots` runs on: `near` (the CPUs nearest its GPUs) when known, else
    /// its slots' where the loop binds; None: the thread's binding stays as it is.
    fn cpus_for(&self, slots: &[usize], near: Option<Vec<usize>>) -> Option<Vec<usize>> {
        match near {
            Some(c) => Some(c),
            None if !self.binding.cpus.is_empty() => {
                Some(slots.iter().map(|&s| self.binding.cpus[s % self.binding.cpus.len()]).collect())
            }
            // Not binding, but a GPU task was bound: back to the CPUs the thread started with.
            None if self.binding.bound.is_some() => Some(self.binding.unbound.clone()),
            None => None,
        }
    }

    /// Starts `t` in `slots` (first slot first) with `devices`, its stdout and stderr on
    /// `fds`: its child, or (`hand_over`, a function call that needs no process of its own)
    /// its warm interpreter's run of it; or why not (an errno and a line for its stderr).
    pub(super) fn spawn(
        &mut self,
        t: &TaskToRun,
        slots: &[usize],
        devices: &[Device],
        (prog, argv_owned): &CommandLine,
        (out, err): (RawFd, RawFd),
        hand_over: bool,
    ) -> Result<Started, (i32, String)> {
        let slot = slots[0];
        let extra = self.task_env(t, slots.len(), devices);
        let gpu_env = self.gpu_env;
        let env = self
            .env
            .iter()
            .filter(|e| !gpu_env || !crate::gpu::VISIBLE_VARS.iter().any(|v| crate::gpu::sets(e.as_bytes(), v)))
            .chain(extra.iter());
        if hand_over && t.shape.mem_mb == 0 && devices.is_empty() && !t.shell {
            let bytes: Vec<&[u8]> = env.clone().map(|e| e.as_bytes()).collect();
            let cpus = self.cpus_for(slots, None).unwrap_or_default();
            if let Some(call) = self.warm.hand_over(argv_owned, &bytes, &cpus, (out, err)) {
                return Ok(Started::Call(call));
            }
        }
        let mut argv: Vec<*const libc::c_char> = argv_owned.iter().map(|a| a.as_ptr()).collect();
        argv.push(std::ptr::null());
        let mut envp: Vec<*const libc::c_char> = Vec::with_capacity(self.env.len() + extra.len() + 1);
        envp.extend(env.map(|e| e.as_ptr()));
        envp.push(std::ptr::null());
        self.bind(slots, crate::gpu::nearest_cpus(devices));
        let prepared = self.memory.prepare(slot, t.shape.mem_mb);
        let what = Program { prog, argv: &argv, envp: &envp, out, err };
        let into = prepared.kills_before.and_then(|_| self.memory.born_into(slot));
        let (spawned, inside) = match into {
            Some(handle) => {
                match self.spawner.spawn_into(what.prog, what.argv, what.envp, what.out, what.err, handle) {
                    Ok(c) => (Ok(c), true),
                    Err(IntoError::Failed(errno)) => (Err(errno), true),
                    Err(IntoError::Refused(errno)) => {
                        self.memory.refused_into(errno);
                        self.spawn_moved(slot, prepared.kills_before, &what)
                    }
                }
            }
            None => self.spawn_moved(slot, prepared.kills_before, &what),
        };
        match spawned {
            Ok(child) => {
                self.memory.started(slot, child.pid, t.shape.mem_mb, &prepared, inside);
                Ok(Started::Process(child))
            }
            Err(errno) => {
                let name = String::from_utf8_lossy(prog.as_bytes()).into_owned();
                Err((errno, format!("htc: {name}: {}\n", io::Error::from_raw_os_error(errno))))
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
        let wrapper = oom_kills_before.and(self.memory.wrapper(slot));
        let wrapped = wrapper.as_ref().map(|w| w.argv(what.argv));
        let (prog, argv) = match &wrapped {
            Some(argv) => (c"/bin/sh", &argv[..]),
            None => (what.prog, what.argv),
        };
        let inside = oom_kills_before.is_some() && self.memory.enter(slot);
        let spawned = self.spawner.spawn(prog, argv, what.envp, what.out, what.err);
        if inside {
            self.memory.leave(slot);
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
    fn task_env(&self, t: &TaskToRun, cores: usize, devices: &[crate::gpu::Device]) -> Vec<CString> {
        let mut extra = vec![
            CString::new(format!("HTC_TASK_ID={}", t.id)).unwrap(),
            CString::new(format!("HTC_ATTEMPT={}", t.attempt)).unwrap(),
            CString::new(format!("HTC_CORES={cores}")).unwrap(),
            CString::new(format!("HTC_JOB_ID={}", self.job_id)).unwrap_or_default(),
            CString::new(format!("HTC_AGENT={}", self.agent)).unwrap(),
        ];
        if self.gpu_env {
            let ids = crate::gpu::visible(devices);
            for var in crate::gpu::VISIBLE_VARS {
                extra.push(CString::new(format!("{var}={ids}")).unwrap_or_default());
            }
        }
        extra
    }
}

/// Variables a task must not inherit from its agent: the per-task HTC_* set (added fresh),
/// the agent's own log filter, and the PMI channel of the agents' srun step (its fd is not the
/// task's, and an MPI program started as a task would try to use it).
fn is_private_var(k: &[u8]) -> bool {
    const RESERVED: &[&[u8]] = &[b"HTC_TASK_ID", b"HTC_JOB_ID", b"HTC_ATTEMPT", b"HTC_CORES", b"HTC_AGENT", b"HTC_LOG"];
    RESERVED.contains(&k) || k.starts_with(b"PMI_") || k.starts_with(b"PMIX_")
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
