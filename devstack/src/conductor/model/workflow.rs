//! The workflow instance (`Workflow`, §3.6): the stored record and its JSON view.

use std::collections::HashMap;
use std::sync::Arc;

use serde::Serialize;
use serde_json::{Map, Value};

use super::defs::WorkflowDef;
use super::task::Task;

/// Status of a workflow instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum WorkflowStatus {
    Running,
    Completed,
    Failed,
    TimedOut,
    Terminated,
    Paused,
}

impl WorkflowStatus {
    /// COMPLETED, FAILED, TIMED_OUT and TERMINATED are final.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Completed | Self::Failed | Self::TimedOut | Self::Terminated
        )
    }
}

/// A stored workflow instance; its tasks live in the store by id, in `task_ids` order.
#[derive(Debug, Clone)]
pub struct Workflow {
    pub workflow_id: String,
    pub def: Arc<WorkflowDef>,
    pub status: WorkflowStatus,
    pub create_time: i64,
    pub update_time: i64,
    pub end_time: i64,
    pub input: Map<String, Value>,
    pub output: Map<String, Value>,
    pub correlation_id: Option<String>,
    pub reason_for_incompletion: Option<String>,
    pub task_ids: Vec<String>,
    pub task_to_domain: HashMap<String, String>,
    pub failed_reference_task_names: Vec<String>,
    pub failed_task_names: Vec<String>,
    pub priority: i32,
}

/// The JSON shape of `GET /api/workflow/{id}`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowView<'a> {
    pub workflow_id: &'a str,
    pub workflow_name: &'a str,
    pub workflow_version: i32,
    pub status: WorkflowStatus,
    pub create_time: i64,
    pub start_time: i64,
    pub update_time: i64,
    pub end_time: i64,
    pub input: &'a Map<String, Value>,
    pub output: &'a Map<String, Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason_for_incompletion: Option<&'a str>,
    pub tasks: Vec<&'a Task>,
    pub task_to_domain: &'a HashMap<String, String>,
    pub failed_reference_task_names: &'a [String],
    pub failed_task_names: &'a [String],
    pub workflow_definition: &'a WorkflowDef,
    pub priority: i32,
    pub variables: Map<String, Value>,
    pub last_retried_time: i64,
}

impl Workflow {
    /// The JSON view, with `tasks` filled from the store when asked for.
    pub fn view<'a>(&'a self, tasks: Vec<&'a Task>) -> WorkflowView<'a> {
        WorkflowView {
            workflow_id: &self.workflow_id,
            workflow_name: &self.def.name,
            workflow_version: self.def.version,
            status: self.status,
            create_time: self.create_time,
            start_time: self.create_time,
            update_time: self.update_time,
            end_time: self.end_time,
            input: &self.input,
            output: &self.output,
            correlation_id: self.correlation_id.as_deref(),
            reason_for_incompletion: self.reason_for_incompletion.as_deref(),
            tasks,
            task_to_domain: &self.task_to_domain,
            failed_reference_task_names: &self.failed_reference_task_names,
            failed_task_names: &self.failed_task_names,
            workflow_definition: &self.def,
            priority: self.priority,
            variables: Map::new(),
            last_retried_time: 0,
        }
    }
}
