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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_protection_rule_on_staging_branches_fails_terminally_naming_the_rule() {
    let conductor = Conductor::start().await;
    let lakefs = Lakefs::start().await;
    lakefs.seed(REPO, &[("data/a.txt", "one\n")]).await;
    // Retried twice if it were FAILED.
    let task = TaskFixture::workspace("refs.protected", COPY, "", "");
    let sup = start(&task, &conductor, &lakefs, 1).await;

    // Protecting the target is fine: lakeFS lets merges into a protected branch through.
    lakefs
        .client
        .set_branch_protection_rules(REPO, &["main"])
        .await
        .unwrap();
    let id = conductor.start_with(&task, input()).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
    let before = lakefs.client.resolve_commit(REPO, "main").await.unwrap();

    lakefs
        .client
        .set_branch_protection_rules(REPO, &["main", "perago-*"])
        .await
        .unwrap();
    // Read at main~1 (before seen.txt), so that the body has a change to stage.
    let id = conductor
        .start_with(
            &task,
            json!({"workspace": {"repository": REPO, "branch": "main", "prefix": "data", "ref": "main~1"}, "params": {}}),
        )
        .await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "FAILED", "{wf:#}");
    let tasks = wf["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 1, "not retried: {wf:#}");
    assert_eq!(tasks[0]["status"], "FAILED_WITH_TERMINAL_ERROR", "{wf:#}");
    let reason = tasks[0]["reasonForIncompletion"].as_str().unwrap();
    assert!(
        reason.starts_with("publish refused by lakeFS: writing to perago-staging-")
            && reason.contains(&format!(
                "in repository {REPO} is blocked by the branch protection rule \"perago-*\" (HTTP 403: cannot write to protected branch)"
            ))
            && reason.contains("change the rule so that it does not match perago-staging-*")
            && reason.ends_with("the task is not retried: a retry would be refused the same way"),
        "{reason}"
    );
    assert_eq!(
        lakefs.client.resolve_commit(REPO, "main").await.unwrap(),
        before
    );
    // The staging branch is still deleted (deleting is no staging write).
    assert_eq!(lakefs.client.list_branches(REPO).await.unwrap(), ["main"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_hook_fails_the_attempt_naming_the_hook_and_the_retry_publishes() {
    let conductor = Conductor::start().await;
    let lakefs = Lakefs::start().await;
    lakefs.seed(REPO, &[("data/a.txt", "one\n")]).await;
    let task = TaskFixture::workspace("refs.hook", COPY, "retry_count = 1", "");
    let sup = start(&task, &conductor, &lakefs, 1).await;
    // The real server's answer when a pre-merge action's hook fails (pkg/graveler
    // HookAbortError, pkg/actions/service.go), once.
    let hook = "pre-merge hook aborted, run id '2bdn0f6r8s0000abcdeg': hook run id \
                '2bdn0f6r8s0000abcdeg_0_0' failed on action 'check formats' hook 'no_csv': \
                action failed: webhook returned 500";
    let rule = lakefs
        .server
        .faults()
        .add(FaultSpec {
            method: Some("POST".into()),
            path: format!("/api/v1/repositories/{REPO}/refs/perago-staging-"),
            status: Some(412),
            body: Some(json!({ "message": hook }).to_string()),
            count: Some(1),
            ..FaultSpec::default()
        })
        .unwrap();

    let id = conductor.start_with(&task, input()).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
    assert_eq!(lakefs.server.faults().hits(rule), Some(1));
    let tasks = wf["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 2, "{wf:#}");
    assert_eq!(tasks[0]["status"], "FAILED", "{wf:#}");
    assert_eq!(
        tasks[0]["reasonForIncompletion"].as_str().unwrap(),
        format!(
            "publish refused by a lakeFS hook: merging into main in repository {REPO} was aborted by a hook (HTTP 412: {hook}); see the action run in lakeFS (lakectl actions runs list lakefs://{REPO}) and fix the hook or what it checks; nothing was published"
        )
    );
    let retry_id = tasks[1]["taskId"].as_str().unwrap();
    assert_eq!(merges_of(&lakefs, retry_id).await, 1);
    assert_eq!(
        merges_of(&lakefs, tasks[0]["taskId"].as_str().unwrap()).await,
        0
    );
}
