//! The slot round trip: completion out, next assignment in, over the real slot protocol
//! (tonic, HTTP/2, Unix socket) between two processes, the client on a current-thread runtime
//! as the executor runs it; and beside it the floor, a raw Unix-socket ping-pong of the same
//! size between two processes.

use perago_proto::slot::v1::{
    self as proto,
    broker_message::Message as FromBroker,
    executor_message::Message as ToBroker,
    slot_server::{Slot, SlotServer},
};
use std::{
    io::{Read as _, Write as _},
    os::unix::net::{UnixListener, UnixStream},
    path::Path,
    pin::Pin,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};
use tokio::sync::mpsc;
use tokio_stream::{Stream, StreamExt as _, wrappers::ReceiverStream};
use tonic::{Request, Response, Status, Streaming};

/// Bytes per ping-pong message: about one assignment or completion.
const MESSAGE_BYTES: usize = 200;

fn assignment(n: u64) -> proto::BrokerMessage {
    proto::BrokerMessage {
        message: Some(FromBroker::Assignment(proto::Assignment {
            soft_time_limit_ms: None,
            max_tasks_per_executor: None,
            max_executor_memory_bytes: None,
            trace: None,
            execution_id: format!("00000000-0000-0000-0000-{n:012}"),
            attempt: Some(proto::AttemptSnapshot {
                workflow_instance_id: "0b8c4f5e-9d2a-4a57-8f0e-6f1c2d3e4a5b".into(),
                task_id: "1c9d5e6f-ae3b-4b68-9a1f-7a2d3e4f5b6c".into(),
                task_def_name: "bench.echo".into(),
                reference_task_name: "t".into(),
                status: proto::TaskStatus::InProgress as i32,
                input_data_json: format!("{{\"params\":{{\"n\":{n}}}}}"),
                response_timeout_seconds: Some(600),
                ..Default::default()
            }),
        })),
    }
}

/// The broker side: answers every completion with the next assignment.
#[derive(Debug)]
struct EchoBroker;

type AttachStream = Pin<Box<dyn Stream<Item = Result<proto::BrokerMessage, Status>> + Send>>;

#[tonic::async_trait]
impl Slot for EchoBroker {
    type AttachStream = AttachStream;

    async fn attach(
        &self,
        request: Request<Streaming<proto::ExecutorMessage>>,
    ) -> Result<Response<AttachStream>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            let mut n = 0u64;
            while let Some(Ok(message)) = inbound.next().await {
                let reply = match message.message {
                    Some(ToBroker::Hello(_)) | Some(ToBroker::Completion(_)) => assignment(n),
                    _ => continue,
                };
                n += 1;
                if tx.send(Ok(reply)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn reload_attempt(
        &self,
        _request: Request<proto::ReloadAttemptRequest>,
    ) -> Result<Response<proto::ReloadAttemptResponse>, Status> {
        Err(Status::unimplemented("not in the benchmark"))
    }
}

/// `perago-bench __slot-server SOCKET`: the broker side, on a multi-thread runtime as the
/// broker runs.
pub(crate) fn serve_slot(socket: &Path) -> i32 {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let listener = tokio::net::UnixListener::bind(socket).expect("bind");
        tonic::transport::Server::builder()
            .add_service(SlotServer::new(EchoBroker))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
            .await
            .expect("serve");
    });
    0
}

/// `perago-bench __uds-server SOCKET`: echoes fixed-size messages.
pub(crate) fn serve_uds(socket: &Path) -> i32 {
    let listener = UnixListener::bind(socket).expect("bind");
    let (mut stream, _) = listener.accept().expect("accept");
    let mut buf = [0u8; MESSAGE_BYTES];
    while stream.read_exact(&mut buf).is_ok() {
        if stream.write_all(&buf).is_err() {
            break;
        }
    }
    0
}

fn spawn_server(mode: &str, socket: &Path) -> Result<Child, String> {
    let exe = std::env::current_exe().map_err(|e| perago_core::errors::chain(&e))?;
    Command::new(exe)
        .arg(mode)
        .arg(socket)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| perago_core::errors::chain(&e))
}

