//! Where `status` with no argument finds this user's running runtimes: each supervisor writes
//! `<state home>/perago/supervisors/<pid>.json` (the folder 0700, the file 0600) naming its
//! task types and their broker sockets, and removes it when it exits. A file whose supervisor
//! is gone (it was SIGKILLed, or its pid now belongs to another process: the file records the
//! process's start time) is ignored and removed by the next reader.
//!
//! The folder is trusted only when it is this user's own real directory, open to no one else
//! (see [`RecordsDir::open`]); it is then held open and used only through its descriptor, so a
//! symlink or another folder swapped in later changes nothing. A record is read only when it
//! is a regular file of this user, at most [`MAX_RECORD_BYTES`]: another user's file could
//! point `status --probe` at a socket of theirs.

use perago_sys::{fd::dir::Dir, user::euid};
use serde::{Deserialize, Serialize};
use std::{
    collections::BTreeMap,
    ffi::{OsStr, OsString},
    fs,
    io::{self, Write as _},
    os::unix::fs::{DirBuilderExt as _, MetadataExt as _},
    path::{Path, PathBuf},
};

/// The largest record read: a record names a few task types and their sockets.
pub(crate) const MAX_RECORD_BYTES: u64 = 64 * 1024;

/// One runtime of a supervisor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Entry {
    /// The task type.
    pub(crate) task: String,
    /// Its broker's socket.
    pub(crate) socket: PathBuf,
}

/// A supervisor's file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Record {
    pub(crate) pid: u32,
    /// The process's start time (`/proc/<pid>/stat` field 22), against pid reuse.
    pub(crate) started: u64,
    pub(crate) runtimes: Vec<Entry>,
}

/// Why the records folder is not used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FolderError {
    /// It cannot be created or opened (a symlink or a file in its place is refused here).
    #[error("cannot use {} as the supervisors' records folder: {cause}", dir.display())]
    Open {
        dir: PathBuf,
        /// What is wrong, in words.
        cause: String,
    },
    /// Another user owns it.
    #[error(
        "the supervisors' records folder {} is owned by uid {owner}, not this user (uid {me}): it is not used",
        dir.display()
    )]
    NotOwned { dir: PathBuf, owner: u32, me: u32 },
    /// Group or others may use it.
    #[error(
        "the supervisors' records folder {} has mode {mode:04o}, open to other users (it must be 0700): it is not used",
        dir.display()
    )]
    OpenToOthers { dir: PathBuf, mode: u32 },
}

/// The folder of the supervisors' files.
pub(crate) fn dir(vars: &BTreeMap<String, String>) -> PathBuf {
    super::root::state_home(vars)
        .join("perago")
        .join("supervisors")
}

/// The start time of `pid`, `None` if it is not running.
fn start_time(pid: u32) -> Option<u64> {
    perago_sys::proc::stat(pid)
        .filter(|s| s.state != 'Z')
        .and_then(|s| s.start_time)
}

/// The records folder, checked and held open.
#[derive(Debug)]
pub(crate) struct RecordsDir {
    path: PathBuf,
    dir: Dir,
}

impl RecordsDir {
    /// Opens `path` if it is this user's own real directory that no other user may use: opened
    /// without following a symlink, then checked by `fstat` on the descriptor. `Ok(None)`
    /// when it does not exist.
    pub(crate) fn open(path: &Path) -> Result<Option<Self>, FolderError> {
        let dir = match Dir::open(path) {
            Ok(dir) => dir,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                let cause = match fs::symlink_metadata(path) {
                    Ok(meta) if meta.file_type().is_symlink() => {
                        "it is a symlink, not a real directory".to_owned()
                    }
                    Ok(meta) if !meta.is_dir() => "it is not a directory".to_owned(),
                    _ => perago_core::errors::chain(&e),
                };
                return Err(FolderError::Open {
                    dir: path.to_owned(),
                    cause,
                });
            }
        };
        let meta = dir.stat().map_err(|e| FolderError::Open {
            dir: path.to_owned(),
            cause: perago_core::errors::chain(&e),
        })?;
        let me = euid();
        if meta.uid != me {
            return Err(FolderError::NotOwned {
                dir: path.to_owned(),
                owner: meta.uid,
                me,
            });
        }
        if meta.mode & 0o077 != 0 {
            return Err(FolderError::OpenToOthers {
                dir: path.to_owned(),
                mode: meta.mode,
            });
        }
        Ok(Some(Self {
            path: path.to_owned(),
            dir,
        }))
    }

    /// Creates `path` (and its parents) as 0700 if missing, then [`RecordsDir::open`]s it.
    pub(crate) fn create(path: &Path) -> Result<Self, FolderError> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)
            .map_err(|e| FolderError::Open {
                dir: path.to_owned(),
                cause: perago_core::errors::chain(&e),
            })?;
        Self::open(path)?.ok_or_else(|| FolderError::Open {
            dir: path.to_owned(),
            cause: "it disappeared after it was created".to_owned(),
        })
    }

    /// The folder's path, for messages.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

