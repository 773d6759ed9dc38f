//! Handing a runtime child (broker, executor) its secrets without its environment, which
//! `/proc/<pid>/environ` shows for the process's whole life.
//!
//! The channel is one end of an unnamed `socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC)`,
//! inherited by number ([`PERAGO_SECRETS_FD`](crate::env::PERAGO_SECRETS_FD)). A socket cannot
//! be opened again through `/proc/<pid>/fd/N` (that fails with `ENXIO`, whoever tries), it has no
//! name anyone could connect to, and nothing is in it until the child asked:
//!
//! ```text
//! supervisor                                  child
//!   channel() → (ours, theirs)
//!   spawn, theirs inherited ───────────────→  prctl(PR_SET_DUMPABLE, 0)
//!   wait for READY (timeout, async)   ←──────  write READY (one byte)
//!   write the secrets (JSON), shut down ────→  read to end of file (at most MAX_BYTES)
//! ```
//!
//! A pipe, filled before the spawn, could be read by any process of the same user that opened
//! `/proc/<child>/fd/N` before the child turned non-dumpable. A child that never says ready gets
//! nothing (the supervisor stops it).

use std::{
    io::{self, Read as _, Write as _},
    os::{fd::OwnedFd, unix::net::UnixStream},
    time::Duration,
};

/// The byte a child writes once it is non-dumpable.
pub const READY: u8 = b'R';

/// At most this many bytes of secrets cross (a few tokens and keys take a few hundred).
pub const MAX_BYTES: usize = 64 * 1024;

/// How long the supervisor waits for a child's [`READY`]; how long a child waits for its
/// secrets after it.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// A new channel: the supervisor's end, and the child's (close-on-exec: pass it on with
/// `perago_sys::spawn::inherit_fd`).
pub fn channel() -> io::Result<(UnixStream, OwnedFd)> {
    let (ours, theirs) = UnixStream::pair()?;
    Ok((ours, theirs.into()))
}

/// Why a child got no secrets.
#[derive(Debug, thiserror::Error)]
pub enum HandOverError {
    /// It did not say ready in time.
    #[error("the child did not say it was ready for its secrets within {0:?}")]
    NotReady(Duration),
    /// It closed the channel (or exited) first.
    #[error("the child closed its secrets channel before it said it was ready")]
    Closed,
    /// It wrote something else.
    #[error("the child wrote {0:#04x} on its secrets channel, not its ready byte")]
    NotTheReadyByte(u8),
    /// The channel failed.
    #[error("the secrets channel failed")]
    Io(#[from] io::Error),
}

/// The supervisor's side: waits (at most `timeout`) for the child's [`READY`], then writes
/// `secrets` and shuts the channel down. Nothing is written before the byte.
pub async fn hand_over(
    ours: UnixStream,
    secrets: &[u8],
    timeout: Duration,
) -> Result<(), HandOverError> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    ours.set_nonblocking(true)?;
    let mut ours = tokio::net::UnixStream::from_std(ours)?;
    let mut byte = [0u8; 1];
    match tokio::time::timeout(timeout, ours.read(&mut byte)).await {
        Err(_) => return Err(HandOverError::NotReady(timeout)),
        Ok(Ok(0)) => return Err(HandOverError::Closed),
        Ok(Ok(_)) if byte[0] == READY => {}
        Ok(Ok(_)) => return Err(HandOverError::NotTheReadyByte(byte[0])),
        Ok(Err(e)) => return Err(e.into()),
    }
    tokio::time::timeout(timeout, async {
        ours.write_all(secrets).await?;
        ours.shutdown().await
    })
    .await
    .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
    Ok(())
}

