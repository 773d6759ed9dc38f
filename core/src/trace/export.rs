//! The batch exporter: a bounded queue and one task that sends batches to the collector.
//!
//! [`Shared::record`] only takes a lock and pushes (or counts a drop): the broker's actor calls
//! it and must never wait on a collector. The export task wakes every `schedule_delay`, when a
//! batch's worth is queued, or when asked to flush, and sends what is queued in batches of at
//! most `max_batch`, one at a time, each bounded by the export timeout. A batch that fails is
//! counted and dropped, not retried: a collector that is down must not grow the broker's
//! memory, and a task's spans are worth less than the task.

use super::{Config, ConfigError, Kind, Protocol, SpanData, Stats, Status, Value};
use crate::errors::DisplayChain;
use perago_proto::otlp::{
    collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
        trace_service_client::TraceServiceClient,
    },
    common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value},
    resource::v1::Resource,
    trace::v1::{ResourceSpans, ScopeSpans, Span, Status as OtlpStatus, span, status},
};
use prost::Message as _;
use std::{
    collections::VecDeque,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};
use tokio::sync::{Notify, mpsc, oneshot};

/// At most one warning per this long about failed exports: a collector that is down for an
/// hour says so 60 times, not once per batch.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// The most of a collector's answer read (an `ExportTraceServiceResponse` is a few bytes; an
/// error page is not worth more).
const MAX_ANSWER: usize = 64 << 10;

/// What a [`super::Tracer`] shares with its export task.
pub(super) struct Shared {
    pub(super) config: Config,
    queue: Arc<Queue>,
    flushes: mpsc::Sender<oneshot::Sender<()>>,
    task: tokio::task::AbortHandle,
}

/// The spans waiting and the counts, shared by recorders and the export task.
struct Queue {
    spans: Mutex<VecDeque<SpanData>>,
    max: usize,
    batch: usize,
    /// Woken when a full batch is waiting.
    wake: Notify,
    exported: AtomicU64,
    dropped: AtomicU64,
    failed: AtomicU64,
}

