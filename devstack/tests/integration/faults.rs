//! Fault injection under `/__devstack/faults`: failing statuses, latency, dropped connections.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use tokio::time::Instant;

use perago_devstack::faults::FaultSpec;

use crate::support::Dev;

fn admin(dev: &Dev) -> String {
    format!("{}/__devstack/faults", dev.server.root_url())
}

#[tokio::test]
async fn a_status_fault_fails_the_next_n_matching_requests() {
    let dev = Dev::start().await;
    let rule = json!({"method": "GET", "path": "/api/tasks/poll/", "status": 503, "count": 2});
    let added = dev.send(dev.http.post(admin(&dev)).json(&rule)).await;
    assert_eq!(added.status, StatusCode::OK, "{}", added.text);
    let id = added.json()["id"].as_u64().unwrap();

    // Other routes are untouched.
    assert_eq!(dev.get("/health").await.status, StatusCode::OK);
    for _ in 0..2 {
        dev.get("/tasks/poll/batch/t?timeout=0")
            .await
            .assert_error(503, "fault injected");
    }
    assert_eq!(
        dev.get("/tasks/poll/batch/t?timeout=0").await.status,
        StatusCode::OK
    );

    let listed = dev.send(dev.http.get(admin(&dev))).await.json();
    assert_eq!(listed[0]["id"], id);
    assert_eq!(listed[0]["remaining"], 0);
    assert_eq!(listed[0]["hits"], 2);
    let removed = dev
        .send(dev.http.delete(format!("{}/{id}", admin(&dev))))
        .await;
    assert_eq!(removed.status, StatusCode::OK);
    assert_eq!(dev.send(dev.http.get(admin(&dev))).await.json(), json!([]));
}

#[tokio::test]
async fn a_latency_fault_delays_then_serves() {
    let dev = Dev::start().await;
    let rule = json!({"path": "/api/health", "latencyMs": 500});
    dev.send(dev.http.post(admin(&dev)).json(&rule)).await;
    let started = Instant::now();
    assert_eq!(dev.get("/health").await.status, StatusCode::OK);
    assert!(started.elapsed() >= Duration::from_millis(500));
    let cleared = dev.send(dev.http.delete(admin(&dev))).await;
    assert_eq!(cleared.status, StatusCode::OK);
    let started = Instant::now();
    dev.get("/health").await;
    assert!(started.elapsed() < Duration::from_millis(500));
}