/// Why a child took no secrets.
#[derive(Debug, thiserror::Error)]
pub enum ReceiveError {
    /// The descriptor is not an open socket (a pipe could have been read by another process).
    #[error("descriptor {0} is not a socket")]
    NotASocket(std::os::fd::RawFd),
    /// This process could not turn non-dumpable, so it does not ask.
    #[error("this process is still dumpable")]
    Dumpable(#[source] io::Error),
    /// More than [`MAX_BYTES`] came.
    #[error("more than {MAX_BYTES} bytes of secrets")]
    TooLarge,
    /// The channel failed.
    #[error("the secrets channel failed")]
    Io(#[from] io::Error),
}

/// The child's side, on the inherited descriptor `fd`: turns this process non-dumpable, says
/// [`READY`], and reads the secrets to the end (waiting at most [`TIMEOUT`] for each read).
pub fn receive(fd: std::os::fd::RawFd) -> Result<Vec<u8>, ReceiveError> {
    use std::os::unix::fs::FileTypeExt as _;
    let file = perago_sys::fd::adopt_fd(fd).ok_or(ReceiveError::NotASocket(fd))?;
    if !file.metadata()?.file_type().is_socket() {
        return Err(ReceiveError::NotASocket(fd));
    }
    perago_sys::memory::set_non_dumpable().map_err(ReceiveError::Dumpable)?;
    if perago_sys::memory::is_dumpable() {
        return Err(ReceiveError::Dumpable(io::Error::other(
            "PR_SET_DUMPABLE did not hold",
        )));
    }
    let mut stream = UnixStream::from(OwnedFd::from(file));
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.write_all(&[READY])?;
    let mut secrets = Vec::new();
    (&mut stream)
        .take(MAX_BYTES as u64 + 1)
        .read_to_end(&mut secrets)?;
    if secrets.len() > MAX_BYTES {
        return Err(ReceiveError::TooLarge);
    }
    Ok(secrets)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd as _;

    /// The child's end is a socket, which `/proc/<pid>/fd/N` cannot open again (`ENXIO`); a
    /// pipe's end, as the secrets came before, can.
    #[test]
    fn the_childs_end_cannot_be_opened_again_through_proc() {
        let (_ours, theirs) = channel().unwrap();
        let path = format!("/proc/self/fd/{}", theirs.as_raw_fd());
        assert!(
            std::fs::read_link(&path)
                .unwrap()
                .to_string_lossy()
                .starts_with("socket:["),
            "{path}"
        );
        let e = std::fs::File::open(&path).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENXIO), "{e}");
        assert_eq!(perago_sys::fd::is_cloexec(theirs.as_raw_fd()), Some(true));
        // What a same-user process did with the pipe.
        let (read, mut write) = std::io::pipe().unwrap();
        write.write_all(b"{\"secret\":1}").unwrap();
        drop(write);
        let mut text = String::new();
        std::fs::File::open(format!("/proc/self/fd/{}", read.as_raw_fd()))
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "{\"secret\":1}");
    }

    /// A child that never says ready gets nothing: once the supervisor gave up, its end holds
    /// no byte and reads end of file.
    #[tokio::test]
    async fn nothing_is_written_before_ready() {
        let (ours, theirs) = channel().unwrap();
        let e = hand_over(ours, b"{\"k\":\"v\"}", Duration::from_millis(100))
            .await
            .unwrap_err();
        assert!(matches!(e, HandOverError::NotReady(_)), "{e}");
        let mut theirs = UnixStream::from(theirs);
        let mut got = Vec::new();
        theirs.read_to_end(&mut got).unwrap();
        assert!(got.is_empty(), "{got:?}");
        // Another byte than the ready byte gets nothing either.
        let (ours, theirs) = channel().unwrap();
        let mut theirs = UnixStream::from(theirs);
        theirs.write_all(b"x").unwrap();
        let e = hand_over(ours, b"{}", TIMEOUT).await.unwrap_err();
        assert!(matches!(e, HandOverError::NotTheReadyByte(b'x')), "{e}");
        let mut got = Vec::new();
        theirs.read_to_end(&mut got).unwrap();
        assert!(got.is_empty(), "{got:?}");
        // Nor a child that closed its end.
        let (ours, theirs) = channel().unwrap();
        drop(theirs);
        assert!(matches!(
            hand_over(ours, b"{}", TIMEOUT).await,
            Err(HandOverError::Closed)
        ));
    }

    /// After the ready byte, the secrets, then end of file.
    #[tokio::test]
    async fn after_ready_the_secrets_come_then_end_of_file() {
        let (ours, theirs) = channel().unwrap();
        let handing = tokio::spawn(async move { hand_over(ours, b"{\"k\":\"v\"}", TIMEOUT).await });
        let got = tokio::task::spawn_blocking(move || {
            let mut theirs = UnixStream::from(theirs);
            theirs.write_all(&[READY]).unwrap();
            let mut got = Vec::new();
            theirs.read_to_end(&mut got).unwrap();
            got
        })
        .await
        .unwrap();
        assert_eq!(got, b"{\"k\":\"v\"}");
        handing.await.unwrap().unwrap();
    }

    /// A descriptor that is not a socket is refused before anything else.
    #[test]
    fn a_pipe_is_not_taken_for_the_channel() {
        let (read, _write) = std::io::pipe().unwrap();
        let fd = std::os::fd::IntoRawFd::into_raw_fd(OwnedFd::from(read));
        assert!(matches!(receive(fd), Err(ReceiveError::NotASocket(n)) if n == fd));
        assert!(matches!(receive(-1), Err(ReceiveError::NotASocket(-1))));
    }
}
