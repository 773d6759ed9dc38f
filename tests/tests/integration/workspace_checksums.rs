//! Workspace tasks over objects whose lakeFS checksum is not their content's MD5 (issue #24,
//! item 4): linked objects (their source's ETag) and S3-gateway multipart uploads (the MD5 of the
//! parts' MD5s), made through devstack's `PUT .../staging/backing` as the real server makes them.
//! What the body changed is decided against what the executor downloaded, never against them.

use crate::harness::{Conductor, Lakefs, SupervisorProc, TaskFixture, gated_body};
use md5::{Digest, Md5};
use serde_json::{Value, json};
use std::time::Duration;

const REPO: &str = "ws-checksums";
const STORE: &str = "ws-checksums-store";
const PARTS: &str = "part one, part two\n";
const LINKED: &str = "a,b\n1,2\n";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `REPO` on `main`: `data/parts.bin` with the checksum the S3 gateway stores for a two-part
/// upload, `data/linked.csv` with a source's ETag, `data/api.txt` uploaded through the API.
async fn seeded() -> Lakefs {
    let lakefs = Lakefs::start().await;
    lakefs
        .seed(STORE, &[("parts", PARTS), ("linked", LINKED)])
        .await;
    lakefs.seed(REPO, &[("data/api.txt", "api\n")]).await;
    let (first, second) = PARTS.as_bytes().split_at(9);
    let mut outer = Md5::new();
    outer.update(Md5::digest(first));
    outer.update(Md5::digest(second));
    let gateway = hex(&outer.finalize());
    assert_ne!(gateway, hex(&Md5::digest(PARTS)));
    link(&lakefs, "data/parts.bin", "parts", &gateway, PARTS.len()).await;
    link(
        &lakefs,
        "data/linked.csv",
        "linked",
        "\"0x8DC1A2B3C4D5E6F\"",
        LINKED.len(),
    )
    .await;
    lakefs
        .client
        .commit(REPO, "main", "linked", &serde_json::Map::new())
        .await
        .unwrap();
    lakefs
}

/// Links `key` on `REPO`'s `main` to the bytes of `STORE`'s `source`, with `checksum`.
async fn link(lakefs: &Lakefs, key: &str, source: &str, checksum: &str, size: usize) {
    let api = lakefs.server.api_url();
    let credentials = lakefs.server.credentials();
    let http = perago_core::http::client_builder(&api).build().unwrap();
    let stat: Value = http
        .get(format!("{api}/repositories/{STORE}/refs/main/objects/stat"))
        .query(&[("path", source)])
        .basic_auth(
            &credentials.access_key_id,
            Some(&credentials.secret_access_key),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let body = json!({"staging": {"physical_address": stat["physical_address"]},
        "checksum": checksum, "size_bytes": size});
    let reply = http
        .put(format!(
            "{api}/repositories/{REPO}/branches/main/staging/backing"
        ))
        .query(&[("path", key)])
        .basic_auth(
            &credentials.access_key_id,
            Some(&credentials.secret_access_key),
        )
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 200, "{}", reply.text().await.unwrap());
}

fn input() -> Value {
    json!({"workspace": {"repository": REPO, "branch": "main", "prefix": "data"}, "params": {}})
}

fn counts(wf: &Value) -> (Option<u64>, Option<u64>, Option<u64>) {
    let ws = &wf["output"]["workspace"];
    (
        ws["added"].as_u64(),
        ws["changed"].as_u64(),
        ws["removed"].as_u64(),
    )
}

async fn start(task: &TaskFixture, conductor: &Conductor, lakefs: &Lakefs) -> SupervisorProc {
    conductor.register(task).await;
    SupervisorProc::start_owned(task, conductor, 1, &lakefs.env())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_changes_nothing_over_linked_objects_publishes_nothing() {
    let conductor = Conductor::start().await;
    let lakefs = seeded().await;
    let before = lakefs.client.resolve_commit(REPO, "main").await.unwrap();
    // Re-uploading the two linked objects would also trip this budget.
    let task = TaskFixture::workspace(
        "ws.linked.unchanged",
        "read params\necho '{}'\n",
        "retry_count = 0",
        "[workspace.publish_budget]\nmax_objects = 1\nseconds = 30\n",
    );
    let sup = start(&task, &conductor, &lakefs).await;
    let id = conductor.start_with(&task, input()).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
    assert_eq!(counts(&wf), (Some(0), Some(0), Some(0)), "{wf:#}");
    assert_eq!(wf["output"]["workspace"]["commit_id"], before.as_str());
    assert_eq!(
        lakefs.client.resolve_commit(REPO, "main").await.unwrap(),
        before,
        "no publish"
    );
    assert_eq!(lakefs.client.list_branches(REPO).await.unwrap(), ["main"]);
}

/// The body edits one linked file and deletes the API-uploaded one; meanwhile someone else
/// changes the gateway object on `main`. Only the body's two paths are published, and the
/// other's change is no conflict: the body never touched that path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_edit_beside_a_linked_object_changed_on_main_meanwhile_completes_with_one_upload() {
    let conductor = Conductor::start().await;
    let lakefs = seeded().await;
    let body = gated_body(
        r#"cd "$PERAGO_WORKSPACE_DIR"
printf 'a,b\n1,3\n' > linked.csv
rm api.txt
echo '{}'
"#,
    );
    let task = TaskFixture::workspace("ws.linked.edit", &body, "retry_count = 0", "");
    let sup = start(&task, &conductor, &lakefs).await;
    let id = conductor.start_with(&task, input()).await;
    let gate = task.gate();
    gate.started().await;
    lakefs
        .client
        .upload(REPO, "main", "data/parts.bin", b"theirs\n".to_vec())
        .await
        .unwrap();
    let theirs = lakefs
        .client
        .commit(REPO, "main", "a concurrent change", &serde_json::Map::new())
        .await
        .unwrap()
        .id;
    gate.open();

    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
    assert_eq!(counts(&wf), (Some(0), Some(1), Some(1)), "{wf:#}");
    let published = wf["output"]["workspace"]["commit_id"].as_str().unwrap();
    let diff = lakefs.client.diff(REPO, &theirs, published).await.unwrap();
    assert_eq!(
        diff,
        [
            ("removed".to_owned(), "data/api.txt".to_owned()),
            ("changed".to_owned(), "data/linked.csv".to_owned()),
        ]
    );
    assert_eq!(
        lakefs.read(REPO, "data/parts.bin").await.as_deref(),
        Some("theirs\n")
    );
    assert_eq!(
        lakefs.read(REPO, "data/linked.csv").await.as_deref(),
        Some("a,b\n1,3\n")
    );
    assert_eq!(lakefs.read(REPO, "data/api.txt").await, None);
    assert_eq!(lakefs.client.list_branches(REPO).await.unwrap(), ["main"]);
}
