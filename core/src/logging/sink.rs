//! Where a worker's lines go (stderr, its JSONL file), and when.
//!
//! A line is written at once, with one system call of its own, unless the thread that logs it
//! *holds* lines: a broker's or an executor's runtime thread while it has work to run (see
//! [`hold_lines`]). Such a thread adds its lines to the output's buffer and writes each buffer
//! it filled in one system call when it goes idle, just before its runtime parks
//! ([`flush_held`], installed as the runtime's `on_thread_park`), and when it stops holding.
//! A warning or an error, a line from any other thread (a Rust body on the blocking pool, say)
//! and a buffer past [`HOLD_AT_MOST`] go out at once, after what the buffer held.
//!
//! What this costs: a process killed by SIGKILL loses the lines it logged since its runtime
//! last went idle, at most [`HOLD_AT_MOST`] bytes per output and never a warning or an error.
//! A process that ends any other way writes them first: its drain, an error, a panic that
//! unwinds through `block_on`, and a fatal signal (an abort, a crash, SIGQUIT, systemd's
//! watchdog SIGABRT), whose handler ([`flush_on_fatal_signal`]) writes every output it can
//! take without waiting, before the signal ends the process as it would have. An output another
//! thread was writing at that instant is skipped (that thread was writing its lines anyway). A
//! runtime under steady load goes idle between its wake-ups, so held lines reach the file
//! within the same wake-up that logged them.

use super::file::RotatingFile;
use perago_sys::fatal::{Membership, SignalSafeSet};
use std::{
    cell::{Cell, RefCell},
    io::{self, Write as _},
    os::fd::{AsFd as _, BorrowedFd},
    sync::{Arc, Mutex, OnceLock, PoisonError, TryLockError},
};

/// The most one output holds: past it, the buffer is written at once.
pub const HOLD_AT_MOST: usize = 64 * 1024;

/// One output of log lines.
#[derive(Debug)]
pub(crate) enum Output {
    /// The process's standard error.
    Stderr,
    /// A worker's JSONL file.
    File(RotatingFile),
    /// Lines kept in memory (tests).
    #[cfg(test)]
    Memory(Vec<Vec<u8>>),
}

impl Output {
    /// Writes `count` whole lines. Standard error takes them as they come (an error there has
    /// nowhere to be said); the file drops and counts what it cannot write.
    fn write(&mut self, lines: &[u8], count: u64) {
        match self {
            Self::Stderr => {
                let _ = io::stderr().lock().write_all(lines);
            }
            Self::File(file) => file.write_lines_or_drop(lines, count),
            #[cfg(test)]
            Self::Memory(writes) => writes.push(lines.to_vec()),
        }
    }

    /// Writes `lines` from a signal handler: to the descriptor itself, no lock, no rotation.
    fn write_now(&self, lines: &[u8]) {
        let write = |fd: BorrowedFd<'_>| perago_sys::fatal::write_all_now(fd, lines);
        match self {
            Self::Stderr => write(io::stderr().as_fd()),
            Self::File(file) => write(file.as_fd()),
            #[cfg(test)]
            Self::Memory(_) => {}
        }
    }
}

#[derive(Debug)]
struct State {
    held: Vec<u8>,
    /// Lines in `held`.
    count: u64,
    out: Output,
}

impl State {
    fn flush(&mut self) {
        if self.count > 0 {
            self.out.write(&self.held, self.count);
            self.held.clear();
            self.count = 0;
            // A burst's buffer is not kept for good.
            if self.held.capacity() > HOLD_AT_MOST {
                self.held.shrink_to(HOLD_AT_MOST);
            }
        }
    }
}

/// An output with the lines held for it.
#[derive(Debug)]
pub(crate) struct LineBuffer {
    state: Mutex<State>,
}

thread_local! {
    /// Whether this thread holds its lines ([`hold_lines`]).
    static HOLDING: Cell<bool> = const { Cell::new(false) };
    /// The buffers this thread has added held lines to since it last flushed them.
    static HELD: RefCell<Vec<Arc<LineBuffer>>> = const { RefCell::new(Vec::new()) };
}

