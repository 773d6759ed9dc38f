//! One attempt, from prepare to cleanup.

use super::publish::check_budget;
use super::*;
use crate::workspace::scan::{Changes, Rules, ScanError, Snapshot};
use perago_core::{lakefs::LakefsClient, manifest::PublishBudget, shape::WorkspaceInput};
use perago_sys::fd::dir::{Dir, fstat};
use std::{
    collections::BTreeMap,
    fs,
    os::fd::AsFd as _,
    path::{Path, PathBuf},
    time::Duration,
};

/// A prepared attempt: files downloaded, ready for the body.
#[derive(Debug)]
pub struct Attempt {
    pub(super) client: LakefsClient,
    pub(super) input: WorkspaceInput,
    pub(super) dir: AttemptDir,
    pub(super) work: PathBuf,
    /// The commit the files were read from.
    pub(super) source_commit: String,
    /// key → hex MD5 of the bytes this executor wrote at download time (never the listed
    /// `checksum`, which is not always a content MD5): what "changed" is decided against.
    /// Held in the executor's memory, out of the body's reach.
    pub(super) downloaded: BTreeMap<String, String>,
    pub(super) staging: Option<String>,
    /// When the task's `timeoutSeconds` ends (`None`: no limit), bounding how long a merge
    /// that did not answer is settled.
    pub(super) task_deadline: Option<tokio::time::Instant>,
}

impl Attempt {
    /// Creates the attempt directory with its owner file and downloads the input prefix at
    /// the commit the input ref points to now, within the default limits.
    pub async fn prepare(
        client: LakefsClient,
        root: &Path,
        execution_id: &str,
        owner: Owner,
        input: WorkspaceInput,
    ) -> Result<Self, WorkspaceFailure> {
        Self::prepare_within(
            client,
            root,
            execution_id,
            owner,
            input,
            DownloadLimits::default(),
        )
        .await
    }

    /// [`prepare`](Self::prepare) within `limits`.
    pub async fn prepare_within(
        client: LakefsClient,
        root: &Path,
        execution_id: &str,
        owner: Owner,
        input: WorkspaceInput,
        limits: DownloadLimits,
    ) -> Result<Self, WorkspaceFailure> {
        let dir = AttemptDir::create(root, execution_id, owner)?;
        let mut attempt = Self {
            client,
            input,
            work: dir.work.clone(),
            dir,
            source_commit: String::new(),
            downloaded: BTreeMap::new(),
            staging: None,
            task_deadline: None,
        };
        let downloaded = match limits.time_left {
            Some(left) => tokio::time::timeout(left, attempt.download(limits.budget))
                .await
                .unwrap_or(Err(WorkspaceFailure::DownloadTimedOut { left })),
            None => attempt.download(limits.budget).await,
        };
        if let Err(e) = downloaded {
            // Nothing ran yet: the attempt leaves nothing behind.
            attempt.cleanup().await;
            return Err(e);
        }
        Ok(attempt)
    }

    /// The time the task has left from now (`None`: no limit): a merge that did not answer is
    /// settled for at most that long (and never longer than
    /// [`MERGE_SETTLE_LIMIT`](crate::workspace::settle::MERGE_SETTLE_LIMIT)).
    pub fn set_time_left(&mut self, left: Option<Duration>) {
        self.task_deadline = left.map(|left| tokio::time::Instant::now() + left);
    }

    /// The folder the body works in (`PERAGO_WORKSPACE_DIR`).
    pub fn work_dir(&self) -> &Path {
        &self.work
    }

    /// The change the body made. Fails closed, before and after the scan, unless the attempt
    /// directory is still the one this executor created and filled: a folder swept and made
    /// again (by a body, or by anyone) would otherwise read as "every input file deleted".
    ///
    /// The work folder is taken back from the body's user first (see `scan`): only files owned
    /// by `body_uid` (the executor's own uid when the body runs as the executor's user) are
    /// published. `budget` is checked before any file is read, from the sizes listed, and again
    /// on the exact change.
    pub fn changes(
        &self,
        body_uid: Option<u32>,
        budget: Option<PublishBudget>,
    ) -> Result<Changes, WorkspaceFailure> {
        self.dir.verify()?;
        let unreadable = |source| ScanError::Io {
            path: self.work.clone(),
            source,
        };
        // The attempt directory is the executor's: its owner is who the tree goes back to.
        let attempt = fstat(self.dir.handles[0].1.as_fd()).map_err(unreadable)?;
        let work = Dir::from_fd(self.dir.handles[1].1.as_fd()).map_err(unreadable)?;
        let rules = Rules {
            body_uid: body_uid.unwrap_or(attempt.uid),
            keeper: (attempt.uid, attempt.gid),
        };
        let snapshot = Snapshot::take(&work, &self.work, &self.input.prefix, rules)?;
        self.dir.verify()?;
        if let Some(budget) = budget {
            let (objects, bytes) = snapshot.lower_bound(&self.downloaded);
            check_budget(budget, objects, bytes)?;
        }
        let changes = snapshot.changes(&self.downloaded)?;
        self.dir.verify()?;
        Ok(changes)
    }

    /// Deletes the staging branch and the attempt directory. Best effort: failures are
    /// logged and never change the reported status.
    ///
    /// A staging branch that cannot be deleted keeps the attempt's owner file (which names it),
    /// marked `done`, so that the supervisor's GC deletes the branch later (and `status` lists
    /// it meanwhile); the files go in any case.
    pub async fn cleanup(mut self) {
        if let Some(staging) = &self.staging
            && let Err(e) = self
                .client
                .delete_branch(&self.input.repository, staging)
                .await
        {
            tracing::warn!(error = %perago_core::errors::DisplayChain(&e), branch = %staging, "cannot delete the staging branch; left for the supervisor's GC");
            let kept = self
                .dir
                .verify()
                .and_then(|()| self.dir.record(|owner| owner.done = true));
            if kept.is_ok() {
                if let Err(e) = fs::remove_dir_all(&self.work) {
                    tracing::warn!(error = %perago_core::errors::DisplayChain(&e), dir = %self.work.display(), "cannot remove the attempt's files");
                }
                return;
            }
        }
        if let Err(e) = fs::remove_dir_all(&self.dir.path) {
            tracing::warn!(error = %perago_core::errors::DisplayChain(&e), dir = %self.dir.path.display(), "cannot remove the attempt directory");
        }
    }
}
