//! Orkes-style auth on the Conductor server: off by default (`/api/token` is a 404, as on OSS);
//! when on, the token route and the `X-Authorization` check on every other `/api` route.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use perago_devstack::conductor::ConductorServer;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{Dev, Reply, eventually};

const KEY: &str = "app-key";
const SECRET: &str = "app-secret";

async fn dev_with_auth(ttl: Duration) -> Dev {
    let server = ConductorServer::builder()
        .auth(KEY, SECRET)
        .token_ttl(ttl)
        .bind("127.0.0.1:0")
        .await
        .expect("the dev server binds to a free port");
    let api = server.base_url();
    Dev {
        server,
        http: crate::support::http_client(),
        api,
    }
}

async fn token(dev: &Dev) -> String {
    let reply = dev
        .post("/token", &json!({"keyId": KEY, "keySecret": SECRET}))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    reply.json()["token"]
        .as_str()
        .expect("a token string")
        .to_owned()
}

async fn get_with(dev: &Dev, path: &str, token: Option<&str>) -> Reply {
    let mut request = dev.http.get(format!("{}{path}", dev.api));
    if let Some(token) = token {
        request = request.header("X-Authorization", token);
    }
    dev.send(request).await
}

fn assert_refused(reply: &Reply, error: &str) {
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{}", reply.text);
    let body = reply.json();
    assert_eq!(body["error"], error, "{body}");
    assert_eq!(body["status"], 401, "{body}");
}

#[tokio::test]
async fn token_route_is_a_404_without_auth() {
    let dev = Dev::start().await;
    let reply = dev
        .post("/token", &json!({"keyId": KEY, "keySecret": SECRET}))
        .await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "{}", reply.text);
    assert!(!dev.server.auth_required());
    assert_eq!(
        get_with(&dev, "/metadata/taskdefs", None).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn token_route_issues_a_jwt_with_an_exp_claim() {
    let dev = dev_with_auth(Duration::from_secs(600)).await;
    let token = token(&dev).await;
    let parts: Vec<&str> = token.split('.').collect();
    assert_eq!(parts.len(), 3, "{token}");
    let claims: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let exp = claims["exp"].as_u64().expect("an integer exp");
    assert!(exp >= now + 599 && exp <= now + 602, "{claims}");
    assert_eq!(claims["sub"], KEY);
    assert_eq!(dev.server.tokens_issued(), 1);
    assert_ne!(
        self::token(&dev).await,
        token,
        "each call issues a new token"
    );
}

#[tokio::test]
async fn wrong_credentials_are_a_401_and_malformed_requests_a_400() {
    let dev = dev_with_auth(Duration::from_secs(600)).await;
    let reply = dev
        .post("/token", &json!({"keyId": KEY, "keySecret": "wrong"}))
        .await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{}", reply.text);
    let body = reply.json();
    assert_eq!(body["status"], 401);
    assert!(
        body["message"].as_str().unwrap().contains("Invalid key"),
        "{body}"
    );
    assert!(!reply.text.contains(SECRET));
    let reply = dev
        .post("/token", &json!({"keyId": "other", "keySecret": SECRET}))
        .await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    let reply = dev.post_raw("/token", "not json").await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text);
    assert_eq!(dev.server.tokens_issued(), 0);
}

