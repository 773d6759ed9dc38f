//! Poison-task detection (`PERAGO_POISON_AFTER`): how many times the attempts of one workflow
//! task have killed their executor. The ledger is bounded, so a broker that runs for months
//! keeps a flat memory: past [`MAX_TRACKED`] workflow tasks the oldest is forgotten.

use perago_core::attempt::AttemptSnapshot;
use std::collections::{HashMap, VecDeque};

/// Workflow tasks whose crashes are remembered at most.
pub(crate) const MAX_TRACKED: usize = 10_000;

/// One workflow task across its retries: the workflow, the task's reference name and its
/// DO_WHILE iteration. Retries keep all three; Conductor gives each loop iteration its own
/// reference name (`ref__2`), and the iteration keeps them apart on a server that does not.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct WorkflowTask {
    pub(crate) workflow_instance_id: String,
    pub(crate) reference_task_name: String,
    pub(crate) iteration: u32,
}

impl WorkflowTask {
    pub(crate) fn of(attempt: &AttemptSnapshot) -> Self {
        Self {
            workflow_instance_id: attempt.workflow_instance_id.clone(),
            reference_task_name: attempt.reference_task_name.clone(),
            iteration: attempt.iteration,
        }
    }
}

/// Executor crashes per workflow task, oldest first forgotten.
#[derive(Debug)]
pub(crate) struct CrashLedger {
    counts: HashMap<WorkflowTask, u32>,
    /// Keys in the order they were first counted.
    order: VecDeque<WorkflowTask>,
    capacity: usize,
}

impl Default for CrashLedger {
    fn default() -> Self {
        Self::with_capacity(MAX_TRACKED)
    }
}

impl CrashLedger {
    /// A ledger that remembers at most `capacity` workflow tasks.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self {
            counts: HashMap::new(),
            order: VecDeque::new(),
            capacity: capacity.max(1),
        }
    }

    /// Counts one more crash of `task`; returns its count so far.
    pub(crate) fn record(&mut self, task: WorkflowTask) -> u32 {
        if let Some(count) = self.counts.get_mut(&task) {
            *count += 1;
            return *count;
        }
        while self.order.len() >= self.capacity {
            if let Some(oldest) = self.order.pop_front() {
                self.counts.remove(&oldest);
            }
        }
        self.order.push_back(task.clone());
        self.counts.insert(task, 1);
        1
    }

    /// Forgets `task` (it has been failed for good: a rerun of the workflow starts afresh).
    pub(crate) fn forget(&mut self, task: &WorkflowTask) {
        if self.counts.remove(task).is_some() {
            self.order.retain(|t| t != task);
        }
    }

    /// Workflow tasks remembered now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.counts.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(workflow: &str, reference: &str, iteration: u32) -> WorkflowTask {
        WorkflowTask {
            workflow_instance_id: workflow.into(),
            reference_task_name: reference.into(),
            iteration,
        }
    }

    #[test]
    fn counts_per_workflow_task() {
        let mut ledger = CrashLedger::default();
        assert_eq!(ledger.record(key("w1", "a", 0)), 1);
        assert_eq!(ledger.record(key("w1", "a", 0)), 2);
        assert_eq!(ledger.record(key("w2", "a", 0)), 1);
        assert_eq!(ledger.record(key("w1", "b", 0)), 1);
        assert_eq!(ledger.record(key("w1", "a", 1)), 1);
        assert_eq!(ledger.record(key("w1", "a", 0)), 3);
        ledger.forget(&key("w1", "a", 0));
        assert_eq!(ledger.record(key("w1", "a", 0)), 1);
    }

    #[test]
    fn the_oldest_is_forgotten_past_the_bound() {
        let mut ledger = CrashLedger::with_capacity(3);
        for w in ["w1", "w2", "w3"] {
            ledger.record(key(w, "a", 0));
        }
        ledger.record(key("w1", "a", 0));
        ledger.record(key("w4", "a", 0));
        assert_eq!(ledger.len(), 3);
        // w1 was counted first, so it went, in spite of its second crash.
        assert_eq!(ledger.record(key("w2", "a", 0)), 2);
        assert_eq!(ledger.record(key("w1", "a", 0)), 1);
        assert_eq!(ledger.len(), 3);
        assert_eq!(ledger.order.len(), 3);
    }
}
