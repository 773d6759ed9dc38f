//! The result journal (issue #23, item 4) with the real binaries: Conductor (devstack, with a
//! fault rule) refuses every final update while a body finishes, the whole runtime is
//! SIGKILLed (supervisor, broker, executors: every process of its workspace root), updates are
//! allowed again and a new `start` on the same root replays the journal before it polls. The
//! result is reported if, and only if, the attempt is still `IN_PROGRESS` with the same retry
//! count; a result whose attempt timed out and was retried meanwhile is dropped, and the
//! retry's result is the one Conductor keeps.

use crate::harness::{Conductor, SupervisorProc, TaskFixture, alive, eventually};
use perago_devstack::faults::FaultSpec;
use serde_json::{Value, json};
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

/// A task whose body appends its execution id to `marker`, then echoes its params.
fn marking_task(name: &str, marker: &Path, extra: &str) -> TaskFixture {
    TaskFixture::new(
        name,
        &format!(
            "read params\necho \"$PERAGO_EXECUTION_ID\" >> '{}'\nprintf '{{\"echo\": %s}}' \"$params\"\n",
            marker.display()
        ),
        extra,
    )
}

/// Every final update (`COMPLETED` from these bodies), v1 or update-v2, answered 503; lease
/// extensions and polls pass.
fn refuse_completions(conductor: &Conductor) -> u64 {
    conductor
        .server
        .faults()
        .add(FaultSpec {
            method: Some("POST".into()),
            path: "/api/tasks".into(),
            body_contains: Some("\"status\":\"COMPLETED\"".into()),
            status: Some(503),
            ..FaultSpec::default()
        })
        .unwrap()
}

/// The pids of every live process whose environment names `root` (the supervisor, its broker
/// and executors, their bodies).
fn processes_of(root: &Path) -> Vec<u32> {
    let needle = root.as_os_str().as_encoded_bytes().to_vec();
    let mut pids = Vec::new();
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let environ = fs::read(entry.path().join("environ")).unwrap_or_default();
        if environ
            .split(|b| *b == 0)
            .any(|kv| kv.windows(needle.len()).any(|w| w == needle.as_slice()))
            && alive(pid)
        {
            pids.push(pid);
        }
    }
    pids
}

/// SIGKILLs the whole runtime on `root` at once, until none of its processes is left.
async fn kill_runtime(sup: &mut SupervisorProc, root: &Path) {
    let pids = processes_of(root);
    assert!(pids.contains(&sup.pid()), "{pids:?}");
    eventually("the runtime gone", Duration::from_secs(10), || async {
        let pids = processes_of(root);
        if pids.is_empty() {
            return Some(());
        }
        let _ = Command::new("kill")
            .arg("-KILL")
            .args(pids.iter().map(u32::to_string))
            .stderr(Stdio::null())
            .status();
        None
    })
    .await;
    let status = sup.wait_exit(Duration::from_secs(5)).await;
    assert!(!status.success());
}

/// The entries waiting in the task type's journal under `root` (files kept for reuse, empty
/// or marked settled with a leading `#`, left out).
fn journal_entries(root: &Path, task: &TaskFixture) -> Vec<PathBuf> {
    let dir = root.join("journal").join(&task.name);
    let mut out: Vec<PathBuf> = fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| fs::read(p).is_ok_and(|b| b.first().is_some_and(|&c| c != b'#')))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

fn tasks(wf: &Value) -> &[Value] {
    wf["tasks"].as_array().map_or(&[], Vec::as_slice)
}

