//! The decider for linear workflows of SIMPLE tasks: starting a workflow, scheduling the next
//! task when one completes, handing failed attempts to `retry.rs` (§4.6), and ending the
//! workflow with its output or failure reason.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Map, Value};
use uuid::Uuid;

use super::domains::task_domain;
use super::error::ApiError;
use super::expr::{self, Scope};
use super::model::{Task, TaskDef, TaskStatus, Workflow, WorkflowDef, WorkflowStatus};
use super::payloads;
use super::queue::queue_name;
use super::store::State;
use super::sweeper::deadline;

/// What a new workflow starts from.
#[derive(Debug)]
pub(crate) struct StartParams {
    pub(crate) def: Arc<WorkflowDef>,
    pub(crate) input: Map<String, Value>,
    pub(crate) correlation_id: Option<String>,
    pub(crate) priority: i32,
    pub(crate) task_to_domain: HashMap<String, String>,
}

/// Resolves expressions against a workflow and its latest task attempts.
struct WorkflowScope<'a> {
    state: &'a State,
    workflow: &'a Workflow,
}

impl Scope for WorkflowScope<'_> {
    fn root(&self, first: &str, second: &str) -> Option<Value> {
        if first == "workflow" {
            return match second {
                "input" => Some(Value::Object(self.workflow.input.clone())),
                "output" => Some(Value::Object(self.workflow.output.clone())),
                "workflowId" => Some(Value::String(self.workflow.workflow_id.clone())),
                "correlationId" => self.workflow.correlation_id.clone().map(Value::String),
                _ => None,
            };
        }
        let task = self
            .workflow
            .task_ids
            .iter()
            .rev()
            .filter_map(|id| self.state.tasks.get(id))
            .find(|t| t.reference_task_name == first)?;
        match second {
            "output" => Some(Value::Object(task.output_data.clone())),
            "input" => Some(Value::Object(task.input_data.clone())),
            _ => None,
        }
    }
}

impl State {
    /// Starts a workflow: snapshots TaskDefs into its definition (ad-hoc defaults for
    /// unregistered names, §4.1) and schedules the first task.
    pub(crate) fn start_workflow(&mut self, params: StartParams, now: i64) -> String {
        let mut def = (*params.def).clone();
        for task in &mut def.tasks {
            if task.task_definition.is_none() {
                let snapshot = self
                    .task_defs
                    .get(&task.name)
                    .cloned()
                    .unwrap_or_else(|| TaskDef::with_defaults(&task.name));
                task.task_definition = Some(snapshot);
            }
        }
        let workflow_id = Uuid::new_v4().to_string();
        let workflow = Workflow {
            workflow_id: workflow_id.clone(),
            def: Arc::new(def),
            status: WorkflowStatus::Running,
            create_time: now,
            update_time: now,
            end_time: 0,
            input: params.input,
            output: Map::new(),
            correlation_id: params.correlation_id,
            reason_for_incompletion: None,
            task_ids: Vec::new(),
            task_to_domain: params.task_to_domain,
            failed_reference_task_names: Vec::new(),
            failed_task_names: Vec::new(),
            priority: params.priority,
        };
        tracing::debug!(workflow_id = %workflow_id, name = %workflow.def.name, "workflow started");
        self.workflows.insert(workflow_id.clone(), workflow);
        self.advance(&workflow_id, 0, now);
        workflow_id
    }

