//! The child's side of [`Spawn`](super::Spawn): `clone(CLONE_VM | CLONE_VFORK)` onto a stack
//! of its own, the steps before `exec`, and `execvpe`.
//!
//! What the child does, in std's order (after joining its memory cgroup, if it has one):
//! stdio (three pipes), `setgroups`/`setgid`/`setuid`
//! (raw system calls: glibc's wrappers would signal every thread of the parent, whose memory
//! the child shares), `chdir`, `setpgid(0, 0)`, caught signals back to their default action
//! and SIGPIPE too, the parent-death signal (after the uid change, which clears it) and a
//! check that the parent is still the one that spawned it, every descriptor above stderr
//! marked close-on-exec, an empty signal mask, then `execvpe` (which, like std, runs a script
//! without a `#!` line through `/bin/sh`).
//!
//! Hazards, beyond memory safety:
//!
//! - Between `clone` and `exec` the child runs in the parent's address space while the parent's
//!   other threads go on: it may only make async-signal-safe calls. It takes no lock (another
//!   thread may hold malloc's or stdio's), allocates nothing, and touches no thread-local state
//!   but errno (it shares the suspended spawning thread's TLS). Every step is a system call or
//!   glibc's thin wrapper of one; the set*id calls are raw system calls for the reason above.
//! - `execvpe` is a GNU extension, not POSIX, and POSIX lists only `execl`, `execle`, `execv`
//!   and `execve` of the exec family as async-signal-safe. That `execvpe` may run here is a
//!   property of glibc's implementation: it builds each candidate path of the `PATH` search, and
//!   the argv of its `/bin/sh` fallback for a script without `#!`, on the caller's stack, with
//!   no malloc and no lock (hence [`stack_size`]'s headroom). Another libc would need checking,
//!   or a `PATH` search of our own prepared before the clone and a plain `execve`.
//! - Sharing memory with a vfork child is what `posix_spawn` does in glibc, and it relies on the
//!   same property: the parent's thread is suspended until the child execs or exits, so nothing
//!   the child reads ([`ChildContext`], on that thread's frame) can change or be freed under
//!   it. The spawning thread blocks every signal across the clone, so the child starts with
//!   them all blocked and unblocks them only once it has reset the handlers: no handler of the
//!   parent ever runs on the child's stack.

use std::{
    cell::RefCell,
    ffi::{CString, c_char, c_int, c_void},
    io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd},
    ptr,
    sync::atomic::{AtomicI32, Ordering},
};

thread_local! {
    /// The child stack of spawns from this thread, kept for the next one: the calling thread
    /// sleeps until the child has exec'd, so one stack per thread is never used twice at once.
    pub(super) static STACK: RefCell<Option<Stack>> = const { RefCell::new(None) };
}

/// `argv` and `envp` as the NULL-terminated pointer arrays `execvpe` takes.
pub(super) fn pointers(strings: &[CString]) -> Vec<*const c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(ptr::null()))
        .collect()
}

/// Enough for the child's own frames, and for glibc's `/bin/sh` fallback, which copies argv
/// onto the stack.
pub(super) fn stack_size(argv: &[*const c_char]) -> usize {
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
pub(super) struct Stack {
    base: *mut c_void,
    /// Usable bytes, above the guard page.
    pub(super) len: usize,
    guard: usize,
}

impl Stack {
    pub(super) fn new(len: usize) -> io::Result<Self> {
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
pub(super) struct ChildContext {
    pub(super) program: *const c_char,
    pub(super) argv: *const *const c_char,
    pub(super) envp: *const *const c_char,
    /// NULL: stay in the parent's directory.
    pub(super) dir: *const c_char,
    pub(super) user: Option<(u32, u32)>,
    pub(super) death_signal: c_int,
    /// `cgroup.procs` of the cgroup to join first (-1: none).
    pub(super) cgroup_procs: RawFd,
    /// Who the child's parent must be once its parent-death signal is set.
    pub(super) parent: libc::pid_t,
    /// The child's ends of its stdin, stdout and stderr pipes (all above 2).
    pub(super) stdio: [RawFd; 3],
    /// Written by the child when a step fails (then it exits): which step, and errno.
    pub(super) step: AtomicI32,
    pub(super) errno: AtomicI32,
}

const STEP_STDIO: i32 = 1;
const STEP_USER: i32 = 2;
const STEP_DIR: i32 = 3;
const STEP_GROUP: i32 = 4;
const STEP_DEATH_SIGNAL: i32 = 5;
pub(super) const STEP_PARENT_GONE: i32 = 6;
const STEP_EXEC: i32 = 7;
pub(super) const STEP_CGROUP: i32 = 8;

/// Clones the child onto `stack`; returns its pid and pidfd once it has exec'd or exited.
pub(super) fn clone_child(
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
        // First: nothing of the body may run outside its memory cgroup. `0` is the writer
        // itself (this child: no CLONE_THREAD), in v1 and v2 alike.
        if ctx.cgroup_procs >= 0 && libc::write(ctx.cgroup_procs, b"0".as_ptr().cast(), 1) != 1 {
            child_failed(ctx, STEP_CGROUP);
        }
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
pub(super) fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
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
