//! Issue #24, item 3: no task waits for a batch poll to fill. Conductor's SQL queues answer a
//! batch poll only once it holds `count` tasks or its timeout has passed (devstack's default
//! `fill-or-timeout`); the broker used to ask for every free slot with the whole long-poll
//! wait, so at `-j 4` a lone task waited about `PERAGO_POLL_WAIT_MS` before it started.

use std::time::Duration;

use perago_devstack::conductor::QueueSemantics;
use serde_json::{Value, json};

use crate::harness::{Conductor, SupervisorProc, TaskFixture, eventually};

/// The long-poll wait these tests run with: what a lone task waited before the fix.
const LONG_POLL_MS: &str = "5000";
/// A lone task's schedule-to-start must stay well under [`LONG_POLL_MS`].
const PROMPT: Duration = Duration::from_millis(1500);

/// Runs `-j 4` against devstack with `semantics` and starts `TASKS` workflows one at a time,
/// each once the previous one has completed and the broker's poll is waiting again; returns
/// each task's schedule-to-start (`startTime − scheduledTime`, as Conductor recorded them).
async fn lone_tasks(semantics: QueueSemantics, name: &str) -> Vec<Duration> {
    const TASKS: usize = 3;
    let conductor = Conductor::start_semantics(semantics).await;
    let task = TaskFixture::new(name, "echo '{\"done\": true}'\n", "");
    conductor.register(&task).await;
    let sup = SupervisorProc::start(
        &task,
        &conductor,
        4,
        &[("PERAGO_POLL_WAIT_MS", LONG_POLL_MS)],
    );
    let mut waits = Vec::new();
    for n in 0..TASKS {
        // A poll is waiting on an empty queue (all four slots idle once a task has run).
        eventually(
            "the broker's poll to wait",
            Duration::from_secs(30),
            || async { (conductor.server.polls_waiting() >= 1).then_some(()) },
        )
        .await;
        let id = conductor.start_workflow(&task, json!({"n": n})).await;
        let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
        assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
        let t: &Value = &wf["tasks"][0];
        let started = t["startTime"].as_i64().unwrap() - t["scheduledTime"].as_i64().unwrap();
        waits.push(Duration::from_millis(u64::try_from(started).unwrap()));
    }
    waits
}

fn assert_prompt(waits: &[Duration], semantics: QueueSemantics) {
    assert!(
        waits.iter().all(|w| *w < PROMPT),
        "with {semantics} queues and -j 4, every lone task starts well within the long poll \
         ({LONG_POLL_MS} ms): schedule-to-start {waits:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_task_at_j4_starts_at_once_on_fill_or_timeout_queues() {
    let semantics = QueueSemantics::FillOrTimeout;
    assert_prompt(&lone_tasks(semantics, "polls.fill").await, semantics);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_task_at_j4_starts_at_once_on_immediate_queues() {
    let semantics = QueueSemantics::Immediate;
    assert_prompt(&lone_tasks(semantics, "polls.immediate").await, semantics);
}
