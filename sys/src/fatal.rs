//! A last word before a fatal signal ends the process: [`on_fatal_signal`] runs a hook once
//! when the process gets a signal that kills it without running any of its code (an abort, a
//! crash, systemd's watchdog SIGABRT, a SIGQUIT), then hands the signal on to what handled it
//! before (Rust's own stack-overflow report for SIGSEGV and SIGBUS), so the process still dies
//! of that signal, with its core dump and exit status.
//!
//! The hook runs inside a signal handler, on whichever thread took the signal, perhaps while
//! that thread was halfway through `malloc` or held a lock: it must be async-signal-safe. It
//! may take a lock with `try_lock` (and skip what it cannot take), read memory and write with
//! [`write_all_now`]; it must not allocate, format, wait for a lock or log.
//!
//! Pitfalls: the handler runs on the thread's alternate signal stack when it has one (Rust
//! gives its threads a small one, a few KiB), so the hook must not need much stack. SIGKILL and
//! SIGSTOP cannot be caught: what the hook would have saved is lost to them. A signal the
//! process ignores (`SIG_IGN`) is left alone, and so is one the process handles (SIGTERM,
//! SIGINT, SIGHUP, SIGCHLD: none of them is in the list).

#![expect(
    unsafe_code,
    reason = "sigaction(2), raise(3) and write(2) from a signal handler; pointers a handler reads"
)]

use std::{
    io,
    os::fd::{AsRawFd as _, BorrowedFd},
    sync::{
        Arc, OnceLock,
        atomic::{AtomicPtr, AtomicU8, AtomicUsize, Ordering},
    },
};

/// The signals whose default action ends the process at once and that a process of perago's
/// does not handle itself.
const SIGNALS: [libc::c_int; 8] = [
    libc::SIGABRT,
    libc::SIGBUS,
    libc::SIGFPE,
    libc::SIGILL,
    libc::SIGQUIT,
    libc::SIGSEGV,
    libc::SIGSYS,
    libc::SIGTRAP,
];

/// The hook; set once, read by the handler.
static HOOK: OnceLock<fn()> = OnceLock::new();

/// What each of [`SIGNALS`] did before the handler was installed.
static PREVIOUS: [OnceLock<Previous>; SIGNALS.len()] = [const { OnceLock::new() }; SIGNALS.len()];

/// The hook's progress: not run, running, done.
static STATE: AtomicU8 = AtomicU8::new(NOT_RUN);
const NOT_RUN: u8 = 0;
const RUNNING: u8 = 1;
const DONE: u8 = 2;

/// A `sigaction` as read back from the kernel.
struct Previous(libc::sigaction);

// SAFETY: a `sigaction` is plain data (a handler address, flags, a mask), read only by the
// handler after it is set once.
unsafe impl Sync for Previous {}
// SAFETY: as above.
unsafe impl Send for Previous {}

/// Runs `hook` once when a fatal signal arrives (see the module's note for what it may do),
/// then lets the signal do what it did before. Later calls change nothing: the first hook
/// stays. Errors come from `sigaction(2)`; signals installed before it stay installed.
pub fn on_fatal_signal(hook: fn()) -> io::Result<()> {
    if HOOK.set(hook).is_err() {
        return Ok(());
    }
    for (index, &signal) in SIGNALS.iter().enumerate() {
        // SAFETY: a zeroed `sigaction` is a valid one (SIG_DFL, no flags, empty mask), and
        // sigemptyset(3) initialises the mask we pass.
        let mut ours: libc::sigaction = unsafe { std::mem::zeroed() };
        ours.sa_sigaction = on_signal as extern "C" fn(_, _, _) as libc::sighandler_t;
        ours.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        // SAFETY: as above.
        unsafe { libc::sigemptyset(&raw mut ours.sa_mask) };
        // SAFETY: as above.
        let mut before: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: sigaction(2) reads `ours` and writes `before`; the handler it installs is
        // async-signal-safe (see `on_signal`).
        if unsafe { libc::sigaction(signal, &raw const ours, &raw mut before) } != 0 {
            return Err(io::Error::last_os_error());
        }
        if before.sa_sigaction == libc::SIG_IGN {
            // Ignored on purpose: it stays ignored.
            // SAFETY: puts back what sigaction(2) just gave us.
            unsafe { libc::sigaction(signal, &raw const before, std::ptr::null_mut()) };
            continue;
        }
        let _ = PREVIOUS[index].set(Previous(before));
    }
    Ok(())
}

