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
        loop {
            let id = fastrand::u128(..);
            if id != 0 {
                return Self(id.to_be_bytes());
            }
        }
    }
    /// 32 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }
}

impl SpanId {
    /// A random id (fastrand), never all zero.
    pub fn random() -> Self {
        loop {
            let id = fastrand::u64(..);
            if id != 0 {
                return Self(id.to_be_bytes());
            }
        }
    }
    /// 16 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }
    /// From 8 bytes off the wire (the executor's spans): `None` unless exactly 8, not all zero.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        let id: [u8; 8] = bytes.try_into().ok()?;
        (id != [0; 8]).then_some(Self(id))
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
    #[error(
        "traceparent {0:?} is not version-traceid-spanid-flags in lowercase hex (00-<32>-<16>-<2>)"
    )]
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
        let malformed = || {
            TraceparentError::Malformed(if traceparent.len() > MAX_HEADER {
                format!("{} characters", traceparent.len())
            } else {
                traceparent.to_owned()
            })
        };
        if traceparent.len() > MAX_HEADER {
            return Err(malformed());
        }
        let b = traceparent.as_bytes();
        if b.len() < 55 || b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return Err(malformed());
        }
        let version = unhex::<1>(&b[0..2]).ok_or_else(malformed)?[0];
        if version == 0xff {
            return Err(TraceparentError::ForbiddenVersion(traceparent.to_owned()));
        }
        // Version 00 is exactly 55; a later version may append fields after a `-`.
        if (version == 0 && b.len() != 55) || (b.len() > 55 && b[55] != b'-') {
            return Err(malformed());
        }
        let trace_id = unhex::<16>(&b[3..35]).ok_or_else(malformed)?;
        let span_id = unhex::<8>(&b[36..52]).ok_or_else(malformed)?;
        let flags = unhex::<1>(&b[53..55]).ok_or_else(malformed)?[0];
        if trace_id == [0; 16] || span_id == [0; 8] {
            return Err(TraceparentError::ZeroId(traceparent.to_owned()));
        }
        Ok(Self {
            trace_id: TraceId(trace_id),
            span_id: SpanId(span_id),
            sampled: flags & 1 == 1,
            trace_state: tracestate.and_then(valid_tracestate),
        })
    }

    /// `00-<trace id>-<span id>-<flags>`.
    pub fn traceparent(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            self.trace_id.to_hex(),
            self.span_id.to_hex(),
            u8::from(self.sampled)
        )
    }

    /// The same trace and state under `span_id`: what a child is given.
    pub fn child(&self, span_id: SpanId) -> Self {
        Self {
            span_id,
            ..self.clone()
        }
    }
}

/// W3C's bound on `tracestate` (and, here, on what a `traceparent` may be before it is read).
const MAX_HEADER: usize = 512;

/// At most 32 list members (W3C).
const MAX_MEMBERS: usize = 32;

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