    /// Schedules the task at `index` of the definition, or completes the workflow past the end.
    fn advance(&mut self, workflow_id: &str, index: usize, now: i64) {
        let Some(workflow) = self.workflows.get(workflow_id) else {
            return;
        };
        let Some(wf_task) = workflow.def.tasks.get(index).cloned() else {
            self.complete_workflow(workflow_id, now);
            return;
        };
        let task_def = Arc::new(
            wf_task
                .task_definition
                .clone()
                .unwrap_or_else(|| TaskDef::with_defaults(&wf_task.name)),
        );
        let scope = WorkflowScope {
            state: self,
            workflow,
        };
        let mut input = task_def.input_template.clone();
        input.extend(expr::resolve_map(&wf_task.input_parameters, &scope));
        let domain = task_domain(
            &wf_task.name,
            &workflow.task_to_domain,
            &self.poll_data,
            now,
        );
        let task = Task {
            task_type: wf_task.name.clone(),
            status: TaskStatus::Scheduled,
            input_data: input,
            reference_task_name: wf_task.task_reference_name.clone(),
            retry_count: 0,
            seq: 0,
            correlation_id: workflow.correlation_id.clone(),
            poll_count: 0,
            task_def_name: wf_task.name.clone(),
            scheduled_time: now,
            start_time: 0,
            end_time: 0,
            update_time: now,
            start_delay_in_seconds: wf_task.start_delay,
            retried_task_id: None,
            retried: false,
            executed: false,
            callback_from_worker: true,
            response_timeout_seconds: task_def.response_timeout_seconds,
            workflow_instance_id: workflow_id.to_owned(),
            workflow_type: workflow.def.name.clone(),
            task_id: Uuid::new_v4().to_string(),
            reason_for_incompletion: None,
            callback_after_seconds: i64::from(wf_task.start_delay),
            worker_id: None,
            output_data: Map::new(),
            domain,
            rate_limit_per_frequency: task_def.rate_limit_per_frequency,
            rate_limit_frequency_in_seconds: task_def.rate_limit_frequency_in_seconds,
            external_output_payload_storage_path: None,
            workflow_priority: workflow.priority,
            iteration: 0,
            sub_workflow_id: None,
            subworkflow_changed: false,
            first_start_time: 0,
            queue_wait_time: 0,
            loop_over_task: false,
            allowed_retries: wf_task.retry_count.unwrap_or(task_def.retry_count),
            task_definition: task_def,
            workflow_task: wf_task,
            def_index: index,
            alerted: false,
            external_input_payload_storage_path: None,
        };
        let mut task = task;
        let too_large = self.externalize_input(&mut task);
        let due = self.scale.after(now, task.callback_after_seconds);
        let task_id = task.task_id.clone();
        self.add_task(task, due);
        if too_large {
            self.on_task_terminal(&task_id, now);
        }
    }

    /// ExternalPayloadStorageUtils.verifyAndUpload(TASK_INPUT) as a task is created: an input
    /// above the threshold is stored and replaced by `{}` and its path; one above the hard
    /// limit fails the task for good (`inputData: {}`, the server's reason). True when failed.
    fn externalize_input(&mut self, task: &mut Task) -> bool {
        if task.input_data.is_empty() {
            return false;
        }
        let limits = self.payloads.thresholds;
        let size = payloads::json_size(&task.input_data);
        let max = limits.max_task_input_kb.saturating_mul(1024);
        if size > max {
            task.reason_for_incompletion = Some(payloads::task_too_large(
                size,
                &task.task_id,
                &task.workflow_instance_id,
                max,
            ));
            task.status = TaskStatus::FailedWithTerminalError;
            task.input_data = Map::new();
            tracing::info!(task_id = %task.task_id, size, max, "task input above the hard limit: task failed");
            return true;
        }
        if size > limits.task_input_kb.saturating_mul(1024) {
            let bytes = serde_json::to_vec(&task.input_data).unwrap_or_default();
            let path = self.payloads.store(bytes);
            tracing::debug!(task_id = %task.task_id, size, %path, "task input externalized");
            task.input_data = Map::new();
            task.external_input_payload_storage_path = Some(path);
        }
        false
    }

    /// Stores a new task instance, appends it to its workflow and queues it.
    pub(super) fn add_task(&mut self, mut task: Task, due_ms: i64) {
        let Some(workflow) = self.workflows.get_mut(&task.workflow_instance_id) else {
            return;
        };
        task.seq = i32::try_from(workflow.task_ids.len() + 1).unwrap_or(i32::MAX);
        workflow.task_ids.push(task.task_id.clone());
        let queue = queue_name(&task.task_type, task.domain.as_deref());
        self.queues.push(&queue, &task.task_id, due_ms);
        self.active.insert(task.task_id.clone());
        self.note_deadline(deadline(&task, self.scale));
        tracing::debug!(task_id = %task.task_id, queue = %queue, due_ms, retry = task.retry_count, "task scheduled");
        self.tasks.insert(task.task_id.clone(), task);
    }

