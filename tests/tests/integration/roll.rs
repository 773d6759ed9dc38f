//! Rolling body changes end to end (issue #26 item 4): the body an executor runs is the
//! version the supervisor took (version 1: the manifest as `start` checked it), never the file
//! as it is on disk later; SIGHUP re-reads the manifest and a changed body rolls in, each old
//! executor recycled after its current assignment, nothing failed.

use crate::harness::{
    Conductor, SupervisorProc, TaskFixture, child_named, eventually, gated_body, signal_pid,
    status_json, thread_mode,
};
use serde_json::{Value, json};
use std::time::Duration;

/// A body that prints the version its manifest's `[body] env` names.
const BODY: &str = "cat > /dev/null\nsleep 0.05\nprintf '{\"v\": \"%s\"}\\n' \"$V\"\n";

fn task(name: &str) -> TaskFixture {
    TaskFixture::new(name, BODY, "").with_manifest_tail("env = { V = \"one\" }\n")
}

/// Rewrites the version the manifest's body prints.
fn set_version(task: &TaskFixture, from: &str, to: &str) {
    let text = std::fs::read_to_string(task.manifest()).unwrap();
    let edited = text.replace(&format!("V = \"{from}\""), &format!("V = \"{to}\""));
    assert_ne!(text, edited);
    std::fs::write(task.manifest(), edited).unwrap();
}

/// The version the workflow's one task printed; panics unless it completed at the first
/// attempt.
fn version_of(wf: &Value) -> String {
    assert_eq!(wf["status"], "COMPLETED", "{wf}");
    let tasks = wf["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 1, "no retry, no failed attempt: {wf}");
    tasks[0]["outputData"]["result"]["v"]
        .as_str()
        .unwrap_or_else(|| panic!("{wf}"))
        .to_owned()
}

/// The runtime's body version, whether it rolls, and each slot's body version.
fn versions(status: &Value) -> Option<(u64, bool, Vec<u64>)> {
    Some((
        status["body_version"].as_u64()?,
        status["rolling"].as_bool()?,
        status["slots"]
            .as_array()?
            .iter()
            .filter_map(|s| s["body_version"].as_u64())
            .collect(),
    ))
}

/// The runtime's `perago_body_version` and `perago_body_version_oldest` on `/metrics`.
fn body_gauges(sup: &SupervisorProc, task: &TaskFixture) -> Option<(u64, u64)> {
    let log = sup.log_text();
    let at = log.find("metrics served at ")? + "metrics served at ".len();
    let url = log[at..].split_whitespace().next()?.to_owned();
    let out = std::process::Command::new("curl")
        .args(["-sf", &url])
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let gauge = |name: &str| {
        let prefix = format!("{name}{{task=\"{}\"}} ", task.name);
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
    };
    Some((
        gauge("perago_body_version")?,
        gauge("perago_body_version_oldest")?,
    ))
}

/// Editing task.toml on disk changes no executor's body: one that restarts (killed, or
/// recycled after each task) runs version 1 still, and so does one restarted after the file
/// was broken; status says version 1 throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_manifest_changes_no_body_until_a_roll() {
    let conductor = Conductor::start().await;
    let task = task("e2e.rolldisk");
    conductor.register(&task).await;
    // Every task a fresh executor, in both execution modes.
    let sup = SupervisorProc::start(&task, &conductor, 1, &[("PERAGO_EXECUTOR_MAX_TASKS", "1")]);
    let run = async |conductor: &Conductor| {
        let id = conductor.start_workflow(&task, json!({})).await;
        version_of(&conductor.wait_terminal(&id, Duration::from_secs(30)).await)
    };
    assert_eq!(run(&conductor).await, "one");
    set_version(&task, "one", "two");
    if !thread_mode() {
        // Its replacement after a kill too.
        let executor = eventually("the executor", Duration::from_secs(10), || async {
            child_named(sup.pid(), "perago-executor-0001")
        })
        .await;
        signal_pid(executor.pid, "KILL");
        eventually("its replacement", Duration::from_secs(15), || async {
            child_named(sup.pid(), "perago-executor-0001").filter(|p| p.pid != executor.pid)
        })
        .await;
    }
    assert_eq!(run(&conductor).await, "one");
    assert_eq!(run(&conductor).await, "one");
    std::fs::write(task.manifest(), "[task\nbroken").unwrap();
    assert_eq!(
        run(&conductor).await,
        "one",
        "a broken file breaks no restart"
    );
    let status = status_json(&sup.workspace_root());
    assert_eq!(versions(&status), Some((1, false, vec![1])), "{status}");
}

