//! Conversions between the slot protocol's messages and the core types, executor side:
//! assignments come in, results go out.

use perago_core::json::{Kind, RawJson};
use perago_core::{
    attempt::{AttemptSnapshot, TaskStatus},
    result::{Outcome, RuntimeResult},
};
use perago_proto::slot::v1 as wire;

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
    // The broker checked the input as it came from Conductor (as it would be parsed, numbers
    // included): here it is kept as text and forwarded, its depth counted and its syntax
    // skimmed (both without parsing), and only its top level read (by `parse_input`).
    let input_data = RawJson::skimmed(attempt.input_data_json).map_err(|e| {
        WireError(format!(
            "input_data_json is not JSON: {}",
            perago_core::errors::DisplayChain(&e)
        ))
    })?;
    if perago_core::json::kind(input_data.as_str()) != Kind::Object {
        return Err(WireError("input_data_json is not a JSON object".into()));
    }
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
    result_into_wire(result.clone())
}

/// [`result_to_wire`], moving the output (which can be megabytes) into the message.
pub fn result_into_wire(result: RuntimeResult) -> wire::TaskResult {
    use wire::task_result::Outcome as W;
    let (worker_id, outcome) = result.into_parts();
    let outcome = match outcome {
        Outcome::Completed(output) => W::Completed(wire::Completed {
            output_json: output.into_string(),
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
        worker_id,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(input: &str) -> wire::AttemptSnapshot {
        wire::AttemptSnapshot {
            workflow_instance_id: "wf".into(),
            task_id: "t".into(),
            status: wire::TaskStatus::InProgress as i32,
            input_data_json: input.to_owned(),
            ..Default::default()
        }
    }

    /// The input is kept as the broker sent it, byte for byte.
    #[test]
    fn an_input_is_kept_as_it_came() {
        let text =
            r#"{"params": {"x": 1.0e2, "s": "\u00e9", "big": 123456789012345678901234567890}}"#;
        let received = attempt_from_wire(attempt(text)).unwrap();
        assert_eq!(received.input_data.as_str(), text);
    }

    /// Too deep, malformed or not an object: refused with the errors parsing gives.
    #[test]
    fn a_bad_input_is_refused_as_before() {
        let deep = format!(r#"{{"params": {}1{}}}"#, "[".repeat(1000), "]".repeat(1000));
        for text in [deep.as_str(), "{\"params\": {}", "{\"params\": {}} x", ""] {
            let parsed = perago_core::json::from_str(text).unwrap_err();
            assert_eq!(
                attempt_from_wire(attempt(text)).unwrap_err().to_string(),
                format!("malformed assignment: input_data_json is not JSON: {parsed}")
            );
        }
        for text in ["[1]", "\"s\"", "null"] {
            assert_eq!(
                attempt_from_wire(attempt(text)).unwrap_err().to_string(),
                "malformed assignment: input_data_json is not a JSON object"
            );
        }
    }
}
