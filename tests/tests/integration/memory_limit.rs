//! `body.memory_limit` end to end (issue #27 item 4): each body runs in a memory cgroup of its
//! own, so a body that allocates past its limit is OOM-killed by the kernel and its task FAILED
//! with that reason, while the runtime (supervisor, broker, executor) goes on: the next task
//! on the same runtime completes, and the body's cgroup is gone afterwards.
//!
//! Needs a writable memory cgroup (this project's machines and CI: root with cgroup v1); where
//! none can be made the test fails saying so: `start` refuses the manifest.

use crate::harness::{Conductor, SupervisorProc, TaskFixture, status_json};
use serde_json::json;
use std::{path::PathBuf, time::Duration};

/// `{"big": true}`: dd fills one 256 MiB buffer (every page touched), far past the 64 MiB
/// limit; otherwise a small result. The body's cgroup line goes to stderr, so the reason's
/// tail (and the log) name it.
const BODY: &str = "input=$(cat)\n\
                    grep -E '(^[0-9]+:memory:|^0::)' /proc/self/cgroup >&2\n\
                    case \"$input\" in *big*) dd if=/dev/zero of=/dev/null bs=256M count=1 2>/dev/null || exit 3;; esac\n\
                    echo '{\"small\": true}'\n";

/// The `perago-body-…` cgroup a body's stderr named.
fn cgroup_named(text: &str) -> Option<String> {
    text.split(['/', '\n', ' ', '"'])
        .find(|part| part.starts_with("perago-body-"))
        .map(str::to_owned)
}

/// Where the body cgroups of a runtime run by this test process go: this process's memory
/// cgroup (the supervisor's too: it is our child).
fn body_parent() -> PathBuf {
    perago_sys::cgroup::locate()
        .unwrap_or_else(|e| panic!("this test needs a writable memory cgroup: {e}"))
        .body_parent()
}

