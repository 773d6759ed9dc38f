//! Input and output shapes (SPEC §5): a workspace task's input is exactly
//! `{"workspace": {...}, "params": {...}}`, a workspace-free task's exactly `{"params": {...}}`;
//! outputs are `{"workspace": …, "result": …}` and `{"result": …}`.

use crate::json::{Kind, RawJson};
use crate::manifest::TaskKind;
use serde_json::Value;

/// What is wrong with a task's input. The message names the key first, since it becomes the
/// start of `reasonForIncompletion`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad input: {key}: {problem}")]
pub struct InputError {
    /// The offending key, e.g. `workspace.branch`.
    pub key: String,
    /// What is wrong.
    pub problem: String,
}

fn input_error(key: impl Into<String>, problem: impl Into<String>) -> InputError {
    InputError {
        key: key.into(),
        problem: problem.into(),
    }
}

/// Where a workspace task's files come from and go back to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceInput {
    /// lakeFS repository.
    pub repository: String,
    /// Branch to publish to.
    pub branch: String,
    /// Path prefix within the branch (normalized: empty, or ending with `/`).
    pub prefix: String,
    /// Ref to download from; `None` means the branch.
    pub source_ref: Option<String>,
}

/// A task input that passed the shape rules.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskInput<'a> {
    /// `params`, a JSON object, as its text within the input.
    pub params: &'a str,
    /// `workspace`, for workspace tasks.
    pub workspace: Option<WorkspaceInput>,
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Top-level input keys allowed beside the shape's: the W3C trace context of the caller, which
/// the broker makes the attempt's parent trace (docs/broker.md#traces). Any value passes (a
/// workflow that passes `${workflow.input.traceparent}` without one gives `null`): a bad trace
/// context starts a new trace and never fails the task.
pub const TRACE_CONTEXT_KEYS: [&str; 2] = ["traceparent", "tracestate"];

/// Checks `input` (a JSON object) against the shape of `kind`. `allowed_prefix` is the
/// manifest's `[workspace] prefix`: a workspace input may only narrow within it. Only the top
/// level and `workspace` are read; `params` stays text.
pub fn parse_input<'a>(
    kind: TaskKind,
    input: &'a RawJson,
    allowed_prefix: &str,
) -> Result<TaskInput<'a>, InputError> {
    let expected = kind.input_keys();
    let expected_text = || {
        let quoted: Vec<String> = expected.iter().map(|k| format!("'{k}'")).collect();
        format!("a {} task takes exactly {}", kind, quoted.join(" and "))
    };
    let members = crate::json::members(input.as_str()).map_err(|e| {
        input_error(
            "input",
            format!("must be a JSON object: {}", crate::errors::DisplayChain(&e)),
        )
    })?;
    let member = |key: &str| members.iter().find(|(k, _)| k == key).map(|(_, v)| *v);
    let mut unexpected: Vec<&str> = members
        .iter()
        .map(|(k, _)| &**k)
        .filter(|k| !expected.contains(k) && !TRACE_CONTEXT_KEYS.contains(k))
        .collect();
    unexpected.sort();
    if let Some(key) = unexpected.first() {
        return Err(input_error(
            *key,
            format!("unexpected key; {}", expected_text()),
        ));
    }
    for key in expected {
        if member(key).is_none() {
            return Err(input_error(*key, format!("missing; {}", expected_text())));
        }
    }
    let params = member("params").expect("checked above");
    match crate::json::kind(params) {
        Kind::Object => {}
        other => {
            return Err(input_error(
                "params",
                format!("must be a JSON object, found {}", other.described()),
            ));
        }
    }
    let workspace = match kind {
        TaskKind::WorkspaceFree => None,
        TaskKind::Workspace => {
            let text = member("workspace").expect("checked above");
            let value = crate::json::from_str(text)
                .map_err(|e| input_error("workspace", crate::errors::chain(&e)))?;
            Some(parse_workspace(&value, allowed_prefix)?)
        }
    };
    Ok(TaskInput { params, workspace })
}

