//! Memory limits: a task's `mem=` enforced by a memory cgroup per slot where the agent has them,
//! else by watching its process group's resident memory.

use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Instant;

use crate::memcg::{self, Version};

/// The memory cgroups of a loop's slots, and how its running tasks' `mem=` is enforced.
pub(super) struct Memory {
    /// Where slots get memory cgroups; None: the RSS watch enforces every `mem=`.
    root: Option<Arc<memcg::Root>>,
    /// Each slot's memory cgroup, made when it first runs a task with `mem=`.
    cgroups: Vec<Option<memcg::Slot>>,
    /// Each running limited task, by first slot: how its limit is enforced.
    limits: Vec<Option<Limit>>,
    /// Tasks are started in their v2 memory cgroup (`clone3`), until the kernel refuses it.
    into_cgroup: bool,
    /// When running tasks' memory was last looked at.
    checked: Option<Instant>,
    job_id: String,
    first_slot: usize,
}

/// How one running task's `mem=` is held.
#[derive(Debug, Clone, Copy)]
struct Limit {
    pid: libc::pid_t,
    mem_mb: u32,
    /// In its slot's memory cgroup: the cgroup's count of OOM kills when the task started.
    kills_before: Option<u64>,
    /// Started inside that cgroup (not moved in by itself afterwards): no RSS watch needed.
    born_inside: bool,
}

/// What the spawn needs to know of the task's memory cgroup.
pub(super) struct Prepared {
    /// The cgroup's count of OOM kills so far; None: the task is watched instead.
    pub kills_before: Option<u64>,
}

impl Memory {
    pub(super) fn new(root: Option<Arc<memcg::Root>>, slots: usize, job_id: String, first_slot: usize) -> Memory {
        Memory {
            root,
            cgroups: Vec::new(),
            limits: vec![None; slots],
            into_cgroup: true,
            checked: None,
            job_id,
            first_slot,
        }
    }

    fn v1(&self) -> bool {
        self.root.as_ref().is_some_and(|r| r.version() == Version::V1)
    }

