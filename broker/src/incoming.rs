//! The broker socket's accept loop, hardened against connection floods. Anyone who can reach
//! the socket can open connections; without bounds a few thousand idle ones exhausted the
//! broker's descriptors (then `status`, executors and even the Conductor client could not get
//! one) and the accept loop spun on EMFILE.
//!
//! - At most [`Limits::connections`] connections are open at once; past that the loop stops
//!   accepting (the kernel's backlog holds the rest) until one closes.
//! - A connection that has not made its first request is *waiting*. At most
//!   [`Limits::waiting`] are kept: a newer connection evicts the oldest waiting one, so a flood
//!   of idle connections keeps recycling a small share of the table and a real client (which
//!   asks at once) still gets in. A waiting connection is also closed after
//!   [`Limits::first_request_within`].
//! - EMFILE/ENFILE (and ENOBUFS/ENOMEM) back off 10 ms → 1 s instead of spinning, evicting
//!   the oldest waiting connection to give a descriptor back.
//! - `perago_sys::rlimit::raise_nofile_limit` lifts the soft descriptor limit to the hard one at start, and the
//!   connection bound leaves at least half the table (and 64 descriptors) to everything else:
//!   the Conductor client, the metrics listener, logs.
//!
//! A connection's first request is noticed by [`mark_request`], which the server calls for
//! every request (its `trace_fn`) with the connection's [`ConnInfo`] in the extensions.

use perago_sys::socket::QuietUnixStream;
use std::{
    collections::VecDeque,
    io,
    pin::Pin,
    sync::{
        Arc, Mutex, Weak,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    task::{Context, Poll, Waker},
    time::Duration,
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::UnixListener,
    sync::{OwnedSemaphorePermit, Semaphore, mpsc},
};
use tokio_stream::wrappers::ReceiverStream;

/// Descriptors kept for everything but the socket's connections, at the least.
const RESERVED_DESCRIPTORS: u64 = 64;
/// Never more connections than this, however many descriptors there are.
const MAX_CONNECTIONS: u64 = 1024;

/// The bounds of the accept loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Connections open at once.
    pub(crate) connections: usize,
    /// Connections that have not made a request yet, kept at once.
    pub(crate) waiting: usize,
    /// How long a connection may stay without a request.
    pub(crate) first_request_within: Duration,
}

impl Limits {
    /// The bounds for a descriptor limit of `nofile` and `slots` executors (each holds a
    /// connection for its life, and there is room for all of them and a few more). A
    /// connection holds two descriptors (see `perago_sys::socket::QuietUnixStream`): half of
    /// what is not reserved.
    pub(crate) fn for_descriptors(nofile: u64, slots: u32) -> Self {
        let share = (nofile.saturating_sub(RESERVED_DESCRIPTORS) / 2).min(MAX_CONNECTIONS);
        let connections = share.max(u64::from(slots) + 16);
        let connections = usize::try_from(connections).unwrap_or(usize::MAX);
        Self {
            connections,
            waiting: (connections / 4).max(4),
            first_request_within: Duration::from_secs(10),
        }
    }
}

/// One accepted connection's state, shared with the registry and the server's requests.
#[derive(Debug, Default)]
struct ConnState {
    requested: AtomicBool,
    evicted: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl ConnState {
    fn evict(&self) {
        self.evicted.store(true, Ordering::Release);
        if let Some(waker) = self.waker.lock().expect("not poisoned").take() {
            waker.wake();
        }
    }
}

/// The connections that have not made a request yet, oldest first.
#[derive(Debug, Default)]
struct Registry {
    queue: Mutex<VecDeque<Weak<ConnState>>>,
    waiting: AtomicUsize,
}

impl Registry {
    fn push(&self, state: &Arc<ConnState>) {
        self.waiting.fetch_add(1, Ordering::AcqRel);
        let mut queue = self.queue.lock().expect("not poisoned");
        queue.push_back(Arc::downgrade(state));
        // Entries of connections that asked or closed are dropped lazily; keep it short.
        if queue.len() > 2 * MAX_CONNECTIONS as usize {
            queue.retain(|w| {
                w.upgrade()
                    .is_some_and(|s| !s.requested.load(Ordering::Acquire))
            });
        }
    }

    /// Evicts the oldest connection still waiting; false if there is none.
    fn evict_oldest(&self) -> bool {
        let mut queue = self.queue.lock().expect("not poisoned");
        while let Some(weak) = queue.pop_front() {
            if let Some(state) = weak.upgrade()
                && !state.requested.load(Ordering::Acquire)
                && !state.evicted.load(Ordering::Acquire)
            {
                state.evict();
                return true;
            }
        }
        false
    }

