//! One trace per attempt, while traces are exported (`OTEL_EXPORTER_OTLP_ENDPOINT`): a root
//! `task` span from the attempt's hold (its poll's start, when it came from a poll) to its
//! report's acknowledgement, with children `poll`, `dispatch`, the executor's (`body`,
//! `workspace.*`, sent in its `Completion`) and `update`.
//!
//! The actor keeps an [`AttemptTrace`] per execution beside its log span, from the
//! execution's first effect on. Nothing is exported before the root ends: the trace id and
//! the parent are settled when the assignment is sent (the task input's `traceparent` is in
//! the assignment), and a trace that is not sampled records nothing at all.

use crate::state::Assigned;
use perago_core::{
    attempt::AttemptSnapshot,
    conductor::Polled,
    result::ResultStatus,
    trace::{Kind, SpanData, SpanId, Status, TraceContext, TraceId, Tracer, Value},
};
use perago_proto::slot::v1 as proto;
use std::{borrow::Cow, collections::HashMap, time::SystemTime};

/// The task input's keys (top level of `inputData`) a parent trace context is read from: the
/// W3C header names.
pub(crate) const INPUT_TRACEPARENT: &str = "traceparent";
pub(crate) const INPUT_TRACESTATE: &str = "tracestate";

/// The most spans of the executor one attempt exports (it records at most 32 itself).
const MAX_EXECUTOR_SPANS: usize = 64;
/// A member of the input longer than this is no trace context (W3C's bound is 512): it is not
/// decoded.
const MAX_CONTEXT_TEXT: usize = 1024;

/// The traces of the executions the actor holds or runs.
pub(crate) struct Traces {
    tracer: Tracer,
    task_type: String,
    attempts: HashMap<String, AttemptTrace>,
    /// The poll whose tasks are being handled: when it started and returned, by task id.
    poll: Option<(SystemTime, SystemTime, Vec<String>)>,
}

/// The trace of one attempt, until its root span ends.
#[derive(Debug)]
pub(crate) struct AttemptTrace {
    tracer: Tracer,
    trace_id: TraceId,
    root: SpanId,
    /// The span of the task input's `traceparent`, when it had a valid one.
    parent: Option<SpanId>,
    trace_state: Option<String>,
    /// `None` until the assignment is sent (or the root ends without one).
    sampled: Option<bool>,
    start: SystemTime,
    /// The poll the attempt came with.
    poll: Option<(SystemTime, SystemTime)>,
    /// When it was held: the dispatch span starts here.
    held: SystemTime,
    dispatched: Option<SystemTime>,
    attributes: Vec<(Cow<'static, str>, Value)>,
    /// The executor's spans, as sent.
    executor: Vec<proto::ExecutorSpan>,
}

impl Traces {
    pub(crate) fn new(tracer: Tracer, task_type: String) -> Self {
        Self {
            tracer,
            task_type,
            attempts: HashMap::new(),
            poll: None,
        }
    }

    /// A poll that started at `started` returned `tasks` now: their traces begin with it.
    /// Good until [`Traces::poll_handled`].
    pub(crate) fn polled(&mut self, tasks: &[Polled], started: SystemTime) {
        let ids = tasks
            .iter()
            .filter_map(|task| match task {
                Polled::Task(task) => Some(task.fields.get("taskId")?.as_str()?.to_owned()),
                Polled::Undecodable { .. } => None,
            })
            .collect();
        self.poll = Some((started, SystemTime::now(), ids));
    }

    pub(crate) fn poll_handled(&mut self) {
        self.poll = None;
    }

