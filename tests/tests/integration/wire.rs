//! The broker's and the executor's halves of the slot protocol agree: an attempt and every
//! kind of result survive the trip over the wire, and a malformed message is refused.

use perago_broker::wire as broker;
use perago_core::{
    attempt::{AttemptSnapshot, TaskStatus},
    json::RawJson,
    result::{Reason, RuntimeResult},
    shape::workspace_free_output,
};
use perago_executor::wire as executor;
use perago_proto::slot::v1 as proto;
use serde_json::json;

fn attempt(status: TaskStatus) -> AttemptSnapshot {
    let mut a = AttemptSnapshot::from_conductor(&json!({
        "taskId": "t-1", "workflowInstanceId": "wf-1", "retryCount": 2, "taskDefName": "d",
        "referenceTaskName": "r", "seq": 9, "iteration": 1, "status": "IN_PROGRESS",
        "inputData": {"params": {"big": 9007199254740993_u64, "f": 1.5}},
        "retriedTaskId": "t-0", "responseTimeoutSeconds": 60, "startTime": 1_700_000_000_000_i64
    }))
    .unwrap();
    a.status = status;
    a
}

#[test]
fn attempts_round_trip_in_every_status() {
    for status in TaskStatus::ALL {
        let sent = attempt(status);
        let received = executor::attempt_from_wire(broker::attempt_to_wire(&sent)).unwrap();
        assert_eq!(received, sent);
    }
    // Integers stay integers (no float detour as google.protobuf.Struct would take).
    let wire = broker::attempt_to_wire(&attempt(TaskStatus::InProgress));
    assert!(
        wire.input_data_json.contains("9007199254740993"),
        "{}",
        wire.input_data_json
    );
}

#[test]
fn results_round_trip() {
    let results = [
        RuntimeResult::completed(
            "w0001",
            workspace_free_output(RawJson::from_value(&json!({"n": 1}))),
        ),
        RuntimeResult::failed("w0001", Reason::new("body failed (exit status 1)")),
        RuntimeResult::failed_terminal("w0001", Reason::new("pre guardrail failed")),
    ];
    for sent in results {
        let received = broker::result_from_wire(executor::result_to_wire(&sent)).unwrap();
        assert_eq!(received, sent);
    }
}

#[test]
fn malformed_messages_are_refused() {
    let no_outcome = proto::TaskResult {
        outcome: None,
        worker_id: "w".into(),
    };
    assert_eq!(
        broker::result_from_wire(no_outcome)
            .unwrap_err()
            .to_string(),
        "malformed completion: the result has no outcome"
    );
    let not_object = proto::TaskResult {
        outcome: Some(proto::task_result::Outcome::Completed(proto::Completed {
            output_json: "[1]".into(),
        })),
        worker_id: "w".into(),
    };
    assert!(broker::result_from_wire(not_object).is_err());
    let empty_reason = proto::TaskResult {
        outcome: Some(proto::task_result::Outcome::Failed(proto::Failed {
            reason: " ".into(),
        })),
        worker_id: "w".into(),
    };
    assert_eq!(
        broker::result_from_wire(empty_reason)
            .unwrap_err()
            .to_string(),
        "malformed completion: a failed result has an empty reason"
    );
    let no_worker = proto::TaskResult {
        outcome: Some(proto::task_result::Outcome::Failed(proto::Failed {
            reason: "x".into(),
        })),
        worker_id: String::new(),
    };
    assert!(broker::result_from_wire(no_worker).is_err());

    let mut bad = broker::attempt_to_wire(&attempt(TaskStatus::InProgress));
    bad.status = 0;
    assert_eq!(
        executor::attempt_from_wire(bad.clone())
            .unwrap_err()
            .to_string(),
        "malformed assignment: unknown task status 0"
    );
    bad.status = proto::TaskStatus::InProgress as i32;
    bad.input_data_json = "[]".into();
    assert_eq!(
        executor::attempt_from_wire(bad).unwrap_err().to_string(),
        "malformed assignment: input_data_json is not a JSON object"
    );
}
