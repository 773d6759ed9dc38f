//! One workspace attempt (SPEC §6): download the input prefix at a pinned commit into
//! `<root>/attempts/<execution_id>/work`, let the body change it, then — behind the attempt
//! fence — stage the change on `perago-staging-<execution_id>` cut from that same commit, commit
//! it with the attempt's metadata, fence again, and merge it into the branch. The staging
//! branch and the attempt directory are removed on every path.

use super::{
    contention::MergeTries,
    paths::{PathError, key_to_relative},
    refusal,
    scan::{Changes, Rules, ScanError, Snapshot},
    settle::{
        EXECUTION_ID_KEY, Earlier, MergeAnswer, RETRY_KEY, Settled, TASK_ID_KEY, WorkflowTask,
        earlier_publication, merges, scan_log, settle, settle_window,
    },
};
use perago_core::{
    attempt::{AttemptSnapshot, FenceError},
    lakefs::{LakefsClient, LakefsError},
    manifest::{DownloadBudget, PublishBudget, WorkspaceSpec},
    process::dirfd::{Dir, fstat},
    shape::WorkspaceInput,
};
use serde_json::{Map, Value, json};
use std::{
    collections::BTreeMap,
    fs,
    os::{fd::AsFd as _, unix::fs::DirBuilderExt as _},
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};
use tokio::{sync::Semaphore, task::JoinSet};

/// Transfers in flight at once, per attempt.
const TRANSFER_CONCURRENCY: usize = 8;
/// How long the fence keeps trying when the broker cannot read the task.
const FENCE_PATIENCE: Duration = Duration::from_secs(10);
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

use perago_core::owner::AttemptOwner;
pub use perago_core::owner::OWNER_FILE;