/// This supervisor's file, removed when dropped.
#[derive(Debug)]
pub(crate) struct Registration {
    dir: RecordsDir,
    name: OsString,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let _ = self.dir.dir.unlink_at(&self.name);
    }
}

/// Why this supervisor could not be recorded.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RegisterError {
    #[error(transparent)]
    Folder(#[from] FolderError),
    #[error("cannot write a record in {}", dir.display())]
    Write {
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Writes this supervisor's file under `path`, through the checked folder.
pub(crate) fn register(path: &Path, runtimes: Vec<Entry>) -> Result<Registration, RegisterError> {
    let dir = RecordsDir::create(path)?;
    let pid = std::process::id();
    let record = Record {
        pid,
        started: start_time(pid).unwrap_or_default(),
        runtimes,
    };
    let name = OsString::from(format!("{pid}.json"));
    let tmp = OsString::from(format!(".{pid}.json.tmp"));
    let write = || -> io::Result<()> {
        match dir.dir.unlink_at(&tmp) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let mut file = dir.dir.create_new(&tmp, 0o600)?;
        file.write_all(&serde_json::to_vec(&record).expect("a record serializes"))?;
        dir.dir.rename_at(&tmp, &name)
    };
    write().map_err(|source| RegisterError::Write {
        dir: path.to_owned(),
        source,
    })?;
    Ok(Registration { dir, name })
}

/// What [`running`] found.
#[derive(Debug, Default)]
pub(crate) struct Found {
    /// The records of the supervisors still running, by pid.
    pub(crate) records: Vec<Record>,
    /// Files that were not used, and why (another user's, not a regular file, too big, …).
    pub(crate) skipped: Vec<String>,
}

/// Reads one record of `dir`: a regular file of this user within [`MAX_RECORD_BYTES`].
fn read_record(dir: &Dir, name: &OsStr) -> Result<Record, String> {
    let file = dir
        .open_file(name)
        .map_err(|e| perago_core::errors::chain(&e))?;
    let meta = file
        .metadata()
        .map_err(|e| perago_core::errors::chain(&e))?;
    if meta.is_file() && meta.uid() != euid() {
        return Err(format!(
            "owned by uid {}, not this user (uid {})",
            meta.uid(),
            euid()
        ));
    }
    let text = perago_core::files::read_open_regular(file, MAX_RECORD_BYTES)
        .map_err(|e| perago_core::errors::chain(&e))?;
    serde_json::from_str(&text)
        .map_err(|e| format!("not a record: {}", perago_core::errors::DisplayChain(&e)))
}

/// The records of the supervisors still running in the checked folder at `path` (none when
/// it does not exist); the files of those gone are removed, those that are not this user's
/// regular records are left alone and named in [`Found::skipped`].
pub(crate) fn running(path: &Path) -> Result<Found, FolderError> {
    let Some(dir) = RecordsDir::open(path)? else {
        return Ok(Found::default());
    };
    let mut found = Found::default();
    let Ok(names) = dir.dir.entries() else {
        return Ok(found);
    };
    for name in names {
        let text = name.to_string_lossy();
        if text.starts_with('.') || !text.ends_with(".json") {
            continue;
        }
        match read_record(&dir.dir, &name) {
            Ok(record) if start_time(record.pid) == Some(record.started) => {
                found.records.push(record);
            }
            Ok(_) => {
                let _ = dir.dir.unlink_at(&name);
            }
            Err(why) => found
                .skipped
                .push(format!("{}: {why}", dir.path().join(&name).display())),
        }
    }
    found.records.sort_by_key(|r| r.pid);
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registration_lists_the_runtimes_until_dropped_and_stale_files_are_removed() {
        let home = tempfile::tempdir().unwrap();
        let dir = home.path().join("perago/supervisors");
        let runtimes = vec![
            Entry {
                task: "a".into(),
                socket: "/run/a/broker.sock".into(),
            },
            Entry {
                task: "b".into(),
                socket: "/run/b/broker.sock".into(),
            },
        ];
        let registration = register(&dir, runtimes.clone()).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(
            mode(&dir.join(format!("{}.json", std::process::id()))),
            0o600
        );
        // A supervisor that died without removing its file: pid 1's start time is not 0.
        let stale = dir.join("1.json");
        fs::write(
            &stale,
            serde_json::to_vec(&Record {
                pid: 1,
                started: 0,
                runtimes: Vec::new(),
            })
            .unwrap(),
        )
        .unwrap();
        let found = running(&dir).unwrap().records;
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].pid, std::process::id());
        assert_eq!(found[0].runtimes, runtimes);
        assert!(!stale.exists(), "a stale file is removed");
        drop(registration);
        assert!(running(&dir).unwrap().records.is_empty());
        assert!(
            running(&home.path().join("nothing"))
                .unwrap()
                .records
                .is_empty()
        );
    }

    fn record(pid: u32, started: u64, socket: &str) -> Vec<u8> {
        serde_json::to_vec(&Record {
            pid,
            started,
            runtimes: vec![Entry {
                task: "t".into(),
                socket: socket.into(),
            }],
        })
        .unwrap()
    }

    /// The current process's record as another process could forge it: it names a live pid.
    fn live_record(socket: &str) -> Vec<u8> {
        let pid = std::process::id();
        record(pid, start_time(pid).unwrap(), socket)
    }

    #[test]
    fn a_symlinked_folder_is_neither_written_through_nor_cleaned_through() {
        use std::os::unix::fs::PermissionsExt as _;
        let home = tempfile::tempdir().unwrap();
        let elsewhere = home.path().join("elsewhere");
        fs::create_dir(&elsewhere).unwrap();
        fs::set_permissions(&elsewhere, fs::Permissions::from_mode(0o700)).unwrap();
        // A stale record there, which a reader through the link would have removed.
        fs::write(elsewhere.join("1.json"), record(1, 0, "/x")).unwrap();
        let dir = home.path().join("perago/supervisors");
        fs::create_dir_all(dir.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &dir).unwrap();
        let err = register(&dir, Vec::new()).unwrap_err().to_string();
        assert!(
            err.contains("it is a symlink, not a real directory"),
            "{err}"
        );
        let err = running(&dir).unwrap_err().to_string();
        assert!(
            err.contains("it is a symlink, not a real directory"),
            "{err}"
        );
        let mut left: Vec<_> = fs::read_dir(&elsewhere)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        left.sort();
        assert_eq!(
            left,
            vec![OsString::from("1.json")],
            "nothing written or removed"
        );
    }

    #[test]
    fn a_folder_open_to_others_or_owned_by_another_user_is_not_used() {
        use std::os::unix::fs::PermissionsExt as _;
        let home = tempfile::tempdir().unwrap();
        let dir = home.path().join("supervisors");
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(dir.join("9.json"), live_record("/attacker.sock")).unwrap();
        let err = running(&dir).unwrap_err();
        assert!(
            matches!(err, FolderError::OpenToOthers { mode: 0o755, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("has mode 0755"), "{err}");
        assert!(matches!(
            register(&dir, Vec::new()),
            Err(RegisterError::Folder(FolderError::OpenToOthers { .. }))
        ));
        if euid() == 0 {
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
            std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
            let err = running(&dir).unwrap_err();
            assert!(
                matches!(
                    err,
                    FolderError::NotOwned {
                        owner: 65534,
                        me: 0,
                        ..
                    }
                ),
                "{err}"
            );
            assert!(matches!(
                register(&dir, Vec::new()),
                Err(RegisterError::Folder(FolderError::NotOwned { .. }))
            ));
        }
    }

    #[test]
    fn records_that_are_not_this_users_regular_files_are_skipped_and_left_alone() {
        let home = tempfile::tempdir().unwrap();
        let dir = home.path().join("supervisors");
        let registration = register(&dir, Vec::new()).unwrap();
        // A FIFO: reading it must not wait for a writer.
        let fifo = dir.join("2.json");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        // Far over the limit.
        let big = dir.join("3.json");
        fs::write(&big, vec![b' '; MAX_RECORD_BYTES as usize + 1]).unwrap();
        // A symlink to a record elsewhere.
        let outside = home.path().join("outside.json");
        fs::write(&outside, live_record("/attacker.sock")).unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("4.json")).unwrap();
        let started = std::time::Instant::now();
        let found = running(&dir).unwrap();
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        assert_eq!(
            found.records.len(),
            1,
            "only this supervisor's own: {found:?}"
        );
        assert_eq!(found.skipped.len(), 3, "{found:?}");
        let skipped = found.skipped.join("\n");
        assert!(
            skipped.contains("2.json: a FIFO (only regular files are read)"),
            "{skipped}"
        );
        assert!(
            skipped.contains("3.json: 65537 bytes is above the limit of 65536 bytes"),
            "{skipped}"
        );
        assert!(skipped.contains("4.json: "), "{skipped}");
        assert!(fifo.exists() && big.exists() && outside.exists());
        if euid() == 0 {
            // Another user's record naming a live supervisor and their socket.
            let forged = dir.join("5.json");
            fs::write(&forged, live_record("/attacker.sock")).unwrap();
            std::os::unix::fs::chown(&forged, Some(65534), Some(65534)).unwrap();
            let found = running(&dir).unwrap();
            assert!(
                found.records.iter().all(|r| r
                    .runtimes
                    .iter()
                    .all(|e| e.socket != Path::new("/attacker.sock"))),
                "{found:?}"
            );
            assert!(
                found
                    .skipped
                    .iter()
                    .any(|s| s.contains("5.json: owned by uid 65534, not this user (uid 0)")),
                "{found:?}"
            );
            assert!(forged.exists(), "another user's file is not removed");
        }
        drop(registration);
    }
}
