//! Servers whose answers are not what they claim (issue #22, items 3, 5 and 9), end to end with
//! the real binaries against devstack's fault rules: a redirect is never followed (nothing
//! reaches the other host); a merge that answers 200 without merging is FAILED, not COMPLETED;
//! a download budget stops an input larger than it allows before anything is run.

use crate::harness::{Conductor, Lakefs, SupervisorProc, TaskFixture};
use perago_devstack::faults::FaultSpec;
use serde_json::{Value, json};
use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

const REPO: &str = "ws-answers";

/// Edits a.txt, so that there is something to merge.
const EDIT: &str = r#"read params
cd "$PERAGO_WORKSPACE_DIR"
echo edited > a.txt
echo '{}'
"#;

async fn seeded() -> Lakefs {
    let lakefs = Lakefs::start().await;
    lakefs
        .seed(
            REPO,
            &[
                ("data/a.txt", "a\n"),
                ("data/b.txt", "bb\n"),
                ("data/c.txt", "ccc\n"),
            ],
        )
        .await;
    lakefs
}

fn input() -> Value {
    json!({"workspace": {"repository": REPO, "branch": "main", "prefix": "data"}, "params": {}})
}

fn reason(wf: &Value) -> String {
    let task = wf["tasks"]
        .as_array()
        .and_then(|t| t.last())
        .expect("a task");
    task["reasonForIncompletion"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

async fn start(task: &TaskFixture, conductor: &Conductor, lakefs: &Lakefs) -> SupervisorProc {
    conductor.register(task).await;
    SupervisorProc::start_owned(task, conductor, 1, &lakefs.env())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merge_that_answers_200_without_merging_is_failed() {
    let conductor = Conductor::start().await;
    let lakefs = seeded().await;
    let task = TaskFixture::workspace("ws.forged", EDIT, "retry_count = 0", "");
    let sup = start(&task, &conductor, &lakefs).await;
    let head = lakefs.client.resolve_commit(REPO, "main").await.unwrap();
    let made_up = "0123456789abcdef".repeat(4);
    for (reference, expected) in [
        (
            String::new(),
            "publish failed: lakeFS merge ws-answers/perago-staging-".to_owned(),
        ),
        (
            made_up.clone(),
            format!(
                "publish failed: the merge answered commit {made_up}, but main shows no such commit merging staging commit "
            ),
        ),
    ] {
        let rule = lakefs
            .server
            .faults()
            .add(FaultSpec {
                method: Some("POST".into()),
                path: format!("/api/v1/repositories/{REPO}/refs/perago-staging-"),
                status: Some(200),
                body: Some(json!({ "reference": reference }).to_string()),
                ..FaultSpec::default()
            })
            .unwrap();
        let id = conductor.start_with(&task, input()).await;
        let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
        assert_eq!(wf["status"], "FAILED", "{wf:#}\n{}", sup.log_text());
        let why = reason(&wf);
        assert!(why.starts_with(&expected), "{why}");
        if reference.is_empty() {
            assert!(
                why.ends_with("\"\" is not a commit id (64 lowercase hex characters)"),
                "{why}"
            );
        }
        assert_eq!(lakefs.server.faults().hits(rule), Some(1));
        lakefs.server.faults().remove(rule);
        // Nothing was merged, and the staging branch is gone.
        assert_eq!(
            lakefs.client.resolve_commit(REPO, "main").await.unwrap(),
            head
        );
        assert_eq!(
            lakefs.read(REPO, "data/a.txt").await.as_deref(),
            Some("a\n")
        );
        assert_eq!(lakefs.client.list_branches(REPO).await.unwrap(), ["main"]);
    }
    // The real answer is checked the same way, and passes.
    let id = conductor.start_with(&task, input()).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}");
    let merged = lakefs.client.resolve_commit(REPO, "main").await.unwrap();
    assert_ne!(merged, head);
    let task_output = &wf["tasks"].as_array().unwrap().last().unwrap()["outputData"];
    assert_eq!(task_output["workspace"]["commit_id"], merged.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_download_budget_stops_a_larger_input_before_the_body_runs() {
    let conductor = Conductor::start().await;
    let lakefs = seeded().await;
    for (name, budget, expected) in [
        (
            "ws.dl.objects",
            "max_objects = 2",
            "download budget exceeded: more than 2 objects under prefix \"data/\", max_objects is that; nothing was downloaded",
        ),
        (
            "ws.dl.bytes",
            "max_bytes = 8",
            "download budget exceeded: 9 bytes listed under prefix \"data/\", max_bytes is 8; nothing was downloaded",
        ),
    ] {
        let task = TaskFixture::workspace(
            name,
            "echo '{}'",
            "retry_count = 0",
            &format!("[workspace.download_budget]\n{budget}\n"),
        );
        let sup = start(&task, &conductor, &lakefs).await;
        let id = conductor.start_with(&task, input()).await;
        let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
        assert_eq!(wf["status"], "FAILED", "{wf:#}\n{}", sup.log_text());
        assert_eq!(reason(&wf), expected);
        drop(sup);
    }
}

/// A loopback listener that counts the connections made to it (and answers none).
async fn other_host() -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/stolen", listener.local_addr().unwrap());
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&connections);
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            drop(conn);
        }
    });
    (url, connections)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_from_conductor_or_lakefs_are_never_followed() {
    let conductor = Conductor::start().await;
    let lakefs = seeded().await;
    let task = TaskFixture::workspace("ws.redirected", EDIT, "retry_count = 0", "");
    let sup = start(&task, &conductor, &lakefs).await;
    let (url, connections) = other_host().await;
    let head = lakefs.client.resolve_commit(REPO, "main").await.unwrap();

    // The merge (a POST with the task's metadata and lakeFS credentials) is redirected.
    let rule = lakefs
        .server
        .faults()
        .add(FaultSpec {
            method: Some("POST".into()),
            path: format!("/api/v1/repositories/{REPO}/refs/perago-staging-"),
            status: Some(307),
            location: Some(url.clone()),
            ..FaultSpec::default()
        })
        .unwrap();
    let id = conductor.start_with(&task, input()).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "FAILED", "{wf:#}\n{}", sup.log_text());
    let why = reason(&wf);
    assert!(
        why.starts_with("publish failed: lakeFS merge ws-answers/perago-staging-")
            && why.ends_with(&format!(
                "the server answered HTTP 307 redirecting to {url}; perago follows no redirects"
            )),
        "{why}"
    );
    assert_eq!(lakefs.server.faults().hits(rule), Some(1));
    lakefs.server.faults().remove(rule);
    assert_eq!(
        lakefs.client.resolve_commit(REPO, "main").await.unwrap(),
        head
    );

    // The task result (POST /api/tasks) is redirected, three times: it is sent again to
    // Conductor, never to the other host, and arrives once the redirects stop.
    let rule = conductor
        .server
        .faults()
        .add(FaultSpec {
            method: Some("POST".into()),
            path: "/api/tasks".into(),
            status: Some(307),
            location: Some(url.clone()),
            count: Some(3),
            ..FaultSpec::default()
        })
        .unwrap();
    let id = conductor.start_with(&task, input()).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(60)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
    assert_eq!(conductor.server.faults().hits(rule), Some(3));
    // The refused redirect is logged.
    sup.log_with("perago follows no redirects", Duration::from_secs(5))
        .await;
    assert_eq!(
        connections.load(Ordering::SeqCst),
        0,
        "nothing reached {url}"
    );
}
