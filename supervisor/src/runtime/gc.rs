//! Garbage collection of attempt directories under `<root>/attempts/`, and of the lakeFS
//! staging branches they name. Executors write `<attempt>/.perago-owner` (`slot, generation,
//! pid, execution_id, created`) before downloading, add `repository` and `staging_branch`
//! before they create `perago-staging-<execution_id>`, and `done` when they finished with a
//! directory but could not delete its branch. The supervisor removes:
//! - at start and after shutdown: every attempt (nothing can be live under the root lock, which
//!   every process of a runtime holds); as a second guard, one whose owner pid is a live
//!   `perago-executor-*` process (and not `done`) is left alone and logged;
//! - after an executor dies: the attempts of that slot generation (targeted GC);
//! - every GC interval: attempts older than the TTL whose owner is not live, and at once those
//!   that name a staging branch and whose owner is not live.
//!
//! Before a directory that names a staging branch goes, the branch is deleted; when that fails
//! (lakeFS unreachable, no lakeFS configuration) the directory stays, so that the next sweep
//! tries again, and the branch is listed in `staging-branches.json` beside the broker socket,
//! which `perago-supervisor status` shows. The branch name must be exactly
//! `perago-staging-<the directory's name>`: an owner file rewritten to name another branch is
//! ignored, never obeyed.

use std::{
    fs,
    path::{Path, PathBuf},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use perago_core::lakefs::LakefsClient;

use perago_core::owner::{AttemptOwner, OWNER_FILE};
/// Beside the broker socket: the staging branches the GC could not delete yet.
pub(crate) const LEFTOVERS_FILE: &str = "staging-branches.json";
/// How long one branch deletion may take before the sweep moves on.
const DELETE_PATIENCE: Duration = Duration::from_secs(10);

/// An attempt directory and what its owner file says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AttemptDir {
    pub(crate) path: PathBuf,
    pub(crate) slot: Option<u32>,
    pub(crate) generation: Option<u64>,
    pub(crate) pid: Option<u32>,
    /// Seconds since the epoch; the directory's mtime when the owner file is missing.
    pub(crate) created: u64,
    /// `(repository, branch)` of the staging branch the attempt may have left.
    pub(crate) staging: Option<(String, String)>,
    /// The executor finished with the directory.
    pub(crate) done: bool,
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
            let owner = fs::read_to_string(path.join(OWNER_FILE))
                .map(|text| AttemptOwner::parse(&text))
                .unwrap_or_default();
            let mtime = e
                .metadata()
                .ok()
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_secs());
            let name = e.file_name().to_string_lossy().into_owned();
            AttemptDir {
                staging: owner.staging(&name),
                done: owner.done,
                slot: owner.slot,
                generation: owner.generation,
                pid: owner.pid,
                created: owner.created.unwrap_or(mtime),
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

/// Deletes the staging branch `dir` names, if any; false when it may still exist.
async fn delete_staging(dir: &AttemptDir, lakefs: Option<&LakefsClient>) -> bool {
    let Some((repository, branch)) = &dir.staging else {
        return true;
    };
    let Some(client) = lakefs else {
        tracing::warn!(dir = %dir.path.display(), repository = %repository, branch = %branch, "cannot delete a staging branch: no lakeFS configuration; the attempt directory is kept");
        return false;
    };
    match tokio::time::timeout(DELETE_PATIENCE, client.delete_branch(repository, branch)).await {
        Ok(Ok(())) => {
            tracing::info!(repository = %repository, branch = %branch, "deleted a staging branch left by an attempt");
            true
        }
        Ok(Err(e)) => {
            tracing::warn!(repository = %repository, branch = %branch, error = %perago_core::errors::DisplayChain(&e), "cannot delete a staging branch; the attempt directory is kept for the next sweep");
            false
        }
        Err(_) => {
            tracing::warn!(repository = %repository, branch = %branch, "deleting a staging branch took too long; the attempt directory is kept for the next sweep");
            false
        }
    }
}

async fn remove(
    dirs: impl IntoIterator<Item = AttemptDir>,
    why: &str,
    lakefs: Option<&LakefsClient>,
) -> usize {
    let mut removed = 0;
    for dir in dirs {
        if !delete_staging(&dir, lakefs).await {
            continue;
        }
        match remove_dir(&dir.path) {
            Ok(()) => {
                removed += 1;
                tracing::info!(dir = %dir.path.display(), slot = ?dir.slot, generation = ?dir.generation, "removed an attempt directory ({why})");
            }
            Err(e) => {
                tracing::warn!(dir = %dir.path.display(), error = %perago_core::errors::DisplayChain(&e), "cannot remove an attempt directory")
            }
        }
    }
    removed
}

/// Writes `<socket dir>/staging-branches.json`: the staging branches named by attempts whose
/// owner process is gone or finished with them (those a sweep could not delete), for `status`.
pub(crate) fn report_leftovers(root: &Path, socket: &Path) {
    let left: Vec<serde_json::Value> = attempts(root)
        .into_iter()
        .filter(|d| d.done || !d.pid.is_some_and(pid_alive))
        .filter_map(|d| {
            let (repository, branch) = d.staging?;
            Some(serde_json::json!({
                "repository": repository, "branch": branch,
                "attempt_dir": d.path.display().to_string(),
            }))
        })
        .collect();
    let file = socket.with_file_name(LEFTOVERS_FILE);
    let result = if left.is_empty() {
        match fs::remove_file(&file) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    } else {
        let temporary = file.with_extension("json.new");
        fs::write(&temporary, serde_json::Value::from(left).to_string())
            .and_then(|()| fs::rename(&temporary, &file))
    };
    if let Err(e) = result {
        tracing::warn!(file = %file.display(), error = %perago_core::errors::DisplayChain(&e), "cannot write the list of staging branches left");
    }
}

/// Whether `pid` is a live executor (its argv[0] is `perago-executor-<slot>`), whoever started it.
fn is_live_executor(pid: u32) -> bool {
    pid_alive(pid)
        && fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|argv| argv.starts_with(b"perago-executor-"))
}

