//! The only libc calls of the executor: process groups and the parent-death signal.
//!
//! Pitfall: `PR_SET_PDEATHSIG` fires when the *thread* that spawned the child exits, not the
//! process. Bodies must therefore be spawned from a long-lived thread (the executor's
//! current-thread runtime, or a runtime worker), never from `spawn_blocking`, whose idle
//! threads are reaped after a few seconds and would take the body with them.

#![expect(
    unsafe_code,
    reason = "pre_exec and kill(2) on a process group need libc"
)]

use std::io;

/// Makes the child the leader of its own process group (so a terminal's Ctrl-C or a service
/// manager's SIGTERM reaches only the supervisor, and the whole body tree can be signalled),
/// and has the kernel SIGKILL it if the executor dies first.
pub(crate) fn isolate(cmd: &mut tokio::process::Command) {
    cmd.process_group(0);
    // SAFETY: the closure runs in the forked child before exec and only calls prctl(2) and
    // getppid(2), both async-signal-safe; it allocates nothing and touches no locks.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl: then nobody would kill us.
            if libc::getppid() == 1 {
                return Err(io::Error::other("executor exited while starting the body"));
            }
            Ok(())
        });
    }
}

/// Sends `signal` to every process of the group led by `pgid`. A group that is already gone
/// is not an error.
pub(crate) fn signal_group(pgid: u32, signal: i32) -> io::Result<()> {
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
pub(crate) const SIGTERM: i32 = libc::SIGTERM;
/// SIGKILL.
pub(crate) const SIGKILL: i32 = libc::SIGKILL;

/// The name of a signal number, for reasons and logs.
pub(crate) fn signal_name(signal: i32) -> &'static str {
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
