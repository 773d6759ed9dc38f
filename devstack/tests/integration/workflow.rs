//! Workflows of linear SIMPLE tasks: start forms, advancing, outputs, terminate.

use reqwest::StatusCode;
use serde_json::json;

use crate::support::Dev;

#[tokio::test]
async fn a_linear_workflow_advances_task_by_task_and_completes_with_its_output() {
    let dev = Dev::start().await;
    dev.linear_workflow("chain", &["double", "increment"]).await;
    let workflow_id = dev.start_workflow("chain", json!({"x": 5})).await;

    let first = dev.poll_one("double").await;
    assert_eq!(first["inputData"], json!({"x": 5}));
    assert_eq!(first["seq"], 1);
    assert!(
        dev.poll("increment", 1, 0).await.is_empty(),
        "the second step waits"
    );
    dev.update(&first, "COMPLETED", json!({"x": 10})).await;

    // The next task is scheduled inside the update, so it is pollable at once.
    let second = dev.poll("increment", 1, 0).await.remove(0);
    assert_eq!(second["inputData"], json!({"x": 10}));
    assert_eq!(second["seq"], 2);
    dev.update(&second, "COMPLETED", json!({"x": 11})).await;

    let workflow = dev.workflow(&workflow_id).await;
    assert_eq!(workflow["status"], "COMPLETED");
    assert_eq!(workflow["output"], json!({"result": 11}));
    assert_eq!(workflow["workflowName"], "chain");
    assert_eq!(workflow["workflowVersion"], 1);
    assert_eq!(workflow["input"], json!({"x": 5}));
    assert!(workflow["endTime"].as_i64().unwrap() >= workflow["startTime"].as_i64().unwrap());
    let statuses: Vec<_> = workflow["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["status"].clone())
        .collect();
    assert_eq!(statuses, vec![json!("COMPLETED"), json!("COMPLETED")]);

    let without = dev
        .get(&format!("/workflow/{workflow_id}?includeTasks=false"))
        .await
        .json();
    assert_eq!(without["tasks"], json!([]));
}

#[tokio::test]
async fn start_by_request_body_takes_version_correlation_and_inline_input() {
    let dev = Dev::start().await;
    dev.linear_workflow("wf", &["work"]).await;
    let request = json!({"name": "wf", "version": 1, "correlationId": "c-1", "input": {"x": 3}});
    let reply = dev.post("/workflow", &request).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert!(reply.content_type.unwrap().starts_with("text/plain"));
    let workflow = dev.workflow(&reply.text).await;
    assert_eq!(workflow["correlationId"], "c-1");
    let task = dev.poll_one("work").await;
    assert_eq!(task["correlationId"], "c-1");
    assert_eq!(task["inputData"], json!({"x": 3}));

    let by_name = dev
        .post("/workflow/wf?version=1&correlationId=c-2", &json!({"x": 4}))
        .await;
    assert_eq!(dev.workflow(&by_name.text).await["correlationId"], "c-2");

    dev.post("/workflow/missing", &json!({}))
        .await
        .assert_error(404, "No such workflow found by name: missing");
    dev.post("/workflow", &json!({"name": "wf", "version": 9}))
        .await
        .assert_error(404, "version: 9");
    dev.post("/workflow", &json!({"input": {}}))
        .await
        .assert_error(400, "Validation failed");
}

#[tokio::test]
async fn workflow_without_output_parameters_outputs_its_last_task_output() {
    let dev = Dev::start().await;
    let def = json!({"name": "plain", "tasks": [{"name": "work", "taskReferenceName": "w"}]});
    assert_eq!(
        dev.post("/metadata/workflow", &def).await.status,
        StatusCode::OK
    );
    let workflow_id = dev.start_workflow("plain", json!({})).await;
    let task = dev.poll_one("work").await;
    dev.update(&task, "COMPLETED", json!({"answer": 42})).await;
    assert_eq!(
        dev.workflow(&workflow_id).await["output"],
        json!({"answer": 42})
    );
}

/// The in-process read a benchmark waits with: running until the last task completes, ended
/// after, ended for a terminated one too, and unknown for an id devstack never gave.
#[tokio::test]
async fn workflow_running_reads_the_state_in_process() {
    let dev = Dev::start().await;
    dev.linear_workflow("chain", &["double", "increment"]).await;
    let workflow_id = dev.start_workflow("chain", json!({"x": 5})).await;
    assert_eq!(dev.server.workflow_running(&workflow_id), Some(true));
    let first = dev.poll_one("double").await;
    dev.update(&first, "COMPLETED", json!({"x": 10})).await;
    assert_eq!(
        dev.server.workflow_running(&workflow_id),
        Some(true),
        "one task of two done"
    );
    let second = dev.poll_one("increment").await;
    dev.update(&second, "COMPLETED", json!({"x": 11})).await;
    assert_eq!(dev.server.workflow_running(&workflow_id), Some(false));
    assert_eq!(dev.workflow(&workflow_id).await["status"], "COMPLETED");

    let terminated = dev.start_workflow("chain", json!({"x": 1})).await;
    dev.terminate(&terminated, "enough").await;
    assert_eq!(dev.server.workflow_running(&terminated), Some(false));
    assert_eq!(dev.server.workflow_running("no-such-workflow"), None);
}

#[tokio::test]
async fn terminate_cancels_pending_tasks() {
    let dev = Dev::start().await;
    dev.linear_workflow("wf", &["work"]).await;
    let workflow_id = dev.start_workflow("wf", json!({"x": 1})).await;
    dev.terminate(&workflow_id, "enough").await;
    let workflow = dev.workflow(&workflow_id).await;
    assert_eq!(workflow["status"], "TERMINATED");
    assert_eq!(workflow["reasonForIncompletion"], "enough");
    assert_eq!(workflow["tasks"][0]["status"], "CANCELED");
    assert!(dev.poll("work", 1, 0).await.is_empty());
}

#[tokio::test]
async fn an_optional_task_that_fails_completes_with_errors_and_the_workflow_goes_on() {
    let dev = Dev::start().await;
    dev.task_def("maybe", json!({"retryCount": 0})).await;
    let def = json!({"name": "opt", "tasks": [
        {"name": "maybe", "taskReferenceName": "m", "optional": true},
        {"name": "work", "taskReferenceName": "w"}]});
    assert_eq!(
        dev.post("/metadata/workflow", &def).await.status,
        StatusCode::OK
    );
    let workflow_id = dev.start_workflow("opt", json!({})).await;
    let task = dev.poll_one("maybe").await;
    dev.update(&task, "FAILED", json!({})).await;
    let next = dev.poll_one("work").await;
    dev.update(&next, "COMPLETED", json!({"done": true})).await;
    let workflow = dev.workflow(&workflow_id).await;
    assert_eq!(workflow["status"], "COMPLETED");
    assert_eq!(workflow["tasks"][0]["status"], "COMPLETED_WITH_ERRORS");
}
