//! The Conductor broker: the one process that holds the Conductor client. It polls one task
//! type, dispatches each task to a free executor slot over the slot protocol, serves the
//! attempt fence (`ReloadAttempt`), extends leases and reports results.
//!
//! Process tree position: a child of `perago-supervisor`, shown as `perago-conductor-broker`.
//! Inside: one actor ([`state`]) owns every slot; the poller, the gRPC services and the
//! reporters talk to it by message. See `docs/runtime.md`.

#![forbid(unsafe_code)]

mod actor;
mod admission;
mod applied;
pub mod cli;
mod counters;
mod crash_history;
mod depth;
#[cfg(test)]
mod error_texts;
mod health;
mod incoming;
mod journal;
pub mod metrics;
mod poison;
mod poller;
mod recent;
mod report;
mod service;
mod state;
mod traces;
pub mod wire;

use perago_core::{backoff::Backoff, conductor::ConductorClient, identity::WorkerPrefix};
use perago_proto::{admin::v1::admin_server::AdminServer, slot::v1 as proto};
use std::{future::Future, path::PathBuf, sync::Arc, time::Duration, time::SystemTime};
use tokio::sync::{mpsc, oneshot};

/// Everything the broker needs; the supervisor passes it through the environment.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// The Conductor task type polled.
    pub task_name: String,
    /// The worker id prefix (the broker polls as prefix + `Broker`).
    pub prefix: WorkerPrefix,
    /// The capacity and lifecycle settings; `capacity.max_executors` is the number of slots.
    pub capacity: perago_core::capacity::Capacity,
    /// The Conductor client.
    pub conductor: ConductorClient,
    /// Where to serve gRPC.
    pub socket: PathBuf,
    /// The secret the supervisor presents on `Control` calls.
    pub control_token: String,
    /// The process whose `Control` calls are taken (with the token): the supervisor.
    pub control_pid: u32,
    /// Long-poll wait per batch poll (at most 5 s).
    pub poll_wait: Duration,
    /// `PERAGO_DOMAIN`: the task domain polled in, whose queue depth is read; `None`: the
    /// default queue.
    pub domain: Option<perago_core::conductor::Domain>,
    /// `PERAGO_POLL_INTERVAL_MS`: the wait after a poll that brought no task (zero: none).
    pub poll_interval: Duration,
    /// How the supervisor set the runtime up (execution mode, SDK settings), for Admin.Status.
    pub settings: perago_proto::admin::v1::RuntimeSettings,
    /// Where to serve Prometheus metrics (`PERAGO_METRICS_ADDR`); off when `None`.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// `PERAGO_STALL_TIMEOUT`: an executor not heard from this long is killed (`None`: off).
    pub stall_timeout: Option<Duration>,
    /// The runtime's locked workspace root (`PERAGO_WORKSPACE_ROOT`): the result journal lives
    /// under it. `None`: results are not journaled.
    pub workspace_root: Option<PathBuf>,
    /// `PERAGO_READY_FD`: the write end of the supervisor's ready pipe, a descriptor this
    /// process owns (inherited, or in thread mode given up by the supervisor). [`run`] takes
    /// it, writes one byte once the socket is served, and closes it. `None`: nobody is told.
    pub ready_fd: Option<std::os::fd::RawFd>,
    /// `PERAGO_SOFT_TIME_LIMIT_MS`: the manifest's soft time limit as the supervisor read it
    /// (0: none), shown in Admin.Status until `Admin.Reconfigure` changes it; `None`: not told.
    pub soft_time_limit_ms: Option<u64>,
    /// `PERAGO_SHARE=1`: polls only within the permits the supervisor grants
    /// (`Admin.ShareGrant`; docs/sharing.md).
    pub share: bool,
    /// The OpenTelemetry exporter's settings (`OTEL_*`): a trace per attempt is exported;
    /// `None`: off.
    pub trace: Option<perago_core::trace::Config>,
}