fn lines(path: &Path) -> Vec<String> {
    fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Starts a runtime of `task` on the workspace root `root` (shared by the runtimes of a
/// test), with `env` added.
fn start_on(
    task: &TaskFixture,
    conductor: &Conductor,
    root: &Path,
    env: &[(&'static str, String)],
) -> SupervisorProc {
    let mut all = vec![("PERAGO_WORKSPACE_ROOT", root.display().to_string())];
    all.extend_from_slice(env);
    SupervisorProc::start_owned(task, conductor, 1, &all)
}

/// Runs one workflow until its body has finished and its update was refused and journaled,
/// then kills the runtime whole; returns the workflow id.
async fn finish_refused_then_kill(
    task: &TaskFixture,
    conductor: &Conductor,
    root: &Path,
    marker: &Path,
    input: Value,
    env: &[(&'static str, String)],
) -> String {
    let refused = refuse_completions(conductor);
    let mut a = start_on(task, conductor, root, env);
    let id = conductor.start_with(task, input).await;
    eventually(
        "the body done, its update refused and journaled",
        Duration::from_secs(20),
        || async {
            (lines(marker).len() == 1
                && conductor.server.faults().hits(refused).unwrap_or(0) >= 1
                && journal_entries(root, task).len() == 1)
                .then_some(())
        },
    )
    .await;
    let entry = &journal_entries(root, task)[0];
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(entry), 0o600);
        assert_eq!(mode(entry.parent().unwrap()), 0o700);
        assert_eq!(mode(&root.join("journal")), 0o700);
    }
    kill_runtime(&mut a, root).await;
    // The result is left in the journal, and Conductor still has the attempt running.
    assert_eq!(journal_entries(root, task).len(), 1);
    let wf = conductor.workflow(&id).await;
    assert_eq!(tasks(&wf)[0]["status"], "IN_PROGRESS", "{wf:#}");
    drop(a);
    conductor.server.faults().remove(refused);
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_conductor_refused_until_the_runtime_died_is_reported_by_the_next_start() {
    let conductor = Conductor::start().await;
    let scratch = tempfile::tempdir().unwrap();
    let (root, marker) = (scratch.path().join("ws"), scratch.path().join("ran"));
    // A response timeout far beyond the test: the attempt stays IN_PROGRESS while no runtime
    // runs, as after a real crash.
    let task = marking_task("journal.replay", &marker, "response_timeout_seconds = 50");
    conductor.register(&task).await;
    let id = finish_refused_then_kill(
        &task,
        &conductor,
        &root,
        &marker,
        json!({"params": {"n": 7}}),
        &[],
    )
    .await;

    let mut b = start_on(&task, &conductor, &root, &[]);
    let wf = conductor.wait_terminal(&id, Duration::from_secs(20)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", b.log_text());
    assert_eq!(wf["output"]["result"]["echo"], json!({"n": 7}), "{wf:#}");
    let attempts = tasks(&wf);
    assert_eq!(attempts.len(), 1, "no retry: {wf:#}");
    assert_eq!(attempts[0]["retryCount"], 0);
    // The body ran once, in the first runtime: the second only reported what it left.
    assert_eq!(lines(&marker).len(), 1, "{:?}", lines(&marker));
    assert!(
        attempts[0]["workerId"]
            .as_str()
            .is_some_and(|w| w.starts_with("journalreplay")),
        "{wf:#}"
    );
    eventually("the journal emptied", Duration::from_secs(5), || async {
        journal_entries(&root, &task).is_empty().then_some(())
    })
    .await;
    b.log_with(
        "journaled result reported: the attempt was still in progress",
        Duration::from_secs(5),
    )
    .await;
    b.signal("TERM");
    let status = b.wait_exit(Duration::from_secs(20)).await;
    assert!(status.success(), "{status}\n{}", b.log_text());
    // No line logs the result's content (read once the runtime has drained: every line it
    // held is written by then).
    let log = b.log_text();
    assert!(
        !log.contains("\"n\":7") && !log.contains("\"n\": 7"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journaled_result_whose_attempt_was_retried_meanwhile_is_dropped() {
    let conductor = Conductor::start().await;
    let scratch = tempfile::tempdir().unwrap();
    let (root, marker) = (scratch.path().join("ws"), scratch.path().join("ran"));
    let task = marking_task(
        "journal.fenced",
        &marker,
        "response_timeout_seconds = 2\nretry_count = 2",
    );
    conductor.register(&task).await;
    let id = finish_refused_then_kill(
        &task,
        &conductor,
        &root,
        &marker,
        json!({"params": {"n": 7}}),
        &[],
    )
    .await;
    // No lease is extended any more: Conductor times the attempt out and schedules a retry.
    eventually(
        "the first attempt TIMED_OUT and a retry scheduled",
        Duration::from_secs(20),
        || async {
            let wf = conductor.workflow(&id).await;
            let attempts = tasks(&wf);
            (attempts.len() == 2 && attempts[0]["status"] == "TIMED_OUT").then_some(())
        },
    )
    .await;

    let mut b = start_on(&task, &conductor, &root, &[]);
    let wf = conductor.wait_terminal(&id, Duration::from_secs(20)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", b.log_text());
    let attempts = tasks(&wf);
    assert_eq!(attempts.len(), 2, "{wf:#}");
    // The old result was not reported: the first attempt stays TIMED_OUT, without output.
    assert_eq!(attempts[0]["status"], "TIMED_OUT", "{wf:#}");
    assert!(
        attempts[0]["outputData"]
            .as_object()
            .is_none_or(serde_json::Map::is_empty),
        "{wf:#}"
    );
    assert_eq!(attempts[1]["status"], "COMPLETED", "{wf:#}");
    assert_eq!(attempts[1]["retryCount"], 1);
    assert_eq!(wf["output"]["result"]["echo"], json!({"n": 7}), "{wf:#}");
    // The body ran twice: once per attempt; the retry's result is the one kept.
    assert_eq!(lines(&marker).len(), 2, "{:?}", lines(&marker));
    eventually("the journal emptied", Duration::from_secs(5), || async {
        journal_entries(&root, &task).is_empty().then_some(())
    })
    .await;
    let log = b
        .log_with(
            "journaled result dropped, not reported: the attempt is TIMED_OUT now",
            Duration::from_secs(5),
        )
        .await;
    assert!(!log.contains("journaled result reported"), "{log}");
    b.signal("TERM");
    let status = b.wait_exit(Duration::from_secs(20)).await;
    assert!(status.success(), "{status}\n{}", b.log_text());
}

/// A workspace task whose merge landed but whose update Conductor refused until the runtime
/// died: its fsync'd entry is reported COMPLETED by the next start, with the published commit,
/// and the change (an appended line: not idempotent) is on `main` once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_published_workspace_change_whose_update_was_lost_is_reported_completed_once() {
    const REPO: &str = "journal-ws";
    let conductor = Conductor::start().await;
    let lakefs = crate::harness::Lakefs::start().await;
    lakefs.seed(REPO, &[("data/log.txt", "first\n")]).await;
    let scratch = tempfile::tempdir().unwrap();
    let (root, marker) = (scratch.path().join("ws"), scratch.path().join("ran"));
    let task = TaskFixture::workspace(
        "journal.ws",
        &format!(
            "read params\ncd \"$PERAGO_WORKSPACE_DIR\"\necho appended >> log.txt\n\
             echo \"$PERAGO_EXECUTION_ID\" >> '{}'\nprintf '{{\"ok\": true}}'\n",
            marker.display()
        ),
        "response_timeout_seconds = 50",
        "",
    );
    conductor.register(&task).await;
    let input = json!({
        "workspace": {"repository": REPO, "branch": "main", "prefix": "data"},
        "params": {},
    });
    let id =
        finish_refused_then_kill(&task, &conductor, &root, &marker, input, &lakefs.env()).await;
    // The change is published already; only Conductor does not know.
    assert_eq!(
        lakefs.read(REPO, "data/log.txt").await.as_deref(),
        Some("first\nappended\n")
    );
    let published = lakefs.client.resolve_commit(REPO, "main").await.unwrap();
    let entry = fs::read_to_string(&journal_entries(&root, &task)[0]).unwrap();
    let header: Value = serde_json::from_str(entry.lines().next().unwrap()).unwrap();
    assert_eq!(header["publishedCommit"], published.as_str(), "{header}");

    let mut b = start_on(&task, &conductor, &root, &lakefs.env());
    let wf = conductor.wait_terminal(&id, Duration::from_secs(20)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", b.log_text());
    assert_eq!(tasks(&wf).len(), 1, "no retry: {wf:#}");
    assert_eq!(wf["output"]["result"], json!({"ok": true}), "{wf:#}");
    assert_eq!(
        wf["output"]["workspace"]["commit_id"],
        published.as_str(),
        "{wf:#}"
    );
    assert_eq!(lines(&marker).len(), 1, "{:?}", lines(&marker));
    assert_eq!(
        lakefs.read(REPO, "data/log.txt").await.as_deref(),
        Some("first\nappended\n")
    );
    eventually("the journal emptied", Duration::from_secs(5), || async {
        journal_entries(&root, &task).is_empty().then_some(())
    })
    .await;
    b.signal("TERM");
    let status = b.wait_exit(Duration::from_secs(20)).await;
    assert!(status.success(), "{status}\n{}", b.log_text());
}
