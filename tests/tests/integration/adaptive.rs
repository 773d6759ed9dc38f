//! The adaptive executor count (`-j MIN..MAX`) end to end: the broker reads the task type's
//! queue depth, wants more slots while tasks wait, and retires slots idle for
//! `PERAGO_SCALE_DOWN_AFTER`; the supervisor starts and leaves stopped what the broker wants.

use crate::harness::{Conductor, SupervisorProc, TaskFixture, children_of, eventually};
use perago_proto::admin::v1::{
    SlotState, StatusRequest, StatusResponse, admin_client::AdminClient,
};
use serde_json::json;
use std::{collections::BTreeSet, path::Path, time::Duration};

/// Takes a second, then echoes the worker id it ran on.
const SLEEPY: &str = r#"read params
sleep 1
printf '{"worker": "%s"}' "$PERAGO_WORKER_ID"
"#;

/// The broker's Admin.Status of the runtime under `root`, if it answers.
pub(crate) async fn status(root: &Path) -> Option<StatusResponse> {
    let channel = perago_core::socket::connect(&root.join("run/broker.sock"))
        .await
        .ok()?;
    AdminClient::new(channel)
        .status(StatusRequest {})
        .await
        .ok()
        .map(tonic::Response::into_inner)
}

fn states(status: &StatusResponse) -> Vec<SlotState> {
    status.slots.iter().map(|s| s.state()).collect()
}

