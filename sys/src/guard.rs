//! The body guard: in thread mode, a perago binary run as `<binary> __perago-body-guard
//! <program> <args>…` between the supervisor and each body, so that what a body starts dies
//! with the supervisor even when the supervisor is SIGKILLed (see [`body_guard_main`]).

#![expect(
    unsafe_code,
    reason = "signal masks, sigwait(2), waitpid(2), dup2(2), prctl(2) and kill(2) in the guard"
)]

use crate::{
    proc::{children, descendants},
    reaper::{ADOPTED_PATIENCE, kill_found},
};
use std::io;

/// The first argument that turns a perago binary into a body guard (see [`body_guard_main`]).
pub const BODY_GUARD_ARG: &str = "__perago-body-guard";

static BODY_GUARD: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

/// Runs every body of this process under `program` (a perago binary that dispatches
/// [`BODY_GUARD_ARG`] to [`body_guard_main`]). Thread mode sets it: there the bodies' parent is
/// the supervisor, and nothing else would be left to kill what they started if the
/// supervisor were SIGKILLed.
pub fn set_body_guard(program: std::path::PathBuf) {
    let _ = BODY_GUARD.set(program);
}

/// The guard program set by [`set_body_guard`], if any (see [`crate::Spawn::body`]).
pub(crate) fn body_guard() -> Option<&'static std::path::Path> {
    BODY_GUARD.get().map(std::path::PathBuf::as_path)
}

/// The body guard: a process between a thread-mode supervisor and one body. It is a child
/// subreaper, runs `args` (program, arguments) with the guard's stdio in the guard's process
/// group, and kills everything the body started as soon as the body exits or the guard's
/// parent dies (its parent-death signal is SIGUSR1, which it waits for). It then exits as the
/// body did. A SIGUSR1 while its parent lives (the soft time limit, sent to the guard alone)
/// is passed on to the body. Other signals the guard itself receives (the group's SIGTERM at
/// a time limit) also reached the body and are otherwise ignored. Returns the exit code.
pub fn body_guard_main(args: &[std::ffi::OsString]) -> i32 {
    use std::os::unix::process::CommandExt as _;
    let Some((program, rest)) = args.split_first() else {
        eprintln!("error: {BODY_GUARD_ARG} needs a program");
        return 2;
    };
    // SAFETY: plain syscalls on this process; the sigset lives on this stack.
    let (parent, waited) = unsafe {
        let parent = libc::getppid();
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in [
            libc::SIGCHLD,
            libc::SIGUSR1,
            libc::SIGTERM,
            libc::SIGINT,
            libc::SIGHUP,
            libc::SIGQUIT,
        ] {
            libc::sigaddset(&mut set, signal);
        }
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGUSR1, 0, 0, 0);
        (parent, set)
    };
    // The parent died before the parent-death signal was armed: nothing was started yet.
    // SAFETY: getppid(2) has no preconditions.
    if unsafe { libc::getppid() } != parent {
        return 1;
    }
    let mut cmd = std::process::Command::new(program);
    cmd.args(rest);
    // SAFETY: prctl(2) only, async-signal-safe; std resets the signal mask in the child.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let body = match cmd.spawn() {
        Ok(child) => child.id(),
        Err(e) => {
            eprintln!("error: cannot start {}: {e}", program.to_string_lossy());
            return 127;
        }
    };
    // The guard must not hold the body's pipes open: their end is the body's business.
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        use std::os::fd::AsRawFd as _;
        for fd in 0..=2 {
            // SAFETY: dup2(2) onto the standard descriptors.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
    let mut status: Option<libc::c_int> = None;
    while status.is_none() {
        let mut signal = 0;
        // SAFETY: sigwait(2) on the set blocked above.
        if unsafe { libc::sigwait(&waited, &mut signal) } != 0 {
            continue;
        }
        match signal {
            libc::SIGCHLD => loop {
                let mut raw = 0;
                // SAFETY: every child of the guard is its own to reap.
                let pid = unsafe { libc::waitpid(-1, &mut raw, libc::WNOHANG) };
                if pid <= 0 {
                    break;
                }
                if pid as u32 == body {
                    status = Some(raw);
                }
            },
            // SIGUSR1 is the parent-death signal; while the parent lives it is the
            // executor's soft time limit, for the body.
            // SAFETY: getppid(2) and kill(2) on the body's pid; no memory is involved.
            libc::SIGUSR1 if unsafe { libc::getppid() } == parent => unsafe {
                libc::kill(body as i32, libc::SIGUSR1);
            },
            // The parent (the supervisor) died: end the body and all it started.
            libc::SIGUSR1 => {
                kill_all_children();
                return 137;
            }
            _ => {}
        }
    }
    kill_all_children();
    let raw = status.expect("loop ends with a status");
    if libc::WIFEXITED(raw) {
        return libc::WEXITSTATUS(raw);
    }
    let signal = libc::WTERMSIG(raw);
    // SAFETY: restore the default action and die of the body's signal, so the caller sees it.
    unsafe {
        libc::signal(signal, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, signal);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::kill(libc::getpid(), signal);
    }
    128 + signal
}

/// The body guard's clean-up: every child (all of them adopted or the body) and everything
/// below, SIGKILLed and reaped, for at most [`ADOPTED_PATIENCE`].
fn kill_all_children() {
    let me = std::process::id();
    let deadline = std::time::Instant::now() + ADOPTED_PATIENCE;
    loop {
        let kids = children(me);
        if kids.is_empty() || std::time::Instant::now() >= deadline {
            return;
        }
        for kid in kids {
            for (pid, parent) in descendants(kid) {
                // Through a pidfd where the kernel has them: see `crate::reaper`.
                kill_found(pid, if pid == kid { me } else { parent });
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
        // SAFETY: every child of the guard is its own to reap.
        while unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
    }
}
