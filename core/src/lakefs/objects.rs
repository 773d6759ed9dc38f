//! Objects: listing, download (to memory or a file), upload, delete, diff.

use super::{
    LakefsClient, LakefsError, MAX_CHECKSUM_BYTES, MAX_LISTED, MAX_OBJECT_IN_MEMORY, MAX_PAGE,
    ObjectStats,
    client::{Body, READ_ATTEMPTS, REQUEST_TIMEOUT, TRANSFER_TIMEOUT, UPLOAD_CHUNK},
};
use crate::url::encode_segment as segment;
use reqwest::Method;
use serde::Deserialize;
use serde_json::{Value, json};
use std::path::Path;

/// A local file to upload, read again from what it was checked from: [`LakefsClient::upload_file`]
/// sends exactly what [`read_checked`](Self::read_checked) hands it, and fails if that fails.
pub trait CheckedUpload: Clone + Send + 'static {
    /// The lakeFS key.
    fn key(&self) -> &str;
    /// The local path, for messages.
    fn path(&self) -> &Path;
    /// The size announced and sent.
    fn size(&self) -> u64;
    /// Reads the content in pieces of `chunk` bytes handed to `send` (which says whether to go
    /// on); an error if the content is not what was checked.
    fn read_checked(&self, chunk: usize, send: impl FnMut(Vec<u8>) -> bool) -> std::io::Result<()>;
}

impl LakefsClient {
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
                    tracing::debug!(error = %crate::errors::DisplayChain(&e), attempt, "retrying a lakeFS download");
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
        upload: &impl CheckedUpload,
    ) -> Result<(), LakefsError> {
        let key = upload.key();
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
                let _ = pieces
                    .blocking_send(Err(std::io::Error::new(e.kind(), crate::errors::chain(&e))));
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
                Some(Body::Stream(body, upload.size())),
                TRANSFER_TIMEOUT,
            )
            .await;
        let local = |source| LakefsError::Local {
            op: op.clone(),
            file: upload.path().to_owned(),
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
