//! Response timeouts, extendLease, task timeouts and retries, on a time-scaled server so that
//! Conductor's second-granularity settings take milliseconds.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use tokio::time::Instant;

use crate::support::{Dev, result};

#[tokio::test]
async fn response_timeout_times_the_task_out_and_schedules_a_retry() {
    // 1 Conductor second = 20 ms: a 10 s response timeout takes 200 ms.
    let dev = Dev::scaled(0.02).await;
    dev.task_def(
        "slow",
        json!({"responseTimeoutSeconds": 10, "retryCount": 1, "retryDelaySeconds": 5}),
    )
    .await;
    dev.linear_workflow("wf", &["slow"]).await;
    let workflow_id = dev.start_workflow("wf", json!({"x": 1})).await;

    let first = dev.poll_one("slow").await;
    // No update: the retry appears after the timeout (200 ms) and the delay (100 ms).
    let retry = dev.poll_one("slow").await;
    assert_ne!(retry["taskId"], first["taskId"]);
    assert_eq!(retry["retryCount"], 1);
    assert_eq!(retry["retriedTaskId"], first["taskId"]);
    assert_eq!(retry["referenceTaskName"], first["referenceTaskName"]);
    assert_eq!(retry["inputData"], first["inputData"]);
    assert_eq!(retry["startDelayInSeconds"], 5);
    assert_eq!(retry["pollCount"], 1);

    let timed_out = dev.task(first["taskId"].as_str().unwrap()).await;
    assert_eq!(timed_out["status"], "TIMED_OUT");
    assert_eq!(timed_out["retried"], true);
    let reason = timed_out["reasonForIncompletion"].as_str().unwrap();
    assert!(
        reason.starts_with("responseTimeout: 10 exceeded for the taskId: "),
        "{reason}"
    );

    // The retry budget is spent: the next timeout ends the workflow.
    let workflow = dev.finished_workflow(&workflow_id).await;
    assert_eq!(workflow["status"], "TIMED_OUT");
    assert_eq!(workflow["tasks"].as_array().unwrap().len(), 2);
    assert_eq!(workflow["failedReferenceTaskNames"], json!(["r0"]));
}

#[tokio::test]
async fn extend_lease_resets_the_response_timeout() {
    // A 10 s response timeout is 1 s real; heartbeats come every 100 ms.
    let dev = Dev::scaled(0.1).await;
    dev.task_def(
        "leased",
        json!({"responseTimeoutSeconds": 10, "retryCount": 0}),
    )
    .await;
    dev.linear_workflow("wf", &["leased"]).await;
    dev.start_workflow("wf", json!({"x": 1})).await;
    let task = dev.poll_one("leased").await;
    let task_id = task["taskId"].as_str().unwrap();

    // Heartbeat for 1.5 s, well past the 1 s timeout.
    let heartbeat = json!({"workflowInstanceId": task["workflowInstanceId"], "taskId": task_id,
                           "status": "IN_PROGRESS", "extendLease": true});
    let started = Instant::now();
    let mut ticks = tokio::time::interval(Duration::from_millis(100));
    while started.elapsed() < Duration::from_millis(1500) {
        ticks.tick().await;
        let reply = dev.post("/tasks", &heartbeat).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.text, task_id);
        let v2 = dev.post("/tasks/update-v2", &heartbeat).await;
        assert_eq!(v2.status, StatusCode::NO_CONTENT);
    }
    let stored = dev.task(task_id).await;
    assert_eq!(
        stored["status"], "IN_PROGRESS",
        "leases kept the task alive"
    );
    assert!(stored["updateTime"].as_i64() > task["updateTime"].as_i64());
    assert_eq!(
        stored["workerId"], "test-worker",
        "a lease touches nothing but updateTime"
    );

    // Heartbeats stop: the task times out, and without retries the workflow does too.
    let workflow_id = task["workflowInstanceId"].as_str().unwrap();
    let workflow = dev.finished_workflow(workflow_id).await;
    assert_eq!(workflow["status"], "TIMED_OUT");
    assert_eq!(dev.task(task_id).await["status"], "TIMED_OUT");
}

