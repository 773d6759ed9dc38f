//! The runtime result of one execution, and its Conductor `TaskResult` form.
//!
//! The invariants of SPEC §5 are in the types: `COMPLETED` carries output and no reason,
//! `FAILED`/`FAILED_WITH_TERMINAL_ERROR` carry a non-empty reason and no output, and every
//! result carries the worker id.

use serde_json::{Map, Value, json};
use std::fmt;

/// Conductor cuts `reasonForIncompletion` at this many characters.
pub const MAX_REASON_CHARS: usize = 500;

/// A failure reason: non-empty, at most [`MAX_REASON_CHARS`] characters, cut on a character
/// boundary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reason(String);

/// `text` with its control characters other than newline and tab written out (`\x1b`,
/// `\0`, `\r`): a body's bytes must not drive an operator's terminal, hide text with a
/// carriage return, or cut a record at a NUL, in a reason or a log line.
pub fn escape_controls(text: &str) -> std::borrow::Cow<'_, str> {
    let bad = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !text.chars().any(bad) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\0' => out.push_str("\\0"),
            '\r' => out.push_str("\\r"),
            c if bad(c) && (c as u32) < 0x100 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if bad(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

impl Reason {
    /// A reason from one message; an over-long message keeps its start (the check and field
    /// come first) and ends with `…`. Control characters are escaped.
    pub fn new(message: impl Into<String>) -> Self {
        let message = message.into();
        let message = escape_controls(&message);
        let message = message.trim();
        if message.is_empty() {
            return Self("failed without a reason".to_owned());
        }
        if message.chars().count() <= MAX_REASON_CHARS {
            return Self(message.to_owned());
        }
        let mut cut: String = message.chars().take(MAX_REASON_CHARS - 1).collect();
        cut.push('…');
        Self(cut)
    }

    /// A reason made of a head (which check failed, on which field) and a tail (such as the
    /// end of the body's stderr). The head is kept whole as far as possible; the tail is cut
    /// from its start so its last, most telling lines survive.
    pub fn with_tail(head: &str, tail: &str) -> Self {
        let head = Self::new(head).0;
        let tail = escape_controls(tail);
        let tail = tail.trim();
        if tail.is_empty() {
            return Self(head);
        }
        let sep = ": ";
        let room = MAX_REASON_CHARS.saturating_sub(head.chars().count() + sep.chars().count());
        if room < 2 {
            return Self(head);
        }
        let tail_len = tail.chars().count();
        let tail = if tail_len <= room {
            tail.to_owned()
        } else {
            let skip = tail_len - (room - 1);
            format!("…{}", tail.chars().skip(skip).collect::<String>())
        };
        Self(format!("{head}{sep}{tail}"))
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The status reported to Conductor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultStatus {
    /// `COMPLETED`.
    Completed,
    /// `FAILED`: Conductor may retry.
    Failed,
    /// `FAILED_WITH_TERMINAL_ERROR`: never retried.
    FailedWithTerminalError,
}

impl ResultStatus {
    /// Conductor's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "COMPLETED",
            Self::Failed => "FAILED",
            Self::FailedWithTerminalError => "FAILED_WITH_TERMINAL_ERROR",
        }
    }
}

/// What one execution produced.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Success, with the task output (`{"result": …}` or `{"workspace": …, "result": …}`).
    Completed(Map<String, Value>),
    /// Failure Conductor may retry.
    Failed(Reason),
    /// Failure that must not be retried.
    FailedTerminal(Reason),
}

/// The result of one execution, as the executor hands it to the broker.
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeResult {
    outcome: Outcome,
    worker_id: String,
}

impl RuntimeResult {
    /// `COMPLETED` with output.
    pub fn completed(worker_id: impl Into<String>, output: Map<String, Value>) -> Self {
        Self {
            outcome: Outcome::Completed(output),
            worker_id: worker_id.into(),
        }
    }

    /// `FAILED` with a reason.
    pub fn failed(worker_id: impl Into<String>, reason: Reason) -> Self {
        Self {
            outcome: Outcome::Failed(reason),
            worker_id: worker_id.into(),
        }
    }

    /// `FAILED_WITH_TERMINAL_ERROR` with a reason.
    pub fn failed_terminal(worker_id: impl Into<String>, reason: Reason) -> Self {
        Self {
            outcome: Outcome::FailedTerminal(reason),
            worker_id: worker_id.into(),
        }
    }

    /// The outcome.
    pub fn outcome(&self) -> &Outcome {
        &self.outcome
    }

