//! Workspace tasks end to end: the real supervisor, broker and executors against devstack's
//! Conductor and lakeFS on loopback.

use crate::harness::{
    Conductor, Lakefs, SupervisorProc, TaskFixture, alive, child_named, eventually, gated_body,
    runs_worker, signal_pid, status_json,
};
use perago_devstack::faults::FaultSpec;
use serde_json::{Value, json};
use std::{path::Path, time::Duration};

const REPO: &str = "ws-e2e";

/// Edits a.txt, deletes b.txt, adds sub/new.txt, leaves c.txt alone.
const EDIT: &str = r#"read params
cd "$PERAGO_WORKSPACE_DIR"
echo edited > a.txt
rm b.txt
mkdir -p sub && echo fresh > sub/new.txt
printf '{"files": %s}' "$(find . -type f | wc -l)"
"#;

async fn seeded() -> Lakefs {
    let lakefs = Lakefs::start().await;
    lakefs
        .seed(
            REPO,
            &[
                ("data/a.txt", "a\n"),
                ("data/b.txt", "b\n"),
                ("data/c.txt", "c\n"),
                ("other/x.txt", "x\n"),
            ],
        )
        .await;
    lakefs
}

fn input(prefix: &str) -> Value {
    json!({"workspace": {"repository": REPO, "branch": "main", "prefix": prefix}, "params": {}})
}

fn task_of(wf: &Value) -> &Value {
    wf["tasks"]
        .as_array()
        .and_then(|t| t.last())
        .expect("a task")
}

