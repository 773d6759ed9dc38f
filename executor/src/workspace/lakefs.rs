//! A lakeFS REST client for exactly what the workspace runtime needs: pin a branch, list and
//! read objects at a commit, cut a staging branch, upload, delete, commit, merge, clean up.
//! Every request has a timeout; idempotent reads are retried on transport errors, 5xx and 429.
//! The secret key never appears in `Debug` output or in error messages.
//!
//! Nothing a server answers is taken on its word: every answer read into memory has a cap
//! ([`MAX_JSON_ANSWER`], error bodies [`MAX_ERROR_ANSWER`]); a listing's keys must come in
//! order after `after`, its `next_offset` must advance (lakeFS's is the last key returned) and
//! it holds at most the entries the caller allows; a download receives exactly the size the
//! listing gave; commit ids must be commit ids (64 lowercase hex characters).

use perago_core::{backoff::Backoff, url::encode_segment as segment};
use reqwest::{Method, StatusCode};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use std::{fmt, path::Path, path::PathBuf, time::Duration};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// An object transfer streams for as long as it makes progress; this bounds one that hangs.
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(3600);
/// The size of the pieces a file is uploaded in: at most this much of it is in memory at once.
const UPLOAD_CHUNK: usize = 256 * 1024;
/// A transfer that receives nothing for this long has failed.
const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// Attempts of an idempotent request before its error is returned.
const READ_ATTEMPTS: u32 = 5;
/// lakeFS pages at most 1000 entries.
pub const MAX_PAGE: u32 = 1000;
/// The largest JSON answer read: a page of 1000 entries with 1024-byte keys and their stats
/// is a few MiB at most.
pub const MAX_JSON_ANSWER: usize = 8 << 20;
/// The most of an error answer read (its message is cut to 300 characters anyway).
pub const MAX_ERROR_ANSWER: usize = 64 << 10;
/// The largest object [`LakefsClient::get_object`] reads into memory (tests, `dev`).
pub const MAX_OBJECT_IN_MEMORY: usize = 64 << 20;
/// lakeFS keys (and so branch ids and paths listed) are at most 1024 bytes.
pub const MAX_KEY_BYTES: usize = 1024;
/// The longest object checksum kept (an MD5 is 32 hex characters, an S3 multipart ETag a few
/// more).
pub const MAX_CHECKSUM_BYTES: usize = 128;
/// The most branch protection rules read.
pub const MAX_PROTECTION_RULES: usize = 1000;
/// The most entries a diff or a branch listing holds.
pub const MAX_LISTED: usize = 100_000;

/// Where and as whom to reach lakeFS.
#[derive(Clone)]
pub struct LakefsConfig {
    /// `LAKEFS_ENDPOINT`, with or without `/api/v1`.
    pub endpoint: String,
    /// `LAKEFS_ACCESS_KEY_ID`.
    pub access_key_id: String,
    /// `LAKEFS_SECRET_ACCESS_KEY`.
    pub secret_access_key: String,
}

impl fmt::Debug for LakefsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LakefsConfig")
            .field("endpoint", &self.endpoint)
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .finish()
    }
}

/// lakeFS settings no client can be made from.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LakefsConfigError {
    /// Variables are missing.
    #[error(
        "LakeFS config is required for workspace tasks: missing {}",
        missing.join(", ")
    )]
    Missing {
        /// Every missing variable.
        missing: Vec<&'static str>,
    },
    /// `LAKEFS_ENDPOINT` is not an http(s) URL.
    #[error("LAKEFS_ENDPOINT {endpoint:?} is invalid: expected an http:// or https:// URL")]
    Endpoint {
        /// The endpoint as given.
        endpoint: String,
    },
    /// The HTTP client cannot be built (TLS roots, …).
    #[error("cannot build an HTTP client: {0}")]
    Client(#[source] std::sync::Arc<reqwest::Error>),
}

impl LakefsConfig {
    /// The config from `lookup`; the error lists every missing name.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, LakefsConfigError> {
        use perago_core::env::{
            LAKEFS_ACCESS_KEY_ID, LAKEFS_ENDPOINT, LAKEFS_SECRET_ACCESS_KEY, require,
        };
        let [endpoint, access_key_id, secret_access_key] = require(
            lookup,
            [
                LAKEFS_ENDPOINT,
                LAKEFS_ACCESS_KEY_ID,
                LAKEFS_SECRET_ACCESS_KEY,
            ],
        )
        .map_err(|missing| LakefsConfigError::Missing { missing })?;
        Ok(Self {
            endpoint,
            access_key_id,
            secret_access_key,
        })
    }
}

