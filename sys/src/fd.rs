//! Descriptors: close-on-exec flags, descriptors handed over by number (the workspace root's
//! lock, an inherited pipe end), and the size and state of pipes. [`dir`] walks a folder tree
//! from held descriptors.

#![expect(
    unsafe_code,
    reason = "fcntl(2), ioctl(2) and poll(2) on descriptors, and taking one over by number"
)]

use std::{io, os::fd::RawFd};

pub mod dir;

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

/// Takes ownership of the open descriptor `fd` handed over by number (an inherited pipe end, or
/// in thread mode one the supervisor gave up), marked close-on-exec so bodies do not inherit
/// it. `None` if `fd` is not open or is a standard stream.
pub fn adopt_fd(fd: std::os::fd::RawFd) -> Option<std::fs::File> {
    use std::os::fd::FromRawFd as _;
    if fd <= 2 {
        return None;
    }
    // SAFETY: fcntl(2) on a descriptor number; F_GETFD fails with EBADF if it is not open.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } == -1 {
        return None;
    }
    // SAFETY: the descriptor is open and was handed to this process to own; nothing else
    // in it uses the number (the supervisor forgot it in thread mode, see children.rs).
    Some(unsafe { std::fs::File::from_raw_fd(fd) })
}

/// Asks the kernel for a pipe buffer of `bytes` on the pipe `fd` (`F_SETPIPE_SZ`; at most
/// `/proc/sys/fs/pipe-max-size` unprivileged); the size it got. A payload of that size then
/// crosses in one write and one read instead of a wake-up per 64 KiB.
pub fn set_pipe_size(fd: RawFd, bytes: usize) -> io::Result<usize> {
    let bytes = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: fcntl(F_SETPIPE_SZ) changes the buffer size of a pipe; no memory is involved.
    let got = unsafe { libc::fcntl(fd, libc::F_SETPIPE_SZ, bytes) };
    usize::try_from(got).map_err(|_| io::Error::last_os_error())
}

/// The bytes waiting to be read in the pipe (or socket) `fd` (`FIONREAD`).
pub fn readable_bytes(fd: RawFd) -> io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: ioctl(FIONREAD) writes one int into `n`, which lives on this stack.
    if unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(usize::try_from(n).unwrap_or(0))
}

/// What `poll(2)` says, without waiting, about one end of a pipe (or a socket).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PipeState {
    /// There is something to read (`POLLIN`).
    pub readable: bool,
    /// A read end whose every writer is gone (`POLLHUP`): what is left is all there will be.
    pub hung_up: bool,
    /// A write end whose every reader is gone (`POLLERR`): a write would fail with `EPIPE`.
    pub broken: bool,
}

/// Polls `fd` once, without waiting (see [`PipeState`]).
pub fn pipe_state(fd: RawFd) -> io::Result<PipeState> {
    pipe_states([fd]).map(|[state]| state)
}

/// Polls every one of `fds` with one `poll(2)`, without waiting (see [`PipeState`]).
pub fn pipe_states<const N: usize>(fds: [RawFd; N]) -> io::Result<[PipeState; N]> {
    let mut pollfds = fds.map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    let count = libc::nfds_t::try_from(N).map_err(io::Error::other)?;
    // SAFETY: poll(2) reads and writes the `N` pollfds it is given, which live on this stack;
    // a zero timeout never waits.
    if unsafe { libc::poll(pollfds.as_mut_ptr(), count, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    if pollfds.iter().any(|p| p.revents & libc::POLLNVAL != 0) {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    Ok(pollfds.map(|p| PipeState {
        readable: p.revents & libc::POLLIN != 0,
        hung_up: p.revents & libc::POLLHUP != 0,
        broken: p.revents & libc::POLLERR != 0,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd as _;

    /// A pipe end tells, without waiting, whether something is unread, whether its writers
    /// are gone (read end) and whether its readers are gone (write end).
    #[test]
    fn pipe_state_tells_unread_bytes_and_closed_ends() {
        use std::io::Write as _;
        let (read, write) = std::io::pipe().unwrap();
        let (r, w) = (read.as_raw_fd(), write.as_raw_fd());
        assert_eq!(pipe_state(r).unwrap(), PipeState::default());
        assert_eq!(pipe_state(w).unwrap(), PipeState::default());
        (&write).write_all(b"x").unwrap();
        assert_eq!(
            pipe_state(r).unwrap(),
            PipeState {
                readable: true,
                ..PipeState::default()
            }
        );
        // The bytes a write end holds that no reader took are counted on that end too.
        assert_eq!(readable_bytes(w).unwrap(), 1);
        drop(read);
        assert!(pipe_state(w).unwrap().broken);
        let (read, write) = std::io::pipe().unwrap();
        drop(write);
        assert!(pipe_state(read.as_raw_fd()).unwrap().hung_up);
    }

    /// One poll tells each end's state, as a poll of each would.
    #[test]
    fn pipe_states_polls_several_ends_at_once() {
        use std::io::Write as _;
        let (quiet_read, quiet_write) = std::io::pipe().unwrap();
        let (read, write) = std::io::pipe().unwrap();
        (&write).write_all(b"x").unwrap();
        drop(write);
        let (lone_read, lone_write) = std::io::pipe().unwrap();
        drop(lone_read);
        let fds = [
            quiet_read.as_raw_fd(),
            read.as_raw_fd(),
            lone_write.as_raw_fd(),
            quiet_write.as_raw_fd(),
        ];
        let states = pipe_states(fds).unwrap();
        assert_eq!(states, fds.map(|fd| pipe_state(fd).unwrap()));
        assert_eq!(states[0], PipeState::default());
        assert_eq!(
            states[1],
            PipeState {
                readable: true,
                hung_up: true,
                broken: false
            }
        );
        assert!(states[2].broken);
        assert_eq!(states[3], PipeState::default());
        // No process has this many descriptors open, and no other test can open it meanwhile.
        let never_open = RawFd::MAX;
        assert_eq!(
            pipe_states([read.as_raw_fd(), never_open])
                .unwrap_err()
                .raw_os_error(),
            Some(libc::EBADF),
            "a descriptor that is not open, among them, fails the poll"
        );
    }
}
