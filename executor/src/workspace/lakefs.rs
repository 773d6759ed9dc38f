//! A lakeFS REST client for exactly what the workspace runtime needs: pin a branch, list and
//! read objects at a commit, cut a staging branch, upload, delete, commit, merge, clean up.
//! Every request has a timeout; idempotent reads are retried on transport errors, 5xx and 429.
//! The secret key never appears in `Debug` output or in error messages.

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
    /// Hex MD5 of the content.
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

#[derive(Debug, Deserialize)]
struct Pagination {
    has_more: bool,
    next_offset: String,
}

#[derive(Debug, Deserialize)]
struct Page<T> {
    pagination: Pagination,
    results: Vec<T>,
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
        let resp = self.respond(op, method, path, query, body, timeout).await?;
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .map_err(|source| LakefsError::Transport {
                op: op.to_owned(),
                source,
            })?;
        Ok((status, bytes.to_vec()))
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
            Some(Body::File(file, size)) => {
                // Streamed from disk in small chunks; the length is announced so that the
                // server never sees a chunked upload.
                req = req
                    .header("Content-Type", "application/octet-stream")
                    .header("Content-Length", size)
                    .body(reqwest::Body::wrap_stream(
                        tokio_util::io::ReaderStream::with_capacity(file, UPLOAD_CHUNK),
                    ))
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
        let bytes = resp.bytes().await.map_err(transport)?.to_vec();
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
        let mut attempt = 0;
        loop {
            match self
                .send(op, method.clone(), path, query, None, REQUEST_TIMEOUT)
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

    /// The commit a ref (branch, commit id) points at now.
    pub async fn resolve_commit(&self, repo: &str, reference: &str) -> Result<String, LakefsError> {
        let op = format!("resolve {repo}@{reference}");
        let branch = format!("{}/branches/{}", Self::repo_path(repo), segment(reference));
        match self.read(&op, Method::GET, &branch, &[]).await {
            Ok(bytes) => Ok(Self::decode::<Ref>(&op, &bytes)?.commit_id),
            Err(e) if e.is_not_found() => {
                let commit = format!("{}/commits/{}", Self::repo_path(repo), segment(reference));
                let bytes = self.read(&op, Method::GET, &commit, &[]).await?;
                Ok(Self::decode::<Commit>(&op, &bytes)?.id)
            }
            Err(e) => Err(e),
        }
    }

    /// Every object under `prefix` at `reference`, following pagination.
    pub async fn list_objects(
        &self,
        repo: &str,
        reference: &str,
        prefix: &str,
    ) -> Result<Vec<ObjectStats>, LakefsError> {
        let op = format!("list {repo}@{reference}/{prefix}");
        let path = format!(
            "{}/refs/{}/objects/ls",
            Self::repo_path(repo),
            segment(reference)
        );
        let amount = MAX_PAGE.to_string();
        let mut after = String::new();
        let mut out = Vec::new();
        loop {
            let query = [
                ("prefix", prefix),
                ("after", after.as_str()),
                ("amount", amount.as_str()),
                ("user_metadata", "false"),
            ];
            let bytes = self.read(&op, Method::GET, &path, &query).await?;
            let page: Page<ObjectStats> = Self::decode(&op, &bytes)?;
            out.extend(page.results.into_iter().filter(|o| o.path_type == "object"));
            if !page.pagination.has_more || page.pagination.next_offset.is_empty() {
                return Ok(out);
            }
            after = page.pagination.next_offset;
        }
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
        self.read(&op, Method::GET, &path, &[("path", key)]).await
    }

    /// Streams one object into `file` (created or truncated), never holding more than one
    /// response chunk in memory; transport errors, 5xx and 429 are retried from the start.
    pub async fn get_object_to_file(
        &self,
        repo: &str,
        reference: &str,
        key: &str,
        file: &Path,
    ) -> Result<(), LakefsError> {
        let op = format!("get {repo}@{reference}/{key}");
        let path = format!(
            "{}/refs/{}/objects",
            Self::repo_path(repo),
            segment(reference)
        );
        let mut attempt = 0;
        loop {
            match self.stream_to_file(&op, &path, key, file).await {
                Ok(()) => return Ok(()),
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
    ) -> Result<(), LakefsError> {
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
        let mut out = tokio::fs::File::create(file).await.map_err(local)?;
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|source| LakefsError::Transport {
                op: op.to_owned(),
                source,
            })?
        {
            out.write_all(&chunk).await.map_err(local)?;
        }
        out.flush().await.map_err(local)
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

    /// Uploads the content of `file` to `key` on `branch`, streamed from disk.
    pub async fn upload_file(
        &self,
        repo: &str,
        branch: &str,
        key: &str,
        file: &Path,
    ) -> Result<(), LakefsError> {
        let op = format!("upload {repo}/{branch}/{key}");
        let path = format!(
            "{}/branches/{}/objects",
            Self::repo_path(repo),
            segment(branch)
        );
        let local = |source| LakefsError::Local {
            op: op.clone(),
            file: file.to_owned(),
            source,
        };
        let content = tokio::fs::File::open(file).await.map_err(local)?;
        let size = content.metadata().await.map_err(local)?.len();
        self.send(
            &op,
            Method::POST,
            &path,
            &[("path", key)],
            Some(Body::File(content, size)),
            TRANSFER_TIMEOUT,
        )
        .await
        .map(drop)
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
        Self::decode(&op, &bytes)
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
        answer["reference"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| LakefsError::Decode {
                op,
                message: "no reference in the merge result".into(),
            })
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
        let amount = MAX_PAGE.to_string();
        let mut after = String::new();
        let mut out = Vec::new();
        loop {
            let query = [
                ("after", after.as_str()),
                ("amount", amount.as_str()),
                ("type", "two_dot"),
            ];
            let bytes = self.read(&op, Method::GET, &path, &query).await?;
            let page: Page<Entry> = Self::decode(&op, &bytes)?;
            out.extend(page.results.into_iter().map(|e| (e.kind, e.path)));
            if !page.pagination.has_more || page.pagination.next_offset.is_empty() {
                return Ok(out);
            }
            after = page.pagination.next_offset;
        }
    }

    /// Every branch name of `repo`.
    pub async fn list_branches(&self, repo: &str) -> Result<Vec<String>, LakefsError> {
        #[derive(Deserialize)]
        struct Named {
            id: String,
        }
        let op = format!("list branches of {repo}");
        let path = format!("{}/branches", Self::repo_path(repo));
        let amount = MAX_PAGE.to_string();
        let mut after = String::new();
        let mut out = Vec::new();
        loop {
            let query = [("after", after.as_str()), ("amount", amount.as_str())];
            let bytes = self.read(&op, Method::GET, &path, &query).await?;
            let page: Page<Named> = Self::decode(&op, &bytes)?;
            out.extend(page.results.into_iter().map(|b| b.id));
            if !page.pagination.has_more || page.pagination.next_offset.is_empty() {
                return Ok(out);
            }
            after = page.pagination.next_offset;
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

enum Body {
    Json(Value),
    Raw(Vec<u8>),
    /// A file and its length.
    File(tokio::fs::File, u64),
}

#[cfg(test)]
mod tests {
    use super::*;

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