/// Workflows of short tasks while the body changes twice (SIGHUP after each edit): every one
/// completes at its first attempt, each output names exactly one version, the executor
/// replacements are recycles (no crash, no backoff), and once the roll ends every slot runs
/// the newest version and no older output comes any more. A broken manifest and a TaskDef
/// change are refused, and work goes on at the running version.
///
/// 90 workflows, not the 200: three slots of 50 ms tasks on a 2-core machine shared
/// with other tests finish them in a few seconds, long enough for two rolls under load, and
/// the suite runs this once per execution mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_body_rolls_twice_under_load_with_nothing_failed() {
    const WORKFLOWS: u64 = 90;
    let conductor = Conductor::start().await;
    let task = task("e2e.roll");
    conductor.register(&task).await;
    let mut ids = Vec::new();
    for n in 0..WORKFLOWS {
        ids.push(conductor.start_workflow(&task, json!({ "n": n })).await);
    }
    let sup = SupervisorProc::start(
        &task,
        &conductor,
        3,
        &[("PERAGO_METRICS_ADDR", "127.0.0.1:0")],
    );
    let root = sup.workspace_root();
    let completed_at_least = |n: u64| {
        let root = root.clone();
        async move {
            let status = status_json(&root);
            (status["counters"]["completed"].as_u64()? >= n).then_some(())
        }
    };
    eventually("the first tasks", Duration::from_secs(30), || {
        completed_at_least(WORKFLOWS / 6)
    })
    .await;
    // Refused as a whole, nothing changes: a manifest that does not check, a TaskDef change.
    let good = std::fs::read_to_string(task.manifest()).unwrap();
    std::fs::write(task.manifest(), "[task\nbroken").unwrap();
    sup.signal("HUP");
    eventually(
        "the broken manifest refused",
        Duration::from_secs(10),
        || async {
            sup.log_text()
                .contains("reload refused: manifest")
                .then_some(())
        },
    )
    .await;
    std::fs::write(
        task.manifest(),
        good.replace("retry_count = 2", "retry_count = 5")
            .replace("V = \"one\"", "V = \"two\""),
    )
    .unwrap();
    sup.signal("HUP");
    eventually(
        "the TaskDef change refused",
        Duration::from_secs(10),
        || async {
            sup.log_text()
                .contains("task.retry_count changed")
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        versions(&status_json(&root)).map(|v| v.0),
        Some(1),
        "nothing rolled"
    );
    std::fs::write(task.manifest(), &good).unwrap();
    set_version(&task, "one", "two");
    sup.signal("HUP");
    eventually("more tasks", Duration::from_secs(30), || {
        completed_at_least(WORKFLOWS / 2)
    })
    .await;
    set_version(&task, "two", "three");
    sup.signal("HUP");
    let mut seen = std::collections::BTreeMap::<String, u64>::new();
    for id in &ids {
        let wf = conductor.wait_terminal(id, Duration::from_secs(60)).await;
        *seen.entry(version_of(&wf)).or_default() += 1;
    }
    assert!(
        seen.keys()
            .all(|v| ["one", "two", "three"].contains(&v.as_str())),
        "{seen:?}"
    );
    assert!(seen.contains_key("one"), "{seen:?}");
    let status = eventually("the roll to end", Duration::from_secs(30), || async {
        let status = status_json(&root);
        (versions(&status)? == (3, false, vec![3, 3, 3])).then_some(status)
    })
    .await;
    assert_eq!(body_gauges(&sup, &task), Some((3, 3)), "/metrics");
    let counters = &status["counters"];
    assert_eq!(counters["failed"], 0, "{status}");
    assert_eq!(counters["failed_terminal"], 0, "{status}");
    assert_eq!(counters["executor_exits"], 0, "no crash: {status}");
    // After the roll: only the newest version answers.
    for n in 0..6 {
        let id = conductor.start_workflow(&task, json!({ "after": n })).await;
        let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
        assert_eq!(version_of(&wf), "three", "{wf}");
    }
    let log = sup
        .log_with("body roll finished", Duration::from_secs(5))
        .await;
    assert_eq!(
        log.matches("a new body version body_version=").count(),
        2,
        "{log}"
    );
    assert!(!log.contains("slot restart scheduled"), "no backoff: {log}");
}

