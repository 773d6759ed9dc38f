//! One assignment, start to result, with real shell bodies and guardrails: every failure kind
//! of SPEC §5 produces its status and a reason a person can act on.

#![forbid(unsafe_code)]

use perago_core::{
    attempt::AttemptSnapshot,
    manifest::Manifest,
    result::{Outcome, ResultStatus, RuntimeResult},
};
use perago_executor::assignment::AssignmentRunner;
use serde_json::{Value, json};
use std::{
    fs,
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

const WORKER: &str = "testtask0003";

struct Task {
    dir: tempfile::TempDir,
}

impl Task {
    /// A workspace-free task whose body is `body.sh`; `extra` is appended to the manifest.
    fn new(body: &str, extra: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("body.sh"), body).unwrap();
        let manifest = format!(
            "[task]\nname = \"test.task\"\nkind = \"workspace-free\"\ntimeout_seconds = 5\n\
             [body]\ncommand = [\"sh\", \"body.sh\"]\nenv = {{ GREETING = \"hi\" }}\n{extra}"
        );
        fs::write(dir.path().join("task.toml"), manifest).unwrap();
        Self { dir }
    }

    fn file(self, name: &str, text: &str) -> Self {
        fs::write(self.dir.path().join(name), text).unwrap();
        self
    }

    fn runner(&self) -> AssignmentRunner {
        let manifest = Manifest::load(&self.dir.path().join("task.toml")).unwrap();
        let path = std::env::var_os("PATH");
        AssignmentRunner::new(Arc::new(manifest), WORKER.to_owned(), path.as_deref())
            .unwrap()
            .with_kill_grace(Duration::from_millis(300))
    }

    async fn run(&self, input: Value) -> RuntimeResult {
        self.run_started(input, None).await
    }

    /// Runs an attempt whose Conductor `startTime` lies `ago` in the past.
    async fn run_started(&self, input: Value, ago: Option<Duration>) -> RuntimeResult {
        let mut task = json!({
            "taskId": "task-1", "workflowInstanceId": "wf-1", "retryCount": 0,
            "taskDefName": "test.task", "referenceTaskName": "ref", "seq": 1,
            "status": "IN_PROGRESS", "inputData": input
        });
        if let Some(ago) = ago {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            task["startTime"] = json!((now - ago).as_millis() as i64);
        }
        let attempt = AttemptSnapshot::from_conductor(&task).unwrap();
        self.runner().execute("exec-1", &attempt).await
    }
}

fn output(result: &RuntimeResult) -> serde_json::Map<String, Value> {
    match result.outcome() {
        Outcome::Completed(out) => match out.to_value().unwrap() {
            Value::Object(out) => out,
            other => panic!("output is not an object: {other}"),
        },
        other => panic!("expected COMPLETED, got {other:?}"),
    }
}

#[track_caller]
fn reason(result: &RuntimeResult, status: ResultStatus) -> String {
    assert_eq!(result.status(), status, "{result:?}");
    match result.outcome() {
        Outcome::Failed(r) | Outcome::FailedTerminal(r) => r.as_str().to_owned(),
        Outcome::Completed(_) => unreachable!(),
    }
}

#[tokio::test]
async fn body_result_becomes_the_output() {
    let task = Task::new(
        r#"read params
printf '{"params": %s, "worker": "%s", "task": "%s", "execution": "%s", "greeting": "%s", "cwd": "%s"}' \
  "$params" "$PERAGO_WORKER_ID" "$PERAGO_TASK_ID" "$PERAGO_EXECUTION_ID" "$GREETING" "$(pwd)"
"#,
        "",
    );
    let result = task.run(json!({"params": {"n": 7}})).await;
    assert_eq!(result.worker_id(), WORKER);
    let cwd = fs::canonicalize(task.dir.path()).unwrap();
    assert_eq!(
        Value::Object(output(&result)),
        json!({"result": {
            "params": {"n": 7}, "worker": WORKER, "task": "task-1", "execution": "exec-1",
            "greeting": "hi", "cwd": cwd.to_str().unwrap()
        }})
    );
}