/// A workspace step that failed; the assignment is FAILED with its text as the reason.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceFailure {
    /// The attempt directory cannot be created, written or opened.
    #[error("cannot {action} the attempt directory {}: {source}", path.display())]
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
    #[error("cannot record the staging branch in {}: {source}; nothing was published", file.display())]
    OwnerFile {
        /// The owner file.
        file: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The attempt directory is not the one this executor created and filled any more.
    #[error("the attempt directory {} is no longer the one this executor created and filled: {change}; its input snapshot is lost, so the change cannot be known; nothing was published", path.display())]
    AttemptDirReplaced {
        /// The attempt directory.
        path: PathBuf,
        /// What changed.
        change: DirChange,
    },
    /// A lakeFS call of the download failed.
    #[error("workspace download failed: {0}")]
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
    #[error("cannot create {}: {source}", path.display())]
    CreateFolder {
        /// The folder.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A transfer task panicked or was cancelled.
    #[error("{} task failed: {source}", transfer.article_name())]
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
    #[error("staging failed: {0}")]
    Staging(#[source] LakefsError),
    /// Committing on the staging branch failed.
    #[error("staging commit failed: {0}")]
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
    #[error("publish failed: {0}")]
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
    #[error("{source} ({when}); nothing was published")]
    Fence {
        /// What the fresh read shows.
        #[source]
        source: FenceError,
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
        "publication unknown: cannot read {branch} to learn whether an earlier attempt of this workflow task published ({when}): {source}; nothing was published"
    )]
    EarlierUnknown {
        /// The target branch.
        branch: String,
        /// `before staging`, `before publishing`.
        when: &'static str,
        /// Why the branch cannot be read.
        #[source]
        source: LakefsError,
    },
    /// Every merge try within the budget was refused 429: lakeFS gave up against a branch that
    /// other writers kept moving.
    #[error(
        "publish failed: lakeFS refused all {tries} merges of staging commit {staged} into {branch} within merge_timeout_seconds ({budget_seconds} s) because other writers kept moving {branch} ({last}); nothing was published"
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
        /// The last refusal.
        #[source]
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
    #[error("cannot read {}: {source}", path.display())]
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
    #[error("{} was removed ({source})", path.display())]
    Removed {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The owner file has other content.
    #[error("its {OWNER_FILE} file was rewritten")]
    OwnerRewritten,
    /// The owner file cannot be read.
    #[error("its {OWNER_FILE} file is gone ({source})")]
    OwnerGone {
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// A prepared attempt: files downloaded, ready for the body.
#[derive(Debug)]
pub struct Attempt {
    client: LakefsClient,
    input: WorkspaceInput,
    dir: AttemptDir,
    work: PathBuf,
    /// The commit the files were read from.
    source_commit: String,
    /// key → hex MD5 of the bytes this executor wrote at download time (never the listed
    /// `checksum`, which is not always a content MD5): what "changed" is decided against.
    /// Held in the executor's memory, out of the body's reach.
    downloaded: BTreeMap<String, String>,
    staging: Option<String>,
    /// When the task's `timeoutSeconds` ends (`None`: no limit), bounding how long a merge
    /// that did not answer is settled.
    task_deadline: Option<tokio::time::Instant>,
}

/// Seconds since the epoch.
fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The attempt directory this executor created, and proof that it still is: an open handle on
/// the directory and its `work/` folder (the kernel never reuses the inode of a directory that
/// is open, so a folder made again at the same path always has another one) and the owner
/// file's exact content.
#[derive(Debug)]
pub(crate) struct AttemptDir {
    path: PathBuf,
    work: PathBuf,
    owner: AttemptOwner,
    owner_text: String,
    handles: [(PathBuf, fs::File); 2],
}

fn identity(meta: &fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt as _;
    (meta.dev(), meta.ino())
}

fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
}

/// Writes `text` to `path` (created or truncated) readable by the executor's user only.
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::{io::Write as _, os::unix::fs::OpenOptionsExt as _};
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(text.as_bytes())
}

impl AttemptDir {
    /// Creates `<root>/attempts/<execution_id>/work` and writes the owner file. `attempts/`
    /// and the attempt directory are 0711 (a `[body] user` can pass through to its `work/`,
    /// nobody but the executor can list them), `work/` is 0700 and the owner file 0600,
    /// whatever the umask.
    pub(crate) fn create(
        root: &Path,
        execution_id: &str,
        owner: Owner,
    ) -> Result<Self, WorkspaceFailure> {
        let path = root.join("attempts").join(execution_id);
        let work = path.join("work");
        let cannot = |action: &'static str, source: std::io::Error| WorkspaceFailure::AttemptDir {
            action,
            path: path.clone(),
            source,
        };
        let attempts = root.join("attempts");
        let made = fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(&attempts)
            .and_then(|()| set_mode(&attempts, 0o711))
            // A fresh execution id: an attempt directory that exists already was not made here.
            .and_then(|()| fs::DirBuilder::new().mode(0o711).create(&path))
            .and_then(|()| set_mode(&path, 0o711))
            .and_then(|()| fs::DirBuilder::new().mode(0o700).create(&work))
            .and_then(|()| set_mode(&work, 0o700));
        made.map_err(|e| cannot("create", e))?;
        let owner = AttemptOwner {
            slot: Some(owner.slot),
            generation: Some(owner.generation),
            pid: Some(std::process::id()),
            execution_id: Some(execution_id.to_owned()),
            created: Some(now_secs()),
            ..AttemptOwner::default()
        };
        let owner_text = owner.to_text();
        write_private(&path.join(OWNER_FILE), &owner_text)
            .map_err(|e| cannot("write the owner file in", e))?;
        let open = |p: &Path| fs::File::open(p).map(|f| (p.to_owned(), f));
        let handles = [
            open(&path).map_err(|e| cannot("open", e))?,
            open(&work).map_err(|e| cannot("open", e))?,
        ];
        Ok(Self {
            path,
            work,
            owner,
            owner_text,
            handles,
        })
    }

    /// Rewrites the owner file (atomically) as `change` leaves it: the supervisor's GC reads
    /// `repository` and `staging_branch` to delete a staging branch an executor killed
    /// mid-publish left behind, and `done` to know the executor has finished with the directory.
    fn record(&mut self, change: impl FnOnce(&mut AttemptOwner)) -> Result<(), WorkspaceFailure> {
        let mut owner = self.owner.clone();
        change(&mut owner);
        let text = owner.to_text();
        let temporary = self.path.join(format!("{OWNER_FILE}.new"));
        write_private(&temporary, &text)
            .and_then(|()| fs::rename(&temporary, self.path.join(OWNER_FILE)))
            .map_err(|source| WorkspaceFailure::OwnerFile {
                file: self.path.join(OWNER_FILE),
                source,
            })?;
        self.owner = owner;
        self.owner_text = text;
        Ok(())
    }

    /// Ok while the directory, its `work/` folder and its owner file are the ones created.
    pub(crate) fn verify(&self) -> Result<(), WorkspaceFailure> {
        let gone = |change: DirChange| WorkspaceFailure::AttemptDirReplaced {
            path: self.path.clone(),
            change,
        };
        for (path, handle) in &self.handles {
            let held = handle.metadata().map_err(|source| {
                gone(DirChange::Unreadable {
                    path: path.clone(),
                    source,
                })
            })?;
            match fs::symlink_metadata(path) {
                Ok(now) if identity(&now) == identity(&held) => {}
                Ok(_) => return Err(gone(DirChange::Remade { path: path.clone() })),
                Err(source) => {
                    return Err(gone(DirChange::Removed {
                        path: path.clone(),
                        source,
                    }));
                }
            }
        }
        match fs::read_to_string(self.path.join(OWNER_FILE)) {
            Ok(text) if text == self.owner_text => Ok(()),
            Ok(_) => Err(gone(DirChange::OwnerRewritten)),
            Err(source) => Err(gone(DirChange::OwnerGone { source })),
        }
    }
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
    /// [`MERGE_SETTLE_LIMIT`](super::settle::MERGE_SETTLE_LIMIT)).
    pub fn set_time_left(&mut self, left: Option<Duration>) {
        self.task_deadline = left.map(|left| tokio::time::Instant::now() + left);
    }

    /// The folder the body works in (`PERAGO_WORKSPACE_DIR`).
    pub fn work_dir(&self) -> &Path {
        &self.work
    }

    async fn download(&mut self, budget: Option<DownloadBudget>) -> Result<(), WorkspaceFailure> {
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

    /// Stages and publishes `changes`; returns the `workspace` output object. `publishing` is
    /// called once the change is staged (uploaded and committed on the staging branch), right
    /// before the last fence and the merge: the phase an operator sees is the one it is in.
    /// A write lakeFS refuses for its configuration or a hook says what to change (`refusal`).
    #[expect(
        clippy::too_many_arguments,
        reason = "each is a distinct input of one publish"
    )]
    pub async fn publish(
        &mut self,
        changes: &Changes,
        spec: &WorkspaceSpec,
        fence: &dyn Fence,
        polled: &AttemptSnapshot,
        execution_id: &str,
        metadata: Map<String, Value>,
        publishing: &(dyn Fn() + Send + Sync),
    ) -> Result<Value, WorkspaceFailure> {
        let published = self
            .publish_change(
                changes,
                spec,
                fence,
                polled,
                execution_id,
                metadata,
                publishing,
            )
            .await;
        match published {
            Err(failure) => Err(self.explain_refusal(failure, execution_id).await),
            ok => ok,
        }
    }

    /// `failure`, said as what lakeFS refused and what to change when it is a 403 or 412 of a
    /// write; the repository's protection rules are read to name the one that blocks.
    async fn explain_refusal(
        &self,
        failure: WorkspaceFailure,
        execution_id: &str,
    ) -> WorkspaceFailure {
        let Some((step, status, message)) = refusal::refused(&failure) else {
            return failure;
        };
        let repo = &self.input.repository;
        let rules = if status == 403 && message.contains("protected branch") {
            Some(
                self.client
                    .branch_protection_rules(repo)
                    .await
                    .map_err(|e| e.to_string()),
            )
        } else {
            None
        };
        let staging = format!("perago-staging-{execution_id}");
        let target = refusal::Target {
            repository: repo,
            branch: &self.input.branch,
            staging: &staging,
        };
        refusal::explain(step, status, message, target, rules)
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "each is a distinct input of one publish"
    )]
    async fn publish_change(
        &mut self,
        changes: &Changes,
        spec: &WorkspaceSpec,
        fence: &dyn Fence,
        polled: &AttemptSnapshot,
        execution_id: &str,
        metadata: Map<String, Value>,
        publishing: &(dyn Fn() + Send + Sync),
    ) -> Result<Value, WorkspaceFailure> {
        if let Some(budget) = spec.publish_budget {
            // What is sent is exactly these sizes (see `LakefsClient::upload_file`).
            check_budget(budget, changes.objects(), changes.upload_bytes())?;
        }
        let counts = |commit: &str| {
            json!({
                "repository": self.input.repository, "branch": self.input.branch,
                "prefix": self.input.prefix, "source_commit_id": self.source_commit,
                "commit_id": commit, "added": changes.added.len(),
                "changed": changes.changed.len(), "removed": changes.removed.len(),
            })
        };
        // Every publication names its workflow task and what it changed: a retry finds it by
        // these (see `settle`), and reports the counts of the one that landed.
        let task = WorkflowTask::of(polled);
        let mut metadata = metadata;
        let named = task.metadata().into_iter().chain([
            (RETRY_KEY, polled.retry_count.to_string()),
            (TASK_ID_KEY, polled.task_id.clone()),
            (EXECUTION_ID_KEY, execution_id.to_owned()),
            ("added", changes.added.len().to_string()),
            ("changed", changes.changed.len().to_string()),
            ("removed", changes.removed.len().to_string()),
        ]);
        for (key, value) in named {
            metadata.insert(key.to_owned(), Value::String(value));
        }
        // The fence runs whatever the body did: an attempt Conductor has given up on is FAILED,
        // also when it has nothing to publish.
        check_fence(fence, polled, "before staging").await?;
        if let Some(earlier) = self
            .earlier(&task, polled.retry_count, "before staging")
            .await?
        {
            return Ok(self.already_published(&earlier));
        }
        if changes.is_empty() {
            tracing::info!("the body changed nothing; nothing to publish");
            return Ok(counts(&self.source_commit.clone()));
        }

        let repo = self.input.repository.clone();
        let staging = format!("perago-staging-{execution_id}");
        // Recorded before the branch exists: an executor killed from here on leaves a branch
        // the supervisor can find.
        self.dir.verify()?;
        self.dir.record(|owner| {
            owner.repository = Some(repo.clone());
            owner.staging_branch = Some(staging.clone());
        })?;
        self.client
            .create_branch(&repo, &staging, &self.source_commit)
            .await
            .map_err(WorkspaceFailure::Staging)?;
        self.staging = Some(staging.clone());
        self.upload(&repo, &staging, changes).await?;
        // What was uploaded was read from the directory this executor filled.
        self.dir.verify()?;
        if !changes.removed.is_empty() {
            self.client
                .delete_objects(&repo, &staging, &changes.removed)
                .await
                .map_err(WorkspaceFailure::Staging)?;
        }
        let message = format!(
            "perago: {} of workflow {} (retry {})",
            polled.task_id, polled.workflow_instance_id, polled.retry_count
        );
        let staged = self
            .client
            .commit(&repo, &staging, &message, &metadata)
            .await
            .map_err(WorkspaceFailure::StagingCommit)?;

        publishing();
        check_fence(fence, polled, "before publishing").await?;
        // An earlier attempt's merge may have landed while this one staged.
        if let Some(earlier) = self
            .earlier(&task, polled.retry_count, "before publishing")
            .await?
        {
            return Ok(self.already_published(&earlier));
        }
        let budget = Duration::from_secs(spec.merge_timeout_seconds);
        let mut tries = MergeTries::new(tokio::time::Instant::now(), budget);
        let merged = loop {
            let answer = MergeAnswer::of(
                self.client
                    .merge(
                        &repo,
                        &staging,
                        &self.input.branch,
                        &message,
                        &metadata,
                        tries.timeout(tokio::time::Instant::now()),
                    )
                    .await,
            );
            let MergeAnswer::Busy(refused) = answer else {
                break self.settle_merge(answer, &staged.id).await?;
            };
            // Not applied (see `contention`): merge again, within the budget, behind the fence.
            let Some(wait) = tries.refused_at(tokio::time::Instant::now()) else {
                return Err(WorkspaceFailure::MergeContended {
                    branch: self.input.branch.clone(),
                    staged: staged.id.clone(),
                    tries: tries.refused(),
                    budget_seconds: spec.merge_timeout_seconds,
                    last: refused,
                });
            };
            tracing::warn!(error = %refused, tries = tries.refused(), wait = ?wait, "the merge was refused under contention; merging again");
            tokio::time::sleep(wait).await;
            check_fence(fence, polled, "before merging again").await?;
            if let Some(earlier) = self
                .earlier(&task, polled.retry_count, "before merging again")
                .await?
            {
                return Ok(self.already_published(&earlier));
            }
            // Never twice: a 429 from something in front of lakeFS need not mean what lakeFS's
            // does.
            if let Some(commit) = self.merged(&staged.id).await.ok().flatten() {
                tracing::warn!(commit = %commit, "the merge refused under contention was applied after all");
                break commit;
            }
        };
        tracing::info!(repository = %repo, branch = %self.input.branch, commit = %merged, "workspace published");
        Ok(counts(&merged))
    }

    /// The merge commit, once the branch shows it: what is known after the merge `answer`.
    /// An answer is not proof (the branch must show that commit merging the staged one); an
    /// error the server answered may still hide a merge applied (the branch is read once); a
    /// merge that did not answer may land later, so the branch is read with backoff for the
    /// settle window before the attempt reports "publication unknown".
    async fn settle_merge(
        &self,
        answer: MergeAnswer,
        staged: &str,
    ) -> Result<String, WorkspaceFailure> {
        let branch = || self.input.branch.clone();
        let window = settle_window(
            self.task_deadline
                .map(|d| d.saturating_duration_since(tokio::time::Instant::now())),
        );
        let unknown = |what: String, waited, last| WorkspaceFailure::PublicationUnknown {
            branch: branch(),
            staged: staged.to_owned(),
            what,
            waited,
            last,
        };
        match answer {
            MergeAnswer::Answered(answered) => {
                let shown = match self.merged(staged).await {
                    Ok(shown) => shown,
                    // The branch cannot be read: read it again until it can.
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot read the branch to confirm the merge; retrying");
                        match settle(tokio::time::Instant::now() + window, || async {
                            // Readable now: what it shows is the answer, shown or not.
                            self.merged(staged)
                                .await
                                .map(|shown| Some(shown.unwrap_or_default()))
                        })
                        .await
                        {
                            Settled::Merged(shown) => Some(shown).filter(|s| !s.is_empty()),
                            Settled::Unknown { waited, last } => {
                                return Err(unknown(
                                    format!("answered commit {answered}"),
                                    waited,
                                    last,
                                ));
                            }
                        }
                    }
                };
                match shown {
                    Some(commit) if commit == answered => Ok(commit),
                    _ => Err(WorkspaceFailure::MergeNotOnBranch {
                        branch: branch(),
                        answered,
                        staged: staged.to_owned(),
                    }),
                }
            }
            MergeAnswer::Conflict => Err(WorkspaceFailure::MergeConflict {
                branch: branch(),
                source_commit: self.source_commit.clone(),
            }),
            MergeAnswer::NotSent(e) => Err(WorkspaceFailure::Publish(e)),
            MergeAnswer::Refused(e) | MergeAnswer::Busy(e) => {
                match self.merged(staged).await.ok().flatten() {
                    Some(commit) => {
                        tracing::warn!(error = %e, commit = %commit, "the merge answered with an error but was applied");
                        Ok(commit)
                    }
                    None => Err(WorkspaceFailure::Publish(e)),
                }
            }
            MergeAnswer::MayLand(e) => {
                tracing::warn!(error = %e, window = ?window, "the merge did not answer; reading the branch until it shows whether it landed");
                match settle(tokio::time::Instant::now() + window, || self.merged(staged)).await {
                    Settled::Merged(commit) => {
                        tracing::warn!(error = %e, commit = %commit, "the merge did not answer but landed");
                        Ok(commit)
                    }
                    Settled::Unknown { waited, last } => {
                        Err(unknown(format!("did not answer ({e})"), waited, last))
                    }
                }
            }
        }
    }

    /// An earlier attempt's publication of `task` on the branch, for a retry (`retry_count` >
    /// 0); a first attempt has none to look for.
    async fn earlier(
        &self,
        task: &WorkflowTask,
        retry_count: u32,
        when: &'static str,
    ) -> Result<Option<Earlier>, WorkspaceFailure> {
        if retry_count == 0 {
            return Ok(None);
        }
        scan_log(
            &self.client,
            &self.input.repository,
            &self.input.branch,
            |commit| earlier_publication(commit, task, retry_count),
        )
        .await
        .map_err(|source| WorkspaceFailure::EarlierUnknown {
            branch: self.input.branch.clone(),
            when,
            source,
        })
    }

    /// The `workspace` output of a retry whose workflow task an earlier attempt published: the
    /// earlier merge commit and its counts, and who published it; nothing is published again.
    fn already_published(&self, earlier: &Earlier) -> Value {
        let count = |key: &str| {
            earlier
                .get(key)
                .and_then(|v| v.parse::<u64>().ok())
                .map_or(Value::Null, Value::from)
        };
        tracing::warn!(
            commit = %earlier.commit,
            task_id = earlier.get(TASK_ID_KEY).unwrap_or_default(),
            retry_count = earlier.retry_count,
            "an earlier attempt of this workflow task already published its change as commit {}; not publishing again",
            earlier.commit
        );
        json!({
            "repository": self.input.repository, "branch": self.input.branch,
            "prefix": self.input.prefix, "source_commit_id": self.source_commit,
            "commit_id": earlier.commit, "added": count("added"),
            "changed": count("changed"), "removed": count("removed"),
            "already_published_by": {
                "task_id": earlier.get(TASK_ID_KEY),
                "execution_id": earlier.get(EXECUTION_ID_KEY),
                "retry_count": earlier.retry_count,
            },
        })
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
                client
                    .upload_file(&repo, &staging, &upload)
                    .await
                    .map_err(WorkspaceFailure::Staging)
            });
        }
        while let Some(done) = transfers.join_next().await {
            done.map_err(|source| WorkspaceFailure::TransferTask {
                transfer: Transfer::Upload,
                source,
            })??;
        }
        Ok(())
    }

    /// The target branch's commit that merged `staged`, if its first-parent line shows one
    /// among its newest commits (at most
    /// [`LOG_SCAN_COMMITS`](super::settle::LOG_SCAN_COMMITS) commits): a well-formed commit id
    /// with `staged` among its parents.
    async fn merged(&self, staged: &str) -> Result<Option<String>, LakefsError> {
        scan_log(
            &self.client,
            &self.input.repository,
            &self.input.branch,
            |c| merges(c, staged).then(|| c.id.clone()),
        )
        .await
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
            tracing::warn!(error = %e, branch = %staging, "cannot delete the staging branch; left for the supervisor's GC");
            let kept = self
                .dir
                .verify()
                .and_then(|()| self.dir.record(|owner| owner.done = true));
            if kept.is_ok() {
                if let Err(e) = fs::remove_dir_all(&self.work) {
                    tracing::warn!(error = %e, dir = %self.work.display(), "cannot remove the attempt's files");
                }
                return;
            }
        }
        if let Err(e) = fs::remove_dir_all(&self.dir.path) {
            tracing::warn!(error = %e, dir = %self.dir.path.display(), "cannot remove the attempt directory");
        }
    }
}

