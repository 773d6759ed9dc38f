//! The `jsonl` body protocol: one persistent process answers every assignment; errors,
//! crashes, protocol breaks and overruns fail only their assignment, and the process is
//! started again for the next one.

use perago_core::{
    attempt::AttemptSnapshot,
    json::RawJson,
    manifest::Manifest,
    result::{Outcome, ResultStatus, RuntimeResult},
};
use perago_executor::assignment::AssignmentRunner;
use serde_json::{Value, json};
use std::{fs, sync::Arc, time::Duration};

const BODY: &str = r#"
import json, os, sys, time
for line in sys.stdin:
    req = json.loads(line)
    p = req["params"]
    eid = req["execution_id"]
    if p.get("die"):
        print("dying on purpose", file=sys.stderr, flush=True)
        sys.exit(3)
    if p.get("garbage"):
        print("this is not json", flush=True)
        continue
    if p.get("big"):
        print(json.dumps({"execution_id": eid, "result": "x" * p["big"]}), flush=True)
        continue
    if p.get("raw"):
        # The request line as it came, and a result written by hand.
        sys.stdout.write('{"execution_id": %s, "result": {"line": %s, "x": 1.0e2, "s": "\\u00e9"}}\n' % (json.dumps(eid), json.dumps(line)))
        sys.stdout.flush()
        continue
    if p.get("warn"):
        print(p["warn"], file=sys.stderr, flush=True)
    if p.get("sleep"):
        time.sleep(p["sleep"])
    if p.get("fail"):
        out = {"execution_id": eid, "error": {"message": "cannot do " + p["fail"], "terminal": p.get("terminal", False)}}
    else:
        out = {"execution_id": eid, "result": {"echo": p, "pid": os.getpid(), "worker": req["worker_id"], "task": req["task_id"]}}
    print(json.dumps(out), flush=True)
"#;

fn runner(timeout: u64) -> (tempfile::TempDir, AssignmentRunner) {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("body.py"), BODY).unwrap();
    fs::write(
        dir.path().join("task.toml"),
        format!(
            "[task]\nname = \"jsonl.task\"\nkind = \"workspace-free\"\ntimeout_seconds = {timeout}\n\
             [body]\ncommand = [\"python3\", \"-u\", \"body.py\"]\nprotocol = \"jsonl\"\n"
        ),
    )
    .unwrap();
    let manifest = Arc::new(Manifest::load(&dir.path().join("task.toml")).unwrap());
    let runner = AssignmentRunner::new(
        manifest,
        "jsonltask0001".into(),
        std::env::var_os("PATH").as_deref(),
    )
    .unwrap()
    .with_kill_grace(Duration::from_millis(200));
    (dir, runner)
}

async fn run(runner: &AssignmentRunner, id: &str, params: Value) -> RuntimeResult {
    let attempt = AttemptSnapshot::from_conductor(&json!({
        "taskId": format!("task-{id}"), "workflowInstanceId": "wf", "retryCount": 0,
        "taskDefName": "jsonl.task", "referenceTaskName": "r", "seq": 1, "status": "IN_PROGRESS",
        "inputData": {"params": params}
    }))
    .unwrap();
    runner.execute(id, &attempt).await
}

fn result(r: &RuntimeResult) -> Value {
    match r.outcome() {
        Outcome::Completed(out) => out.to_value().unwrap()["result"].clone(),
        other => panic!("expected COMPLETED, got {other:?}"),
    }
}

fn reason(r: &RuntimeResult, status: ResultStatus) -> String {
    assert_eq!(r.status(), status, "{r:?}");
    match r.outcome() {
        Outcome::Failed(x) | Outcome::FailedTerminal(x) => x.as_str().to_owned(),
        Outcome::Completed(_) => unreachable!(),
    }
}

