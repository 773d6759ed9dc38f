//! The only libc calls of perago: process groups, the parent-death signal and signals to a
//! group. Every child perago starts (broker, executors, bodies, guardrails) leads its own
//! process group, so a terminal's Ctrl-C or a service manager's SIGTERM reaches only the
//! supervisor, and a whole child tree can be signalled at once.
//!
//! Pitfall: `PR_SET_PDEATHSIG` fires when the *thread* that spawned the child exits, not the
//! process. Children must therefore be spawned from a long-lived thread (a current-thread
//! runtime's main thread, or a runtime worker), never from `spawn_blocking`, whose idle threads
//! are reaped after a few seconds and would take the child with them.

#![expect(
    unsafe_code,
    reason = "pre_exec and kill(2) on a process group need libc"
)]

use std::io;

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
