//! The attempt snapshot: the fields of a polled Conductor task that perago relies on, checked
//! once at the boundary (SPEC §5), and the attempt fence that compares a fresh read against it.

use crate::json::{Kind, RawJson};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::fmt;

/// Conductor's `Task.Status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TaskStatus {
    /// Polled and running.
    InProgress,
    /// Canceled.
    Canceled,
    /// Failed, retriable.
    Failed,
    /// Failed, not retriable.
    FailedWithTerminalError,
    /// Completed.
    Completed,
    /// Optional task failed with no retries left.
    CompletedWithErrors,
    /// Queued.
    Scheduled,
    /// Timed out.
    TimedOut,
    /// Skipped.
    Skipped,
}

impl TaskStatus {
    /// Every status.
    pub const ALL: [Self; 9] = [
        Self::InProgress,
        Self::Canceled,
        Self::Failed,
        Self::FailedWithTerminalError,
        Self::Completed,
        Self::CompletedWithErrors,
        Self::Scheduled,
        Self::TimedOut,
        Self::Skipped,
    ];

    /// Conductor's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InProgress => "IN_PROGRESS",
            Self::Canceled => "CANCELED",
            Self::Failed => "FAILED",
            Self::FailedWithTerminalError => "FAILED_WITH_TERMINAL_ERROR",
            Self::Completed => "COMPLETED",
            Self::CompletedWithErrors => "COMPLETED_WITH_ERRORS",
            Self::Scheduled => "SCHEDULED",
            Self::TimedOut => "TIMED_OUT",
            Self::Skipped => "SKIPPED",
        }
    }

    /// Parses Conductor's spelling.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.as_str() == s)
    }
}

impl fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One Conductor task attempt as perago sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptSnapshot {
    /// `workflowInstanceId`.
    pub workflow_instance_id: String,
    /// `taskId`.
    pub task_id: String,
    /// `retryCount`.
    pub retry_count: u32,
    /// `taskDefName` (Conductor falls back to `taskType` when it is empty).
    pub task_def_name: String,
    /// `referenceTaskName`.
    pub reference_task_name: String,
    /// `seq`.
    pub seq: i64,
    /// `iteration`, 0 when absent.
    pub iteration: u32,
    /// `status`.
    pub status: TaskStatus,
    /// `inputData`, a JSON object, kept as its text (it can be megabytes, and perago only
    /// forwards it).
    pub input_data: RawJson,
    /// `retriedTaskId`.
    pub retried_task_id: Option<String>,
    /// `responseTimeoutSeconds`.
    pub response_timeout_seconds: Option<u64>,
    /// When Conductor's `timeoutSeconds` clock for this attempt started, in Unix ms:
    /// `startTime + startDelayInSeconds·1000`, as Conductor's task-timeout check counts. A
    /// task handed back and polled again keeps its `startTime`, so its body gets only the
    /// time left. `None` when the task has not started (`startTime` absent or 0).
    pub timeout_clock_started_ms: Option<i64>,
}

/// A Conductor task that cannot become an attempt.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttemptError {
    /// Without `taskId` and `workflowInstanceId` Conductor cannot even be told: log and drop.
    #[error("task cannot be identified: {field} is missing or not a non-empty string")]
    Unidentifiable {
        /// `taskId` or `workflowInstanceId`.
        field: &'static str,
    },
    /// A required field is missing: fail the task naming it.
    #[error("malformed task: required field {field} is missing")]
    Missing {
        /// The Conductor field name.
        field: &'static str,
    },
    /// A field has the wrong type or value: fail the task naming it.
    #[error("malformed task: {field} {problem}")]
    Invalid {
        /// The Conductor field name.
        field: &'static str,
        /// What is wrong.
        problem: String,
    },
}

/// The identity of a task that could not be mapped, so it can still be failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRef {
    /// `taskId`.
    pub task_id: String,
    /// `workflowInstanceId`.
    pub workflow_instance_id: String,
}