impl LineBuffer {
    pub(crate) fn new(out: Output) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                held: Vec::new(),
                count: 0,
                out,
            }),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while writing leaves nothing half-done that matters here.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds one whole line (ending in `\n`): held if this thread holds lines and the line is
    /// not `urgent`, else written at once, after whatever was held.
    pub(crate) fn push(self: &Arc<Self>, line: &[u8], urgent: bool) {
        let hold = !urgent && HOLDING.get();
        let mut state = self.state();
        if !hold && state.count == 0 {
            state.out.write(line, 1);
            return;
        }
        state.held.extend_from_slice(line);
        state.count += 1;
        if !hold || state.held.len() >= HOLD_AT_MOST {
            state.flush();
            return;
        }
        drop(state);
        // try_with: a thread being torn down writes its lines at once instead.
        let registered = HELD.try_with(|held| {
            let mut held = held.borrow_mut();
            if !held.iter().any(|b| Arc::ptr_eq(b, self)) {
                held.push(Arc::clone(self));
            }
        });
        if registered.is_err() {
            self.flush();
        }
    }

    /// Writes what is held.
    pub(crate) fn flush(&self) {
        self.state().flush();
    }

    /// What the output has been given (tests).
    #[cfg(test)]
    pub(crate) fn written(&self) -> Vec<Vec<u8>> {
        match &self.state().out {
            Output::Memory(writes) => writes.clone(),
            _ => Vec::new(),
        }
    }
}

/// The outputs a fatal signal can write: past them, a buffer is not kept (said once on
/// stderr), and loses on a fatal signal what it would on a SIGKILL.
const KEPT_AT_MOST: usize = 1024;

/// The outputs a fatal signal writes: the process's stderr and every worker's file, each for
/// as long as its [`Kept`] lives (a process keeps its worker's file for its life; thread
/// mode's workers come and go).
static KEPT_FOR_FATAL: SignalSafeSet<LineBuffer, KEPT_AT_MOST> = SignalSafeSet::new();

/// An output registered with [`keep_for_fatal_signal`]: dropped, the output is no longer
/// written on a fatal signal.
pub(crate) type Kept = Membership<LineBuffer, KEPT_AT_MOST>;

/// Has a fatal signal write what `buffer` holds ([`flush_on_fatal_signal`]) while the
/// returned guard lives, and installs that handler if it is not yet. `None` when every slot
/// is taken, said once on stderr, as is a handler that cannot be installed: both only lose
/// what a SIGKILL would.
pub(crate) fn keep_for_fatal_signal(buffer: &Arc<LineBuffer>) -> Option<Kept> {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        if let Err(error) = perago_sys::fatal::on_fatal_signal(flush_on_fatal_signal) {
            eprintln!(
                "perago: cannot install the handler that writes held log lines on a fatal \
                 signal: {}",
                crate::errors::DisplayChain(&error)
            );
        }
    });
    let kept = KEPT_FOR_FATAL.keep(buffer);
    if kept.is_none() {
        static SAID: OnceLock<()> = OnceLock::new();
        SAID.get_or_init(|| {
            eprintln!(
                "perago: more than {KEPT_AT_MOST} log outputs; the lines held for the others \
                 are not written on a fatal signal"
            );
        });
    }
    kept
}

