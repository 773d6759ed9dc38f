//! A Unix stream socket that wakes the runtime for writing only while a write waits.
//!
//! tokio registers a socket for readable and writable readiness at once, edge-triggered, for
//! its whole life. A Unix stream socket reports writable space to its waiters each time its
//! peer reads (the kernel's `unix_write_space` runs on every freed buffer; TCP wakes a writer
//! only after a write found the buffer full). On a connection that carries a message and its
//! answer, every message the peer reads wakes the writer's thread out of `epoll_wait` for
//! nothing: a wake-up and two context switches per message, in both the broker and the
//! executor, per task (docs/performance.md, round three, tenth look).
//!
//! [`QuietUnixStream`] registers the socket for reading only. A write goes straight to the
//! socket; only when it would block is a duplicate of the descriptor registered for writing
//! (a separate epoll entry, since one descriptor is registered once), and it is taken out again
//! once a write goes through whole. The duplicate is made with the stream and kept for its life.

#![expect(
    unsafe_code,
    reason = "recv(2), send(2), sendmsg(2) and shutdown(2) on a socket this type owns, and \
              registering its descriptors with tokio"
)]

use std::{
    io::{self, IoSlice},
    os::{
        fd::{AsRawFd, OwnedFd, RawFd},
        unix::net::UnixStream,
    },
    pin::Pin,
    task::{Context, Poll, ready},
};

use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf, unix::AsyncFd};

/// A connected Unix stream socket, registered with the current tokio runtime for reading only
/// (see the module's notes). Reads, writes and shutdown behave as `tokio::net::UnixStream`'s; a
/// write to a peer that has gone fails with `EPIPE` instead of raising `SIGPIPE`. It holds two
/// descriptors of the socket for its life.
#[derive(Debug)]
pub struct QuietUnixStream {
    read: AsyncFd<OwnedFd>,
    write: Write,
}

/// The duplicate a write waits for space through.
#[derive(Debug)]
enum Write {
    /// Not registered: no write waits.
    Idle(OwnedFd),
    /// Registered for writable readiness while a write waits.
    Waiting(AsyncFd<OwnedFd>),
    /// Only while it moves from one state to the other.
    Moving,
}

impl QuietUnixStream {
    /// Takes over `stream` (made non-blocking). Must run inside a tokio runtime with I/O
    /// enabled. The duplicate is made here, so that a process out of descriptors fails here
    /// (at accept or connect) and never halfway through a write.
    pub fn new(stream: UnixStream) -> io::Result<Self> {
        stream.set_nonblocking(true)?;
        let fd = OwnedFd::from(stream);
        let duplicate = fd.try_clone()?;
        // SAFETY: an `OwnedFd` keeps its descriptor open, and the same one, while owned.
        let read = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
            .map_err(io::Error::from)?;
        Ok(Self {
            read,
            write: Write::Idle(duplicate),
        })
    }

    /// Takes over a tokio stream (taken out of the runtime's registration first).
    pub fn from_tokio(stream: tokio::net::UnixStream) -> io::Result<Self> {
        Self::new(stream.into_std()?)
    }

    /// Whether a write is waiting for space, i.e. the duplicate is registered for writable
    /// readiness.
    #[cfg(test)]
    fn is_waiting_to_write(&self) -> bool {
        matches!(self.write, Write::Waiting(_))
    }

    fn fd(&self) -> RawFd {
        self.read.as_raw_fd()
    }

    /// Runs `op` (a write of `len` bytes) on the socket, retried on `EINTR`; when it would
    /// block, waits for writable space through the duplicate's registration and tries again.
    /// The registration stays while writes go through only in part (the buffer is full again,
    /// as during a megabyte message) and goes with the first whole one.
    fn poll_write_with(
        &mut self,
        cx: &mut Context<'_>,
        len: usize,
        mut op: impl FnMut(RawFd) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        let fd = self.fd();
        loop {
            if let Write::Waiting(waiting) = &self.write {
                let mut guard = ready!(waiting.poll_write_ready(cx))?;
                let Ok(result) = guard.try_io(|_| op(fd)) else {
                    continue;
                };
                match result {
                    // Full again: wait for the next edge rather than ask and hear EAGAIN.
                    Ok(n) if n < len => guard.clear_ready(),
                    _ => {
                        drop(guard);
                        self.stop_waiting();
                    }
                }
                return Poll::Ready(result);
            }
            match op(fd) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.start_waiting()?,
                result => return Poll::Ready(result),
            }
        }
    }

    fn start_waiting(&mut self) -> io::Result<()> {
        let Write::Idle(duplicate) = std::mem::replace(&mut self.write, Write::Moving) else {
            unreachable!("start_waiting while not idle");
        };
        // SAFETY: as in `new`: the `OwnedFd` keeps the duplicate open while registered.
        match unsafe { AsyncFd::register_with_interest(duplicate, Interest::WRITABLE) } {
            Ok(waiting) => {
                self.write = Write::Waiting(waiting);
                Ok(())
            }
            Err(e) => {
                let (duplicate, e) = e.into_parts();
                self.write = Write::Idle(duplicate);
                Err(e)
            }
        }
    }

    fn stop_waiting(&mut self) {
        if let Write::Waiting(waiting) = std::mem::replace(&mut self.write, Write::Moving) {
            self.write = Write::Idle(waiting.into_inner());
        }
    }
}

