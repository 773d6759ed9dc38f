//! An OpenTelemetry collector for the end-to-end tests: an in-process OTLP trace receiver that
//! serves `opentelemetry.proto.collector.trace.v1.TraceService/Export` over gRPC (tonic, the
//! generated server of the vendored protos) and `POST /v1/traces` over HTTP (protobuf bodies),
//! and keeps every span it receives, flattened, with the request's headers.

use perago_proto::otlp::{
    collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
        trace_service_server::{TraceService, TraceServiceServer},
    },
    common::v1::{AnyValue, any_value},
};
use prost::Message as _;
use std::{
    collections::BTreeMap,
    fmt,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};
use tokio::sync::Notify;

/// One span as received, with what came with it.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    /// 32 lowercase hex digits.
    pub trace_id: String,
    /// 16 lowercase hex digits.
    pub span_id: String,
    /// `None` for a root (empty bytes on the wire).
    pub parent_span_id: Option<String>,
    /// The W3C `tracestate` carried.
    pub trace_state: String,
    /// The span's name.
    pub name: String,
    /// OTLP `SpanKind` (1 internal, 3 client, 5 consumer, …).
    pub kind: i32,
    /// Start, ns since the epoch.
    pub start_unix_nano: u64,
    /// End, ns since the epoch.
    pub end_unix_nano: u64,
    /// Attributes: strings as JSON strings, integers and doubles as numbers, booleans.
    pub attributes: BTreeMap<String, serde_json::Value>,
    /// OTLP `StatusCode` (0 unset, 1 ok, 2 error).
    pub status_code: i32,
    /// The status message.
    pub status_message: String,
    /// The resource's attributes, as text.
    pub resource: BTreeMap<String, String>,
    /// `"grpc"` or `"http"`.
    pub transport: &'static str,
    /// The export request's headers (gRPC metadata), names in lower case.
    pub headers: BTreeMap<String, String>,
}

#[derive(Default)]
struct State {
    spans: Vec<ReceivedSpan>,
    failing: bool,
    requests: usize,
}

struct Shared {
    state: Mutex<State>,
    received: Notify,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Counts the export; stores its spans unless failing. `false`: refused.
    fn take(
        &self,
        request: ExportTraceServiceRequest,
        transport: &'static str,
        headers: BTreeMap<String, String>,
    ) -> bool {
        let mut state = self.lock();
        state.requests += 1;
        if state.failing {
            drop(state);
            self.received.notify_waiters();
            return false;
        }
        state.spans.extend(flatten(request, transport, &headers));
        drop(state);
        self.received.notify_waiters();
        true
    }
}

/// The receiver; its servers stop when it is dropped.
pub struct OtlpReceiver {
    shared: Arc<Shared>,
    grpc: String,
    http: String,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl fmt::Debug for OtlpReceiver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OtlpReceiver")
            .field("grpc", &self.grpc)
            .field("http", &self.http)
            .field("spans", &self.shared.lock().spans.len())
            .finish_non_exhaustive()
    }
}

struct Grpc(Arc<Shared>);

#[tonic::async_trait]
impl TraceService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let headers = request
            .metadata()
            .clone()
            .into_headers()
            .iter()
            .filter_map(|(name, value)| {
                Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned()))
            })
            .collect();
        if self.0.take(request.into_inner(), "grpc", headers) {
            Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
        } else {
            Err(tonic::Status::unavailable("receiver set to fail"))
        }
    }
}

async fn http_export(
    axum::extract::State(shared): axum::extract::State<Arc<Shared>>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> (
    axum::http::StatusCode,
    [(&'static str, &'static str); 1],
    Vec<u8>,
) {
    use axum::http::StatusCode;
    let protobuf = [("content-type", "application/x-protobuf")];
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if content_type != "application/x-protobuf" {
        return (StatusCode::UNSUPPORTED_MEDIA_TYPE, protobuf, Vec::new());
    }
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return (StatusCode::BAD_REQUEST, protobuf, Vec::new());
    };
    let headers = headers
        .iter()
        .filter_map(|(name, value)| {
            Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned()))
        })
        .collect();
    if shared.take(request, "http", headers) {
        let answer = ExportTraceServiceResponse::default().encode_to_vec();
        (StatusCode::OK, protobuf, answer)
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, protobuf, Vec::new())
    }
}

