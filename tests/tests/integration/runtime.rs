//! The process runtime end to end: the real supervisor, broker and executors against
//! devstack's Conductor on loopback.

use crate::harness::{
    Conductor, SupervisorProc, TaskFixture, alive, child_named, children_of, eventually,
    signal_pid, workers_of,
};
use perago_devstack::faults::FaultSpec;
use serde_json::{Value, json};
use std::{collections::BTreeSet, time::Duration};

/// Echoes its params with the worker id it ran on.
const ECHO: &str = r#"read params
printf '{"echo": %s, "worker": "%s"}' "$params" "$PERAGO_WORKER_ID"
"#;

fn task_of(wf: &Value) -> &Value {
    wf["tasks"]
        .as_array()
        .and_then(|t| t.last())
        .expect("a task")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_workflows_complete_across_four_executors() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("e2e.echo", ECHO, "");
    conductor.register(&task).await;
    let mut ids = Vec::new();
    for n in 0..200 {
        ids.push(conductor.start_workflow(&task, json!({"n": n})).await);
    }
    let sup = SupervisorProc::start(&task, &conductor, 4, &[]);

    // The process tree carries the names operators look for in `ps -o args`.
    let names = eventually(
        "the broker and four executors to run",
        Duration::from_secs(20),
        || async {
            let names: BTreeSet<String> = workers_of(sup.pid()).into_iter().collect();
            (names.len() == 5).then_some(names)
        },
    )
    .await;
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        [
            "perago-conductor-broker",
            "perago-executor-0001",
            "perago-executor-0002",
            "perago-executor-0003",
            "perago-executor-0004"
        ]
    );

    let prefix = task.prefix();
    let mut workers = BTreeSet::new();
    for (n, id) in ids.iter().enumerate() {
        let wf = conductor.wait_terminal(id, Duration::from_secs(60)).await;
        assert_eq!(wf["status"], "COMPLETED", "{wf:#}");
        let result = &wf["output"]["result"];
        assert_eq!(result["echo"], json!({"n": n}));
        // Each result carries the worker id of the executor that ran it.
        let worker = result["worker"].as_str().unwrap().to_owned();
        assert_eq!(task_of(&wf)["workerId"], worker.as_str());
        assert!(
            worker.starts_with(&prefix) && worker.len() == prefix.len() + 4,
            "{worker}"
        );
        workers.insert(worker);
    }
    assert!(workers.len() > 1, "work spread over the slots: {workers:?}");
    // The broker polls with its own id (update-v2's follow-up polls carry the result's worker
    // id, as Conductor defines them; once the work is done only the broker polls).
    let url = format!(
        "{}/tasks/queue/polldata?taskType={}",
        conductor.server.base_url(),
        task.name
    );
    let broker = format!("{prefix}Broker");
    eventually(
        "a poll with the broker id",
        Duration::from_secs(10),
        || async {
            let data = reqwest_get(&url).await;
            (data[0]["workerId"] == broker.as_str()).then_some(())
        },
    )
    .await;
}

