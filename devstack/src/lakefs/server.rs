//! Starting and stopping the lakeFS dev server in-process.
//!
//! ```no_run
//! # async fn demo() -> Result<(), perago_devstack::DevstackError> {
//! use perago_devstack::lakefs::LakefsServer;
//! let server = LakefsServer::builder().bind("127.0.0.1:0").await?;
//! println!("LAKEFS_ENDPOINT={}", server.endpoint());
//! server.shutdown().await;
//! # Ok(()) }
//! ```

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, ToSocketAddrs};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::Instrument;

use super::routes;
use super::store::Lakefs;
use crate::errors::DevstackError;
use crate::faults::{self, Faults};
use crate::http;

/// The access key id of lakeFS's quickstart user, the default credentials.
pub const DEFAULT_ACCESS_KEY_ID: &str = "AKIAIOSFOLQUICKSTART";
/// The secret access key of lakeFS's quickstart user.
pub const DEFAULT_SECRET_ACCESS_KEY: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";

/// The one key pair the server accepts (HTTP basic auth: user = key id, password = secret).
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The access key id (basic-auth user name).
    pub access_key_id: String,
    /// The secret access key (basic-auth password).
    pub secret_access_key: String,
}

impl std::fmt::Debug for Credentials {
    // Keeps the secret out of logs and panic messages.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

impl Default for Credentials {
    fn default() -> Self {
        Self {
            access_key_id: DEFAULT_ACCESS_KEY_ID.to_owned(),
            secret_access_key: DEFAULT_SECRET_ACCESS_KEY.to_owned(),
        }
    }
}

/// Entry point of the library API; see [`LakefsServer::builder`].
#[derive(Debug)]
pub struct LakefsServer;

impl LakefsServer {
    /// A builder with the quickstart credentials.
    pub fn builder() -> LakefsServerBuilder {
        LakefsServerBuilder {
            credentials: Credentials::default(),
        }
    }
}

/// Options of a lakeFS dev server.
#[derive(Debug, Clone)]
pub struct LakefsServerBuilder {
    credentials: Credentials,
}

impl LakefsServerBuilder {
    /// The key pair clients must present.
    pub fn credentials(
        mut self,
        access_key_id: impl Into<String>,
        secret_access_key: impl Into<String>,
    ) -> Self {
        self.credentials = Credentials {
            access_key_id: access_key_id.into(),
            secret_access_key: secret_access_key.into(),
        };
        self
    }

    /// Binds `addr` (port 0 picks a free port) and starts serving.
    pub async fn bind(self, addr: impl ToSocketAddrs) -> Result<LakefsHandle, DevstackError> {
        if self.credentials.access_key_id.is_empty()
            || self.credentials.secret_access_key.is_empty()
        {
            return Err(DevstackError::EmptyCredentials);
        }
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| DevstackError::Bind { source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| DevstackError::Bind { source })?;
        let lakefs = Arc::new(Lakefs::new(self.credentials.clone()));
        let faults = Faults::default();
        let router = routes::router(lakefs)
            .layer(axum::middleware::from_fn_with_state(
                faults.clone(),
                faults::inject,
            ))
            .merge(faults::admin_router(faults.clone()));
        let (shutdown, shutdown_rx) = watch::channel(false);
        let server = tokio::spawn(
            http::serve("lakefs", listener, router, shutdown_rx)
                .instrument(tracing::info_span!("lakefs-http", %addr)),
        );
        tracing::info!(%addr, access_key_id = %self.credentials.access_key_id, "lakefs dev server listening");
        Ok(LakefsHandle {
            addr,
            credentials: self.credentials,
            faults,
            shutdown,
            server: Some(server),
        })
    }
}

/// A running server. Dropping it stops the server without waiting; prefer
/// [`LakefsHandle::shutdown`], which drains in-flight requests first.
#[derive(Debug)]
pub struct LakefsHandle {
    addr: SocketAddr,
    credentials: Credentials,
    faults: Faults,
    shutdown: watch::Sender<bool>,
    server: Option<JoinHandle<()>>,
}

impl LakefsHandle {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`, the form `LAKEFS_ENDPOINT` usually takes (clients append `/api/v1`).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `http://ADDR/api/v1`, the base of every API path (the SDK's `host`).
    pub fn api_url(&self) -> String {
        format!("http://{}/api/v1", self.addr)
    }

    /// The key pair the server accepts.
    pub fn credentials(&self) -> &Credentials {
        &self.credentials
    }

    /// The fault-injection rules, to set them without going through HTTP.
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// Stops accepting and lets in-flight requests finish (bounded).
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        if let Some(server) = self.server.take()
            && let Err(error) = server.await
        {
            tracing::warn!(error = %crate::errors::DisplayChain(&error), "lakefs server task ended abnormally");
        }
    }
}

impl Drop for LakefsHandle {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}
