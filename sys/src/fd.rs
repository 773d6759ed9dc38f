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
    let mut pollfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll(2) reads and writes the one pollfd it is given, which lives on this stack;
    // a zero timeout never waits.
    if unsafe { libc::poll(&mut pollfd, 1, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    if pollfd.revents & libc::POLLNVAL != 0 {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    Ok(PipeState {
        readable: pollfd.revents & libc::POLLIN != 0,
        hung_up: pollfd.revents & libc::POLLHUP != 0,
        broken: pollfd.revents & libc::POLLERR != 0,
    })
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
}