    /// The execution's lease starts (it is held or dispatched): its trace begins, once.
    pub(crate) fn begin(&mut self, execution_id: &str, attempt: &AttemptSnapshot, domain: &str) {
        if self.attempts.contains_key(execution_id) {
            return;
        }
        let now = SystemTime::now();
        let poll = self
            .poll
            .as_ref()
            .filter(|(.., ids)| ids.contains(&attempt.task_id))
            .map(|&(started, returned, _)| (started, returned));
        let mut attributes: Vec<(Cow<'static, str>, Value)> = vec![
            (
                "conductor.workflow_id".into(),
                Value::Str(attempt.workflow_instance_id.clone()),
            ),
            (
                "conductor.task_id".into(),
                Value::Str(attempt.task_id.clone()),
            ),
            (
                "conductor.task_type".into(),
                Value::Str(self.task_type.clone()),
            ),
            (
                "conductor.task_reference_name".into(),
                Value::Str(attempt.reference_task_name.clone()),
            ),
            (
                "conductor.retry_count".into(),
                Value::Int(attempt.retry_count.into()),
            ),
            (
                "perago.execution_id".into(),
                Value::Str(execution_id.to_owned()),
            ),
        ];
        if !domain.is_empty() {
            attributes.push(("conductor.domain".into(), Value::Str(domain.to_owned())));
        }
        if let Some(retried) = &attempt.retried_task_id {
            attributes.push((
                "conductor.retried_task_id".into(),
                Value::Str(retried.clone()),
            ));
        }
        self.attempts.insert(
            execution_id.to_owned(),
            AttemptTrace {
                tracer: self.tracer.clone(),
                trace_id: TraceId::random(),
                root: SpanId::random(),
                parent: None,
                trace_state: None,
                sampled: None,
                start: poll.map_or(now, |(started, _)| started),
                poll,
                held: poll.map_or(now, |(_, returned)| returned),
                dispatched: None,
                attributes,
                executor: Vec::new(),
            },
        );
    }

    /// The execution was dispatched to a slot.
    pub(crate) fn assigned(&mut self, assigned: &Assigned) {
        if let Some(trace) = self.attempts.get_mut(&assigned.execution_id) {
            trace.dispatched = Some(SystemTime::now());
            trace.attributes.push((
                "perago.worker_id".into(),
                Value::Str(assigned.worker_id.clone()),
            ));
            trace
                .attributes
                .push(("perago.slot".into(), Value::Int(assigned.slot.into())));
        }
    }

    /// The assignment goes out: its trace takes the input's `traceparent` as parent (first
    /// time only: a trace is settled once), and, when sampled, the assignment carries the
    /// context the executor's spans are children of.
    pub(crate) fn sending(&mut self, assignment: &mut proto::Assignment) {
        let Some(trace) = self.attempts.get_mut(&assignment.execution_id) else {
            return;
        };
        if trace.sampled.is_none() {
            let parent = assignment
                .attempt
                .as_ref()
                .and_then(|attempt| input_context(&attempt.input_data_json));
            if let Some(parent) = &parent {
                trace.trace_id = parent.trace_id;
                trace.parent = Some(parent.span_id);
                trace.trace_state = parent.trace_state.clone();
            }
            trace.sampled = Some(self.tracer.sampled(parent.as_ref(), trace.trace_id));
        }
        if trace.sampled == Some(true) {
            let context = TraceContext {
                trace_id: trace.trace_id,
                span_id: trace.root,
                sampled: true,
                trace_state: trace.trace_state.clone(),
            };
            assignment.trace = Some(Box::new(proto::TraceContext {
                traceparent: context.traceparent(),
                tracestate: context.trace_state.unwrap_or_default(),
            }));
        }
    }

    /// The executor's spans of a completion are the trace's (at most
    /// [`MAX_EXECUTOR_SPANS`]); taken out of the completion, which the machine needs not.
    pub(crate) fn completion(&mut self, completion: &mut proto::Completion) {
        let spans = std::mem::take(&mut completion.spans);
        if let Some(trace) = self.attempts.get_mut(&completion.execution_id) {
            let room = MAX_EXECUTOR_SPANS.saturating_sub(trace.executor.len());
            trace.executor.extend(spans.into_iter().take(room));
        }
    }

