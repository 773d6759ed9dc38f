//! Metadata models: `TaskDef` (§3.5), `WorkflowDef` and `WorkflowTask` (§3.6). Fields the dev
//! server does not interpret are kept in `extra` so a definition reads back as it was written.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// What a task or poll timeout does (`TaskDef.timeoutPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TimeoutPolicy {
    /// Mark the task TIMED_OUT and apply the retry logic.
    Retry,
    /// Mark the task and the workflow TIMED_OUT.
    #[default]
    TimeOutWf,
    /// Only report; the task keeps running.
    AlertOnly,
}

/// How the delay before a retry grows (`TaskDef.retryLogic`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RetryLogic {
    /// Always `retryDelaySeconds`.
    #[default]
    Fixed,
    /// `retryDelaySeconds · 2^retryCount`.
    ExponentialBackoff,
    /// `retryDelaySeconds · backoffScaleFactor · (retryCount + 1)`.
    LinearBackoff,
}

/// Workflow-level timeout policy (`WorkflowDef.timeoutPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum WorkflowTimeoutPolicy {
    /// Mark the workflow TIMED_OUT.
    TimeOutWf,
    /// Only report.
    #[default]
    AlertOnly,
}

fn default_retry_count() -> i32 {
    3
}
fn default_retry_delay() -> i32 {
    60
}
fn default_response_timeout() -> i64 {
    3600
}
fn one() -> i32 {
    1
}
fn two() -> i32 {
    2
}
fn yes() -> bool {
    true
}

/// A task definition. Defaults are the real server's (trap 7: slow for tests).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskDef {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default = "default_retry_count")]
    pub retry_count: i32,
    #[serde(default)]
    pub timeout_seconds: i64,
    #[serde(default)]
    pub input_keys: Vec<String>,
    #[serde(default)]
    pub output_keys: Vec<String>,
    #[serde(default)]
    pub timeout_policy: TimeoutPolicy,
    #[serde(default)]
    pub retry_logic: RetryLogic,
    #[serde(default = "default_retry_delay")]
    pub retry_delay_seconds: i32,
    #[serde(default = "default_response_timeout")]
    pub response_timeout_seconds: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrent_exec_limit: Option<i32>,
    #[serde(default)]
    pub input_template: Map<String, Value>,
    /// `null` on the server, serialized as 0 (off).
    #[serde(default)]
    pub rate_limit_per_frequency: i32,
    /// `null` on the server, serialized as 1.
    #[serde(default = "one")]
    pub rate_limit_frequency_in_seconds: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_email: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll_timeout_seconds: Option<i32>,
    #[serde(default = "one")]
    pub backoff_scale_factor: i32,
    #[serde(default)]
    pub max_retry_delay_seconds: i32,
    #[serde(default)]
    pub backoff_jitter_ms: i32,
    #[serde(default)]
    pub total_timeout_seconds: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_time: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_time: Option<i64>,
    /// Everything else (`ownerApp`, schemas, isolation groups…), stored and echoed untouched.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl TaskDef {
    /// The ad-hoc definition the server uses for an unregistered SIMPLE task (§4.1).
    pub fn with_defaults(name: &str) -> Self {
        let mut def: Self = serde_json::from_value(serde_json::json!({ "name": name }))
            .expect("a name-only TaskDef always deserializes");
        def.name = name.to_owned();
        def
    }

    /// Bean-validation messages, empty when the definition is valid.
    pub fn validation_errors(&self) -> Vec<String> {
        let mut errors = Vec::new();
        if self.name.is_empty() {
            errors.push("TaskDef name cannot be null or empty".to_owned());
        }
        if self.retry_count < 0 {
            errors.push("TaskDef retryCount: must be >= 0".to_owned());
        }
        if self.response_timeout_seconds < 1 {
            errors.push(format!(
                "TaskDef responseTimeoutSeconds: {} must be greater than 0",
                self.response_timeout_seconds
            ));
        }
        if self.timeout_seconds > 0 && self.response_timeout_seconds > self.timeout_seconds {
            errors.push(format!(
                "TaskDef: {} responseTimeoutSeconds: {} must be less than timeoutSeconds: {}",
                self.name, self.response_timeout_seconds, self.timeout_seconds
            ));
        }
        errors
    }
}

/// One step of a workflow definition.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowTask {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub task_reference_name: String,
    #[serde(default = "simple", rename = "type")]
    pub task_type: String,
    #[serde(default)]
    pub input_parameters: Map<String, Value>,
    #[serde(default)]
    pub start_delay: i32,
    #[serde(default)]
    pub optional: bool,
    /// Overrides the TaskDef's `retryCount` when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_count: Option<i32>,
    /// Filled with a snapshot of the registered TaskDef when a workflow starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_definition: Option<TaskDef>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

fn simple() -> String {
    "SIMPLE".to_owned()
}

/// A workflow definition; the dev server runs linear lists of SIMPLE tasks.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowDef {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default = "one")]
    pub version: i32,
    #[serde(default)]
    pub tasks: Vec<WorkflowTask>,
    #[serde(default)]
    pub input_parameters: Vec<String>,
    #[serde(default)]
    pub output_parameters: Map<String, Value>,
    #[serde(default = "two")]
    pub schema_version: i32,
    #[serde(default = "yes")]
    pub restartable: bool,
    #[serde(default)]
    pub timeout_policy: WorkflowTimeoutPolicy,
    #[serde(default)]
    pub timeout_seconds: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_time: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_time: Option<i64>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl WorkflowDef {
    /// Validation messages, empty when the definition can run here. Only SIMPLE tasks are
    /// supported: a definition using other task types is refused at registration rather than
    /// failing mysteriously at run time.
    pub fn validation_errors(&self) -> Vec<String> {
        let mut errors = Vec::new();
        if self.name.is_empty() {
            errors.push("WorkflowDef name cannot be null or empty".to_owned());
        }
        if self.tasks.is_empty() {
            errors.push("WorkflowTask list cannot be empty".to_owned());
        }
        let mut refs = std::collections::HashSet::new();
        for task in &self.tasks {
            if task.name.is_empty() {
                errors.push("WorkflowTask name cannot be empty or null".to_owned());
            }
            if task.task_reference_name.is_empty() {
                errors.push(format!(
                    "WorkflowTask taskReferenceName name cannot be empty or null for task {}",
                    task.name
                ));
            } else if !refs.insert(task.task_reference_name.as_str()) {
                errors.push(format!(
                    "taskReferenceName: {} should be unique across tasks for a given workflowDefinition: {}",
                    task.task_reference_name, self.name
                ));
            }
            if task.task_type != "SIMPLE" {
                errors.push(format!(
                    "devstack runs only SIMPLE tasks; task {} has type {}",
                    task.task_reference_name, task.task_type
                ));
            }
        }
        errors
    }
}