#[tokio::test]
async fn failed_is_retried_after_the_delay_and_terminal_error_is_not() {
    // A 20 s retry delay takes 1 s: long enough to see the retry invisible even on a busy machine.
    let dev = Dev::scaled(0.05).await;
    dev.task_def(
        "flaky",
        json!({"retryCount": 2, "retryDelaySeconds": 20, "retryLogic": "FIXED"}),
    )
    .await;
    dev.linear_workflow("wf", &["flaky"]).await;
    let workflow_id = dev.start_workflow("wf", json!({"x": 1})).await;

    let first = dev.poll_one("flaky").await;
    let mut failed = result(&first, "FAILED", json!({}));
    failed["reasonForIncompletion"] = json!("disk full");
    dev.post("/tasks", &failed).await;
    // The retry is queued but invisible for the delay.
    assert_eq!(
        dev.get("/tasks/queue/size?taskType=flaky").await.json(),
        json!(1)
    );
    assert!(dev.poll("flaky", 1, 0).await.is_empty());
    let retry = dev.poll_one("flaky").await;
    assert_eq!(retry["retryCount"], 1);
    assert_eq!(retry["retriedTaskId"], first["taskId"]);
    assert_eq!(
        retry["reasonForIncompletion"], "disk full",
        "carried from the failed attempt"
    );
    assert_eq!(retry["callbackAfterSeconds"], 0);

    let mut terminal = result(&retry, "FAILED_WITH_TERMINAL_ERROR", json!({}));
    terminal["reasonForIncompletion"] = json!("bad input");
    dev.post("/tasks", &terminal).await;
    let workflow = dev.finished_workflow(&workflow_id).await;
    assert_eq!(workflow["status"], "FAILED");
    assert_eq!(
        workflow["tasks"].as_array().unwrap().len(),
        2,
        "no retry after a terminal error"
    );
    let reason = workflow["reasonForIncompletion"].as_str().unwrap();
    assert_eq!(
        reason,
        format!(
            "Task {} failed with status: FAILED and reason: 'bad input'",
            retry["taskId"].as_str().unwrap()
        )
    );
}

#[tokio::test]
async fn retries_stop_at_the_retry_count_and_fail_the_workflow() {
    let dev = Dev::scaled(0.01).await;
    dev.task_def("flaky", json!({"retryCount": 1, "retryDelaySeconds": 1}))
        .await;
    dev.linear_workflow("wf", &["flaky"]).await;
    let workflow_id = dev.start_workflow("wf", json!({"x": 1})).await;
    for attempt in 0..2 {
        let task = dev.poll_one("flaky").await;
        assert_eq!(task["retryCount"], attempt);
        dev.update(&task, "FAILED", json!({})).await;
    }
    let workflow = dev.finished_workflow(&workflow_id).await;
    assert_eq!(workflow["status"], "FAILED");
    assert!(dev.poll("flaky", 1, 0).await.is_empty());
}

