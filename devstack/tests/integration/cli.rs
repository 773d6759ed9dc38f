//! The `perago-devstack` binary: the JSON address line, serving, and SIGTERM.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

#[tokio::test]
async fn binary_prints_its_url_serves_and_stops_on_sigterm() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_perago-devstack"))
        .args(["--conductor", "127.0.0.1:0", "--time-scale", "0.5"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the binary starts");
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .expect("the address line arrives within 10 s")
        .unwrap()
        .expect("one line on stdout");
    let parsed: serde_json::Value = serde_json::from_str(&line).unwrap();
    let url = parsed["conductor"].as_str().unwrap();
    assert!(
        url.starts_with("http://127.0.0.1:") && url.ends_with("/api"),
        "{line}"
    );
    assert!(!url.ends_with(":0/api"), "the real port is printed: {line}");

    let health: serde_json::Value = crate::support::http_client()
        .get(format!("{url}/health"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["healthy"], true);

    let pid = child.id().unwrap().to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .unwrap();
    assert!(killed.success());
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("exits within 10 s of SIGTERM")
        .unwrap();
    assert!(status.success(), "{status}");
}

#[tokio::test]
async fn binary_requires_conductor_auth_when_asked() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_perago-devstack"))
        .args(["--conductor", "127.0.0.1:0", "--conductor-token-ttl", "60"])
        .env(perago_devstack::cli::ENV_CONDUCTOR_AUTH, "app-key:se:cret")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the binary starts");
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .expect("the address line arrives within 10 s")
        .unwrap()
        .expect("one line on stdout");
    let parsed: serde_json::Value = serde_json::from_str(&line).unwrap();
    let url = parsed["conductor"].as_str().unwrap();
    let http = crate::support::http_client();
    let refused = http
        .get(format!("{url}/metadata/taskdefs"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    let answer: serde_json::Value = http
        .post(format!("{url}/token"))
        .json(&serde_json::json!({"keyId": "app-key", "keySecret": "se:cret"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = answer["token"].as_str().expect("a token");
    let ok = http
        .get(format!("{url}/metadata/taskdefs"))
        .header("X-Authorization", token)
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
}

#[tokio::test]
async fn binary_refuses_a_malformed_conductor_auth() {
    let output = Command::new(env!("CARGO_BIN_EXE_perago-devstack"))
        .args(["--conductor", "127.0.0.1:0", "--conductor-auth", "no-colon"])
        .env_remove(perago_devstack::cli::ENV_CONDUCTOR_AUTH)
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("expected KEY:SECRET"), "{stderr}");
}

#[tokio::test]
async fn binary_refuses_a_bad_time_scale() {
    let output = Command::new(env!("CARGO_BIN_EXE_perago-devstack"))
        .args(["--conductor", "127.0.0.1:0", "--time-scale", "0"])
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("time scale must be a finite number greater than 0"),
        "{stderr}"
    );
}

#[tokio::test]
async fn help_is_stable() {
    let output = Command::new(env!("CARGO_BIN_EXE_perago-devstack"))
        .arg("--help")
        .env("COLUMNS", "100")
        // Clap shows an env var's current value in the help; keep the snapshot independent of it.
        .env_remove(perago_devstack::cli::ENV_CONDUCTOR)
        .env_remove(perago_devstack::cli::ENV_TIME_SCALE)
        .env_remove(perago_devstack::cli::ENV_CONDUCTOR_AUTH)
        .env_remove(perago_devstack::cli::ENV_CONDUCTOR_TOKEN_TTL)
        .env_remove(perago_devstack::cli::ENV_LAKEFS)
        .env_remove(perago_devstack::cli::ENV_LAKEFS_ACCESS_KEY_ID)
        .env_remove(perago_devstack::cli::ENV_LAKEFS_SECRET_ACCESS_KEY)
        .output()
        .await
        .unwrap();
    assert!(output.status.success());
    insta::assert_snapshot!(String::from_utf8_lossy(&output.stdout));
}
