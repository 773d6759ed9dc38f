//! Conformance through the official Python SDK (conductor-python, pinned in
//! `tests/python/requirements.txt`): `tests/python/conductor_sdk_conformance.py` registers
//! definitions, runs 20 workflows with the SDK's own TaskHandler workers, and checks a
//! response-timeout retry and a terminal failure through the SDK's clients.
//!
//! The interpreter is `PERAGO_TEST_PYTHON`, else `<workspace>/.venv/bin/python` (created by
//! `scripts/test`). The script runs in its own process group (the SDK forks one process per
//! worker), under a hard timeout after which the whole group is killed.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::process::Command;

use crate::support::Dev;

/// Hard limit for the script; it normally takes 2–3 s.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(50);
/// One Conductor second lasts 50 ms: the script's 10 s response timeout takes 0.5 s.
const TIME_SCALE: f64 = 0.05;

pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the crate lives in the workspace")
        .to_path_buf()
}

pub(crate) fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("PERAGO_TEST_PYTHON") {
        let python = PathBuf::from(python);
        assert!(
            python.exists(),
            "PERAGO_TEST_PYTHON={} does not exist; run scripts/test to create .venv",
            python.display()
        );
        return python;
    }
    let venv = workspace_root().join(".venv/bin/python");
    assert!(
        venv.exists(),
        "no Python with the test clients (conductor-python, lakefs-sdk): set PERAGO_TEST_PYTHON or run scripts/test, which \
         creates {} from tests/python/requirements.txt",
        venv.display()
    );
    venv
}

pub(crate) async fn kill_group(pid: u32) {
    // Negative pid: the whole process group, the SDK's worker processes included.
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pid}")])
        .stderr(Stdio::null())
        .status()
        .await;
}

/// Runs `tests/python/<script>` with `env` in its own process group under `timeout`, and
/// returns its stdout; panics with stdout and stderr unless it exits 0 and prints `ok_marker`.
pub(crate) async fn run_script(
    script: &str,
    env: &[(&str, &str)],
    timeout: Duration,
    ok_marker: &str,
) -> String {
    let python = python();
    let script = workspace_root().join("tests/python").join(script);
    let mut child = Command::new(&python)
        .arg(&script)
        .current_dir(workspace_root())
        .envs(env.iter().copied())
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("failed to start {}: {e}", python.display()));
    let pid = child.id().expect("a running child has a pid");
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = tokio::spawn(async move {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text).await;
        text
    });
    let err = tokio::spawn(async move {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text).await;
        text
    });
    let status = tokio::time::timeout(timeout, child.wait()).await;
    // Whatever happened, nothing of the script may outlive the test.
    kill_group(pid).await;
    let collect = async { (out.await.unwrap_or_default(), err.await.unwrap_or_default()) };
    let (stdout, stderr) = tokio::time::timeout(Duration::from_secs(5), collect)
        .await
        .unwrap_or_else(|_| ("<pipes still open>".into(), String::new()));
    let report = format!("--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}");
    match status {
        Err(_) => panic!(
            "{} did not finish within {timeout:?}; killed\n{report}",
            script.display()
        ),
        Ok(Err(e)) => panic!("waiting for {} failed: {e}\n{report}", script.display()),
        Ok(Ok(status)) => assert!(
            status.success(),
            "{} failed: {status}\n{report}",
            script.display()
        ),
    }
    assert!(stdout.contains(ok_marker), "{report}");
    stdout
}

#[tokio::test]
async fn official_python_sdk_runs_workers_and_workflows_unchanged() {
    let dev = Dev::scaled(TIME_SCALE).await;
    let env = [("CONDUCTOR_SERVER_URL", dev.api.as_str())];
    run_script(
        "conductor_sdk_conformance.py",
        &env,
        SCRIPT_TIMEOUT,
        "[sdk-conformance] OK",
    )
    .await;
}

#[tokio::test]
async fn a_missing_interpreter_fails_the_conformance_test_with_a_hint() {
    // Run the conformance test in a child test process whose PERAGO_TEST_PYTHON is bogus: it
    // must fail, and say how to get the interpreter.
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "python_sdk::official_python_sdk_runs_workers_and_workflows_unchanged",
            "--exact",
            "--nocapture",
        ])
        .env("PERAGO_TEST_PYTHON", "/nonexistent/python")
        .output()
        .await
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!output.status.success(), "{text}");
    assert!(text.contains("run scripts/test"), "{text}");
}
