//! The lines of the `jsonl` protocol: the request line written for an assignment, and the
//! answer line read back, checked (see [`super`] for the exchange around them).

use perago_core::json::{Kind, RawJson};
use serde_json::{Value, json};

/// The failure when the process closed its stdout (usually: it is exiting).
const STDOUT_CLOSED: &str = "the body process closed its stdout";

/// What the request line of one assignment carries.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request<'a> {
    pub(crate) execution_id: &'a str,
    pub(crate) task_id: &'a str,
    pub(crate) workflow_id: &'a str,
    pub(crate) worker_id: &'a str,
    /// A JSON object's text, written in as it is.
    pub(crate) params: &'a str,
    pub(crate) workspace_dir: Option<&'a str>,
    /// The body span's W3C context, while the broker exports traces: written as
    /// `"traceparent"` (and `"tracestate"` when there is one) after `workspace_dir`; absent
    /// otherwise.
    pub(crate) traceparent: Option<&'a str>,
    pub(crate) tracestate: Option<&'a str>,
}

impl Request<'_> {
    /// Writes the request line into `line`, newline included:
    /// `{"execution_id": …, "task_id": …, "workflow_id": …, "worker_id": …, "params": …,
    /// "workspace_dir": …}` (members in this order), `params` as the text it is.
    pub(super) fn write(&self, line: &mut String) {
        use perago_core::json::push_string;
        line.reserve(self.params.len() + 256);
        line.push_str("{\"execution_id\":");
        push_string(line, self.execution_id);
        line.push_str(",\"task_id\":");
        push_string(line, self.task_id);
        line.push_str(",\"workflow_id\":");
        push_string(line, self.workflow_id);
        line.push_str(",\"worker_id\":");
        push_string(line, self.worker_id);
        line.push_str(",\"params\":");
        line.push_str(self.params);
        line.push_str(",\"workspace_dir\":");
        match self.workspace_dir {
            Some(dir) => push_string(line, dir),
            None => line.push_str("null"),
        }
        if let Some(traceparent) = self.traceparent {
            line.push_str(",\"traceparent\":");
            push_string(line, traceparent);
            if let Some(tracestate) = self.tracestate {
                line.push_str(",\"tracestate\":");
                push_string(line, tracestate);
            }
        }
        line.push_str("}\n");
    }
}

/// A break of the line protocol: the body process cannot be talked to, or answered with a
/// line that is not an answer for this execution.
#[derive(Debug, thiserror::Error)]
pub(super) enum ProtocolError {
    /// The request line cannot be written.
    #[error("cannot write to the body process")]
    Write(#[source] std::io::Error),
    /// The body closed its stdout (it is exiting, as a rule).
    #[error("{STDOUT_CLOSED}")]
    StdoutClosed,
    /// The answer line cannot be read.
    #[error("cannot read from the body process")]
    Read(#[source] std::io::Error),
    /// The line is not JSON (or too deep, or a number out of range).
    #[error("the body process wrote a line that is not JSON ({cause}): {start}")]
    NotJson {
        /// The parser's error (mid-sentence: in the message, not a source; it has none).
        cause: perago_core::json::JsonError,
        /// The line's first 120 characters.
        start: String,
    },
    /// The answer names another execution.
    #[error("the body process answered for execution {answered_for}, not {execution_id}")]
    OtherExecution {
        /// The line's `execution_id` (null when it has none).
        answered_for: Value,
        /// The execution asked for.
        execution_id: String,
    },
    /// The answer has no `result` and no `error` object.
    #[error("the body process answered with neither result nor error")]
    NoAnswer,
    /// The answer has both.
    #[error("the body process answered with both result and error")]
    ResultAndError,
    /// The error's `terminal` is there but not a boolean.
    #[error("the body process answered with an error whose terminal is not true or false: {0}")]
    BadTerminal(String),
    /// More came with the answer: a second line, read with it.
    #[error(
        "the body process wrote more than its answer for execution {execution_id} ({bytes} bytes after it)"
    )]
    MoreThanTheAnswer {
        /// The execution answered.
        execution_id: String,
        /// The bytes after the answer's line.
        bytes: usize,
    },
    /// The process ended or closed its stdin with the whole request still unread.
    #[error("the body process {why} before it took the request")]
    NotTaken {
        /// What it did: `exited`, `closed its stdin`.
        why: &'static str,
    },
    /// The answer line is longer than any answer Conductor could take.
    #[error(
        "the body process wrote an answer line of more than {limit} bytes; Conductor takes at most {} bytes of task output (maxTaskOutputPayloadSizeThreshold, 10240 KB)",
        crate::assignment::MAX_OUTPUT_BYTES
    )]
    LineTooLong {
        /// The longest line read, its newline included.
        limit: usize,
    },
    /// No answer within the assignment's time limit.
    #[error("body timed out after {seconds}s (task.timeout_seconds) and was stopped")]
    TimedOut {
        /// The limit, whole seconds rounded up.
        seconds: f64,
    },
}

