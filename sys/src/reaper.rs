//! The child subreaper and what it reaps: the children perago waits for itself ([`Managed`]),
//! and everything else below it, which [`kill_adopted`] SIGKILLs and reaps (what a body left
//! behind: a double-forked daemon, a `setsid` job). [`pidfd`] holds one process by a handle
//! that a later process with the same pid is never mistaken for.
//!
//! The kills here find their targets in `/proc`, and a pid read there is a number, not a
//! process: by the time it is signalled, the process may have exited and been reaped by its
//! parent, and the number given to an unrelated process. A process further down the tree is
//! its own parent's to reap, and even a child of this process that is not [`Managed`] may be
//! waited for by another thread (a Rust body's own `Command`). So each one is first taken as a pidfd
//! (`pidfd_open`, Linux 5.3), then checked again in `/proc` (alive, and still below the parent
//! it was found under, or re-parented to this process), and signalled through the pidfd
//! (`pidfd_send_signal`): if the process held is still alive when checked, the check was about
//! it (a pid is not reused while its process exists, zombie included), and if it died since,
//! the signal reaches nothing. Where the kernel has no pidfds the signal is `kill(2)` right
//! after the check, and the hazard is the window between the two (microseconds: the pid would
//! have to be reaped and handed out again within it).

#![expect(
    unsafe_code,
    reason = "prctl(PR_SET_CHILD_SUBREAPER), waitid(2), waitpid(2), kill(2), gettid(2)"
)]

pub mod pidfd;

use crate::{
    proc::{Stat, children, descendants, stat},
    signal::signal_group,
};
use std::io;

/// Makes this process a child subreaper (`PR_SET_CHILD_SUBREAPER`): a process started below it
/// whose parent dies is re-parented to this process instead of init, so [`kill_adopted`] can
/// find it, however it detached (double fork, `setsid`). The processes that are already our
/// children (a shell that `exec`ed us may have left some) are remembered as not ours to kill.
pub fn become_subreaper() -> io::Result<()> {
    // SAFETY: prctl(2) with integer arguments; no memory is involved.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let me = std::process::id();
    let mut managed = MANAGED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for pid in children(me) {
        if !managed.contains(&pid) {
            managed.push(pid);
        }
    }
    Ok(())
}

/// The children this process started itself (and still waits for through their `Child`), plus
/// those it had before [`become_subreaper`]: never killed or reaped by [`kill_adopted`].
pub(crate) static MANAGED: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());

/// Keeps a spawned child out of [`kill_adopted`]'s reach until dropped: hold it as long as the
/// `Child` it belongs to (reaping it behind tokio's back would make its `wait` fail).
#[derive(Debug)]
pub struct Managed(pub(crate) u32);

impl Managed {
    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.0
    }
}

impl Drop for Managed {
    fn drop(&mut self) {
        let mut managed = MANAGED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(at) = managed.iter().position(|p| *p == self.0) {
            managed.swap_remove(at);
        }
    }
}

/// Spawns `cmd` and registers the child as [`Managed`].
pub fn spawn(cmd: &mut tokio::process::Command) -> io::Result<(tokio::process::Child, Managed)> {
    // Held across the spawn so a concurrent kill_adopted never sees the child unregistered.
    let mut managed = MANAGED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let child = cmd.spawn()?;
    let pid = child.id().expect("a just-spawned child has a pid");
    managed.push(pid);
    Ok((child, Managed(pid)))
}

/// Sends `signal` to the process group of every [`Managed`] child (each leads its own group).
pub fn signal_managed(signal: i32) {
    let pids = MANAGED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    for pid in pids {
        let _ = signal_group(pid, signal);
    }
}

/// How long [`kill_adopted`] keeps killing and reaping before it gives up.
pub(crate) const ADOPTED_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

/// The id of the calling thread.
pub fn current_tid() -> u32 {
    // SAFETY: gettid(2) has no preconditions.
    unsafe { libc::gettid() as u32 }
}

/// The children of this process's threads `threads` (task ids; the main thread's is the pid).
fn children_of_threads(threads: &[u32]) -> Vec<u32> {
    let me = std::process::id();
    let mut found = Vec::new();
    for tid in threads {
        let list = if *tid == me {
            main_thread_children(me)
        } else {
            std::fs::read_to_string(format!("/proc/{me}/task/{tid}/children"))
        };
        match list {
            Ok(list) => found.extend(
                list.split_ascii_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            ),
            // No `children` file (a kernel without CONFIG_PROC_CHILDREN): the full scan.
            Err(e) if e.kind() == io::ErrorKind::NotFound && *tid == me => return children(me),
            Err(_) => {}
        }
    }
    found.sort_unstable();
    found.dedup();
    found
}

/// The main thread's `children` file, kept open: read again from its start it lists the
/// children as they are now, and opening it (a walk of /proc) costs more than reading it. With
/// the pid it belongs to (a process forked from this one must not read its parent's).
static MAIN_CHILDREN: std::sync::OnceLock<(u32, io::Result<std::fs::File>)> =
    std::sync::OnceLock::new();

