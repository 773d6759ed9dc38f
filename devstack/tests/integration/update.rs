//! Update v1 and v2: completion, the IN_PROGRESS requeue, callbacks, late and unknown updates,
//! and task logs.

use reqwest::StatusCode;
use serde_json::json;

use crate::support::{Dev, result};

#[tokio::test]
async fn update_v1_answers_the_task_id_as_text_and_replaces_output() {
    let dev = Dev::start().await;
    dev.linear_workflow("wf", &["work"]).await;
    dev.start_workflow("wf", json!({"x": 1})).await;
    let task = dev.poll_one("work").await;
    let task_id = task["taskId"].as_str().unwrap();

    let reply = dev.update(&task, "COMPLETED", json!({"x": 2})).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.text, task_id);
    assert!(reply.content_type.unwrap().starts_with("text/plain"));

    let stored = dev.task(task_id).await;
    assert_eq!(stored["status"], "COMPLETED");
    assert_eq!(stored["outputData"], json!({"x": 2}));
    assert!(stored["endTime"].as_i64().unwrap() >= stored["startTime"].as_i64().unwrap());
}

#[tokio::test]
async fn update_v2_hands_back_the_next_task_or_204() {
    let dev = Dev::start().await;
    dev.linear_workflow("wf", &["work"]).await;
    dev.start_workflow("wf", json!({"x": 1})).await;
    dev.start_workflow("wf", json!({"x": 2})).await;
    let first = dev.poll_one("work").await;

    let reply = dev
        .post("/tasks/update-v2", &result(&first, "COMPLETED", json!({})))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    let next = reply.json();
    assert_eq!(next["status"], "IN_PROGRESS");
    assert_eq!(next["workerId"], "test-worker");
    assert_eq!(next["inputData"], json!({"x": 2}));
    assert_ne!(next["taskId"], first["taskId"]);

    // v3.32: an IN_PROGRESS update leaves the task non-terminal, so no poll: 204.
    let reply = dev
        .post("/tasks/update-v2", &result(&next, "IN_PROGRESS", json!({})))
        .await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT);
    assert!(reply.text.is_empty());
    let again = dev.poll_one("work").await;
    assert_eq!(again["taskId"], next["taskId"]);

    // Terminal update with nothing left to hand out: 204.
    let reply = dev
        .post("/tasks/update-v2", &result(&again, "COMPLETED", json!({})))
        .await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn in_progress_update_requeues_the_same_task_after_its_callback() {
    // 1 Conductor second = 50 ms.
    let dev = Dev::scaled(0.05).await;
    dev.linear_workflow("wf", &["work"]).await;
    dev.start_workflow("wf", json!({"x": 1})).await;
    let task = dev.poll_one("work").await;
    let task_id = task["taskId"].as_str().unwrap();

    let mut body = result(&task, "IN_PROGRESS", json!({"progress": 50}));
    body["callbackAfterSeconds"] = json!(20); // 1 s real
    let reply = dev.post("/tasks", &body).await;
    assert_eq!(reply.text, task_id);

    let stored = dev.task(task_id).await;
    assert_eq!(
        stored["status"], "SCHEDULED",
        "IN_PROGRESS is stored as SCHEDULED"
    );
    assert_eq!(stored["callbackAfterSeconds"], 20);
    assert_eq!(
        dev.get("/tasks/queue/size?taskType=work").await.json(),
        json!(1)
    );
    assert!(
        dev.poll("work", 1, 0).await.is_empty(),
        "invisible until the callback"
    );

    let again = dev.poll_one("work").await;
    assert_eq!(again["taskId"], task["taskId"]);
    assert_eq!(again["pollCount"], 2);
    assert_eq!(again["status"], "IN_PROGRESS");
    assert_eq!(again["startTime"], task["startTime"]);
    assert_eq!(again["outputData"], json!({"progress": 50}));
    assert_eq!(again["callbackAfterSeconds"], 0);

    // Without a callback the task is pollable at once.
    let reply = dev
        .post("/tasks", &result(&again, "IN_PROGRESS", json!({})))
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    let third = dev.poll("work", 1, 0).await;
    assert_eq!(third[0]["pollCount"], 3);
}