/// A busy executor of the old version finishes its assignment first (its output is the old
/// version's, completed at the first attempt) while an idle one rolls at once: until then
/// `status` shows both versions and the roll under way; then every slot is at the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_executor_finishes_its_task_before_it_rolls_and_status_shows_both_versions() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new(
        "e2e.rollbusy",
        &gated_body("printf '{\"v\": \"%s\"}\\n' \"$V\"\n"),
        "",
    )
    .with_manifest_tail("env = { V = \"one\" }\n");
    conductor.register(&task).await;
    let sup = SupervisorProc::start(&task, &conductor, 2, &[]);
    let root = sup.workspace_root();
    eventually(
        "both executors attached",
        Duration::from_secs(20),
        || async {
            let status = status_json(&root);
            let idle = status["slots"]
                .as_array()?
                .iter()
                .filter(|s| s["state"] == "idle")
                .count();
            (idle == 2).then_some(())
        },
    )
    .await;
    let gate = task.gate();
    let held = conductor.start_workflow(&task, json!({})).await;
    gate.started().await;
    set_version(&task, "one", "two");
    sup.signal("HUP");
    let status = eventually("the idle slot rolled", Duration::from_secs(20), || async {
        let status = status_json(&root);
        let (version, rolling, mut slots) = versions(&status)?;
        slots.sort_unstable();
        (version == 2 && rolling && slots == [1, 2]).then_some(status)
    })
    .await;
    let busy = status["slots"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["body_version"] == 1)
        .unwrap();
    assert_eq!(
        busy["state"], "busy",
        "the old version is the busy one: {status}"
    );
    // The table says so too.
    let run = perago_tests::Run::of(perago_tests::command(crate::harness::SUPERVISOR).args([
        "status",
        "--socket",
        root.join("run/broker.sock").to_str().unwrap(),
    ]));
    assert!(
        run.stdout
            .contains("body version 2  rolling: slots at an older version: "),
        "{}",
        run.stdout
    );
    if !thread_mode() {
        use std::os::unix::fs::PermissionsExt as _;
        let file = root.join("run/body/2.json");
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", file.display());
    }
    gate.open();
    let wf = conductor
        .wait_terminal(&held, Duration::from_secs(30))
        .await;
    assert_eq!(version_of(&wf), "one", "it finished as it started");
    eventually("the roll to end", Duration::from_secs(20), || async {
        (versions(&status_json(&root))? == (2, false, vec![2, 2])).then_some(())
    })
    .await;
    let id = conductor.start_workflow(&task, json!({})).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(version_of(&wf), "two");
    // The broker's JSONL log tells the roll: started, each slot recycled, finished.
    let jsonl = sup.jsonl_dir(&task, &format!("{}Broker", task.prefix()));
    let log = eventually(
        "the broker's log of the roll",
        Duration::from_secs(10),
        || async {
            let log = std::fs::read_to_string(jsonl.join("perago.jsonl")).ok()?;
            log.contains("body roll finished").then_some(log)
        },
    )
    .await;
    assert!(log.contains("body roll started"), "{log}");
    assert_eq!(
        log.matches("executor recycled: body version 1 rolls to 2")
            .count(),
        2,
        "{log}"
    );
    let status = status_json(&root);
    assert_eq!(status["counters"]["executor_exits"], 0, "{status}");
    assert_eq!(status["counters"]["failed"], 0, "{status}");
}

