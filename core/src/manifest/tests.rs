//! Every manifest rule, with its exact message.

use super::*;
use std::path::{Path, PathBuf};

const MINIMAL: &str = r#"
[task]
name = "features.build"
kind = "workspace-free"
timeout_seconds = 600

[body]
command = ["python3", "-u", "build.py"]
"#;

fn dir() -> PathBuf {
    PathBuf::from("/srv/tasks")
}

fn parse(text: &str) -> Result<Manifest, ManifestError> {
    Manifest::parse(Path::new("task.toml"), &dir(), text)
}

/// The error lines, without the `manifest task.toml: ` prefix.
fn problems(text: &str) -> Vec<String> {
    match parse(text) {
        Ok(_) => panic!("manifest unexpectedly valid:\n{text}"),
        Err(ManifestError::Invalid { problems, .. }) => {
            problems.iter().map(ToString::to_string).collect()
        }
        Err(other) => vec![other.to_string()],
    }
}

fn one_problem(text: &str) -> String {
    let mut all = problems(text);
    assert_eq!(all.len(), 1, "expected one problem, got {all:#?}");
    all.remove(0)
}

/// MINIMAL with `line` added to the table `table`.
fn with(table: &str, line: &str) -> String {
    MINIMAL.replacen(&format!("[{table}]\n"), &format!("[{table}]\n{line}\n"), 1)
}

#[test]
fn minimal_manifest_gets_conductor_defaults() {
    let m = parse(MINIMAL).unwrap();
    assert_eq!(m.dir, dir());
    assert_eq!(
        m.task,
        TaskSpec {
            name: "features.build".into(),
            kind: TaskKind::WorkspaceFree,
            description: None,
            owner_email: None,
            timeout_seconds: 600,
            response_timeout_seconds: 600,
            retry_count: 3,
            retry_logic: RetryLogic::Fixed,
            retry_delay_seconds: 60,
            timeout_policy: TimeoutPolicy::TimeOutWorkflow,
            params_schema: None,
            result_schema: None,
            concurrency: None,
        }
    );
    assert_eq!(
        m.body,
        BodySpec {
            kind: BodyKind::Command {
                argv: vec!["python3".into(), "-u".into(), "build.py".into()],
                protocol: BodyProtocol::Exec,
            },
            env: Default::default(),
            user: None,
            soft_time_limit: None,
            memory_limit: None,
        }
    );
    assert_eq!(m.guardrails, Guardrails::default());
    assert_eq!(m.workspace, None);
}

#[test]
fn full_workspace_manifest() {
    let text = r#"
[task]
name = "features.build"
kind = "workspace"
description = "Build features"
owner_email = "data@example.com"
timeout_seconds = 3600
retry_count = 5
retry_logic = "EXPONENTIAL_BACKOFF"
retry_delay_seconds = 5
timeout_policy = "RETRY"

[body]
command = ["./build.sh"]
protocol = "jsonl"
env = { MODE = "fast" }

[guardrails]
pre = ["./check_inputs.sh", "--strict"]
post = ["./check_outputs.sh"]

[workspace]
prefix = "features"

[workspace.publish_budget]
max_objects = 10000
max_bytes = "2GiB"
seconds = 300

[workspace.download_budget]
max_objects = 50000
max_bytes = "8GiB"
"#;
    let m = parse(text).unwrap();
    assert_eq!(m.task.kind, TaskKind::Workspace);
    assert_eq!(
        m.task.response_timeout_seconds, 300,
        "derived from the budget"
    );
    assert_eq!(m.task.retry_logic, RetryLogic::ExponentialBackoff);
    assert_eq!(m.task.timeout_policy, TimeoutPolicy::Retry);
    assert_eq!(m.task.owner_email.as_deref(), Some("data@example.com"));
    assert_eq!(
        m.body.kind,
        BodyKind::Command {
            argv: vec!["./build.sh".into()],
            protocol: BodyProtocol::Jsonl
        }
    );
    assert_eq!(m.body.env["MODE"], "fast");
    assert_eq!(
        m.guardrails.pre,
        Some(vec!["./check_inputs.sh".into(), "--strict".into()])
    );
    assert_eq!(
        m.workspace,
        Some(WorkspaceSpec {
            prefix: "features/".into(),
            merge_timeout_seconds: 300,
            publish_budget: Some(PublishBudget {
                max_objects: Some(10_000),
                max_bytes: Some(2 << 30),
                seconds: Some(300),
            }),
            download_budget: Some(DownloadBudget {
                max_objects: Some(50_000),
                max_bytes: Some(8 << 30),
            }),
        })
    );
}

