//! The server's single source of truth: definitions, workflows, tasks, queues, poll data and
//! logs, all in memory behind one mutex owned by [`Conductor`].
//!
//! Every state transition is a synchronous method on [`State`] taking `now` explicitly, so the
//! lock is never held across an `.await` and the state machine can be tested without a clock.
//! This file holds the store itself, the metadata operations and the read-only queries; the
//! workflow decider lives in `engine.rs`, poll and update in `worker_ops.rs`, timeouts in
//! `sweeper.rs`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use super::clock::TimeScale;
use super::error::ApiError;
use super::model::{PollData, Task, TaskDef, TaskExecLog, Workflow, WorkflowDef};
use super::payloads::Payloads;
use super::queue::Queues;

/// Everything the server knows.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) scale: TimeScale,
    pub(crate) task_defs: BTreeMap<String, TaskDef>,
    pub(crate) workflow_defs: BTreeMap<String, BTreeMap<i32, Arc<WorkflowDef>>>,
    pub(crate) workflows: HashMap<String, Workflow>,
    pub(crate) tasks: HashMap<String, Task>,
    /// Ids of non-terminal tasks: the only ones the sweeper has to look at.
    pub(crate) active: HashSet<String>,
    pub(crate) queues: Queues,
    pub(crate) poll_data: BTreeMap<String, PollData>,
    pub(crate) logs: HashMap<String, Vec<TaskExecLog>>,
    /// When the sweeper next has something to do (epoch ms; `i64::MAX` for never).
    pub(crate) next_sweep: i64,
    /// Set when a transition created a deadline earlier than `next_sweep`.
    pub(crate) wake_sweeper: bool,
    /// How late (real ms, already scaled) every timeout fires after its deadline: the real
    /// server's sweep lag (see `sweeper.rs`); 0 by default.
    pub(crate) sweep_lag_ms: i64,
    /// External payload storage and the payload thresholds.
    pub(crate) payloads: Arc<Payloads>,
}

impl State {
    pub(crate) fn new(scale: TimeScale, payloads: Arc<Payloads>) -> Self {
        Self {
            payloads,
            scale,
            task_defs: BTreeMap::new(),
            workflow_defs: BTreeMap::new(),
            workflows: HashMap::new(),
            tasks: HashMap::new(),
            active: HashSet::new(),
            queues: Queues::default(),
            poll_data: BTreeMap::new(),
            logs: HashMap::new(),
            next_sweep: i64::MAX,
            wake_sweeper: false,
            sweep_lag_ms: 0,
        }
    }

    /// `POST /api/metadata/taskdefs`: create or replace each definition.
    pub(crate) fn create_task_defs(
        &mut self,
        defs: Vec<TaskDef>,
        now: i64,
    ) -> Result<(), ApiError> {
        if defs.is_empty() {
            return Err(ApiError::validation([(
                "registerTaskDef.taskDefinitions".to_owned(),
                "TaskDefList cannot be empty or null".to_owned(),
            )]));
        }
        let errors: Vec<_> = defs
            .iter()
            .enumerate()
            .flat_map(|(i, def)| {
                def.validation_errors()
                    .into_iter()
                    .map(move |message| (format!("registerTaskDef.taskDefinitions[{i}]"), message))
            })
            .collect();
        if !errors.is_empty() {
            return Err(ApiError::validation(errors));
        }
        for mut def in defs {
            def.create_time = Some(now);
            def.update_time = None;
            self.task_defs.insert(def.name.clone(), def);
        }
        Ok(())
    }

    /// `PUT /api/metadata/taskdefs`: replace an existing definition.
    pub(crate) fn update_task_def(&mut self, mut def: TaskDef, now: i64) -> Result<(), ApiError> {
        let errors = def.validation_errors();
        if !errors.is_empty() {
            return Err(ApiError::validation(
                errors
                    .into_iter()
                    .map(|m| ("updateTaskDef.taskDefinition".to_owned(), m)),
            ));
        }
        let Some(existing) = self.task_defs.get(&def.name) else {
            return Err(ApiError::NotFound(format!(
                "No such task by name {}",
                def.name
            )));
        };
        def.create_time = existing.create_time;
        def.update_time = Some(now);
        self.task_defs.insert(def.name.clone(), def);
        Ok(())
    }

    pub(crate) fn task_def(&self, name: &str) -> Result<&TaskDef, ApiError> {
        self.task_defs
            .get(name)
            .ok_or_else(|| ApiError::NotFound(format!("No such taskType found by name: {name}")))
    }

