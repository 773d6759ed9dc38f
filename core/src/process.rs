//! The only libc calls of perago: process groups, the parent-death signal and signals to a
//! group; the descriptors a child inherits (the workspace root's lock, a pipe); the child
//! subreaper and the clean-up of what bodies leave behind; the thread-mode body guard; and
//! walking a workspace from held folder descriptors ([`dirfd`]). Every
//! child perago starts (broker, executors, bodies, guardrails) leads its own process group, so
//! a terminal's Ctrl-C or a service manager's SIGTERM reaches only the supervisor, and a whole
//! child tree can be signalled at once.
//!
//! Nothing a body starts outlives it: the executor and the supervisor are child subreapers, so
//! whatever a body detaches (double fork, `setsid`) is re-parented to them instead of init, and
//! [`kill_adopted`] SIGKILLs and reaps every child that is not [`Managed`] (spawned through
//! [`spawn`] and still waited for). In thread mode bodies run under [`body_guard_main`], which
//! does the same when the supervisor dies.
//!
//! Bodies are started by [`Spawn`] (`clone(CLONE_VM | CLONE_VFORK)`, the same steps before
//! `exec`, a pidfd to wait on) rather than a forking `Command`: see `process/spawn.rs`.
//!
//! Pitfall: `PR_SET_PDEATHSIG` fires when the *thread* that spawned the child exits, not the
//! process. Children must therefore be spawned from a long-lived thread (a current-thread
//! runtime's main thread, or a runtime worker), never from `spawn_blocking`, whose idle threads
//! are reaped after a few seconds and would take the child with them.

#![expect(
    unsafe_code,
    reason = "pre_exec, fcntl(2), close_range(2), kill(2) on a process group and openat(2) need libc"
)]

use std::{io, os::fd::RawFd};

pub mod dirfd;
pub mod pidfd;
pub mod secrets;
mod spawn;
pub use spawn::{Child, Environment, Spawn};

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

/// Has malloc keep freed memory for reuse instead of handing it back to the kernel at once
/// (glibc; elsewhere nothing changes). A task's payload, up to megabytes, passes through a few
/// buffers in the broker and an executor; by default glibc serves blocks that large from
/// their own mappings, or trims the heap's free top as soon as it passes a few megabytes, so
/// every task faulted in (and the kernel zeroed) fresh pages for each buffer: a quarter of
/// both processes' time at 1 MiB per task. Blocks up to 16 MiB (a slot message is at most 11)
/// now come from the heap, and up to 32 MiB of free heap top stay mapped: a process that
/// handled large payloads keeps that much more resident.
pub fn retain_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt(3) sets malloc tunables; called at start, before other threads.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 16 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 32 << 20);
        }
    }
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

/// Makes this process non-dumpable: another process of the same user can then no longer read
/// its memory, its `/proc/<pid>/environ` or its open descriptors (only root can). Runtime
/// processes hold the slot tokens, the control token and the Conductor and lakeFS secrets;
/// bodies run as the same user by default.
pub fn set_non_dumpable() -> io::Result<()> {
    // SAFETY: prctl(PR_SET_DUMPABLE) changes a flag of this process; no memory is involved.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether this process is dumpable (see [`set_non_dumpable`]).
pub fn is_dumpable() -> bool {
    // SAFETY: prctl(PR_GET_DUMPABLE) reads a flag of this process.
    unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) == 1 }
}

/// A user that bodies cannot run as.
#[derive(Debug, thiserror::Error)]
pub enum UserError {
    /// The name cannot be a user name (it holds a NUL byte).
    #[error("{name:?} is not a user name")]
    BadName {
        /// The name as given.
        name: String,
    },
    /// The user database could not be read.
    #[error("cannot look up user {name:?}: {source}")]
    Lookup {
        /// The name as given.
        name: String,
        /// The error of getpwnam_r.
        #[source]
        source: io::Error,
    },
    /// There is no such user.
    #[error("there is no user named {name:?} on this machine")]
    NoSuchUser {
        /// The name as given.
        name: String,
    },
    /// The runtime is not root and the user is not the runtime's own.
    #[error(
        "body.user = {name:?} needs the runtime to run as root to switch to it (it runs as uid {euid})"
    )]
    NotRoot {
        /// The name as given.
        name: String,
        /// The runtime's effective uid.
        euid: u32,
    },
}

