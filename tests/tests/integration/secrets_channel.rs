//! The secrets channel, end to end: while a broker or an executor starts (before it is
//! non-dumpable), a process of the same user that opens `/proc/<child>/fd/<N>` gets nothing;
//! the children still take their secrets and run tasks.

use crate::harness::{BROKER, Conductor, EXECUTOR, SupervisorProc, TaskFixture};
use serde_json::json;
use std::{path::Path, time::Duration};

const NOBODY: u32 = 65534;

/// A wrapper that stands for `real` (a runtime child's program): it notes its pid and its
/// secrets descriptor in `hold/<role>`, waits for `hold/<role>.go`, then becomes `real`. Being
/// a shell, it is dumpable all along: the state of any child before its `prctl`, held open.
fn holding_wrapper(dir: &Path, hold: &Path, role: &str, real: &str) -> String {
    let path = dir.join(format!("{role}-wrapper.sh"));
    let note = hold.join(role);
    let go = hold.join(format!("{role}.go"));
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\necho \"$$ $PERAGO_SECRETS_FD\" > '{note}.tmp' && mv '{note}.tmp' '{note}'\n\
             while [ ! -e '{go}' ]; do sleep 0.02; done\nexec '{real}' \"$@\"\n",
            note = note.display(),
            go = go.display(),
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.display().to_string()
}

/// What a process of user `uid` reads from `/proc/<pid>/fd/<fd>`: its output, or why not.
fn read_as(uid: u32, pid: &str, fd: &str) -> Result<String, String> {
    use std::os::unix::process::CommandExt as _;
    let out = std::process::Command::new("cat")
        .arg(format!("/proc/{pid}/fd/{fd}"))
        .uid(uid)
        .gid(uid)
        .output()
        .unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Held before it turns non-dumpable, each child's secrets descriptor is a socket that a
/// process of the same user cannot open (`ENXIO`), and nothing in it until the child asks;
/// before, it was a pipe holding every secret (4 of 4 restarted executors' lakeFS keys and
/// slot tokens were read). Released, the broker and the executor take their secrets and a
/// task completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_same_user_process_cannot_read_a_starting_childs_secrets() {
    if perago_sys::user::euid() != 0 {
        eprintln!("skipped: running the runtime as another user needs root");
        return;
    }
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("e2e.secretsrace", "echo '{\"ok\": true}'\n", "");
    let hold = task.dir.path().join("hold");
    std::fs::create_dir(&hold).unwrap();
    std::os::unix::fs::chown(&hold, Some(NOBODY), Some(NOBODY)).unwrap();
    let broker = holding_wrapper(task.dir.path(), &hold, "broker", BROKER);
    let executor = holding_wrapper(task.dir.path(), &hold, "executor", EXECUTOR);
    conductor.register(&task).await;
    let sup = SupervisorProc::start_as(
        &task,
        &conductor,
        1,
        &[
            ("PERAGO_EXECUTION_MODE", "process"),
            ("PERAGO_BROKER_BIN", &broker),
            ("PERAGO_EXECUTOR_BIN", &executor),
            ("CONDUCTOR_AUTH_KEY", "conductor-key-value"),
            ("CONDUCTOR_AUTH_SECRET", "conductor-secret-value"),
            ("LAKEFS_ENDPOINT", "http://127.0.0.1:9"),
            ("LAKEFS_ACCESS_KEY_ID", "lakefs-key-value"),
            ("LAKEFS_SECRET_ACCESS_KEY", "lakefs-secret-value"),
        ],
        Some(NOBODY),
    );
    for role in ["broker", "executor"] {
        let note = hold.join(role);
        let noted = crate::harness::eventually(
            &format!("the {role} wrapper holds"),
            Duration::from_secs(30),
            || {
                let note = note.clone();
                async move { std::fs::read_to_string(&note).ok() }
            },
        )
        .await;
        let (pid, fd) = noted.trim().split_once(' ').unwrap();
        let read = read_as(NOBODY, pid, fd);
        assert!(
            read.as_ref()
                .is_err_and(|e| e.contains("No such device or address")),
            "{role}: a process of the same user read {read:?}\n{}",
            sup.log_text()
        );
        let link = std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).unwrap();
        assert!(
            link.to_string_lossy().starts_with("socket:["),
            "{role}: {}",
            link.display()
        );
        std::fs::write(hold.join(format!("{role}.go")), "").unwrap();
    }
    let id = conductor.start_workflow(&task, json!({})).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf}\n{}", sup.log_text());
    assert!(
        !sup.log_text().contains("got no secrets"),
        "{}",
        sup.log_text()
    );
}

/// An executor that never says it is ready gets no secrets: after the hand-over's timeout the
/// supervisor stops it (logged) and starts the slot again; once the next generation says
/// ready, it attaches and runs the task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_never_says_ready_gets_nothing_and_is_stopped() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("e2e.neverready", "echo '{\"ok\": true}'\n", "");
    let hold = task.dir.path().join("hold");
    std::fs::create_dir(&hold).unwrap();
    let executor = holding_wrapper(task.dir.path(), &hold, "executor", EXECUTOR);
    conductor.register(&task).await;
    let sup = SupervisorProc::start(
        &task,
        &conductor,
        1,
        &[
            ("PERAGO_EXECUTION_MODE", "process"),
            ("PERAGO_EXECUTOR_BIN", &executor),
            ("LAKEFS_SECRET_ACCESS_KEY", "lakefs-secret-value"),
        ],
    );
    let first = crate::harness::eventually(
        "the executor wrapper holds",
        Duration::from_secs(30),
        || {
            let note = hold.join("executor");
            async move { std::fs::read_to_string(&note).ok() }
        },
    )
    .await;
    crate::harness::eventually(
        "the supervisor stops the child that never said ready",
        Duration::from_secs(40),
        || {
            let log = sup.log_text();
            async move {
                log.contains("the child got no secrets; it is stopped")
                    .then_some(())
            }
        },
    )
    .await;
    let pid: u32 = first.split_whitespace().next().unwrap().parse().unwrap();
    assert!(
        crate::harness::eventually(
            "the held child is gone",
            Duration::from_secs(10),
            || async move { (!crate::harness::alive(pid)).then_some(true) }
        )
        .await
    );
    assert!(
        sup.log_text()
            .contains("the child did not say it was ready for its secrets within 10s"),
        "{}",
        sup.log_text()
    );
    std::fs::write(hold.join("executor.go"), "").unwrap();
    let id = conductor.start_workflow(&task, json!({})).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(60)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf}\n{}", sup.log_text());
}