#[tokio::test]
async fn api_routes_require_a_valid_token_and_health_does_not() {
    let dev = dev_with_auth(Duration::from_secs(600)).await;
    assert_refused(
        &get_with(&dev, "/metadata/taskdefs", None).await,
        "INVALID_TOKEN",
    );
    assert_refused(
        &get_with(&dev, "/metadata/taskdefs", Some("forged.token.here")).await,
        "INVALID_TOKEN",
    );
    let token = token(&dev).await;
    // Trap 17: the header is X-Authorization with the bare token, not "Bearer".
    assert_refused(
        &get_with(&dev, "/metadata/taskdefs", Some(&format!("Bearer {token}"))).await,
        "INVALID_TOKEN",
    );
    let reply = dev
        .send(
            dev.http
                .get(format!("{}/metadata/taskdefs", dev.api))
                .bearer_auth(&token),
        )
        .await;
    assert_refused(&reply, "INVALID_TOKEN");
    let reply = get_with(&dev, "/metadata/taskdefs", Some(&token)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    let reply = dev
        .send(
            dev.http
                .post(format!("{}/metadata/taskdefs", dev.api))
                .header("X-Authorization", &token)
                .json(&json!([{"name": "t"}])),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_refused(
        &get_with(
            &dev,
            "/tasks/poll/batch/t?workerid=w&count=1&timeout=1",
            None,
        )
        .await,
        "INVALID_TOKEN",
    );
    assert_eq!(get_with(&dev, "/health", None).await.status, StatusCode::OK);
    let root_health = dev
        .send(dev.http.get(format!("{}/health", dev.server.root_url())))
        .await;
    assert_eq!(root_health.status, StatusCode::OK);
}

#[tokio::test]
async fn expired_tokens_are_refused_with_expired_token() {
    let dev = dev_with_auth(Duration::from_secs(1)).await;
    let token = token(&dev).await;
    let reply = eventually("the token expires", || async {
        let reply = get_with(&dev, "/metadata/taskdefs", Some(&token)).await;
        (reply.status != StatusCode::OK).then_some(reply)
    })
    .await;
    assert_refused(&reply, "EXPIRED_TOKEN");
    let fresh = self::token(&dev).await;
    let reply = get_with(&dev, "/metadata/taskdefs", Some(&fresh)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
}

#[tokio::test]
async fn opaque_tokens_have_no_claims_and_expire_too() {
    let server = ConductorServer::builder()
        .auth(KEY, SECRET)
        .token_ttl(Duration::from_secs(1))
        .opaque_tokens(true)
        .bind("127.0.0.1:0")
        .await
        .unwrap();
    let api = server.base_url();
    let dev = Dev {
        server,
        http: crate::support::http_client(),
        api,
    };
    let token = token(&dev).await;
    assert!(!token.contains('.'), "{token}");
    let reply = eventually("the opaque token expires", || async {
        let reply = get_with(&dev, "/metadata/taskdefs", Some(&token)).await;
        (reply.status != StatusCode::OK).then_some(reply)
    })
    .await;
    assert_refused(&reply, "EXPIRED_TOKEN");
}

#[tokio::test]
async fn revoked_tokens_are_invalid() {
    let dev = dev_with_auth(Duration::from_secs(600)).await;
    let token = token(&dev).await;
    assert_eq!(
        get_with(&dev, "/metadata/taskdefs", Some(&token))
            .await
            .status,
        StatusCode::OK
    );
    dev.server.revoke_tokens();
    assert_refused(
        &get_with(&dev, "/metadata/taskdefs", Some(&token)).await,
        "INVALID_TOKEN",
    );
    assert_eq!(dev.server.tokens_refused(), 1);
}

#[tokio::test]
async fn empty_credentials_are_refused() {
    let err = ConductorServer::builder()
        .auth(KEY, "")
        .bind("127.0.0.1:0")
        .await
        .unwrap_err();
    assert_eq!(err.exit_code(), 2);
}

/// The official Python SDK against the auth server: it fetches a token with the key from
/// `CONDUCTOR_AUTH_KEY`/`CONDUCTOR_AUTH_SECRET`, sends it, and after the server forgets it
/// (`INVALID_TOKEN`) renews it and repeats the call.
const PYTHON_AUTH: &str = r#"
import sys
from conductor.client.configuration.configuration import Configuration
from conductor.client.http.models.task_def import TaskDef
from conductor.client.orkes_clients import OrkesClients

metadata = OrkesClients(Configuration()).get_metadata_client()
metadata.register_task_def(TaskDef(name="py.auth", timeout_seconds=60, response_timeout_seconds=30))
print("first", metadata.get_task_def("py.auth").name, flush=True)
sys.stdin.readline()
print("second", metadata.get_task_def("py.auth").name, flush=True)
"#;

#[tokio::test]
async fn the_official_python_sdk_authenticates_and_renews_a_rejected_token() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    let dev = dev_with_auth(Duration::from_secs(600)).await;
    let mut child = tokio::process::Command::new(crate::python_sdk::python())
        .args(["-c", PYTHON_AUTH])
        .env("CONDUCTOR_SERVER_URL", &dev.api)
        .env("CONDUCTOR_AUTH_KEY", KEY)
        .env("CONDUCTOR_AUTH_SECRET", SECRET)
        .env("PYTHONUNBUFFERED", "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python starts");
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let next = async |lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>| {
        tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("the script answers within 30 s")
            .unwrap()
    };
    assert_eq!(next(&mut lines).await.as_deref(), Some("first py.auth"));
    assert_eq!(dev.server.tokens_refused(), 0);
    let issued = dev.server.tokens_issued();
    assert!(issued >= 1);
    dev.server.revoke_tokens();
    stdin.write_all(b"go\n").await.unwrap();
    let second = next(&mut lines).await;
    let output = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("the script ends")
        .unwrap();
    assert_eq!(
        second.as_deref(),
        Some("second py.auth"),
        "stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success());
    assert_eq!(dev.server.tokens_refused(), 1);
    assert_eq!(dev.server.tokens_issued(), issued + 1);
}