/// A task's top-level fields by name: its whole JSON object, or the [`TaskFields`] a poll kept.
pub trait Fields {
    /// The value of `field`, if the task has it.
    fn field(&self, name: &str) -> Option<&Value>;
}

impl Fields for Map<String, Value> {
    fn field(&self, name: &str) -> Option<&Value> {
        self.get(name)
    }
}

impl Fields for TaskFields {
    fn field(&self, name: &str) -> Option<&Value> {
        self.get(name)
    }
}

fn nonempty_str<'a>(task: &'a (impl Fields + ?Sized), field: &str) -> Option<&'a str> {
    task.field(field)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// The `taskId` and `workflowInstanceId` of a polled task, if it has both.
pub fn task_ref(task: &Value) -> Result<TaskRef, AttemptError> {
    let map = task
        .as_object()
        .ok_or(AttemptError::Unidentifiable { field: "taskId" })?;
    task_ref_of(map)
}

fn task_ref_of(map: &(impl Fields + ?Sized)) -> Result<TaskRef, AttemptError> {
    let task_id =
        nonempty_str(map, "taskId").ok_or(AttemptError::Unidentifiable { field: "taskId" })?;
    let workflow = nonempty_str(map, "workflowInstanceId").ok_or(AttemptError::Unidentifiable {
        field: "workflowInstanceId",
    })?;
    Ok(TaskRef {
        task_id: task_id.to_owned(),
        workflow_instance_id: workflow.to_owned(),
    })
}

impl AttemptSnapshot {
    /// Maps a Conductor `Task` JSON object. An error other than
    /// [`AttemptError::Unidentifiable`] is reported to Conductor as FAILED with its message.
    pub fn from_conductor(task: &Value) -> Result<Self, AttemptError> {
        let map = task
            .as_object()
            .ok_or(AttemptError::Unidentifiable { field: "taskId" })?;
        Self::from_fields(map, || match map.get("inputData") {
            None | Some(Value::Null) => InputField::Missing,
            Some(Value::Object(o)) => InputField::Object(RawJson::from_value(o)),
            Some(_) => InputField::NotObject,
        })
    }

    /// [`AttemptSnapshot::from_conductor`] for a polled task: its input (which can be
    /// megabytes) is moved into the snapshot as the text it came as. The same checks, in the
    /// same order, with the same errors.
    pub fn from_polled(task: PolledTask) -> Result<Self, AttemptError> {
        let PolledTask { fields, input_data } = task;
        Self::from_fields(&fields, || match input_data {
            None => InputField::Missing,
            Some(input) => match crate::json::kind(input.as_str()) {
                Kind::Null => InputField::Missing,
                Kind::Object => InputField::Object(input),
                _ => InputField::NotObject,
            },
        })
    }