/// A roll may change what runs the body: from a command to a Rust task binary
/// (`body.executor`), which the next generations run in place of the stock executor. Thread
/// mode cannot run such a binary at all: the roll is refused there, saying why, and the running
/// version keeps running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roll_can_change_the_command_for_a_task_binary_where_the_mode_runs_one() {
    let conductor = Conductor::start().await;
    let sum = env!("CARGO_BIN_EXE_perago-example-sum");
    let task = TaskFixture::new(
        "e2e.rollbin",
        "cat > /dev/null\necho '{\"sum\": \"from the command\"}'\n",
        "",
    );
    conductor.register(&task).await;
    let sup = SupervisorProc::start(&task, &conductor, 1, &[]);
    let sum_of = async |conductor: &Conductor| {
        let id = conductor
            .start_workflow(&task, json!({"a": 40, "b": 2}))
            .await;
        let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
        assert_eq!(wf["status"], "COMPLETED", "{wf}");
        wf["output"]["result"]["sum"].clone()
    };
    assert_eq!(sum_of(&conductor).await, "from the command");
    let manifest = std::fs::read_to_string(task.manifest()).unwrap().replace(
        "command = [\"sh\", \"body.sh\"]",
        &format!("executor = \"{sum}\""),
    );
    std::fs::write(task.manifest(), manifest).unwrap();
    sup.signal("HUP");
    let root = sup.workspace_root();
    if thread_mode() {
        eventually("the refusal", Duration::from_secs(10), || async {
            sup.log_text()
                .contains("cannot run in thread mode")
                .then_some(())
        })
        .await;
        assert_eq!(sum_of(&conductor).await, "from the command");
        assert_eq!(versions(&status_json(&root)).map(|v| v.0), Some(1));
    } else {
        eventually("the roll to end", Duration::from_secs(20), || async {
            (versions(&status_json(&root))? == (2, false, vec![2])).then_some(())
        })
        .await;
        assert_eq!(sum_of(&conductor).await, 42);
    }
}

/// `perago-supervisor reload` rolls a changed body in and says so (the version and what
/// changed); the runtime ends at the new version on every slot, the next task prints it, and a
/// second reload is a no-op.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reload_command_rolls_a_changed_body_and_says_so() {
    let conductor = Conductor::start().await;
    let task = task("e2e.rollcmd");
    conductor.register(&task).await;
    let sup = SupervisorProc::start(&task, &conductor, 2, &[]);
    let root = sup.workspace_root();
    let run = async |conductor: &Conductor| {
        let id = conductor.start_workflow(&task, json!({})).await;
        version_of(&conductor.wait_terminal(&id, Duration::from_secs(30)).await)
    };
    assert_eq!(run(&conductor).await, "one");
    set_version(&task, "one", "two");
    let manifest = task.manifest();
    let out = crate::reload::reload(&[manifest.to_str().unwrap()], &root);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        out.stdout
            .contains("e2e.rollcmd: the body rolls to version 2 (body.env changed)"),
        "{out:?}"
    );
    eventually("the roll to end", Duration::from_secs(20), || async {
        (versions(&status_json(&root))? == (2, false, vec![2, 2])).then_some(())
    })
    .await;
    assert_eq!(run(&conductor).await, "two");
    let again = crate::reload::reload(&[manifest.to_str().unwrap()], &root);
    assert_eq!(again.code, Some(0), "{again:?}");
    assert!(again.stdout.contains("e2e.rollcmd: unchanged"), "{again:?}");
}
