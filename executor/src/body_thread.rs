//! The thread a Rust body runs on: one per executor, started with its first Rust body, that runs
//! one call at a time for the executor's life.
//!
//! Why not tokio's blocking pool: handing a call to the pool and back cost an executor five
//! `futex` calls and a `gettid` per assignment (strace of an executor under load): the runtime
//! thread notified the pool's condition variable while holding its mutex, so the woken thread
//! blocked on the mutex at once and had to be woken a second time. Here a call is put in a slot
//! and the thread unparked: one wake, one wait. The result goes back through a oneshot, which
//! wakes the runtime as the pool's join handle did. The thread's id is known once, so the
//! slot's collection of what a body left running (`body_thread_id`) asks no system call.
//!
//! A call that never returns holds the thread, as it held a pool thread: the executor is then
//! poisoned and exits after the completion (see `AssignmentRunner::run_rust`), and a later call,
//! if one came, would wait behind it and time out in turn. When the handle is dropped (the
//! executor's runner goes, e.g. a thread-mode slot's executor ends), the thread exits once its
//! call, if any, returns.

use std::{
    collections::VecDeque,
    panic::{AssertUnwindSafe, catch_unwind},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::{self, Thread},
};
use tokio::sync::oneshot;

type Call = Box<dyn FnOnce() + Send>;

/// What a call ended with: its value, or the panic's payload.
pub(crate) type Outcome<T> = thread::Result<T>;

/// The calls waiting (at most one in practice) and whether the handle is gone.
struct Shared {
    calls: Mutex<VecDeque<Call>>,
    closed: AtomicBool,
}

/// The handle of the body thread; dropping it lets the thread end.
pub(crate) struct BodyThread {
    shared: Arc<Shared>,
    thread: Thread,
    tid: u32,
}

impl std::fmt::Debug for BodyThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BodyThread")
            .field("tid", &self.tid)
            .finish()
    }
}

impl BodyThread {
    /// Starts the thread (named `perago-body`) in the context of `runtime`, as the blocking
    /// pool's threads are: a body may call `tokio::runtime::Handle::current()` (and block on
    /// it), as it could when it ran there. What the body logs goes where the calling thread's
    /// lines go (in thread mode, its worker's own JSONL file, as the pool's threads did).
    pub(crate) fn start(runtime: tokio::runtime::Handle) -> std::io::Result<Self> {
        let log = tracing::dispatcher::get_default(tracing::Dispatch::clone);
        let shared = Arc::new(Shared {
            calls: Mutex::new(VecDeque::with_capacity(1)),
            closed: AtomicBool::new(false),
        });
        let (tid_tx, tid_rx) = std::sync::mpsc::sync_channel(1);
        let serving = Arc::clone(&shared);
        let handle = thread::Builder::new()
            .name("perago-body".to_owned())
            .spawn(move || {
                let _context = runtime.enter();
                let _log = tracing::dispatcher::set_default(&log);
                let _ = tid_tx.send(perago_sys::reaper::current_tid());
                serve(&serving);
            })?;
        let tid = tid_rx
            .recv()
            .map_err(|_| std::io::Error::other("the body thread ended before it started"))?;
        Ok(Self {
            shared,
            thread: handle.thread().clone(),
            tid,
        })
    }

    /// The thread's id (what a process the body starts has as its parent thread).
    pub(crate) fn tid(&self) -> u32 {
        self.tid
    }

    /// Runs `call` on the thread; its value (or the panic that ended it) arrives on the
    /// receiver. A receiver dropped before then (a timed-out call) loses nothing but the value.
    pub(crate) fn run<T: Send + 'static>(
        &self,
        call: impl FnOnce() -> T + Send + 'static,
    ) -> oneshot::Receiver<Outcome<T>> {
        let (tx, rx) = oneshot::channel();
        let call: Call = Box::new(move || {
            let _ = tx.send(catch_unwind(AssertUnwindSafe(call)));
        });
        self.shared
            .calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push_back(call);
        self.thread.unpark();
        rx
    }
}