#[tokio::test]
async fn bad_input_shape_fails_naming_the_key() {
    let task = Task::new("echo '{}'", "");
    let r = task.run(json!({"params": {}, "workspace": {}})).await;
    assert_eq!(
        reason(&r, ResultStatus::Failed),
        "bad input: workspace: unexpected key; a workspace-free task takes exactly 'params'"
    );
    let r = task.run(json!({"params": "n=1"})).await;
    assert_eq!(
        reason(&r, ResultStatus::Failed),
        "bad input: params: must be a JSON object, found a string"
    );
}

#[tokio::test]
async fn params_schema_violation_fails_naming_the_field() {
    let task = Task::new("echo '{}'", "")
        .file(
            "params.json",
            r#"{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}"#,
        )
        .file(
            "task.toml",
            "[task]\nname = \"test.task\"\nkind = \"workspace-free\"\ntimeout_seconds = 5\nparams_schema = \"params.json\"\n[body]\ncommand = [\"sh\", \"body.sh\"]\n",
        );
    let r = task.run(json!({"params": {"n": "seven"}})).await;
    assert_eq!(
        reason(&r, ResultStatus::Failed),
        "bad input: params do not match the params schema: params/n: \"seven\" is not of type \"integer\""
    );
}

#[tokio::test]
async fn pre_guardrail_failure_is_terminal_and_the_body_never_runs() {
    let task = Task::new(
        "touch body-ran; echo '{}'",
        "[guardrails]\npre = [\"sh\", \"pre.sh\"]\n",
    )
    .file(
        "pre.sh",
        "cat > pre-input.json\necho 'params.name is empty' >&2\nexit 4\n",
    );
    let r = task.run(json!({"params": {"name": ""}})).await;
    assert_eq!(
        reason(&r, ResultStatus::FailedWithTerminalError),
        "pre guardrail sh pre.sh failed (exit status 4): params.name is empty"
    );
    assert!(!task.dir.path().join("body-ran").exists());
    // The guardrail read the params on stdin.
    let seen = fs::read_to_string(task.dir.path().join("pre-input.json")).unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&seen).unwrap(),
        json!({"name": ""})
    );
}

#[tokio::test]
async fn body_failure_carries_the_stderr_tail() {
    let task = Task::new(
        "i=0; while [ $i -lt 400 ]; do echo \"progress line $i\" >&2; i=$((i+1)); done\necho 'Traceback: KeyError: name' >&2\nexit 3\n",
        "",
    );
    let r = task.run(json!({"params": {}})).await;
    let text = reason(&r, ResultStatus::Failed);
    assert!(text.starts_with("body failed (exit status 3): …"), "{text}");
    assert!(text.ends_with("Traceback: KeyError: name"), "{text}");
    assert!(text.chars().count() <= 500);
}

#[tokio::test]
async fn killed_body_names_the_signal() {
    let task = Task::new("kill -9 $$\n", "");
    let r = task.run(json!({"params": {}})).await;
    assert_eq!(
        reason(&r, ResultStatus::Failed),
        "body failed (signal 9 (SIGKILL))"
    );
}

#[tokio::test]
async fn body_output_must_be_one_json_document() {
    let r = Task::new("echo 'done!'", "")
        .run(json!({"params": {}}))
        .await;
    let text = reason(&r, ResultStatus::Failed);
    assert!(
        text.starts_with("body result on stdout is not valid JSON: "),
        "{text}"
    );
    let r = Task::new("echo nothing to say >&2", "")
        .run(json!({"params": {}}))
        .await;
    assert_eq!(
        reason(&r, ResultStatus::Failed),
        "body printed no result on stdout (expected one JSON document): nothing to say"
    );
    // Above Conductor's hard limit, as the server would: for good, naming both sizes.
    let r = Task::new("head -c 11000000 /dev/zero | tr '\\0' 'a'", "")
        .run(json!({"params": {}}))
        .await;
    assert_eq!(
        reason(&r, ResultStatus::FailedWithTerminalError),
        "task output is 11000000 bytes, above Conductor's limit of 10485760 bytes (maxTaskOutputPayloadSizeThreshold, 10240 KB); the server fails such a task for good"
    );
}