#[tokio::test]
async fn retry_delays_follow_the_retry_logic() {
    let dev = Dev::scaled(0.001).await;
    dev.task_def(
        "backoff",
        json!({"retryCount": 3, "retryDelaySeconds": 10, "retryLogic": "EXPONENTIAL_BACKOFF"}),
    )
    .await;
    dev.linear_workflow("wf", &["backoff"]).await;
    dev.start_workflow("wf", json!({"x": 1})).await;
    let mut delays = Vec::new();
    for _ in 0..3 {
        let task = dev.poll_one("backoff").await;
        dev.update(&task, "FAILED", json!({})).await;
        let workflow = dev
            .workflow(task["workflowInstanceId"].as_str().unwrap())
            .await;
        let retry = workflow["tasks"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()
            .clone();
        assert_eq!(retry["status"], "SCHEDULED");
        assert_eq!(retry["callbackAfterSeconds"], retry["startDelayInSeconds"]);
        delays.push(retry["startDelayInSeconds"].as_i64().unwrap());
    }
    assert_eq!(delays, vec![10, 20, 40]);
}

#[tokio::test]
async fn task_timeout_with_time_out_wf_ends_the_workflow_without_retry() {
    let dev = Dev::scaled(0.02).await;
    dev.task_def(
        "bounded",
        json!({"timeoutSeconds": 10, "responseTimeoutSeconds": 10, "retryCount": 3,
               "timeoutPolicy": "TIME_OUT_WF"}),
    )
    .await;
    dev.linear_workflow("wf", &["bounded"]).await;
    let workflow_id = dev.start_workflow("wf", json!({"x": 1})).await;
    let task = dev.poll_one("bounded").await;
    // Released for later (SCHEDULED, so no response timeout); timeoutSeconds still runs.
    let mut release = result(&task, "IN_PROGRESS", json!({}));
    release["callbackAfterSeconds"] = json!(100);
    dev.post("/tasks", &release).await;
    let workflow = dev.finished_workflow(&workflow_id).await;
    assert_eq!(workflow["status"], "TIMED_OUT");
    assert_eq!(workflow["tasks"].as_array().unwrap().len(), 1);
    // A result arriving after the timeout is accepted and dropped.
    let late = dev.update(&task, "COMPLETED", json!({})).await;
    assert_eq!(late.status, StatusCode::OK);
    assert_eq!(
        dev.task(task["taskId"].as_str().unwrap()).await["status"],
        "TIMED_OUT"
    );
}

#[tokio::test]
async fn poll_timeout_with_retry_policy_replaces_an_unpolled_task() {
    let dev = Dev::scaled(0.02).await;
    dev.task_def(
        "unpolled",
        json!({"pollTimeoutSeconds": 10, "retryCount": 1, "retryDelaySeconds": 0,
               "timeoutPolicy": "RETRY"}),
    )
    .await;
    dev.linear_workflow("wf", &["unpolled"]).await;
    let workflow_id = dev.start_workflow("wf", json!({"x": 1})).await;
    let workflow = crate::support::eventually("the unpolled task is retried", || async {
        let workflow = dev.workflow(&workflow_id).await;
        (workflow["tasks"].as_array().unwrap().len() == 2).then_some(workflow)
    })
    .await;
    assert_eq!(workflow["tasks"][0]["status"], "TIMED_OUT");
    let reason = workflow["tasks"][0]["reasonForIncompletion"]
        .as_str()
        .unwrap();
    assert!(reason.starts_with("Task poll timed out"), "{reason}");
    let retry = dev.poll_one("unpolled").await;
    assert_eq!(retry["retryCount"], 1);
}

#[tokio::test]
async fn concurrency_limit_postpones_extra_tasks() {
    // The 60 s postponement takes 600 ms.
    let dev = Dev::scaled(0.01).await;
    dev.task_def("single", json!({"concurrentExecLimit": 1}))
        .await;
    dev.linear_workflow("wf", &["single"]).await;
    dev.start_workflow("wf", json!({"x": 1})).await;
    dev.start_workflow("wf", json!({"x": 2})).await;
    let first = dev.poll("single", 2, 0).await;
    assert_eq!(first.len(), 1, "only one may run at a time");
    dev.update(&first[0], "COMPLETED", json!({})).await;
    let second = dev.poll_one("single").await;
    assert_eq!(second["inputData"], json!({"x": 2}));
}

/// Issue #24, item 7: with a sweep lag the response timeout fires that much after
/// `updateTime + responseTimeoutSeconds`, not at it; an update that lands in between is
/// accepted as on the real server, whose sweep would come later too.
#[tokio::test]
async fn a_sweep_lag_fires_timeouts_late_and_accepts_updates_meanwhile() {
    use perago_devstack::conductor::ConductorServer;
    // 1 Conductor second = 100 ms: the 2 s response timeout is 200 ms, the 3 s lag 300 ms.
    let dev = Dev::built(
        ConductorServer::builder()
            .time_scale(0.1)
            .sweep_lag(Duration::from_secs(3)),
    )
    .await;
    dev.task_def(
        "lagged",
        json!({"responseTimeoutSeconds": 2, "retryCount": 1}),
    )
    .await;
    dev.linear_workflow("wf", &["lagged"]).await;
    let workflow_id = dev.start_workflow("wf", json!({"x": 1})).await;

    // Past its deadline but inside the lag, the overrun attempt is still IN_PROGRESS, and its
    // COMPLETED update is accepted.
    let first = dev.poll_one("lagged").await;
    let first_id = first["taskId"].as_str().unwrap();
    let polled = Instant::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let task = dev.task(first_id).await;
    assert!(
        polled.elapsed() < Duration::from_millis(500),
        "a slow machine"
    );
    assert_eq!(task["status"], "IN_PROGRESS", "{task}");
    dev.update(&first, "COMPLETED", json!({"late": true})).await;
    let workflow = dev.finished_workflow(&workflow_id).await;
    assert_eq!(workflow["status"], "COMPLETED", "{workflow}");

    // Left alone, it times out only after deadline + lag (500 ms), not at 200 ms.
    let workflow_id = dev.start_workflow("wf", json!({"x": 2})).await;
    let second = dev.poll_one("lagged").await;
    let polled = Instant::now();
    let timed_out = crate::support::eventually("the lagged timeout", || async {
        let task = dev.task(second["taskId"].as_str().unwrap()).await;
        (task["status"] == "TIMED_OUT").then(Instant::now)
    })
    .await;
    let after = timed_out - polled;
    assert!(after >= Duration::from_millis(480), "fired after {after:?}");
    assert_eq!(
        dev.workflow(&workflow_id).await["tasks"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
}
