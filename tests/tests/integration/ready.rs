//! The broker's ready pipe (`PERAGO_READY_FD`), end to end: the broker closes it once it has
//! said it serves, and no body ever holds it.

use crate::harness::{Conductor, SupervisorProc, TaskFixture, children_of, eventually};
use serde_json::json;
use std::{collections::BTreeSet, fs, time::Duration};

/// The pipes among `pid`'s descriptors above the standard streams, by inode (`pipe:[N]`).
fn pipes_of(pid: u32) -> BTreeSet<String> {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return BTreeSet::new();
    };
    fds.flatten()
        .filter(|fd| {
            fd.file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
                .is_some_and(|n| n > 2)
        })
        .filter_map(|fd| fs::read_link(fd.path()).ok())
        .map(|link| link.to_string_lossy().into_owned())
        .filter(|link| link.starts_with("pipe:"))
        .collect()
}

/// Every descriptor of `pid` with what it is.
fn fds_of(pid: u32) -> Vec<(String, String)> {
    let mut fds: Vec<_> = fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.flatten()
                .map(|fd| {
                    let link = fs::read_link(fd.path()).unwrap_or_default();
                    (
                        fd.file_name().to_string_lossy().into_owned(),
                        link.to_string_lossy().into_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    fds.sort();
    fds
}

/// A body that reports its open descriptors above the standard streams, with what each is
/// (the shell's own glob directory is closed again by then), and whether it was given
/// `PERAGO_READY_FD`.
const REPORT_FDS: &str = "read params\nfds=''\nfor f in /proc/$$/fd/*; do\n  n=${f##*/}\n  [ \"$n\" -gt 2 ] && [ -e \"$f\" ] || continue\n  fds=\"$fds $n=$(readlink \"$f\")\"\ndone\n\
printf '{\"fds\": \"%s\", \"ready_fd\": \"%s\"}\\n' \"$fds\" \"${PERAGO_READY_FD-unset}\"\n";

/// A body holds nothing of the runtime's beyond its standard streams (the only descriptor
/// above them is its shell's script): not the broker's ready pipe, and no `PERAGO_READY_FD`
/// in its environment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_inherits_no_ready_pipe() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("e2e.readyfds", REPORT_FDS, "retry_count = 0");
    conductor.register(&task).await;
    let sup = SupervisorProc::start(&task, &conductor, 1, &[]);
    let id = conductor.start_workflow(&task, json!({})).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
    let result = &wf["output"]["result"];
    let script = task.dir.path().join("body.sh");
    for fd in result["fds"].as_str().unwrap().split_whitespace() {
        let (_, link) = fd.split_once('=').unwrap();
        assert!(
            std::path::Path::new(link).ends_with("body.sh"),
            "a body holds {fd} (its script is {})",
            script.display()
        );
    }
    assert_eq!(result["ready_fd"], "unset", "{result}");
}

/// In process mode the broker is told its ready pipe's number and, once it has said it
/// serves, holds it no more: no pipe it holds above its standard streams is one its
/// supervisor holds too (the supervisor's read end goes once start-up is over, too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_closes_its_ready_pipe_once_it_serves() {
    if perago_sys::user::euid() != 0 {
        eprintln!("skipped: a non-dumpable broker's descriptors are readable by root only");
        return;
    }
    let conductor = Conductor::start().await;
    let task = TaskFixture::new(
        "e2e.readyclosed",
        "read params\necho '{\"ok\": true}'\n",
        "",
    );
    conductor.register(&task).await;
    let sup = SupervisorProc::start(
        &task,
        &conductor,
        1,
        &[("PERAGO_EXECUTION_MODE", "process")],
    );
    // Ready: a task runs through the broker.
    let id = conductor.start_workflow(&task, json!({})).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
    let broker = eventually("the broker process", Duration::from_secs(10), || async {
        children_of(sup.pid()).into_iter().find(|p| {
            p.argv
                .first()
                .is_some_and(|a| a.starts_with("perago-conductor-broker"))
        })
    })
    .await;
    let environ = fs::read(format!("/proc/{}/environ", broker.pid)).unwrap();
    let ready_fd = environ
        .split(|b| *b == 0)
        .filter_map(|v| std::str::from_utf8(v).ok())
        .find_map(|v| v.strip_prefix("PERAGO_READY_FD="))
        .map(str::to_owned);
    assert!(
        ready_fd
            .as_deref()
            .is_some_and(|fd| fd.parse::<u32>().is_ok_and(|n| n > 2)),
        "the broker was told its ready pipe: {ready_fd:?}"
    );
    let ready_fd = ready_fd.unwrap();
    let now = fs::read_link(format!("/proc/{}/fd/{ready_fd}", broker.pid))
        .map(|l| l.to_string_lossy().into_owned());
    assert!(
        !now.as_ref().is_ok_and(|l| l.starts_with("pipe:")),
        "the broker's descriptor {ready_fd} is still a pipe ({now:?})"
    );
    // Pipes this test process holds too came from outside (the test runner's), not from the
    // runtime.
    let outside = pipes_of(std::process::id());
    let shared: Vec<String> = pipes_of(broker.pid)
        .intersection(&pipes_of(sup.pid()))
        .filter(|pipe| !outside.contains(*pipe))
        .cloned()
        .collect();
    assert!(
        shared.is_empty(),
        "the broker and its supervisor still share {shared:?} (its ready pipe was {ready_fd}); the broker holds {:?}",
        fds_of(broker.pid)
    );
}

/// A descriptor the supervisor was started with (an operator's shell, a test runner's
/// jobserver, a service manager's socket) reaches neither its broker nor its executors: each
/// runtime child holds only what the launcher passes it (its standard streams, the root lock,
/// its pipe, its secrets socket).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_child_inherits_no_descriptor_of_the_supervisors_parent() {
    if perago_sys::user::euid() != 0 {
        eprintln!("skipped: a non-dumpable child's descriptors are readable by root only");
        return;
    }
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("e2e.strayfd", "read params\necho '{\"ok\": true}'\n", "");
    conductor.register(&task).await;
    // Left open across exec, as a careless parent would: the supervisor inherits it.
    let stray_path = task.dir.path().join("stray-descriptor");
    let stray = fs::File::create(&stray_path).unwrap();
    perago_sys::fd::set_cloexec(std::os::fd::AsRawFd::as_raw_fd(&stray), false).unwrap();
    let sup = SupervisorProc::start(
        &task,
        &conductor,
        2,
        &[("PERAGO_EXECUTION_MODE", "process")],
    );
    drop(stray);
    let id = conductor.start_workflow(&task, json!({})).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
    let holds_stray = |pid: u32| {
        fds_of(pid)
            .into_iter()
            .any(|(_, link)| std::path::Path::new(&link) == stray_path)
    };
    assert!(
        holds_stray(sup.pid()),
        "the supervisor itself was started holding the descriptor: {:?}",
        fds_of(sup.pid())
    );
    let children = eventually(
        "the broker and both executors",
        Duration::from_secs(10),
        || async {
            let kids: Vec<_> = children_of(sup.pid())
                .into_iter()
                .filter(|p| {
                    p.argv.first().is_some_and(|a| {
                        a.starts_with("perago-conductor-broker") || a.starts_with("perago-executor")
                    })
                })
                .collect();
            (kids.len() == 3).then_some(kids)
        },
    )
    .await;
    for child in children {
        assert!(
            !holds_stray(child.pid),
            "{:?} (pid {}) inherited the supervisor's parent's descriptor: {:?}",
            child.argv,
            child.pid,
            fds_of(child.pid)
        );
    }
}
