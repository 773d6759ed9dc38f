//! Whether Conductor applied a result update it answered 200 to. It does not say: an update
//! of a task that is already terminal (timed out, canceled, or a retry scheduled after it) or
//! of a terminal workflow is answered as if applied (v1: 200 and the task id; update-v2: its
//! next task or 204; see the API reference, §4.3). So when the broker has a reason to doubt an
//! update (the attempt's lease was found lost, a lease extension failed, or the update needed
//! retries: Conductor may have timed the attempt out meanwhile), it reads the task back once the update is
//! acknowledged: the update was applied if the task now has the status sent and the sending
//! executor's worker id (every update overwrites `workerId`). Other updates are taken as
//! applied without a read, so the common path costs nothing.
//!
//! What cannot be told apart: two executions of the same task by the same executor (the
//! second sees its own worker id and status), and an update whose read-back fails (then the
//! broker's belief stands: ignored after a lost lease, applied otherwise).

use perago_core::{attempt::TaskStatus, conductor::ConductorClient, result::ResultStatus};
use serde_json::Value;

/// What a read-back says about an update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The task has the status sent, and the sender's worker id.
    Applied,
    /// The task has another status or another worker's id: the update was not applied.
    Ignored { status: String, worker_id: String },
    /// The answer does not say (no status).
    Unknown,
}

/// Judges the task as read back after an update of status `sent` by `worker_id`.
pub(crate) fn verdict(sent: ResultStatus, worker_id: &str, task: &Value) -> Verdict {
    let Some(status) = task
        .get("status")
        .and_then(Value::as_str)
        .and_then(TaskStatus::parse)
    else {
        return Verdict::Unknown;
    };
    let stored_worker = task.get("workerId").and_then(Value::as_str).unwrap_or("");
    if status.as_str() == sent.as_str() && stored_worker == worker_id {
        Verdict::Applied
    } else {
        Verdict::Ignored {
            status: status.as_str().to_owned(),
            worker_id: stored_worker.to_owned(),
        }
    }
}

/// Reads `task_id` back after its update (status `sent` by `worker_id`) was acknowledged and
/// says whether it was applied; `lease_lost` is the answer when the read fails.
pub(crate) async fn applied(
    client: &ConductorClient,
    task_id: &str,
    sent: ResultStatus,
    worker_id: &str,
    lease_lost: bool,
) -> bool {
    let read = client.get_task(task_id).await;
    let verdict = match &read {
        Ok(task) => verdict(sent, worker_id, task),
        Err(e) if e.is_not_found() => Verdict::Ignored {
            status: "unknown to Conductor".to_owned(),
            worker_id: String::new(),
        },
        Err(_) => Verdict::Unknown,
    };
    match verdict {
        Verdict::Applied => true,
        Verdict::Ignored { status, worker_id } => {
            tracing::warn!(
                sent = sent.as_str(),
                found = %status,
                found_worker_id = %worker_id,
                "result ignored by Conductor: the attempt was no longer in progress when its update arrived"
            );
            false
        }
        Verdict::Unknown => {
            tracing::debug!(
                error = ?read.as_ref().err().map(perago_core::errors::chain),
                lease_lost,
                "cannot tell whether Conductor applied the update; counted by what the broker knows"
            );
            !lease_lost
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_update_is_applied_only_with_its_status_and_its_worker_id() {
        let ours = "perago-executor-0001@t";
        let task = |status: &str, worker: &str| json!({"status": status, "workerId": worker});
        assert_eq!(
            verdict(ResultStatus::Completed, ours, &task("COMPLETED", ours)),
            Verdict::Applied
        );
        assert_eq!(
            verdict(ResultStatus::Failed, ours, &task("FAILED", ours)),
            Verdict::Applied
        );
        // Conductor timed the attempt out before the update: it kept TIMED_OUT.
        assert_eq!(
            verdict(ResultStatus::Completed, ours, &task("TIMED_OUT", "")),
            Verdict::Ignored {
                status: "TIMED_OUT".into(),
                worker_id: String::new()
            }
        );
        // The workflow was terminated: CANCELED stays.
        assert!(matches!(
            verdict(ResultStatus::Completed, ours, &task("CANCELED", ours)),
            Verdict::Ignored { .. }
        ));
        // Another executor's result was applied first.
        assert!(matches!(
            verdict(
                ResultStatus::Completed,
                ours,
                &task("COMPLETED", "perago-executor-0002@t")
            ),
            Verdict::Ignored { .. }
        ));
        // Still in progress (requeued): not ours either.
        assert!(matches!(
            verdict(ResultStatus::Completed, ours, &task("SCHEDULED", ours)),
            Verdict::Ignored { .. }
        ));
        assert_eq!(
            verdict(ResultStatus::Completed, ours, &json!({})),
            Verdict::Unknown
        );
        assert_eq!(
            verdict(
                ResultStatus::Completed,
                ours,
                &json!({"status": "completed"})
            ),
            Verdict::Unknown,
            "a status Conductor does not send decides nothing"
        );
    }
}
