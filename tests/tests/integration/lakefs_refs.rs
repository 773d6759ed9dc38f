//! Issue #24 items 5, 6 and 7 (third bullet), end to end against devstack's lakeFS behaving as
//! the real server does: refs that are not branch ids, merges refused 429 under contention,
//! branch protection rules and failed hooks.

use crate::harness::{Conductor, Lakefs, SupervisorProc, TaskFixture};
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
