//! One workspace attempt (SPEC §6): download the input prefix at a pinned commit into
//! `<root>/attempts/<execution_id>/work`, let the body change it, then — behind the attempt
//! fence — stage the change on `perago-staging-<execution_id>` cut from that same commit, commit
//! it with the attempt's metadata, fence again, and merge it into the branch. The staging
//! branch and the attempt directory are removed on every path.

use super::{
    lakefs::{LakefsClient, LakefsError},
    paths::key_to_relative,
    scan::{Changes, scan},
};
use perago_core::{
    attempt::{AttemptSnapshot, FenceError},
    manifest::WorkspaceSpec,
    shape::WorkspaceInput,
};
use serde_json::{Map, Value, json};
use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};
use tokio::{sync::Semaphore, task::JoinSet};

/// Transfers in flight at once, per attempt.
const TRANSFER_CONCURRENCY: usize = 8;
/// How long the fence keeps trying when the broker cannot read the task.
const FENCE_PATIENCE: Duration = Duration::from_secs(10);

/// A fresh read of the attempt through the broker.
#[derive(Debug)]
pub enum FenceRead {
    /// Conductor's current view of the task.
    Fresh(Box<AttemptSnapshot>),
    /// Conductor no longer knows the task.
    Gone,
    /// The read failed; it may work if tried again.
    Unavailable(String),
}

/// Reads the attempt back (the broker's `ReloadAttempt`).
pub trait Fence: Send + Sync {
    /// One read.
    fn reload(&self) -> std::pin::Pin<Box<dyn Future<Output = FenceRead> + Send + '_>>;
}

/// Who owns an attempt directory, for the supervisor's GC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    /// The slot.
    pub slot: u32,
    /// Its generation.
    pub generation: u64,
}

/// The name of the owner file in an attempt directory.
pub const OWNER_FILE: &str = ".perago-owner";

/// What a failed workspace step means for the result.
#[derive(Debug)]
pub enum WorkspaceFailure {
    /// FAILED with this reason.
    Failed(String),
}

fn failed(message: impl Into<String>) -> WorkspaceFailure {
    WorkspaceFailure::Failed(message.into())
}

/// A prepared attempt: files downloaded, ready for the body.
#[derive(Debug)]
pub struct Attempt {
    client: LakefsClient,
    input: WorkspaceInput,
    dir: PathBuf,
    work: PathBuf,
    /// The commit the files were read from.
    source_commit: String,
    /// key → MD5 as downloaded.
    downloaded: BTreeMap<String, String>,
    staging: Option<String>,
}

