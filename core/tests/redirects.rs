//! Issue #22, item 3: no client follows a redirect. A hostile Conductor answers 302 or 307
//! pointing at a second server on another loopback port; that server must receive nothing —
//! no key secret (`/token`), no `X-Authorization` token, no task result — and the request
//! fails with an error naming the status and the target.

#![forbid(unsafe_code)]

use perago_core::conductor::{ConductorClient, ConductorError, Credentials};
use serde_json::json;
use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// One request as a server received it: the head (request line and headers) and the body.
#[derive(Debug, Clone)]
struct Hit {
    head: String,
    body: Vec<u8>,
}

/// A loopback HTTP/1.1 server answering each request with what `answer` makes of its head;
/// every connection is closed after one answer.
struct Server {
    addr: SocketAddr,
    hits: Arc<Mutex<Vec<Hit>>>,
}

impl Server {
    async fn start(answer: impl Fn(&str) -> String + Send + Sync + 'static) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(Mutex::new(Vec::new()));
        let (answer, seen) = (Arc::new(answer), Arc::clone(&hits));
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let (answer, seen) = (Arc::clone(&answer), Arc::clone(&seen));
                tokio::spawn(async move {
                    let Some(hit) = read_request(&mut conn).await else {
                        return;
                    };
                    let reply = answer(&hit.head);
                    seen.lock().unwrap().push(hit);
                    let _ = conn.write_all(reply.as_bytes()).await;
                    let _ = conn.shutdown().await;
                });
            }
        });
        Self { addr, hits }
    }

    fn hits(&self) -> Vec<Hit> {
        self.hits.lock().unwrap().clone()
    }
}

async fn read_request(conn: &mut tokio::net::TcpStream) -> Option<Hit> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let length = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = buf[end..].to_vec();
    while body.len() < length {
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some(Hit { head, body })
}

fn redirect(status: u16, to: SocketAddr) -> String {
    format!(
        "HTTP/1.1 {status} Redirect\r\nLocation: http://{to}/api/stolen\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
}

fn ok(body: &str) -> String {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// The refused redirect behind a Conductor error; panics if it is anything else.
fn refused(error: &ConductorError) -> perago_core::http::RedirectRefused {
    match error {
        ConductorError::Transport { source, .. } => perago_core::http::redirect_refused(source)
            .unwrap_or_else(|| panic!("not a refused redirect: {error}"))
            .clone(),
        other => panic!("expected a transport error, got {other}"),
    }
}

fn client(first: &Server) -> ConductorClient {
    ConductorClient::with_auth(
        &format!("http://{}/api", first.addr),
        Some(Credentials::new("key-id", "key-secret")),
    )
    .unwrap()
}

#[tokio::test]
async fn the_token_request_is_not_sent_on_to_another_host() {
    for status in [302, 307, 308] {
        let second = Server::start(|_| ok("{\"token\": \"stolen\"}")).await;
        let to = second.addr;
        let first = Server::start(move |_| redirect(status, to)).await;
        let error = client(&first)
            .batch_poll("t", "w", 1, Duration::from_millis(10))
            .await
            .unwrap_err();
        let why = refused(&error);
        assert_eq!(why.status, status);
        assert_eq!(why.location, format!("http://{to}/api/stolen"));
        assert!(
            perago_core::errors::chain(&error).contains(&format!(
                "HTTP {status} redirecting to http://{to}/api/stolen; perago follows no redirects"
            )),
            "{error}"
        );
        let asked = first.hits();
        assert_eq!(asked.len(), 1, "{asked:?}");
        assert!(asked[0].head.starts_with("POST /api/token "), "{asked:?}");
        assert!(String::from_utf8_lossy(&asked[0].body).contains("key-secret"));
        assert!(second.hits().is_empty(), "{:?}", second.hits());
    }
}

#[tokio::test]
async fn polls_and_updates_are_not_sent_on_to_another_host() {
    for status in [302, 307] {
        let second = Server::start(|_| ok("[]")).await;
        let to = second.addr;
        let first = Server::start(move |head| {
            if head.starts_with("POST /api/token ") {
                ok("{\"token\": \"live-token\"}")
            } else {
                redirect(status, to)
            }
        })
        .await;
        let client = client(&first);
        let poll = client
            .batch_poll("t", "w", 1, Duration::from_millis(10))
            .await
            .unwrap_err();
        assert_eq!(refused(&poll).status, status);
        let result =
            json!({"taskId": "task-1", "status": "COMPLETED", "outputData": {"secret": "result"}});
        let update = client.update_task(&result).await.unwrap_err();
        assert_eq!(refused(&update).status, status);
        let asked = first.hits();
        let heads: Vec<&str> = asked
            .iter()
            .map(|h| h.head.lines().next().unwrap())
            .collect();
        assert!(
            heads
                .iter()
                .any(|h| h.starts_with("GET /api/tasks/poll/batch/t?"))
                && heads.iter().any(|h| h.starts_with("POST /api/tasks ")),
            "{heads:?}"
        );
        assert!(
            asked
                .iter()
                .filter(|h| !h.head.starts_with("POST /api/token "))
                .all(|h| h
                    .head
                    .to_ascii_lowercase()
                    .contains("x-authorization: live-token")),
            "the first server got the token: the second must not"
        );
        assert!(second.hits().is_empty(), "{:?}", second.hits());
    }
}
