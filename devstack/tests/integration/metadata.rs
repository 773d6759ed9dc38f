//! Task and workflow definitions: create, update, get, list, delete, defaults and conflicts.

use reqwest::StatusCode;
use serde_json::json;

use crate::support::Dev;

#[tokio::test]
async fn task_defs_are_created_with_server_defaults_updated_and_listed() {
    let dev = Dev::start().await;
    dev.task_def(
        "a",
        json!({"ownerEmail": "me@example.com", "custom": {"k": 1}}),
    )
    .await;
    let def = dev.get("/metadata/taskdefs/a").await.json();
    assert_eq!(def["retryCount"], 3);
    assert_eq!(def["retryDelaySeconds"], 60);
    assert_eq!(def["responseTimeoutSeconds"], 3600);
    assert_eq!(def["timeoutPolicy"], "TIME_OUT_WF");
    assert_eq!(def["retryLogic"], "FIXED");
    assert_eq!(def["rateLimitFrequencyInSeconds"], 1);
    assert_eq!(def["custom"], json!({"k": 1}), "unknown fields are kept");
    assert!(def["createTime"].as_i64().unwrap() > 0);

    let reply = dev
        .put("/metadata/taskdefs", &json!({"name": "a", "retryCount": 0}))
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.text.is_empty());
    assert_eq!(
        dev.get("/metadata/taskdefs/a").await.json()["retryCount"],
        0
    );

    dev.put("/metadata/taskdefs", &json!({"name": "ghost"}))
        .await
        .assert_error(404, "No such task by name ghost");
    dev.get("/metadata/taskdefs/ghost")
        .await
        .assert_error(404, "No such taskType found by name: ghost");

    dev.task_def("b", json!({})).await;
    let names: Vec<_> = dev
        .get("/metadata/taskdefs")
        .await
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].clone())
        .collect();
    assert_eq!(names, vec![json!("a"), json!("b")]);

    let reply = dev
        .send(dev.http.delete(format!("{}/metadata/taskdefs/b", dev.api)))
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        dev.get("/metadata/taskdefs/b").await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn workflow_defs_conflict_unless_overwritten_and_resolve_the_latest_version() {
    let dev = Dev::start().await;
    let v1 =
        json!({"name": "wf", "version": 1, "tasks": [{"name": "t", "taskReferenceName": "t"}]});
    assert_eq!(
        dev.post("/metadata/workflow", &v1).await.status,
        StatusCode::OK
    );
    dev.post("/metadata/workflow", &v1)
        .await
        .assert_error(409, "already exists");
    assert_eq!(
        dev.post("/metadata/workflow?overwrite=true", &v1)
            .await
            .status,
        StatusCode::OK
    );

    let mut v2 = v1.clone();
    v2["version"] = json!(2);
    let bulk = dev.put("/metadata/workflow", &json!([v2])).await;
    assert_eq!(bulk.status, StatusCode::OK);
    assert_eq!(bulk.json()["bulkSuccessfulResults"], json!(["wf"]));

    assert_eq!(dev.get("/metadata/workflow/wf").await.json()["version"], 2);
    assert_eq!(
        dev.get("/metadata/workflow/wf?version=1").await.json()["version"],
        1
    );
    dev.get("/metadata/workflow/wf?version=7")
        .await
        .assert_error(404, "No such workflow found by name: wf, version: 7");
    assert_eq!(
        dev.get("/metadata/workflow")
            .await
            .json()
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

#[tokio::test]
async fn invalid_definitions_are_refused_with_validation_errors() {
    let dev = Dev::start().await;
    let reply = dev
        .post("/metadata/taskdefs", &json!([{"description": "no name"}]))
        .await;
    reply.assert_error(400, "Validation failed");
    assert!(
        !reply.json()["validationErrors"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    dev.post("/metadata/taskdefs", &json!([]))
        .await
        .assert_error(400, "Validation failed");
    dev.post(
        "/metadata/taskdefs",
        &json!([{"name": "x", "responseTimeoutSeconds": 0}]),
    )
    .await
    .assert_error(400, "Validation failed");
    dev.post("/metadata/workflow", &json!({"name": "empty", "tasks": []}))
        .await
        .assert_error(400, "Validation failed");
    let fork = json!({"name": "f", "tasks": [{"name": "x", "taskReferenceName": "x", "type": "FORK_JOIN"}]});
    let reply = dev.post("/metadata/workflow", &fork).await;
    reply.assert_error(400, "Validation failed");
    assert!(reply.text.contains("only SIMPLE"), "{}", reply.text);
}