/// The uid and primary gid of the user `name` (from the system's user database).
pub fn user_ids(name: &str) -> Result<(u32, u32), UserError> {
    let c_name = std::ffi::CString::new(name).map_err(|_| UserError::BadName {
        name: name.to_owned(),
    })?;
    let mut entry: libc::passwd = unsafe_zeroed_passwd();
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call: the name is NUL-terminated, `entry` and
    // `buf` live on this frame with their true sizes, and `found` is written by the call.
    let rc = unsafe {
        libc::getpwnam_r(
            c_name.as_ptr(),
            &mut entry,
            buf.as_mut_ptr(),
            buf.len(),
            &mut found,
        )
    };
    if rc != 0 {
        return Err(UserError::Lookup {
            name: name.to_owned(),
            source: io::Error::from_raw_os_error(rc),
        });
    }
    if found.is_null() {
        return Err(UserError::NoSuchUser {
            name: name.to_owned(),
        });
    }
    Ok((entry.pw_uid, entry.pw_gid))
}

fn unsafe_zeroed_passwd() -> libc::passwd {
    // SAFETY: `passwd` is a C struct of integers and pointers, for which all-zero is valid
    // (null pointers); getpwnam_r fills it before it is read.
    unsafe { std::mem::zeroed() }
}

/// This process's effective user id.
pub fn euid() -> u32 {
    // SAFETY: geteuid(2) cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

/// The uid and gid bodies run as for `body.user = name`: the user must exist, and a runtime
/// that is not root can only "switch" to itself.
pub fn body_user(name: &str) -> Result<(u32, u32), UserError> {
    let (uid, gid) = user_ids(name)?;
    let me = euid();
    if me != 0 && me != uid {
        return Err(UserError::NotRoot {
            name: name.to_owned(),
            euid: me,
        });
    }
    Ok((uid, gid))
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

/// Sends `signal` to the one process `pid` (not its group). A process that is already gone is
/// not an error.
pub fn signal_process(pid: u32, signal: i32) -> io::Result<()> {
    let Ok(pid) = i32::try_from(pid) else {
        return Err(io::Error::other("process id out of range"));
    };
    if pid <= 1 {
        return Err(io::Error::other("refusing to signal process 0 or 1"));
    }
    // SAFETY: kill(2) on one pid; no memory is involved.
    let rc = unsafe { libc::kill(pid, signal) };
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

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit (the broker: a flood of
/// socket connections must not leave it without descriptors); returns the soft limit in force
/// afterwards (1024 if it cannot be read).
pub fn raise_nofile_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2) writes the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) } != 0 {
        return 1024;
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit(2) reads the struct we pass.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raw const raised) } == 0 {
            limit.rlim_cur = limit.rlim_max;
        }
    }
    limit.rlim_cur
}

/// The children this process started itself (and still waits for through their `Child`), plus
/// those it had before [`become_subreaper`]: never killed or reaped by [`kill_adopted`].
static MANAGED: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());

/// Keeps a spawned child out of [`kill_adopted`]'s reach until dropped: hold it as long as the
/// `Child` it belongs to (reaping it behind tokio's back would make its `wait` fail).
#[derive(Debug)]
pub struct Managed(u32);

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

