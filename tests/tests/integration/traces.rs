//! OpenTelemetry traces end to end (issue #29 item 2): with the standard `OTEL_*` environment
//! the runtime exports a trace per attempt to a real OTLP receiver (gRPC and HTTP), the task
//! input's `traceparent` becomes its parent, and the body gets the context to continue it.

use crate::harness::{Conductor, Lakefs, SupervisorProc, TaskFixture, eventually, thread_mode};
use perago_tests::otlp::{OtlpReceiver, ReceivedSpan};
use serde_json::json;
use std::time::Duration;

const PARENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_SPAN: &str = "00f067aa0ba902b7";

/// Answers with the trace context it was given, and whether it can see the exporter's
/// credential (it must not).
const ECHO_CONTEXT: &str = "cat > /dev/null\n\
    printf '{\"traceparent\": \"%s\", \"tracestate\": \"%s\", \"headers\": \"%s\"}' \"${TRACEPARENT-unset}\" \"${TRACESTATE-unset}\" \"${OTEL_EXPORTER_OTLP_HEADERS-unset}\"\n";

/// Registers `task` with a workflow that passes `traceparent` and `tracestate` of the
/// workflow input on to the task input, as a traced workflow does.
async fn register_traced(conductor: &Conductor, task: &TaskFixture) {
    conductor.register(task).await;
    let wf = json!({
        "name": format!("{}.wf", task.name), "version": 1, "schemaVersion": 2,
        "tasks": [{"name": task.name, "taskReferenceName": "t", "type": "SIMPLE",
                   "inputParameters": {
                       "params": "${workflow.input.params}",
                       "traceparent": "${workflow.input.traceparent}",
                       "tracestate": "${workflow.input.tracestate}"}}],
        "outputParameters": {"result": "${t.output.result}"}
    });
    conductor.client.upsert_workflow_defs(&[wf]).await.unwrap();
}

fn otel_env(endpoint: &str, protocol: &str) -> Vec<(&'static str, String)> {
    vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.to_owned()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol.to_owned()),
        ("OTEL_SERVICE_NAME", "traced-workers".to_owned()),
        (
            "OTEL_RESOURCE_ATTRIBUTES",
            "deployment.environment=test,team=data%20platform".to_owned(),
        ),
        // Spans of a finished attempt go out within 100 ms, not the default 5 s.
        ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
        ("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=sekrit".to_owned()),
    ]
}

fn named<'a>(spans: &'a [ReceivedSpan], name: &str) -> Vec<&'a ReceivedSpan> {
    spans.iter().filter(|s| s.name == name).collect()
}

fn one<'a>(spans: &'a [ReceivedSpan], name: &str) -> &'a ReceivedSpan {
    let found = named(spans, name);
    assert_eq!(found.len(), 1, "one {name} span in {spans:#?}");
    found[0]
}

