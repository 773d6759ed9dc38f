//! Executor recycling end to end: `--max-tasks-per-executor` and `--max-executor-memory`
//! replace an executor between assignments, at once and without failing anything.

use crate::harness::{Conductor, SupervisorProc, TaskFixture, eventually};
use serde_json::{Value, json};
use std::{collections::BTreeSet, process::Command, time::Duration};

/// `status --json` of the running supervisor.
fn status(sup: &SupervisorProc) -> Option<Value> {
    let socket = sup.workspace_root().join("run/broker.sock");
    let out = Command::new(crate::harness::SUPERVISOR)
        .args(["status", "--json", "--socket", socket.to_str().unwrap()])
        .output()
        .ok()?;
    serde_json::from_slice(&out.stdout).ok()
}

/// The `(generation, pid)` of every executor the supervisor started for slot 1, from its log.
fn executors_of_slot_1(log: &str) -> BTreeSet<(u64, u64)> {
    let field = |line: &str, name: &str| -> Option<u64> {
        let at = line.find(&format!(" {name}="))? + name.len() + 2;
        line[at..]
            .split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    log.lines()
        .filter(|l| l.contains("executor started") && field(l, "slot") == Some(1))
        .filter_map(|l| Some((field(l, "generation")?, field(l, "pid")?)))
        .collect()
}

async fn recycle_by_count(mode: &str) {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new(
        "e2e.recycle",
        "cat > /dev/null\necho '{\"ok\": true}'\n",
        "",
    );
    conductor.register(&task).await;
    let mut ids = Vec::new();
    for n in 0..10 {
        ids.push(conductor.start_workflow(&task, json!({ "n": n })).await);
    }
    let sup = SupervisorProc::start(
        &task,
        &conductor,
        1,
        &[
            ("PERAGO_EXECUTOR_MAX_TASKS", "3"),
            ("PERAGO_EXECUTION_MODE", mode),
        ],
    );
    for id in &ids {
        let wf = conductor.wait_terminal(id, Duration::from_secs(30)).await;
        assert_eq!(wf["status"], "COMPLETED", "{mode}: {wf}");
        assert_eq!(wf["tasks"].as_array().unwrap().len(), 1, "{mode}: no retry");
    }
    // 10 tasks, 3 per executor: generations 1..=4, three of them recycled.
    let counters = eventually(
        "three recycled executors",
        Duration::from_secs(10),
        || async {
            let counters = status(&sup)?["counters"].clone();
            (counters["executors_recycled"] == 3).then_some(counters)
        },
    )
    .await;
    assert_eq!(counters["executor_exits"], 0, "{mode}: {counters}");
    assert_eq!(counters["failed"], 0, "{mode}: {counters}");
    let log = sup.log_text();
    let started = executors_of_slot_1(&log);
    let generations: BTreeSet<u64> = started.iter().map(|(g, _)| *g).collect();
    assert_eq!(generations, (1..=4).collect(), "{mode}: {log}");
    if mode == "process" {
        let pids: BTreeSet<u64> = started.iter().map(|(_, p)| *p).collect();
        assert_eq!(pids.len(), 4, "{log}");
    }
    assert_eq!(
        log.matches("executor recycled: restarting the slot at once")
            .count(),
        3,
        "{mode}: {log}"
    );
    assert!(
        !log.contains("slot restart scheduled"),
        "{mode}: no backoff: {log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_is_replaced_after_max_tasks_without_backoff_or_failure() {
    for mode in ["process", "thread"] {
        recycle_by_count(mode).await;
    }
}

/// A jsonl body that keeps 80 MiB after a request with `grow`.
const GROWING: &str = r#"
import json, sys
kept = []
for line in sys.stdin:
    req = json.loads(line)
    if "cancel" in req:
        continue
    if req["params"].get("grow"):
        block = bytearray(80 * 1024 * 1024)
        for i in range(0, len(block), 4096):
            block[i] = 1
        kept.append(block)
    out = {"execution_id": req["execution_id"], "result": {"grew": bool(kept)}}
    print(json.dumps(out), flush=True)
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jsonl_body_growing_past_max_executor_memory_is_recycled_after_that_assignment() {
    for mode in ["process", "thread"] {
        recycle_by_memory(mode).await;
    }
}

async fn recycle_by_memory(mode: &str) {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("e2e.recyclemem", "", "").with_file("body.py", GROWING);
    let manifest = std::fs::read_to_string(task.manifest()).unwrap().replace(
        "command = [\"sh\", \"body.sh\"]",
        "command = [\"python3\", \"-u\", \"body.py\"]\nprotocol = \"jsonl\"",
    );
    std::fs::write(task.manifest(), manifest).unwrap();
    conductor.register(&task).await;
    let sup = SupervisorProc::start(
        &task,
        &conductor,
        1,
        &[
            ("PERAGO_EXECUTOR_MAX_MEMORY", "64MiB"),
            ("PERAGO_EXECUTION_MODE", mode),
        ],
    );
    let recycled = || async { status(&sup).map(|s| s["counters"]["executors_recycled"].clone()) };

    // Below the limit: the executor stays.
    let small = conductor.start_workflow(&task, json!({})).await;
    let wf = conductor
        .wait_terminal(&small, Duration::from_secs(20))
        .await;
    assert_eq!(wf["status"], "COMPLETED", "{wf}");
    assert_eq!(wf["output"]["result"], json!({"grew": false}));
    assert_eq!(recycled().await, Some(json!(0)));

    // The assignment that crosses it completes, then the executor is replaced.
    let big = conductor.start_workflow(&task, json!({"grow": true})).await;
    let wf = conductor.wait_terminal(&big, Duration::from_secs(20)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf}");
    assert_eq!(wf["output"]["result"], json!({"grew": true}));
    eventually(
        "the executor to be recycled",
        Duration::from_secs(10),
        || async { (recycled().await? == json!(1)).then_some(()) },
    )
    .await;
    let generations = eventually("the next generation", Duration::from_secs(10), || async {
        let g: BTreeSet<u64> = executors_of_slot_1(&sup.log_text())
            .into_iter()
            .map(|(g, _)| g)
            .collect();
        (g.len() == 2).then_some(g)
    })
    .await;
    assert_eq!(generations, BTreeSet::from([1, 2]));
    let log = sup.log_text();
    // Thread mode: the executor shares the supervisor's process; only its body counts.
    let measured = if mode == "process" {
        "(executor and bodies) above --max-executor-memory 64MiB"
    } else {
        "(bodies) above --max-executor-memory 64MiB"
    };
    assert!(log.contains(measured), "{mode}: {log}");
    assert!(!log.contains("slot restart scheduled"), "{log}");

    // The fresh generation (and a fresh body) takes the next task.
    let after = conductor.start_workflow(&task, json!({})).await;
    let wf = conductor
        .wait_terminal(&after, Duration::from_secs(20))
        .await;
    assert_eq!(wf["output"]["result"], json!({"grew": false}), "{wf}");
}

/// The recycling exit code alone does not make a recycle: an executor that exits 75 without
/// having told the broker (a `body.executor` binary's own exit, say) is restarted with the
/// usual backoff, not at once in a tight loop.
#[tokio::test]
async fn an_executor_exiting_75_on_its_own_is_restarted_with_backoff() {
    use std::os::unix::fs::PermissionsExt as _;
    let conductor = Conductor::start().await;
    let task =
        TaskFixture::new("e2e.exit75", "cat\n", "").with_file("exit75.sh", "#!/bin/sh\nexit 75\n");
    let fake = task.dir.path().join("exit75.sh");
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    conductor.register(&task).await;
    let sup = SupervisorProc::start(
        &task,
        &conductor,
        1,
        &[
            ("PERAGO_EXECUTOR_MAX_TASKS", "1"),
            ("PERAGO_EXECUTOR_BIN", fake.to_str().unwrap()),
        ],
    );
    // The second exit comes a second after the first, and its restart waits two.
    eventually(
        "a second restart with a longer backoff",
        Duration::from_secs(20),
        || async {
            let log = sup.log_text();
            (log.contains("slot restart scheduled") && log.contains("restart_in_s=2")).then_some(())
        },
    )
    .await;
    let log = sup.log_text();
    assert!(!log.contains("executor recycled"), "{log}");
    assert!(log.contains("75"), "{log}");
}