/// `/proc/<me>/task/<me>/children`, read through [`MAIN_CHILDREN`].
fn main_thread_children(me: u32) -> io::Result<String> {
    use std::os::unix::fs::FileExt as _;
    let path = || format!("/proc/{me}/task/{me}/children");
    let (pid, file) = MAIN_CHILDREN.get_or_init(|| (me, std::fs::File::open(path())));
    let file = match file {
        Ok(file) if *pid == me => file,
        Err(e) if *pid == me => return Err(io::Error::new(e.kind(), e.to_string())),
        _ => return std::fs::read_to_string(path()),
    };
    let mut text = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        let n = file.read_at(&mut chunk, text.len() as u64)?;
        if n == 0 {
            break;
        }
        text.extend_from_slice(&chunk[..n]);
    }
    String::from_utf8(text).map_err(io::Error::other)
}

/// SIGKILLs every child of this process that is not [`Managed`] (orphans re-parented to this
/// subreaper: what a body left behind) with everything below it, and reaps them. Loops until
/// none is left (a dying process hands its own children to us), for at most 2 s. Returns how
/// many live processes it killed.
pub fn kill_adopted() -> usize {
    kill_adopted_where(|| children(std::process::id()))
}

/// [`kill_adopted`] for the children of the main thread and of `threads` only: cheaper (no
/// scan of every thread) and enough after an assignment. The kernel hands orphans to a child
/// subreaper's first live thread, its main thread while the process runs; processes a body
/// started directly are children of the thread that spawned the body (the main thread, whose
/// runtime spawns commands, or the executor's body thread a Rust body ran on: pass its id).
pub fn kill_adopted_below(threads: &[u32]) -> usize {
    // `kill_adopted_where` asks `has_children` first: after most assignments there is none,
    // and nothing else is asked (not even this process's id).
    kill_adopted_where(|| {
        let mut all = Vec::with_capacity(threads.len() + 1);
        all.push(std::process::id());
        all.extend_from_slice(threads);
        children_of_threads(&all)
    })
}

/// Whether this process has any child at all, live or zombie, of any of its threads: one
/// `waitid(2)` that reaps nothing (`ECHILD` means none). After most assignments there is none,
/// and this spares reading `/proc`.
pub fn has_children() -> bool {
    // SAFETY: waitid(2) with WNOHANG | WNOWAIT writes only into `info`, which lives on this
    // stack, and neither blocks nor reaps.
    let (rc, errno) = unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let rc = libc::waitid(
            libc::P_ALL,
            0,
            &mut info,
            libc::WEXITED | libc::WSTOPPED | libc::WCONTINUED | libc::WNOHANG | libc::WNOWAIT,
        );
        (rc, io::Error::last_os_error().raw_os_error())
    };
    !(rc == -1 && errno == Some(libc::ECHILD))
}

fn kill_adopted_where(children_now: impl Fn() -> Vec<u32>) -> usize {
    if !has_children() {
        return 0;
    }
    let deadline = std::time::Instant::now() + ADOPTED_PATIENCE;
    // The pids signalled so far: one still dying at the next round (its exit takes longer
    // than a round under load, or with a large memory to free) is signalled again, and must
    // not be counted again.
    let mut killed: Vec<u32> = Vec::new();
    loop {
        let adopted: Vec<u32> = {
            let managed = MANAGED
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            children_now()
                .into_iter()
                .filter(|p| !managed.contains(p))
                .collect()
        };
        if adopted.is_empty() {
            return killed.len();
        }
        let me = std::process::id();
        for &orphan in &adopted {
            for (pid, parent) in descendants(orphan) {
                if kill_found(pid, if pid == orphan { me } else { parent })
                    && !killed.contains(&pid)
                {
                    killed.push(pid);
                }
            }
        }
        for &orphan in &adopted {
            let mut status = 0;
            // SAFETY: waitpid(2) on a child that is ours and that no `Child` waits for.
            unsafe { libc::waitpid(orphan as i32, &mut status, libc::WNOHANG) };
        }
        if std::time::Instant::now() >= deadline {
            tracing::warn!(
                left = adopted.len(),
                "processes left behind by a body would not die"
            );
            return killed.len();
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// SIGKILLs `pid`, found in `/proc` as a child of `parent`, if it is still a live child of
/// `parent` or of this process (which adopts what is orphaned below it); whether it was
/// signalled. See the module docs for why a pidfd is taken first.
pub(crate) fn kill_found(pid: u32, parent: u32) -> bool {
    let me = std::process::id();
    let still_ours =
        || stat(pid).is_some_and(|s: Stat| s.state != 'Z' && (s.ppid == parent || s.ppid == me));
    match pidfd::ProcessHandle::open(pid) {
        // Checked once the handle is taken: while the process it holds lives, `pid` is its.
        Ok(handle) => still_ours() && handle.signal(libc::SIGKILL).is_ok(),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => false,
        // No pidfds (Linux before 5.3, or no descriptor left): kill(2) right after the check.
        Err(_) => {
            // SAFETY: kill(2) on one pid; no memory is involved. Semantic hazard: between the
            // check and the kill the process may be reaped by its parent and its pid reused;
            // the window is the time between two system calls.
            still_ours() && unsafe { libc::kill(pid as i32, libc::SIGKILL) } == 0
        }
    }
}

#[cfg(test)]
mod tests;
