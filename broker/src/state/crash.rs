//! Poison detection: an executor death is counted against the workflow task it ran only
//! where the evidence points at the task, and a task that kills its executor
//! `PERAGO_POISON_AFTER` times fails for good (see `crate::poison`).

use super::{
    Effect, HistoryRead,
    machine::{Machine, Parked, Running},
};
use crate::poison::{self, Verdict, WorkflowTask};
use perago_core::result::{Reason, RuntimeResult};

impl Machine {
    /// Fails the assignment of an executor that died, counting the death against its
    /// workflow task only where the evidence points at the task (see [`poison::judge`]): every
    /// reason says whether it was counted, and the running total. A counted crash whose
    /// earlier count this broker cannot vouch for is parked until Conductor's record says it.
    pub(super) fn judge_crash(
        &mut self,
        run: Running,
        worker_id: String,
        crash: String,
        verdict: Verdict,
    ) {
        let limit = self.capacity.poison_after;
        let task = WorkflowTask::of(&run.attempt);
        let not_counted = match verdict {
            Verdict::Runtime(why) => Some(why),
            Verdict::SelfInflicted => None,
            Verdict::Outside => {
                let others = self.deaths.record(self.now.instant, Some(&task));
                (others > 0).then(|| {
                    format!(
                        "{others} other executor deaths in the last {} s (a burst, not this task's doing)",
                        poison::BURST_WINDOW.as_secs()
                    )
                })
            }
        };
        if limit == 0 {
            self.report(
                None,
                run,
                RuntimeResult::failed(worker_id, Reason::new(crash)),
                false,
            );
            return;
        }
        let prior = self.crashes.prior(&run.attempt);
        if let Some(why) = not_counted {
            if let Some(n) = prior {
                // The next attempt's count still starts from here.
                self.crashes.record(task.clone(), n, &run.attempt.task_id);
            }
            tracing::info!(
                "executor death not counted against workflow task {}: {why}",
                task.reference_task_name
            );
            let reason = format!("{crash}{}", poison::not_counted_suffix(&why, prior, limit));
            self.report(
                None,
                run,
                RuntimeResult::failed(worker_id, Reason::new(reason)),
                false,
            );
            return;
        }
        match prior {
            Some(prior) => self.count_crash(run, worker_id, &crash, prior),
            None => {
                let retried_task_id = run.attempt.retried_task_id.clone().unwrap_or_default();
                tracing::info!(retried_task_id = %retried_task_id, "reading the workflow task's earlier attempts from Conductor to count this crash");
                // The result waits: it is in flight (a drain waits for it) and reported.
                self.updates_in_flight += 1;
                self.reported.insert(&run.attempt.task_id);
                self.effects
                    .push(Effect::ReadCrashHistory(Box::new(HistoryRead {
                        execution_id: run.execution_id.clone(),
                        task_id: run.attempt.task_id.clone(),
                        retried_task_id,
                        workflow_instance_id: run.attempt.workflow_instance_id.clone(),
                        reference_task_name: run.attempt.reference_task_name.clone(),
                        task_def_name: run.attempt.task_def_name.clone(),
                    })));
                self.parked.insert(
                    run.execution_id.clone(),
                    Parked {
                        run,
                        worker_id,
                        crash,
                    },
                );
            }
        }
    }

    /// Conductor's record of a parked crash's workflow task was read: the crash is counted
    /// on top of it (on a failed read, on top of this broker's own count) and reported.
    pub(super) fn crash_history_read(&mut self, execution_id: &str, counted: Option<u32>) {
        let Some(parked) = self.parked.remove(execution_id) else {
            return;
        };
        self.updates_in_flight = self.updates_in_flight.saturating_sub(1);
        let prior = counted.unwrap_or_else(|| {
            let local = self.crashes.local(&WorkflowTask::of(&parked.run.attempt));
            tracing::warn!("cannot read the workflow task's earlier attempts from Conductor: counting this crash on this runtime's own count ({local} so far)");
            local
        });
        self.count_crash(parked.run, parked.worker_id, &parked.crash, prior);
    }

    /// Counts a crash on top of `prior` and reports it: FAILED with the running total, or,
    /// once the total reaches `poison_after`, FAILED_WITH_TERMINAL_ERROR (its key is
    /// forgotten, so a rerun of the workflow starts afresh).
    pub(super) fn count_crash(&mut self, run: Running, worker_id: String, crash: &str, prior: u32) {
        let limit = self.capacity.poison_after;
        let task = WorkflowTask::of(&run.attempt);
        let counted = prior.saturating_add(1);
        if counted < limit {
            self.crashes.record(task, counted, &run.attempt.task_id);
            let reason = format!("{crash}{}", poison::counted_suffix(counted, limit));
            self.report(
                None,
                run,
                RuntimeResult::failed(worker_id, Reason::new(reason)),
                false,
            );
            return;
        }
        self.crashes.forget(&task);
        let reason = format!(
            "{}attempts of workflow task {} in workflow {} killed their executor {counted} times ({}={limit}); last: {crash}",
            poison::POISON_PREFIX,
            task.reference_task_name,
            task.workflow_instance_id,
            perago_core::capacity::PERAGO_POISON_AFTER,
        );
        tracing::warn!("{reason}");
        self.counters.tasks_poisoned.inc();
        let result = RuntimeResult::failed_terminal(worker_id, Reason::new(reason));
        self.report(None, run, result, false);
    }
}
