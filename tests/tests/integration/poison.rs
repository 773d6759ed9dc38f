//! Poison tasks (issue 12, item 6): a workflow task whose attempts kill their executor
//! `PERAGO_POISON_AFTER` times (default 3) is failed with FAILED_WITH_TERMINAL_ERROR, so it
//! stops taking executors down, while every other task keeps completing. The count is
//! Conductor's (issue #23, item 1): it carries over a runtime restart. Outside kills that hit
//! other tasks too are not counted: chaos.rs has that case.

use crate::harness::{Conductor, SupervisorProc, TaskFixture, eventually};
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

/// The attempts of workflow task `t` in `wf`, oldest first.
fn attempts(wf: &Value) -> Vec<&Value> {
    wf["tasks"]
        .as_array()
        .map(|t| t.iter().filter(|t| t["referenceTaskName"] == "t").collect())
        .unwrap_or_default()
}

fn reason(attempt: &Value) -> &str {
    attempt["reasonForIncompletion"]
        .as_str()
        .unwrap_or_default()
}

/// Issue #23, item 1: a poison task's count carries over a runtime restart. The pill kills
/// its executor twice on a first runtime, which is then stopped; a second runtime (on a
/// fresh workspace root, as on another host) reads the count back from Conductor's record of
/// the earlier attempts and fails the third attempt for good, not the fifth. Before the fix
/// the count lived in the broker's memory only: the second runtime started from zero and the
/// workflow ran to its fifth attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_tasks_count_carries_over_a_runtime_restart() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("poison.restart", BODY, "retry_count = 5");
    // A retry waits 5 s: the first runtime is stopped before the third attempt is due.
    let manifest = std::fs::read_to_string(task.manifest()).unwrap();
    std::fs::write(
        task.manifest(),
        manifest.replace("retry_delay_seconds = 0", "retry_delay_seconds = 5"),
    )
    .unwrap();
    conductor.register(&task).await;
    let mut first = SupervisorProc::start(&task, &conductor, 1, &[]);
    let pill = conductor
        .start_workflow(&task, json!({"poison": true}))
        .await;
    let wf = eventually(
        "two crashes on the first runtime",
        Duration::from_secs(25),
        || {
            let (conductor, pill) = (&conductor, &pill);
            async move {
                let wf = conductor.workflow(pill).await;
                let failed = attempts(&wf)
                    .iter()
                    .filter(|t| t["status"] == "FAILED")
                    .count();
                (failed >= 2).then_some(wf)
            }
        },
    )
    .await;
    first.signal("TERM");
    let status = first.wait_exit(Duration::from_secs(15)).await;
    assert!(status.success(), "{status}\n{}", first.log_text());
    let crashes = attempts(&wf);
    for (n, attempt) in crashes[..2].iter().enumerate() {
        let reason = reason(attempt);
        assert!(
            reason.ends_with(&format!(
                "; crash {} of 3 counted against this workflow task (PERAGO_POISON_AFTER=3)",
                n + 1
            )),
            "attempt {n}: {reason}"
        );
    }
    let wf = conductor.workflow(&pill).await;
    let statuses: Vec<&str> = attempts(&wf)
        .iter()
        .map(|t| t["status"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        statuses,
        ["FAILED", "FAILED", "SCHEDULED"],
        "the third attempt waits for a runtime\n{wf:#}"
    );

    let second = SupervisorProc::start(&task, &conductor, 1, &[]);
    let wf = conductor
        .wait_terminal(&pill, Duration::from_secs(25))
        .await;
    assert_eq!(wf["status"], "FAILED", "{wf:#}\n{}", second.log_text());
    let attempts = attempts(&wf);
    let statuses: Vec<&str> = attempts
        .iter()
        .map(|t| t["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        statuses,
        ["FAILED", "FAILED", "FAILED_WITH_TERMINAL_ERROR"],
        "{wf:#}\n{}",
        second.log_text()
    );
    let last = reason(attempts[2]);
    assert!(
        last.starts_with(&format!(
            "poison task: attempts of workflow task t in workflow {pill} killed their executor 3 times (PERAGO_POISON_AFTER=3); last: executor "
        )),
        "{last}"
    );
    second
        .log_with(
            "read the crashes counted before this attempt from Conductor",
            Duration::from_secs(5),
        )
        .await;
}