    /// The mapping of a task's fields; `input` reads `inputData`, at its turn among the checks.
    fn from_fields(
        map: &impl Fields,
        input: impl FnOnce() -> InputField,
    ) -> Result<Self, AttemptError> {
        let ids = task_ref_of(map)?;

        let string = |field: &'static str| -> Result<String, AttemptError> {
            match map.field(field) {
                None | Some(Value::Null) => Err(AttemptError::Missing { field }),
                Some(Value::String(s)) => Ok(s.clone()),
                Some(_) => Err(AttemptError::Invalid {
                    field,
                    problem: "must be a string".to_owned(),
                }),
            }
        };
        let integer = |field: &'static str| -> Result<Option<i64>, AttemptError> {
            match map.field(field) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v.as_i64().map(Some).ok_or(AttemptError::Invalid {
                    field,
                    problem: "must be an integer".to_owned(),
                }),
            }
        };
        let non_negative = |field: &'static str, v: i64| -> Result<u64, AttemptError> {
            u64::try_from(v).map_err(|_| AttemptError::Invalid {
                field,
                problem: format!("must not be negative, found {v}"),
            })
        };
        let small = |field: &'static str, v: u64| -> Result<u32, AttemptError> {
            u32::try_from(v).map_err(|_| AttemptError::Invalid {
                field,
                problem: format!("is out of range: {v}"),
            })
        };

        let retry_count = integer("retryCount")?.ok_or(AttemptError::Missing {
            field: "retryCount",
        })?;
        let retry_count = small("retryCount", non_negative("retryCount", retry_count)?)?;
        let task_def_name = match nonempty_str(map, "taskDefName") {
            Some(name) => name.to_owned(),
            None => match nonempty_str(map, "taskType") {
                Some(name) => name.to_owned(),
                None => {
                    return Err(AttemptError::Missing {
                        field: "taskDefName",
                    });
                }
            },
        };
        let reference_task_name = string("referenceTaskName")?;
        let seq = integer("seq")?.ok_or(AttemptError::Missing { field: "seq" })?;
        let iteration = match integer("iteration")? {
            None => 0,
            Some(v) => small("iteration", non_negative("iteration", v)?)?,
        };
        let status_text = string("status")?;
        let status = TaskStatus::parse(&status_text).ok_or_else(|| AttemptError::Invalid {
            field: "status",
            problem: format!("has unknown value {status_text:?}"),
        })?;
        let input_data = match input() {
            InputField::Missing => return Err(AttemptError::Missing { field: "inputData" }),
            InputField::Object(input) => input,
            InputField::NotObject => {
                return Err(AttemptError::Invalid {
                    field: "inputData",
                    problem: "must be a JSON object".to_owned(),
                });
            }
        };
        let retried_task_id = match map.field("retriedTaskId") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.is_empty() => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => {
                return Err(AttemptError::Invalid {
                    field: "retriedTaskId",
                    problem: "must be a string".to_owned(),
                });
            }
        };
        let response_timeout_seconds = integer("responseTimeoutSeconds")?
            .map(|v| non_negative("responseTimeoutSeconds", v))
            .transpose()?;
        let start_delay_ms = integer("startDelayInSeconds")?
            .unwrap_or(0)
            .saturating_mul(1000);
        let timeout_clock_started_ms = integer("startTime")?
            .filter(|&t| t > 0)
            .map(|t| t.saturating_add(start_delay_ms.max(0)));

        Ok(Self {
            workflow_instance_id: ids.workflow_instance_id,
            task_id: ids.task_id,
            retry_count,
            task_def_name,
            reference_task_name,
            seq,
            iteration,
            status,
            input_data,
            retried_task_id,
            response_timeout_seconds,
            timeout_clock_started_ms,
        })
    }

    /// A copy without the input (which can be megabytes; `{}` stands in for it), for what
    /// needs only the attempt's identity and timing.
    pub fn without_input(&self) -> Self {
        Self {
            workflow_instance_id: self.workflow_instance_id.clone(),
            task_id: self.task_id.clone(),
            retry_count: self.retry_count,
            task_def_name: self.task_def_name.clone(),
            reference_task_name: self.reference_task_name.clone(),
            seq: self.seq,
            iteration: self.iteration,
            status: self.status,
            input_data: RawJson::trusted("{}".to_owned()),
            retried_task_id: self.retried_task_id.clone(),
            response_timeout_seconds: self.response_timeout_seconds,
            timeout_clock_started_ms: self.timeout_clock_started_ms,
        }
    }

    /// The attempt fence: a `fresh` read of this attempt's task passes only if it is still
    /// IN_PROGRESS and the same workflow, task and retry.
    pub fn fence(&self, fresh: &AttemptSnapshot) -> Result<(), FenceError> {
        if fresh.workflow_instance_id != self.workflow_instance_id {
            return Err(FenceError::Changed {
                field: "workflowInstanceId",
                polled: self.workflow_instance_id.clone(),
                fresh: fresh.workflow_instance_id.clone(),
            });
        }
        if fresh.task_id != self.task_id {
            return Err(FenceError::Changed {
                field: "taskId",
                polled: self.task_id.clone(),
                fresh: fresh.task_id.clone(),
            });
        }
        if fresh.retry_count != self.retry_count {
            return Err(FenceError::Changed {
                field: "retryCount",
                polled: self.retry_count.to_string(),
                fresh: fresh.retry_count.to_string(),
            });
        }
        if fresh.status != TaskStatus::InProgress {
            return Err(FenceError::NotInProgress {
                status: fresh.status,
            });
        }
        Ok(())
    }
}

