//! Typed Python bodies (issue #28): a function with a Pydantic contract, served on the `jsonl`
//! protocol by the `perago_body` package (sdk/python), run by the real runtime. The bodies
//! import the package from sdk/python/src (so the suite tests this tree's package); the
//! `dev` run of the example uses the copy scripts/test installs into the test Python.

use crate::harness::{Conductor, SUPERVISOR, SupervisorProc, TaskFixture, eventually};
use perago_tests::{Run, command, workspace_root};
use serde_json::{Value, json};
use std::{path::PathBuf, time::Duration};

/// A typed body whose params pick what it does; it prints one line per request.
const TYPED: &str = r#"
from pydantic import BaseModel, Field
from perago_body import Context, TerminalError, task

class Params(BaseModel):
    name: str
    mode: str = "ok"

class Result(BaseModel):
    greeting: str
    execution_id: str
    length: int = Field(ge=0)

@task(params=Params, result=Result)
def body(params: Params, ctx: Context) -> Result:
    print(f"typed body greeting {params.name}")
    if params.mode == "terminal":
        raise TerminalError(f"no greeting for {params.name}")
    if params.mode == "value":
        raise ValueError(f"cannot greet {params.name}")
    if params.mode == "bad_result":
        return {"greeting": "x", "execution_id": ctx.execution_id, "length": -1}
    if params.mode == "soft":
        cancelled = ctx.cancelled.wait(30)
        return Result(greeting="cancelled" if cancelled else "not cancelled", execution_id=ctx.execution_id, length=0)
    return Result(greeting=f"hello, {params.name}!", execution_id=ctx.execution_id, length=len(params.name))

if __name__ == "__main__":
    body.run()
"#;