/// What `/proc/<pid>/stat` says: the state letter, the parent and the process group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// `R`, `S`, `D`, `Z` (zombie), …
    pub state: char,
    /// The parent's pid.
    pub ppid: u32,
    /// The process group.
    pub pgid: u32,
    /// When it started, in clock ticks after boot (field 22): with the pid, it names one
    /// process, whatever later reuses the pid.
    pub start_time: Option<u64>,
}

/// Parses the text of `/proc/<pid>/stat`; the command name may hold spaces and parentheses.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgid = fields.next()?.parse().ok()?;
    // Fields 6 to 21, then the start time.
    let start_time = fields.nth(16).and_then(|t| t.parse().ok());
    Some(Stat {
        state,
        ppid,
        pgid,
        start_time,
    })
}

/// The stat of `pid`, `None` once it is gone.
pub fn stat(pid: u32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The children of `pid`, from `/proc/<pid>/task/*/children`, or by scanning every
/// `/proc/*/stat` where the kernel lacks that file.
pub fn children(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return found;
    };
    for task in tasks.flatten() {
        match std::fs::read_to_string(task.path().join("children")) {
            Ok(list) => found.extend(
                list.split_ascii_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            ),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return children_by_scan(pid),
            Err(_) => {}
        }
    }
    found.sort_unstable();
    found.dedup();
    found
}

fn children_by_scan(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| stat(*pid).is_some_and(|s| s.ppid == parent))
        .collect()
}

/// `pid` and every process below it, parents first.
pub fn tree(pid: u32) -> Vec<u32> {
    let mut all = vec![pid];
    let mut next = 0;
    while next < all.len() {
        for kid in children(all[next]) {
            if !all.contains(&kid) {
                all.push(kid);
            }
        }
        next += 1;
    }
    all
}

