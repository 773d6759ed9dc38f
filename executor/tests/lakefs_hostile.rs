//! The lakeFS client against a hostile server on loopback (issue #22, items 3, 5 and 9):
//! redirects are refused and never followed, answers are read only up to a cap, a pagination
//! that does not advance is refused, a merge answer is not taken on its word.

use perago_executor::workspace::lakefs::{LakefsClient, LakefsConfig, LakefsError};
use serde_json::Map;
use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// One request as the server received it.
#[derive(Debug, Clone)]
struct Hit {
    head: String,
    body: Vec<u8>,
}

/// What the server answers.
enum Reply {
    /// A whole answer.
    Text(String),
}

/// A loopback HTTP/1.1 server answering each request with what `answer` makes of its head;
/// every connection is closed after one answer.
struct Server {
    addr: SocketAddr,
    hits: Arc<Mutex<Vec<Hit>>>,
}

impl Server {
    async fn start(answer: impl Fn(&str) -> Reply + Send + Sync + 'static) -> Self {
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
                    match reply {
                        Reply::Text(text) => {
                            let _ = conn.write_all(text.as_bytes()).await;
                        }
                    }
                    let _ = conn.shutdown().await;
                });
            }
        });
        Self { addr, hits }
    }

    fn hits(&self) -> Vec<Hit> {
        self.hits.lock().unwrap().clone()
    }

    fn client(&self) -> LakefsClient {
        LakefsClient::new(&LakefsConfig {
            endpoint: format!("http://{}", self.addr),
            access_key_id: "access-key".to_owned(),
            secret_access_key: "secret-key".to_owned(),
        })
        .unwrap()
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

fn json(status: u16, body: &str) -> Reply {
    Reply::Text(format!(
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ))
}

fn redirect(status: u16, to: SocketAddr) -> Reply {
    Reply::Text(format!(
        "HTTP/1.1 {status} Redirect\r\nLocation: http://{to}/api/v1/stolen\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    ))
}

#[tokio::test]
async fn redirects_are_refused_and_nothing_reaches_the_other_host() {
    for status in [301, 302, 307, 308] {
        let second = Server::start(|_| json(200, "{}")).await;
        let to = second.addr;
        let first = Server::start(move |_| redirect(status, to)).await;
        let client = first.client();
        let location = format!("http://{to}/api/v1/stolen");
        let is_refused = |e: &LakefsError| matches!(e, LakefsError::Redirect { status: s, location: l, .. } if *s == status && *l == location);

        let listed = client.list_objects("repo", "main", "p/").await.unwrap_err();
        assert!(is_refused(&listed), "{listed}");
        assert_eq!(
            listed.to_string(),
            format!(
                "lakeFS list repo@main/p/: the server answered HTTP {status} redirecting to {location}; perago follows no redirects"
            )
        );
        let uploaded = client
            .upload("repo", "staging", "p/a.txt", b"the task's output".to_vec())
            .await
            .unwrap_err();
        assert!(is_refused(&uploaded), "{uploaded}");
        let merged = client
            .merge(
                "repo",
                "staging",
                "main",
                "m",
                &Map::new(),
                Duration::from_secs(5),
            )
            .await
            .unwrap_err();
        assert!(is_refused(&merged), "{merged}");
        assert!(!merged.is_retryable(), "a redirect is not an outage");

        // Each was asked once (no retry), with credentials, and nothing went on.
        let asked = first.hits();
        assert_eq!(asked.len(), 3, "{asked:?}");
        assert!(
            asked.iter().all(|h| h
                .head
                .to_ascii_lowercase()
                .contains("authorization: basic ")),
            "{asked:?}"
        );
        assert_eq!(asked[1].body, b"the task's output");
        assert!(second.hits().is_empty(), "{:?}", second.hits());
    }
}

#[tokio::test]
async fn a_redirect_status_without_location_is_not_a_success() {
    for status in [300, 302, 304] {
        let server = Server::start(move |_| {
            Reply::Text(format!(
                "HTTP/1.1 {status} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            ))
        })
        .await;
        let error = server
            .client()
            .create_branch("repo", "staging", "main")
            .await
            .unwrap_err();
        assert!(
            matches!(error, LakefsError::Redirect { status: s, ref location, .. } if s == status && location == "(no Location)"),
            "{error}"
        );
    }
}
