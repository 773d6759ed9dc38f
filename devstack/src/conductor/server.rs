//! Starting and stopping the Conductor dev server in-process.
//!
//! ```no_run
//! # async fn demo() -> Result<(), perago_devstack::DevstackError> {
//! use perago_devstack::conductor::ConductorServer;
//! let server = ConductorServer::builder().time_scale(0.01).bind("127.0.0.1:0").await?;
//! println!("CONDUCTOR_SERVER_URL={}", server.base_url());
//! server.shutdown().await;
//! # Ok(()) }
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, ToSocketAddrs};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::Instrument;

use super::auth::{self, AuthState, DEFAULT_TOKEN_TTL};
use super::clock::TimeScale;
use super::fill::QueueSemantics;
use super::model::WorkflowStatus;
use super::payloads::{self, PayloadStorage, PayloadThresholds, Payloads};
use super::routes;
use super::store::Conductor;
use super::sweeper;
use crate::errors::DevstackError;
use crate::faults::{self, Faults};
use crate::http;

/// Entry point of the library API; see [`ConductorServer::builder`].
#[derive(Debug)]
pub struct ConductorServer;

impl ConductorServer {
    /// A builder with real-time durations.
    pub fn builder() -> ConductorServerBuilder {
        ConductorServerBuilder {
            time_scale: 1.0,
            auth: None,
            token_ttl: DEFAULT_TOKEN_TTL,
            opaque_tokens: false,
            sweep_lag: Duration::ZERO,
            thresholds: PayloadThresholds::default(),
            payload_storage: PayloadStorage::default(),
            queue_semantics: QueueSemantics::default(),
        }
    }
}

/// Options of a Conductor dev server.
#[derive(Clone)]
pub struct ConductorServerBuilder {
    time_scale: f64,
    /// Key id and secret, when auth is required.
    auth: Option<(String, String)>,
    token_ttl: Duration,
    opaque_tokens: bool,
    sweep_lag: Duration,
    thresholds: PayloadThresholds,
    payload_storage: PayloadStorage,
    queue_semantics: QueueSemantics,
}

impl std::fmt::Debug for ConductorServerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConductorServerBuilder")
            .field("time_scale", &self.time_scale)
            .field("auth_key_id", &self.auth.as_ref().map(|(id, _)| id))
            .field("token_ttl", &self.token_ttl)
            .field("opaque_tokens", &self.opaque_tokens)
            .field("sweep_lag", &self.sweep_lag)
            .field("thresholds", &self.thresholds)
            .field("payload_storage", &self.payload_storage)
            .field("queue_semantics", &self.queue_semantics)
            .finish()
    }
}

impl ConductorServerBuilder {
    /// Real seconds per Conductor second for timeouts, retry delays, callbacks and start delays:
    /// 0.01 makes a 60 s retry delay take 0.6 s. Must be finite and greater than 0.
    pub fn time_scale(mut self, factor: f64) -> Self {
        self.time_scale = factor;
        self
    }

    /// Requires Orkes-style authentication: `POST /api/token` with this key id and secret
    /// answers `{"token": "<JWT>"}`, and every other `/api/...` route except health wants the
    /// token in `X-Authorization` (else 401 `INVALID_TOKEN`, or `EXPIRED_TOKEN` once it is past
    /// its `exp`). Without this, `/api/token` is a 404, as on Conductor OSS.
    pub fn auth(mut self, key_id: impl Into<String>, key_secret: impl Into<String>) -> Self {
        self.auth = Some((key_id.into(), key_secret.into()));
        self
    }

    /// How long tokens last (default one hour; real time, not scaled by
    /// [`time_scale`](Self::time_scale)). The `exp` claim is whole seconds, so the end is
    /// rounded up to the next second.
    pub fn token_ttl(mut self, ttl: Duration) -> Self {
        self.token_ttl = ttl;
        self
    }

    /// Issues opaque tokens (random strings, no JWT claims) instead of JWTs, so clients cannot
    /// read when they expire and must renew them when refused with `EXPIRED_TOKEN`.
    pub fn opaque_tokens(mut self, opaque: bool) -> Self {
        self.opaque_tokens = opaque;
        self
    }

