//! A deployment's Conductor SDK environment (`CONDUCTOR_WORKER_ALL_THREAD_COUNT`,
//! `conductor.worker.<task>.<prop>`, …) works unchanged under `start`, what perago cannot honour
//! is refused naming its variable, and `--execution-mode NAME=MODE` runs one type in each mode.

use crate::harness::{Conductor, SUPERVISOR, SupervisorProc, TaskFixture, eventually};
use serde_json::{Value, json};
use std::time::Duration;

/// Echoes its params with the worker id it ran on.
const ECHO: &str = r#"read params
printf '{"echo": %s, "worker": "%s"}' "$params" "$PERAGO_WORKER_ID"
"#;

/// `status --json` of every runtime of the supervisor recorded under `state_home`, once
/// `ready` holds for it.
async fn status_until(
    state_home: &str,
    what: &str,
    ready: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let mut last = String::new();
    let got = eventually(what, Duration::from_secs(20), || {
        let run = perago_tests::Run::of(
            perago_tests::command(SUPERVISOR)
                .args(["status", "--json"])
                .env("XDG_STATE_HOME", state_home),
        );
        last = run.to_string();
        let all: Vec<Value> = match serde_json::from_str::<Value>(&run.stdout) {
            Ok(Value::Array(all)) => all,
            Ok(one @ Value::Object(_)) => vec![one],
            _ => Vec::new(),
        };
        let done = !all.is_empty() && ready(&all);
        async move { done.then_some(all) }
    })
    .await;
    assert!(!got.is_empty(), "{last}");
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sdk_environment_sets_executors_worker_ids_and_polls_without_j() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("sdk.env", ECHO, "");
    conductor.register(&task).await;
    let state = tempfile::tempdir().unwrap();
    let state_home = state.path().to_str().unwrap().to_owned();
    // No -j: the SDK's thread_count gives the executor count.
    let sup = SupervisorProc::start_tasks(
        &[&task],
        &conductor,
        &[],
        &[],
        &[
            ("XDG_STATE_HOME", &state_home),
            ("CONDUCTOR_WORKER_ALL_THREAD_COUNT", "3"),
            ("CONDUCTOR_WORKER_SDK.ENV_POLL_INTERVAL", "50"),
            ("conductor.worker.sdk.env.worker_id", "pod7-"),
            ("CONDUCTOR_WORKER_ALL_LEASE_EXTEND_ENABLED", "true"),
            // The harness sets PERAGO_POLL_WAIT_MS, which wins: not listed as applied.
            ("CONDUCTOR_WORKER_ALL_POLL_TIMEOUT", "1000"),
            // Another task's settings are not this one's.
            ("CONDUCTOR_WORKER_OTHER_THREAD_COUNT", "5"),
        ],
        None,
        None,
    );
    let mut ids = Vec::new();
    for n in 0..6 {
        ids.push(conductor.start_workflow(&task, json!({"n": n})).await);
    }
    for id in &ids {
        let wf = conductor.wait_terminal(id, Duration::from_secs(60)).await;
        assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
        let worker = wf["output"]["result"]["worker"]
            .as_str()
            .unwrap_or_default();
        assert!(
            ["pod7-0001", "pod7-0002", "pod7-0003"].contains(&worker),
            "{worker}"
        );
    }
    let all = status_until(&state_home, "status with three slots", |all| {
        all[0]["slots"].as_array().is_some_and(|s| s.len() == 3)
    })
    .await;
    let status = &all[0];
    assert_eq!(
        status["broker_worker_id"]
            .as_str()
            .map(|b| b.starts_with("pod7-")),
        Some(true),
        "{status:#}"
    );
    let sdk: Vec<(String, String, String)> = status["sdk_settings"]
        .as_array()
        .unwrap_or_else(|| panic!("{status:#}"))
        .iter()
        .map(|s| {
            let f = |k: &str| s[k].as_str().unwrap().to_owned();
            (f("property"), f("value"), f("variable"))
        })
        .collect();
    let row = |p: &str, v: &str, var: &str| (p.to_owned(), v.to_owned(), var.to_owned());
    assert_eq!(
        sdk,
        [
            row("thread_count", "3", "CONDUCTOR_WORKER_ALL_THREAD_COUNT"),
            row(
                "poll_interval",
                "50",
                "CONDUCTOR_WORKER_SDK.ENV_POLL_INTERVAL"
            ),
            row("worker_id", "pod7-", "conductor.worker.sdk.env.worker_id"),
            row(
                "lease_extend_enabled",
                "true",
                "CONDUCTOR_WORKER_ALL_LEASE_EXTEND_ENABLED"
            ),
        ],
        "{status:#}"
    );
    let table = perago_tests::Run::of(
        perago_tests::command(SUPERVISOR)
            .args(["status"])
            .env("XDG_STATE_HOME", &state_home),
    );
    assert!(
        table
            .stdout
            .contains("thread_count=3 (CONDUCTOR_WORKER_ALL_THREAD_COUNT)"),
        "{table}"
    );
    let mut sup = sup;
    sup.signal("TERM");
    let exit = sup.wait_exit(Duration::from_secs(30)).await;
    assert_eq!(exit.code(), Some(0), "{}", sup.log_text());
}

