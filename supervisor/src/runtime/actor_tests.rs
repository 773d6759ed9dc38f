//! The actor's calls to the broker, against stand-in servers.

use super::*;
use std::time::Instant;

#[tokio::test]
async fn a_socket_anyone_listens_on_is_foreign() {
    let tmp = tempfile::tempdir().unwrap();
    let socket = tmp.path().join("broker.sock");
    assert!(foreign_broker(&socket).await.is_none(), "no file");
    // A listener that never accepts nor answers still holds the path.
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let err = foreign_broker(&socket).await.expect("held").to_string();
    assert_eq!(
        err,
        format!(
            "another runtime is running under this workspace root: a process already answers on {}; this supervisor did not start it and will not use it (stop that runtime first)",
            socket.display()
        )
    );
    // A stale file nobody listens on is the broker's to clean up, not a foreign runtime.
    drop(listener);
    assert!(socket.exists());
    assert!(foreign_broker(&socket).await.is_none(), "stale file");
}

/// A scripted broker `Control`: answers each `SlotStarted` with the next code, and keeps
/// what it was told.
#[derive(Debug, Clone, Default)]
struct ScriptedControl {
    answers: std::sync::Arc<std::sync::Mutex<Vec<tonic::Code>>>,
    seen: std::sync::Arc<std::sync::Mutex<Vec<(u64, String)>>>,
}

#[tonic::async_trait]
impl proto::control_server::Control for ScriptedControl {
    async fn slot_started(
        &self,
        request: tonic::Request<proto::SlotStarted>,
    ) -> Result<tonic::Response<proto::ControlAck>, tonic::Status> {
        let started = request.into_inner();
        self.seen
            .lock()
            .unwrap()
            .push((started.generation, started.token));
        match self.answers.lock().unwrap().remove(0) {
            tonic::Code::Ok => Ok(tonic::Response::new(proto::ControlAck {})),
            code => Err(tonic::Status::new(code, "scripted")),
        }
    }

    async fn slot_exited(
        &self,
        _request: tonic::Request<proto::SlotExited>,
    ) -> Result<tonic::Response<proto::SlotExitedAck>, tonic::Status> {
        Ok(tonic::Response::new(proto::SlotExitedAck::default()))
    }

    async fn roll_body(
        &self,
        _request: tonic::Request<proto::RollBody>,
    ) -> Result<tonic::Response<proto::ControlAck>, tonic::Status> {
        Ok(tonic::Response::new(proto::ControlAck {}))
    }
}

/// A lost answer is retried with the same generation and token (the broker takes that
/// repeat); a refusal is final and names the slot and generation; the slot's generation moves
/// only when the broker took one. The machine decides, this module's `announce` calls.
#[tokio::test]
async fn announcements_are_repeated_when_lost_and_final_when_refused() {
    use super::super::machine::Config;
    let tmp = tempfile::tempdir().unwrap();
    let socket = tmp.path().join("broker.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let fake = ScriptedControl::default();
    fake.answers.lock().unwrap().extend([
        tonic::Code::Ok,
        tonic::Code::Unavailable,
        tonic::Code::Ok,
        tonic::Code::FailedPrecondition,
    ]);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(proto::control_server::ControlServer::new(fake.clone()))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let channel = perago_core::socket::connect(&socket).await.unwrap();
    let mut control =
        ControlClient::with_interceptor(channel, TokenInterceptor("t".parse().unwrap()));
    let config = Config {
        capacity: perago_core::capacity::Capacity::fixed(1),
        worker_ids: vec!["w0001".into()],
        force_kill_after: None,
        gc_interval: Duration::from_secs(300),
        stall_timeout: None,
        notify: false,
        watchdog: None,
    };
    let mut now = Instant::now();
    let mut m = Machine::new(
        config,
        secret,
        super::super::children::Child::Process(1),
        now,
    );
    // Performs the announcement in `out` over the fake broker; returns what the machine did
    // with its answer, and the error if there was one.
    async fn call(
        m: &mut Machine,
        control: &mut Control,
        out: Vec<Effect>,
        now: Instant,
    ) -> (Vec<Effect>, Option<RuntimeError>) {
        let [
            Effect::Announce {
                slot,
                generation,
                token,
                body_version,
            },
        ] = out.as_slice()
        else {
            panic!("{out:?}");
        };
        let result = announce(
            Some(control),
            *slot,
            *generation,
            token.clone(),
            *body_version,
        )
        .await;
        let error = match &result {
            Ok(()) => None,
            Err(AnnounceError::Lost(status)) => Some(RuntimeError::from(status.clone())),
            Err(AnnounceError::Refused(reason)) => Some(RuntimeError::GenerationRefused {
                slot: *slot,
                generation: *generation,
                reason: reason.clone(),
            }),
        };
        let input = Input::Announced {
            slot: *slot,
            generation: *generation,
            result,
        };
        (m.handle(input, now), error)
    }
    // Generation 1 is taken; it runs and crashes.
    let out = m.handle(Input::Begin, now);
    let (out, error) = call(&mut m, &mut control, out, now).await;
    assert!(error.is_none() && matches!(out.as_slice(), [Effect::Spawn { .. }]));
    m.handle(
        Input::Spawned {
            slot: 1,
            generation: 1,
            result: Ok(super::super::children::Child::Process(2)),
        },
        now,
    );
    let crash = |generation| {
        Input::Exited(ChildExit {
            kind: ChildKind::Executor {
                slot: 1,
                generation,
            },
            pid: 2,
            ended: super::super::children::Ended::Task(Err("crashed".into())),
        })
    };
    m.handle(crash(1), now);
    m.handle(
        Input::ExitHandled {
            slot: 1,
            generation: 1,
            seen: None,
        },
        now,
    );
    assert_eq!(m.slot(1).0, 1);
    now += Duration::from_secs(1);
    let out = m.handle(Input::Tick, now);
    let (out, lost) = call(&mut m, &mut control, out, now).await;
    let lost = lost.expect("lost");
    assert!(matches!(lost, RuntimeError::Control(_)), "{lost}");
    assert_eq!(out, []);
    assert_eq!(m.slot(1).0, 1);
    now += Duration::from_secs(2);
    let out = m.handle(Input::Tick, now);
    let (out, error) = call(&mut m, &mut control, out, now).await;
    assert!(error.is_none());
    let [Effect::Spawn { token, .. }] = out.as_slice() else {
        panic!("{out:?}");
    };
    let token = token.clone();
    assert_eq!(m.slot(1).0, 2);
    assert_eq!(
        fake.seen.lock().unwrap()[1..].to_vec(),
        [(2, token.clone()), (2, token.clone())]
    );

    m.handle(
        Input::Spawned {
            slot: 1,
            generation: 2,
            result: Ok(super::super::children::Child::Process(3)),
        },
        now,
    );
    m.handle(crash(2), now);
    m.handle(
        Input::ExitHandled {
            slot: 1,
            generation: 2,
            seen: None,
        },
        now,
    );
    now += Duration::from_secs(4);
    let out = m.handle(Input::Tick, now);
    let (out, refused) = call(&mut m, &mut control, out, now).await;
    let refused = refused.expect("refused");
    assert!(
        matches!(
            refused,
            RuntimeError::GenerationRefused {
                slot: 1,
                generation: 3,
                ..
            }
        ),
        "{refused}"
    );
    assert!(
        refused
            .to_string()
            .starts_with("the broker refused generation 3 of slot 1 (scripted)"),
        "{refused}"
    );
    assert_eq!(out, [Effect::Drain], "the runtime stops");
    assert_eq!(m.slot(1).0, 2);
    let seen = fake.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 4);
    assert_eq!(seen[3].0, 3);
    assert_ne!(seen[3].1, token, "a new generation has a new token");
}