/// `inputData` as the mapping finds it.
enum InputField {
    /// Absent or null.
    Missing,
    /// Not an object.
    NotObject,
    /// An object.
    Object(RawJson),
}

/// A polled task's fields but `inputData`, and where `inputData` is in its text.
type Split = (TaskFields, Option<std::ops::Range<usize>>);

/// The top-level fields of a Conductor task that the runtime reads: [`PolledTask::split`] parses
/// these and only checks the others (a task carries some 50, among them its whole
/// `workflowTask` definition, and building maps of them all cost more than anything else the
/// broker did with a task's JSON).
pub const READ_FIELDS: [&str; 15] = [
    "taskId",
    "workflowInstanceId",
    "taskType",
    "taskDefName",
    "status",
    "retryCount",
    "referenceTaskName",
    "seq",
    "iteration",
    "retriedTaskId",
    "responseTimeoutSeconds",
    "startDelayInSeconds",
    "startTime",
    "externalInputPayloadStoragePath",
    "outputData",
];

/// The fields of [`READ_FIELDS`] that a polled task has, each at its place in that list: one
/// allocation per task, no map and no key of its own (boxed: a `Value` is 72 bytes, and a
/// polled task is moved through vectors and channels).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TaskFields(Box<[Option<Value>; READ_FIELDS.len()]>);

/// `fields["taskId"]`: the value, or null when the task does not have it (as indexing a
/// `Value` answers).
impl std::ops::Index<&str> for TaskFields {
    type Output = Value;

    fn index(&self, name: &str) -> &Value {
        static NULL: Value = Value::Null;
        self.get(name).unwrap_or(&NULL)
    }
}

impl TaskFields {
    fn place(name: &str) -> Option<usize> {
        READ_FIELDS.iter().position(|read| *read == name)
    }

    /// The value of `name`, if the task has it (never one of a field not in [`READ_FIELDS`]).
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.0[Self::place(name)?].as_ref()
    }

    /// Sets `name` to `value` if it is one of [`READ_FIELDS`]; another field is not kept
    /// (false).
    pub fn set(&mut self, name: &str, value: Value) -> bool {
        match Self::place(name) {
            Some(at) => {
                self.0[at] = Some(value);
                true
            }
            None => false,
        }
    }

    /// The names of the fields it has, in the order of [`READ_FIELDS`].
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        READ_FIELDS
            .iter()
            .zip(self.0.iter())
            .filter(|(_, value)| value.is_some())
            .map(|(name, _)| *name)
    }
}

/// A task as a poll (or update-v2) returned it, checked as [`crate::json::check`] checks JSON:
/// the fields the runtime reads ([`READ_FIELDS`]) parsed, `inputData` kept as the text it came
/// as.
#[derive(Debug, Clone, PartialEq)]
pub struct PolledTask {
    /// Those of [`READ_FIELDS`] that it has.
    pub fields: TaskFields,
    /// `inputData` (any JSON value), when present.
    pub input_data: Option<RawJson>,
}

impl PolledTask {
    /// `externalInputPayloadStoragePath`: Conductor moved the input (above its
    /// `taskInputPayloadSizeThreshold`) to external payload storage, and `inputData` is `{}`
    /// until it is fetched from there (see [`crate::conductor::fetch_task_input`]).
    pub fn external_input_path(&self) -> Option<&str> {
        nonempty_str(&self.fields, "externalInputPayloadStoragePath")
    }

