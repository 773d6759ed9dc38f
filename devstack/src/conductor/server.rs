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

use tokio::net::{TcpListener, ToSocketAddrs};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::Instrument;

use super::clock::TimeScale;
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
        ConductorServerBuilder { time_scale: 1.0 }
    }
}

/// Options of a Conductor dev server.
#[derive(Debug, Clone)]
pub struct ConductorServerBuilder {
    time_scale: f64,
}

impl ConductorServerBuilder {
    /// Real seconds per Conductor second for timeouts, retry delays, callbacks and start delays:
    /// 0.01 makes a 60 s retry delay take 0.6 s. Must be finite and greater than 0.
    pub fn time_scale(mut self, factor: f64) -> Self {
        self.time_scale = factor;
        self
    }

    /// Binds `addr` (port 0 picks a free port) and starts serving and sweeping.
    pub async fn bind(self, addr: impl ToSocketAddrs) -> Result<ConductorHandle, DevstackError> {
        let scale = TimeScale::new(self.time_scale)
            .ok_or(DevstackError::InvalidTimeScale(self.time_scale))?;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| DevstackError::Bind { source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| DevstackError::Bind { source })?;
        let conductor = Arc::new(Conductor::new(scale));
        let faults = Faults::default();
        let router = routes::router(Arc::clone(&conductor))
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
        let server = tokio::spawn(
            http::serve("conductor", listener, router, shutdown_rx)
                .instrument(tracing::info_span!("conductor-http", %addr)),
        );
        tracing::info!(%addr, time_scale = scale.factor(), "conductor dev server listening");
        Ok(ConductorHandle {
            addr,
            faults,
            shutdown,
            tasks: vec![server, sweeper],
        })
    }
}

/// A running server. Dropping it stops the server without waiting; prefer
/// [`ConductorHandle::shutdown`], which drains in-flight requests first.
#[derive(Debug)]
pub struct ConductorHandle {
    addr: SocketAddr,
    faults: Faults,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
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

    /// `http://ADDR`, for the admin routes.
    pub fn root_url(&self) -> String {
        format!("http://{}", self.addr)
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
                tracing::warn!(%error, "conductor task ended abnormally");
            }
        }
    }
}

impl Drop for ConductorHandle {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}
