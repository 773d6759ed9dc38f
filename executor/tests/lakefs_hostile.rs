//! The lakeFS client against a hostile server on loopback (issue #22, items 3, 5 and 9):
//! redirects are refused and never followed, answers are read only up to a cap, a pagination
//! that does not advance is refused, a merge answer is not taken on its word.

#![forbid(unsafe_code)]

use perago_core::lakefs::{LakefsClient, LakefsConfig, LakefsError};
use serde_json::Map;
use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// One request as the server received it.
#[derive(Debug, Clone)]
struct Hit {
    head: String,
    body: Vec<u8>,
}

/// What the server answers.
enum Reply {
    /// A whole answer.
    Text(String),
    /// `head` (status line and headers), then `total` zero bytes, written until the client
    /// stops reading.
    Stream { head: String, total: u64 },
}

/// A loopback HTTP/1.1 server answering each request with what `answer` makes of its head;
/// every connection is closed after one answer.
struct Server {
    addr: SocketAddr,
    hits: Arc<Mutex<Vec<Hit>>>,
    /// Body bytes of `Stream` answers the client accepted.
    streamed: Arc<AtomicU64>,
}

impl Server {
    async fn start(answer: impl Fn(&str) -> Reply + Send + Sync + 'static) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(Mutex::new(Vec::new()));
        let streamed = Arc::new(AtomicU64::new(0));
        let (answer, seen, sent) = (Arc::new(answer), Arc::clone(&hits), Arc::clone(&streamed));
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let (answer, seen, sent) =
                    (Arc::clone(&answer), Arc::clone(&seen), Arc::clone(&sent));
                tokio::spawn(async move {
                    let Some(hit) = read_request(&mut conn).await else {
                        return;
                    };
                    let reply = answer(&hit.head);
                    seen.lock().unwrap().push(hit);
                    match reply {
                        Reply::Text(text) => {
                            let _ = conn.write_all(text.as_bytes()).await;
                        }
                        Reply::Stream { head, total } => {
                            if conn.write_all(head.as_bytes()).await.is_err() {
                                return;
                            }
                            let chunk = vec![b'0'; 64 * 1024];
                            let mut left = total;
                            while left > 0 {
                                let n = left.min(chunk.len() as u64) as usize;
                                if conn.write_all(&chunk[..n]).await.is_err() {
                                    return;
                                }
                                sent.fetch_add(n as u64, Ordering::Relaxed);
                                left -= n as u64;
                            }
                        }
                    }
                    let _ = conn.shutdown().await;
                });
            }
        });
        Self {
            addr,
            hits,
            streamed,
        }
    }

    fn hits(&self) -> Vec<Hit> {
        self.hits.lock().unwrap().clone()
    }

    fn client(&self) -> LakefsClient {
        LakefsClient::new(&LakefsConfig {
            endpoint: format!("http://{}", self.addr),
            access_key_id: "access-key".to_owned(),
            secret_access_key: "secret-key".to_owned(),
        })
        .unwrap()
    }
}

async fn read_request(conn: &mut tokio::net::TcpStream) -> Option<Hit> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let length = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = buf[end..].to_vec();
    while body.len() < length {
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some(Hit { head, body })
}

fn json(status: u16, body: &str) -> Reply {
    Reply::Text(format!(
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ))
}

