//! Task domains (issue #26, item 1): `start --domain` polls only the domain's queue, the
//! queue workflows route to with `taskToDomain`; run once drains that queue and exits.

use crate::harness::{Conductor, SUPERVISOR, SupervisorProc, TaskFixture, eventually, status_json};
use perago_tests::workspace_root;
use serde_json::{Value, json};
use std::{path::PathBuf, process::Command, time::Duration};

const ECHO: &str = "read params\necho '{\"result\": 1}'\n";

/// Starts `count` workflows of `task` through the Conductor Python SDK
/// (`StartWorkflowRequest.task_to_domain`); returns their ids.
pub(crate) fn start_in_domain(
    conductor: &Conductor,
    task: &TaskFixture,
    task_to_domain: &Value,
    count: usize,
) -> Vec<String> {
    let python = std::env::var_os("PERAGO_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".venv/bin/python"));
    let script = "import json, sys\n\
        from conductor.client.configuration.configuration import Configuration\n\
        from conductor.client.http.api_client import ApiClient\n\
        from conductor.client.http.api.workflow_resource_api import WorkflowResourceApi\n\
        from conductor.client.http.models.start_workflow_request import StartWorkflowRequest\n\
        url, name, domains, count = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])\n\
        api = WorkflowResourceApi(ApiClient(Configuration(server_api_url=url)))\n\
        ids = [api.start_workflow(StartWorkflowRequest(name=name, version=1, input={'params': {'n': n}}, task_to_domain=domains)) for n in range(count)]\n\
        print(json.dumps(ids))\n";
    let out = Command::new(python)
        .args([
            "-c",
            script,
            &conductor.server.base_url(),
            &format!("{}.wf", task.name),
            &task_to_domain.to_string(),
            &count.to_string(),
        ])
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("a JSON list of ids")
}

/// The workflow's task: its domain and the worker that took it.
pub(crate) async fn taken_by(conductor: &Conductor, id: &str) -> (Value, String) {
    let wf = conductor.wait_terminal(id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}");
    let task = &wf["tasks"][0];
    (
        task["domain"].clone(),
        task["workerId"].as_str().unwrap_or_default().to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_domain_workflow_is_taken_by_the_domain_runtime_only() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("dom.echo", ECHO, "");
    conductor.register(&task).await;
    let blue = SupervisorProc::start_args(
        &task,
        &conductor,
        "2",
        &["--domain", "blue"],
        &[("PERAGO_WORKER_ID_PREFIX", "blue")],
        None,
        None,
    );
    let plain = SupervisorProc::start_args(
        &task,
        &conductor,
        "2",
        &[],
        &[("PERAGO_WORKER_ID_PREFIX", "plain")],
        None,
        None,
    );
    // Both poll (so the blue domain has an active worker) before any workflow starts.
    for sup in [&blue, &plain] {
        let root = sup.workspace_root();
        eventually("the runtime to poll", Duration::from_secs(20), || async {
            let status = status_json(&root);
            (status["counters"]["polls"].as_u64().unwrap_or(0) > 0).then_some(())
        })
        .await;
    }
    let status = status_json(&blue.workspace_root());
    assert_eq!(status["domain"], "blue", "{status:#}");
    assert_eq!(status_json(&plain.workspace_root())["domain"], "");

    let to_blue = start_in_domain(&conductor, &task, &json!({"dom.echo": "blue"}), 6);
    // `*` with a fallback: blue has an active worker, so blue.
    let star = start_in_domain(&conductor, &task, &json!({"*": "blue,NO_DOMAIN"}), 2);
    // A domain nobody polls, then NO_DOMAIN: the default queue.
    let fallback = start_in_domain(
        &conductor,
        &task,
        &json!({"dom.echo": "green,NO_DOMAIN"}),
        2,
    );
    let mut plain_ids = Vec::new();
    for n in 0..6 {
        plain_ids.push(conductor.start_workflow(&task, json!({"n": n})).await);
    }
    for id in to_blue.iter().chain(&star) {
        let (domain, worker) = taken_by(&conductor, id).await;
        assert_eq!(domain, "blue");
        assert!(worker.starts_with("blue"), "{id} taken by {worker}");
    }
    for id in plain_ids.iter().chain(&fallback) {
        let (domain, worker) = taken_by(&conductor, id).await;
        assert_eq!(domain, Value::Null);
        assert!(worker.starts_with("plain"), "{id} taken by {worker}");
    }
    let log = blue.log_text();
    assert!(!log.contains("panicked"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_with_a_domain_drains_its_queue_and_exits_0() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("dom.once", ECHO, "");
    conductor.register(&task).await;
    let blue = start_in_domain(&conductor, &task, &json!({"dom.once": "blue"}), 5);
    // Tasks of the default queue: a depth read of the wrong queue never reaches 0.
    let plain = conductor.start_workflow(&task, json!({"n": 0})).await;
    let mut sup = SupervisorProc::start_args(
        &task,
        &conductor,
        "2",
        &["--once", "--domain", "dom.once=blue"],
        &[],
        None,
        None,
    );
    let status = sup.wait_exit(Duration::from_secs(30)).await;
    let log = sup.log_text();
    assert_eq!(status.code(), Some(0), "{log}");
    for id in &blue {
        assert_eq!(conductor.workflow(id).await["status"], "COMPLETED", "{log}");
    }
    let wf = conductor.workflow(&plain).await;
    assert_eq!(wf["status"], "RUNNING", "{wf:#}");
    assert_eq!(wf["tasks"][0]["status"], "SCHEDULED", "{wf:#}");
}

#[test]
fn a_bad_domain_is_refused_naming_the_flag() {
    let task = TaskFixture::new("dom.bad", ECHO, "");
    for (value, message) in [
        ("a:b", "--domain a:b: domain \"a:b\": only ASCII"),
        ("", "--domain : domain \"\": empty"),
        (
            "nope=blue",
            "--domain nope=…: no manifest given has the task nope",
        ),
    ] {
        let out = Command::new(SUPERVISOR)
            .args([
                "start",
                task.manifest().to_str().unwrap(),
                "--domain",
                value,
            ])
            .env("CONDUCTOR_SERVER_URL", "http://127.0.0.1:1/api")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{value:?}: {stderr}");
        assert!(stderr.contains(message), "{value:?}: {stderr}");
    }
}

/// The adaptive executor count reads the domain's queue: a backlog routed to blue grows a
/// `--domain blue -j 1..3` runtime (the default queue, empty, would keep it at 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_in_the_domain_grows_the_executors() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("dom.scale", "read params\nsleep 1\necho '{}'\n", "");
    conductor.register(&task).await;
    start_in_domain(&conductor, &task, &json!({"dom.scale": "blue"}), 20);
    let sup = SupervisorProc::start_args(
        &task,
        &conductor,
        "1..3",
        &["--domain", "blue"],
        &[],
        None,
        None,
    );
    let root = sup.workspace_root();
    eventually(
        "three executors wanted",
        Duration::from_secs(15),
        || async {
            let s = crate::adaptive::status(&root).await?;
            let c = s.capacity.as_ref()?;
            (c.wanted_executors == 3 && s.domain == "blue").then_some(())
        },
    )
    .await;
}
