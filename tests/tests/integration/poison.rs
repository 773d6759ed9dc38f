//! Poison tasks (issue 12, item 6): a workflow task whose attempts kill their executor
//! `PERAGO_POISON_AFTER` times (default 3) is failed with FAILED_WITH_TERMINAL_ERROR, so it
//! stops taking executors down, while every other task keeps completing.

use crate::harness::{Conductor, SupervisorProc, TaskFixture};
use serde_json::{Value, json};
use std::time::Duration;

/// For `{"poison": true}` the body SIGKILLs its parent, the executor (process mode runs the
/// body as the executor's direct child); otherwise it echoes its input.
const BODY: &str = r#"read params
case "$params" in
  *poison*) kill -9 "$PPID"; sleep 30 ;;
esac
printf '{"echo": %s}' "$params"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_kills_its_executor_three_times_fails_for_good_and_others_complete() {
    let conductor = Conductor::start().await;
    // Five retries: without poison detection the pill would take six executors down.
    let task = TaskFixture::new("poison.pill", BODY, "retry_count = 5");
    conductor.register(&task).await;
    let sup = SupervisorProc::start(&task, &conductor, 2, &[]);
    let pill = conductor
        .start_workflow(&task, json!({"poison": true}))
        .await;
    let mut others = Vec::new();
    for n in 0..10 {
        others.push((n, conductor.start_workflow(&task, json!({"n": n})).await));
    }

    let wf = conductor
        .wait_terminal(&pill, Duration::from_secs(25))
        .await;
    assert_eq!(wf["status"], "FAILED", "{wf:#}\n{}", sup.log_text());
    let attempts: Vec<&Value> = wf["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["referenceTaskName"] == "t")
        .collect();
    let statuses: Vec<&str> = attempts
        .iter()
        .map(|t| t["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        statuses,
        ["FAILED", "FAILED", "FAILED_WITH_TERMINAL_ERROR"],
        "{wf:#}\n{}",
        sup.log_text()
    );
    let reason = attempts[2]["reasonForIncompletion"].as_str().unwrap();
    assert!(
        reason.starts_with(&format!(
            "poison task: attempts of workflow task t in workflow {pill} killed their executor 3 times (PERAGO_POISON_AFTER=3); last: executor "
        )),
        "{reason}"
    );
    assert!(reason.contains("signal 9"), "{reason}");
    for t in &attempts[..2] {
        let reason = t["reasonForIncompletion"].as_str().unwrap();
        assert!(!reason.starts_with("poison task"), "{reason}");
    }

    for (n, id) in &others {
        let wf = conductor.wait_terminal(id, Duration::from_secs(20)).await;
        assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
        assert_eq!(wf["output"]["result"]["echo"], json!({"n": n}));
    }
    let socket = sup.workspace_root().join("run/broker.sock");
    let out = std::process::Command::new(crate::harness::SUPERVISOR)
        .args(["status", "--json", "--socket", socket.to_str().unwrap()])
        .output()
        .unwrap();
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["counters"]["tasks_poisoned"], 1, "{status:#}");
    assert_eq!(status["capacity"]["poison_after"], 3, "{status:#}");
    let log = sup.log_text();
    assert_eq!(
        log.matches("poison task: attempts of workflow task")
            .count(),
        1,
        "{log}"
    );
}
