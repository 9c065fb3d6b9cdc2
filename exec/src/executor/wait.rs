//! The kernel's side of waiting for a child: `pidfd_open`, `waitid` (retried when a signal
//! interrupts it), whether pidfds work here, whether SIGCHLD is ignored (the kernel would then
//! discard exit statuses).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

pub(super) fn sigchld_ignored() -> bool {
    // SAFETY: reading the current action into a zeroed struct.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGCHLD, std::ptr::null(), &mut old) == 0
            && (old.sa_sigaction == libc::SIG_IGN || old.sa_flags & libc::SA_NOCLDWAIT != 0)
    }
}

pub(super) fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
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
pub(super) fn pidfds_work() -> io::Result<()> {
    let fd = pidfd_open(std::process::id() as libc::pid_t)?;
    // Not our child, so a kernel that knows P_PIDFD answers ECHILD; one that does not, EINVAL.
    match wait_info(libc::P_PIDFD, fd.as_raw_fd() as libc::id_t, libc::WEXITED | libc::WNOHANG) {
        Err(e) if e.raw_os_error() == Some(libc::ECHILD) => Ok(()),
        Err(e) => Err(e),
        Ok(_) => Err(io::Error::other("waitid(P_PIDFD) on this process succeeded")),
    }
}

/// `waitid`, retried when a signal handler interrupts it.
pub(super) fn wait_info(idtype: libc::idtype_t, id: libc::id_t, options: libc::c_int) -> io::Result<libc::siginfo_t> {
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
