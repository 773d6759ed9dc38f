//! The gRPC services on the broker socket: `Slot` (executors), `Control` (the supervisor) and
//! `Admin` (operators). They translate requests into actor events; the actor decides.

use crate::{actor::Event, incoming, state::Input, wire};
use perago_core::{attempt::AttemptSnapshot, conductor::ConductorClient};
use perago_proto::{
    CONTROL_TOKEN_METADATA,
    admin::v1::{self as admin, admin_server::Admin},
    slot::v1::{
        self as proto, control_server::Control, executor_message::Message as Inbound,
        slot_server::Slot,
    },
};
use std::{pin::Pin, time::Duration};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::{Stream, StreamExt as _, wrappers::ReceiverStream};
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument as _;

/// An executor must say hello this soon after opening its stream.
const HELLO_DEADLINE: Duration = Duration::from_secs(10);

/// The longest `Control.SlotExited` waits for the actor to take the report: the supervisor
/// gives up at 5 s, and a broker's own answer says more than the supervisor's timeout.
const EXIT_ACK_DEADLINE: Duration = Duration::from_secs(4);

/// `Admin.Watch`: the heartbeat when the request leaves it 0, and the range it is clamped to.
const WATCH_HEARTBEAT_DEFAULT: Duration = Duration::from_millis(1000);
const WATCH_HEARTBEAT_MIN: Duration = Duration::from_millis(100);
const WATCH_HEARTBEAT_MAX: Duration = Duration::from_secs(60);

/// How long a watcher waits for the actor's state before giving that message up: a wedged
/// actor sends nothing, and the watcher asks again a heartbeat later.
const WATCH_ASK_DEADLINE: Duration = Duration::from_secs(1);

/// The longest `Admin.Watch` waits for its first message before it fails (UNAVAILABLE): under
/// the 5 s its callers give a broker.
const WATCH_FIRST_DEADLINE: Duration = Duration::from_secs(4);

/// The heartbeat a `WatchRequest` asks for, defaulted and clamped.
fn watch_heartbeat(heartbeat_ms: u32) -> Duration {
    if heartbeat_ms == 0 {
        return WATCH_HEARTBEAT_DEFAULT;
    }
    Duration::from_millis(u64::from(heartbeat_ms)).clamp(WATCH_HEARTBEAT_MIN, WATCH_HEARTBEAT_MAX)
}

async fn ask<T>(
    events: &mpsc::Sender<Event>,
    make: impl FnOnce(oneshot::Sender<T>) -> Event,
) -> Result<T, Status> {
    let (reply, answer) = oneshot::channel();
    events
        .send(make(reply))
        .await
        .map_err(|_| Status::unavailable("the broker is shutting down"))?;
    answer
        .await
        .map_err(|_| Status::unavailable("the broker is shutting down"))
}

/// `perago.slot.v1.Slot`.
#[derive(Debug, Clone)]
pub(crate) struct SlotService {
    pub(crate) events: mpsc::Sender<Event>,
    pub(crate) conductor: ConductorClient,
}

type AttachStream = Pin<Box<dyn Stream<Item = Result<proto::BrokerMessage, Status>> + Send>>;

#[tonic::async_trait]
impl Slot for SlotService {
    type AttachStream = AttachStream;

