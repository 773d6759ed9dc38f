//! Task inputs in Conductor's external payload storage. Conductor moves a task input above its
//! `taskInputPayloadSizeThreshold` (3072 KB by default) there: the task comes with
//! `inputData: {}` and `externalInputPayloadStoragePath`. The input is read as the Java SDK
//! reads it: `GET /tasks/externalstoragelocation?path=…&operation=READ&payloadType=TASK_INPUT`
//! answers an `ExternalStorageLocation`, whose `uri` (an S3 or Azure pre-signed URL, or the
//! server's own endpoint with the Postgres storage) holds the JSON document.
//!
//! The `uri` is another origin than Conductor's: it is fetched with a client of its own, built
//! for that URL ([`crate::http::client_builder`]: the same TLS rules, no redirects), which
//! sends no credential: Conductor's token goes to Conductor only (a pre-signed URL is its own
//! credential). The answer is streamed and capped at the inline limit, and must be one JSON
//! object. Only the `uri`'s scheme, host and path are ever logged or put in a reason: its
//! query is the signature.

use std::time::Duration;

use reqwest::Method;
use serde_json::Value;

use super::client::{ConductorClient, read_capped};
use super::errors::ConductorError;
use crate::json::{Kind, RawJson};

/// Why an externalized input could not be had.
#[derive(Debug, thiserror::Error)]
pub enum PayloadError {
    /// Conductor did not say where the input is.
    #[error("cannot ask Conductor where the task input {path:?} is stored")]
    Location {
        /// `externalInputPayloadStoragePath`.
        path: String,
        /// Conductor's error.
        #[source]
        source: ConductorError,
    },
    /// The location has no `uri`: the server runs `DummyPayloadStorage` (no storage module).
    #[error(
        "Conductor stored the task input at {path:?} but its external storage location has no uri: the server runs without a readable payload storage (DummyPayloadStorage, the default); configure conductor.external-payload-storage.type (s3, azureblob or postgres) so that workers can read inputs above taskInputPayloadSizeThreshold"
    )]
    NoUri {
        /// `externalInputPayloadStoragePath`.
        path: String,
    },
    /// The location is not an `ExternalStorageLocation`, or its `uri` not an http(s) URL.
    #[error("Conductor's external storage location for {path:?} is unusable: {problem}")]
    BadLocation {
        /// `externalInputPayloadStoragePath`.
        path: String,
        /// What is wrong.
        problem: String,
    },
    /// The storage did not answer.
    #[error("GET {uri} (the task input in external storage)")]
    Transport {
        /// The URL without its query.
        uri: String,
        /// The transport error.
        #[source]
        source: reqwest::Error,
    },
    /// The storage answered an error status.
    #[error("GET {uri} (the task input in external storage): HTTP {status}")]
    Status {
        /// The URL without its query.
        uri: String,
        /// The status.
        status: u16,
    },
    /// The stored input is larger than perago takes inline.
    #[error("the task input at {uri} is larger than {limit} bytes, the most perago takes")]
    TooLarge {
        /// The URL without its query.
        uri: String,
        /// The cap.
        limit: usize,
    },
    /// The stored input is not one JSON object.
    #[error("the task input at {uri} is not a JSON object: {problem}")]
    NotObject {
        /// The URL without its query.
        uri: String,
        /// What it is instead.
        problem: String,
    },
}

impl PayloadError {
    /// Whether a retry of the task would meet the same answer: the server's storage
    /// configuration, or the stored document itself. Everything else (Conductor or the
    /// storage unreachable or failing) may pass.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            Self::NoUri { .. }
                | Self::BadLocation { .. }
                | Self::TooLarge { .. }
                | Self::NotObject { .. }
        )
    }
}

/// `url` as it may be shown: scheme, host, port and path; no query, no user info.
fn shown(url: &reqwest::Url) -> String {
    let mut url = url.clone();
    url.set_query(None);
    url.set_fragment(None);
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url.to_string()
}

