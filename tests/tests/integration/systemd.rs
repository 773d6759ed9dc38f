//! Under a systemd `Type=notify` unit: `READY=1` only once every executor is attached,
//! `STATUS=` lines, `WATCHDOG=1` pings when asked for, `STOPPING=1` at the drain; and no child
//! sees the notify variables (only the supervisor speaks for the service).

use crate::harness::{Conductor, SupervisorProc, TaskFixture, child_named, thread_mode};
use std::{
    os::unix::net::UnixDatagram,
    time::{Duration, Instant},
};

const BODY: &str = "read params\ncase \"$params\" in *slow*) sleep 2;; esac\necho '{}'\n";

/// Datagrams received until `done` holds for one of them, within `timeout`.
fn receive_until(
    socket: &UnixDatagram,
    timeout: Duration,
    done: impl Fn(&str) -> bool,
) -> Vec<String> {
    let deadline = Instant::now() + crate::harness::patience(timeout);
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        if let Ok(n) = socket.recv(&mut buf) {
            let message = String::from_utf8_lossy(&buf[..n]).into_owned();
            let finished = done(&message);
            got.push(message);
            if finished {
                return got;
            }
        }
    }
    panic!("timed out; received {got:?}");
}

/// A datagram socket for the supervisor to notify (with a read timeout), in `dir`.
fn notify_socket(dir: &tempfile::TempDir) -> (std::path::PathBuf, UnixDatagram) {
    let path = dir.path().join("notify");
    let listener = UnixDatagram::bind(&path).unwrap();
    listener
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    (path, listener)
}

