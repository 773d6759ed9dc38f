//! Request bodies: `TaskResult` (§3.3) and `StartWorkflowRequest` (§3.6). Unknown fields are
//! ignored, as Jackson is configured to do on the real server.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::{Map, Value};

use super::defs::WorkflowDef;
use super::task::{TaskExecLog, TaskStatus};

/// Statuses a worker may report (`TaskResult.Status`); anything else fails deserialization.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TaskResultStatus {
    /// Still working: for a worker task this requeues it (stored as SCHEDULED).
    InProgress,
    /// Failed; retried per the TaskDef.
    Failed,
    /// Failed; never retried.
    FailedWithTerminalError,
    /// Done.
    Completed,
    /// Canceled by the worker (v3.32+); not retried, the workflow is TERMINATED.
    Canceled,
}

impl From<TaskResultStatus> for TaskStatus {
    fn from(status: TaskResultStatus) -> Self {
        match status {
            TaskResultStatus::InProgress => Self::InProgress,
            TaskResultStatus::Failed => Self::Failed,
            TaskResultStatus::FailedWithTerminalError => Self::FailedWithTerminalError,
            TaskResultStatus::Completed => Self::Completed,
            TaskResultStatus::Canceled => Self::Canceled,
        }
    }
}

/// Body of `POST /api/tasks` and `POST /api/tasks/update-v2`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct TaskResult {
    pub workflow_instance_id: Option<String>,
    pub task_id: Option<String>,
    pub reason_for_incompletion: Option<String>,
    #[serde(deserialize_with = "null_as_default")]
    pub callback_after_seconds: i64,
    pub worker_id: Option<String>,
    pub status: Option<TaskResultStatus>,
    pub output_data: Option<Map<String, Value>>,
    pub logs: Option<Vec<TaskExecLog>>,
    pub external_output_payload_storage_path: Option<String>,
    pub sub_workflow_id: Option<String>,
    #[serde(deserialize_with = "null_as_default")]
    pub extend_lease: bool,
}

/// Jackson on the server accepts `null` for primitive fields and leaves them at their default;
/// a client that serializes unset options as `null` must not get a 500 for it.
fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// Body of `POST /api/workflow`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct StartWorkflowRequest {
    pub name: Option<String>,
    pub version: Option<i32>,
    pub correlation_id: Option<String>,
    pub input: Option<Map<String, Value>>,
    pub task_to_domain: Option<HashMap<String, String>>,
    pub workflow_def: Option<WorkflowDef>,
    pub priority: Option<i32>,
}
