//! The broker process on its own, driven as the supervisor and as executors would drive it:
//! every attach is authenticated per generation, and a completion that is not the slot's
//! current assignment never reaches Conductor.

use crate::harness::{BROKER, Conductor, SupervisorProc, TaskFixture, child_named, eventually};
use perago_proto::{
    CONTROL_TOKEN_METADATA,
    admin::v1::{MetricsRequest, StatusRequest, admin_client::AdminClient},
    slot::v1::{
        self as proto, broker_message::Message as FromBroker,
        executor_message::Message as ToBroker, slot_client::SlotClient,
    },
};
use serde_json::json;
use std::{os::unix::fs::PermissionsExt as _, process::Stdio, time::Duration};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, transport::Channel};

const CONTROL_TOKEN: &str = "control-secret";

pub(crate) struct Broker {
    pub(crate) child: std::process::Child,
    pub(crate) dir: tempfile::TempDir,
    pub(crate) channel: Channel,
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) async fn start_broker(conductor: &Conductor, task: &TaskFixture) -> Broker {
    start_broker_with(conductor, task, &[]).await
}

pub(crate) async fn start_broker_with(
    conductor: &Conductor,
    task: &TaskFixture,
    env: &[(&str, &str)],
) -> Broker {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let socket = dir.path().join("broker.sock");
    let child = perago_tests::command(BROKER)
        .env("CONDUCTOR_SERVER_URL", conductor.server.base_url())
        .env("PERAGO_SOCKET", &socket)
        .env("PERAGO_SLOTS", "2")
        .env("PERAGO_CONTROL_TOKEN", CONTROL_TOKEN)
        .env("PERAGO_TASK_NAME", &task.name)
        .env("PERAGO_WORKER_ID_PREFIX", task.prefix())
        .env("PERAGO_POLL_WAIT_MS", "200")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("broker.log")).unwrap())
        .spawn()
        .unwrap();
    let channel = eventually("the broker socket", Duration::from_secs(10), || async {
        perago_core::socket::connect(&socket).await.ok()
    })
    .await;
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "socket mode");
    Broker {
        child,
        dir,
        channel,
    }
}

pub(crate) fn with_control_token<T>(message: T) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert(CONTROL_TOKEN_METADATA, CONTROL_TOKEN.parse().unwrap());
    request
}

pub(crate) fn creds(slot: u32, generation: u64, token: &str) -> proto::SlotCredentials {
    proto::SlotCredentials {
        slot,
        generation,
        token: token.to_owned(),
    }
}

pub(crate) fn hello(
    credentials: proto::SlotCredentials,
    worker_id: &str,
) -> proto::ExecutorMessage {
    proto::ExecutorMessage {
        message: Some(ToBroker::Hello(proto::Hello {
            protocol_version: proto::ProtocolVersion::ProtocolVersion1 as i32,
            credentials: Some(credentials),
            pid: std::process::id(),
            worker_id: worker_id.to_owned(),
            body_at_dispatch: false,
        })),
    }
}

/// Opens an Attach stream with `first` as the first message.
pub(crate) async fn attach(
    channel: &Channel,
    first: proto::ExecutorMessage,
) -> Result<
    (
        mpsc::Sender<proto::ExecutorMessage>,
        tonic::Streaming<proto::BrokerMessage>,
    ),
    tonic::Status,
> {
    let (tx, rx) = mpsc::channel(8);
    tx.send(first).await.unwrap();
    let mut client = SlotClient::new(channel.clone());
    let mut inbound = client.attach(ReceiverStream::new(rx)).await?.into_inner();
    match inbound.message().await? {
        Some(proto::BrokerMessage {
            message: Some(FromBroker::Welcome(_)),
        }) => Ok((tx, inbound)),
        other => panic!("expected Welcome, got {other:?}"),
    }
}

