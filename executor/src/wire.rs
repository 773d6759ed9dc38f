//! Conversions between the slot protocol's messages and the core types, executor side:
//! assignments come in, results go out.

use perago_core::{
    attempt::{AttemptSnapshot, TaskStatus},
    result::{Outcome, RuntimeResult},
};
use perago_proto::slot::v1 as wire;
use serde_json::Value;

/// An assignment whose attempt cannot be read. The executor fails it rather than guessing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed assignment: {0}")]
pub struct WireError(pub String);

/// The core status of a wire status.
pub fn status_from_wire(status: wire::TaskStatus) -> Option<TaskStatus> {
    use wire::TaskStatus as W;
    Some(match status {
        W::Unspecified => return None,
        W::InProgress => TaskStatus::InProgress,
        W::Canceled => TaskStatus::Canceled,
        W::Failed => TaskStatus::Failed,
        W::FailedWithTerminalError => TaskStatus::FailedWithTerminalError,
        W::Completed => TaskStatus::Completed,
        W::CompletedWithErrors => TaskStatus::CompletedWithErrors,
        W::Scheduled => TaskStatus::Scheduled,
        W::TimedOut => TaskStatus::TimedOut,
        W::Skipped => TaskStatus::Skipped,
    })
}

/// The attempt of an assignment (or of a `ReloadAttempt` answer).
pub fn attempt_from_wire(attempt: wire::AttemptSnapshot) -> Result<AttemptSnapshot, WireError> {
    let status = wire::TaskStatus::try_from(attempt.status)
        .ok()
        .and_then(status_from_wire)
        .ok_or_else(|| WireError(format!("unknown task status {}", attempt.status)))?;
    // As deep as Conductor allows (serde_json alone stops at 128 levels).
    let input_data = match perago_core::json::from_str(&attempt.input_data_json) {
        Ok(Value::Object(map)) => map,
        Ok(_) => return Err(WireError("input_data_json is not a JSON object".into())),
        Err(e) => return Err(WireError(format!("input_data_json is not JSON: {e}"))),
    };
    if attempt.task_id.is_empty() || attempt.workflow_instance_id.is_empty() {
        return Err(WireError(
            "task_id and workflow_instance_id are required".into(),
        ));
    }
    Ok(AttemptSnapshot {
        workflow_instance_id: attempt.workflow_instance_id,
        task_id: attempt.task_id,
        retry_count: attempt.retry_count,
        task_def_name: attempt.task_def_name,
        reference_task_name: attempt.reference_task_name,
        seq: attempt.seq,
        iteration: attempt.iteration,
        status,
        input_data,
        retried_task_id: attempt.retried_task_id,
        response_timeout_seconds: attempt.response_timeout_seconds,
        timeout_clock_started_ms: attempt.timeout_clock_started_unix_ms,
    })
}

/// The wire form of a result.
pub fn result_to_wire(result: &RuntimeResult) -> wire::TaskResult {
    use wire::task_result::Outcome as W;
    let outcome = match result.outcome() {
        Outcome::Completed(output) => W::Completed(wire::Completed {
            output_json: serde_json::to_string(output).expect("a JSON map always serializes"),
        }),
        Outcome::Failed(reason) => W::Failed(wire::Failed {
            reason: reason.as_str().to_owned(),
        }),
        Outcome::FailedTerminal(reason) => W::FailedTerminal(wire::Failed {
            reason: reason.as_str().to_owned(),
        }),
    };
    wire::TaskResult {
        outcome: Some(outcome),
        worker_id: result.worker_id().to_owned(),
    }
}