    /// Called once a task reached a terminal status: continue, retry, or end the workflow.
    pub(crate) fn on_task_terminal(&mut self, task_id: &str, now: i64) {
        let Some(task) = self.tasks.get_mut(task_id) else {
            return;
        };
        self.active.remove(task_id);
        let queue = queue_name(&task.task_type, task.domain.as_deref());
        self.queues.remove(&queue, task_id);
        task.executed = true;
        let task = task.clone();
        let running = self
            .workflows
            .get(&task.workflow_instance_id)
            .is_some_and(|w| !w.status.is_terminal());
        if !running {
            return;
        }
        if task.status.is_successful() {
            self.advance(&task.workflow_instance_id, task.def_index + 1, now);
        } else if task.status.is_retriable() && task.retry_count < task.allowed_retries {
            self.retry(&task, now);
        } else if task.workflow_task.optional {
            if let Some(t) = self.tasks.get_mut(task_id) {
                t.status = TaskStatus::CompletedWithErrors;
            }
            self.advance(&task.workflow_instance_id, task.def_index + 1, now);
        } else {
            let status = match task.status {
                TaskStatus::Canceled => WorkflowStatus::Terminated,
                TaskStatus::TimedOut => WorkflowStatus::TimedOut,
                _ => WorkflowStatus::Failed,
            };
            let reason = format!(
                "Task {} failed with status: {} and reason: '{}'",
                task.task_id,
                status_name(status),
                task.reason_for_incompletion.as_deref().unwrap_or("null")
            );
            self.end_workflow(
                &task.workflow_instance_id,
                status,
                Some(reason),
                Some(&task),
                now,
            );
        }
    }

    fn complete_workflow(&mut self, workflow_id: &str, now: i64) {
        let Some(workflow) = self.workflows.get(workflow_id) else {
            return;
        };
        let output = if workflow.def.output_parameters.is_empty() {
            // Without outputParameters the workflow output is the last task's output.
            workflow
                .task_ids
                .last()
                .and_then(|id| self.tasks.get(id))
                .map(|t| t.output_data.clone())
                .unwrap_or_default()
        } else {
            let scope = WorkflowScope {
                state: self,
                workflow,
            };
            expr::resolve_map(&workflow.def.output_parameters, &scope)
        };
        if let Some(workflow) = self.workflows.get_mut(workflow_id) {
            workflow.output = output;
        }
        self.end_workflow(workflow_id, WorkflowStatus::Completed, None, None, now);
    }

    /// Ends a workflow; any task still pending is canceled.
    pub(crate) fn end_workflow(
        &mut self,
        workflow_id: &str,
        status: WorkflowStatus,
        reason: Option<String>,
        failed: Option<&Task>,
        now: i64,
    ) {
        let Some(workflow) = self.workflows.get_mut(workflow_id) else {
            return;
        };
        workflow.status = status;
        workflow.end_time = now;
        workflow.update_time = now;
        workflow.reason_for_incompletion = reason;
        if let Some(task) = failed {
            workflow
                .failed_reference_task_names
                .push(task.reference_task_name.clone());
            workflow.failed_task_names.push(task.task_def_name.clone());
        }
        let pending: Vec<String> = workflow
            .task_ids
            .iter()
            .filter(|id| self.active.contains(*id))
            .cloned()
            .collect();
        for id in pending {
            if let Some(task) = self.tasks.get_mut(&id) {
                task.status = TaskStatus::Canceled;
                task.end_time = now;
                let queue = queue_name(&task.task_type, task.domain.as_deref());
                self.queues.remove(&queue, &id);
            }
            self.active.remove(&id);
        }
        tracing::info!(workflow_id, status = status_name(status), "workflow ended");
    }
}

/// The upper-case wire name of a workflow status.
pub(crate) fn status_name(status: WorkflowStatus) -> &'static str {
    match status {
        WorkflowStatus::Running => "RUNNING",
        WorkflowStatus::Completed => "COMPLETED",
        WorkflowStatus::Failed => "FAILED",
        WorkflowStatus::TimedOut => "TIMED_OUT",
        WorkflowStatus::Terminated => "TERMINATED",
        WorkflowStatus::Paused => "PAUSED",
    }
}

impl State {
    /// Resolves the definition a start request names, or its inline definition.
    pub(crate) fn definition_for_start(
        &self,
        name: &str,
        version: Option<i32>,
        inline: Option<WorkflowDef>,
    ) -> Result<Arc<WorkflowDef>, ApiError> {
        match inline {
            Some(def) => {
                let errors = def.validation_errors();
                if errors.is_empty() {
                    Ok(Arc::new(def))
                } else {
                    Err(ApiError::validation(errors.into_iter().map(|m| {
                        ("startWorkflowRequest.workflowDef".to_owned(), m)
                    })))
                }
            }
            None => self.workflow_def(name, version),
        }
    }
}