/// Every registration of this process's epoll instances, as (descriptor, events), from
/// `/proc/self/fdinfo`: the kernel's own account of what wakes the runtime (tests read it to
/// see that a stream is registered for reading only). An instance reached through two
/// descriptors (tokio duplicates its own) is counted once; lines it cannot read are left out.
pub fn epoll_registrations() -> io::Result<Vec<(RawFd, u32)>> {
    let mut lines = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir("/proc/self/fd")? {
        let entry = entry?;
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        };
        if target.to_str() != Some("anon_inode:[eventpoll]") {
            continue;
        }
        let path = std::path::Path::new("/proc/self/fdinfo").join(entry.file_name());
        let Ok(info) = std::fs::read_to_string(path) else {
            continue;
        };
        lines.extend(
            info.lines()
                .filter(|l| l.starts_with("tfd:"))
                .map(str::to_owned),
        );
    }
    // `tfd: <fd> events: <hex> data: …`
    Ok(lines
        .iter()
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words[..] {
                ["tfd:", fd, "events:", events, ..] => {
                    Some((fd.parse().ok()?, u32::from_str_radix(events, 16).ok()?))
                }
                _ => None,
            }
        })
        .collect())
}

/// A system call's return value as `io::Result`, retried on `EINTR`.
fn retrying(mut call: impl FnMut() -> isize) -> io::Result<usize> {
    loop {
        match usize::try_from(call()) {
            Ok(n) => return Ok(n),
            Err(_) => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
}

impl AsyncRead for QuietUnixStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            let mut guard = ready!(this.read.poll_read_ready(cx))?;
            // SAFETY: recv(2) only writes into the bytes, and `assume_init` below covers only
            // those it reports written.
            let unfilled = unsafe { buf.unfilled_mut() };
            let len = unfilled.len();
            if len == 0 {
                return Poll::Ready(Ok(()));
            }
            let read = guard.try_io(|fd| {
                retrying(|| {
                    // SAFETY: recv(2) writes at most `len` bytes into `unfilled`, which is
                    // that long and borrowed for the call.
                    unsafe { libc::recv(fd.as_raw_fd(), unfilled.as_mut_ptr().cast(), len, 0) }
                })
            });
            match read {
                Ok(Ok(n)) => {
                    // A short read has drained the socket (epoll is edge-triggered): wait for
                    // the next edge instead of asking again only to hear EAGAIN, as tokio does.
                    if 0 < n && n < len {
                        guard.clear_ready();
                    }
                    // SAFETY: recv(2) wrote the first `n` bytes.
                    unsafe { buf.assume_init(n) };
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => {}
            }
        }
    }
}

impl AsyncWrite for QuietUnixStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_write_with(cx, buf.len(), |fd| {
            retrying(|| {
                // SAFETY: send(2) reads `buf`, which is borrowed for the call.
                unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL) }
            })
        })
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        // At most IOV_MAX slices per call (a shorter write is allowed to any caller).
        let bufs = &bufs[..bufs.len().min(1024)];
        let len = bufs.iter().map(|b| b.len()).sum();
        self.get_mut().poll_write_with(cx, len, |fd| {
            // SAFETY: an all-zero msghdr is a valid one (no address, no control data).
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            // `IoSlice` is ABI-compatible with `iovec` on Unix; sendmsg(2) only reads them.
            msg.msg_iov = bufs.as_ptr().cast_mut().cast();
            msg.msg_iovlen = bufs.len();
            retrying(|| {
                // SAFETY: sendmsg(2) reads the message header and the slices it points to,
                // all borrowed for the call.
                unsafe { libc::sendmsg(fd, &raw const msg, libc::MSG_NOSIGNAL) }
            })
        })
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // SAFETY: shutdown(2) on our own socket; no memory is involved.
        let done = unsafe { libc::shutdown(self.fd(), libc::SHUT_WR) };
        Poll::Ready(if done == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        })
    }
}

impl AsRawFd for QuietUnixStream {
    fn as_raw_fd(&self) -> RawFd {
        self.fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read as _, Write as _};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    const EPOLLIN: u32 = 0x1;
    const EPOLLOUT: u32 = 0x4;

