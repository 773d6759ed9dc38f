//! Hostile tasks end to end: one bad task harms nothing else in its batch.

use crate::harness::{Conductor, SupervisorProc, TaskFixture};
use serde_json::{Value, json};
use std::time::Duration;

/// `depth` levels of arrays around a 1.
fn nested(depth: usize) -> Value {
    let mut v = json!(1);
    for _ in 0..depth {
        v = json!([v]);
    }
    v
}

fn depth_of(mut v: &Value) -> usize {
    let mut depth = 0;
    while let Some(inner) = v.as_array().and_then(|a| a.first()) {
        depth += 1;
        v = inner;
    }
    depth
}

/// Conductor accepts input nested up to 1,000 levels; serde_json alone stops at 128, which
/// made the whole batch-poll answer undecodable (its healthy batch-mates timed out). Now the
/// deep task runs like the others, and all four come back in one batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deeply_nested_input_runs_and_its_batch_mates_too() {
    for mode in ["process", "thread"] {
        deep_input_in(mode).await;
    }
}

async fn deep_input_in(mode: &str) {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("e2e.deep", "cat\n", "");
    conductor.register(&task).await;
    let deep = conductor
        .start_workflow(&task, json!({"deep": nested(900)}))
        .await;
    let mut others = Vec::new();
    for n in 0..3 {
        others.push(conductor.start_workflow(&task, json!({"n": n})).await);
    }
    // Started after the workflows, so its first batch poll takes all four.
    let _sup = SupervisorProc::start(&task, &conductor, 4, &[("PERAGO_EXECUTION_MODE", mode)]);
    let wf = conductor
        .wait_terminal(&deep, Duration::from_secs(30))
        .await;
    assert_eq!(
        wf["status"], "COMPLETED",
        "{mode}: {}",
        wf["tasks"][0]["reasonForIncompletion"]
    );
    assert_eq!(depth_of(&wf["output"]["result"]["deep"]), 900, "{mode}");
    for id in others {
        let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
        assert_eq!(wf["status"], "COMPLETED");
        assert_eq!(wf["tasks"].as_array().unwrap().len(), 1, "no retry needed");
    }
}

/// A body gets the per-task variables and its manifest's `body.env`, never the runtime's:
/// not the slot token or socket (with them it could pose as its executor to the broker), not
/// the Conductor or lakeFS configuration. In both execution modes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_sees_none_of_the_runtimes_variables() {
    for mode in ["process", "thread"] {
        let conductor = Conductor::start().await;
        let dump = tempfile::tempdir().unwrap();
        let task = TaskFixture::new(
            "e2e.envdump",
            "env > \"$DUMP/$PERAGO_EXECUTION_ID.env\"\necho '{}'\n",
            "",
        )
        .with_manifest_tail(&format!(
            "env = {{ DUMP = \"{}\" }}\n",
            dump.path().display()
        ));
        conductor.register(&task).await;
        let sup = SupervisorProc::start(
            &task,
            &conductor,
            1,
            &[
                ("PERAGO_EXECUTION_MODE", mode),
                ("LAKEFS_SECRET_ACCESS_KEY", "lakefs-secret-value"),
                ("CONDUCTOR_AUTH_KEY", "conductor-key"),
                ("CONDUCTOR_AUTH_SECRET", "conductor-secret-value"),
            ],
        );
        let id = conductor.start_workflow(&task, json!({})).await;
        let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
        assert_eq!(
            wf["status"],
            "COMPLETED",
            "{mode}: {wf}\n{}",
            sup.log_text()
        );
        let file = std::fs::read_dir(dump.path())
            .unwrap()
            .next()
            .unwrap()
            .unwrap();
        let env = std::fs::read_to_string(file.path()).unwrap();
        let names: Vec<&str> = env.lines().filter_map(|l| l.split('=').next()).collect();
        for name in &names {
            let runtime = name.starts_with("CONDUCTOR_") || name.starts_with("LAKEFS_");
            let per_task = [
                "PERAGO_TASK_ID",
                "PERAGO_EXECUTION_ID",
                "PERAGO_WORKER_ID",
                "PERAGO_WORKFLOW_ID",
            ]
            .contains(name);
            assert!(
                !runtime && (per_task || !name.starts_with("PERAGO_")),
                "{mode}: the body sees {name}\n{env}"
            );
        }
        assert!(
            names.contains(&"PERAGO_EXECUTION_ID") && names.contains(&"DUMP"),
            "{env}"
        );
        assert!(!env.contains("secret-value"), "{mode}: {env}");
    }
}

