//! The HTTP accept loop shared by devstack's servers.
//!
//! `axum::serve` would do, except that fault injection must be able to drop one connection in the
//! middle of a request. Each connection is therefore served here with hyper directly, and gets a
//! [`ConnectionControl`] in its requests' extensions: killing it makes this loop drop the
//! connection future, which closes the socket without an answer, as a crashed or partitioned
//! server would.
//!
//! Shutdown: stop accepting, ask every connection to finish its in-flight request and close,
//! then wait for them for at most [`DRAIN_GRACE`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use tower_service::Service;
use tracing::Instrument;

/// How long shutdown waits for in-flight requests (long polls last at most 5 s).
pub(crate) const DRAIN_GRACE: Duration = Duration::from_secs(6);

/// Pause after a failed accept.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Lets a handler drop the connection its request arrived on.
#[derive(Debug, Clone, Default)]
pub(crate) struct ConnectionControl {
    kill: Arc<Notify>,
}

impl ConnectionControl {
    /// Closes the connection without answering; the request's handler is dropped with it.
    pub(crate) fn kill(&self) {
        self.kill.notify_one();
    }
}

/// Serves `router` on `listener` until `shutdown` changes, then drains.
pub(crate) async fn serve(
    name: &'static str,
    listener: TcpListener,
    router: Router,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let span = tracing::debug_span!("connection", server = name, %peer);
                    let task = serve_connection(stream, peer, router.clone(), shutdown.clone());
                    connections.spawn(task.instrument(span));
                }
                // Accept errors (e.g. too many open files) concern one connection; keep serving,
                // after a pause so a persistent error does not spin the loop (as axum::serve).
                Err(error) => {
                    tracing::warn!(server = name, error = %crate::errors::DisplayChain(&error), "accept failed");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                }
            },
            // Reap finished connections so the set does not grow with every client.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            _ = shutdown.changed() => break,
        }
    }
    let open = connections.len();
    let drained = tokio::time::timeout(DRAIN_GRACE, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    match drained {
        Ok(()) => tracing::info!(server = name, open, "server stopped after draining"),
        Err(_) => {
            tracing::warn!(
                server = name,
                left = connections.len(),
                "drain timed out; aborting connections"
            );
            connections.abort_all();
        }
    }
}

async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    router: Router,
    mut shutdown: watch::Receiver<bool>,
) {
    // Small request/response pairs on loopback: Nagle would add delays to every round trip.
    let _ = stream.set_nodelay(true);
    let control = ConnectionControl::default();
    let kill = Arc::clone(&control.kill);
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        request.extensions_mut().insert(control.clone());
        request
            .extensions_mut()
            .insert(axum::extract::ConnectInfo(peer));
        router.clone().call(request)
    });
    let connection =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    let mut draining = false;
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(error = %crate::errors::DisplayChain(&error), "connection ended with an error");
                }
                return;
            }
            () = kill.notified() => {
                tracing::info!("connection dropped by fault injection");
                return;
            }
            _ = shutdown.changed(), if !draining => {
                draining = true;
                connection.as_mut().graceful_shutdown();
            }
        }
    }
}