#[test]
fn workspace_defaults_without_a_workspace_table() {
    let m = parse(&MINIMAL.replace("workspace-free", "workspace")).unwrap();
    assert_eq!(
        m.workspace,
        Some(WorkspaceSpec {
            prefix: String::new(),
            merge_timeout_seconds: DEFAULT_MERGE_TIMEOUT_SECONDS,
            publish_budget: None,
            download_budget: None,
        })
    );
}

#[test]
fn default_response_timeout_is_capped_by_timeout() {
    let m = parse(&MINIMAL.replace("timeout_seconds = 600", "timeout_seconds = 0")).unwrap();
    assert_eq!(m.task.response_timeout_seconds, 3600);
    let m = parse(&MINIMAL.replace("timeout_seconds = 600", "timeout_seconds = 7200")).unwrap();
    assert_eq!(m.task.response_timeout_seconds, 3600);
    let m = parse(&with("task", "response_timeout_seconds = 30")).unwrap();
    assert_eq!(m.task.response_timeout_seconds, 30);
}

#[test]
fn executor_body_resolves_against_the_folder() {
    let text = MINIMAL.replace(
        r#"command = ["python3", "-u", "build.py"]"#,
        r#"executor = "target/release/my-task"
env = { RUST_LOG = "info" }"#,
    );
    let m = parse(&text).unwrap();
    assert_eq!(
        m.body.kind,
        BodyKind::Executor(dir().join("target/release/my-task"))
    );
}

#[test]
fn syntax_errors_carry_line_and_column() {
    let err = parse("[task]\nname = \n").unwrap_err().to_string();
    assert_eq!(
        err,
        "manifest task.toml:2:8: not valid TOML: string values must be quoted, expected literal string"
    );
    // One line, never an echo of the offending source line, however long it is.
    let long = format!("[task]\nname = \"x\" {}\n", "y".repeat(1 << 20));
    let err = parse(&long).unwrap_err().to_string();
    assert!(!err.contains('\n'), "{err}");
    assert!(err.len() < 300, "{} bytes", err.len());
    assert!(
        err.starts_with("manifest task.toml:2:12: not valid TOML: "),
        "{err}"
    );
}

#[test]
fn exactly_one_task() {
    assert_eq!(
        problems("[body]\ncommand = [\"x\"]\n"),
        ["task: missing [task] table: a manifest defines exactly one task"]
    );
    let two = r#"
[[task]]
name = "a"
[[task]]
name = "b"
[body]
command = ["x"]
"#;
    assert_eq!(
        one_problem(two),
        "task: a manifest defines exactly one task in a [task] table, found 2 [[task]] entries; run one supervisor per task"
    );
    assert_eq!(
        one_problem("task = \"features.build\"\n[body]\ncommand = [\"x\"]\n"),
        "task: expected a table, found a string"
    );
}

#[test]
fn required_task_keys() {
    let text = "[task]\n[body]\ncommand = [\"x\"]\n";
    assert_eq!(
        problems(text),
        [
            "task.name: missing (the Conductor TaskDef name)",
            "task.kind: missing (\"workspace\" or \"workspace-free\")",
            "task.timeout_seconds: missing (seconds the body may run, Conductor's timeoutSeconds; 0 = no limit)",
        ]
    );
}

