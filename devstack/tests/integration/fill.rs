//! `--queue-semantics`: a batch poll on Conductor's SQL queues answers only once it holds
//! `count` tasks or its timeout has passed, and the tasks it popped wait in the server
//! meanwhile (issue #24, item 3); `immediate` answers with the first task.

use std::time::Duration;

use perago_devstack::conductor::QueueSemantics;
use serde_json::json;
use tokio::time::Instant;

use crate::support::{Dev, eventually};

#[tokio::test]
async fn an_under_filled_batch_poll_waits_out_its_timeout_holding_the_task() {
    let dev = Dev::with_semantics(QueueSemantics::FillOrTimeout).await;
    dev.linear_workflow("wf", &["work"]).await;
    let workflow_id = dev.start_workflow("wf", json!({"x": 1})).await;
    let started = Instant::now();
    let batch = {
        let http = dev.http.clone();
        let url = format!(
            "{}/tasks/poll/batch/work?workerid=batcher&count=3&timeout=1000",
            dev.api
        );
        tokio::spawn(async move { http.get(url).send().await.unwrap().text().await.unwrap() })
    };
    eventually("the batch poll is waiting", || async {
        (dev.server.polls_waiting() == 1).then_some(())
    })
    .await;
    // Popped: no other poll sees it, and it is not handed out yet.
    assert_eq!(
        dev.poll("work", 1, 0).await,
        Vec::<serde_json::Value>::new()
    );
    let workflow = dev.workflow(&workflow_id).await;
    assert_eq!(workflow["tasks"][0]["status"], "SCHEDULED", "{workflow}");

    let body: serde_json::Value = serde_json::from_str(&batch.await.unwrap()).unwrap();
    let waited = started.elapsed();
    assert_eq!(body.as_array().unwrap().len(), 1, "{body}");
    assert_eq!(body[0]["workerId"], "batcher");
    assert!(
        waited >= Duration::from_millis(1000),
        "an under-filled batch answers only after its timeout: {waited:?}"
    );
}

#[tokio::test]
async fn a_batch_poll_answers_as_soon_as_it_is_full() {
    let dev = Dev::with_semantics(QueueSemantics::FillOrTimeout).await;
    dev.linear_workflow("wf", &["work"]).await;
    dev.start_workflow("wf", json!({"x": 1})).await;
    let started = Instant::now();
    let batch = {
        let http = dev.http.clone();
        let url = format!("{}/tasks/poll/batch/work?count=2&timeout=5000", dev.api);
        tokio::spawn(async move { http.get(url).send().await.unwrap().text().await.unwrap() })
    };
    eventually("the batch poll is waiting", || async {
        (dev.server.polls_waiting() == 1).then_some(())
    })
    .await;
    dev.start_workflow("wf", json!({"x": 2})).await;
    let body: serde_json::Value = serde_json::from_str(&batch.await.unwrap()).unwrap();
    assert_eq!(body.as_array().unwrap().len(), 2, "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "a full batch answers before its timeout: {:?}",
        started.elapsed()
    );
    // A poll with count 1 is full with its first task.
    dev.start_workflow("wf", json!({"x": 3})).await;
    let one = Instant::now();
    assert_eq!(dev.poll("work", 1, 5000).await.len(), 1);
    assert!(
        one.elapsed() < Duration::from_secs(1),
        "{:?}",
        one.elapsed()
    );
}

#[tokio::test]
async fn tasks_popped_for_a_client_that_went_away_are_handed_out_all_the_same() {
    let dev = Dev::with_semantics(QueueSemantics::FillOrTimeout).await;
    dev.linear_workflow("wf", &["work"]).await;
    let workflow_id = dev.start_workflow("wf", json!({"x": 1})).await;
    let abandoned = {
        let http = dev.http.clone();
        let url = format!(
            "{}/tasks/poll/batch/work?workerid=gone&count=4&timeout=5000",
            dev.api
        );
        tokio::spawn(async move { http.get(url).send().await })
    };
    eventually("the batch poll is waiting", || async {
        (dev.server.polls_waiting() == 1).then_some(())
    })
    .await;
    abandoned.abort();
    // As on the real server: the popped task goes IN_PROGRESS for a worker that never sees it
    // (it waits for its response timeout); it is not put back.
    let task = eventually("the popped task is handed out", || async {
        let workflow = dev.workflow(&workflow_id).await;
        let task = workflow["tasks"][0].clone();
        (task["status"] == "IN_PROGRESS").then_some(task)
    })
    .await;
    assert_eq!(task["workerId"], "gone");
    assert_eq!(dev.server.polls_waiting(), 0);
}

#[tokio::test]
async fn immediate_semantics_answer_with_the_first_task() {
    let dev = Dev::with_semantics(QueueSemantics::Immediate).await;
    dev.linear_workflow("wf", &["work"]).await;
    dev.start_workflow("wf", json!({"x": 1})).await;
    let started = Instant::now();
    assert_eq!(dev.poll("work", 3, 3000).await.len(), 1);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
}