impl Shared {
    pub(super) fn record(&self, span: SpanData) {
        let mut spans = self
            .queue
            .spans
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if spans.len() >= self.queue.max {
            drop(spans);
            self.queue.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        spans.push_back(span);
        let full = spans.len() >= self.queue.batch;
        drop(spans);
        if full {
            self.queue.wake.notify_one();
        }
    }

    pub(super) async fn flush(&self, deadline: Duration) {
        let (done, flushed) = oneshot::channel();
        let asked = async {
            if self.flushes.send(done).await.is_ok() {
                let _ = flushed.await;
            }
        };
        if tokio::time::timeout(deadline, asked).await.is_err() {
            let waiting = self.queue.len();
            tracing::warn!(
                endpoint = %self.config.endpoint,
                waiting,
                "OTLP: spans not exported within {deadline:?} of the drain's end; they are lost",
            );
        }
    }

    pub(super) fn stats(&self) -> Stats {
        Stats {
            exported: self.queue.exported.load(Ordering::Relaxed),
            dropped: self.queue.dropped.load(Ordering::Relaxed),
            failed: self.queue.failed.load(Ordering::Relaxed),
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Queue {
    fn take(&self) -> Vec<SpanData> {
        let mut spans = self
            .spans
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = spans.len().min(self.batch);
        spans.drain(..n).collect()
    }

    fn len(&self) -> usize {
        self.spans
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }
}

pub(super) fn start(config: Config) -> Result<Arc<Shared>, ConfigError> {
    let client = Client::new(&config)?;
    let queue = Arc::new(Queue {
        spans: Mutex::new(VecDeque::new()),
        max: config.max_queue,
        batch: config.max_batch.clamp(1, config.max_queue.max(1)),
        wake: Notify::new(),
        exported: AtomicU64::new(0),
        dropped: AtomicU64::new(0),
        failed: AtomicU64::new(0),
    });
    let (flushes, asked) = mpsc::channel(4);
    let exporter = Exporter {
        queue: Arc::clone(&queue),
        client,
        resource: resource(&config),
        endpoint: config.endpoint.clone(),
        timeout: config.timeout.min(config.export_timeout),
        schedule_delay: config.schedule_delay,
        warned: None,
        lost_since_warning: 0,
    };
    let task = tokio::spawn(exporter.run(asked)).abort_handle();
    Ok(Arc::new(Shared {
        config,
        queue,
        flushes,
        task,
    }))
}

/// The export task's state.
struct Exporter {
    queue: Arc<Queue>,
    client: Client,
    resource: Resource,
    endpoint: String,
    timeout: Duration,
    schedule_delay: Duration,
    warned: Option<Instant>,
    /// Spans lost since the last warning, said in the next one.
    lost_since_warning: u64,
}

impl Exporter {
    async fn run(mut self, mut asked: mpsc::Receiver<oneshot::Sender<()>>) {
        loop {
            let flushed = tokio::select! {
                () = tokio::time::sleep(self.schedule_delay) => None,
                () = self.queue.wake.notified() => None,
                flush = asked.recv() => match flush {
                    Some(flushed) => Some(flushed),
                    // The tracer is gone.
                    None => return,
                },
            };
            loop {
                let batch = self.queue.take();
                if batch.is_empty() {
                    break;
                }
                self.export(batch).await;
            }
            if let Some(flushed) = flushed {
                let _ = flushed.send(());
            }
        }
    }

    async fn export(&mut self, batch: Vec<SpanData>) {
        let count = batch.len() as u64;
        let request = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(self.resource.clone()),
                scope_spans: vec![ScopeSpans {
                    scope: Some(InstrumentationScope {
                        name: "perago".to_owned(),
                        version: env!("CARGO_PKG_VERSION").to_owned(),
                        ..Default::default()
                    }),
                    spans: batch.into_iter().map(span).collect(),
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }],
        };
        let sent = tokio::time::timeout(self.timeout, self.client.export(request)).await;
        let outcome = match sent {
            Err(_) => Err(format!("no answer within {:?}", self.timeout)),
            Ok(outcome) => outcome,
        };
        match outcome {
            Ok(answer) => {
                let rejected = answer
                    .partial_success
                    .map_or(0, |partial| {
                        u64::try_from(partial.rejected_spans).unwrap_or(0)
                    })
                    .min(count);
                self.queue
                    .exported
                    .fetch_add(count - rejected, Ordering::Relaxed);
                if rejected > 0 {
                    self.queue.failed.fetch_add(rejected, Ordering::Relaxed);
                    self.warn(rejected, "the collector rejected some spans".to_owned());
                }
            }
            Err(why) => {
                self.queue.failed.fetch_add(count, Ordering::Relaxed);
                self.warn(count, why);
            }
        }
    }

    fn warn(&mut self, lost: u64, why: String) {
        self.lost_since_warning += lost;
        if self.warned.is_some_and(|at| at.elapsed() < WARN_EVERY) {
            return;
        }
        self.warned = Some(Instant::now());
        tracing::warn!(
            endpoint = %self.endpoint,
            lost = self.lost_since_warning,
            error = %why,
            "OTLP export failed; those spans are lost (said at most once a minute)",
        );
        self.lost_since_warning = 0;
    }
}

/// How batches reach the collector.
enum Client {
    Grpc {
        client: TraceServiceClient<tonic::transport::Channel>,
        metadata: tonic::metadata::MetadataMap,
    },
    Http {
        client: reqwest::Client,
        url: String,
        headers: reqwest::header::HeaderMap,
    },
}

impl Client {
    fn new(config: &Config) -> Result<Self, ConfigError> {
        let refused = |why: String| ConfigError::Invalid {
            name: "OTEL_EXPORTER_OTLP_ENDPOINT",
            value: config.endpoint.clone(),
            why,
        };
        // The header values are credentials: an error says which header, never its value.
        let bad_header = |name: &str| ConfigError::Invalid {
            name: "OTEL_EXPORTER_OTLP_HEADERS",
            value: "(not shown)".to_owned(),
            why: format!("header {name:?} cannot be sent"),
        };
        match config.protocol {
            Protocol::Grpc => {
                let endpoint = tonic::transport::Endpoint::from_shared(config.endpoint.clone())
                    .map_err(|e| refused(format!("{}", DisplayChain(&e))))?
                    .connect_timeout(config.timeout)
                    .timeout(config.timeout);
                let mut metadata = tonic::metadata::MetadataMap::new();
                for (name, value) in &config.headers {
                    let key = tonic::metadata::AsciiMetadataKey::from_bytes(
                        name.to_ascii_lowercase().as_bytes(),
                    )
                    .map_err(|_| bad_header(name))?;
                    let value = tonic::metadata::AsciiMetadataValue::try_from(value.as_str())
                        .map_err(|_| bad_header(name))?;
                    metadata.insert(key, value);
                }
                Ok(Self::Grpc {
                    client: TraceServiceClient::new(endpoint.connect_lazy()),
                    metadata,
                })
            }
            Protocol::HttpProtobuf => {
                let mut headers = reqwest::header::HeaderMap::new();
                for (name, value) in &config.headers {
                    let key = reqwest::header::HeaderName::from_bytes(name.as_bytes())
                        .map_err(|_| bad_header(name))?;
                    let mut value = reqwest::header::HeaderValue::from_str(value)
                        .map_err(|_| bad_header(name))?;
                    value.set_sensitive(true);
                    headers.insert(key, value);
                }
                headers.insert(
                    reqwest::header::CONTENT_TYPE,
                    reqwest::header::HeaderValue::from_static("application/x-protobuf"),
                );
                let client = crate::http::client_builder(&config.endpoint)
                    .connect_timeout(config.timeout)
                    .build()
                    .map_err(|e| refused(format!("{}", DisplayChain(&e))))?;
                Ok(Self::Http {
                    client,
                    url: config.endpoint.clone(),
                    headers,
                })
            }
        }
    }

    async fn export(
        &mut self,
        request: ExportTraceServiceRequest,
    ) -> Result<ExportTraceServiceResponse, String> {
        match self {
            Self::Grpc { client, metadata } => {
                let mut request = tonic::Request::new(request);
                *request.metadata_mut() = metadata.clone();
                client
                    .export(request)
                    .await
                    .map(tonic::Response::into_inner)
                    .map_err(|status| format!("{}", DisplayChain(&status)))
            }
            Self::Http {
                client,
                url,
                headers,
            } => {
                let mut answer = client
                    .post(url.as_str())
                    .headers(headers.clone())
                    .body(request.encode_to_vec())
                    .send()
                    .await
                    .map_err(|e| format!("{}", DisplayChain(&e)))?;
                let code = answer.status();
                let mut body = Vec::new();
                while let Some(chunk) = answer
                    .chunk()
                    .await
                    .map_err(|e| format!("{}", DisplayChain(&e)))?
                {
                    let room = MAX_ANSWER.saturating_sub(body.len());
                    body.extend_from_slice(&chunk[..chunk.len().min(room)]);
                    if body.len() >= MAX_ANSWER {
                        break;
                    }
                }
                if !code.is_success() {
                    let text = String::from_utf8_lossy(&body);
                    let text: String = text.chars().take(200).collect();
                    return Err(format!("the collector answered HTTP {code}: {text}"));
                }
                // An answer that is not the protobuf one (an empty 200, JSON) still took the
                // spans: only a readable partial success says otherwise.
                Ok(ExportTraceServiceResponse::decode(body.as_slice()).unwrap_or_default())
            }
        }
    }
}

fn resource(config: &Config) -> Resource {
    Resource {
        attributes: config
            .resource
            .iter()
            .map(|(key, value)| {
                key_value(key.clone(), any_value::Value::StringValue(value.clone()))
            })
            .collect(),
        ..Default::default()
    }
}

fn key_value(key: String, value: any_value::Value) -> KeyValue {
    KeyValue {
        key,
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

fn unix_nanos(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
        })
}

/// A recorded span as OTLP carries it.
fn span(data: SpanData) -> Span {
    let kind = match data.kind {
        Kind::Internal => span::SpanKind::Internal,
        Kind::Client => span::SpanKind::Client,
        Kind::Consumer => span::SpanKind::Consumer,
    };
    let status = match data.status {
        Status::Unset => None,
        Status::Error(message) => Some(OtlpStatus {
            message,
            code: status::StatusCode::Error.into(),
        }),
    };
    Span {
        trace_id: data.trace_id.0.to_vec(),
        span_id: data.span_id.0.to_vec(),
        trace_state: data.trace_state.unwrap_or_default(),
        parent_span_id: data
            .parent_span_id
            .map(|p| p.0.to_vec())
            .unwrap_or_default(),
        // Recorded spans are sampled ones (trace flags bit 0).
        flags: 1,
        name: data.name.into_owned(),
        kind: kind.into(),
        start_time_unix_nano: unix_nanos(data.start),
        end_time_unix_nano: unix_nanos(data.end),
        attributes: data
            .attributes
            .into_iter()
            .map(|(key, value)| {
                let value = match value {
                    Value::Str(s) => any_value::Value::StringValue(s),
                    Value::Int(i) => any_value::Value::IntValue(i),
                    Value::Bool(b) => any_value::Value::BoolValue(b),
                };
                key_value(key.into_owned(), value)
            })
            .collect(),
        status,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{SpanId, TraceId, Tracer};
    use std::borrow::Cow;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    fn recorded(name: &'static str) -> SpanData {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        SpanData {
            trace_id: TraceId([0x11; 16]),
            span_id: SpanId::random(),
            parent_span_id: Some(SpanId([0x22; 8])),
            trace_state: Some("k=v".to_owned()),
            name: Cow::Borrowed(name),
            kind: Kind::Consumer,
            start,
            end: start + Duration::from_millis(1500),
            attributes: vec![
                (Cow::Borrowed("s"), Value::Str("text".to_owned())),
                (Cow::Borrowed("i"), Value::Int(-3)),
                (Cow::Borrowed("b"), Value::Bool(true)),
            ],
            status: Status::Error("it broke".to_owned()),
        }
    }

    /// One HTTP/1.1 request read off `listener` (head, body) and answered `answer`.
    async fn serve_one(listener: &tokio::net::TcpListener, answer: &str) -> (String, Vec<u8>) {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut read = Vec::new();
        let head_end = loop {
            let mut buf = [0; 4096];
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "the exporter hung up mid-request");
            read.extend_from_slice(&buf[..n]);
            if let Some(at) = read.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
        };
        let head = String::from_utf8(read[..head_end].to_vec()).unwrap();
        let length: usize = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse().unwrap())
            })
            .expect("a content-length");
        while read.len() < head_end + length {
            let mut buf = [0; 4096];
            let n = stream.read(&mut buf).await.unwrap();
            read.extend_from_slice(&buf[..n]);
        }
        stream.write_all(answer.as_bytes()).await.unwrap();
        (head, read[head_end..].to_vec())
    }

    #[tokio::test]
    async fn spans_go_over_http_as_otlp_protobuf_with_the_headers() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/v1/traces", listener.local_addr().unwrap());
        let mut config = Config::for_endpoint(url, Protocol::HttpProtobuf);
        config.headers = vec![("x-api-key".to_owned(), "k3y".to_owned())];
        let tracer = Tracer::start(config).unwrap();
        tracer.record(recorded("task"));
        let flush = tracer.flush(Duration::from_secs(10));
        let served = serve_one(
            &listener,
            "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n",
        );
        let ((head, body), ()) = tokio::join!(served, flush);
        assert!(head.starts_with("POST /v1/traces HTTP/1.1"), "{head}");
        let lower = head.to_ascii_lowercase();
        assert!(
            lower.contains("content-type: application/x-protobuf"),
            "{head}"
        );
        assert!(lower.contains("x-api-key: k3y"), "{head}");
        let request = ExportTraceServiceRequest::decode(body.as_slice()).unwrap();
        let resource = &request.resource_spans[0];
        let keys: Vec<_> = resource
            .resource
            .as_ref()
            .unwrap()
            .attributes
            .iter()
            .map(|kv| kv.key.as_str())
            .collect();
        assert_eq!(keys[0], "service.name");
        assert!(keys.contains(&"telemetry.sdk.name"));
        let sent = &resource.scope_spans[0].spans[0];
        assert_eq!(sent.name, "task");
        assert_eq!(sent.trace_id, [0x11; 16]);
        assert_eq!(sent.parent_span_id, [0x22; 8]);
        assert_eq!(sent.trace_state, "k=v");
        assert_eq!(sent.kind, i32::from(span::SpanKind::Consumer));
        assert_eq!(sent.start_time_unix_nano, 1_700_000_000_000_000_000);
        assert_eq!(
            sent.end_time_unix_nano - sent.start_time_unix_nano,
            1_500_000_000
        );
        let status = sent.status.as_ref().unwrap();
        assert_eq!((status.code, status.message.as_str()), (2, "it broke"));
        let values: Vec<_> = sent
            .attributes
            .iter()
            .map(|kv| kv.value.clone().unwrap().value.unwrap())
            .collect();
        assert_eq!(
            values,
            [
                any_value::Value::StringValue("text".to_owned()),
                any_value::Value::IntValue(-3),
                any_value::Value::BoolValue(true)
            ]
        );
        assert_eq!(
            tracer.stats(),
            Stats {
                exported: 1,
                dropped: 0,
                failed: 0
            }
        );
    }

    #[tokio::test]
    async fn a_refusing_collector_costs_the_spans_only_and_a_redirect_is_not_followed() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/v1/traces", listener.local_addr().unwrap());
        let tracer = Tracer::start(Config::for_endpoint(url, Protocol::HttpProtobuf)).unwrap();
        tracer.record(recorded("a"));
        tracer.record(recorded("b"));
        let flush = tracer.flush(Duration::from_secs(10));
        let served = serve_one(
            &listener,
            "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\n\r\nbusy",
        );
        tokio::join!(served, flush);
        assert_eq!(
            tracer.stats(),
            Stats {
                exported: 0,
                dropped: 0,
                failed: 2
            }
        );
        tracer.record(recorded("c"));
        let flush = tracer.flush(Duration::from_secs(10));
        let served = serve_one(
            &listener,
            "HTTP/1.1 307 Temporary Redirect\r\nlocation: http://elsewhere.invalid/v1/traces\r\ncontent-length: 0\r\n\r\n",
        );
        tokio::join!(served, flush);
        assert_eq!(
            tracer.stats(),
            Stats {
                exported: 0,
                dropped: 0,
                failed: 3
            }
        );
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_and_a_silent_collector_bounds_the_flush() {
        // Accepts and never answers.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/v1/traces", listener.local_addr().unwrap());
        let mut config = Config::for_endpoint(url, Protocol::HttpProtobuf);
        config.max_queue = 3;
        config.max_batch = 3;
        config.schedule_delay = Duration::from_secs(3600);
        config.timeout = Duration::from_millis(300);
        let tracer = Tracer::start(config).unwrap();
        // The exporter is woken by a full batch; what comes while it is sending queues up to 3.
        for name in ["1", "2", "3", "4", "5", "6", "7", "8"] {
            tracer.record(recorded(name));
        }
        assert!(tracer.stats().dropped >= 2, "{:?}", tracer.stats());
        let started = Instant::now();
        tracer.flush(Duration::from_secs(10)).await;
        assert!(started.elapsed() < Duration::from_secs(5));
        let stats = tracer.stats();
        assert_eq!(stats.exported, 0);
        assert_eq!(stats.dropped + stats.failed, 8, "{stats:?}");
        drop(listener);
    }

    #[tokio::test]
    async fn a_partial_success_counts_the_rejected_spans_as_failed() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/v1/traces", listener.local_addr().unwrap());
        let tracer = Tracer::start(Config::for_endpoint(url, Protocol::HttpProtobuf)).unwrap();
        for name in ["a", "b", "c"] {
            tracer.record(recorded(name));
        }
        let answer = ExportTraceServiceResponse {
            partial_success: Some(
                perago_proto::otlp::collector::trace::v1::ExportTracePartialSuccess {
                    rejected_spans: 2,
                    error_message: "too old".to_owned(),
                },
            ),
        }
        .encode_to_vec();
        let mut reply = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: {}\r\n\r\n",
            answer.len()
        );
        reply.push_str(std::str::from_utf8(&answer).unwrap());
        let flush = tracer.flush(Duration::from_secs(10));
        tokio::join!(serve_one(&listener, &reply), flush);
        assert_eq!(
            tracer.stats(),
            Stats {
                exported: 1,
                dropped: 0,
                failed: 2
            }
        );
    }

    #[tokio::test]
    async fn a_grpc_endpoint_tonic_cannot_use_is_refused_at_start() {
        let refused = Tracer::start(Config::for_endpoint("http://bad host:4317", Protocol::Grpc))
            .unwrap_err();
        let said = format!("{}", DisplayChain(&refused));
        assert!(said.contains("OTEL_EXPORTER_OTLP_ENDPOINT"), "{said}");
        let mut config = Config::for_endpoint("http://127.0.0.1:4317", Protocol::Grpc);
        config.headers = vec![("bad header".to_owned(), "s3cret".to_owned())];
        let said = format!("{}", DisplayChain(&Tracer::start(config).unwrap_err()));
        assert!(
            said.contains("bad header") && !said.contains("s3cret"),
            "{said}"
        );
    }
}
