//! The runtime result of one execution, and its Conductor `TaskResult` form.
//!
//! The invariants of SPEC §5 are in the types: `COMPLETED` carries output and no reason,
//! `FAILED`/`FAILED_WITH_TERMINAL_ERROR` carry a non-empty reason and no output, and every
//! result carries the worker id.

use crate::json::RawJson;
use serde_json::Value;
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

/// `text` cut to at most `max` characters (at least 2) on character boundaries: its start and
/// its end joined by `…`. A message names what was checked first and why it failed last (a
/// path, then the cause), so both ends are kept and the middle is what goes.
fn keep_both_ends(text: &str, max: usize) -> String {
    let count = text.chars().count();
    if count <= max {
        return text.to_owned();
    }
    let head = (max - 1) / 2;
    let tail = max - 1 - head;
    let mut out: String = text.chars().take(head).collect();
    out.push('…');
    out.extend(text.chars().skip(count - tail));
    out
}

/// The most of [`MAX_REASON_CHARS`] that the head of [`Reason::with_tail`] takes when there is
/// a tail: the rest is left to the tail, the cause.
const MAX_HEAD_WITH_TAIL_CHARS: usize = 300;

impl Reason {
    /// A reason from one message; an over-long message keeps its start (the check and field
    /// come first) and its end (the cause comes last), joined by `…`. Control characters are
    /// escaped.
    pub fn new(message: impl Into<String>) -> Self {
        let message = message.into();
        let message = escape_controls(&message);
        let message = message.trim();
        if message.is_empty() {
            return Self("failed without a reason".to_owned());
        }
        Self(keep_both_ends(message, MAX_REASON_CHARS))
    }

