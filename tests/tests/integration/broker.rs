//! The broker process on its own, driven as the supervisor and as executors would drive it:
//! every attach is authenticated per generation, and a completion that is not the slot's
//! current assignment never reaches Conductor.

use crate::harness::{BROKER, Conductor, TaskFixture, eventually};
use perago_proto::{
    CONTROL_TOKEN_METADATA,
    admin::v1::{StatusRequest, admin_client::AdminClient},
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

struct Broker {
    child: std::process::Child,
    dir: tempfile::TempDir,
    channel: Channel,
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start_broker(conductor: &Conductor, task: &TaskFixture) -> Broker {
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
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let channel = eventually("the broker socket", Duration::from_secs(10), || async {
        perago_executor::slot::connect(&socket).await.ok()
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

fn with_control_token<T>(message: T) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert(CONTROL_TOKEN_METADATA, CONTROL_TOKEN.parse().unwrap());
    request
}

fn creds(slot: u32, generation: u64, token: &str) -> proto::SlotCredentials {
    proto::SlotCredentials {
        slot,
        generation,
        token: token.to_owned(),
    }
}

fn hello(credentials: proto::SlotCredentials, worker_id: &str) -> proto::ExecutorMessage {
    proto::ExecutorMessage {
        message: Some(ToBroker::Hello(proto::Hello {
            protocol_version: proto::ProtocolVersion::ProtocolVersion1 as i32,
            credentials: Some(credentials),
            pid: std::process::id(),
            worker_id: worker_id.to_owned(),
        })),
    }
}

/// Opens an Attach stream with `first` as the first message.
async fn attach(
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
    let mut control = proto::control_client::ControlClient::new(broker.channel.clone());
    control
        .slot_started(with_control_token(proto::SlotStarted {
            slot: 1,
            generation: 1,
            token: "s1".into(),
            pid: 0,
        }))
        .await
        .unwrap();
    let (tx, mut inbound) = attach(&broker.channel, hello(creds(1, 1, "s1"), &worker))
        .await
        .unwrap();
    let id = conductor.start_workflow(&task, json!({"n": 1})).await;
    let assignment = match inbound.message().await.unwrap() {
        Some(proto::BrokerMessage {
            message: Some(FromBroker::Assignment(a)),
        }) => a,
        other => panic!("expected an assignment, got {other:?}"),
    };
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
