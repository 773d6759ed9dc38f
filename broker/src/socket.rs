//! The broker socket: probe, clean, bind, chmod, remove. The runtime directory is 0700, so
//! only the owner can reach the socket even in the instant before its own mode is set.

use std::{
    fs, io,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
};
use tokio::net::UnixListener;

/// A bound broker socket; removes its file when dropped.
#[derive(Debug)]
pub(crate) struct BoundSocket {
    path: PathBuf,
}

impl Drop for BoundSocket {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// Binds `path`: refuses if a live server answers there, removes a stale file, binds and
/// sets mode 0600.
pub(crate) async fn bind(path: &Path) -> io::Result<(UnixListener, BoundSocket)> {
    if path.exists() {
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
    let listener = UnixListener::bind(path)?;
    let guard = BoundSocket {
        path: path.to_owned(),
    };
    fs::set_permissions(path, fs::Permissions::from_mode(0o600))?;
    Ok((listener, guard))
}
