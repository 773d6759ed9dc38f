//! A publication lands at most once per workflow task (issue #23, item 3): a merge slower than
//! `merge_timeout_seconds` is settled before the attempt reports, and a retry whose workflow task
//! an earlier attempt already published does not publish again. The body appends a line, a
//! change that shows when it is published twice.

use crate::harness::{Conductor, Lakefs, SupervisorProc, TaskFixture, eventually};
use perago_devstack::faults::FaultSpec;
use serde_json::{Value, json};
use std::time::Duration;

const REPO: &str = "once-e2e";

/// Appends one line to `log.txt`: not idempotent.
const APPEND: &str = r#"read params
cd "$PERAGO_WORKSPACE_DIR"
echo appended >> log.txt
echo '{"appended": true}'
"#;

async fn seeded() -> Lakefs {
    let lakefs = Lakefs::start().await;
    lakefs.seed(REPO, &[("data/log.txt", "first\n")]).await;
    lakefs
}

fn input() -> Value {
    json!({"workspace": {"repository": REPO, "branch": "main", "prefix": "data"}, "params": {}})
}

async fn start(task: &TaskFixture, conductor: &Conductor, lakefs: &Lakefs) -> SupervisorProc {
    conductor.register(task).await;
    SupervisorProc::start_owned(task, conductor, 1, &lakefs.env())
}

/// The merge of the first attempt is served 6 s late while `merge_timeout_seconds` is 3: the
/// server applies it all the same (and holds the staging branch's delete until then). The
/// attempt reads the branch until it shows the merge and reports COMPLETED; the line is on
/// `main` once. (Before: FAILED after one read of the log, and the retry appended it again.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merge_slower_than_its_timeout_is_settled_and_published_once() {
    let conductor = Conductor::start().await;
    let lakefs = seeded().await;
    let task = TaskFixture::workspace(
        "once.slow",
        APPEND,
        "",
        "[workspace]\nmerge_timeout_seconds = 3\n",
    );
    let slow = lakefs
        .server
        .faults()
        .add(FaultSpec {
            method: Some("POST".into()),
            path: format!("/api/v1/repositories/{REPO}/refs/perago-staging-"),
            latency_ms: Some(6000),
            detached: true,
            hold_method: Some("DELETE".into()),
            hold_path: Some(format!(
                "/api/v1/repositories/{REPO}/branches/perago-staging-"
            )),
            count: Some(1),
            ..FaultSpec::default()
        })
        .unwrap();
    let sup = start(&task, &conductor, &lakefs).await;
    let id = conductor.start_with(&task, input()).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(90)).await;
    assert_eq!(lakefs.server.faults().hits(slow), Some(1));
    assert_eq!(
        lakefs.read(REPO, "data/log.txt").await.as_deref(),
        Some("first\nappended\n"),
        "{}",
        sup.log_text()
    );
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
    let tasks = wf["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 1, "one attempt: {wf:#}");
    let published = &wf["output"]["workspace"];
    assert_eq!(
        published["commit_id"].as_str(),
        Some(
            lakefs
                .client
                .resolve_commit(REPO, "main")
                .await
                .unwrap()
                .as_str()
        )
    );
    assert!(
        sup.log_text()
            .contains("the merge did not answer but landed"),
        "{}",
        sup.log_text()
    );
    eventually(
        "the staging branch to go",
        Duration::from_secs(20),
        || async { (lakefs.client.list_branches(REPO).await.unwrap() == ["main"]).then_some(()) },
    )
    .await;
}

/// The first attempt publishes, but Conductor never accepts its result: the attempt times
/// out and is retried. The retry finds the first attempt's merge of the same workflow task on
/// the branch, does not publish again, and reports COMPLETED with that commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_publication_that_landed_does_not_publish_again() {
    let conductor = Conductor::start().await;
    let lakefs = seeded().await;
    let task = TaskFixture::workspace(
        "once.retry",
        APPEND,
        "retry_count = 1\nresponse_timeout_seconds = 2",
        "",
    );
    let sup = start(&task, &conductor, &lakefs).await;
    let before = lakefs.client.resolve_commit(REPO, "main").await.unwrap();
    // Every update is refused (400: not retried): the first attempt's result is lost.
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
    let id = conductor.start_with(&task, input()).await;
    eventually("the result to be lost", Duration::from_secs(30), || async {
        sup.log_text().contains("task result lost").then_some(())
    })
    .await;
    let first = lakefs.client.resolve_commit(REPO, "main").await.unwrap();
    assert_ne!(first, before, "the first attempt published");
    conductor.server.faults().clear();

    let wf = conductor.wait_terminal(&id, Duration::from_secs(60)).await;
    assert_eq!(
        lakefs.read(REPO, "data/log.txt").await.as_deref(),
        Some("first\nappended\n"),
        "{}",
        sup.log_text()
    );
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
    assert_eq!(
        lakefs.client.resolve_commit(REPO, "main").await.unwrap(),
        first,
        "nothing published after the first attempt"
    );
    let tasks = wf["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 2, "{wf:#}");
    assert_eq!(tasks[0]["status"], "TIMED_OUT", "{wf:#}");
    let output = &tasks[1]["outputData"];
    let published = &output["workspace"];
    assert_eq!(published["commit_id"], first.as_str(), "{output:#}");
    assert_eq!(
        published["already_published_by"]["task_id"], tasks[0]["taskId"],
        "{output:#}"
    );
    assert_eq!(published["already_published_by"]["retry_count"], 0);
    assert_eq!(
        published["changed"], 1,
        "the first attempt's counts: {output:#}"
    );
    assert_eq!(output["result"], json!({"appended": true}));
    // The first attempt's merge names its workflow task.
    let log = lakefs.client.log(REPO, "main", 5).await.unwrap();
    let merge = log.iter().find(|c| c.id == first).unwrap();
    let metadata = merge.metadata.clone().unwrap_or_default();
    assert_eq!(metadata["workflow_id"], id.as_str());
    assert_eq!(
        metadata["reference_task_name"],
        tasks[0]["referenceTaskName"]
    );
    assert_eq!(metadata["iteration"], "0");
    sup.log_with("not publishing again", Duration::from_secs(5))
        .await;
    assert_eq!(lakefs.client.list_branches(REPO).await.unwrap(), ["main"]);
}
