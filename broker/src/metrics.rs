//! Prometheus metrics over HTTP (`GET /metrics`, hyper's HTTP/1.1 server), opt-in with
//! `PERAGO_METRICS_ADDR`. The exposition is `prometheus-client`'s, built from the registry of
//! `counters.rs` at each scrape; `Admin.Metrics` answers with the same text from the same
//! registry ([`exposition`]).

use http_body_util::Full;
use hyper::{
    Method, Request, Response, StatusCode,
    body::{Bytes, Incoming},
    service::service_fn,
};
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use std::{sync::Arc, time::Duration};
use tokio::net::TcpListener;

/// How long a connection may take to send its request head.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// The pause after a failed `accept` (out of descriptors, say) before the next one: a failing
/// listener must not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(200);

/// The content type of [`exposition`]'s text.
pub(crate) const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// The body of `GET /metrics` (and of `Admin.Metrics`): `registry` encoded now.
pub(crate) fn exposition(registry: &Registry) -> String {
    crate::counters::prometheus(registry)
}

/// What one scrape answers: the exposition and its content type, or `None` when there is
/// none to give (503).
pub type Scraped = Option<(String, String)>;

async fn answer<F, Fut>(request: &Request<Incoming>, scrape: &F) -> Response<Full<Bytes>>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Scraped>,
{
    let (status, kind, body) = match (request.method(), request.uri().path()) {
        (&Method::GET | &Method::HEAD, "/metrics") => match scrape().await {
            Some((text, kind)) => (StatusCode::OK, kind, text),
            None => (
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain".to_owned(),
                "no broker answers\n".to_owned(),
            ),
        },
        (_, "/metrics") => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain".to_owned(),
            "use GET\n".to_owned(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain".to_owned(),
            "not found; try /metrics\n".to_owned(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(kind) = hyper::header::HeaderValue::from_str(&kind) {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, kind);
    }
    response
}

/// Serves `registry` on `listener` until the broker exits.
pub(crate) async fn serve(listener: TcpListener, registry: Arc<Registry>) {
    serve_with(listener, move || {
        let text = exposition(&registry);
        async move { Some((text, CONTENT_TYPE.to_owned())) }
    })
    .await;
}

/// Serves `GET /metrics` on `listener` (405 for another method, 404 for another path) with
/// what `scrape` gives at each request, until the task is dropped: hyper's HTTP/1.1 server, a
/// header read timeout, and a pause after a failing `accept` so that the listener never
/// spins. The broker serves its registry with it; a supervisor of several task types, the
/// merge of its brokers' expositions.
pub async fn serve_with<F, Fut>(listener: TcpListener, scrape: F)
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Scraped> + Send,
{
    let scrape = Arc::new(scrape);
    let mut failing = false;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => {
                failing = false;
                stream
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %perago_core::errors::DisplayChain(&e), "the metrics listener cannot accept connections; retrying");
                    failing = true;
                }
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let scrape = Arc::clone(&scrape);
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let scrape = Arc::clone(&scrape);
                async move { Ok::<_, std::convert::Infallible>(answer(&request, &*scrape).await) }
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT);
            if let Err(e) = builder
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(error = %perago_core::errors::DisplayChain(&e), "a metrics connection ended with an error");
            }
        });
    }
}