/// Fails when `objects` or `bytes` exceed the publish budget.
fn check_budget(budget: PublishBudget, objects: u64, bytes: u64) -> Result<(), WorkspaceFailure> {
    if let Some(max) = budget.max_objects
        && objects > max
    {
        return Err(WorkspaceFailure::TooManyObjects { objects, max });
    }
    if let Some(max) = budget.max_bytes
        && bytes > max
    {
        return Err(WorkspaceFailure::TooManyBytes { bytes, max });
    }
    Ok(())
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

/// The attempt fence: a positive fresh read, or FAILED. Read errors are retried for a few
/// seconds, then fail closed.
pub async fn check_fence(
    fence: &dyn Fence,
    polled: &AttemptSnapshot,
    when: &'static str,
) -> Result<(), WorkspaceFailure> {
    let deadline = tokio::time::Instant::now() + FENCE_PATIENCE;
    let mut wait = Duration::from_millis(100);
    loop {
        match fence.reload().await {
            FenceRead::Fresh(fresh) => {
                return polled
                    .fence(&fresh)
                    .map_err(|source| WorkspaceFailure::Fence { source, when });
            }
            FenceRead::Gone => {
                return Err(WorkspaceFailure::TaskGone {
                    task_id: polled.task_id.clone(),
                    when,
                });
            }
            FenceRead::Unavailable(cause) if tokio::time::Instant::now() >= deadline => {
                return Err(WorkspaceFailure::FenceUnavailable { cause });
            }
            FenceRead::Unavailable(cause) => {
                tracing::warn!(cause = %cause, "attempt fence read failed; retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(2));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use perago_core::lakefs::LakefsConfig;
    use std::sync::{
        Mutex,
        atomic::{AtomicUsize, Ordering},
    };

    fn snapshot(status: &str) -> AttemptSnapshot {
        AttemptSnapshot::from_conductor(&json!({
            "taskId": "task-1", "workflowInstanceId": "wf-1", "retryCount": 0,
            "taskDefName": "t", "referenceTaskName": "ref", "seq": 1,
            "status": status, "inputData": {}
        }))
        .unwrap()
    }

    /// Answers the scripted reads in order, then "unavailable"; counts the reads.
    #[derive(Default)]
    struct Scripted {
        reads: Mutex<Vec<FenceRead>>,
        calls: AtomicUsize,
    }

    impl Scripted {
        fn new(reads: Vec<FenceRead>) -> Self {
            Self {
                reads: Mutex::new(reads.into_iter().rev().collect()),
                calls: AtomicUsize::new(0),
            }
        }
        fn calls(&self) -> usize {
            self.calls.load(Ordering::SeqCst)
        }
    }

    impl Fence for Scripted {
        fn reload(&self) -> std::pin::Pin<Box<dyn Future<Output = FenceRead> + Send + '_>> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let next = self.reads.lock().unwrap().pop();
            Box::pin(async move {
                next.unwrap_or_else(|| FenceRead::Unavailable("connection refused".to_owned()))
            })
        }
    }

    fn fresh(status: &str) -> FenceRead {
        FenceRead::Fresh(Box::new(snapshot(status)))
    }

    fn message(result: Result<impl std::fmt::Debug, WorkspaceFailure>) -> String {
        match result {
            Err(failure) => failure.to_string(),
            Ok(v) => panic!("expected a failure, got {v:?}"),
        }
    }

    #[tokio::test]
    async fn the_fence_passes_only_a_fresh_in_progress_read() {
        let polled = snapshot("IN_PROGRESS");
        let fence = Scripted::new(vec![fresh("IN_PROGRESS")]);
        check_fence(&fence, &polled, "before staging")
            .await
            .unwrap();

        let fence = Scripted::new(vec![fresh("TIMED_OUT")]);
        assert_eq!(
            message(check_fence(&fence, &polled, "before publishing").await),
            "stale attempt: task status is TIMED_OUT, expected IN_PROGRESS (before publishing); nothing was published"
        );
        let fence = Scripted::new(vec![fresh("TIMED_OUT")]);
        assert!(matches!(
            check_fence(&fence, &polled, "before publishing").await,
            Err(WorkspaceFailure::Fence {
                source: FenceError::NotInProgress { .. },
                when: "before publishing"
            })
        ));
        let fence = Scripted::new(vec![FenceRead::Gone]);
        assert!(matches!(
            check_fence(&fence, &polled, "before staging").await,
            Err(WorkspaceFailure::TaskGone { ref task_id, .. }) if task_id == "task-1"
        ));
        // A 404 from Conductor: stale at once, not retried.
        let fence = Scripted::new(vec![FenceRead::Gone]);
        assert_eq!(
            message(check_fence(&fence, &polled, "before staging").await),
            "stale attempt: Conductor no longer knows task task-1 (before staging); nothing was published"
        );
        assert_eq!(fence.calls(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unavailable_fence_is_retried_then_fails_closed() {
        let polled = snapshot("IN_PROGRESS");
        // A blip is retried...
        let fence = Scripted::new(vec![
            FenceRead::Unavailable("HTTP 503".to_owned()),
            fresh("IN_PROGRESS"),
        ]);
        check_fence(&fence, &polled, "before staging")
            .await
            .unwrap();
        assert_eq!(fence.calls(), 2);
        // ...an outage longer than the patience fails the attempt: never a publish unfenced.
        let started = tokio::time::Instant::now();
        let fence = Scripted::new(Vec::new());
        assert_eq!(
            message(check_fence(&fence, &polled, "before staging").await),
            "attempt fence unavailable: connection refused"
        );
        assert!(started.elapsed() >= FENCE_PATIENCE);
        assert!(fence.calls() > 3, "{}", fence.calls());
        let fence = Scripted::new(Vec::new());
        assert!(matches!(
            check_fence(&fence, &polled, "before staging").await,
            Err(WorkspaceFailure::FenceUnavailable { .. })
        ));
    }

    #[test]
    fn a_key_that_is_also_a_folder_is_refused_by_its_variant() {
        let object = |path: &str| perago_core::lakefs::ObjectStats {
            path: path.to_owned(),
            path_type: "object".to_owned(),
            checksum: String::new(),
            size_bytes: None,
        };
        let failure =
            plan_download("p/", vec![object("p/x"), object("p/x/y")], Path::new("/w")).unwrap_err();
        assert!(matches!(
            failure,
            WorkspaceFailure::KeyIsFolder { ref key, ref folder } if key == "p/x/y" && folder == "p/x"
        ));
        assert_eq!(
            failure.to_string(),
            "workspace download failed: object key \"p/x/y\" needs \"p/x\" to be a folder, but it is an object too; a workspace cannot hold both; nothing was downloaded"
        );
        assert!(matches!(
            plan_download("p/", vec![object("p/../x")], Path::new("/w")),
            Err(WorkspaceFailure::UnsafeKey(_))
        ));
    }

    /// An attempt with a downloaded snapshot of `files` (key under `p/` → content), made without
    /// lakeFS; its client points at a port nothing listens on.
    fn attempt(root: &Path, files: &[(&str, &str)]) -> Attempt {
        let dir = AttemptDir::create(
            root,
            "exec-1",
            Owner {
                slot: 1,
                generation: 1,
            },
        )
        .unwrap();
        let mut downloaded = BTreeMap::new();
        for (name, text) in files {
            let path = dir.work.join(name);
            fs::write(&path, text).unwrap();
            downloaded.insert(
                format!("p/{name}"),
                super::super::scan::md5_hex(&path).unwrap(),
            );
        }
        let client = LakefsClient::new(&LakefsConfig {
            endpoint: "http://127.0.0.1:9".to_owned(),
            access_key_id: "k".to_owned(),
            secret_access_key: "s".to_owned(),
        })
        .unwrap();
        Attempt {
            client,
            input: WorkspaceInput {
                repository: "repo".to_owned(),
                branch: "main".to_owned(),
                prefix: "p/".to_owned(),
                source_ref: None,
            },
            work: dir.work.clone(),
            dir,
            source_commit: "c0".to_owned(),
            downloaded,
            staging: None,
            task_deadline: None,
        }
    }

    fn spec() -> WorkspaceSpec {
        WorkspaceSpec {
            prefix: String::new(),
            merge_timeout_seconds: 5,
            publish_budget: None,
            download_budget: None,
        }
    }

    #[tokio::test]
    async fn a_body_that_changed_nothing_is_still_fenced() {
        let tmp = tempfile::tempdir().unwrap();
        let mut ws = attempt(tmp.path(), &[("a.txt", "a")]);
        let changes = ws.changes(None, None).unwrap();
        assert!(changes.is_empty());
        let polled = snapshot("IN_PROGRESS");
        let stale = Scripted::new(vec![fresh("CANCELED")]);
        let result = ws
            .publish(
                &changes,
                &spec(),
                &stale,
                &polled,
                "exec-1",
                Map::new(),
                &|| {},
            )
            .await;
        assert_eq!(
            message(result),
            "stale attempt: task status is CANCELED, expected IN_PROGRESS (before staging); nothing was published"
        );
        assert_eq!(stale.calls(), 1);

        let current = Scripted::new(vec![fresh("IN_PROGRESS")]);
        let output = ws
            .publish(
                &changes,
                &spec(),
                &current,
                &polled,
                "exec-1",
                Map::new(),
                &|| {},
            )
            .await
            .unwrap();
        assert_eq!(output["commit_id"], "c0");
        assert_eq!(current.calls(), 1, "one fence read, nothing staged");
    }

    fn listed(keys: &[&str]) -> Vec<perago_core::lakefs::ObjectStats> {
        keys.iter()
            .map(|k| {
                serde_json::from_value(json!({"path": k, "path_type": "object", "checksum": "c"}))
                    .unwrap()
            })
            .collect()
    }

    #[test]
    fn folder_markers_are_skipped_when_downloading() {
        let work = Path::new("/w");
        let plan = plan_download(
            "data/",
            listed(&["data/", "data/a/", "data/a/f.csv", "data/b/", "data/g"]),
            work,
        )
        .unwrap();
        let files: Vec<_> = plan
            .iter()
            .map(|p| (p.key.as_str(), p.file.clone()))
            .collect();
        assert_eq!(
            files,
            [
                ("data/a/f.csv", work.join("a/f.csv")),
                ("data/g", work.join("g"))
            ]
        );
    }

    #[test]
    fn a_key_that_is_also_a_folder_fails_naming_both_keys() {
        for keys in [
            &["data/x", "data/x/y"][..],
            &["data/x/y/z", "data/a", "data/x"][..],
        ] {
            let err = plan_download("data/", listed(keys), Path::new("/w"))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("\"data/x\"") && err.contains("\"data/x/y"),
                "{err}"
            );
            assert!(err.ends_with("nothing was downloaded"), "{err}");
        }
        // Siblings sharing a name prefix are not folders of each other.
        plan_download("", listed(&["x", "xy/z", "x.d/z"]), Path::new("/w")).unwrap();
    }

    #[tokio::test]
    async fn a_staging_branch_that_cannot_be_deleted_stays_named_in_the_owner_file() {
        let tmp = tempfile::tempdir().unwrap();
        let mut ws = attempt(tmp.path(), &[("a.txt", "a")]);
        ws.dir
            .record(|owner| {
                owner.repository = Some("repo".into());
                owner.staging_branch = Some("perago-staging-exec-1".into());
            })
            .unwrap();
        ws.dir
            .verify()
            .expect("a recorded owner file is still ours");
        ws.staging = Some("perago-staging-exec-1".to_owned());
        let (path, work) = (ws.dir.path.clone(), ws.work.clone());
        // lakeFS is unreachable: the branch cannot be deleted.
        ws.cleanup().await;
        let owner: Value =
            serde_json::from_str(&fs::read_to_string(path.join(OWNER_FILE)).unwrap()).unwrap();
        assert_eq!(owner["repository"], "repo");
        assert_eq!(owner["staging_branch"], "perago-staging-exec-1");
        assert_eq!(owner["execution_id"], "exec-1");
        assert_eq!(owner["done"], true);
        assert!(!work.exists(), "the files are gone");
    }

    #[test]
    fn the_publish_budget_refuses_a_big_new_file_before_reading_it() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = attempt(tmp.path(), &[("a.txt", "a")]);
        // 64 GiB, sparse: hashing it first would take minutes.
        let big = fs::File::create(ws.work.join("big.bin")).unwrap();
        big.set_len(64 << 30).unwrap();
        let budget = PublishBudget {
            max_objects: None,
            max_bytes: Some(64 << 20),
            seconds: None,
        };
        let started = std::time::Instant::now();
        assert_eq!(
            message(ws.changes(None, Some(budget))),
            format!(
                "publish budget exceeded: {} bytes to upload, max_bytes is {}; nothing was published",
                64u64 << 30,
                64 << 20
            )
        );
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn attempt_folders_are_closed_to_other_users() {
        use std::os::unix::fs::PermissionsExt as _;
        let tmp = tempfile::tempdir().unwrap();
        let ws = attempt(tmp.path(), &[("a.txt", "a")]);
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&tmp.path().join("attempts")), 0o711);
        assert_eq!(mode(&ws.dir.path), 0o711);
        assert_eq!(mode(&ws.work), 0o700);
        assert_eq!(mode(&ws.dir.path.join(OWNER_FILE)), 0o600);
    }

    #[test]
    fn a_swept_and_remade_attempt_directory_fails_closed() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = attempt(tmp.path(), &[("a.txt", "a"), ("b.txt", "b")]);
        fs::write(ws.work.join("a.txt"), "edited").unwrap();
        assert_eq!(ws.changes(None, None).unwrap().changed.len(), 1);

        // Swept while the body ran; a body then makes its folder again with only its output.
        let path = ws.dir.path.clone();
        fs::remove_dir_all(&path).unwrap();
        fs::create_dir_all(&ws.work).unwrap();
        fs::write(ws.work.join("a.txt"), "edited").unwrap();
        let reason = message(ws.changes(None, None));
        assert!(
            reason.starts_with(&format!(
                "the attempt directory {} is no longer the one this executor created and filled: {} was removed and made again",
                path.display(),
                path.display()
            )),
            "{reason}"
        );
        assert!(reason.ends_with("nothing was published"), "{reason}");

        // Even an owner file put back by hand is not the one written.
        fs::write(path.join(OWNER_FILE), "{}").unwrap();
        assert!(message(ws.changes(None, None)).contains("was removed and made again"));
    }

    #[test]
    fn an_attempt_directory_with_a_foreign_owner_file_fails_closed() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = attempt(tmp.path(), &[("a.txt", "a")]);
        ws.changes(None, None).unwrap();
        fs::write(ws.dir.path.join(OWNER_FILE), "{}").unwrap();
        assert!(message(ws.changes(None, None)).contains("its .perago-owner file was rewritten"),);
        fs::remove_file(ws.dir.path.join(OWNER_FILE)).unwrap();
        assert!(message(ws.changes(None, None)).contains("its .perago-owner file is gone"));
    }
}