#[tokio::test]
async fn one_process_answers_every_assignment() {
    let (_dir, runner) = runner(10);
    let first = result(&run(&runner, "e1", json!({"n": 1})).await);
    let second = result(&run(&runner, "e2", json!({"n": 2})).await);
    assert_eq!(first["echo"], json!({"n": 1}));
    assert_eq!(second["echo"], json!({"n": 2}));
    assert_eq!(first["worker"], "jsonltask0001");
    assert_eq!(second["task"], "task-e2");
    assert_eq!(first["pid"], second["pid"], "the body process persists");
}

#[tokio::test]
async fn body_errors_fail_only_their_assignment() {
    let (_dir, runner) = runner(10);
    let pid = result(&run(&runner, "e1", json!({})).await)["pid"].clone();
    let r = run(&runner, "e2", json!({"fail": "this"})).await;
    assert_eq!(reason(&r, ResultStatus::Failed), "cannot do this");
    let r = run(&runner, "e3", json!({"fail": "that", "terminal": true})).await;
    assert_eq!(
        reason(&r, ResultStatus::FailedWithTerminalError),
        "cannot do that"
    );
    assert_eq!(
        result(&run(&runner, "e4", json!({})).await)["pid"],
        pid,
        "still the same process"
    );
}

#[tokio::test]
async fn a_crashed_or_confused_process_is_replaced() {
    let (_dir, runner) = runner(10);
    let pid = result(&run(&runner, "e1", json!({})).await)["pid"].clone();
    let r = run(&runner, "e2", json!({"die": true})).await;
    let text = reason(&r, ResultStatus::Failed);
    assert!(
        text.starts_with(
            "body process exited (exit status: 3) while running execution e2: dying on purpose"
        ),
        "{text}"
    );
    let after_crash = result(&run(&runner, "e3", json!({})).await)["pid"].clone();
    assert_ne!(after_crash, pid, "a new process after the crash");

    let r = run(&runner, "e4", json!({"garbage": true})).await;
    let text = reason(&r, ResultStatus::Failed);
    assert!(
        text.starts_with("the body process wrote a line that is not JSON"),
        "{text}"
    );
    assert_ne!(
        result(&run(&runner, "e5", json!({})).await)["pid"],
        after_crash
    );
}

#[tokio::test]
async fn an_overrun_is_stopped_and_the_process_replaced() {
    let (_dir, runner) = runner(1);
    let pid = result(&run(&runner, "e1", json!({})).await)["pid"].clone();
    let r = run(&runner, "e2", json!({"sleep": 30})).await;
    assert_eq!(
        reason(&r, ResultStatus::Failed),
        "body timed out after 1s (task.timeout_seconds) and was stopped"
    );
    assert_ne!(result(&run(&runner, "e3", json!({})).await)["pid"], pid);
}

/// A body that works until it reads the cancel line for its execution, then answers with what
/// it has.
const CANCELLABLE: &str = r#"
import json, sys
for line in sys.stdin:
    req = json.loads(line)
    if "cancel" in req:
        continue
    eid = req["execution_id"]
    cancel = json.loads(sys.stdin.readline())
    out = {"execution_id": eid, "result": {"cancelled": cancel["cancel"]}}
    print(json.dumps(out), flush=True)
"#;

#[tokio::test]
async fn at_the_soft_limit_a_jsonl_body_reads_a_cancel_line() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("body.py"), CANCELLABLE).unwrap();
    fs::write(
        dir.path().join("task.toml"),
        "[task]\nname = \"jsonl.task\"\nkind = \"workspace-free\"\ntimeout_seconds = 5\n\
         [body]\ncommand = [\"python3\", \"-u\", \"body.py\"]\nprotocol = \"jsonl\"\n\
         soft_time_limit = \"300ms\"\n",
    )
    .unwrap();
    let manifest = Arc::new(Manifest::load(&dir.path().join("task.toml")).unwrap());
    let runner = AssignmentRunner::new(
        manifest,
        "jsonltask0001".into(),
        std::env::var_os("PATH").as_deref(),
    )
    .unwrap();
    let started = std::time::Instant::now();
    let r = run(&runner, "exec-soft", json!({})).await;
    assert_eq!(result(&r), json!({"cancelled": "exec-soft"}));
    assert!(started.elapsed() >= Duration::from_millis(300));
    // The same process takes the next assignment.
    let r = run(&runner, "exec-next", json!({})).await;
    assert_eq!(result(&r), json!({"cancelled": "exec-next"}));
}