fn parse_workspace(value: &Value, allowed_prefix: &str) -> Result<WorkspaceInput, InputError> {
    const KEYS: [&str; 4] = ["repository", "branch", "prefix", "ref"];
    let Value::Object(map) = value else {
        return Err(input_error(
            "workspace",
            format!(
                "must be a JSON object with repository, branch and prefix, found {}",
                json_type(value)
            ),
        ));
    };
    let mut unknown: Vec<&String> = map.keys().filter(|k| !KEYS.contains(&k.as_str())).collect();
    unknown.sort();
    if let Some(key) = unknown.first() {
        return Err(input_error(
            format!("workspace.{key}"),
            "unknown key; workspace takes repository, branch, prefix and ref",
        ));
    }
    let string = |key: &str, required: bool| -> Result<Option<String>, InputError> {
        match map.get(key) {
            None | Some(Value::Null) if required => {
                Err(input_error(format!("workspace.{key}"), "missing"))
            }
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(input_error(
                format!("workspace.{key}"),
                format!("must be a string, found {}", json_type(other)),
            )),
        }
    };
    let repository = string("repository", true)?.unwrap_or_default();
    let branch = string("branch", true)?.unwrap_or_default();
    let prefix = string("prefix", true)?.unwrap_or_default();
    let source_ref = string("ref", false)?;
    for (key, value) in [("repository", &repository), ("branch", &branch)] {
        if value.is_empty() {
            return Err(input_error(format!("workspace.{key}"), "must not be empty"));
        }
        if value.contains(['/', '\0']) || value.chars().any(char::is_whitespace) {
            return Err(input_error(
                format!("workspace.{key}"),
                format!("{value:?} is not a valid lakeFS {key} name"),
            ));
        }
    }
    // The branch is written to (the merge target): lakeFS takes only a branch id there, and
    // answers 400 to anything else (`main~1`, `v1.0`); a ref to read from goes in `ref`.
    if !is_lakefs_branch_id(&branch) {
        return Err(input_error(
            "workspace.branch",
            format!(
                "{branch:?} is not a valid lakeFS branch name (letters, digits, '_' and '-', not starting with '-'); to read from a tag, a commit or an expression such as main~1, set workspace.ref"
            ),
        ));
    }
    match source_ref.as_deref() {
        Some("") => return Err(input_error("workspace.ref", "must not be empty when set")),
        // lakeFS refuses a ref with whitespace on every route (`^[^\s]+$`).
        Some(r) if r.contains('\0') || r.chars().any(char::is_whitespace) => {
            return Err(input_error(
                "workspace.ref",
                format!("{r:?} is not a ref lakeFS accepts: a ref has no whitespace"),
            ));
        }
        _ => {}
    }
    let prefix =
        normalize_prefix(&prefix).map_err(|p| input_error("workspace.prefix", p.to_string()))?;
    if !prefix_within(&prefix, allowed_prefix) {
        return Err(input_error(
            "workspace.prefix",
            format!("{prefix:?} is outside the task's workspace prefix {allowed_prefix:?}"),
        ));
    }
    Ok(WorkspaceInput {
        repository,
        branch,
        prefix,
        source_ref,
    })
}

/// A lakeFS path prefix that cannot map onto a local folder.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrefixError {
    /// It holds a NUL character.
    #[error("must not contain a NUL character")]
    Nul,
    /// It starts with `/`.
    #[error("{prefix:?} must be relative (no leading '/')")]
    Absolute {
        /// The prefix as given.
        prefix: String,
    },
    /// It has an empty segment (`a//b`).
    #[error("{prefix:?} has an empty path segment")]
    EmptySegment {
        /// The prefix as given.
        prefix: String,
    },
    /// It has a `.` or `..` segment.
    #[error("{prefix:?} must not contain '.' or '..' segments")]
    DotSegment {
        /// The prefix as given.
        prefix: String,
    },
}

/// Whether `id` is a lakeFS branch id: `^\w[-\w]*$` with ASCII `\w` (Go's regexp), checked by
/// lakeFS on every branch route (`pkg/validator`, `pkg/graveler/validate.go`).
pub fn is_lakefs_branch_id(id: &str) -> bool {
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut bytes = id.bytes();
    bytes.next().is_some_and(word) && bytes.all(|b| word(b) || b == b'-')
}

