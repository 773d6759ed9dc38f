//! What fails in a workspace attempt.

use super::*;
use crate::workspace::{paths::PathError, scan::ScanError};
use perago_core::{attempt::FenceError, errors::DisplayChain, lakefs::LakefsError};
use std::{path::PathBuf, time::Duration};

/// A workspace step that failed; the assignment is FAILED with its text as the reason.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceFailure {
    /// The attempt directory cannot be created, written or opened.
    #[error("cannot {action} the attempt directory {}", path.display())]
    AttemptDir {
        /// `create`, `write the owner file in`, `open`.
        action: &'static str,
        /// The attempt directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The owner file cannot be rewritten with the staging branch.
    // The cause sits mid-sentence, so it is in the message, with its own causes, and not a
    // source (see docs/errors.md).
    #[error("cannot record the staging branch in {}: {}; nothing was published", file.display(), DisplayChain(cause))]
    OwnerFile {
        /// The owner file.
        file: PathBuf,
        /// The I/O error.
        cause: std::io::Error,
    },
    /// The attempt directory is not the one this executor created and filled any more.
    #[error("the attempt directory {} is no longer the one this executor created and filled: {}; its input snapshot is lost, so the change cannot be known; nothing was published", path.display(), DisplayChain(change))]
    AttemptDirReplaced {
        /// The attempt directory.
        path: PathBuf,
        /// What changed.
        change: DirChange,
    },
    /// A lakeFS call of the download failed.
    #[error("workspace download failed")]
    Download(#[source] LakefsError),
    /// The listing and the transfers took longer than the task had left.
    #[error(
        "workspace download failed: not done in the {left:?} the task had left (task.timeout_seconds); the body was not run"
    )]
    DownloadTimedOut {
        /// The time the task had left when the download began.
        left: Duration,
    },
    /// More objects under the prefix than the download budget allows.
    #[error(
        "download budget exceeded: more than {max} objects under prefix {prefix:?}, {why}; nothing was downloaded"
    )]
    TooManyDownloadObjects {
        /// The input prefix.
        prefix: String,
        /// The most an attempt lists.
        max: u64,
        /// Where the limit comes from.
        why: &'static str,
    },
    /// More bytes listed than the download budget allows.
    #[error(
        "download budget exceeded: {bytes} bytes listed under prefix {prefix:?}, max_bytes is {max}; nothing was downloaded"
    )]
    TooManyDownloadBytes {
        /// The input prefix.
        prefix: String,
        /// The listed sizes' sum.
        bytes: u64,
        /// The budget.
        max: u64,
    },
    /// An object key cannot be a path under the workspace.
    #[error(transparent)]
    UnsafeKey(#[from] PathError),
    /// Two keys cannot both be laid out as files (`x` and `x/y`).
    #[error(
        "workspace download failed: object key {key:?} needs {folder:?} to be a folder, but it is an object too; a workspace cannot hold both; nothing was downloaded"
    )]
    KeyIsFolder {
        /// The key that needs the folder.
        key: String,
        /// The key that is an object where a folder is needed.
        folder: String,
    },
    /// A local folder for a download cannot be created.
    #[error("cannot create {}", path.display())]
    CreateFolder {
        /// The folder.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A transfer task panicked or was cancelled.
    #[error("{} task failed", transfer.article_name())]
    TransferTask {
        /// Which kind of transfer.
        transfer: Transfer,
        /// The join error.
        #[source]
        source: tokio::task::JoinError,
    },
    /// The work folder cannot be scanned for the change.
    #[error(transparent)]
    Scan(#[from] ScanError),
    /// More objects changed than the publish budget allows.
    #[error(
        "publish budget exceeded: {objects} objects changed, max_objects is {max}; nothing was published"
    )]
    TooManyObjects {
        /// Objects changed.
        objects: u64,
        /// The budget.
        max: u64,
    },
    /// More bytes to upload than the publish budget allows.
    #[error(
        "publish budget exceeded: {bytes} bytes to upload, max_bytes is {max}; nothing was published"
    )]
    TooManyBytes {
        /// Bytes to upload.
        bytes: u64,
        /// The budget.
        max: u64,
    },
    /// Cutting, uploading to or deleting on the staging branch failed.
    #[error("staging failed")]
    Staging(#[source] LakefsError),
    /// Committing on the staging branch failed.
    #[error("staging commit failed")]
    StagingCommit(#[source] LakefsError),
    /// The merge conflicts with a change made to the branch since the attempt read it.
    #[error(
        "publish failed: merge conflict: {branch} changed paths this attempt also changed since it read commit {source_commit}; nothing was published"
    )]
    MergeConflict {
        /// The target branch.
        branch: String,
        /// The commit the attempt read.
        source_commit: String,
    },
    /// The merge failed otherwise (and was not applied).
    #[error("publish failed")]
    Publish(#[source] LakefsError),
    /// The merge answered success, but the branch does not show that commit merging the
    /// staging commit.
    #[error(
        "publish failed: the merge answered commit {answered}, but {branch} shows no such commit merging staging commit {staged}; not reported as published"
    )]
    MergeNotOnBranch {
        /// The target branch.
        branch: String,
        /// The commit id the merge answered.
        answered: String,
        /// The staging commit.
        staged: String,
    },
    /// The fence read the attempt and it is no longer this one, running.
    // The message starts with the cause: it is in the message and not a source.
    #[error("{} ({when}); nothing was published", DisplayChain(cause))]
    Fence {
        /// What the fresh read shows.
        cause: FenceError,
        /// `before staging`, `before publishing`.
        when: &'static str,
    },
    /// Conductor no longer knows the task.
    #[error(
        "stale attempt: Conductor no longer knows task {task_id} ({when}); nothing was published"
    )]
    TaskGone {
        /// The task.
        task_id: String,
        /// `before staging`, `before publishing`.
        when: &'static str,
    },
    /// The fence could not read the attempt for long enough.
    #[error("attempt fence unavailable: {cause}")]
    FenceUnavailable {
        /// The last read's error.
        cause: String,
    },
    /// The merge may have landed, but the branch did not show it within the settle window.
    #[error(
        "publication unknown: the merge of staging commit {staged} into {branch} {what}, and {branch} did not show it within {:.1} s ({last}); it may still land",
        .waited.as_secs_f64()
    )]
    PublicationUnknown {
        /// The target branch.
        branch: String,
        /// The staging commit.
        staged: String,
        /// What the merge answered (`answered commit …`, or its error).
        what: String,
        /// How long the branch was read.
        waited: Duration,
        /// The last read's outcome.
        last: String,
    },
    /// A retry cannot read the branch to learn whether an earlier attempt already published.
    #[error(
        "publication unknown: cannot read {branch} to learn whether an earlier attempt of this workflow task published ({when}): {}; nothing was published",
        DisplayChain(cause)
    )]
    EarlierUnknown {
        /// The target branch.
        branch: String,
        /// `before staging`, `before publishing`.
        when: &'static str,
        /// Why the branch cannot be read (mid-sentence: in the message, not a source).
        cause: LakefsError,
    },
    /// Every merge try within the budget was refused 429: lakeFS gave up against a branch that
    /// other writers kept moving.
    #[error(
        "publish failed: lakeFS refused all {tries} merges of staging commit {staged} into {branch} within merge_timeout_seconds ({budget_seconds} s) because other writers kept moving {branch} ({}); nothing was published",
        DisplayChain(last)
    )]
    MergeContended {
        /// The target branch.
        branch: String,
        /// The staging commit.
        staged: String,
        /// The merge tries made.
        tries: u32,
        /// `merge_timeout_seconds`.
        budget_seconds: u64,
        /// The last refusal (mid-sentence: in the message, not a source).
        last: LakefsError,
    },
    /// lakeFS refused a write for its configuration (403): a branch protection rule covering
    /// the staging branch, a read-only repository. Terminal: a retry is refused the same way.
    #[error(
        "publish refused by lakeFS: {what}; {remedy}; nothing was published, and the task is not retried: a retry would be refused the same way"
    )]
    Forbidden {
        /// What was refused, by what.
        what: String,
        /// What to change.
        remedy: String,
    },
    /// A lakeFS hook aborted a write (412).
    #[error("publish refused by a lakeFS hook: {what}; {remedy}; nothing was published")]
    HookFailed {
        /// What was aborted, with the hook's answer.
        what: String,
        /// Where to look.
        remedy: String,
    },
}