    /// Splits the JSON object `text`, checking it as parsing would (the same depth limit,
    /// syntax and number rules, the same errors), in about one pass: only the top level is
    /// read, the fields of [`READ_FIELDS`] are parsed, and the others and `inputData` are
    /// checked without being parsed.
    pub fn split(text: &str) -> Result<Self, crate::json::JsonError> {
        let (fields, input) = Self::split_at(text)?;
        Ok(Self {
            fields,
            input_data: input.map(|at| RawJson::trusted(text[at].to_owned())),
        })
    }

    /// [`PolledTask::split`] of the task at `range` of `text`, which the task takes over: its
    /// input becomes the snapshot's text in place (moved within the buffer, not copied into a
    /// new one; an input can be megabytes). `text` is given back with the error.
    pub fn split_owned(
        mut text: String,
        range: std::ops::Range<usize>,
    ) -> Result<Self, (crate::json::JsonError, String)> {
        let (fields, input) = match Self::split_at(&text[range.clone()]) {
            Ok(split) => split,
            Err(e) => return Err((e, text)),
        };
        let input_data = input.map(|at| {
            text.truncate(range.start + at.end);
            text.drain(..range.start + at.start);
            RawJson::trusted(text)
        });
        Ok(Self { fields, input_data })
    }

    /// The fields but `inputData`, parsed, and where `inputData` is in `text`; `text` is
    /// checked on the way (a failure is named by [`crate::json::check`], as parsing names it).
    fn split_at(text: &str) -> Result<Split, crate::json::JsonError> {
        use crate::json::{JsonError, MAX_DEPTH, nesting_depth};
        let depth = nesting_depth(text, MAX_DEPTH);
        if depth > MAX_DEPTH {
            return Err(JsonError::TooDeep { depth });
        }
        let split = || -> Result<Split, JsonError> {
            let mut fields = TaskFields::default();
            let mut input = None;
            for (key, value) in crate::json::members(text)? {
                if key == "inputData" {
                    crate::json::check(value)?;
                    // `value` is a slice of `text`.
                    let start = value.as_ptr() as usize - text.as_ptr() as usize;
                    input = Some(start..start + value.len());
                } else if let Some(at) = TaskFields::place(&key) {
                    fields.0[at] = Some(crate::json::from_str(value)?);
                } else {
                    crate::json::check(value)?;
                }
            }
            Ok((fields, input))
        };
        // The scan and the parts' checks find that the text is broken; the whole text's check
        // says how, with the position parsing it gives.
        split().map_err(|e| crate::json::check(text).err().unwrap_or(e))
    }

    /// A task given as a `Value` (a JSON object; anything else has no fields): its fields of
    /// [`READ_FIELDS`] and its input, as [`PolledTask::split`] keeps them.
    pub fn from_value(task: Value) -> Self {
        let mut fields = TaskFields::default();
        let Value::Object(map) = task else {
            return Self {
                fields,
                input_data: None,
            };
        };
        let mut input_data = None;
        for (name, value) in map {
            if name == "inputData" {
                input_data = Some(RawJson::from_value(&value));
            } else {
                fields.set(&name, value);
            }
        }
        Self { fields, input_data }
    }

    /// The `taskId` and `workflowInstanceId`, if it has both.
    pub fn task_ref(&self) -> Result<TaskRef, AttemptError> {
        task_ref_of(&self.fields)
    }
}

