//! Steps run before `exec` in a child forked by `tokio::process::Command` (the broker and the
//! executors; bodies start through [`Spawn`](super::Spawn)). Each closure runs in the forked
//! child, which has one thread and a copy of the parent's memory whose locks may be held by
//! threads that no longer exist there: it may only make async-signal-safe calls, and
//! allocates nothing.

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

/// Marks every descriptor above stderr close-on-exec in the child, so it inherits only its
/// stdin, stdout and stderr (never the root lock or a socket of the runtime), whatever the
/// parent left open. Uses `close_range(CLOSE_RANGE_CLOEXEC)` (Linux 5.11); on older kernels
/// the parent's own close-on-exec flags are the only guard. Bodies get the same step from
/// [`Spawn`](super::Spawn), in its child; the supervisor's launcher registers this one first
/// for the broker and executors, then [`inherit_fd`] for each descriptor it passes (pre-exec
/// steps run in the order they were registered).
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fd::{adopt_root_lock, is_cloexec, set_cloexec};
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
