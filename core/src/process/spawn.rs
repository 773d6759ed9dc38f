//! Starting a body the cheap way: `clone(CLONE_VM | CLONE_VFORK)` instead of `fork`.
//!
//! A spawn with steps before `exec` (process group, parent-death signal, descriptors) makes std
//! fork: the whole address space is copied (page tables, `dup_mmap`) and the parent then takes
//! a copy-on-write fault on every page it writes. Here the child borrows the parent's memory
//! on a stack of its own until it execs, as `posix_spawn` does, and runs the same steps with
//! async-signal-safe calls only: everything it needs (argv, envp, paths) is prepared before the
//! clone, so it allocates nothing. The parent's thread sleeps until the child has exec'd or
//! exited (`CLONE_VFORK`), and learns why it failed from the memory they share. The child is
//! then waited for through a pidfd registered with tokio, not tokio's SIGCHLD-driven reaping.
//!
//! What the child does, in std's order: stdio (three pipes), `setgroups`/`setgid`/`setuid`
//! (raw system calls: glibc's wrappers would signal every thread of the parent, whose memory
//! the child shares), `chdir`, `setpgid(0, 0)`, caught signals back to their default action
//! and SIGPIPE too, the parent-death signal (after the uid change, which clears it) and a
//! check that the parent is still the one that spawned it, every descriptor above stderr
//! marked close-on-exec, an empty signal mask, then `execvpe` (which, like std, runs a script
//! without a `#!` line through `/bin/sh`).
//!
//! The module docs' pitfall holds here too: the parent-death signal fires when the spawning
//! *thread* exits.

#![expect(
    unsafe_code,
    reason = "clone(2) with a child stack, execve(2) and the steps before it need libc"
)]