    /// A waiting connection asked or closed.
    fn left(&self) {
        self.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What the server puts in each request's extensions: which connection it came on.
#[derive(Debug, Clone)]
pub(crate) struct ConnInfo(Arc<Shared>);

#[derive(Debug)]
struct Shared {
    state: Arc<ConnState>,
    registry: Arc<Registry>,
    /// The pid of the process that connected (`SO_PEERCRED`).
    peer_pid: Option<i32>,
}

impl ConnInfo {
    /// The pid of the process that opened the connection, if the kernel said.
    pub(crate) fn peer_pid(&self) -> Option<i32> {
        self.0.peer_pid
    }
}

/// Called for every request (the server's `trace_fn`): the connection is no longer waiting.
pub(crate) fn mark_request(request: &tonic::codegen::http::Request<()>) -> tracing::Span {
    if let Some(ConnInfo(shared)) = request.extensions().get::<ConnInfo>()
        && !shared.state.requested.swap(true, Ordering::AcqRel)
        && !shared.state.evicted.load(Ordering::Acquire)
    {
        shared.registry.left();
    }
    tracing::Span::none()
}

/// An accepted connection: closed (reads fail) once evicted or past its first-request
/// deadline while it has made no request; holds its place in the connection bound.
#[derive(Debug)]
pub(crate) struct Conn {
    stream: QuietUnixStream,
    shared: Arc<Shared>,
    deadline: Pin<Box<tokio::time::Sleep>>,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Conn {
    fn drop(&mut self) {
        let state = &self.shared.state;
        if !state.requested.swap(true, Ordering::AcqRel) && !state.evicted.load(Ordering::Acquire) {
            self.shared.registry.left();
        }
    }
}

impl Conn {
    fn check_waiting(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        let state = &self.shared.state;
        if state.requested.load(Ordering::Acquire) {
            return Ok(());
        }
        if state.evicted.load(Ordering::Acquire) {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "closed: newer connections were waiting for their first request",
            ));
        }
        *state.waker.lock().expect("not poisoned") = Some(cx.waker().clone());
        if self.deadline.as_mut().poll(cx).is_ready() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "closed: no request in time",
            ));
        }
        Ok(())
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Err(e) = self.check_waiting(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        ConnInfo(Arc::clone(&self.shared))
    }
}