#[tokio::test]
async fn result_schema_and_post_guardrail() {
    let task = Task::new(
        "echo '{\"rows\": \"many\"}'",
        "[guardrails]\npost = [\"sh\", \"post.sh\"]\n",
    )
    .file(
        "result.json",
        r#"{"type":"object","properties":{"rows":{"type":"integer"}}}"#,
    )
    .file(
        "post.sh",
        "cat > post-input.json\necho 'rows missing' >&2\nexit 1\n",
    );
    let r = task.run(json!({"params": {}})).await;
    assert_eq!(
        reason(&r, ResultStatus::Failed),
        "post guardrail sh post.sh failed (exit status 1): rows missing"
    );
    let seen = fs::read_to_string(task.dir.path().join("post-input.json")).unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&seen).unwrap(),
        json!({"rows": "many"})
    );

    fs::write(
        task.dir.path().join("task.toml"),
        "[task]\nname = \"test.task\"\nkind = \"workspace-free\"\ntimeout_seconds = 5\nresult_schema = \"result.json\"\n[body]\ncommand = [\"sh\", \"body.sh\"]\n",
    )
    .unwrap();
    let r = task.run(json!({"params": {}})).await;
    assert_eq!(
        reason(&r, ResultStatus::Failed),
        "result does not match the result schema: result/rows: \"many\" is not of type \"integer\""
    );
}

#[tokio::test]
async fn overrunning_body_is_stopped_at_the_timeout() {
    let task = Task::new("echo started >&2\nexec sleep 60\n", "")
        .file(
            "task.toml",
            "[task]\nname = \"test.task\"\nkind = \"workspace-free\"\ntimeout_seconds = 1\n[body]\ncommand = [\"sh\", \"body.sh\"]\n",
        );
    let started = Instant::now();
    let r = task.run(json!({"params": {}})).await;
    assert_eq!(
        reason(&r, ResultStatus::Failed),
        "body timed out after 1s (task.timeout_seconds) and was stopped: started"
    );
    // Stopped by SIGTERM, long before the 60 s sleep would have ended.
    assert!(started.elapsed() < Duration::from_secs(30));
}

/// A task handed back and polled again keeps Conductor's `startTime`: the body gets only the
/// time Conductor has left, not a fresh `timeout_seconds`.
#[tokio::test]
async fn the_limit_counts_from_the_attempts_start_in_conductor() {
    let manifest = |policy: &str| {
        format!(
            "[task]\nname = \"test.task\"\nkind = \"workspace-free\"\ntimeout_seconds = 5\n{policy}[body]\ncommand = [\"sh\", \"body.sh\"]\n"
        )
    };
    let task = Task::new("echo started >&2\nexec sleep 60\n", "").file("task.toml", &manifest(""));
    // 4 s of the 5 s are gone: the body is stopped after about 1 s.
    let started = Instant::now();
    let r = task
        .run_started(json!({"params": {}}), Some(Duration::from_secs(4)))
        .await;
    let why = reason(&r, ResultStatus::Failed);
    assert!(
        why.starts_with("body timed out after 5s (task.timeout_seconds) counted from the attempt's start in Conductor, 4s before this execution"),
        "{why}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );

    // All of it is gone: the body does not start at all.
    let r = task
        .run_started(json!({"params": {}}), Some(Duration::from_secs(9)))
        .await;
    assert_eq!(
        reason(&r, ResultStatus::Failed),
        "no time left to run: Conductor started this attempt 9s ago and task.timeout_seconds is 5s"
    );

    // ALERT_ONLY: Conductor enforces nothing, the limit counts from this execution's start.
    let task = Task::new("echo done >&2\necho '{}'\n", "")
        .file("task.toml", &manifest("timeout_policy = \"ALERT_ONLY\"\n"));
    let r = task
        .run_started(json!({"params": {}}), Some(Duration::from_secs(9)))
        .await;
    assert_eq!(r.status(), ResultStatus::Completed, "{r:?}");
}

#[tokio::test]
async fn body_ignoring_sigterm_is_killed_after_the_grace() {
    let task = Task::new("trap '' TERM\necho stubborn >&2\nsleep 60\n", "").file(
        "task.toml",
        "[task]\nname = \"test.task\"\nkind = \"workspace-free\"\ntimeout_seconds = 1\n[body]\ncommand = [\"sh\", \"body.sh\"]\n",
    );
    let started = Instant::now();
    let r = task.run(json!({"params": {}})).await;
    assert!(reason(&r, ResultStatus::Failed).starts_with("body timed out after 1s"));
    assert!(started.elapsed() < Duration::from_secs(30));
}

/// Whether `pid` is still a live (non-zombie) process.
fn alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => {
            // The state follows the parenthesized command name.
            let state = stat.rsplit(") ").next().and_then(|s| s.chars().next());
            state != Some('Z')
        }
    }
}

