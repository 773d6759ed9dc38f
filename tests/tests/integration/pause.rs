//! Pause and resume polling (issue #26 item 2) with the real binaries: a runtime started
//! paused polls nothing (the task's pollCount stays 0) until `resume`, then runs the task;
//! `pause` during a backlog lets the running tasks complete and polls nothing more; readiness
//! is NOT_SERVING while paused, liveness stays SERVING; `status`, `--json` and `/metrics` say
//! it; `pause` with nothing running fails naming why.

use crate::harness::{
    Conductor, SUPERVISOR, SupervisorProc, TaskFixture, eventually, gated_body, status_json,
};
use perago_tests::{Run, command};
use serde_json::json;
use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

/// `perago-supervisor ARGS…` with `env`.
fn supervisor(args: &[&str], env: &[(&str, &Path)]) -> Run {
    let mut cmd = command(SUPERVISOR);
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    Run::of(&mut cmd)
}

fn socket_of(sup: &SupervisorProc) -> String {
    sup.workspace_root()
        .join("run/broker.sock")
        .to_str()
        .unwrap()
        .to_owned()
}

fn probe(sup: &SupervisorProc, kind: &str) -> Run {
    supervisor(
        &["status", "--probe", kind, "--socket", &socket_of(sup)],
        &[],
    )
}

/// The `perago_paused` gauge of the runtime's `/metrics`.
fn paused_gauge(sup: &SupervisorProc, task: &TaskFixture) -> Option<u64> {
    let log = sup.log_text();
    let at = log.find("metrics served at ")? + "metrics served at ".len();
    let url = log[at..].split_whitespace().next()?.to_owned();
    let out = Command::new("curl").args(["-sf", &url]).output().ok()?;
    let prefix = format!("perago_paused{{task=\"{}\"}} ", task.name);
    String::from_utf8(out.stdout)
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
}

