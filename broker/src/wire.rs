//! Conversions between the slot protocol's messages and the core types, broker side:
//! attempts go out, results come in. A result that does not decode is refused (fail closed):
//! the broker never reports something it cannot read.

use perago_core::{
    attempt::{AttemptSnapshot, TaskStatus},
    result::{Reason, RuntimeResult},
};
use perago_proto::slot::v1 as wire;
use serde_json::Value;

/// A completion whose result cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed completion: {0}")]
pub struct WireError(pub String);

/// The wire status of a core status.
pub fn status_to_wire(status: TaskStatus) -> wire::TaskStatus {
    use wire::TaskStatus as W;
    match status {
        TaskStatus::InProgress => W::InProgress,
        TaskStatus::Canceled => W::Canceled,
        TaskStatus::Failed => W::Failed,
        TaskStatus::FailedWithTerminalError => W::FailedWithTerminalError,
        TaskStatus::Completed => W::Completed,
        TaskStatus::CompletedWithErrors => W::CompletedWithErrors,
        TaskStatus::Scheduled => W::Scheduled,
        TaskStatus::TimedOut => W::TimedOut,
        TaskStatus::Skipped => W::Skipped,
    }
}

/// The attempt's input as the JSON text the slot protocol carries.
fn input_json(attempt: &AttemptSnapshot) -> String {
    serde_json::to_string(&attempt.input_data).expect("a JSON map always serializes")
}

/// The length of [`input_json`], counted without building the text.
pub fn input_json_len(attempt: &AttemptSnapshot) -> usize {
    perago_core::json::encoded_len(&attempt.input_data)
}

/// The wire form of an attempt.
pub fn attempt_to_wire(attempt: &AttemptSnapshot) -> wire::AttemptSnapshot {
    wire::AttemptSnapshot {
        workflow_instance_id: attempt.workflow_instance_id.clone(),
        task_id: attempt.task_id.clone(),
        retry_count: attempt.retry_count,
        task_def_name: attempt.task_def_name.clone(),
        reference_task_name: attempt.reference_task_name.clone(),
        seq: attempt.seq,
        iteration: attempt.iteration,
        status: status_to_wire(attempt.status) as i32,
        input_data_json: input_json(attempt),
        retried_task_id: attempt.retried_task_id.clone(),
        response_timeout_seconds: attempt.response_timeout_seconds,
        timeout_clock_started_unix_ms: attempt.timeout_clock_started_ms,
    }
}

/// The core form of a completion's result.
pub fn result_from_wire(result: wire::TaskResult) -> Result<RuntimeResult, WireError> {
    use wire::task_result::Outcome as W;
    if result.worker_id.is_empty() {
        return Err(WireError("worker_id is empty".into()));
    }
    let worker = result.worker_id;
    let failure_reason = |f: wire::Failed| {
        if f.reason.trim().is_empty() {
            Err(WireError("a failed result has an empty reason".into()))
        } else {
            Ok(Reason::new(f.reason))
        }
    };
    match result.outcome {
        None => Err(WireError("the result has no outcome".into())),
        Some(W::Completed(c)) => match perago_core::json::from_str(&c.output_json) {
            Ok(Value::Object(output)) => Ok(RuntimeResult::completed(worker, output)),
            Ok(_) => Err(WireError("output_json is not a JSON object".into())),
            Err(e) => Err(WireError(format!("output_json is not JSON: {e}"))),
        },
        Some(W::Failed(f)) => Ok(RuntimeResult::failed(worker, failure_reason(f)?)),
        Some(W::FailedTerminal(f)) => {
            Ok(RuntimeResult::failed_terminal(worker, failure_reason(f)?))
        }
    }
}