/// Checks a lakeFS path prefix and normalizes it to `""` or `a/b/`. Absolute paths, `.` or
/// `..` segments, empty segments and NUL are refused: the prefix maps onto local folders.
pub fn normalize_prefix(prefix: &str) -> Result<String, PrefixError> {
    if prefix.is_empty() {
        return Ok(String::new());
    }
    if prefix.contains('\0') {
        return Err(PrefixError::Nul);
    }
    let owned = || prefix.to_owned();
    if prefix.starts_with('/') {
        return Err(PrefixError::Absolute { prefix: owned() });
    }
    let trimmed = prefix.strip_suffix('/').unwrap_or(prefix);
    for segment in trimmed.split('/') {
        match segment {
            "" => return Err(PrefixError::EmptySegment { prefix: owned() }),
            "." | ".." => return Err(PrefixError::DotSegment { prefix: owned() }),
            _ => {}
        }
    }
    Ok(format!("{trimmed}/"))
}

/// Whether normalized `prefix` lies within normalized `allowed` (both `""` or ending in `/`).
pub fn prefix_within(prefix: &str, allowed: &str) -> bool {
    prefix.starts_with(allowed)
}

/// The output of a completed workspace-free task: `{"result": …}`, the result written in as
/// the text it is (within its own buffer when it has room: a result can be megabytes).
pub fn workspace_free_output(result: RawJson) -> RawJson {
    let mut out = result.into_string();
    out.reserve(11);
    out.insert_str(0, "{\"result\":");
    out.push('}');
    RawJson::trusted(out)
}