/// Connects to the server's socket once it listens. The file appears at `bind`, a moment
/// before `listen`: a connection in between is refused, so refusals are retried too.
fn connect_when_listening(socket: &Path) -> Result<UnixStream, String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match UnixStream::connect(socket) {
            Ok(stream) => return Ok(stream),
            Err(e) if Instant::now() > deadline => {
                return Err(format!(
                    "{} does not accept: {}",
                    socket.display(),
                    perago_core::errors::DisplayChain(&e)
                ));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(2)),
        }
    }
}

/// Round-trip times of the slot protocol, in microseconds.
pub(crate) fn slot_round_trips(rounds: usize) -> Result<Vec<f64>, String> {
    let dir = tempfile::tempdir().map_err(|e| perago_core::errors::chain(&e))?;
    let socket = dir.path().join("slot.sock");
    let mut server = spawn_server("__slot-server", &socket)?;
    // The tonic server takes any number of connections: this one only proves it listens.
    drop(connect_when_listening(&socket)?);
    // The executor side runs on a current-thread runtime of its own thread, as in perago.
    let result = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async move {
            let channel = perago_core::socket::connect(&socket)
                .await
                .map_err(|e| perago_core::errors::chain(&e))?;
            let mut client = proto::slot_client::SlotClient::new(channel);
            let (tx, rx) = mpsc::channel(4);
            tx.send(proto::ExecutorMessage {
                message: Some(ToBroker::Hello(proto::Hello::default())),
            })
            .await
            .map_err(|e| perago_core::errors::chain(&e))?;
            let mut inbound = client
                .attach(ReceiverStream::new(rx))
                .await
                .map_err(|e| perago_core::errors::chain(&e))?
                .into_inner();
            let warmup = rounds / 10 + 10;
            let mut samples = Vec::with_capacity(rounds);
            let mut current = inbound
                .message()
                .await
                .map_err(|e| perago_core::errors::chain(&e))?;
            for i in 0..rounds + warmup {
                let Some(proto::BrokerMessage {
                    message: Some(FromBroker::Assignment(a)),
                }) = current
                else {
                    return Err("expected an assignment".to_owned());
                };
                let completion = proto::ExecutorMessage {
                    message: Some(ToBroker::Completion(proto::Completion {
                        task_id: a.attempt.map(|t| t.task_id).unwrap_or_default(),
                        execution_id: a.execution_id,
                        result: Some(proto::TaskResult {
                            outcome: Some(proto::task_result::Outcome::Completed(
                                proto::Completed {
                                    output_json: format!("{{\"result\":{{\"n\":{i}}}}}"),
                                },
                            )),
                            worker_id: "benchecho0001".into(),
                        }),
                        recycle: String::new(),
                        body_peak_memory_bytes: 0,
                        body_oom_killed: false,
                        spans: Vec::new(),
                    })),
                };
                // One round trip: the completion goes out, the next assignment comes in.
                let sent = Instant::now();
                tx.send(completion)
                    .await
                    .map_err(|e| perago_core::errors::chain(&e))?;
                current = inbound
                    .message()
                    .await
                    .map_err(|e| perago_core::errors::chain(&e))?;
                if i >= warmup {
                    samples.push(sent.elapsed().as_secs_f64() * 1e6);
                }
            }
            Ok(samples)
        })
    })
    .join()
    .map_err(|_| "the slot client panicked".to_owned())?;
    let _ = server.kill();
    let _ = server.wait();
    result
}

/// Round-trip times of a raw Unix-socket ping-pong, in microseconds.
pub(crate) fn uds_round_trips(rounds: usize) -> Result<Vec<f64>, String> {
    let dir = tempfile::tempdir().map_err(|e| perago_core::errors::chain(&e))?;
    let socket = dir.path().join("pingpong.sock");
    let mut server = spawn_server("__uds-server", &socket)?;
    // The echo server accepts exactly one connection: this is it.
    let mut stream = connect_when_listening(&socket)?;
    let mut buf = [7u8; MESSAGE_BYTES];
    let warmup = rounds / 10 + 10;
    let mut samples = Vec::with_capacity(rounds);
    for i in 0..rounds + warmup {
        let sent = Instant::now();
        stream
            .write_all(&buf)
            .map_err(|e| perago_core::errors::chain(&e))?;
        stream
            .read_exact(&mut buf)
            .map_err(|e| perago_core::errors::chain(&e))?;
        if i >= warmup {
            samples.push(sent.elapsed().as_secs_f64() * 1e6);
        }
    }
    drop(stream);
    let _ = server.kill();
    let _ = server.wait();
    Ok(samples)
}
