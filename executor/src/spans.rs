//! The executor's spans of one assignment (only while the broker exports traces: the
//! assignment carries a trace context). They are recorded here, sent in the `Completion`, and
//! exported by the broker with the attempt's trace: the executor itself talks to no collector.

use perago_core::trace::{SpanId, TraceContext};
use perago_proto::slot::v1 as proto;
use std::{sync::Mutex, time::SystemTime};

/// The most spans one assignment records (a workspace task's are six or so): what a body
/// could make the executor record is bounded.
const MAX_SPANS: usize = 32;
/// The longest error text a span keeps, in bytes (a body's failure reason carries the end of
/// its stderr: the span needs what failed, not all of it).
const MAX_ERROR_BYTES: usize = 512;

/// The spans of one assignment, and the context they are children of.
#[derive(Debug)]
pub struct SpanRecorder {
    context: TraceContext,
    spans: Mutex<Vec<proto::ExecutorSpan>>,
}

/// A span begun and not yet ended.
#[derive(Debug)]
pub struct Open {
    name: &'static str,
    span_id: SpanId,
    start: SystemTime,
    attributes: Vec<proto::SpanAttribute>,
}

impl Open {
    /// The context a child of this span gets: what the body is handed (`TRACEPARENT`).
    pub fn context(&self, recorder: &SpanRecorder) -> TraceContext {
        recorder.context.child(self.span_id)
    }

    pub fn int(&mut self, key: &str, value: i64) {
        self.attributes.push(proto::SpanAttribute {
            key: key.to_owned(),
            value: Some(proto::span_attribute::Value::IntValue(value)),
        });
    }

    pub fn string(&mut self, key: &str, value: impl Into<String>) {
        self.attributes.push(proto::SpanAttribute {
            key: key.to_owned(),
            value: Some(proto::span_attribute::Value::StringValue(value.into())),
        });
    }
}

impl SpanRecorder {
    /// The recorder of an assignment that carries `trace`; `None` when it carries none, or one
    /// that does not parse (the broker sent it: a broker of another version, at worst the
    /// assignment goes untraced).
    pub fn from_wire(trace: Option<&proto::TraceContext>) -> Option<Self> {
        let trace = trace?;
        let tracestate = (!trace.tracestate.is_empty()).then_some(trace.tracestate.as_str());
        match TraceContext::parse(&trace.traceparent, tracestate) {
            Ok(context) => Some(Self {
                context,
                spans: Mutex::new(Vec::new()),
            }),
            Err(e) => {
                tracing::warn!(error = %perago_core::errors::DisplayChain(&e), "the assignment's trace context does not parse; its spans are not recorded");
                None
            }
        }
    }

    /// Begins a span named `name`, now.
    pub fn start(&self, name: &'static str) -> Open {
        Open {
            name,
            span_id: SpanId::random(),
            start: SystemTime::now(),
            attributes: Vec::new(),
        }
    }

    /// Ends `open` now, failed with `error` if given.
    pub fn end(&self, open: Open, error: Option<&str>) {
        let span = proto::ExecutorSpan {
            name: open.name.to_owned(),
            span_id: open.span_id.0.to_vec(),
            parent_span_id: Vec::new(),
            start_unix_nano: unix_nanos(open.start),
            end_unix_nano: unix_nanos(SystemTime::now()),
            error: error.map(truncated).unwrap_or_default(),
            attributes: open.attributes,
        };
        let mut spans = self.spans.lock().unwrap_or_else(|e| e.into_inner());
        if spans.len() < MAX_SPANS {
            spans.push(span);
        }
    }

    /// The spans recorded, for the completion.
    pub fn take(&self) -> Vec<proto::ExecutorSpan> {
        std::mem::take(&mut *self.spans.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// `text`, at most [`MAX_ERROR_BYTES`] at a character boundary.
fn truncated(text: &str) -> String {
    if text.len() <= MAX_ERROR_BYTES {
        return text.to_owned();
    }
    let mut end = MAX_ERROR_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

fn unix_nanos(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(traceparent: &str) -> proto::TraceContext {
        proto::TraceContext {
            traceparent: traceparent.to_owned(),
            tracestate: "vendor=x".to_owned(),
        }
    }

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn an_assignment_without_a_context_records_nothing() {
        assert!(SpanRecorder::from_wire(None).is_none());
        assert!(SpanRecorder::from_wire(Some(&wire("00-zz"))).is_none());
    }

    #[test]
    fn a_span_is_a_child_of_the_broker_span_and_hands_its_own_id_on() {
        let recorder = SpanRecorder::from_wire(Some(&wire(PARENT))).expect("parses");
        let mut open = recorder.start("body");
        open.int("process.exit.code", 3);
        let child = open.context(&recorder);
        assert_eq!(child.trace_id.to_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(child.trace_state.as_deref(), Some("vendor=x"));
        assert_eq!(child.span_id, open.span_id);
        recorder.end(open, Some(&"x".repeat(4 * MAX_ERROR_BYTES)));
        let spans = recorder.take();
        assert_eq!(spans.len(), 1);
        assert_eq!(spans[0].name, "body");
        assert_eq!(spans[0].span_id, child.span_id.0.to_vec());
        assert!(
            spans[0].parent_span_id.is_empty(),
            "the broker's span is the parent"
        );
        assert!(spans[0].start_unix_nano <= spans[0].end_unix_nano);
        assert!(spans[0].error.len() <= MAX_ERROR_BYTES + '…'.len_utf8());
        assert_eq!(spans[0].attributes.len(), 1);
        assert!(recorder.take().is_empty(), "taken once");
    }

    #[test]
    fn an_assignment_records_a_bounded_number_of_spans() {
        let recorder = SpanRecorder::from_wire(Some(&wire(PARENT))).expect("parses");
        for _ in 0..MAX_SPANS * 3 {
            recorder.end(recorder.start("workspace.fence"), None);
        }
        assert_eq!(recorder.take().len(), MAX_SPANS);
    }

    #[test]
    fn a_long_error_is_cut_at_a_character_boundary() {
        let text = "é".repeat(MAX_ERROR_BYTES);
        let cut = truncated(&text);
        assert!(cut.ends_with('…'));
        assert!(cut.len() <= MAX_ERROR_BYTES + '…'.len_utf8());
    }
}