/// A well-formed answer.
#[derive(Debug)]
pub(super) enum Answer {
    /// `result`, as the text the body wrote.
    Result(RawJson),
    /// `error`: its message, and whether it is terminal.
    Error {
        /// `message` (a default when there is none).
        message: String,
        /// `terminal` (false when there is none).
        terminal: bool,
    },
}

/// Checks the response line read for `execution_id`: whole, as it would be parsed (depth,
/// syntax, numbers: the same errors), then only its top level is read; `result` is kept as
/// the text it is.
pub(super) fn answer(answer: &str, execution_id: &str) -> Result<Answer, ProtocolError> {
    let not_json = |source: perago_core::json::JsonError| ProtocolError::NotJson {
        cause: source,
        start: answer.chars().take(120).collect(),
    };
    perago_core::json::check(answer).map_err(not_json)?;
    // Anything but an object has no members (its `execution_id` reads as null).
    let members = match perago_core::json::kind(answer) {
        Kind::Object => perago_core::json::members(answer).map_err(not_json)?,
        _ => Vec::new(),
    };
    let member = |key: &str| members.iter().find(|(k, _)| k == key).map(|(_, v)| *v);
    let parsed = |text: &str| perago_core::json::from_str(text).map_err(not_json);
    let answered_for = member("execution_id").map_or(Ok(Value::Null), parsed)?;
    if answered_for != json!(execution_id) {
        return Err(ProtocolError::OtherExecution {
            answered_for,
            execution_id: execution_id.to_owned(),
        });
    }
    let result = member("result");
    // A null error beside a result is how some serializers write "no error".
    let error = member("error").filter(|e| perago_core::json::kind(e) != Kind::Null);
    match (result, error) {
        (Some(_), Some(_)) => Err(ProtocolError::ResultAndError),
        (Some(result), None) => {
            // Room for the output's `{"result":` and `}` around it (see `workspace_free_output`).
            let mut text = String::with_capacity(result.len() + 16);
            text.push_str(result);
            Ok(Answer::Result(RawJson::trusted(text)))
        }
        (None, Some(error)) if perago_core::json::kind(error) == Kind::Object => {
            let error = parsed(error)?;
            let terminal = match error.get("terminal") {
                None => false,
                Some(Value::Bool(terminal)) => *terminal,
                Some(other) => {
                    return Err(ProtocolError::BadTerminal(
                        other.to_string().chars().take(120).collect(),
                    ));
                }
            };
            let message = error["message"]
                .as_str()
                .unwrap_or("the body reported an error without a message")
                .to_owned();
            Ok(Answer::Error { message, terminal })
        }
        _ => Err(ProtocolError::NoAnswer),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The body protocol's errors with a cause render as before (see `perago_core::errors`).
    #[test]
    fn errors_render_as_before() {
        use perago_core::errors::{chain, repeated_cause};
        let cases = [
            (
                ProtocolError::Write(std::io::Error::from(std::io::ErrorKind::BrokenPipe)),
                "cannot write to the body process: broken pipe",
            ),
            (
                ProtocolError::Read(std::io::Error::other("reset")),
                "cannot read from the body process: reset",
            ),
            (
                ProtocolError::NotJson {
                    cause: perago_core::json::JsonError::Syntax("expected value".to_owned()),
                    start: "oops".to_owned(),
                },
                "the body process wrote a line that is not JSON (expected value): oops",
            ),
        ];
        for (error, text) in cases {
            assert_eq!(chain(&error), text);
            assert_eq!(repeated_cause(&error), None, "{text}");
        }
    }

    fn request_line(
        execution_id: &str,
        task_id: &str,
        workflow_id: &str,
        worker_id: &str,
        params: &str,
        workspace_dir: Option<&str>,
    ) -> String {
        let mut line = String::new();
        Request {
            execution_id,
            task_id,
            workflow_id,
            worker_id,
            params,
            workspace_dir,
            traceparent: None,
            tracestate: None,
        }
        .write(&mut line);
        line
    }

    /// While traced, the request carries the body span's context after `workspace_dir`;
    /// `tracestate` only with a `traceparent`.
    #[test]
    fn a_traced_request_carries_the_trace_context() {
        let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut line = String::new();
        let request = Request {
            execution_id: "e",
            task_id: "t",
            workflow_id: "w",
            worker_id: "k",
            params: "{}",
            workspace_dir: None,
            traceparent: Some(traceparent),
            tracestate: Some("a=1"),
        };
        request.write(&mut line);
        let value: serde_json::Value = serde_json::from_str(&line).expect("a JSON line");
        assert_eq!(value["traceparent"], traceparent);
        assert_eq!(value["tracestate"], "a=1");
        line.clear();
        Request {
            traceparent: None,
            ..request
        }
        .write(&mut line);
        let value: serde_json::Value = serde_json::from_str(&line).expect("a JSON line");
        assert!(value.get("traceparent").is_none() && value.get("tracestate").is_none());
    }

    /// The request line is the object the `json!` builder made before, member for member,
    /// with the params in it as the text they came as.
    #[test]
    fn the_request_line_carries_the_params_as_they_came() {
        let params = r#"{"x": 1.0e2, "s": "\u00e9", "big": 123456789012345678901234567890}"#;
        for dir in [None, Some("/w/\"dir\"")] {
            let line = request_line("e-1", "t-1", "wf-1", "w\n1", params, dir);
            assert!(line.ends_with('\n'));
            assert!(line.contains(&format!(r#","params":{params},"#)), "{line}");
            let expected = json!({
                "execution_id": "e-1",
                "task_id": "t-1",
                "workflow_id": "wf-1",
                "worker_id": "w\n1",
                "params": perago_core::json::from_str(params).unwrap(),
                "workspace_dir": dir,
            });
            let parsed = perago_core::json::from_str(line.trim_end()).unwrap();
            assert_eq!(parsed, expected);
            assert_eq!(
                serde_json::to_string(&parsed).unwrap(),
                serde_json::to_string(&expected).unwrap(),
                "the members in the same order"
            );
        }
        // Compact params give the very line `json!` gave.
        let line = request_line("e", "t", "wf", "w", r#"{"n":[1,"a"]}"#, None);
        let before = json!({
            "execution_id": "e", "task_id": "t", "workflow_id": "wf", "worker_id": "w",
            "params": {"n": [1, "a"]}, "workspace_dir": Value::Null,
        });
        assert_eq!(line, format!("{before}\n"));
    }

    fn read(line: &str) -> Result<Answer, ProtocolError> {
        answer(line, "e-1")
    }

    /// The result is kept as the body wrote it, byte for byte.
    #[test]
    fn a_result_is_kept_as_the_body_wrote_it() {
        let result = r#"{"x": 1.0e2, "s": "\u00e9", "big": 123456789012345678901234567890}"#;
        let line = format!(r#"{{"execution_id": "e-1", "result": {result}, "extra": 1}}"#);
        match read(&line) {
            Ok(Answer::Result(raw)) => assert_eq!(raw.as_str(), result),
            other => panic!("{other:?}"),
        }
        // A null result is a result.
        assert!(matches!(
            read(r#"{"execution_id": "e-1", "result": null}"#),
            Ok(Answer::Result(raw)) if raw.as_str() == "null"
        ));
        match read(r#"{"execution_id": "e-1", "error": {"message": "no", "terminal": true}}"#) {
            Ok(Answer::Error { message, terminal }) => {
                assert_eq!((message.as_str(), terminal), ("no", true));
            }
            other => panic!("{other:?}"),
        }
    }

    /// `result` with a (non-null) `error` is no answer; `terminal` is a boolean or absent.
    #[test]
    fn an_answer_is_a_result_or_an_error_with_a_boolean_terminal() {
        assert!(matches!(
            read(r#"{"execution_id": "e-1", "result": 1, "error": {"message": "x"}}"#),
            Err(ProtocolError::ResultAndError)
        ));
        assert!(matches!(
            read(r#"{"execution_id": "e-1", "result": null, "error": {}}"#),
            Err(ProtocolError::ResultAndError)
        ));
        assert!(matches!(
            read(r#"{"execution_id": "e-1", "result": 2, "error": null}"#),
            Ok(Answer::Result(raw)) if raw.as_str() == "2"
        ));
        for terminal in [r#""yes""#, "1", "null", "[]", r#"{"a": 1}"#] {
            let line = format!(
                r#"{{"execution_id": "e-1", "error": {{"message": "m", "terminal": {terminal}}}}}"#
            );
            let e = read(&line).unwrap_err();
            assert!(
                matches!(e, ProtocolError::BadTerminal(_)),
                "{terminal}: {e:?}"
            );
            assert_eq!(
                e.to_string(),
                format!(
                    "the body process answered with an error whose terminal is not true or false: {}",
                    perago_core::json::from_str(terminal).unwrap()
                )
            );
        }
        assert!(matches!(
            read(r#"{"execution_id": "e-1", "error": {"message": "m"}}"#),
            Ok(Answer::Error { ref message, terminal: false }) if message == "m"
        ));
        assert!(matches!(
            read(r#"{"execution_id": "e-1", "error": {"terminal": false}}"#),
            Ok(Answer::Error { ref message, terminal: false })
                if message == "the body reported an error without a message"
        ));
    }

    /// Lines that are not JSON, too deep, or not an answer for this execution fail with the
    /// messages they failed with before.
    #[test]
    fn a_bad_answer_fails_as_before() {
        let deep = format!(
            r#"{{"execution_id": "e-1", "result": {}1{}}}"#,
            "[".repeat(1000),
            "]".repeat(1000)
        );
        for line in [
            deep.as_str(),
            "this is not json",
            r#"{"result": 1e400}"#,
            "[1,",
        ] {
            let e = perago_core::json::from_str(line).unwrap_err();
            assert_eq!(
                read(line).unwrap_err().to_string(),
                format!(
                    "the body process wrote a line that is not JSON ({e}): {}",
                    line.chars().take(120).collect::<String>()
                )
            );
        }
        assert_eq!(
            read(r#"{"execution_id": "e-2", "result": 1}"#)
                .unwrap_err()
                .to_string(),
            "the body process answered for execution \"e-2\", not e-1"
        );
        assert_eq!(
            read(r#"{"execution_id": {"a": [1, 2]}, "result": 1}"#)
                .unwrap_err()
                .to_string(),
            r#"the body process answered for execution {"a":[1,2]}, not e-1"#
        );
        assert_eq!(
            read("[1]").unwrap_err().to_string(),
            "the body process answered for execution null, not e-1"
        );
        assert_eq!(
            read(r#"{"result": 1}"#).unwrap_err().to_string(),
            "the body process answered for execution null, not e-1"
        );
        for line in [
            r#"{"execution_id": "e-1"}"#,
            r#"{"execution_id": "e-1", "error": "no"}"#,
        ] {
            assert_eq!(
                read(line).unwrap_err().to_string(),
                "the body process answered with neither result nor error"
            );
            assert!(matches!(answer(line, "e-1"), Err(ProtocolError::NoAnswer)));
        }
        assert!(matches!(
            answer("[1,", "e-1"),
            Err(ProtocolError::NotJson { .. })
        ));
        assert!(matches!(
            answer(r#"{"execution_id": "e-2", "result": 1}"#, "e-1"),
            Err(ProtocolError::OtherExecution { ref answered_for, .. }) if *answered_for == json!("e-2")
        ));
    }
}
