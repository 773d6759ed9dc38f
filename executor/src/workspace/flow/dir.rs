//! The attempt directory and its owner file, for the supervisor's GC.

use super::*;
use perago_core::owner::AttemptOwner;
use std::{
    fs,
    os::unix::fs::DirBuilderExt as _,
    path::{Path, PathBuf},
    time::{SystemTime, UNIX_EPOCH},
};

/// Who owns an attempt directory, for the supervisor's GC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    /// The slot.
    pub slot: u32,
    /// Its generation.
    pub generation: u64,
}

pub use perago_core::owner::OWNER_FILE;

/// Seconds since the epoch.
pub(super) fn now_secs() -> u64 {
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
    pub(super) path: PathBuf,
    pub(super) work: PathBuf,
    pub(super) owner: AttemptOwner,
    pub(super) owner_text: String,
    pub(super) handles: [(PathBuf, fs::File); 2],
}

pub(super) fn identity(meta: &fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt as _;
    (meta.dev(), meta.ino())
}

pub(super) fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
}

/// Writes `text` to `path` (created or truncated) readable by the executor's user only.
pub(super) fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
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
    pub(super) fn record(
        &mut self,
        change: impl FnOnce(&mut AttemptOwner),
    ) -> Result<(), WorkspaceFailure> {
        let mut owner = self.owner.clone();
        change(&mut owner);
        let text = owner.to_text();
        let temporary = self.path.join(format!("{OWNER_FILE}.new"));
        write_private(&temporary, &text)
            .and_then(|()| fs::rename(&temporary, self.path.join(OWNER_FILE)))
            .map_err(|source| WorkspaceFailure::OwnerFile {
                file: self.path.join(OWNER_FILE),
                cause: source,
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
                        cause: source,
                    }));
                }
            }
        }
        match fs::read_to_string(self.path.join(OWNER_FILE)) {
            Ok(text) if text == self.owner_text => Ok(()),
            Ok(_) => Err(gone(DirChange::OwnerRewritten)),
            Err(cause) => Err(gone(DirChange::OwnerGone { cause })),
        }
    }
}
