//! Conductor authentication: perago-core's client against devstack with auth on (token fetched
//! lazily and sent, refreshed before expiry and once after a rejection, bad credentials a clear
//! error, servers without auth used with and without credentials), and the runtime end to end.

use crate::harness::{Conductor, SupervisorProc, TaskFixture, eventually};
use perago_core::conductor::{ConductorClient, ConductorError, Credentials};
use perago_devstack::conductor::{ConductorHandle, ConductorServer};
use perago_devstack::faults::FaultSpec;
use serde_json::{Value, json};
use std::time::Duration;

const KEY: &str = "perago-test-key";
const SECRET: &str = "perago-test-secret";

async fn server(auth: bool, ttl: Duration) -> ConductorHandle {
    let mut builder = ConductorServer::builder().token_ttl(ttl);
    if auth {
        builder = builder.auth(KEY, SECRET);
    }
    builder.bind("127.0.0.1:0").await.expect("devstack binds")
}

fn client(server: &ConductorHandle, secret: Option<&str>) -> ConductorClient {
    let credentials = secret.map(|s| Credentials::new(KEY, s));
    ConductorClient::with_auth(&server.base_url(), credentials).unwrap()
}

fn task_def(name: &str) -> Value {
    json!({"name": name, "retryCount": 0, "timeoutSeconds": 60, "responseTimeoutSeconds": 30})
}

#[tokio::test]
async fn the_client_fetches_a_token_lazily_and_sends_it_on_every_request() {
    let server = server(true, Duration::from_secs(600)).await;
    let client = client(&server, Some(SECRET));
    assert_eq!(
        server.tokens_issued(),
        0,
        "no token before the first request"
    );
    client
        .register_task_defs(&[task_def("auth.a")])
        .await
        .unwrap();
    assert!(client.get_task_def("auth.a").await.unwrap().is_some());
    assert!(client.get_task_def("auth.missing").await.unwrap().is_none());
    let polled = client
        .batch_poll("auth.a", "w", 1, Duration::from_millis(1))
        .await
        .unwrap();
    assert!(polled.is_empty());
    assert_eq!(server.tokens_issued(), 1);
    assert_eq!(client.tokens_fetched(), 1);
    assert_eq!(server.tokens_refused(), 0);
    // Clones share the token.
    let clone = client.clone();
    assert!(clone.get_task_def("auth.a").await.unwrap().is_some());
    assert_eq!(server.tokens_issued(), 1);
    let debug = format!("{client:?}");
    assert!(!debug.contains(SECRET), "{debug}");
}

#[tokio::test]
async fn concurrent_first_requests_share_one_token() {
    let server = server(true, Duration::from_secs(600)).await;
    let client = client(&server, Some(SECRET));
    let mut requests = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let client = client.clone();
        requests.spawn(async move { client.get_task_def("auth.none").await });
    }
    while let Some(result) = requests.join_next().await {
        assert!(result.unwrap().unwrap().is_none());
    }
    assert_eq!(server.tokens_issued(), 1);
}

#[tokio::test]
async fn a_client_without_credentials_is_refused_by_an_auth_server() {
    let server = server(true, Duration::from_secs(600)).await;
    let err = client(&server, None)
        .get_task_def("auth.a")
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(401), "{err}");
    assert!(err.to_string().contains("INVALID_TOKEN"), "{err}");
    assert!(!err.is_retryable());
    assert_eq!(server.tokens_issued(), 0);
}

#[tokio::test]
async fn wrong_credentials_are_a_clear_error_that_is_not_retried() {
    let server = server(true, Duration::from_secs(600)).await;
    let client = client(&server, Some("not-the-secret"));
    let err = client.get_task_def("auth.a").await.unwrap_err();
    assert!(err.is_bad_credentials(), "{err:?}");
    assert!(!err.is_retryable());
    assert_eq!(err.status(), Some(401));
    let text = err.to_string();
    assert!(
        text.contains("/api/token")
            && text.contains(KEY)
            && text.contains("CONDUCTOR_AUTH_KEY and CONDUCTOR_AUTH_SECRET"),
        "{text}"
    );
    assert!(!text.contains("not-the-secret"), "{text}");
    assert!(!format!("{err:?}").contains("not-the-secret"));
    assert_eq!(
        server.tokens_refused(),
        0,
        "nothing was sent without a token"
    );
}

