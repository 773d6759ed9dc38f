//! The broker pushes its state: `Admin.Watch` sends the state first, then each change a
//! supervisor acts on as it happens, and heartbeats from the broker's own loop (none from a
//! stopped broker); `Control.SlotExited` answers with the broker's view of the slot after the
//! report.

use crate::{
    broker::{
        Broker, attach, creds, first_assignment, hello, start_broker, start_broker_with,
        with_control_token,
    },
    harness::{Conductor, TaskFixture, eventually, signal_pid},
};
use perago_proto::{
    admin::v1::{DrainRequest, SlotState, StatusResponse, WatchRequest, admin_client::AdminClient},
    slot::v1::{
        self as proto, broker_message::Message as FromBroker, control_client::ControlClient,
        executor_message::Message as ToBroker,
    },
};
use std::time::{Duration, Instant};
use tonic::Streaming;

/// Far beyond every deadline below: a message that comes within one of them is a change, not
/// a heartbeat.
const NO_HEARTBEAT_MS: u32 = 60_000;

/// The longest a change may take to arrive.
const CHANGE_DEADLINE: Duration = Duration::from_secs(10);

async fn watch(broker: &Broker, heartbeat_ms: u32) -> Streaming<StatusResponse> {
    AdminClient::new(broker.channel.clone())
        .watch(WatchRequest { heartbeat_ms })
        .await
        .unwrap()
        .into_inner()
}

/// The next message, which must come within `within`.
async fn next(stream: &mut Streaming<StatusResponse>, within: Duration) -> StatusResponse {
    tokio::time::timeout(within, stream.message())
        .await
        .unwrap_or_else(|_| panic!("no Watch message within {within:?}"))
        .expect("the stream is healthy")
        .expect("the stream goes on")
}

/// Reads messages until one satisfies `wanted`; the whole wait is bounded by `within`.
async fn until(
    stream: &mut Streaming<StatusResponse>,
    what: &str,
    within: Duration,
    wanted: impl Fn(&StatusResponse) -> bool,
) -> StatusResponse {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let message = tokio::time::timeout(left, stream.message())
            .await
            .unwrap_or_else(|_| panic!("{what}: not seen on the Watch stream within {within:?}"))
            .expect("the stream is healthy")
            .expect("the stream goes on");
        if wanted(&message) {
            return message;
        }
    }
}

fn states(status: &StatusResponse) -> Vec<SlotState> {
    status.slots.iter().map(|s| s.state()).collect()
}

async fn slot_started(broker: &Broker, slot: u32, generation: u64, token: &str) {
    ControlClient::new(broker.channel.clone())
        .slot_started(with_control_token(proto::SlotStarted {
            slot,
            generation,
            token: token.into(),
            pid: 0,
            body_version: 0,
        }))
        .await
        .unwrap();
}

async fn slot_exited(broker: &Broker, slot: u32, generation: u64) -> proto::SlotExitedAck {
    ControlClient::new(broker.channel.clone())
        .slot_exited(with_control_token(proto::SlotExited {
            slot,
            generation,
            pid: 0,
            status: "exit status 1".into(),
            cause: proto::ExitCause::Unspecified as i32,
            signal: None,
            exit_code: Some(1),
        }))
        .await
        .unwrap()
        .into_inner()
}

