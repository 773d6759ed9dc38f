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