#[tokio::test]
async fn tokens_are_refreshed_before_they_expire() {
    let server = server(true, Duration::from_secs(1)).await;
    let client = client(&server, Some(SECRET));
    // Requests keep succeeding while tokens come and go; the client renews each before its
    // `exp`, so the server never sees an expired one.
    eventually("the third token", Duration::from_secs(15), || async {
        client.get_task_def("auth.none").await.unwrap();
        (server.tokens_issued() >= 3).then_some(())
    })
    .await;
    assert_eq!(server.tokens_refused(), 0);
    assert_eq!(client.tokens_fetched(), server.tokens_issued());
}

#[tokio::test]
async fn an_opaque_token_is_renewed_when_refused_as_expired() {
    let server = ConductorServer::builder()
        .auth(KEY, SECRET)
        .token_ttl(Duration::from_secs(1))
        .opaque_tokens(true)
        .bind("127.0.0.1:0")
        .await
        .unwrap();
    let client = client(&server, Some(SECRET));
    // Without an `exp` claim the client keeps its token (45 minutes) until the server refuses
    // it as expired; then it fetches another and repeats the request, which succeeds.
    eventually(
        "an expired token to be renewed",
        Duration::from_secs(15),
        || async {
            assert!(client.get_task_def("auth.none").await.unwrap().is_none());
            (server.tokens_refused() >= 1).then_some(())
        },
    )
    .await;
    assert_eq!(server.tokens_issued(), 2);
    assert_eq!(client.tokens_fetched(), 2);
}

#[tokio::test]
async fn a_rejected_token_is_replaced_and_the_request_sent_again() {
    let server = server(true, Duration::from_secs(600)).await;
    let client = client(&server, Some(SECRET));
    client
        .register_task_defs(&[task_def("auth.b")])
        .await
        .unwrap();
    server.revoke_tokens();
    // A body-carrying request is sent again whole.
    client
        .register_task_defs(&[task_def("auth.c")])
        .await
        .unwrap();
    assert!(client.get_task_def("auth.c").await.unwrap().is_some());
    assert_eq!(server.tokens_refused(), 1);
    assert_eq!(server.tokens_issued(), 2);
}

#[tokio::test]
async fn a_second_rejection_is_returned_after_one_refresh() {
    let server = server(true, Duration::from_secs(600)).await;
    let client = client(&server, Some(SECRET));
    assert!(client.get_task_def("auth.none").await.unwrap().is_none());
    server
        .faults()
        .add(FaultSpec {
            method: None,
            path: "/api/metadata/taskdefs/".into(),
            status: Some(401),
            count: Some(5),
            ..FaultSpec::default()
        })
        .unwrap();
    let err = client.get_task_def("auth.none").await.unwrap_err();
    assert_eq!(err.status(), Some(401), "{err}");
    assert!(!err.is_bad_credentials());
    assert_eq!(server.tokens_issued(), 2, "one refresh, then the error");
}

#[tokio::test]
async fn a_server_without_auth_works_with_and_without_credentials() {
    let server = server(false, Duration::from_secs(600)).await;
    for secret in [None, Some(SECRET)] {
        let client = client(&server, secret);
        client
            .register_task_defs(&[task_def("auth.d")])
            .await
            .unwrap();
        assert!(client.get_task_def("auth.d").await.unwrap().is_some());
        assert!(client.get_task_def("auth.d").await.unwrap().is_some());
        assert_eq!(client.tokens_fetched(), 0);
    }
    assert_eq!(server.tokens_issued(), 0);
}

#[tokio::test]
async fn a_failing_token_route_is_a_retryable_error() {
    let server = server(true, Duration::from_secs(600)).await;
    server
        .faults()
        .add(FaultSpec {
            method: Some("POST".into()),
            path: "/api/token".into(),
            status: Some(503),
            count: Some(1),
            ..FaultSpec::default()
        })
        .unwrap();
    let client = client(&server, Some(SECRET));
    let err = client.get_task_def("auth.none").await.unwrap_err();
    assert_eq!(err.status(), Some(503));
    assert!(err.is_retryable(), "{err:?}");
    assert!(matches!(err, ConductorError::Status { .. }));
    // The next request fetches a token and succeeds.
    assert!(client.get_task_def("auth.none").await.unwrap().is_none());
    assert_eq!(server.tokens_issued(), 1);
}

fn token_404(count: Option<u64>) -> FaultSpec {
    FaultSpec {
        method: Some("POST".into()),
        path: "/api/token".into(),
        status: Some(404),
        count,
        ..FaultSpec::default()
    }
}