#[tokio::test]
async fn processes_left_behind_by_the_body_are_ended() {
    let task = Task::new("sleep 300 &\necho $! > orphan.pid\necho '{}'\n", "");
    let r = task.run(json!({"params": {}})).await;
    assert_eq!(r.status(), ResultStatus::Completed);
    let pid: u32 = fs::read_to_string(task.dir.path().join("orphan.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SIGKILL is delivered before execute returns; give the kernel a bounded moment to tear
    // the process down.
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(pid) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !alive(pid),
        "the body's background process {pid} outlived the assignment"
    );
}

#[test]
fn unsupported_manifests_are_refused_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let load = |text: &str| {
        fs::write(dir.path().join("task.toml"), text).unwrap();
        let m = Manifest::load(&dir.path().join("task.toml")).unwrap();
        let error = AssignmentRunner::new(
            Arc::new(m),
            WORKER.into(),
            std::env::var_os("PATH").as_deref(),
        )
        .unwrap_err();
        perago_core::errors::chain(&error)
    };
    assert_eq!(
        load(
            "[task]\nname = \"t\"\nkind = \"workspace-free\"\ntimeout_seconds = 5\n[body]\ncommand = [\"perago-no-such-body\"]\n"
        ),
        "body.command: \"perago-no-such-body\" not found on PATH"
    );
    assert!(Path::new(dir.path()).exists());
}

#[tokio::test]
async fn a_workspace_assignment_without_lakefs_config_fails_and_says_what_is_missing() {
    use perago_core::lakefs::LakefsConfig;
    use perago_executor::{assignment::WorkspaceRuntime, workspace::flow::Owner};
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("body.sh"), "echo '{}'").unwrap();
    fs::write(
        dir.path().join("task.toml"),
        "[task]\nname = \"ws.task\"\nkind = \"workspace\"\ntimeout_seconds = 5\n[body]\ncommand = [\"sh\", \"body.sh\"]\n",
    )
    .unwrap();
    let manifest = Arc::new(Manifest::load(&dir.path().join("task.toml")).unwrap());
    let lakefs = LakefsConfig::from_lookup(|name| {
        (name == "LAKEFS_ENDPOINT").then(|| "http://127.0.0.1:9".to_owned())
    })
    .and_then(|c| perago_core::lakefs::LakefsClient::new(&c));
    let runner =
        AssignmentRunner::new(manifest, WORKER.into(), std::env::var_os("PATH").as_deref())
            .unwrap()
            .with_workspace(WorkspaceRuntime {
                root: dir.path().join("root"),
                lakefs,
                owner: Owner {
                    slot: 1,
                    generation: 1,
                },
            });
    let attempt = AttemptSnapshot::from_conductor(&json!({
        "taskId": "t", "workflowInstanceId": "w", "retryCount": 0, "taskDefName": "ws.task",
        "referenceTaskName": "r", "seq": 1, "status": "IN_PROGRESS",
        "inputData": {"params": {}, "workspace": {"repository": "repo", "branch": "main", "prefix": ""}}
    }))
    .unwrap();
    let result = runner.execute("e", &attempt).await;
    assert_eq!(
        reason(&result, ResultStatus::Failed),
        "LakeFS config is required for workspace tasks: missing LAKEFS_ACCESS_KEY_ID, LAKEFS_SECRET_ACCESS_KEY"
    );
    // The runner is still usable: the executor keeps running.
    let again = runner.execute("e2", &attempt).await;
    assert_eq!(again.status(), ResultStatus::Failed);
}