    /// The events `fd` is registered for.
    fn registrations(fd: RawFd) -> Vec<u32> {
        epoll_registrations()
            .unwrap()
            .into_iter()
            .filter(|(tfd, _)| *tfd == fd)
            .map(|(_, e)| e)
            .collect()
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// tokio's own stream is registered for writable readiness for its whole life: each read by
    /// its peer wakes the runtime. Ours is registered for reading only.
    #[test]
    fn only_reading_is_registered_while_no_write_waits() {
        runtime().block_on(async {
            let (ours, _peer) = UnixStream::pair().unwrap();
            let (theirs, _peer2) = tokio::net::UnixStream::pair().unwrap();
            let tokio_events = registrations(theirs.as_raw_fd());
            assert_eq!(tokio_events.len(), 1, "{tokio_events:x?}");
            assert_ne!(
                tokio_events[0] & EPOLLOUT,
                0,
                "tokio's stream: {:x}",
                tokio_events[0]
            );

            let ours = QuietUnixStream::new(ours).unwrap();
            let events = registrations(ours.as_raw_fd());
            assert_eq!(events.len(), 1, "{events:x?}");
            assert_ne!(events[0] & EPOLLIN, 0, "{:x}", events[0]);
            assert_eq!(events[0] & EPOLLOUT, 0, "{:x}", events[0]);
        });
    }

    /// A write larger than the socket's buffer waits for space through a registration for
    /// writing, which goes once the write is through; every byte arrives, in order.
    #[test]
    fn a_write_that_would_block_waits_for_space_then_stops_listening_for_it() {
        runtime().block_on(async {
            let (ours, mut peer) = UnixStream::pair().unwrap();
            let mut ours = QuietUnixStream::new(ours).unwrap();
            let payload: Vec<u8> = (0..8u32 << 20).map(|i| (i % 251) as u8).collect();
            // Fill the socket's buffer: the write that would block is left waiting for space.
            let mut cx = Context::from_waker(std::task::Waker::noop());
            let mut written = 0;
            while let Poll::Ready(n) = Pin::new(&mut ours).poll_write(&mut cx, &payload[written..])
            {
                written += n.unwrap();
                assert!(
                    written < payload.len(),
                    "8 MiB never filled the socket's buffer"
                );
            }
            assert!(ours.is_waiting_to_write());
            let writing: Vec<_> = epoll_registrations()
                .unwrap()
                .into_iter()
                .filter(|(_, e)| e & EPOLLOUT != 0)
                .collect();
            assert_eq!(
                writing.len(),
                1,
                "one registration for writing while the write waits"
            );
            assert_ne!(
                writing[0].0,
                ours.as_raw_fd(),
                "the duplicate's, not the socket's"
            );

            // The reader takes what is buffered: the write goes on, in part (the rest does not
            // fit), and the registration stays for the next part.
            let mut taken = Vec::new();
            peer.set_nonblocking(true).unwrap();
            let mut chunk = vec![0; 1 << 16];
            loop {
                match peer.read(&mut chunk) {
                    Ok(n) => taken.extend_from_slice(&chunk[..n]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => panic!("{e}"),
                }
            }
            peer.set_nonblocking(false).unwrap();
            let n =
                std::future::poll_fn(|cx| Pin::new(&mut ours).poll_write(cx, &payload[written..]))
                    .await
                    .unwrap();
            assert!(0 < n && n < payload.len() - written, "{n}");
            written += n;
            assert!(ours.is_waiting_to_write(), "still full: still registered");

            let reader = std::thread::spawn(move || {
                let mut got = taken;
                peer.read_to_end(&mut got).unwrap();
                got
            });
            ours.write_all(&payload[written..]).await.unwrap();
            assert!(!ours.is_waiting_to_write());
            let writing: Vec<_> = epoll_registrations()
                .unwrap()
                .into_iter()
                .filter(|(_, e)| e & EPOLLOUT != 0)
                .collect();
            assert!(writing.is_empty(), "{writing:x?}");
            assert_eq!(registrations(ours.as_raw_fd()).len(), 1);
            ours.shutdown().await.unwrap();
            assert!(
                reader.join().unwrap() == payload,
                "the bytes arrive whole and in order"
            );
        });
    }

    /// Reads see what the peer wrote, then the end once it is gone; a write to a peer that is
    /// gone fails with EPIPE (no SIGPIPE: this test would die of it); vectored writes arrive
    /// as one stream.
    #[test]
    fn reads_writes_and_the_ends_behave_as_a_socket() {
        runtime().block_on(async {
            let (ours, mut peer) = UnixStream::pair().unwrap();
            let mut ours = QuietUnixStream::new(ours).unwrap();
            let n = ours
                .write_vectored(&[
                    IoSlice::new(b"one "),
                    IoSlice::new(b"two "),
                    IoSlice::new(b"three"),
                ])
                .await
                .unwrap();
            assert_eq!(n, 13);
            let mut got = [0; 13];
            peer.read_exact(&mut got).unwrap();
            assert_eq!(&got, b"one two three");

            peer.write_all(b"answer").unwrap();
            drop(peer);
            let mut got = Vec::new();
            ours.read_to_end(&mut got).await.unwrap();
            assert_eq!(got, b"answer");

            let err = loop {
                match ours.write_all(&[0; 4096]).await {
                    Ok(()) => {}
                    Err(e) => break e,
                }
            };
            assert_eq!(err.kind(), io::ErrorKind::BrokenPipe, "{err}");
        });
    }
}