/// A stand-in broker's start-up: the ready pipe's write end (what the broker holds), its
/// read end, and the channel its exit comes on.
fn starting_broker() -> (
    std::os::fd::OwnedFd,
    super::super::children::ReadyPipe,
    mpsc::UnboundedSender<ChildExit>,
    mpsc::UnboundedReceiver<ChildExit>,
) {
    let (write, read) = tokio::net::unix::pipe::pipe().unwrap();
    let (exits_tx, exits) = mpsc::unbounded_channel();
    (write.into_blocking_fd().unwrap(), read, exits_tx, exits)
}

fn broker_exit(why: &str) -> ChildExit {
    ChildExit {
        kind: ChildKind::Broker,
        pid: 0,
        ended: super::super::children::Ended::Task(Err(why.to_owned())),
    }
}

/// The broker's ready byte ends the wait (with nothing from its exit); its pipe closed
/// without one is not ready, and what follows is its exit: `BrokerDiedAtStart`, message kept.
#[tokio::test]
async fn the_ready_byte_ends_the_wait_and_a_closed_pipe_is_not_ready() {
    use std::io::Write as _;
    let socket = std::path::Path::new("/nonexistent/broker.sock");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let (write, read, _exits_tx, mut exits) = starting_broker();
    let waiting = tokio::spawn(async move {
        let ready = wait_ready(read, &mut exits, deadline, socket).await;
        (ready.map_err(|e| e.to_string()), exits)
    });
    std::fs::File::from(write).write_all(b"R").unwrap();
    let (ready, _) = waiting.await.unwrap();
    assert_eq!(ready, Ok(true));

    let (write, read, exits_tx, mut exits) = starting_broker();
    drop(write);
    assert_eq!(
        wait_ready(read, &mut exits, deadline, socket)
            .await
            .map_err(|e| e.to_string()),
        Ok(false),
        "end of file without the byte"
    );
    exits_tx.send(broker_exit("cannot serve")).unwrap();
    assert_eq!(
        exit_or_deadline(&mut exits, deadline, socket)
            .await
            .to_string(),
        "the broker exited during start-up (failed: cannot serve)"
    );
}

/// A broker that exits before it says it serves stops the wait at once (its pipe still
/// open, as a child of its own that inherited it would hold it); one that neither says it
/// serves nor exits stops it at the deadline: `BrokerStart`, message kept.
#[tokio::test]
async fn an_exit_or_the_deadline_ends_a_wait_without_the_ready_byte() {
    let socket = std::path::Path::new("/run/perago/broker.sock");
    let far = tokio::time::Instant::now() + Duration::from_secs(30);
    let (_write, read, exits_tx, mut exits) = starting_broker();
    exits_tx.send(broker_exit("killed")).unwrap();
    let err = wait_ready(read, &mut exits, far, socket).await.unwrap_err();
    assert!(
        matches!(err, RuntimeError::BrokerDiedAtStart { .. }),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "the broker exited during start-up (failed: killed)"
    );

    let (_write, read, _exits_tx, mut exits) = starting_broker();
    let started = tokio::time::Instant::now();
    let soon = started + Duration::from_millis(100);
    let err = wait_ready(read, &mut exits, soon, socket)
        .await
        .unwrap_err();
    assert!(tokio::time::Instant::now() >= soon);
    assert_eq!(
        err.to_string(),
        "the broker did not start serving on /run/perago/broker.sock within 15s"
    );
    let (_write, _read, _exits_tx, mut exits) = starting_broker();
    let err = exit_or_deadline(&mut exits, soon, socket).await;
    assert!(matches!(err, RuntimeError::BrokerStart { .. }), "{err}");
}
