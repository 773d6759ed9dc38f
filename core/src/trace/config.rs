//! The standard OpenTelemetry environment, as the SDKs read it
//! (<https://opentelemetry.io/docs/specs/otel/configuration/sdk-environment-variables/> and
//! the OTLP exporter's page).

use super::{context::TraceContext, context::TraceId};
use std::time::Duration;

/// How spans go to the collector (`OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// `grpc`: `opentelemetry.proto.collector.trace.v1.TraceService/Export`.
    Grpc,
    /// `http/protobuf` (the spec's default): `POST <endpoint>` with an
    /// `ExportTraceServiceRequest` body.
    HttpProtobuf,
}

/// `OTEL_TRACES_SAMPLER` (+ `OTEL_TRACES_SAMPLER_ARG`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sampler {
    AlwaysOn,
    AlwaysOff,
    /// Sampled when the trace id's low 8 bytes, as a big-endian u64, fall below ratio × 2^64
    /// (as the SDKs' TraceIdRatioBased does).
    TraceIdRatio(f64),
    /// The parent's sampled flag when there is a parent, else the inner root sampler.
    ParentBased(Root),
}

/// A parent-based sampler's sampler for roots.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Root {
    AlwaysOn,
    AlwaysOff,
    TraceIdRatio(f64),
}

impl Sampler {
    pub fn sampled(&self, parent: Option<&TraceContext>, trace_id: TraceId) -> bool {
        todo!()
    }
}

/// The exporter's settings. Built by [`Config::from_env`]; tests build it directly.
#[derive(Clone, PartialEq)]
pub struct Config {
    /// The full URL spans go to: for `http/protobuf`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as
    /// given, or `OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1/traces`; for `grpc`, the endpoint as
    /// given.
    pub endpoint: String,
    pub protocol: Protocol,
    /// `OTEL_EXPORTER_OTLP_[TRACES_]HEADERS`, percent-decoded: sent with each export, never
    /// logged (they hold credentials).
    pub headers: Vec<(String, String)>,
    /// `OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT` (ms; default 10 s): one export's bound.
    pub timeout: Duration,
    /// The resource: `service.name` (`OTEL_SERVICE_NAME`, else `OTEL_RESOURCE_ATTRIBUTES`'s,
    /// else "perago"), the other `OTEL_RESOURCE_ATTRIBUTES` pairs percent-decoded, and
    /// `telemetry.sdk.name`/`language`/`version`.
    pub resource: Vec<(String, String)>,
    pub sampler: Sampler,
    /// `OTEL_BSP_MAX_QUEUE_SIZE` (default 2048).
    pub max_queue: usize,
    /// `OTEL_BSP_SCHEDULE_DELAY` (ms; default 5000).
    pub schedule_delay: Duration,
    /// `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` (default 512; at most max_queue).
    pub max_batch: usize,
    /// `OTEL_BSP_EXPORT_TIMEOUT` (ms; default 30000).
    pub export_timeout: Duration,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("endpoint", &self.endpoint)
            .field("protocol", &self.protocol)
            .field("headers", &format_args!("{} (not shown)", self.headers.len()))
            .field("timeout", &self.timeout)
            .field("resource", &self.resource)
            .field("sampler", &self.sampler)
            .finish_non_exhaustive()
    }
}

/// A setting that cannot be used: the runtime refuses to start rather than run without the
/// traces the operator asked for.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{name}={value:?}: {why}")]
    Invalid {
        name: &'static str,
        value: String,
        why: String,
    },
}

impl Config {
    /// Reads the environment through `var` (`std::env::var` in the runtime; a map in tests).
    /// `Ok(None)`: tracing is off — `OTEL_SDK_DISABLED=true`, `OTEL_TRACES_EXPORTER=none`, or
    /// no endpoint set. An exporter other than `otlp`/`none` is an error, as is an unknown
    /// protocol (`http/json` included: not supported), sampler, or an unparsable number.
    /// `OTEL_EXPORTER_OTLP_[TRACES_]COMPRESSION=gzip` is refused too (not supported; `none`
    /// is fine).
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, ConfigError> {
        todo!()
    }

    /// A configuration for tests: `endpoint` over `protocol`, always on, a short schedule
    /// delay (100 ms) so tests see spans soon.
    pub fn for_endpoint(endpoint: impl Into<String>, protocol: Protocol) -> Self {
        todo!()
    }
}
