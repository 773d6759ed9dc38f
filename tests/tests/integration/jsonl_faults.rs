//! A misbehaving `jsonl` body, end to end: what it does is charged to the task that caused it,
//! never to the next, healthy one.

use crate::harness::{Conductor, SupervisorProc, TaskFixture};
use serde_json::json;
use std::time::Duration;

/// A `jsonl` task whose body is the Python script `script`; no retries, so a failure shows.
fn jsonl_task(name: &str, script: &str) -> TaskFixture {
    let task = TaskFixture::new(name, "", "retry_count = 0").with_file("body.py", script);
    let manifest = std::fs::read_to_string(task.manifest()).unwrap().replace(
        "command = [\"sh\", \"body.sh\"]",
        "command = [\"python3\", \"-u\", \"body.py\"]\nprotocol = \"jsonl\"",
    );
    std::fs::write(task.manifest(), manifest).unwrap();
    task
}

/// Answers one request, then exits.
const ONE_AND_DONE: &str = r#"
import json, os, sys
req = json.loads(sys.stdin.readline())
print(json.dumps({"execution_id": req["execution_id"], "result": {"pid": os.getpid()}}), flush=True)
"#;

/// A body that exits after every answer: each task still COMPLETES, at its first try (before,
/// every other one failed: its request went to the process on its way out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jsonl_body_that_exits_after_every_answer_fails_no_task() {
    for mode in ["process", "thread"] {
        let conductor = Conductor::start().await;
        let task = jsonl_task("e2e.oneanddone", ONE_AND_DONE);
        conductor.register(&task).await;
        let sup = SupervisorProc::start(&task, &conductor, 1, &[("PERAGO_EXECUTION_MODE", mode)]);
        let mut pids = Vec::new();
        for n in 0..5 {
            let id = conductor.start_workflow(&task, json!({"n": n})).await;
            let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
            assert_eq!(
                wf["status"],
                "COMPLETED",
                "{mode}: {}\n{}",
                wf["tasks"][0]["reasonForIncompletion"],
                sup.log_text()
            );
            assert_eq!(wf["tasks"].as_array().unwrap().len(), 1, "{mode}: no retry");
            pids.push(wf["output"]["result"]["pid"].clone());
        }
        pids.dedup();
        assert_eq!(pids.len(), 5, "{mode}: a fresh process for each: {pids:?}");
    }
}

/// Answers each request; for `{"poison": true}` a second line comes with the answer.
const POISONABLE: &str = r#"
import json, os, sys
for line in sys.stdin:
    req = json.loads(line)
    out = json.dumps({"execution_id": req["execution_id"], "result": {"pid": os.getpid()}})
    if req["params"].get("poison"):
        sys.stdout.write(out + "\n" + out + "\n")
        sys.stdout.flush()
    else:
        print(out, flush=True)
"#;

/// A body that writes an extra line for one poisoned input: only that task fails; the next one
/// runs in a fresh process and completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_task_whose_answer_came_with_an_extra_line_fails() {
    for mode in ["process", "thread"] {
        let conductor = Conductor::start().await;
        let task = jsonl_task("e2e.poisonline", POISONABLE);
        conductor.register(&task).await;
        let sup = SupervisorProc::start(&task, &conductor, 1, &[("PERAGO_EXECUTION_MODE", mode)]);
        let mut pids = Vec::new();
        for n in 0..5 {
            let poison = n == 2;
            let id = conductor
                .start_workflow(&task, json!({"n": n, "poison": poison}))
                .await;
            let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
            let reason = wf["tasks"][0]["reasonForIncompletion"]
                .as_str()
                .unwrap_or("");
            if poison {
                assert_eq!(wf["status"], "FAILED", "{mode}: {wf}");
                assert!(
                    reason.starts_with("the body process wrote more than its answer for execution"),
                    "{mode}: {reason}"
                );
            } else {
                assert_eq!(
                    wf["status"],
                    "COMPLETED",
                    "{mode}: {reason}\n{}",
                    sup.log_text()
                );
                pids.push(wf["output"]["result"]["pid"].clone());
            }
        }
        assert_eq!(pids[0], pids[1], "{mode}: one process until the poison");
        assert_ne!(pids[1], pids[2], "{mode}: replaced after it");
        assert_eq!(pids[2], pids[3], "{mode}");
    }
}
