//! Poll and batch poll: the SCHEDULED → IN_PROGRESS hand-out, empty answers, long polls.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use tokio::time::Instant;

use crate::support::Dev;

#[tokio::test]
async fn poll_hands_a_scheduled_task_out_once_and_records_the_worker() {
    let dev = Dev::start().await;
    dev.linear_workflow("wf", &["work"]).await;
    let workflow_id = dev.start_workflow("wf", json!({"x": 7})).await;

    let queued = dev.get("/tasks/queue/size?taskType=work").await;
    assert_eq!(queued.json(), json!(1));
    let before = dev.workflow(&workflow_id).await;
    assert_eq!(before["tasks"][0]["status"], "SCHEDULED");
    assert_eq!(before["tasks"][0]["startTime"], 0);

    let task = dev.poll_one("work").await;
    assert_eq!(task["status"], "IN_PROGRESS");
    assert_eq!(task["taskType"], "work");
    assert_eq!(task["taskDefName"], "work");
    assert_eq!(task["workerId"], "test-worker");
    assert_eq!(task["pollCount"], 1);
    assert_eq!(task["retryCount"], 0);
    assert_eq!(task["inputData"], json!({"x": 7}));
    assert_eq!(task["workflowInstanceId"], workflow_id.as_str());
    assert_eq!(task["referenceTaskName"], "r0");
    assert_eq!(task["callbackAfterSeconds"], 0);
    assert_eq!(task["responseTimeoutSeconds"], 3600);
    assert!(task["startTime"].as_i64().unwrap() > 0);
    assert_eq!(task["updateTime"], task["startTime"]);
    assert_eq!(task["workflowTask"]["type"], "SIMPLE");

    let stored = dev.task(task["taskId"].as_str().unwrap()).await;
    assert_eq!(stored["status"], "IN_PROGRESS");
    assert_eq!(stored["workerId"], "test-worker");
    assert_eq!(
        dev.get("/tasks/queue/size?taskType=work").await.json(),
        json!(0)
    );
    // Not handed out twice while IN_PROGRESS.
    assert!(dev.poll("work", 1, 0).await.is_empty());
}

#[tokio::test]
async fn empty_polls_answer_204_for_single_and_200_empty_array_for_batch() {
    let dev = Dev::start().await;
    let single = dev.get("/tasks/poll/nothing?workerid=w").await;
    assert_eq!(single.status, StatusCode::NO_CONTENT);
    assert!(single.text.is_empty());

    let batch = dev
        .get("/tasks/poll/batch/nothing?count=5&timeout=10")
        .await;
    assert_eq!(batch.status, StatusCode::OK);
    assert_eq!(batch.json(), json!([]));

    let too_long = dev.get("/tasks/poll/batch/nothing?timeout=5001").await;
    too_long.assert_error(400, "Long Poll Timeout value cannot be more than 5 seconds");
}

#[tokio::test]
async fn batch_poll_returns_up_to_count_tasks() {
    let dev = Dev::start().await;
    dev.linear_workflow("wf", &["work"]).await;
    for i in 0..5 {
        dev.start_workflow("wf", json!({"x": i})).await;
    }
    let first = dev.poll("work", 3, 100).await;
    assert_eq!(first.len(), 3);
    let rest = dev.poll("work", 10, 100).await;
    assert_eq!(rest.len(), 2);
    let inputs: Vec<_> = first
        .iter()
        .chain(&rest)
        .map(|t| t["inputData"]["x"].clone())
        .collect();
    assert_eq!(
        inputs,
        vec![json!(0), json!(1), json!(2), json!(3), json!(4)]
    );
}