use super::{MANAGED, Managed};
use std::{
    cell::RefCell,
    ffi::{CString, OsStr, c_char, c_int, c_void},
    io,
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd},
        unix::{ffi::OsStrExt as _, process::ExitStatusExt as _},
    },
    path::Path,
    process::ExitStatus,
    ptr,
    sync::atomic::{AtomicI32, Ordering},
    time::Duration,
};
use tokio::io::unix::AsyncFd;

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
            saw_nul: false,
        };
        spawn.program = spawn.c_string(program.as_ref());
        spawn.argv.push(spawn.program.clone());
        spawn
    }

    /// `program` run the way bodies run: itself, or wrapped in the body guard if one is set
    /// (see [`super::set_body_guard`]; the spawning counterpart of [`super::body_command`]).
    pub fn body(program: &Path) -> Self {
        match super::BODY_GUARD.get() {
            Some(guard) => {
                let mut spawn = Self::new(guard);
                spawn.arg(super::BODY_GUARD_ARG).arg(program);
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

thread_local! {
    /// The child stack of spawns from this thread, kept for the next one: the calling thread
    /// sleeps until the child has exec'd, so one stack per thread is never used twice at once.
    static STACK: RefCell<Option<Stack>> = const { RefCell::new(None) };
}

/// `argv` and `envp` as the NULL-terminated pointer arrays `execvpe` takes.
fn pointers(strings: &[CString]) -> Vec<*const c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(ptr::null()))
        .collect()
}

/// Enough for the child's own frames, and for glibc's `/bin/sh` fallback, which copies argv
/// onto the stack.
fn stack_size(argv: &[*const c_char]) -> usize {
    let bytes = 64 * 1024 + std::mem::size_of_val(argv);
    bytes.next_multiple_of(page_size())
}

fn page_size() -> usize {
    // SAFETY: sysconf(3) reads a constant of the system.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096)
}

/// A child stack: anonymous memory with a guard page below it, so an overflow faults instead
/// of writing into the parent's memory.
#[derive(Debug)]
struct Stack {
    base: *mut c_void,
    /// Usable bytes, above the guard page.
    len: usize,
    guard: usize,
}

impl Stack {
    fn new(len: usize) -> io::Result<Self> {
        let guard = page_size();
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let base = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len + guard,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = Self { base, len, guard };
        // SAFETY: the lowest page of the mapping just made, which nothing uses yet.
        if unsafe { libc::mprotect(base, guard, libc::PROT_NONE) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stack)
    }

    /// The highest address, 16-byte aligned (stacks grow down).
    fn top(&self) -> *mut c_void {
        // SAFETY: one past the end of the mapping, which is page-aligned.
        unsafe { self.base.cast::<u8>().add(self.guard + self.len).cast() }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; no child runs on it (the spawning thread waits
        // for the exec before it can drop the stack).
        unsafe { libc::munmap(self.base, self.len + self.guard) };
    }
}

/// Everything the child reads, prepared by the parent: the child may not allocate.
struct ChildContext {
    program: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
    /// NULL: stay in the parent's directory.
    dir: *const c_char,
    user: Option<(u32, u32)>,
    death_signal: c_int,
    /// Who the child's parent must be once its parent-death signal is set.
    parent: libc::pid_t,
    /// The child's ends of its stdin, stdout and stderr pipes (all above 2).
    stdio: [RawFd; 3],
    /// Written by the child when a step fails (then it exits): which step, and errno.
    step: AtomicI32,
    errno: AtomicI32,
}

const STEP_STDIO: i32 = 1;
const STEP_USER: i32 = 2;
const STEP_DIR: i32 = 3;
const STEP_GROUP: i32 = 4;
const STEP_DEATH_SIGNAL: i32 = 5;
const STEP_PARENT_GONE: i32 = 6;
const STEP_EXEC: i32 = 7;

/// Clones the child onto `stack`; returns its pid and pidfd once it has exec'd or exited.
fn clone_child(
    ctx: &ChildContext,
    stack: &mut Stack,
) -> io::Result<(libc::pid_t, Option<OwnedFd>)> {
    // Every signal blocked while the child runs in our memory: a handler of ours must never
    // run on its stack. The child unblocks them only after resetting their handlers.
    // SAFETY: sigset_t is plain data; pthread_sigmask(3) changes this thread's mask only.
    let old_mask = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        old
    };
    let flags = libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD;
    let arg = ptr::from_ref(ctx).cast_mut().cast::<c_void>();
    let mut pidfd: c_int = -1;
    // SAFETY: `child_main` only reads `ctx` (alive: this thread sleeps until the child has
    // exec'd or exited) and writes its atomics; it runs on `stack`, which nothing else uses,
    // and makes async-signal-safe calls only. CLONE_PIDFD writes the pidfd to `pidfd`.
    let mut pid = unsafe {
        libc::clone(
            child_main,
            stack.top(),
            flags | libc::CLONE_PIDFD,
            arg,
            &raw mut pidfd,
            ptr::null_mut::<c_void>(),
            ptr::null_mut::<libc::pid_t>(),
        )
    };
    let mut err = io::Error::last_os_error();
    if pid < 0 && err.raw_os_error() == Some(libc::EINVAL) {
        // A kernel before 5.2, without CLONE_PIDFD: the child is then waited for by polling.
        pidfd = -1;
        // SAFETY: as above, without the pidfd.
        pid = unsafe {
            libc::clone(
                child_main,
                stack.top(),
                flags,
                arg,
                ptr::null_mut::<libc::pid_t>(),
                ptr::null_mut::<c_void>(),
                ptr::null_mut::<libc::pid_t>(),
            )
        };
        err = io::Error::last_os_error();
    }
    // SAFETY: restores this thread's mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old_mask, ptr::null_mut()) };
    if pid < 0 {
        return Err(err);
    }
    // SAFETY: with CLONE_PIDFD the kernel opened this descriptor (close-on-exec) for us alone.
    let pidfd = (pidfd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(pidfd) });
    Ok((pid, pidfd))
}

