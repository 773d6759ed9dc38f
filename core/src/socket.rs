//! perago's Unix sockets: the server side ([`bind`]: the broker's socket and the supervisor's
//! control socket, by the same rules) and the client side of a broker's socket ([`connect`]:
//! one gRPC channel, for the executors' slots and the supervisor's control, status and
//! metrics calls).

use hyper_util::rt::TokioIo;
use std::{
    fs, io,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
};
use tokio::net::UnixListener;
use tonic::transport::{Channel, Endpoint, Uri};

/// A bound socket; removes its file when dropped.
#[derive(Debug)]
pub struct BoundSocket {
    path: PathBuf,
}

impl Drop for BoundSocket {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// Binds `path`: refuses if a live server answers there or if its directory is open to anyone
/// but its owner (the directory is 0700, so only the owner can reach the socket whatever its
/// own mode), removes a stale file (a dangling symlink too), binds
/// and sets mode 0600.
pub async fn bind(path: &Path) -> io::Result<(UnixListener, BoundSocket)> {
    if fs::symlink_metadata(path).is_ok() {
        if tokio::net::UnixStream::connect(path).await.is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("another process is serving on {}", path.display()),
            ));
        }
        fs::remove_file(path)?;
    }
    if let Some(dir) = path.parent() {
        let mode = fs::metadata(dir)?.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "the socket directory {} has mode {mode:o}; it must be accessible to its owner only (0700)",
                    dir.display()
                ),
            ));
        }
    }
    let listener = bind_owner_only(path)?;
    let guard = BoundSocket {
        path: path.to_owned(),
    };
    // Already 0600 from `bind_owner_only`; said again by path in case a kernel took the mode
    // from elsewhere.
    fs::set_permissions(path, fs::Permissions::from_mode(0o600))?;
    Ok((listener, guard))
}

/// A socket listening at `path` whose file is 0600 from the moment `bind` creates it: Linux
/// gives the file the socket's own mode (less the umask), so the mode is set on the socket
/// first. A client that finds the file (it can connect at once) never sees a wider mode.
fn bind_owner_only(path: &Path) -> io::Result<UnixListener> {
    use socket2::{Domain, SockAddr, Socket, Type};
    use std::os::fd::OwnedFd;
    // Close-on-exec, as socket2 makes every socket: no body inherits the listener.
    let socket = Socket::new(Domain::UNIX, Type::STREAM, None)?;
    let socket = fs::File::from(OwnedFd::from(socket));
    socket.set_permissions(fs::Permissions::from_mode(0o600))?;
    let socket = Socket::from(OwnedFd::from(socket));
    socket.bind(&SockAddr::unix(path)?)?;
    // What `UnixListener::bind` (mio) asks for.
    socket.listen(1024)?;
    socket.set_nonblocking(true)?;
    UnixListener::from_std(std::os::unix::net::UnixListener::from(OwnedFd::from(
        socket,
    )))
}

/// A channel to the broker over its Unix socket.
pub async fn connect(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    let path = socket.to_owned();
    // The URI is required by the API but unused: every connection goes to the socket.
    // A whole slot message fits the receive windows: an assignment carrying megabytes is
    // not held up waiting for window updates on the way.
    let window = u32::try_from(perago_proto::MAX_SLOT_MESSAGE_BYTES).unwrap_or(u32::MAX);
    Endpoint::from_static("http://perago.broker")
        .initial_stream_window_size(window)
        .initial_connection_window_size(window)
        // And comes in few frames (see `perago_proto::SLOT_FRAME_BYTES`).
        .max_frame_size(perago_proto::SLOT_FRAME_BYTES)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                // Registered for reading only: the broker's reads of what we send do not wake
                // this process (see `perago_sys::socket`).
                let stream = perago_sys::socket::QuietUnixStream::from_tokio(stream)?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileTypeExt as _;

    /// The rules of both servers' sockets: a folder open to others is refused; a stale file
    /// (or a dangling symlink) is replaced; the socket is 0600; a live server there is
    /// refused; the file goes with the guard.
    #[tokio::test]
    async fn the_socket_is_0600_in_an_owner_only_folder_and_refuses_a_live_one() {
        let tmp = tempfile::tempdir().unwrap();
        let open = tmp.path().join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o755)).unwrap();
        let err = bind(&open.join("x.sock")).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
        let dir = tmp.path().join("run");
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        let path = dir.join("x.sock");
        // A stale file is replaced.
        fs::write(&path, "").unwrap();
        let (listener, guard) = bind(&path).await.unwrap();
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let err = bind(&path).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse, "{err}");
        drop(listener);
        drop(guard);
        assert!(
            fs::symlink_metadata(&path).is_err(),
            "removed with its guard"
        );
        // A dangling symlink where the socket goes is stale too.
        std::os::unix::fs::symlink(tmp.path().join("gone"), &path).unwrap();
        let (_listener, _guard) = bind(&path).await.unwrap();
        assert!(fs::symlink_metadata(&path).unwrap().file_type().is_socket());
    }

    /// The file is 0600 from the moment it exists: a client can connect as soon as `bind`
    /// returns, before any later change of mode (with the umask's 0755 in between, a test that
    /// connected and read the mode failed now and then). The listener serves and is not
    /// inherited by what the process execs.
    #[tokio::test]
    async fn the_socket_file_is_created_0600() {
        let tmp = tempfile::tempdir().unwrap();
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o700)).unwrap();
        let path = tmp.path().join("x.sock");
        let listener = bind_owner_only(&path).unwrap();
        let meta = fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let client = tokio::net::UnixStream::connect(&path).await.unwrap();
        let (_served, _) = listener.accept().await.unwrap();
        drop(client);
        use std::os::fd::AsRawFd as _;
        let fd = listener.as_raw_fd();
        let flags = fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).unwrap();
        let flags = flags
            .lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .map(|f| u32::from_str_radix(f.trim(), 8).unwrap())
            .unwrap();
        assert_ne!(flags & 0o2000000, 0, "O_CLOEXEC: {flags:o}");
    }

    /// A channel's connection is registered with the runtime for reading only: the broker's
    /// reads of what an executor sends do not wake the executor (tokio's own stream would be
    /// registered for writing too).
    #[tokio::test]
    async fn a_channel_listens_only_for_reading() {
        const EPOLLOUT: u32 = 0x4;
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("broker.sock");
        // The broker's end outside the runtime, so that only the channel's is registered.
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        // Holds the connection until the test's process ends (not joined: the channel's
        // connection closes only when its task next runs on this test's runtime).
        std::thread::spawn(move || {
            use std::io::Read as _;
            let (mut conn, _) = listener.accept().unwrap();
            let mut sink = Vec::new();
            let _ = conn.read_to_end(&mut sink);
        });
        let channel = tokio::time::timeout(std::time::Duration::from_secs(10), connect(&path))
            .await
            .expect("connected in time")
            .unwrap();
        let registrations = perago_sys::socket::epoll_registrations().unwrap();
        assert!(!registrations.is_empty());
        let writing: Vec<_> = registrations
            .iter()
            .filter(|(_, e)| e & EPOLLOUT != 0)
            .collect();
        assert!(writing.is_empty(), "registered for writing: {writing:x?}");
        drop(channel);
    }
}
