//! Run once (`start --once`): the runtime works until Conductor has no task of its type left
//! and every slot is idle, then drains and exits 0.

use crate::harness::{Conductor, SupervisorProc, TaskFixture, patience};
use serde_json::json;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const ECHO: &str = "read params\nsleep 0.2\necho '{}'\n";

fn now_ms() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_works_through_the_queue_then_exits_0() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("once.echo", ECHO, "");
    conductor.register(&task).await;
    let mut ids = Vec::new();
    for n in 0..20 {
        ids.push(conductor.start_workflow(&task, json!({"n": n})).await);
    }
    let mut sup = SupervisorProc::start_args(&task, &conductor, "2", &["--once"], &[], None, None);
    let status = sup.wait_exit(Duration::from_secs(30)).await;
    let exited_ms = now_ms();
    let log = sup.log_text();
    assert_eq!(status.code(), Some(0), "{log}");
    let mut last_end = 0;
    for id in &ids {
        let wf = conductor.workflow(id).await;
        assert_eq!(wf["status"], "COMPLETED", "{wf:#}");
        last_end = last_end.max(wf["endTime"].as_i64().unwrap());
    }
    // Within a few seconds of the last completion (a short poll, a queue read a second
    // later, the drain).
    let after = exited_ms - last_end;
    let bound = i64::try_from(patience(Duration::from_secs(4)).as_millis()).unwrap();
    assert!(
        (0..bound).contains(&after),
        "exited {after} ms after the last completion\n{log}"
    );
    assert!(
        log.contains("run once: no task of once.echo left and every slot idle; draining"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_with_an_empty_queue_exits_0_promptly_in_both_modes() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("once.empty", ECHO, "");
    conductor.register(&task).await;
    let started = std::time::Instant::now();
    let mut sup = SupervisorProc::start_args(
        &task,
        &conductor,
        "2",
        &[],
        &[("PERAGO_ONCE", "1")],
        None,
        None,
    );
    let status = sup.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(status.code(), Some(0), "{}", sup.log_text());
    assert!(started.elapsed() < patience(Duration::from_secs(8)));

    // Thread mode: the broker runs in the supervisor's process; its clean end is the drain's.
    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(conductor.start_workflow(&task, json!({"n": n})).await);
    }
    let mut sup = SupervisorProc::start_args(
        &task,
        &conductor,
        "2",
        &["--once", "--execution-mode", "thread"],
        &[],
        None,
        None,
    );
    let status = sup.wait_exit(Duration::from_secs(20)).await;
    assert_eq!(status.code(), Some(0), "{}", sup.log_text());
    for id in &ids {
        assert_eq!(conductor.workflow(id).await["status"], "COMPLETED");
    }
}

/// Issue #23: run once with the deprecated `GET /tasks/queue/sizes` refused (500, every time)
/// reads the depth from `GET /tasks/queue/size`; with both refused it ends after empty polls.
/// Either way it completes the queued tasks and exits 0 within a bound, and says once, at
/// warn, that it cannot read the depth. Before, every poll stayed held after the first empty
/// one and the runtime never exited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_finishes_when_the_queue_size_routes_fail() {
    use perago_devstack::faults::FaultSpec;
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("once.sizes", ECHO, "");
    conductor.register(&task).await;
    for (refused, falls_back_to_polls) in [
        ("/api/tasks/queue/sizes", false),
        // A prefix: both `/queue/size` and `/queue/sizes`.
        ("/api/tasks/queue/size", true),
    ] {
        conductor.server.faults().clear();
        let rule = conductor
            .server
            .faults()
            .add(FaultSpec {
                method: Some("GET".into()),
                path: refused.into(),
                status: Some(500),
                ..FaultSpec::default()
            })
            .unwrap();
        let mut ids = Vec::new();
        for n in 0..6 {
            ids.push(conductor.start_workflow(&task, json!({"n": n})).await);
        }
        let started = std::time::Instant::now();
        let mut sup = SupervisorProc::start_args(
            &task,
            &conductor,
            "2",
            &["--once"],
            &[("PERAGO_POLL_WAIT_MS", "500")],
            None,
            None,
        );
        let status = sup.wait_exit(Duration::from_secs(30)).await;
        let log = sup.log_text();
        assert_eq!(status.code(), Some(0), "refused {refused}\n{log}");
        assert!(
            started.elapsed() < patience(Duration::from_secs(15)),
            "refused {refused}: exited after {:?}\n{log}",
            started.elapsed()
        );
        for id in &ids {
            let wf = conductor.workflow(id).await;
            assert_eq!(wf["status"], "COMPLETED", "refused {refused}: {wf:#}");
        }
        let hits = conductor.server.faults().hits(rule).unwrap();
        let warnings = log.matches("cannot read the queue depth").count();
        if falls_back_to_polls {
            assert!(hits > 0);
            assert_eq!(warnings, 1, "warned once\n{log}");
            assert!(
                log.contains("empty polls in a row, the queue depth unreadable"),
                "{log}"
            );
        } else {
            assert_eq!(warnings, 0, "the other route answers\n{log}");
            assert!(
                log.contains("run once: no task of once.sizes left and every slot idle; draining"),
                "{log}"
            );
        }
    }
}

/// Issue #24, item 7: a task named `x,y` against a Conductor that splits a single
/// `taskType=x,y` of `GET /tasks/queue/sizes` at the comma, as Spring does. Run once drains
/// through the queue depth, and exits 0, whether `/tasks/queue/size` is there or answers 404
/// (an older server, or a proxy without the route): then it is asked once, remembered as
/// missing, and `/tasks/queue/sizes` gets the name whole. Before, with `/tasks/queue/size`
/// missing, every depth read failed (the answer had keys `x` and `y`) and run once fell back to
/// empty polls, asking `/tasks/queue/size` again each second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_reads_the_depth_of_a_task_named_with_a_comma() {
    use perago_devstack::faults::FaultSpec;
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("x,y", ECHO, "");
    conductor.register(&task).await;
    for size_missing in [false, true] {
        conductor.server.faults().clear();
        let rule = size_missing.then(|| {
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
                .unwrap()
        });
        let mut ids = Vec::new();
        for n in 0..4 {
            ids.push(conductor.start_workflow(&task, json!({"n": n})).await);
        }
        let mut sup = SupervisorProc::start_args(
            &task,
            &conductor,
            "2",
            &["--once"],
            &[("PERAGO_POLL_WAIT_MS", "500")],
            None,
            None,
        );
        let status = sup.wait_exit(Duration::from_secs(30)).await;
        let log = sup.log_text();
        assert_eq!(status.code(), Some(0), "size missing {size_missing}\n{log}");
        for id in &ids {
            let wf = conductor.workflow(id).await;
            assert_eq!(wf["status"], "COMPLETED", "{wf:#}");
        }
        assert!(
            log.contains("run once: no task of x,y left and every slot idle; draining"),
            "size missing {size_missing}\n{log}"
        );
        assert!(!log.contains("cannot read the queue depth"), "{log}");
        if let Some(rule) = rule {
            assert_eq!(conductor.server.faults().hits(rule).unwrap(), 1, "{log}");
            assert!(
                log.contains("this Conductor has no GET /tasks/queue/size"),
                "{log}"
            );
        }
    }
}