/// Inputs as Conductor treats them: a 5 MiB input is moved to external payload storage (the
/// task comes with `inputData: {}` and a path); perago fetches it and the body sees all of it,
/// on the executor that goes on to run the next task. An 11 MiB workflow input is refused by
/// the server itself (its hard limit), so no task reaches perago. (Inputs above tonic's default
/// 4 MiB message limit once killed the executor.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_inputs_run_or_fail_cleanly_and_the_executor_goes_on() {
    for mode in ["process", "thread"] {
        large_inputs_in(mode).await;
    }
}

async fn large_inputs_in(mode: &str) {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new(
        "e2e.large",
        "n=$(wc -c)\nprintf '{\"bytes\": %s, \"pid\": %s}' \"$n\" \"$PPID\"\n",
        "",
    );
    conductor.register(&task).await;
    let sup = SupervisorProc::start(&task, &conductor, 1, &[("PERAGO_EXECUTION_MODE", mode)]);
    let five = conductor
        .start_workflow(&task, json!({"blob": "x".repeat(5 << 20)}))
        .await;
    let wf = conductor
        .wait_terminal(&five, Duration::from_secs(60))
        .await;
    assert_eq!(wf["status"], "COMPLETED", "{}", sup.log_text());
    let task_record = &wf["tasks"][0];
    assert!(
        task_record["externalInputPayloadStoragePath"].is_string(),
        "devstack externalized the input as Conductor does: {}",
        task_record["inputData"]
    );
    assert!(wf["output"]["result"]["bytes"].as_u64().unwrap() > 5 << 20);
    let executor = wf["output"]["result"]["pid"].clone();

    let refused = conductor
        .client
        .start_workflow(
            &format!("{}.wf", task.name),
            &json!({"params": {"blob": "x".repeat(11 << 20)}}),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("HTTP 500")
            && refused.contains("is greater than the permissible limit: 10485760 bytes"),
        "{refused}"
    );

    let small = conductor.start_workflow(&task, json!({"n": 1})).await;
    let wf = conductor
        .wait_terminal(&small, Duration::from_secs(30))
        .await;
    assert_eq!(wf["status"], "COMPLETED");
    if mode == "process" {
        // In thread mode each body's parent is its own guard process.
        assert_eq!(wf["output"]["result"]["pid"], executor, "the same executor");
    }
    assert!(!sup.log_text().contains("restart"), "{}", sup.log_text());
}

/// An externalized input through an authenticated Conductor: the body sees the real input,
/// and the storage never gets the Conductor token (devstack's blob store refuses a request
/// that brings one, as S3 refuses a second credential on a pre-signed URL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_externalized_input_is_fetched_and_the_storage_never_sees_the_token() {
    let server = perago_devstack::conductor::ConductorServer::builder()
        .auth("key", "secret")
        .bind("127.0.0.1:0")
        .await
        .unwrap();
    let client = perago_core::conductor::ConductorClient::with_auth(
        &server.base_url(),
        Some(perago_core::conductor::Credentials::new("key", "secret")),
    )
    .unwrap();
    let conductor = Conductor { server, client };
    let task = TaskFixture::new(
        "e2e.external",
        r#"printf '{"ys": %s}' "$(tr -d -c y | wc -c)"
"#,
        "",
    );
    conductor.register(&task).await;
    let sup = SupervisorProc::start(
        &task,
        &conductor,
        1,
        &[
            ("CONDUCTOR_AUTH_KEY", "key"),
            ("CONDUCTOR_AUTH_SECRET", "secret"),
        ],
    );
    let wf = conductor
        .start_workflow(&task, json!({"blob": "y".repeat(4 << 20)}))
        .await;
    let wf = conductor.wait_terminal(&wf, Duration::from_secs(60)).await;
    assert_eq!(wf["status"], "COMPLETED", "{}", sup.log_text());
    assert_eq!(wf["output"]["result"]["ys"], 4 << 20, "{}", sup.log_text());
}

