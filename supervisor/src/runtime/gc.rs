//! Garbage collection of attempt directories under `<root>/attempts/`. Executors write
//! `<attempt>/.perago-owner` (`slot, generation, pid, execution_id, created`) before
//! downloading; the supervisor removes:
//! - at start and after shutdown: every attempt (nothing can be live under the root lock, which
//!   every process of a runtime holds); as a second guard, one whose owner pid is a live
//!   `perago-executor-*` process is left alone and logged;
//! - after an executor dies: the attempts of that slot generation (targeted GC);
//! - every GC interval: attempts older than the TTL whose owner is not live.

use std::{
    fs,
    path::{Path, PathBuf},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

/// The owner file an executor writes (see `perago_executor::workspace::flow`).
const OWNER_FILE: &str = ".perago-owner";

/// An attempt directory and what its owner file says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AttemptDir {
    pub(crate) path: PathBuf,
    pub(crate) slot: Option<u32>,
    pub(crate) generation: Option<u64>,
    pub(crate) pid: Option<u32>,
    /// Seconds since the epoch; the directory's mtime when the owner file is missing.
    pub(crate) created: u64,
}

fn attempts(root: &Path) -> Vec<AttemptDir> {
    let Ok(entries) = fs::read_dir(root.join("attempts")) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| {
            let path = e.path();
            let owner: serde_json::Value = fs::read_to_string(path.join(OWNER_FILE))
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
                .unwrap_or_default();
            let mtime = e
                .metadata()
                .ok()
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_secs());
            AttemptDir {
                slot: owner["slot"].as_u64().and_then(|v| u32::try_from(v).ok()),
                generation: owner["generation"].as_u64(),
                pid: owner["pid"].as_u64().and_then(|v| u32::try_from(v).ok()),
                created: owner["created"].as_u64().unwrap_or(mtime),
                path,
            }
        })
        .collect()
}

/// Renames a directory out of its attempt path, then deletes it: a removal that fails half-way
/// never leaves a thinned-out folder where an executor would take it for its own (the executor
/// checks that its attempt path still names the directory it filled, see
/// `perago_executor::workspace::flow`).
fn remove_dir(path: &Path) -> std::io::Result<()> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let doomed = if name.starts_with(".removing-") {
        path.to_owned()
    } else {
        let doomed = path.with_file_name(format!(".removing-{name}"));
        fs::rename(path, &doomed)?;
        doomed
    };
    fs::remove_dir_all(doomed)
}

fn remove(dirs: impl IntoIterator<Item = AttemptDir>, why: &str) -> usize {
    let mut removed = 0;
    for dir in dirs {
        match remove_dir(&dir.path) {
            Ok(()) => {
                removed += 1;
                tracing::info!(dir = %dir.path.display(), slot = ?dir.slot, generation = ?dir.generation, "removed an attempt directory ({why})");
            }
            Err(e) => {
                tracing::warn!(dir = %dir.path.display(), error = %e, "cannot remove an attempt directory")
            }
        }
    }
    removed
}

/// Whether `pid` is a live executor (its argv[0] is `perago-executor-<slot>`), whoever started it.
fn is_live_executor(pid: u32) -> bool {
    pid_alive(pid)
        && fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|argv| argv.starts_with(b"perago-executor-"))
}

/// Start and final sweep: every attempt directory goes, except one a live executor owns.
pub(crate) fn sweep_all(root: &Path, why: &str) -> usize {
    let (live, dead): (Vec<_>, Vec<_>) = attempts(root)
        .into_iter()
        .partition(|d| d.pid.is_some_and(is_live_executor));
    for dir in live {
        tracing::warn!(dir = %dir.path.display(), pid = ?dir.pid, "left an attempt directory in place: its executor is alive");
    }
    remove(dead, why)
}

/// Targeted GC: the attempts of one dead slot generation.
pub(crate) fn sweep_generation(root: &Path, slot: u32, generation: u64) -> usize {
    let dead = attempts(root)
        .into_iter()
        .filter(|d| d.slot == Some(slot) && d.generation == Some(generation));
    remove(dead, "its executor died")
}

/// Whether a process is alive.
pub(crate) fn pid_alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, r)| !r.starts_with('Z')))
        .unwrap_or(false)
}