/// For `window`, the runtime polls nothing and none of `ids` is polled or started.
async fn nothing_polled(
    sup: &SupervisorProc,
    conductor: &Conductor,
    ids: &[String],
    polls: u64,
    window: Duration,
) {
    let started = Instant::now();
    while started.elapsed() < window {
        let s = status_json(&sup.workspace_root());
        assert_eq!(s["counters"]["polls"], polls, "{s:#}");
        assert_eq!(s["paused"], true, "{s:#}");
        for id in ids {
            let t = conductor.workflow(id).await["tasks"][0].clone();
            assert_eq!(t["status"], "SCHEDULED", "{t:#}");
            assert_eq!(t["pollCount"].as_u64().unwrap_or(0), 0, "{t:#}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn started_paused_polls_nothing_until_resumed() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("pause.start", "read p\necho '{}'\n", "");
    conductor.register(&task).await;
    let id = conductor.start_workflow(&task, json!({"n": 1})).await;
    let sup = SupervisorProc::start_args(
        &task,
        &conductor,
        "2",
        &["--paused"],
        &[("PERAGO_METRICS_ADDR", "127.0.0.1:0")],
        None,
        None,
    );
    // Executors start and attach while paused: a pause keeps them up.
    let s = eventually(
        "idle executors of a paused runtime",
        Duration::from_secs(20),
        || async {
            let s = status_json(&sup.workspace_root());
            let slots = s["slots"].as_array()?;
            (slots.len() == 2 && slots.iter().all(|s| s["state"] == "idle")).then_some(s)
        },
    )
    .await;
    assert_eq!(s["paused"], true, "{s:#}");
    assert!(s["paused_since_unix_ms"].as_i64().unwrap() > 0, "{s:#}");
    let table = supervisor(&["status", "--socket", &socket_of(&sup)], &[]);
    table.expect_code(0);
    assert!(table.stdout.contains("  paused yes (for "), "{table}");
    // Readiness says NOT_SERVING while paused, naming the pause; liveness passes.
    let ready = probe(&sup, "ready");
    ready.expect_code(1);
    assert_eq!(ready.stdout.trim(), "NOT_SERVING", "{ready}");
    assert!(ready.stderr.contains("(paused"), "{ready}");
    probe(&sup, "live").expect_code(0);
    let gauge = eventually("the paused gauge", Duration::from_secs(10), || async {
        paused_gauge(&sup, &task)
    })
    .await;
    assert_eq!(gauge, 1);
    nothing_polled(
        &sup,
        &conductor,
        std::slice::from_ref(&id),
        0,
        Duration::from_secs(1),
    )
    .await;

    // `resume MANIFEST` finds the runtime as `status` does, through its workspace root.
    let root = sup.workspace_root();
    let manifest = task.manifest();
    let resume = supervisor(
        &["resume", manifest.to_str().unwrap()],
        &[("PERAGO_WORKSPACE_ROOT", &root)],
    );
    resume.expect_code(0);
    assert_eq!(
        resume.stdout,
        format!("{}: resumed\n", task.name),
        "{resume}"
    );
    let wf = conductor.wait_terminal(&id, Duration::from_secs(20)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
    let s = status_json(&sup.workspace_root());
    assert_eq!(s["paused"], false, "{s:#}");
    assert_eq!(s["paused_since_unix_ms"], 0, "{s:#}");
    probe(&sup, "ready").expect_code(0);
    assert_eq!(paused_gauge(&sup, &task), Some(0));
    let again = supervisor(
        &["resume", manifest.to_str().unwrap()],
        &[("PERAGO_WORKSPACE_ROOT", &root)],
    );
    again.expect_code(0);
    assert_eq!(again.stdout, format!("{}: already running\n", task.name));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_during_a_backlog_lets_running_tasks_finish_and_polls_nothing_more() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("pause.backlog", &gated_body("echo '{}'"), "");
    conductor.register(&task).await;
    let mut ids = Vec::new();
    for n in 0..5 {
        ids.push(conductor.start_workflow(&task, json!({"n": n})).await);
    }
    // A supervisor registry of this test's own: `pause` with no argument finds this one only.
    let state = tempfile::tempdir().unwrap();
    let state_dir = state.path().to_str().unwrap().to_owned();
    let sup = SupervisorProc::start(&task, &conductor, 2, &[("XDG_STATE_HOME", &state_dir)]);
    let env = [("XDG_STATE_HOME", state.path())];
    // Both executors run a task; three wait in Conductor's queue.
    eventually("two busy slots", Duration::from_secs(20), || async {
        let s = status_json(&sup.workspace_root());
        let slots = s["slots"].as_array()?;
        (slots.iter().filter(|s| s["state"] == "busy").count() == 2
            && s["counters"]["dispatched"] == 2)
            .then_some(())
    })
    .await;
    let pause = eventually(
        "the supervisor's record",
        Duration::from_secs(10),
        || async {
            let run = supervisor(&["pause"], &env);
            (run.code == Some(0)).then_some(run)
        },
    )
    .await;
    assert_eq!(
        pause.stdout,
        format!(
            "{}: paused (running tasks finish; nothing new is polled until resume)\n",
            task.name
        ),
        "{pause}"
    );
    let again = supervisor(&["pause"], &env);
    again.expect_code(0);
    assert!(
        again
            .stdout
            .starts_with(&format!("{}: already paused (for ", task.name)),
        "{again}"
    );
    let polls = status_json(&sup.workspace_root())["counters"]["polls"]
        .as_u64()
        .unwrap();
    // The running tasks finish and are reported while paused.
    task.gate().open();
    let mut done = Vec::new();
    let mut waiting = Vec::new();
    eventually(
        "the two running tasks to complete",
        Duration::from_secs(20),
        || async {
            let s = status_json(&sup.workspace_root());
            (s["counters"]["completed"] == 2
                && s["slots"].as_array()?.iter().all(|s| s["state"] == "idle"))
            .then_some(())
        },
    )
    .await;
    for id in &ids {
        let wf = conductor.workflow(id).await;
        match wf["status"].as_str() {
            Some("COMPLETED") => done.push(id.clone()),
            _ => waiting.push(id.clone()),
        }
    }
    assert_eq!((done.len(), waiting.len()), (2, 3), "{done:?} {waiting:?}");
    // Nothing more is polled: the three queued tasks stay SCHEDULED, never polled; the
    // executors stay up, idle.
    nothing_polled(&sup, &conductor, &waiting, polls, Duration::from_secs(1)).await;
    let s = status_json(&sup.workspace_root());
    let slots = s["slots"].as_array().unwrap();
    assert!(slots.iter().all(|s| s["state"] == "idle"), "{s:#}");
    // Resumed (no argument: every runtime of this user's running supervisors): the rest run.
    let resume = supervisor(&["resume"], &env);
    resume.expect_code(0);
    assert_eq!(
        resume.stdout,
        format!("{}: resumed\n", task.name),
        "{resume}"
    );
    for id in &waiting {
        let wf = conductor.wait_terminal(id, Duration::from_secs(30)).await;
        assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
    }
    sup.log_with("paused: no new task is polled", Duration::from_secs(5))
        .await;
    sup.log_with("resumed: polling again", Duration::from_secs(5))
        .await;
}

/// `pause` and `resume` with nothing to talk to fail, saying why.
#[test]
fn pause_with_nothing_running_fails_naming_why() {
    let state = tempfile::tempdir().unwrap();
    let env = [("XDG_STATE_HOME", state.path())];
    for verb in ["pause", "resume"] {
        let run = supervisor(&[verb], &env);
        run.expect_code(1);
        assert!(
            run.stderr
                .contains("no perago supervisor of this user is running"),
            "{run}"
        );
    }
    let task = TaskFixture::new("pause.none", "read p\necho '{}'\n", "");
    let root = state.path().join("ws");
    let run = supervisor(
        &["pause", task.manifest().to_str().unwrap()],
        &[
            ("XDG_STATE_HOME", state.path()),
            ("PERAGO_WORKSPACE_ROOT", &root),
        ],
    );
    run.expect_code(1);
    assert!(
        run.stderr.contains("no perago runtime answers at "),
        "{run}"
    );
    assert!(run.stdout.is_empty(), "{run}");
}

/// `--once --paused` with an empty queue does not take the quiet of the pause for an empty
/// queue: it keeps running; a drain (SIGTERM) while paused drains, exit 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_once_waits_while_paused_and_a_drain_while_paused_drains() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("pause.once", "read p\necho '{}'\n", "");
    conductor.register(&task).await;
    let mut sup = SupervisorProc::start_args(
        &task,
        &conductor,
        "1",
        &["--once", "--paused"],
        &[],
        None,
        None,
    );
    eventually("a paused idle runtime", Duration::from_secs(20), || async {
        let s = status_json(&sup.workspace_root());
        (s["paused"] == true && s["slots"][0]["state"] == "idle").then_some(())
    })
    .await;
    // Run once unpaused ends within a second or two on an empty queue (see once.rs); paused,
    // it is still there after a few queue-depth reads.
    let window = Instant::now();
    while window.elapsed() < Duration::from_secs(3) {
        assert!(
            sup.child.try_wait().unwrap().is_none(),
            "run once ended while paused\n{}",
            sup.log_text()
        );
        let s = status_json(&sup.workspace_root());
        assert_eq!(s["draining"], false, "{s:#}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    sup.signal("TERM");
    let exit = sup.wait_exit(Duration::from_secs(20)).await;
    assert!(exit.success(), "{exit:?}\n{}", sup.log_text());
}