/// Why the attempt fence refused: the attempt is stale.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FenceError {
    /// The task is no longer running (timed out, canceled, …).
    #[error("stale attempt: task status is {status}, expected IN_PROGRESS")]
    NotInProgress {
        /// The fresh status.
        status: TaskStatus,
    },
    /// The fresh read is another attempt.
    #[error("stale attempt: {field} changed from {polled} to {fresh}")]
    Changed {
        /// The field that differs.
        field: &'static str,
        /// As polled.
        polled: String,
        /// As read now.
        fresh: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn polled() -> Value {
        json!({
            "taskType": "features.build", "status": "IN_PROGRESS",
            "inputData": {"params": {"n": 1}}, "referenceTaskName": "build_ref",
            "retryCount": 1, "seq": 3, "taskDefName": "features.build",
            "workflowInstanceId": "wf-1", "taskId": "t-1", "retriedTaskId": "t-0",
            "responseTimeoutSeconds": 120, "iteration": 2, "pollCount": 1,
            "startTime": 1_700_000_000_450_i64, "startDelayInSeconds": 2
        })
    }

    fn without(field: &str) -> Value {
        let mut v = polled();
        v.as_object_mut().unwrap().remove(field);
        v
    }

    fn with(field: &str, value: Value) -> Value {
        let mut v = polled();
        v[field] = value;
        v
    }

    /// The polled conversion moves the input and otherwise answers exactly as the borrowed
    /// one, errors included (also when the input and another field are both wrong).
    #[test]
    fn the_polled_conversion_answers_as_the_borrowed_one() {
        let mut broken = with("status", json!("NOPE"));
        broken.as_object_mut().unwrap().remove("inputData");
        for task in [
            polled(),
            without("inputData"),
            with("inputData", json!([1])),
            with("inputData", Value::Null),
            with("retryCount", json!(-1)),
            with("retriedTaskId", json!(5)),
            broken,
            json!("not an object"),
        ] {
            let text = task.to_string();
            let split =
                PolledTask::split(&text).unwrap_or_else(|_| PolledTask::from_value(task.clone()));
            assert_eq!(
                AttemptSnapshot::from_polled(split),
                AttemptSnapshot::from_conductor(&task),
                "{task}"
            );
            assert_eq!(
                AttemptSnapshot::from_polled(PolledTask::from_value(task.clone())),
                AttemptSnapshot::from_conductor(&task),
                "{task}"
            );
        }
    }

    #[test]
    fn maps_every_field() {
        let a = AttemptSnapshot::from_conductor(&polled()).unwrap();
        assert_eq!(
            a,
            AttemptSnapshot {
                workflow_instance_id: "wf-1".into(),
                task_id: "t-1".into(),
                retry_count: 1,
                task_def_name: "features.build".into(),
                reference_task_name: "build_ref".into(),
                seq: 3,
                iteration: 2,
                status: TaskStatus::InProgress,
                input_data: RawJson::from_value(&json!({"params": {"n": 1}})),
                retried_task_id: Some("t-0".into()),
                response_timeout_seconds: Some(120),
                timeout_clock_started_ms: Some(1_700_000_002_450),
            }
        );
    }

    #[test]
    fn optional_fields_default() {
        let mut v = polled();
        for f in ["iteration", "retriedTaskId", "responseTimeoutSeconds"] {
            v.as_object_mut().unwrap().remove(f);
        }
        let a = AttemptSnapshot::from_conductor(&v).unwrap();
        assert_eq!(a.iteration, 0);
        assert_eq!(a.retried_task_id, None);
        assert_eq!(a.response_timeout_seconds, None);
        // Conductor's getter falls back to taskType when taskDefName is empty.
        let a = AttemptSnapshot::from_conductor(&with("taskDefName", json!(""))).unwrap();
        assert_eq!(a.task_def_name, "features.build");
    }

    #[test]
    fn missing_required_fields_are_named() {
        let msg = |v: Value| AttemptSnapshot::from_conductor(&v).unwrap_err().to_string();
        for field in [
            "retryCount",
            "referenceTaskName",
            "seq",
            "status",
            "inputData",
        ] {
            assert_eq!(
                msg(without(field)),
                format!("malformed task: required field {field} is missing"),
            );
        }
        let mut v = without("taskDefName");
        v.as_object_mut().unwrap().remove("taskType");
        assert_eq!(
            msg(v),
            "malformed task: required field taskDefName is missing"
        );
    }

    #[test]
    fn invalid_fields_are_named() {
        let msg = |v: Value| AttemptSnapshot::from_conductor(&v).unwrap_err().to_string();
        assert_eq!(
            msg(with("inputData", json!([1]))),
            "malformed task: inputData must be a JSON object"
        );
        assert_eq!(
            msg(with("retryCount", json!("1"))),
            "malformed task: retryCount must be an integer"
        );
        assert_eq!(
            msg(with("retryCount", json!(-1))),
            "malformed task: retryCount must not be negative, found -1"
        );
        assert_eq!(
            msg(with("status", json!("RUNNING"))),
            "malformed task: status has unknown value \"RUNNING\""
        );
    }

    /// An externalized input maps as the `{}` it came as (the fence and the result journal
    /// read such tasks back); the path is kept for the broker to fetch the real input.
    #[test]
    fn an_externalized_input_maps_and_keeps_its_path() {
        let task = with("externalInputPayloadStoragePath", json!("k.json"));
        let attempt = AttemptSnapshot::from_conductor(&task).unwrap();
        assert_eq!(attempt.task_id, "t-1");
        let polled = PolledTask::from_value(task);
        assert_eq!(polled.external_input_path(), Some("k.json"));
        let polled = PolledTask::from_value(with("externalInputPayloadStoragePath", json!("")));
        assert_eq!(polled.external_input_path(), None);
    }

    #[test]
    fn unidentifiable_tasks_are_told_apart() {
        let err = AttemptSnapshot::from_conductor(&without("taskId")).unwrap_err();
        assert_eq!(err, AttemptError::Unidentifiable { field: "taskId" });
        let err =
            AttemptSnapshot::from_conductor(&with("workflowInstanceId", json!(""))).unwrap_err();
        assert_eq!(
            err,
            AttemptError::Unidentifiable {
                field: "workflowInstanceId"
            }
        );
        assert!(AttemptSnapshot::from_conductor(&json!([])).is_err());
        // A task that is identifiable but malformed can still be failed.
        let ids = task_ref(&without("seq")).unwrap();
        assert_eq!(ids.task_id, "t-1");
        assert_eq!(ids.workflow_instance_id, "wf-1");
    }

    #[test]
    fn fence_passes_only_the_same_running_attempt() {
        let polled = AttemptSnapshot::from_conductor(&polled()).unwrap();
        assert_eq!(polled.fence(&polled.clone()), Ok(()));

        let mut timed_out = polled.clone();
        timed_out.status = TaskStatus::TimedOut;
        assert_eq!(
            polled.fence(&timed_out).unwrap_err().to_string(),
            "stale attempt: task status is TIMED_OUT, expected IN_PROGRESS"
        );
        let mut retried = polled.clone();
        retried.retry_count = 2;
        assert_eq!(
            polled.fence(&retried).unwrap_err().to_string(),
            "stale attempt: retryCount changed from 1 to 2"
        );
        let mut other_wf = polled.clone();
        other_wf.workflow_instance_id = "wf-2".into();
        assert!(matches!(
            polled.fence(&other_wf),
            Err(FenceError::Changed {
                field: "workflowInstanceId",
                ..
            })
        ));
        let mut other_task = polled.clone();
        other_task.task_id = "t-2".into();
        assert!(matches!(
            polled.fence(&other_task),
            Err(FenceError::Changed {
                field: "taskId",
                ..
            })
        ));
    }

    #[test]
    fn status_spellings_round_trip() {
        for s in TaskStatus::ALL {
            assert_eq!(TaskStatus::parse(s.as_str()), Some(s));
            assert_eq!(serde_json::to_value(s).unwrap(), json!(s.as_str()));
        }
        assert_eq!(TaskStatus::parse("completed"), None);
    }

    /// A split parses only the fields the runtime reads; the others (a workflowTask of
    /// hundreds of members) are checked, not kept: one that is broken fails the split as
    /// parsing the whole task would, with the same error.
    #[test]
    fn a_split_keeps_the_fields_read_and_checks_the_rest() {
        let mut task = polled();
        task["workflowTask"] = json!({"name": "x", "inputParameters": {"a": [1, 2, {"b": null}]}});
        task["outputData"] = json!({"kept": true});
        let split = PolledTask::split(&task.to_string()).unwrap();
        let mut kept: Vec<&str> = split.fields.names().collect();
        kept.sort_unstable();
        let mut expected: Vec<&str> = READ_FIELDS
            .iter()
            .copied()
            .filter(|f| task.get(f).is_some())
            .collect();
        expected.sort_unstable();
        assert_eq!(kept, expected);
        assert!(!kept.contains(&"workflowTask") && !kept.contains(&"pollCount"));
        assert_eq!(split.fields.get("outputData"), Some(&json!({"kept": true})));
        assert_eq!(
            AttemptSnapshot::from_polled(split),
            AttemptSnapshot::from_conductor(&task)
        );
        // A number no f64 holds, deep in a field nobody reads: refused as parsing refuses it.
        let text = task.to_string().replace(r#""b":null"#, r#""b":1e999"#);
        let parsed = serde_json::from_str::<Value>(&text)
            .unwrap_err()
            .to_string();
        match PolledTask::split(&text) {
            Err(crate::json::JsonError::Syntax(e)) => assert_eq!(e, parsed),
            other => panic!("{other:?}"),
        }
    }

    /// A field given twice keeps its last value, as parsing the task into a map keeps it; a
    /// field the runtime does not read is neither kept nor answered.
    #[test]
    fn the_fields_kept_answer_as_the_task_parsed() {
        let text = r#"{"taskId": "t-1", "taskId": "t-2", "pollCount": 3, "seq": 4}"#;
        let parsed: Value = serde_json::from_str(text).unwrap();
        let mut fields = PolledTask::split(text).unwrap().fields;
        assert_eq!(fields["taskId"], parsed["taskId"]);
        assert_eq!(fields.get("taskId"), Some(&json!("t-2")));
        assert_eq!(fields.names().collect::<Vec<_>>(), ["taskId", "seq"]);
        assert_eq!(fields.get("pollCount"), None);
        assert_eq!(fields["status"], Value::Null);
        assert!(!fields.set("pollCount", json!(1)));
        assert_eq!(fields.get("pollCount"), None);
        assert!(fields.set("status", json!("IN_PROGRESS")));
        assert_eq!(
            fields.names().collect::<Vec<_>>(),
            ["taskId", "status", "seq"]
        );
        assert_eq!(
            PolledTask::from_value(parsed).fields.get("taskId"),
            Some(&json!("t-2"))
        );
    }

    /// A polled task's input reaches the snapshot as the text Conductor sent, byte for byte.
    #[test]
    fn a_polled_input_is_kept_as_it_came() {
        let input =
            r#"{"params": {"x": 1.0e2, "s": "\u00e9", "big": 123456789012345678901234567890}}"#;
        let text = format!(
            r#"{{"taskId": "t-1", "workflowInstanceId": "wf-1", "retryCount": 0, "taskDefName": "d",
                "referenceTaskName": "r", "seq": 1, "status": "IN_PROGRESS", "inputData": {input}}}"#
        );
        crate::json::check(&text).unwrap();
        let task = PolledTask::split(&text).unwrap();
        assert_eq!(task.task_ref().unwrap().task_id, "t-1");
        let attempt = AttemptSnapshot::from_polled(task).unwrap();
        assert_eq!(attempt.input_data.as_str(), input);
        assert_eq!(attempt.task_def_name, "d");
    }
}
