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
fn the_systemd_unit_lets_a_drain_finish() {
    let unit = fs::read_to_string(workspace_root().join("deploy/systemd/perago@.service")).unwrap();
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
fn the_kubernetes_sidecar_shares_the_workspace_and_outlives_the_drain() {
    let pod = fs::read_to_string(workspace_root().join("deploy/kubernetes/sidecar.yaml")).unwrap();
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
    // The probes ask the health service through `status --probe`, for this task's manifest.
    for (probe, kind) in [
        ("startupProbe:", "live"),
        ("livenessProbe:", "live"),
        ("readinessProbe:", "ready"),
    ] {
        let at = lines
            .iter()
            .position(|l| *l == probe)
            .unwrap_or_else(|| panic!("no {probe}"));
        let command = lines[at + 2];
        assert_eq!(
            command,
            format!(
                "command: [\"perago-supervisor\", \"status\", \"--probe\", \"{kind}\", \"/etc/perago/task.toml\"]"
            ),
            "{probe}"
        );
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