#[test]
fn task_key_types_and_ranges() {
    let cases = [
        (
            "retry_count = -1",
            "task.retry_count: must be at least 0, found -1",
        ),
        (
            "retry_count = \"3\"",
            "task.retry_count: expected an integer, found a string",
        ),
        (
            "retry_delay_seconds = 1.5",
            "task.retry_delay_seconds: expected an integer, found a float",
        ),
        (
            "response_timeout_seconds = 0",
            "task.response_timeout_seconds: must be at least 1, found 0",
        ),
        (
            "retry_logic = \"fixed\"",
            "task.retry_logic: unknown value \"fixed\" (expected one of FIXED, EXPONENTIAL_BACKOFF, LINEAR_BACKOFF)",
        ),
        (
            "timeout_policy = \"NEVER\"",
            "task.timeout_policy: unknown value \"NEVER\" (expected one of RETRY, TIME_OUT_WF, ALERT_ONLY)",
        ),
        (
            "owner_email = \"nobody\"",
            "task.owner_email: \"nobody\" is not an email address",
        ),
        (
            "description = 5",
            "task.description: expected a string, found an integer",
        ),
        (
            "retries = 3",
            "task.retries: unknown key (keys of [task]: concurrency_group, concurrency_limit, cost_units, description, kind, name, owner_email, params_schema, response_timeout_seconds, result_schema, retry_count, retry_delay_seconds, retry_logic, timeout_policy, timeout_seconds)",
        ),
    ];
    for (line, expected) in cases {
        assert_eq!(one_problem(&with("task", line)), expected, "{line}");
    }
    assert_eq!(
        one_problem(&MINIMAL.replace("workspace-free", "free")),
        "task.kind: unknown value \"free\" (expected one of workspace, workspace-free)"
    );
    assert_eq!(
        one_problem(&MINIMAL.replace("timeout_seconds = 600", "timeout_seconds = -5")),
        "task.timeout_seconds: must be at least 0, found -5"
    );
}

#[test]
fn task_names_that_would_become_bad_paths() {
    for (name, problem) in [
        ("", "must not be empty"),
        (
            "a/b",
            "must not contain '/' (the name becomes a folder name)",
        ),
        (
            "a..b",
            "must not contain '..' (the name becomes a folder name)",
        ),
        ("a b", "must not contain whitespace or control characters"),
        ("a\\u0000b", "must not contain a NUL character"),
    ] {
        let text = MINIMAL.replace("\"features.build\"", &format!("\"{name}\""));
        let shown = name.replace("\\u0000", "\\0");
        assert_eq!(
            one_problem(&text),
            format!("task.name: \"{shown}\" {problem}"),
            "{name}"
        );
    }
}

#[test]
fn timeout_below_response_timeout_is_rejected() {
    assert_eq!(
        one_problem(&with("task", "response_timeout_seconds = 900")),
        "task.timeout_seconds: 600 is less than the response timeout 900 (from task.response_timeout_seconds); Conductor rejects a TaskDef whose timeoutSeconds is below responseTimeoutSeconds"
    );
    let text = MINIMAL.replace("workspace-free", "workspace")
        + "[workspace.publish_budget]\nseconds = 1200\n";
    assert_eq!(
        one_problem(&text),
        "task.timeout_seconds: 600 is less than the response timeout 1200 (from workspace.publish_budget.seconds); Conductor rejects a TaskDef whose timeoutSeconds is below responseTimeoutSeconds"
    );
}

#[test]
fn budget_seconds_and_response_timeout_are_exclusive() {
    let text = with("task", "response_timeout_seconds = 60").replace("workspace-free", "workspace")
        + "[workspace.publish_budget]\nseconds = 300\n";
    assert_eq!(
        one_problem(&text),
        "task.response_timeout_seconds: cannot be set together with workspace.publish_budget.seconds, which derives it"
    );
}

