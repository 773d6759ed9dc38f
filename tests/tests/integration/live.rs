//! Changes without a restart (issue #26 item 4), end to end: `perago-supervisor scale` changes
//! a running runtime's executor count under load, slots and worker ids stay, a retired
//! executor finishes its task first, and no task is lost or failed.

use crate::adaptive::status;
use crate::harness::{Conductor, SUPERVISOR, SupervisorProc, TaskFixture, eventually};
use perago_proto::admin::v1::{SlotState, StatusResponse};
use serde_json::json;
use std::{collections::BTreeSet, path::Path, time::Duration};

/// Takes 0.3 s, then echoes the worker id it ran on.
const SHORT: &str = r#"read params
sleep 0.3
printf '{"worker": "%s"}' "$PERAGO_WORKER_ID"
"#;

fn scale(root: &Path, jobs: &str) -> perago_tests::Run {
    perago_tests::Run::of(perago_tests::command(SUPERVISOR).args([
        "scale",
        "--socket",
        root.join("run/broker.sock").to_str().unwrap(),
        "-j",
        jobs,
    ]))
}

fn running(s: &StatusResponse) -> Vec<u32> {
    s.slots
        .iter()
        .filter(|slot| matches!(slot.state(), SlotState::Busy | SlotState::Idle))
        .map(|slot| slot.slot)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_up_and_down_under_load_loses_and_fails_nothing() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("live.scale", SHORT, "");
    conductor.register(&task).await;
    let mut ids = Vec::new();
    for n in 0..60 {
        ids.push(conductor.start_workflow(&task, json!({"n": n})).await);
    }
    let mut sup = SupervisorProc::start(&task, &conductor, 2, &[]);
    let root = sup.workspace_root();
    eventually("two executors running", Duration::from_secs(15), || async {
        let s = status(&root).await?;
        (running(&s) == [1, 2]).then_some(())
    })
    .await;

    // A bad count is refused, naming the setting; the runtime is untouched.
    let bad = scale(&root, "0");
    assert_ne!(bad.code, Some(0), "{bad:?}");
    assert!(bad.stderr.contains("-j"), "{bad:?}");

    // Up to four: slots 3 and 4 are added and run, under their own worker ids.
    let up = scale(&root, "4");
    assert_eq!(up.code, Some(0), "{up:?}");
    assert!(up.stdout.contains("-j 2 -> -j 4"), "{up:?}");
    let s = eventually(
        "four executors running",
        Duration::from_secs(15),
        || async {
            let s = status(&root).await?;
            (running(&s) == [1, 2, 3, 4]).then_some(s)
        },
    )
    .await;
    let prefix = task.prefix();
    let ids_now: Vec<_> = s.slots.iter().map(|s| s.worker_id.clone()).collect();
    let expected: Vec<_> = (1..=4).map(|n| format!("{prefix}{n:04}")).collect();
    assert_eq!(ids_now, expected);
    let c = s.capacity.unwrap();
    assert_eq!((c.min_executors, c.max_executors), (4, 4));

    // Down to one while they are busy: slots 2..4 finish their tasks, then retire.
    let down = scale(&root, "1");
    assert_eq!(down.code, Some(0), "{down:?}");
    let mut workers = BTreeSet::new();
    for id in &ids {
        let wf = conductor.wait_terminal(id, Duration::from_secs(60)).await;
        assert_eq!(wf["status"], "COMPLETED", "{wf:#}");
        assert_eq!(wf["tasks"].as_array().unwrap().len(), 1, "no retry: {wf:#}");
        workers.insert(
            wf["output"]["result"]["worker"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    assert!(
        workers.len() >= 3,
        "the added slots took tasks: {workers:?}"
    );
    let end = eventually("three slots retired", Duration::from_secs(15), || async {
        let s = status(&root).await?;
        (s.slots.iter().map(|s| s.state()).collect::<Vec<_>>()
            == [
                SlotState::Idle,
                SlotState::Retired,
                SlotState::Retired,
                SlotState::Retired,
            ])
        .then_some(s)
    })
    .await;
    let counters = end.counters.unwrap();
    assert_eq!(counters.completed, 60);
    assert_eq!(
        (
            counters.failed,
            counters.failed_terminal,
            counters.executor_exits
        ),
        (0, 0, 0),
        "{counters:?}"
    );
    let c = end.capacity.unwrap();
    assert_eq!(
        (c.min_executors, c.max_executors, c.wanted_executors),
        (1, 1, 1)
    );
    let table = perago_tests::Run::of(perago_tests::command(SUPERVISOR).args([
        "status",
        "--socket",
        root.join("run/broker.sock").to_str().unwrap(),
    ]));
    assert!(table.stdout.contains("retired"), "{table:?}");
    assert!(
        table
            .stdout
            .contains("executors 1 (scaled down: the slots above it are retired)"),
        "{table:?}"
    );
    let log = sup.log_text();
    assert!(!log.contains("slot restart scheduled"), "{log}");

    // A range makes it adaptive: a new backlog grows it again, within the range.
    assert_eq!(scale(&root, "1..3").code, Some(0));
    let mut more = Vec::new();
    for n in 0..12 {
        more.push(conductor.start_workflow(&task, json!({"n": n})).await);
    }
    for id in &more {
        let wf = conductor.wait_terminal(id, Duration::from_secs(60)).await;
        assert_eq!(wf["status"], "COMPLETED", "{wf:#}");
    }
    let s = status(&root).await.unwrap();
    assert_eq!(
        s.slots[3].state(),
        SlotState::Retired,
        "slot 4 is above the range"
    );
    sup.signal("TERM");
    assert_eq!(sup.wait_exit(Duration::from_secs(20)).await.code(), Some(0));
}

/// `scale` without a MANIFEST or --socket is a usage error naming both (it used to scale every
/// runtime of the user); with several manifests every runtime is tried, a runtime that does
/// not answer is reported after the others were scaled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_needs_a_target_and_tries_every_runtime() {
    let bare = perago_tests::Run::of(perago_tests::command(SUPERVISOR).args(["scale", "-j", "2"]));
    assert_eq!(bare.code, Some(2), "{bare:?}");
    assert!(
        bare.stderr.contains("<MANIFEST|--socket <SOCKET>>"),
        "{bare:?}"
    );

    let conductor = Conductor::start().await;
    let a = TaskFixture::new("live.each_a", SHORT, "");
    let b = TaskFixture::new("live.each_b", SHORT, "");
    let absent = TaskFixture::new("live.each_absent", SHORT, "");
    conductor.register(&a).await;
    conductor.register(&b).await;
    let mut sup = SupervisorProc::start_many(&[&a, &b], &conductor, &["1"], &[]);
    let ws = sup.workspace_root();
    for task in [&a, &b] {
        let root = ws.join(&task.name);
        eventually("the runtime serves", Duration::from_secs(15), || async {
            status(&root).await.map(|_| ())
        })
        .await;
    }
    // The runtime that does not run comes first: the two after it are still scaled.
    let run = perago_tests::Run::of(
        perago_tests::command(SUPERVISOR)
            .arg("scale")
            .args([absent.manifest(), a.manifest(), b.manifest()])
            .args(["-j", "2"])
            .env("PERAGO_WORKSPACE_ROOT", &ws)
            .env("XDG_STATE_HOME", ws.join("no-records")),
    );
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(
        run.stderr.contains("live.each_absent/run/broker.sock"),
        "{run:?}"
    );
    assert_eq!(run.stdout.matches("-j 1 -> -j 2").count(), 2, "{run:?}");
    for task in [&a, &b] {
        let c = status(&ws.join(&task.name))
            .await
            .unwrap()
            .capacity
            .unwrap();
        assert_eq!((c.min_executors, c.max_executors), (2, 2));
    }
    sup.signal("TERM");
    assert_eq!(sup.wait_exit(Duration::from_secs(20)).await.code(), Some(0));
}
