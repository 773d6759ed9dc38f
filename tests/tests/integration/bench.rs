//! The benchmark keeps working: a smoke run with tiny counts (no figure is judged here; the
//! targets are checked by reading a real run, see docs/performance.md).

use perago_tests::{Run, command, workspace_root};

#[test]
fn the_benchmark_smoke_run_measures_every_scenario() {
    let out_dir = tempfile::tempdir().unwrap();
    let out = Run::of(
        command(env!("CARGO_BIN_EXE_perago-bench-dup"))
            .arg("--smoke")
            .args(["--out", out_dir.path().to_str().unwrap()])
            .args(["--supervisor", env!("CARGO_BIN_EXE_perago-supervisor-dup")])
            .args(["--broker", env!("CARGO_BIN_EXE_perago-broker-dup")])
            .args(["--executor", env!("CARGO_BIN_EXE_perago-executor-dup")])
            .args(["--task", env!("CARGO_BIN_EXE_perago-bench-task-dup")])
            .current_dir(workspace_root()),
    );
    out.expect_code(0);
    for figure in [
        "ceiling: poll+update client",
        "perago rust body j=2",
        "perago exec body j=4",
        "perago jsonl python body j=2",
        "conductor-python j=4",
        "ratio perago rust / python j=2",
        "schedule-to-start p50 perago",
        "slot round trip p50",
        "raw unix socket ping-pong p50",
        "rss broker idle",
        "rss anonymous executor idle (max)",
        "cpu/task Conductor client alone (ceiling client's thread)",
        "cpu/task runtime less the Conductor client, perago rust body j=2",
        "rss python process under load (mean)",
        "start-up to all slots attached j=2",
        "scaling perago rust body j=2",
        "perago workspace task (10 files in, 1 published) j=2",
        "perago workspace task (10 gateway-checksum files in, 1 published) j=2",
        "uploads/task, workspace task (10 gateway-checksum files in, 1 published)",
        "cpu/task broker, perago jsonl python body j=2",
        "cpu/task executors, perago exec body j=4",
        "cpu/task bodies, perago jsonl python body j=4",
        "cpu/task supervisor, perago rust body j=2",
        "cpu/task runtime (broker+executors+supervisor), perago jsonl python body j=2",
        "cpu/task whole worker side, conductor-python j=2",
        "cpu/task whole worker side, conductor-python j=2 1MiB",
        "perago jsonl python body j=2 64KiB",
        "perago rust body j=2 RUST_LOG=warn",
        "cpu/task bare spawn loop (cat), spawner",
        "cpu/task bare spawn loop forking (cat), spawner",
        "schedule-to-start p50 perago j=4 fill-or-timeout",
        "schedule-to-start p99 perago j=4 immediate",
        "full queue, perago rust body j=4 fill-or-timeout",
    ] {
        assert!(out.stdout.contains(figure), "{figure} missing\n{out}");
    }
    let results: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out_dir.path().join("results.json")).unwrap(),
    )
    .unwrap();
    for f in results["figures"].as_array().unwrap() {
        let median = f["median"].as_f64().unwrap_or(f64::NAN);
        assert!(median.is_finite() && median >= 0.0, "{f}");
    }
    let svg = std::fs::read_to_string(out_dir.path().join("scaling.svg")).unwrap();
    assert!(svg.contains("<polyline"));
}