    /// Fires every timeout (response, task and poll) `lag` Conductor seconds (scaled by
    /// [`time_scale`](Self::time_scale)) after its deadline, as the real server, which judges
    /// timeouts only when it next decides the workflow, does: up to about a minute late on
    /// Postgres. Default zero: within milliseconds of the deadline.
    pub fn sweep_lag(mut self, lag: Duration) -> Self {
        self.sweep_lag = lag;
        self
    }

    /// When a batch poll answers (default [`QueueSemantics::FillOrTimeout`], as Conductor's
    /// SQL queues and its default SQLite deployment do).
    pub fn queue_semantics(mut self, semantics: QueueSemantics) -> Self {
        self.queue_semantics = semantics;
        self
    }

    /// Binds `addr` (port 0 picks a free port) and starts serving and sweeping.
    /// Conductor's payload thresholds (default: the server's, 3072 KB / 10240 KB).
    pub fn payload_thresholds(mut self, thresholds: PayloadThresholds) -> Self {
        self.thresholds = thresholds;
        self
    }

    /// The external payload storage the server is configured with (default: a blob store
    /// answering pre-signed URLs; [`PayloadStorage::Dummy`]: locations without a `uri`).
    pub fn payload_storage(mut self, storage: PayloadStorage) -> Self {
        self.payload_storage = storage;
        self
    }

    /// Binds `addr` (port 0 picks a free port) and starts serving and sweeping. The blob store
    /// of external payloads listens on a port of its own on the same IP.
    pub async fn bind(self, addr: impl ToSocketAddrs) -> Result<ConductorHandle, DevstackError> {
        let scale = TimeScale::new(self.time_scale)
            .ok_or(DevstackError::InvalidTimeScale(self.time_scale))?;
        let auth = match self.auth {
            Some((id, secret)) if id.is_empty() || secret.is_empty() => {
                return Err(DevstackError::EmptyConductorCredentials);
            }
            Some((id, secret)) => Some(Arc::new(AuthState::new(
                id,
                secret,
                self.token_ttl,
                self.opaque_tokens,
            ))),
            None => None,
        };
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| DevstackError::Bind { source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| DevstackError::Bind { source })?;
        let blob_listener = TcpListener::bind((addr.ip(), 0))
            .await
            .map_err(|source| DevstackError::Bind { source })?;
        let blob_addr = blob_listener
            .local_addr()
            .map_err(|source| DevstackError::Bind { source })?;
        let payloads = Arc::new(Payloads::new(self.thresholds, self.payload_storage));
        payloads.set_origin(format!("http://{blob_addr}"));
        let mut conductor = Conductor::new(scale, Arc::clone(&payloads));
        conductor.queue_semantics = self.queue_semantics;
        let conductor = Arc::new(conductor);
        let lag_ms = i64::try_from(self.sweep_lag.as_millis()).unwrap_or(i64::MAX);
        conductor.with(|s| s.sweep_lag_ms = scale.ms(lag_ms));
        let faults = Faults::default();
        let mut api = routes::router(Arc::clone(&conductor));
        if let Some(auth) = &auth {
            api = api
                .route(
                    "/api/token",
                    axum::routing::post(auth::token).with_state(Arc::clone(auth)),
                )
                .layer(axum::middleware::from_fn_with_state(
                    Arc::clone(auth),
                    auth::require,
                ));
        }
        let router = api
            .layer(axum::middleware::from_fn_with_state(
                faults.clone(),
                faults::inject,
            ))
            .merge(faults::admin_router(faults.clone()));
        let (shutdown, shutdown_rx) = watch::channel(false);
        let sweeper = tokio::spawn(
            sweeper::run(Arc::clone(&conductor), shutdown_rx.clone())
                .instrument(tracing::info_span!("conductor-sweeper")),
        );
        // The blob store answers through the same fault rules (a path under `/payloads/`).
        let blobs = payloads::blob_router(payloads).layer(axum::middleware::from_fn_with_state(
            faults.clone(),
            faults::inject,
        ));
        let blob_server = tokio::spawn(
            http::serve("conductor-blobs", blob_listener, blobs, shutdown_rx.clone())
                .instrument(tracing::info_span!("conductor-blobs", addr = %blob_addr)),
        );
        let server = tokio::spawn(
            http::serve("conductor", listener, router, shutdown_rx)
                .instrument(tracing::info_span!("conductor-http", %addr)),
        );
        tracing::info!(
            %addr,
            time_scale = scale.factor(),
            auth = auth.is_some(),
            sweep_lag = ?self.sweep_lag,
            queue_semantics = %self.queue_semantics,
            "conductor dev server listening"
        );
        Ok(ConductorHandle {
            addr,
            conductor,
            auth,
            faults,
            shutdown,
            tasks: vec![server, sweeper, blob_server],
            blob_addr,
        })
    }
}

