//! Starting processes. Two paths:
//!
//! - Bodies (command and `jsonl` alike) through [`Spawn`]: `clone(CLONE_VM | CLONE_VFORK)`
//!   instead of `fork` (see [`vfork`] for the child's side). What a body inherits is decided
//!   here once: stdio as three pipes and no other descriptor, the environment it is given and
//!   no other, its own process group, caught signals back to their default action and SIGPIPE
//!   too, an empty signal mask, the parent-death signal, the optional user, and the body guard
//!   in thread mode ([`Spawn::body`]).
//! - The runtime's own children (broker, executors) through a `tokio::process::Command` with
//!   the steps of [`pre_exec`] ([`isolate`], [`inherit_fd`]), registered by
//!   [`crate::reaper::spawn`].
//!
//! A spawn with steps before `exec` (process group, parent-death signal, descriptors) makes std
//! fork: the whole address space is copied (page tables, `dup_mmap`) and the parent then takes
//! a copy-on-write fault on every page it writes. [`Spawn`]'s child borrows the parent's memory
//! on a stack of its own until it execs, as `posix_spawn` does, and runs the same steps with
//! async-signal-safe calls only: everything it needs (argv, envp, paths) is prepared before the
//! clone, so it allocates nothing. The parent's thread sleeps until the child has exec'd or
//! exited (`CLONE_VFORK`), and learns why it failed from the memory they share. The child is
//! then waited for through a pidfd registered with tokio, not tokio's SIGCHLD-driven reaping.
//!
//! The crate docs' pitfall holds here too: the parent-death signal fires when the spawning
//! *thread* exits.

#![expect(
    unsafe_code,
    reason = "kill(2) and waitpid(2) on our own children, and a pidfd registered with tokio"
)]

mod pre_exec;
mod vfork;

pub use pre_exec::{inherit_fd, inherit_only_stdio, isolate};

use crate::reaper::{MANAGED, Managed};
use std::{
    ffi::{CString, OsStr, c_char, c_int},
    io,
    os::{
        fd::{AsRawFd as _, OwnedFd},
        unix::{ffi::OsStrExt as _, process::ExitStatusExt as _},
    },
    path::Path,
    process::ExitStatus,
    ptr,
    sync::atomic::{AtomicI32, Ordering},
    time::Duration,
};
use tokio::io::unix::AsyncFd;
use vfork::{
    ChildContext, STACK, STEP_CGROUP, STEP_PARENT_GONE, Stack, clone_child, pipe, pointers,
    stack_size,
};

/// What to start, and how: a program with its arguments, its whole environment, a working
/// directory, an optional uid and gid, and the signal it gets when the spawning thread dies.
/// Stdin, stdout and stderr are always pipes; nothing else is inherited.
#[derive(Debug)]
pub struct Spawn {
    program: CString,
    argv: Vec<CString>,
    /// See [`Spawn::base_env`].
    base_env: Option<Environment>,
    env: Vec<CString>,
    dir: Option<CString>,
    user: Option<(u32, u32)>,
    death_signal: c_int,
    /// `cgroup.procs` of the memory cgroup the child joins before anything else (-1: none).
    cgroup_procs: c_int,
    /// An argument or variable held a NUL byte: reported by [`Spawn::spawn`], as std does.
    saw_nul: bool,
}

impl Spawn {
    /// `program` (a path, or a name looked up in `PATH` as `execvp` does) with no arguments,
    /// an empty environment, this process's working directory, and SIGKILL as its
    /// parent-death signal.
    pub fn new(program: impl AsRef<OsStr>) -> Self {
        let mut spawn = Self {
            program: CString::default(),
            argv: Vec::new(),
            base_env: None,
            env: Vec::new(),
            dir: None,
            user: None,
            death_signal: libc::SIGKILL,
            cgroup_procs: -1,
            saw_nul: false,
        };
        spawn.program = spawn.c_string(program.as_ref());
        spawn.argv.push(spawn.program.clone());
        spawn
    }

    /// `program` run the way bodies run: itself, or wrapped in the body guard if one is set
    /// (see [`crate::guard::set_body_guard`]).
    pub fn body(program: &Path) -> Self {
        match crate::guard::body_guard() {
            Some(guard) => {
                let mut spawn = Self::new(guard);
                spawn.arg(crate::guard::BODY_GUARD_ARG).arg(program);
                spawn
            }
            None => Self::new(program),
        }
    }

    fn c_string(&mut self, text: &OsStr) -> CString {
        CString::new(text.as_bytes()).unwrap_or_else(|_| {
            self.saw_nul = true;
            CString::default()
        })
    }

    /// Adds an argument.
    pub fn arg(&mut self, arg: impl AsRef<OsStr>) -> &mut Self {
        let arg = self.c_string(arg.as_ref());
        self.argv.push(arg);
        self
    }

    /// Adds arguments.
    pub fn args<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(&mut self, args: I) -> &mut Self {
        for arg in args {
            self.arg(arg);
        }
        self
    }