/// SIGTERM: systemd hears `STOPPING=1` once, and the supervisor drains and exits 0.
async fn stops_on_sigterm(listener: &UnixDatagram, sup: &mut SupervisorProc) {
    sup.signal("TERM");
    let got = receive_until(listener, Duration::from_secs(10), |m| {
        m.starts_with("STOPPING=1")
    });
    assert_eq!(
        got.last().unwrap(),
        "STOPPING=1\nSTATUS=draining (SIGTERM)",
        "{got:?}"
    );
    let exit = sup.wait_exit(Duration::from_secs(20)).await;
    assert!(exit.success(), "{}", sup.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notify_unit_hears_ready_status_watchdog_and_stopping() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("e2e.notify", BODY, "");
    conductor.register(&task).await;
    let dir = tempfile::tempdir().unwrap();
    let (path, listener) = notify_socket(&dir);
    let mut sup = SupervisorProc::start(
        &task,
        &conductor,
        2,
        &[
            ("NOTIFY_SOCKET", path.to_str().unwrap()),
            ("WATCHDOG_USEC", "400000"),
        ],
    );
    let got = receive_until(&listener, Duration::from_secs(20), |m| {
        m.starts_with("READY=1")
    });
    let ready = got.last().unwrap();
    assert_eq!(
        ready, "READY=1\nSTATUS=e2e.notify: 0 busy, 2 idle",
        "{got:?}"
    );
    // Sent only once both executors were attached.
    let status = crate::harness::status_json(&sup.workspace_root());
    let states: Vec<&str> = status["slots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["idle", "idle"], "{status}");
    // The watchdog: pinged at least twice in a row (every 200 ms).
    receive_until(&listener, Duration::from_secs(5), |m| m == "WATCHDOG=1");
    receive_until(&listener, Duration::from_secs(5), |m| m == "WATCHDOG=1");
    // Only the supervisor has the variables (thread mode has no broker or executor process).
    if !thread_mode() {
        let broker = child_named(sup.pid(), "perago-conductor-broker").expect("broker");
        let executor = child_named(sup.pid(), "perago-executor-0001").expect("executor");
        for pid in [broker.pid, executor.pid] {
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
            let text = String::from_utf8_lossy(&environ);
            for name in ["NOTIFY_SOCKET=", "WATCHDOG_USEC="] {
                assert!(!text.contains(name), "pid {pid} has {name}");
            }
        }
    }
    // A running task shows in the status line.
    let id = conductor
        .start_workflow(&task, serde_json::json!({"slow": true}))
        .await;
    receive_until(&listener, Duration::from_secs(10), |m| {
        m == "STATUS=e2e.notify: 1 busy, 1 idle"
    });
    conductor.wait_terminal(&id, Duration::from_secs(20)).await;
    stops_on_sigterm(&listener, &mut sup).await;
}

/// In thread mode bodies are started from the supervisor's own process, whose environment
/// holds the notify socket: they must not get it either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_body_sees_the_notify_socket_in_either_mode() {
    for mode in ["thread", "process"] {
        let conductor = Conductor::start().await;
        let task = TaskFixture::new(
            "e2e.notifyenv",
            "read params\nenv > \"env-$PERAGO_TASK_ID\"\necho '{}'\n",
            "",
        );
        conductor.register(&task).await;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let _listener = UnixDatagram::bind(&path).unwrap();
        let mut sup = SupervisorProc::start_args(
            &task,
            &conductor,
            "1",
            &["--execution-mode", mode],
            &[
                ("NOTIFY_SOCKET", path.to_str().unwrap()),
                ("WATCHDOG_USEC", "60000000"),
            ],
            None,
            None,
        );
        let id = conductor.start_workflow(&task, serde_json::json!({})).await;
        let wf = conductor.wait_terminal(&id, Duration::from_secs(20)).await;
        assert_eq!(wf["status"], "COMPLETED", "{wf:#}");
        let task_id = wf["tasks"][0]["taskId"].as_str().unwrap();
        let env = std::fs::read_to_string(task.dir.path().join(format!("env-{task_id}"))).unwrap();
        for name in ["NOTIFY_SOCKET=", "WATCHDOG_USEC="] {
            assert!(!env.contains(name), "{mode} mode: the body has {name}");
        }
        sup.signal("TERM");
        assert!(sup.wait_exit(Duration::from_secs(20)).await.success());
    }
}

/// Several task types under one unit: READY once every type's executors are attached, one
/// STATUS line for all of them, the watchdog while every broker answers, one STOPPING.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unit_of_several_task_types_is_ready_once_every_type_is() {
    let conductor = Conductor::start().await;
    let a = TaskFixture::new("e2e.notify.a", BODY, "");
    let b = TaskFixture::new("e2e.notify.b", BODY, "");
    conductor.register(&a).await;
    conductor.register(&b).await;
    let dir = tempfile::tempdir().unwrap();
    let (path, listener) = notify_socket(&dir);
    let mut sup = SupervisorProc::start_many(
        &[&a, &b],
        &conductor,
        &["1", "e2e.notify.b=2"],
        &[
            ("NOTIFY_SOCKET", path.to_str().unwrap()),
            ("WATCHDOG_USEC", "400000"),
        ],
    );
    let got = receive_until(&listener, Duration::from_secs(20), |m| {
        m.starts_with("READY=1")
    });
    assert_eq!(
        got.last().unwrap(),
        "READY=1\nSTATUS=e2e.notify.a: 0 busy, 1 idle; e2e.notify.b: 0 busy, 2 idle",
        "{got:?}"
    );
    assert_eq!(
        got.iter().filter(|m| m.starts_with("READY=1")).count(),
        1,
        "{got:?}"
    );
    receive_until(&listener, Duration::from_secs(5), |m| m == "WATCHDOG=1");
    // A task of one type shows in the joined line.
    let id = conductor
        .start_workflow(&b, serde_json::json!({"slow": true}))
        .await;
    receive_until(&listener, Duration::from_secs(10), |m| {
        m == "STATUS=e2e.notify.a: 0 busy, 1 idle; e2e.notify.b: 1 busy, 1 idle"
    });
    conductor.wait_terminal(&id, Duration::from_secs(20)).await;
    stops_on_sigterm(&listener, &mut sup).await;
}