    /// The execution is reported: its trace ends once the update does (see
    /// [`AttemptTrace::reported`]).
    pub(crate) fn take(&mut self, execution_id: &str) -> Option<AttemptTrace> {
        self.attempts.remove(execution_id)
    }

    /// The execution was dropped without a report (handed back, its lease lost while held):
    /// its trace ends now, failed with `why`.
    pub(crate) fn dropped(&mut self, execution_id: &str, why: &str) {
        if let Some(trace) = self.attempts.remove(execution_id) {
            trace.end(None, Status::Error(why.to_owned()), Vec::new());
        }
    }
}

impl AttemptTrace {
    /// The result (`status`, failed with `failure`) was delivered (`delivered` `Err`: given
    /// up, why), its update having started at `update_started`: the update span and the root
    /// end now.
    pub(crate) fn reported(
        self,
        status: ResultStatus,
        failure: Option<&str>,
        update_started: SystemTime,
        delivered: Result<(), &str>,
    ) {
        let root_status = match (failure, delivered) {
            (_, Err(why)) => Status::Error(format!("the result was not delivered: {why}")),
            (None, Ok(())) => Status::Unset,
            (Some(reason), Ok(())) => Status::Error(reason.to_owned()),
        };
        let attributes = vec![(
            Cow::Borrowed("conductor.status"),
            Value::Str(status.as_str().to_owned()),
        )];
        let update = (update_started, delivered.err().map(str::to_owned));
        self.end(Some(update), root_status, attributes);
    }

    /// Ends the root span now, with its children; records all when sampled.
    fn end(
        self,
        update: Option<(SystemTime, Option<String>)>,
        status: Status,
        extra: Vec<(Cow<'static, str>, Value)>,
    ) {
        let tracer = self.tracer.clone();
        for span in self.finish(update, status, extra) {
            tracer.record(span);
        }
    }

    /// The spans of the attempt, ended now (none when it is not sampled); the root last.
    fn finish(
        self,
        update: Option<(SystemTime, Option<String>)>,
        status: Status,
        extra: Vec<(Cow<'static, str>, Value)>,
    ) -> Vec<SpanData> {
        // Settled when the assignment went out (with the input's parent, if any); a trace that
        // ends before that has no parent and asks the sampler as a root.
        let sampled = self
            .sampled
            .unwrap_or_else(|| self.tracer.sampled(None, self.trace_id));
        if !sampled {
            return Vec::new();
        }
        let mut spans = Vec::new();
        let end = SystemTime::now();
        let child = |name: &'static str, kind: Kind, start: SystemTime, end: SystemTime| SpanData {
            trace_id: self.trace_id,
            span_id: SpanId::random(),
            parent_span_id: Some(self.root),
            trace_state: self.trace_state.clone(),
            name: name.into(),
            kind,
            start,
            end,
            attributes: Vec::new(),
            status: Status::Unset,
        };
        if let Some((started, returned)) = self.poll {
            spans.push(child("poll", Kind::Client, started, returned));
        }
        if let Some(dispatched) = self.dispatched {
            spans.push(child("dispatch", Kind::Internal, self.held, dispatched));
        }
        spans.extend(
            self.executor
                .iter()
                .filter_map(|span| self.executor_span(span)),
        );
        if let Some((started, failed)) = update {
            let mut span = child("update", Kind::Client, started, end);
            if let Some(why) = failed {
                span.status = Status::Error(why);
            }
            spans.push(span);
        }
        let mut attributes = self.attributes;
        attributes.extend(extra);
        spans.push(SpanData {
            trace_id: self.trace_id,
            span_id: self.root,
            parent_span_id: self.parent,
            trace_state: self.trace_state,
            name: "task".into(),
            kind: Kind::Consumer,
            start: self.start,
            end,
            attributes,
            status,
        });
        spans
    }

    /// An executor's span as exported: its ids checked (a bad one is dropped), its parent the
    /// root unless it names one, its times as sent.
    fn executor_span(&self, span: &proto::ExecutorSpan) -> Option<SpanData> {
        let span_id = SpanId::from_bytes(&span.span_id)?;
        let parent = if span.parent_span_id.is_empty() {
            self.root
        } else {
            SpanId::from_bytes(&span.parent_span_id)?
        };
        const KNOWN: [&str; 5] = [
            "body",
            "workspace.download",
            "workspace.stage",
            "workspace.fence",
            "workspace.merge",
        ];
        let name: Cow<'static, str> = match KNOWN.iter().find(|&&known| known == span.name) {
            Some(known) => Cow::Borrowed(known),
            // An executor of another version: its name, bounded.
            None => Cow::Owned(span.name.chars().take(64).collect()),
        };
        Some(self.executor_span_data(name, span_id, parent, span))
    }