/// Seconds since the epoch.
fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Attempt {
    /// Creates the attempt directory with its owner file and downloads the input prefix at
    /// the commit the input ref points to now.
    pub async fn prepare(
        client: LakefsClient,
        root: &Path,
        execution_id: &str,
        owner: Owner,
        input: WorkspaceInput,
    ) -> Result<Self, WorkspaceFailure> {
        let dir = root.join("attempts").join(execution_id);
        let work = dir.join("work");
        fs::create_dir_all(&work).map_err(|e| {
            failed(format!(
                "cannot create the attempt directory {}: {e}",
                dir.display()
            ))
        })?;
        let owner_json = json!({
            "slot": owner.slot, "generation": owner.generation, "pid": std::process::id(),
            "execution_id": execution_id, "created": now_secs(),
        });
        fs::write(dir.join(OWNER_FILE), owner_json.to_string()).map_err(|e| {
            failed(format!(
                "cannot write the owner file in {}: {e}",
                dir.display()
            ))
        })?;
        let mut attempt = Self {
            client,
            input,
            dir,
            work,
            source_commit: String::new(),
            downloaded: BTreeMap::new(),
            staging: None,
        };
        if let Err(e) = attempt.download().await {
            // Nothing ran yet: the attempt leaves nothing behind.
            attempt.cleanup().await;
            return Err(e);
        }
        Ok(attempt)
    }

    /// The folder the body works in (`PERAGO_WORKSPACE_DIR`).
    pub fn work_dir(&self) -> &Path {
        &self.work
    }

    async fn download(&mut self) -> Result<(), WorkspaceFailure> {
        let WorkspaceInput {
            repository,
            branch,
            prefix,
            source_ref,
        } = &self.input;
        let reference = source_ref.as_deref().unwrap_or(branch);
        let commit = self
            .client
            .resolve_commit(repository, reference)
            .await
            .map_err(|e| failed(format!("workspace download failed: {e}")))?;
        let objects = self
            .client
            .list_objects(repository, &commit, prefix)
            .await
            .map_err(|e| failed(format!("workspace download failed: {e}")))?;
        // Every key is checked before anything is written.
        let mut plan = Vec::with_capacity(objects.len());
        for object in objects {
            let relative =
                key_to_relative(prefix, &object.path).map_err(|e| failed(e.to_string()))?;
            plan.push((object.path, object.checksum, self.work.join(relative)));
        }
        let limit = Arc::new(Semaphore::new(TRANSFER_CONCURRENCY));
        let mut transfers = JoinSet::new();
        for (key, _, target) in &plan {
            let (client, repo, commit) = (self.client.clone(), repository.clone(), commit.clone());
            let (key, target, limit) = (key.clone(), target.clone(), Arc::clone(&limit));
            transfers.spawn(async move {
                let _permit = limit.acquire_owned().await.expect("never closed");
                let bytes = client
                    .get_object(&repo, &commit, &key)
                    .await
                    .map_err(|e| format!("workspace download failed: {e}"))?;
                if let Some(parent) = target.parent() {
                    fs::create_dir_all(parent)
                        .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
                }
                fs::write(&target, bytes)
                    .map_err(|e| format!("cannot write {}: {e}", target.display()))
            });
        }
        while let Some(done) = transfers.join_next().await {
            done.map_err(|e| failed(format!("a download task failed: {e}")))?
                .map_err(failed)?;
        }
        self.downloaded = plan.into_iter().map(|(k, sum, _)| (k, sum)).collect();
        tracing::info!(repository = %repository, commit = %commit, prefix = %prefix, files = self.downloaded.len(), "workspace downloaded");
        self.source_commit = commit;
        Ok(())
    }

    /// The change the body made.
    pub fn changes(&self) -> Result<Changes, WorkspaceFailure> {
        scan(&self.work, &self.input.prefix, &self.downloaded).map_err(|e| failed(e.to_string()))
    }

    /// Stages and publishes `changes`; returns the `workspace` output object.
    pub async fn publish(
        &mut self,
        changes: &Changes,
        spec: &WorkspaceSpec,
        fence: &dyn Fence,
        polled: &AttemptSnapshot,
        execution_id: &str,
        metadata: Map<String, Value>,
    ) -> Result<Value, WorkspaceFailure> {
        if let Some(budget) = spec.publish_budget {
            if let Some(max) = budget.max_objects
                && changes.objects() > max
            {
                return Err(failed(format!(
                    "publish budget exceeded: {} objects changed, max_objects is {max}; nothing was published",
                    changes.objects()
                )));
            }
            if let Some(max) = budget.max_bytes
                && changes.upload_bytes() > max
            {
                return Err(failed(format!(
                    "publish budget exceeded: {} bytes to upload, max_bytes is {max}; nothing was published",
                    changes.upload_bytes()
                )));
            }
        }
        let counts = |commit: &str| {
            json!({
                "repository": self.input.repository, "branch": self.input.branch,
                "prefix": self.input.prefix, "source_commit_id": self.source_commit,
                "commit_id": commit, "added": changes.added.len(),
                "changed": changes.changed.len(), "removed": changes.removed.len(),
            })
        };
        if changes.is_empty() {
            tracing::info!("the body changed nothing; nothing to publish");
            return Ok(counts(&self.source_commit.clone()));
        }
        check_fence(fence, polled, "before staging").await?;

        let repo = self.input.repository.clone();
        let staging = format!("perago-staging-{execution_id}");
        self.client
            .create_branch(&repo, &staging, &self.source_commit)
            .await
            .map_err(|e| failed(format!("staging failed: {e}")))?;
        self.staging = Some(staging.clone());
        self.upload(&repo, &staging, changes).await?;
        if !changes.removed.is_empty() {
            self.client
                .delete_objects(&repo, &staging, &changes.removed)
                .await
                .map_err(|e| failed(format!("staging failed: {e}")))?;
        }
        let message = format!(
            "perago: {} of workflow {} (retry {})",
            polled.task_id, polled.workflow_instance_id, polled.retry_count
        );
        let staged = self
            .client
            .commit(&repo, &staging, &message, &metadata)
            .await
            .map_err(|e| failed(format!("staging commit failed: {e}")))?;

        check_fence(fence, polled, "before publishing").await?;
        let timeout = Duration::from_secs(spec.merge_timeout_seconds);
        let merged = match self
            .client
            .merge(
                &repo,
                &staging,
                &self.input.branch,
                &message,
                &metadata,
                timeout,
            )
            .await
        {
            Ok(commit) => commit,
            Err(LakefsError::Conflict { .. }) => {
                return Err(failed(format!(
                    "publish failed: merge conflict: {} changed paths this attempt also changed since it read commit {}; nothing was published",
                    self.input.branch, self.source_commit
                )));
            }
            Err(e) if e.is_retryable() => {
                // A merge that timed out or answered 5xx may still have been applied.
                match self.find_merge(&repo, &staged.id).await {
                    Some(commit) => {
                        tracing::warn!(error = %e, commit = %commit, "the merge answered with an error but was applied");
                        commit
                    }
                    None => return Err(failed(format!("publish failed: {e}"))),
                }
            }
            Err(e) => return Err(failed(format!("publish failed: {e}"))),
        };
        tracing::info!(repository = %repo, branch = %self.input.branch, commit = %merged, "workspace published");
        Ok(counts(&merged))
    }

    async fn upload(
        &self,
        repo: &str,
        staging: &str,
        changes: &Changes,
    ) -> Result<(), WorkspaceFailure> {
        let limit = Arc::new(Semaphore::new(TRANSFER_CONCURRENCY));
        let mut transfers = JoinSet::new();
        for upload in changes.added.iter().chain(&changes.changed) {
            let (client, repo, staging) =
                (self.client.clone(), repo.to_owned(), staging.to_owned());
            let (upload, limit) = (upload.clone(), Arc::clone(&limit));
            transfers.spawn(async move {
                let _permit = limit.acquire_owned().await.expect("never closed");
                let bytes = fs::read(&upload.file)
                    .map_err(|e| format!("cannot read {}: {e}", upload.file.display()))?;
                client
                    .upload(&repo, &staging, &upload.key, bytes)
                    .await
                    .map_err(|e| format!("staging failed: {e}"))
            });
        }
        while let Some(done) = transfers.join_next().await {
            done.map_err(|e| failed(format!("an upload task failed: {e}")))?
                .map_err(failed)?;
        }
        Ok(())
    }

    /// The target branch's commit that merged `staged`, if any of its newest commits did.
    async fn find_merge(&self, repo: &str, staged: &str) -> Option<String> {
        let log = self.client.log(repo, &self.input.branch, 100).await.ok()?;
        log.into_iter()
            .find(|c| c.parents.iter().any(|p| p == staged))
            .map(|c| c.id)
    }

    /// Deletes the staging branch and the attempt directory. Best effort: failures are
    /// logged and never change the reported status.
    pub async fn cleanup(self) {
        if let Some(staging) = &self.staging
            && let Err(e) = self
                .client
                .delete_branch(&self.input.repository, staging)
                .await
        {
            tracing::warn!(error = %e, branch = %staging, "cannot delete the staging branch");
        }
        if let Err(e) = fs::remove_dir_all(&self.dir) {
            tracing::warn!(error = %e, dir = %self.dir.display(), "cannot remove the attempt directory");
        }
    }
}

/// The attempt fence: a positive fresh read, or FAILED. Read errors are retried for a few
/// seconds, then fail closed.
pub async fn check_fence(
    fence: &dyn Fence,
    polled: &AttemptSnapshot,
    when: &str,
) -> Result<(), WorkspaceFailure> {
    let deadline = tokio::time::Instant::now() + FENCE_PATIENCE;
    let mut wait = Duration::from_millis(100);
    loop {
        match fence.reload().await {
            FenceRead::Fresh(fresh) => {
                return polled.fence(&fresh).map_err(|e: FenceError| {
                    failed(format!("{e} ({when}); nothing was published"))
                });
            }
            FenceRead::Gone => {
                return Err(failed(format!(
                    "stale attempt: Conductor no longer knows task {} ({when}); nothing was published",
                    polled.task_id
                )));
            }
            FenceRead::Unavailable(cause) if tokio::time::Instant::now() >= deadline => {
                return Err(failed(format!("attempt fence unavailable: {cause}")));
            }
            FenceRead::Unavailable(cause) => {
                tracing::warn!(cause = %cause, "attempt fence read failed; retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(2));
            }
        }
    }
}