async fn reqwest_get(url: &str) -> Value {
    // The devstack client has no poll-data call; a plain GET is enough here.
    let output = tokio::process::Command::new("curl")
        .args(["-sf", url])
        .output()
        .await
        .expect("curl runs");
    serde_json::from_slice(&output.stdout).unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_the_running_task_finish_and_exits_zero() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new(
        "e2e.slow",
        "read params\ntouch started\nsleep 3\necho '{\"slept\": 3}'\n",
        "",
    );
    conductor.register(&task).await;
    let mut sup = SupervisorProc::start(&task, &conductor, 2, &[]);
    let id = conductor.start_workflow(&task, json!({})).await;
    let marker = task.dir.path().join("started");
    eventually("the body to start", Duration::from_secs(20), || async {
        marker.exists().then_some(())
    })
    .await;
    assert_eq!(
        workers_of(sup.pid()).len(),
        3,
        "{:?}",
        workers_of(sup.pid())
    );
    let before = children_of(sup.pid());

    sup.signal("TERM");
    // The idle executor leaves at once; the busy one stays until its task is done.
    eventually(
        "the idle executor to exit",
        Duration::from_secs(2),
        || async { (workers_of(sup.pid()).len() == 2).then_some(()) },
    )
    .await;
    let wf = conductor.workflow(&id).await;
    assert_eq!(
        task_of(&wf)["status"],
        "IN_PROGRESS",
        "still running during the drain"
    );

    let status = sup.wait_exit(Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(0), "{}", sup.log_text());
    let wf = conductor.wait_terminal(&id, Duration::from_secs(5)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}");
    assert_eq!(wf["output"]["result"], json!({"slept": 3}));
    for child in before {
        assert!(
            !alive(child.pid),
            "{:?} outlived the supervisor",
            child.argv
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_executor_fails_its_task_and_the_slot_restarts() {
    let conductor = Conductor::start().await;
    // The first attempt hangs; its retry (retryCount 1) finishes at once.
    let task = TaskFixture::new(
        "e2e.crash",
        "read params\nif [ ! -e attempted ]; then touch attempted; sleep 60; fi\necho '{\"ok\": true}'\n",
        "",
    );
    conductor.register(&task).await;
    let sup = SupervisorProc::start(&task, &conductor, 1, &[]);
    let id = conductor.start_workflow(&task, json!({})).await;
    let marker = task.dir.path().join("attempted");
    eventually(
        "the first attempt to start",
        Duration::from_secs(20),
        || async { marker.exists().then_some(()) },
    )
    .await;
    let victim = child_named(sup.pid(), "perago-executor-0001").expect("executor running");
    signal_pid(victim.pid, "KILL");

    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}");
    let tasks = wf["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 2, "one failed attempt and its retry: {wf:#}");
    let prefix = task.prefix();
    assert_eq!(tasks[0]["status"], "FAILED");
    let reason = tasks[0]["reasonForIncompletion"].as_str().unwrap();
    assert!(
        reason.starts_with(&format!(
            "executor {prefix}0001 (pid {}, generation 1) exited (signal 9 (SIGKILL)) while running execution ",
            victim.pid
        )),
        "{reason}"
    );
    // The broker-made failure carries the executor's worker id.
    assert_eq!(tasks[0]["workerId"], format!("{prefix}0001"));
    assert_eq!(tasks[1]["status"], "COMPLETED");
    assert_eq!(tasks[1]["retryCount"], 1);

    // The slot came back with the same name (same worker id) and a new process.
    let replacement = eventually("the slot to restart", Duration::from_secs(10), || async {
        child_named(sup.pid(), "perago-executor-0001").filter(|p| p.pid != victim.pid)
    })
    .await;
    assert!(alive(replacement.pid));
    sup.log_with("restarting the slot", Duration::from_secs(5))
        .await;
    sup.log_with("generation=2", Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pre_guardrail_failure_is_terminal_in_conductor() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("e2e.guarded", ECHO, "")
        .with_file(
            "pre.sh",
            "echo 'refusing: params.name is empty' >&2\nexit 3\n",
        )
        .with_manifest_tail("[guardrails]\npre = [\"sh\", \"pre.sh\"]\n");
    conductor.register(&task).await;
    let _sup = SupervisorProc::start(&task, &conductor, 1, &[]);
    let id = conductor.start_workflow(&task, json!({"name": ""})).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "FAILED");
    let tasks = wf["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 1, "a terminal error is never retried");
    assert_eq!(tasks[0]["status"], "FAILED_WITH_TERMINAL_ERROR");
    assert_eq!(
        tasks[0]["reasonForIncompletion"],
        "pre guardrail sh pre.sh failed (exit status 3): refusing: params.name is empty"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conductor_errors_are_retried_until_it_recovers() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("e2e.flaky", ECHO, "");
    conductor.register(&task).await;
    let faults = conductor.server.faults();
    faults
        .add(FaultSpec {
            path: "/api/tasks/poll/".into(),
            status: Some(500),
            count: Some(3),
            ..FaultSpec::default()
        })
        .unwrap();
    faults
        .add(FaultSpec {
            method: Some("POST".into()),
            path: "/api/tasks".into(),
            status: Some(503),
            count: Some(2),
            ..FaultSpec::default()
        })
        .unwrap();
    let sup = SupervisorProc::start(&task, &conductor, 2, &[]);
    let mut ids = Vec::new();
    for n in 0..5 {
        ids.push(conductor.start_workflow(&task, json!({"n": n})).await);
    }
    for id in &ids {
        let wf = conductor.wait_terminal(id, Duration::from_secs(60)).await;
        assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
    }
    sup.log_with("poll failed; backing off", Duration::from_secs(5))
        .await;
    sup.log_with("polling recovered", Duration::from_secs(5))
        .await;
    sup.log_with(
        "result update failed; retrying with backoff",
        Duration::from_secs(5),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_are_extended_while_the_body_runs() {
    let conductor = Conductor::start().await;
    // A 2 s response timeout and a 5 s body: without lease extensions Conductor would time the
    // attempt out and retry it.
    let task = TaskFixture::new(
        "e2e.lease",
        "read params\nsleep 5\necho '{\"done\": true}'\n",
        "response_timeout_seconds = 2",
    );
    conductor.register(&task).await;
    let sup = SupervisorProc::start(&task, &conductor, 1, &[]);
    let id = conductor.start_workflow(&task, json!({})).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
    let tasks = wf["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 1, "no timeout, no retry: {wf:#}");
    assert_eq!(tasks[0]["retryCount"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_executor_deaths_follow_the_restart_backoff() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("e2e.backoff", ECHO, "");
    conductor.register(&task).await;
    let sup = SupervisorProc::start(&task, &conductor, 1, &[]);
    let mut last = 0;
    for round in 1..=3 {
        let victim = eventually("the executor to run", Duration::from_secs(20), || async {
            child_named(sup.pid(), "perago-executor-0001").filter(|p| p.pid != last)
        })
        .await;
        last = victim.pid;
        signal_pid(victim.pid, "KILL");
        let expected = format!("restart_in_s={}", [1, 2, 4][round - 1]);
        eventually(&expected, Duration::from_secs(10), || async {
            sup.log_text().contains(&expected).then_some(())
        })
        .await;
    }
    let log = sup.log_text();
    let delays: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("slot restart scheduled"))
        .filter_map(|l| l.split("restart_in_s=").nth(1))
        .collect();
    assert_eq!(delays, ["1", "2", "4"], "{log}");
    assert!(log.contains("generation=3"), "{log}");
}

/// The `restart_in_s` of every restart the supervisor scheduled so far.
fn restart_delays(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains("slot restart scheduled"))
        .filter_map(|l| l.split("restart_in_s=").nth(1))
        .map(|d| d.split_whitespace().next().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completed_assignment_resets_the_restart_backoff() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("e2e.backoffreset", ECHO, "");
    conductor.register(&task).await;
    let sup = SupervisorProc::start(&task, &conductor, 1, &[]);
    let mut last = 0;
    for round in 1..=3 {
        let victim = eventually("the executor to run", Duration::from_secs(20), || async {
            child_named(sup.pid(), "perago-executor-0001").filter(|p| p.pid != last)
        })
        .await;
        last = victim.pid;
        if round == 3 {
            // The third generation does useful work before it is killed.
            let id = conductor.start_workflow(&task, json!({"n": 1})).await;
            let wf = conductor.wait_terminal(&id, Duration::from_secs(20)).await;
            assert_eq!(wf["status"], "COMPLETED", "{wf:#}");
        }
        signal_pid(victim.pid, "KILL");
        eventually(
            "the restart to be scheduled",
            Duration::from_secs(10),
            || async { (restart_delays(&sup.log_text()).len() == round).then_some(()) },
        )
        .await;
    }
    let log = sup.log_text();
    assert_eq!(
        restart_delays(&log),
        ["1", "2", "1"],
        "a completed assignment starts the backoff over: {log}"
    );
}

/// A worker's runtime holds the lines it logs while it has work and writes them when it goes
/// idle (core/src/logging/sink.rs): a task's lines reach the JSONL files and stderr while the
/// runtime keeps running, not only when it exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_lines_reach_the_logs_when_the_runtime_goes_idle() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("e2e.idle_logs", "cat\n", "");
    conductor.register(&task).await;
    let sup = SupervisorProc::start(&task, &conductor, 1, &[]);
    let id = conductor.start_workflow(&task, json!({"n": 1})).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
    let task_id = task_of(&wf)["taskId"].as_str().unwrap().to_owned();
    let executor = task_of(&wf)["workerId"].as_str().unwrap().to_owned();
    let broker = format!("{}Broker", task.prefix());
    let has = |text: &str, message: &str| {
        text.lines()
            .any(|l| l.contains(message) && l.contains(task_id.as_str()))
    };
    for (worker, message) in [
        (&broker, "\"message\":\"result reported\""),
        (&executor, "\"message\":\"assignment completed\""),
    ] {
        eventually(
            &format!("{message} in {worker}'s file"),
            Duration::from_secs(10),
            || async { has(&sup.jsonl_text(&task, worker), message).then_some(()) },
        )
        .await;
    }
    eventually("the report on stderr", Duration::from_secs(10), || async {
        has(&sup.log_text(), "result reported").then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_worker_writes_jsonl_with_ids() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new(
        "e2e.logs",
        "read params\necho 'computing the answer' >&2\necho '{\"answer\": 42}'\n",
        "",
    );
    conductor.register(&task).await;
    let mut sup = SupervisorProc::start(&task, &conductor, 2, &[]);
    let id = conductor.start_workflow(&task, json!({})).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "COMPLETED");
    let task_id = task_of(&wf)["taskId"].as_str().unwrap().to_owned();
    let executor = task_of(&wf)["workerId"].as_str().unwrap().to_owned();
    sup.signal("TERM");
    assert_eq!(sup.wait_exit(Duration::from_secs(30)).await.code(), Some(0));

    let prefix = task.prefix();
    let read_lines = |worker: &str| -> Vec<Value> {
        let path = sup.jsonl_dir(&task, worker).join("perago.jsonl");
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
            .collect()
    };
    for worker in [
        format!("{prefix}Broker"),
        format!("{prefix}0001"),
        format!("{prefix}0002"),
    ] {
        let lines = read_lines(&worker);
        assert!(!lines.is_empty(), "{worker} logged nothing");
        assert!(
            lines.iter().all(|l| l["worker_id"] == worker.as_str()),
            "{worker}: {lines:#?}"
        );
    }
    let broker = read_lines(&format!("{prefix}Broker"));
    let dispatched = broker
        .iter()
        .find(|l| l["message"] == "dispatched")
        .expect("a dispatch line");
    assert_eq!(dispatched["task_id"], task_id.as_str());
    assert!(
        dispatched["execution_id"]
            .as_str()
            .is_some_and(|e| e.len() == 36)
    );
    let ran = read_lines(&executor);
    let stderr = ran
        .iter()
        .find(|l| l["stream"] == "stderr")
        .expect("the body's stderr is in the worker log");
    assert_eq!(stderr["message"], "computing the answer");
    // Every line of the assignment carries its ids: the body's stderr as much as the
    // executor's own lines (through the assignment's span).
    let execution_id = dispatched["execution_id"].as_str().unwrap();
    let of_assignment: Vec<&Value> = ran
        .iter()
        .filter(|l| l["stream"] == "stderr" || l["message"] == "assignment completed")
        .collect();
    assert_eq!(of_assignment.len(), 2, "{ran:#?}");
    for line in of_assignment {
        assert_eq!(line["task_id"], task_id.as_str(), "{line}");
        assert_eq!(line["execution_id"], execution_id, "{line}");
        assert_eq!(line["worker_id"], executor.as_str(), "{line}");
    }
    // So does every broker line about the task, from the dispatch to the report (through the
    // broker's span of the assignment): none names the task or execution without the fields.
    let broker_id = format!("{prefix}Broker");
    let mentioning: Vec<&Value> = broker
        .iter()
        .filter(|l| {
            let text = l.to_string();
            text.contains(&task_id) || text.contains(execution_id)
        })
        .collect();
    for line in &mentioning {
        assert_eq!(line["task_id"], task_id.as_str(), "{line}");
        assert_eq!(line["execution_id"], execution_id, "{line}");
        assert_eq!(line["worker_id"], broker_id.as_str(), "{line}");
    }
    let messages: Vec<&str> = mentioning
        .iter()
        .filter_map(|l| l["message"].as_str())
        .collect();
    for expected in ["dispatched", "result reported"] {
        assert!(messages.contains(&expected), "{expected}: {broker:#?}");
        // From the dispatch on, the lines name the executor running the assignment too (a
        // line's `worker_id` is its file's worker, the broker).
        let line = mentioning
            .iter()
            .find(|l| l["message"] == expected)
            .unwrap();
        assert_eq!(line["executor_worker_id"], executor.as_str(), "{line}");
    }
    // So do the lines on stderr.
    let log = sup.log_text();
    let reported = log
        .lines()
        .find(|l| l.contains("result reported") && l.contains(&task_id))
        .unwrap_or_else(|| panic!("no result reported line for {task_id}: {log}"));
    assert!(
        reported.contains(&format!("executor_worker_id={executor}"))
            && reported.contains(&format!("execution_id={execution_id}")),
        "{reported}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thread_mode_runs_the_same_work_in_one_process() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("e2e.thread", ECHO, "");
    conductor.register(&task).await;
    let mut ids = Vec::new();
    for n in 0..40 {
        ids.push(conductor.start_workflow(&task, json!({"n": n})).await);
    }
    let mut sup =
        SupervisorProc::start(&task, &conductor, 3, &[("PERAGO_EXECUTION_MODE", "thread")]);
    let prefix = task.prefix();
    let mut workers = BTreeSet::new();
    for (n, id) in ids.iter().enumerate() {
        let wf = conductor.wait_terminal(id, Duration::from_secs(60)).await;
        assert_eq!(wf["status"], "COMPLETED", "{wf:#}");
        assert_eq!(wf["output"]["result"]["echo"], json!({"n": n}));
        workers.insert(task_of(&wf)["workerId"].as_str().unwrap().to_owned());
    }
    assert!(
        workers
            .iter()
            .all(|w| w.starts_with(&prefix) && w.len() == prefix.len() + 4)
    );
    // No broker or executor processes: only the bodies ever ran as children.
    assert!(
        children_of(sup.pid())
            .iter()
            .all(|p| !p.argv[0].starts_with("perago-")),
        "{:?}",
        children_of(sup.pid())
    );
    sup.signal("TERM");
    assert_eq!(
        sup.wait_exit(Duration::from_secs(30)).await.code(),
        Some(0),
        "{}",
        sup.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_with_random_executor_kills_loses_nothing() {
    let conductor = Conductor::start().await;
    // Bodies take a little while so kills land mid-task; every attempt may be retried.
    let task = TaskFixture::new(
        "e2e.soak",
        "read params\nsleep 0.05\nprintf '{\"echo\": %s}' \"$params\"\n",
        "retry_count = 10",
    );
    conductor.register(&task).await;
    let mut ids = Vec::new();
    for n in 0..300 {
        ids.push(conductor.start_workflow(&task, json!({"n": n})).await);
    }
    let sup = SupervisorProc::start(&task, &conductor, 4, &[]);
    // Deterministic "random" victims: a small LCG, so a failure reproduces.
    let mut seed: u32 = 0x5eed;
    let mut kills = 0;
    while kills < 10 {
        seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        let slot = (seed >> 16) % 4 + 1;
        let name = format!("perago-executor-{slot:04}");
        let victim = eventually(
            &format!("{name} to run"),
            Duration::from_secs(20),
            || async { child_named(sup.pid(), &name) },
        )
        .await;
        signal_pid(victim.pid, "KILL");
        kills += 1;
        // Let the runtime make progress between kills (and the slot come back).
        eventually(
            &format!("{name} to come back"),
            Duration::from_secs(40),
            || async { child_named(sup.pid(), &name).filter(|p| p.pid != victim.pid) },
        )
        .await;
    }
    for (n, id) in ids.iter().enumerate() {
        let wf = conductor.wait_terminal(id, Duration::from_secs(120)).await;
        assert_eq!(wf["status"], "COMPLETED", "workflow {n}: {wf:#}");
        assert_eq!(wf["output"]["result"]["echo"], json!({"n": n}));
    }
    let restarts = sup.log_text().matches("restarting the slot").count();
    assert_eq!(restarts, 10, "{}", sup.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rust_task_binary_runs_as_the_executor() {
    let conductor = Conductor::start().await;
    let sum = env!("CARGO_BIN_EXE_perago-example-sum");
    // ALERT_ONLY: Conductor's own timeoutSeconds would otherwise race the executor's limit and
    // time the workflow out first.
    let task = TaskFixture::new(
        "e2e.sum",
        "",
        "retry_count = 0\ntimeout_policy = \"ALERT_ONLY\"",
    );
    // Point body.executor at the example binary instead of a shell body.
    let manifest = std::fs::read_to_string(task.manifest())
        .unwrap()
        .replace(
            "command = [\"sh\", \"body.sh\"]",
            &format!("executor = \"{sum}\""),
        )
        .replace("timeout_seconds = 60", "timeout_seconds = 2");
    std::fs::write(task.manifest(), manifest).unwrap();
    conductor.register(&task).await;
    // The panic's message is what is tested, not its backtrace: with RUST_BACKTRACE set (as it
    // is in CI) the default hook symbolizes the debug binary's backtrace on the body's thread,
    // inside the 2 s limit, and under load that alone took over 2 s ("timed out after 2s").
    let sup = SupervisorProc::start(&task, &conductor, 2, &[("RUST_BACKTRACE", "0")]);
    let prefix = task.prefix();
    let ok = conductor
        .start_workflow(&task, json!({"a": 40, "b": 2}))
        .await;
    let bad = conductor.start_workflow(&task, json!({"b": 2})).await;
    let panics = conductor
        .start_workflow(&task, json!({"a": 1, "panic": true}))
        .await;
    let slow = conductor
        .start_workflow(&task, json!({"a": 1, "sleep_ms": 5000}))
        .await;

    let wf = conductor.wait_terminal(&ok, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
    assert_eq!(wf["output"]["result"]["sum"], 42);
    let wf = conductor.wait_terminal(&bad, Duration::from_secs(30)).await;
    assert_eq!(task_of(&wf)["status"], "FAILED_WITH_TERMINAL_ERROR");
    assert_eq!(
        task_of(&wf)["reasonForIncompletion"],
        "params.a must be an integer"
    );
    let wf = conductor
        .wait_terminal(&panics, Duration::from_secs(30))
        .await;
    assert_eq!(task_of(&wf)["status"], "FAILED");
    assert_eq!(
        task_of(&wf)["reasonForIncompletion"],
        "body panicked: asked to panic"
    );
    let wf = conductor
        .wait_terminal(&slow, Duration::from_secs(30))
        .await;
    assert_eq!(task_of(&wf)["status"], "FAILED", "{wf:#}");
    assert_eq!(
        task_of(&wf)["reasonForIncompletion"],
        "body timed out after 2s (task.timeout_seconds); the executor restarts to stop it"
    );
    // The overrun executor was replaced.
    let worker = task_of(&wf)["workerId"].as_str().unwrap().to_owned();
    assert!(worker.starts_with(&prefix));
    eventually(
        "the overrun executor to be restarted",
        Duration::from_secs(10),
        || async { sup.log_text().contains("restarting the slot").then_some(()) },
    )
    .await;
    // ps shows the slot names for a Rust task binary too.
    assert!(
        child_named(sup.pid(), "perago-executor-0001").is_some()
            || child_named(sup.pid(), "perago-executor-0002").is_some()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_broker_stops_the_runtime_with_exit_one() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("e2e.brokerdeath", ECHO, "");
    conductor.register(&task).await;
    let mut sup = SupervisorProc::start(&task, &conductor, 2, &[]);
    let broker = eventually("the broker to run", Duration::from_secs(20), || async {
        child_named(sup.pid(), "perago-conductor-broker")
    })
    .await;
    let executors: Vec<u32> = eventually("two executors", Duration::from_secs(20), || async {
        let pids: Vec<u32> = children_of(sup.pid())
            .into_iter()
            .filter(|p| p.argv[0].starts_with("perago-executor-"))
            .map(|p| p.pid)
            .collect();
        (pids.len() == 2).then_some(pids)
    })
    .await;
    signal_pid(broker.pid, "KILL");
    let status = sup.wait_exit(Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(1), "{}", sup.log_text());
    for pid in executors {
        assert!(!alive(pid), "executor {pid} outlived the supervisor");
    }
    let log = sup.log_text();
    assert!(
        log.contains("error: the broker exited (signal 9 (SIGKILL)) while the runtime was running"),
        "{log}"
    );
    assert!(
        !log.contains("restarting the slot"),
        "no restarts without a broker: {log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_kill_after_the_deadline_reports_the_killed_task() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new(
        "e2e.stuck",
        "read params\ntouch started\nexec sleep 60\n",
        "",
    );
    conductor.register(&task).await;
    let mut sup = SupervisorProc::start(
        &task,
        &conductor,
        1,
        &[("PERAGO_SHUTDOWN_FORCE_KILL_AFTER", "1s")],
    );
    let id = conductor.start_workflow(&task, json!({})).await;
    let marker = task.dir.path().join("started");
    eventually("the body to start", Duration::from_secs(20), || async {
        marker.exists().then_some(())
    })
    .await;
    let executor = child_named(sup.pid(), "perago-executor-0001").expect("executor");
    sup.signal("TERM");
    // A second signal during the drain is logged, not a kill.
    eventually("the drain to start", Duration::from_secs(5), || async {
        sup.log_text().contains("SIGTERM: draining").then_some(())
    })
    .await;
    sup.signal("INT");
    let status = sup.wait_exit(Duration::from_secs(30)).await;
    let log = sup.log_text();
    assert!(log.contains("SIGINT during drain: ignored"), "{log}");
    let kill_line = log
        .lines()
        .find(|l| l.contains("force-killing an executor"))
        .unwrap_or_else(|| panic!("no force-kill line: {log}"));
    for field in [
        format!("worker_id={}0001", task.prefix()),
        format!("pid={}", executor.pid),
        "phase=body".to_owned(),
        "deadline_s=1".to_owned(),
    ] {
        assert!(kill_line.contains(&field), "{field} missing: {kill_line}");
    }
    assert!(!alive(executor.pid));
    // The broker reported the killed assignment before it went.
    let wf = conductor.workflow(&id).await;
    let first = &wf["tasks"][0];
    assert_eq!(first["status"], "FAILED", "{wf:#}\n{log}");
    assert!(
        first["reasonForIncompletion"]
            .as_str()
            .unwrap()
            .contains("exited (killed by the supervisor at the shutdown deadline, PERAGO_SHUTDOWN_FORCE_KILL_AFTER=1s after the drain started: signal 9 (SIGKILL)) while running execution"),
        "{wf:#}"
    );
    assert_eq!(status.code(), Some(3), "a forced shutdown exits 3: {log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_update_v2_gets_v1_updates() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("e2e.v1", ECHO, "");
    conductor.register(&task).await;
    conductor
        .server
        .faults()
        .add(FaultSpec {
            method: Some("POST".into()),
            path: "/api/tasks/update-v2".into(),
            status: Some(405),
            ..FaultSpec::default()
        })
        .unwrap();
    let sup = SupervisorProc::start(&task, &conductor, 2, &[]);
    let mut ids = Vec::new();
    for n in 0..10 {
        ids.push(conductor.start_workflow(&task, json!({"n": n})).await);
    }
    for id in &ids {
        let wf = conductor.wait_terminal(id, Duration::from_secs(30)).await;
        assert_eq!(wf["status"], "COMPLETED", "{wf:#}");
    }
    let log = sup.log_text();
    assert_eq!(
        log.matches("has no usable update-v2; using v1 from now on")
            .count(),
        1,
        "{log}"
    );
}
