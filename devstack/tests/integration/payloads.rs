//! Payload thresholds and external payload storage, as Conductor's ExternalPayloadStorageUtils
//! and its storages do them (thresholds set small here: 1 KB and 4 KB).

use perago_devstack::conductor::{ConductorServer, PayloadStorage, PayloadThresholds};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{Dev, http_client};

async fn dev(storage: PayloadStorage) -> Dev {
    let server = ConductorServer::builder()
        .payload_thresholds(PayloadThresholds {
            task_input_kb: 1,
            max_task_input_kb: 4,
            task_output_kb: 1,
            max_task_output_kb: 4,
            max_workflow_input_kb: 8,
        })
        .payload_storage(storage)
        .bind("127.0.0.1:0")
        .await
        .unwrap();
    let api = server.base_url();
    Dev {
        server,
        http: http_client(),
        api,
    }
}

/// `{"x": "aaa…"}` of about `bytes` bytes.
fn input(bytes: usize) -> Value {
    json!({"x": "a".repeat(bytes)})
}

#[tokio::test]
async fn an_input_above_the_threshold_is_stored_and_read_through_a_presigned_url() {
    let dev = dev(PayloadStorage::Blob).await;
    dev.linear_workflow("wf", &["work"]).await;
    dev.start_workflow("wf", input(2000)).await;
    let task = dev.poll_one("work").await;
    assert_eq!(task["inputData"], json!({}));
    let path = task["externalInputPayloadStoragePath"].as_str().unwrap();

    let location = dev
        .get(&format!(
            "/tasks/externalstoragelocation?path={path}&operation=READ&payloadType=TASK_INPUT"
        ))
        .await;
    assert_eq!(location.status, StatusCode::OK, "{}", location.text);
    let location = location.json();
    assert_eq!(location["path"], path);
    let uri = location["uri"].as_str().unwrap();
    assert!(
        uri.starts_with(&format!("{}/payloads/", dev.server.payload_store_url())),
        "{uri}"
    );
    assert_ne!(
        dev.server.payload_store_url(),
        dev.server.root_url(),
        "another origin"
    );

    let read = dev.send(dev.http.get(uri)).await;
    assert_eq!(read.status, StatusCode::OK);
    assert_eq!(read.json(), input(2000));
    for header in ["X-Authorization", "Authorization"] {
        let read = dev.send(dev.http.get(uri).header(header, "token")).await;
        assert_eq!(read.status, StatusCode::BAD_REQUEST, "{header}");
        assert!(
            read.text.contains("Only one auth mechanism allowed"),
            "{}",
            read.text
        );
    }
    let unsigned = uri.split('?').next().unwrap();
    let read = dev.send(dev.http.get(unsigned)).await;
    assert_eq!(read.status, StatusCode::FORBIDDEN);

    let wrong = dev
        .get("/tasks/externalstoragelocation?path=p&operation=DELETE&payloadType=TASK_INPUT")
        .await;
    assert_eq!(wrong.status, StatusCode::BAD_REQUEST);
    assert!(
        wrong
            .text
            .contains("Invalid input - Operation: DELETE, PayloadType: TASK_INPUT"),
        "{}",
        wrong.text
    );
}

#[tokio::test]
async fn the_dummy_storage_answers_a_location_without_uri() {
    let dev = dev(PayloadStorage::Dummy).await;
    let location = dev
        .get("/tasks/external-storage-location?path=k.json&operation=READ&payloadType=TASK_INPUT")
        .await;
    assert_eq!(location.status, StatusCode::OK, "{}", location.text);
    let location = location.json();
    assert!(location.get("uri").is_none(), "{location}");
    let path = location["path"].as_str().unwrap();
    assert!(
        path.starts_with("k.json") && path.ends_with(".json") && path.len() > 20,
        "{path}"
    );
}

#[tokio::test]
async fn payloads_above_the_hard_limits_fail_the_task_or_refuse_the_start() {
    let dev = dev(PayloadStorage::Blob).await;
    dev.linear_workflow("wf", &["work"]).await;

    // A task input above 4 KB: the task fails for good as it is created, never polled.
    let id = dev.start_workflow("wf", input(5000)).await;
    let wf = dev.finished_workflow(&id).await;
    assert_eq!(wf["status"], "FAILED");
    let task = &wf["tasks"][0];
    assert_eq!(task["status"], "FAILED_WITH_TERMINAL_ERROR");
    assert_eq!(task["inputData"], json!({}));
    let reason = task["reasonForIncompletion"].as_str().unwrap();
    assert!(
        reason.starts_with("The payload size: 5008 of task: ")
            && reason.ends_with("is greater than the permissible limit: 4096 bytes"),
        "{reason}"
    );
    assert!(dev.poll("work", 1, 100).await.is_empty());

    // An output above 4 KB: forced to FAILED_WITH_TERMINAL_ERROR, v1 still answers 200.
    dev.start_workflow("wf", input(10)).await;
    let task = dev.poll_one("work").await;
    let reply = dev.update(&task, "COMPLETED", input(5000)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    let stored = dev.task(task["taskId"].as_str().unwrap()).await;
    assert_eq!(stored["status"], "FAILED_WITH_TERMINAL_ERROR");
    assert_eq!(stored["outputData"], json!({}));
    assert!(
        stored["reasonForIncompletion"]
            .as_str()
            .unwrap()
            .contains("is greater than the permissible limit: 4096 bytes")
    );

    // A workflow input above 8 KB: the start is refused (500), nothing is created.
    let reply = dev.post("/workflow/wf", &input(9000)).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(
        reply
            .text
            .contains("is greater than the permissible limit: 8192 bytes"),
        "{}",
        reply.text
    );
}