    /// Starts the child's environment (empty otherwise) from `base`, prepared once for many
    /// spawns; a variable set with [`Spawn::env`] replaces the one of the same name.
    pub fn base_env(&mut self, base: &Environment) -> &mut Self {
        self.saw_nul |= base.saw_nul;
        self.base_env = Some(base.clone());
        self
    }

    /// Sets a variable in the child's environment (which starts empty, or as
    /// [`Spawn::base_env`]); of two with the same name the last one counts.
    pub fn env(&mut self, name: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> &mut Self {
        match env_entry(name.as_ref(), value.as_ref()) {
            Some(entry) => self.env.push(entry),
            None => self.saw_nul = true,
        }
        self
    }

    /// Sets the working directory.
    pub fn current_dir(&mut self, dir: impl AsRef<Path>) -> &mut Self {
        self.dir = Some(self.c_string(dir.as_ref().as_os_str()));
        self
    }

    /// Runs the child as `uid`:`gid` (with no supplementary groups).
    pub fn user(&mut self, uid: u32, gid: u32) -> &mut Self {
        self.user = Some((uid, gid));
        self
    }

    /// The signal the child gets when the thread that spawned it exits (default SIGKILL).
    pub fn death_signal(&mut self, signal: i32) -> &mut Self {
        self.death_signal = signal;
        self
    }

    /// Has the child join the cgroup whose `cgroup.procs` is `procs` (open for writing) as
    /// its first step, before anything of the program runs: see
    /// [`crate::cgroup::BodyCgroup::procs`]. The descriptor must stay open until
    /// [`Spawn::spawn`] returns.
    pub fn cgroup(&mut self, procs: std::os::fd::BorrowedFd<'_>) -> &mut Self {
        self.cgroup_procs = procs.as_raw_fd();
        self
    }

    /// Starts the child, leader of its own process group, and registers it as [`Managed`].
    /// Must run inside a tokio runtime (the child is waited for through it).
    pub fn spawn(&self) -> io::Result<(Child, Managed)> {
        if self.saw_nul {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "nul byte found in provided data",
            ));
        }
        let (stdin_read, stdin_write) = pipe()?;
        let (stdout_read, stdout_write) = pipe()?;
        let (stderr_read, stderr_write) = pipe()?;
        let argv = pointers(&self.argv);
        let envp = self.envp();
        let ctx = ChildContext {
            program: self.program.as_ptr(),
            argv: argv.as_ptr(),
            envp: envp.as_ptr(),
            dir: self.dir.as_ref().map_or(ptr::null(), |d| d.as_ptr()),
            user: self.user,
            death_signal: self.death_signal,
            cgroup_procs: self.cgroup_procs,
            // SAFETY: getpid(2) has no preconditions.
            parent: unsafe { libc::getpid() },
            stdio: [
                stdin_read.as_raw_fd(),
                stdout_write.as_raw_fd(),
                stderr_write.as_raw_fd(),
            ],
            step: AtomicI32::new(0),
            errno: AtomicI32::new(0),
        };
        // Held across the spawn so a concurrent kill_adopted never sees the child unregistered.
        let mut managed = MANAGED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (pid, pidfd) = STACK.with(|stack| {
            let mut stack = stack.borrow_mut();
            let size = stack_size(&argv);
            if stack.as_ref().is_none_or(|s| s.len < size) {
                *stack = Some(Stack::new(size)?);
            }
            clone_child(&ctx, stack.as_mut().expect("made above"))
        })?;
        // The child's ends are its own now (or it is gone).
        drop((stdin_read, stdout_write, stderr_write));
        let step = ctx.step.load(Ordering::Acquire);
        if step != 0 {
            let errno = ctx.errno.load(Ordering::Acquire);
            // The child has exited (CLONE_VFORK returned without an exec): reap it.
            // SAFETY: waitpid(2) on our own child, which nothing else waits for.
            unsafe { libc::waitpid(pid, ptr::null_mut(), 0) };
            drop(pidfd);
            return Err(if step == STEP_PARENT_GONE {
                io::Error::other("the parent exited while starting the child")
            } else if step == STEP_CGROUP {
                let cause = io::Error::from_raw_os_error(errno);
                io::Error::new(
                    cause.kind(),
                    format!("cannot join the body's memory cgroup: {cause}"),
                )
            } else {
                io::Error::from_raw_os_error(errno)
            });
        }
        let pid = pid as u32;
        managed.push(pid);
        drop(managed);
        let mut child = Child {
            pid,
            pidfd: None,
            status: None,
            stdin: Some(stdin_write),
            stdout: Some(stdout_read),
            stderr: Some(stderr_read),
        };
        let managed = Managed(pid);
        if let Some(pidfd) = pidfd {
            // SAFETY: an `OwnedFd` keeps its descriptor open, and the same one, while owned.
            // On failure the child is dropped: killed, and reaped by a later kill_adopted.
            let pidfd =
                unsafe { AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE) }
                    .map_err(io::Error::from)?;
            child.pidfd = Some(pidfd);
        }
        Ok((child, managed))
    }
}

