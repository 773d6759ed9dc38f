//! Conversions between the slot protocol's messages and the core types, broker side:
//! attempts go out, results come in. A result that does not decode is refused (fail closed):
//! the broker never reports something it cannot read.

use perago_core::json::RawJson;
use perago_core::{
    attempt::{AttemptSnapshot, TaskStatus},
    result::{Reason, RuntimeResult},
};
use perago_proto::slot::v1 as wire;

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

/// The length of the attempt's input as the slot protocol carries it: the text it came as.
pub fn input_json_len(attempt: &AttemptSnapshot) -> usize {
    attempt.input_data.len()
}

/// The wire form of an attempt.
pub fn attempt_to_wire(attempt: &AttemptSnapshot) -> wire::AttemptSnapshot {
    wire_attempt(attempt, attempt.input_data.as_str().to_owned())
}

/// The wire form of an attempt being dispatched: its input (which can be megabytes) moves into
/// the message instead of being copied, and `{}` stands in for it in `attempt`: the broker has
/// no further use for it.
pub fn attempt_into_wire(attempt: &mut AttemptSnapshot) -> wire::AttemptSnapshot {
    let input = std::mem::replace(&mut attempt.input_data, RawJson::trusted("{}".to_owned()));
    wire_attempt(attempt, input.into_string())
}

fn wire_attempt(attempt: &AttemptSnapshot, input_data_json: String) -> wire::AttemptSnapshot {
    wire::AttemptSnapshot {
        workflow_instance_id: attempt.workflow_instance_id.clone(),
        task_id: attempt.task_id.clone(),
        retry_count: attempt.retry_count,
        task_def_name: attempt.task_def_name.clone(),
        reference_task_name: attempt.reference_task_name.clone(),
        seq: attempt.seq,
        iteration: attempt.iteration,
        status: status_to_wire(attempt.status) as i32,
        input_data_json,
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
        // Checked as it would be parsed (depth, syntax, the same errors), and kept as text:
        // it goes on to Conductor as it came.
        Some(W::Completed(c)) => match RawJson::parse(c.output_json) {
            Ok(output) if output.is_object() => Ok(RuntimeResult::completed(worker, output)),
            Ok(_) => Err(WireError("output_json is not a JSON object".into())),
            Err(e) => Err(WireError(format!(
                "output_json is not JSON: {}",
                perago_core::errors::DisplayChain(&e)
            ))),
        },
        Some(W::Failed(f)) => Ok(RuntimeResult::failed(worker, failure_reason(f)?)),
        Some(W::FailedTerminal(f)) => {
            Ok(RuntimeResult::failed_terminal(worker, failure_reason(f)?))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use perago_core::result::Outcome;

    fn completed(output_json: &str) -> wire::TaskResult {
        wire::TaskResult {
            outcome: Some(wire::task_result::Outcome::Completed(wire::Completed {
                output_json: output_json.to_owned(),
            })),
            worker_id: "w0001".into(),
        }
    }

    /// The output goes on as the executor wrote it, byte for byte.
    #[test]
    fn an_output_is_kept_as_it_came() {
        let text =
            r#"{"result": {"x": 1.0e2, "s": "\u00e9", "big": 123456789012345678901234567890}}"#;
        let result = result_from_wire(completed(&format!(" {text}\n"))).unwrap();
        let Outcome::Completed(output) = result.outcome() else {
            panic!("completed");
        };
        assert_eq!(output.as_str(), text);
    }

    /// A dispatched attempt's input moves into the message, unchanged; the rest is the same
    /// as a copy would be.
    #[test]
    fn a_dispatched_input_moves_into_the_message() {
        let text = r#"{"params": {"x": 1.0e2, "s": "\u00e9"}}"#;
        let task = format!(
            r#"{{"taskId": "t", "workflowInstanceId": "wf", "retryCount": 1, "taskDefName": "d",
                "referenceTaskName": "r", "seq": 2, "status": "IN_PROGRESS", "inputData": {text},
                "responseTimeoutSeconds": 30}}"#
        );
        let mut attempt =
            AttemptSnapshot::from_polled(perago_core::attempt::PolledTask::split(&task).unwrap())
                .unwrap();
        let copied = attempt_to_wire(&attempt);
        let lease = attempt.without_input();
        let moved = attempt_into_wire(&mut attempt);
        assert_eq!(moved, copied);
        assert_eq!(moved.input_data_json, text);
        assert_eq!(attempt.input_data.as_str(), "{}");
        assert_eq!(attempt, lease, "all but the input is kept");
        assert_eq!(lease.response_timeout_seconds, Some(30));
    }

    /// Too deep, malformed or not an object: refused with the errors parsing gives.
    #[test]
    fn a_bad_output_is_refused_as_before() {
        let deep = format!(r#"{{"result": {}1{}}}"#, "[".repeat(1000), "]".repeat(1000));
        for text in [deep.as_str(), "{\"result\": 1", "{\"result\": 1e400}", ""] {
            let parsed = perago_core::json::from_str(text).unwrap_err();
            assert_eq!(
                result_from_wire(completed(text)).unwrap_err().to_string(),
                format!("malformed completion: output_json is not JSON: {parsed}")
            );
        }
        assert_eq!(
            result_from_wire(completed(&"[".repeat(2000)))
                .unwrap_err()
                .to_string(),
            "malformed completion: output_json is not JSON: JSON nested 1001 levels deep; at most 1000 are accepted"
        );
        for text in ["[1]", "\"s\"", "null", "3"] {
            assert_eq!(
                result_from_wire(completed(text)).unwrap_err().to_string(),
                "malformed completion: output_json is not a JSON object"
            );
        }
    }
}
