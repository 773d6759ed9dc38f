//! The W3C trace context (<https://www.w3.org/TR/trace-context/>): `traceparent` and
//! `tracestate`, parsed strictly, and new ids.

/// A trace id: 16 bytes, never all zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceId(pub [u8; 16]);

/// A span id: 8 bytes, never all zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpanId(pub [u8; 8]);

impl TraceId {
    /// A random id (fastrand), never all zero.
    pub fn random() -> Self {
        todo!()
    }
    /// 32 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        todo!()
    }
}

impl SpanId {
    /// A random id (fastrand), never all zero.
    pub fn random() -> Self {
        todo!()
    }
    /// 16 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        todo!()
    }
    /// From 8 bytes off the wire (the executor's spans): `None` unless exactly 8, not all zero.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        todo!()
    }
}

/// A span's context as W3C carries it between processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    pub trace_id: TraceId,
    /// The span the next one is a child of.
    pub span_id: SpanId,
    /// The `sampled` flag (bit 0 of trace-flags).
    pub sampled: bool,
    /// `tracestate`, when valid (else dropped, as W3C says: it never fails the parent).
    pub trace_state: Option<String>,
}

/// Why a `traceparent` was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceparentError {
    #[error("traceparent {0:?} is not version-traceid-spanid-flags in lowercase hex (00-<32>-<16>-<2>)")]
    Malformed(String),
    #[error("traceparent {0:?} has an all-zero trace id or span id")]
    ZeroId(String),
    #[error("traceparent {0:?} has version ff, which W3C forbids")]
    ForbiddenVersion(String),
}

impl TraceContext {
    /// Parses `traceparent` (and `tracestate`, dropped when invalid: over 512 characters,
    /// over 32 members, or a member not `key=value`) as W3C level 1 says: version `00`
    /// exactly 55 characters; a higher version at least 55 with the same first four fields
    /// (and `-` after them if longer); `ff` refused; ids lowercase hex, not all zero.
    /// Input longer than 512 characters is refused without being copied into the error.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Result<Self, TraceparentError> {
        todo!()
    }

    /// `00-<trace id>-<span id>-<flags>`.
    pub fn traceparent(&self) -> String {
        todo!()
    }

    /// The same trace and state under `span_id`: what a child is given.
    pub fn child(&self, span_id: SpanId) -> Self {
        Self {
            span_id,
            ..self.clone()
        }
    }
}
