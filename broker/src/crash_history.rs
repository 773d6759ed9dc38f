//! A workflow task's crash count, read back from Conductor: the attempt that crashed names the
//! one it was retried from (`retriedTaskId`), whose `reasonForIncompletion` ends with the
//! running total when perago failed it for a crash (see [`crate::poison::parse_counted`]).
//! That is what makes counts survive a broker restart and agree across runtimes on several
//! hosts; the broker's ledger is only a cache of it.
//!
//! The walk is bounded ([`MAX_READS`] reads, each answer capped by the client), and every
//! earlier attempt is checked before its reason is believed: it must be the task asked for, of
//! the same workflow, reference name and task type.

use crate::{
    poison::{Counted, parse_counted},
    state::HistoryRead,
};
use perago_core::conductor::{ConductorClient, ConductorError};
use serde_json::Value;
use std::time::Duration;

/// Earlier attempts read at most for one crash.
pub(crate) const MAX_READS: usize = 10;

/// The longest a walk may take, all reads together: the crash's result waits for it (and a
/// drain with it), and a Conductor that answers slowly must not hold it for 10 × the client's
/// request timeout.
pub(crate) const MAX_WALK_TIME: Duration = Duration::from_secs(15);

/// Why the history could not be read: the crash is then counted on the broker's own count.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HistoryError {
    #[error("cannot read earlier attempt {task_id}")]
    Read {
        task_id: String,
        #[source]
        source: ConductorError,
    },
    #[error(
        "earlier attempt {task_id} does not match the crashed attempt: its {field} is {found:?}, expected {expected:?}"
    )]
    Mismatch {
        task_id: String,
        field: &'static str,
        found: String,
        expected: String,
    },
    #[error("earlier attempt {task_id}: {field} is not a string")]
    Malformed {
        task_id: String,
        field: &'static str,
    },
    #[error("earlier attempt {task_id} is retried from itself or from an attempt already read")]
    Cycle { task_id: String },
    #[error("no perago crash count in the last {MAX_READS} earlier attempts")]
    TooLong,
    #[error("reading the earlier attempts took longer than {}s", MAX_WALK_TIME.as_secs())]
    TimedOut,
}

/// Reads through `client`, within [`MAX_WALK_TIME`].
pub(crate) async fn counted_before(
    client: &ConductorClient,
    read: &HistoryRead,
) -> Result<u32, HistoryError> {
    let walk = walk(read, |task_id| async move {
        client
            .get_task(&task_id)
            .await
            .map_err(|source| HistoryError::Read { task_id, source })
    });
    tokio::time::timeout(MAX_WALK_TIME, walk)
        .await
        .unwrap_or(Err(HistoryError::TimedOut))
}

