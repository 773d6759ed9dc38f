use super::{attempt::*, dir::*, download::*, errors::*, fence::*};
use perago_core::{
    attempt::{AttemptSnapshot, FenceError},
    lakefs::LakefsClient,
    manifest::{PublishBudget, WorkspaceSpec},
    shape::WorkspaceInput,
};
use serde_json::{Map, Value, json};
use std::{collections::BTreeMap, fs, path::Path, time::Duration};

use perago_core::lakefs::LakefsConfig;
use std::sync::{
    Mutex,
    atomic::{AtomicUsize, Ordering},
};

fn snapshot(status: &str) -> AttemptSnapshot {
    AttemptSnapshot::from_conductor(&json!({
        "taskId": "task-1", "workflowInstanceId": "wf-1", "retryCount": 0,
        "taskDefName": "t", "referenceTaskName": "ref", "seq": 1,
        "status": status, "inputData": {}
    }))
    .unwrap()
}

/// Answers the scripted reads in order, then "unavailable"; counts the reads.
#[derive(Default)]
struct Scripted {
    reads: Mutex<Vec<FenceRead>>,
    calls: AtomicUsize,
}

impl Scripted {
    fn new(reads: Vec<FenceRead>) -> Self {
        Self {
            reads: Mutex::new(reads.into_iter().rev().collect()),
            calls: AtomicUsize::new(0),
        }
    }
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Fence for Scripted {
    fn reload(&self) -> std::pin::Pin<Box<dyn Future<Output = FenceRead> + Send + '_>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let next = self.reads.lock().unwrap().pop();
        Box::pin(async move {
            next.unwrap_or_else(|| FenceRead::Unavailable("connection refused".to_owned()))
        })
    }
}

fn fresh(status: &str) -> FenceRead {
    FenceRead::Fresh(Box::new(snapshot(status)))
}

fn message(result: Result<impl std::fmt::Debug, WorkspaceFailure>) -> String {
    match result {
        Err(failure) => failure.to_string(),
        Ok(v) => panic!("expected a failure, got {v:?}"),
    }
}

