//! Signals by number: to one process, to a process group, and their names.
//!
//! Both senders name their target by number, and a number outlives its process: once a process
//! has exited *and been reaped*, the kernel may give its pid to a new process, and a process
//! group id is free again once the last member of the group is gone. They are for targets the
//! caller knows to be alive or unreaped: its own children (a child keeps its pid until it is
//! waited for), or a group whose leader is such a child. A pid read from `/proc` about a process
//! that is not the caller's child is signalled through a pidfd instead
//! ([`crate::reaper::pidfd::ProcessHandle`], and see [`crate::reaper`]).

#![expect(unsafe_code, reason = "kill(2) on a pid or a process group")]

use std::io;

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
    // Semantic hazard: `pgid` is a number. If the group's leader was reaped and every member
    // has exited, a new process may lead a group of that id and would get the signal. Callers
    // pass the pid of a child they still hold (`Managed`, a `Child` not yet waited for, a
    // broker or executor the supervisor has not reaped), which pins the number.
    let rc = unsafe { libc::kill(-pgid, signal) };
    sent_or_gone(rc.into())
}

/// Sends `signal` to the one process `pid` (not its group). A process that is already gone is
/// not an error.
pub fn signal_process(pid: u32, signal: i32) -> io::Result<()> {
    let Ok(pid) = i32::try_from(pid) else {
        return Err(io::Error::other("process id out of range"));
    };
    if pid <= 1 {
        return Err(io::Error::other("refusing to signal process 0 or 1"));
    }
    // SAFETY: kill(2) on one pid; no memory is involved. Semantic hazard: once `pid` has
    // exited and been reaped, the number may be another process's. Callers signal a child of
    // their own that they have not reaped (a zombie keeps its pid), or a pid they just read
    // from `/proc` about a child of theirs, in which case the same holds.
    let rc = unsafe { libc::kill(pid, signal) };
    sent_or_gone(rc.into())
}

/// SIGTERM.
pub const SIGTERM: i32 = libc::SIGTERM;

/// SIGKILL.
pub const SIGKILL: i32 = libc::SIGKILL;

/// SIGUSR1: a body's soft time limit.
pub const SIGUSR1: i32 = libc::SIGUSR1;

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
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGSYS => "SIGSYS",
        _ => "signal",
    }
}

/// The result of a signal-sending call's return code `rc`: sent, or the target already gone
/// (ESRCH), is `Ok`; any other failure is the OS error.
pub(crate) fn sent_or_gone(rc: std::ffi::c_long) -> io::Result<()> {
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