/// The params reach the body as the text they came as, and the body's result reaches the
/// output as the text it wrote: nothing is parsed and written again on the way.
#[tokio::test]
async fn params_and_result_pass_through_as_text() {
    let (_dir, runner) = runner(10);
    let mut attempt = AttemptSnapshot::from_conductor(&json!({
        "taskId": "task-raw", "workflowInstanceId": "wf", "retryCount": 0,
        "taskDefName": "jsonl.task", "referenceTaskName": "r", "seq": 1, "status": "IN_PROGRESS",
        "inputData": {"params": {}}
    }))
    .unwrap();
    let params = r#"{"raw": true, "n": 1.0e2, "s": "\u00e9", "big": 0, "z": 123456789012345678901234567890}"#;
    attempt.input_data = RawJson::parse(format!(r#"{{"params": {params}}}"#)).unwrap();
    let r = runner.execute("e-raw", &attempt).await;
    let Outcome::Completed(out) = r.outcome() else {
        panic!("expected COMPLETED, got {r:?}");
    };
    assert!(
        out.as_str().ends_with(r#", "x": 1.0e2, "s": "\u00e9"}}"#),
        "{out:?}"
    );
    let line = out.to_value().unwrap()["result"]["line"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(line.contains(&format!(r#","params":{params},"#)), "{line}");
}

/// The size limit applies to a `jsonl` body's result too.
#[tokio::test]
async fn a_result_above_the_limit_fails() {
    let (_dir, runner) = runner(30);
    let r = run(&runner, "e-big", json!({"big": 3 * 1024 * 1024 + 1})).await;
    assert_eq!(
        reason(&r, ResultStatus::Failed),
        "body result is larger than 3 MiB; Conductor cannot take it inline"
    );
    let ok = result(&run(&runner, "e-ok", json!({"big": 1024})).await);
    assert_eq!(ok, json!("x".repeat(1024)));
}

/// The persistent body's stderr is read by a task that outlives each assignment; its lines
/// carry the ids of the assignment they were written during (its span), also when the next
/// assignment follows at once: the end of an assignment waits until the reader has taken
/// what the body wrote before its answer.
#[tokio::test]
async fn the_bodys_stderr_lines_carry_the_ids_of_their_assignment() {
    use tracing::Instrument as _;
    let logs = tempfile::tempdir().unwrap();
    let dir = perago_core::logging::init_worker(&perago_core::logging::JsonlConfig {
        root: logs.path().to_owned(),
        task: "jsonl.task".into(),
        worker_id: "jsonltask0001".into(),
        max_bytes: perago_core::logging::DEFAULT_MAX_BYTES,
        max_files: 1,
    })
    .unwrap();
    let (_dir, runner) = runner(10);
    let ids = ["e1", "e2", "e3", "e4", "e5"];
    for id in ids {
        let span =
            tracing::info_span!("assignment", task_id = %format!("task-{id}"), execution_id = id);
        let r = run(&runner, id, json!({"warn": format!("warning from {id}")}))
            .instrument(span)
            .await;
        assert_eq!(r.status(), ResultStatus::Completed, "{r:?}");
    }
    let text = fs::read_to_string(dir.join("perago.jsonl")).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|l| l["stream"] == "stderr")
        .collect();
    assert_eq!(lines.len(), ids.len(), "{text}");
    for (line, id) in lines.iter().zip(ids) {
        assert_eq!(line["message"], format!("warning from {id}"), "{line}");
        assert_eq!(line["execution_id"], id, "{line}");
        assert_eq!(line["task_id"], format!("task-{id}"), "{line}");
    }
}
