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
        match *self {
            Self::AlwaysOn => true,
            Self::AlwaysOff => false,
            Self::TraceIdRatio(ratio) => ratio_sampled(ratio, trace_id),
            Self::ParentBased(root) => match (parent, root) {
                (Some(parent), _) => parent.sampled,
                (None, Root::AlwaysOn) => true,
                (None, Root::AlwaysOff) => false,
                (None, Root::TraceIdRatio(ratio)) => ratio_sampled(ratio, trace_id),
            },
        }
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
            .field(
                "headers",
                &format_args!("{} (not shown)", self.headers.len()),
            )
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
        // An empty variable is unset, as the SDKs read them.
        let var = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        // The traces-only variable wins over the general one.
        let either = |traces: &'static str, general: &'static str| {
            var(traces)
                .map(|v| (traces, v))
                .or_else(|| var(general).map(|v| (general, v)))
        };
        if let Some(disabled) = var("OTEL_SDK_DISABLED") {
            match disabled.trim().to_ascii_lowercase().as_str() {
                "true" => return Ok(None),
                "false" => {}
                _ => return Err(invalid("OTEL_SDK_DISABLED", &disabled, "not true or false")),
            }
        }
        if let Some(exporters) = var("OTEL_TRACES_EXPORTER") {
            let mut otlp = false;
            for exporter in exporters.split(',').map(str::trim) {
                match exporter {
                    "otlp" => otlp = true,
                    "none" => {}
                    _ => {
                        return Err(invalid(
                            "OTEL_TRACES_EXPORTER",
                            &exporters,
                            "perago exports traces over OTLP only: otlp or none",
                        ));
                    }
                }
            }
            if !otlp {
                return Ok(None);
            }
        }
        let protocol = match either(
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ) {
            None => Protocol::HttpProtobuf,
            Some((name, value)) => match value.trim() {
                "grpc" => Protocol::Grpc,
                "http/protobuf" => Protocol::HttpProtobuf,
                _ => {
                    return Err(invalid(
                        name,
                        &value,
                        "not grpc or http/protobuf (http/json is not supported)",
                    ));
                }
            },
        };
        let endpoint = if let Some(endpoint) = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
            check_endpoint(
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                endpoint.trim(),
                protocol,
            )?
        } else if let Some(base) = var("OTEL_EXPORTER_OTLP_ENDPOINT") {
            let base = check_endpoint("OTEL_EXPORTER_OTLP_ENDPOINT", base.trim(), protocol)?;
            match protocol {
                Protocol::Grpc => base,
                Protocol::HttpProtobuf => format!("{}/v1/traces", base.trim_end_matches('/')),
            }
        } else {
            return Ok(None);
        };
        let headers = match either(
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            "OTEL_EXPORTER_OTLP_HEADERS",
        ) {
            None => Vec::new(),
            // The value is a credential: an error names the variable, never what it holds.
            Some((name, value)) => parse_pairs(&value).ok_or_else(|| {
                invalid(
                    name,
                    "(not shown)",
                    "not comma-separated key=value pairs, percent-encoded",
                )
            })?,
        };
        for (key, value) in &headers {
            let key_ok = !key.is_empty()
                && key
                    .bytes()
                    .all(|c| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c));
            if !key_ok || value.bytes().any(|c| c < 0x20 && c != b'\t' || c == 0x7f) {
                return Err(invalid(
                    "OTEL_EXPORTER_OTLP_HEADERS",
                    "(not shown)",
                    "a header name or value HTTP cannot carry",
                ));
            }
        }
        if let Some((name, value)) = either(
            "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
            "OTEL_EXPORTER_OTLP_COMPRESSION",
        ) && value.trim() != "none"
        {
            return Err(invalid(
                name,
                &value,
                "perago sends spans uncompressed: none",
            ));
        }
        let timeout = match either(
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            "OTEL_EXPORTER_OTLP_TIMEOUT",
        ) {
            None => Duration::from_secs(10),
            Some((name, value)) => millis(name, &value)?,
        };
        let sampler = sampler(var("OTEL_TRACES_SAMPLER"), var("OTEL_TRACES_SAMPLER_ARG"))?;
        let mut resource = match var("OTEL_RESOURCE_ATTRIBUTES") {
            None => Vec::new(),
            Some(value) => parse_pairs(&value).ok_or_else(|| {
                invalid(
                    "OTEL_RESOURCE_ATTRIBUTES",
                    &value,
                    "not comma-separated key=value pairs, percent-encoded",
                )
            })?,
        };
        let service = var("OTEL_SERVICE_NAME").map(|s| s.trim().to_owned());
        resource.retain(|(key, _)| service.is_none() || key != "service.name");
        if let Some(service) = service {
            resource.insert(0, ("service.name".to_owned(), service));
        } else if !resource.iter().any(|(key, _)| key == "service.name") {
            resource.insert(0, ("service.name".to_owned(), "perago".to_owned()));
        }
        resource.extend(sdk_resource());
        let number = |name: &'static str, default: usize| match var(name) {
            None => Ok(default),
            Some(value) => match value.trim().parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(invalid(name, &value, "not a whole number above 0")),
            },
        };
        let max_queue = number("OTEL_BSP_MAX_QUEUE_SIZE", 2048)?;
        let max_batch = number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)?.min(max_queue);
        let schedule_delay = match var("OTEL_BSP_SCHEDULE_DELAY") {
            None => Duration::from_secs(5),
            Some(value) => millis("OTEL_BSP_SCHEDULE_DELAY", &value)?,
        };
        let export_timeout = match var("OTEL_BSP_EXPORT_TIMEOUT") {
            None => Duration::from_secs(30),
            Some(value) => millis("OTEL_BSP_EXPORT_TIMEOUT", &value)?,
        };
        Ok(Some(Self {
            endpoint,
            protocol,
            headers,
            timeout,
            resource,
            sampler,
            max_queue,
            schedule_delay,
            max_batch,
            export_timeout,
        }))
    }

    /// A configuration for tests: `endpoint` over `protocol`, always on, a short schedule
    /// delay (100 ms) so tests see spans soon.
    pub fn for_endpoint(endpoint: impl Into<String>, protocol: Protocol) -> Self {
        let mut resource = vec![("service.name".to_owned(), "perago".to_owned())];
        resource.extend(sdk_resource());
        Self {
            endpoint: endpoint.into(),
            protocol,
            headers: Vec::new(),
            timeout: Duration::from_secs(10),
            resource,
            sampler: Sampler::AlwaysOn,
            max_queue: 2048,
            schedule_delay: Duration::from_millis(100),
            max_batch: 512,
            export_timeout: Duration::from_secs(30),
        }
    }
}