#[test]
fn body_rules() {
    let no_body = "[task]\nname = \"t\"\nkind = \"workspace-free\"\ntimeout_seconds = 1\n";
    assert_eq!(
        one_problem(no_body),
        "body: missing [body] table: set body.command (or body.executor)"
    );
    let body = |b: &str| format!("{no_body}[body]\n{b}\n");
    let cases = [
        (
            "",
            "body.command: missing (the command that runs the task, e.g. [\"python3\", \"-u\", \"task.py\"]; or set body.executor)",
        ),
        (
            "command = []",
            "body.command: must name a command: the array is empty",
        ),
        (
            "command = \"python3 build.py\"",
            "body.command: expected an array of strings (a command and its arguments), found a string",
        ),
        (
            "command = [\"python3\", 1]",
            "body.command[1]: expected a string, found an integer",
        ),
        (
            "command = [\"\"]",
            "body.command[0]: the command name is empty",
        ),
        (
            "command = [\"x\"]\nexecutor = \"bin/x\"",
            "body: set either body.command or body.executor, not both",
        ),
        (
            "executor = \"bin/x\"\nprotocol = \"exec\"",
            "body.protocol: applies only to body.command; an executor binary speaks the slot protocol itself",
        ),
        ("executor = \"\"", "body.executor: must not be empty"),
        (
            "command = [\"x\"]\nprotocol = \"grpc\"",
            "body.protocol: unknown value \"grpc\" (expected one of exec, jsonl)",
        ),
        (
            "command = [\"x\"]\nenv = { PERAGO_WORKER_ID = \"w\" }",
            "body.env.PERAGO_WORKER_ID: PERAGO_* variables are set by the runtime and cannot be overridden",
        ),
        (
            "command = [\"x\"]\nenv = { \"A=B\" = \"w\" }",
            "body.env.A=B: is not a valid environment variable name",
        ),
        (
            "command = [\"x\"]\nenv = { N = 1 }",
            "body.env.N: expected a string, found an integer",
        ),
        (
            "command = [\"x\"]\nenv = \"A=1\"",
            "body.env: expected a table, found a string",
        ),
        (
            "command = [\"x\"]\ncwd = \"/tmp\"",
            "body.cwd: unknown key (keys of [body]: command, env, executor, memory_limit, protocol, soft_time_limit, user)",
        ),
    ];
    for (b, expected) in cases {
        assert_eq!(one_problem(&body(b)), expected, "{b}");
    }
}

#[test]
fn memory_limit_is_a_size_of_at_least_4mib_for_a_command_body() {
    let m = parse(&with("body", "memory_limit = \"2GiB\"")).unwrap();
    assert_eq!(m.body.memory_limit, Some(2 << 30));
    let m = parse(&with("body", "memory_limit = 67108864")).unwrap();
    assert_eq!(m.body.memory_limit, Some(64 << 20));
    let m = parse(&with("body", "memory_limit = \"64 MB\"")).unwrap();
    assert_eq!(m.body.memory_limit, Some(64_000_000));
    let cases = [
        (
            "memory_limit = \"2 gigs\"",
            "body.memory_limit: invalid byte size \"2 gigs\": unknown unit (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB) (a size such as \"512MiB\" or \"2GiB\")",
        ),
        (
            "memory_limit = \"1MiB\"",
            "body.memory_limit: must be at least 4MiB (a body needs that much to start)",
        ),
        (
            "memory_limit = -1",
            "body.memory_limit: must be at least 4MiB (a body needs that much to start)",
        ),
        (
            "memory_limit = 1.5",
            "body.memory_limit: expected a size such as \"2GiB\", found a float",
        ),
    ];
    for (b, expected) in cases {
        assert_eq!(one_problem(&with("body", b)), expected, "{b}");
    }
    let executor =
        with("body", "memory_limit = \"1GiB\"").replace("command = ", "executor = \"bin/task\"\n#");
    assert_eq!(
        one_problem(&executor),
        "body.memory_limit: applies only to body.command; an executor binary runs the task in its own process, which the runtime keeps outside any body's memory cgroup"
    );
}