/// Writes what every kept output holds, each with one write(2) and no rotation, skipping an
/// output whose lock another thread holds. Runs inside a signal handler: no allocation, no
/// waiting (see `perago_sys::fatal`).
pub(crate) fn flush_on_fatal_signal() {
    KEPT_FOR_FATAL.for_each(|buffer| {
        let mut state = match buffer.state.try_lock() {
            Ok(state) => state,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        if state.count > 0 {
            state.out.write_now(&state.held);
            // Written once, whatever comes next (clear frees nothing).
            state.held.clear();
            state.count = 0;
        }
    });
}

/// Writes the lines this thread holds, each buffer in one system call. A runtime thread that
/// holds lines calls it just before it parks (`on_thread_park`); elsewhere it does nothing.
pub fn flush_held() {
    let held = HELD.try_with(|held| std::mem::take(&mut *held.borrow_mut()));
    for buffer in held.unwrap_or_default() {
        buffer.flush();
    }
}

/// While this guard lives, the lines this thread logs are held until [`flush_held`] (or the
/// guard's end) writes them. Made for the thread that runs a worker's runtime (`block_on`),
/// whose runtime calls [`flush_held`] before it parks.
#[must_use = "lines are held only while the guard lives"]
#[derive(Debug)]
pub struct Holding {
    was: bool,
}

/// Holds this thread's lines until it goes idle; see [`Holding`].
pub fn hold_lines() -> Holding {
    Holding {
        was: HOLDING.replace(true),
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        HOLDING.set(self.was);
        flush_held();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory() -> Arc<LineBuffer> {
        LineBuffer::new(Output::Memory(Vec::new()))
    }

    #[test]
    fn a_thread_that_does_not_hold_writes_each_line_at_once() {
        let out = memory();
        out.push(b"a\n", false);
        out.push(b"b\n", false);
        assert_eq!(out.written(), [b"a\n".to_vec(), b"b\n".to_vec()]);
    }

    #[test]
    fn held_lines_go_out_together_when_the_thread_goes_idle() {
        let (out, err) = (memory(), memory());
        let holding = hold_lines();
        out.push(b"a\n", false);
        err.push(b"x\n", false);
        out.push(b"b\n", false);
        assert!(out.written().is_empty(), "held");
        flush_held();
        assert_eq!(out.written(), [b"a\nb\n".to_vec()], "one write");
        assert_eq!(err.written(), [b"x\n".to_vec()]);
        // Nothing held: nothing more is written.
        flush_held();
        assert_eq!(out.written().len(), 1);
        out.push(b"c\n", false);
        drop(holding);
        assert_eq!(
            out.written()[1],
            b"c\n",
            "the guard's end writes what is held"
        );
        out.push(b"d\n", false);
        assert_eq!(out.written()[2], b"d\n", "and lines are no longer held");
    }

    #[test]
    fn an_urgent_line_goes_out_at_once_after_what_was_held() {
        let out = memory();
        let _holding = hold_lines();
        out.push(b"info\n", false);
        out.push(b"warn\n", true);
        assert_eq!(out.written(), [b"info\nwarn\n".to_vec()]);
        flush_held();
        assert_eq!(out.written().len(), 1);
    }

    #[test]
    fn another_threads_line_goes_out_at_once_after_what_was_held() {
        let out = memory();
        let _holding = hold_lines();
        out.push(b"held\n", false);
        let other = Arc::clone(&out);
        std::thread::spawn(move || other.push(b"from a blocking thread\n", false))
            .join()
            .unwrap();
        assert_eq!(out.written(), [b"held\nfrom a blocking thread\n".to_vec()]);
    }

    #[test]
    fn a_buffer_past_its_bound_is_written_at_once() {
        let out = memory();
        let _holding = hold_lines();
        let line = [b'x'; 1023]
            .iter()
            .copied()
            .chain([b'\n'])
            .collect::<Vec<u8>>();
        for _ in 1..HOLD_AT_MOST / line.len() {
            out.push(&line, false);
        }
        assert!(out.written().is_empty());
        out.push(&line, false);
        let written = out.written();
        assert_eq!(written.len(), 1);
        assert_eq!(written[0].len(), HOLD_AT_MOST);
    }

    #[test]
    fn guards_nest() {
        let out = memory();
        let outer = hold_lines();
        {
            let _inner = hold_lines();
        }
        out.push(b"still held\n", false);
        assert!(out.written().is_empty());
        drop(outer);
        assert_eq!(out.written(), [b"still held\n".to_vec()]);
    }
}
