//! Basic auth, the unauthenticated routes, start-up calls, unknown endpoints, the CLI flag.

use std::process::Stdio;
use std::time::Duration;

use reqwest::Method;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use super::support::{KEY, Lake, SECRET};

#[tokio::test]
async fn every_api_route_needs_the_configured_key_pair() {
    let lake = Lake::start().await;
    let url = format!("{}/repositories", lake.api);
    let cases = [
        lake.http.get(&url),
        lake.http.get(&url).basic_auth(KEY, Some("wrong")),
        lake.http.get(&url).basic_auth("other", Some(SECRET)),
        lake.http.get(&url).bearer_auth("token"),
        lake.http
            .get(&url)
            .header("authorization", "Basic not-base64!"),
        lake.http
            .post(&url)
            .json(&json!({"name": "abc", "storage_namespace": "mem://x"})),
        lake.http.get(format!("{}/config", lake.api)),
        lake.http.get(format!("{}/user", lake.api)),
    ];
    for request in cases {
        let reply = lake.send(request).await;
        reply.assert_message(401, "error authenticating request");
        assert_eq!(reply.content_type.as_deref(), Some("application/json"));
    }
    // Nothing was created by the refused POST.
    let list = lake.get("/repositories").await;
    assert_eq!(list.assert_status(200).json()["results"], json!([]));
}

#[tokio::test]
async fn health_and_setup_are_open_and_config_describes_a_mem_blockstore() {
    let lake = Lake::start().await;
    let health = lake
        .send(lake.http.get(format!("{}/healthcheck", lake.api)))
        .await;
    assert_eq!(health.status.as_u16(), 204);
    assert!(health.text.is_empty());
    let setup = lake
        .send(lake.http.get(format!("{}/setup_lakefs", lake.api)))
        .await;
    assert_eq!(setup.assert_status(200).json()["state"], "initialized");
    let again = lake.send(
        lake.http
            .post(format!("{}/setup_lakefs", lake.api))
            .json(&json!({"username": "x"})),
    );
    again
        .await
        .assert_message(409, "lakeFS already initialized");

    let config = lake.get("/config").await.assert_status(200).json();
    let storage = &config["storage_config"];
    assert_eq!(storage["blockstore_type"], "mem");
    assert_eq!(storage["pre_sign_support"], false);
    assert_eq!(storage["blockstore_namespace_ValidityRegex"], "^mem://");
    assert_eq!(config["storage_config_list"], json!([]));
    let user = lake.get("/user").await.assert_status(200).json();
    assert!(user["user"]["id"].is_string(), "{user}");
    assert!(user["user"]["creation_date"].is_i64(), "{user}");
}

#[tokio::test]
async fn unknown_endpoints_answer_invalid_api_endpoint() {
    let lake = Lake::start().await;
    for path in [
        "/nope",
        "/repositories/repo/unknown/thing",
        "/repositories/repo/refs/main",
    ] {
        lake.get(path)
            .await
            .assert_message(404, "invalid API endpoint");
    }
    let reply = lake
        .send(lake.request(Method::GET, "/../../etc/passwd"))
        .await;
    assert_eq!(reply.status.as_u16(), 404);
}

#[tokio::test]
async fn handle_urls_are_the_endpoint_and_the_api_base() {
    let lake = Lake::start().await;
    let addr = lake.server.addr();
    assert_eq!(lake.server.endpoint(), format!("http://{addr}"));
    assert_eq!(lake.server.api_url(), format!("http://{addr}/api/v1"));
    assert_eq!(lake.server.credentials().access_key_id, KEY);
    assert_eq!(lake.server.credentials().secret_access_key, SECRET);
    assert!(
        !format!("{:?}", lake.server.credentials()).contains(SECRET),
        "the secret stays out of Debug"
    );
}

#[tokio::test]
async fn binary_serves_lakefs_next_to_conductor_with_credentials_from_flags() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_perago-devstack"))
        .args(["--conductor", "127.0.0.1:0", "--lakefs", "127.0.0.1:0"])
        .args([
            "--lakefs-access-key-id",
            "AKIAFLAG",
            "--lakefs-secret-access-key",
            "flag-secret",
        ])
        .env_remove(perago_devstack::cli::ENV_LAKEFS_ACCESS_KEY_ID)
        .env_remove(perago_devstack::cli::ENV_LAKEFS_SECRET_ACCESS_KEY)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the binary starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .expect("the address line arrives within 10 s")
        .unwrap()
        .expect("one line on stdout");
    let parsed: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert!(
        parsed["conductor"].as_str().unwrap().ends_with("/api"),
        "{line}"
    );
    let endpoint = parsed["lakefs"].as_str().unwrap();
    assert!(
        endpoint.starts_with("http://127.0.0.1:") && !endpoint.ends_with(":0"),
        "{line}"
    );
    assert!(
        !endpoint.contains("/api"),
        "the endpoint is printed without /api/v1: {line}"
    );

    // The line carries the key pair the server accepts: a client needs nothing else.
    let (key, secret) = (
        parsed["lakefs_access_key_id"].as_str().unwrap(),
        parsed["lakefs_secret_access_key"].as_str().unwrap(),
    );
    assert_eq!((key, secret), ("AKIAFLAG", "flag-secret"), "{line}");
    let client = crate::support::http_client();
    let url = format!("{endpoint}/api/v1/repositories");
    let ok = client
        .get(&url)
        .basic_auth(key, Some(secret))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status().as_u16(), 200);
    let refused = client
        .get(&url)
        .basic_auth(KEY, Some(SECRET))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status().as_u16(), 401);

    let pid = child.id().unwrap().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .await
            .unwrap()
            .success()
    );
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("exits within 10 s of SIGTERM")
        .unwrap();
    assert!(status.success(), "{status}");
}