/// The Python the tests run bodies with (`PERAGO_TEST_PYTHON`, else the workspace's .venv, as
/// the other Python-driven tests find it).
fn python() -> PathBuf {
    let python = std::env::var_os("PERAGO_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".venv/bin/python"));
    assert!(
        python.exists(),
        "{} is missing: run scripts/test, which makes .venv with pydantic and sdk/python",
        python.display()
    );
    python
}

/// A `jsonl` task whose body is [`TYPED`], run by the test Python with sdk/python/src on its
/// path; `retry_count = 1` (retry_delay_seconds 0), so a retried failure shows as two tasks.
fn typed_task(name: &str, manifest_tail: &str) -> TaskFixture {
    let task = TaskFixture::new(name, "", "retry_count = 1").with_file("body.py", TYPED);
    let src = workspace_root().join("sdk/python/src");
    let manifest = std::fs::read_to_string(task.manifest()).unwrap().replace(
        "command = [\"sh\", \"body.sh\"]",
        &format!(
            "command = [{}, \"body.py\"]\nprotocol = \"jsonl\"\nenv = {{ PYTHONPATH = {} }}\n{manifest_tail}",
            toml_string(&python().to_string_lossy()),
            toml_string(&src.to_string_lossy()),
        ),
    );
    std::fs::write(task.manifest(), manifest).unwrap();
    task
}

fn toml_string(text: &str) -> String {
    serde_json::to_string(text).unwrap()
}

/// The last task of a workflow.
fn last_task(wf: &Value) -> &Value {
    wf["tasks"]
        .as_array()
        .and_then(|t| t.last())
        .expect("a task")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typed_body_completes_fails_terminally_and_is_retried_as_its_errors_say() {
    let conductor = Conductor::start().await;
    let task = typed_task("e2e.typed", "");
    conductor.register(&task).await;
    let sup = SupervisorProc::start(&task, &conductor, 1, &[]);

    // Valid params: COMPLETED with the model's output.
    let id = conductor
        .start_workflow(&task, json!({"name": "Ada"}))
        .await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(
        wf["status"],
        "COMPLETED",
        "{}\n{}",
        last_task(&wf)["reasonForIncompletion"],
        sup.log_text()
    );
    let result = &wf["output"]["result"];
    let execution_id = result["execution_id"].as_str().unwrap().to_owned();
    assert_eq!(
        *result,
        json!({"greeting": "hello, Ada!", "execution_id": execution_id, "length": 3})
    );
    assert_eq!(execution_id.len(), 36, "{result}");

    // The body's print is in its worker's log, on the assignment's line with its ids.
    let worker = last_task(&wf)["workerId"].as_str().unwrap().to_owned();
    let task_id = last_task(&wf)["taskId"].as_str().unwrap().to_owned();
    let log = sup.jsonl_dir(&task, &worker).join("perago.jsonl");
    let printed = eventually(
        "the body's print in the worker log",
        Duration::from_secs(10),
        || async {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            text.lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .find(|l| l["stream"] == "stderr" && l["message"] == "typed body greeting Ada")
        },
    )
    .await;
    assert_eq!(printed["execution_id"], execution_id.as_str(), "{printed}");
    assert_eq!(printed["task_id"], task_id.as_str(), "{printed}");
    assert_eq!(printed["worker_id"], worker.as_str(), "{printed}");

    // Megabytes of unicode in the params line and in the answer.
    let long: String = "ü€𝄞".repeat(300_000);
    let id = conductor.start_workflow(&task, json!({"name": long})).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(
        wf["status"],
        "COMPLETED",
        "{}",
        last_task(&wf)["reasonForIncompletion"]
    );
    assert_eq!(
        wf["output"]["result"]["greeting"],
        format!("hello, {long}!")
    );
    assert_eq!(wf["output"]["result"]["length"], 900_000);

    // TerminalError: FAILED_WITH_TERMINAL_ERROR with its message, not retried.
    let id = conductor
        .start_workflow(&task, json!({"name": "Bo", "mode": "terminal"}))
        .await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    let tasks = wf["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 1, "not retried: {wf}");
    assert_eq!(tasks[0]["status"], "FAILED_WITH_TERMINAL_ERROR", "{wf}");
    assert_eq!(tasks[0]["reasonForIncompletion"], "no greeting for Bo");

    // A ValueError: FAILED with its type and message, and retried.
    let id = conductor
        .start_workflow(&task, json!({"name": "Cy", "mode": "value"}))
        .await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    let tasks = wf["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 2, "retried once: {wf}");
    for t in tasks {
        assert_eq!(t["status"], "FAILED", "{wf}");
        assert_eq!(t["reasonForIncompletion"], "ValueError: cannot greet Cy");
    }

    // Params the model refuses (no schema in this manifest: the body's own check): terminal,
    // naming the field.
    let id = conductor.start_workflow(&task, json!({"mode": "ok"})).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    let tasks = wf["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 1, "not retried: {wf}");
    assert_eq!(tasks[0]["status"], "FAILED_WITH_TERMINAL_ERROR", "{wf}");
    assert_eq!(
        tasks[0]["reasonForIncompletion"],
        "bad input: params do not match Params: params/name: Field required"
    );

    // A result that does not match its model: FAILED naming the field (and retried).
    let id = conductor
        .start_workflow(&task, json!({"name": "Di", "mode": "bad_result"}))
        .await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    let tasks = wf["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 2, "retried once: {wf}");
    assert_eq!(tasks[1]["status"], "FAILED", "{wf}");
    assert_eq!(
        tasks[1]["reasonForIncompletion"],
        "result does not match Result: result/length: Input should be greater than or equal to 0"
    );

    // None of that ended the body's loop: one process answered every request.
    let worker_log = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(
        worker_log.matches("started the jsonl body process").count(),
        1,
        "one body process for every task\n{worker_log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typed_body_sees_the_soft_limit_as_ctx_cancelled() {
    let conductor = Conductor::start().await;
    let task = typed_task("e2e.typedsoft", "soft_time_limit = \"1s\"");
    conductor.register(&task).await;
    let sup = SupervisorProc::start(&task, &conductor, 1, &[]);
    let id = conductor
        .start_workflow(&task, json!({"name": "Eve", "mode": "soft"}))
        .await;
    // Without the cancel the body would wait 30 s, past this deadline.
    let wf = conductor.wait_terminal(&id, Duration::from_secs(20)).await;
    assert_eq!(
        wf["status"],
        "COMPLETED",
        "{}\n{}",
        last_task(&wf)["reasonForIncompletion"],
        sup.log_text()
    );
    assert_eq!(wf["output"]["result"]["greeting"], "cancelled", "{wf}");
    assert_eq!(wf["tasks"].as_array().unwrap().len(), 1, "{wf}");
}

/// The example's schemas are what its code declares, and `extract` embeds them in the TaskDef.
#[test]
fn extract_embeds_the_schemas_the_package_generates() {
    let example = workspace_root().join("examples/greet-typed");
    let copy = tempfile::tempdir().unwrap();
    for file in ["task.toml", "greet_typed.py"] {
        std::fs::copy(example.join(file), copy.path().join(file)).unwrap();
    }
    let generate = Run::of(
        command(python())
            .args([
                "-m",
                "perago_body",
                "schema",
                "greet_typed:greet",
                "--out",
                "schemas",
            ])
            .env("PYTHONPATH", workspace_root().join("sdk/python/src"))
            .current_dir(copy.path()),
    );
    generate.expect_code(0);
    let read = |path: PathBuf| -> Value {
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let params = read(copy.path().join("schemas/params.json"));
    let result = read(copy.path().join("schemas/result.json"));
    // The example ships exactly these.
    assert_eq!(params, read(example.join("schemas/params.json")));
    assert_eq!(result, read(example.join("schemas/result.json")));
    assert_eq!(params["title"], "GreetParams");
    assert_eq!(params["properties"]["times"]["maximum"], 10);

    let manifest = copy.path().join("task.toml");
    let check = Run::of(command(SUPERVISOR).args(["check", manifest.to_str().unwrap()]));
    check.expect_code(0);
    let out = Run::of(command(SUPERVISOR).args(["extract", manifest.to_str().unwrap(), "-o", "-"]));
    out.expect_code(0);
    let def: Value = serde_json::from_str(&out.stdout).unwrap();
    let embedded = |schema: &Value, key: &str, generated: &Value| {
        let mut inner = schema["data"]["properties"][key].clone();
        assert!(inner["$id"].is_string(), "{schema}");
        inner.as_object_mut().unwrap().remove("$id");
        assert_eq!(inner, *generated, "{schema}");
    };
    embedded(&def["inputSchema"], "params", &params);
    embedded(&def["outputSchema"], "result", &result);
    assert_eq!(def["inputSchema"]["name"], "examples.greet_typed.input");
}

/// `perago-supervisor dev` runs the typed example with the package installed in the test
/// Python (scripts/test installs it; its bin folder goes first on PATH, for `python3`).
#[test]
fn dev_runs_the_typed_example() {
    let python = python();
    let installed = Run::of(command(&python).args(["-c", "import perago_body"]));
    assert_eq!(
        installed.code,
        Some(0),
        "perago_body is not installed in {}: run scripts/test, which installs sdk/python\n{installed}",
        python.display()
    );
    let bin = python.parent().unwrap().to_owned();
    let path = std::env::join_paths(std::iter::once(bin).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .unwrap();
    let out = Run::of(
        command(SUPERVISOR)
            .args([
                "dev",
                "examples/greet-typed/task.toml",
                "--input",
                r#"{"params": {"name": "Ada", "times": 2}}"#,
                "--input",
                r#"{"params": {"name": ""}}"#,
            ])
            .env("PATH", path)
            .env_remove("PYTHONPATH")
            .current_dir(workspace_root()),
    );
    out.expect_code(1);
    let lines: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let done = lines
        .iter()
        .find(|l| l["status"] == "COMPLETED")
        .unwrap_or_else(|| panic!("one completes\n{out}"));
    assert_eq!(
        done["output"]["result"],
        json!({"message": "hello, Ada! hello, Ada!", "length": 3})
    );
    let failed = lines
        .iter()
        .find(|l| l["status"] == "FAILED")
        .unwrap_or_else(|| panic!("one fails\n{out}"));
    assert_eq!(failed["task_status"], "FAILED_WITH_TERMINAL_ERROR");
    assert_eq!(failed["reason"], "params.name is empty");
    assert!(
        out.stderr
            .contains("greeting Ada 2 time(s) as examplesgreettyped0001"),
        "{out}"
    );
}