/// A failed lakeFS call.
#[derive(Debug, thiserror::Error)]
pub enum LakefsError {
    /// No answer (connect, timeout, reset).
    #[error("lakeFS {op}: {source}")]
    Transport {
        /// What was being done.
        op: String,
        /// The cause.
        #[source]
        source: reqwest::Error,
    },
    /// An error status.
    #[error("lakeFS {op}: HTTP {status}: {message}")]
    Status {
        /// What was being done.
        op: String,
        /// The status code.
        status: u16,
        /// The server's `message`.
        message: String,
    },
    /// A 3xx answer: no client follows a redirect (`perago_core::http`).
    #[error(
        "lakeFS {op}: the server answered HTTP {status} redirecting to {location}; perago follows no redirects"
    )]
    Redirect {
        /// What was being done.
        op: String,
        /// The 3xx status.
        status: u16,
        /// The `Location`, or `(no Location)`.
        location: String,
    },
    /// An answer longer than perago reads into memory.
    #[error("lakeFS {op}: the answer is larger than {limit} bytes, the most perago reads; refused")]
    TooLarge {
        /// What was being done.
        op: String,
        /// The cap.
        limit: usize,
    },
    /// A listing page that does not continue the listing (keys out of order, a `next_offset`
    /// that does not advance).
    #[error("lakeFS {op}: bad pagination: {message}; refused")]
    Pagination {
        /// What was being done.
        op: String,
        /// What was wrong.
        message: String,
    },
    /// A listing with more entries than the caller holds.
    #[error("lakeFS {op}: more than {max} entries listed")]
    TooMany {
        /// What was being done.
        op: String,
        /// The most the caller holds.
        max: usize,
    },
    /// An object whose content is longer than its listing gave: the transfer was cut there.
    #[error(
        "lakeFS {op}: the server sent more than the {listed} bytes the listing gives the object; refused"
    )]
    LongerThanListed {
        /// What was being done.
        op: String,
        /// The size listed.
        listed: u64,
    },
    /// An object whose content is shorter than its listing gave.
    #[error(
        "lakeFS {op}: the server sent {received} bytes, but the listing gives the object {listed}; refused"
    )]
    ShorterThanListed {
        /// What was being done.
        op: String,
        /// The size listed.
        listed: u64,
        /// The bytes received.
        received: u64,
    },
    /// A merge conflict (409).
    #[error("lakeFS {op}: merge conflict")]
    Conflict {
        /// What was being done.
        op: String,
    },
    /// A local file could not be read or written.
    #[error("lakeFS {op}: {}: {source}", file.display())]
    Local {
        /// What was being done.
        op: String,
        /// The file.
        file: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// An answer that is not what the API promises.
    #[error("lakeFS {op}: unexpected response: {message}")]
    Decode {
        /// What was being done.
        op: String,
        /// What was wrong.
        message: String,
    },
}

impl LakefsError {
    /// Transport errors, 5xx and 429.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Transport { .. } => true,
            Self::Status { status, .. } => *status >= 500 || *status == 429,
            _ => false,
        }
    }

    /// A 404.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Status { status: 404, .. })
    }

    /// lakeFS's "no changes" 400 (commit or merge with nothing to do).
    pub fn is_no_changes(&self) -> bool {
        matches!(self, Self::Status { status: 400, message, .. } if message.contains("no changes"))
    }
}

/// One object as listed.
#[derive(Debug, Clone, Deserialize)]
pub struct ObjectStats {
    /// The key.
    pub path: String,
    /// `object` or `common_prefix`.
    pub path_type: String,
    /// lakeFS's checksum: the hex MD5 of the content only for objects uploaded through the
    /// API (`<md5 of the parts' MD5s>-<parts>` through the S3 gateway in parts, the source's
    /// ETag when linked or imported). Checked for length; never compared with local files.
    #[serde(default)]
    pub checksum: String,
    /// Size in bytes.
    #[serde(default)]
    pub size_bytes: Option<u64>,
}

/// A commit.
#[derive(Debug, Clone, Deserialize)]
pub struct Commit {
    /// The commit id.
    pub id: String,
    /// Parent commit ids.
    #[serde(default)]
    pub parents: Vec<String>,
    /// Commit metadata.
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
}

/// A page's `pagination`.
#[derive(Debug, Deserialize)]
pub struct Pagination {
    /// More pages follow.
    pub has_more: bool,
    /// Where the next page starts.
    pub next_offset: String,
}

/// A page of a listing as lakeFS sends it.
#[derive(Debug, Deserialize)]
pub struct Page<T> {
    /// Its pagination.
    pub pagination: Pagination,
    /// Its entries.
    pub results: Vec<T>,
}

#[derive(Debug, Deserialize)]
struct Ref {
    commit_id: String,
}

/// A client for one lakeFS server.
#[derive(Debug, Clone)]
pub struct LakefsClient {
    http: reqwest::Client,
    base: String,
    key: String,
    secret: String,
    backoff: Backoff,
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
        let http = perago_core::http::client_builder(&base)
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

    fn repo_path(repo: &str) -> String {
        format!("/repositories/{}", segment(repo))
    }

