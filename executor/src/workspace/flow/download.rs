//! The download: list the input prefix at the pinned commit, lay it out, transfer it.

use super::*;
use crate::workspace::paths::key_to_relative;
use perago_core::{lakefs::LakefsError, manifest::DownloadBudget, shape::WorkspaceInput};
use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};
use tokio::{sync::Semaphore, task::JoinSet};

/// Transfers in flight at once, per attempt.
pub(super) const TRANSFER_CONCURRENCY: usize = 8;
/// The most objects an attempt lists and downloads without
/// `[workspace.download_budget] max_objects`.
pub const DEFAULT_MAX_DOWNLOAD_OBJECTS: u64 = 100_000;

/// What one download may take.
#[derive(Debug, Clone, Copy, Default)]
pub struct DownloadLimits {
    /// `[workspace.download_budget]`, if the manifest sets one.
    pub budget: Option<DownloadBudget>,
    /// The time the task has left (`None`: no limit); the listing and the transfers count.
    pub time_left: Option<Duration>,
}

impl Attempt {
    pub(super) async fn download(
        &mut self,
        budget: Option<DownloadBudget>,
    ) -> Result<(), WorkspaceFailure> {
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
            .map_err(WorkspaceFailure::Download)?;
        let budget = budget.unwrap_or_default();
        let (max_objects, why) = match budget.max_objects {
            Some(max) => (max, "max_objects is that"),
            None => (
                DEFAULT_MAX_DOWNLOAD_OBJECTS,
                "the most an attempt downloads without [workspace.download_budget] max_objects",
            ),
        };
        let objects = self
            .client
            .list_objects(
                repository,
                &commit,
                prefix,
                usize::try_from(max_objects).unwrap_or(usize::MAX),
            )
            .await
            .map_err(|e| match e {
                LakefsError::TooMany { .. } => WorkspaceFailure::TooManyDownloadObjects {
                    prefix: prefix.clone(),
                    max: max_objects,
                    why,
                },
                other => WorkspaceFailure::Download(other),
            })?;
        // Every key is checked before anything is written.
        let plan = plan_download(prefix, objects, &self.work)?;
        // Each transfer receives exactly its listed size, so the listing bounds the whole.
        let bytes = plan.iter().fold(0u64, |sum, p| sum.saturating_add(p.size));
        if let Some(max) = budget.max_bytes
            && bytes > max
        {
            return Err(WorkspaceFailure::TooManyDownloadBytes {
                prefix: prefix.clone(),
                bytes,
                max,
            });
        }
        let limit = Arc::new(Semaphore::new(TRANSFER_CONCURRENCY));
        let mut transfers = JoinSet::new();
        for planned in &plan {
            let (client, repo, commit) = (self.client.clone(), repository.clone(), commit.clone());
            let (key, target, size, limit) = (
                planned.key.clone(),
                planned.file.clone(),
                planned.size,
                Arc::clone(&limit),
            );
            transfers.spawn(async move {
                let _permit = limit.acquire_owned().await.expect("never closed");
                if let Some(parent) = target.parent() {
                    fs::create_dir_all(parent).map_err(|source| {
                        WorkspaceFailure::CreateFolder {
                            path: parent.to_owned(),
                            source,
                        }
                    })?;
                }
                client
                    .get_object_to_file(&repo, &commit, &key, &target, size)
                    .await
                    .map(|md5| (key, md5))
                    .map_err(WorkspaceFailure::Download)
            });
        }
        let mut downloaded = BTreeMap::new();
        while let Some(done) = transfers.join_next().await {
            let (key, md5) = done.map_err(|source| WorkspaceFailure::TransferTask {
                transfer: Transfer::Download,
                source,
            })??;
            downloaded.insert(key, md5);
        }
        self.downloaded = downloaded;
        tracing::info!(repository = %repository, commit = %commit, prefix = %prefix, files = self.downloaded.len(), "workspace downloaded");
        self.source_commit = commit;
        Ok(())
    }
}

/// One object to download.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Planned {
    /// The key.
    pub(crate) key: String,
    /// Its size as listed: the transfer must receive exactly this.
    pub(crate) size: u64,
    /// Where it is written.
    pub(crate) file: PathBuf,
}

/// Where each listed object is written. Folder markers (keys ending
/// in `/`, as S3 tools make them) are skipped: they hold no file, and are left alone on publish.
/// A key that is also a folder of another key (`x` and `x/y`) cannot be laid out as files: the
/// error names both. Nothing is written before every key is checked.
pub(crate) fn plan_download(
    prefix: &str,
    objects: Vec<perago_core::lakefs::ObjectStats>,
    work: &Path,
) -> Result<Vec<Planned>, WorkspaceFailure> {
    let mut plan = Vec::with_capacity(objects.len());
    let mut files = BTreeMap::new();
    for object in objects {
        if object.path.ends_with('/') {
            tracing::debug!(key = %object.path, "skipped a folder marker");
            continue;
        }
        let relative = key_to_relative(prefix, &object.path)?;
        files.insert(relative.clone(), object.path.clone());
        plan.push(Planned {
            size: object.size_bytes.unwrap_or(0),
            file: work.join(relative),
            key: object.path,
        });
    }
    for (relative, key) in &files {
        if let Some(folder) = relative.ancestors().skip(1).find_map(|a| files.get(a)) {
            return Err(WorkspaceFailure::KeyIsFolder {
                key: key.clone(),
                folder: folder.clone(),
            });
        }
    }
    Ok(plan)
}