/// The child, on its own stack in the parent's memory, until `execvpe`. Only
/// async-signal-safe calls, no allocation, no locks, no thread-local state but errno.
extern "C" fn child_main(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `ChildContext` the parent keeps alive until this child has
    // exec'd or exited (CLONE_VFORK).
    let ctx = unsafe { &*arg.cast::<ChildContext>() };
    // SAFETY: each call below is a system call (or glibc's thin wrapper of one) on this
    // child's own process state; every pointer passed was prepared by the parent and lives
    // until the exec.
    unsafe {
        for (target, fd) in (0..).zip(ctx.stdio) {
            // The parent made every `fd` > 2, so no dup2 overwrites another's source. The
            // pipes were made non-blocking, for the parent's ends: each end is its own open
            // file description, so clearing the flag here leaves the parent's ends as they are.
            if libc::dup2(fd, target) < 0 || libc::fcntl(target, libc::F_SETFL, 0) < 0 {
                child_failed(ctx, STEP_STDIO);
            }
        }
        if let Some((uid, gid)) = ctx.user {
            // Raw system calls: glibc's set*id wrappers signal every thread of the process
            // they believe they run in, which is the parent's.
            if libc::syscall(libc::SYS_setgroups, 0, ptr::null::<libc::gid_t>()) != 0
                && *libc::__errno_location() != libc::EPERM
            {
                child_failed(ctx, STEP_USER);
            }
            if libc::syscall(libc::SYS_setgid, gid) != 0
                || libc::syscall(libc::SYS_setuid, uid) != 0
            {
                child_failed(ctx, STEP_USER);
            }
        }
        if !ctx.dir.is_null() && libc::chdir(ctx.dir) != 0 {
            child_failed(ctx, STEP_DIR);
        }
        if libc::setpgid(0, 0) != 0 {
            child_failed(ctx, STEP_GROUP);
        }
        // Handlers are the parent's code: back to the default before signals are unblocked.
        // Ignored signals stay ignored, as across any exec, except SIGPIPE (std does the same).
        for signal in 1..=64 {
            if signal == libc::SIGKILL || signal == libc::SIGSTOP {
                continue;
            }
            let mut action: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, ptr::null(), &mut action) != 0 {
                continue;
            }
            let handled =
                action.sa_sigaction != libc::SIG_DFL && action.sa_sigaction != libc::SIG_IGN;
            if handled || (signal == libc::SIGPIPE && action.sa_sigaction != libc::SIG_DFL) {
                let mut default: libc::sigaction = std::mem::zeroed();
                default.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(signal, &default, ptr::null_mut());
            }
        }
        // After the uid change, which would clear it.
        if libc::prctl(libc::PR_SET_PDEATHSIG, ctx.death_signal, 0, 0, 0) != 0 {
            child_failed(ctx, STEP_DEATH_SIGNAL);
        }
        // The parent may have died before the signal was armed: nobody would kill us then.
        if libc::getppid() != ctx.parent {
            child_failed(ctx, STEP_PARENT_GONE);
        }
        // Marked, not closed: the child inherits only its stdio, whatever the parent has open.
        // Linux 5.11; before it, the parent's own close-on-exec flags are the only guard.
        let _ = libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        );
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::pthread_sigmask(libc::SIG_SETMASK, &empty, ptr::null_mut());
        libc::execvpe(ctx.program, ctx.argv, ctx.envp);
    }
    child_failed(ctx, STEP_EXEC)
}

/// Tells the parent which step failed, with errno, and ends the child.
fn child_failed(ctx: &ChildContext, step: i32) -> ! {
    // SAFETY: errno is this thread's (the parent's suspended thread's, whose TLS the child
    // shares): read right after the failed call.
    let errno = unsafe { *libc::__errno_location() };
    ctx.errno.store(errno, Ordering::Release);
    ctx.step.store(step, Ordering::Release);
    // SAFETY: _exit(2) ends the child at once, running nothing of the parent's.
    unsafe { libc::_exit(127) }
}

/// A close-on-exec, non-blocking pipe, both ends above stderr (so the child's dup2 onto 0, 1
/// and 2 never overwrites one of them). The child makes its ends blocking again.
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as c_int; 2];
    // SAFETY: pipe2(2) fills the two-element array it is given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned here alone.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((above_stderr(read)?, above_stderr(write)?))
}

/// `fd`, or a close-on-exec duplicate numbered above 2 if it is 0, 1 or 2 (a process started
/// with a standard stream closed gets those numbers back from `pipe2`).
fn above_stderr(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) makes a new descriptor; no memory is involved.
    let dup = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if dup < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just created, owned here alone.
    Ok(unsafe { OwnedFd::from_raw_fd(dup) })
}

#[cfg(test)]
mod tests;