impl OtlpReceiver {
    /// Serves both transports on loopback ports of their own.
    pub async fn start() -> Self {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            received: Notify::new(),
        });
        let grpc_listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("the receiver binds a loopback port for gRPC");
        let http_listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("the receiver binds a loopback port for HTTP");
        let grpc = format!("http://{}", grpc_listener.local_addr().expect("bound"));
        let http = format!("http://{}", http_listener.local_addr().expect("bound"));
        let service = TraceServiceServer::new(Grpc(Arc::clone(&shared)));
        let grpc_task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(
                    grpc_listener,
                ))
                .await;
        });
        let app = axum::Router::new()
            .route("/v1/traces", axum::routing::post(http_export))
            .with_state(Arc::clone(&shared));
        let http_task = tokio::spawn(async move {
            let _ = axum::serve(http_listener, app).await;
        });
        Self {
            shared,
            grpc,
            http,
            tasks: vec![grpc_task, http_task],
        }
    }

    /// The gRPC endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT` with `grpc`).
    pub fn grpc_endpoint(&self) -> String {
        self.grpc.clone()
    }

    /// The HTTP base URL (`OTEL_EXPORTER_OTLP_ENDPOINT` with `http/protobuf`: the exporter
    /// appends `/v1/traces`).
    pub fn http_endpoint(&self) -> String {
        self.http.clone()
    }

    /// Every span received so far, in arrival order.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.shared.lock().spans.clone()
    }

    /// Exports received, stored or refused.
    pub fn requests(&self) -> usize {
        self.shared.lock().requests
    }

    /// While `failing`, every export is refused (gRPC `UNAVAILABLE`, HTTP 503) and its spans
    /// are not kept.
    pub fn set_failing(&self, failing: bool) {
        self.shared.lock().failing = failing;
    }

    /// The spans once `done` holds for them; panics after `timeout` listing what arrived.
    pub async fn wait_for(
        &self,
        done: impl Fn(&[ReceivedSpan]) -> bool,
        timeout: Duration,
    ) -> Vec<ReceivedSpan> {
        let deadline = Instant::now() + timeout;
        loop {
            let received = self.shared.received.notified();
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            let now = Instant::now();
            assert!(
                now < deadline,
                "the receiver did not get the spans waited for within {timeout:?}; {} exports, spans:\n{}",
                self.requests(),
                spans
                    .iter()
                    .map(|s| format!(
                        "  {} trace {} span {} parent {:?}",
                        s.name, s.trace_id, s.span_id, s.parent_span_id
                    ))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            let wait = (deadline - now).min(Duration::from_millis(50));
            let _ = tokio::time::timeout(wait, received).await;
        }
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn json_value(value: Option<&AnyValue>) -> serde_json::Value {
    match value.and_then(|v| v.value.as_ref()) {
        None => serde_json::Value::Null,
        Some(any_value::Value::StringValue(s)) => serde_json::Value::String(s.clone()),
        Some(any_value::Value::IntValue(i)) => serde_json::Value::from(*i),
        Some(any_value::Value::BoolValue(b)) => serde_json::Value::Bool(*b),
        Some(any_value::Value::DoubleValue(d)) => serde_json::Value::from(*d),
        Some(other) => serde_json::Value::String(format!("{other:?}")),
    }
}

fn flatten(
    request: ExportTraceServiceRequest,
    transport: &'static str,
    headers: &BTreeMap<String, String>,
) -> Vec<ReceivedSpan> {
    let mut out = Vec::new();
    for resource_spans in request.resource_spans {
        let resource: BTreeMap<String, String> = resource_spans
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .map(|kv| {
                let value = match json_value(kv.value.as_ref()) {
                    serde_json::Value::String(s) => s,
                    other => other.to_string(),
                };
                (kv.key.clone(), value)
            })
            .collect();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                let status = span.status.unwrap_or_default();
                out.push(ReceivedSpan {
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: (!span.parent_span_id.is_empty())
                        .then(|| hex(&span.parent_span_id)),
                    trace_state: span.trace_state,
                    name: span.name,
                    kind: span.kind,
                    start_unix_nano: span.start_time_unix_nano,
                    end_unix_nano: span.end_time_unix_nano,
                    attributes: span
                        .attributes
                        .iter()
                        .map(|kv| (kv.key.clone(), json_value(kv.value.as_ref())))
                        .collect(),
                    status_code: status.code,
                    status_message: status.message,
                    resource: resource.clone(),
                    transport,
                    headers: headers.clone(),
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use perago_proto::otlp::{
        collector::trace::v1::trace_service_client::TraceServiceClient,
        common::v1::KeyValue,
        resource::v1::Resource,
        trace::v1::{ResourceSpans, ScopeSpans, Span, Status},
    };

    fn request(name: &str, parent: &[u8]) -> ExportTraceServiceRequest {
        let kv = |key: &str, value| KeyValue {
            key: key.to_owned(),
            value: Some(AnyValue { value: Some(value) }),
            ..Default::default()
        };
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![kv(
                        "service.name",
                        any_value::Value::StringValue("svc".to_owned()),
                    )],
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    spans: vec![Span {
                        trace_id: vec![0xab; 16],
                        span_id: vec![0x01; 8],
                        parent_span_id: parent.to_vec(),
                        name: name.to_owned(),
                        kind: 5,
                        attributes: vec![
                            kv("n", any_value::Value::IntValue(7)),
                            kv("ok", any_value::Value::BoolValue(true)),
                        ],
                        status: Some(Status {
                            message: "bad".to_owned(),
                            code: 2,
                        }),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    #[tokio::test]
    async fn both_transports_are_received_and_a_failing_receiver_keeps_nothing() {
        let receiver = OtlpReceiver::start().await;
        let mut client = TraceServiceClient::connect(receiver.grpc_endpoint())
            .await
            .unwrap();
        let mut grpc = tonic::Request::new(request("over-grpc", &[]));
        grpc.metadata_mut()
            .insert("x-api-key", "k".parse().unwrap());
        client.export(grpc).await.unwrap();

        // HTTP/1.1 by hand: the receiver must take what an exporter writes.
        let body = request("over-http", &[0x02; 8]).encode_to_vec();
        let addr = receiver
            .http_endpoint()
            .trim_start_matches("http://")
            .to_owned();
        let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let head = format!(
            "POST /v1/traces HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/x-protobuf\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(&body).await.unwrap();
        let mut answer = String::new();
        let mut bytes = Vec::new();
        stream.read_to_end(&mut bytes).await.unwrap();
        answer.push_str(&String::from_utf8_lossy(&bytes));
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

        let spans = receiver
            .wait_for(|s| s.len() == 2, Duration::from_secs(5))
            .await;
        let (g, h) = (&spans[0], &spans[1]);
        assert_eq!(g.name, "over-grpc");
        assert_eq!(g.transport, "grpc");
        assert_eq!(g.trace_id, "ab".repeat(16));
        assert_eq!(g.span_id, "01".repeat(8));
        assert_eq!(g.parent_span_id, None);
        assert_eq!(g.headers.get("x-api-key").map(String::as_str), Some("k"));
        assert_eq!(g.attributes["n"], serde_json::json!(7));
        assert_eq!(g.attributes["ok"], serde_json::json!(true));
        assert_eq!((g.status_code, g.status_message.as_str()), (2, "bad"));
        assert_eq!(g.resource["service.name"], "svc");
        assert_eq!(h.transport, "http");
        assert_eq!(h.parent_span_id.as_deref(), Some("0202020202020202"));

        receiver.set_failing(true);
        let refused = client.export(request("refused", &[])).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unavailable);
        assert_eq!(receiver.spans().len(), 2);
        assert_eq!(receiver.requests(), 3);
    }
}