    async fn send(
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
    async fn send_limited(
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
    async fn respond(
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
            req.send().await.map_err(|source| {
                match perago_core::http::redirect_refused(&source) {
                    Some(refused) => LakefsError::Redirect {
                        op: op.to_owned(),
                        status: refused.status,
                        location: refused.location.clone(),
                    },
                    None => transport(source),
                }
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
    async fn read(
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
    async fn read_limited(
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
                    tracing::debug!(error = %e, attempt, "retrying a lakeFS read");
                    tokio::time::sleep(self.backoff.delay(attempt)).await;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn decode<T: serde::de::DeserializeOwned>(op: &str, bytes: &[u8]) -> Result<T, LakefsError> {
        serde_json::from_slice(bytes).map_err(|e| LakefsError::Decode {
            op: op.to_owned(),
            message: e.to_string(),
        })
    }

    /// The commit a ref points at now: a branch, a commit id, a tag, or an expression
    /// (`main~1`, `main@`, `v1.0~2`). A branch id is read from its branch (then, on a 404,
    /// as a commit or tag of that name); anything else from `GET /commits/{ref}`, which lakeFS
    /// resolves for every ref: its branch routes answer 400 to what is not a branch id.
    pub async fn resolve_commit(&self, repo: &str, reference: &str) -> Result<String, LakefsError> {
        let op = format!("resolve {repo}@{reference}");
        if !is_branch_id(reference) {
            return Ok(self.get_commit(repo, reference).await?.id);
        }
        let branch = format!("{}/branches/{}", Self::repo_path(repo), segment(reference));
        let id = match self.read(&op, Method::GET, &branch, &[]).await {
            Ok(bytes) => Self::decode::<Ref>(&op, &bytes)?.commit_id,
            Err(e) if e.is_not_found() => self.get_commit(repo, reference).await?.id,
            Err(e) => return Err(e),
        };
        commit_id(&op, id)
    }

    /// The commit `reference` names (`GET /commits/{ref}`); its id is checked.
    pub async fn get_commit(&self, repo: &str, reference: &str) -> Result<Commit, LakefsError> {
        let op = format!("get commit {repo}@{reference}");
        let path = format!("{}/commits/{}", Self::repo_path(repo), segment(reference));
        let bytes = self.read(&op, Method::GET, &path, &[]).await?;
        let commit = Self::decode::<Commit>(&op, &bytes)?;
        commit_id(&op, commit.id.clone())?;
        Ok(commit)
    }

    /// Every object under `prefix` at `reference`, following pagination; more than `max`
    /// entries is [`LakefsError::TooMany`], a page that does not continue the listing is
    /// [`LakefsError::Pagination`]. Keys, checksums and sizes are checked as they arrive.
    pub async fn list_objects(
        &self,
        repo: &str,
        reference: &str,
        prefix: &str,
        max: usize,
    ) -> Result<Vec<ObjectStats>, LakefsError> {
        let op = format!("list {repo}@{reference}/{prefix}");
        let path = format!(
            "{}/refs/{}/objects/ls",
            Self::repo_path(repo),
            segment(reference)
        );
        let query = [("prefix", prefix), ("user_metadata", "false")];
        let listed: Vec<ObjectStats> = self
            .list_pages(
                &op,
                &path,
                &query,
                max,
                |o: &ObjectStats| &o.path,
                |o| check_object(&op, o),
            )
            .await?;
        Ok(listed
            .into_iter()
            .filter(|o| o.path_type == "object")
            .collect())
    }

    /// The content of one object.
    pub async fn get_object(
        &self,
        repo: &str,
        reference: &str,
        key: &str,
    ) -> Result<Vec<u8>, LakefsError> {
        let op = format!("get {repo}@{reference}/{key}");
        let path = format!(
            "{}/refs/{}/objects",
            Self::repo_path(repo),
            segment(reference)
        );
        self.read_limited(
            &op,
            Method::GET,
            &path,
            &[("path", key)],
            MAX_OBJECT_IN_MEMORY,
        )
        .await
    }

    /// Streams one object into `file` (created or truncated), never holding more than one
    /// response chunk in memory; transport errors, 5xx and 429 are retried from the start.
    /// The object must be `size` bytes (its listed size): a server that sends more is cut
    /// off there, and fewer is an error too.
    ///
    /// Returns the hex MD5 of the bytes written, hashed as they arrive: the executor's own
    /// record of what it downloaded. lakeFS's `checksum` is the content MD5 only for objects
    /// uploaded through its API (an S3-gateway multipart upload stores the part-ETag hash, a
    /// linked or imported object its source's ETag), so it can never decide what changed.
    pub async fn get_object_to_file(
        &self,
        repo: &str,
        reference: &str,
        key: &str,
        file: &Path,
        size: u64,
    ) -> Result<String, LakefsError> {
        let op = format!("get {repo}@{reference}/{key}");
        let path = format!(
            "{}/refs/{}/objects",
            Self::repo_path(repo),
            segment(reference)
        );
        let mut attempt = 0;
        loop {
            match self.stream_to_file(&op, &path, key, file, size).await {
                Ok(md5) => return Ok(md5),
                Err(e) if e.is_retryable() && attempt + 1 < READ_ATTEMPTS => {
                    tracing::debug!(error = %e, attempt, "retrying a lakeFS download");
                    tokio::time::sleep(self.backoff.delay(attempt)).await;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn stream_to_file(
        &self,
        op: &str,
        path: &str,
        key: &str,
        file: &Path,
        size: u64,
    ) -> Result<String, LakefsError> {
        use md5::Digest as _;
        use tokio::io::AsyncWriteExt as _;
        let local = |source| LakefsError::Local {
            op: op.to_owned(),
            file: file.to_owned(),
            source,
        };
        let mut resp = self
            .respond(
                op,
                Method::GET,
                path,
                &[("path", key)],
                None,
                TRANSFER_TIMEOUT,
            )
            .await?;
        let longer = || LakefsError::LongerThanListed {
            op: op.to_owned(),
            listed: size,
        };
        if resp
            .content_length()
            .is_some_and(|announced| announced > size)
        {
            return Err(longer());
        }
        // Only the executor (and, once handed over, the body's user) may read the workspace.
        let mut out = tokio::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(file)
            .await
            .map_err(local)?;
        let mut received = 0u64;
        let mut md5 = md5::Md5::new();
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|source| LakefsError::Transport {
                op: op.to_owned(),
                source,
            })?
        {
            received += chunk.len() as u64;
            if received > size {
                return Err(longer());
            }
            md5.update(&chunk);
            out.write_all(&chunk).await.map_err(local)?;
        }
        if received != size {
            return Err(LakefsError::ShorterThanListed {
                op: op.to_owned(),
                listed: size,
                received,
            });
        }
        out.flush().await.map_err(local)?;
        Ok(md5.finalize().iter().map(|b| format!("{b:02x}")).collect())
    }

    /// Creates `branch` from `source` (a commit id or branch).
    pub async fn create_branch(
        &self,
        repo: &str,
        branch: &str,
        source: &str,
    ) -> Result<(), LakefsError> {
        let op = format!("create branch {repo}/{branch}");
        let path = format!("{}/branches", Self::repo_path(repo));
        let body = Body::Json(json!({"name": branch, "source": source}));
        self.send(&op, Method::POST, &path, &[], Some(body), REQUEST_TIMEOUT)
            .await
            .map(drop)
    }

    /// Uploads `content` to `key` on `branch` (small objects: tests, `dev`).
    pub async fn upload(
        &self,
        repo: &str,
        branch: &str,
        key: &str,
        content: Vec<u8>,
    ) -> Result<(), LakefsError> {
        let op = format!("upload {repo}/{branch}/{key}");
        let path = format!(
            "{}/branches/{}/objects",
            Self::repo_path(repo),
            segment(branch)
        );
        self.send(
            &op,
            Method::POST,
            &path,
            &[("path", key)],
            Some(Body::Raw(content)),
            REQUEST_TIMEOUT,
        )
        .await
        .map(drop)
    }

    /// Uploads `upload` to its key on `branch`, streamed from the descriptor it was checked
    /// and hashed from (never reopened by path): exactly the checked size is announced and
    /// sent, and the upload fails (the server never receives the whole object) if the file
    /// no longer has that size and checksum.
    pub async fn upload_file(
        &self,
        repo: &str,
        branch: &str,
        upload: &super::scan::Upload,
    ) -> Result<(), LakefsError> {
        let key = upload.key.as_str();
        let op = format!("upload {repo}/{branch}/{key}");
        let path = format!(
            "{}/branches/{}/objects",
            Self::repo_path(repo),
            segment(branch)
        );
        // Read on a blocking thread, a few pieces ahead of the request.
        let (pieces, received) = tokio::sync::mpsc::channel::<std::io::Result<Vec<u8>>>(2);
        let reader = upload.clone();
        let reading = tokio::task::spawn_blocking(move || {
            let read = reader.read_checked(UPLOAD_CHUNK, |piece| {
                pieces.blocking_send(Ok(piece)).is_ok()
            });
            if let Err(e) = &read {
                // The request fails instead of ending: the object is not stored.
                let _ = pieces.blocking_send(Err(std::io::Error::new(e.kind(), e.to_string())));
            }
            read
        });
        let body =
            reqwest::Body::wrap_stream(tokio_stream::wrappers::ReceiverStream::new(received));
        let sent = self
            .send(
                &op,
                Method::POST,
                &path,
                &[("path", key)],
                Some(Body::Stream(body, upload.size)),
                TRANSFER_TIMEOUT,
            )
            .await;
        let local = |source| LakefsError::Local {
            op: op.clone(),
            file: upload.path.clone(),
            source,
        };
        match reading.await {
            Ok(Err(e)) => Err(local(e)),
            Err(e) => Err(local(std::io::Error::other(e))),
            Ok(Ok(())) => sent.map(drop),
        }
    }

    /// Deletes `keys` on `branch`, at most 1000 per request.
    pub async fn delete_objects(
        &self,
        repo: &str,
        branch: &str,
        keys: &[String],
    ) -> Result<(), LakefsError> {
        let path = format!(
            "{}/branches/{}/objects/delete",
            Self::repo_path(repo),
            segment(branch)
        );
        for chunk in keys.chunks(MAX_PAGE as usize) {
            let op = format!("delete {} objects on {repo}/{branch}", chunk.len());
            let (_, bytes) = self
                .send(
                    &op,
                    Method::POST,
                    &path,
                    &[],
                    Some(Body::Json(json!({"paths": chunk}))),
                    REQUEST_TIMEOUT,
                )
                .await?;
            let answer: Value = Self::decode(&op, &bytes)?;
            if let Some(first) = answer["errors"].as_array().and_then(|e| e.first()) {
                return Err(LakefsError::Status {
                    op,
                    status: first["status_code"].as_u64().unwrap_or(500) as u16,
                    message: first["message"]
                        .as_str()
                        .unwrap_or("delete failed")
                        .to_owned(),
                });
            }
        }
        Ok(())
    }

    /// Commits `branch` with `message` and `metadata`.
    pub async fn commit(
        &self,
        repo: &str,
        branch: &str,
        message: &str,
        metadata: &Map<String, Value>,
    ) -> Result<Commit, LakefsError> {
        let op = format!("commit {repo}/{branch}");
        let path = format!(
            "{}/branches/{}/commits",
            Self::repo_path(repo),
            segment(branch)
        );
        let body = Body::Json(json!({"message": message, "metadata": metadata}));
        let (_, bytes) = self
            .send(&op, Method::POST, &path, &[], Some(body), REQUEST_TIMEOUT)
            .await?;
        let commit: Commit = Self::decode(&op, &bytes)?;
        commit_id(&op, commit.id.clone())?;
        Ok(commit)
    }

    /// Merges `source` into `destination` within `timeout`; returns the merge commit id.
    pub async fn merge(
        &self,
        repo: &str,
        source: &str,
        destination: &str,
        message: &str,
        metadata: &Map<String, Value>,
        timeout: Duration,
    ) -> Result<String, LakefsError> {
        let op = format!("merge {repo}/{source} into {destination}");
        let path = format!(
            "{}/refs/{}/merge/{}",
            Self::repo_path(repo),
            segment(source),
            segment(destination)
        );
        let body = Body::Json(json!({"message": message, "metadata": metadata}));
        let (_, bytes) = self
            .send(&op, Method::POST, &path, &[], Some(body), timeout)
            .await
            .map_err(|e| match e {
                // For a merge, 409 means the branches changed the same paths.
                LakefsError::Status {
                    op, status: 409, ..
                } => LakefsError::Conflict { op },
                other => other,
            })?;
        let answer: Value = Self::decode(&op, &bytes)?;
        let reference = answer["reference"]
            .as_str()
            .ok_or_else(|| LakefsError::Decode {
                op: op.clone(),
                message: "no reference in the merge result".into(),
            })?;
        commit_id(&op, reference.to_owned())
    }

    /// The newest commits of `reference`, newest first.
    pub async fn log(
        &self,
        repo: &str,
        reference: &str,
        amount: u32,
    ) -> Result<Vec<Commit>, LakefsError> {
        let op = format!("log {repo}@{reference}");
        let path = format!(
            "{}/refs/{}/commits",
            Self::repo_path(repo),
            segment(reference)
        );
        let amount = amount.min(MAX_PAGE).to_string();
        let bytes = self
            .read(&op, Method::GET, &path, &[("amount", amount.as_str())])
            .await?;
        Ok(Self::decode::<Page<Commit>>(&op, &bytes)?.results)
    }

    /// One page of the log of `reference`, newest first: at most `amount` commits after commit
    /// `after` (empty: from the head), following first parents only when `first_parent`. The
    /// page is checked by [`check_log_page`] before anything in it is used.
    pub async fn log_page(
        &self,
        repo: &str,
        reference: &str,
        after: &str,
        amount: u32,
        first_parent: bool,
    ) -> Result<LogPage, LakefsError> {
        let op = format!("log {repo}@{reference}");
        let path = format!(
            "{}/refs/{}/commits",
            Self::repo_path(repo),
            segment(reference)
        );
        let amount = amount.clamp(1, MAX_PAGE);
        let amount_text = amount.to_string();
        let mut query = vec![("amount", amount_text.as_str())];
        if !after.is_empty() {
            query.push(("after", after));
        }
        if first_parent {
            query.push(("first_parent", "true"));
        }
        let bytes = self.read(&op, Method::GET, &path, &query).await?;
        let page: Page<Commit> = Self::decode(&op, &bytes)?;
        drop(bytes);
        check_log_page(&op, after, amount, page)
    }

    /// The patterns of `repo`'s branch protection rules (at most [`MAX_PROTECTION_RULES`]).
    pub async fn branch_protection_rules(&self, repo: &str) -> Result<Vec<String>, LakefsError> {
        #[derive(Deserialize)]
        struct Rule {
            pattern: String,
        }
        let op = format!("read branch protection rules of {repo}");
        let path = format!("{}/settings/branch_protection", Self::repo_path(repo));
        let bytes = self.read(&op, Method::GET, &path, &[]).await?;
        let rules: Vec<Rule> = Self::decode(&op, &bytes)?;
        if rules.len() > MAX_PROTECTION_RULES {
            return Err(LakefsError::TooMany {
                op,
                max: MAX_PROTECTION_RULES,
            });
        }
        Ok(rules.into_iter().map(|r| r.pattern).collect())
    }

    /// Sets `repo`'s branch protection rules to `patterns` (for tests).
    pub async fn set_branch_protection_rules(
        &self,
        repo: &str,
        patterns: &[&str],
    ) -> Result<(), LakefsError> {
        let op = format!("set branch protection rules of {repo}");
        let path = format!("{}/settings/branch_protection", Self::repo_path(repo));
        let rules: Vec<Value> = patterns.iter().map(|p| json!({"pattern": p})).collect();
        self.send(
            &op,
            Method::PUT,
            &path,
            &[],
            Some(Body::Json(Value::Array(rules))),
            REQUEST_TIMEOUT,
        )
        .await
        .map(drop)
    }

    /// Creates tag `tag` at `reference` (for tests); returns the commit it names.
    pub async fn create_tag(
        &self,
        repo: &str,
        tag: &str,
        reference: &str,
    ) -> Result<String, LakefsError> {
        let op = format!("create tag {repo}/{tag}");
        let path = format!("{}/tags", Self::repo_path(repo));
        let body = Body::Json(json!({"id": tag, "ref": reference}));
        let (_, bytes) = self
            .send(&op, Method::POST, &path, &[], Some(body), REQUEST_TIMEOUT)
            .await?;
        commit_id(&op, Self::decode::<Ref>(&op, &bytes)?.commit_id)
    }

    /// Creates a repository (for `dev` and tests); an existing one is left as it is.
    pub async fn ensure_repository(
        &self,
        repo: &str,
        storage_namespace: &str,
        default_branch: &str,
    ) -> Result<(), LakefsError> {
        let op = format!("create repository {repo}");
        let body = Body::Json(json!({
            "name": repo, "storage_namespace": storage_namespace, "default_branch": default_branch,
        }));
        match self
            .send(
                &op,
                Method::POST,
                "/repositories",
                &[],
                Some(body),
                REQUEST_TIMEOUT,
            )
            .await
        {
            Err(LakefsError::Status { status: 409, .. }) => Ok(()),
            other => other.map(drop),
        }
    }

    /// `(type, path)` of every difference between two commits (`added`, `removed`, `changed`).
    pub async fn diff(
        &self,
        repo: &str,
        left: &str,
        right: &str,
    ) -> Result<Vec<(String, String)>, LakefsError> {
        #[derive(Deserialize)]
        struct Entry {
            #[serde(rename = "type")]
            kind: String,
            path: String,
        }
        let op = format!("diff {repo} {left}..{right}");
        let path = format!(
            "{}/refs/{}/diff/{}",
            Self::repo_path(repo),
            segment(left),
            segment(right)
        );
        let entries: Vec<Entry> = self
            .list_pages(
                &op,
                &path,
                &[("type", "two_dot")],
                MAX_LISTED,
                |e: &Entry| &e.path,
                |_| Ok(()),
            )
            .await?;
        Ok(entries.into_iter().map(|e| (e.kind, e.path)).collect())
    }

    /// Every branch name of `repo`.
    pub async fn list_branches(&self, repo: &str) -> Result<Vec<String>, LakefsError> {
        #[derive(Deserialize)]
        struct Named {
            id: String,
        }
        let op = format!("list branches of {repo}");
        let path = format!("{}/branches", Self::repo_path(repo));
        let branches: Vec<Named> = self
            .list_pages(&op, &path, &[], MAX_LISTED, |b: &Named| &b.id, |_| Ok(()))
            .await?;
        Ok(branches.into_iter().map(|b| b.id).collect())
    }

    /// Every entry of the paginated listing at `path` (with `query` besides `after` and
    /// `amount`), each checked by `check` as its page arrives; each page must continue the
    /// listing ([`next_page`], by the entries' `key`), and more than `max` entries is
    /// [`LakefsError::TooMany`].
    async fn list_pages<T: serde::de::DeserializeOwned>(
        &self,
        op: &str,
        path: &str,
        query: &[(&str, &str)],
        max: usize,
        key: impl Fn(&T) -> &str,
        check: impl Fn(&T) -> Result<(), LakefsError>,
    ) -> Result<Vec<T>, LakefsError> {
        let amount = MAX_PAGE.to_string();
        let mut after = String::new();
        let mut out = Vec::new();
        loop {
            let mut page_query = query.to_vec();
            page_query.extend([("after", after.as_str()), ("amount", amount.as_str())]);
            let bytes = self.read(op, Method::GET, path, &page_query).await?;
            let page: Page<T> = Self::decode(op, &bytes)?;
            drop(bytes);
            page.results.iter().try_for_each(&check)?;
            let next = next_page(op, &after, page.results.iter().map(&key), &page.pagination)?;
            if out.len() + page.results.len() > max {
                return Err(LakefsError::TooMany {
                    op: op.to_owned(),
                    max,
                });
            }
            out.extend(page.results);
            match next {
                Some(next) => after = next,
                None => return Ok(out),
            }
        }
    }

    /// Deletes `branch`; a branch that is already gone is not an error.
    pub async fn delete_branch(&self, repo: &str, branch: &str) -> Result<(), LakefsError> {
        let op = format!("delete branch {repo}/{branch}");
        let path = format!("{}/branches/{}", Self::repo_path(repo), segment(branch));
        match self.read(&op, Method::DELETE, &path, &[]).await {
            Err(e) if e.is_not_found() => Ok(()),
            other => other.map(drop),
        }
    }
}

/// One checked page of a branch log.
#[derive(Debug, Clone)]
pub struct LogPage {
    /// The commits, newest first; every id is a commit id.
    pub commits: Vec<Commit>,
    /// The `after` of the next page (the last commit's id), `None` on the last page.
    pub next: Option<String>,
}

/// A log page as lakeFS sends it (`LogCommits` in its controller): at most `amount` commits, each
/// with a commit id, none of them `after` itself, and, when `has_more`, results whose last id is
/// the `next_offset`. Anything else could loop or skip, and is refused.
pub fn check_log_page(
    op: &str,
    after: &str,
    amount: u32,
    page: Page<Commit>,
) -> Result<LogPage, LakefsError> {
    let refuse = |message: String| {
        Err(LakefsError::Pagination {
            op: op.to_owned(),
            message,
        })
    };
    if page.results.len() > amount as usize {
        return refuse(format!(
            "{} commits in a page of at most {amount}",
            page.results.len()
        ));
    }
    for commit in &page.results {
        commit_id(op, commit.id.clone())?;
        if commit.id == after {
            return refuse(format!("commit {after} listed again after itself"));
        }
    }
    if !page.pagination.has_more {
        return Ok(LogPage {
            commits: page.results,
            next: None,
        });
    }
    match page.results.last() {
        None => refuse("a page with has_more but no commits".to_owned()),
        Some(last) if last.id != page.pagination.next_offset => refuse(format!(
            "next_offset {:?} is not the last commit listed, {}",
            page.pagination
                .next_offset
                .chars()
                .take(80)
                .collect::<String>(),
            last.id
        )),
        Some(last) => {
            let next = Some(last.id.clone());
            Ok(LogPage {
                commits: page.results,
                next,
            })
        }
    }
}

/// Whether `reference` is a lakeFS branch id (`^\w[-\w]*$`, ASCII `\w` as Go's regexp has
/// it), the only refs lakeFS's branch routes take.
pub fn is_branch_id(reference: &str) -> bool {
    perago_core::shape::is_lakefs_branch_id(reference)
}

/// Whether `id` is a lakeFS commit id: 64 lowercase hex characters (a SHA-256).
pub fn is_commit_id(id: &str) -> bool {
    id.len() == 64 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// `id`, if it is a commit id.
fn commit_id(op: &str, id: String) -> Result<String, LakefsError> {
    if is_commit_id(&id) {
        return Ok(id);
    }
    let shown: String = id.chars().take(80).collect();
    Err(LakefsError::Decode {
        op: op.to_owned(),
        message: format!("{shown:?} is not a commit id (64 lowercase hex characters)"),
    })
}

/// The whole body of `resp`, refused past `limit` bytes (announced or received) without
/// reading further.
async fn read_capped(
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

/// A listed object whose key, checksum or size cannot be right.
fn check_object(op: &str, object: &ObjectStats) -> Result<(), LakefsError> {
    let bad = |message: String| {
        Err(LakefsError::Decode {
            op: op.to_owned(),
            message,
        })
    };
    if object.checksum.len() > MAX_CHECKSUM_BYTES {
        return bad(format!(
            "object {:?} has a checksum of {} bytes; at most {MAX_CHECKSUM_BYTES} are kept",
            object.path,
            object.checksum.len()
        ));
    }
    if object.path_type == "object" && object.size_bytes.is_none() {
        return bad(format!(
            "object {:?} is listed without size_bytes",
            object.path
        ));
    }
    Ok(())
}

/// Checks one page of a listing and returns where the next one starts (`None`: this was the
/// last). lakeFS lists keys in byte order strictly after `after`, and a page that says
/// `has_more` has results and gives the last one's key as `next_offset`
/// (`paginationFor` in its controller): anything else could loop or skip, and is refused.
fn next_page<'a>(
    op: &str,
    after: &str,
    keys: impl IntoIterator<Item = &'a str>,
    pagination: &Pagination,
) -> Result<Option<String>, LakefsError> {
    let refuse = |message: String| {
        Err(LakefsError::Pagination {
            op: op.to_owned(),
            message,
        })
    };
    let short = |key: &str| key.chars().take(80).collect::<String>();
    let mut last: Option<&str> = None;
    for key in keys {
        if key.len() > MAX_KEY_BYTES {
            return refuse(format!(
                "a key of {} bytes (lakeFS keys are at most {MAX_KEY_BYTES})",
                key.len()
            ));
        }
        if key <= last.unwrap_or(after) {
            return refuse(format!(
                "key {:?} does not come after {:?}",
                short(key),
                short(last.unwrap_or(after))
            ));
        }
        last = Some(key);
    }
    if !pagination.has_more {
        return Ok(None);
    }
    let next = pagination.next_offset.as_str();
    let Some(last) = last else {
        return refuse("a page with has_more but no results".to_owned());
    };
    if next.len() > MAX_KEY_BYTES {
        return refuse(format!("a next_offset of {} bytes", next.len()));
    }
    if next <= after {
        return refuse(format!(
            "next_offset {:?} does not advance past {:?}",
            short(next),
            short(after)
        ));
    }
    if next < last {
        return refuse(format!(
            "next_offset {:?} is before the last key returned, {:?}",
            short(next),
            short(last)
        ));
    }
    Ok(Some(next.to_owned()))
}

enum Body {
    Json(Value),
    Raw(Vec<u8>),
    /// A streamed body and its length.
    Stream(reqwest::Body, u64),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_page(ids: &[&str], has_more: bool, next: &str) -> Page<Commit> {
        serde_json::from_value(json!({
            "pagination": {"has_more": has_more, "next_offset": next},
            "results": ids.iter().map(|id| json!({"id": id, "parents": []})).collect::<Vec<_>>(),
        }))
        .unwrap()
    }

    #[test]
    fn a_log_page_must_continue_the_log() {
        let (a, b, c) = ("a".repeat(64), "b".repeat(64), "c".repeat(64));
        let page = check_log_page("log", "", 2, log_page(&[&b, &a], true, &a)).unwrap();
        assert_eq!(page.next.as_deref(), Some(a.as_str()));
        assert_eq!(page.commits.len(), 2);
        let last = check_log_page("log", &a, 2, log_page(&[&c], false, "")).unwrap();
        assert!(last.next.is_none());
        let refused = |page, after: &str, amount| {
            check_log_page("log", after, amount, page)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            refused(log_page(&[&b, &a, &c], false, ""), "", 2),
            "lakeFS log: bad pagination: 3 commits in a page of at most 2; refused"
        );
        assert_eq!(
            refused(log_page(&[&b, &a], true, &b), "", 2),
            format!(
                "lakeFS log: bad pagination: next_offset \"{b}\" is not the last commit listed, {a}; refused"
            )
        );
        assert_eq!(
            refused(log_page(&[], true, &a), "", 2),
            "lakeFS log: bad pagination: a page with has_more but no commits; refused"
        );
        assert_eq!(
            refused(log_page(&[&a], false, ""), &a, 2),
            format!("lakeFS log: bad pagination: commit {a} listed again after itself; refused")
        );
        assert!(refused(log_page(&["HEAD"], false, ""), "", 2).contains("is not a commit id"));
    }

    #[test]
    fn bad_settings_are_named_by_their_variant() {
        let missing = LakefsConfig::from_lookup(|name| {
            (name == perago_core::env::LAKEFS_ACCESS_KEY_ID).then(|| "k".to_owned())
        })
        .unwrap_err();
        assert!(matches!(
            missing,
            LakefsConfigError::Missing { ref missing }
                if *missing == [perago_core::env::LAKEFS_ENDPOINT, perago_core::env::LAKEFS_SECRET_ACCESS_KEY]
        ));
        assert_eq!(
            missing.to_string(),
            "LakeFS config is required for workspace tasks: missing LAKEFS_ENDPOINT, LAKEFS_SECRET_ACCESS_KEY"
        );
        let endpoint = LakefsClient::new(&LakefsConfig {
            endpoint: "lakefs:8000".to_owned(),
            access_key_id: "k".to_owned(),
            secret_access_key: "s".to_owned(),
        })
        .unwrap_err();
        assert!(
            matches!(endpoint, LakefsConfigError::Endpoint { ref endpoint } if endpoint == "lakefs:8000")
        );
        assert_eq!(
            endpoint.to_string(),
            "LAKEFS_ENDPOINT \"lakefs:8000\" is invalid: expected an http:// or https:// URL"
        );
    }
}
