//! What `status` reads, and what it trusts: the supervisors' records folder
//! (`${XDG_STATE_HOME}/perago/supervisors/`, read with no argument) is used only when it is
//! this user's own real directory open to no one else, and a record only when it is this
//! user's regular file; whatever a broker answers is printed without driving the terminal.

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
    if perago_sys::user::euid() != 0 {
        eprintln!("skipped: planting another user's file needs root");
        return;
    }
    let state = tempfile::tempdir().unwrap();
    let folder = state.path().join("perago/supervisors");
    fs::create_dir_all(&folder).unwrap();
    fs::set_permissions(&folder, fs::Permissions::from_mode(0o700)).unwrap();
    // This test's own pid and start time: a record of a supervisor that is running.
    let pid = std::process::id();
    let started = perago_sys::proc::stat(pid).unwrap().start_time.unwrap();
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

/// An `Admin` server that answers `Status` with whatever it was given.
struct HostileBroker(perago_proto::admin::v1::StatusResponse);

#[tonic::async_trait]
impl perago_proto::admin::v1::admin_server::Admin for HostileBroker {
    async fn status(
        &self,
        _: tonic::Request<perago_proto::admin::v1::StatusRequest>,
    ) -> Result<tonic::Response<perago_proto::admin::v1::StatusResponse>, tonic::Status> {
        Ok(tonic::Response::new(self.0.clone()))
    }

    async fn drain(
        &self,
        _: tonic::Request<perago_proto::admin::v1::DrainRequest>,
    ) -> Result<tonic::Response<perago_proto::admin::v1::DrainResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not here"))
    }

    async fn pause(
        &self,
        _: tonic::Request<perago_proto::admin::v1::PauseRequest>,
    ) -> Result<tonic::Response<perago_proto::admin::v1::PauseResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not here"))
    }

    async fn resume(
        &self,
        _: tonic::Request<perago_proto::admin::v1::ResumeRequest>,
    ) -> Result<tonic::Response<perago_proto::admin::v1::ResumeResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not here"))
    }

    async fn scale(
        &self,
        _: tonic::Request<perago_proto::admin::v1::ScaleRequest>,
    ) -> Result<tonic::Response<perago_proto::admin::v1::ScaleResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not here"))
    }

    async fn reconfigure(
        &self,
        _: tonic::Request<perago_proto::admin::v1::ReconfigureRequest>,
    ) -> Result<tonic::Response<perago_proto::admin::v1::ReconfigureResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not here"))
    }

    async fn share_grant(
        &self,
        _: tonic::Request<perago_proto::admin::v1::ShareGrantRequest>,
    ) -> Result<tonic::Response<perago_proto::admin::v1::ShareStatus>, tonic::Status> {
        Err(tonic::Status::unimplemented("not here"))
    }

    async fn metrics(
        &self,
        _: tonic::Request<perago_proto::admin::v1::MetricsRequest>,
    ) -> Result<tonic::Response<perago_proto::admin::v1::MetricsResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not here"))
    }

    type WatchStream =
        tokio_stream::Once<Result<perago_proto::admin::v1::StatusResponse, tonic::Status>>;

    async fn watch(
        &self,
        _: tonic::Request<perago_proto::admin::v1::WatchRequest>,
    ) -> Result<tonic::Response<Self::WatchStream>, tonic::Status> {
        Ok(tonic::Response::new(tokio_stream::once(Ok(self.0.clone()))))
    }
}

/// A broker answering a 3 MiB worker id (a format-width panic before), escape sequences in
/// every text field and absurd times, beside a 300 MB `staging-branches.json` (an abort
/// before): `status` prints a bounded, escaped table and warns about the file; `--json`
/// gives every value exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_prints_a_hostile_brokers_answer_safely() {
    use perago_proto::admin::v1::{SlotStatus, StatusResponse, admin_server::AdminServer};
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("broker.sock");
    let huge = "w".repeat(3 << 20);
    let answer = StatusResponse {
        task_name: "t\u{1b}]0;owned\u{7}".into(),
        broker_worker_id: "b\u{1b}[2J".into(),
        broker_pid: 1,
        started_at_unix_ms: i64::MIN,
        slots: vec![SlotStatus {
            slot: 1,
            worker_id: huge.clone(),
            task_id: "task\nFORGED LINE".into(),
            execution_id: "e".into(),
            busy_since_unix_ms: i64::MIN,
            phase: "\u{1b}[1A".into(),
            ..SlotStatus::default()
        }],
        ..StatusResponse::default()
    };
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(AdminServer::new(HostileBroker(answer)).max_encoding_message_size(8 << 20))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    fs::File::create(dir.path().join("staging-branches.json"))
        .unwrap()
        .set_len(300_000_000)
        .unwrap();
    let socket_arg = socket.to_str().unwrap().to_owned();
    let run = |json: bool| {
        let socket_arg = socket_arg.clone();
        tokio::task::spawn_blocking(move || {
            let mut args = vec!["status", "--socket", &socket_arg];
            if json {
                args.push("--json");
            }
            Run::of(command(SUPERVISOR).args(&args))
        })
    };
    let table = run(false).await.unwrap();
    table.expect_code(0);
    assert!(
        !table.stdout.contains('\u{1b}') && !table.stdout.contains('\u{7}'),
        "{table}"
    );
    assert!(
        table
            .stdout
            .starts_with("task t\\x1b]0;owned\\x07  broker b\\x1b[2J (pid 1)"),
        "{}",
        &table.stdout[..200.min(table.stdout.len())]
    );
    assert!(table.stdout.contains("task\\nFORGED LINE / e"), "{table}");
    assert!(
        table.stdout.lines().all(|l| l.chars().count() < 300),
        "{table}"
    );
    assert!(
        table
            .stderr
            .contains("300000000 bytes is above the limit of 1048576 bytes"),
        "{table}"
    );
    let json = run(true).await.unwrap();
    json.expect_code(0);
    let value: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(value["slots"][0]["worker_id"], huge.as_str());
    assert_eq!(value["task_name"], "t\u{1b}]0;owned\u{7}");
    assert_eq!(value["staging_branches_left"], json!([]));
    server.abort();
}