#[test]
fn soft_time_limit_is_a_duration_below_the_timeout() {
    let m = parse(&with("body", "soft_time_limit = \"9m\"")).unwrap();
    assert_eq!(
        m.body.soft_time_limit,
        Some(std::time::Duration::from_secs(540))
    );
    let m = parse(&with("body", "soft_time_limit = \"599500ms\"")).unwrap();
    assert_eq!(
        m.body.soft_time_limit,
        Some(std::time::Duration::from_millis(599_500))
    );
    // No hard limit: any soft limit comes before it.
    let text = with("body", "soft_time_limit = \"2h\"")
        .replace("timeout_seconds = 600", "timeout_seconds = 0");
    assert!(parse(&text).is_ok());
    let cases = [
        (
            "soft_time_limit = \"10m\"",
            "body.soft_time_limit: 600s is not below task.timeout_seconds (600s); the soft limit must come before the hard one",
        ),
        (
            "soft_time_limit = \"600500ms\"",
            "body.soft_time_limit: 600500ms is not below task.timeout_seconds (600s); the soft limit must come before the hard one",
        ),
        (
            "soft_time_limit = \"0s\"",
            "body.soft_time_limit: invalid duration \"0s\": must be greater than zero (a duration such as \"45s\", \"500ms\" or \"5m\")",
        ),
        (
            "soft_time_limit = \"-1s\"",
            "body.soft_time_limit: invalid duration \"-1s\": must be positive (a duration such as \"45s\", \"500ms\" or \"5m\")",
        ),
        (
            "soft_time_limit = \"soon\"",
            "body.soft_time_limit: invalid duration \"soon\": expected a number followed by ms, s, m or h (a duration such as \"45s\", \"500ms\" or \"5m\")",
        ),
        (
            "soft_time_limit = 30",
            "body.soft_time_limit: expected a string, found an integer",
        ),
    ];
    for (line, expected) in cases {
        assert_eq!(one_problem(&with("body", line)), expected, "{line}");
    }
}

#[test]
fn guardrail_rules() {
    assert_eq!(
        one_problem(&format!("{MINIMAL}[guardrails]\npre = \"./check.sh\"\n")),
        "guardrails.pre: expected an array of strings (a command and its arguments), found a string"
    );
    assert_eq!(
        one_problem(&format!("{MINIMAL}[guardrails]\npost = []\n")),
        "guardrails.post: must name a command: the array is empty"
    );
    assert_eq!(
        one_problem(&format!("{MINIMAL}[guardrails]\nduring = [\"x\"]\n")),
        "guardrails.during: unknown key (keys of [guardrails]: post, pre)"
    );
}

#[test]
fn workspace_rules() {
    assert_eq!(
        one_problem(&format!("{MINIMAL}[workspace]\nprefix = \"a\"\n")),
        "workspace: only workspace tasks (task.kind = \"workspace\") have a [workspace] table"
    );
    let ws = MINIMAL.replace("workspace-free", "workspace");
    let cases = [
        (
            "[workspace]\nprefix = \"../up\"",
            "workspace.prefix: \"../up\" must not contain '.' or '..' segments",
        ),
        (
            "[workspace]\nprefix = \"/abs\"",
            "workspace.prefix: \"/abs\" must be relative (no leading '/')",
        ),
        (
            "[workspace]\nmerge_timeout_seconds = 0",
            "workspace.merge_timeout_seconds: must be at least 1, found 0",
        ),
        (
            "[workspace]\nrepo = \"x\"",
            "workspace.repo: unknown key (keys of [workspace]: download_budget, merge_timeout_seconds, prefix, publish_budget)",
        ),
        (
            "[workspace.publish_budget]\nmax_objects = 0",
            "workspace.publish_budget.max_objects: must be at least 1, found 0",
        ),
        (
            "[workspace.publish_budget]\nmax_bytes = \"2 gigs\"",
            "workspace.publish_budget.max_bytes: invalid byte size \"2 gigs\": unknown unit (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)",
        ),
        (
            "[workspace.publish_budget]\nmax_bytes = 0",
            "workspace.publish_budget.max_bytes: must be at least 1, found 0",
        ),
        (
            "[workspace.publish_budget]\nmax_bytes = \"0GiB\"",
            "workspace.publish_budget.max_bytes: must be at least 1 byte",
        ),
        (
            "[workspace.publish_budget]\nmax_bytes = 1.5",
            "workspace.publish_budget.max_bytes: expected a byte count or a size such as \"2GiB\", found a float",
        ),
        (
            "[workspace.publish_budget]\nseconds = 0",
            "workspace.publish_budget.seconds: must be at least 1, found 0",
        ),
        (
            "[workspace.publish_budget]\nmax_files = 3",
            "workspace.publish_budget.max_files: unknown key (keys of [workspace.publish_budget]: max_bytes, max_objects, seconds)",
        ),
        (
            "[workspace.download_budget]\nmax_objects = 0",
            "workspace.download_budget.max_objects: must be at least 1, found 0",
        ),
        (
            "[workspace.download_budget]\nmax_bytes = \"0GiB\"",
            "workspace.download_budget.max_bytes: must be at least 1 byte",
        ),
        (
            "[workspace.download_budget]\nmax_bytes = \"lots\"",
            "workspace.download_budget.max_bytes: invalid byte size \"lots\": expected a number, optionally followed by a unit such as MiB or GB",
        ),
        (
            "[workspace.download_budget]\nmax_bytes = -1",
            "workspace.download_budget.max_bytes: must be at least 1, found -1",
        ),
        (
            "[workspace.download_budget]\nseconds = 30",
            "workspace.download_budget.seconds: unknown key (keys of [workspace.download_budget]: max_bytes, max_objects)",
        ),
        (
            "[workspace]\ndownload_budget = 5",
            "workspace.download_budget: expected a table, found an integer",
        ),
    ];
    for (table, expected) in cases {
        assert_eq!(one_problem(&format!("{ws}{table}\n")), expected, "{table}");
    }
    let m = parse(&format!(
        "{ws}[workspace]\nmerge_timeout_seconds = 90\n[workspace.publish_budget]\nmax_bytes = 4096\n"
    ))
    .unwrap();
    let w = m.workspace.unwrap();
    assert_eq!(w.merge_timeout_seconds, 90);
    assert_eq!(w.publish_budget.unwrap().max_bytes, Some(4096));
    assert_eq!(w.download_budget, None);
}

