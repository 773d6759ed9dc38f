//! Nothing a body starts outlives its assignment, its executor or the runtime: double-forked
//! `setsid` daemons, background jobs of a shell, across every way a runtime ends (issue 10,
//! item 3), and the honest exits of broker death and the shutdown deadline (item 4).
//!
//! Each test marks the processes its bodies leave behind with a `sleep` of a duration no other
//! test uses, and looks for that duration in every `/proc/*/cmdline`.

use crate::harness::{Conductor, SupervisorProc, TaskFixture, child_named, eventually};
use perago_sys::proc::stat;
use serde_json::json;
use std::time::{Duration, Instant};

/// A `sleep` argument no other test (nor any other process on the machine) uses.
fn marker(test: u32) -> String {
    format!("{}.{}{test}", 7000 + test, std::process::id())
}

/// Live (non-zombie) processes whose command line holds `marker`.
fn marked(marker: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if text.contains(marker) && stat(pid).is_some_and(|s| s.state != 'Z') {
            found.push(pid);
        }
    }
    found
}

/// Waits until no process carries `marker`; panics naming the survivors after `within`.
async fn none_left(marker: &str, within: Duration, log: impl Fn() -> String) {
    let deadline = Instant::now() + crate::harness::patience(within);
    loop {
        let left = marked(marker);
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "processes started by a body outlived it by {within:?}: {left:?}\n--- log ---\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A body that starts `sleep <marker>` in the background and waits for it, after `touch
/// started`.
fn waiting_body(marker: &str) -> String {
    format!("read params\nsleep {marker} &\ntouch started\nwait\necho '{{}}'\n")
}

async fn body_started(task: &TaskFixture, marker: &str) {
    let started = task.dir.path().join("started");
    eventually("the body to start", Duration::from_secs(20), || async {
        (started.exists() && !marked(marker).is_empty()).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setsid_daemon_holding_stdout_keeps_no_result_hostage_and_is_killed() {
    let mark = marker(1);
    let conductor = Conductor::start().await;
    // The daemon double-forks out of the body's process group and session, holding stdout;
    // the body exits once it has.
    let body = format!(
        "read params\n(setsid sh -c 'touch detached; exec sleep {mark}' &)\n\
         while [ ! -e detached ]; do sleep 0.01; done\n\
         echo '{{\"ok\": true}}'\n"
    );
    let task = TaskFixture::new("e2e.daemon", &body, "retry_count = 0");
    conductor.register(&task).await;
    let sup = SupervisorProc::start(&task, &conductor, 1, &[]);
    let id = conductor.start_workflow(&task, json!({})).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
    assert_eq!(wf["output"]["result"], json!({"ok": true}));
    none_left(&mark, Duration::from_secs(2), || sup.log_text()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_sigkill_leaves_no_descendant_of_its_body() {
    let mark = marker(2);
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("e2e.orphans", &waiting_body(&mark), "retry_count = 0");
    conductor.register(&task).await;
    let sup = SupervisorProc::start(&task, &conductor, 1, &[]);
    let id = conductor.start_workflow(&task, json!({})).await;
    body_started(&task, &mark).await;
    let executor = child_named(sup.pid(), "perago-executor-0001").expect("executor");
    crate::harness::signal_pid(executor.pid, "KILL");
    none_left(&mark, Duration::from_secs(2), || sup.log_text()).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "FAILED", "{wf:#}");
}

async fn force_kill_at_the_deadline(mode: &str, test: u32) {
    let mark = marker(test);
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("e2e.deadline", &waiting_body(&mark), "retry_count = 0");
    conductor.register(&task).await;
    let mut sup = SupervisorProc::start(
        &task,
        &conductor,
        1,
        &[
            ("PERAGO_SHUTDOWN_FORCE_KILL_AFTER", "1s"),
            ("PERAGO_EXECUTION_MODE", mode),
        ],
    );
    let id = conductor.start_workflow(&task, json!({})).await;
    body_started(&task, &mark).await;
    sup.signal("TERM");
    let status = sup.wait_exit(Duration::from_secs(15)).await;
    let log = sup.log_text();
    assert_eq!(status.code(), Some(3), "a forced shutdown exits 3\n{log}");
    assert!(
        log.contains(
            "error: the drain did not finish within PERAGO_SHUTDOWN_FORCE_KILL_AFTER (1s)"
        ),
        "{log}"
    );
    none_left(&mark, Duration::from_secs(2), || sup.log_text()).await;
    let wf = conductor.workflow(&id).await;
    let first = &wf["tasks"][0];
    assert_eq!(first["status"], "FAILED", "{wf:#}\n{log}");
    let reason = first["reasonForIncompletion"].as_str().unwrap();
    assert!(
        reason.contains(
            "killed by the supervisor at the shutdown deadline, PERAGO_SHUTDOWN_FORCE_KILL_AFTER=1s after the drain started"
        ),
        "{reason}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_shutdown_exits_three_names_the_deadline_and_leaves_nothing() {
    force_kill_at_the_deadline("process", 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_shutdown_in_thread_mode_still_reports_the_killed_task() {
    force_kill_at_the_deadline("thread", 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_broker_stops_the_running_bodies_and_the_supervisor_within_seconds() {
    let mark = marker(5);
    let conductor = Conductor::start().await;
    // SIGTERM (the group's) ends the shell and its background job.
    let task = TaskFixture::new("e2e.brokergone", &waiting_body(&mark), "retry_count = 0");
    conductor.register(&task).await;
    let mut sup = SupervisorProc::start(&task, &conductor, 2, &[]);
    let _ = conductor.start_workflow(&task, json!({})).await;
    body_started(&task, &mark).await;
    let broker = child_named(sup.pid(), "perago-conductor-broker").expect("broker");
    let killed_at = Instant::now();
    crate::harness::signal_pid(broker.pid, "KILL");
    let exit = sup.wait_exit(Duration::from_secs(10)).await;
    let took = killed_at.elapsed();
    let log = sup.log_text();
    assert_eq!(exit.code(), Some(1), "{log}");
    assert!(
        took < crate::harness::patience(Duration::from_secs(5)),
        "the supervisor took {took:?} to stop after its broker died\n{log}"
    );
    assert!(
        log.contains("the broker is gone while an assignment runs"),
        "{log}"
    );
    none_left(&mark, Duration::from_secs(2), || sup.log_text()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_supervisor_sigkill_in_thread_mode_leaves_no_descendant_of_a_body() {
    let mark = marker(6);
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("e2e.threadkill", &waiting_body(&mark), "retry_count = 0");
    conductor.register(&task).await;
    let sup = SupervisorProc::start(&task, &conductor, 1, &[("PERAGO_EXECUTION_MODE", "thread")]);
    let _ = conductor.start_workflow(&task, json!({})).await;
    body_started(&task, &mark).await;
    sup.signal("KILL");
    none_left(&mark, Duration::from_secs(2), || sup.log_text()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deadline_also_bounds_a_drain_started_over_admin_drain() {
    let mark = marker(7);
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("e2e.admindrain", &waiting_body(&mark), "retry_count = 0");
    conductor.register(&task).await;
    let mut sup = SupervisorProc::start(
        &task,
        &conductor,
        1,
        &[("PERAGO_SHUTDOWN_FORCE_KILL_AFTER", "1s")],
    );
    let socket = sup.workspace_root().join("run/broker.sock");
    let id = conductor.start_workflow(&task, json!({})).await;
    body_started(&task, &mark).await;
    let channel = perago_core::socket::connect(&socket).await.unwrap();
    perago_proto::admin::v1::admin_client::AdminClient::new(channel)
        .drain(perago_proto::admin::v1::DrainRequest {})
        .await
        .unwrap();
    let status = sup.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(status.code(), Some(3), "{}", sup.log_text());
    none_left(&mark, Duration::from_secs(2), || sup.log_text()).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(5)).await;
    assert_eq!(wf["status"], "FAILED", "{wf:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_body_guard_exits_as_its_body_did_and_kills_what_it_left() {
    use std::os::unix::process::ExitStatusExt as _;
    let mark = marker(8);
    let dir = tempfile::tempdir().unwrap();
    let guard = |script: &str| {
        std::process::Command::new(crate::harness::SUPERVISOR)
            .arg(perago_sys::guard::BODY_GUARD_ARG)
            .args(["sh", "-c", script])
            .current_dir(dir.path())
            .status()
            .unwrap()
    };
    let status = guard(&format!(
        "(setsid sh -c 'touch detached; exec sleep {mark}' &)\n\
         while [ ! -e detached ]; do sleep 0.01; done\nexit 3"
    ));
    assert_eq!(status.code(), Some(3));
    assert_eq!(
        marked(&mark),
        Vec::<u32>::new(),
        "the guard killed the daemon"
    );
    assert_eq!(
        guard("kill -9 $$").signal(),
        Some(9),
        "and dies of the body's signal"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_supervisor_sigkill_in_process_mode_lets_the_body_finish_then_ends_what_it_left() {
    let mark = marker(9);
    let conductor = Conductor::start().await;
    // The body leaves a detached daemon behind and finishes a second later.
    let body = format!(
        "read params\n(setsid sh -c 'touch detached; exec sleep {mark}' &)\n\
         while [ ! -e detached ]; do sleep 0.01; done\ntouch started\nsleep 1\necho '{{}}'\n"
    );
    let task = TaskFixture::new("e2e.orphanedrun", &body, "retry_count = 0");
    conductor.register(&task).await;
    let sup = SupervisorProc::start(&task, &conductor, 1, &[]);
    let id = conductor.start_workflow(&task, json!({})).await;
    body_started(&task, &mark).await;
    // The orphaned executor drains (parent-death SIGTERM): its body finishes and is reported,
    // and what the body left dies with the assignment.
    sup.signal("KILL");
    let wf = conductor.wait_terminal(&id, Duration::from_secs(10)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}");
    none_left(&mark, Duration::from_secs(2), || sup.log_text()).await;
}