    async fn attach(
        &self,
        request: Request<Streaming<proto::ExecutorMessage>>,
    ) -> Result<Response<Self::AttachStream>, Status> {
        let peer_pid = request
            .extensions()
            .get::<incoming::ConnInfo>()
            .and_then(incoming::ConnInfo::peer_pid);
        let mut inbound = request.into_inner();
        let first = tokio::time::timeout(HELLO_DEADLINE, inbound.next())
            .await
            .map_err(|_| Status::deadline_exceeded("no hello within 10 s"))?;
        let hello = match first {
            Some(Ok(proto::ExecutorMessage {
                message: Some(Inbound::Hello(hello)),
            })) => hello,
            Some(Ok(_)) => return Err(Status::invalid_argument("the first message must be Hello")),
            Some(Err(status)) => return Err(status),
            None => return Err(Status::cancelled("stream closed before hello")),
        };
        // A handle on the process that connected, taken now (it is sending on this stream)
        // and only when it is the process the hello names: a stalled executor is killed
        // through it, never through a pid that may have been reused since.
        let process = peer_pid
            .and_then(|pid| u32::try_from(pid).ok())
            .filter(|pid| *pid == hello.pid)
            .and_then(|pid| perago_sys::reaper::pidfd::ProcessHandle::open(pid).ok());
        let (tx, rx) = mpsc::channel(16);
        let (slot, generation) = ask(&self.events, |reply| Event::Hello {
            hello,
            tx,
            reply,
            process,
        })
        .await??;

        // Read the executor's side in a task of its own, so a dropped peer shows up at once.
        let events = self.events.clone();
        tokio::spawn(async move {
            while let Some(message) = inbound.next().await {
                let event = match message {
                    Ok(proto::ExecutorMessage {
                        message: Some(Inbound::Completion(completion)),
                    }) => Event::Slot(Input::Completion {
                        slot,
                        generation,
                        completion,
                    }),
                    Ok(proto::ExecutorMessage {
                        message: Some(Inbound::Progress(progress)),
                    }) => Event::Slot(Input::Progress {
                        slot,
                        generation,
                        progress,
                    }),
                    Ok(proto::ExecutorMessage {
                        message: Some(Inbound::Pong(_)),
                    }) => Event::Slot(Input::Pong { slot, generation }),
                    Ok(_) => {
                        tracing::warn!(
                            slot,
                            generation,
                            "ignored an unexpected message on an attached stream"
                        );
                        continue;
                    }
                    Err(status) => {
                        tracing::debug!(slot, generation, %status, "attach stream error");
                        break;
                    }
                };
                if events.send(event).await.is_err() {
                    return;
                }
            }
            let _ = events
                .send(Event::Slot(Input::StreamEnded { slot, generation }))
                .await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn reload_attempt(
        &self,
        request: Request<proto::ReloadAttemptRequest>,
    ) -> Result<Response<proto::ReloadAttemptResponse>, Status> {
        let request = request.into_inner();
        let credentials = request
            .credentials
            .ok_or_else(|| Status::unauthenticated("no credentials"))?;
        let execution_id = request.execution_id;
        let task_id = ask(&self.events, |reply| Event::FenceTarget {
            credentials,
            execution_id,
            reply,
        })
        .await??;
        let task = self.conductor.get_task(&task_id).await.map_err(|e| {
            if e.is_not_found() {
                Status::not_found(format!("Conductor no longer knows task {task_id}"))
            } else {
                Status::unavailable(format!(
                    "cannot read task {task_id}: {}",
                    perago_core::errors::DisplayChain(&e)
                ))
            }
        })?;
        let attempt = AttemptSnapshot::from_conductor(&task).map_err(|e| {
            Status::unavailable(format!(
                "task {task_id} read back malformed: {}",
                perago_core::errors::DisplayChain(&e)
            ))
        })?;
        Ok(Response::new(proto::ReloadAttemptResponse {
            attempt: Some(wire::attempt_to_wire(&attempt)),
        }))
    }
}

/// `perago.slot.v1.Control`.
#[derive(Debug, Clone)]
pub(crate) struct ControlService {
    pub(crate) events: mpsc::Sender<Event>,
    pub(crate) token: String,
    /// The supervisor's pid: `Control` calls on another process's connection are refused,
    /// token or not (a stolen token is of no use from anywhere else).
    pub(crate) control_pid: u32,
}

impl ControlService {
    fn authorize<T>(&self, request: &Request<T>) -> Result<(), Status> {
        let given = request
            .metadata()
            .get(CONTROL_TOKEN_METADATA)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        let ok = given.len() == self.token.len()
            && given
                .bytes()
                .zip(self.token.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if !ok {
            return Err(Status::unauthenticated("wrong or missing control token"));
        }
        let peer = request
            .extensions()
            .get::<incoming::ConnInfo>()
            .and_then(incoming::ConnInfo::peer_pid);
        if peer != i32::try_from(self.control_pid).ok() {
            tracing::error!(
                peer_pid = ?peer,
                supervisor_pid = self.control_pid,
                "refused a control call with the right token from another process than the supervisor"
            );
            return Err(Status::permission_denied(format!(
                "control calls are taken from the supervisor (pid {}) only",
                self.control_pid
            )));
        }
        Ok(())
    }
}

#[tonic::async_trait]
impl Control for ControlService {
    async fn slot_started(
        &self,
        request: Request<proto::SlotStarted>,
    ) -> Result<Response<proto::ControlAck>, Status> {
        self.authorize(&request)?;
        let started = request.into_inner();
        ask(&self.events, |reply| Event::SlotStarted { started, reply }).await??;
        Ok(Response::new(proto::ControlAck {}))
    }

    async fn roll_body(
        &self,
        request: Request<proto::RollBody>,
    ) -> Result<Response<proto::ControlAck>, Status> {
        self.authorize(&request)?;
        let body_version = request.into_inner().body_version;
        ask(&self.events, |reply| Event::Roll {
            body_version,
            reply,
        })
        .await?;
        Ok(Response::new(proto::ControlAck {}))
    }

    async fn slot_exited(
        &self,
        request: Request<proto::SlotExited>,
    ) -> Result<Response<proto::SlotExitedAck>, Status> {
        self.authorize(&request)?;
        let exited = request.into_inner();
        let ack = tokio::time::timeout(
            EXIT_ACK_DEADLINE,
            ask(&self.events, |reply| Event::SlotExited { exited, reply }),
        )
        .await
        .map_err(|_| {
            Status::deadline_exceeded("the broker did not take the exit report within 4 s")
        })??;
        Ok(Response::new(ack))
    }
}

/// `perago.admin.v1.Admin`.
#[derive(Debug, Clone)]
pub(crate) struct AdminService {
    pub(crate) events: mpsc::Sender<Event>,
    /// The registry `/metrics` serves, for `Admin.Metrics`.
    pub(crate) metrics: std::sync::Arc<prometheus_client::registry::Registry>,
    /// What `Admin.Watch` streams wake on.
    pub(crate) watchers: crate::actor::Watchers,
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<admin::StatusResponse, Status>> + Send>>;

/// One `Admin.Watch` stream after its first message: the state again at each change the actor
/// signals and after `heartbeat` of quiet, always read from the actor (bounded), so a wedged
/// actor sends nothing. A slow reader holds up only this task, never the actor: changes that
/// come meanwhile are merged into the next read. Ends when the reader goes or the broker has
/// drained.
async fn follow(
    events: mpsc::Sender<Event>,
    mut changes: tokio::sync::watch::Receiver<u64>,
    heartbeat: Duration,
    tx: mpsc::Sender<Result<admin::StatusResponse, Status>>,
) {
    loop {
        tokio::select! {
            () = tx.closed() => return,
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            () = tokio::time::sleep(heartbeat) => {}
        }
        let status = tokio::time::timeout(
            WATCH_ASK_DEADLINE,
            ask(&events, |reply| Event::Status { reply }),
        )
        .await;
        match status {
            Ok(Ok(status)) => {
                if tx.send(Ok(status)).await.is_err() {
                    return;
                }
            }
            // The actor is gone: so is the broker.
            Ok(Err(_)) => return,
            // The actor did not answer in time: nothing is sent for this beat.
            Err(_) => tracing::debug!("a watcher's status read timed out"),
        }
    }
}

#[tonic::async_trait]
impl Admin for AdminService {
    type WatchStream = WatchStream;

    async fn watch(
        &self,
        request: Request<admin::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let heartbeat = watch_heartbeat(request.into_inner().heartbeat_ms);
        // Subscribed before the first read: a change after it is not missed.
        let changes = self.watchers.subscribe();
        let first = tokio::time::timeout(
            WATCH_FIRST_DEADLINE,
            ask(&self.events, |reply| Event::Status { reply }),
        )
        .await
        .map_err(|_| Status::unavailable("the broker's loop did not answer within 4 s"))??;
        let (tx, rx) = mpsc::channel(1);
        tx.send(Ok(first))
            .await
            .map_err(|_| Status::cancelled("the watcher went away"))?;
        let span = tracing::debug_span!(
            "watch",
            heartbeat_ms = u64::try_from(heartbeat.as_millis()).unwrap_or(u64::MAX)
        );
        tokio::spawn(follow(self.events.clone(), changes, heartbeat, tx).instrument(span));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn status(
        &self,
        _request: Request<admin::StatusRequest>,
    ) -> Result<Response<admin::StatusResponse>, Status> {
        Ok(Response::new(
            ask(&self.events, |reply| Event::Status { reply }).await?,
        ))
    }

    async fn drain(
        &self,
        _request: Request<admin::DrainRequest>,
    ) -> Result<Response<admin::DrainResponse>, Status> {
        let already_draining = ask(&self.events, |reply| Event::Drain { reply }).await?;
        Ok(Response::new(admin::DrainResponse { already_draining }))
    }

    async fn pause(
        &self,
        _request: Request<admin::PauseRequest>,
    ) -> Result<Response<admin::PauseResponse>, Status> {
        let (already_paused, since) = ask(&self.events, |reply| Event::Pause { reply }).await?;
        Ok(Response::new(admin::PauseResponse {
            already_paused,
            paused_since_unix_ms: since
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
        }))
    }

    async fn resume(
        &self,
        _request: Request<admin::ResumeRequest>,
    ) -> Result<Response<admin::ResumeResponse>, Status> {
        let already_running = ask(&self.events, |reply| Event::Resume { reply }).await?;
        Ok(Response::new(admin::ResumeResponse { already_running }))
    }

    async fn scale(
        &self,
        request: Request<admin::ScaleRequest>,
    ) -> Result<Response<admin::ScaleResponse>, Status> {
        let admin::ScaleRequest {
            min_executors: min,
            max_executors: max,
        } = request.into_inner();
        let (previous_min_executors, previous_max_executors) =
            ask(&self.events, |reply| Event::Scale { min, max, reply }).await??;
        Ok(Response::new(admin::ScaleResponse {
            previous_min_executors,
            previous_max_executors,
        }))
    }

    async fn reconfigure(
        &self,
        request: Request<admin::ReconfigureRequest>,
    ) -> Result<Response<admin::ReconfigureResponse>, Status> {
        let admin::ReconfigureRequest {
            soft_time_limit_ms,
            poll_interval_ms,
            poll_timeout_ms,
            domain,
            max_tasks_per_executor,
            max_executor_memory_bytes,
            min_free_memory_bytes,
        } = request.into_inner();
        let settings = crate::state::Reconfig {
            soft_time_limit_ms,
            poll_interval_ms,
            poll_timeout_ms,
            domain,
            max_tasks_per_executor,
            max_executor_memory_bytes,
            min_free_memory_bytes,
        };
        let done = ask(&self.events, |reply| Event::Reconfigure { settings, reply }).await??;
        Ok(Response::new(admin::ReconfigureResponse {
            unchanged: done.unchanged,
            previous_soft_time_limit_ms: done.previous_soft_time_limit_ms,
            changed: done.changed,
        }))
    }

    async fn share_grant(
        &self,
        request: Request<admin::ShareGrantRequest>,
    ) -> Result<Response<admin::ShareStatus>, Status> {
        let admin::ShareGrantRequest { limit, epoch } = request.into_inner();
        let status = ask(&self.events, |reply| Event::ShareGrant {
            limit,
            epoch,
            reply,
        })
        .await??;
        Ok(Response::new(status))
    }

    async fn metrics(
        &self,
        _request: Request<admin::MetricsRequest>,
    ) -> Result<Response<admin::MetricsResponse>, Status> {
        Ok(Response::new(admin::MetricsResponse {
            text: crate::metrics::exposition(&self.metrics),
            content_type: crate::metrics::CONTENT_TYPE.to_owned(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_heartbeat_is_defaulted_and_clamped() {
        assert_eq!(watch_heartbeat(0), Duration::from_secs(1));
        assert_eq!(watch_heartbeat(1), Duration::from_millis(100));
        assert_eq!(watch_heartbeat(250), Duration::from_millis(250));
        assert_eq!(watch_heartbeat(u32::MAX), Duration::from_secs(60));
    }
}
