//! The workspace root: where the supervisor lock, the runtime directory (broker socket) and,
//! for workspace tasks, the attempt directories live. One supervisor per root, enforced with
//! `flock` on `.perago-supervisor.lock`.

use std::{
    fs::{self, File, OpenOptions},
    io::{self, Write as _},
    os::unix::fs::{DirBuilderExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
};

/// Unix socket paths must fit in `sun_path` (108 bytes including the NUL).
const MAX_SOCKET_PATH: usize = 100;

/// The lock file's name inside the workspace root.
pub(crate) const LOCK_FILE: &str = ".perago-supervisor.lock";

/// The default root of a task: `${XDG_STATE_HOME:-~/.local/state}/perago/<task>/workspace`.
pub(crate) fn default_root(
    task: &str,
    vars: &std::collections::BTreeMap<String, String>,
) -> PathBuf {
    state_home(vars).join("perago").join(task).join("workspace")
}

/// The default log root: `${XDG_STATE_HOME:-~/.local/state}/perago/logs` (the task name is
/// the next folder level, so supervisors of several tasks share it).
pub(crate) fn default_log_root(vars: &std::collections::BTreeMap<String, String>) -> PathBuf {
    state_home(vars).join("perago").join("logs")
}

fn state_home(vars: &std::collections::BTreeMap<String, String>) -> PathBuf {
    vars.get("XDG_STATE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(vars.get("HOME").map_or("/tmp", String::as_str)).join(".local/state")
        })
}

/// A root this process holds the lock of. The lock is released when this is dropped (or the
/// process dies: the kernel drops the flock with the file descriptor).
#[derive(Debug)]
pub(crate) struct LockedRoot {
    pub(crate) root: PathBuf,
    pub(crate) runtime_dir: PathBuf,
    pub(crate) socket: PathBuf,
    _lock: File,
}

/// A root that cannot be taken.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RootError {
    #[error("workspace root {} is locked by perago supervisor pid {pid} on {host}", root.display())]
    Locked {
        root: PathBuf,
        pid: String,
        host: String,
    },
    #[error("cannot prepare {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> RootError + '_ {
    move |source| RootError::Io {
        path: path.to_owned(),
        source,
    }
}

fn host_name() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| fs::read_to_string("/etc/hostname"))
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown host".to_owned())
}

/// A short stable hash of a path, for the fallback runtime directory name.
fn path_hash(path: &Path) -> String {
    // FNV-1a: stable across runs and Rust versions (unlike std's DefaultHasher).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in path.as_os_str().as_encoded_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

fn make_private_dir(path: &Path) -> Result<(), RootError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(io_err(path))?;
    // An existing directory keeps its mode through create(); force it.
    fs::set_permissions(path, fs::Permissions::from_mode(0o700)).map_err(io_err(path))
}

/// The runtime directory of a (canonical) root: `<root>/run`, or, when the socket path would
/// be too long for `sun_path`, `$XDG_RUNTIME_DIR/perago/<hash of root>/`.
pub(crate) fn runtime_dir(
    root: &Path,
    vars: &std::collections::BTreeMap<String, String>,
) -> PathBuf {
    let dir = root.join("run");
    if dir.join("broker.sock").as_os_str().len() <= MAX_SOCKET_PATH {
        return dir;
    }
    let base = vars
        .get("XDG_RUNTIME_DIR")
        .filter(|v| !v.is_empty())
        .map(|v| PathBuf::from(v).join("perago"))
        .unwrap_or_else(|| std::env::temp_dir().join("perago-runtime"));
    base.join(path_hash(root))
}

/// Creates the root if needed and takes its lock. A lock file whose lock can be taken is
/// stale, whatever pid it names.
pub(crate) fn lock(
    root: &Path,
    vars: &std::collections::BTreeMap<String, String>,
) -> Result<LockedRoot, RootError> {
    fs::create_dir_all(root).map_err(io_err(root))?;
    let root = fs::canonicalize(root).map_err(io_err(root))?;
    let lock_path = root.join(LOCK_FILE);
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
        .map_err(io_err(&lock_path))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(fs::TryLockError::WouldBlock) => {
            let holder = fs::read_to_string(&lock_path).unwrap_or_default();
            let mut parts = holder.split_whitespace();
            return Err(RootError::Locked {
                root,
                pid: parts.next().unwrap_or("?").to_owned(),
                host: parts.next().unwrap_or("?").to_owned(),
            });
        }
        Err(fs::TryLockError::Error(e)) => return Err(io_err(&lock_path)(e)),
    }
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    file.set_len(0).map_err(io_err(&lock_path))?;
    writeln!(file, "{} {} {started}", std::process::id(), host_name())
        .map_err(io_err(&lock_path))?;

    let runtime_dir = runtime_dir(&root, vars);
    make_private_dir(&runtime_dir)?;
    let socket = runtime_dir.join("broker.sock");
    Ok(LockedRoot {
        root,
        runtime_dir,
        socket,
        _lock: file,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn second_lock_is_refused_and_released_on_drop() {
        let tmp = tempfile::tempdir().unwrap();
        let vars = BTreeMap::new();
        let first = lock(tmp.path(), &vars).unwrap();
        let mode = fs::metadata(&first.runtime_dir)
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o700);
        let err = lock(tmp.path(), &vars).unwrap_err().to_string();
        let root = fs::canonicalize(tmp.path()).unwrap();
        assert_eq!(
            err,
            format!(
                "workspace root {} is locked by perago supervisor pid {} on {}",
                root.display(),
                std::process::id(),
                host_name()
            )
        );
        drop(first);
        // A lock file left behind (here: by the dropped holder) is stale once unlocked.
        assert!(root.join(LOCK_FILE).exists());
        lock(tmp.path(), &vars).unwrap();
    }

    #[test]
    fn long_roots_fall_back_to_a_short_runtime_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let deep = tmp.path().join("a".repeat(60)).join("b".repeat(60));
        let runtime = tempfile::tempdir().unwrap();
        let vars = BTreeMap::from([(
            "XDG_RUNTIME_DIR".to_owned(),
            runtime.path().to_str().unwrap().to_owned(),
        )]);
        let locked = lock(&deep, &vars).unwrap();
        assert!(locked.socket.starts_with(runtime.path().join("perago")));
        assert!(locked.socket.as_os_str().len() <= MAX_SOCKET_PATH);
    }

    #[test]
    fn default_root_is_keyed_by_task() {
        let vars = BTreeMap::from([("HOME".to_owned(), "/home/ada".to_owned())]);
        assert_eq!(
            default_root("features.build", &vars),
            PathBuf::from("/home/ada/.local/state/perago/features.build/workspace")
        );
        let vars = BTreeMap::from([("XDG_STATE_HOME".to_owned(), "/var/lib/x".to_owned())]);
        assert_eq!(
            default_root("t", &vars),
            PathBuf::from("/var/lib/x/perago/t/workspace")
        );
    }
}