/// Why the broker stopped.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// The socket could not be bound.
    #[error("cannot serve on {}", path.display())]
    Socket {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The metrics address could not be bound.
    #[error("cannot serve metrics on {addr}")]
    Metrics {
        /// `PERAGO_METRICS_ADDR`.
        addr: std::net::SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The trace exporter cannot start.
    #[error("cannot export traces")]
    Trace(#[from] perago_core::trace::ConfigError),
    /// The gRPC server failed.
    #[error("the slot server failed")]
    Serve(#[from] tonic::transport::Error),
}

/// Serves until a drain completes (every executor gone, every result reported). A drain
/// starts on `Admin.Drain` or when `stop` resolves.
///
/// Owns `config.ready_fd` (marked close-on-exec at once, closed once written or when the
/// broker fails first): run each configuration once.
pub async fn run(config: BrokerConfig, stop: impl Future<Output = ()>) -> Result<(), BrokerError> {
    let ready = config.ready_fd.and_then(perago_sys::fd::adopt_fd);
    // Descriptors: as many as allowed, and the socket's connections bounded to a share of
    // them (see `incoming`), so a flood of connections cannot starve the executors' streams,
    // `status` or the Conductor client.
    let nofile = perago_sys::rlimit::raise_nofile_limit();
    let limits = incoming::Limits::for_descriptors(nofile, config.capacity.max_executors);
    let (listener, _socket_guard) =
        perago_core::socket::bind(&config.socket)
            .await
            .map_err(|source| BrokerError::Socket {
                path: config.socket.clone(),
                source,
            })?;
    let counters = Arc::new(counters::Counters::default());
    let gauges = Arc::new(counters::Gauges::default());
    // One registry for both readers of the metrics, so they always agree: `GET /metrics`
    // (when PERAGO_METRICS_ADDR is set) and `Admin.Metrics` (always).
    let registry = Arc::new(counters::registry(
        &config.task_name,
        config.domain.as_ref(),
        &config.settings,
        &counters,
        &gauges,
    ));
    if let Some(addr) = config.metrics_addr {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| BrokerError::Metrics { addr, source })?;
        let bound = listener
            .local_addr()
            .map_err(|source| BrokerError::Metrics { addr, source })?;
        tracing::info!(addr = %bound, "metrics served at http://{bound}/metrics");
        tokio::spawn(metrics::serve(listener, Arc::clone(&registry)));
    }
    let backoff = Backoff::default_remote();
    let (events, rx) = mpsc::channel(1024);
    let (drained_tx, drained_rx) = oneshot::channel();
    // Updates and lease extensions share one route's state, polls have their own (`health`).
    let health = health::Health::new("updates");
    let journal = open_journal(&config);
    let reporter = report::Reporter::new(
        config.conductor.clone(),
        Arc::clone(&counters),
        Arc::clone(&gauges),
        backoff,
        health.clone(),
    )
    .with_journal(journal.clone());
    let machine = state::Machine::new(
        config.task_name.clone(),
        &config.prefix,
        config.capacity.clone(),
        Arc::clone(&counters),
        Arc::clone(&gauges),
        state::Now {
            instant: std::time::Instant::now(),
            wall: SystemTime::now(),
        },
        state::ExecutionIds::new(|| uuid::Uuid::new_v4().to_string()),
    )
    .with_domain(config.domain.clone())
    .with_poll(config.poll_wait, config.poll_interval)
    .with_soft_time_limit(config.soft_time_limit_ms)
    .with_share(config.share);
    // The gRPC health service: SERVING while the broker takes work, NOT_SERVING while paused
    // and from the start of a drain (the actor switches it), for readiness probes and load
    // balancers.
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    let actor = actor::Actor::new(
        machine,
        config.capacity.max_executors,
        reporter,
        events.clone(),
        drained_tx,
    )
    .with_queue_depth(config.conductor.clone(), config.task_name.clone())
    .with_health(health_reporter.clone())
    .with_stall_timeout(config.stall_timeout)
    .with_settings(config.settings.clone());
    let tracer = match config.trace.clone() {
        Some(trace) => {
            let tracer = perago_core::trace::Tracer::start(trace)?;
            tracing::info!(endpoint = %tracer.config().endpoint, protocol = ?tracer.config().protocol, "exporting a trace per attempt over OTLP");
            Some(tracer)
        }
        None => None,
    };
    let mut actor = match &tracer {
        Some(tracer) => actor.with_traces(tracer.clone(), config.task_name.clone()),
        None => actor,
    };
    let watchers = actor.watchers();
    let poll_settings = actor.poll_settings();
    let measure_memory =
        config.capacity.min_free_memory.is_some() || config.capacity.memory_headroom.is_some();
    let actor = if measure_memory {
        actor.measuring_memory()
    } else {
        actor
    };
    let actor = tokio::spawn(actor.run(rx));
    if measure_memory {
        // Measured once before the poller asks for its first grant, so a runtime started
        // short of memory polls nothing.
        let mut failing = false;
        admission::measure(&events, &mut failing).await;
        tokio::spawn(admission::watch(events.clone(), failing));
    }
    let poller = poller::Poller {
        client: config.conductor.clone(),
        task_name: config.task_name.clone(),
        settings: poll_settings,
        broker_id: config.prefix.broker_id(),
        backoff,
        counters: Arc::clone(&counters),
        gauges: Arc::clone(&gauges),
        health: health.route("polls"),
    };
    // The results a killed runtime left in the journal are settled before the first poll.
    let replay_client = config.conductor.clone();
    let poller_events = events.clone();
    tokio::spawn(async move {
        if let Some(journal) = journal {
            journal::replay(&journal, &replay_client, &backoff, journal::REPLAY_PATIENCE).await;
        }
        poller.run(poller_events).await;
    });

    tracing::info!(
        task = %config.task_name, domain = config.domain.as_ref().map_or("", |d| d.as_str()), slots = config.capacity.max_executors, socket = %config.socket.display(),
        broker_id = %config.prefix.broker_id(), conductor = config.conductor.base_url(),
        "broker serving"
    );
    let drain_events = events.clone();
    let shutdown = async move {
        let mut drained_rx = drained_rx;
        tokio::select! {
            // A drain requested over Admin completed by itself...
            _ = &mut drained_rx => {}
            // ...or an outside stop (a signal) starts one, and we wait for it to complete.
            () = stop => {
                let (reply, _) = oneshot::channel();
                let _ = drain_events.send(actor::Event::Drain { reply }).await;
                let _ = drained_rx.await;
            }
        }
    };
    let slot = proto::slot_server::SlotServer::new(service::SlotService {
        events: events.clone(),
        conductor: config.conductor.clone(),
    })
    .max_decoding_message_size(perago_proto::MAX_SLOT_MESSAGE_BYTES)
    .max_encoding_message_size(perago_proto::MAX_SLOT_MESSAGE_BYTES);
    let control = proto::control_server::ControlServer::new(service::ControlService {
        events: events.clone(),
        token: config.control_token.clone(),
        control_pid: config.control_pid,
    });
    let admin = AdminServer::new(service::AdminService {
        events: events.clone(),
        metrics: registry,
        watchers,
    });
    drop(events);
    // Operators' tools: grpcurl needs reflection (many builds in use, the PyPI one included,
    // speak only v1alpha, so both flavours are served) and load balancers the health service.
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(perago_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .expect("the descriptor sets are valid");
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(perago_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .expect("the descriptor sets are valid");
    let health = health_service;
    health_reporter
        .set_serving::<perago_proto::admin::v1::admin_server::AdminServer<service::AdminService>>()
        .await;
    health_reporter
        .set_serving::<proto::slot_server::SlotServer<service::SlotService>>()
        .await;
    tracing::debug!(
        nofile,
        connections = limits.connections,
        waiting = limits.waiting,
        "socket bounds"
    );
    tonic::transport::Server::builder()
        // A whole slot message fits the receive windows: a completion carrying megabytes is
        // not held up waiting for window updates on the way.
        .initial_stream_window_size(SLOT_WINDOW)
        .initial_connection_window_size(SLOT_WINDOW)
        // And comes in few frames: a 1 MiB completion is one frame, not 64 of h2's default
        // 16 KiB, each framed, counted against the windows and buffered on its own.
        .max_frame_size(perago_proto::SLOT_FRAME_BYTES)
        // Called for every request: marks its connection as no longer waiting for one.
        .trace_fn(incoming::mark_request)
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(slot)
        .add_service(control)
        .add_service(admin)
        .serve_with_incoming_shutdown(
            Announced {
                incoming: incoming::incoming(listener, limits),
                ready,
            },
            shutdown,
        )
        .await?;
    actor.abort();
    if let Some(tracer) = tracer {
        // Every attempt's trace ended with the drain: what is queued goes out now.
        tracer.flush(TRACE_FLUSH_LIMIT).await;
        let stats = tracer.stats();
        tracing::info!(
            exported = stats.exported,
            dropped = stats.dropped,
            failed = stats.failed,
            "spans exported"
        );
    }
    tracing::info!("broker stopped");
    Ok(())
}

/// The result journal of the task type under the workspace root; `None` (with a warning) when
/// it cannot be used, or there is no root.
fn open_journal(config: &BrokerConfig) -> Option<Arc<journal::Journal>> {
    let Some(root) = &config.workspace_root else {
        tracing::info!("no workspace root: results are not journaled");
        return None;
    };
    match journal::Journal::open(root, &config.task_name) {
        Ok(journal) => Some(Arc::new(journal)),
        Err(e) => {
            tracing::warn!(error = %perago_core::errors::DisplayChain(&e), "results are not journaled: a runtime killed before Conductor takes an update loses it");
            None
        }
    }
}

/// The accept loop's stream, which tells the supervisor the broker serves the first time
/// the server polls it: the socket is bound, its mode set, and the accept loop runs.
struct Announced<S> {
    incoming: S,
    /// The ready pipe (`PERAGO_READY_FD`), until announced.
    ready: Option<std::fs::File>,
}

impl<S: tokio_stream::Stream + Unpin> tokio_stream::Stream for Announced<S> {
    type Item = S::Item;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<S::Item>> {
        if let Some(ready) = self.ready.take() {
            announce(ready);
        }
        std::pin::Pin::new(&mut self.incoming).poll_next(cx)
    }
}

/// Writes the ready byte and closes the pipe. One byte into an empty pipe never blocks; a
/// supervisor that is gone (`EPIPE`) is nobody to tell.
fn announce(mut ready: std::fs::File) {
    use std::io::Write as _;
    if let Err(e) = ready.write_all(b"R") {
        tracing::warn!(error = %perago_core::errors::DisplayChain(&e), "cannot tell the supervisor the broker serves");
    }
}

/// How long a stopping broker waits for its last spans to be exported.
const TRACE_FLUSH_LIMIT: Duration = Duration::from_secs(5);

/// The HTTP/2 receive windows of the slot socket: a whole slot message.
const SLOT_WINDOW: u32 = perago_proto::MAX_SLOT_MESSAGE_BYTES as u32;
const _: () = assert!(perago_proto::MAX_SLOT_MESSAGE_BYTES <= u32::MAX as usize);
