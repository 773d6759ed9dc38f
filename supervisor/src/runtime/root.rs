//! The workspace root: where the supervisor lock, the runtime directory (broker socket) and,
//! for workspace tasks, the attempt directories live. One runtime per root, enforced with
//! `flock` on `.perago-supervisor.lock`.
//!
//! The lock belongs to the whole runtime, not only to the supervisor: the broker and every
//! executor inherit the lock's open file description (see `children.rs`), and a `flock` lasts
//! until the last descriptor of that description is closed. A supervisor killed with SIGKILL
//! thus leaves the root locked while its broker and executors drain, and a new `start` waits
//! for them (bounded by `PERAGO_ROOT_LOCK_WAIT`) instead of sweeping their live attempts.

use std::{
    fs::{self, File, OpenOptions},
    io::{self, Write as _},
    os::{
        fd::{AsRawFd as _, RawFd},
        unix::fs::{DirBuilderExt as _, PermissionsExt as _},
    },
    path::{Path, PathBuf},
    time::{Duration, Instant},
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

pub(crate) fn state_home(vars: &std::collections::BTreeMap<String, String>) -> PathBuf {
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

impl LockedRoot {
    /// The lock's descriptor, for the children that must hold the lock too.
    pub(crate) fn lock_fd(&self) -> RawFd {
        self._lock.as_raw_fd()
    }
}

/// A root that cannot be taken.
#[derive(Debug, thiserror::Error)]
pub enum RootError {
    /// A live supervisor holds the root.
    #[error("workspace root {} is locked by perago supervisor pid {pid} on {host}", root.display())]
    Locked {
        /// The workspace root.
        root: PathBuf,
        /// The holder's pid, as its lock file says.
        pid: String,
        /// The holder's host.
        host: String,
    },
    /// A supervisor that exited left processes that still hold the root.
    #[error(
        "workspace root {} is still held by the runtime of perago supervisor pid {pid}, which has exited: its processes are still draining ({holders}); waited {}; start again once they have exited (or raise PERAGO_ROOT_LOCK_WAIT)",
        root.display(), waited_text(*waited)
    )]
    Draining {
        /// The workspace root.
        root: PathBuf,
        /// The exited supervisor's pid.
        pid: String,
        /// The processes still holding it.
        holders: String,
        /// How long this supervisor waited.
        waited: Duration,
    },
    /// A folder or file of the root cannot be prepared.
    #[error("cannot prepare {}", path.display())]
    Io {
        /// The folder or file.
        path: PathBuf,
        /// The I/O error.
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

/// Who holds a lock that could not be taken.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Holder {
    /// The supervisor named in the lock file is alive: a runtime is running.
    Supervisor { pid: String, host: String },
    /// That supervisor is gone but processes of its runtime still hold the lock.
    Orphans {
        pid: String,
        holders: Vec<(u32, String)>,
    },
}

/// The other processes that have `path` open, with their argv[0] (`perago-executor-0001`).
/// Only processes this user may inspect are seen; this one (which opened the file to try the
/// lock) is left out.
fn processes_holding(path: &Path) -> Vec<(u32, String)> {
    let me = std::process::id();
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir("/proc") else {
        return out;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
            .filter(|pid| *pid != me)
        else {
            continue;
        };
        let Ok(fds) = fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        if fds
            .flatten()
            .any(|fd| fs::read_link(fd.path()).is_ok_and(|target| target == path))
        {
            let name = fs::read(entry.path().join("cmdline"))
                .ok()
                .and_then(|raw| {
                    raw.split(|b| *b == 0)
                        .next()
                        .map(|a| String::from_utf8_lossy(a).into_owned())
                })
                .filter(|a| !a.is_empty())
                .unwrap_or_else(|| "?".to_owned());
            out.push((pid, name));
        }
    }
    out.sort();
    out
}

/// Reads the lock file and decides whose lock it is.
fn holder(lock_path: &Path) -> Holder {
    let text = fs::read_to_string(lock_path).unwrap_or_default();
    let mut parts = text.split_whitespace();
    let pid = parts.next().unwrap_or("?").to_owned();
    let host = parts.next().unwrap_or("?").to_owned();
    if host != host_name() {
        // Another host (a shared file system): nothing to inspect, so it counts as running.
        return Holder::Supervisor { pid, host };
    }
    let holders = processes_holding(lock_path);
    let supervisor_alive = pid.parse().is_ok_and(|p: u32| {
        crate::runtime::gc::pid_alive(p)
            && (holders.is_empty() || holders.iter().any(|(h, _)| *h == p))
    });
    if supervisor_alive {
        Holder::Supervisor { pid, host }
    } else {
        Holder::Orphans { pid, holders }
    }
}

/// `500ms`, `30s`.
fn waited_text(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

fn describe(holders: &[(u32, String)]) -> String {
    if holders.is_empty() {
        return "processes this user cannot inspect".to_owned();
    }
    holders
        .iter()
        .map(|(pid, name)| format!("{name} (pid {pid})"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Creates the root if needed and takes its lock. A lock file whose lock can be taken is
/// stale, whatever pid it names. A lock held by a live supervisor is refused at once; one held
/// only by the processes of a supervisor that has died (its broker and executors draining) is
/// waited for, up to `wait`, polling every 100 ms and logging once why.
pub(crate) async fn lock(
    root: &Path,
    vars: &std::collections::BTreeMap<String, String>,
    wait: Duration,
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
    let started = Instant::now();
    let mut logged = false;
    loop {
        match file.try_lock() {
            Ok(()) => break,
            Err(fs::TryLockError::WouldBlock) => {}
            Err(fs::TryLockError::Error(e)) => return Err(io_err(&lock_path)(e)),
        }
        match holder(&lock_path) {
            Holder::Supervisor { pid, host } => {
                return Err(RootError::Locked { root, pid, host });
            }
            Holder::Orphans { pid, holders } => {
                if started.elapsed() >= wait {
                    return Err(RootError::Draining {
                        root,
                        pid,
                        holders: describe(&holders),
                        waited: wait,
                    });
                }
                if !logged {
                    logged = true;
                    tracing::warn!(
                        root = %root.display(), supervisor_pid = %pid, holders = %describe(&holders),
                        wait_s = wait.as_secs_f64(),
                        "the runtime of a supervisor that has exited is still draining under this root; waiting for it to finish"
                    );
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if logged {
        tracing::info!(
            waited_ms = started.elapsed().as_millis() as u64,
            "the earlier runtime has finished; root taken"
        );
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

    const NO_WAIT: Duration = Duration::from_millis(1);

    #[tokio::test]
    async fn second_lock_is_refused_and_released_on_drop() {
        let tmp = tempfile::tempdir().unwrap();
        let vars = BTreeMap::new();
        let first = lock(tmp.path(), &vars, NO_WAIT).await.unwrap();
        let mode = fs::metadata(&first.runtime_dir)
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o700);
        // A live supervisor's lock is refused at once, however long the caller would wait.
        let asked = Instant::now();
        let err = lock(tmp.path(), &vars, Duration::from_secs(30))
            .await
            .unwrap_err()
            .to_string();
        assert!(asked.elapsed() < Duration::from_secs(5));
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
        lock(tmp.path(), &vars, NO_WAIT).await.unwrap();
    }

    /// A child holding the lock as the broker and executors do.
    fn holding_child(locked: &LockedRoot, seconds: &str) -> tokio::process::Child {
        let mut cmd = tokio::process::Command::new("sleep");
        cmd.arg(seconds).kill_on_drop(true);
        perago_sys::spawn::inherit_fd(&mut cmd, locked.lock_fd());
        cmd.spawn().unwrap()
    }

    #[tokio::test]
    async fn the_lock_outlives_the_supervisor_while_its_children_run() {
        let tmp = tempfile::tempdir().unwrap();
        let vars = BTreeMap::new();
        let locked = lock(tmp.path(), &vars, NO_WAIT).await.unwrap();
        let mut child = holding_child(&locked, "30");
        let child_pid = child.id().unwrap();
        // The supervisor is gone (its descriptor closed); its child still holds the lock.
        drop(locked);
        let err = lock(tmp.path(), &vars, Duration::from_millis(300))
            .await
            .unwrap_err()
            .to_string();
        let root = fs::canonicalize(tmp.path()).unwrap();
        assert_eq!(
            err,
            format!(
                "workspace root {} is still held by the runtime of perago supervisor pid {}, which has exited: its processes are still draining (sleep (pid {child_pid})); waited 300ms; start again once they have exited (or raise PERAGO_ROOT_LOCK_WAIT)",
                root.display(),
                std::process::id()
            )
        );
        child.kill().await.unwrap();
        lock(tmp.path(), &vars, NO_WAIT).await.unwrap();
    }

    #[tokio::test]
    async fn a_start_waits_for_the_draining_runtime_to_finish() {
        let tmp = tempfile::tempdir().unwrap();
        let vars = BTreeMap::new();
        let locked = lock(tmp.path(), &vars, NO_WAIT).await.unwrap();
        // Counted from before the holder starts: it holds the lock for 0.5 s from its start,
        // whenever (under load) this test gets to ask.
        let asked = Instant::now();
        let mut child = holding_child(&locked, "0.5");
        drop(locked);
        // The supervisor that took the lock has exited: the file names a pid that is gone.
        // (This test process is alive: named in the file, it would count as a running
        // supervisor the moment the sleep exits between a failed try and the scan of holders.)
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        let gone_pid = gone.id();
        gone.wait().unwrap();
        fs::write(
            fs::canonicalize(tmp.path()).unwrap().join(LOCK_FILE),
            format!("{gone_pid} {} 0\n", host_name()),
        )
        .unwrap();
        let taken = lock(tmp.path(), &vars, Duration::from_secs(20))
            .await
            .unwrap();
        assert!(
            asked.elapsed() >= Duration::from_millis(300),
            "{:?}",
            asked.elapsed()
        );
        child.wait().await.unwrap();
        let text = fs::read_to_string(taken.root.join(LOCK_FILE)).unwrap();
        assert!(
            text.starts_with(&format!("{} ", std::process::id())),
            "{text}"
        );
    }

    #[tokio::test]
    async fn long_roots_fall_back_to_a_short_runtime_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let deep = tmp.path().join("a".repeat(60)).join("b".repeat(60));
        let runtime = tempfile::tempdir().unwrap();
        let vars = BTreeMap::from([(
            "XDG_RUNTIME_DIR".to_owned(),
            runtime.path().to_str().unwrap().to_owned(),
        )]);
        let locked = lock(&deep, &vars, NO_WAIT).await.unwrap();
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
