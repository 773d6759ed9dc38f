//! Malformed bodies, wrong enum values, missing ids and unknown routes: the real server's
//! status with an `ErrorResponse` body, and the server keeps serving.

use reqwest::StatusCode;
use serde_json::json;

use crate::support::Dev;

#[tokio::test]
async fn malformed_json_is_a_500_with_an_error_body() {
    let dev = Dev::start().await;
    for path in [
        "/tasks",
        "/tasks/update-v2",
        "/metadata/taskdefs",
        "/workflow",
        "/workflow/x",
    ] {
        dev.post_raw(path, "{not json")
            .await
            .assert_error(500, "JSON parse error");
    }
    dev.post_raw("/tasks", "")
        .await
        .assert_error(500, "JSON parse error");
    assert_eq!(
        dev.get("/health").await.status,
        StatusCode::OK,
        "still serving"
    );
}

#[tokio::test]
async fn wrong_enum_values_are_a_500_like_jackson() {
    let dev = Dev::start().await;
    dev.linear_workflow("wf", &["work"]).await;
    let workflow_id = dev.start_workflow("wf", json!({"x": 1})).await;
    let task = dev.poll_one("work").await;
    for status in ["completed", "SCHEDULED", "DONE"] {
        let body =
            json!({"workflowInstanceId": workflow_id, "taskId": task["taskId"], "status": status});
        dev.post("/tasks", &body)
            .await
            .assert_error(500, "unknown variant");
    }
    dev.post(
        "/metadata/taskdefs",
        &json!([{"name": "t", "retryLogic": "fixed"}]),
    )
    .await
    .assert_error(500, "unknown variant");
    assert_eq!(
        dev.task(task["taskId"].as_str().unwrap()).await["status"],
        "IN_PROGRESS"
    );
}

#[tokio::test]
async fn missing_ids_fail_validation_before_any_lookup() {
    let dev = Dev::start().await;
    let reply = dev.post("/tasks", &json!({})).await;
    reply.assert_error(400, "Validation failed, check below errors for detail.");
    let messages: Vec<_> = reply.json()["validationErrors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["message"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        messages.contains(&"Workflow Id cannot be null or empty".to_owned()),
        "{messages:?}"
    );
    assert!(
        messages.contains(&"Task ID cannot be null or empty".to_owned()),
        "{messages:?}"
    );
    // extendLease without a workflow id is still a validation failure (trap 16).
    dev.post("/tasks", &json!({"taskId": "t", "extendLease": true}))
        .await
        .assert_error(400, "Validation failed");
}

#[tokio::test]
async fn unknown_routes_and_methods_answer_json_errors() {
    let dev = Dev::start().await;
    dev.get("/nope").await.assert_error(404, "No handler found");
    let reply = dev
        .send(dev.http.delete(format!("{}/tasks/update-v2", dev.api)))
        .await;
    reply.assert_error(405, "not supported");
    dev.get("/tasks/poll/batch/t?count=many")
        .await
        .assert_error(500, "count");
}

#[tokio::test]
async fn health_is_always_healthy() {
    let dev = Dev::start().await;
    let expected = json!({"healthResults": [], "suppressedHealthResults": [], "healthy": true});
    assert_eq!(dev.get("/health").await.json(), expected);
    let root = dev
        .send(dev.http.get(format!("{}/health", dev.server.root_url())))
        .await;
    assert_eq!(root.json(), expected);
}

#[tokio::test]
async fn nulls_for_primitive_fields_and_any_case_booleans_are_accepted() {
    let dev = Dev::start().await;
    let def = json!({"name": "wf", "tasks": [{"name": "work", "taskReferenceName": "w"}]});
    assert_eq!(
        dev.post("/metadata/workflow?overwrite=True", &def)
            .await
            .status,
        StatusCode::OK
    );
    let workflow_id = dev.start_workflow("wf", json!({})).await;
    let task = dev.poll_one("work").await;
    let body = json!({"workflowInstanceId": workflow_id, "taskId": task["taskId"],
                      "status": "COMPLETED", "callbackAfterSeconds": null, "extendLease": null,
                      "outputData": null, "logs": null});
    let reply = dev.post("/tasks", &body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(dev.workflow(&workflow_id).await["status"], "COMPLETED");
}

#[tokio::test]
async fn absurd_numbers_do_not_panic_the_server() {
    let dev = Dev::start().await;
    dev.linear_workflow("wf", &["work"]).await;
    dev.start_workflow("wf", json!({"x": 1})).await;
    let task = dev.poll_one("work").await;
    for callback in [i64::MAX, i64::MIN, -5] {
        let body = json!({"workflowInstanceId": task["workflowInstanceId"], "taskId": task["taskId"],
                          "status": "IN_PROGRESS", "callbackAfterSeconds": callback});
        assert_eq!(dev.post("/tasks", &body).await.status, StatusCode::OK);
        // Polling computes the wait until the message is due.
        dev.poll("work", 1, 10).await;
    }
    let reply = dev
        .get(&format!(
            "/tasks/poll/batch/work?count={}&timeout=10",
            i64::MAX
        ))
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    dev.post("/metadata/taskdefs", &json!([{"name": "huge", "responseTimeoutSeconds": i64::MAX,
                                            "retryDelaySeconds": i32::MAX, "retryLogic": "EXPONENTIAL_BACKOFF"}]))
        .await;
    dev.linear_workflow("huge_wf", &["huge"]).await;
    dev.start_workflow("huge_wf", json!({"x": 1})).await;
    let huge = dev.poll_one("huge").await;
    assert_eq!(
        dev.update(&huge, "FAILED", json!({})).await.status,
        StatusCode::OK
    );
    assert_eq!(
        dev.get("/tasks/queue/size?taskType=huge").await.json(),
        json!(1)
    );
    assert_eq!(dev.get("/health").await.status, StatusCode::OK);
}