/// Executor processes of the supervisor `pid`.
fn executors(pid: u32) -> usize {
    children_of(pid)
        .iter()
        .filter(|p| {
            p.argv
                .first()
                .is_some_and(|a| a.starts_with("perago-executor-"))
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_grows_the_executors_to_the_maximum_and_idleness_retires_them() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("adaptive.sleep", SLEEPY, "");
    conductor.register(&task).await;
    let mut ids = Vec::new();
    for n in 0..40 {
        ids.push(conductor.start_workflow(&task, json!({"n": n})).await);
    }
    let mut sup = SupervisorProc::start_args(
        &task,
        &conductor,
        "1..4",
        &[],
        &[("PERAGO_SCALE_DOWN_AFTER", "2s")],
        None,
        None,
    );
    let root = sup.workspace_root();

    // Four executors run at once, each slot busy or idle (none retired), all wanted.
    eventually(
        "four executors running",
        Duration::from_secs(15),
        || async {
            let s = status(&root).await?;
            let running = states(&s)
                .iter()
                .filter(|st| matches!(st, SlotState::Busy | SlotState::Idle))
                .count();
            (running == 4
                && s.capacity.as_ref()?.wanted_executors == 4
                && executors(sup.pid()) == 4)
                .then_some(())
        },
    )
    .await;

    let prefix = task.prefix();
    let mut workers = BTreeSet::new();
    for id in &ids {
        let wf = conductor.wait_terminal(id, Duration::from_secs(40)).await;
        assert_eq!(wf["status"], "COMPLETED", "{wf:#}");
        workers.insert(
            wf["output"]["result"]["worker"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    // The results name the stable slot ids.
    let expected: BTreeSet<String> = (1..=4).map(|n| format!("{prefix}{n:04}")).collect();
    assert_eq!(workers, expected);

    // The queue is empty: after 2 s of idleness the runtime is back to its minimum.
    let end = eventually("three slots retired", Duration::from_secs(15), || async {
        let s = status(&root).await?;
        (states(&s)
            == [
                SlotState::Idle,
                SlotState::Retired,
                SlotState::Retired,
                SlotState::Retired,
            ]
            && executors(sup.pid()) == 1)
            .then_some(s)
    })
    .await;
    let capacity = end.capacity.unwrap();
    assert_eq!(
        (capacity.wanted_executors, capacity.queue_depth),
        (1, 0),
        "{capacity:?}"
    );
    let counters = end.counters.unwrap();
    assert_eq!((counters.scale_ups, counters.scale_downs), (3, 3));
    assert_eq!(counters.executor_exits, 0, "a retired executor is no exit");
    assert_eq!(counters.completed, 40);
    // Retired slots stay stopped: nothing is restarted.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(executors(sup.pid()), 1);
    let log = sup.log_text();
    assert!(!log.contains("slot restart scheduled"), "{log}");
    assert_eq!(
        log.matches("executor retired (scale down)").count(),
        3,
        "{log}"
    );

    sup.signal("TERM");
    assert_eq!(sup.wait_exit(Duration::from_secs(20)).await.code(), Some(0));
}

/// Thread mode: the same decisions, carried out on executor tasks of the supervisor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thread_mode_scales_up_and_down_too() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("adaptive.thread", SLEEPY, "");
    conductor.register(&task).await;
    let mut ids = Vec::new();
    for n in 0..8 {
        ids.push(conductor.start_workflow(&task, json!({"n": n})).await);
    }
    let mut sup = SupervisorProc::start_args(
        &task,
        &conductor,
        "1..2",
        &["--execution-mode", "thread"],
        &[("PERAGO_SCALE_DOWN_AFTER", "1s")],
        None,
        None,
    );
    let root = sup.workspace_root();
    eventually("two slots running", Duration::from_secs(15), || async {
        let s = status(&root).await?;
        (states(&s)
            .iter()
            .all(|st| matches!(st, SlotState::Busy | SlotState::Idle))
            && s.capacity.as_ref()?.wanted_executors == 2)
            .then_some(())
    })
    .await;
    for id in &ids {
        let wf = conductor.wait_terminal(id, Duration::from_secs(30)).await;
        assert_eq!(wf["status"], "COMPLETED", "{wf:#}");
    }
    // Retired in the broker's view, and its thread's end seen by the supervisor as a retirement
    // (a SIGTERM sent before the supervisor saw it would make it an exit during the drain).
    let end = eventually("slot 2 retired", Duration::from_secs(10), || async {
        let s = status(&root).await?;
        (states(&s) == [SlotState::Idle, SlotState::Retired]
            && sup.log_text().contains("executor retired (scale down)"))
        .then_some(s)
    })
    .await;
    let counters = end.counters.unwrap();
    assert_eq!(
        (
            counters.scale_ups,
            counters.scale_downs,
            counters.executor_exits
        ),
        (1, 1, 0)
    );
    sup.signal("TERM");
    assert_eq!(sup.wait_exit(Duration::from_secs(20)).await.code(), Some(0));
    let log = sup.log_text();
    assert!(!log.contains("slot restart scheduled"), "{log}");
}

/// Issue #24, item 7: a task named `a,b` on a Conductor without `/tasks/queue/size` (404) whose
/// `/tasks/queue/sizes` splits a single `taskType=a,b` at the comma (Spring's list binding): the
/// backlog still grows the executors, since the depth is read with the name whole. Before, each
/// read failed and the count stayed at the minimum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_comma_in_the_task_name_still_scales_up() {
    use perago_devstack::faults::FaultSpec;
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("a,b", SLEEPY, "");
    conductor.register(&task).await;
    conductor
        .server
        .faults()
        .add(FaultSpec {
            method: Some("GET".into()),
            path: "/api/tasks/queue/size".into(),
            path_exact: true,
            status: Some(404),
            ..FaultSpec::default()
        })
        .unwrap();
    for n in 0..20 {
        conductor.start_workflow(&task, json!({"n": n})).await;
    }
    let sup = SupervisorProc::start_args(&task, &conductor, "1..3", &[], &[], None, None);
    let root = sup.workspace_root();
    eventually(
        "three executors wanted",
        Duration::from_secs(15),
        || async {
            let s = status(&root).await?;
            // Slots attached, not processes counted: in thread mode executors are threads.
            let attached = states(&s)
                .iter()
                .filter(|st| matches!(st, SlotState::Busy | SlotState::Idle))
                .count();
            (s.capacity.as_ref()?.wanted_executors == 3 && attached == 3).then_some(())
        },
    )
    .await;
    assert!(
        !sup.log_text().contains("cannot read the queue depth"),
        "{}",
        sup.log_text()
    );
}