/// Periodic GC: attempts older than `ttl` whose owner is not live (`is_current(slot,
/// generation)` and its pid alive).
pub(crate) fn sweep_expired(
    root: &Path,
    ttl: Duration,
    is_current: impl Fn(u32, u64) -> bool,
) -> usize {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let expired = attempts(root).into_iter().filter(|d| {
        let old = now.saturating_sub(d.created) >= ttl.as_secs();
        let live = match (d.slot, d.generation, d.pid) {
            (Some(s), Some(g), Some(p)) => is_current(s, g) && pid_alive(p),
            _ => false,
        };
        old && !live
    });
    remove(
        expired,
        "older than PERAGO_WORKSPACE_GC_TTL and not owned by a live executor",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn attempt(root: &Path, id: &str, owner: Option<serde_json::Value>) -> PathBuf {
        let dir = root.join("attempts").join(id);
        fs::create_dir_all(dir.join("work/sub")).unwrap();
        fs::write(dir.join("work/sub/f"), "x").unwrap();
        if let Some(owner) = owner {
            fs::write(dir.join(OWNER_FILE), owner.to_string()).unwrap();
        }
        dir
    }

    fn now() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    #[test]
    fn targeted_gc_removes_only_the_dead_generation() {
        let tmp = tempfile::tempdir().unwrap();
        let me = std::process::id();
        let dead = attempt(
            tmp.path(),
            "a",
            Some(json!({"slot": 1, "generation": 1, "pid": me, "created": now()})),
        );
        let newer = attempt(
            tmp.path(),
            "b",
            Some(json!({"slot": 1, "generation": 2, "pid": me, "created": now()})),
        );
        let other = attempt(
            tmp.path(),
            "c",
            Some(json!({"slot": 2, "generation": 1, "pid": me, "created": now()})),
        );
        assert_eq!(sweep_generation(tmp.path(), 1, 1), 1);
        assert!(!dead.exists() && newer.exists() && other.exists());
        assert_eq!(sweep_all(tmp.path(), "test"), 2);
        assert!(!newer.exists() && !other.exists());
        assert_eq!(sweep_all(tmp.path(), "test"), 0);
    }

    #[test]
    fn periodic_gc_keeps_young_and_live_attempts() {
        let tmp = tempfile::tempdir().unwrap();
        let me = std::process::id();
        let old = now() - 7200;
        let live_old = attempt(
            tmp.path(),
            "live",
            Some(json!({"slot": 1, "generation": 3, "pid": me, "created": old})),
        );
        let stale_gen = attempt(
            tmp.path(),
            "stale",
            Some(json!({"slot": 1, "generation": 2, "pid": me, "created": old})),
        );
        let young = attempt(
            tmp.path(),
            "young",
            Some(json!({"slot": 2, "generation": 1, "pid": 999_999_999u64, "created": now()})),
        );
        let ownerless = attempt(tmp.path(), "ownerless", None);
        let removed = sweep_expired(tmp.path(), Duration::from_secs(3600), |s, g| {
            (s, g) == (1, 3)
        });
        assert_eq!(removed, 1);
        assert!(live_old.exists(), "owned by a live current executor");
        assert!(!stale_gen.exists(), "old and its generation is gone");
        assert!(young.exists(), "younger than the TTL");
        assert!(
            ownerless.exists(),
            "a fresh dir without an owner file is young by its mtime"
        );
        assert_eq!(sweep_expired(tmp.path(), Duration::ZERO, |_, _| false), 3);
    }

    #[test]
    fn the_start_sweep_never_removes_a_live_executors_attempt() {
        use std::os::unix::process::CommandExt as _;
        let tmp = tempfile::tempdir().unwrap();
        let mut executor = std::process::Command::new("sleep")
            .arg0("perago-executor-0001")
            .arg("30")
            .spawn()
            .unwrap();
        // Until it has exec'd, the child's command line is still this test's.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !fs::read(format!("/proc/{}/cmdline", executor.id()))
            .is_ok_and(|argv| argv.starts_with(b"perago-executor-"))
        {
            assert!(std::time::Instant::now() < deadline, "sleep never exec'd");
            std::thread::sleep(Duration::from_millis(5));
        }
        let live = attempt(
            tmp.path(),
            "live",
            Some(json!({"slot": 1, "generation": 1, "pid": executor.id(), "created": now()})),
        );
        let dead = attempt(
            tmp.path(),
            "dead",
            Some(json!({"slot": 1, "generation": 1, "pid": 999_999_999u64, "created": now()})),
        );
        // A removal that failed half-way earlier, renamed out of the attempt path.
        let half = tmp.path().join("attempts/.removing-old");
        fs::create_dir_all(half.join("work")).unwrap();
        assert_eq!(sweep_all(tmp.path(), "test"), 2);
        assert!(live.exists() && !dead.exists() && !half.exists());
        executor.kill().unwrap();
        executor.wait().unwrap();
        assert_eq!(sweep_all(tmp.path(), "test"), 1);
        assert!(!live.exists());
    }
}
