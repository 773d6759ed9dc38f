//! A handle on one process that a later process with the same pid can never be mistaken for
//! (a pidfd, Linux 5.3+): taken while the process is known to be the right one, it signals
//! that process or nothing. The broker takes one for each attached executor (it is not their
//! parent, so it cannot rely on the zombie keeping the pid) and kills a stalled one through it.

use std::{
    io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
};

/// A pidfd of one process.
#[derive(Debug)]
pub struct ProcessHandle {
    fd: OwnedFd,
    pid: u32,
}

impl ProcessHandle {
    /// Opens a handle on `pid`. Refuses this process itself (a thread-mode executor runs in
    /// it) and pids 0 and 1.
    pub fn open(pid: u32) -> io::Result<Self> {
        if pid <= 1 || pid == std::process::id() {
            return Err(io::Error::other(format!(
                "refusing a process handle on pid {pid} (this process, or 0/1)"
            )));
        }
        let raw = i32::try_from(pid).map_err(|_| io::Error::other("pid out of range"))?;
        // SAFETY: pidfd_open(2) takes a pid and flags and returns a new descriptor or -1; no
        // memory is passed.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, raw, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = i32::try_from(fd).map_err(|_| io::Error::other("descriptor out of range"))?;
        // SAFETY: the kernel just returned this descriptor; nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self { fd, pid })
    }

    /// The pid the handle was opened on.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Sends `signal` to the process, if it still exists (one that has exited, even if its pid
    /// was reused since, is not an error: nothing is signalled).
    pub fn signal(&self, signal: i32) -> io::Result<()> {
        // SAFETY: pidfd_send_signal(2) with a descriptor we own, no siginfo (NULL) and no flags.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.fd.as_raw_fd(),
                signal,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        crate::signal::sent_or_gone(rc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_signals_its_process_and_never_a_later_one() {
        assert!(ProcessHandle::open(std::process::id()).is_err());
        assert!(ProcessHandle::open(1).is_err());
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let handle = ProcessHandle::open(child.id()).unwrap();
        assert_eq!(handle.pid(), child.id());
        handle.signal(libc::SIGKILL).unwrap();
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        // Reaped: whatever has the pid now, the handle signals nothing.
        handle.signal(libc::SIGKILL).unwrap();
    }
}