    /// `POST /api/metadata/workflow` (409 on an existing version unless `overwrite`) and each
    /// element of `PUT /api/metadata/workflow` (always overwrites).
    pub(crate) fn register_workflow_def(
        &mut self,
        mut def: WorkflowDef,
        overwrite: bool,
        now: i64,
    ) -> Result<(), ApiError> {
        let errors = def.validation_errors();
        if !errors.is_empty() {
            return Err(ApiError::validation(
                errors.into_iter().map(|m| ("workflowDef".to_owned(), m)),
            ));
        }
        let versions = self.workflow_defs.entry(def.name.clone()).or_default();
        if let Some(existing) = versions.get(&def.version) {
            if !overwrite {
                return Err(ApiError::Conflict(format!(
                    "Workflow with {}.{} already exists!",
                    def.name, def.version
                )));
            }
            def.create_time = existing.create_time;
            def.update_time = Some(now);
        } else {
            def.create_time = Some(now);
        }
        versions.insert(def.version, Arc::new(def));
        Ok(())
    }

    /// A workflow definition by name and version (latest when `None`).
    pub(crate) fn workflow_def(
        &self,
        name: &str,
        version: Option<i32>,
    ) -> Result<Arc<WorkflowDef>, ApiError> {
        let versions = self.workflow_defs.get(name);
        let found = match version {
            Some(v) => versions.and_then(|vs| vs.get(&v)),
            None => versions.and_then(|vs| vs.values().next_back()),
        };
        found.cloned().ok_or_else(|| {
            let version = version.map_or_else(|| "null".to_owned(), |v| v.to_string());
            ApiError::NotFound(format!(
                "No such workflow found by name: {name}, version: {version}"
            ))
        })
    }

    pub(crate) fn workflow(&self, id: &str) -> Result<&Workflow, ApiError> {
        self.workflows
            .get(id)
            .ok_or_else(|| ApiError::NotFound(format!("No such workflow found by id: {id}")))
    }

    /// The tasks of a workflow, in scheduling order.
    pub(crate) fn workflow_tasks<'a>(&'a self, workflow: &'a Workflow) -> Vec<&'a Task> {
        workflow
            .task_ids
            .iter()
            .filter_map(|id| self.tasks.get(id))
            .collect()
    }

    /// Lowers `next_sweep` to `deadline` and asks for a sweeper wake-up when needed.
    pub(crate) fn note_deadline(&mut self, deadline: Option<i64>) {
        if let Some(deadline) = deadline
            && deadline < self.next_sweep
        {
            self.next_sweep = deadline;
            self.wake_sweeper = true;
        }
    }
}

/// The shared handle on the state: the mutex, plus the sweeper's wake-up signal.
#[derive(Debug)]
pub(crate) struct Conductor {
    state: Mutex<State>,
    pub(crate) sweeper_wake: Notify,
    /// Polls waiting for a task right now (see [`Conductor::polls_waiting`]).
    polls_waiting: AtomicUsize,
    /// When a batch poll answers (`--queue-semantics`).
    pub(crate) queue_semantics: super::fill::QueueSemantics,
}

/// Counts one waiting poll while alive.
#[derive(Debug)]
pub(crate) struct WaitingPoll<'a>(&'a AtomicUsize);

impl Drop for WaitingPoll<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Conductor {
    pub(crate) fn new(scale: TimeScale, payloads: Arc<Payloads>) -> Self {
        Self {
            state: Mutex::new(State::new(scale, payloads)),
            sweeper_wake: Notify::new(),
            polls_waiting: AtomicUsize::new(0),
            queue_semantics: super::fill::QueueSemantics::default(),
        }
    }

    /// Polls that found no task and are waiting for one (long polls in flight).
    pub(crate) fn polls_waiting(&self) -> usize {
        self.polls_waiting.load(Ordering::SeqCst)
    }

    /// Marks a poll as waiting until the guard is dropped.
    pub(crate) fn poll_waits(&self) -> WaitingPoll<'_> {
        self.polls_waiting.fetch_add(1, Ordering::SeqCst);
        WaitingPoll(&self.polls_waiting)
    }

    /// Runs `f` under the lock, then wakes the sweeper if `f` created an earlier deadline.
    /// The lock is a std mutex: `f` is synchronous, so it can never be held across an await.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let mut state = self.lock();
        let result = f(&mut state);
        let wake = std::mem::take(&mut state.wake_sweeper);
        drop(state);
        if wake {
            self.sweeper_wake.notify_one();
        }
        result
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves the state as consistent as the step that
        // panicked; for a dev server, serving on beats failing every later request.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}
