//! The slot client: attach to the broker with this generation's credentials, then run
//! assignments one at a time until told to stop.
//!
//! ```text
//! connect (retrying briefly) → Attach: Hello → Welcome
//!   ← Assignment → Progress… → run → Completion →
//!   ← Stop: exit once idle (0)        stream ends: the broker is gone (exit 1)
//!   ← Ping → Pong, at once, idle or busy (any time)
//!   nothing from the broker for Welcome.stall_timeout_ms: the broker is gone (exit 1)
//! ```
//!
//! SIGTERM/SIGINT only set a flag: an assignment in progress always finishes and its
//! completion is sent; the executor exits at the next idle point. Only a broker that goes away
//! mid-assignment cuts it short (its result could not be reported): the bodies are stopped
//! and the executor exits 1. After every assignment, whatever its bodies left running is
//! killed.

use crate::{
    assignment::{AssignmentIo, AssignmentRunner},
    recycle::RecycleLimits,
    wire,
    workspace::flow::{Fence, FenceRead},
};
use perago_core::{
    backoff::Backoff,
    result::{Reason, RuntimeResult},
};
use perago_proto::slot::v1::{
    self as proto, broker_message::Message as FromBroker, executor_message::Message as ToBroker,
    slot_client::SlotClient,
};
use std::{
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tracing::Instrument as _;

/// The attempt fence over the slot protocol: `ReloadAttempt` for this slot's current
/// execution.
struct SlotFence {
    client: SlotClient<Channel>,
    credentials: proto::SlotCredentials,
    execution_id: String,
}

impl Fence for SlotFence {
    fn reload(&self) -> std::pin::Pin<Box<dyn Future<Output = FenceRead> + Send + '_>> {
        Box::pin(async move {
            let request = proto::ReloadAttemptRequest {
                credentials: Some(self.credentials.clone()),
                execution_id: self.execution_id.clone(),
            };
            match self.client.clone().reload_attempt(request).await {
                Ok(answer) => match answer.into_inner().attempt.map(wire::attempt_from_wire) {
                    Some(Ok(fresh)) => FenceRead::Fresh(Box::new(fresh)),
                    Some(Err(e)) => FenceRead::Unavailable(perago_core::errors::chain(&e)),
                    None => FenceRead::Unavailable("the broker sent no attempt".to_owned()),
                },
                Err(status) if status.code() == tonic::Code::NotFound => FenceRead::Gone,
                Err(status) => FenceRead::Unavailable(status.message().to_owned()),
            }
        })
    }
}

/// How long to keep trying to reach the broker socket at start.
const CONNECT_PATIENCE: Duration = Duration::from_secs(10);

/// Who this executor is, as the supervisor set it up.
#[derive(Debug, Clone)]
pub struct SlotIdentity {
    /// `PERAGO_WORKER_ID`.
    pub worker_id: String,
    /// Slot number.
    pub slot: u32,
    /// Generation.
    pub generation: u64,
    /// Per-generation secret.
    pub token: String,
    /// The broker socket.
    pub socket: PathBuf,
    /// Where to tell the supervisor of this generation's first completed assignment
    /// (`PERAGO_COMPLETION_FD`).
    pub completions: Option<Arc<std::fs::File>>,
    /// When this generation leaves to be replaced by a fresh one.
    pub recycle: RecycleLimits,
}

/// How the slot loop ended normally.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Served {
    /// The broker said stop (a drain), or a signal asked for it.
    Stopped,
    /// A recycling limit was reached (the reason says which) and the broker said stop: exit
    /// with [`EXIT_RECYCLED`](perago_core::recycle::EXIT_RECYCLED).
    Recycled(String),
}