/// Writes all of `bytes` to `fd` with write(2), retrying when interrupted and giving up on any
/// other error: made for a hook that runs in a signal handler (no allocation, no lock).
pub fn write_all_now(fd: BorrowedFd<'_>, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: write(2) reads `bytes.len()` bytes of a live slice from a descriptor the
        // caller holds open.
        let wrote = unsafe { libc::write(fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len()) };
        match usize::try_from(wrote) {
            Ok(0) => return,
            Ok(n) => bytes = &bytes[n.min(bytes.len())..],
            Err(_) if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

extern "C" fn on_signal(
    signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    // SAFETY: __errno_location(3) is this thread's errno; the hook's calls may change it, and
    // the code the signal interrupted may be about to read it.
    let errno = unsafe { *libc::__errno_location() };
    run_hook_once();
    put_back_every_action();
    hand_on(signal, info, context);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Runs the hook if no thread has; a thread that gets a fatal signal while another runs the
/// hook waits a little for it, so the process does not die halfway through it.
fn run_hook_once() {
    match STATE.compare_exchange(NOT_RUN, RUNNING, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {
            if let Some(hook) = HOOK.get() {
                hook();
            }
            STATE.store(DONE, Ordering::Release);
        }
        Err(_) => {
            for _ in 0..10_000 {
                if STATE.load(Ordering::Acquire) == DONE {
                    break;
                }
                // SAFETY: sched_yield(2) takes nothing.
                unsafe { libc::sched_yield() };
            }
        }
    }
}

/// Puts back what handled each fatal signal before this module: once the hook has run, there is
/// nothing left for these handlers to do. A signal the action handed on to raises (Rust's
/// stack-overflow report calls abort(3), so SIGABRT on top of SIGSEGV) then acts at once instead
/// of entering this handler again on the same alternate signal stack, whose 8 KiB two nested
/// signal frames (each with the CPU's whole register state) and the report can overflow — the
/// process would die of SIGSEGV instead of the abort.
fn put_back_every_action() {
    for (index, &signal) in SIGNALS.iter().enumerate() {
        if let Some(Previous(before)) = PREVIOUS[index].get() {
            // SAFETY: sigaction(2) reads the action the kernel gave us at install; it is
            // async-signal-safe.
            unsafe { libc::sigaction(signal, before, std::ptr::null_mut()) };
        }
    }
}

/// Lets what handled `signal` before act (a signal with none recorded gets its default action
/// back here; the others `put_back_every_action` has put back): a handler of its own is called
/// (Rust's stack-overflow report); a default action is raised again, to be delivered when this
/// handler returns (the signal is blocked until then), so the process dies of it even when the
/// signal was sent rather than caused by a fault.
fn hand_on(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    let previous = SIGNALS
        .iter()
        .position(|&s| s == signal)
        .and_then(|index| PREVIOUS[index].get());
    match previous {
        Some(Previous(before)) => {
            // `put_back_every_action` has made `before` the action again.
            let handler = before.sa_sigaction;
            if handler != libc::SIG_DFL && handler != libc::SIG_IGN {
                if before.sa_flags & libc::SA_SIGINFO != 0 {
                    // SAFETY: the kernel reported this address as a three-argument handler
                    // (SA_SIGINFO), which we call as the kernel would have.
                    let handler: extern "C" fn(
                        libc::c_int,
                        *mut libc::siginfo_t,
                        *mut libc::c_void,
                    ) = unsafe { std::mem::transmute(handler) };
                    handler(signal, info, context);
                } else {
                    // SAFETY: as above, a one-argument handler.
                    let handler: extern "C" fn(libc::c_int) =
                        unsafe { std::mem::transmute(handler) };
                    handler(signal);
                }
            }
        }
        None => {
            // SAFETY: a zeroed `sigaction` is SIG_DFL with no flags.
            let default: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: sigaction(2) reads `default`.
            unsafe { libc::sigaction(signal, &raw const default, std::ptr::null_mut()) };
        }
    }
    // SAFETY: sigaction(2) with no new action only reads the current one into `now`.
    let mut now: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::sigaction(signal, std::ptr::null(), &raw mut now) };
    if now.sa_sigaction == libc::SIG_DFL {
        // SAFETY: raise(3) is async-signal-safe.
        unsafe { libc::raise(signal) };
    }
}

/// A fixed set of shared values that a fatal-signal hook reads without a lock or an
/// allocation: [`SignalSafeSet::keep`] adds one for as long as the returned [`Membership`]
/// lives; [`SignalSafeSet::for_each`], made for the hook, visits those in it. A slot holds a
/// pointer from `Arc::into_raw`, or null.
pub struct SignalSafeSet<T, const N: usize> {
    slots: [AtomicPtr<T>; N],
    /// Visits under way: a membership that ends meanwhile waits for them before it lets its
    /// value go.
    visiting: AtomicUsize,
}

impl<T, const N: usize> SignalSafeSet<T, N> {
    /// An empty set (for a `static`).
    pub const fn new() -> Self {
        Self {
            slots: [const { AtomicPtr::new(std::ptr::null_mut()) }; N],
            visiting: AtomicUsize::new(0),
        }
    }
}

impl<T, const N: usize> std::fmt::Debug for SignalSafeSet<T, N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kept = self
            .slots
            .iter()
            .filter(|slot| !slot.load(Ordering::Relaxed).is_null())
            .count();
        f.debug_struct("SignalSafeSet")
            .field("kept", &kept)
            .field("slots", &N)
            .finish()
    }
}

