//! The transport of [`LakefsClient`]: one authenticated request with a timeout, its answer read
//! under a cap, idempotent reads retried; the calls themselves are in `refs` and `objects`.

use super::{LakefsConfig, LakefsConfigError, LakefsError, MAX_ERROR_ANSWER, MAX_JSON_ANSWER};
use crate::{backoff::Backoff, url::encode_segment as segment};
use reqwest::{Method, StatusCode};
use serde_json::Value;
use std::time::Duration;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// An object transfer streams for as long as it makes progress; this bounds one that hangs.
pub(super) const TRANSFER_TIMEOUT: Duration = Duration::from_secs(3600);
/// The size of the pieces a file is uploaded in: at most this much of it is in memory at once.
pub(super) const UPLOAD_CHUNK: usize = 256 * 1024;
/// A transfer that receives nothing for this long has failed.
const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// Attempts of an idempotent request before its error is returned.
pub(super) const READ_ATTEMPTS: u32 = 5;

/// A client for one lakeFS server.
#[derive(Debug, Clone)]
pub struct LakefsClient {
    http: reqwest::Client,
    base: String,
    key: String,
    secret: String,
    pub(super) backoff: Backoff,
}

impl LakefsClient {
    /// A client for `config`.
    pub fn new(config: &LakefsConfig) -> Result<Self, LakefsConfigError> {
        let mut base = config.endpoint.trim().trim_end_matches('/').to_owned();
        if !base.starts_with("http://") && !base.starts_with("https://") {
            return Err(LakefsConfigError::Endpoint {
                endpoint: config.endpoint.clone(),
            });
        }
        if !base.ends_with("/api/v1") {
            base.push_str("/api/v1");
        }
        let http = crate::http::client_builder(&base)
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(|e| LakefsConfigError::Client(std::sync::Arc::new(e)))?;
        Ok(Self {
            http,
            base,
            key: config.access_key_id.clone(),
            secret: config.secret_access_key.clone(),
            backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(5), 0.2)
                .expect("valid constants"),
        })
    }

    pub(super) fn repo_path(repo: &str) -> String {
        format!("/repositories/{}", segment(repo))
    }

    pub(super) async fn send(
        &self,
        op: &str,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<Body>,
        timeout: Duration,
    ) -> Result<(StatusCode, Vec<u8>), LakefsError> {
        self.send_limited(op, method, path, query, body, timeout, MAX_JSON_ANSWER)
            .await
    }

    /// [`send`](Self::send), reading at most `limit` bytes of the answer.
    #[expect(
        clippy::too_many_arguments,
        reason = "send's arguments and the cap on what it reads"
    )]
    pub(super) async fn send_limited(
        &self,
        op: &str,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<Body>,
        timeout: Duration,
        limit: usize,
    ) -> Result<(StatusCode, Vec<u8>), LakefsError> {
        let resp = self.respond(op, method, path, query, body, timeout).await?;
        let status = resp.status();
        Ok((status, read_capped(op, resp, limit).await?))
    }

    /// One request; an error status is read (its body is small) and returned as an error, a
    /// success is returned unread so that its body can be streamed.
    pub(super) async fn respond(
        &self,
        op: &str,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<Body>,
        timeout: Duration,
    ) -> Result<reqwest::Response, LakefsError> {
        let url = format!("{}{path}", self.base);
        let mut req = self
            .http
            .request(method, &url)
            .basic_auth(&self.key, Some(&self.secret))
            .timeout(timeout);
        if !query.is_empty() {
            req = req.query(query);
        }
        match body {
            Some(Body::Json(v)) => req = req.json(&v),
            Some(Body::Raw(bytes)) => {
                req = req
                    .header("Content-Type", "application/octet-stream")
                    .body(bytes)
            }
            Some(Body::Stream(stream, size)) => {
                // Streamed from disk in small chunks; the length is announced so that the
                // server never sees a chunked upload.
                req = req
                    .header("Content-Type", "application/octet-stream")
                    .header("Content-Length", size)
                    .body(stream)
            }
            None => {}
        }
        let transport = |source| LakefsError::Transport {
            op: op.to_owned(),
            source,
        };
        let resp =
            req.send()
                .await
                .map_err(|source| match crate::http::redirect_refused(&source) {
                    Some(refused) => LakefsError::Redirect {
                        op: op.to_owned(),
                        status: refused.status,
                        location: refused.location.clone(),
                    },
                    None => transport(source),
                })?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        if status.is_redirection() {
            // A 3xx the client did not try to follow (no `Location`, 300, 304): not an answer.
            return Err(LakefsError::Redirect {
                op: op.to_owned(),
                status: status.as_u16(),
                location: resp.headers().get(reqwest::header::LOCATION).map_or_else(
                    || "(no Location)".to_owned(),
                    |l| String::from_utf8_lossy(l.as_bytes()).into_owned(),
                ),
            });
        }
        let bytes = read_prefix(resp, MAX_ERROR_ANSWER)
            .await
            .map_err(transport)?;
        let message = serde_json::from_slice::<Value>(&bytes)
            .ok()
            .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(&bytes).chars().take(300).collect());
        Err(LakefsError::Status {
            op: op.to_owned(),
            status: status.as_u16(),
            message,
        })
    }

    /// `send` with retries, for idempotent requests only.
    pub(super) async fn read(
        &self,
        op: &str,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
    ) -> Result<Vec<u8>, LakefsError> {
        self.read_limited(op, method, path, query, MAX_JSON_ANSWER)
            .await
    }

    /// [`read`](Self::read), reading at most `limit` bytes of the answer.
    pub(super) async fn read_limited(
        &self,
        op: &str,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        limit: usize,
    ) -> Result<Vec<u8>, LakefsError> {
        let mut attempt = 0;
        loop {
            match self
                .send_limited(
                    op,
                    method.clone(),
                    path,
                    query,
                    None,
                    REQUEST_TIMEOUT,
                    limit,
                )
                .await
            {
                Ok((_, bytes)) => return Ok(bytes),
                Err(e) if e.is_retryable() && attempt + 1 < READ_ATTEMPTS => {
                    tracing::debug!(error = %crate::errors::DisplayChain(&e), attempt, "retrying a lakeFS read");
                    tokio::time::sleep(self.backoff.delay(attempt)).await;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    pub(super) fn decode<T: serde::de::DeserializeOwned>(
        op: &str,
        bytes: &[u8],
    ) -> Result<T, LakefsError> {
        serde_json::from_slice(bytes).map_err(|e| LakefsError::Decode {
            op: op.to_owned(),
            message: crate::errors::chain(&e),
        })
    }
}

/// The whole body of `resp`, refused past `limit` bytes (announced or received) without
/// reading further.
pub(super) async fn read_capped(
    op: &str,
    mut resp: reqwest::Response,
    limit: usize,
) -> Result<Vec<u8>, LakefsError> {
    let too_large = || LakefsError::TooLarge {
        op: op.to_owned(),
        limit,
    };
    if resp
        .content_length()
        .is_some_and(|announced| announced > limit as u64)
    {
        return Err(too_large());
    }
    let mut out = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|source| LakefsError::Transport {
            op: op.to_owned(),
            source,
        })?
    {
        if out.len() + chunk.len() > limit {
            return Err(too_large());
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// At most the first `limit` bytes of the body of `resp` (an error answer: the rest is not read).
async fn read_prefix(mut resp: reqwest::Response, limit: usize) -> Result<Vec<u8>, reqwest::Error> {
    let mut out = Vec::new();
    while out.len() < limit
        && let Some(chunk) = resp.chunk().await?
    {
        out.extend_from_slice(&chunk[..chunk.len().min(limit - out.len())]);
    }
    Ok(out)
}

/// A request body.
pub(super) enum Body {
    Json(Value),
    Raw(Vec<u8>),
    /// A streamed body and its length.
    Stream(reqwest::Body, u64),
}