    fn executor_span_data(
        &self,
        name: Cow<'static, str>,
        span_id: SpanId,
        parent: SpanId,
        span: &proto::ExecutorSpan,
    ) -> SpanData {
        let at = |nanos: u64| SystemTime::UNIX_EPOCH + std::time::Duration::from_nanos(nanos);
        let attributes = span
            .attributes
            .iter()
            .take(16)
            .filter_map(|a| {
                use proto::span_attribute::Value as Wire;
                let value = match a.value.as_ref()? {
                    Wire::StringValue(s) => Value::Str(s.chars().take(512).collect()),
                    Wire::IntValue(n) => Value::Int(*n),
                    Wire::BoolValue(b) => Value::Bool(*b),
                };
                Some((Cow::Owned(a.key.chars().take(128).collect()), value))
            })
            .collect();
        SpanData {
            trace_id: self.trace_id,
            span_id,
            parent_span_id: Some(parent),
            trace_state: self.trace_state.clone(),
            name,
            kind: Kind::Internal,
            start: at(span.start_unix_nano),
            end: at(span.end_unix_nano.max(span.start_unix_nano)),
            attributes,
            status: if span.error.is_empty() {
                Status::Unset
            } else {
                Status::Error(span.error.chars().take(512).collect())
            },
        }
    }
}

/// The parent trace context a task input carries (`traceparent`, `tracestate` at its top
/// level), when it carries a valid one; an invalid one is ignored (a new trace starts), as W3C
/// says a receiver does.
fn input_context(input_json: &str) -> Option<TraceContext> {
    if !input_json.contains(INPUT_TRACEPARENT) {
        return None;
    }
    let members = perago_core::json::members(input_json).ok()?;
    let text = |key: &str| {
        let raw = members.iter().find(|(name, _)| name == key)?.1;
        (raw.len() <= MAX_CONTEXT_TEXT)
            .then(|| serde_json::from_str::<String>(raw).ok())
            .flatten()
    };
    let traceparent = text(INPUT_TRACEPARENT)?;
    let tracestate = text(INPUT_TRACESTATE);
    match TraceContext::parse(&traceparent, tracestate.as_deref()) {
        Ok(context) => Some(context),
        Err(e) => {
            tracing::info!(error = %perago_core::errors::DisplayChain(&e), "the task input's traceparent is not valid; the attempt starts a new trace");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use perago_core::trace::{Config, Protocol, Sampler};

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn traces(sampler: Sampler) -> Traces {
        // Nothing is recorded through it here: the spans are read from `finish`.
        let mut config =
            Config::for_endpoint("http://127.0.0.1:9/v1/traces", Protocol::HttpProtobuf);
        config.sampler = sampler;
        Traces::new(Tracer::start(config).unwrap(), "features.build".to_owned())
    }

    fn attempt(input: serde_json::Value) -> AttemptSnapshot {
        AttemptSnapshot::from_conductor(&serde_json::json!({
            "taskType": "features.build", "status": "IN_PROGRESS", "inputData": input,
            "referenceTaskName": "build_ref", "retryCount": 1, "taskDefName": "features.build", "seq": 1,
            "workflowInstanceId": "wf-1", "taskId": "t-1", "retriedTaskId": "t-0",
        }))
        .unwrap()
    }

    fn assignment(attempt: &AttemptSnapshot) -> proto::Assignment {
        proto::Assignment {
            execution_id: "e-1".to_owned(),
            attempt: Some(crate::wire::attempt_to_wire(attempt)),
            ..Default::default()
        }
    }

    fn executor_span(name: &str, span_id: [u8; 8], parent: &[u8]) -> proto::ExecutorSpan {
        proto::ExecutorSpan {
            name: name.to_owned(),
            span_id: span_id.to_vec(),
            parent_span_id: parent.to_vec(),
            start_unix_nano: 1_700_000_000_000_000_000,
            end_unix_nano: 1_700_000_001_000_000_000,
            error: String::new(),
            attributes: vec![proto::SpanAttribute {
                key: "process.exit.code".to_owned(),
                value: Some(proto::span_attribute::Value::IntValue(0)),
            }],
        }
    }

    /// Polled, held, dispatched, assigned, completed, reported: what the actor calls, in its
    /// order.
    fn run_attempt(
        traces: &mut Traces,
        input: serde_json::Value,
        spans: Vec<proto::ExecutorSpan>,
    ) -> (proto::Assignment, Vec<SpanData>) {
        let attempt = attempt(input);
        let started = SystemTime::now() - std::time::Duration::from_millis(50);
        let polled = Polled::Task(perago_core::attempt::PolledTask::from_value(
            serde_json::json!({"taskId": "t-1"}),
        ));
        traces.polled(&[polled], started);
        traces.begin("e-1", &attempt, "blue");
        traces.poll_handled();
        traces.assigned(&Assigned {
            slot: 2,
            worker_id: "features.build-2".to_owned(),
            task_id: "t-1".to_owned(),
            execution_id: "e-1".to_owned(),
            retry_count: 1,
            response_timeout_seconds: 60,
        });
        let mut sent = assignment(&attempt);
        traces.sending(&mut sent);
        let mut completion = proto::Completion {
            execution_id: "e-1".to_owned(),
            spans,
            ..Default::default()
        };
        traces.completion(&mut completion);
        assert!(
            completion.spans.is_empty(),
            "the machine is not given the spans"
        );
        let trace = traces.take("e-1").expect("a trace per execution");
        let spans = trace.finish(
            Some((SystemTime::now(), None)),
            Status::Unset,
            vec![(
                "conductor.status".into(),
                Value::Str("COMPLETED".to_owned()),
            )],
        );
        (sent, spans)
    }

    fn named<'a>(spans: &'a [SpanData], name: &str) -> &'a SpanData {
        spans
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no {name} span in {spans:#?}"))
    }

    #[tokio::test]
    async fn an_attempt_under_an_input_traceparent_is_one_tree_under_it() {
        let mut traces = traces(Sampler::ParentBased(
            perago_core::trace::config::Root::AlwaysOff,
        ));
        let body_id = [9; 8];
        let (sent, spans) = run_attempt(
            &mut traces,
            serde_json::json!({"traceparent": PARENT, "tracestate": "congo=t61", "n": 1}),
            vec![
                executor_span("body", body_id, &[]),
                executor_span("workspace.fence", [8; 8], &body_id),
                executor_span("evil", [0; 8], &[]),
            ],
        );
        let root = named(&spans, "task");
        assert_eq!(root.trace_id.to_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(
            root.parent_span_id.map(|p| p.to_hex()).as_deref(),
            Some("00f067aa0ba902b7")
        );
        assert_eq!(root.kind, Kind::Consumer);
        assert_eq!(root.trace_state.as_deref(), Some("congo=t61"));
        // The executor continues the trace under the root.
        let carried = sent
            .trace
            .expect("a sampled assignment carries its context");
        assert_eq!(
            carried.traceparent,
            format!("00-{}-{}-01", root.trace_id.to_hex(), root.span_id.to_hex())
        );
        assert_eq!(carried.tracestate, "congo=t61");
        let names: Vec<_> = spans.iter().map(|s| s.name.as_ref()).collect();
        assert_eq!(
            names,
            [
                "poll",
                "dispatch",
                "body",
                "workspace.fence",
                "update",
                "task"
            ]
        );
        for child in ["poll", "dispatch", "body", "update"] {
            assert_eq!(
                named(&spans, child).parent_span_id,
                Some(root.span_id),
                "{child}"
            );
            assert_eq!(named(&spans, child).trace_id, root.trace_id, "{child}");
        }
        assert_eq!(
            named(&spans, "workspace.fence").parent_span_id,
            Some(SpanId(body_id))
        );
        assert!(named(&spans, "poll").start <= named(&spans, "dispatch").start);
        assert_eq!(root.start, named(&spans, "poll").start);
        let attribute = |key: &str| {
            root.attributes
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(
            attribute("conductor.workflow_id"),
            Some(Value::Str("wf-1".to_owned()))
        );
        assert_eq!(
            attribute("conductor.task_id"),
            Some(Value::Str("t-1".to_owned()))
        );
        assert_eq!(attribute("conductor.retry_count"), Some(Value::Int(1)));
        assert_eq!(
            attribute("conductor.domain"),
            Some(Value::Str("blue".to_owned()))
        );
        assert_eq!(
            attribute("conductor.retried_task_id"),
            Some(Value::Str("t-0".to_owned()))
        );
        assert_eq!(attribute("perago.slot"), Some(Value::Int(2)));
        assert_eq!(
            attribute("perago.worker_id"),
            Some(Value::Str("features.build-2".to_owned()))
        );
        assert_eq!(
            attribute("conductor.status"),
            Some(Value::Str("COMPLETED".to_owned()))
        );
        assert_eq!(
            named(&spans, "body").attributes,
            [(Cow::Borrowed("process.exit.code"), Value::Int(0))]
        );
    }

    #[tokio::test]
    async fn an_attempt_without_a_valid_traceparent_starts_a_trace_the_sampler_decides() {
        let mut on = traces(Sampler::AlwaysOn);
        for input in [
            serde_json::json!({"n": 1}),
            serde_json::json!({"traceparent": "00-zz"}),
            serde_json::json!({"traceparent": 5}),
        ] {
            let (sent, spans) = run_attempt(&mut on, input.clone(), Vec::new());
            let root = named(&spans, "task");
            assert_eq!(root.parent_span_id, None, "{input}");
            assert_ne!(root.trace_id.to_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
            assert!(sent.trace.is_some());
        }
        let mut off = traces(Sampler::AlwaysOff);
        let (sent, spans) = run_attempt(
            &mut off,
            serde_json::json!({"traceparent": PARENT}),
            Vec::new(),
        );
        assert_eq!(
            sent.trace, None,
            "an unsampled attempt tells the executor nothing"
        );
        assert!(spans.is_empty());
        // A parent that is not sampled is followed by the default sampler.
        let mut based = traces(Sampler::ParentBased(
            perago_core::trace::config::Root::AlwaysOn,
        ));
        let unsampled = PARENT.replace("-01", "-00");
        let (sent, spans) = run_attempt(
            &mut based,
            serde_json::json!({"traceparent": unsampled}),
            Vec::new(),
        );
        assert_eq!(sent.trace, None);
        assert!(spans.is_empty());
    }

    #[tokio::test]
    async fn an_executor_sends_at_most_its_share_of_spans() {
        let mut traces = traces(Sampler::AlwaysOn);
        let many = (1..=200u8)
            .map(|i| executor_span("x".repeat(1000).as_str(), [i; 8], &[]))
            .collect();
        let (_, spans) = run_attempt(&mut traces, serde_json::json!({}), many);
        let executor: Vec<_> = spans.iter().filter(|s| s.name.starts_with('x')).collect();
        assert_eq!(executor.len(), MAX_EXECUTOR_SPANS);
        assert!(executor.iter().all(|s| s.name.len() == 64));
    }
}