impl WorkspaceFailure {
    /// Whether the failure is FAILED_WITH_TERMINAL_ERROR: configuration a retry cannot get past
    /// (see `refusal`).
    pub fn is_terminal(&self) -> bool {
        matches!(self, Self::Forbidden { .. })
    }
}

/// The kind of a file transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transfer {
    /// An object downloaded into the work folder.
    Download,
    /// A file uploaded to the staging branch.
    Upload,
}

impl Transfer {
    fn article_name(self) -> &'static str {
        match self {
            Self::Download => "a download",
            Self::Upload => "an upload",
        }
    }
}

/// How an attempt directory is not the one created any more.
#[derive(Debug, thiserror::Error)]
pub enum DirChange {
    /// The held handle's metadata cannot be read.
    #[error("cannot read {}", path.display())]
    Unreadable {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The path is another directory now.
    #[error("{} was removed and made again", path.display())]
    Remade {
        /// The directory.
        path: PathBuf,
    },
    /// The path is gone.
    #[error("{} was removed ({})", path.display(), DisplayChain(cause))]
    Removed {
        /// The directory.
        path: PathBuf,
        /// The I/O error (mid-sentence: in the message, not a source).
        cause: std::io::Error,
    },
    /// The owner file has other content.
    #[error("its {OWNER_FILE} file was rewritten")]
    OwnerRewritten,
    /// The owner file cannot be read.
    #[error("its {OWNER_FILE} file is gone ({})", DisplayChain(cause))]
    OwnerGone {
        /// The I/O error (mid-sentence: in the message, not a source).
        cause: std::io::Error,
    },
}