/// The process state letter of `pid` (`T` when stopped).
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) S ...`: the state follows the last ')'.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_sends_the_state_then_each_change_at_once_and_ends_when_drained() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("broker.watch", "cat\n", "");
    conductor.register(&task).await;
    let mut broker = start_broker(&conductor, &task).await;
    let worker = format!("{}0001", task.prefix());
    let mut stream = watch(&broker, NO_HEARTBEAT_MS).await;

    // The first message is the state now.
    let first = next(&mut stream, CHANGE_DEADLINE).await;
    assert_eq!(first.task_name, task.name);
    assert_eq!(first.broker_worker_id, format!("{}Broker", task.prefix()));
    assert!(!first.draining);
    assert_eq!(states(&first), [SlotState::Waiting, SlotState::Waiting]);
    assert_eq!(first.broker_pid, broker.child.id());

    // A slot attaching arrives as it happens, not a heartbeat later.
    slot_started(&broker, 1, 1, "s1").await;
    let (tx, mut inbound) = attach(&broker.channel, hello(creds(1, 1, "s1"), &worker))
        .await
        .unwrap();
    let attached = until(&mut stream, "slot 1 idle", CHANGE_DEADLINE, |s| {
        s.slots[0].state() == SlotState::Idle
    })
    .await;
    assert_eq!(attached.slots[0].generation, 1);
    assert_eq!(attached.slots[1].state(), SlotState::Waiting);

    // So does a drain through Admin.Drain.
    AdminClient::new(broker.channel.clone())
        .drain(DrainRequest {})
        .await
        .unwrap();
    until(&mut stream, "draining", CHANGE_DEADLINE, |s| s.draining).await;

    // The idle executor is told to stop and goes; the drained broker ends the stream cleanly
    // and exits.
    match inbound.message().await.unwrap() {
        Some(proto::BrokerMessage {
            message: Some(FromBroker::Stop(_)),
        }) => {}
        other => panic!("expected Stop, got {other:?}"),
    }
    drop(tx);
    drop(inbound);
    let end = tokio::time::timeout(CHANGE_DEADLINE, async {
        loop {
            match stream.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => return Ok(()),
                Err(status) => return Err(status),
            }
        }
    })
    .await
    .expect("the stream ends once the broker has drained");
    assert!(end.is_ok(), "the stream ended with an error: {end:?}");
    let pid = broker.child.id();
    eventually("the broker to exit", CHANGE_DEADLINE, || async {
        (!crate::harness::alive(pid)).then_some(())
    })
    .await;
    let exit = broker.child.wait().unwrap();
    assert!(exit.success(), "broker exit: {exit}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_heartbeats_come_from_a_quiet_broker_but_not_from_a_stopped_one() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("broker.watchbeat", "cat\n", "");
    conductor.register(&task).await;
    let broker = start_broker(&conductor, &task).await;
    let pid = broker.child.id();
    let mut stream = watch(&broker, 200).await;
    let first = next(&mut stream, CHANGE_DEADLINE).await;

    // Nothing changes, and the state comes again and again.
    for _ in 0..3 {
        let beat = next(&mut stream, Duration::from_secs(5)).await;
        assert_eq!(states(&beat), states(&first));
    }

    // A stopped broker sends nothing: what was on its way before the stop may still arrive
    // (a message or two), but not the ten heartbeats of a running broker over 2 s.
    signal_pid(pid, "STOP");
    eventually("the broker to stop", CHANGE_DEADLINE, || async {
        (proc_state(pid) == Some('T')).then_some(())
    })
    .await;
    let window = tokio::time::Instant::now() + Duration::from_secs(2);
    let mut while_stopped = 0;
    while let Ok(message) = tokio::time::timeout_at(window, stream.message()).await {
        message.unwrap().expect("the stream goes on");
        while_stopped += 1;
    }
    assert!(
        while_stopped <= 2,
        "{while_stopped} messages from a stopped broker"
    );

    // It resumes once the broker runs again.
    signal_pid(pid, "CONT");
    next(&mut stream, Duration::from_secs(5)).await;
    next(&mut stream, Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slot_exited_answers_the_brokers_view_of_the_slot_after_the_report() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("broker.exitack", "cat\n", "");
    conductor.register(&task).await;
    // An adaptive range 1..2: slot 2 is not wanted at the start.
    let broker = start_broker_with(&conductor, &task, &[("PERAGO_EXECUTORS_MIN", "1")]).await;
    let worker = format!("{}0001", task.prefix());

    // Slot 2 is retired.
    let ack = slot_exited(&broker, 2, 1).await;
    assert_eq!(
        (ack.draining, ack.retired, ack.recycling),
        (false, true, false),
        "slot 2: {ack:?}"
    );

    // Slot 1's generation 1 leaves to be recycled with its completion.
    let (tx, mut inbound, assignment, id) =
        first_assignment(&broker, &conductor, &task, &worker).await;
    let attempt = assignment.attempt.unwrap();
    tx.send(proto::ExecutorMessage {
        message: Some(ToBroker::Completion(proto::Completion {
            task_id: attempt.task_id.clone(),
            execution_id: assignment.execution_id.clone(),
            result: Some(proto::TaskResult {
                outcome: Some(proto::task_result::Outcome::Completed(proto::Completed {
                    output_json: r#"{"result":"done"}"#.into(),
                })),
                worker_id: worker.clone(),
            }),
            recycle: "1 assignments reached --max-tasks-per-executor 1".into(),
            body_peak_memory_bytes: 0,
            body_oom_killed: false,
            spans: Vec::new(),
        })),
    })
    .await
    .unwrap();
    match inbound.message().await.unwrap() {
        Some(proto::BrokerMessage {
            message: Some(FromBroker::Stop(stop)),
        }) => assert_eq!(stop.reason, "recycle"),
        other => panic!("expected Stop, got {other:?}"),
    }
    let wf = conductor.wait_terminal(&id, Duration::from_secs(20)).await;
    assert_eq!(wf["status"], "COMPLETED");
    drop(tx);
    drop(inbound);
    let ack = slot_exited(&broker, 1, 1).await;
    assert_eq!(
        (ack.draining, ack.retired, ack.recycling),
        (false, false, true),
        "slot 1, generation 1: {ack:?}"
    );

    // Generation 2 did not say so: its exit is no recycling.
    slot_started(&broker, 1, 2, "s2").await;
    let (tx, inbound) = attach(&broker.channel, hello(creds(1, 2, "s2"), &worker))
        .await
        .unwrap();
    drop(tx);
    drop(inbound);
    let ack = slot_exited(&broker, 1, 2).await;
    assert_eq!(
        (ack.draining, ack.retired, ack.recycling),
        (false, false, false),
        "slot 1, generation 2: {ack:?}"
    );

    // Once a drain has started, the answer says so (generation 3 stays attached meanwhile,
    // so the broker is still there to answer).
    slot_started(&broker, 1, 3, "s3").await;
    let (_tx, _inbound) = attach(&broker.channel, hello(creds(1, 3, "s3"), &worker))
        .await
        .unwrap();
    AdminClient::new(broker.channel.clone())
        .drain(DrainRequest {})
        .await
        .unwrap();
    let ack = slot_exited(&broker, 1, 2).await;
    assert_eq!(
        (ack.draining, ack.retired, ack.recycling),
        (true, false, false),
        "after Admin.Drain: {ack:?}"
    );
}

/// `status --watch` gives up on a broker that has sent nothing for five heartbeats (it is
/// stopped here), saying so, with exit 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_watch_gives_up_on_a_silent_broker() {
    use std::io::BufRead as _;
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("broker.watchsilent", "cat\n", "");
    conductor.register(&task).await;
    let broker = start_broker(&conductor, &task).await;
    let pid = broker.child.id();
    let socket = broker.dir.path().join("broker.sock");
    let mut watch = perago_tests::command(crate::harness::SUPERVISOR)
        .args(["status", "--watch", "--socket", socket.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The first table is printed: it follows the broker.
    let stdout = watch.stdout.take().unwrap();
    let first_line = tokio::task::spawn_blocking(move || {
        let mut reader = std::io::BufReader::new(stdout);
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        // Keep reading, so that the command is never blocked on a full pipe.
        std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::sink()));
        line
    });
    let first_line = tokio::time::timeout(CHANGE_DEADLINE, first_line)
        .await
        .expect("status --watch prints the state")
        .unwrap();
    assert!(
        first_line.starts_with(&format!("task {}", task.name)),
        "{first_line}"
    );
    signal_pid(pid, "STOP");
    let exit = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::task::spawn_blocking(move || watch.wait_with_output()),
    )
    .await
    .expect("status --watch gives up on a stopped broker")
    .unwrap()
    .unwrap();
    signal_pid(pid, "CONT");
    let stderr = String::from_utf8_lossy(&exit.stderr);
    assert_eq!(exit.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "no perago runtime answers at {}: no answer within 5 s",
            socket.display()
        )),
        "{stderr}"
    );
}

/// A watcher that comes after a quiet spell still hears the next change, also one that takes
/// the runtime back to what the last watcher saw (the busy slot idle again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_watcher_hears_a_change_back_to_what_an_earlier_one_saw() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("broker.watchagain", "cat\n", "");
    conductor.register(&task).await;
    let broker = start_broker(&conductor, &task).await;
    let worker = format!("{}0001", task.prefix());
    let mut earlier = watch(&broker, NO_HEARTBEAT_MS).await;
    next(&mut earlier, CHANGE_DEADLINE).await;
    slot_started(&broker, 1, 1, "s1").await;
    let (tx, mut inbound) = attach(&broker.channel, hello(creds(1, 1, "s1"), &worker))
        .await
        .unwrap();
    until(&mut earlier, "slot 1 idle", CHANGE_DEADLINE, |s| {
        s.slots[0].state() == SlotState::Idle
    })
    .await;
    drop(earlier);

    // Unwatched, the slot takes a task; then someone watches again.
    let id = conductor
        .start_workflow(&task, serde_json::json!({"n": 1}))
        .await;
    let assignment = match inbound.message().await.unwrap() {
        Some(proto::BrokerMessage {
            message: Some(FromBroker::Assignment(a)),
        }) => a,
        other => panic!("expected an assignment, got {other:?}"),
    };
    let mut later = watch(&broker, NO_HEARTBEAT_MS).await;
    let first = next(&mut later, CHANGE_DEADLINE).await;
    assert_eq!(first.slots[0].state(), SlotState::Busy);

    // Idle again: the same state the earlier watcher saw last, and a change to this one.
    let attempt = assignment.attempt.unwrap();
    tx.send(proto::ExecutorMessage {
        message: Some(ToBroker::Completion(proto::Completion {
            task_id: attempt.task_id.clone(),
            execution_id: assignment.execution_id.clone(),
            result: Some(proto::TaskResult {
                outcome: Some(proto::task_result::Outcome::Completed(proto::Completed {
                    output_json: r#"{"result":"done"}"#.into(),
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
    until(&mut later, "slot 1 idle again", CHANGE_DEADLINE, |s| {
        s.slots[0].state() == SlotState::Idle
    })
    .await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(20)).await;
    assert_eq!(wf["status"], "COMPLETED");
}

/// A pause and a resume are changes the Watch stream sends at once (issue #26 item 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_sends_a_pause_and_a_resume_at_once() {
    use perago_proto::admin::v1::{PauseRequest, ResumeRequest};
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("broker.watch.pause", "cat\n", "");
    conductor.register(&task).await;
    let broker = start_broker(&conductor, &task).await;
    let mut stream = watch(&broker, NO_HEARTBEAT_MS).await;
    let first = next(&mut stream, CHANGE_DEADLINE).await;
    assert!(!first.paused);
    let mut admin = AdminClient::new(broker.channel.clone());
    let paused = admin.pause(PauseRequest {}).await.unwrap().into_inner();
    assert!(!paused.already_paused);
    let seen = until(&mut stream, "the pause", CHANGE_DEADLINE, |s| s.paused).await;
    assert_eq!(seen.paused_since_unix_ms, paused.paused_since_unix_ms);
    let resumed = admin.resume(ResumeRequest {}).await.unwrap().into_inner();
    assert!(!resumed.already_running);
    let seen = until(&mut stream, "the resume", CHANGE_DEADLINE, |s| !s.paused).await;
    assert_eq!(seen.paused_since_unix_ms, 0);
}