/// A running server. Dropping it stops the server without waiting; prefer
/// [`ConductorHandle::shutdown`], which drains in-flight requests first.
#[derive(Debug)]
pub struct ConductorHandle {
    addr: SocketAddr,
    conductor: Arc<Conductor>,
    auth: Option<Arc<AuthState>>,
    faults: Faults,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    blob_addr: SocketAddr,
}

impl ConductorHandle {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR/api`, the form the SDKs take as `CONDUCTOR_SERVER_URL`.
    pub fn base_url(&self) -> String {
        format!("http://{}/api", self.addr)
    }

    /// `http://BLOB_ADDR`: the origin of the external payload store's pre-signed URLs (its own
    /// port, not the API's).
    pub fn payload_store_url(&self) -> String {
        format!("http://{}", self.blob_addr)
    }

    /// `http://ADDR`, for the admin routes.
    pub fn root_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Whether the server requires auth ([`ConductorServerBuilder::auth`]).
    pub fn auth_required(&self) -> bool {
        self.auth.is_some()
    }

    /// Tokens issued by `POST /api/token` so far (0 without auth).
    pub fn tokens_issued(&self) -> u64 {
        self.auth.as_ref().map_or(0, |a| a.issued())
    }

    /// Requests refused with 401 for a missing, unknown or expired token so far.
    pub fn tokens_refused(&self) -> u64 {
        self.auth.as_ref().map_or(0, |a| a.refused())
    }

    /// Forgets every token issued, as a server restart or a revoked key would: requests with
    /// one get 401 `INVALID_TOKEN` until the client fetches a new one. No effect without auth.
    pub fn revoke_tokens(&self) {
        if let Some(auth) = &self.auth {
            auth.revoke_all();
        }
    }

    /// Polls (single, batch or update-v2's follow-up) that found no task and are waiting for
    /// one right now: a test can wait for a client's long poll to be in flight.
    pub fn polls_waiting(&self) -> usize {
        self.conductor.polls_waiting()
    }

    /// Messages queued for `task_type` (no domain), delayed ones included, as
    /// `GET /api/tasks/queue/size?taskType=` answers.
    pub fn queue_size(&self, task_type: &str) -> usize {
        self.conductor.with(|s| s.queues.size(task_type))
    }

    /// Whether workflow `id` is still RUNNING (not ended, nor paused); `None` when there is no
    /// such workflow. Read in this process, without serializing the workflow: a benchmark can
    /// wait for its workflows without loading the server it measures (a workflow of 1 MiB
    /// tasks is several MiB of JSON over `GET /api/workflow`).
    pub fn workflow_running(&self, id: &str) -> Option<bool> {
        self.conductor.with(|s| {
            s.workflows
                .get(id)
                .map(|w| w.status == WorkflowStatus::Running)
        })
    }

    /// The fault-injection rules, to set them without going through HTTP.
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// Stops accepting, lets in-flight requests finish (bounded), and stops the sweeper.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        for task in std::mem::take(&mut self.tasks) {
            if let Err(error) = task.await {
                tracing::warn!(error = %crate::errors::DisplayChain(&error), "conductor task ended abnormally");
            }
        }
    }
}

impl Drop for ConductorHandle {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}
