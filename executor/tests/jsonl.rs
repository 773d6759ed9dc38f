//! The `jsonl` body protocol: one persistent process answers every assignment; errors,
//! crashes, protocol breaks and overruns fail only their assignment, and the process is
//! started again for the next one.

#![forbid(unsafe_code)]

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

/// Starts the runner's body process and waits until the interpreter has started (the body
/// written by [`ready_marking`] says so), so an assignment's time limit does not include
/// Python's start-up; its pid.
async fn started_body(runner: &AssignmentRunner, dir: &std::path::Path) -> u32 {
    let pid = runner.start_body().await.unwrap().expect("a jsonl body");
    let marker = dir.join(format!("ready.{pid}"));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !marker.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the body process {pid} did not start within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    pid
}

/// [`BODY`], marking each process's start in `dir` once its imports are done.
fn ready_marking(dir: &std::path::Path) {
    let marker = dir.join("ready");
    let body = format!(
        "import os\nopen({:?} + '.' + str(os.getpid()), 'w').close()\n{BODY}",
        marker.to_str().unwrap()
    );
    fs::write(dir.join("body.py"), body).unwrap();
}

#[tokio::test]
async fn an_overrun_is_stopped_and_the_process_replaced() {
    let (dir, runner) = runner(1);
    ready_marking(dir.path());
    // The 1 s limit is the assignment's; the processes start (and Python with them, which can
    // take longer than that on a loaded machine) before the assignments that must not overrun.
    let started = started_body(&runner, dir.path()).await;
    let pid = result(&run(&runner, "e1", json!({})).await)["pid"].clone();
    assert_eq!(pid, json!(started));
    let r = run(&runner, "e2", json!({"sleep": 30})).await;
    assert_eq!(
        reason(&r, ResultStatus::Failed),
        "body timed out after 1s (task.timeout_seconds) and was stopped"
    );
    let replacement = started_body(&runner, dir.path()).await;
    assert_ne!(replacement, started, "the overrun process was stopped");
    let after = result(&run(&runner, "e3", json!({})).await)["pid"].clone();
    assert_eq!(after, json!(replacement));
    assert_ne!(after, pid);
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
    let r = run(&runner, "e-big", json!({"big": 10 * 1024 * 1024 + 1})).await;
    let text = reason(&r, ResultStatus::FailedWithTerminalError);
    assert!(
        text.starts_with("task output is 1048") && text.contains("limit of 10485760 bytes"),
        "{text}"
    );
    let ok = result(&run(&runner, "e-ok", json!({"big": 1024})).await);
    assert_eq!(ok, json!("x".repeat(1024)));
}