impl Spawn {
    /// The environment as `execvpe` takes it: the base variables no [`Spawn::env`] replaces,
    /// then those set, each name once (the last one set).
    fn envp(&self) -> Vec<*const c_char> {
        let base = self.base_env.as_ref().map_or(&[][..], |b| &b.entries[..]);
        let mut envp = Vec::with_capacity(base.len() + self.env.len() + 1);
        let set_after = |entry: &CString, later: &[CString]| {
            let name = env_name(entry);
            later.iter().any(|e| env_name(e) == name)
        };
        for entry in base {
            if !set_after(entry, &self.env) {
                envp.push(entry.as_ptr());
            }
        }
        for (at, entry) in self.env.iter().enumerate() {
            if !set_after(entry, &self.env[at + 1..]) {
                envp.push(entry.as_ptr());
            }
        }
        envp.push(ptr::null());
        envp
    }
}

/// The name of a `NAME=value` entry.
fn env_name(entry: &CString) -> &[u8] {
    let bytes = entry.as_bytes();
    bytes.split(|b| *b == b'=').next().unwrap_or(bytes)
}

/// Variables prepared once for many spawns (as `NAME=value` C strings): see
/// [`Spawn::base_env`].
#[derive(Debug, Clone, Default)]
pub struct Environment {
    entries: std::sync::Arc<[CString]>,
    /// A name or value held a NUL byte: every spawn with it fails, as with std.
    saw_nul: bool,
}

impl Environment {
    /// The variables `vars`, in order (give each name once).
    pub fn new<K: AsRef<OsStr>, V: AsRef<OsStr>>(vars: impl IntoIterator<Item = (K, V)>) -> Self {
        let mut saw_nul = false;
        let entries = vars
            .into_iter()
            .filter_map(|(name, value)| {
                let entry = env_entry(name.as_ref(), value.as_ref());
                saw_nul |= entry.is_none();
                entry
            })
            .collect();
        Self { entries, saw_nul }
    }
}

/// `NAME=value`, `None` if either holds a NUL byte.
fn env_entry(name: &OsStr, value: &OsStr) -> Option<CString> {
    let (name, value) = (name.as_bytes(), value.as_bytes());
    let mut entry = Vec::with_capacity(name.len() + value.len() + 1);
    entry.extend_from_slice(name);
    entry.push(b'=');
    entry.extend_from_slice(value);
    CString::new(entry).ok()
}

/// A child started by [`Spawn::spawn`]. Dropping it before it was waited for SIGKILLs it (it
/// is then reaped by the next `kill_adopted`, once its [`Managed`] is dropped too).
#[derive(Debug)]
pub struct Child {
    pid: u32,
    /// Readable once the child has exited; `None` on kernels without pidfds (before 5.2),
    /// where [`Child::wait`] polls.
    pidfd: Option<AsyncFd<OwnedFd>>,
    status: Option<ExitStatus>,
    /// The write end of the child's stdin, non-blocking (close it for end of file).
    pub stdin: Option<OwnedFd>,
    /// The read end of the child's stdout, non-blocking.
    pub stdout: Option<OwnedFd>,
    /// The read end of the child's stderr, non-blocking.
    pub stderr: Option<OwnedFd>,
}

impl Child {
    /// The child's pid (also its process group).
    pub fn id(&self) -> u32 {
        self.pid
    }

    /// Waits for the child to exit and reaps it. Cancel-safe: the status is taken only when
    /// the child is reaped, within one poll.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        let mut pause = Duration::from_millis(1);
        if let Some(status) = self.status {
            return Ok(status);
        }
        loop {
            match &self.pidfd {
                // Readable once the child has exited.
                Some(pidfd) => {
                    let mut ready = pidfd.readable().await?;
                    match reap(self.pid)? {
                        Some(status) => {
                            drop(ready);
                            self.status = Some(status);
                            return Ok(status);
                        }
                        None => ready.clear_ready(),
                    }
                }
                None => {
                    if let Some(status) = self.try_wait()? {
                        return Ok(status);
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
            }
        }
    }

    /// The exit status if the child has exited (reaping it), `None` while it runs.
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        if self.status.is_none() {
            self.status = reap(self.pid)?;
        }
        Ok(self.status)
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if self.status.is_none() {
            // Not reaped: still our child, so the pid cannot have been reused.
            // SAFETY: kill(2) and waitpid(2) on our own unreaped child.
            unsafe {
                libc::kill(self.pid as i32, libc::SIGKILL);
                libc::waitpid(self.pid as i32, ptr::null_mut(), libc::WNOHANG);
            }
        }
    }
}

/// Reaps `pid` if it has exited.
fn reap(pid: u32) -> io::Result<Option<ExitStatus>> {
    let mut raw = 0;
    loop {
        // SAFETY: waitpid(2) on our own child, writing the status to a local.
        let rc = unsafe { libc::waitpid(pid as i32, &mut raw, libc::WNOHANG) };
        match rc {
            0 => return Ok(None),
            rc if rc > 0 => return Ok(Some(ExitStatus::from_raw(raw))),
            _ => {
                let err = io::Error::last_os_error();
                if err.kind() != io::ErrorKind::Interrupted {
                    return Err(err);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