/// The crashes counted before the attempt of `read`: walks back `retriedTaskId` from
/// `read.retried_task_id`, reading each attempt with `get`, until a reason of perago's says
/// the total (a poison verdict resets it to 0) or the first attempt is reached (0).
pub(crate) async fn walk<F, Fut>(read: &HistoryRead, mut get: F) -> Result<u32, HistoryError>
where
    F: FnMut(String) -> Fut,
    Fut: Future<Output = Result<Value, HistoryError>>,
{
    let mut seen = vec![read.task_id.clone()];
    let mut next = read.retried_task_id.clone();
    for _ in 0..MAX_READS {
        if seen.contains(&next) {
            return Err(HistoryError::Cycle { task_id: next });
        }
        let task = get(next.clone()).await?;
        let field = |name: &'static str| -> Result<Option<&str>, HistoryError> {
            match task.get(name) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s)),
                Some(_) => Err(HistoryError::Malformed {
                    task_id: next.clone(),
                    field: name,
                }),
            }
        };
        let def_name = field("taskDefName")?
            .filter(|s| !s.is_empty())
            .or(field("taskType")?);
        for (name, found, expected) in [
            ("taskId", field("taskId")?, next.as_str()),
            (
                "workflowInstanceId",
                field("workflowInstanceId")?,
                &read.workflow_instance_id,
            ),
            (
                "referenceTaskName",
                field("referenceTaskName")?,
                &read.reference_task_name,
            ),
            ("taskDefName", def_name, &read.task_def_name),
        ] {
            if found != Some(expected) {
                return Err(HistoryError::Mismatch {
                    task_id: next.clone(),
                    field: name,
                    found: found.unwrap_or_default().to_owned(),
                    expected: expected.to_owned(),
                });
            }
        }
        match parse_counted(field("reasonForIncompletion")?.unwrap_or_default()) {
            Counted::Total(n) => return Ok(n),
            Counted::Reset => return Ok(0),
            Counted::Silent => {}
        }
        let Some(earlier) = field("retriedTaskId")?.filter(|s| !s.is_empty()) else {
            return Ok(0);
        };
        let earlier = earlier.to_owned();
        seen.push(std::mem::replace(&mut next, earlier));
    }
    Err(HistoryError::TooLong)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::poison::{counted_suffix, not_counted_suffix};
    use serde_json::json;
    use std::{cell::RefCell, collections::HashMap};

    const CRASH: &str = "executor t0001 (pid 9, generation 2) exited (signal 9 (SIGKILL)) while running execution e";

    fn attempt(id: &str, retried: Option<&str>, reason: &str) -> Value {
        json!({
            "taskId": id, "workflowInstanceId": "wf", "referenceTaskName": "a",
            "taskDefName": "t", "taskType": "t", "status": "FAILED",
            "retriedTaskId": retried, "reasonForIncompletion": reason,
        })
    }

    fn read(retried: &str) -> HistoryRead {
        HistoryRead {
            execution_id: "x".into(),
            task_id: "now".into(),
            retried_task_id: retried.into(),
            workflow_instance_id: "wf".into(),
            reference_task_name: "a".into(),
            task_def_name: "t".into(),
        }
    }

    /// Walks over `tasks`; returns the result and the ids read, in order.
    fn run(tasks: &[Value], from: &str) -> (Result<u32, HistoryError>, Vec<String>) {
        let by_id: HashMap<String, Value> = tasks
            .iter()
            .map(|t| {
                // `_asked_as`: the id a test serves this answer for (a server that lies).
                let id = t.get("_asked_as").unwrap_or(&t["taskId"]);
                (id.as_str().unwrap().to_owned(), t.clone())
            })
            .collect();
        let asked = RefCell::new(Vec::new());
        let get = |id: String| {
            asked.borrow_mut().push(id.clone());
            let found = by_id.get(&id).cloned();
            async move {
                found.ok_or(HistoryError::Read {
                    task_id: id,
                    source: ConductorError::Status {
                        method: "GET",
                        url: "u".into(),
                        status: 404,
                        body: String::new(),
                    },
                })
            }
        };
        let result = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(walk(&read(from), get));
        (result, asked.into_inner())
    }

    #[test]
    fn the_total_is_the_last_one_perago_wrote() {
        let tasks = [
            attempt("t1", None, &format!("{CRASH}{}", counted_suffix(1, 3))),
            attempt(
                "t2",
                Some("t1"),
                &format!("{CRASH}{}", counted_suffix(2, 3)),
            ),
        ];
        let (got, asked) = run(&tasks, "t2");
        assert_eq!(got.unwrap(), 2);
        assert_eq!(asked, ["t2"]);
    }

    #[test]
    fn other_failures_are_walked_past_to_the_first_attempt() {
        let tasks = [
            attempt("t1", None, &format!("{CRASH}{}", counted_suffix(1, 3))),
            attempt("t2", Some("t1"), "command exited with status 1: boom"),
            attempt(
                "t3",
                Some("t2"),
                &format!("{CRASH}{}", not_counted_suffix("a burst", None, 3)),
            ),
            attempt("t4", Some("t3"), "Task timed out after 10 seconds"),
        ];
        let (got, asked) = run(&tasks, "t4");
        assert_eq!(got.unwrap(), 1);
        assert_eq!(asked, ["t4", "t3", "t2", "t1"]);
        let (got, _) = run(
            &tasks[1..2]
                .iter()
                .map(|t| {
                    let mut t = t.clone();
                    t["retriedTaskId"] = Value::Null;
                    t
                })
                .collect::<Vec<_>>(),
            "t2",
        );
        assert_eq!(
            got.unwrap(),
            0,
            "a first attempt with no crash count: none before"
        );
    }

    #[test]
    fn a_poison_verdict_starts_a_rerun_afresh() {
        let tasks = [
            attempt("t1", None, &format!("{CRASH}{}", counted_suffix(2, 3))),
            attempt(
                "t2",
                Some("t1"),
                &format!(
                    "poison task: attempts of workflow task a in workflow wf killed their executor 3 times (PERAGO_POISON_AFTER=3); last: {CRASH}"
                ),
            ),
        ];
        assert_eq!(run(&tasks, "t2").0.unwrap(), 0);
    }

    #[test]
    fn an_attempt_of_another_workflow_task_or_a_cycle_or_a_long_chain_is_not_believed() {
        let mut other = attempt("t1", None, &format!("{CRASH}{}", counted_suffix(2, 3)));
        other["workflowInstanceId"] = json!("another");
        let err = run(&[other], "t1").0.unwrap_err();
        assert!(
            matches!(
                err,
                HistoryError::Mismatch {
                    field: "workflowInstanceId",
                    ..
                }
            ),
            "{err}"
        );
        let mut renamed = attempt("t1", None, "x");
        renamed["taskId"] = json!("t9");
        renamed["_asked_as"] = json!("t1");
        assert!(matches!(
            run(&[renamed], "t1").0,
            Err(HistoryError::Mismatch {
                field: "taskId",
                ..
            })
        ));
        let mut typed = attempt("t1", None, "x");
        typed["taskDefName"] = json!("other");
        assert!(matches!(
            run(&[typed], "t1").0,
            Err(HistoryError::Mismatch {
                field: "taskDefName",
                ..
            })
        ));
        let mut odd = attempt("t1", None, "x");
        odd["reasonForIncompletion"] = json!(3);
        assert!(matches!(
            run(&[odd], "t1").0,
            Err(HistoryError::Malformed { .. })
        ));
        let cycle = [
            attempt("t1", Some("t2"), "x"),
            attempt("t2", Some("t1"), "x"),
        ];
        assert!(matches!(
            run(&cycle, "t2").0,
            Err(HistoryError::Cycle { .. })
        ));
        let chain: Vec<Value> = (1..=20)
            .map(|n| {
                let earlier = format!("t{}", n - 1);
                attempt(&format!("t{n}"), (n > 1).then_some(earlier.as_str()), "x")
            })
            .collect();
        let (got, asked) = run(&chain, "t20");
        assert!(matches!(got, Err(HistoryError::TooLong)), "{got:?}");
        assert_eq!(asked.len(), MAX_READS);
        // A failed read is an error, never a count.
        assert!(matches!(run(&[], "t1").0, Err(HistoryError::Read { .. })));
    }
}