#[tokio::test]
async fn updates_to_terminal_tasks_are_accepted_and_ignored() {
    let dev = Dev::start().await;
    dev.linear_workflow("wf", &["work"]).await;
    dev.start_workflow("wf", json!({"x": 1})).await;
    let task = dev.poll_one("work").await;
    let task_id = task["taskId"].as_str().unwrap();
    dev.update(&task, "COMPLETED", json!({"x": "first"})).await;

    let late = dev.update(&task, "FAILED", json!({"x": "late"})).await;
    assert_eq!(late.status, StatusCode::OK);
    assert_eq!(late.text, task_id);
    let stored = dev.task(task_id).await;
    assert_eq!(stored["status"], "COMPLETED");
    assert_eq!(stored["outputData"], json!({"x": "first"}));

    let late_v2 = dev
        .post("/tasks/update-v2", &result(&task, "COMPLETED", json!({})))
        .await;
    assert_eq!(late_v2.status, StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn updates_to_unknown_workflows_and_tasks_are_404() {
    let dev = Dev::start().await;
    dev.linear_workflow("wf", &["work"]).await;
    let workflow_id = dev.start_workflow("wf", json!({"x": 1})).await;

    let unknown_wf = json!({"workflowInstanceId": "nope", "taskId": "t", "status": "COMPLETED"});
    dev.post("/tasks", &unknown_wf)
        .await
        .assert_error(404, "No such workflow found by id: nope");
    dev.post("/tasks/update-v2", &unknown_wf)
        .await
        .assert_error(404, "No such workflow found by id: nope");

    let unknown_task =
        json!({"workflowInstanceId": workflow_id, "taskId": "t", "status": "COMPLETED"});
    dev.post("/tasks", &unknown_task)
        .await
        .assert_error(404, "No such task found by id: t");

    dev.get("/tasks/nope")
        .await
        .assert_error(404, "Task not found for taskId: nope");

    let lease = json!({"workflowInstanceId": workflow_id, "taskId": "t", "extendLease": true});
    dev.post("/tasks", &lease)
        .await
        .assert_error(404, "No such task found by id: t");
}

#[tokio::test]
async fn task_logs_come_from_the_log_route_and_from_results() {
    let dev = Dev::start().await;
    dev.linear_workflow("wf", &["work"]).await;
    dev.start_workflow("wf", json!({"x": 1})).await;
    let task = dev.poll_one("work").await;
    let task_id = task["taskId"].as_str().unwrap();

    let none = dev.get(&format!("/tasks/{task_id}/log")).await;
    assert_eq!(none.status, StatusCode::NO_CONTENT);

    let reply = dev
        .post_raw(&format!("/tasks/{task_id}/log"), "step one")
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.text.is_empty());
    let mut body = result(&task, "COMPLETED", json!({}));
    body["logs"] = json!([{"log": "step two", "createdTime": 1_700_000_000}]);
    dev.post("/tasks", &body).await;

    let logs = dev.get(&format!("/tasks/{task_id}/log")).await.json();
    assert_eq!(logs[0]["log"], "step one");
    assert_eq!(logs[0]["taskId"], task_id);
    assert!(logs[0]["createdTime"].as_i64().unwrap() > 1_700_000_000_000);
    assert_eq!(logs[1]["log"], "step two");
    assert_eq!(logs[1]["taskId"], task_id);
    assert_eq!(
        logs[1]["createdTime"], 1_700_000_000,
        "the client's createdTime is kept"
    );
}

#[tokio::test]
async fn large_outputs_are_accepted() {
    let dev = Dev::start().await;
    dev.linear_workflow("wf", &["work"]).await;
    dev.start_workflow("wf", json!({"x": 1})).await;
    let task = dev.poll_one("work").await;
    let big = "x".repeat(4 * 1024 * 1024);
    let reply = dev.update(&task, "COMPLETED", json!({"blob": big})).await;
    assert_eq!(
        reply.status,
        StatusCode::OK,
        "{}",
        &reply.text[..reply.text.len().min(200)]
    );
    let stored = dev.task(task["taskId"].as_str().unwrap()).await;
    assert_eq!(
        stored["outputData"]["blob"].as_str().unwrap().len(),
        4 * 1024 * 1024
    );
}