#[tokio::test]
async fn a_body_inherits_no_descriptor_of_its_executor_but_stdio() {
    use std::os::fd::AsRawFd as _;
    // As the workspace root's lock is in an executor: open and inheritable.
    let lock = tempfile::NamedTempFile::new().unwrap();
    let fd = lock.as_file().as_raw_fd();
    perago_sys::fd::set_cloexec(fd, false).unwrap();
    let task = Task::new(
        r#"read params
fd=$(printf '%s' "$params" | tr -cd 0-9)
printf '{"held": "%s"}' "$(readlink /proc/$$/fd/$fd)"
"#,
        "",
    );
    let result = task.run(json!({"params": {"fd": fd}})).await;
    let held = output(&result)["result"]["held"]
        .as_str()
        .unwrap()
        .to_owned();
    perago_sys::fd::set_cloexec(fd, true).unwrap();
    assert_ne!(
        held,
        lock.path().to_str().unwrap(),
        "the body holds the lock"
    );
}

/// A runner whose body is the Rust task `task` (`body.executor` names a binary the runner
/// never starts: the task is given); the folder holds its manifest.
fn rust_runner(task: impl perago_executor::task::Task) -> (tempfile::TempDir, AssignmentRunner) {
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("task.toml"),
        "[task]\nname = \"test.task\"\nkind = \"workspace-free\"\ntimeout_seconds = 5\n\
         [body]\nexecutor = \"my-task\"\n",
    )
    .unwrap();
    let manifest = Manifest::load(&dir.path().join("task.toml")).unwrap();
    let runner =
        AssignmentRunner::with_task(Arc::new(manifest), WORKER.to_owned(), None, Arc::new(task))
            .unwrap();
    (dir, runner)
}

/// An attempt of `test.task` with empty params.
fn empty_attempt() -> AttemptSnapshot {
    AttemptSnapshot::from_conductor(&json!({
        "taskId": "task-1", "workflowInstanceId": "wf-1", "retryCount": 0,
        "taskDefName": "test.task", "referenceTaskName": "ref", "seq": 1,
        "status": "IN_PROGRESS", "inputData": {"params": {}}
    }))
    .unwrap()
}

/// A Rust body's output is held to the same size limit as a command body's.
#[tokio::test]
async fn an_oversized_rust_task_output_fails_with_its_size() {
    struct Big;
    impl perago_executor::task::Task for Big {
        fn run(
            &self,
            _ctx: &perago_executor::task::TaskContext,
            _params: &serde_json::Map<String, Value>,
        ) -> Result<Value, perago_executor::task::TaskError> {
            Ok(json!({"blob": "x".repeat(11 << 20)}))
        }
    }
    let (_dir, runner) = rust_runner(Big);
    let attempt = empty_attempt();
    let r = runner.execute("exec-1", &attempt).await;
    assert_eq!(
        reason(&r, ResultStatus::FailedWithTerminalError),
        "task output is 11534358 bytes, above Conductor's limit of 10485760 bytes (maxTaskOutputPayloadSizeThreshold, 10240 KB); the server fails such a task for good"
    );
}

/// The soft limit's body: sleeps in the background so the shell runs its trap at once.
const SOFT_BODY: &str = "trap 'echo \"{\\\"partial\\\": true}\"; exit 0' USR1\n\
                         sleep 30 &\nwait $!\necho '{\"partial\": false}'\n";