/// A storage error fails the attempt (FAILED, retried: the retry fetches and completes); a
/// location without a `uri` (the server's DummyPayloadStorage) fails it for good, naming the
/// server's storage configuration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_errors_are_retried_and_a_location_without_uri_is_terminal() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new(
        "e2e.storage",
        r#"printf '{"bytes": %s}' "$(wc -c)"
"#,
        "",
    );
    conductor.register(&task).await;
    conductor
        .server
        .faults()
        .add(perago_devstack::faults::FaultSpec {
            path: "/payloads/".into(),
            status: Some(503),
            count: Some(1),
            ..Default::default()
        })
        .unwrap();
    let sup = SupervisorProc::start(&task, &conductor, 1, &[]);
    let wf = conductor
        .start_workflow(&task, json!({"blob": "x".repeat(4 << 20)}))
        .await;
    let wf = conductor.wait_terminal(&wf, Duration::from_secs(60)).await;
    assert_eq!(wf["status"], "COMPLETED", "{}", sup.log_text());
    let tasks = wf["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 2, "one retry");
    assert_eq!(tasks[0]["status"], "FAILED");
    let reason = tasks[0]["reasonForIncompletion"].as_str().unwrap();
    assert!(
        reason.contains("HTTP 503") && !reason.contains("Signature"),
        "{reason}"
    );
    drop(sup);

    let dummy = perago_devstack::conductor::ConductorServer::builder()
        .payload_storage(perago_devstack::conductor::PayloadStorage::Dummy)
        .bind("127.0.0.1:0")
        .await
        .unwrap();
    let client = perago_core::conductor::ConductorClient::new(&dummy.base_url()).unwrap();
    let conductor = Conductor {
        server: dummy,
        client,
    };
    conductor.register(&task).await;
    let sup = SupervisorProc::start(&task, &conductor, 1, &[]);
    let wf = conductor
        .start_workflow(&task, json!({"blob": "x".repeat(4 << 20)}))
        .await;
    let wf = conductor.wait_terminal(&wf, Duration::from_secs(60)).await;
    let tasks = wf["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 1, "not retried: {}", sup.log_text());
    assert_eq!(tasks[0]["status"], "FAILED_WITH_TERMINAL_ERROR");
    let reason = tasks[0]["reasonForIncompletion"].as_str().unwrap();
    assert!(
        reason.contains("DummyPayloadStorage") && reason.contains("no uri"),
        "{reason}"
    );
}

/// Outputs up to Conductor's hard limit are delivered (8 MiB: COMPLETED, as the SDKs do);
/// above it the task fails for good, the reason naming the output's size and the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_up_to_the_hard_limit_complete_and_above_it_fail_for_good() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new(
        "e2e.output",
        r#"n=$(tr -dc 0-9)
printf '{"blob": "'; head -c "$n" /dev/zero | tr '\0' z; printf '"}'
"#,
        "",
    );
    conductor.register(&task).await;
    let sup = SupervisorProc::start(&task, &conductor, 1, &[]);
    let eight = conductor.start_workflow(&task, json!({"n": 8 << 20})).await;
    let wf = conductor
        .wait_terminal(&eight, Duration::from_secs(60))
        .await;
    assert_eq!(wf["status"], "COMPLETED", "{}", sup.log_text());
    assert_eq!(
        wf["output"]["result"]["blob"].as_str().unwrap().len(),
        8 << 20
    );
    let eleven = conductor
        .start_workflow(&task, json!({"n": 11 << 20}))
        .await;
    let wf = conductor
        .wait_terminal(&eleven, Duration::from_secs(60))
        .await;
    let tasks = wf["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 1, "a terminal failure is not retried");
    assert_eq!(tasks[0]["status"], "FAILED_WITH_TERMINAL_ERROR");
    let reason = tasks[0]["reasonForIncompletion"].as_str().unwrap();
    assert!(
        reason.starts_with("task output is 1153") && reason.contains("limit of 10485760 bytes"),
        "{reason}"
    );
}