/// The attempt directories left under a supervisor's root.
fn attempts_left(root: &Path) -> Vec<String> {
    std::fs::read_dir(root.join("attempts"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

async fn start(
    task: &TaskFixture,
    conductor: &Conductor,
    lakefs: &Lakefs,
    jobs: u32,
) -> SupervisorProc {
    conductor.register(task).await;
    SupervisorProc::start_owned(task, conductor, jobs, &lakefs.env())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_task_publishes_exactly_its_change() {
    let conductor = Conductor::start().await;
    let lakefs = seeded().await;
    let task = TaskFixture::workspace("ws.edit", EDIT, "", "");
    let sup = start(&task, &conductor, &lakefs, 1).await;
    let id = conductor.start_with(&task, input("data")).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());

    let ws = &wf["output"]["workspace"];
    assert_eq!(ws["repository"], REPO);
    assert_eq!(ws["branch"], "main");
    assert_eq!(
        (
            ws["added"].as_u64(),
            ws["changed"].as_u64(),
            ws["removed"].as_u64()
        ),
        (Some(1), Some(1), Some(1))
    );
    assert_eq!(wf["output"]["result"], json!({"files": 3}));

    assert_eq!(
        lakefs.read(REPO, "data/a.txt").await.as_deref(),
        Some("edited\n")
    );
    assert_eq!(lakefs.read(REPO, "data/b.txt").await, None);
    assert_eq!(
        lakefs.read(REPO, "data/c.txt").await.as_deref(),
        Some("c\n")
    );
    assert_eq!(
        lakefs.read(REPO, "data/sub/new.txt").await.as_deref(),
        Some("fresh\n")
    );
    assert_eq!(
        lakefs.read(REPO, "other/x.txt").await.as_deref(),
        Some("x\n")
    );

    // The published commit carries the attempt's identity.
    let commit_id = ws["commit_id"].as_str().unwrap();
    assert_eq!(
        lakefs.client.resolve_commit(REPO, "main").await.unwrap(),
        commit_id
    );
    let log = lakefs.client.log(REPO, "main", 10).await.unwrap();
    let head = log
        .iter()
        .find(|c| c.id == commit_id)
        .expect("the merge commit in the log");
    let metadata = head.metadata.clone().unwrap_or_default();
    let task_json = task_of(&wf);
    assert_eq!(metadata["workflow_id"], id.as_str());
    assert_eq!(metadata["task_id"], task_json["taskId"]);
    assert_eq!(metadata["retry_count"], "0");
    assert_eq!(metadata["worker_id"], task_json["workerId"]);
    assert_eq!(metadata["execution_id"].as_str().map(str::len), Some(36));
    assert!(
        metadata.get("retried_task_id").is_none(),
        "a first attempt retries nothing: {metadata:?}"
    );

    // Nothing left behind: no staging branch, no attempt directory.
    assert_eq!(lakefs.client.list_branches(REPO).await.unwrap(), ["main"]);
    assert!(attempts_left(&sup.workspace_root()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflicting_change_on_the_branch_fails_the_task_and_publishes_nothing() {
    let conductor = Conductor::start().await;
    let lakefs = seeded().await;
    // The body waits for the test to change the branch under it.
    let body = gated_body(
        r#"echo mine > "$PERAGO_WORKSPACE_DIR/a.txt"
echo '{}'
"#,
    );
    let task = TaskFixture::workspace("ws.conflict", &body, "retry_count = 0", "");
    let sup = start(&task, &conductor, &lakefs, 1).await;
    let id = conductor.start_with(&task, input("data")).await;
    let gate = task.gate();
    gate.started().await;
    lakefs
        .client
        .upload(REPO, "main", "data/a.txt", b"theirs\n".to_vec())
        .await
        .unwrap();
    lakefs
        .client
        .commit(REPO, "main", "a concurrent change", &serde_json::Map::new())
        .await
        .unwrap();
    gate.open();

    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "FAILED", "{wf:#}");
    let reason = task_of(&wf)["reasonForIncompletion"].as_str().unwrap();
    assert!(
        reason.starts_with(
            "publish failed: merge conflict: main changed paths this attempt also changed"
        ),
        "{reason}"
    );
    assert_eq!(
        lakefs.read(REPO, "data/a.txt").await.as_deref(),
        Some("theirs\n")
    );
    assert_eq!(lakefs.client.list_branches(REPO).await.unwrap(), ["main"]);
    assert!(attempts_left(&sup.workspace_root()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lakefs_errors_are_retried_on_download_and_reported_on_merge() {
    let conductor = Conductor::start().await;
    let lakefs = seeded().await;
    let task = TaskFixture::workspace("ws.flaky", EDIT, "retry_count = 0", "");
    let sup = start(&task, &conductor, &lakefs, 1).await;
    lakefs
        .server
        .faults()
        .add(FaultSpec {
            method: Some("GET".into()),
            path: format!("/api/v1/repositories/{REPO}/refs/"),
            status: Some(503),
            count: Some(3),
            ..FaultSpec::default()
        })
        .unwrap();
    let id = conductor.start_with(&task, input("data")).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());

    lakefs
        .server
        .faults()
        .add(FaultSpec {
            method: Some("POST".into()),
            path: format!("/api/v1/repositories/{REPO}/refs/perago-staging-"),
            status: Some(500),
            ..FaultSpec::default()
        })
        .unwrap();
    let before = lakefs.client.log(REPO, "main", 1).await.unwrap()[0]
        .id
        .clone();
    let id = conductor.start_with(&task, input("other")).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "FAILED", "{wf:#}");
    let reason = task_of(&wf)["reasonForIncompletion"].as_str().unwrap();
    assert!(
        reason.starts_with("publish failed: lakeFS merge"),
        "{reason}"
    );
    assert!(reason.contains("HTTP 500"), "{reason}");
    assert_eq!(
        lakefs.client.log(REPO, "main", 1).await.unwrap()[0].id,
        before
    );
    assert_eq!(lakefs.client.list_branches(REPO).await.unwrap(), ["main"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsafe_keys_and_escaping_symlinks_never_leave_the_workspace() {
    let conductor = Conductor::start().await;
    let lakefs = seeded().await;
    lakefs
        .client
        .upload(REPO, "main", "evil/../../escape.txt", b"gotcha".to_vec())
        .await
        .unwrap();
    lakefs
        .client
        .commit(REPO, "main", "a hostile key", &serde_json::Map::new())
        .await
        .unwrap();
    let body = r#"read params
ln -s /etc/hostname "$PERAGO_WORKSPACE_DIR/leak"
echo '{}'
"#;
    let task = TaskFixture::workspace("ws.escape", body, "retry_count = 0", "");
    let sup = start(&task, &conductor, &lakefs, 1).await;

    let id = conductor.start_with(&task, input("evil")).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "FAILED");
    assert_eq!(
        task_of(&wf)["reasonForIncompletion"],
        "object key \"evil/../../escape.txt\" is unsafe: it has a '.' or '..' segment"
    );
    let root = sup.workspace_root();
    assert!(!root.join("escape.txt").exists() && !root.join("attempts/escape.txt").exists());

    let before = lakefs.client.log(REPO, "main", 1).await.unwrap()[0]
        .id
        .clone();
    let id = conductor.start_with(&task, input("data")).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "FAILED");
    let reason = task_of(&wf)["reasonForIncompletion"].as_str().unwrap();
    assert!(
        reason.starts_with("leak is a symlink that points outside the workspace"),
        "{reason}"
    );
    assert_eq!(
        lakefs.client.log(REPO, "main", 1).await.unwrap()[0].id,
        before,
        "nothing published"
    );
    assert!(attempts_left(&root).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_publish_budget_stops_an_oversized_change_before_staging() {
    let conductor = Conductor::start().await;
    let lakefs = seeded().await;
    let task = TaskFixture::workspace(
        "ws.budget",
        EDIT,
        "retry_count = 0",
        "[workspace.publish_budget]\nmax_objects = 2\nseconds = 30\n",
    );
    let _sup = start(&task, &conductor, &lakefs, 1).await;
    let id = conductor.start_with(&task, input("data")).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "FAILED");
    assert_eq!(
        task_of(&wf)["reasonForIncompletion"],
        "publish budget exceeded: 3 objects changed, max_objects is 2; nothing was published"
    );
    assert_eq!(
        lakefs.read(REPO, "data/b.txt").await.as_deref(),
        Some("b\n")
    );
    assert_eq!(lakefs.client.list_branches(REPO).await.unwrap(), ["main"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_executors_attempt_directory_is_collected() {
    let conductor = Conductor::start().await;
    let lakefs = seeded().await;
    let body = "read params\ntouch started\nsleep 60\n";
    let task = TaskFixture::workspace("ws.gc", body, "retry_count = 0", "");
    let sup = start(&task, &conductor, &lakefs, 1).await;
    let _id = conductor.start_with(&task, input("data")).await;
    let gate = task.gate();
    gate.started().await;
    let root = sup.workspace_root();
    let left = attempts_left(&root);
    assert_eq!(left.len(), 1, "one attempt directory while the body runs");
    assert!(
        root.join("attempts")
            .join(&left[0])
            .join(".perago-owner")
            .exists()
    );
    let executor = child_named(sup.pid(), "perago-executor-0001").unwrap();
    signal_pid(executor.pid, "KILL");
    eventually(
        "targeted GC of the dead executor's attempt",
        Duration::from_secs(10),
        || async { attempts_left(&root).is_empty().then_some(()) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_supervisor_on_the_same_root_is_refused() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("ws.lock", "read p\necho '{}'\n", "");
    conductor.register(&task).await;
    let first = SupervisorProc::start(&task, &conductor, 1, &[]);
    eventually(
        "the first supervisor to run its broker",
        Duration::from_secs(20),
        || async { runs_worker(first.pid(), "perago-conductor-broker").then_some(()) },
    )
    .await;
    let out = perago_tests::Run::of(
        perago_tests::command(crate::harness::SUPERVISOR)
            .args(["start", task.manifest().to_str().unwrap()])
            .env("CONDUCTOR_SERVER_URL", conductor.server.base_url())
            .env("PERAGO_WORKSPACE_ROOT", first.workspace_root()),
    );
    out.expect_code(1);
    let root = std::fs::canonicalize(first.workspace_root()).unwrap();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(
        out.stderr,
        format!(
            "error: workspace root {} is locked by perago supervisor pid {} on {}\n",
            root.display(),
            first.pid(),
            host.trim()
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_attempt_publishes_nothing_and_its_retry_does() {
    let conductor = Conductor::start().await;
    let lakefs = seeded().await;
    let body = gated_body(
        r#"echo "attempt $PERAGO_TASK_ID" > "$PERAGO_WORKSPACE_DIR/a.txt"
echo '{}'
"#,
    );
    let task = TaskFixture::workspace(
        "ws.stale",
        &body,
        "retry_count = 1\nresponse_timeout_seconds = 2",
        "",
    );
    let sup = start(&task, &conductor, &lakefs, 1).await;
    let id = conductor.start_with(&task, input("data")).await;
    let gate = task.gate();
    gate.started().await;
    // Conductor stops hearing from the worker: lease extensions fail, the attempt times out and
    // Conductor schedules a retry while the first body still runs.
    conductor
        .server
        .faults()
        .add(FaultSpec {
            method: Some("POST".into()),
            path: "/api/tasks".into(),
            status: Some(503),
            ..FaultSpec::default()
        })
        .unwrap();
    eventually(
        "Conductor to time the attempt out",
        Duration::from_secs(20),
        || async {
            let wf = conductor.workflow(&id).await;
            (wf["tasks"][0]["status"] == "TIMED_OUT").then_some(())
        },
    )
    .await;
    conductor.server.faults().clear();
    gate.open();

    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
    let tasks = wf["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 2);
    let (stale, retry) = (&tasks[0]["taskId"], &tasks[1]["taskId"]);
    // Only the retry published: the stale attempt's fence stopped it before staging.
    let log = lakefs.client.log(REPO, "main", 20).await.unwrap();
    let published: Vec<&Value> = log
        .iter()
        .filter_map(|c| c.metadata.as_ref())
        .filter_map(|m| m.get("task_id"))
        .collect();
    assert!(published.contains(&retry), "{published:?}");
    assert!(!published.contains(&stale), "{published:?}");
    // The retry's commit names the attempt it retries.
    let retry_commit = log
        .iter()
        .filter_map(|c| c.metadata.as_ref())
        .find(|m| m.get("task_id") == Some(retry))
        .unwrap();
    assert_eq!(
        retry_commit.get("retried_task_id"),
        Some(stale),
        "{retry_commit:?}"
    );
    assert_eq!(
        lakefs.read(REPO, "data/a.txt").await,
        Some(format!("attempt {}\n", retry.as_str().unwrap()))
    );
    assert!(
        sup.log_text().contains("stale attempt: task status is TIMED_OUT, expected IN_PROGRESS (before staging); nothing was published"),
        "{}",
        sup.log_text()
    );
    assert_eq!(lakefs.client.list_branches(REPO).await.unwrap(), ["main"]);
    assert!(attempts_left(&sup.workspace_root()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_lock_is_reclaimed_and_orphans_are_swept_at_start_and_shutdown() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("ws.orphans", "read p\necho '{}'\n", "");
    conductor.register(&task).await;
    // A previous supervisor died: its lock file names a dead pid and an attempt is left.
    let root = tempfile::tempdir().unwrap();
    let ws = root.path().join("ws");
    std::fs::create_dir_all(ws.join("attempts/left-behind/work")).unwrap();
    std::fs::write(ws.join(".perago-supervisor.lock"), "999999999 oldhost 1\n").unwrap();
    let mut sup = SupervisorProc::start(
        &task,
        &conductor,
        1,
        &[("PERAGO_WORKSPACE_ROOT", ws.to_str().unwrap())],
    );
    eventually("the orphan sweep", Duration::from_secs(20), || async {
        (!ws.join("attempts/left-behind").exists()).then_some(())
    })
    .await;
    let lock = std::fs::read_to_string(ws.join(".perago-supervisor.lock")).unwrap();
    assert!(lock.starts_with(&format!("{} ", sup.pid())), "{lock}");
    // Anything left when the runtime stops is swept after it.
    eventually("the executor to run", Duration::from_secs(20), || async {
        runs_worker(sup.pid(), "perago-executor-0001").then_some(())
    })
    .await;
    std::fs::create_dir_all(ws.join("attempts/late/work")).unwrap();
    sup.signal("TERM");
    assert_eq!(sup.wait_exit(Duration::from_secs(30)).await.code(), Some(0));
    assert!(attempts_left(&ws).is_empty());
}

/// Waits until slot 1 of the runtime serving under `root` is attached and idle.
async fn first_slot_idle(root: &Path) {
    use perago_proto::admin::v1::{SlotState, StatusRequest, admin_client::AdminClient};
    let socket = root.join("run/broker.sock");
    eventually("slot 1 to be idle", Duration::from_secs(20), || async {
        let channel = perago_core::socket::connect(&socket).await.ok()?;
        let status = AdminClient::new(channel)
            .status(StatusRequest {})
            .await
            .ok()?;
        (status.get_ref().slots.first()?.state() == SlotState::Idle).then_some(())
    })
    .await;
}

/// Whether the three seeded files under `data/` are on `main` as seeded, apart from `a.txt`.
async fn untouched_but_a(lakefs: &Lakefs) -> bool {
    lakefs.read(REPO, "data/b.txt").await.as_deref() == Some("b\n")
        && lakefs.read(REPO, "data/c.txt").await.as_deref() == Some("c\n")
        && lakefs.read(REPO, "other/x.txt").await.as_deref() == Some("x\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_while_the_orphaned_runtime_drains_never_destroys_its_work() {
    let conductor = Conductor::start().await;
    let lakefs = seeded().await;
    // A careless body: if its folder vanished, it makes a new one holding only its output (the
    // sweep of a live attempt used to turn that into "the body deleted every other file").
    let body = gated_body(
        r#"mkdir -p "$PERAGO_WORKSPACE_DIR"
echo edited > "$PERAGO_WORKSPACE_DIR/a.txt"
echo '{}'
"#,
    );
    let task = TaskFixture::workspace("ws.restart", &body, "retry_count = 0", "");
    let mut first = start(&task, &conductor, &lakefs, 1).await;
    let id = conductor.start_with(&task, input("data")).await;
    let gate = task.gate();
    gate.started().await;
    let root = first.workspace_root();
    let attempt = attempts_left(&root);
    assert_eq!(attempt.len(), 1);
    let broker = child_named(first.pid(), "perago-conductor-broker").unwrap();
    let executor = child_named(first.pid(), "perago-executor-0001").unwrap();

    // The supervisor dies; its broker and executor drain on (parent-death signal: SIGTERM).
    first.signal("KILL");
    first.wait_exit(Duration::from_secs(5)).await;
    let with_root = |wait: &str| {
        let mut env = lakefs.env();
        env.push(("PERAGO_WORKSPACE_ROOT", root.display().to_string()));
        env.push(("PERAGO_ROOT_LOCK_WAIT", wait.to_owned()));
        env
    };

    // A start at once that will not wait long refuses, and says why; it sweeps nothing.
    let mut refused = SupervisorProc::start_owned(&task, &conductor, 1, &with_root("500ms"));
    let status = refused.wait_exit(Duration::from_secs(20)).await;
    let log = refused.log_text();
    assert_eq!(status.code(), Some(1), "{log}");
    let message = format!(
        "error: workspace root {} is still held by the runtime of perago supervisor pid {}, which has exited: its processes are still draining",
        std::fs::canonicalize(&root).unwrap().display(),
        first.pid()
    );
    assert!(log.contains(&message), "{log}");
    for (name, pid) in [
        ("perago-conductor-broker", broker.pid),
        ("perago-executor-0001", executor.pid),
    ] {
        assert!(log.contains(&format!("{name} (pid {pid})")), "{log}");
    }
    assert!(!log.contains("control token"), "{log}");
    assert_eq!(attempts_left(&root), attempt, "the live attempt was swept");
    assert!(alive(broker.pid) && alive(executor.pid));

    // A start that waits takes the root once the old runtime has finished, and not before.
    let mut next = SupervisorProc::start_owned(&task, &conductor, 1, &with_root("30s"));
    eventually(
        "the next start to wait",
        Duration::from_secs(10),
        || async {
            next.log_text()
                .contains("waiting for it to finish")
                .then_some(())
        },
    )
    .await;
    assert!(child_named(next.pid(), "perago-conductor-broker").is_none());
    assert_eq!(attempts_left(&root), attempt, "the live attempt was swept");

    gate.open();
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}");
    // Exactly the body's change: a.txt edited, nothing deleted.
    assert_eq!(
        lakefs.read(REPO, "data/a.txt").await.as_deref(),
        Some("edited\n")
    );
    assert!(
        untouched_but_a(&lakefs).await,
        "main lost files the body never deleted"
    );
    assert_eq!(wf["output"]["workspace"]["removed"], 0);

    eventually(
        "the next runtime to start once the old one is gone",
        Duration::from_secs(20),
        || async { child_named(next.pid(), "perago-conductor-broker") },
    )
    .await;
    eventually(
        "the old runtime to be gone",
        Duration::from_secs(5),
        || async { (!alive(broker.pid) && !alive(executor.pid)).then_some(()) },
    )
    .await;
    // Its executor attaches (a drain before that would only test the attach timeout).
    first_slot_idle(&root).await;
    next.signal("TERM");
    let log = next.log_text();
    assert_eq!(
        next.wait_exit(Duration::from_secs(20)).await.code(),
        Some(0),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_changed_nothing_is_still_fenced() {
    let conductor = Conductor::start().await;
    let lakefs = seeded().await;
    let body = gated_body("echo '{}'\n");
    let task = TaskFixture::workspace("ws.unchanged", &body, "retry_count = 0", "");
    let sup = start(&task, &conductor, &lakefs, 1).await;
    let id = conductor.start_with(&task, input("data")).await;
    let gate = task.gate();
    gate.started().await;
    // Conductor forgets the task while the body runs: its fence read answers 404.
    let task_id = task_of(&conductor.workflow(&id).await)["taskId"]
        .as_str()
        .unwrap()
        .to_owned();
    conductor
        .server
        .faults()
        .add(FaultSpec {
            method: Some("GET".into()),
            path: format!("/api/tasks/{task_id}"),
            status: Some(404),
            ..FaultSpec::default()
        })
        .unwrap();
    gate.open();
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "FAILED", "{wf:#}\n{}", sup.log_text());
    assert_eq!(
        task_of(&wf)["reasonForIncompletion"],
        format!(
            "stale attempt: Conductor no longer knows task {task_id} (before staging); nothing was published"
        )
    );
    assert!(attempts_left(&sup.workspace_root()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_never_talks_to_a_broker_it_did_not_start() {
    use std::os::unix::fs::PermissionsExt as _;
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("ws.foreign", "read p\necho '{}'\n", "");
    conductor.register(&task).await;
    // A broker serving under the root without holding its lock (another runtime's).
    let root = tempfile::tempdir().unwrap();
    let ws = std::fs::canonicalize(root.path()).unwrap().join("ws");
    std::fs::create_dir_all(ws.join("run")).unwrap();
    std::fs::set_permissions(ws.join("run"), std::fs::Permissions::from_mode(0o700)).unwrap();
    let socket = ws.join("run/broker.sock");
    // One of its attempts, whose owner this test cannot show to be alive.
    std::fs::create_dir_all(ws.join("attempts/theirs/work")).unwrap();
    let mut foreign = perago_tests::command(crate::harness::BROKER)
        .env("CONDUCTOR_SERVER_URL", conductor.server.base_url())
        .env("PERAGO_SOCKET", &socket)
        .env("PERAGO_SLOTS", "1")
        .env("PERAGO_CONTROL_TOKEN", "not-yours")
        .env("PERAGO_TASK_NAME", &task.name)
        .env("PERAGO_WORKER_ID_PREFIX", task.prefix())
        .env("PERAGO_POLL_WAIT_MS", "200")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    eventually(
        "the foreign broker to serve",
        Duration::from_secs(10),
        || async { perago_core::socket::connect(&socket).await.ok() },
    )
    .await;

    let mut sup = SupervisorProc::start(
        &task,
        &conductor,
        1,
        &[("PERAGO_WORKSPACE_ROOT", ws.to_str().unwrap())],
    );
    let status = sup.wait_exit(Duration::from_secs(20)).await;
    let log = sup.log_text();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains(&format!(
            "error: another runtime is running under this workspace root: a broker (pid {}) already answers on {}; this supervisor did not start it and will not use it (stop that runtime first)",
            foreign.id(),
            socket.display()
        )),
        "{log}"
    );
    assert!(!log.contains("control token"), "{log}");
    assert!(alive(foreign.id()), "the foreign broker was left alone");
    assert!(socket.exists());
    assert_eq!(
        attempts_left(&ws),
        ["theirs"],
        "its attempts were left alone"
    );
    let _ = foreign.kill();
    let _ = foreign.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_directory_removed_under_the_body_publishes_nothing() {
    let conductor = Conductor::start().await;
    let lakefs = seeded().await;
    // Whoever removes the attempt directory (here the body itself), the input snapshot is gone:
    // the folder made again holds only the output, which must not read as "deleted the rest".
    let body = r#"read params
rm -rf "$(dirname "$PERAGO_WORKSPACE_DIR")"
mkdir -p "$PERAGO_WORKSPACE_DIR"
echo edited > "$PERAGO_WORKSPACE_DIR/a.txt"
echo '{}'
"#;
    let task = TaskFixture::workspace("ws.swept", body, "retry_count = 0", "");
    let sup = start(&task, &conductor, &lakefs, 1).await;
    let before = lakefs.client.log(REPO, "main", 1).await.unwrap()[0]
        .id
        .clone();
    let id = conductor.start_with(&task, input("data")).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "FAILED", "{wf:#}\n{}", sup.log_text());
    let reason = task_of(&wf)["reasonForIncompletion"].as_str().unwrap();
    assert!(
        reason.starts_with("the attempt directory ")
            && reason.contains("is no longer the one this executor created and filled"),
        "{reason}"
    );
    assert_eq!(
        lakefs.client.log(REPO, "main", 1).await.unwrap()[0].id,
        before,
        "nothing published"
    );
    assert_eq!(
        lakefs.read(REPO, "data/a.txt").await.as_deref(),
        Some("a\n")
    );
    assert!(untouched_but_a(&lakefs).await);
    assert_eq!(lakefs.client.list_branches(REPO).await.unwrap(), ["main"]);
}

/// The attempt fence, scripted: the reads in order, then "unavailable".
struct ScriptedFence(std::sync::Mutex<Vec<perago_executor::workspace::flow::FenceRead>>);

impl perago_executor::workspace::flow::Fence for ScriptedFence {
    fn reload(
        &self,
    ) -> std::pin::Pin<
        Box<dyn Future<Output = perago_executor::workspace::flow::FenceRead> + Send + '_>,
    > {
        let next = self.0.lock().unwrap().pop();
        Box::pin(async move {
            next.unwrap_or(perago_executor::workspace::flow::FenceRead::Unavailable(
                "script ended".to_owned(),
            ))
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_second_fence_stops_a_staged_change_before_it_is_published() {
    use perago_core::attempt::AttemptSnapshot;
    use perago_executor::workspace::flow::{Attempt, FenceRead, Owner, WorkspaceFailure};
    let lakefs = seeded().await;
    let snapshot = |status: &str| {
        AttemptSnapshot::from_conductor(&json!({
            "taskId": "t-1", "workflowInstanceId": "wf-1", "retryCount": 0,
            "taskDefName": "ws.fence", "referenceTaskName": "t", "seq": 1,
            "status": status, "inputData": input("data")
        }))
        .unwrap()
    };
    let root = tempfile::tempdir().unwrap();
    let input = perago_core::shape::WorkspaceInput {
        repository: REPO.to_owned(),
        branch: "main".to_owned(),
        prefix: "data/".to_owned(),
        source_ref: None,
    };
    let before = lakefs.client.resolve_commit(REPO, "main").await.unwrap();
    let mut ws = Attempt::prepare(
        lakefs.client.clone(),
        root.path(),
        "exec-1",
        Owner {
            slot: 1,
            generation: 1,
        },
        input,
    )
    .await
    .unwrap();
    std::fs::write(ws.work_dir().join("a.txt"), "edited\n").unwrap();
    let changes = ws.changes(None, None).unwrap();
    assert_eq!(changes.changed.len(), 1);
    // Current before staging; timed out (a retry scheduled) once the change is staged.
    let fence = ScriptedFence(std::sync::Mutex::new(vec![
        FenceRead::Fresh(Box::new(snapshot("TIMED_OUT"))),
        FenceRead::Fresh(Box::new(snapshot("IN_PROGRESS"))),
    ]));
    let spec = perago_core::manifest::WorkspaceSpec {
        prefix: String::new(),
        merge_timeout_seconds: 10,
        publish_budget: None,
        download_budget: None,
    };
    // The phase turns "publishing" once the change is staged: after the fence before
    // staging, before the one before publishing (fence reads left in the script then: 1).
    let left_when_publishing = std::sync::atomic::AtomicUsize::new(usize::MAX);
    let publishing = || {
        let left = fence.0.lock().unwrap().len();
        left_when_publishing.store(left, std::sync::atomic::Ordering::SeqCst);
    };
    let result = ws
        .publish(
            &changes,
            &spec,
            &fence,
            &snapshot("IN_PROGRESS"),
            "exec-1",
            serde_json::Map::new(),
            &publishing,
        )
        .await;
    assert_eq!(
        left_when_publishing.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the publishing phase starts between the two fences"
    );
    let Err(failure) = result else {
        panic!("published past a stale fence: {result:?}");
    };
    assert!(
        matches!(
            failure,
            WorkspaceFailure::Fence {
                when: "before publishing",
                ..
            }
        ),
        "{failure:?}"
    );
    assert_eq!(
        failure.to_string(),
        "stale attempt: task status is TIMED_OUT, expected IN_PROGRESS (before publishing); nothing was published"
    );
    // The staged commit exists, but main never saw it; cleanup removes the staging branch.
    assert_eq!(
        lakefs.client.list_branches(REPO).await.unwrap(),
        ["main", "perago-staging-exec-1"]
    );
    assert_eq!(
        lakefs.client.resolve_commit(REPO, "main").await.unwrap(),
        before
    );
    ws.cleanup().await;
    assert_eq!(lakefs.client.list_branches(REPO).await.unwrap(), ["main"]);
    assert!(attempts_left(root.path()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_attempt_fails_closed_after_the_fence_patience() {
    let conductor = Conductor::start().await;
    let lakefs = seeded().await;
    let body = gated_body("echo edited > \"$PERAGO_WORKSPACE_DIR/a.txt\"\necho '{}'\n");
    let task = TaskFixture::workspace("ws.fenceless", &body, "retry_count = 0", "");
    let sup = start(&task, &conductor, &lakefs, 1).await;
    let id = conductor.start_with(&task, input("data")).await;
    let gate = task.gate();
    gate.started().await;
    // Conductor cannot answer the fence read (for longer than the executor's ≈10 s patience).
    let task_id = task_of(&conductor.workflow(&id).await)["taskId"]
        .as_str()
        .unwrap()
        .to_owned();
    conductor
        .server
        .faults()
        .add(FaultSpec {
            method: Some("GET".into()),
            path: format!("/api/tasks/{task_id}"),
            status: Some(503),
            ..FaultSpec::default()
        })
        .unwrap();
    gate.open();
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "FAILED", "{wf:#}\n{}", sup.log_text());
    let reason = task_of(&wf)["reasonForIncompletion"].as_str().unwrap();
    assert!(
        reason.starts_with("attempt fence unavailable: "),
        "{reason}"
    );
    assert_eq!(
        lakefs.read(REPO, "data/a.txt").await.as_deref(),
        Some("a\n")
    );
    assert_eq!(lakefs.client.list_branches(REPO).await.unwrap(), ["main"]);
    assert!(attempts_left(&sup.workspace_root()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_left_by_a_body_never_holds_the_root() {
    let conductor = Conductor::start().await;
    // The body leaves a daemon behind (its own session, stdio closed), as careless bodies do.
    let body = "read p\n( setsid sleep 20 </dev/null >/dev/null 2>&1 & echo $! > daemon.pid )\necho '{}'\n";
    let task = TaskFixture::new("ws.daemon", body, "");
    conductor.register(&task).await;
    let mut first = SupervisorProc::start(&task, &conductor, 1, &[]);
    let id = conductor.start_workflow(&task, json!({})).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}");
    let daemon: u32 = std::fs::read_to_string(task.dir.path().join("daemon.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    first.signal("TERM");
    assert_eq!(
        first.wait_exit(Duration::from_secs(20)).await.code(),
        Some(0)
    );

    // The runtime is gone; the daemon may live on, but the root is free at once.
    let root = first.workspace_root();
    let mut next = SupervisorProc::start(
        &task,
        &conductor,
        1,
        &[
            ("PERAGO_WORKSPACE_ROOT", root.to_str().unwrap()),
            ("PERAGO_ROOT_LOCK_WAIT", "200ms"),
        ],
    );
    first_slot_idle(&root).await;
    let log = next.log_text();
    assert!(!log.contains("still draining"), "{log}");
    if alive(daemon) {
        signal_pid(daemon, "KILL");
    }
    next.signal("TERM");
    next.wait_exit(Duration::from_secs(20)).await;
}

/// Edits as [`EDIT`] does, and says who it ran as.
const AS_USER: &str = r#"cd "$PERAGO_WORKSPACE_DIR"
echo edited > a.txt
rm b.txt
mkdir -p sub && echo fresh > sub/new.txt
printf '{"uid": %s}' "$(id -u)"
"#;

/// `[body] user`: the body runs as that user on files it owns, and its change is published;
/// a workspace root the user cannot reach fails the attempt saying so, publishing nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_user_works_on_its_own_files_and_its_change_is_published() {
    if perago_sys::user::euid() != 0 {
        eprintln!("skipped: switching users needs root");
        return;
    }
    let conductor = Conductor::start().await;
    let lakefs = seeded().await;
    let task = TaskFixture::workspace("ws.bodyuser", AS_USER, "", "");
    let manifest = std::fs::read_to_string(task.manifest()).unwrap();
    std::fs::write(
        task.manifest(),
        manifest.replace("[body]\n", "[body]\nuser = \"nobody\"\n"),
    )
    .unwrap();
    assert!(
        std::fs::read_to_string(task.manifest())
            .unwrap()
            .contains("user = \"nobody\""),
        "{}",
        std::fs::read_to_string(task.manifest()).unwrap()
    );
    let open: std::fs::Permissions = std::os::unix::fs::PermissionsExt::from_mode(0o755);
    std::fs::set_permissions(task.dir.path(), open.clone()).unwrap();
    // A workspace root nobody can reach first: 0700, owned by root.
    let closed = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        closed.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let mut env = lakefs.env();
    env.push((
        "PERAGO_WORKSPACE_ROOT",
        closed.path().join("ws").display().to_string(),
    ));
    conductor.register(&task).await;
    let sup = SupervisorProc::start_owned(&task, &conductor, 1, &env);
    let id = conductor.start_with(&task, input("data")).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    let reason = task_of(&wf)["reasonForIncompletion"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        reason.contains("body.user (uid 65534) cannot reach its workspace"),
        "{reason}\n{}",
        sup.log_text()
    );
    assert_eq!(
        lakefs.read(REPO, "data/a.txt").await.as_deref(),
        Some("a\n")
    );
    drop(sup);

    let reachable = tempfile::tempdir().unwrap();
    std::fs::set_permissions(reachable.path(), open).unwrap();
    let mut env = lakefs.env();
    env.push((
        "PERAGO_WORKSPACE_ROOT",
        reachable.path().join("ws").display().to_string(),
    ));
    let sup = SupervisorProc::start_owned(&task, &conductor, 1, &env);
    let id = conductor.start_with(&task, input("data")).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
    assert_eq!(
        lakefs.read(REPO, "data/a.txt").await.as_deref(),
        Some("edited\n")
    );
    assert_eq!(lakefs.read(REPO, "data/b.txt").await, None);
    assert_eq!(
        lakefs.read(REPO, "data/sub/new.txt").await.as_deref(),
        Some("fresh\n")
    );
}

/// The peak resident memory (`VmHWM`) of a process, in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/<pid>/status");
    kib * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_files_are_streamed_with_bounded_executor_memory() {
    const MIB: u64 = 1 << 20;
    const FILE: u64 = 64 * MIB;
    // Well below one file, let alone the 3 × 64 MiB downloaded and the 3 × 64 MiB published.
    const BOUND: u64 = 48 * MIB;
    let conductor = Conductor::start().await;
    let lakefs = seeded().await;
    for i in 1..=3u8 {
        lakefs
            .client
            .upload(
                REPO,
                "main",
                &format!("big/in-{i}.bin"),
                vec![i; FILE as usize],
            )
            .await
            .unwrap();
    }
    lakefs
        .client
        .commit(REPO, "main", "big inputs", &serde_json::Map::new())
        .await
        .unwrap();
    // Checks what it downloaded, removes it and writes three new large files.
    let body = format!(
        r#"read params
cd "$PERAGO_WORKSPACE_DIR"
for i in 1 2 3; do
  [ "$(stat -c %s in-$i.bin)" = {FILE} ] || exit 3
  rm in-$i.bin
  head -c {FILE} /dev/zero | tr '\0' "$i" > out-$i.bin
done
echo '{{}}'
"#
    );
    let task = TaskFixture::workspace("ws.big", &body, "retry_count = 0", "");
    let sup = start(&task, &conductor, &lakefs, 1).await;
    let id = conductor.start_with(&task, input("big")).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(60)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
    let ws = &wf["output"]["workspace"];
    assert_eq!(
        (ws["added"].as_u64(), ws["removed"].as_u64()),
        (Some(3), Some(3))
    );

    let executor = child_named(sup.pid(), "perago-executor-0001").expect("the executor");
    let peak = peak_rss(executor.pid);
    eprintln!("the executor peaked at {} MiB", peak / MIB);
    assert!(
        peak < BOUND,
        "the executor peaked at {} MiB moving 6 × 64 MiB (bound {} MiB)",
        peak / MIB,
        BOUND / MIB
    );

    // main holds exactly the three new files, with lakeFS's MD5 checksums.
    let objects = lakefs
        .client
        .list_objects(REPO, "main", "big/", 1000)
        .await
        .unwrap();
    let listed: Vec<_> = objects
        .iter()
        .map(|o| (o.path.as_str(), o.size_bytes, o.checksum.clone()))
        .collect();
    let md5 = |i: u8| {
        use md5::Digest as _;
        md5::Md5::digest(vec![b'0' + i; FILE as usize])
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    assert_eq!(
        listed,
        (1..=3u8)
            .map(|i| (
                ["big/out-1.bin", "big/out-2.bin", "big/out-3.bin"][usize::from(i - 1)],
                Some(FILE),
                md5(i)
            ))
            .collect::<Vec<_>>()
    );
    assert_eq!(lakefs.client.list_branches(REPO).await.unwrap(), ["main"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn folder_markers_clashing_keys_and_folder_links_in_a_workspace() {
    let conductor = Conductor::start().await;
    let lakefs = seeded().await;
    for (key, content) in [
        ("mk/", ""),
        ("mk/sub/", ""),
        ("mk/sub/f.txt", "f\n"),
        ("dup/x", "file\n"),
        ("dup/x/y", "under it\n"),
    ] {
        lakefs
            .client
            .upload(REPO, "main", key, content.as_bytes().to_vec())
            .await
            .unwrap();
    }
    lakefs
        .client
        .commit(REPO, "main", "markers and a clash", &serde_json::Map::new())
        .await
        .unwrap();
    let body = r#"read params
cd "$PERAGO_WORKSPACE_DIR"
echo edited > sub/f.txt
mkdir -p runs/3 && echo out > runs/3/out.txt
ln -s runs/3 latest
echo '{}'
"#;
    let task = TaskFixture::workspace("ws.markers", body, "retry_count = 0", "");
    let sup = start(&task, &conductor, &lakefs, 1).await;

    let id = conductor.start_with(&task, input("mk/")).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
    let keys: Vec<_> = lakefs
        .client
        .list_objects(REPO, "main", "mk/", 1000)
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.path)
        .collect();
    // The markers are left as they were; the folder link is not published.
    assert_eq!(
        keys,
        ["mk/", "mk/runs/3/out.txt", "mk/sub/", "mk/sub/f.txt"]
    );
    assert_eq!(
        lakefs.read(REPO, "mk/sub/f.txt").await.as_deref(),
        Some("edited\n")
    );

    let before = lakefs.client.resolve_commit(REPO, "main").await.unwrap();
    let id = conductor.start_with(&task, input("dup/")).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "FAILED");
    assert_eq!(
        task_of(&wf)["reasonForIncompletion"],
        "workspace download failed: object key \"dup/x/y\" needs \"dup/x\" to be a folder, but it is an object too; a workspace cannot hold both; nothing was downloaded"
    );
    assert_eq!(
        lakefs.client.resolve_commit(REPO, "main").await.unwrap(),
        before,
        "nothing published"
    );
    assert_eq!(lakefs.client.list_branches(REPO).await.unwrap(), ["main"]);
    assert!(attempts_left(&sup.workspace_root()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staging_branch_left_by_an_executor_killed_mid_publish_is_deleted() {
    let conductor = Conductor::start().await;
    let lakefs = seeded().await;
    let task = TaskFixture::workspace("ws.staging", EDIT, "retry_count = 0", "");
    let mut env = lakefs.env();
    env.push(("PERAGO_WORKSPACE_GC_INTERVAL", "1s".to_owned()));
    conductor.register(&task).await;
    let sup = SupervisorProc::start_owned(&task, &conductor, 1, &env);
    let root = sup.workspace_root();
    let staging_path = format!("/api/v1/repositories/{REPO}/branches/perago-staging-");
    let faults = lakefs.server.faults();
    // Uploads to the staging branch hang: the executor is killed mid-publish.
    faults
        .add(FaultSpec {
            method: Some("POST".into()),
            path: staging_path.clone(),
            latency_ms: Some(60_000),
            ..FaultSpec::default()
        })
        .unwrap();
    // And the branch cannot be deleted at first.
    let refuse_delete = faults
        .add(FaultSpec {
            method: Some("DELETE".into()),
            path: staging_path.clone(),
            status: Some(503),
            ..FaultSpec::default()
        })
        .unwrap();
    let before = lakefs.client.resolve_commit(REPO, "main").await.unwrap();
    let id = conductor.start_with(&task, input("data")).await;
    let staging = eventually("a staging branch", Duration::from_secs(20), || async {
        lakefs
            .client
            .list_branches(REPO)
            .await
            .unwrap()
            .into_iter()
            .find(|b| b.starts_with("perago-staging-"))
    })
    .await;
    let executor = child_named(sup.pid(), "perago-executor-0001").unwrap();
    signal_pid(executor.pid, "KILL");

    // The GC cannot delete it yet: `status` lists it, its attempt directory stays.
    let listed = eventually(
        "status to list the branch",
        Duration::from_secs(15),
        || async {
            let left = status_json(&root)["staging_branches_left"].clone();
            (left.as_array().is_some_and(|l| !l.is_empty())).then_some(left)
        },
    )
    .await;
    assert_eq!(listed[0]["repository"], REPO);
    assert_eq!(listed[0]["branch"], staging.as_str());
    assert_eq!(attempts_left(&root).len(), 1);
    let wf = conductor.wait_terminal(&id, Duration::from_secs(20)).await;
    assert_eq!(wf["status"], "FAILED");

    // lakeFS answers again: the periodic GC deletes the branch, then the directory.
    assert!(faults.remove(refuse_delete));
    eventually(
        "the staging branch deleted",
        Duration::from_secs(15),
        || async { (lakefs.client.list_branches(REPO).await.unwrap() == ["main"]).then_some(()) },
    )
    .await;
    eventually(
        "the attempt directory removed",
        Duration::from_secs(10),
        || async { attempts_left(&root).is_empty().then_some(()) },
    )
    .await;
    let status = eventually(
        "status to list nothing",
        Duration::from_secs(10),
        || async {
            let status = status_json(&root);
            (status["staging_branches_left"] == json!([])).then_some(status)
        },
    )
    .await;
    assert_eq!(status["task_name"], task.name.as_str());
    // Nothing partial was published.
    assert_eq!(
        lakefs.client.resolve_commit(REPO, "main").await.unwrap(),
        before
    );
    assert_eq!(
        lakefs.read(REPO, "data/b.txt").await.as_deref(),
        Some("b\n")
    );
    faults.clear();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_start_sweep_deletes_staging_branches_an_earlier_runtime_left() {
    let conductor = Conductor::start().await;
    let lakefs = seeded().await;
    let task = TaskFixture::workspace("ws.leftover", EDIT, "retry_count = 0", "");
    conductor.register(&task).await;
    // An earlier runtime died mid-publish: its attempt names its staging branch, and one
    // attempt's owner file was rewritten to name `main`.
    let left = "perago-staging-0b9c1a6e-0000-4000-8000-000000000001";
    lakefs
        .client
        .create_branch(REPO, left, "main")
        .await
        .unwrap();
    let root = tempfile::tempdir().unwrap();
    let ws = root.path().join("ws");
    for (id, branch) in [
        ("0b9c1a6e-0000-4000-8000-000000000001", left),
        ("0b9c1a6e-0000-4000-8000-000000000002", "main"),
    ] {
        let dir = ws.join("attempts").join(id);
        std::fs::create_dir_all(dir.join("work")).unwrap();
        std::fs::write(
            dir.join(".perago-owner"),
            json!({"slot": 1, "generation": 1, "pid": 999_999_999u64, "execution_id": id,
                   "created": 1, "repository": REPO, "staging_branch": branch})
            .to_string(),
        )
        .unwrap();
    }
    let mut env = lakefs.env();
    env.push(("PERAGO_WORKSPACE_ROOT", ws.display().to_string()));
    let mut sup = SupervisorProc::start_owned(&task, &conductor, 1, &env);
    eventually("the start sweep", Duration::from_secs(20), || async {
        attempts_left(&ws).is_empty().then_some(())
    })
    .await;
    assert_eq!(lakefs.client.list_branches(REPO).await.unwrap(), ["main"]);
    // The runtime works as usual afterwards.
    let id = conductor.start_with(&task, input("data")).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
    sup.signal("TERM");
    assert_eq!(sup.wait_exit(Duration::from_secs(30)).await.code(), Some(0));
    assert_eq!(lakefs.client.list_branches(REPO).await.unwrap(), ["main"]);
}

/// A workspace task whose result Conductor refuses after it published: the "task result lost"
/// line names the commit its change went out as, for whoever reconciles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_result_names_the_commit_it_published() {
    let conductor = Conductor::start().await;
    let lakefs = seeded().await;
    let task = TaskFixture::workspace("ws.lost", EDIT, "", "");
    let sup = start(&task, &conductor, &lakefs, 1).await;
    let before = lakefs.client.resolve_commit(REPO, "main").await.unwrap();
    // Every update is refused for good (400: not retried).
    for path in ["/api/tasks/update-v2", "/api/tasks"] {
        conductor
            .server
            .faults()
            .add(FaultSpec {
                method: Some("POST".into()),
                path: path.into(),
                status: Some(400),
                ..FaultSpec::default()
            })
            .unwrap();
    }
    conductor.start_with(&task, input("data")).await;
    let line = eventually("the result to be lost", Duration::from_secs(30), || async {
        sup.log_text()
            .lines()
            .find(|l| l.contains("task result lost"))
            .map(str::to_owned)
    })
    .await;
    let head = lakefs.client.resolve_commit(REPO, "main").await.unwrap();
    assert_ne!(head, before, "the change was published");
    assert!(
        line.contains(&format!("published as commit {head}"))
            && line.contains(&format!("published_commit=\"{head}\"")),
        "{line}"
    );
}

/// A Rust `Task` body of a workspace task finds its files through `TaskContext::workspace_dir`,
/// and what it writes there is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rust_task_works_in_its_workspace_directory() {
    use perago_executor::{
        assignment::{AssignmentIo, AssignmentRunner, WorkspaceRuntime},
        task::{Task, TaskContext, TaskError},
        workspace::flow::{FenceRead, Owner},
    };
    struct Writes;
    impl Task for Writes {
        fn run(
            &self,
            ctx: &TaskContext,
            _params: &serde_json::Map<String, Value>,
        ) -> Result<Value, TaskError> {
            let dir = ctx
                .workspace_dir
                .as_ref()
                .ok_or_else(|| TaskError::Terminal("no workspace directory".into()))?;
            let seen = std::fs::read_to_string(dir.join("a.txt")).unwrap_or_default();
            std::fs::write(dir.join("r.txt"), "from rust\n")
                .map_err(|e| TaskError::Retriable(e.to_string()))?;
            Ok(json!({"seen": seen}))
        }
    }
    let lakefs = seeded().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("task.toml"),
        "[task]\nname = \"ws.rust\"\nkind = \"workspace\"\ntimeout_seconds = 30\n[body]\nexecutor = \"/bin/true\"\n",
    )
    .unwrap();
    let manifest = perago_core::manifest::Manifest::load(&dir.path().join("task.toml")).unwrap();
    let runner = AssignmentRunner::with_task(
        std::sync::Arc::new(manifest),
        "wsrust0001".into(),
        None,
        std::sync::Arc::new(Writes),
    )
    .unwrap()
    .with_workspace(WorkspaceRuntime {
        root: dir.path().join("root"),
        lakefs: Ok(lakefs.client.clone()),
        owner: Owner {
            slot: 1,
            generation: 1,
        },
    });
    let snapshot = || {
        perago_core::attempt::AttemptSnapshot::from_conductor(&json!({
            "taskId": "t-rust", "workflowInstanceId": "wf", "retryCount": 0,
            "taskDefName": "ws.rust", "referenceTaskName": "r", "seq": 1,
            "status": "IN_PROGRESS", "inputData": input("data")
        }))
        .unwrap()
    };
    let fence = ScriptedFence(std::sync::Mutex::new(vec![
        FenceRead::Fresh(Box::new(snapshot())),
        FenceRead::Fresh(Box::new(snapshot())),
    ]));
    let io = AssignmentIo {
        fence: Some(&fence),
        ..AssignmentIo::default()
    };
    let result = runner.execute_with("exec-rust", &snapshot(), &io).await;
    let perago_core::result::Outcome::Completed(output) = result.outcome() else {
        panic!("{result:?}");
    };
    let output = output.to_value().unwrap();
    assert_eq!(output["result"]["seen"], "a\n", "{output}");
    assert_eq!(output["workspace"]["added"], 1, "{output}");
    assert_eq!(
        lakefs.read(REPO, "data/r.txt").await.as_deref(),
        Some("from rust\n")
    );
}

/// Two tasks of one type, both bodies as `nobody`.
/// The victim writes `out.txt` and waits for `go`; the attacker finds the victim's workspace
/// in the victim body's `/proc/<pid>/environ`, watches it with inotify, and as soon as the
/// executor has read `out.txt` for the scan, tries to read the victim's input and to swap
/// `out.txt` for a symlink to a root-only file. It reports what it managed.
const RACE: &str = r#"import ctypes, json, os, select, struct, sys, time

params = json.load(sys.stdin)
rdv = params["rendezvous"]
mine = os.environ["PERAGO_WORKSPACE_DIR"]


def wait_for(name):
    deadline = time.monotonic() + 30
    while not os.path.exists(os.path.join(rdv, name)):
        if time.monotonic() > deadline:
            sys.exit(f"timed out waiting for {name}")
        time.sleep(0.01)


def readable(path):
    try:
        with open(path) as f:
            f.read()
        return True
    except OSError:
        return False


if params["role"] == "victim":
    with open(os.path.join(mine, "out.txt"), "w") as f:
        f.write("victim wrote this\n")
    open(os.path.join(rdv, "victim-ready"), "w").close()
    wait_for("go")
    print("{}")
    sys.exit(0)

wait_for("victim-ready")
victim = None
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            entries = f.read().split(b"\0")
    except OSError:
        continue
    for entry in entries:
        if entry.startswith(b"PERAGO_WORKSPACE_DIR="):
            found = entry.split(b"=", 1)[1].decode()
            if found != mine:
                victim = found
result = {"found": victim is not None}
if victim is None:
    open(os.path.join(rdv, "attacker-watching"), "w").close()
    print(json.dumps(result))
    sys.exit(0)
result["read_while_running"] = readable(os.path.join(victim, "a.txt"))
libc = ctypes.CDLL(None, use_errno=True)
inotify = libc.inotify_init1(os.O_CLOEXEC)
IN_CLOSE_NOWRITE = 0x10
if libc.inotify_add_watch(inotify, victim.encode(), IN_CLOSE_NOWRITE) < 0:
    sys.exit(f"inotify_add_watch: errno {ctypes.get_errno()}")
open(os.path.join(rdv, "attacker-watching"), "w").close()
# The executor hashes out.txt once the victim's body has exited.
seen, deadline = False, time.monotonic() + 30
while not seen and time.monotonic() < deadline:
    ready, _, _ = select.select([inotify], [], [], max(0, deadline - time.monotonic()))
    if not ready:
        break
    events, at = os.read(inotify, 65536), 0
    while at < len(events):
        _, mask, _, length = struct.unpack_from("iIII", events, at)
        seen = seen or events[at + 16 : at + 16 + length].rstrip(b"\0") == b"out.txt"
        at += 16 + length
result["saw_the_scan"] = seen
result["read_after_it_ended"] = readable(os.path.join(victim, "a.txt"))
try:
    link = os.path.join(victim, ".swap")
    os.symlink(params["secret"], link)
    os.rename(link, os.path.join(victim, "out.txt"))
    result["swapped"] = True
except OSError as e:
    result["swapped"] = False
    result["swap_error"] = e.strerror
print(json.dumps(result))
"#;

/// Issue #22, items 1 and 2: a body of another task under the same `[body] user` finds a
/// workspace, waits until the executor has hashed `out.txt` (the fence is slowed down so the
/// window is wide), then swaps it for a symlink to a root-only file. The root executor must
/// publish what the victim's body wrote (or nothing), never the root-only file; once the
/// victim's body has ended its workspace is root's, so the attacker can neither read its input
/// nor swap anything any more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_of_one_user_cannot_make_the_executor_publish_a_swapped_in_file() {
    use std::os::unix::fs::PermissionsExt as _;
    if perago_sys::user::euid() != 0 {
        eprintln!("skipped: switching users needs root");
        return;
    }
    let python = Path::new("/usr/bin/python3");
    if !python.exists() {
        eprintln!("skipped: no /usr/bin/python3 for the bodies");
        return;
    }
    let conductor = Conductor::start().await;
    let lakefs = seeded().await;
    let task = TaskFixture::workspace(
        "ws.race",
        "exec /usr/bin/python3 race.py\n",
        "retry_count = 0",
        "",
    )
    .with_file("race.py", RACE);
    let manifest = std::fs::read_to_string(task.manifest()).unwrap();
    std::fs::write(
        task.manifest(),
        manifest.replace("[body]\n", "[body]\nuser = \"nobody\"\n"),
    )
    .unwrap();
    let open = std::fs::Permissions::from_mode(0o755);
    std::fs::set_permissions(task.dir.path(), open.clone()).unwrap();
    let reachable = tempfile::tempdir().unwrap();
    std::fs::set_permissions(reachable.path(), open).unwrap();
    let rendezvous = tempfile::tempdir().unwrap();
    std::fs::set_permissions(rendezvous.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    // A file only root can read (its folder is root's, 0700).
    let vault = tempfile::tempdir().unwrap();
    let secret = vault.path().join("secret");
    std::fs::write(&secret, "root-only secret\n").unwrap();

    let mut env = lakefs.env();
    env.push((
        "PERAGO_WORKSPACE_ROOT",
        reachable.path().join("ws").display().to_string(),
    ));
    conductor.register(&task).await;
    let sup = SupervisorProc::start_owned(&task, &conductor, 2, &env);
    let input = |role: &str| {
        json!({
            "workspace": {"repository": REPO, "branch": "main", "prefix": "data/"},
            "params": {
                "role": role,
                "rendezvous": rendezvous.path(),
                "secret": secret,
            },
        })
    };
    let victim = conductor.start_with(&task, input("victim")).await;
    let attacker = conductor.start_with(&task, input("attacker")).await;
    eventually(
        "the attacker to watch the victim's workspace",
        Duration::from_secs(30),
        || async {
            rendezvous
                .path()
                .join("attacker-watching")
                .exists()
                .then_some(())
        },
    )
    .await;
    // Both slots are busy, so nothing polls: the only task reads now are the attempt fences.
    // Slowed, they leave the attacker a wide window between the scan and the upload.
    conductor
        .server
        .faults()
        .add(FaultSpec {
            method: Some("GET".into()),
            path: "/api/tasks/".into(),
            latency_ms: Some(2000),
            ..FaultSpec::default()
        })
        .unwrap();
    std::fs::write(rendezvous.path().join("go"), "").unwrap();

    let attacked = conductor
        .wait_terminal(&attacker, Duration::from_secs(60))
        .await;
    let wf = conductor
        .wait_terminal(&victim, Duration::from_secs(60))
        .await;
    conductor.server.faults().clear();
    let report = &attacked["output"]["result"];
    eprintln!("[race] attacker: {report}");
    assert_eq!(
        attacked["status"],
        "COMPLETED",
        "{attacked:#}\n{}",
        sup.log_text()
    );
    assert_eq!(report["found"], true, "{report}");
    assert_eq!(report["saw_the_scan"], true, "{report}");

    // Never the root-only file, anywhere on the branch.
    for object in lakefs
        .client
        .list_objects(REPO, "main", "", 1000)
        .await
        .unwrap()
    {
        let content = lakefs.read(REPO, &object.path).await.unwrap_or_default();
        assert!(
            !content.contains("root-only secret"),
            "{} holds the root-only file\n{report}",
            object.path
        );
    }
    // The victim's publication holds what its body wrote, or the attempt failed.
    let published = lakefs.read(REPO, "data/out.txt").await;
    match wf["status"].as_str() {
        Some("COMPLETED") => assert_eq!(published.as_deref(), Some("victim wrote this\n")),
        _ => assert_eq!(published, None, "{wf:#}"),
    }
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
    // Once the victim's body had ended, its workspace was out of the attacker's reach.
    assert_eq!(report["read_after_it_ended"], false, "{report}");
    assert_eq!(report["swapped"], false, "{report}");
}

/// Milliseconds since the Unix epoch (devstack's clock, on this machine).
fn epoch_ms() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    i64::try_from(since.as_millis()).unwrap()
}

/// Issue #24, item 7 (D6): the fence against a Conductor that times tasks out late, as the
/// real one does (it judges a timeout only when it next decides the workflow). With a sweep
/// lag of about the response timeout:
/// - an attempt that overran its response timeout (no lease extension for longer than it)
///   but whose task is not yet TIMED_OUT passes the fence, publishes, and its result is
///   accepted: the fence reads the task as it is and cannot know the server is late
///   (docs/runtime.md);
/// - an attempt whose task the late sweep did time out is stopped by the fence as without a
///   lag, and only its retry publishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_late_timeout_the_fence_passes_an_overrun_attempt_and_stops_a_timed_out_one() {
    const RTO_MS: i64 = 2000;
    const LAG_MS: i64 = 3000;
    let conductor = Conductor::with_sweep_lag(Duration::from_millis(LAG_MS as u64)).await;
    let lakefs = seeded().await;
    let body = gated_body(
        r#"echo "attempt $PERAGO_TASK_ID" > "$PERAGO_WORKSPACE_DIR/a.txt"
echo '{}'
"#,
    );
    let task = TaskFixture::workspace(
        "ws.late",
        &body,
        "retry_count = 1\nresponse_timeout_seconds = 2",
        "",
    );
    let sup = start(&task, &conductor, &lakefs, 1).await;
    let gate = task.gate();
    let published = || async {
        let log = lakefs.client.log(REPO, "main", 20).await.unwrap();
        log.iter()
            .filter_map(|c| c.metadata.as_ref())
            .filter_map(|m| m.get("task_id").cloned())
            .collect::<Vec<Value>>()
    };

    // 1. Lease extensions fail: the attempt overruns its response timeout, and is let go
    //    while its task is still IN_PROGRESS (the late sweep has not come yet).
    let id = conductor.start_with(&task, input("data")).await;
    gate.started().await;
    conductor
        .server
        .faults()
        .add(FaultSpec {
            method: Some("POST".into()),
            path: "/api/tasks".into(),
            body_contains: Some("\"extendLease\":true".into()),
            status: Some(503),
            ..FaultSpec::default()
        })
        .unwrap();
    eventually(
        "the attempt to overrun its response timeout",
        Duration::from_secs(20),
        || async {
            let wf = conductor.workflow(&id).await;
            let t = &wf["tasks"][0];
            assert_eq!(
                t["status"], "IN_PROGRESS",
                "timed out before the lag: {wf:#}"
            );
            let silent = epoch_ms() - t["updateTime"].as_i64().unwrap();
            (silent > RTO_MS + 200).then_some(())
        },
    )
    .await;
    gate.open();
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    let log = sup.log_text();
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{log}");
    let tasks = wf["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 1, "accepted, not retried: {wf:#}");
    let overrun = tasks[0]["taskId"].as_str().unwrap().to_owned();
    assert!(published().await.contains(&json!(overrun)), "{log}");
    assert_eq!(
        lakefs.read(REPO, "data/a.txt").await,
        Some(format!("attempt {overrun}\n"))
    );
    assert!(!log.contains("stale attempt"), "{log}");
    conductor.server.faults().clear();

    // 2. Conductor hears nothing (every update fails): the task times out, but only about
    //    RTO + lag after its last update; the fence then stops the stale attempt.
    gate.reset();
    let id = conductor.start_with(&task, input("data")).await;
    gate.started().await;
    conductor
        .server
        .faults()
        .add(FaultSpec {
            method: Some("POST".into()),
            path: "/api/tasks".into(),
            status: Some(503),
            ..FaultSpec::default()
        })
        .unwrap();
    let last_update = std::sync::atomic::AtomicI64::new(0);
    let timed_out = eventually(
        "Conductor to time the attempt out",
        Duration::from_secs(20),
        || async {
            let wf = conductor.workflow(&id).await;
            let t = &wf["tasks"][0];
            if t["status"] == "IN_PROGRESS" {
                let seen = t["updateTime"].as_i64().unwrap();
                last_update.store(seen, std::sync::atomic::Ordering::Relaxed);
            }
            (t["status"] == "TIMED_OUT").then(|| t.clone())
        },
    )
    .await;
    let last_update = last_update.into_inner();
    let late = timed_out["endTime"].as_i64().unwrap() - last_update;
    assert!(
        late >= RTO_MS + LAG_MS - 100,
        "timed out {late} ms after the last update"
    );
    conductor.server.faults().clear();
    gate.open();
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    let log = sup.log_text();
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{log}");
    let tasks = wf["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 2, "{wf:#}");
    let published = published().await;
    assert!(published.contains(&tasks[1]["taskId"]), "{published:?}");
    assert!(!published.contains(&tasks[0]["taskId"]), "{published:?}");
    assert!(
        log.contains("stale attempt: task status is TIMED_OUT, expected IN_PROGRESS (before staging); nothing was published"),
        "{log}"
    );
    assert_eq!(lakefs.client.list_branches(REPO).await.unwrap(), ["main"]);
}