fn soft_manifest(timeout: u64, soft: &str) -> String {
    format!(
        "[task]\nname = \"test.task\"\nkind = \"workspace-free\"\ntimeout_seconds = {timeout}\n\
         [body]\ncommand = [\"sh\", \"body.sh\"]\nsoft_time_limit = \"{soft}\"\n"
    )
}

#[tokio::test]
async fn at_the_soft_limit_an_exec_body_gets_sigusr1_and_its_result_is_used() {
    let task = Task::new(SOFT_BODY, "").file("task.toml", &soft_manifest(5, "300ms"));
    let started = Instant::now();
    let r = task.run(json!({"params": {}})).await;
    assert_eq!(output(&r)["result"], json!({"partial": true}));
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(4),
        "{took:?}"
    );
}

/// A body dispatched past its soft limit has had no time to install a handler, and SIGUSR1's
/// default action would kill it: it is not signalled, and runs to its end (within the hard
/// limit). Under load, the signal used to arrive before the trap and the body died of it.
#[tokio::test]
async fn an_exec_body_dispatched_past_its_soft_limit_is_not_signalled() {
    let body = "sleep 0.3\ntrap 'echo \"{\\\"partial\\\": true}\"; exit 0' USR1\n\
                sleep 0.3\necho '{\"partial\": false}'\n";
    let task = Task::new(body, "").file("task.toml", &soft_manifest(10, "2s"));
    // Conductor started the attempt 3 s ago: the soft limit (2 s) is behind it.
    let started = Instant::now();
    let r = task
        .run_started(json!({"params": {}}), Some(Duration::from_secs(3)))
        .await;
    assert_eq!(output(&r)["result"], json!({"partial": false}));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_body_ignoring_the_soft_limit_is_stopped_at_the_hard_limit() {
    let task = Task::new("trap '' USR1\necho stubborn >&2\nsleep 30\n", "")
        .file("task.toml", &soft_manifest(1, "200ms"));
    let r = task.run(json!({"params": {}})).await;
    assert_eq!(
        reason(&r, ResultStatus::Failed),
        "body timed out after 1s (task.timeout_seconds) and was stopped: stubborn"
    );
}

/// What a Rust body starts and leaves running is a child of the thread the body ran on: the
/// runner names that thread (`body_thread_id`), so the slot finds and kills it after the
/// assignment; the thread is the same for every assignment.
#[tokio::test]
async fn a_rust_bodys_leftover_child_is_found_below_its_thread() {
    struct Leaves(String);
    impl perago_executor::task::Task for Leaves {
        fn run(
            &self,
            _ctx: &perago_executor::task::TaskContext,
            _params: &serde_json::Map<String, Value>,
        ) -> Result<Value, perago_executor::task::TaskError> {
            let child = std::process::Command::new("sleep")
                .arg(&self.0)
                .spawn()
                .map_err(|e| perago_executor::task::TaskError::retriable(e.to_string()))?;
            Ok(json!({"pid": child.id()}))
        }
    }
    // A duration no other process uses, to find the child by.
    let marker = format!("3001.{}", std::process::id());
    let (_dir, runner) = rust_runner(Leaves(marker));
    let attempt = empty_attempt();
    let mut threads = Vec::new();
    for n in 0..2 {
        let r = runner.execute(&format!("exec-{n}"), &attempt).await;
        let pid = output(&r)["result"]["pid"].as_u64().unwrap();
        let found = runner.body_thread_id();
        assert!(found.is_some(), "no body thread after a Rust body ran");
        assert_ne!(
            found,
            Some(std::process::id()),
            "the body ran on its own thread"
        );
        threads.extend(found);
        assert_eq!(perago_sys::reaper::kill_adopted_below(found.as_slice()), 1);
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "the leftover {pid} was killed and reaped"
        );
    }
    assert_eq!(threads[0], threads[1], "one thread for every assignment");
}