fn invalid(name: &'static str, value: &str, why: &str) -> ConfigError {
    ConfigError::Invalid {
        name,
        value: value.to_owned(),
        why: why.to_owned(),
    }
}

/// An `http://` or `https://` URL with a host; gRPC over TLS is not built in (tonic's TLS
/// would be a second TLS stack), so a gRPC endpoint must be plain `http://` — a collector
/// sidecar or a local agent, as usual — and an `https://` one is refused at start.
fn check_endpoint(
    name: &'static str,
    url: &str,
    protocol: Protocol,
) -> Result<String, ConfigError> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| invalid(name, url, "not an http:// or https:// URL"))?;
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if host.is_empty() || host.contains('@') || url.bytes().any(|c| c.is_ascii_whitespace()) {
        return Err(invalid(
            name,
            url,
            "needs a host (and no user info or spaces)",
        ));
    }
    if protocol == Protocol::Grpc && url.starts_with("https://") {
        return Err(invalid(
            name,
            url,
            "OTLP over gRPC is sent in plain http:// only; for TLS use \
             OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf with an https:// endpoint",
        ));
    }
    Ok(url.to_owned())
}

/// A duration in whole milliseconds (the OTLP variables' unit).
fn millis(name: &'static str, value: &str) -> Result<Duration, ConfigError> {
    match value.trim().parse::<u64>() {
        Ok(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
        _ => Err(invalid(
            name,
            value,
            "not a whole number of milliseconds above 0",
        )),
    }
}

fn sampler(name: Option<String>, arg: Option<String>) -> Result<Sampler, ConfigError> {
    let ratio = || match &arg {
        None => Ok(1.0),
        Some(value) => match value.trim().parse::<f64>() {
            Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
            _ => Err(invalid(
                "OTEL_TRACES_SAMPLER_ARG",
                value,
                "not a ratio from 0 to 1",
            )),
        },
    };
    let Some(name) = name else {
        return Ok(Sampler::ParentBased(Root::AlwaysOn));
    };
    Ok(match name.trim() {
        "always_on" => Sampler::AlwaysOn,
        "always_off" => Sampler::AlwaysOff,
        "traceidratio" => Sampler::TraceIdRatio(ratio()?),
        "parentbased_always_on" => Sampler::ParentBased(Root::AlwaysOn),
        "parentbased_always_off" => Sampler::ParentBased(Root::AlwaysOff),
        "parentbased_traceidratio" => Sampler::ParentBased(Root::TraceIdRatio(ratio()?)),
        _ => {
            return Err(invalid(
                "OTEL_TRACES_SAMPLER",
                &name,
                "not always_on, always_off, traceidratio, parentbased_always_on, \
                 parentbased_always_off or parentbased_traceidratio",
            ));
        }
    })
}

/// The SDKs' TraceIdRatioBased: the low 8 bytes of the id, big-endian, below ratio × 2^64.
fn ratio_sampled(ratio: f64, trace_id: TraceId) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    let low = u64::from_be_bytes(trace_id.0[8..].try_into().unwrap_or_default());
    // The float-to-int cast saturates; 0 samples nothing.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let bound = (ratio * 18_446_744_073_709_551_616.0) as u64;
    low < bound
}