/// A body's stderr cannot flood the runtime's logs: 20 MB of it leave a bounded log with one
/// line saying how much was dropped, control characters are written out, and the failure
/// reason carries the (escaped) tail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stderr_flood_is_capped_in_the_logs_and_control_characters_escaped() {
    for mode in ["process", "thread"] {
        stderr_flood_in(mode).await;
    }
}

async fn stderr_flood_in(mode: &str) {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new(
        "e2e.flood",
        "read p\n[ \"$p\" = '{\"ok\":true}' ] && { echo '{\"healthy\": true}'; exit 0; }\n\
         printf 'colour \\033[31mred\\r\\n' >&2\n\
         head -c 20000000 /dev/zero | tr '\\0' 'y' | fold -w 100 >&2\n\
         printf 'last words \\033]0;title\\007\\n' >&2\nexit 3\n",
        "retry_count = 0",
    );
    conductor.register(&task).await;
    let sup = SupervisorProc::start(&task, &conductor, 1, &[]);
    let id = conductor.start_workflow(&task, json!({})).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(60)).await;
    let reason = wf["tasks"][0]["reasonForIncompletion"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        reason.ends_with("last words \\x1b]0;title\\x07"),
        "{reason}"
    );
    // Process mode: the executor's JSONL log (JSON-escaped); thread mode: everything goes to
    // the supervisor's stderr, as text.
    let (text, escaped) = if mode == "process" {
        let worker = format!("{}0001", task.prefix());
        let mut text = String::new();
        for entry in std::fs::read_dir(sup.jsonl_dir(&task, &worker)).unwrap() {
            text.push_str(&std::fs::read_to_string(entry.unwrap().path()).unwrap());
        }
        (text, r"colour \\x1b[31mred")
    } else {
        (sup.log_text(), r"colour \x1b[31mred")
    };
    assert!(
        text.len() < 2_000_000,
        "{mode}: {} bytes of log for 20 MB of stderr",
        text.len()
    );
    assert!(
        text.contains("bytes of stderr dropped"),
        "{mode}: {}",
        &text[text.len().saturating_sub(2000)..]
    );
    assert!(
        text.contains(escaped),
        "{mode}: the ESC is written out, not raw"
    );
    assert!(!text.contains('\u{1b}'), "{mode}: no raw ESC in the log");
}