/// The output of a completed workspace task: `{"workspace": …, "result": …}`.
pub fn workspace_output(workspace: &Value, result: RawJson) -> RawJson {
    let workspace = serde_json::to_string(workspace).expect("a Value always serializes");
    let mut out = result.into_string();
    out.reserve(workspace.len() + 25);
    out.insert_str(0, ",\"result\":");
    out.insert_str(0, &workspace);
    out.insert_str(0, "{\"workspace\":");
    out.push('}');
    RawJson::trusted(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What a parsed input holds, owned: `params` parsed, and `workspace`.
    #[derive(Debug)]
    struct Parsed {
        params: Value,
        workspace: Option<WorkspaceInput>,
    }

    fn parse(kind: TaskKind, v: &Value, allowed: &str) -> Result<Parsed, InputError> {
        let raw = RawJson::from_value(v);
        parse_input(kind, &raw, allowed).map(|input| Parsed {
            params: crate::json::from_str(input.params).unwrap(),
            workspace: input.workspace,
        })
    }

    fn free(v: Value) -> Result<Parsed, InputError> {
        parse(TaskKind::WorkspaceFree, &v, "")
    }

    fn ws(v: Value, allowed: &str) -> Result<Parsed, InputError> {
        parse(TaskKind::Workspace, &v, allowed)
    }

    #[test]
    fn workspace_free_takes_exactly_params() {
        let input = free(json!({"params": {"n": 1}})).unwrap();
        let missing = free(json!({})).unwrap_err();
        assert_eq!(
            (missing.key.as_str(), missing.problem.as_str()),
            (
                "params",
                "missing; a workspace-free task takes exactly 'params'"
            )
        );
        assert_eq!(input.params["n"], 1);
        assert_eq!(input.workspace, None);
        assert_eq!(
            free(json!({})).unwrap_err().to_string(),
            "bad input: params: missing; a workspace-free task takes exactly 'params'"
        );
        assert_eq!(
            free(json!({"params": {}, "extra": 1}))
                .unwrap_err()
                .to_string(),
            "bad input: extra: unexpected key; a workspace-free task takes exactly 'params'"
        );
        assert_eq!(
            free(json!({"params": {}, "workspace": {}}))
                .unwrap_err()
                .to_string(),
            "bad input: workspace: unexpected key; a workspace-free task takes exactly 'params'"
        );
        assert_eq!(
            free(json!({"params": [1]})).unwrap_err().to_string(),
            "bad input: params: must be a JSON object, found an array"
        );
        assert_eq!(
            free(json!({"params": null})).unwrap_err().to_string(),
            "bad input: params: must be a JSON object, found null"
        );
    }

    /// A caller's trace context rides beside the shape's keys, whatever it holds (the broker
    /// judges it, and a bad one only starts a new trace).
    #[test]
    fn a_trace_context_is_allowed_beside_the_shape() {
        for context in [
            json!({"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "a=1"}),
            json!({"traceparent": null, "tracestate": null}),
            json!({"traceparent": 5}),
        ] {
            let mut input = json!({"params": {"n": 1}});
            input
                .as_object_mut()
                .unwrap()
                .extend(context.as_object().unwrap().clone());
            assert_eq!(free(input.clone()).unwrap().params["n"], 1, "{input}");
            input["workspace"] = json!({"repository": "r", "branch": "main", "prefix": "data/"});
            assert!(ws(input.clone(), "data/").is_ok(), "{input}");
        }
        assert_eq!(
            free(json!({"params": {}, "traceparent": "x", "traceid": "y"}))
                .unwrap_err()
                .to_string(),
            "bad input: traceid: unexpected key; a workspace-free task takes exactly 'params'"
        );
    }

    #[test]
    fn workspace_takes_exactly_workspace_and_params() {
        let input = ws(
            json!({"params": {}, "workspace": {"repository": "repo", "branch": "main", "prefix": "data/in"}}),
            "",
        )
        .unwrap();
        assert_eq!(
            input.workspace,
            Some(WorkspaceInput {
                repository: "repo".into(),
                branch: "main".into(),
                prefix: "data/in/".into(),
                source_ref: None,
            })
        );
        assert_eq!(
            ws(json!({"params": {}}), "").unwrap_err().to_string(),
            "bad input: workspace: missing; a workspace task takes exactly 'workspace' and 'params'"
        );
        assert_eq!(
            ws(json!({"params": {}, "workspace": "repo"}), "")
                .unwrap_err()
                .to_string(),
            "bad input: workspace: must be a JSON object with repository, branch and prefix, found a string"
        );
    }

    #[test]
    fn workspace_fields_are_checked() {
        let base = |w: Value| ws(json!({"params": {}, "workspace": w}), "");
        assert_eq!(
            base(json!({"repository": "r", "branch": "main"}))
                .unwrap_err()
                .to_string(),
            "bad input: workspace.prefix: missing"
        );
        assert_eq!(
            base(json!({"repository": "r", "branch": "main", "prefix": "", "token": "x"}))
                .unwrap_err()
                .to_string(),
            "bad input: workspace.token: unknown key; workspace takes repository, branch, prefix and ref"
        );
        assert_eq!(
            base(json!({"repository": "", "branch": "main", "prefix": ""}))
                .unwrap_err()
                .to_string(),
            "bad input: workspace.repository: must not be empty"
        );
        assert_eq!(
            base(json!({"repository": "r", "branch": 5, "prefix": ""}))
                .unwrap_err()
                .to_string(),
            "bad input: workspace.branch: must be a string, found a number"
        );
        assert_eq!(
            base(json!({"repository": "r", "branch": "a/b", "prefix": ""}))
                .unwrap_err()
                .to_string(),
            "bad input: workspace.branch: \"a/b\" is not a valid lakeFS branch name"
        );
        assert_eq!(
            base(json!({"repository": "r", "branch": "main", "prefix": "../etc"}))
                .unwrap_err()
                .to_string(),
            "bad input: workspace.prefix: \"../etc\" must not contain '.' or '..' segments"
        );
        assert_eq!(
            base(json!({"repository": "r", "branch": "main", "prefix": "/etc"}))
                .unwrap_err()
                .to_string(),
            "bad input: workspace.prefix: \"/etc\" must be relative (no leading '/')"
        );
        assert_eq!(
            base(json!({"repository": "r", "branch": "main", "prefix": "", "ref": ""}))
                .unwrap_err()
                .to_string(),
            "bad input: workspace.ref: must not be empty when set"
        );
        for (branch, problem) in [
            ("main~1", "\"main~1\" is not a valid lakeFS branch name"),
            ("v1.0", "\"v1.0\" is not a valid lakeFS branch name"),
            ("-x", "\"-x\" is not a valid lakeFS branch name"),
        ] {
            let refused = base(json!({"repository": "r", "branch": branch, "prefix": ""}))
                .unwrap_err()
                .to_string();
            assert!(
                refused.starts_with(&format!("bad input: workspace.branch: {problem}"))
                    && refused.ends_with("set workspace.ref"),
                "{refused}"
            );
        }
        assert_eq!(
            base(json!({"repository": "r", "branch": "main", "prefix": "", "ref": "main 1"}))
                .unwrap_err()
                .to_string(),
            "bad input: workspace.ref: \"main 1\" is not a ref lakeFS accepts: a ref has no whitespace"
        );
        for accepted in ["main~1", "main@", "v1.0", "main^2", "a/b"] {
            let parsed = base(
                json!({"repository": "r", "branch": "main_2-x", "prefix": "", "ref": accepted}),
            )
            .unwrap();
            assert_eq!(
                parsed.workspace.unwrap().source_ref.as_deref(),
                Some(accepted)
            );
        }
        let with_ref =
            base(json!({"repository": "r", "branch": "main", "prefix": "", "ref": "abc123"}))
                .unwrap();
        assert_eq!(
            with_ref.workspace.unwrap().source_ref.as_deref(),
            Some("abc123")
        );
    }

    #[test]
    fn input_prefix_narrows_within_the_manifest_prefix() {
        let at = |prefix: &str| {
            ws(
                json!({"params": {}, "workspace": {"repository": "r", "branch": "main", "prefix": prefix}}),
                "features/",
            )
        };
        assert!(at("features").is_ok());
        assert!(at("features/2026/").is_ok());
        assert_eq!(
            at("featuresX/a").unwrap_err().to_string(),
            "bad input: workspace.prefix: \"featuresX/a/\" is outside the task's workspace prefix \"features/\""
        );
        assert_eq!(
            at("").unwrap_err().to_string(),
            "bad input: workspace.prefix: \"\" is outside the task's workspace prefix \"features/\""
        );
    }

    #[test]
    fn prefixes_normalize() {
        assert_eq!(normalize_prefix(""), Ok(String::new()));
        assert_eq!(normalize_prefix("a"), Ok("a/".into()));
        assert_eq!(normalize_prefix("a/b/"), Ok("a/b/".into()));
        assert!(matches!(
            normalize_prefix("a//b"),
            Err(PrefixError::EmptySegment { ref prefix }) if prefix == "a//b"
        ));
        assert!(matches!(
            normalize_prefix("a/./b"),
            Err(PrefixError::DotSegment { .. })
        ));
        assert!(matches!(normalize_prefix("a\0"), Err(PrefixError::Nul)));
        let absolute = normalize_prefix("/a").unwrap_err();
        assert!(matches!(absolute, PrefixError::Absolute { .. }));
        assert_eq!(
            absolute.to_string(),
            "\"/a\" must be relative (no leading '/')"
        );
    }

    #[test]
    fn outputs_have_the_documented_keys() {
        assert_eq!(
            workspace_free_output(RawJson::from_value(&json!(1))).as_str(),
            r#"{"result":1}"#
        );
        assert_eq!(
            workspace_output(
                &json!({"commit_id": "c"}),
                RawJson::from_value(&json!(null))
            )
            .as_str(),
            r#"{"workspace":{"commit_id":"c"},"result":null}"#
        );
        // The result goes in as the text it is: no number or escape is rewritten.
        let result = RawJson::parse(r#"{"x": 1.0e2, "s": "\u00e9"}"#.to_owned()).unwrap();
        assert_eq!(
            workspace_free_output(result).as_str(),
            r#"{"result":{"x": 1.0e2, "s": "\u00e9"}}"#
        );
    }
}