#[tokio::test]
async fn the_fence_passes_only_a_fresh_in_progress_read() {
    let polled = snapshot("IN_PROGRESS");
    let fence = Scripted::new(vec![fresh("IN_PROGRESS")]);
    check_fence(&fence, &polled, "before staging")
        .await
        .unwrap();

    let fence = Scripted::new(vec![fresh("TIMED_OUT")]);
    assert_eq!(
        message(check_fence(&fence, &polled, "before publishing").await),
        "stale attempt: task status is TIMED_OUT, expected IN_PROGRESS (before publishing); nothing was published"
    );
    let fence = Scripted::new(vec![fresh("TIMED_OUT")]);
    assert!(matches!(
        check_fence(&fence, &polled, "before publishing").await,
        Err(WorkspaceFailure::Fence {
            cause: FenceError::NotInProgress { .. },
            when: "before publishing"
        })
    ));
    let fence = Scripted::new(vec![FenceRead::Gone]);
    assert!(matches!(
        check_fence(&fence, &polled, "before staging").await,
        Err(WorkspaceFailure::TaskGone { ref task_id, .. }) if task_id == "task-1"
    ));
    // A 404 from Conductor: stale at once, not retried.
    let fence = Scripted::new(vec![FenceRead::Gone]);
    assert_eq!(
        message(check_fence(&fence, &polled, "before staging").await),
        "stale attempt: Conductor no longer knows task task-1 (before staging); nothing was published"
    );
    assert_eq!(fence.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_unavailable_fence_is_retried_then_fails_closed() {
    let polled = snapshot("IN_PROGRESS");
    // A blip is retried...
    let fence = Scripted::new(vec![
        FenceRead::Unavailable("HTTP 503".to_owned()),
        fresh("IN_PROGRESS"),
    ]);
    check_fence(&fence, &polled, "before staging")
        .await
        .unwrap();
    assert_eq!(fence.calls(), 2);
    // ...an outage longer than the patience fails the attempt: never a publish unfenced.
    let started = tokio::time::Instant::now();
    let fence = Scripted::new(Vec::new());
    assert_eq!(
        message(check_fence(&fence, &polled, "before staging").await),
        "attempt fence unavailable: connection refused"
    );
    assert!(started.elapsed() >= FENCE_PATIENCE);
    assert!(fence.calls() > 3, "{}", fence.calls());
    let fence = Scripted::new(Vec::new());
    assert!(matches!(
        check_fence(&fence, &polled, "before staging").await,
        Err(WorkspaceFailure::FenceUnavailable { .. })
    ));
}

#[test]
fn a_key_that_is_also_a_folder_is_refused_by_its_variant() {
    let object = |path: &str| perago_core::lakefs::ObjectStats {
        path: path.to_owned(),
        path_type: "object".to_owned(),
        checksum: String::new(),
        size_bytes: None,
    };
    let failure =
        plan_download("p/", vec![object("p/x"), object("p/x/y")], Path::new("/w")).unwrap_err();
    assert!(matches!(
        failure,
        WorkspaceFailure::KeyIsFolder { ref key, ref folder } if key == "p/x/y" && folder == "p/x"
    ));
    assert_eq!(
        failure.to_string(),
        "workspace download failed: object key \"p/x/y\" needs \"p/x\" to be a folder, but it is an object too; a workspace cannot hold both; nothing was downloaded"
    );
    assert!(matches!(
        plan_download("p/", vec![object("p/../x")], Path::new("/w")),
        Err(WorkspaceFailure::UnsafeKey(_))
    ));
}

/// An attempt with a downloaded snapshot of `files` (key under `p/` → content), made without
/// lakeFS; its client points at a port nothing listens on.
fn attempt(root: &Path, files: &[(&str, &str)]) -> Attempt {
    let dir = AttemptDir::create(
        root,
        "exec-1",
        Owner {
            slot: 1,
            generation: 1,
        },
    )
    .unwrap();
    let mut downloaded = BTreeMap::new();
    for (name, text) in files {
        let path = dir.work.join(name);
        fs::write(&path, text).unwrap();
        downloaded.insert(
            format!("p/{name}"),
            crate::workspace::scan::md5_hex(&path).unwrap(),
        );
    }
    let client = LakefsClient::new(&LakefsConfig {
        endpoint: "http://127.0.0.1:9".to_owned(),
        access_key_id: "k".to_owned(),
        secret_access_key: "s".to_owned(),
    })
    .unwrap();
    Attempt {
        client,
        input: WorkspaceInput {
            repository: "repo".to_owned(),
            branch: "main".to_owned(),
            prefix: "p/".to_owned(),
            source_ref: None,
        },
        work: dir.work.clone(),
        dir,
        source_commit: "c0".to_owned(),
        downloaded,
        staging: None,
        task_deadline: None,
    }
}

fn spec() -> WorkspaceSpec {
    WorkspaceSpec {
        prefix: String::new(),
        merge_timeout_seconds: 5,
        publish_budget: None,
        download_budget: None,
    }
}

#[tokio::test]
async fn a_body_that_changed_nothing_is_still_fenced() {
    let tmp = tempfile::tempdir().unwrap();
    let mut ws = attempt(tmp.path(), &[("a.txt", "a")]);
    let changes = ws.changes(None, None).unwrap();
    assert!(changes.is_empty());
    let polled = snapshot("IN_PROGRESS");
    let stale = Scripted::new(vec![fresh("CANCELED")]);
    let result = ws
        .publish(
            &changes,
            &spec(),
            &stale,
            &polled,
            "exec-1",
            Map::new(),
            &|| {},
        )
        .await;
    assert_eq!(
        message(result),
        "stale attempt: task status is CANCELED, expected IN_PROGRESS (before staging); nothing was published"
    );
    assert_eq!(stale.calls(), 1);

    let current = Scripted::new(vec![fresh("IN_PROGRESS")]);
    let output = ws
        .publish(
            &changes,
            &spec(),
            &current,
            &polled,
            "exec-1",
            Map::new(),
            &|| {},
        )
        .await
        .unwrap();
    assert_eq!(output["commit_id"], "c0");
    assert_eq!(current.calls(), 1, "one fence read, nothing staged");
}

fn listed(keys: &[&str]) -> Vec<perago_core::lakefs::ObjectStats> {
    keys.iter()
        .map(|k| {
            serde_json::from_value(json!({"path": k, "path_type": "object", "checksum": "c"}))
                .unwrap()
        })
        .collect()
}

#[test]
fn folder_markers_are_skipped_when_downloading() {
    let work = Path::new("/w");
    let plan = plan_download(
        "data/",
        listed(&["data/", "data/a/", "data/a/f.csv", "data/b/", "data/g"]),
        work,
    )
    .unwrap();
    let files: Vec<_> = plan
        .iter()
        .map(|p| (p.key.as_str(), p.file.clone()))
        .collect();
    assert_eq!(
        files,
        [
            ("data/a/f.csv", work.join("a/f.csv")),
            ("data/g", work.join("g"))
        ]
    );
}

#[test]
fn a_key_that_is_also_a_folder_fails_naming_both_keys() {
    for keys in [
        &["data/x", "data/x/y"][..],
        &["data/x/y/z", "data/a", "data/x"][..],
    ] {
        let err = plan_download("data/", listed(keys), Path::new("/w"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("\"data/x\"") && err.contains("\"data/x/y"),
            "{err}"
        );
        assert!(err.ends_with("nothing was downloaded"), "{err}");
    }
    // Siblings sharing a name prefix are not folders of each other.
    plan_download("", listed(&["x", "xy/z", "x.d/z"]), Path::new("/w")).unwrap();
}

#[tokio::test]
async fn a_staging_branch_that_cannot_be_deleted_stays_named_in_the_owner_file() {
    let tmp = tempfile::tempdir().unwrap();
    let mut ws = attempt(tmp.path(), &[("a.txt", "a")]);
    ws.dir
        .record(|owner| {
            owner.repository = Some("repo".into());
            owner.staging_branch = Some("perago-staging-exec-1".into());
        })
        .unwrap();
    ws.dir
        .verify()
        .expect("a recorded owner file is still ours");
    ws.staging = Some("perago-staging-exec-1".to_owned());
    let (path, work) = (ws.dir.path.clone(), ws.work.clone());
    // lakeFS is unreachable: the branch cannot be deleted.
    ws.cleanup().await;
    let owner: Value =
        serde_json::from_str(&fs::read_to_string(path.join(OWNER_FILE)).unwrap()).unwrap();
    assert_eq!(owner["repository"], "repo");
    assert_eq!(owner["staging_branch"], "perago-staging-exec-1");
    assert_eq!(owner["execution_id"], "exec-1");
    assert_eq!(owner["done"], true);
    assert!(!work.exists(), "the files are gone");
}

#[test]
fn the_publish_budget_refuses_a_big_new_file_before_reading_it() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = attempt(tmp.path(), &[("a.txt", "a")]);
    // 64 GiB, sparse: hashing it first would take minutes.
    let big = fs::File::create(ws.work.join("big.bin")).unwrap();
    big.set_len(64 << 30).unwrap();
    let budget = PublishBudget {
        max_objects: None,
        max_bytes: Some(64 << 20),
        seconds: None,
    };
    let started = std::time::Instant::now();
    assert_eq!(
        message(ws.changes(None, Some(budget))),
        format!(
            "publish budget exceeded: {} bytes to upload, max_bytes is {}; nothing was published",
            64u64 << 30,
            64 << 20
        )
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn attempt_folders_are_closed_to_other_users() {
    use std::os::unix::fs::PermissionsExt as _;
    let tmp = tempfile::tempdir().unwrap();
    let ws = attempt(tmp.path(), &[("a.txt", "a")]);
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&tmp.path().join("attempts")), 0o711);
    assert_eq!(mode(&ws.dir.path), 0o711);
    assert_eq!(mode(&ws.work), 0o700);
    assert_eq!(mode(&ws.dir.path.join(OWNER_FILE)), 0o600);
}

#[test]
fn a_swept_and_remade_attempt_directory_fails_closed() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = attempt(tmp.path(), &[("a.txt", "a"), ("b.txt", "b")]);
    fs::write(ws.work.join("a.txt"), "edited").unwrap();
    assert_eq!(ws.changes(None, None).unwrap().changed.len(), 1);

    // Swept while the body ran; a body then makes its folder again with only its output.
    let path = ws.dir.path.clone();
    fs::remove_dir_all(&path).unwrap();
    fs::create_dir_all(&ws.work).unwrap();
    fs::write(ws.work.join("a.txt"), "edited").unwrap();
    let reason = message(ws.changes(None, None));
    assert!(
        reason.starts_with(&format!(
            "the attempt directory {} is no longer the one this executor created and filled: {} was removed and made again",
            path.display(),
            path.display()
        )),
        "{reason}"
    );
    assert!(reason.ends_with("nothing was published"), "{reason}");

    // Even an owner file put back by hand is not the one written.
    fs::write(path.join(OWNER_FILE), "{}").unwrap();
    assert!(message(ws.changes(None, None)).contains("was removed and made again"));
}

#[test]
fn an_attempt_directory_with_a_foreign_owner_file_fails_closed() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = attempt(tmp.path(), &[("a.txt", "a")]);
    ws.changes(None, None).unwrap();
    fs::write(ws.dir.path.join(OWNER_FILE), "{}").unwrap();
    assert!(message(ws.changes(None, None)).contains("its .perago-owner file was rewritten"),);
    fs::remove_file(ws.dir.path.join(OWNER_FILE)).unwrap();
    assert!(message(ws.changes(None, None)).contains("its .perago-owner file is gone"));
}