/// The spans of the trace whose root has `task_id`, once its root arrived.
fn trace_of(spans: &[ReceivedSpan], root: &ReceivedSpan) -> Vec<ReceivedSpan> {
    spans
        .iter()
        .filter(|s| s.trace_id == root.trace_id)
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_is_one_trace_under_the_inputs_traceparent_and_the_body_continues_it() {
    let receiver = OtlpReceiver::start().await;
    // Both transports, one per execution mode of the run.
    let (endpoint, protocol) = if thread_mode() {
        (receiver.http_endpoint(), "http/protobuf")
    } else {
        (receiver.grpc_endpoint(), "grpc")
    };
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("e2e.traced", ECHO_CONTEXT, "retry_count = 0");
    register_traced(&conductor, &task).await;
    let mut sup = SupervisorProc::start_owned(&task, &conductor, 1, &otel_env(&endpoint, protocol));
    let traceparent = format!("00-{PARENT_TRACE}-{PARENT_SPAN}-01");
    let id = conductor
        .start_with(
            &task,
            json!({"params": {}, "traceparent": traceparent, "tracestate": "vendor=1"}),
        )
        .await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf}");
    let task_id = wf["tasks"][0]["taskId"].as_str().unwrap().to_owned();

    let spans = receiver
        .wait_for(
            |spans| spans.iter().any(|s| s.name == "task"),
            Duration::from_secs(20),
        )
        .await;
    let root = one(&spans, "task");
    assert_eq!(root.trace_id, PARENT_TRACE, "the input's trace: {root:#?}");
    assert_eq!(root.parent_span_id.as_deref(), Some(PARENT_SPAN));
    assert_eq!(root.trace_state, "vendor=1");
    assert_eq!(root.attributes["conductor.task_id"], json!(task_id));
    assert_eq!(root.attributes["conductor.workflow_id"], json!(id));
    assert_eq!(root.attributes["conductor.task_type"], json!("e2e.traced"));
    assert_eq!(root.attributes["conductor.retry_count"], json!(0));
    assert_eq!(root.attributes["conductor.status"], json!("COMPLETED"));
    assert!(root.attributes["perago.execution_id"].is_string());
    assert!(
        root.attributes["perago.worker_id"]
            .as_str()
            .is_some_and(|w| w.starts_with(&task.prefix())),
        "{root:#?}"
    );
    assert_eq!(root.resource["service.name"], "traced-workers");
    assert_eq!(root.resource["deployment.environment"], "test");
    assert_eq!(root.resource["team"], "data platform");
    assert_eq!(
        root.headers.get("x-api-key").map(String::as_str),
        Some("sekrit")
    );
    assert_eq!(
        root.status_code, 0,
        "a completed task's root is not an error"
    );

    let trace = trace_of(&spans, root);
    for name in ["poll", "dispatch", "body", "update"] {
        let span = one(&trace, name);
        assert_eq!(
            span.parent_span_id.as_deref(),
            Some(root.span_id.as_str()),
            "{name} is a child of the root"
        );
        assert!(
            span.start_unix_nano >= root.start_unix_nano
                && span.end_unix_nano <= root.end_unix_nano,
            "{name} lies within the root: {span:#?} {root:#?}"
        );
    }
    let body = one(&trace, "body");
    assert_eq!(body.attributes["process.exit.code"], json!(0));
    // The body was handed its own span's context.
    assert_eq!(
        wf["output"]["result"],
        json!({"traceparent": format!("00-{PARENT_TRACE}-{}-01", body.span_id), "tracestate": "vendor=1", "headers": "unset"})
    );
    // Nothing leaks the headers: read once the runtime has drained, when every line it held
    // is written.
    sup.signal("TERM");
    let status = sup.wait_exit(Duration::from_secs(20)).await;
    assert!(status.success(), "{status}\n{}", sup.log_text());
    let log = sup.log_text() + &sup.jsonl_text(&task, &format!("{}Broker", task.prefix()));
    assert!(
        log.contains("exporting a trace per attempt over OTLP"),
        "the broker says it exports: {log}"
    );
    assert!(!log.contains("sekrit"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_attempt_of_a_retried_task_is_a_trace_of_its_own() {
    let receiver = OtlpReceiver::start().await;
    let conductor = Conductor::start().await;
    // Fails the first attempt (exit 3), completes the second.
    let body = "cat > /dev/null\nd=$(dirname \"$0\")\n\
                if [ ! -e \"$d/failed-once\" ]; then touch \"$d/failed-once\"; echo first >&2; exit 3; fi\n\
                echo '{}'\n";
    let task = TaskFixture::new("e2e.traceretry", body, "retry_count = 1");
    conductor.register(&task).await;
    let _sup = SupervisorProc::start_owned(
        &task,
        &conductor,
        1,
        &otel_env(&receiver.http_endpoint(), "http/protobuf"),
    );
    let id = conductor.start_workflow(&task, json!({})).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf}");
    let spans = receiver
        .wait_for(
            |spans| spans.iter().filter(|s| s.name == "task").count() == 2,
            Duration::from_secs(20),
        )
        .await;
    let mut roots = named(&spans, "task");
    roots.sort_by_key(|r| r.attributes["conductor.retry_count"].as_i64());
    let (first, second) = (roots[0], roots[1]);
    assert_ne!(first.trace_id, second.trace_id, "a new trace per attempt");
    assert!(first.parent_span_id.is_none() && second.parent_span_id.is_none());
    assert_eq!(first.attributes["conductor.retry_count"], json!(0));
    assert_eq!(second.attributes["conductor.retry_count"], json!(1));
    assert_eq!(first.attributes["conductor.status"], json!("FAILED"));
    assert_eq!(first.status_code, 2, "a failed attempt's root is an error");
    assert!(first.status_message.contains("first"), "{first:#?}");
    assert_eq!(second.status_code, 0);
    let failed_trace = trace_of(&spans, first);
    let failed_body = one(&failed_trace, "body");
    assert_eq!(failed_body.attributes["process.exit.code"], json!(3));
    assert_eq!(failed_body.status_code, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_endpoint_nothing_is_traced_and_no_inherited_context_reaches_the_body() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("e2e.untraced", ECHO_CONTEXT, "retry_count = 0");
    register_traced(&conductor, &task).await;
    // A context in the runtime's own environment is not the attempt's.
    let inherited = format!("00-{PARENT_TRACE}-{PARENT_SPAN}-01");
    let _sup = SupervisorProc::start(
        &task,
        &conductor,
        1,
        &[
            ("TRACEPARENT", inherited.as_str()),
            ("TRACESTATE", "a=b"),
            // A credential without an endpoint is still kept from bodies.
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=leak"),
        ],
    );
    let id = conductor
        .start_with(&task, json!({"params": {}, "traceparent": inherited}))
        .await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf}");
    assert_eq!(
        wf["output"]["result"],
        json!({"traceparent": "unset", "tracestate": "unset", "headers": "unset"})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_refuses_costs_no_task_and_later_traces_still_arrive() {
    let receiver = OtlpReceiver::start().await;
    receiver.set_failing(true);
    let conductor = Conductor::start().await;
    let task = TaskFixture::new(
        "e2e.tracedown",
        "cat > /dev/null\necho '{}'\n",
        "retry_count = 0",
    );
    conductor.register(&task).await;
    let sup = SupervisorProc::start_owned(
        &task,
        &conductor,
        1,
        &otel_env(&receiver.grpc_endpoint(), "grpc"),
    );
    let first = conductor.start_workflow(&task, json!({})).await;
    let wf = conductor
        .wait_terminal(&first, Duration::from_secs(30))
        .await;
    assert_eq!(
        wf["status"], "COMPLETED",
        "a refused export costs no task: {wf}"
    );
    // The refusal is logged (rate-limited), then the collector comes back.
    let broker = format!("{}Broker", task.prefix());
    eventually(
        "the export failure to be logged",
        Duration::from_secs(20),
        || async {
            sup.jsonl_text(&task, &broker)
                .contains("OTLP export failed")
                .then_some(())
        },
    )
    .await;
    receiver.set_failing(false);
    let second = conductor.start_workflow(&task, json!({})).await;
    let wf = conductor
        .wait_terminal(&second, Duration::from_secs(30))
        .await;
    assert_eq!(wf["status"], "COMPLETED", "{wf}");
    let spans = receiver
        .wait_for(
            |spans| {
                spans.iter().any(|s| {
                    s.name == "task" && s.attributes["conductor.workflow_id"] == json!(second)
                })
            },
            Duration::from_secs(20),
        )
        .await;
    assert!(
        !spans
            .iter()
            .any(|s| s.name == "task" && s.attributes["conductor.workflow_id"] == json!(first)),
        "the refused batch is not exported twice"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_attempt_has_its_download_stage_fence_and_merge_spans() {
    let receiver = OtlpReceiver::start().await;
    let conductor = Conductor::start().await;
    let lakefs = Lakefs::start().await;
    lakefs.seed("traced", &[("data/a.txt", "a\n")]).await;
    let task = TaskFixture::workspace(
        "e2e.tracedws",
        "cat > /dev/null\necho b > \"$PERAGO_WORKSPACE_DIR/b.txt\"\necho '{}'\n",
        "",
        "[workspace]\nprefix = \"data/\"\n",
    );
    conductor.register(&task).await;
    let mut env = lakefs.env();
    env.extend(otel_env(&receiver.http_endpoint(), "http/protobuf"));
    let _sup = SupervisorProc::start_owned(&task, &conductor, 1, &env);
    let id = conductor
        .start_with(
            &task,
            json!({"workspace": {"repository": "traced", "branch": "main", "prefix": "data/"}, "params": {}}),
        )
        .await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(60)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf}");
    let spans = receiver
        .wait_for(
            |spans| spans.iter().any(|s| s.name == "task"),
            Duration::from_secs(20),
        )
        .await;
    let root = one(&spans, "task");
    let trace = trace_of(&spans, root);
    let start_of = |name: &str| one(&trace, name).start_unix_nano;
    for name in [
        "workspace.download",
        "body",
        "workspace.stage",
        "workspace.merge",
    ] {
        assert_eq!(
            one(&trace, name).parent_span_id.as_deref(),
            Some(root.span_id.as_str()),
            "{name}"
        );
    }
    assert!(start_of("workspace.download") <= start_of("body"));
    assert!(start_of("body") <= start_of("workspace.stage"));
    assert!(start_of("workspace.stage") <= start_of("workspace.merge"));
    // The fence is read before staging and before publishing.
    let fences = named(&trace, "workspace.fence");
    assert!(fences.len() >= 2, "{trace:#?}");
    assert!(fences.iter().all(|f| f.status_code == 0));
}

/// A Python body with the official OpenTelemetry SDK continues the trace from `TRACEPARENT`
/// and exports its own span to the same collector (it inherits the OTLP endpoint).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bodys_own_opentelemetry_sdk_continues_the_attempts_trace() {
    let python = crate::harness::test_python();
    let receiver = OtlpReceiver::start().await;
    let conductor = Conductor::start().await;
    let script = r#"
import json, os, sys
sys.stdin.read()
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
provider = TracerProvider(resource=Resource.create({"service.name": "the-body"}))
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
carrier = {"traceparent": os.environ["TRACEPARENT"]}
parent = TraceContextTextMapPropagator().extract(carrier)
with provider.get_tracer("body").start_as_current_span("user.work", context=parent):
    pass
provider.shutdown()
print(json.dumps({"ok": True}))
"#;
    let body = format!(
        "exec '{}' \"$(dirname \"$0\")/body.py\"\n",
        python.display()
    );
    let task =
        TaskFixture::new("e2e.tracedpy", &body, "retry_count = 0").with_file("body.py", script);
    conductor.register(&task).await;
    let _sup = SupervisorProc::start_owned(
        &task,
        &conductor,
        1,
        &otel_env(&receiver.http_endpoint(), "http/protobuf"),
    );
    let id = conductor.start_workflow(&task, json!({})).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(60)).await;
    assert_eq!(
        wf["status"], "COMPLETED",
        "{}",
        wf["tasks"][0]["reasonForIncompletion"]
    );
    let spans = receiver
        .wait_for(
            |spans| {
                spans.iter().any(|s| s.name == "task")
                    && spans.iter().any(|s| s.name == "user.work")
            },
            Duration::from_secs(30),
        )
        .await;
    let body = one(&spans, "body");
    let work = one(&spans, "user.work");
    assert_eq!(work.trace_id, body.trace_id, "one trace");
    assert_eq!(work.parent_span_id.as_deref(), Some(body.span_id.as_str()));
    assert_eq!(work.resource["service.name"], "the-body");
}

/// A tracing setting that cannot be used stops `start` with the variable named (and a
/// header's value, a credential, not shown), before any broker runs.
#[test]
fn a_tracing_setting_that_cannot_be_used_refuses_start_naming_it() {
    let task = TaskFixture::new("e2e.badotel", "cat > /dev/null\necho '{}'\n", "");
    let root = tempfile::tempdir().unwrap();
    for (name, value, says) in [
        (
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "http/json",
            "OTEL_EXPORTER_OTLP_PROTOCOL=\"http/json\"",
        ),
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "x-api-key=s3cret%zz",
            "OTEL_EXPORTER_OTLP_HEADERS=\"(not shown)\"",
        ),
    ] {
        let run = perago_tests::Run::of(
            perago_tests::command(crate::harness::SUPERVISOR)
                .arg("start")
                .arg(task.manifest())
                .env("CONDUCTOR_SERVER_URL", "http://127.0.0.1:9")
                .env("PERAGO_WORKSPACE_ROOT", root.path().join("ws"))
                .env("PERAGO_LOG_ROOT", root.path().join("logs"))
                .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
                .env(name, value),
        );
        assert_ne!(run.code, Some(0), "{run}");
        assert!(
            run.stderr
                .contains("OpenTelemetry tracing is misconfigured"),
            "{run}"
        );
        assert!(run.stderr.contains(says), "{run}");
        assert!(!run.stderr.contains("s3cret"), "{run}");
    }
}