/// Announces slot 1, generation 1 (token `s1`) as the supervisor would, attaches to it as
/// `worker`, starts one workflow of `task` and returns the stream, the assignment it got and
/// the workflow's id.
pub(crate) async fn first_assignment(
    broker: &Broker,
    conductor: &Conductor,
    task: &TaskFixture,
    worker: &str,
) -> (
    mpsc::Sender<proto::ExecutorMessage>,
    tonic::Streaming<proto::BrokerMessage>,
    proto::Assignment,
    String,
) {
    proto::control_client::ControlClient::new(broker.channel.clone())
        .slot_started(with_control_token(proto::SlotStarted {
            slot: 1,
            generation: 1,
            token: "s1".into(),
            pid: 0,
            body_version: 0,
        }))
        .await
        .unwrap();
    let (tx, mut inbound) = attach(&broker.channel, hello(creds(1, 1, "s1"), worker))
        .await
        .unwrap();
    let id = conductor.start_workflow(task, json!({"n": 1})).await;
    let assignment = match inbound.message().await.unwrap() {
        Some(proto::BrokerMessage {
            message: Some(FromBroker::Assignment(a)),
        }) => a,
        other => panic!("expected an assignment, got {other:?}"),
    };
    (tx, inbound, assignment, id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attaches_are_authenticated_per_generation() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("broker.auth", "cat\n", "");
    conductor.register(&task).await;
    let broker = start_broker(&conductor, &task).await;
    let worker = format!("{}0001", task.prefix());

    let mut control = proto::control_client::ControlClient::new(broker.channel.clone());
    let started = proto::SlotStarted {
        slot: 1,
        generation: 1,
        token: "gen1-secret".into(),
        pid: 0,
        body_version: 0,
    };
    let err = control.slot_started(started.clone()).await.unwrap_err();
    assert_eq!(
        err.code(),
        Code::Unauthenticated,
        "control calls need the token"
    );
    control
        .slot_started(with_control_token(started))
        .await
        .unwrap();

    for (credentials, code) in [
        (creds(1, 1, "guess"), Code::Unauthenticated),
        (creds(1, 2, "gen1-secret"), Code::Unauthenticated),
        (creds(1, 0, "gen1-secret"), Code::Unauthenticated),
        (creds(2, 1, "gen1-secret"), Code::Unauthenticated),
        (creds(7, 1, "gen1-secret"), Code::Unauthenticated),
    ] {
        let status = attach(&broker.channel, hello(credentials.clone(), &worker))
            .await
            .err()
            .unwrap_or_else(|| panic!("{credentials:?} was accepted"));
        assert_eq!(status.code(), code, "{credentials:?}: {status}");
    }
    let wrong_id = attach(
        &broker.channel,
        hello(creds(1, 1, "gen1-secret"), "someoneelse0001"),
    )
    .await
    .err()
    .unwrap();
    assert_eq!(wrong_id.code(), Code::InvalidArgument);

    let (_tx, _inbound) = attach(&broker.channel, hello(creds(1, 1, "gen1-secret"), &worker))
        .await
        .unwrap();
    let twice = attach(&broker.channel, hello(creds(1, 1, "gen1-secret"), &worker))
        .await
        .err()
        .unwrap();
    assert_eq!(twice.code(), Code::AlreadyExists);

    // A restart supersedes the old generation: its token no longer works.
    control
        .slot_started(with_control_token(proto::SlotStarted {
            slot: 1,
            generation: 2,
            token: "gen2-secret".into(),
            pid: 0,
            body_version: 0,
        }))
        .await
        .unwrap();
    let stale = attach(&broker.channel, hello(creds(1, 1, "gen1-secret"), &worker))
        .await
        .err()
        .unwrap();
    assert_eq!(stale.code(), Code::Unauthenticated);
    attach(&broker.channel, hello(creds(1, 2, "gen2-secret"), &worker))
        .await
        .unwrap();
    assert!(broker.dir.path().join("broker.sock").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_current_assignment_can_complete_or_read_its_attempt() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("broker.fence", "cat\n", "");
    conductor.register(&task).await;
    let broker = start_broker(&conductor, &task).await;
    let worker = format!("{}0001", task.prefix());
    let (tx, _inbound, assignment, id) =
        first_assignment(&broker, &conductor, &task, &worker).await;
    let attempt = assignment.attempt.clone().unwrap();

    // The fence answers only the slot's current execution.
    let mut slot_client = SlotClient::new(broker.channel.clone());
    let other = slot_client
        .reload_attempt(proto::ReloadAttemptRequest {
            credentials: Some(creds(1, 1, "s1")),
            execution_id: "not-this-one".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(other.code(), Code::FailedPrecondition);
    let forged = slot_client
        .reload_attempt(proto::ReloadAttemptRequest {
            credentials: Some(creds(1, 1, "guess")),
            execution_id: assignment.execution_id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(forged.code(), Code::Unauthenticated);
    let fresh = slot_client
        .reload_attempt(proto::ReloadAttemptRequest {
            credentials: Some(creds(1, 1, "s1")),
            execution_id: assignment.execution_id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .attempt
        .unwrap();
    assert_eq!(fresh.task_id, attempt.task_id);
    assert_eq!(fresh.status, proto::TaskStatus::InProgress as i32);

    let completion = |execution_id: &str, task_id: &str, output: &str| proto::ExecutorMessage {
        message: Some(ToBroker::Completion(proto::Completion {
            task_id: task_id.to_owned(),
            execution_id: execution_id.to_owned(),
            result: Some(proto::TaskResult {
                outcome: Some(proto::task_result::Outcome::Completed(proto::Completed {
                    output_json: output.to_owned(),
                })),
                worker_id: worker.clone(),
            }),
            recycle: String::new(),
            body_peak_memory_bytes: 0,
            body_oom_killed: false,
            spans: Vec::new(),
        })),
    };
    // Wrong execution id, then wrong task id: both refused. Then the real one.
    tx.send(completion(
        "stale-execution",
        &attempt.task_id,
        r#"{"result":"forged"}"#,
    ))
    .await
    .unwrap();
    tx.send(completion(
        &assignment.execution_id,
        "other-task",
        r#"{"result":"forged"}"#,
    ))
    .await
    .unwrap();
    tx.send(completion(
        &assignment.execution_id,
        &attempt.task_id,
        r#"{"result":"real"}"#,
    ))
    .await
    .unwrap();

    let wf = conductor.wait_terminal(&id, Duration::from_secs(20)).await;
    assert_eq!(wf["status"], "COMPLETED");
    assert_eq!(wf["output"]["result"], "real", "{wf:#}");
    assert_eq!(wf["tasks"].as_array().unwrap().len(), 1);
    assert_eq!(wf["tasks"][0]["workerId"], worker.as_str());

    // The counter moves once the reporter has the server's answer.
    let status = eventually("the completed counter", Duration::from_secs(5), || async {
        let status = AdminClient::new(broker.channel.clone())
            .status(StatusRequest {})
            .await
            .unwrap()
            .into_inner();
        (status.counters.as_ref()?.completed == 1).then_some(status)
    })
    .await;
    assert_eq!(status.task_name, task.name);
    assert_eq!(status.broker_worker_id, format!("{}Broker", task.prefix()));
    let counters = status.counters.unwrap();
    assert_eq!(counters.dispatched, 1);
    assert_eq!(counters.completed, 1);
    assert_eq!(status.slots.len(), 2);
    assert_eq!(status.slots[0].worker_id, worker);
}

/// A stolen or replayed control message cannot take a slot over: generations are taken only
/// in the order the supervisor issues them, so one that jumps ahead or back is refused and the
/// attached executor keeps its slot and its work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slot_started_out_of_order_is_refused_and_the_executor_keeps_its_slot() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("broker.order", "cat\n", "");
    conductor.register(&task).await;
    let broker = start_broker(&conductor, &task).await;
    let worker = format!("{}0001", task.prefix());
    let mut control = proto::control_client::ControlClient::new(broker.channel.clone());
    let announce = |generation: u64, token: &str| {
        with_control_token(proto::SlotStarted {
            slot: 1,
            generation,
            token: token.to_owned(),
            pid: 0,
            body_version: 0,
        })
    };
    control.slot_started(announce(1, "s1")).await.unwrap();
    let (tx, mut inbound) = attach(&broker.channel, hello(creds(1, 1, "s1"), &worker))
        .await
        .unwrap();

    for generation in [7, u64::MAX, 1, 0] {
        let refused = control
            .slot_started(announce(generation, "forged"))
            .await
            .expect_err("an out-of-order generation is refused");
        assert_eq!(refused.code(), Code::FailedPrecondition, "{refused}");
        assert!(
            refused
                .message()
                .contains("it takes generation 2 next, not"),
            "{refused}"
        );
    }
    let stolen = attach(&broker.channel, hello(creds(1, 7, "forged"), &worker))
        .await
        .expect_err("the refused generation cannot attach");
    assert_eq!(stolen.code(), Code::Unauthenticated);

    // Generation 1 still holds the slot: it is assigned a task and completes it.
    let id = conductor.start_workflow(&task, json!({"n": 1})).await;
    let assignment = match inbound.message().await.unwrap() {
        Some(proto::BrokerMessage {
            message: Some(FromBroker::Assignment(a)),
        }) => a,
        other => panic!("expected an assignment, got {other:?}"),
    };
    tx.send(proto::ExecutorMessage {
        message: Some(ToBroker::Completion(proto::Completion {
            task_id: assignment.attempt.unwrap().task_id,
            execution_id: assignment.execution_id,
            result: Some(proto::TaskResult {
                outcome: Some(proto::task_result::Outcome::Completed(proto::Completed {
                    output_json: r#"{"result":"kept"}"#.to_owned(),
                })),
                worker_id: worker.clone(),
            }),
            recycle: String::new(),
            body_peak_memory_bytes: 0,
            body_oom_killed: false,
            spans: Vec::new(),
        })),
    })
    .await
    .unwrap();
    let wf = conductor.wait_terminal(&id, Duration::from_secs(20)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}");
    assert_eq!(wf["output"]["result"], "kept");

    // The next generation in order is taken; a retry of it (same token) is answered as
    // taken, the same generation with another token is not.
    control.slot_started(announce(2, "s2")).await.unwrap();
    control.slot_started(announce(2, "s2")).await.unwrap();
    let other = control
        .slot_started(announce(2, "forged"))
        .await
        .unwrap_err();
    assert_eq!(other.code(), Code::FailedPrecondition);
    attach(&broker.channel, hello(creds(1, 2, "s2"), &worker))
        .await
        .unwrap();
}

/// A stolen control token is of no use: the broker takes `Control` calls only on the
/// supervisor's own connections (`SO_PEERCRED`), so another process holding the token can
/// announce no generation, in order or not, and the runtime goes on. (What the supervisor does
/// when the broker refuses one of its generations is tested against a scripted broker in
/// `supervise.rs`: it stops, exit 1.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stolen_control_token_cannot_take_a_slot_over() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("broker.takeover", "read p\necho '{}'\n", "");
    conductor.register(&task).await;
    let sup = SupervisorProc::start(&task, &conductor, 1, &[]);
    let socket = sup.workspace_root().join("run/broker.sock");
    let id = conductor.start_workflow(&task, json!({})).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(20)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());

    // The token is not where a thief would look first: the broker got it over a pipe.
    let broker = child_named(sup.pid(), "perago-conductor-broker").expect("the broker");
    let environ = std::fs::read(format!("/proc/{}/environ", broker.pid)).unwrap();
    assert!(
        !environ
            .split(|b| *b == 0)
            .any(|kv| kv.starts_with(b"PERAGO_CONTROL_TOKEN=")),
        "the control token is in the broker's environment"
    );
    let channel = perago_core::socket::connect(&socket).await.unwrap();
    let mut control = proto::control_client::ControlClient::new(channel);
    let exited = control
        .slot_exited(Request::new(proto::SlotExited {
            slot: 1,
            generation: 1,
            pid: 1,
            status: "forged".into(),
            ..Default::default()
        }))
        .await
        .unwrap_err();
    assert_eq!(exited.code(), Code::Unauthenticated);

    // The executor of generation 1 still serves, and the runtime runs on.
    for _ in 0..2 {
        let id = conductor.start_workflow(&task, json!({})).await;
        let wf = conductor.wait_terminal(&id, Duration::from_secs(20)).await;
        assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
        assert_eq!(
            wf["tasks"][0]["workerId"],
            format!("{}0001", task.prefix()),
            "{wf:#}"
        );
    }
    let log = sup.log_text();
    assert!(!log.contains("executor exited"), "{log}");
}

/// A thief that has the control token anyway (here: the test, which set it) but is not the
/// supervisor's process is refused, in order or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_right_control_token_from_another_process_is_refused() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("broker.thief", "read p\necho '{}'\n", "");
    conductor.register(&task).await;
    // The broker takes control calls from pid 1 only: this test process is "another process".
    let broker = start_broker_with(&conductor, &task, &[("PERAGO_CONTROL_PID", "1")]).await;
    let mut control = proto::control_client::ControlClient::new(broker.channel.clone());
    for generation in [9, 1] {
        let refused = control
            .slot_started(with_control_token(proto::SlotStarted {
                slot: 1,
                generation,
                token: "thief".into(),
                pid: 0,
                body_version: 0,
            }))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::PermissionDenied, "{refused}");
        assert_eq!(
            refused.message(),
            "control calls are taken from the supervisor (pid 1) only"
        );
    }
}

/// The broker's CPU time so far (user + system), in clock ticks (100 per second).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = stat.rsplit_once(") ").unwrap().1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the command: state is field 3, utime 14, stime 15.
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// This process's soft descriptor limit.
fn own_nofile() -> u64 {
    std::fs::read_to_string("/proc/self/limits")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3)?.parse().ok())
        .unwrap_or(1024)
}

/// The socket survives a flood of idle connections: thousands (more than the broker's bound
/// and than its whole descriptor table, lowered to 256 here) are opened and held while tasks
/// keep completing on the attached executors (the broker's Conductor client needs descriptors
/// too) and `perago-supervisor status` answers; the broker holds a bounded number of
/// descriptors and does not spin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_socket_survives_a_flood_of_idle_connections() {
    const NOFILE: u64 = 256;
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("broker.flood", "read p\necho '{}'\n", "");
    conductor.register(&task).await;
    let sup = SupervisorProc::start_limited(&task, &conductor, 2, &[], Some(NOFILE));
    let socket = sup.workspace_root().join("run/broker.sock");
    let id = conductor.start_workflow(&task, json!({})).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(20)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
    let broker = child_named(sup.pid(), "perago-conductor-broker")
        .expect("the broker")
        .pid;
    let status = || async {
        let run = tokio::process::Command::new(crate::harness::SUPERVISOR)
            .args(["status", "--json", "--socket", socket.to_str().unwrap()])
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(Duration::from_secs(8), run)
            .await
            .map_err(|_| "status did not answer within 8 s".to_owned())?
            .unwrap();
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| {
            format!(
                "status failed ({e}): {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
        Ok::<_, String>(status)
    };

    // The flood: idle connections, never a byte sent, held open by this test.
    let flood = own_nofile().saturating_sub(200).min(3000);
    assert!(flood >= 2 * NOFILE, "this process may open only {flood}");
    let started = std::time::Instant::now();
    let mut idle = Vec::new();
    while (idle.len() as u64) < flood {
        match tokio::net::UnixStream::connect(&socket).await {
            Ok(c) => idle.push(c),
            // The backlog is full for a moment: the broker has not accepted yet.
            Err(_) if started.elapsed() < Duration::from_secs(15) => {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            Err(e) => panic!(
                "only {} connections opened in 15 s: {e}\n{}",
                idle.len(),
                sup.log_text()
            ),
        }
    }
    println!(
        "opened {} idle connections in {:?}",
        idle.len(),
        started.elapsed()
    );

    // While they are held: tasks complete, status answers, the broker stays within its
    // descriptors and idle.
    let ticks = cpu_ticks(broker);
    let window = std::time::Instant::now();
    let ids = start_workflows(&conductor, &task, 6).await;
    for id in &ids {
        let wf = conductor.wait_terminal(id, Duration::from_secs(20)).await;
        assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
    }
    // Hold the flood a little longer, idle, to see whether the broker spins.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let elapsed = window.elapsed();
    let cpu = (cpu_ticks(broker) - ticks) as f64 / 100.0 / elapsed.as_secs_f64();
    let fds = std::fs::read_dir(format!("/proc/{broker}/fd"))
        .unwrap()
        .count();
    println!(
        "broker during the flood: {:.1} % CPU over {elapsed:?}, {fds} descriptors open",
        cpu * 100.0
    );
    for _ in 0..3 {
        let answer = status()
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", sup.log_text()));
        assert_eq!(answer["slots"].as_array().unwrap().len(), 2, "{answer}");
    }
    assert!(cpu < 0.25, "the broker used {:.0} % CPU", cpu * 100.0);
    assert!((fds as u64) < NOFILE, "{fds} descriptors open");
    drop(idle);
    let id = conductor.start_workflow(&task, json!({})).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(20)).await;
    assert_eq!(wf["status"], "COMPLETED");
}

async fn start_workflows(conductor: &Conductor, task: &TaskFixture, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(conductor.start_workflow(task, json!({"i": i})).await);
    }
    ids
}

/// A plain HTTP/1.1 GET: the response head and body.
async fn http_get(url: &str) -> (String, String) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').unwrap();
    let mut stream = tokio::net::TcpStream::connect(host).await.unwrap();
    stream
        .write_all(
            format!("GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    (head.to_owned(), body.to_owned())
}

/// What must be equal in two scrapes a moment apart: the metadata lines and every series
/// (a sample line without its value).
fn families_and_series(text: &str) -> Vec<&str> {
    text.lines()
        .map(|l| {
            if l.starts_with('#') {
                l
            } else {
                l.rsplit_once(' ').map_or(l, |(series, _)| series)
            }
        })
        .collect()
}

/// `Admin.Metrics` answers with the broker's exposition, from the registry its `/metrics`
/// serves: the same families and series, the same content type, and the counters of a task
/// run through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_metrics_answers_what_the_metrics_endpoint_serves() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("broker.metrics", "cat\n", "");
    conductor.register(&task).await;
    let broker =
        start_broker_with(&conductor, &task, &[("PERAGO_METRICS_ADDR", "127.0.0.1:0")]).await;
    let log = broker.dir.path().join("broker.log");
    let url = eventually(
        "the metrics address in the log",
        Duration::from_secs(20),
        || async {
            let log = std::fs::read_to_string(&log).ok()?;
            let at = log.find("metrics served at ")?;
            let rest = &log[at + "metrics served at ".len()..];
            Some(rest.split(['"', ' ', '\n']).next()?.to_owned())
        },
    )
    .await;

    // One task through the broker, as an executor would run it.
    let worker = format!("{}0001", task.prefix());
    let (tx, _inbound, assignment, id) =
        first_assignment(&broker, &conductor, &task, &worker).await;
    tx.send(proto::ExecutorMessage {
        message: Some(ToBroker::Completion(proto::Completion {
            task_id: assignment.attempt.unwrap().task_id,
            execution_id: assignment.execution_id,
            result: Some(proto::TaskResult {
                outcome: Some(proto::task_result::Outcome::Completed(proto::Completed {
                    output_json: "{}".to_owned(),
                })),
                worker_id: worker.clone(),
            }),
            recycle: String::new(),
            body_peak_memory_bytes: 0,
            body_oom_killed: false,
            spans: Vec::new(),
        })),
    })
    .await
    .unwrap();
    let wf = conductor.wait_terminal(&id, Duration::from_secs(20)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}");

    let admin = AdminClient::new(broker.channel.clone());
    let completed = format!(
        "perago_task_results_total{{task=\"{}\",status=\"COMPLETED\"}} 1\n",
        task.name
    );
    let answer = eventually(
        "the completion in Admin.Metrics",
        Duration::from_secs(10),
        || {
            let mut admin = admin.clone();
            let completed = completed.clone();
            async move {
                let answer = admin.metrics(MetricsRequest {}).await.unwrap().into_inner();
                answer.text.contains(&completed).then_some(answer)
            }
        },
    )
    .await;
    let text = &answer.text;
    for series in [
        format!("perago_polls_total{{task=\"{}\"}} ", task.name),
        format!("task_poll_total{{taskType=\"{}\"}} ", task.name),
        format!(
            "task_execution_started_total{{taskType=\"{}\"}} 1\n",
            task.name
        ),
    ] {
        assert!(text.contains(&series), "{series} missing:\n{text}");
    }
    let polls = |text: &str| -> f64 {
        let prefix = format!("perago_polls_total{{task=\"{}\"}} ", task.name);
        let line = text.lines().find(|l| l.starts_with(&prefix)).unwrap();
        line[prefix.len()..].parse().unwrap()
    };
    assert!(polls(text) >= 1.0, "{text}");

    // The HTTP body has the same families and series (values may move between the two
    // reads: the broker goes on polling), and the same content type.
    let (head, _) = http_get(&url).await;
    assert!(
        head.to_ascii_lowercase()
            .contains(&format!("content-type: {}", answer.content_type)),
        "{head} vs {}",
        answer.content_type
    );
    eventually(
        "the same families over gRPC and HTTP",
        Duration::from_secs(10),
        || {
            let mut admin = admin.clone();
            let url = url.clone();
            async move {
                let grpc = admin
                    .metrics(MetricsRequest {})
                    .await
                    .unwrap()
                    .into_inner()
                    .text;
                let (_, body) = http_get(&url).await;
                (families_and_series(&grpc) == families_and_series(&body)).then_some(())
            }
        },
    )
    .await;
    // Admin.Metrics is there without PERAGO_METRICS_ADDR too.
    let plain = start_broker(
        &conductor,
        &TaskFixture::new("broker.metrics2", "cat\n", ""),
    )
    .await;
    let text = AdminClient::new(plain.channel.clone())
        .metrics(MetricsRequest {})
        .await
        .unwrap()
        .into_inner()
        .text;
    assert!(
        text.contains("perago_polls_total{task=\"broker.metrics2\"} "),
        "{text}"
    );
}
