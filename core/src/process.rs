//! The only libc calls of perago: process groups, the parent-death signal, signals to a
//! group and the descriptors a child inherits (the workspace root's lock). Every child perago starts (broker, executors, bodies, guardrails) leads its own
//! process group, so a terminal's Ctrl-C or a service manager's SIGTERM reaches only the
//! supervisor, and a whole child tree can be signalled at once.
//!
//! Pitfall: `PR_SET_PDEATHSIG` fires when the *thread* that spawned the child exits, not the
//! process. Children must therefore be spawned from a long-lived thread (a current-thread
//! runtime's main thread, or a runtime worker), never from `spawn_blocking`, whose idle threads
//! are reaped after a few seconds and would take the child with them.

#![expect(
    unsafe_code,
    reason = "pre_exec, fcntl(2), close_range(2) and kill(2) on a process group need libc"
)]

use std::{io, os::fd::RawFd};

/// Makes the child the leader of its own process group and has the kernel send it
/// `death_signal` if its parent dies first (SIGKILL for bodies; SIGTERM for the broker and
/// executors, so an orphaned runtime drains instead of polling on).
pub fn isolate(cmd: &mut tokio::process::Command, death_signal: i32) {
    cmd.process_group(0);
    // SAFETY: the closure runs in the forked child before exec and only calls prctl(2) and
    // getppid(2), both async-signal-safe; it allocates nothing and touches no locks.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, death_signal, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl: then nobody would kill us.
            if libc::getppid() == 1 {
                return Err(io::Error::other(
                    "the parent exited while starting the child",
                ));
            }
            Ok(())
        });
    }
}

/// The variable that tells a runtime child (broker, executor) which file descriptor holds the
/// workspace root's lock. The supervisor leaves that descriptor open across `exec`, so the
/// `flock` stays held until the last process of the runtime has exited (see `docs/supervisor.md`,
/// "Workspace root lock").
pub const ROOT_LOCK_FD: &str = "PERAGO_ROOT_LOCK_FD";

/// Has the child inherit `fd` (the workspace root's lock) across `exec`: the descriptor is
/// opened close-on-exec, and the flag is cleared in the forked child only, so no other child of
/// this process inherits it.
pub fn inherit_fd(cmd: &mut tokio::process::Command, fd: RawFd) {
    // SAFETY: runs in the forked child before exec and only calls fcntl(2), which is
    // async-signal-safe; it allocates nothing and touches no locks.
    unsafe {
        cmd.pre_exec(move || {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Whether `fd` is close-on-exec; `None` if it is not an open descriptor.
pub fn is_cloexec(fd: RawFd) -> Option<bool> {
    // SAFETY: fcntl(F_GETFD) reads the descriptor flags; no memory is involved.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    (flags >= 0).then_some(flags & libc::FD_CLOEXEC != 0)
}

/// Sets or clears close-on-exec on `fd`.
pub fn set_cloexec(fd: RawFd, on: bool) -> io::Result<()> {
    // SAFETY: fcntl(F_GETFD/F_SETFD) changes descriptor flags only; no memory is involved.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFD);
        if flags < 0 {
            return Err(io::Error::last_os_error());
        }
        let flags = if on {
            flags | libc::FD_CLOEXEC
        } else {
            flags & !libc::FD_CLOEXEC
        };
        if libc::fcntl(fd, libc::F_SETFD, flags) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Called first thing by a runtime child with the value of [`ROOT_LOCK_FD`]: keeps the
/// inherited lock descriptor open for this process's life (that is what holds the root's lock)
/// but marks it close-on-exec, so a body — which might daemonize and live on — never holds
/// the lock. Returns the descriptor, or `None` when there is none (thread mode, tests).
pub fn adopt_root_lock(value: Option<&str>) -> Option<RawFd> {
    let fd: RawFd = value?.trim().parse().ok().filter(|fd| *fd > 2)?;
    set_cloexec(fd, true).ok()?;
    Some(fd)
}

/// Marks every descriptor above stderr close-on-exec in the child, so a body inherits only
/// its stdin, stdout and stderr (never the root lock or a socket of the runtime), whatever the
/// executor left open. Uses `close_range(CLOSE_RANGE_CLOEXEC)` (Linux 5.11); on older kernels
/// the executor's own close-on-exec flags are the only guard.
pub fn inherit_only_stdio(cmd: &mut tokio::process::Command) {
    // SAFETY: runs in the forked child before exec and only makes the close_range(2) system
    // call, which is async-signal-safe. Marking (not closing) keeps std's exec-error pipe,
    // already close-on-exec, working.
    unsafe {
        cmd.pre_exec(|| {
            let _ = libc::syscall(
                libc::SYS_close_range,
                3 as libc::c_uint,
                libc::c_uint::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            );
            Ok(())
        });
    }
}

/// Sends `signal` to every process of the group led by `pgid`. A group that is already gone
/// is not an error.
pub fn signal_group(pgid: u32, signal: i32) -> io::Result<()> {
    let Ok(pgid) = i32::try_from(pgid) else {
        return Err(io::Error::other("process group id out of range"));
    };
    if pgid <= 1 {
        // kill(0) or kill(-1) would hit our own group or every process we may signal.
        return Err(io::Error::other("refusing to signal process group 0 or 1"));
    }
    // SAFETY: kill(2) with a negative pid signals a process group; no memory is involved.
    let rc = unsafe { libc::kill(-pgid, signal) };
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::ESRCH) {
        Ok(())
    } else {
        Err(err)
    }
}

/// SIGTERM.
pub const SIGTERM: i32 = libc::SIGTERM;
/// SIGKILL.
pub const SIGKILL: i32 = libc::SIGKILL;

/// The name of a signal number, for reasons and logs.
pub fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGUSR2 => "SIGUSR2",
        _ => "signal",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd as _;

    async fn child_sees(fd: RawFd, setup: impl FnOnce(&mut tokio::process::Command)) -> bool {
        let mut cmd = tokio::process::Command::new("sh");
        cmd.args(["-c", &format!("test -e /proc/self/fd/{fd}")]);
        setup(&mut cmd);
        cmd.status().await.unwrap().success()
    }

    #[tokio::test]
    async fn only_the_child_given_the_lock_inherits_it() {
        let file = tempfile::tempfile().unwrap();
        let fd = file.as_raw_fd();
        assert_eq!(is_cloexec(fd), Some(true), "std opens files close-on-exec");
        assert!(!child_sees(fd, |_| {}).await);
        assert!(child_sees(fd, |cmd| inherit_fd(cmd, fd)).await);
        // Cleared in the forked child only: the parent's descriptor is still close-on-exec.
        assert_eq!(is_cloexec(fd), Some(true));
    }

    #[tokio::test]
    async fn a_runtime_child_keeps_the_lock_from_its_bodies() {
        let file = tempfile::tempfile().unwrap();
        let fd = file.as_raw_fd();
        // As an executor finds it after exec: inheritable.
        set_cloexec(fd, false).unwrap();
        // A body started with only stdio never sees it, whatever its flag.
        assert!(!child_sees(fd, inherit_only_stdio).await);
        assert_eq!(adopt_root_lock(Some(&fd.to_string())), Some(fd));
        assert_eq!(is_cloexec(fd), Some(true));
        assert!(!child_sees(fd, |_| {}).await);
        assert_eq!(adopt_root_lock(None), None);
        assert_eq!(adopt_root_lock(Some("1")), None, "never stdio");
        assert_eq!(adopt_root_lock(Some("x")), None);
        assert_eq!(adopt_root_lock(Some("999999")), None, "not open");
    }
}