impl<T, const N: usize> Default for SignalSafeSet<T, N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Send + Sync, const N: usize> SignalSafeSet<T, N> {
    /// Adds `value` until the membership is dropped; `None` when every slot is taken.
    pub fn keep(&'static self, value: &Arc<T>) -> Option<Membership<T, N>> {
        let raw = Arc::into_raw(Arc::clone(value)).cast_mut();
        for (slot, kept) in self.slots.iter().enumerate() {
            let free = std::ptr::null_mut();
            if kept
                .compare_exchange(free, raw, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                return Some(Membership { set: self, slot });
            }
        }
        // SAFETY: `raw` came from `Arc::into_raw` above and was stored nowhere.
        drop(unsafe { Arc::from_raw(raw) });
        None
    }

    /// Calls `visit` with each value in the set. Async-signal-safe when `visit` is: it takes
    /// no lock and allocates nothing. A membership of this set that ends meanwhile waits for
    /// the visit, so `visit` must not end one itself (it would wait for itself).
    pub fn for_each(&self, mut visit: impl FnMut(&T)) {
        self.visiting.fetch_add(1, Ordering::SeqCst);
        for slot in &self.slots {
            let value = slot.load(Ordering::SeqCst);
            if !value.is_null() {
                // SAFETY: a pointer in a slot is a live `Arc`'s: the membership that empties
                // the slot waits for this visit (counted above) before it lets the value go.
                visit(unsafe { &*value });
            }
        }
        self.visiting.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A value's place in a [`SignalSafeSet`]; dropped, the value leaves the set.
pub struct Membership<T: 'static, const N: usize> {
    set: &'static SignalSafeSet<T, N>,
    slot: usize,
}

impl<T, const N: usize> std::fmt::Debug for Membership<T, N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Membership")
            .field("slot", &self.slot)
            .finish()
    }
}