/// How long [`kill_adopted`] keeps killing and reaping before it gives up.
const ADOPTED_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

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
/// runtime spawns commands, or the blocking thread a Rust body ran on: pass its id).
pub fn kill_adopted_below(threads: &[u32]) -> usize {
    if !has_children() {
        return 0;
    }
    let mut all = Vec::with_capacity(threads.len() + 1);
    all.push(std::process::id());
    all.extend_from_slice(threads);
    kill_adopted_where(|| children_of_threads(&all))
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
    let mut killed = 0;
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
            return killed;
        }
        for &orphan in &adopted {
            for pid in tree(orphan) {
                if stat(pid).is_some_and(|s| s.state != 'Z') {
                    killed += 1;
                    // SAFETY: kill(2) on one pid; no memory is involved.
                    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
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
            return killed;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

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

/// A command for `program`: itself, or wrapped in the body guard if one is set.
pub fn body_command(program: &std::path::Path) -> tokio::process::Command {
    match BODY_GUARD.get() {
        Some(guard) => {
            let mut cmd = tokio::process::Command::new(guard);
            cmd.arg(BODY_GUARD_ARG).arg(program);
            cmd
        }
        None => tokio::process::Command::new(program),
    }
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
            for pid in tree(kid) {
                // SAFETY: kill(2) on one pid below this guard.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
        // SAFETY: every child of the guard is its own to reap.
        while unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
    }
}

/// The exit code of an executor that ends to be recycled (`--max-tasks-per-executor`,
/// `--max-executor-memory`): the supervisor starts the slot's next generation at once, without
/// backoff (EX_TEMPFAIL).
pub const EXIT_RECYCLED: i32 = 75;

/// The reason of the broker's `Stop` to an executor that asked to be recycled.
pub const STOP_RECYCLE: &str = "recycle";

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

    #[test]
    fn users_are_looked_up_by_name() {
        assert_eq!(user_ids("root").unwrap(), (0, 0));
        let missing = user_ids("no-such-user-perago").unwrap_err();
        assert!(
            matches!(missing, UserError::NoSuchUser { ref name } if name == "no-such-user-perago")
        );
        assert_eq!(
            missing.to_string(),
            "there is no user named \"no-such-user-perago\" on this machine"
        );
        assert!(matches!(user_ids("a\0b"), Err(UserError::BadName { .. })));
        if euid() != 0 {
            assert!(matches!(
                body_user("root"),
                Err(UserError::NotRoot { ref name, .. }) if name == "root"
            ));
        }
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

    use std::time::{Duration, Instant};

    #[test]
    fn stat_parses_names_with_spaces_and_parentheses() {
        assert_eq!(
            parse_stat("42 (a b) c) S 7 40 40 0 -1 4194560"),
            Some(Stat {
                state: 'S',
                ppid: 7,
                pgid: 40,
                start_time: None,
            })
        );
        assert_eq!(
            parse_stat("42 (x) S 7 40 40 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 1 0 123456 999 1")
                .and_then(|s| s.start_time),
            Some(123_456)
        );
        assert_eq!(parse_stat("42 no parenthesis"), None);
        let me = stat(std::process::id()).expect("this process has a stat");
        assert_ne!(me.state, 'Z');
        assert!(me.start_time.is_some_and(|t| t > 0), "{me:?}");
    }

    /// Live processes whose command line contains `marker`.
    fn alive_with(marker: &str) -> Vec<u32> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            // Only `sleep` itself: the shells and `setsid` that start it carry the marker in
            // their command lines too, for a moment, and are gone the next instant.
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let mut args = cmdline.split(|b| *b == 0);
            let is_sleep = args
                .next()
                .is_some_and(|argv0| argv0 == b"sleep" || argv0.ends_with(b"/sleep"));
            if is_sleep
                && args.any(|a| a == marker.as_bytes())
                && stat(pid).is_some_and(|s| s.state != 'Z')
            {
                found.push(pid);
            }
        }
        found
    }

    fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A body that double-forks a `setsid` daemon (`sleep marker`) and exits; returns the
    /// daemon's pid once this process (a subreaper) has adopted it.
    async fn leave_adopted_daemon(marker: &str) -> u32 {
        let mut body = tokio::process::Command::new("sh");
        body.args(["-c", &format!("(setsid sleep {marker} &); exit 0")]);
        let (mut body, guard) = spawn(&mut body).unwrap();
        assert!(body.wait().await.unwrap().success());
        drop(guard);
        // Started, and adopted once the subshell that started it has exited.
        wait_for("the daemon to be adopted", || {
            alive_with(marker)
                .first()
                .is_some_and(|pid| stat(*pid).is_some_and(|s| s.ppid == std::process::id()))
        });
        alive_with(marker)[0]
    }

    #[tokio::test]
    async fn kill_adopted_ends_a_double_forked_setsid_daemon_and_spares_managed_children() {
        become_subreaper().unwrap();
        // Unique durations mark the processes: `sleep` has no other argument to carry a marker.
        let daemon = format!("1000.{}1", std::process::id());
        let managed = format!("1000.{}2", std::process::id());
        let mut keep = tokio::process::Command::new("sleep");
        keep.arg(&managed).kill_on_drop(true);
        let (_kept, _kept_guard) = spawn(&mut keep).unwrap();
        let pid = leave_adopted_daemon(&daemon).await;

        assert!(kill_adopted() >= 1);
        assert_eq!(alive_with(&daemon), Vec::<u32>::new(), "the daemon is gone");
        assert_eq!(
            stat(pid),
            None,
            "and reaped, not left a zombie (or its pid reused)"
        );
        assert_eq!(
            alive_with(&managed).len(),
            1,
            "a managed child is not touched"
        );
    }

    /// The shortcut that skips `/proc` must see every kind of child: a live one, and one that
    /// exited and is not reaped yet (a zombie still to be waited for).
    #[test]
    fn has_children_sees_live_and_exited_unreaped_children() {
        let mut child = std::process::Command::new("sleep")
            .arg("1000")
            .spawn()
            .unwrap();
        assert!(has_children(), "a live child");
        child.kill().unwrap();
        wait_for("the child to become a zombie", || {
            stat(child.id()).is_some_and(|s| s.state == 'Z')
        });
        assert!(has_children(), "an exited child not yet reaped");
        child.wait().unwrap();
    }

    #[tokio::test]
    async fn kill_adopted_ends_what_a_spawned_body_left_and_spares_a_spawned_body_that_runs() {
        become_subreaper().unwrap();
        let daemon = format!("1002.{}1", std::process::id());
        let running = format!("1002.{}2", std::process::id());
        let (_running, _running_guard) = Spawn::new("sleep").arg(&running).spawn().unwrap();
        let (mut body, guard) = Spawn::new("/bin/sh")
            .args(["-c", &format!("(setsid sleep {daemon} &); exit 0")])
            .env("PATH", "/usr/bin:/bin")
            .spawn()
            .unwrap();
        assert!(body.wait().await.unwrap().success());
        drop(guard);
        wait_for("the daemon to be adopted", || {
            alive_with(&daemon)
                .first()
                .is_some_and(|pid| stat(*pid).is_some_and(|s| s.ppid == std::process::id()))
        });
        let pid = alive_with(&daemon)[0];

        assert!(kill_adopted() >= 1);
        assert_eq!(alive_with(&daemon), Vec::<u32>::new(), "the daemon is gone");
        assert_eq!(stat(pid), None, "and reaped");
        assert_eq!(
            alive_with(&running).len(),
            1,
            "a body being run is not touched"
        );
    }

    #[tokio::test]
    async fn the_main_threads_children_are_read_afresh_from_the_file_kept_open() {
        become_subreaper().unwrap();
        let me = std::process::id();
        let end = |pid: u32| {
            signal_process(pid, SIGKILL).unwrap();
            // SAFETY: waitpid(2) on our own child, killed above.
            unsafe { libc::waitpid(pid as i32, std::ptr::null_mut(), 0) };
        };
        // Opened (and kept) before the daemons exist.
        main_thread_children(me).unwrap();
        let first = leave_adopted_daemon(&format!("1003.{}1", std::process::id())).await;
        assert!(children_of_threads(&[me]).contains(&first));
        end(first);
        // Read from its start: a read going on from where the last one ended would skip it.
        let second = leave_adopted_daemon(&format!("1003.{}2", std::process::id())).await;
        let now = children_of_threads(&[me]);
        assert!(now.contains(&second) && !now.contains(&first), "{now:?}");
        end(second);
    }

    /// After an assignment only the main thread and the body's threads are looked at: the
    /// kernel hands an orphan to a subreaper's main thread, even when the process that left it
    /// was started from another thread; a process started directly by a thread is that
    /// thread's child, found only when that thread is named.
    #[tokio::test]
    async fn kill_adopted_below_finds_orphans_on_the_main_thread_and_children_of_named_threads() {
        become_subreaper().unwrap();
        // This test runs on a thread of the test harness, not the main thread.
        let me = current_tid();
        assert_ne!(me, std::process::id());
        let daemon = format!("1001.{}1", std::process::id());
        let direct = format!("1001.{}2", std::process::id());
        leave_adopted_daemon(&daemon).await;
        // Started directly from this thread and not managed: what a Rust body might leave.
        let child = std::process::Command::new("sleep")
            .arg(&direct)
            .spawn()
            .unwrap();
        let direct_pid = child.id();
        std::mem::forget(child);

        assert!(
            kill_adopted_below(&[]) >= 1,
            "the orphan, on the main thread"
        );
        assert_eq!(alive_with(&daemon), Vec::<u32>::new(), "the daemon is gone");
        assert_eq!(alive_with(&direct).len(), 1, "not this thread's child");
        assert_eq!(kill_adopted_below(&[me]), 1);
        assert_eq!(alive_with(&direct), Vec::<u32>::new());
        assert_eq!(stat(direct_pid), None, "reaped");
    }
}