#[tokio::test]
async fn long_poll_wakes_as_soon_as_a_task_is_queued() {
    let dev = Dev::start().await;
    dev.linear_workflow("wf", &["work"]).await;
    let started = Instant::now();
    let poller = {
        let http = dev.http.clone();
        let url = format!("{}/tasks/poll/batch/work?count=1&timeout=5000", dev.api);
        tokio::spawn(async move { http.get(url).send().await.unwrap().text().await.unwrap() })
    };
    // The workflow starts once the poll is waiting (it found the queue empty).
    crate::support::eventually("the long poll is waiting", || async {
        (dev.server.polls_waiting() == 1).then_some(())
    })
    .await;
    dev.start_workflow("wf", json!({"x": 1})).await;
    let body: serde_json::Value = serde_json::from_str(&poller.await.unwrap()).unwrap();
    assert_eq!(body.as_array().unwrap().len(), 1, "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "long poll should return on push, not at its timeout: {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn waiting_polls_are_counted_until_they_answer_or_their_client_leaves() {
    let dev = Dev::start().await;
    dev.linear_workflow("wf", &["work"]).await;
    assert_eq!(dev.server.polls_waiting(), 0);
    let url = format!("{}/tasks/poll/batch/work?count=1&timeout=5000", dev.api);
    let answered = {
        let (http, url) = (dev.http.clone(), url.clone());
        tokio::spawn(async move { http.get(url).send().await.unwrap().text().await.unwrap() })
    };
    let abandoned = {
        let http = dev.http.clone();
        tokio::spawn(async move { http.get(url).send().await })
    };
    crate::support::eventually("two polls are waiting", || async {
        (dev.server.polls_waiting() == 2).then_some(())
    })
    .await;
    abandoned.abort();
    crate::support::eventually("the abandoned poll is no longer counted", || async {
        (dev.server.polls_waiting() == 1).then_some(())
    })
    .await;
    assert_eq!(dev.server.queue_size("work"), 0);
    dev.start_workflow("wf", json!({"x": 1})).await;
    let body: serde_json::Value = serde_json::from_str(&answered.await.unwrap()).unwrap();
    assert_eq!(body.as_array().unwrap().len(), 1, "{body}");
    assert_eq!(dev.server.polls_waiting(), 0);
    dev.start_workflow("wf", json!({"x": 2})).await;
    assert_eq!(dev.server.queue_size("work"), 1);
}

#[tokio::test]
async fn domains_have_their_own_queues() {
    let dev = Dev::start().await;
    dev.linear_workflow("wf", &["work"]).await;
    let request = json!({"name": "wf", "input": {"x": 1}, "taskToDomain": {"*": "blue"}});
    let reply = dev.post("/workflow", &request).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert!(dev.poll("work", 1, 0).await.is_empty());
    let sizes = dev.get("/tasks/queue/all").await.json();
    assert_eq!(sizes["blue:work"], 1, "{sizes}");
    let reply = dev
        .get("/tasks/poll/batch/work?domain=blue&timeout=100")
        .await;
    let tasks = reply.json();
    assert_eq!(tasks[0]["domain"], "blue", "{tasks}");
}

#[tokio::test]
async fn queue_sizes_and_poll_data_report_per_type() {
    let dev = Dev::start().await;
    dev.linear_workflow("wf", &["work"]).await;
    dev.start_workflow("wf", json!({"x": 1})).await;
    dev.start_workflow("wf", json!({"x": 2})).await;
    let sizes = dev
        .get("/tasks/queue/sizes?taskType=work&taskType=other")
        .await;
    assert_eq!(sizes.json(), json!({"work": 2, "other": 0}));
    // One value is a comma-separated list, trimmed, as Spring binds it; repeated values are
    // taken whole (issue #24, item 7).
    let split = dev.get("/tasks/queue/sizes?taskType=work,%20other").await;
    assert_eq!(split.json(), json!({"work": 2, "other": 0}));
    let whole = dev
        .get("/tasks/queue/sizes?taskType=work,other&taskType=work,other")
        .await;
    assert_eq!(whole.json(), json!({"work,other": 0}));
    dev.poll("work", 1, 0).await;
    let data = dev.get("/tasks/queue/polldata?taskType=work").await.json();
    assert_eq!(data[0]["queueName"], "work", "{data}");
    assert_eq!(data[0]["workerId"], "test-worker", "{data}");
    assert!(data[0]["lastPollTime"].as_i64().unwrap() > 0);
}