#[tokio::test]
async fn a_drop_fault_closes_the_connection_without_an_answer() {
    let dev = Dev::start().await;
    dev.linear_workflow("wf", &["work"]).await;
    dev.start_workflow("wf", json!({"x": 1})).await;
    let task = dev.poll_one("work").await;
    let rule = json!({"method": "POST", "path": "/api/tasks", "drop": true, "count": 1});
    dev.send(dev.http.post(admin(&dev)).json(&rule)).await;

    let body = crate::support::result(&task, "COMPLETED", json!({}));
    let error = dev
        .http
        .post(format!("{}/tasks", dev.api))
        .json(&body)
        .send()
        .await
        .expect_err("the connection is dropped");
    assert!(!error.is_status(), "{error}");
    // The update was never applied, and the next attempt goes through.
    assert_eq!(
        dev.task(task["taskId"].as_str().unwrap()).await["status"],
        "IN_PROGRESS"
    );
    assert_eq!(
        dev.update(&task, "COMPLETED", json!({})).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn invalid_fault_rules_are_refused() {
    let dev = Dev::start().await;
    for rule in [
        json!({"path": "/api"}),
        json!({"path": "/api", "status": 503, "drop": true}),
        json!({"nope": 1}),
        json!({"path": "/api", "detached": true}),
        json!({"path": "/api", "detached": true, "latencyMs": 10, "status": 503}),
        json!({"path": "/api", "latencyMs": 10, "holdPath": "/api/x"}),
        json!({"path": "/api", "latencyMs": 10, "detached": true, "holdMethod": "DELETE"}),
        json!({"path": "/api", "latencyMs": 10, "detached": true, "holdPath": "/a", "holdMethod": "BAD METHOD"}),
    ] {
        let reply = dev.send(dev.http.post(admin(&dev)).json(&rule)).await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{rule}: {}",
            reply.text
        );
    }
}

#[tokio::test]
async fn faults_can_be_set_in_process() {
    let dev = Dev::start().await;
    let spec = FaultSpec {
        path: "/api/health".into(),
        status: Some(500),
        count: Some(1),
        ..Default::default()
    };
    let id = dev.server.faults().add(spec).unwrap();
    dev.get("/health").await.assert_error(500, "fault injected");
    assert_eq!(dev.get("/health").await.status, StatusCode::OK);
    assert!(dev.server.faults().remove(id));
    assert!(!dev.server.faults().remove(id));
    let error = dev.server.faults().add(FaultSpec::default()).unwrap_err();
    assert!(error.to_string().contains("needs status"), "{error}");
}

#[tokio::test]
async fn a_body_contains_rule_matches_only_requests_whose_body_has_the_text() {
    let dev = Dev::start().await;
    dev.linear_workflow("wf", &["work"]).await;
    dev.start_workflow("wf", json!({"x": 1})).await;
    let task = dev.poll_one("work").await;
    let id = dev
        .server
        .faults()
        .add(FaultSpec {
            method: Some("POST".into()),
            path: "/api/tasks".into(),
            body_contains: Some("\"extendLease\":true".into()),
            status: Some(503),
            ..Default::default()
        })
        .unwrap();

    // A lease extension is refused (twice), a completion with the same route goes through.
    let mut extension = crate::support::result(&task, "IN_PROGRESS", json!({}));
    extension["extendLease"] = json!(true);
    for _ in 0..2 {
        dev.post("/tasks", &extension)
            .await
            .assert_error(503, "fault injected");
    }
    assert_eq!(dev.server.faults().hits(id), Some(2));
    assert_eq!(
        dev.update(&task, "COMPLETED", json!({"done": true}))
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(dev.server.faults().hits(id), Some(2));
    let stored = dev.task(task["taskId"].as_str().unwrap()).await;
    assert_eq!(stored["status"], "COMPLETED");
    assert_eq!(
        stored["outputData"],
        json!({"done": true}),
        "the body was passed on"
    );
    // Over HTTP too, and listed with its counters.
    let rule = json!({"path": "/api/health", "bodyContains": "x", "status": 500});
    dev.send(dev.http.post(admin(&dev)).json(&rule)).await;
    assert_eq!(dev.get("/health").await.status, StatusCode::OK);
    let listed = dev.send(dev.http.get(admin(&dev))).await.json();
    assert_eq!(listed[1]["bodyContains"], "x");
    assert_eq!(listed[1]["hits"], 0);
    assert_eq!(dev.server.faults().hits(999), None);
}

#[tokio::test]
async fn a_body_fault_answers_its_text_instead_of_serving() {
    let dev = Dev::start().await;
    let rule = json!({"path": "/api/tasks/poll/", "status": 200, "body": "{\"forged\": true}", "count": 1});
    let added = dev.send(dev.http.post(admin(&dev)).json(&rule)).await;
    assert_eq!(added.status, StatusCode::OK, "{}", added.text);
    let forged = dev.get("/tasks/poll/batch/t?timeout=0").await;
    assert_eq!(forged.status, StatusCode::OK);
    assert_eq!(forged.json(), json!({"forged": true}));
    // A body needs a status to answer with.
    let refused = dev
        .send(
            dev.http
                .post(admin(&dev))
                .json(&json!({"path": "/api/tasks", "body": "{}"})),
        )
        .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert!(
        refused.text.contains("body needs a status"),
        "{}",
        refused.text
    );
}

#[tokio::test]
async fn a_location_fault_answers_a_redirect() {
    let dev = Dev::start().await;
    let rule = json!({"path": "/api/tasks/poll/", "status": 307, "location": "http://127.0.0.1:9/x", "count": 1});
    let added = dev.send(dev.http.post(admin(&dev)).json(&rule)).await;
    assert_eq!(added.status, StatusCode::OK, "{}", added.text);
    let url = format!("{}/api/tasks/poll/batch/t?timeout=0", dev.server.root_url());
    let plain = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let answer = plain.get(url).send().await.unwrap();
    assert_eq!(answer.status(), StatusCode::TEMPORARY_REDIRECT);
    assert_eq!(answer.headers()["location"], "http://127.0.0.1:9/x");
    let refused = dev
        .send(
            dev.http
                .post(admin(&dev))
                .json(&json!({"path": "/api/tasks", "location": "http://x/", "latencyMs": 1})),
        )
        .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert!(
        refused.text.contains("location needs a status"),
        "{}",
        refused.text
    );
}