/// Once `/token` has issued a token, a 404 from it (a proxy answering for a restarting
/// server) is an outage to retry, not the end of auth: nothing is sent without a token, and
/// requests go on with a fresh one once the route is back.
#[tokio::test]
async fn a_token_404_after_a_token_was_issued_is_an_outage() {
    let server = server(true, Duration::from_secs(1)).await;
    let client = client(&server, Some(SECRET));
    assert!(client.get_task_def("auth.none").await.unwrap().is_none());
    let fault = server.faults().add(token_404(None)).unwrap();
    // Once the token is due for renewal, requests meet the 404.
    let err = eventually(
        "the renewal to meet the 404",
        Duration::from_secs(15),
        || async { client.get_task_def("auth.none").await.err() },
    )
    .await;
    assert!(
        matches!(err, ConductorError::TokenUnavailable { .. }),
        "{err:?}"
    );
    assert!(err.is_retryable() && !err.is_not_found(), "{err:?}");
    assert!(err.to_string().contains("/api/token"), "{err}");
    for _ in 0..3 {
        let again = client.get_task_def("auth.none").await.unwrap_err();
        assert!(
            matches!(again, ConductorError::TokenUnavailable { .. }),
            "{again:?}"
        );
    }
    assert_eq!(
        server.tokens_refused(),
        0,
        "nothing was sent without a token"
    );
    assert!(server.faults().hits(fault).unwrap() >= 4);
    server.faults().remove(fault);
    assert!(client.get_task_def("auth.none").await.unwrap().is_none());
    assert_eq!(server.tokens_issued(), 2);
}

/// A 404 at the very first fetch means no auth, as the SDKs take it; but when the server
/// then refuses a request for want of a token, it has auth after all: a token is fetched and
/// the request sent again.
#[tokio::test]
async fn a_first_token_404_from_a_server_with_auth_is_undone_by_its_refusal() {
    let server = server(true, Duration::from_secs(600)).await;
    server.faults().add(token_404(Some(1))).unwrap();
    let client = client(&server, Some(SECRET));
    assert!(client.get_task_def("auth.none").await.unwrap().is_none());
    assert_eq!(server.tokens_issued(), 1);
    assert!(client.get_task_def("auth.none").await.unwrap().is_none());
    assert_eq!(client.tokens_fetched(), 1);
}

/// The runtime against a Conductor with auth whose `/token` answers 404 for a while after the
/// runtime has its token: polling stops for the outage and resumes with a fresh token once
/// the route is back (before, the broker dropped auth for good and polled unauthenticated,
/// refused, until restarted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_rides_out_a_token_route_answering_404() {
    let server = server(true, Duration::from_secs(2)).await;
    let client = client(&server, Some(SECRET));
    let conductor = Conductor { server, client };
    let task = TaskFixture::new("e2e.auth404", ECHO, "");
    conductor.register(&task).await;
    let sup = SupervisorProc::start(
        &task,
        &conductor,
        1,
        &[
            ("CONDUCTOR_AUTH_KEY", KEY),
            ("CONDUCTOR_AUTH_SECRET", SECRET),
        ],
    );
    let id = conductor.start_workflow(&task, json!({"n": 1})).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf}\n{}", sup.log_text());
    let fault = conductor.server.faults().add(token_404(None)).unwrap();
    // The runtime's token expires under the fault: it meets the 404.
    eventually(
        "the runtime to meet the 404",
        Duration::from_secs(20),
        || async { (conductor.server.faults().hits(fault).unwrap_or(0) >= 1).then_some(()) },
    )
    .await;
    let refused = conductor.server.tokens_refused();
    conductor.server.faults().remove(fault);
    let id = conductor.start_workflow(&task, json!({"n": 2})).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf}\n{}", sup.log_text());
    assert_eq!(wf["output"]["result"]["echo"]["n"], 2, "{wf}");
    assert_eq!(
        refused, 0,
        "the runtime sent nothing without a token during the outage"
    );
    // Logged once at its start, once at its end.
    let log = sup
        .log_with(
            "the Conductor token endpoint issues tokens again",
            Duration::from_secs(5),
        )
        .await;
    assert_eq!(log.matches("taking it as an outage").count(), 1, "{log}");
}

/// Echoes its params.
const ECHO: &str = r#"read params
printf '{"echo": %s}' "$params"
"#;

