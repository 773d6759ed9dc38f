//! What the body changed is decided against the executor's own record of what it downloaded
//! (issue #24, item 4): lakeFS's listed `checksum` is the content MD5 only for objects uploaded
//! through its API; an S3-gateway multipart upload lists `<md5 of the parts' MD5s>-<parts>`, a
//! linked or imported object its source's ETag. A loopback server lists such checksums here.

#![forbid(unsafe_code)]

use perago_core::lakefs::{LakefsClient, LakefsConfig};
use perago_core::shape::WorkspaceInput;
use perago_executor::workspace::flow::{Attempt, DownloadLimits, Owner};
use std::{collections::BTreeMap, net::SocketAddr, sync::Arc};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const COMMIT: &str = "c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00";

/// A read-only lakeFS with one commit holding `objects` (key → (listed checksum, content)).
async fn serve(objects: BTreeMap<String, (String, String)>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let objects = Arc::new(objects);
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let objects = Arc::clone(&objects);
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if conn.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let target = head.split(' ').nth(1).unwrap_or_default().to_owned();
                let (path, query) = target.split_once('?').unwrap_or((&target, ""));
                let key = query
                    .split('&')
                    .find_map(|p| p.strip_prefix("path="))
                    .map(|k| k.replace("%2F", "/"));
                let (content_type, body) = if path.ends_with("/branches/main") {
                    (
                        "application/json",
                        serde_json::json!({"id": "main", "commit_id": COMMIT}).to_string(),
                    )
                } else if path.ends_with("/objects/ls") {
                    let results: Vec<_> = objects
                        .iter()
                        .map(|(key, (checksum, content))| {
                            serde_json::json!({"path": key, "path_type": "object",
                                "checksum": checksum, "size_bytes": content.len(),
                                "mtime": 0, "physical_address": "s3://elsewhere/x"})
                        })
                        .collect();
                    let page = serde_json::json!({"results": results, "pagination": {
                        "has_more": false, "next_offset": "",
                        "results": objects.len(), "max_per_page": 1000}});
                    ("application/json", page.to_string())
                } else if let Some((_, content)) = key.and_then(|k| objects.get(&k)) {
                    ("application/octet-stream", content.clone())
                } else {
                    ("application/json", r#"{"message":"not found"}"#.to_owned())
                };
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(answer.as_bytes()).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    addr
}

async fn prepare(root: &std::path::Path, addr: SocketAddr) -> Attempt {
    let client = LakefsClient::new(&LakefsConfig {
        endpoint: format!("http://{addr}"),
        access_key_id: "k".to_owned(),
        secret_access_key: "s".to_owned(),
    })
    .unwrap();
    Attempt::prepare_within(
        client,
        root,
        "exec-1",
        Owner {
            slot: 1,
            generation: 1,
        },
        WorkspaceInput {
            repository: "repo".to_owned(),
            branch: "main".to_owned(),
            prefix: "p/".to_owned(),
            source_ref: None,
        },
        DownloadLimits {
            budget: None,
            time_left: None,
        },
    )
    .await
    .unwrap()
}

fn objects() -> BTreeMap<String, (String, String)> {
    BTreeMap::from([
        // Through the S3 gateway in two parts.
        (
            "p/parts.bin".to_owned(),
            (
                "3858f62230ac3c915f300c664312c11f-2".to_owned(),
                "two parts".to_owned(),
            ),
        ),
        // Linked, with its source's ETag.
        (
            "p/linked.csv".to_owned(),
            ("\"0x8DC1A2B3C4D5E6F\"".to_owned(), "a,b\n1,2\n".to_owned()),
        ),
        // An API upload: the content MD5 of "hello".
        (
            "p/api.txt".to_owned(),
            (
                "5d41402abc4b2a76b9719d911017c592".to_owned(),
                "hello".to_owned(),
            ),
        ),
    ])
}

#[tokio::test]
async fn a_workspace_left_alone_changes_nothing_whatever_checksums_lakefs_lists() {
    let tmp = tempfile::tempdir().unwrap();
    let addr = serve(objects()).await;
    let ws = prepare(tmp.path(), addr).await;
    let changes = ws.changes(None, None).unwrap();
    assert!(
        changes.is_empty(),
        "added {:?}, changed {:?}, removed {:?}",
        changes.added.iter().map(|u| &u.key).collect::<Vec<_>>(),
        changes.changed.iter().map(|u| &u.key).collect::<Vec<_>>(),
        changes.removed
    );
    ws.cleanup().await;
}

#[tokio::test]
async fn one_edit_and_one_deletion_are_exactly_what_changed() {
    let tmp = tempfile::tempdir().unwrap();
    let addr = serve(objects()).await;
    let ws = prepare(tmp.path(), addr).await;
    let work = ws.work_dir().to_owned();
    std::fs::write(work.join("linked.csv"), "a,b\n1,3\n").unwrap();
    std::fs::remove_file(work.join("parts.bin")).unwrap();
    let changes = ws.changes(None, None).unwrap();
    let keys: Vec<_> = changes.changed.iter().map(|u| u.key.as_str()).collect();
    assert_eq!(keys, ["p/linked.csv"]);
    assert!(changes.added.is_empty());
    assert_eq!(changes.removed, ["p/parts.bin"]);
    ws.cleanup().await;
}
