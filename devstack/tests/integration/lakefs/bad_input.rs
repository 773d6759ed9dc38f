//! Malformed requests get 4xx answers and never take the server down; faults apply to lakeFS
//! routes as to Conductor's.

use std::time::Duration;

use perago_devstack::faults::FaultSpec;
use reqwest::Method;
use serde_json::json;

use super::support::Lake;

#[tokio::test]
async fn malformed_requests_are_refused_and_the_server_keeps_serving() {
    let lake = Lake::start().await;
    lake.repo("repo").await;
    let raw = |method: Method, path: &str, body: &'static str| {
        lake.send(
            lake.request(method, path)
                .header("content-type", "application/json")
                .body(body),
        )
    };
    for (method, path, body) in [
        (Method::POST, "/repositories", "{"),
        (Method::POST, "/repositories", "[]"),
        (
            Method::POST,
            "/repositories",
            r#"{"name": 5, "storage_namespace": "mem://x"}"#,
        ),
        (Method::POST, "/repositories/repo/branches", "null"),
        (
            Method::POST,
            "/repositories/repo/branches/main/commits",
            "{\"message\": \"\\ud800\"}x",
        ),
        (
            Method::POST,
            "/repositories/repo/branches/main/objects/delete",
            r#"{"paths": "a"}"#,
        ),
        (
            Method::POST,
            "/repositories/repo/refs/main/merge/main",
            "nope",
        ),
        (Method::PUT, "/repositories/repo/branches/main", "{}"),
    ] {
        let reply = raw(method.clone(), path, body).await;
        assert_eq!(
            reply.status.as_u16(),
            400,
            "{method} {path} {body}: {}",
            reply.text
        );
        assert!(reply.json()["message"].is_string(), "{}", reply.text);
    }
    for path in [
        "/repositories/repo/refs/main/objects/ls?amount=x",
        "/repositories/repo/refs/main/objects/ls?user_metadata=maybe",
        "/repositories/repo/refs/main~x/objects/ls",
        "/repositories/repo/refs/main~99/objects/ls",
        "/repositories/repo/refs/main~1%C3%A9/objects/ls",
        "/repositories/repo/refs/main~%C3%A9/objects/ls",
        "/repositories/repo/refs/main%5E99999999999999999999999/objects/ls",
        "/repositories/repo/refs/main%20x/objects/ls",
        "/repositories/repo/refs/@/objects/ls",
        "/repositories/repo/refs/main/objects?path=%FF",
        "/repositories/repo/commits/main%5E7",
        "/repositories/repo/refs/main/commits?amount=5000",
        "/repositories/repo/refs/main/diff/main?type=four_dot",
    ] {
        let reply = lake.get(path).await;
        assert!(
            reply.status.is_client_error(),
            "{path}: {} {}",
            reply.status,
            reply.text
        );
    }
    lake.upload("repo", "main", "still", "alive").await;
    assert_eq!(lake.read("repo", "main", "still").await.unwrap(), "alive");
}

#[tokio::test]
async fn faults_apply_to_lakefs_routes_through_the_same_admin_path() {
    let lake = Lake::start().await;
    lake.repo("repo").await;
    let admin = format!("{}/__devstack/faults", lake.server.endpoint());
    // Admin routes need no lakeFS credentials.
    let rule = json!({"method": "POST", "path": "/api/v1/repositories/repo/refs/", "status": 503, "count": 1});
    let added = lake.http.post(&admin).json(&rule).send().await.unwrap();
    assert_eq!(added.status().as_u16(), 200);
    let reply = lake.merge("repo", "main", "main", &json!({})).await;
    assert_eq!(reply.status.as_u16(), 503, "{}", reply.text);
    assert!(reply.json()["message"].is_string());
    // Only once: the next merge reaches the server (and finds nothing to merge).
    lake.merge("repo", "main", "main", &json!({}))
        .await
        .assert_status(400);

    // In-process: drop the connection of the next upload; it is not applied.
    lake.server
        .faults()
        .add(FaultSpec {
            method: Some("POST".into()),
            path: "/api/v1/repositories/repo/branches/main/objects".into(),
            drop: true,
            count: Some(1),
            ..Default::default()
        })
        .unwrap();
    let dropped = lake
        .request(Method::POST, "/repositories/repo/branches/main/objects")
        .query(&[("path", "lost")])
        .body("x")
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    let error = dropped.expect_err("the connection is dropped without an answer");
    assert!(!error.is_timeout(), "{error}");
    assert!(lake.read("repo", "main", "lost").await.is_err());
    lake.upload("repo", "main", "kept", "x").await;
}
