//! Memory limits: a task's `mem=` enforced by a memory cgroup per slot where the agent has them,
//! else by watching its process group's resident memory.

use super::*;

impl Executor {
    /// Tasks past their `mem=` are killed, and end as out of memory; looked at every
    /// `memwatch::EVERY` while any such task runs. A task in a memory cgroup was stopped by the
    /// kernel (one process of it): the rest of its group goes. Others are watched: the resident
    /// memory of their whole process group.
    pub(super) fn enforce_memory(&mut self) {
        let now = Instant::now();
        if self.mem_checked.is_some_and(|t| now.duration_since(t) < crate::memwatch::EVERY) {
            return;
        }
        self.mem_checked = Some(now);
        let mut groups = Vec::new();
        let mut killed = Vec::new();
        let v1 = self.cfg.memcg.as_ref().is_some_and(|r| r.version() == crate::memcg::Version::V1);
        let limited: Vec<(libc::pid_t, usize, Option<u64>, bool)> = self
            .running
            .iter()
            .filter(|(_, r)| r.task.shape.mem_mb > 0 && r.oom_mb.is_none())
            .map(|(&pid, r)| (pid, r.slots[0], r.oom_kills_before, r.born_in_cgroup))
            .collect();
        for (pid, slot, before, born) in limited {
            match before {
                Some(before) => match self.cgroup_oom(slot, before) {
                    Some(mb) => killed.push((pid, mb)),
                    // v2 tasks moved themselves in, or tried to: the watch backs them up.
                    None if !v1 && !born => groups.push(pid),
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
    pub(super) fn limit_memory(&mut self, slot: usize, mem_mb: u32) -> Option<u64> {
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
    pub(super) fn enter_cgroup(&mut self, slot: usize) -> bool {
        let Some(cg) = self.cgroups.get(slot).and_then(Option::as_ref) else { return false };
        match cg.enter_thread() {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(job = %self.cfg.job_id, error = %e, "cannot spawn into the slot's memory cgroup");
                false
            }
        }
    }

    pub(super) fn leave_cgroup(&mut self, slot: usize) {
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

    /// v2: the descriptor of slot `slot`'s cgroup, for the task to be born in it, unless the
    /// kernel refused that before.
    pub(super) fn born_into(&self, slot: usize) -> Option<RawFd> {
        self.cfg.memcg.as_ref().filter(|r| r.version() == crate::memcg::Version::V2 && self.into_cgroup)?;
        self.cgroups.get(slot)?.as_ref()?.handle()
    }

    /// The kernel would not start a task in its cgroup (`errno`): the task is moved in instead,
    /// this time, and from now on where the refusal will stand.
    pub(super) fn refused_into(&mut self, errno: i32) {
        let lasting = !matches!(errno, libc::EAGAIN | libc::ENOMEM | libc::EMFILE | libc::ENFILE | libc::EINTR);
        if lasting && self.into_cgroup {
            self.into_cgroup = false;
            tracing::info!(job = %self.cfg.job_id, error = %io::Error::from_raw_os_error(errno), "tasks cannot be started in their memory cgroup here (clone3 with CLONE_INTO_CGROUP); each moves itself in");
        }
    }

    /// v2: the command that moves the task into slot `slot`'s cgroup before it runs.
    pub(super) fn cgroup_wrapper(&self, slot: usize) -> Option<crate::memcg::Wrapper> {
        self.cfg.memcg.as_ref().filter(|r| r.version() == crate::memcg::Version::V2)?;
        let cg = self.cgroups.get(slot)?.as_ref()?;
        crate::memcg::Wrapper::new(cg)
    }

    /// The peak MiB of slot `slot`'s cgroup if the kernel killed there for memory since its
    /// count was `before`.
    pub(super) fn cgroup_oom(&mut self, slot: usize, before: u64) -> Option<u64> {
        self.cgroups.get_mut(slot)?.as_mut()?.oom_since(before)
    }
}
