//! The merged `/metrics` of a supervisor running several task types: several brokers'
//! expositions merged into one (`perago_core::metrics_text::merge_expositions`) are read by
//! Prometheus's own Python parsers as one exposition, every family once with the samples of
//! every broker.

use perago_tests::workspace_root;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram, info::Info},
    registry::{Registry, Unit},
};
use serde_json::Value;
use std::{path::PathBuf, process::Command};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    status: String,
}

/// A registry shaped like a broker's: a `perago_*` part labelled `task` and an SDK part
/// labelled `taskType`, with counters (one by label), a histogram with a unit, a gauge and an
/// info.
fn registry(task: &str, polls: u64) -> Registry {
    let mut root = Registry::default();
    let perago = root.sub_registry_with_label(("task".into(), task.to_owned().into()));
    let counter: Counter = Counter::default();
    counter.inc_by(polls);
    perago.register("perago_polls", "Poll requests sent to Conductor", counter);
    let duration = Histogram::new([0.1, 1.0, 10.0]);
    duration.observe(0.5);
    perago.register_with_unit(
        "perago_task_duration",
        "Time from dispatch to completion",
        Unit::Seconds,
        duration,
    );
    let busy: Gauge = Gauge::default();
    busy.set(1);
    perago.register("perago_busy_slots", "Slots running an assignment", busy);
    perago.register(
        "perago_build",
        "The broker's build",
        Info::new(vec![("version".to_owned(), "0.1".to_owned())]),
    );
    let sdk = root.sub_registry_with_label(("taskType".into(), task.to_owned().into()));
    let time = Family::<Outcome, Histogram>::new_with_constructor(|| Histogram::new([0.1, 1.0]));
    time.get_or_create(&Outcome {
        status: "SUCCESS".into(),
    })
    .observe(0.02);
    sdk.register("task_poll_time_seconds", "Poll request latency", time);
    let poll: Counter = Counter::default();
    poll.inc_by(polls);
    sdk.register("task_poll", "Poll requests issued to the server", poll);
    root
}

/// `texts` merged, then parsed by `module`'s `text_string_to_metric_families`: family name →
/// (type, samples as `name{labels}` strings).
fn parse_merged(texts: &[String], module: &str) -> (String, Vec<(String, String, Vec<String>)>) {
    let merged = perago_core::metrics_text::merge_expositions(texts);
    let python = std::env::var_os("PERAGO_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".venv/bin/python"));
    let script = format!(
        "import json, sys\nfrom {module} import text_string_to_metric_families as p\n\
         print(json.dumps([[f.name, f.type, [s.name + json.dumps(s.labels, sort_keys=True) for s in f.samples]] for f in p(sys.stdin.read())]))"
    );
    let parsed = Command::new(python)
        .args(["-c", &script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write as _;
            child.stdin.take().unwrap().write_all(merged.as_bytes())?;
            child.wait_with_output()
        })
        .unwrap();
    assert!(
        parsed.status.success(),
        "{module} refused the merge: {}\n{merged}",
        String::from_utf8_lossy(&parsed.stderr)
    );
    let families: Value = serde_json::from_slice(&parsed.stdout).unwrap();
    let families = families
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f[0].as_str().unwrap().to_owned(),
                f[1].as_str().unwrap().to_owned(),
                f[2].as_array()
                    .unwrap()
                    .iter()
                    .map(|s| s.as_str().unwrap().to_owned())
                    .collect(),
            )
        })
        .collect();
    (merged, families)
}

/// Every family once, in order, each with `alpha`'s and `beta`'s samples.
fn assert_every_family_once_with_both(
    merged: &str,
    families: &[(String, String, Vec<String>)],
    expected: &[(&str, &str)],
) {
    let got: Vec<(&str, &str)> = families
        .iter()
        .map(|(name, kind, _)| (name.as_str(), kind.as_str()))
        .collect();
    assert_eq!(got, expected, "{merged}");
    for (name, _, samples) in families {
        for task in ["alpha", "beta"] {
            assert!(
                samples.iter().any(|s| s.contains(&format!("\"{task}\""))),
                "{name} has no sample of {task}: {samples:?}\n{merged}"
            );
        }
    }
}

fn encode(registry: &Registry, openmetrics: bool) -> String {
    let mut out = String::new();
    if openmetrics {
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
    } else {
        prometheus_client::encoding::prometheus_text::encode(&mut out, registry).unwrap();
    }
    out
}

/// The brokers' own format, Prometheus text 0.0.4, read by `prometheus_client.parser`.
#[test]
fn merged_prometheus_text_parses_with_every_family_once() {
    let texts = [
        encode(&registry("alpha", 3), false),
        encode(&registry("beta", 5), false),
    ];
    let (merged, families) = parse_merged(&texts, "prometheus_client.parser");
    assert_every_family_once_with_both(
        &merged,
        &families,
        &[
            ("perago_polls", "counter"),
            ("perago_task_duration_seconds", "histogram"),
            ("perago_busy_slots", "gauge"),
            ("perago_build_info", "gauge"),
            ("task_poll_time_seconds", "histogram"),
            ("task_poll", "counter"),
        ],
    );
    let polls = &families[0].2;
    assert_eq!(
        polls,
        &[
            r#"perago_polls_total{"task": "alpha"}"#,
            r#"perago_polls_total{"task": "beta"}"#
        ]
    );
    let (empty, none) = parse_merged(&[], "prometheus_client.parser");
    assert_eq!((empty.as_str(), none.len()), ("# EOF\n", 0));
}

/// OpenMetrics text (`# UNIT`, `_created`, `# EOF`), read by the strict
/// `prometheus_client.openmetrics.parser`, which refuses a family announced twice and
/// anything after `# EOF`.
#[test]
fn merged_openmetrics_parses_with_every_family_once() {
    let texts = [
        encode(&registry("alpha", 3), true),
        encode(&registry("beta", 5), true),
    ];
    let (merged, families) = parse_merged(&texts, "prometheus_client.openmetrics.parser");
    assert_every_family_once_with_both(
        &merged,
        &families,
        &[
            ("perago_polls", "counter"),
            ("perago_task_duration_seconds", "histogram"),
            ("perago_busy_slots", "gauge"),
            ("perago_build", "info"),
            ("task_poll_time_seconds", "histogram"),
            ("task_poll", "counter"),
        ],
    );
    // Without the merge (the texts one after the other) the strict parser refuses it.
    let python = std::env::var_os("PERAGO_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".venv/bin/python"));
    let concatenated = Command::new(python)
        .args([
            "-c",
            "import sys\nfrom prometheus_client.openmetrics.parser import text_string_to_metric_families as p\nlist(p(sys.argv[1]))",
            &texts.concat(),
        ])
        .output()
        .unwrap();
    assert!(!concatenated.status.success());
    let (empty, none) = parse_merged(&[], "prometheus_client.openmetrics.parser");
    assert_eq!((empty.as_str(), none.len()), ("# EOF\n", 0));
}
