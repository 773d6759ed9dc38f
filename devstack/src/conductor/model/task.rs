//! The `Task` instance and its status enum, as the real server serializes them (§3.1, §3.2 of the
//! reference): camelCase names, upper-case enum values, epoch-millisecond timestamps with `0`
//! meaning "unset", and `null` fields omitted.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::defs::{TaskDef, WorkflowTask};

/// Status of a task instance (`Task.Status` on the server).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TaskStatus {
    /// Handed to a worker by a poll.
    InProgress,
    /// Stopped by the workflow or by a worker (v3.32+); never retried.
    Canceled,
    /// Failed; retried while the retry budget lasts.
    Failed,
    /// Failed in a way no retry can fix.
    FailedWithTerminalError,
    /// Done.
    Completed,
    /// An optional task that failed with no retries left.
    CompletedWithErrors,
    /// Waiting in its queue.
    Scheduled,
    /// A response, poll or task timeout fired.
    TimedOut,
    /// Skipped by the workflow.
    Skipped,
}

impl TaskStatus {
    /// Whether the status is final for this task instance.
    pub fn is_terminal(self) -> bool {
        !matches!(self, Self::InProgress | Self::Scheduled)
    }

    /// Whether the status counts as success for the workflow.
    pub fn is_successful(self) -> bool {
        !matches!(
            self,
            Self::Canceled | Self::Failed | Self::FailedWithTerminalError | Self::TimedOut
        )
    }

    /// Whether the decider may retry a task that ended with this status.
    pub fn is_retriable(self) -> bool {
        !matches!(
            self,
            Self::Canceled | Self::FailedWithTerminalError | Self::Skipped
        )
    }
}

/// One task instance. Retries are new instances with a new `taskId`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Task {
    pub task_type: String,
    pub status: TaskStatus,
    pub input_data: Map<String, Value>,
    pub reference_task_name: String,
    pub retry_count: i32,
    pub seq: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<String>,
    pub poll_count: i32,
    pub task_def_name: String,
    pub scheduled_time: i64,
    pub start_time: i64,
    pub end_time: i64,
    pub update_time: i64,
    pub start_delay_in_seconds: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retried_task_id: Option<String>,
    pub retried: bool,
    pub executed: bool,
    pub callback_from_worker: bool,
    pub response_timeout_seconds: i64,
    pub workflow_instance_id: String,
    pub workflow_type: String,
    pub task_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason_for_incompletion: Option<String>,
    pub callback_after_seconds: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_id: Option<String>,
    pub output_data: Map<String, Value>,
    pub workflow_task: WorkflowTask,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    pub rate_limit_per_frequency: i32,
    pub rate_limit_frequency_in_seconds: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub external_output_payload_storage_path: Option<String>,
    pub workflow_priority: i32,
    pub iteration: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sub_workflow_id: Option<String>,
    pub subworkflow_changed: bool,
    pub first_start_time: i64,
    /// Derived getter on the server (`startTime - scheduledTime`); kept up to date on poll.
    pub queue_wait_time: i64,
    pub loop_over_task: bool,
    /// Derived getter on the server: the TaskDef snapshot taken when the workflow started.
    pub task_definition: Arc<TaskDef>,
    /// Index of this task's WorkflowTask in the definition; the decider's cursor.
    #[serde(skip)]
    pub(crate) def_index: usize,
    /// Retries allowed: the WorkflowTask's `retryCount` if set, else the TaskDef's.
    #[serde(skip)]
    pub(crate) allowed_retries: i32,
    /// An ALERT_ONLY timeout already fired for this instance; it is reported once.
    #[serde(skip)]
    pub(crate) alerted: bool,
    /// Where the input went when it was above the task-input threshold (`inputData` is `{}`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub external_input_payload_storage_path: Option<String>,
}

/// A log line attached to a task.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskExecLog {
    #[serde(default)]
    pub log: Option<String>,
    #[serde(default)]
    pub task_id: Option<String>,
    #[serde(default)]
    pub created_time: i64,
}

/// The last poll seen for a queue.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PollData {
    pub queue_name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_id: Option<String>,
    pub last_poll_time: i64,
}