/// Whether an accept error means "out of descriptors or memory" (back off and free some).
fn out_of_resources(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// Accepts on `listener` within `limits`; the stream ends (and the listener closes) when
/// the server drops it.
pub(crate) fn incoming(listener: UnixListener, limits: Limits) -> ReceiverStream<io::Result<Conn>> {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(accept_loop(listener, limits, tx));
    ReceiverStream::new(rx)
}

async fn accept_loop(listener: UnixListener, limits: Limits, tx: mpsc::Sender<io::Result<Conn>>) {
    let bound = Arc::new(Semaphore::new(limits.connections));
    let registry = Arc::new(Registry::default());
    let mut backoff = Duration::ZERO;
    let mut full_logged = false;
    loop {
        // A place in the bound first: when the table is full, make room by closing the
        // oldest idle connection, else wait for one to close.
        let permit = match Arc::clone(&bound).try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                let evicted = registry.evict_oldest();
                if !full_logged {
                    tracing::warn!(
                        connections = limits.connections,
                        evicted_idle = evicted,
                        "the broker socket is at its connection bound; new connections wait"
                    );
                    full_logged = true;
                }
                tokio::select! {
                    permit = Arc::clone(&bound).acquire_owned() => permit.expect("never closed"),
                    () = tx.closed() => return,
                }
            }
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = tx.closed() => return,
        };
        // Taken over registered for reading only (`perago_sys::socket`: an executor's read of
        // an assignment does not wake the broker), with the descriptor that takes.
        let accepted = accepted.and_then(|(stream, _)| {
            let peer_pid = stream.peer_cred().ok().and_then(|c| c.pid());
            Ok((QuietUnixStream::from_tokio(stream)?, peer_pid))
        });
        let (stream, peer_pid) = match accepted {
            Ok(accepted) => accepted,
            Err(e) if out_of_resources(&e) => {
                drop(permit);
                registry.evict_oldest();
                backoff = (backoff * 2).clamp(Duration::from_millis(10), Duration::from_secs(1));
                if backoff == Duration::from_millis(10) {
                    tracing::warn!(error = %perago_core::errors::DisplayChain(&e), "cannot accept on the broker socket; backing off");
                }
                tokio::time::sleep(backoff).await;
                continue;
            }
            Err(e) => {
                // The peer left before we accepted (ECONNABORTED…): nothing to do.
                tracing::debug!(error = %perago_core::errors::DisplayChain(&e), "accept failed");
                continue;
            }
        };
        backoff = Duration::ZERO;
        if bound.available_permits() > limits.connections / 2 {
            full_logged = false;
        }
        if registry.waiting.load(Ordering::Acquire) >= limits.waiting {
            registry.evict_oldest();
        }
        let state = Arc::new(ConnState::default());
        registry.push(&state);
        let conn = Conn {
            stream,
            shared: Arc::new(Shared {
                state,
                registry: Arc::clone(&registry),
                peer_pid,
            }),
            deadline: Box::pin(tokio::time::sleep(limits.first_request_within)),
            _permit: permit,
        };
        if tx.send(Ok(conn)).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::UnixStream;
    use tokio_stream::StreamExt as _;
    use tonic::transport::server::Connected as _;

    #[test]
    fn the_bound_leaves_descriptors_to_the_rest() {
        let l = Limits::for_descriptors(1024, 4);
        assert_eq!((l.connections, l.waiting), (480, 120));
        assert_eq!(Limits::for_descriptors(1_048_576, 4).connections, 1024);
        // Room for every executor, however low the limit.
        assert_eq!(Limits::for_descriptors(64, 40).connections, 56);
        assert_eq!(Limits::for_descriptors(0, 1).waiting, 4);
    }

    /// Idle connections beyond the waiting share are closed oldest first; one that asked
    /// stays.
    #[tokio::test]
    async fn idle_connections_are_evicted_oldest_first() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("s.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let limits = Limits {
            connections: 8,
            waiting: 4,
            first_request_within: Duration::from_secs(60),
        };
        let mut conns = incoming(listener, limits);
        let mut clients = Vec::new();
        let mut served = Vec::new();
        for _ in 0..6 {
            clients.push(UnixStream::connect(&path).await.unwrap());
            served.push(conns.next().await.unwrap().unwrap());
        }
        // Connections 0 and 1 were evicted when 4 and 5 arrived: reading them fails.
        for (i, conn) in served.iter_mut().enumerate() {
            let mut byte = [0u8; 1];
            let read = tokio::time::timeout(Duration::from_millis(50), conn.read(&mut byte)).await;
            match i {
                0 | 1 => assert!(matches!(read, Ok(Err(_))), "{i}: {read:?}"),
                _ => assert!(read.is_err(), "{i} still open: {read:?}"),
            }
        }
        drop(served.drain(..2));
        // One that made a request is never evicted, however many arrive after it.
        let asked = &served[0];
        mark_request(&{
            let mut r = tonic::codegen::http::Request::new(());
            r.extensions_mut().insert(asked.connect_info());
            r
        });
        for _ in 0..4 {
            clients.push(UnixStream::connect(&path).await.unwrap());
            served.push(conns.next().await.unwrap().unwrap());
        }
        clients[2].write_all(b"x").await.unwrap();
        let mut byte = [0u8; 1];
        served[0].read_exact(&mut byte).await.unwrap();
        assert_eq!(&byte, b"x");
    }

    /// Past the bound, nothing more is accepted until a connection closes.
    #[tokio::test]
    async fn the_bound_holds_and_frees() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("s.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let limits = Limits {
            connections: 2,
            waiting: 4,
            first_request_within: Duration::from_secs(60),
        };
        let mut conns = incoming(listener, limits);
        let _c1 = UnixStream::connect(&path).await.unwrap();
        let first = conns.next().await.unwrap().unwrap();
        mark_request(&{
            let mut r = tonic::codegen::http::Request::new(());
            r.extensions_mut().insert(first.connect_info());
            r
        });
        let _c2 = UnixStream::connect(&path).await.unwrap();
        let mut second = conns.next().await.unwrap().unwrap();
        // The table is full: the idle second is evicted to make room, and once it is gone
        // (as the server drops a connection whose read failed) the third is accepted.
        let _c3 = UnixStream::connect(&path).await.unwrap();
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(5), second.read(&mut byte)).await;
        assert!(matches!(read, Ok(Err(_))), "{read:?}");
        drop(second);
        let third = tokio::time::timeout(Duration::from_secs(5), conns.next())
            .await
            .expect("room was made by evicting the idle one")
            .unwrap()
            .unwrap();
        drop((first, third));
    }

    /// A connection without a request is closed at its deadline.
    #[tokio::test]
    async fn a_connection_without_a_request_times_out() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("s.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let limits = Limits {
            connections: 8,
            waiting: 4,
            first_request_within: Duration::from_millis(100),
        };
        let mut conns = incoming(listener, limits);
        let _client = UnixStream::connect(&path).await.unwrap();
        let mut conn = conns.next().await.unwrap().unwrap();
        assert_eq!(
            conn.connect_info().peer_pid(),
            i32::try_from(std::process::id()).ok(),
            "the connecting process"
        );
        // Taken over registered for reading only (the client's own tokio stream is registered
        // for writing too).
        use std::os::fd::AsRawFd as _;
        let fd = conn.stream.as_raw_fd();
        let events: Vec<u32> = perago_sys::socket::epoll_registrations()
            .unwrap()
            .into_iter()
            .filter_map(|(tfd, events)| (tfd == fd).then_some(events))
            .collect();
        assert_eq!(events.len(), 1, "{events:x?}");
        assert_eq!(events[0] & 0x4, 0, "EPOLLOUT: {:x}", events[0]);
        let mut byte = [0u8; 1];
        let err = conn.read(&mut byte).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }
}
