//! `body.soft_time_limit` end to end: at the soft limit an `exec` body gets SIGUSR1 and a
//! `jsonl` body a cancel line, so it can return what it has; one that ignores it is stopped at
//! the hard limit as before.

use crate::harness::{Conductor, SupervisorProc, TaskFixture};
use serde_json::json;
use std::time::Duration;

/// Traps SIGUSR1 and prints its partial result; without the signal it would print the full
/// one after 30 s.
const TRAPPING: &str = "cat > /dev/null\n\
                        trap 'echo \"{\\\"partial\\\": true}\"; exit 0' USR1\n\
                        sleep 30 &\nwait $!\necho '{\"partial\": false}'\n";

/// Ignores SIGUSR1 and sleeps past the hard limit.
const IGNORING: &str = "cat > /dev/null\ntrap '' USR1\necho stubborn >&2\nsleep 30\n";

/// Answers each request when it reads the cancel line for it.
const CANCELLABLE: &str = r#"
import json, sys
for line in sys.stdin:
    req = json.loads(line)
    if "cancel" in req:
        continue
    cancel = json.loads(sys.stdin.readline())
    out = {"execution_id": req["execution_id"], "result": {"cancelled": cancel["cancel"]}}
    print(json.dumps(out), flush=True)
"#;

fn fixture(name: &str, body: &str) -> TaskFixture {
    // A 3 s hard limit, the soft one at 1 s; no retry, so a failure stays one. ALERT_ONLY:
    // Conductor's own timeoutSeconds would otherwise race the executor's hard limit.
    TaskFixture::new(
        name,
        body,
        "retry_count = 0\ntimeout_policy = \"ALERT_ONLY\"",
    )
    .with_manifest_tail("soft_time_limit = \"1s\"\n")
}

/// `timeout_seconds = 3` replaces the fixture's 60.
fn short(task: TaskFixture) -> TaskFixture {
    let manifest = std::fs::read_to_string(task.manifest())
        .unwrap()
        .replace("timeout_seconds = 60", "timeout_seconds = 3");
    std::fs::write(task.manifest(), manifest).unwrap();
    task
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_body_that_traps_sigusr1_completes_with_its_partial_result() {
    for mode in ["process", "thread"] {
        let conductor = Conductor::start().await;
        let task = short(fixture("e2e.soft", TRAPPING));
        conductor.register(&task).await;
        let _sup = SupervisorProc::start(&task, &conductor, 1, &[("PERAGO_EXECUTION_MODE", mode)]);
        let id = conductor.start_workflow(&task, json!({})).await;
        let wf = conductor.wait_terminal(&id, Duration::from_secs(20)).await;
        assert_eq!(
            wf["status"], "COMPLETED",
            "{mode}: {}",
            wf["tasks"][0]["reasonForIncompletion"]
        );
        assert_eq!(wf["output"]["result"], json!({"partial": true}), "{mode}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_body_that_ignores_sigusr1_is_stopped_at_the_hard_limit() {
    let conductor = Conductor::start().await;
    let task = short(fixture("e2e.softignored", IGNORING));
    conductor.register(&task).await;
    let sup = SupervisorProc::start(&task, &conductor, 1, &[]);
    let id = conductor.start_workflow(&task, json!({})).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "FAILED", "{wf}");
    let reason = wf["tasks"][0]["reasonForIncompletion"].as_str().unwrap();
    assert!(
        reason.starts_with("body timed out after 3s (task.timeout_seconds)")
            && reason.ends_with("stubborn"),
        "{reason}"
    );
    // The soft limit was reached first, and logged with the ids.
    let logs = worker_log(&sup, &task);
    assert!(
        logs.contains("soft time limit reached (body.soft_time_limit); sending the body SIGUSR1"),
        "{logs}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jsonl_body_reads_the_cancel_line_at_the_soft_limit() {
    let conductor = Conductor::start().await;
    let task = short(
        TaskFixture::new("e2e.softjsonl", "", "retry_count = 0").with_file("body.py", CANCELLABLE),
    );
    let manifest = std::fs::read_to_string(task.manifest())
        .unwrap()
        .replace(
            "command = [\"sh\", \"body.sh\"]",
            "command = [\"python3\", \"-u\", \"body.py\"]\nprotocol = \"jsonl\"\nsoft_time_limit = \"1s\"",
        );
    std::fs::write(task.manifest(), manifest).unwrap();
    conductor.register(&task).await;
    let _sup = SupervisorProc::start(&task, &conductor, 1, &[]);
    let id = conductor.start_workflow(&task, json!({})).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(20)).await;
    assert_eq!(
        wf["status"], "COMPLETED",
        "{}",
        wf["tasks"][0]["reasonForIncompletion"]
    );
    let execution = &wf["output"]["result"]["cancelled"];
    assert!(execution.as_str().is_some_and(|e| !e.is_empty()), "{wf}");
}

/// Every JSONL log line of the task's workers.
fn worker_log(sup: &SupervisorProc, task: &TaskFixture) -> String {
    let dir = sup.jsonl_dir(task, &format!("{}0001", task.prefix()));
    std::fs::read_to_string(dir.join("perago.jsonl")).unwrap_or_default()
}

#[test]
fn check_names_a_soft_limit_that_is_not_below_the_timeout() {
    use perago_tests::{Run, command};
    let task = short(fixture("e2e.softcheck", TRAPPING));
    let ok = Run::of(
        command(crate::harness::SUPERVISOR).args(["check", task.manifest().to_str().unwrap()]),
    );
    ok.expect_code(0);
    assert!(
        ok.stdout.contains(
            "  soft time limit: 1s (SIGUSR1 to an exec body, a cancel line to a jsonl body)"
        ),
        "{}",
        ok.stdout
    );
    let manifest = std::fs::read_to_string(task.manifest())
        .unwrap()
        .replace("soft_time_limit = \"1s\"", "soft_time_limit = \"3s\"");
    std::fs::write(task.manifest(), manifest).unwrap();
    let bad = Run::of(
        command(crate::harness::SUPERVISOR).args(["check", task.manifest().to_str().unwrap()]),
    );
    bad.expect_code(1);
    assert!(
        bad.stderr.contains("body.soft_time_limit: 3s is not below task.timeout_seconds (3s); the soft limit must come before the hard one"),
        "{}",
        bad.stderr
    );
}