impl Drop for BodyThread {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

/// The thread's loop: each call in turn, parked in between, until the handle is dropped.
fn serve(shared: &Shared) {
    loop {
        let next = shared
            .calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop_front();
        match next {
            // A panic is caught inside the call (and sent as its outcome).
            Some(call) => call(),
            None if shared.closed.load(Ordering::Acquire) => return,
            // A spurious wake-up only goes round again.
            None => thread::park(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn calls_run_in_turn_on_one_thread_and_a_panic_is_their_outcome() {
        let body = BodyThread::start(tokio::runtime::Handle::current()).unwrap();
        let mut tids = Vec::new();
        for n in 0..100u32 {
            let value = body
                .run(move || (n * 2, perago_sys::reaper::current_tid()))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(value.0, n * 2);
            tids.push(value.1);
        }
        assert!(tids.iter().all(|&t| t == body.tid()), "{tids:?}");
        assert_ne!(body.tid(), perago_sys::reaper::current_tid());
        let panicked = body.run(|| -> u32 { panic!("boom") }).await.unwrap();
        let payload = panicked.unwrap_err();
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"boom"));
        // The thread outlives a panicking call.
        assert_eq!(body.run(|| 7).await.unwrap().unwrap(), 7);
    }

    #[tokio::test]
    async fn a_call_behind_one_that_overruns_waits_for_it() {
        let body = BodyThread::start(tokio::runtime::Handle::current()).unwrap();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let stuck = body.run(move || release_rx.recv().is_ok());
        let behind = body.run(|| 1);
        let waited = tokio::time::timeout(Duration::from_millis(50), behind).await;
        assert!(waited.is_err(), "the second call ran beside the first");
        drop(stuck);
        release_tx.send(()).unwrap();
        // A dropped receiver (a timed-out call) does not stop the next call.
        assert_eq!(body.run(|| 2).await.unwrap().unwrap(), 2);
    }

    #[tokio::test]
    async fn a_body_can_block_on_the_runtime_as_on_the_blocking_pool() {
        let body = BodyThread::start(tokio::runtime::Handle::current()).unwrap();
        let value = body
            .run(|| {
                let handle = tokio::runtime::Handle::current();
                handle.block_on(async {
                    tokio::task::yield_now().await;
                    5
                })
            })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(value, 5);
    }

    /// In thread mode each worker's lines go to its own file through a dispatcher that is its
    /// threads' default, not the process's: the body thread takes the starting thread's.
    #[tokio::test]
    async fn a_body_logs_where_the_thread_that_started_it_logs() {
        let root = tempfile::tempdir().unwrap();
        let config = perago_core::logging::JsonlConfig::from_lookup(
            root.path().to_owned(),
            "test.task",
            "testtask0001",
            |_| None,
        )
        .unwrap();
        let dispatch = perago_core::logging::worker_dispatch(&config).unwrap();
        let body = {
            let _default = tracing::dispatcher::set_default(&dispatch);
            BodyThread::start(tokio::runtime::Handle::current()).unwrap()
        };
        // Logged on the body thread after this thread's default is gone again.
        body.run(|| tracing::warn!("a line from the body"))
            .await
            .unwrap()
            .unwrap();
        let file = config.dir().join("perago.jsonl");
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        assert!(text.contains("a line from the body"), "{file:?}: {text:?}");
    }

    #[test]
    fn the_thread_ends_when_the_handle_is_dropped() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let body = BodyThread::start(runtime.handle().clone()).unwrap();
        let tid = body.tid();
        let task = format!("/proc/self/task/{tid}");
        assert!(std::path::Path::new(&task).exists());
        drop(body);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::path::Path::new(&task).exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "the body thread still runs"
            );
            thread::sleep(Duration::from_millis(5));
        }
    }
}
