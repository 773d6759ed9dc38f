//! A task as a poll (or update-v2) returned it, checked as it is decoded.

use crate::attempt::{Fields, PolledTask, TaskRef};
use serde_json::Value;
use std::fmt;

/// A task as a poll (or update-v2) returned it.
#[derive(Debug, Clone, PartialEq)]
pub enum Polled {
    /// The task, checked; its input kept as text.
    Task(PolledTask),
    /// A task whose JSON cannot be taken (nested deeper than Conductor allows, or broken):
    /// its ids, when they can be read, so it can be failed, and what is wrong.
    Undecodable {
        /// `taskId` and `workflowInstanceId`, if readable.
        ids: Option<TaskRef>,
        /// What the task says its type is, as far as it can be read.
        types: TaskTypes,
        /// What is wrong.
        problem: String,
    },
}

/// What a polled task says its type is: its `taskDefName` and its `taskType`, each when it
/// is there and not empty (a value that is no string is kept as its JSON text, so it can
/// match no name). For a SIMPLE task Conductor makes both the task definition's name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TaskTypes {
    /// `taskDefName`.
    pub task_def_name: Option<String>,
    /// `taskType`.
    pub task_type: Option<String>,
}

impl TaskTypes {
    /// The types named by a task's top-level fields.
    pub fn of(fields: &(impl Fields + ?Sized)) -> Self {
        let get = |field: &str| match fields.field(field) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.is_empty() => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => Some(other.to_string()),
        };
        Self {
            task_def_name: get("taskDefName"),
            task_type: get("taskType"),
        }
    }

    /// Whether the task is of type `name`: it names a type, and every name it gives is `name`.
    /// A task that names none cannot be told apart from another type's.
    pub fn is(&self, name: &str) -> bool {
        let names = [&self.task_def_name, &self.task_type];
        names.iter().any(|n| n.is_some())
            && names.iter().all(|n| n.as_deref().is_none_or(|n| n == name))
    }
}

impl fmt::Display for TaskTypes {
    /// `taskDefName "a", taskType "b"`, or what is missing.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.task_def_name, &self.task_type) {
            (None, None) => f.write_str("no taskDefName or taskType"),
            (Some(d), None) => write!(f, "taskDefName {d:?} and no taskType"),
            (None, Some(t)) => write!(f, "taskType {t:?} and no taskDefName"),
            (Some(d), Some(t)) => write!(f, "taskDefName {d:?}, taskType {t:?}"),
        }
    }
}

impl Polled {
    /// Decodes one task: checked whole as [`crate::json::from_str`] would parse it (the same
    /// errors), then split at its top level without parsing its input. The ids of an
    /// undecodable one are read by skipping every other field, which serde_json does without
    /// recursion.
    pub fn decode(text: &str) -> Self {
        Self::decode_with(text, PolledTask::split)
    }

    /// [`Polled::decode`] for the task at `range` of `text`, which it takes over: the input
    /// is moved within the buffer rather than copied into a new one.
    pub fn decode_owned(text: String, range: std::ops::Range<usize>) -> Self {
        if let Some(refused) = Self::refuse_non_object(&text[range.clone()]) {
            return refused;
        }
        match PolledTask::split_owned(text, range.clone()) {
            Ok(task) => Self::Task(task),
            Err((e, text)) => Self::undecodable(&text[range], &e),
        }
    }

    fn decode_with(
        text: &str,
        split: impl FnOnce(&str) -> Result<PolledTask, crate::json::JsonError>,
    ) -> Self {
        if let Some(refused) = Self::refuse_non_object(text) {
            return refused;
        }
        match split(text) {
            Ok(task) => Self::Task(task),
            Err(e) => Self::undecodable(text, &e),
        }
    }

    /// What a text that does not start as an object is: undecodable for the reason parsing
    /// gives, or not an object. `None` for an object (which the split checks).
    fn refuse_non_object(text: &str) -> Option<Self> {
        if crate::json::kind(text) == crate::json::Kind::Object {
            return None;
        }
        Some(match crate::json::check(text) {
            Ok(()) => Self::not_an_object(),
            Err(e) => Self::undecodable(text, &e),
        })
    }

    fn not_an_object() -> Self {
        Self::Undecodable {
            ids: None,
            types: TaskTypes::default(),
            problem: "a polled task is not a JSON object".to_owned(),
        }
    }

    fn undecodable(text: &str, e: &crate::json::JsonError) -> Self {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Ids {
            task_id: String,
            workflow_instance_id: String,
        }
        /// Read apart from the ids: a type that is not a string leaves the ids readable.
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Types {
            #[serde(default)]
            task_def_name: Option<String>,
            #[serde(default)]
            task_type: Option<String>,
        }
        let types = serde_json::from_str::<Types>(text)
            .map(|t| TaskTypes {
                task_def_name: t.task_def_name.filter(|s| !s.is_empty()),
                task_type: t.task_type.filter(|s| !s.is_empty()),
            })
            .unwrap_or_default();
        Self::Undecodable {
            ids: serde_json::from_str::<Ids>(text).ok().map(|ids| TaskRef {
                task_id: ids.task_id,
                workflow_instance_id: ids.workflow_instance_id,
            }),
            types,
            problem: crate::errors::chain(&e),
        }
    }
}