    /// Sets slot `slot`'s memory cgroup up for a task of `mem_mb` (none: 0).
    pub(super) fn prepare(&mut self, slot: usize, mem_mb: u32) -> Prepared {
        let Some(root) = self.root.as_ref().filter(|_| mem_mb > 0) else { return Prepared { kills_before: None } };
        if self.cgroups.len() <= slot {
            self.cgroups.resize_with(slot + 1, || None);
        }
        let n = self.first_slot + slot;
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
            Ok(before) => Prepared { kills_before: Some(before) },
            Err(e) => {
                tracing::warn!(job = %self.job_id, slot = n, error = %e, "memory cgroup unusable: this task's mem= is watched instead");
                Prepared { kills_before: None }
            }
        }
    }

    /// The task of `mem_mb` started in `slot` as `pid`, `born_inside` its cgroup or not.
    pub(super) fn started(&mut self, slot: usize, pid: libc::pid_t, mem_mb: u32, p: &Prepared, born_inside: bool) {
        // Not born in its cgroup (v1): the watch enforces its mem= instead.
        let kills_before = p.kills_before.filter(|_| born_inside || !self.v1());
        self.limits[slot] = (mem_mb > 0).then_some(Limit { pid, mem_mb, kills_before, born_inside });
    }

    /// The task in `slot` ended: the MiB its cgroup peaked at if the kernel killed it for memory.
    /// Read even when the watch killed it, so the next task in the slot starts from the count.
    pub(super) fn ended(&mut self, slot: usize) -> Option<u64> {
        let before = self.limits[slot].take()?.kills_before?;
        self.cgroups.get_mut(slot)?.as_mut()?.oom_since(before)
    }

    /// Tasks past their `mem=`, by first slot, with the MiB seen; looked at every
    /// `memwatch::EVERY` while any such task runs. A task in a memory cgroup was stopped by the
    /// kernel (one process of it): the rest of its group is to go. Others are watched: the
    /// resident memory of their whole process group.
    pub(super) fn over(&mut self) -> Vec<(usize, u64)> {
        let now = Instant::now();
        if self.checked.is_some_and(|t| now.duration_since(t) < crate::memwatch::EVERY) {
            return Vec::new();
        }
        self.checked = Some(now);
        let v1 = self.v1();
        let mut watched = Vec::new();
        let mut killed = Vec::new();
        for slot in 0..self.limits.len() {
            let Some(l) = self.limits[slot] else { continue };
            match l.kills_before {
                Some(before) => {
                    match self.cgroups.get_mut(slot).and_then(Option::as_mut).and_then(|c| c.oom_since(before)) {
                        Some(mb) => killed.push((slot, mb)),
                        // v2 tasks moved themselves in, or tried to: the watch backs them up.
                        None if !v1 && !l.born_inside => watched.push((slot, l)),
                        None => {}
                    }
                }
                None => watched.push((slot, l)),
            }
        }
        if !watched.is_empty() {
            let pids: Vec<libc::pid_t> = watched.iter().map(|(_, l)| l.pid).collect();
            for (pid, mb) in crate::memwatch::group_rss_mb(&pids) {
                if let Some((slot, _)) = watched.iter().find(|(_, l)| l.pid == pid && mb > l.mem_mb as u64) {
                    killed.push((*slot, mb));
                }
            }
        }
        killed
    }

    /// v1: moves this thread into slot `slot`'s memory cgroup, so the task it spawns next is
    /// born there; true if it did (then `leave` after the spawn).
    pub(super) fn enter(&mut self, slot: usize) -> bool {
        if !self.v1() {
            return false;
        }
        let Some(cg) = self.cgroups.get(slot).and_then(Option::as_ref) else { return false };
        match cg.enter_thread() {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(job = %self.job_id, error = %e, "cannot spawn into the slot's memory cgroup");
                false
            }
        }
    }

    pub(super) fn leave(&mut self, slot: usize) {
        let Some(root) = self.root.as_ref() else { return };
        if let Err(e) = root.leave_thread() {
            // Tasks spawned from here on are born in this slot's cgroup: it must not limit
            // them, and its count of kills must not be read as theirs.
            tracing::error!(job = %self.job_id, error = %e, "the spawn loop cannot leave a task's memory cgroup; memory cgroups are off for it, their mem= is watched");
            if let Some(Err(e)) = self.cgroups.get_mut(slot).and_then(Option::as_mut).map(|cg| cg.unlimit()) {
                tracing::error!(job = %self.job_id, error = %e, "and its limit could not be lifted");
            }
            self.root = None;
        }
    }

    /// v2: the descriptor of slot `slot`'s cgroup, for the task to be born in it, unless the
    /// kernel refused that before.
    pub(super) fn born_into(&self, slot: usize) -> Option<RawFd> {
        self.root.as_ref().filter(|r| r.version() == Version::V2 && self.into_cgroup)?;
        self.cgroups.get(slot)?.as_ref()?.handle()
    }

    /// The kernel would not start a task in its cgroup (`errno`): the task is moved in instead,
    /// this time, and from now on where the refusal will stand.
    pub(super) fn refused_into(&mut self, errno: i32) {
        let lasting = !matches!(errno, libc::EAGAIN | libc::ENOMEM | libc::EMFILE | libc::ENFILE | libc::EINTR);
        if lasting && self.into_cgroup {
            self.into_cgroup = false;
            tracing::info!(job = %self.job_id, error = %io::Error::from_raw_os_error(errno), "tasks cannot be started in their memory cgroup here (clone3 with CLONE_INTO_CGROUP); each moves itself in");
        }
    }

    /// v2: the command that moves the task into slot `slot`'s cgroup before it runs.
    pub(super) fn wrapper(&self, slot: usize) -> Option<memcg::Wrapper> {
        self.root.as_ref().filter(|r| r.version() == Version::V2)?;
        let cg = self.cgroups.get(slot)?.as_ref()?;
        memcg::Wrapper::new(cg)
    }
}