/// A body hunting for secrets finds none: not in its environment, not in any
/// `/proc/<pid>/environ` it can read. The runtime runs as an unprivileged user (as a body of
/// the same user would find it): its processes are non-dumpable, so their environ files are
/// closed to the body, and secrets reach the broker and the executors over a socket anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_finds_no_secret_in_any_environment_it_can_read() {
    // SAFETY-free check: only root can start the runtime as another user.
    if !std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
    {
        eprintln!("skipped: running the runtime as another user needs root");
        return;
    }
    const NOBODY: u32 = 65534;
    let conductor = Conductor::start().await;
    let dump = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(dump.path(), Some(NOBODY), Some(NOBODY)).unwrap();
    let task = TaskFixture::new(
        "e2e.hunt",
        r#"out="$DUMP/$PERAGO_EXECUTION_ID"
env > "$out.self"
n=0
for f in /proc/[0-9]*/environ; do
  if tr '\0' '\n' < "$f" >> "$out.procs" 2>/dev/null; then n=$((n+1)); fi
done
echo "{\"readable\": $n}"
"#,
        "",
    )
    .with_manifest_tail(&format!(
        "env = {{ DUMP = \"{}\" }}\n",
        dump.path().display()
    ));
    conductor.register(&task).await;
    let sup = SupervisorProc::start_as(
        &task,
        &conductor,
        2,
        &[
            ("CONDUCTOR_AUTH_KEY", "conductor-key-value"),
            ("CONDUCTOR_AUTH_SECRET", "conductor-secret-value"),
            ("LAKEFS_ENDPOINT", "http://127.0.0.1:9"),
            ("LAKEFS_ACCESS_KEY_ID", "lakefs-key-value"),
            ("LAKEFS_SECRET_ACCESS_KEY", "lakefs-secret-value"),
        ],
        Some(NOBODY),
    );
    let id = conductor.start_workflow(&task, json!({})).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf}\n{}", sup.log_text());
    let readable = wf["output"]["result"]["readable"].as_u64().unwrap();
    assert!(
        readable >= 1,
        "the body could not even read its own environ"
    );
    let mut found = String::new();
    for entry in std::fs::read_dir(dump.path()).unwrap() {
        found.push_str(&std::fs::read_to_string(entry.unwrap().path()).unwrap());
    }
    for secret in [
        "conductor-key-value",
        "conductor-secret-value",
        "lakefs-key-value",
        "lakefs-secret-value",
        "PERAGO_SLOT_TOKEN",
        "PERAGO_CONTROL_TOKEN",
    ] {
        assert!(
            !found.contains(secret),
            "the body found {secret} ({readable} environ files readable)"
        );
    }
    eprintln!("[hunt] the body read {readable} environ files and found no secret");
}

/// `[body] user`: a runtime started as root runs its bodies as an unprivileged user, who can
/// read none of the runtime's environments (root's, and non-dumpable) and owns its files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_run_as_the_body_user_and_find_no_secret() {
    if perago_sys::user::euid() != 0 {
        eprintln!("skipped: switching users needs root");
        return;
    }
    for mode in ["process", "thread"] {
        let conductor = Conductor::start().await;
        let task = TaskFixture::new(
            "e2e.bodyuser",
            r#"n=0
found=0
for f in /proc/[0-9]*/environ; do
  if tr '\0' '\n' < "$f" 2>/dev/null | grep -q 'secret-value'; then found=$((found+1)); fi
  if cat "$f" > /dev/null 2>&1; then n=$((n+1)); fi
done
printf '{"uid": %s, "readable": %s, "found": %s}' "$(id -u)" "$n" "$found"
"#,
            "",
        )
        .with_manifest_tail("user = \"nobody\"\n");
        // The body (nobody) must be able to read its script.
        let mode_bits = std::os::unix::fs::PermissionsExt::from_mode(0o755);
        std::fs::set_permissions(task.dir.path(), mode_bits).unwrap();
        conductor.register(&task).await;
        let sup = SupervisorProc::start(
            &task,
            &conductor,
            1,
            &[
                ("PERAGO_EXECUTION_MODE", mode),
                ("CONDUCTOR_AUTH_KEY", "conductor-key"),
                ("CONDUCTOR_AUTH_SECRET", "conductor-secret-value"),
                ("LAKEFS_ENDPOINT", "http://127.0.0.1:9"),
                ("LAKEFS_ACCESS_KEY_ID", "lakefs-key"),
                ("LAKEFS_SECRET_ACCESS_KEY", "lakefs-secret-value"),
            ],
        );
        let id = conductor.start_workflow(&task, json!({})).await;
        let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
        assert_eq!(
            wf["status"],
            "COMPLETED",
            "{mode}: {wf}\n{}",
            sup.log_text()
        );
        let result = &wf["output"]["result"];
        assert_eq!(result["uid"], 65534, "{mode}: {result}");
        assert_eq!(result["found"], 0, "{mode}: {result}");
        eprintln!("[body user] {mode}: {result}");
    }
}