/// An answer line longer than any answer Conductor could take (here 40 MiB without a newline,
/// the process then waiting) fails its assignment terminally, at once, naming both sizes, and
/// a fresh process takes the next one. Before, the executor read on until the time limit,
/// holding all of it (an endless line: until memory ran out).
#[tokio::test]
async fn an_answer_line_above_the_cap_fails_terminally_and_the_process_is_replaced() {
    let (_dir, runner) = runner_of(
        r#"
import json, os, sys, time
for line in sys.stdin:
    req = json.loads(line)
    if req["params"].get("flood"):
        chunk = "x" * (1 << 20)
        for _ in range(40):
            sys.stdout.write(chunk)
        sys.stdout.flush()
        time.sleep(60)
    print(json.dumps({"execution_id": req["execution_id"], "result": {"pid": os.getpid()}}), flush=True)
"#,
        60,
    );
    let first = pid_of(&runner, "e-before", json!({})).await;
    let r = run(&runner, "e-flood", json!({"flood": true})).await;
    let text = reason(&r, ResultStatus::FailedWithTerminalError);
    assert!(
        text.contains("answer line of more than 11534336 bytes")
            && text.contains("at most 10485760 bytes"),
        "{text}"
    );
    let next = pid_of(&runner, "e-after", json!({})).await;
    assert_ne!(first, next, "the flooding process was replaced");
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

/// A runner of the `jsonl` body `script` (Python), with a time limit of `timeout` seconds.
fn runner_of(script: &str, timeout: u64) -> (tempfile::TempDir, AssignmentRunner) {
    let (dir, runner) = runner(timeout);
    fs::write(dir.path().join("body.py"), script).unwrap();
    (dir, runner)
}

/// The pid in a result, for bodies that answer `{"pid": …}`.
async fn pid_of(runner: &AssignmentRunner, id: &str, params: Value) -> Value {
    let r = run(runner, id, params).await;
    result(&r)["pid"].clone()
}

/// A body that exits after each answer: the process is gone before the next request, which a
/// fresh one takes; no assignment fails for it (today every other one did: its request went
/// to the process that was exiting).
#[tokio::test]
async fn a_body_that_exits_after_each_answer_fails_nothing() {
    let (_dir, runner) = runner_of(
        r#"
import json, os, sys
req = json.loads(sys.stdin.readline())
print(json.dumps({"execution_id": req["execution_id"], "result": {"pid": os.getpid()}}), flush=True)
"#,
        10,
    );
    let mut pids = Vec::new();
    for n in 0..6 {
        pids.push(pid_of(&runner, &format!("e{n}"), json!({})).await);
    }
    pids.dedup();
    assert_eq!(pids.len(), 6, "a fresh process for each: {pids:?}");
}

/// The same, when the process is still on its way out as the next request is written: the
/// request it never read goes to a fresh process.
#[tokio::test]
async fn a_body_exiting_slowly_after_its_answer_fails_nothing() {
    let (_dir, runner) = runner_of(
        r#"
import json, os, sys, time
req = json.loads(sys.stdin.readline())
print(json.dumps({"execution_id": req["execution_id"], "result": {"pid": os.getpid()}}), flush=True)
time.sleep(0.2)
"#,
        10,
    );
    for n in 0..4 {
        pid_of(&runner, &format!("e{n}"), json!({})).await;
    }
}

/// A body that closes its stdin and lives on: the next request goes to a fresh process, also
/// when the stdin closes only after the next request was written.
#[tokio::test]
async fn a_body_that_closes_its_stdin_is_replaced_without_failing_the_next() {
    let (_dir, runner) = runner_of(
        r#"
import json, os, sys, time
req = json.loads(sys.stdin.readline())
late = req["params"].get("late")
if not late:
    os.close(0)
print(json.dumps({"execution_id": req["execution_id"], "result": {"pid": os.getpid()}}), flush=True)
if late:
    time.sleep(0.2)
    os.close(0)
time.sleep(60)
"#,
        10,
    );
    let first = pid_of(&runner, "e1", json!({})).await;
    let second = pid_of(&runner, "e2", json!({"late": true})).await;
    let third = pid_of(&runner, "e3", json!({})).await;
    assert_ne!(first, second);
    assert_ne!(second, third);
}

/// Answers as asked, and for `{"poison": true}` writes a second line with its answer (in the
/// same write); for `{"late": true}` writes a duplicate of its answer later, then touches
/// `late.done`; for `{"dup_before": …}` first repeats its answer to the execution before.
const EXTRA_LINES: &str = r#"
import json, os, sys, time
last = None
for line in sys.stdin:
    req = json.loads(line)
    p = req["params"]
    eid = req["execution_id"]
    out = json.dumps({"execution_id": eid, "result": {"pid": os.getpid()}})
    if p.get("dup_before") and last:
        print(last, flush=True)
    if p.get("other"):
        print(json.dumps({"execution_id": "someone-else", "result": 1}), flush=True)
        continue
    if p.get("poison"):
        sys.stdout.write(out + "\n" + out + "\n")
        sys.stdout.flush()
    else:
        print(out, flush=True)
    if p.get("late"):
        time.sleep(0.1)
        print(out, flush=True)
        open("late.done", "w").close()
    last = out
"#;

/// An extra line that came with the answer fails the assignment it came with; the next one
/// gets a fresh process and completes.
#[tokio::test]
async fn an_extra_line_fails_only_the_assignment_it_came_with() {
    let (_dir, runner) = runner_of(EXTRA_LINES, 10);
    let first = pid_of(&runner, "e1", json!({})).await;
    let r = run(&runner, "e2", json!({"poison": true})).await;
    let text = reason(&r, ResultStatus::Failed);
    assert!(
        text.starts_with("the body process wrote more than its answer for execution e2"),
        "{text}"
    );
    let next = pid_of(&runner, "e3", json!({})).await;
    assert_ne!(first, next, "the process that wrote it was replaced");
}

/// A line written after an answer was read (a stale or duplicate line) is never read as the
/// next assignment's answer: found before the next request, the process is replaced; arriving
/// after it (a repeat of the answer before), it is skipped. The next assignment completes.
#[tokio::test]
async fn a_stale_line_is_never_charged_to_the_next_assignment() {
    let (dir, runner) = runner_of(EXTRA_LINES, 10);
    let first = pid_of(&runner, "e1", json!({"late": true})).await;
    let done = dir.path().join("late.done");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !done.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the body never wrote its late line"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let second = pid_of(&runner, "e2", json!({})).await;
    assert_ne!(first, second, "the process with a stale line was replaced");
    // A repeat of e2's answer comes before e3's.
    let third = pid_of(&runner, "e3", json!({"dup_before": true})).await;
    assert_eq!(
        second, third,
        "the repeat was skipped, e3's own answer taken"
    );
    let fourth = pid_of(&runner, "e4", json!({})).await;
    assert_ne!(
        third, fourth,
        "the process that repeated itself was replaced after"
    );
    // An answer for an execution that is neither is this assignment's failure.
    let r = run(&runner, "e5", json!({"other": true})).await;
    assert_eq!(
        reason(&r, ResultStatus::Failed),
        "the body process answered for execution \"someone-else\", not e5"
    );
}

/// `result` together with `error` is no answer, and `terminal` is a boolean or nothing.
#[tokio::test]
async fn an_answer_with_result_and_error_or_a_bad_terminal_fails() {
    let (_dir, runner) = runner_of(
        r#"
import json, sys
for line in sys.stdin:
    req = json.loads(line)
    out = dict(req["params"]["answer"])
    out["execution_id"] = req["execution_id"]
    print(json.dumps(out), flush=True)
"#,
        10,
    );
    let r = run(
        &runner,
        "e1",
        json!({"answer": {"result": 1, "error": {"message": "no", "terminal": true}}}),
    )
    .await;
    assert_eq!(
        reason(&r, ResultStatus::Failed),
        "the body process answered with both result and error"
    );
    for terminal in [json!("yes"), json!(1), json!(null)] {
        let r = run(
            &runner,
            "e2",
            json!({"answer": {"error": {"message": "no", "terminal": terminal}}}),
        )
        .await;
        assert_eq!(
            reason(&r, ResultStatus::Failed),
            format!(
                "the body process answered with an error whose terminal is not true or false: {terminal}"
            )
        );
    }
    // A null error beside a result is no error; an error without terminal is not terminal.
    let r = run(
        &runner,
        "e3",
        json!({"answer": {"result": 7, "error": null}}),
    )
    .await;
    assert_eq!(result(&r), json!(7));
    let r = run(
        &runner,
        "e4",
        json!({"answer": {"error": {"message": "no"}}}),
    )
    .await;
    assert_eq!(reason(&r, ResultStatus::Failed), "no");
}

/// What a body process inherited, as it sees it: open descriptors, signal mask and
/// dispositions, process group and session, parent-death signal, user and groups, umask,
/// descriptor limit and the names of its environment. Run as a command body it prints its
/// report once; with `jsonl` it answers each request with it.
const INHERITED: &str = r#"
import ctypes, json, os, sys
def report():
    status = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
    limits = [l for l in open("/proc/self/limits").read().splitlines() if l.startswith("Max open files")]
    death = ctypes.c_int(-1)
    ctypes.CDLL(None).prctl(2, ctypes.byref(death), 0, 0, 0)  # PR_GET_PDEATHSIG
    umask = os.umask(0o22)
    os.umask(umask)
    return {
        "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
        "blocked": status["SigBlk"].strip(),
        "ignored": status["SigIgn"].strip(),
        "caught": status["SigCgt"].strip(),
        "leads_its_group": os.getpgid(0) == os.getpid(),
        "leads_a_session": os.getsid(0) == os.getpid(),
        "parent": os.getppid(),
        "death_signal": death.value,
        "user": [os.getuid(), os.geteuid(), os.getgid(), os.getegid(), sorted(os.getgroups())],
        "umask": umask,
        "nofile": limits,
        "env": sorted(name for name in os.environ if not name.startswith("PERAGO_")),
    }
if sys.argv[1:] == ["jsonl"]:
    for line in sys.stdin:
        eid = json.loads(line)["execution_id"]
        print(json.dumps({"execution_id": eid, "result": {"inherited": report()}}), flush=True)
else:
    sys.stdin.read()
    print(json.dumps({"inherited": report()}))
"#;

/// A `jsonl` body and a command body start through one spawn path (`command::body_spawn`):
/// what one inherits, the other does. Fails if the two drift apart (a descriptor, a signal
/// left blocked or ignored, another process group, no parent-death signal, another user or
/// environment).
#[tokio::test]
async fn a_jsonl_body_inherits_what_a_command_body_inherits() {
    let report = |protocol: &str| {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("inherited.py"), INHERITED).unwrap();
        let (args, protocol) = match protocol {
            "jsonl" => (", \"jsonl\"", "protocol = \"jsonl\"\n"),
            _ => ("", ""),
        };
        fs::write(
            dir.path().join("task.toml"),
            format!(
                "[task]\nname = \"jsonl.task\"\nkind = \"workspace-free\"\ntimeout_seconds = 10\n\
                 [body]\ncommand = [\"python3\", \"-u\", \"inherited.py\"{args}]\n{protocol}\
                 env = {{ GREETING = \"hi\" }}\n"
            ),
        )
        .unwrap();
        let manifest = Arc::new(Manifest::load(&dir.path().join("task.toml")).unwrap());
        let runner = AssignmentRunner::new(
            manifest,
            "inheritedtask0001".into(),
            std::env::var_os("PATH").as_deref(),
        )
        .unwrap();
        (dir, runner)
    };
    let (_command_dir, command) = report("command");
    let (_jsonl_dir, jsonl) = report("jsonl");
    let command = run(&command, "c1", json!({})).await;
    let jsonl = run(&jsonl, "j1", json!({})).await;
    let inherited = |r: &RuntimeResult| match r.outcome() {
        Outcome::Completed(out) => out.to_value().unwrap()["result"]["inherited"].clone(),
        other => panic!("expected COMPLETED, got {other:?}"),
    };
    let (command, jsonl) = (inherited(&command), inherited(&jsonl));
    assert!(command.is_object(), "{command}");
    assert_eq!(command["leads_its_group"], true, "{command}");
    assert_eq!(command["death_signal"], 9, "SIGKILL: {command}");
    assert!(
        command["env"]
            .as_array()
            .unwrap()
            .contains(&json!("GREETING"))
    );
    for (what, seen) in command.as_object().unwrap() {
        assert_eq!(
            &jsonl[what], seen,
            "{what}: the jsonl body and the command body differ"
        );
    }
    assert_eq!(jsonl, command);
}
