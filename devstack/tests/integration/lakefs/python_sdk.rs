//! Conformance through the official Python clients, pinned in `tests/python/requirements.txt`:
//! the generated `lakefs-sdk` (`tests/python/lakefs_sdk_conformance.py`: create a repository,
//! upload and page through more objects than one page, commit with metadata, branch from a
//! commit id, merge, provoke a 409 conflict, delete objects and branches) and the high-level
//! `lakefs` package (`tests/python/lakefs_hl_conformance.py`: the same flow over its different
//! wire habits: raw chunked uploads, `+`-encoded queries, exclusive uploads, ranged reads).
//!
//! The interpreter is found and the script run exactly as for the Conductor SDK.

use std::time::Duration;

use super::support::{KEY, Lake, SECRET};
use crate::python_sdk::run_script;

/// Hard limit for the script; it normally takes about 2 s.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn official_lakefs_sdk_works_unchanged() {
    let lake = Lake::start().await;
    let endpoint = lake.server.endpoint();
    let env = [
        ("LAKEFS_ENDPOINT", endpoint.as_str()),
        ("LAKEFS_ACCESS_KEY_ID", KEY),
        ("LAKEFS_SECRET_ACCESS_KEY", SECRET),
    ];
    let stdout = run_script(
        "lakefs_sdk_conformance.py",
        &env,
        SCRIPT_TIMEOUT,
        "[lakefs-sdk-conformance] OK",
    )
    .await;
    assert!(stdout.contains("conflict reported: 409"), "{stdout}");
}

#[tokio::test]
async fn official_high_level_lakefs_package_works_unchanged() {
    let lake = Lake::start().await;
    let endpoint = lake.server.endpoint();
    let env = [
        ("LAKEFS_ENDPOINT", endpoint.as_str()),
        ("LAKEFS_ACCESS_KEY_ID", KEY),
        ("LAKEFS_SECRET_ACCESS_KEY", SECRET),
        // Keep a developer's ~/.lakectl.yaml and LAKECTL_* out of the client configuration.
        ("HOME", "/nonexistent"),
    ];
    let stdout = run_script(
        "lakefs_hl_conformance.py",
        &env,
        SCRIPT_TIMEOUT,
        "[lakefs-hl-conformance] OK",
    )
    .await;
    assert!(stdout.contains("conflict reported: 409"), "{stdout}");
}

#[tokio::test]
async fn a_missing_interpreter_fails_the_lakefs_conformance_test_with_a_hint() {
    let output = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "lakefs::python_sdk::official_lakefs_sdk_works_unchanged",
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
