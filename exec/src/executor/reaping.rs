//! A task's end: its exit seen through its pidfd (or, without one, `waitid(P_ALL, __WNOTHREAD)`),
//! its group killed and its zombie released (at once, or after `ExecConfig::linger`), its slots
//! freed and its end reported.

use super::*;

impl Executor {
    /// The pidfd of `pid` (the one its clone gave, else a new one) in the epoll set, or None if
    /// the fallback's scan must find it.
    pub(super) fn watch(&mut self, pid: libc::pid_t, pidfd: Option<OwnedFd>) -> Option<OwnedFd> {
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
    pub(super) fn reap_ready(&mut self) {
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
    pub(super) fn reap_unwatched(&mut self) {
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
    pub(super) fn finish(&mut self, pid: libc::pid_t, lost: Option<io::Error>) {
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
            ended: Ended::new(outcome, value, r.start_us, end_us),
        }));
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
}