/// What says which SDK made the spans (OTel semantic conventions).
fn sdk_resource() -> [(String, String); 3] {
    [
        ("telemetry.sdk.name".to_owned(), "perago".to_owned()),
        ("telemetry.sdk.language".to_owned(), "rust".to_owned()),
        (
            "telemetry.sdk.version".to_owned(),
            env!("CARGO_PKG_VERSION").to_owned(),
        ),
    ]
}

/// `key=value,key=value` (W3C Baggage-like, as `OTEL_RESOURCE_ATTRIBUTES` and
/// `OTEL_EXPORTER_OTLP_HEADERS` are written), each side trimmed and percent-decoded. `None`
/// when a member has no `=`, an empty key, or a bad escape.
fn parse_pairs(text: &str) -> Option<Vec<(String, String)>> {
    let mut pairs = Vec::new();
    for member in text.split(',') {
        if member.trim().is_empty() {
            continue;
        }
        let (key, value) = member.split_once('=')?;
        let key = percent_decode(key.trim())?;
        if key.is_empty() {
            return None;
        }
        pairs.push((key, percent_decode(value.trim())?));
    }
    Some(pairs)
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let pair = bytes.get(i + 1..i + 3)?;
            let digits = std::str::from_utf8(pair).ok()?;
            out.push(u8::from_str_radix(digits, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn config(vars: &[(&str, &str)]) -> Result<Option<Config>, ConfigError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Config::from_env(|name| vars.get(name).cloned())
    }

    fn error(vars: &[(&str, &str)]) -> String {
        let refused = config(vars).unwrap_err();
        format!("{}", crate::errors::DisplayChain(&refused))
    }

    #[test]
    fn without_an_endpoint_or_when_disabled_tracing_is_off() {
        assert_eq!(config(&[]).unwrap(), None);
        let on = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")];
        assert!(config(&on).unwrap().is_some());
        for off in [
            ("OTEL_SDK_DISABLED", "true"),
            ("OTEL_TRACES_EXPORTER", "none"),
        ] {
            assert_eq!(config(&[on[0], off]).unwrap(), None, "{off:?}");
        }
        assert_eq!(
            config(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")]).unwrap(),
            None
        );
    }

    #[test]
    fn the_standard_variables_are_read_as_the_sdks_read_them() {
        let c = config(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/"),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "x-api-key=s%3Dcret, tenant=a b",
            ),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "service.name=ignored,deployment.environment=prod%2Ceu",
            ),
            ("OTEL_SERVICE_NAME", "etl"),
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "100"),
            ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "1000"),
            ("OTEL_BSP_SCHEDULE_DELAY", "200"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(c.endpoint, "http://collector:4318/v1/traces");
        assert_eq!(c.protocol, Protocol::HttpProtobuf);
        assert_eq!(
            c.headers,
            [
                ("x-api-key".to_owned(), "s=cret".to_owned()),
                ("tenant".to_owned(), "a b".to_owned())
            ]
        );
        assert_eq!(c.timeout, Duration::from_millis(2500));
        assert_eq!(c.resource[0], ("service.name".to_owned(), "etl".to_owned()));
        assert_eq!(
            c.resource[1],
            ("deployment.environment".to_owned(), "prod,eu".to_owned())
        );
        assert!(!c.resource[1..].iter().any(|(k, _)| k == "service.name"));
        assert_eq!(c.sampler, Sampler::ParentBased(Root::TraceIdRatio(0.25)));
        assert_eq!((c.max_queue, c.max_batch), (100, 100));
        assert_eq!(c.schedule_delay, Duration::from_millis(200));
        // The credential never shows in a debug print.
        assert!(!format!("{c:?}").contains("cret"));
    }

    #[test]
    fn the_traces_variables_win_and_their_endpoint_is_used_as_given() {
        let c = config(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://general:4318"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://traces:4318/custom",
            ),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "a=1"),
            ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "b=2"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(c.endpoint, "http://traces:4318/custom");
        assert_eq!(c.protocol, Protocol::Grpc);
        assert_eq!(c.headers, [("b".to_owned(), "2".to_owned())]);
        assert_eq!(c.resource[0].1, "perago");
        assert_eq!(c.sampler, Sampler::ParentBased(Root::AlwaysOn));
        let grpc = config(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(grpc.endpoint, "http://collector:4317");
    }

    #[test]
    fn settings_that_cannot_be_used_are_refused_naming_the_variable() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318");
        for (vars, says) in [
            (
                vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")],
                "not an http:// or https:// URL",
            ),
            (
                vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "http:///v1")],
                "needs a host",
            ),
            (
                vec![
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4317"),
                    ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ],
                "plain http:// only",
            ),
            (
                vec![endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")],
                "http/json is not supported",
            ),
            (
                vec![endpoint, ("OTEL_TRACES_EXPORTER", "zipkin")],
                "OTLP only",
            ),
            (
                vec![endpoint, ("OTEL_TRACES_SAMPLER", "sometimes")],
                "OTEL_TRACES_SAMPLER=",
            ),
            (
                vec![
                    endpoint,
                    ("OTEL_TRACES_SAMPLER", "traceidratio"),
                    ("OTEL_TRACES_SAMPLER_ARG", "2"),
                ],
                "ratio from 0 to 1",
            ),
            (
                vec![endpoint, ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")],
                "uncompressed",
            ),
            (
                vec![endpoint, ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s")],
                "milliseconds",
            ),
            (vec![endpoint, ("OTEL_BSP_MAX_QUEUE_SIZE", "0")], "above 0"),
            (
                vec![endpoint, ("OTEL_SDK_DISABLED", "maybe")],
                "true or false",
            ),
            (
                vec![endpoint, ("OTEL_RESOURCE_ATTRIBUTES", "novalue")],
                "key=value",
            ),
        ] {
            let said = error(&vars);
            assert!(said.contains(says), "{vars:?}: {said}");
        }
        // A bad header never prints what it holds.
        let said = error(&[endpoint, ("OTEL_EXPORTER_OTLP_HEADERS", "token=s3cret%zz")]);
        assert!(
            said.contains("OTEL_EXPORTER_OTLP_HEADERS") && !said.contains("s3cret"),
            "{said}"
        );
        let said = error(&[endpoint, ("OTEL_EXPORTER_OTLP_HEADERS", "bad name=s3cret")]);
        assert!(!said.contains("s3cret"), "{said}");
    }

    #[test]
    fn samplers_decide_as_the_sdks_do() {
        let id = |low: u64| {
            let mut bytes = [7; 16];
            bytes[8..].copy_from_slice(&low.to_be_bytes());
            TraceId(bytes)
        };
        let half = Sampler::TraceIdRatio(0.5);
        assert!(half.sampled(None, id(0)));
        assert!(half.sampled(None, id(u64::MAX / 2 - 1)));
        assert!(!half.sampled(None, id(u64::MAX / 2 + 2)));
        assert!(!Sampler::TraceIdRatio(0.0).sampled(None, id(0)));
        assert!(Sampler::TraceIdRatio(1.0).sampled(None, id(u64::MAX)));
        let parent = |sampled| TraceContext {
            trace_id: id(1),
            span_id: crate::trace::SpanId([1; 8]),
            sampled,
            trace_state: None,
        };
        let based = Sampler::ParentBased(Root::AlwaysOff);
        assert!(based.sampled(Some(&parent(true)), id(1)));
        assert!(!based.sampled(None, id(1)));
        assert!(!Sampler::ParentBased(Root::AlwaysOn).sampled(Some(&parent(false)), id(1)));
        assert!(!Sampler::AlwaysOff.sampled(Some(&parent(true)), id(1)));
    }
}