/// Why the slot loop ended abnormally.
#[derive(Debug, thiserror::Error)]
pub enum SlotError {
    /// The broker socket could not be reached.
    #[error("cannot reach the broker at {}", path.display())]
    Connect {
        /// The socket.
        path: PathBuf,
        /// The cause.
        #[source]
        source: tonic::transport::Error,
    },
    /// The broker refused the attach or the stream failed.
    #[error("the broker refused or dropped the slot stream")]
    Stream(#[from] tonic::Status),
    /// A Rust body overran and could not be stopped.
    #[error("a task body overran its time limit; restarting the executor to stop it")]
    Poisoned,
    /// The broker closed the stream without a stop.
    #[error("the broker closed the slot stream")]
    BrokerGone,
    /// The broker sent nothing (not even a ping) for the stall timeout it announced: it is
    /// stopped or wedged, and treated as gone.
    #[error(
        "the broker sent nothing for {} ({}): treating it as gone",
        perago_core::liveness::describe(*timeout),
        perago_core::liveness::PERAGO_STALL_TIMEOUT
    )]
    BrokerSilent {
        /// The stall timeout from `Welcome`.
        timeout: Duration,
    },
}

async fn connect_patiently(socket: &Path) -> Result<Channel, SlotError> {
    let backoff = Backoff::new(Duration::from_millis(20), Duration::from_secs(1), 0.2)
        .expect("valid constants");
    let deadline = tokio::time::Instant::now() + CONNECT_PATIENCE;
    let mut attempt = 0;
    loop {
        match perago_core::socket::connect(socket).await {
            Ok(channel) => return Ok(channel),
            Err(source) if tokio::time::Instant::now() >= deadline => {
                return Err(SlotError::Connect {
                    path: socket.to_owned(),
                    source,
                });
            }
            Err(_) => {
                tokio::time::sleep(backoff.delay(attempt)).await;
                attempt += 1;
            }
        }
    }
}

