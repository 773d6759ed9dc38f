//! The worker-facing transitions: handing tasks out on poll (§4.2) and applying a worker's
//! `TaskResult` (§4.3, §4.4). Long-poll waiting happens in the route, outside the lock.

use super::error::ApiError;
use super::model::{PollData, Task, TaskExecLog, TaskResult, TaskStatus};
use super::queue::queue_name;
use super::store::State;
use super::sweeper::deadline;

/// At most this many log entries of one `TaskResult` are kept (`taskExecLogSizeLimit`).
const LOGS_PER_UPDATE: usize = 10;
/// `reasonForIncompletion` is cut to this many characters.
const REASON_LIMIT: usize = 500;
/// How long a message is postponed when the concurrency limit is hit
/// (`taskExecutionPostponeDuration`), in Conductor seconds.
const POSTPONE_SECS: i64 = 60;

/// What an update did, for the route to answer.
#[derive(Debug)]
pub(crate) struct UpdateOutcome {
    /// The task id, echoed as v1's text/plain answer.
    pub(crate) task_id: String,
    /// For update-v2: the queue to poll for the next task, set only when the update left the
    /// task terminal (v3.32 semantics).
    pub(crate) poll_next: Option<PollTarget>,
}

/// Where update-v2 polls for the next task.
#[derive(Debug, Clone)]
pub(crate) struct PollTarget {
    pub(crate) task_type: String,
    pub(crate) domain: Option<String>,
    pub(crate) worker_id: Option<String>,
}

impl State {
    /// Hands out up to `count` due tasks of `task_type` in `domain`.
    pub(crate) fn poll(
        &mut self,
        task_type: &str,
        domain: Option<&str>,
        worker_id: Option<&str>,
        count: usize,
        now: i64,
    ) -> Vec<Task> {
        let queue = queue_name(task_type, domain);
        let mut handed = Vec::new();
        while handed.len() < count {
            let ids = self.queues.pop_ready(&queue, now, count - handed.len());
            if ids.is_empty() {
                break;
            }
            for id in ids {
                if let Some(task) = self.hand_out(&queue, &id, worker_id, now) {
                    handed.push(task);
                }
            }
        }
        self.poll_data.insert(
            queue.clone(),
            PollData {
                queue_name: queue,
                domain: domain.filter(|d| !d.is_empty()).map(str::to_owned),
                worker_id: worker_id.map(str::to_owned),
                last_poll_time: now,
            },
        );
        handed
    }

    /// Hands out tasks a fill-or-timeout poll popped earlier (`fill.rs`): each is checked again
    /// now (it may have ended meanwhile), and the queue's poll data is updated as by [`poll`].
    ///
    /// [`poll`]: State::poll
    pub(crate) fn hand_out_popped(
        &mut self,
        task_type: &str,
        domain: Option<&str>,
        worker_id: Option<&str>,
        ids: Vec<String>,
        now: i64,
    ) -> Vec<Task> {
        let queue = queue_name(task_type, domain);
        let handed = ids
            .iter()
            .filter_map(|id| self.hand_out(&queue, id, worker_id, now))
            .collect();
        self.poll_data.insert(
            queue.clone(),
            PollData {
                queue_name: queue,
                domain: domain.filter(|d| !d.is_empty()).map(str::to_owned),
                worker_id: worker_id.map(str::to_owned),
                last_poll_time: now,
            },
        );
        handed
    }

    fn hand_out(
        &mut self,
        queue: &str,
        id: &str,
        worker_id: Option<&str>,
        now: i64,
    ) -> Option<Task> {
        let task = self.tasks.get(id)?;
        if task.status.is_terminal() {
            return None;
        }
        if let Some(limit) = task.task_definition.concurrent_exec_limit
            && limit > 0
        {
            let running = self
                .active
                .iter()
                .filter_map(|a| self.tasks.get(a))
                .filter(|t| {
                    t.status == TaskStatus::InProgress && t.task_def_name == task.task_def_name
                })
                .count();
            if running >= usize::try_from(limit).unwrap_or(usize::MAX) {
                let due = self.scale.after(now, POSTPONE_SECS);
                self.queues.push(queue, id, due);
                return None;
            }
        }
        let task = self.tasks.get_mut(id)?;
        task.status = TaskStatus::InProgress;
        if task.start_time == 0 {
            task.start_time = now;
            task.queue_wait_time = now - task.scheduled_time;
        }
        if task.first_start_time == 0 {
            task.first_start_time = now;
        }
        task.callback_after_seconds = 0;
        task.worker_id = worker_id.map(str::to_owned);
        task.poll_count += 1;
        task.update_time = now;
        let task = task.clone();
        self.note_deadline(deadline(&task, self.scale));
        Some(task)
    }

