//! OpenTelemetry traces, exported over OTLP by hand (no OpenTelemetry crates): the W3C trace
//! context ([`context`]), the standard `OTEL_*` environment ([`config`]), the sampler, and a
//! [`Tracer`] that batches finished spans into a bounded queue and exports them in a task of
//! its own, over gRPC (`TraceService/Export`, tonic) or HTTP (`POST /v1/traces`,
//! `application/x-protobuf`).
//!
//! The broker records every span of an attempt (the executor's come to it in its
//! `Completion`): recording never blocks and never fails; a full queue drops the span and
//! counts it; an export that fails is logged at most once a minute and counted.

pub mod config;
pub mod context;
mod export;

pub use config::{Config, ConfigError, Protocol, Sampler};
pub use context::{SpanId, TraceContext, TraceId, TraceparentError};

use std::{borrow::Cow, time::SystemTime};

/// An attribute's value: what perago's spans carry.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Str(String),
    Int(i64),
    Bool(bool),
}

/// How a span ended.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Status {
    /// Nothing said (OTLP `STATUS_CODE_UNSET`): the span's work did what it does.
    #[default]
    Unset,
    /// Failed, with why (`STATUS_CODE_ERROR`, the message).
    Error(String),
}

/// The kind of a span (OTLP `SpanKind`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Kind {
    #[default]
    Internal,
    /// A call to a server (Conductor, lakeFS).
    Client,
    /// Work taken from a queue (the attempt's root span).
    Consumer,
}

/// A finished span, as recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct SpanData {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    /// `None`: the trace's root.
    pub parent_span_id: Option<SpanId>,
    /// The parent's `tracestate`, carried on (W3C: a span keeps its trace's state).
    pub trace_state: Option<String>,
    pub name: Cow<'static, str>,
    pub kind: Kind,
    pub start: SystemTime,
    pub end: SystemTime,
    pub attributes: Vec<(Cow<'static, str>, Value)>,
    pub status: Status,
}

/// What a tracer did so far, for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Spans a collector accepted.
    pub exported: u64,
    /// Spans dropped before export: the queue was full.
    pub dropped: u64,
    /// Spans whose export failed (collector down, refused, timed out).
    pub failed: u64,
}

/// The handle spans are recorded through; cheap to clone. Built by [`Tracer::start`] from a
/// [`Config`]: without one (tracing off) nothing is built, and callers hold an
/// `Option<Tracer>`.
#[derive(Clone)]
pub struct Tracer {
    inner: std::sync::Arc<export::Shared>,
}

impl Tracer {
    /// Starts the export task on the current tokio runtime. Fails when the endpoint cannot be
    /// used at all (a gRPC endpoint tonic refuses): a clear error at start-up, not a silent
    /// loss later.
    pub fn start(config: Config) -> Result<Self, ConfigError> {
        export::start(config).map(|inner| Self { inner })
    }

    /// Whether a new span tree under `parent` (the task input's `traceparent`, if any) is
    /// sampled, by the configured sampler (`OTEL_TRACES_SAMPLER`).
    pub fn sampled(&self, parent: Option<&TraceContext>, trace_id: TraceId) -> bool {
        self.inner.config.sampler.sampled(parent, trace_id)
    }

    /// Queues `span` for export. Never blocks: when the queue is full the span is dropped and
    /// counted.
    pub fn record(&self, span: SpanData) {
        self.inner.record(span);
    }

    /// Exports what is queued, waiting at most `deadline`; later records are still taken but
    /// may not be exported. Called once a drain completes.
    pub async fn flush(&self, deadline: std::time::Duration) {
        self.inner.flush(deadline).await;
    }

    pub fn stats(&self) -> Stats {
        self.inner.stats()
    }

    /// The configured settings.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the headers: they hold credentials.
        f.debug_struct("Tracer")
            .field("endpoint", &self.inner.config.endpoint)
            .field("protocol", &self.inner.config.protocol)
            .finish_non_exhaustive()
    }
}