#[test]
fn unknown_top_level_tables_are_rejected() {
    assert_eq!(
        one_problem(&format!("{MINIMAL}[tasks]\nname = \"x\"\n")),
        "tasks: unknown key (keys of the manifest: body, dev, guardrails, task, worker, workspace)"
    );
}

#[test]
fn every_problem_is_reported_at_once_with_the_path() {
    let text = "[task]\nname = \"a/b\"\nkind = \"x\"\ntimeout_seconds = 1\n[body]\ncommand = []\n";
    let err = parse(text).unwrap_err().to_string();
    assert_eq!(
        err,
        "manifest task.toml: task.name: \"a/b\" must not contain '/' (the name becomes a folder name)\n\
         manifest task.toml: task.kind: unknown value \"x\" (expected one of workspace, workspace-free)\n\
         manifest task.toml: body.command: must name a command: the array is empty"
    );
}

mod files {
    use super::*;
    use std::fs;

    fn write(dir: &Path, name: &str, text: &str) {
        fs::write(dir.join(name), text).unwrap();
    }

    #[test]
    fn load_reads_the_file_and_compiles_schemas() {
        let tmp = tempfile::tempdir().unwrap();
        write(
            tmp.path(),
            "params.json",
            r#"{"type":"object","required":["n"],"properties":{"n":{"type":"integer"}}}"#,
        );
        let text = with("task", "params_schema = \"params.json\"");
        write(tmp.path(), "task.toml", &text);
        let m = Manifest::load(&tmp.path().join("task.toml")).unwrap();
        assert_eq!(m.dir, fs::canonicalize(tmp.path()).unwrap());
        let schema = m.schemas.params.as_ref().unwrap();
        assert_eq!(
            schema.validate("params", &serde_json::json!({"n": 1})),
            Ok(())
        );
        let text = |v: serde_json::Value| schema.validate("params", &v).map_err(|e| e.to_string());
        assert_eq!(
            text(serde_json::json!({"n": "x"})),
            Err("params/n: \"x\" is not of type \"integer\"".to_owned())
        );
        assert_eq!(
            text(serde_json::json!({})),
            Err("params: \"n\" is a required property".to_owned())
        );
        let violations = schema
            .validate("params", &serde_json::json!({"n": "x"}))
            .unwrap_err();
        assert_eq!(violations.more, 0);
        assert_eq!(violations.listed.len(), 1);
        assert_eq!(violations.listed[0].label, "params");
        assert_eq!(violations.listed[0].pointer, "/n");
        assert!(m.schemas.result.is_none());
    }