    /// Applies a `TaskResult` (`POST /api/tasks`, `update-v2`), in the server's order of checks.
    pub(crate) fn update_task(
        &mut self,
        result: TaskResult,
        now: i64,
    ) -> Result<UpdateOutcome, ApiError> {
        let workflow_id = result.workflow_instance_id.clone().unwrap_or_default();
        let task_id = result.task_id.clone().unwrap_or_default();
        let mut invalid = Vec::new();
        if workflow_id.is_empty() {
            invalid.push((
                "updateTask.taskResult.workflowInstanceId".to_owned(),
                "Workflow Id cannot be null or empty".to_owned(),
            ));
        }
        if task_id.is_empty() {
            invalid.push((
                "updateTask.taskResult.taskId".to_owned(),
                "Task ID cannot be null or empty".to_owned(),
            ));
        }
        if !invalid.is_empty() {
            return Err(ApiError::validation(invalid));
        }
        let unchanged = UpdateOutcome {
            task_id: task_id.clone(),
            poll_next: None,
        };
        if result.extend_lease {
            let task = self
                .tasks
                .get_mut(&task_id)
                .ok_or_else(|| no_task(&task_id))?;
            if !task.status.is_terminal() {
                task.update_time = now;
                let d = deadline(task, self.scale);
                self.note_deadline(d);
            }
            return Ok(unchanged);
        }
        let workflow_terminal = self.workflow(&workflow_id)?.status.is_terminal();
        let task = self.tasks.get(&task_id).ok_or_else(|| no_task(&task_id))?;
        let queue = queue_name(&task.task_type, task.domain.as_deref());
        let target = PollTarget {
            task_type: task.task_type.clone(),
            domain: task.domain.clone(),
            worker_id: result.worker_id.clone(),
        };
        if task.status.is_terminal() {
            // A late result (after a timeout, a retry or a previous update) is ignored; the
            // stored task is terminal, so update-v2 still polls for the next one.
            tracing::debug!(task_id, status = ?task.status, "update to a terminal task ignored");
            self.queues.remove(&queue, &task_id);
            return Ok(UpdateOutcome {
                task_id,
                poll_next: Some(target),
            });
        }
        if workflow_terminal {
            self.queues.remove(&queue, &task_id);
            return Ok(unchanged);
        }
        let status = result
            .status
            .ok_or_else(|| ApiError::Internal("TaskResult status cannot be null".to_owned()))?;
        let task = self
            .tasks
            .get_mut(&task_id)
            .expect("the task was looked up above under the same lock");
        // A worker task reported IN_PROGRESS goes back to its queue (§4.3 step 6).
        task.status = match TaskStatus::from(status) {
            TaskStatus::InProgress => TaskStatus::Scheduled,
            other => other,
        };
        task.reason_for_incompletion = result.reason_for_incompletion.map(truncate_reason);
        task.worker_id = result.worker_id;
        task.callback_after_seconds = result.callback_after_seconds;
        task.output_data = result.output_data.unwrap_or_default();
        task.sub_workflow_id = result.sub_workflow_id;
        if let Some(path) = result
            .external_output_payload_storage_path
            .filter(|p| !p.trim().is_empty())
        {
            task.external_output_payload_storage_path = Some(path);
        }
        // verifyAndUpload(TASK_OUTPUT) as the task is stored: above the hard limit the task is
        // forced to FAILED_WITH_TERMINAL_ERROR, whatever the worker said (v1 still answers 200).
        // Below it the server may store the output externally, which workers never see.
        let size = super::payloads::json_size(&task.output_data);
        let max = self
            .payloads
            .thresholds
            .max_task_output_kb
            .saturating_mul(1024);
        if size > max {
            task.reason_for_incompletion = Some(super::payloads::task_too_large(
                size,
                &task_id,
                &workflow_id,
                max,
            ));
            task.status = TaskStatus::FailedWithTerminalError;
            task.output_data = serde_json::Map::new();
        }
        task.update_time = now;
        let terminal = task.status.is_terminal();
        if terminal {
            task.end_time = now;
        } else {
            let due = self.scale.after(now, task.callback_after_seconds);
            self.queues.push(&queue, &task_id, due);
        }
        let d = deadline(&self.tasks[&task_id], self.scale);
        self.note_deadline(d);
        if let Some(logs) = result.logs {
            let stored = self.logs.entry(task_id.clone()).or_default();
            for mut log in logs.into_iter().take(LOGS_PER_UPDATE) {
                log.task_id = Some(task_id.clone());
                stored.push(log);
            }
        }
        tracing::debug!(task_id, ?status, terminal, "task updated");
        if terminal {
            self.on_task_terminal(&task_id, now);
        }
        Ok(UpdateOutcome {
            task_id,
            poll_next: terminal.then_some(target),
        })
    }

    /// `POST /api/tasks/{taskId}/log`: the raw body becomes one log entry.
    pub(crate) fn add_log(&mut self, task_id: &str, log: String, now: i64) {
        self.logs
            .entry(task_id.to_owned())
            .or_default()
            .push(TaskExecLog {
                log: Some(log),
                task_id: Some(task_id.to_owned()),
                created_time: now,
            });
    }
}

fn no_task(task_id: &str) -> ApiError {
    ApiError::NotFound(format!("No such task found by id: {task_id}"))
}

fn truncate_reason(reason: String) -> String {
    match reason.char_indices().nth(REASON_LIMIT) {
        Some((cut, _)) => reason[..cut].to_owned(),
        None => reason,
    }
}