#[test]
fn what_perago_cannot_honour_is_refused_at_start_naming_the_variable() {
    let task = TaskFixture::new("sdk.refused", ECHO, "");
    let run = perago_tests::Run::of(
        perago_tests::command(SUPERVISOR)
            .arg("start")
            .arg(task.manifest())
            .env("CONDUCTOR_SERVER_URL", "http://127.0.0.1:9/api")
            .env("CONDUCTOR_WORKER_ALL_LEASE_EXTEND_ENABLED", "false")
            .env("CONDUCTOR_WORKER_SDK.REFUSED_THREAD_COUNT", "three")
            .env("conductor.worker.all.register_task_def", "true"),
    );
    run.expect_code(1);
    for needle in [
        "CONDUCTOR_WORKER_ALL_LEASE_EXTEND_ENABLED \"false\": perago always extends the lease",
        "CONDUCTOR_WORKER_SDK.REFUSED_THREAD_COUNT \"three\": expected a whole number",
        "conductor.worker.all.register_task_def \"true\": perago never registers TaskDefs",
    ] {
        assert!(run.stderr.contains(needle), "{needle}\n{run}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_task_types_one_in_each_execution_mode_both_complete() {
    let conductor = Conductor::start().await;
    let a = TaskFixture::new("modes.process", ECHO, "");
    let b = TaskFixture::new("modes.thread", ECHO, "");
    conductor.register(&a).await;
    conductor.register(&b).await;
    let state = tempfile::tempdir().unwrap();
    let state_home = state.path().to_str().unwrap().to_owned();
    let sup = SupervisorProc::start_tasks(
        &[&a, &b],
        &conductor,
        &["2"],
        &[
            "--execution-mode",
            "process",
            "--execution-mode",
            "modes.thread=thread",
        ],
        &[("XDG_STATE_HOME", &state_home)],
        None,
        None,
    );
    let mut ids = Vec::new();
    for n in 0..10 {
        ids.push(conductor.start_workflow(&a, json!({"n": n})).await);
        ids.push(conductor.start_workflow(&b, json!({"n": n})).await);
    }
    for id in &ids {
        let wf = conductor.wait_terminal(id, Duration::from_secs(60)).await;
        assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
    }
    let all = status_until(&state_home, "status of both types", |all| all.len() == 2).await;
    let mut modes: Vec<(String, String)> = all
        .iter()
        .map(|s| {
            (
                s["task_name"].as_str().unwrap().to_owned(),
                s["execution_mode"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    modes.sort();
    assert_eq!(
        modes,
        [
            ("modes.process".to_owned(), "process".to_owned()),
            ("modes.thread".to_owned(), "thread".to_owned())
        ]
    );
    if !crate::harness::thread_mode() {
        // Only the process-mode type has processes of its own.
        let names = crate::harness::workers_of(sup.pid());
        assert!(
            names
                .iter()
                .any(|n| n == "perago-conductor-broker@modes.process"),
            "{names:?}"
        );
        assert!(
            !names.iter().any(|n| n.ends_with("@modes.thread")),
            "{names:?}"
        );
    }
    let table = perago_tests::Run::of(
        perago_tests::command(SUPERVISOR)
            .args(["status"])
            .env("XDG_STATE_HOME", &state_home),
    );
    assert!(table.stdout.contains("execution mode thread"), "{table}");
    assert!(table.stdout.contains("execution mode process"), "{table}");
    let mut sup = sup;
    sup.signal("TERM");
    let exit = sup.wait_exit(Duration::from_secs(30)).await;
    assert_eq!(exit.code(), Some(0), "{}", sup.log_text());
}

/// The SDK's `domain` and `paused` under its names (issue #26 item 3): the runtime starts
/// paused, polls nothing, and once resumed takes the task its domain's workflow routed to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdks_domain_and_paused_apply_under_their_names() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("sdk.dom", ECHO, "");
    conductor.register(&task).await;
    let state = tempfile::tempdir().unwrap();
    let state_home = state.path().to_str().unwrap().to_owned();
    let sup = SupervisorProc::start_tasks(
        &[&task],
        &conductor,
        &["1"],
        &[],
        &[
            ("XDG_STATE_HOME", &state_home),
            ("CONDUCTOR_WORKER_SDK.DOM_DOMAIN", "blue"),
            ("CONDUCTOR_WORKER_ALL_PAUSED", "true"),
        ],
        None,
        None,
    );
    let all = status_until(&state_home, "a paused runtime in its domain", |all| {
        all[0]["slots"].as_array().is_some_and(|s| s.len() == 1)
    })
    .await;
    let s = &all[0];
    assert_eq!(s["domain"], "blue", "{s:#}\n{}", sup.log_text());
    assert_eq!(s["paused"], true, "{s:#}");
    let applied: Vec<(String, String)> = s["sdk_settings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x["property"].as_str().unwrap_or_default().to_owned(),
                x["variable"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    for wanted in [
        ("domain", "CONDUCTOR_WORKER_SDK.DOM_DOMAIN"),
        ("paused", "CONDUCTOR_WORKER_ALL_PAUSED"),
    ] {
        assert!(
            applied
                .iter()
                .any(|(p, v)| (p.as_str(), v.as_str()) == wanted),
            "{wanted:?} in {applied:?}"
        );
    }
    let ids = crate::domains::start_in_domain(&conductor, &task, &json!({"sdk.dom": "blue"}), 1);
    let resume = perago_tests::Run::of(
        perago_tests::command(SUPERVISOR)
            .arg("resume")
            .env("XDG_STATE_HOME", &state_home),
    );
    resume.expect_code(0);
    let (domain, worker) = crate::domains::taken_by(&conductor, &ids[0]).await;
    assert_eq!(domain, "blue");
    assert!(worker.starts_with("sdkdom"), "{worker}");
}