fn redirect(status: u16, to: SocketAddr) -> Reply {
    Reply::Text(format!(
        "HTTP/1.1 {status} Redirect\r\nLocation: http://{to}/api/v1/stolen\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    ))
}

#[tokio::test]
async fn redirects_are_refused_and_nothing_reaches_the_other_host() {
    for status in [301, 302, 307, 308] {
        let second = Server::start(|_| json(200, "{}")).await;
        let to = second.addr;
        let first = Server::start(move |_| redirect(status, to)).await;
        let client = first.client();
        let location = format!("http://{to}/api/v1/stolen");
        let is_refused = |e: &LakefsError| matches!(e, LakefsError::Redirect { status: s, location: l, .. } if *s == status && *l == location);

        let listed = client
            .list_objects("repo", "main", "p/", 10)
            .await
            .unwrap_err();
        assert!(is_refused(&listed), "{listed}");
        assert_eq!(
            listed.to_string(),
            format!(
                "lakeFS list repo@main/p/: the server answered HTTP {status} redirecting to {location}; perago follows no redirects"
            )
        );
        let uploaded = client
            .upload("repo", "staging", "p/a.txt", b"the task's output".to_vec())
            .await
            .unwrap_err();
        assert!(is_refused(&uploaded), "{uploaded}");
        let merged = client
            .merge(
                "repo",
                "staging",
                "main",
                "m",
                &Map::new(),
                Duration::from_secs(5),
            )
            .await
            .unwrap_err();
        assert!(is_refused(&merged), "{merged}");
        assert!(!merged.is_retryable(), "a redirect is not an outage");

        // Each was asked once (no retry), with credentials, and nothing went on.
        let asked = first.hits();
        assert_eq!(asked.len(), 3, "{asked:?}");
        assert!(
            asked.iter().all(|h| h
                .head
                .to_ascii_lowercase()
                .contains("authorization: basic ")),
            "{asked:?}"
        );
        assert_eq!(asked[1].body, b"the task's output");
        assert!(second.hits().is_empty(), "{:?}", second.hits());
    }
}

#[tokio::test]
async fn a_redirect_status_without_location_is_not_a_success() {
    for status in [300, 302, 304] {
        let server = Server::start(move |_| {
            Reply::Text(format!(
                "HTTP/1.1 {status} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            ))
        })
        .await;
        let error = server
            .client()
            .create_branch("repo", "staging", "main")
            .await
            .unwrap_err();
        assert!(
            matches!(error, LakefsError::Redirect { status: s, ref location, .. } if s == status && location == "(no Location)"),
            "{error}"
        );
    }
}

const GIB: u64 = 1 << 30;

/// A 200 whose body is `total` bytes, announced (`Content-Length`) or not (read to the close).
fn huge(status: u16, total: u64, announced: bool) -> Reply {
    let length = if announced {
        format!("Content-Length: {total}\r\n")
    } else {
        String::new()
    };
    Reply::Stream {
        head: format!(
            "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n{length}Connection: close\r\n\r\n"
        ),
        total,
    }
}

#[tokio::test]
async fn a_1_gib_answer_is_refused_at_the_cap_without_being_read() {
    use perago_core::lakefs::MAX_JSON_ANSWER;
    for announced in [true, false] {
        let server = Server::start(move |_| huge(200, GIB, announced)).await;
        let error = server
            .client()
            .list_objects("repo", "main", "p/", 1000)
            .await
            .unwrap_err();
        assert!(
            matches!(error, LakefsError::TooLarge { limit, .. } if limit == MAX_JSON_ANSWER),
            "{error}"
        );
        assert_eq!(
            error.to_string(),
            format!(
                "lakeFS list repo@main/p/: the answer is larger than {MAX_JSON_ANSWER} bytes, the most perago reads; refused"
            )
        );
        assert!(!error.is_retryable());
        // Refused at the cap: what the server got out is the cap and the socket buffers.
        let streamed = server.streamed.load(Ordering::Relaxed);
        assert!(streamed < 64 << 20, "{streamed} bytes were taken");
        assert_eq!(server.hits().len(), 1, "not retried");
    }
    // An error answer is read only as far as its message needs.
    let server = Server::start(|_| huge(400, GIB, false)).await;
    let error = server
        .client()
        .create_branch("repo", "b", "main")
        .await
        .unwrap_err();
    assert!(
        matches!(error, LakefsError::Status { status: 400, ref message, .. } if message.len() <= 300),
        "{error}"
    );
    let streamed = server.streamed.load(Ordering::Relaxed);
    assert!(streamed < 64 << 20, "{streamed} bytes were taken");
}

/// A listing page of `keys`, saying `has_more` with `next`.
fn page(keys: &[&str], has_more: bool, next: &str) -> Reply {
    let results: Vec<_> = keys
        .iter()
        .map(|k| serde_json::json!({"path": k, "path_type": "object", "physical_address": "x", "checksum": "c", "mtime": 0, "size_bytes": 1}))
        .collect();
    let body = serde_json::json!({
        "pagination": {"has_more": has_more, "next_offset": next, "results": keys.len(), "max_per_page": 1000},
        "results": results,
    });
    json(200, &body.to_string())
}

#[tokio::test]
async fn a_listing_that_does_not_advance_is_refused() {
    let cases: [(Vec<&str>, &str, &str); 5] = [
        // The same page again and again: the second repeats a key at or before `after`.
        (
            vec!["p/a"],
            "p/a",
            "key \"p/a\" does not come after \"p/a\"",
        ),
        // More, but no offset to go on from.
        (
            vec!["p/a"],
            "",
            "next_offset \"\" does not advance past \"\"",
        ),
        // An offset before the last key returned: the next page would repeat keys.
        (
            vec!["p/a", "p/b"],
            "p/a",
            "next_offset \"p/a\" is before the last key returned, \"p/b\"",
        ),
        // Keys out of order.
        (
            vec!["p/b", "p/a"],
            "p/b",
            "key \"p/a\" does not come after \"p/b\"",
        ),
        // More, with nothing in the page.
        (vec![], "p/z", "a page with has_more but no results"),
    ];
    for (keys, next, why) in cases {
        let keys: Vec<String> = keys.iter().map(|k| (*k).to_owned()).collect();
        let next = next.to_owned();
        let server = Server::start(move |_| {
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            page(&keys, true, &next)
        })
        .await;
        let error = server
            .client()
            .list_objects("repo", "main", "p/", 100_000)
            .await
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            format!("lakeFS list repo@main/p/: bad pagination: {why}; refused")
        );
        assert!(server.hits().len() <= 2, "{}", server.hits().len());
    }
}

#[tokio::test]
async fn a_listing_holds_at_most_the_entries_allowed() {
    // Pages that advance for ever: each has 1000 new keys.
    let pages = Arc::new(AtomicU64::new(0));
    let served = Arc::clone(&pages);
    let server = Server::start(move |_| {
        let n = served.fetch_add(1, Ordering::Relaxed);
        let keys: Vec<String> = (0..1000).map(|i| format!("p/{n:08}/{i:04}")).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        page(&keys, true, keys[999])
    })
    .await;
    let error = server
        .client()
        .list_objects("repo", "main", "p/", 2500)
        .await
        .unwrap_err();
    assert!(
        matches!(error, LakefsError::TooMany { max: 2500, .. }),
        "{error}"
    );
    assert_eq!(pages.load(Ordering::Relaxed), 3);
}

#[tokio::test]
async fn a_download_receives_exactly_the_listed_size() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("f");
    // Announced longer than listed: refused before a byte is written.
    let server = Server::start(|_| huge(200, GIB, true)).await;
    let error = server
        .client()
        .get_object_to_file("repo", "c", "p/f", &file, 10)
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "lakeFS get repo@c/p/f: the server sent more than the 10 bytes the listing gives the object; refused"
    );
    // Not announced: cut off past the listed size.
    let server = Server::start(|_| huge(200, GIB, false)).await;
    let error = server
        .client()
        .get_object_to_file("repo", "c", "p/f", &file, 10)
        .await
        .unwrap_err();
    assert!(
        matches!(error, LakefsError::LongerThanListed { listed: 10, .. }),
        "{error}"
    );
    assert!(std::fs::metadata(&file).unwrap().len() <= 10);
    let streamed = server.streamed.load(Ordering::Relaxed);
    assert!(streamed < 64 << 20, "{streamed} bytes were taken");
    assert_eq!(server.hits().len(), 1, "not retried");
    // Shorter than listed.
    let server = Server::start(|_| {
        Reply::Text(
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nshort".to_owned(),
        )
    })
    .await;
    let error = server
        .client()
        .get_object_to_file("repo", "c", "p/f", &file, 10)
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "lakeFS get repo@c/p/f: the server sent 5 bytes, but the listing gives the object 10; refused"
    );
    // Exactly the size: fine, and the MD5 of what was written is the executor's record.
    let md5 = server
        .client()
        .get_object_to_file("repo", "c", "p/f", &file, 5)
        .await
        .unwrap();
    assert_eq!(std::fs::read(&file).unwrap(), b"short");
    assert_eq!(md5, "4f09daa9d95bcb166a302407a0e0babe");
}

