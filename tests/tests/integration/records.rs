//! The supervisors' records folder (`${XDG_STATE_HOME}/perago/supervisors/`, which `status`
//! with no argument reads): used only when it is this user's own real directory open to no
//! one else, and a record only when it is this user's regular file.

use crate::harness::{Conductor, SUPERVISOR, SupervisorProc, TaskFixture};
use perago_tests::{Run, command};
use serde_json::json;
use std::{fs, os::unix::fs::PermissionsExt as _, path::Path, time::Duration};

const ECHO: &str = r#"read params
printf '{"echo": %s}' "$params"
"#;

fn status(state_home: &Path, args: &[&str]) -> Run {
    Run::of(
        command(SUPERVISOR)
            .arg("status")
            .args(args)
            .env("XDG_STATE_HOME", state_home),
    )
}

/// Through a symlinked records folder `start` wrote its record outside it, and `status`
/// removed stale files there. Now `start` warns and runs without a record, writes nothing
/// through the link, and `status` says why it does not use the folder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_runs_without_a_record_through_a_symlinked_folder_and_status_says_why() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("records.symlink", ECHO, "");
    conductor.register(&task).await;
    let state = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    fs::set_permissions(elsewhere.path(), fs::Permissions::from_mode(0o700)).unwrap();
    // A stale record in the target: a reader through the link would have removed it.
    let stale = elsewhere.path().join("1.json");
    fs::write(&stale, r#"{"pid":1,"started":0,"runtimes":[]}"#).unwrap();
    fs::create_dir_all(state.path().join("perago")).unwrap();
    let folder = state.path().join("perago/supervisors");
    std::os::unix::fs::symlink(elsewhere.path(), &folder).unwrap();
    let state_home = state.path().to_str().unwrap().to_owned();
    let sup = SupervisorProc::start(&task, &conductor, 1, &[("XDG_STATE_HOME", &state_home)]);
    let id = conductor.start_workflow(&task, json!({"n": 1})).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
    let log = sup.log_text();
    assert!(
        log.contains("cannot record this supervisor")
            && log.contains("it is a symlink, not a real directory"),
        "{log}"
    );
    let out = status(state.path(), &[]);
    out.expect_code(1);
    assert_eq!(
        out.stderr,
        format!(
            "error: cannot use {} as the supervisors' records folder: it is a symlink, not a real directory\n",
            folder.display()
        )
    );
    let names: Vec<_> = fs::read_dir(elsewhere.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        names,
        ["1.json"],
        "nothing written or removed through the link"
    );
    drop(sup);
}

/// A record another user planted, naming a live process and a socket of theirs, would have
/// pointed `status --probe ready` at it. It is ignored (and left alone), and said.
#[test]
fn status_ignores_a_record_owned_by_another_user() {
    if perago_core::process::euid() != 0 {
        eprintln!("skipped: planting another user's file needs root");
        return;
    }
    let state = tempfile::tempdir().unwrap();
    let folder = state.path().join("perago/supervisors");
    fs::create_dir_all(&folder).unwrap();
    fs::set_permissions(&folder, fs::Permissions::from_mode(0o700)).unwrap();
    // This test's own pid and start time: a record of a supervisor that is running.
    let pid = std::process::id();
    let started = perago_core::process::stat(pid).unwrap().start_time.unwrap();
    let forged = folder.join(format!("{pid}.json"));
    fs::write(
        &forged,
        json!({"pid": pid, "started": started, "runtimes": [{"task": "t", "socket": "/tmp/attacker.sock"}]})
            .to_string(),
    )
    .unwrap();
    std::os::unix::fs::chown(&forged, Some(65534), Some(65534)).unwrap();
    let out = status(state.path(), &["--probe", "ready"]);
    out.expect_code(1);
    assert_eq!(
        out.stderr,
        format!(
            "warning: ignoring the supervisor record {}: owned by uid 65534, not this user (uid 0)\n\
             error: no perago supervisor of this user is running (none is recorded in {}); give the task's MANIFEST or --socket PATH\n",
            forged.display(),
            folder.display()
        )
    );
    assert!(forged.exists(), "another user's file is left alone");
}