    #[test]
    fn schema_errors_say_what_failed() {
        let tmp = tempfile::tempdir().unwrap();
        write(tmp.path(), "bad.json", "{not json");
        write(tmp.path(), "wrong.json", r#"{"type": 12}"#);
        assert!(matches!(
            crate::manifest::Schema::load(&tmp.path().join("missing.json")),
            Err(crate::manifest::SchemaError::Read { .. })
        ));
        assert!(matches!(
            crate::manifest::Schema::load(&tmp.path().join("bad.json")),
            Err(crate::manifest::SchemaError::Json { .. })
        ));
        assert!(matches!(
            crate::manifest::Schema::load(&tmp.path().join("wrong.json")),
            Err(crate::manifest::SchemaError::NotASchema { .. })
        ));
    }

    #[test]
    fn schema_problems_name_the_key_and_file() {
        let tmp = tempfile::tempdir().unwrap();
        write(tmp.path(), "bad.json", "{not json");
        write(tmp.path(), "wrong.json", r#"{"type": 12}"#);
        let load = |line: &str| {
            let text = with("task", line);
            write(tmp.path(), "task.toml", &text);
            Manifest::load(&tmp.path().join("task.toml"))
                .unwrap_err()
                .to_string()
        };
        let dir = fs::canonicalize(tmp.path()).unwrap();
        let manifest = tmp.path().join("task.toml");
        assert_eq!(
            load("params_schema = \"missing.json\""),
            format!(
                "manifest {}: task.params_schema: cannot read {}: No such file or directory (os error 2)",
                manifest.display(),
                dir.join("missing.json").display()
            )
        );
        let bad = load("result_schema = \"bad.json\"");
        assert!(
            bad.starts_with(&format!(
                "manifest {}: task.result_schema: {} is not valid JSON: key must be a string",
                manifest.display(),
                dir.join("bad.json").display()
            )),
            "{bad}"
        );
        let wrong = load("params_schema = \"wrong.json\"");
        assert!(
            wrong.starts_with(&format!(
                "manifest {}: task.params_schema: {} is not a valid JSON Schema: ",
                manifest.display(),
                dir.join("wrong.json").display()
            )),
            "{wrong}"
        );
    }

    #[test]
    fn unreadable_manifest() {
        let err = Manifest::load(Path::new("/nonexistent/task.toml")).unwrap_err();
        assert_eq!(
            crate::errors::chain(&err),
            "cannot read manifest /nonexistent/task.toml: No such file or directory (os error 2)"
        );
    }
}

#[test]
fn dev_table() {
    let ws = MINIMAL.replace("workspace-free", "workspace");
    let m = parse(&format!(
        "{ws}[dev]\nseed = \"seed\"\nrepository = \"features\"\n"
    ))
    .unwrap();
    assert_eq!(m.dev.seed, Some(dir().join("seed")));
    assert_eq!(m.dev.repository, "features");
    assert_eq!(m.dev.branch, "main");
    assert_eq!(parse(MINIMAL).unwrap().dev, DevSpec::default());
    assert_eq!(
        one_problem(&format!("{MINIMAL}[dev]\nseed = \"seed\"\n")),
        "dev.seed: only workspace tasks have a workspace to seed"
    );
    assert_eq!(
        one_problem(&format!("{ws}[dev]\nrepository = \"Dev_Repo\"\n")),
        "dev.repository: \"Dev_Repo\" is not a lakeFS repository name (3-63 of a-z, 0-9 and -)"
    );
    assert_eq!(
        one_problem(&format!("{ws}[dev]\ninputs = []\n")),
        "dev.inputs: unknown key (keys of [dev]: branch, repository, seed)"
    );
}

/// Issue #27 item 2: a concurrency group, its limit and a task's cost.
#[test]
fn a_concurrency_group_is_read_and_checked() {
    let m = parse(&with(
        "task",
        "concurrency_group = \"providers\"\nconcurrency_limit = 3\ncost_units = 5",
    ))
    .unwrap();
    assert_eq!(
        m.task.concurrency,
        Some(ConcurrencyGroup {
            name: "providers".into(),
            limit: Some(3),
            cost_units: 5,
        })
    );
    let m = parse(&with("task", "concurrency_group = \"providers\"")).unwrap();
    assert_eq!(
        m.task.concurrency.unwrap().cost_units,
        1,
        "the default cost"
    );
    for (line, key, problem) in [
        (
            "concurrency_limit = 3",
            "task.concurrency_limit",
            "set task.concurrency_group too",
        ),
        (
            "cost_units = 2",
            "task.cost_units",
            "set task.concurrency_group too",
        ),
        (
            "concurrency_group = \"a b\"",
            "task.concurrency_group",
            "only letters",
        ),
        (
            "concurrency_group = \"g\"\nconcurrency_limit = 0",
            "task.concurrency_limit",
            "at least 1",
        ),
        (
            "concurrency_group = \"g\"\ncost_units = 0",
            "task.cost_units",
            "at least 1",
        ),
    ] {
        let err = parse(&with("task", line)).unwrap_err().to_string();
        assert!(err.contains(key) && err.contains(problem), "{line}: {err}");
    }
}

/// Issue #26 item 4: `[worker]` holds the runtime settings `reload` re-reads, each checked as
/// its flag or variable is.
#[test]
fn the_worker_table_holds_the_live_settings() {
    use std::time::Duration;
    assert_eq!(parse(MINIMAL).unwrap().worker, WorkerSpec::default());
    let m = parse(&format!(
        "{MINIMAL}\n[worker]\ndomain = \"blue\"\npaused = true\npoll_interval = \"250ms\"\npoll_timeout = \"2s\"\nmax_tasks_per_executor = 50\nmax_executor_memory = \"512MiB\"\nmin_free_memory = \"1GiB\"\n"
    ))
    .unwrap();
    assert_eq!(
        m.worker,
        WorkerSpec {
            domain: Some(crate::conductor::Domain::parse("blue").unwrap()),
            paused: Some(true),
            poll_interval: Some(Duration::from_millis(250)),
            poll_timeout: Some(Duration::from_secs(2)),
            max_tasks_per_executor: Some(50),
            max_executor_memory: Some(512 << 20),
            min_free_memory: Some(1 << 30),
        }
    );
    let zero = parse(&format!("{MINIMAL}\n[worker]\npoll_interval = \"0s\"\n")).unwrap();
    assert_eq!(zero.worker.poll_interval, Some(Duration::ZERO));
    let cases = [
        (
            "domain = \"a:b\"",
            "worker.domain: domain \"a:b\": only ASCII",
        ),
        (
            "paused = \"yes\"",
            "worker.paused: expected true or false, found a string",
        ),
        (
            "poll_interval = \"2h\"",
            "worker.poll_interval: must be at most 3600s, found \"2h\"",
        ),
        (
            "poll_timeout = \"10ms\"",
            "worker.poll_timeout: must be at least 100ms, found \"10ms\"",
        ),
        (
            "poll_timeout = \"soon\"",
            "worker.poll_timeout: invalid duration",
        ),
        (
            "max_tasks_per_executor = 0",
            "worker.max_tasks_per_executor: must be at least 1, found 0",
        ),
        (
            "max_executor_memory = \"10KiB\"",
            "worker.max_executor_memory: must be at least 1MiB",
        ),
        (
            "min_free_memory = 0",
            "worker.min_free_memory: must be at least 1B",
        ),
        ("thread_count = 4", "worker.thread_count: unknown key"),
    ];
    for (line, expected) in cases {
        let got = one_problem(&format!("{MINIMAL}\n[worker]\n{line}\n"));
        assert!(got.starts_with(expected), "{line}: {got}");
    }
}
