//! Several task types under one supervisor (`start A.toml B.toml`): each keeps a runtime of
//! its own (broker, executors, socket, root), `-j NAME=N` sizes one, a crash in one type never
//! touches the other, signals and exit codes cover the set, `status` and `/metrics` show every
//! type, and nothing starts unless every TaskDef is registered.

use crate::harness::{
    Conductor, SupervisorProc, TaskFixture, child_named, eventually, signal_pid, thread_mode,
    workers_of,
};
use serde_json::{Value, json};
use std::{collections::BTreeSet, time::Duration};

/// Echoes its params with the worker id it ran on.
const ECHO: &str = r#"read params
printf '{"echo": %s, "worker": "%s"}' "$params" "$PERAGO_WORKER_ID"
"#;

/// Like [`ECHO`], slowly enough that a kill lands while it runs.
const SLOW_ECHO: &str = r#"read params
sleep 0.3
printf '{"echo": %s, "worker": "%s"}' "$params" "$PERAGO_WORKER_ID"
"#;

fn worker_of(wf: &Value) -> String {
    wf["output"]["result"]["worker"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// The address the supervisor serves the merged metrics at, from its log.
async fn metrics_address(sup: &SupervisorProc) -> String {
    eventually(
        "the merged metrics address",
        Duration::from_secs(20),
        || async {
            let log = sup.log_text();
            let at = log.find("metrics of every task type served at http://")?;
            let rest = &log[at..];
            let start = rest.find("http://")? + "http://".len();
            let end = rest[start..].find("/metrics")?;
            Some(rest[start..start + end].to_owned())
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_task_types_run_side_by_side_each_with_its_own_jobs_and_worker_ids() {
    let conductor = Conductor::start().await;
    let a = TaskFixture::new("multi.a", ECHO, "");
    let b = TaskFixture::new("multi.b", ECHO, "");
    conductor.register(&a).await;
    conductor.register(&b).await;
    let state = tempfile::tempdir().unwrap();
    let state_home = state.path().to_str().unwrap().to_owned();
    let sup = SupervisorProc::start_many(
        &[&a, &b],
        &conductor,
        &["2", "multi.b=3"],
        &[
            ("XDG_STATE_HOME", &state_home),
            ("PERAGO_METRICS_ADDR", "127.0.0.1:0"),
        ],
    );
    let mut ids = Vec::new();
    for n in 0..100 {
        ids.push((&a, conductor.start_workflow(&a, json!({"n": n})).await));
        ids.push((&b, conductor.start_workflow(&b, json!({"n": n})).await));
    }
    let mut workers: [BTreeSet<String>; 2] = Default::default();
    for (task, id) in &ids {
        let wf = conductor.wait_terminal(id, Duration::from_secs(60)).await;
        assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
        let worker = worker_of(&wf);
        assert!(
            worker.starts_with(&task.prefix()),
            "{} ran on {worker}",
            task.name
        );
        workers[usize::from(task.name == "multi.b")].insert(worker);
    }
    // Each type's workers are its own slots: 2 for a, 3 for b.
    assert!(
        workers[0]
            .iter()
            .all(|w| ["multia0001", "multia0002"].contains(&w.as_str())),
        "{workers:?}"
    );
    assert!(
        workers[1]
            .iter()
            .all(|w| ["multib0001", "multib0002", "multib0003"].contains(&w.as_str())),
        "{workers:?}"
    );
    if !thread_mode() {
        // `ps` tells the types apart.
        let names: BTreeSet<String> = workers_of(sup.pid()).into_iter().collect();
        let want: BTreeSet<String> = [
            "perago-conductor-broker@multi.a",
            "perago-conductor-broker@multi.b",
            "perago-executor-0001@multi.a",
            "perago-executor-0002@multi.a",
            "perago-executor-0001@multi.b",
            "perago-executor-0002@multi.b",
            "perago-executor-0003@multi.b",
        ]
        .into_iter()
        .map(str::to_owned)
        .collect();
        assert_eq!(names, want);
    }

    // `status` with no argument shows every type of the running supervisor (the counters
    // move once Conductor took each update: read until every result is counted).
    let want = [
        ("multi.a".to_owned(), 2, 100),
        ("multi.b".to_owned(), 3, 100),
    ];
    let mut last = String::new();
    let got = eventually(
        "status to count every result",
        Duration::from_secs(10),
        || {
            let status = perago_tests::Run::of(
                perago_tests::command(crate::harness::SUPERVISOR)
                    .args(["status", "--json"])
                    .env("XDG_STATE_HOME", &state_home),
            );
            status.expect_code(0);
            let all: Value = serde_json::from_str(&status.stdout).unwrap();
            let by_task: Vec<(String, usize, u64)> = all
                .as_array()
                .unwrap_or_else(|| panic!("{status}"))
                .iter()
                .map(|s| {
                    (
                        s["task_name"].as_str().unwrap().to_owned(),
                        s["slots"].as_array().unwrap().len(),
                        s["counters"]["completed"].as_u64().unwrap(),
                    )
                })
                .collect();
            last = format!("{by_task:?}");
            let done = by_task == want;
            async move { done.then_some(by_task) }
        },
    )
    .await;
    assert_eq!(got, want, "{last}");
    // One manifest: that type's runtime, found through the supervisor's record.
    let one = perago_tests::Run::of(
        perago_tests::command(crate::harness::SUPERVISOR)
            .args(["status", "--json", b.manifest().to_str().unwrap()])
            .env("XDG_STATE_HOME", &state_home)
            .env("PERAGO_WORKSPACE_ROOT", sup.workspace_root()),
    );
    one.expect_code(0);
    let one: Value = serde_json::from_str(&one.stdout).unwrap();
    assert_eq!(one["task_name"], "multi.b");

    // One /metrics for both, each series labelled by its type.
    let addr = metrics_address(&sup).await;
    let out = std::process::Command::new("curl")
        .args(["-sf", &format!("http://{addr}/metrics")])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    for task in ["multi.a", "multi.b"] {
        let completed =
            format!("perago_task_results_total{{task=\"{task}\",status=\"COMPLETED\"}} 100");
        assert!(text.contains(&completed), "{completed} in\n{text}");
        assert!(
            text.contains(&format!("task_poll_total{{taskType=\"{task}\"}}")),
            "{text}"
        );
    }
    assert_eq!(
        text.lines()
            .filter(|l| *l == "# TYPE perago_task_results_total counter")
            .count(),
        1,
        "{text}"
    );

    // SIGTERM drains both; the supervisor's record goes with it.
    let mut sup = sup;
    sup.signal("TERM");
    let exit = sup.wait_exit(Duration::from_secs(30)).await;
    assert_eq!(exit.code(), Some(0), "{}", sup.log_text());
    let log = sup.log_text();
    assert_eq!(
        log.matches("SIGTERM: draining (no new tasks").count(),
        2,
        "each runtime drains\n{log}"
    );
    let after = perago_tests::Run::of(
        perago_tests::command(crate::harness::SUPERVISOR)
            .args(["status"])
            .env("XDG_STATE_HOME", &state_home),
    );
    after.expect_code(1);
    assert!(
        after
            .stderr
            .contains("no perago supervisor of this user is running"),
        "{after}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_killed_in_one_task_type_leaves_the_other_undisturbed() {
    let conductor = Conductor::start().await;
    let a = TaskFixture::new("multi.kill.a", SLOW_ECHO, "");
    let b = TaskFixture::new("multi.kill.b", SLOW_ECHO, "");
    conductor.register(&a).await;
    conductor.register(&b).await;
    let sup = SupervisorProc::start_many(&[&a, &b], &conductor, &["1"], &[]);
    let executor_a = eventually("a's executor", Duration::from_secs(20), || async {
        child_named(sup.pid(), "perago-executor-0001@multi.kill.a")
    })
    .await;
    let executor_b = eventually("b's executor", Duration::from_secs(20), || async {
        child_named(sup.pid(), "perago-executor-0001@multi.kill.b")
    })
    .await;
    let broker_b = child_named(sup.pid(), "perago-conductor-broker@multi.kill.b").unwrap();
    let mut ids_b = Vec::new();
    for n in 0..10 {
        ids_b.push(conductor.start_workflow(&b, json!({"n": n})).await);
    }
    let id_a = conductor.start_workflow(&a, json!({"n": 0})).await;
    // a's task is running: kill its executor.
    eventually("a's task to run", Duration::from_secs(20), || async {
        let wf = conductor.workflow(&id_a).await;
        (wf["tasks"][0]["status"] == "IN_PROGRESS").then_some(())
    })
    .await;
    signal_pid(executor_a.pid, "KILL");
    // a's task is retried on the restarted executor; b never noticed.
    let wf = conductor
        .wait_terminal(&id_a, Duration::from_secs(30))
        .await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}");
    for id in &ids_b {
        let wf = conductor.wait_terminal(id, Duration::from_secs(30)).await;
        assert_eq!(wf["status"], "COMPLETED", "{wf:#}");
        let attempts = wf["tasks"].as_array().unwrap().len();
        assert_eq!(attempts, 1, "b's tasks ran once each: {wf:#}");
        assert_eq!(worker_of(&wf), "multikillb0001");
    }
    assert_eq!(
        child_named(sup.pid(), "perago-executor-0001@multi.kill.b").map(|p| p.pid),
        Some(executor_b.pid),
        "b's executor is the same process"
    );
    assert_eq!(
        child_named(sup.pid(), "perago-conductor-broker@multi.kill.b").map(|p| p.pid),
        Some(broker_b.pid)
    );
    assert_ne!(
        eventually("a's new executor", Duration::from_secs(20), || async {
            child_named(sup.pid(), "perago-executor-0001@multi.kill.a")
        })
        .await
        .pid,
        executor_a.pid
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_death_in_one_task_type_drains_the_other_and_exits_one() {
    let conductor = Conductor::start().await;
    let a = TaskFixture::new("multi.dead.a", ECHO, "");
    let b = TaskFixture::new("multi.dead.b", ECHO, "");
    conductor.register(&a).await;
    conductor.register(&b).await;
    let mut sup = SupervisorProc::start_many(&[&a, &b], &conductor, &["1"], &[]);
    let broker_b = eventually("b's broker", Duration::from_secs(20), || async {
        child_named(sup.pid(), "perago-conductor-broker@multi.dead.b")
    })
    .await;
    eventually("a's executor", Duration::from_secs(20), || async {
        child_named(sup.pid(), "perago-executor-0001@multi.dead.a")
    })
    .await;
    signal_pid(broker_b.pid, "KILL");
    let exit = sup.wait_exit(Duration::from_secs(30)).await;
    let log = sup.log_text();
    assert_eq!(exit.code(), Some(1), "{log}");
    assert!(
        log.contains("the runtime of task multi.dead.b stopped"),
        "a's runtime drains because b's stopped\n{log}"
    );
    assert!(
        log.contains("error: task multi.dead.b: the broker exited"),
        "{log}"
    );
    assert!(!log.contains("error: task multi.dead.a"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_task_def_of_one_type_starts_nothing() {
    let conductor = Conductor::start().await;
    let a = TaskFixture::new("multi.reg.a", ECHO, "");
    let b = TaskFixture::new("multi.reg.b", ECHO, "");
    let c = TaskFixture::new("multi.reg.c", ECHO, "");
    conductor.register(&a).await;
    let mut sup = SupervisorProc::start_many(&[&a, &b, &c], &conductor, &["1"], &[]);
    let exit = sup.wait_exit(Duration::from_secs(20)).await;
    let log = sup.log_text();
    assert_eq!(exit.code(), Some(1), "{log}");
    assert!(
        log.contains(
            "error: Conductor TaskDef 'multi.reg.b' is not registered; run perago extract and register it before start\n\
             error: Conductor TaskDef 'multi.reg.c' is not registered; run perago extract and register it before start"
        ),
        "every missing TaskDef at once\n{log}"
    );
    assert!(!log.contains("workspace root locked"), "{log}");
    assert!(!log.contains("broker started"), "{log}");
    assert!(!sup.workspace_root().exists(), "no root was even created");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_once_ends_when_every_task_type_is_done() {
    let conductor = Conductor::start().await;
    let a = TaskFixture::new("multi.once.a", ECHO, "");
    let b = TaskFixture::new("multi.once.b", ECHO, "");
    conductor.register(&a).await;
    conductor.register(&b).await;
    let mut ids = Vec::new();
    for n in 0..10 {
        ids.push(conductor.start_workflow(&a, json!({"n": n})).await);
    }
    for n in 0..30 {
        ids.push(conductor.start_workflow(&b, json!({"n": n})).await);
    }
    let mut sup = SupervisorProc::start_tasks(
        &[&a, &b],
        &conductor,
        &["1", "multi.once.b=2"],
        &["--once"],
        &[],
        None,
        None,
    );
    let exit = sup.wait_exit(Duration::from_secs(60)).await;
    assert_eq!(exit.code(), Some(0), "{}", sup.log_text());
    for id in &ids {
        let wf = conductor.workflow(id).await;
        assert_eq!(wf["status"], "COMPLETED", "{wf:#}");
    }
    let log = sup.log_text();
    for task in ["multi.once.a", "multi.once.b"] {
        assert!(
            log.contains(&format!("run once: no task of {task} left")),
            "{log}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_task_type_scales_within_its_own_range_while_the_other_stays_fixed() {
    let conductor = Conductor::start().await;
    let a = TaskFixture::new("multi.fixed", ECHO, "");
    let b = TaskFixture::new(
        "multi.range",
        "read params\nsleep 1\nprintf '{\"worker\": \"%s\"}' \"$PERAGO_WORKER_ID\"\n",
        "",
    );
    conductor.register(&a).await;
    conductor.register(&b).await;
    let mut ids = Vec::new();
    for n in 0..20 {
        ids.push(conductor.start_workflow(&b, json!({"n": n})).await);
    }
    let mut sup = SupervisorProc::start_many(
        &[&a, &b],
        &conductor,
        &["1", "multi.range=1..3"],
        &[("PERAGO_SCALE_DOWN_AFTER", "60s")],
    );
    let roots = sup.workspace_root();
    // The backlog of b grows b's executors to its maximum; a keeps its one.
    eventually("b at three executors", Duration::from_secs(20), || async {
        let b = crate::adaptive::status(&roots.join("multi.range")).await?;
        let a = crate::adaptive::status(&roots.join("multi.fixed")).await?;
        (b.capacity.as_ref()?.wanted_executors == 3
            && a.capacity.as_ref()?.max_executors == 1
            && a.slots.len() == 1)
            .then_some(())
    })
    .await;
    for id in &ids {
        let wf = conductor.wait_terminal(id, Duration::from_secs(60)).await;
        assert_eq!(wf["status"], "COMPLETED", "{wf:#}");
    }
    sup.signal("TERM");
    assert_eq!(sup.wait_exit(Duration::from_secs(30)).await.code(), Some(0));
}

/// Two supervisors started at once over the same two task types, their manifests in opposite
/// orders, on one workspace root: the roots are locked in one order, so one supervisor runs
/// both types and the other is refused (neither may hold one type's root while refusing the
/// other's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_supervisors_of_the_same_task_types_started_at_once_leave_one_running() {
    let conductor = Conductor::start().await;
    let a = TaskFixture::new("multi.race.a", ECHO, "");
    let b = TaskFixture::new("multi.race.b", ECHO, "");
    conductor.register(&a).await;
    conductor.register(&b).await;
    let shared = tempfile::tempdir().unwrap();
    let root = shared.path().to_str().unwrap();
    let mut first = SupervisorProc::start_many(
        &[&a, &b],
        &conductor,
        &["1"],
        &[("PERAGO_WORKSPACE_ROOT", root)],
    );
    let mut second = SupervisorProc::start_many(
        &[&b, &a],
        &conductor,
        &["1"],
        &[("PERAGO_WORKSPACE_ROOT", root)],
    );
    // One of them is refused at once; the other keeps running.
    let first_refused = eventually(
        "one supervisor to be refused",
        Duration::from_secs(20),
        || {
            let first_done = first.child.try_wait().unwrap().is_some();
            let second_done = second.child.try_wait().unwrap().is_some();
            async move { (first_done || second_done).then_some(first_done) }
        },
    )
    .await;
    let (refused, running) = if first_refused {
        (&mut first, &mut second)
    } else {
        (&mut second, &mut first)
    };
    let exit = refused.wait_exit(Duration::from_secs(5)).await;
    assert_eq!(exit.code(), Some(1), "{}", refused.log_text());
    assert!(
        refused
            .log_text()
            .contains("is locked by perago supervisor pid"),
        "{}",
        refused.log_text()
    );
    assert!(
        running.child.try_wait().unwrap().is_none(),
        "both were refused\n{}\n{}",
        running.log_text(),
        refused.log_text()
    );
    for task in [&a, &b] {
        let id = conductor.start_workflow(task, json!({"n": 1})).await;
        let wf = conductor.wait_terminal(&id, Duration::from_secs(20)).await;
        assert_eq!(wf["status"], "COMPLETED", "{wf:#}");
    }
    running.signal("TERM");
    assert_eq!(
        running.wait_exit(Duration::from_secs(30)).await.code(),
        Some(0)
    );
}