async fn oom_then_complete(mode: &str) {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("e2e.memlimit", BODY, "retry_count = 0")
        .with_manifest_tail("memory_limit = \"64MiB\"\n");
    conductor.register(&task).await;
    let sup = SupervisorProc::start(
        &task,
        &conductor,
        1,
        &[
            ("PERAGO_EXECUTION_MODE", mode),
            ("PERAGO_METRICS_ADDR", "127.0.0.1:0"),
        ],
    );

    let big = conductor.start_workflow(&task, json!({"big": true})).await;
    let wf = conductor.wait_terminal(&big, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "FAILED", "{mode}: {wf:#}\n{}", sup.log_text());
    let reason = wf["tasks"][0]["reasonForIncompletion"]
        .as_str()
        .unwrap_or_default();
    assert!(
        reason.starts_with("OOM-killed at ")
            && reason.contains(" MiB (limit 64 MiB)")
            // Counted toward poison detection, as a crash is.
            && reason.ends_with(
                "; crash 1 of 3 counted against this workflow task (PERAGO_POISON_AFTER=3)"
            ),
        "{mode}: {reason}\n{}",
        sup.log_text()
    );
    let status = status_json(&sup.workspace_root());
    let broker_pid = status["broker_pid"].clone();
    assert!(broker_pid.is_number(), "{mode}: {status:#}");
    // The slot shows the body's peak: at its limit.
    let peak = status["slots"][0]["last_body_peak_memory_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("{mode}: no peak shown: {status:#}"));
    assert!(peak > 48 << 20 && peak <= 64 << 20, "{mode}: {peak}");

    let small = conductor.start_workflow(&task, json!({})).await;
    let wf = conductor
        .wait_terminal(&small, Duration::from_secs(30))
        .await;
    assert_eq!(
        wf["status"],
        "COMPLETED",
        "{mode}: {wf:#}\n{}",
        sup.log_text()
    );
    assert_eq!(wf["output"]["result"], json!({"small": true}), "{mode}");

    // The runtime was not touched: the same broker, its supervisor alive, no executor killed.
    let after = status_json(&sup.workspace_root());
    assert_eq!(after["broker_pid"], broker_pid, "{mode}: {after:#}");
    let slot = &after["slots"][0];
    let last = slot["last_body_peak_memory_bytes"]
        .as_u64()
        .unwrap_or_default();
    assert!(
        last > 0 && last < peak,
        "{mode}: the small body's own peak: {slot:#}"
    );
    assert_eq!(slot["max_body_peak_memory_bytes"], peak, "{mode}: {slot:#}");
    assert!(
        std::path::Path::new(&format!("/proc/{}", sup.pid())).exists(),
        "{mode}: the supervisor is gone"
    );
    assert_eq!(
        after["slots"][0]["generation"], 1,
        "{mode}: the executor was not replaced: {after:#}"
    );
    // The runtime itself is outside every body cgroup.
    let own = std::fs::read_to_string(format!("/proc/{}/cgroup", sup.pid())).unwrap();
    assert!(cgroup_named(&own).is_none(), "{mode}: {own}");

    // /metrics: the OOM kill, and both bodies' peaks.
    let log = sup.log_text();
    let url = log
        .split("metrics served at ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("{mode}: no metrics address in the log\n{log}"));
    let out = std::process::Command::new("curl")
        .args(["-sf", url])
        .output()
        .unwrap();
    let metrics = String::from_utf8_lossy(&out.stdout);
    for line in [
        "perago_body_oom_kills_total{task=\"e2e.memlimit\"} 1\n",
        "perago_body_peak_memory_bytes_count{task=\"e2e.memlimit\"} 2\n",
    ] {
        assert!(metrics.contains(line), "{mode}: {line} missing\n{metrics}");
    }

    // Each body had a cgroup of its own, removed once it ended.
    let failed = cgroup_named(reason).unwrap_or_else(|| panic!("{mode}: {reason}"));
    let log = sup.log_text();
    let completed = log
        .lines()
        .filter(|l| l.contains("perago-body-"))
        .filter_map(cgroup_named)
        .find(|name| *name != failed)
        .unwrap_or_else(|| panic!("{mode}: the second body's cgroup is not logged\n{log}"));
    let parent = body_parent();
    for name in [&failed, &completed] {
        assert!(
            !parent.join(name).exists(),
            "{mode}: {} is still there",
            parent.join(name).display()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_past_its_memory_limit_fails_oom_killed_and_the_next_task_completes() {
    oom_then_complete("process").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_past_its_memory_limit_fails_oom_killed_in_thread_mode_too() {
    oom_then_complete("thread").await;
}

fn check_as(task: &TaskFixture, user: Option<u32>) -> perago_tests::Run {
    let mut cmd = match user {
        Some(uid) => {
            let mut cmd = perago_tests::command("setpriv");
            cmd.args([
                format!("--reuid={uid}"),
                format!("--regid={uid}"),
                "--clear-groups".to_owned(),
                crate::harness::SUPERVISOR.to_owned(),
            ]);
            cmd
        }
        None => perago_tests::command(crate::harness::SUPERVISOR),
    };
    cmd.args(["check", task.manifest().to_str().unwrap()]);
    perago_tests::Run::of(&mut cmd)
}

#[test]
fn check_shows_the_limit_and_check_and_start_refuse_it_where_no_cgroup_can_be_made() {
    use std::os::unix::fs::PermissionsExt as _;
    let task =
        TaskFixture::new("e2e.memcheck", BODY, "").with_manifest_tail("memory_limit = \"2GiB\"\n");
    let ok = check_as(&task, None);
    ok.expect_code(0);
    assert!(
        ok.stdout.contains(&format!(
            "  memory limit: 2GiB per body (a memory cgroup of its own below {}, cgroup v",
            body_parent().display()
        )),
        "{ok}"
    );
    // An unprivileged user cannot make cgroups in root's (no delegation): a clear refusal
    // that names what would make it work, not a silent run without a limit.
    std::fs::set_permissions(task.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let refused = check_as(&task, Some(65534));
    refused.expect_code(1);
    assert!(
        refused
            .stderr
            .contains(": body.memory_limit needs a writable memory cgroup, and ")
            && refused.stderr.contains("run perago as root")
            && refused.stderr.contains("Delegate=yes"),
        "{refused}"
    );
    // `start` refuses it too, before anything starts (no Conductor is asked: the address is
    // closed).
    let root = tempfile::tempdir().unwrap();
    let mut start = perago_tests::command("setpriv");
    start
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            crate::harness::SUPERVISOR,
            "start",
            task.manifest().to_str().unwrap(),
        ])
        .env("CONDUCTOR_SERVER_URL", "http://127.0.0.1:1/api")
        .env("PERAGO_WORKSPACE_ROOT", root.path());
    let started = perago_tests::Run::of(&mut start);
    started.expect_code(1);
    assert!(
        started
            .stderr
            .contains("task.toml: body.memory_limit needs a writable memory cgroup, and ")
            && started.stderr.contains("run perago as root"),
        "{started}"
    );
}

/// A `jsonl` body: one process for many tasks, in one cgroup for its life; `big` makes it fill
/// 256 MiB (dd, OOM-killed), and the shell then exits.
const JSONL_BODY: &str = r#"while IFS= read -r line; do
  id=$(printf '%s' "$line" | sed 's/.*"execution_id": *"\([^"]*\)".*/\1/')
  case "$line" in *big*) dd if=/dev/zero of=/dev/null bs=256M count=1 2>/dev/null || exit 3;; esac
  printf '{"execution_id": "%s", "result": {"small": true}}\n' "$id"
done
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jsonl_body_past_its_memory_limit_fails_that_task_and_a_fresh_process_takes_the_next() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("e2e.memjsonl", JSONL_BODY, "retry_count = 0")
        .with_manifest_tail("protocol = \"jsonl\"\nmemory_limit = \"64MiB\"\n");
    conductor.register(&task).await;
    let sup = SupervisorProc::start(&task, &conductor, 1, &[]);
    let first = conductor.start_workflow(&task, json!({})).await;
    let wf = conductor
        .wait_terminal(&first, Duration::from_secs(30))
        .await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
    let big = conductor.start_workflow(&task, json!({"big": true})).await;
    let wf = conductor.wait_terminal(&big, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "FAILED", "{wf:#}\n{}", sup.log_text());
    let reason = wf["tasks"][0]["reasonForIncompletion"]
        .as_str()
        .unwrap_or_default();
    assert!(
        reason.starts_with("OOM-killed at ")
            && reason.contains(" MiB (limit 64 MiB): body process exited (exit status: 3)"),
        "{reason}"
    );
    let next = conductor.start_workflow(&task, json!({})).await;
    let wf = conductor
        .wait_terminal(&next, Duration::from_secs(30))
        .await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
    let status = status_json(&sup.workspace_root());
    assert_eq!(status["slots"][0]["generation"], 1, "{status:#}");
    // The runtime stops: the executor leaves with its body still running, and takes the
    // body's cgroup with it.
    let executor = status["slots"][0]["pid"].as_u64().unwrap();
    let mut sup = sup;
    sup.signal("TERM");
    let exit = sup.wait_exit(Duration::from_secs(20)).await;
    assert!(exit.success(), "{exit:?}\n{}", sup.log_text());
    let left: Vec<_> = std::fs::read_dir(body_parent())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with(&format!("perago-body-{executor}-")))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// An executor SIGKILLed while its body runs leaves the body's cgroup behind (its body dies
/// of its parent-death signal, but nobody is left to remove the cgroup); the replacement
/// executor removes it when it starts, its maker being gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cgroup_of_a_sigkilled_executor_is_removed_when_the_next_one_starts() {
    use crate::harness::{eventually, gated_body, signal_pid};
    let conductor = Conductor::start().await;
    let body = format!(
        "grep -E '(^[0-9]+:memory:|^0::)' /proc/self/cgroup > cgroup.txt\n{}",
        gated_body("echo '{}'\n")
    );
    let task = TaskFixture::new("e2e.memstale", &body, "retry_count = 0")
        .with_manifest_tail("memory_limit = \"64MiB\"\n");
    conductor.register(&task).await;
    let sup = SupervisorProc::start(&task, &conductor, 1, &[]);
    conductor.start_workflow(&task, json!({})).await;
    task.gate().started().await;
    let written = std::fs::read_to_string(task.dir.path().join("cgroup.txt")).unwrap();
    let name = cgroup_named(&written).unwrap_or_else(|| panic!("{written}"));
    let dir = body_parent().join(&name);
    assert!(dir.exists(), "{}", dir.display());
    let status = status_json(&sup.workspace_root());
    let executor = status["slots"][0]["pid"].as_u64().unwrap();
    assert!(
        name.starts_with(&format!("perago-body-{executor}-")),
        "{name}"
    );
    signal_pid(executor as u32, "KILL");
    eventually(
        "the replacement executor to remove the stale cgroup",
        Duration::from_secs(20),
        || async { (!dir.exists()).then_some(()) },
    )
    .await;
    let status = status_json(&sup.workspace_root());
    assert!(
        status["slots"][0]["generation"].as_u64() >= Some(2),
        "{status:#}\n{}",
        sup.log_text()
    );
    sup.log_with(
        "removed the body memory cgroups a runtime that is gone left behind",
        Duration::from_secs(5),
    )
    .await;
}
