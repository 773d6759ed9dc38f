//! Retries (§4.6): the delay before the next attempt, and the new task instance that attempt is.

use serde_json::Map;
use uuid::Uuid;

use super::model::{RetryLogic, Task, TaskDef, TaskStatus};
use super::store::State;

impl State {
    /// Schedules a new attempt of `failed` after the TaskDef's retry delay (§4.6).
    pub(super) fn retry(&mut self, failed: &Task, now: i64) {
        let def = &failed.task_definition;
        let delay_secs = retry_delay_secs(def, failed.retry_count);
        let jitter_ms = match def.backoff_jitter_ms {
            j if j > 0 => i64::from(Uuid::new_v4().as_u128() as u32 % (j as u32 + 1)),
            _ => 0,
        };
        if let Some(old) = self.tasks.get_mut(&failed.task_id) {
            old.retried = true;
        }
        let mut task = failed.clone();
        task.task_id = Uuid::new_v4().to_string();
        task.retried_task_id = Some(failed.task_id.clone());
        task.retry_count = failed.retry_count + 1;
        task.status = TaskStatus::Scheduled;
        task.poll_count = 0;
        task.scheduled_time = now;
        task.start_time = 0;
        task.end_time = 0;
        task.update_time = now;
        task.worker_id = None;
        task.output_data = Map::new();
        task.start_delay_in_seconds = delay_secs;
        task.callback_after_seconds = i64::from(delay_secs);
        task.retried = false;
        task.executed = false;
        task.alerted = false;
        task.queue_wait_time = 0;
        // The retry is scheduled as any new task: its domain is chosen again
        // (`setTaskDomains` runs on every task the decider schedules).
        if let Some(workflow) = self.workflows.get(&failed.workflow_instance_id) {
            task.domain = super::domains::task_domain(
                &task.task_type,
                &workflow.task_to_domain,
                &self.poll_data,
                now,
            );
        }
        tracing::info!(
            failed_task_id = %failed.task_id, task_id = %task.task_id,
            retry_count = task.retry_count, delay_secs, "task retry scheduled"
        );
        let due = self
            .scale
            .after(now, i64::from(delay_secs))
            .saturating_add(self.scale.ms(jitter_ms));
        self.add_task(task, due);
    }
}

/// Retry delay in seconds before attempt `retry_count + 1` (§4.6), capped as the server does.
pub(crate) fn retry_delay_secs(def: &TaskDef, retry_count: i32) -> i32 {
    let d = i64::from(def.retry_delay_seconds.max(0));
    let r = i64::from(retry_count.max(0));
    let delay = match def.retry_logic {
        RetryLogic::Fixed => d,
        RetryLogic::LinearBackoff => d
            .saturating_mul(i64::from(def.backoff_scale_factor.max(1)))
            .saturating_mul(r + 1),
        RetryLogic::ExponentialBackoff => {
            d.saturating_mul(1_i64.checked_shl(r.min(62) as u32).unwrap_or(i64::MAX))
        }
    };
    let mut delay = i32::try_from(delay).unwrap_or(i32::MAX);
    if def.max_retry_delay_seconds > 0 {
        delay = delay.min(def.max_retry_delay_seconds);
    }
    delay
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conductor::model::RetryLogic;

    fn def(logic: RetryLogic, delay: i32) -> TaskDef {
        let mut def = TaskDef::with_defaults("t");
        def.retry_logic = logic;
        def.retry_delay_seconds = delay;
        def
    }

    #[test]
    fn retry_delays_follow_the_retry_logic() {
        assert_eq!(retry_delay_secs(&def(RetryLogic::Fixed, 5), 3), 5);
        let mut linear = def(RetryLogic::LinearBackoff, 5);
        linear.backoff_scale_factor = 2;
        assert_eq!(retry_delay_secs(&linear, 0), 10);
        assert_eq!(retry_delay_secs(&linear, 2), 30);
        assert_eq!(
            retry_delay_secs(&def(RetryLogic::ExponentialBackoff, 5), 3),
            40
        );
    }

    #[test]
    fn retry_delays_saturate_and_respect_the_cap() {
        let exp = def(RetryLogic::ExponentialBackoff, 60);
        assert_eq!(retry_delay_secs(&exp, 40), i32::MAX);
        let mut capped = exp;
        capped.max_retry_delay_seconds = 100;
        assert_eq!(retry_delay_secs(&capped, 5), 100);
    }
}