/// Start and final sweep: every attempt directory goes, except one a live executor owns.
pub(crate) async fn sweep_all(root: &Path, why: &str, lakefs: Option<&LakefsClient>) -> usize {
    let (live, dead): (Vec<_>, Vec<_>) = attempts(root)
        .into_iter()
        .partition(|d| !d.done && d.pid.is_some_and(is_live_executor));
    for dir in live {
        tracing::warn!(dir = %dir.path.display(), pid = ?dir.pid, "left an attempt directory in place: its executor is alive");
    }
    remove(dead, why, lakefs).await
}

/// Targeted GC: the attempts of one dead slot generation.
pub(crate) async fn sweep_generation(
    root: &Path,
    slot: u32,
    generation: u64,
    lakefs: Option<&LakefsClient>,
) -> usize {
    let dead = attempts(root)
        .into_iter()
        .filter(|d| d.slot == Some(slot) && d.generation == Some(generation));
    remove(dead, "its executor died", lakefs).await
}

/// Whether a process is alive.
pub(crate) fn pid_alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, r)| !r.starts_with('Z')))
        .unwrap_or(false)
}

/// Periodic GC: attempts whose owner is not live (`is_current(slot, generation)` and its pid
/// alive, and not `done`) that are older than `ttl` or name a staging branch.
pub(crate) async fn sweep_expired(
    root: &Path,
    ttl: Duration,
    is_current: impl Fn(u32, u64) -> bool,
    lakefs: Option<&LakefsClient>,
) -> usize {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let expired = attempts(root)
        .into_iter()
        .filter(|d| {
            let old = now.saturating_sub(d.created) >= ttl.as_secs();
            let (known, live) = match (d.slot, d.generation, d.pid) {
                (Some(s), Some(g), Some(p)) => (true, !d.done && is_current(s, g) && pid_alive(p)),
                _ => (false, false),
            };
            // An owner file that names a branch is a complete one: its owner is known to be gone.
            let left_a_branch = known && d.staging.is_some();
            (old || left_a_branch) && !live
        })
        .collect::<Vec<_>>();
    remove(
        expired,
        "older than PERAGO_WORKSPACE_GC_TTL, or naming a staging branch, and not owned by a live executor",
        lakefs,
    )
    .await
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

    #[tokio::test]
    async fn targeted_gc_removes_only_the_dead_generation() {
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
        assert_eq!(sweep_generation(tmp.path(), 1, 1, None).await, 1);
        assert!(!dead.exists() && newer.exists() && other.exists());
        assert_eq!(sweep_all(tmp.path(), "test", None).await, 2);
        assert!(!newer.exists() && !other.exists());
        assert_eq!(sweep_all(tmp.path(), "test", None).await, 0);
    }

    #[tokio::test]
    async fn periodic_gc_keeps_young_and_live_attempts() {
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
        let removed = sweep_expired(
            tmp.path(),
            Duration::from_secs(3600),
            |s, g| (s, g) == (1, 3),
            None,
        )
        .await;
        assert_eq!(removed, 1);
        assert!(live_old.exists(), "owned by a live current executor");
        assert!(!stale_gen.exists(), "old and its generation is gone");
        assert!(young.exists(), "younger than the TTL");
        assert!(
            ownerless.exists(),
            "a fresh dir without an owner file is young by its mtime"
        );
        assert_eq!(
            sweep_expired(tmp.path(), Duration::ZERO, |_, _| false, None).await,
            3
        );
    }

    #[tokio::test]
    async fn the_start_sweep_never_removes_a_live_executors_attempt() {
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
        assert_eq!(sweep_all(tmp.path(), "test", None).await, 2);
        assert!(live.exists() && !dead.exists() && !half.exists());
        executor.kill().unwrap();
        executor.wait().unwrap();
        assert_eq!(sweep_all(tmp.path(), "test", None).await, 1);
        assert!(!live.exists());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn staging_branches_of_dead_attempts_are_deleted_and_listed_until_they_are() {
        let server = perago_devstack::lakefs::LakefsServer::builder()
            .bind("127.0.0.1:0")
            .await
            .unwrap();
        let client = LakefsClient::new(&perago_core::lakefs::LakefsConfig {
            endpoint: server.endpoint(),
            access_key_id: server.credentials().access_key_id.clone(),
            secret_access_key: server.credentials().secret_access_key.clone(),
        })
        .unwrap();
        client
            .ensure_repository("gc-repo", "mem://gc-repo", "main")
            .await
            .unwrap();
        client
            .upload("gc-repo", "main", "f", b"f".to_vec())
            .await
            .unwrap();
        client
            .commit("gc-repo", "main", "seed", &serde_json::Map::new())
            .await
            .unwrap();
        for branch in ["perago-staging-dead", "perago-staging-live", "keep"] {
            client
                .create_branch("gc-repo", branch, "main")
                .await
                .unwrap();
        }
        let branches = || async {
            let mut b = client.list_branches("gc-repo").await.unwrap();
            b.sort();
            b
        };
        let tmp = tempfile::tempdir().unwrap();
        let socket = tmp.path().join("run/broker.sock");
        fs::create_dir_all(socket.parent().unwrap()).unwrap();
        let leftovers = || {
            fs::read_to_string(socket.with_file_name(LEFTOVERS_FILE))
                .map(|t| serde_json::from_str::<serde_json::Value>(&t).unwrap())
                .ok()
        };
        let me = std::process::id();
        let staged = |pid: u64, branch: &str| {
            json!({"slot": 1, "generation": 1, "pid": pid, "created": now(),
                   "repository": "gc-repo", "staging_branch": branch})
        };
        // Killed mid-publish: its executor is gone.
        let dead = attempt(
            tmp.path(),
            "dead",
            Some(staged(999_999_999, "perago-staging-dead")),
        );
        // Publishing now, in a live current executor.
        let live = attempt(
            tmp.path(),
            "live",
            Some(staged(me.into(), "perago-staging-live")),
        );
        // An owner file rewritten to name another branch is never obeyed.
        let forged = attempt(tmp.path(), "forged", Some(staged(999_999_999, "keep")));

        // lakeFS not configured: nothing of a dead attempt that left a branch goes, and the
        // branch is listed for `status`.
        let current = |s: u32, g: u64| (s, g) == (1, 1);
        let ttl = Duration::from_secs(3600);
        assert_eq!(sweep_expired(tmp.path(), ttl, current, None).await, 0);
        assert!(dead.exists() && live.exists() && forged.exists());
        report_leftovers(tmp.path(), &socket);
        assert_eq!(
            leftovers(),
            Some(
                json!([{"repository": "gc-repo", "branch": "perago-staging-dead",
                         "attempt_dir": dead.display().to_string()}])
            )
        );

        // With lakeFS, the dead attempt's branch goes, and then its directory, at once (long
        // before the TTL); the live one's stays.
        assert_eq!(
            sweep_expired(tmp.path(), ttl, current, Some(&client)).await,
            1
        );
        assert!(!dead.exists() && live.exists() && forged.exists());
        assert_eq!(branches().await, ["keep", "main", "perago-staging-live"]);
        report_leftovers(tmp.path(), &socket);
        assert_eq!(leftovers(), None, "nothing left to list");

        // The executor died: its generation's attempts and their branches go.
        assert_eq!(sweep_generation(tmp.path(), 1, 1, Some(&client)).await, 2);
        assert_eq!(branches().await, ["keep", "main"]);
        assert!(!live.exists() && !forged.exists());
        server.shutdown().await;
    }

    #[tokio::test]
    async fn a_done_attempt_is_not_live_even_while_its_executor_runs() {
        let tmp = tempfile::tempdir().unwrap();
        let me = std::process::id();
        let done = attempt(
            tmp.path(),
            "done",
            Some(json!({"slot": 1, "generation": 1, "pid": me, "created": now(), "done": true})),
        );
        assert_eq!(
            sweep_expired(tmp.path(), Duration::from_secs(3600), |_, _| true, None).await,
            0,
            "young, no branch: the TTL applies"
        );
        assert_eq!(
            sweep_expired(tmp.path(), Duration::ZERO, |_, _| true, None).await,
            1
        );
        assert!(!done.exists());
    }
}
