//! Issue #24 items 5, 6 and 7 (third bullet), end to end against devstack's lakeFS behaving as
//! the real server does: refs that are not branch ids, merges refused 429 under contention,
//! branch protection rules and failed hooks.

use crate::harness::{Conductor, Lakefs, SupervisorProc, TaskFixture};
use perago_devstack::faults::FaultSpec;
use serde_json::{Value, json};
use std::time::Duration;

const REPO: &str = "refs-e2e";

/// Copies what it read of a.txt to seen.txt.
const COPY: &str = r#"read params
cd "$PERAGO_WORKSPACE_DIR"
cp a.txt seen.txt
echo '{}'
"#;

fn input_at(reference: &str) -> Value {
    json!({"workspace": {"repository": REPO, "branch": "main", "prefix": "data", "ref": reference}, "params": {}})
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

/// main: "seed" (a.txt = "one"), then "two" (a.txt = "two"); returns the two commit ids.
async fn two_commits(lakefs: &Lakefs) -> (String, String) {
    lakefs.seed(REPO, &[("data/a.txt", "one\n")]).await;
    let first = lakefs.client.resolve_commit(REPO, "main").await.unwrap();
    lakefs
        .client
        .upload(REPO, "main", "data/a.txt", b"two\n".to_vec())
        .await
        .unwrap();
    let second = lakefs
        .client
        .commit(REPO, "main", "two", &serde_json::Map::new())
        .await
        .unwrap()
        .id;
    (first, second)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_reads_from_a_ref_expression_and_a_tag_that_are_not_branch_ids() {
    let conductor = Conductor::start().await;
    let lakefs = Lakefs::start().await;
    let (first, _) = two_commits(&lakefs).await;
    lakefs
        .client
        .create_tag(REPO, "v1.0", &first)
        .await
        .unwrap();
    let task = TaskFixture::workspace("refs.copy", COPY, "retry_count = 0", "");
    let sup = start(&task, &conductor, &lakefs, 1).await;

    for reference in ["main~1", "v1.0"] {
        let id = conductor.start_with(&task, input_at(reference)).await;
        let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
        assert_eq!(
            wf["status"],
            "COMPLETED",
            "ref {reference}: {wf:#}\n{}",
            sup.log_text()
        );
        let ws = &wf["output"]["workspace"];
        assert_eq!(ws["source_commit_id"], first.as_str(), "ref {reference}");
        // Read at the old commit, published onto the branch's head.
        assert_eq!(
            lakefs.read(REPO, "data/seen.txt").await.as_deref(),
            Some("one\n"),
            "ref {reference}"
        );
        assert_eq!(
            lakefs.read(REPO, "data/a.txt").await.as_deref(),
            Some("two\n")
        );
        assert_eq!(ws["added"].as_u64(), Some(1), "{ws}");
    }
}

fn task_of(wf: &Value) -> &Value {
    wf["tasks"]
        .as_array()
        .and_then(|t| t.last())
        .expect("a task")
}

fn input() -> Value {
    json!({"workspace": {"repository": REPO, "branch": "main", "prefix": "data"}, "params": {}})
}

/// The merge commits on main that publish task `task_id`.
async fn merges_of(lakefs: &Lakefs, task_id: &str) -> usize {
    lakefs
        .client
        .log(REPO, "main", 100)
        .await
        .unwrap()
        .iter()
        .filter(|c| {
            c.parents.len() == 2
                && c.metadata
                    .as_ref()
                    .and_then(|m| m.get("task_id"))
                    .and_then(Value::as_str)
                    == Some(task_id)
        })
        .count()
}

/// The merge of a staging branch refused 429 (`Too many attempts, try again later`, as lakeFS
/// answers when its own retries against a moving branch run out), `count` times.
fn contended(lakefs: &Lakefs, count: Option<u64>) -> u64 {
    lakefs
        .server
        .faults()
        .add(FaultSpec {
            method: Some("POST".into()),
            path: format!("/api/v1/repositories/{REPO}/refs/perago-staging-"),
            status: Some(429),
            body: Some(r#"{"message":"Too many attempts, try again later"}"#.into()),
            count,
            ..FaultSpec::default()
        })
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merge_refused_under_contention_is_merged_again_not_rerun() {
    let conductor = Conductor::start().await;
    let lakefs = Lakefs::start().await;
    lakefs.seed(REPO, &[("data/a.txt", "one\n")]).await;
    let task = TaskFixture::workspace("refs.busy", COPY, "retry_count = 0", "");
    let sup = start(&task, &conductor, &lakefs, 1).await;
    let rule = contended(&lakefs, Some(1));

    let id = conductor.start_with(&task, input()).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
    // One attempt (the body ran once), one refused merge, one merge commit.
    assert_eq!(wf["tasks"].as_array().map(Vec::len), Some(1), "{wf:#}");
    assert_eq!(lakefs.server.faults().hits(rule), Some(1));
    let task_id = task_of(&wf)["taskId"].as_str().unwrap();
    assert_eq!(merges_of(&lakefs, task_id).await, 1);
    assert_eq!(
        lakefs.read(REPO, "data/seen.txt").await.as_deref(),
        Some("one\n")
    );
    assert!(
        sup.log_text()
            .contains("the merge was refused under contention; merging again"),
        "{}",
        sup.log_text()
    );
    assert_eq!(lakefs.client.list_branches(REPO).await.unwrap(), ["main"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merge_refused_under_contention_to_the_end_fails_within_the_budget() {
    let conductor = Conductor::start().await;
    let lakefs = Lakefs::start().await;
    lakefs.seed(REPO, &[("data/a.txt", "one\n")]).await;
    let before = lakefs.client.resolve_commit(REPO, "main").await.unwrap();
    let task = TaskFixture::workspace(
        "refs.busy-forever",
        COPY,
        "retry_count = 0",
        "[workspace]\nmerge_timeout_seconds = 4\n",
    );
    let sup = start(&task, &conductor, &lakefs, 1).await;
    let rule = contended(&lakefs, None);

    let started = std::time::Instant::now();
    let id = conductor.start_with(&task, input()).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    let took = started.elapsed();
    assert_eq!(wf["status"], "FAILED", "{wf:#}\n{}", sup.log_text());
    let reason = task_of(&wf)["reasonForIncompletion"].as_str().unwrap();
    let tries = lakefs.server.faults().hits(rule).unwrap();
    assert!(
        reason.starts_with(&format!(
            "publish failed: lakeFS refused all {tries} merges of staging commit "
        )),
        "{reason}"
    );
    assert!(
        reason.contains(
            "into main within merge_timeout_seconds (4 s) because other writers kept moving main"
        ) && reason.contains("HTTP 429: Too many attempts, try again later")
            && reason.ends_with("nothing was published"),
        "{reason}"
    );
    assert!(tries >= 3, "merged again with backoff: {tries} tries");
    // The budget bounds the tries (plus the body, the download and the staging).
    assert!(took < Duration::from_secs(12), "{took:?}");
    assert_eq!(
        lakefs.client.resolve_commit(REPO, "main").await.unwrap(),
        before
    );
    assert_eq!(lakefs.client.list_branches(REPO).await.unwrap(), ["main"]);
}