#[tokio::test]
async fn a_merge_answer_that_is_not_a_commit_id_is_refused() {
    for reference in ["", "made-up", "ABCDEF", &"a".repeat(63), &"g".repeat(64)] {
        let body = serde_json::json!({ "reference": reference }).to_string();
        let server = Server::start(move |_| json(200, &body)).await;
        let error = server
            .client()
            .merge(
                "repo",
                "staging",
                "main",
                "m",
                &Map::new(),
                Duration::from_secs(5),
            )
            .await
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "lakeFS merge repo/staging into main: unexpected response: {reference:?} is not a commit id (64 lowercase hex characters)"
            )
        );
    }
    let id = "0123456789abcdef".repeat(4);
    let body = serde_json::json!({ "reference": id }).to_string();
    let server = Server::start(move |_| json(200, &body)).await;
    let answered = server
        .client()
        .merge(
            "repo",
            "staging",
            "main",
            "m",
            &Map::new(),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(answered, id, "well-formed: the flow then checks the branch");
    // A branch that points at no commit id is refused too.
    let server = Server::start(|_| json(200, r#"{"id": "main", "commit_id": "../x"}"#)).await;
    let error = server
        .client()
        .resolve_commit("repo", "main")
        .await
        .unwrap_err();
    assert!(error.to_string().contains("is not a commit id"), "{error}");
}

#[tokio::test]
async fn the_listing_and_the_downloads_count_against_the_task_time() {
    use perago_executor::workspace::flow::{Attempt, DownloadLimits, Owner, WorkspaceFailure};
    let commit = "ab".repeat(32);
    let pages = Arc::new(AtomicU64::new(0));
    let served = Arc::clone(&pages);
    // The branch resolves; then pages that advance, slowly, for ever (each within every
    // request timeout).
    let branch = format!(r#"{{"id": "main", "commit_id": "{commit}"}}"#);
    let server = Server::start(move |head| {
        if head.contains("/branches/main ") {
            return json(200, &branch);
        }
        let n = served.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(20));
        let key = format!("p/{n:08}");
        page(&[&key], true, &key)
    })
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let input = perago_core::shape::WorkspaceInput {
        repository: "repo".to_owned(),
        branch: "main".to_owned(),
        prefix: "p/".to_owned(),
        source_ref: None,
    };
    let started = std::time::Instant::now();
    let failure = Attempt::prepare_within(
        server.client(),
        tmp.path(),
        "exec-1",
        Owner {
            slot: 1,
            generation: 1,
        },
        input,
        DownloadLimits {
            budget: None,
            time_left: Some(Duration::from_millis(500)),
        },
    )
    .await
    .unwrap_err();
    assert!(
        matches!(failure, WorkspaceFailure::DownloadTimedOut { .. }),
        "{failure}"
    );
    assert_eq!(
        failure.to_string(),
        "workspace download failed: not done in the 500ms the task had left (task.timeout_seconds); the body was not run"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(pages.load(Ordering::Relaxed) > 1);
    // Nothing is left behind.
    assert!(!tmp.path().join("attempts/exec-1").exists());
}

/// A lakeFS that serves one attempt's whole flow (branch `main` at commit `c…`, one object
/// `p/a.txt` = "a"), whose merge answers `merge` and whose branch log shows `log`.
async fn one_attempt_server(merge: Reply, log: serde_json::Value) -> Server {
    let source = "c".repeat(64);
    let staged = "5".repeat(64);
    let merge = Arc::new(Mutex::new(Some(merge)));
    Server::start(move |head| {
        let line = head.lines().next().unwrap_or_default().to_owned();
        if line.starts_with("GET /api/v1/repositories/repo/branches/main ") {
            json(200, &format!(r#"{{"id": "main", "commit_id": "{source}"}}"#))
        } else if line.contains("/objects/ls?") {
            let body = serde_json::json!({
                "pagination": {"has_more": false, "next_offset": "", "results": 1, "max_per_page": 1000},
                "results": [{"path": "p/a.txt", "path_type": "object", "physical_address": "x",
                             "checksum": "0cc175b9c0f1b6a831c399e269772661", "mtime": 0, "size_bytes": 1}],
            });
            json(200, &body.to_string())
        } else if line.starts_with("GET ") && line.contains("/objects?path=") {
            Reply::Text("HTTP/1.1 200 OK\r\nContent-Length: 1\r\nConnection: close\r\n\r\na".to_owned())
        } else if line.contains("/commits ") && line.starts_with("POST ") {
            json(
                201,
                &format!(r#"{{"id": "{staged}", "parents": ["{source}"], "metadata": {{}}}}"#),
            )
        } else if line.contains("/merge/main ") {
            merge
                .lock()
                .unwrap()
                .take()
                .unwrap_or_else(|| json(500, r#"{"message": "merged twice"}"#))
        } else if line.starts_with("GET /api/v1/repositories/repo/refs/main/commits?") {
            let body = serde_json::json!({
                "pagination": {"has_more": false, "next_offset": "", "results": 1, "max_per_page": 1000},
                "results": log,
            });
            json(200, &body.to_string())
        } else if line.starts_with("DELETE ") {
            Reply::Text("HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n".to_owned())
        } else {
            json(201, "{}")
        }
    })
    .await
}

struct InProgress;

impl perago_executor::workspace::flow::Fence for InProgress {
    fn reload(
        &self,
    ) -> std::pin::Pin<
        Box<dyn Future<Output = perago_executor::workspace::flow::FenceRead> + Send + '_>,
    > {
        Box::pin(async { perago_executor::workspace::flow::FenceRead::Fresh(Box::new(snapshot())) })
    }
}

fn snapshot() -> perago_core::attempt::AttemptSnapshot {
    perago_core::attempt::AttemptSnapshot::from_conductor(&serde_json::json!({
        "taskId": "task-1", "workflowInstanceId": "wf-1", "retryCount": 0,
        "taskDefName": "t", "referenceTaskName": "ref", "seq": 1,
        "status": "IN_PROGRESS", "inputData": {}
    }))
    .unwrap()
}

/// Runs one attempt that edits `p/a.txt` and publishes it; the publish's outcome.
async fn publish_once(
    server: &Server,
) -> Result<serde_json::Value, perago_executor::workspace::flow::WorkspaceFailure> {
    publish_within(server, None).await
}

/// [`publish_once`] with the task's time left set to `time_left`.
async fn publish_within(
    server: &Server,
    time_left: Option<Duration>,
) -> Result<serde_json::Value, perago_executor::workspace::flow::WorkspaceFailure> {
    use perago_executor::workspace::flow::{Attempt, Owner};
    let tmp = tempfile::tempdir().unwrap();
    let input = perago_core::shape::WorkspaceInput {
        repository: "repo".to_owned(),
        branch: "main".to_owned(),
        prefix: "p/".to_owned(),
        source_ref: None,
    };
    let owner = Owner {
        slot: 1,
        generation: 1,
    };
    let mut ws = Attempt::prepare(server.client(), tmp.path(), "exec-1", owner, input)
        .await
        .unwrap();
    std::fs::write(ws.work_dir().join("a.txt"), "edited").unwrap();
    let changes = ws.changes(None, None).unwrap();
    ws.set_time_left(time_left);
    let spec = perago_core::manifest::WorkspaceSpec {
        prefix: String::new(),
        merge_timeout_seconds: 5,
        publish_budget: None,
        download_budget: None,
    };
    let published = ws
        .publish(
            &changes,
            &spec,
            &InProgress,
            &snapshot(),
            "exec-1",
            Map::new(),
            &|| {},
        )
        .await;
    ws.cleanup().await;
    published
}

#[tokio::test]
async fn a_merge_counts_only_when_the_branch_shows_it_merging_the_staged_commit() {
    let (source, staged, merged) = ("c".repeat(64), "5".repeat(64), "e".repeat(64));
    let made_up = "0123456789abcdef".repeat(4);
    let on_branch = serde_json::json!([{"id": merged, "parents": [source, staged]}]);
    let merge_ok = |id: &str| json(200, &serde_json::json!({ "reference": id }).to_string());

    // The answer is the branch's merge commit: published.
    let server = one_attempt_server(merge_ok(&merged), on_branch.clone()).await;
    assert_eq!(publish_once(&server).await.unwrap()["commit_id"], merged);

    // A made-up (well-formed) id: FAILED, whatever the branch shows.
    for log in [
        on_branch.clone(),
        serde_json::json!([{"id": source, "parents": []}]),
    ] {
        let server = one_attempt_server(merge_ok(&made_up), log).await;
        let failure = publish_once(&server).await.unwrap_err();
        assert_eq!(
            failure.to_string(),
            format!(
                "publish failed: the merge answered commit {made_up}, but main shows no such commit merging staging commit {staged}; not reported as published"
            )
        );
    }

    // A merge that answered 5xx is checked the same way: published if the branch shows it...
    let server = one_attempt_server(json(503, r#"{"message": "timeout"}"#), on_branch).await;
    assert_eq!(publish_once(&server).await.unwrap()["commit_id"], merged);
    // ...not if the commit that claims to merge it has no commit id, or does not merge it.
    for log in [
        serde_json::json!([{"id": "not-a-commit", "parents": [source, staged]}]),
        serde_json::json!([{"id": merged, "parents": [source]}]),
    ] {
        let server = one_attempt_server(json(503, r#"{"message": "timeout"}"#), log).await;
        let failure = publish_once(&server).await.unwrap_err();
        assert!(
            perago_core::errors::chain(&failure).starts_with(
                "publish failed: lakeFS merge repo/perago-staging-exec-1 into main: HTTP 503"
            ),
            "{failure}"
        );
    }
}

/// A merge that did not answer (here a gateway's 504) is settled: the branch is read until it
/// shows the merge, and when it never does (or its log cannot be read) the attempt reports
/// "publication unknown" once the window (the task's time left) ends.
#[tokio::test]
async fn a_merge_that_did_not_answer_is_settled_or_reported_as_publication_unknown() {
    let (source, staged, merged) = ("c".repeat(64), "5".repeat(64), "e".repeat(64));
    let gateway = || json(504, r#"{"message": "gateway timeout"}"#);
    let server = one_attempt_server(
        gateway(),
        serde_json::json!([{"id": merged, "parents": [source, staged]}]),
    )
    .await;
    let published = publish_within(&server, Some(Duration::from_secs(30))).await;
    assert_eq!(published.unwrap()["commit_id"], merged);

    let server = one_attempt_server(
        gateway(),
        serde_json::json!([{"id": source, "parents": []}]),
    )
    .await;
    let started = std::time::Instant::now();
    let failure = publish_within(&server, Some(Duration::from_secs(1)))
        .await
        .unwrap_err();
    let reason = failure.to_string();
    assert!(
        reason.starts_with(&format!(
            "publication unknown: the merge of staging commit {staged} into main did not answer (lakeFS merge repo/perago-staging-exec-1 into main: HTTP 504: gateway timeout), and main did not show it within "
        )),
        "{reason}"
    );
    assert!(
        reason.ends_with(" s (the branch does not show it); it may still land"),
        "{reason}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    let log_reads = server
        .hits()
        .iter()
        .filter(|h| h.head.contains("/refs/main/commits?"))
        .count();
    assert!(log_reads >= 3, "{log_reads} reads of the log");
}