    /// A reason made of a head (which check failed, on which field) and a tail (such as the
    /// end of the body's stderr). The head is kept whole as far as possible (an over-long one
    /// keeps both its ends, within [`MAX_HEAD_WITH_TAIL_CHARS`]); the tail is cut from its
    /// start so its last, most telling lines survive.
    pub fn with_tail(head: &str, tail: &str) -> Self {
        let tail = escape_controls(tail);
        let tail = tail.trim();
        if tail.is_empty() {
            return Self::new(head);
        }
        let head = Self::new(head).0;
        let head = keep_both_ends(&head, MAX_HEAD_WITH_TAIL_CHARS);
        let sep = ": ";
        let room = MAX_REASON_CHARS - (head.chars().count() + sep.chars().count());
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
    /// Success, with the task output (`{"result": …}` or `{"workspace": …, "result": …}`),
    /// a JSON object kept as its text.
    Completed(RawJson),
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
    /// `COMPLETED` with output (a JSON object).
    pub fn completed(worker_id: impl Into<String>, output: RawJson) -> Self {
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

    /// The worker id and the outcome, taken apart.
    pub fn into_parts(self) -> (String, Outcome) {
        (self.worker_id, self.outcome)
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

    /// The Conductor `TaskResult` body for `POST /api/tasks` (or update-v2), as a `Value`.
    pub fn to_conductor(
        &self,
        workflow_instance_id: &str,
        task_id: &str,
        execution_id: &str,
        now_ms: i64,
    ) -> Value {
        self.clone()
            .into_conductor(workflow_instance_id, task_id, execution_id, now_ms)
            .to_value()
    }

    /// The Conductor `TaskResult` body for `POST /api/tasks` (or update-v2). The execution
    /// id goes into one `logs` entry so that a failure without output is still traceable to
    /// the execution that produced it. The output (which can be megabytes) is written into
    /// the body as the text it is, not parsed and written again.
    pub fn into_conductor(
        self,
        workflow_instance_id: &str,
        task_id: &str,
        execution_id: &str,
        now_ms: i64,
    ) -> TaskResultBody {
        use crate::json::push_string;
        let output_len = match &self.outcome {
            Outcome::Completed(output) => output.len(),
            Outcome::Failed(_) | Outcome::FailedTerminal(_) => 0,
        };
        // The same members in the same order as the `json!` object this replaced.
        let mut body = String::with_capacity(output_len + 512);
        body.push_str("{\"workflowInstanceId\":");
        push_string(&mut body, workflow_instance_id);
        body.push_str(",\"taskId\":");
        push_string(&mut body, task_id);
        body.push_str(",\"workerId\":");
        push_string(&mut body, &self.worker_id);
        body.push_str(",\"status\":\"");
        body.push_str(self.status().as_str());
        body.push_str("\",\"logs\":[{\"log\":");
        push_string(
            &mut body,
            &format!("perago execution {execution_id} by {}", self.worker_id),
        );
        body.push_str(",\"taskId\":");
        push_string(&mut body, task_id);
        body.push_str(",\"createdTime\":");
        body.push_str(&now_ms.to_string());
        body.push_str("}]");
        match self.outcome {
            Outcome::Completed(output) => {
                body.push_str(",\"outputData\":");
                body.push_str(output.as_str());
            }
            Outcome::Failed(reason) | Outcome::FailedTerminal(reason) => {
                body.push_str(",\"reasonForIncompletion\":");
                push_string(&mut body, &reason.0);
            }
        }
        body.push('}');
        TaskResultBody(bytes::Bytes::from(body))
    }
}

/// A Conductor `TaskResult` body, written once as JSON text; cheap to clone (a retried update
/// sends the same bytes again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskResultBody(bytes::Bytes);

impl TaskResultBody {
    /// The JSON text.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The JSON text, shared.
    pub fn to_bytes(&self) -> bytes::Bytes {
        self.0.clone()
    }

    /// Parsed into a `Value` (for tests and messages).
    pub fn to_value(&self) -> Value {
        std::str::from_utf8(&self.0)
            .ok()
            .and_then(|text| crate::json::from_str(text).ok())
            .expect("a result body is JSON")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn completed_carries_output_and_no_reason() {
        let out = crate::shape::workspace_free_output(RawJson::from_value(&json!({"n": 2})));
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
        assert_eq!(r.as_str().chars().filter(|c| *c == '…').count(), 1);
    }

    /// A long path in the middle of a message goes; what was checked and why it failed stay.
    #[test]
    fn an_over_long_reason_keeps_its_start_and_its_cause() {
        let path = format!("/w/attempts/e1/work/{}/out.txt", "deep/".repeat(200));
        let message =
            format!("publish failed: cannot upload {path}: permission denied (os error 13)");
        let r = Reason::new(message);
        assert_eq!(r.as_str().chars().count(), MAX_REASON_CHARS);
        assert!(
            r.as_str()
                .starts_with("publish failed: cannot upload /w/attempts/e1/work/deep/"),
            "{r}"
        );
        assert!(
            r.as_str()
                .ends_with("/out.txt: permission denied (os error 13)"),
            "{r}"
        );
        assert!(r.as_str().contains('…'));
        // Cut on character boundaries at both ends.
        let wide = format!("{}{}", "é".repeat(400), "ü".repeat(400));
        let r = Reason::new(wide);
        assert_eq!(r.as_str().chars().count(), MAX_REASON_CHARS);
        assert!(r.as_str().starts_with('é') && r.as_str().ends_with('ü'));
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
        // A head that would fill the budget keeps its ends and leaves room for the tail.
        let big = format!("check {} failed", "x".repeat(600));
        let r = Reason::with_tail(&big, "the cause");
        assert!(r.as_str().chars().count() <= MAX_REASON_CHARS);
        assert!(r.as_str().starts_with("check xxx"), "{r}");
        assert!(r.as_str().ends_with("x failed: the cause"), "{r}");
        let r = Reason::with_tail(&big, &"y".repeat(1000));
        assert_eq!(r.as_str().chars().count(), MAX_REASON_CHARS);
        assert!(r.as_str().ends_with("yyy"));
    }

    /// The body is the object the `json!` builder made before, member for member, and the
    /// output is in it as the text it came as.
    #[test]
    fn the_output_goes_into_the_body_as_it_came() {
        let text =
            r#"{"result": {"x": 1.0e2, "s": "\u00e9", "big": 123456789012345678901234567890}}"#;
        let output = RawJson::parse(text.to_owned()).unwrap();
        let body = RuntimeResult::completed("w\"1", output).into_conductor("wf", "t", "e-1", 7);
        let written = std::str::from_utf8(body.as_bytes()).unwrap();
        assert!(
            written.ends_with(&format!(r#","outputData":{text}}}"#)),
            "{written}"
        );
        let expected = json!({
            "workflowInstanceId": "wf", "taskId": "t", "workerId": "w\"1", "status": "COMPLETED",
            "logs": [{"log": "perago execution e-1 by w\"1", "taskId": "t", "createdTime": 7}],
            "outputData": crate::json::from_str(text).unwrap(),
        });
        assert_eq!(body.to_value(), expected);
        assert_eq!(
            serde_json::to_string(&body.to_value()).unwrap(),
            serde_json::to_string(&expected).unwrap(),
            "the members in the same order"
        );
        let failed = RuntimeResult::failed("w", Reason::new("bad \u{1b} \"input\""))
            .into_conductor("wf", "t", "e", -1);
        assert_eq!(
            failed.to_value(),
            json!({
                "workflowInstanceId": "wf", "taskId": "t", "workerId": "w", "status": "FAILED",
                "logs": [{"log": "perago execution e by w", "taskId": "t", "createdTime": -1}],
                "reasonForIncompletion": "bad \\x1b \"input\"",
            })
        );
    }
}