impl ConductorClient {
    /// `GET /tasks/externalstoragelocation?path=…&operation=…&payloadType=…`, the
    /// `ExternalStorageLocation` as it came.
    pub async fn external_storage_location(
        &self,
        path: &str,
        operation: &str,
        payload_type: &str,
    ) -> Result<Value, ConductorError> {
        let route = "/tasks/externalstoragelocation";
        let query = [
            ("path", path.to_owned()),
            ("operation", operation.to_owned()),
            ("payloadType", payload_type.to_owned()),
        ];
        let (_, text) = self
            .send(
                Method::GET,
                route,
                &query,
                None,
                Duration::from_secs(30),
                64 << 10,
            )
            .await?;
        Self::decode("GET", route, self.base_url(), &text)
    }
}

/// The task input Conductor stored at `path`, read through `conductor`'s storage location:
/// at most `limit` bytes, within `timeout` for the download.
pub async fn fetch_task_input(
    conductor: &ConductorClient,
    path: &str,
    limit: usize,
    timeout: Duration,
) -> Result<RawJson, PayloadError> {
    let location = conductor
        .external_storage_location(path, "READ", "TASK_INPUT")
        .await
        .map_err(|source| PayloadError::Location {
            path: path.to_owned(),
            source,
        })?;
    let bad = |problem: &str| PayloadError::BadLocation {
        path: path.to_owned(),
        problem: problem.to_owned(),
    };
    let Some(location) = location.as_object() else {
        return Err(bad("the answer is not a JSON object"));
    };
    let uri = match location.get("uri") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.trim().is_empty() => None,
        Some(Value::String(s)) => Some(s.as_str()),
        Some(_) => return Err(bad("uri is not a string")),
    };
    let Some(uri) = uri else {
        return Err(PayloadError::NoUri {
            path: path.to_owned(),
        });
    };
    let url = reqwest::Url::parse(uri).map_err(|e| {
        bad(&format!(
            "uri does not parse: {}",
            crate::errors::DisplayChain(&e)
        ))
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad(&format!(
            "uri has scheme {:?}, not http or https",
            url.scheme()
        )));
    }
    let shown = shown(&url);
    // reqwest's errors name their URL, query and all: the signature must not reach a reason.
    let transport = |source: reqwest::Error| PayloadError::Transport {
        uri: shown.clone(),
        source: source.without_url(),
    };
    // A client of the storage's own: no default header, so no credential of Conductor's.
    let client = crate::http::client_builder(uri)
        .connect_timeout(Duration::from_secs(5))
        .timeout(timeout)
        .build()
        .map_err(transport)?;
    let resp = client.get(url).send().await.map_err(transport)?;
    let status = resp.status();
    if !status.is_success() {
        return Err(PayloadError::Status {
            uri: shown,
            status: status.as_u16(),
        });
    }
    let (bytes, complete) = read_capped(resp, limit).await.map_err(transport)?;
    if !complete {
        return Err(PayloadError::TooLarge { uri: shown, limit });
    }
    let not_object = |problem: String| PayloadError::NotObject {
        uri: shown.clone(),
        problem,
    };
    let text = String::from_utf8(bytes).map_err(|_| not_object("it is not UTF-8".to_owned()))?;
    let input = RawJson::parse(text).map_err(|e| not_object(crate::errors::chain(&e)))?;
    match crate::json::kind(input.as_str()) {
        Kind::Object => Ok(input),
        _ => Err(not_object("it is another JSON value".to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpListener;

    /// A one-request-per-connection HTTP server answering `answer(request head)`; every
    /// request head it read is sent on the channel.
    async fn serve(
        answer: impl Fn(&str) -> String + Send + Sync + 'static,
    ) -> (String, tokio::sync::mpsc::UnboundedReceiver<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let answer = std::sync::Arc::new(answer);
        tokio::spawn(async move {
            loop {
                let Ok((mut conn, _)) = listener.accept().await else {
                    return;
                };
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if conn.read(&mut byte).await.unwrap_or(0) == 0 {
                        break;
                    }
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let body = answer(&head);
                let _ = tx.send(head);
                let _ = conn.write_all(body.as_bytes()).await;
                let _ = conn.shutdown().await;
            }
        });
        (format!("http://{addr}"), rx)
    }

    fn ok(body: &str) -> String {
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
    }

    async fn conductor_answering(location: String) -> ConductorClient {
        let (url, _) = serve(move |_| ok(&location)).await;
        ConductorClient::new(&format!("{url}/api")).unwrap()
    }

    #[tokio::test]
    async fn the_input_is_read_from_the_uri_without_any_credential() {
        let (storage, mut seen) = serve(|_| ok(r#"{"blob": "xyz"}"#)).await;
        let conductor = conductor_answering(format!(
            r#"{{"uri": "{storage}/k.json?sig=s3cr3t", "path": "k.json"}}"#
        ))
        .await;
        let input = fetch_task_input(&conductor, "k.json", 1 << 20, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(input.as_str(), r#"{"blob": "xyz"}"#);
        let head = seen.recv().await.unwrap().to_ascii_lowercase();
        assert!(head.starts_with("get /k.json?sig=s3cr3t "), "{head}");
        assert!(!head.contains("authorization"), "{head}");
    }

    #[tokio::test]
    async fn a_location_without_uri_names_the_server_storage_and_is_terminal() {
        let conductor = conductor_answering(r#"{"path": "k.json0b1c.json"}"#.to_owned()).await;
        let e = fetch_task_input(&conductor, "k.json", 1 << 20, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(e.is_terminal());
        assert!(e.to_string().contains("DummyPayloadStorage"), "{e}");
    }

    #[tokio::test]
    async fn storage_errors_are_retried_and_never_show_the_signature() {
        let (storage, _) = serve(|_| {
            "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                .to_owned()
        })
        .await;
        let conductor =
            conductor_answering(format!(r#"{{"uri": "{storage}/k.json?sig=s3cr3t"}}"#)).await;
        let e = fetch_task_input(&conductor, "k.json", 1 << 20, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(!e.is_terminal());
        let text = e.to_string();
        assert!(
            text.contains("HTTP 503") && !text.contains("s3cr3t"),
            "{text}"
        );
    }

    /// A storage that cannot be reached: reqwest's error names the whole URL, which must not
    /// reach the reason (nor any error in its chain).
    #[tokio::test]
    async fn an_unreachable_storage_never_shows_the_signature() {
        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = closed.local_addr().unwrap();
        drop(closed);
        let conductor =
            conductor_answering(format!(r#"{{"uri": "http://{addr}/k.json?sig=s3cr3t"}}"#)).await;
        let e = fetch_task_input(&conductor, "k.json", 1 << 20, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(!e.is_terminal());
        let mut chain = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            chain.push_str(&format!(" / {s}"));
            source = s.source();
        }
        assert!(
            chain.contains(&format!("http://{addr}/k.json")) && !chain.contains("s3cr3t"),
            "{chain}"
        );
    }

    #[tokio::test]
    async fn an_input_above_the_cap_or_not_an_object_is_refused() {
        let (storage, _) = serve(|head| {
            if head.contains("/big") {
                ok(&format!(r#"{{"b": "{}"}}"#, "x".repeat(2000)))
            } else {
                ok("[1, 2]")
            }
        })
        .await;
        for (name, want) in [
            ("big", "larger than 1024 bytes"),
            ("array", "not a JSON object"),
        ] {
            let conductor = conductor_answering(format!(r#"{{"uri": "{storage}/{name}"}}"#)).await;
            let e = fetch_task_input(&conductor, name, 1024, Duration::from_secs(5))
                .await
                .unwrap_err();
            assert!(e.is_terminal() && e.to_string().contains(want), "{e}");
        }
    }
}