impl<T: 'static, const N: usize> Drop for Membership<T, N> {
    fn drop(&mut self) {
        let value = self.set.slots[self.slot].swap(std::ptr::null_mut(), Ordering::SeqCst);
        // A visit counted before the swap may have read the pointer: the value outlives it (one
        // counted after reads null). A visit is a signal handler's, which ends the process or
        // returns; this waits for nothing else.
        while self.set.visiting.load(Ordering::SeqCst) > 0 {
            std::thread::yield_now();
        }
        if !value.is_null() {
            // SAFETY: the slot held a pointer from `Arc::into_raw`, taken out once, by the
            // swap above, and no visit reads it any more.
            drop(unsafe { Arc::from_raw(value) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value is visited while its membership lives, and let go (the set's reference
    /// dropped) when it ends; a full set refuses and keeps no reference; a freed slot is used
    /// again.
    #[test]
    fn a_value_is_in_the_set_while_its_membership_lives() {
        static SET: SignalSafeSet<String, 3> = SignalSafeSet::new();
        let seen = || {
            let mut seen = Vec::new();
            SET.for_each(|value| seen.push(value.clone()));
            seen.sort();
            seen
        };
        let values: Vec<Arc<String>> = (0..4).map(|n| Arc::new(format!("v{n}"))).collect();
        let mut kept: Vec<_> = values[..3].iter().map(|v| SET.keep(v).unwrap()).collect();
        assert_eq!(seen(), ["v0", "v1", "v2"]);
        assert_eq!(
            Arc::strong_count(&values[1]),
            2,
            "the set holds a reference"
        );
        assert!(SET.keep(&values[3]).is_none(), "full");
        assert_eq!(
            Arc::strong_count(&values[3]),
            1,
            "a refused value is not held"
        );
        drop(kept.remove(1));
        assert_eq!(
            Arc::strong_count(&values[1]),
            1,
            "let go with its membership"
        );
        assert_eq!(seen(), ["v0", "v2"]);
        kept.push(SET.keep(&values[3]).expect("the freed slot"));
        assert_eq!(seen(), ["v0", "v2", "v3"]);
        drop(kept);
        assert!(seen().is_empty());
        assert!(values.iter().all(|v| Arc::strong_count(v) == 1));
    }

    /// A membership that ends while a visit is under way (a handler on another thread) does
    /// not let its value go before the visit is done: the value the visit holds stays alive.
    #[test]
    fn a_membership_ending_during_a_visit_waits_for_it() {
        use std::sync::atomic::AtomicBool;
        static SET: SignalSafeSet<String, 2> = SignalSafeSet::new();
        static VISITING: AtomicBool = AtomicBool::new(false);
        static DROPPING: AtomicBool = AtomicBool::new(false);
        static DROPPED: AtomicBool = AtomicBool::new(false);
        let value = Arc::new("kept".to_owned());
        let membership = SET.keep(&value).unwrap();
        drop(value);
        let dropper = std::thread::spawn(move || {
            while !VISITING.load(Ordering::SeqCst) {
                std::thread::yield_now();
            }
            DROPPING.store(true, Ordering::SeqCst);
            drop(membership);
            DROPPED.store(true, Ordering::SeqCst);
        });
        let mut visited = Vec::new();
        SET.for_each(|value| {
            VISITING.store(true, Ordering::SeqCst);
            while !DROPPING.load(Ordering::SeqCst) {
                std::thread::yield_now();
            }
            // Time for the other thread's drop to run to its end, were it not to wait.
            for _ in 0..10_000 {
                std::thread::yield_now();
                if DROPPED.load(Ordering::SeqCst) {
                    break;
                }
            }
            assert!(
                !DROPPED.load(Ordering::SeqCst),
                "the membership ended during the visit"
            );
            visited.push(value.clone());
        });
        dropper.join().unwrap();
        assert_eq!(visited, ["kept"]);
        assert!(DROPPED.load(Ordering::SeqCst));
        let mut left = 0;
        SET.for_each(|_| left += 1);
        assert_eq!(left, 0);
    }
}