/// A workflow through the real supervisor, broker and executor against a Conductor that
/// requires auth, with tokens short-lived enough to be renewed during the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_authenticates_with_conductor_auth_variables() {
    let server = server(true, Duration::from_secs(2)).await;
    let client = client(&server, Some(SECRET));
    let conductor = Conductor { server, client };
    // The body reports whether the runtime's Conductor credentials reached it (they must not).
    let body = r#"read params
printf '{"echo": %s, "leaked": "%s%s"}' "$params" "${CONDUCTOR_AUTH_KEY:-}" "${CONDUCTOR_AUTH_SECRET:-}"
"#;
    let task = TaskFixture::new("e2e.auth", body, "");
    conductor.register(&task).await;
    let mut sup = SupervisorProc::start(
        &task,
        &conductor,
        1,
        &[
            ("CONDUCTOR_AUTH_KEY", KEY),
            ("CONDUCTOR_AUTH_SECRET", SECRET),
        ],
    );
    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(conductor.start_workflow(&task, json!({"n": n})).await);
        let wf = conductor
            .wait_terminal(ids.last().unwrap(), Duration::from_secs(30))
            .await;
        assert_eq!(wf["status"], "COMPLETED", "{wf}\n{}", sup.log_text());
        assert_eq!(wf["output"]["result"]["echo"]["n"], n, "{wf}");
        assert_eq!(
            wf["output"]["result"]["leaked"], "",
            "bodies never see the credentials"
        );
        // Let a token expire between workflows, so the runtime has to renew it.
        let issued = conductor.server.tokens_issued();
        eventually("a token renewal", Duration::from_secs(20), || async {
            (conductor.server.tokens_issued() > issued).then_some(())
        })
        .await;
    }
    // Read once the runtime has drained: every line it held is written by then.
    sup.signal("TERM");
    let status = sup.wait_exit(Duration::from_secs(20)).await;
    assert!(status.success(), "{status}\n{}", sup.log_text());
    let log = sup.log_text();
    assert!(!log.contains(SECRET), "the secret is never logged");
}

/// With credentials set and a Conductor without auth (`/api/token` is a 404, as on OSS), the
/// runtime works as without them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_with_credentials_runs_against_a_conductor_without_auth() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("e2e.noauth", ECHO, "");
    conductor.register(&task).await;
    let mut sup = SupervisorProc::start(
        &task,
        &conductor,
        1,
        &[
            ("CONDUCTOR_AUTH_KEY", KEY),
            ("CONDUCTOR_AUTH_SECRET", SECRET),
        ],
    );
    let id = conductor.start_workflow(&task, json!({"n": 7})).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf}\n{}", sup.log_text());
    assert_eq!(wf["output"]["result"]["echo"]["n"], 7, "{wf}");
    // Read once the runtime has drained: every line it held is written by then.
    sup.signal("TERM");
    let status = sup.wait_exit(Duration::from_secs(20)).await;
    assert!(status.success(), "{status}\n{}", sup.log_text());
    assert!(
        !sup.log_text().contains(SECRET),
        "the secret is never logged"
    );
}

/// `https://` URLs are served over TLS, verified against the system's root certificates: a
/// self-signed server certificate is refused during the handshake.
#[tokio::test]
async fn https_urls_speak_tls_and_verify_the_server_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let (key, cert) = (dir.path().join("key.pem"), dir.path().join("cert.pem"));
    let made = tokio::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args(["-subj", "/CN=127.0.0.1", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .await
        .expect("openssl runs");
    assert!(made.status.success(), "{made:?}");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let _server = tokio::process::Command::new("openssl")
        .args(["s_server", "-quiet", "-www", "-accept"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("-cert")
        .arg(&cert)
        .arg("-key")
        .arg(&key)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("openssl s_server starts");
    eventually(
        "the TLS server to listen",
        Duration::from_secs(10),
        || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .ok()
                .map(drop)
        },
    )
    .await;
    let client = ConductorClient::new(&format!("https://127.0.0.1:{port}/api")).unwrap();
    let err = client.get_task_def("x").await.unwrap_err();
    // The server's self-signed certificate is not under any system root: refused.
    let mut text = err.to_string();
    let mut source = std::error::Error::source(&err);
    while let Some(e) = source {
        text.push_str(&format!(": {e}"));
        source = e.source();
    }
    assert!(
        matches!(err, ConductorError::Transport { .. })
            && text.contains("invalid peer certificate"),
        "{text}"
    );
}
