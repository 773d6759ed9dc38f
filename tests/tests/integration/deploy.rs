//! The deployment examples stay consistent with the runtime: stop timeouts above the force-kill
//! deadline, the signal to the supervisor only, the shared workspace mounted where perago looks;
//! and the shell completions generate.

use perago_core::units::parse_duration;
use perago_tests::{Run, command, workspace_root};
use std::{fs, time::Duration};

fn value_after<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix(key))
        .map(str::trim)
}

#[test]
fn the_systemd_units_let_a_drain_finish() {
    for file in ["perago@.service", "perago-tasks.service"] {
        systemd_unit_lets_a_drain_finish(file);
    }
    // The multi-task unit runs several manifests under one supervisor.
    let unit =
        fs::read_to_string(workspace_root().join("deploy/systemd/perago-tasks.service")).unwrap();
    let exec = value_after(&unit, "ExecStart=").unwrap();
    assert_eq!(exec.matches("task.toml").count(), 2, "{exec}");
    assert!(exec.contains(" -j examples.greet=1..8"), "{exec}");
}

fn systemd_unit_lets_a_drain_finish(file: &str) {
    let unit = fs::read_to_string(workspace_root().join("deploy/systemd").join(file)).unwrap();
    assert_eq!(value_after(&unit, "KillMode="), Some("mixed"));
    assert_eq!(value_after(&unit, "KillSignal="), Some("SIGTERM"));
    let stop = parse_duration(value_after(&unit, "TimeoutStopSec=").unwrap()).unwrap();
    let force = parse_duration(
        value_after(&unit, "Environment=PERAGO_SHUTDOWN_FORCE_KILL_AFTER=").unwrap(),
    )
    .unwrap();
    assert!(
        stop > force + Duration::from_secs(2),
        "{stop:?} vs {force:?}"
    );
    assert_eq!(value_after(&unit, "Type="), Some("notify"));
    assert_eq!(value_after(&unit, "NotifyAccess="), Some("main"));
    assert!(parse_duration(value_after(&unit, "WatchdogSec=").unwrap()).is_ok());
    let exec = value_after(&unit, "ExecStart=").unwrap();
    assert!(exec.contains("perago-supervisor start "), "{exec}");
}

#[test]
fn the_kubernetes_sidecars_share_the_workspace_and_outlive_the_drain() {
    for file in ["sidecar.yaml", "sidecar-tasks.yaml"] {
        sidecar_shares_the_workspace_and_outlives_the_drain(file);
    }
}

fn sidecar_shares_the_workspace_and_outlives_the_drain(file: &str) {
    let pod = fs::read_to_string(workspace_root().join("deploy/kubernetes").join(file)).unwrap();
    let grace: u64 = value_after(&pod, "terminationGracePeriodSeconds:")
        .unwrap()
        .parse()
        .unwrap();
    let lines: Vec<&str> = pod.lines().map(str::trim).collect();
    let env = |name: &str| {
        let at = lines
            .iter()
            .position(|l| *l == format!("- name: {name}"))
            .unwrap_or_else(|| panic!("{name} is not set"));
        lines[at + 1].trim_start_matches("value:").trim().to_owned()
    };
    let force = parse_duration(&env("PERAGO_SHUTDOWN_FORCE_KILL_AFTER")).unwrap();
    assert!(Duration::from_secs(grace) > force + Duration::from_secs(2));
    let root = env("PERAGO_WORKSPACE_ROOT");
    let mounts = lines
        .iter()
        .filter(|l| **l == format!("mountPath: {root}"))
        .count();
    assert_eq!(
        mounts, 2,
        "the app and perago both mount the workspace at {root}"
    );
    // The probes ask the health service through `status --probe`, for every manifest the
    // container starts.
    let args: Vec<String> =
        serde_json::from_str(value_after(&pod, "args:").expect("the container's args")).unwrap();
    assert_eq!(args[0], "start", "{file}");
    let manifests: Vec<&String> = args.iter().filter(|a| a.ends_with(".toml")).collect();
    assert!(!manifests.is_empty(), "{file}");
    for (probe, kind) in [
        ("startupProbe:", "live"),
        ("livenessProbe:", "live"),
        ("readinessProbe:", "ready"),
    ] {
        let at = lines
            .iter()
            .position(|l| *l == probe)
            .unwrap_or_else(|| panic!("no {probe}"));
        let command: Vec<String> = serde_json::from_str(
            lines[at + 2]
                .strip_prefix("command:")
                .unwrap_or_else(|| panic!("{file}: {probe} has no command")),
        )
        .unwrap();
        let mut want = vec!["perago-supervisor", "status", "--probe", kind];
        want.extend(manifests.iter().map(|m| m.as_str()));
        assert_eq!(command, want, "{file}: {probe}");
    }
}

#[test]
fn shell_completions_generate() {
    for shell in ["bash", "zsh", "fish"] {
        let out = Run::of(
            command(env!("CARGO_BIN_EXE_perago-supervisor-dup")).args(["completions", shell]),
        );
        out.expect_code(0);
        for word in ["check", "extract", "start", "status", "dev"] {
            assert!(out.stdout.contains(word), "{shell}: {word} missing");
        }
    }
    let bad =
        Run::of(command(env!("CARGO_BIN_EXE_perago-supervisor-dup")).args(["completions", "tcsh"]));
    bad.expect_code(2);
}

/// The rest of the line after `key` (which may span lines, with their indentation).
fn after<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let rest = &text[text.find(key)? + key.len()..];
    Some(rest.lines().next().unwrap_or_default().trim())
}

