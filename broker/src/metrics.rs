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

fn answer(request: &Request<Incoming>, registry: &Registry) -> Response<Full<Bytes>> {
    let (status, kind, body) = match (request.method(), request.uri().path()) {
        (&Method::GET | &Method::HEAD, "/metrics") => {
            (StatusCode::OK, CONTENT_TYPE, exposition(registry))
        }
        (_, "/metrics") => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "use GET\n".to_owned(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found; try /metrics\n".to_owned(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(kind),
    );
    response
}

/// Serves `registry` on `listener` until the broker exits.
pub(crate) async fn serve(listener: TcpListener, registry: Arc<Registry>) {
    let mut failing = false;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => {
                failing = false;
                stream
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "the metrics listener cannot accept connections; retrying");
                    failing = true;
                }
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let registry = Arc::clone(&registry);
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let response = answer(&request, &registry);
                async move { Ok::<_, std::convert::Infallible>(response) }
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT);
            if let Err(e) = builder
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(error = %e, "a metrics connection ended with an error");
            }
        });
    }
}