    /// The worker id that produced it.
    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }

    /// The status.
    pub fn status(&self) -> ResultStatus {
        match self.outcome {
            Outcome::Completed(_) => ResultStatus::Completed,
            Outcome::Failed(_) => ResultStatus::Failed,
            Outcome::FailedTerminal(_) => ResultStatus::FailedWithTerminalError,
        }
    }

    /// The Conductor `TaskResult` body for `POST /api/tasks` (or update-v2). The execution
    /// id goes into one `logs` entry so that a failure without output is still traceable to
    /// the execution that produced it.
    pub fn to_conductor(
        &self,
        workflow_instance_id: &str,
        task_id: &str,
        execution_id: &str,
        now_ms: i64,
    ) -> Value {
        self.clone()
            .into_conductor(workflow_instance_id, task_id, execution_id, now_ms)
    }

    /// [`RuntimeResult::to_conductor`], moving the output into the body instead of copying it
    /// (an output can be megabytes).
    pub fn into_conductor(
        self,
        workflow_instance_id: &str,
        task_id: &str,
        execution_id: &str,
        now_ms: i64,
    ) -> Value {
        let mut body = json!({
            "workflowInstanceId": workflow_instance_id,
            "taskId": task_id,
            "workerId": self.worker_id,
            "status": self.status().as_str(),
            "logs": [{
                "log": format!("perago execution {execution_id} by {}", self.worker_id),
                "taskId": task_id,
                "createdTime": now_ms,
            }],
        });
        match self.outcome {
            Outcome::Completed(output) => {
                body["outputData"] = Value::Object(output);
            }
            Outcome::Failed(reason) | Outcome::FailedTerminal(reason) => {
                body["reasonForIncompletion"] = Value::String(reason.0);
            }
        }
        body
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completed_carries_output_and_no_reason() {
        let out = crate::shape::workspace_free_output(json!({"n": 2}));
        let r = RuntimeResult::completed("w0001", out);
        let body = r.to_conductor("wf", "t", "e-1", 7);
        assert_eq!(body["status"], "COMPLETED");
        assert_eq!(body["outputData"], json!({"result": {"n": 2}}));
        assert_eq!(body["workerId"], "w0001");
        assert!(body.get("reasonForIncompletion").is_none());
        assert_eq!(body["logs"][0]["log"], "perago execution e-1 by w0001");
        assert_eq!(body["logs"][0]["createdTime"], 7);
    }

    #[test]
    fn failures_carry_a_reason_and_no_output() {
        let f = RuntimeResult::failed("w0002", Reason::new("bad input: params: missing"));
        let body = f.to_conductor("wf", "t", "e", 0);
        assert_eq!(body["status"], "FAILED");
        assert_eq!(body["reasonForIncompletion"], "bad input: params: missing");
        assert!(body.get("outputData").is_none());
        let t = RuntimeResult::failed_terminal("w0002", Reason::new("pre guardrail failed"));
        assert_eq!(t.status(), ResultStatus::FailedWithTerminalError);
        assert_eq!(
            t.to_conductor("wf", "t", "e", 0)["status"],
            "FAILED_WITH_TERMINAL_ERROR"
        );
    }

    #[test]
    fn control_characters_are_written_out() {
        assert_eq!(
            Reason::new("a\u{1b}[31mred\rb\0c\u{85}d").as_str(),
            "a\\x1b[31mred\\rb\\0c\\x85d"
        );
        assert_eq!(
            Reason::with_tail("body failed", "line 1\nline\t2\u{7}").as_str(),
            "body failed: line 1\nline\t2\\x07"
        );
        assert!(matches!(
            escape_controls("plain\ttext\n"),
            std::borrow::Cow::Borrowed(_)
        ));
    }

    #[test]
    fn reasons_are_never_empty_and_never_over_500_chars() {
        assert_eq!(Reason::new("  ").as_str(), "failed without a reason");
        let long = "é".repeat(800);
        let r = Reason::new(long);
        assert_eq!(r.as_str().chars().count(), MAX_REASON_CHARS);
        assert!(r.as_str().ends_with('…'));
    }

    #[test]
    fn tail_is_cut_from_its_start_and_head_kept() {
        let head = "body exited with status 1";
        let tail: String = (0..200).map(|i| format!("line {i}\n")).collect();
        let r = Reason::with_tail(head, &tail);
        assert_eq!(r.as_str().chars().count(), MAX_REASON_CHARS);
        assert!(r.as_str().starts_with("body exited with status 1: …"));
        assert!(r.as_str().ends_with("line 199"));
        assert_eq!(
            Reason::with_tail("check failed", "  short\n").as_str(),
            "check failed: short"
        );
        assert_eq!(
            Reason::with_tail("check failed", "").as_str(),
            "check failed"
        );
        // A head that fills the budget leaves no room for a tail.
        let big = "x".repeat(600);
        assert_eq!(
            Reason::with_tail(&big, "tail").as_str().chars().count(),
            500
        );
    }
}