/// The documents of a YAML file (`---` between them), each checked for what a Kubernetes
/// schema needs of these examples: an apiVersion and kind perago's examples use, a name, no
/// tab, two-space indentation.
fn documents(file: &str) -> Vec<String> {
    let text = fs::read_to_string(workspace_root().join("deploy/kubernetes").join(file)).unwrap();
    let docs: Vec<String> = text.split("\n---\n").map(str::to_owned).collect();
    for doc in &docs {
        assert!(!doc.contains('\t'), "{file}: a tab");
        for line in doc.lines().filter(|l| !l.trim().is_empty()) {
            let indent = line.len() - line.trim_start().len();
            assert_eq!(indent % 2, 0, "{file}: {line:?}");
        }
        let kind = (top(doc, "apiVersion"), top(doc, "kind"));
        assert!(
            matches!(
                kind,
                (Some("apps/v1"), Some("Deployment"))
                    | (Some("v1"), Some("Service"))
                    | (Some("keda.sh/v1alpha1"), Some("ScaledObject" | "ScaledJob"))
            ),
            "{file}: {kind:?}"
        );
        assert!(doc.contains("\nmetadata:\n  name: "), "{file}: no name");
    }
    docs
}

/// A top-level key's value.
fn top<'a>(doc: &'a str, key: &str) -> Option<&'a str> {
    doc.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}: ")))
        .map(str::trim)
}

fn name_of(doc: &str) -> &str {
    after(doc, "\nmetadata:\n  name:").unwrap()
}

fn kind_of<'a>(docs: &'a [String], kind: &str) -> Vec<&'a String> {
    docs.iter()
        .filter(|d| top(d, "kind") == Some(kind))
        .collect()
}

/// An external trigger's metadata: every value a string (KEDA's schema is a string map, so a
/// bare `4` is refused), naming a scaler Service of `services` by name and port, a task type
/// and a positive targetPerPod.
fn check_external_trigger(file: &str, doc: &str, services: &[(String, String)]) {
    assert!(
        doc.contains("\n    - type: external\n"),
        "{file}: no external trigger"
    );
    let metadata = &doc[doc.find("\n      metadata:\n").expect("trigger metadata")..];
    let value = |key: &str| -> String {
        let raw =
            value_after(metadata, &format!("{key}:")).unwrap_or_else(|| panic!("{file}: no {key}"));
        assert!(
            raw.parse::<f64>().is_err(),
            "{file}: {key}: {raw} must be a string (quote it)"
        );
        raw.trim_matches('"').to_owned()
    };
    let address = value("scalerAddress");
    assert!(
        services
            .iter()
            .any(|(name, port)| address == format!("{name}:{port}")),
        "{file}: scalerAddress {address} is no scaler Service of {services:?}"
    );
    assert!(!value("taskType").is_empty());
    let target: u64 = value("targetPerPod").parse().unwrap();
    assert!(target > 0);
}

#[test]
fn the_keda_examples_scale_the_sidecars_on_the_scaler() {
    let docs = documents("keda-scaledobject.yaml");
    // The scaler: `perago-supervisor scaler --listen` on the port its Service serves.
    let deployments = kind_of(&docs, "Deployment");
    let scaler = deployments
        .iter()
        .find(|d| d.contains("args: [\"scaler\""))
        .expect("a scaler Deployment");
    let args: Vec<String> = serde_json::from_str(value_after(scaler, "args:").unwrap()).unwrap();
    let listen = &args[args.iter().position(|a| a == "--listen").unwrap() + 1];
    let port = listen.rsplit(':').next().unwrap().to_owned();
    let services: Vec<(String, String)> = kind_of(&docs, "Service")
        .iter()
        .map(|s| {
            (
                name_of(s).to_owned(),
                value_after(s, "port:").unwrap().to_owned(),
            )
        })
        .collect();
    assert!(
        services.iter().any(|(_, p)| *p == port),
        "{services:?} vs {listen}"
    );
    let label = after(scaler, "labels:\n        app:").unwrap();
    for service in kind_of(&docs, "Service") {
        assert_eq!(after(service, "selector:\n    app:"), Some(label));
    }
    // The ScaledObject scales the Deployment of sidecars, which drains within its grace.
    let [scaled] = kind_of(&docs, "ScaledObject")[..] else {
        panic!("one ScaledObject")
    };
    let target = after(scaled, "scaleTargetRef:\n    name:").unwrap();
    let sidecars = deployments
        .iter()
        .find(|d| name_of(d) == target)
        .unwrap_or_else(|| panic!("no Deployment {target}"));
    let args: Vec<String> = serde_json::from_str(value_after(sidecars, "args:").unwrap()).unwrap();
    assert_eq!(args[0], "start");
    let grace: u64 = value_after(sidecars, "terminationGracePeriodSeconds:")
        .unwrap()
        .parse()
        .unwrap();
    let force = parse_duration(
        after(
            sidecars,
            "- name: PERAGO_SHUTDOWN_FORCE_KILL_AFTER\n              value:",
        )
        .unwrap(),
    )
    .unwrap();
    assert!(Duration::from_secs(grace) > force + Duration::from_secs(2));
    check_external_trigger("keda-scaledobject.yaml", scaled, &services);

    // The ScaledJob: Jobs of `start --once`, asking the same scaler.
    let docs = documents("keda-scaledjob.yaml");
    let [job] = kind_of(&docs, "ScaledJob")[..] else {
        panic!("one ScaledJob")
    };
    let args: Vec<String> = serde_json::from_str(value_after(job, "args:").unwrap()).unwrap();
    assert_eq!(args[0], "start");
    assert!(args.iter().any(|a| a == "--once"), "{args:?}");
    assert!(
        matches!(
            value_after(job, "restartPolicy:"),
            Some("Never" | "OnFailure")
        ),
        "a Job's pods restart Never or OnFailure"
    );
    check_external_trigger("keda-scaledjob.yaml", job, &services);
}
