//! Timeouts (§4.5): the per-task deadline, the sweep that applies expired ones, and the named
//! background task that runs sweeps.
//!
//! The real server notices a timeout only when it next decides the workflow (trap 9): its
//! sweeper pops the workflow id from the decider queue, where a poll left it postponed to
//! poll + `responseTimeoutSeconds` (`ExecutionService.adjustDeciderQueuePostpone`), and each
//! decide that finds nothing expired postpones it again; on Postgres a popped decider message
//! comes back only 60 s after its `deliver_on` (`PostgresQueueDAO.processAllUnacks`), so a
//! timeout can fire about a minute late, and older releases later still. This sweeper instead
//! sleeps until the earliest deadline of any pending task and is woken whenever a transition
//! creates an earlier one, so by default a timeout fires within milliseconds of its deadline,
//! which keeps time-scaled tests short and exact. A sweep lag (`--sweep-lag`,
//! `ConductorServerBuilder::sweep_lag`) makes every timeout fire that much after its deadline,
//! judged then against the task as it is: an `extendLease` or an update accepted meanwhile
//! moves the deadline as on the real server, where the update lands before the late sweep.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::clock::{TimeScale, ms_duration, now_ms};
use super::model::{Task, TaskStatus, TimeoutPolicy, WorkflowStatus};
use super::queue::queue_name;
use super::store::{Conductor, State};

/// How long the sweeper sleeps when no task has a deadline; a wake-up arrives before that
/// whenever a deadline appears.
const IDLE_SLEEP: Duration = Duration::from_secs(3600);

/// Which check fired for a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expired {
    Response,
    Task,
    Poll,
}

/// The earliest real time (epoch ms) at which a timeout check of `task` fires, if any.
pub(crate) fn deadline(task: &Task, scale: TimeScale) -> Option<i64> {
    [Expired::Response, Expired::Task, Expired::Poll]
        .into_iter()
        .filter_map(|check| check_deadline(task, check, scale))
        .min()
}

fn check_deadline(task: &Task, check: Expired, scale: TimeScale) -> Option<i64> {
    if task.status.is_terminal() {
        return None;
    }
    let def = &task.task_definition;
    let start_delay = i64::from(task.start_delay_in_seconds);
    match check {
        Expired::Response => (task.status == TaskStatus::InProgress
            && task.response_timeout_seconds > 0)
            .then(|| {
                let wait = task
                    .response_timeout_seconds
                    .saturating_add(task.callback_after_seconds);
                scale.after(task.update_time, wait)
            }),
        Expired::Task => {
            (def.timeout_seconds > 0 && task.start_time > 0 && !task.alerted).then(|| {
                scale.after(
                    task.start_time,
                    start_delay.saturating_add(def.timeout_seconds),
                )
            })
        }
        Expired::Poll => {
            let poll_timeout = i64::from(def.poll_timeout_seconds.unwrap_or(0));
            (task.status == TaskStatus::Scheduled && poll_timeout > 0 && !task.alerted).then(|| {
                let wait = start_delay
                    .saturating_add(poll_timeout)
                    .saturating_add(task.callback_after_seconds);
                scale.after(task.scheduled_time, wait)
            })
        }
    }
}

impl State {
    /// Applies every expired timeout and returns when the next one is due (`i64::MAX`: none).
    pub(crate) fn sweep(&mut self, now: i64) -> i64 {
        let expired: Vec<(String, Expired)> = self
            .active
            .iter()
            .filter_map(|id| {
                let task = self.tasks.get(id)?;
                // The decider's order: task timeout, poll timeout, then response timeout, so a
                // task timeout with TIME_OUT_WF wins over a simultaneous response timeout.
                [Expired::Task, Expired::Poll, Expired::Response]
                    .into_iter()
                    .find(|c| {
                        check_deadline(task, *c, self.scale)
                            .is_some_and(|d| d.saturating_add(self.sweep_lag_ms) <= now)
                    })
                    .map(|c| (id.clone(), c))
            })
            .collect();
        for (id, check) in expired {
            self.expire(&id, check, now);
        }
        self.next_sweep = self
            .active
            .iter()
            .filter_map(|id| self.tasks.get(id))
            .filter_map(|t| deadline(t, self.scale))
            .min()
            .map_or(i64::MAX, |d| d.saturating_add(self.sweep_lag_ms));
        self.next_sweep
    }

    fn expire(&mut self, task_id: &str, check: Expired, now: i64) {
        let Some(task) = self.tasks.get_mut(task_id) else {
            return;
        };
        let def = Arc::clone(&task.task_definition);
        let (reason, policy) = match check {
            // The response timeout ignores timeoutPolicy: it always times out and retries.
            Expired::Response => (
                format!(
                    "responseTimeout: {} exceeded for the taskId: {} with Task Definition: {}",
                    task.response_timeout_seconds, task.task_id, task.task_def_name
                ),
                TimeoutPolicy::Retry,
            ),
            Expired::Task => (
                format!(
                    "Task timed out after {} seconds. Timeout configured as {} seconds. \
                     Timeout policy configured to {:?}",
                    (now - task.start_time) / 1000,
                    def.timeout_seconds,
                    def.timeout_policy
                ),
                def.timeout_policy,
            ),
            Expired::Poll => (
                format!(
                    "Task poll timed out after {} seconds. Poll timeout configured as {} seconds. \
                     Timeout policy configured to {:?}",
                    (now - task.scheduled_time) / 1000,
                    def.poll_timeout_seconds.unwrap_or(0),
                    def.timeout_policy
                ),
                def.timeout_policy,
            ),
        };
        tracing::info!(task_id, ?check, ?policy, "task timeout fired");
        if policy == TimeoutPolicy::AlertOnly {
            task.alerted = true;
            return;
        }
        task.status = TaskStatus::TimedOut;
        task.reason_for_incompletion = Some(reason.clone());
        task.end_time = now;
        task.update_time = now;
        if policy == TimeoutPolicy::Retry {
            self.on_task_terminal(task_id, now);
            return;
        }
        // TIME_OUT_WF: the workflow times out at once, without retrying the task.
        task.executed = true;
        let task = task.clone();
        self.active.remove(task_id);
        self.queues.remove(
            &queue_name(&task.task_type, task.domain.as_deref()),
            task_id,
        );
        self.end_workflow(
            &task.workflow_instance_id,
            WorkflowStatus::TimedOut,
            Some(reason),
            Some(&task),
            now,
        );
    }
}

/// The sweeper loop: sweep, then sleep until the next deadline, an earlier deadline's wake-up,
/// or shutdown.
pub(crate) async fn run(conductor: Arc<Conductor>, mut shutdown: watch::Receiver<bool>) {
    loop {
        let next = conductor.with(|state| state.sweep(now_ms()));
        let sleep = if next == i64::MAX {
            IDLE_SLEEP
        } else {
            ms_duration(next.saturating_sub(now_ms()))
        };
        tokio::select! {
            () = conductor.sweeper_wake.notified() => {}
            () = tokio::time::sleep(sleep) => {}
            _ = shutdown.changed() => {
                tracing::debug!("sweeper stopped");
                return;
            }
        }
    }
}