/// `N` bytes from `2N` lowercase hex digits (W3C: uppercase is invalid).
fn unhex<const N: usize>(digits: &[u8]) -> Option<[u8; N]> {
    fn nibble(d: u8) -> Option<u8> {
        match d {
            b'0'..=b'9' => Some(d - b'0'),
            b'a'..=b'f' => Some(d - b'a' + 10),
            _ => None,
        }
    }
    if digits.len() != 2 * N {
        return None;
    }
    let mut out = [0; N];
    for (byte, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        *byte = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(out)
}

/// `tracestate` when W3C would carry it on: at most 512 characters and 32 members, each
/// `key=value` with a key of lowercase letters, digits and `_-*/@` (starting with a letter or
/// digit) and a value of printable ASCII but `,` and `=`, not ending in a space. Empty members
/// are allowed (and dropped); anything else drops the whole header.
fn valid_tracestate(state: &str) -> Option<String> {
    if state.len() > MAX_HEADER {
        return None;
    }
    let mut members = Vec::new();
    for member in state.split(',') {
        let member = member.trim_matches([' ', '\t']);
        if member.is_empty() {
            continue;
        }
        let (key, value) = member.split_once('=')?;
        let key_ok = key.len() <= 256
            && key
                .bytes()
                .next()
                .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
            && key
                .bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"_-*/@".contains(&c))
            && key.bytes().filter(|&c| c == b'@').count() <= 1;
        let value_ok = !value.is_empty()
            && value.len() <= 256
            && value
                .bytes()
                .all(|c| (0x20..=0x7e).contains(&c) && c != b',' && c != b'=')
            && !value.ends_with(' ');
        if !key_ok || !value_ok {
            return None;
        }
        members.push(member);
    }
    if members.is_empty() || members.len() > MAX_MEMBERS {
        return None;
    }
    Some(members.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_version_00_traceparent_round_trips() {
        let parsed = TraceContext::parse(PARENT, Some("congo=t61rcWkgMzE")).unwrap();
        assert_eq!(parsed.trace_id.to_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(parsed.span_id.to_hex(), "00f067aa0ba902b7");
        assert!(parsed.sampled);
        assert_eq!(parsed.trace_state.as_deref(), Some("congo=t61rcWkgMzE"));
        assert_eq!(parsed.traceparent(), PARENT);
        let unsampled = TraceContext::parse(&PARENT.replace("-01", "-00"), None).unwrap();
        assert!(!unsampled.sampled);
        assert!(unsampled.traceparent().ends_with("-00"));
    }

    #[test]
    fn what_w3c_refuses_is_refused_naming_why() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
        ] {
            assert!(
                matches!(
                    TraceContext::parse(bad, None),
                    Err(TraceparentError::Malformed(_))
                ),
                "{bad:?}"
            );
        }
        assert!(matches!(
            TraceContext::parse(
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                None
            ),
            Err(TraceparentError::ZeroId(_))
        ));
        assert!(matches!(
            TraceContext::parse(
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                None
            ),
            Err(TraceparentError::ZeroId(_))
        ));
        assert!(matches!(
            TraceContext::parse(&PARENT.replacen("00", "ff", 1), None),
            Err(TraceparentError::ForbiddenVersion(_))
        ));
    }

    #[test]
    fn a_later_version_is_read_by_its_first_four_fields() {
        let later = format!("{}-what-comes-next", PARENT.replacen("00", "01", 1));
        let parsed = TraceContext::parse(&later, None).unwrap();
        assert_eq!(parsed.span_id.to_hex(), "00f067aa0ba902b7");
        // Re-emitted as the version this side speaks.
        assert_eq!(parsed.traceparent(), PARENT);
    }

    #[test]
    fn a_huge_traceparent_is_refused_without_being_copied() {
        let huge = "0".repeat(10 << 20);
        let error = TraceContext::parse(&huge, None).unwrap_err();
        assert_eq!(
            error,
            TraceparentError::Malformed(format!("{} characters", 10 << 20))
        );
    }

    #[test]
    fn an_invalid_tracestate_is_dropped_and_never_fails_the_parent() {
        let parse = |state: &str| {
            TraceContext::parse(PARENT, Some(state))
                .unwrap()
                .trace_state
        };
        assert_eq!(
            parse("a=1, b@vendor=2,,"),
            Some("a=1,b@vendor=2".to_owned())
        );
        assert_eq!(parse("A=1"), None);
        assert_eq!(parse("a"), None);
        assert_eq!(parse("a=1,b=x=y"), None);
        assert_eq!(parse(""), None);
        assert_eq!(parse(&"a=1,".repeat(33)), None);
        assert_eq!(parse(&format!("a={}", "v".repeat(600))), None);
    }

    #[test]
    fn ids_are_random_and_never_zero() {
        assert_ne!(TraceId::random(), TraceId::random());
        assert_ne!(SpanId::random().0, [0; 8]);
        assert_eq!(SpanId::from_bytes(&[0; 8]), None);
        assert_eq!(SpanId::from_bytes(&[1; 7]), None);
        assert_eq!(SpanId::from_bytes(&[1; 8]), Some(SpanId([1; 8])));
        assert_eq!(SpanId([0xab; 8]).to_hex(), "abababababababab");
    }
}