/// Ends the stream cleanly: closing our side lets everything already queued (the last
/// completion) reach the broker, which then closes its side. Exiting without this could lose
/// a completion still in flight.
async fn close(
    tx: mpsc::Sender<proto::ExecutorMessage>,
    mut inbound: tonic::Streaming<proto::BrokerMessage>,
) -> Result<(), SlotError> {
    drop(tx);
    let drained = tokio::time::timeout(Duration::from_secs(5), async {
        while let Ok(Some(_)) = inbound.message().await {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!("the broker did not close the slot stream within 5 s");
    }
    Ok(())
}

fn message(m: ToBroker) -> proto::ExecutorMessage {
    proto::ExecutorMessage { message: Some(m) }
}

/// After the broker is gone, how long the running body has between SIGTERM and SIGKILL:
/// its result can no longer be reported, so the executor does not wait for it.
pub const BROKER_GONE_GRACE: Duration = Duration::from_secs(2);

/// The slot stream's liveness, executor side: answers the broker's pings and notices a broker
/// that sends nothing for the stall timeout it announced in `Welcome` plus one ping period
/// (three pings missed in a row; 0: off). The extra period lets the supervisor, which polls
/// the broker every second and can end the runtime cleanly, act first on a stopped broker;
/// the executors' own check is the fallback for when nobody else acts.
struct Liveness {
    silence: Option<Duration>,
    last_heard: tokio::time::Instant,
}

impl Liveness {
    fn new(stall_timeout_ms: u64) -> Self {
        Self {
            silence: (stall_timeout_ms > 0).then(|| {
                let timeout = Duration::from_millis(stall_timeout_ms);
                timeout + perago_core::liveness::ping_interval(timeout)
            }),
            last_heard: tokio::time::Instant::now(),
        }
    }

    /// A message came: the broker is alive. A ping is answered at once (never waiting for
    /// room in the stream: a full stream carries messages that count as well).
    fn heard(&mut self, message: &FromBroker, tx: &mpsc::Sender<proto::ExecutorMessage>) {
        self.last_heard = tokio::time::Instant::now();
        if let FromBroker::Ping(ping) = message {
            let _ = tx.try_send(self::message(ToBroker::Pong(proto::Pong {
                sequence: ping.sequence,
            })));
        }
    }

    /// Resolves once the broker has been silent for the whole timeout (never when off).
    async fn silent(&self) -> Duration {
        match self.silence {
            Some(silence) => {
                tokio::time::sleep_until(self.last_heard + silence).await;
                silence
            }
            None => std::future::pending().await,
        }
    }
}

/// Runs one assignment while watching the slot stream. A `Stop` that arrives meanwhile is
/// queued in `pending` for after it (like any other message), a ping is answered at once; if
/// the stream ends (the broker died) or the broker stays silent for the stall timeout, the
/// assignment is abandoned: every body process gets SIGTERM, then SIGKILL after
/// [`BROKER_GONE_GRACE`], and the error is returned.
async fn run_watching_broker(
    work: impl Future<Output = RuntimeResult>,
    inbound: &mut tonic::Streaming<proto::BrokerMessage>,
    pending: &mut std::collections::VecDeque<FromBroker>,
    liveness: &mut Liveness,
    tx: &mpsc::Sender<proto::ExecutorMessage>,
) -> Result<RuntimeResult, SlotError> {
    let error;
    {
        let mut work = std::pin::pin!(work);
        loop {
            tokio::select! {
                result = &mut work => return Ok(result),
                next = inbound.message() => match next {
                    Ok(Some(proto::BrokerMessage { message: Some(message) })) => {
                        liveness.heard(&message, tx);
                        if !matches!(message, FromBroker::Ping(_)) {
                            pending.push_back(message);
                        }
                    }
                    Ok(Some(proto::BrokerMessage { message: None })) => {}
                    Ok(None) | Err(_) => {
                        error = SlotError::BrokerGone;
                        break;
                    }
                },
                timeout = liveness.silent() => {
                    error = SlotError::BrokerSilent { timeout };
                    break;
                }
            }
        }
        tracing::error!(
            grace_s = BROKER_GONE_GRACE.as_secs(),
            "the broker is gone while an assignment runs ({}): its result cannot be reported; stopping the body (SIGTERM, then SIGKILL)",
            perago_core::errors::DisplayChain(&error)
        );
        perago_sys::reaper::signal_managed(perago_sys::signal::SIGTERM);
        if tokio::time::timeout(BROKER_GONE_GRACE, &mut work)
            .await
            .is_err()
        {
            perago_sys::reaper::signal_managed(perago_sys::signal::SIGKILL);
        }
    }
    perago_sys::reaper::kill_adopted();
    Err(error)
}

/// Attaches and serves assignments until `Stop` (returns `Ok`) or the broker goes away.
/// `stop_requested` is the signal flag: checked whenever the executor is idle.
pub async fn serve(
    identity: &SlotIdentity,
    runner: &AssignmentRunner,
    stop_requested: Arc<AtomicBool>,
    mut signalled: mpsc::Receiver<()>,
) -> Result<Served, SlotError> {
    let channel = connect_patiently(&identity.socket).await?;
    let mut client = SlotClient::new(channel.clone())
        .max_decoding_message_size(perago_proto::MAX_SLOT_MESSAGE_BYTES)
        .max_encoding_message_size(perago_proto::MAX_SLOT_MESSAGE_BYTES);
    let (tx, rx) = mpsc::channel(8);
    let credentials = proto::SlotCredentials {
        slot: identity.slot,
        generation: identity.generation,
        token: identity.token.clone(),
    };
    tx.send(message(ToBroker::Hello(proto::Hello {
        protocol_version: proto::ProtocolVersion::ProtocolVersion1 as i32,
        credentials: Some(credentials.clone()),
        pid: std::process::id(),
        worker_id: identity.worker_id.clone(),
        body_at_dispatch: runner.body_at_dispatch(),
    })))
    .await
    .map_err(|_| SlotError::BrokerGone)?;
    let mut inbound = client.attach(ReceiverStream::new(rx)).await?.into_inner();
    let mut liveness = match inbound.message().await? {
        Some(proto::BrokerMessage {
            message: Some(FromBroker::Welcome(welcome)),
        }) => {
            tracing::info!(worker_id = %welcome.worker_id, broker = %welcome.broker_worker_id, generation = identity.generation, stall_timeout_ms = welcome.stall_timeout_ms, "attached to the broker");
            Liveness::new(welcome.stall_timeout_ms)
        }
        _ => return Err(SlotError::BrokerGone),
    };

    // Messages that arrived while an assignment ran (a drain's Stop), handled after it.
    let mut pending = std::collections::VecDeque::new();
    // Assignments this generation ran, and the recycling limit it reached (sent with the
    // completion; the broker answers with a Stop).
    let mut done: u64 = 0;
    let mut recycling: Option<String> = None;
    // The broker's recycling limits, once an assignment carried them (a reload changes them).
    let mut recycle = identity.recycle;
    let served = |recycling: &Option<String>| match recycling {
        Some(why) => Served::Recycled(why.clone()),
        None => Served::Stopped,
    };
    loop {
        if stop_requested.load(Ordering::SeqCst) {
            tracing::info!("stop requested by signal; exiting while idle");
            close(tx, inbound).await?;
            return Ok(served(&recycling));
        }
        let next = match pending.pop_front() {
            Some(next) => next,
            None => {
                let next = tokio::select! {
                    next = inbound.message() => next?,
                    Some(()) = signalled.recv() => continue,
                    timeout = liveness.silent() => {
                        tracing::error!("the broker sent nothing for {} while this executor was idle; exiting", perago_core::liveness::describe(timeout));
                        return Err(SlotError::BrokerSilent { timeout });
                    }
                };
                let Some(proto::BrokerMessage {
                    message: Some(next),
                }) = next
                else {
                    return Err(SlotError::BrokerGone);
                };
                liveness.heard(&next, &tx);
                next
            }
        };
        match next {
            FromBroker::Stop(stop) => {
                tracing::info!(reason = %stop.reason, "stop from the broker; exiting while idle");
                close(tx, inbound).await?;
                // The broker recycles this generation itself (a new body version rolls): it
                // leaves for the next one as if it had reached a limit.
                if recycling.is_none() && stop.reason == perago_core::recycle::STOP_RECYCLE {
                    recycling = Some("a new body version rolls".to_owned());
                }
                return Ok(served(&recycling));
            }
            FromBroker::Welcome(_) | FromBroker::Ping(_) => {}
            FromBroker::Assignment(assignment) => {
                let execution_id = assignment.execution_id.clone();
                let trace = crate::spans::SpanRecorder::from_wire(assignment.trace.as_deref());
                recycle = recycle.with_broker(
                    assignment.max_tasks_per_executor,
                    assignment.max_executor_memory_bytes,
                );
                // The broker's soft time limit (a reload changed it) wins over the manifest's.
                let soft_time_limit = assignment
                    .soft_time_limit_ms
                    .map(|ms| (ms > 0).then(|| std::time::Duration::from_millis(ms)));
                // Every line logged about the assignment, the body's stderr included, carries
                // its ids (the JSONL layer writes a span's fields into each line within it).
                let span = tracing::info_span!(
                    "assignment",
                    task_id = tracing::field::Empty,
                    execution_id = %execution_id,
                    worker_id = %identity.worker_id,
                );
                let (task_id, result) = match assignment.attempt.map(wire::attempt_from_wire) {
                    Some(Ok(attempt)) => {
                        span.record("task_id", attempt.task_id.as_str());
                        span.in_scope(|| tracing::debug!("assignment started"));
                        let fence = SlotFence {
                            client: client.clone(),
                            credentials: credentials.clone(),
                            execution_id: execution_id.clone(),
                        };
                        let progress_tx = tx.clone();
                        let progress_id = execution_id.clone();
                        let progress = move |phase: proto::Phase| {
                            // Progress is advisory: never wait for room in the stream.
                            let _ = progress_tx.try_send(message(ToBroker::Progress(
                                proto::Progress {
                                    execution_id: progress_id.clone(),
                                    phase: phase as i32,
                                },
                            )));
                        };
                        let io = AssignmentIo {
                            fence: Some(&fence),
                            progress: Some(&progress),
                            soft_time_limit,
                            trace: trace.as_ref(),
                        };
                        let work = runner.execute_with(&execution_id, &attempt, &io);
                        let result = run_watching_broker(
                            work,
                            &mut inbound,
                            &mut pending,
                            &mut liveness,
                            &tx,
                        )
                        .instrument(span.clone())
                        .await?;
                        span.in_scope(|| match result.outcome() {
                            perago_core::result::Outcome::Failed(reason)
                            | perago_core::result::Outcome::FailedTerminal(reason) => {
                                // With its ids of its own: at RUST_LOG=warn the (info) span
                                // is off.
                                tracing::warn!(task_id = %attempt.task_id, execution_id = %execution_id, status = result.status().as_str(), reason = %reason, "assignment failed");
                            }
                            perago_core::result::Outcome::Completed(_) => {
                                tracing::info!("assignment completed");
                            }
                        });
                        (attempt.task_id, result)
                    }
                    Some(Err(e)) => (
                        String::new(),
                        RuntimeResult::failed(
                            &identity.worker_id,
                            Reason::new(perago_core::errors::chain(&e)),
                        ),
                    ),
                    None => (
                        String::new(),
                        RuntimeResult::failed(
                            &identity.worker_id,
                            Reason::new("malformed assignment: no attempt"),
                        ),
                    ),
                };
                // Whatever the body left running (orphans re-parented to this subreaper) ends
                // with the assignment (a command body's run has seen to it already).
                if !runner.collects_leftovers() {
                    let killed =
                        perago_sys::reaper::kill_adopted_below(runner.body_thread_id().as_slice());
                    if killed > 0 {
                        span.in_scope(|| {
                            tracing::info!(
                                killed,
                                "killed the processes the assignment left running"
                            );
                        });
                    }
                }
                done += 1;
                if recycling.is_none()
                    && let Some(why) = recycle.check(done, runner.body_pid())
                {
                    span.in_scope(|| {
                        tracing::info!("recycling this executor after this assignment: {why}");
                    });
                    recycling = Some(why);
                }
                let completion = proto::Completion {
                    task_id,
                    execution_id,
                    result: Some(wire::result_into_wire(result)),
                    recycle: recycling.clone().unwrap_or_default(),
                    body_peak_memory_bytes: runner.take_body_peak(),
                    body_oom_killed: runner.take_body_oom(),
                    spans: trace.map(|t| t.take()).unwrap_or_default(),
                };
                tx.send(message(ToBroker::Completion(completion)))
                    .await
                    .map_err(|_| SlotError::BrokerGone)?;
                // The supervisor only needs to know that this generation works (its restart
                // backoff starts over): the first completion says it, and waking the
                // supervisor for every later one would cost it CPU per task.
                if done == 1
                    && let Some(pipe) = &identity.completions
                {
                    use std::io::Write as _;
                    // Non-blocking: a full pipe only loses a hint.
                    let _ = (&**pipe).write(b".");
                }
                if runner.poisoned() {
                    tracing::warn!(
                        "a Rust body overran its time limit and may still be running; exiting so the supervisor replaces this process"
                    );
                    close(tx, inbound).await?;
                    return Err(SlotError::Poisoned);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pings are answered with their sequence; the broker is silent only after the whole
    /// timeout and one ping period without any message, counted from the last one; 0 is off.
    #[tokio::test(start_paused = true)]
    async fn pings_are_answered_and_silence_is_the_whole_timeout() {
        let (tx, mut rx) = mpsc::channel(8);
        let mut liveness = Liveness::new(6000);
        liveness.heard(&FromBroker::Ping(proto::Ping { sequence: 7 }), &tx);
        let pong = rx.try_recv().unwrap();
        assert_eq!(
            pong.message,
            Some(ToBroker::Pong(proto::Pong { sequence: 7 }))
        );
        tokio::time::advance(Duration::from_secs(5)).await;
        liveness.heard(&FromBroker::Stop(proto::Stop::default()), &tx);
        assert!(rx.try_recv().is_err(), "only pings are answered");
        // The timeout and one ping period: three pings missed.
        let started = tokio::time::Instant::now();
        assert_eq!(liveness.silent().await, Duration::from_secs(8));
        assert_eq!(started.elapsed(), Duration::from_secs(8));
        let off = Liveness::new(0);
        let waited = tokio::time::timeout(Duration::from_secs(3600), off.silent()).await;
        assert!(waited.is_err(), "off: never silent");
    }
}
