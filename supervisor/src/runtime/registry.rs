//! Where `status` with no argument finds this user's running runtimes: each supervisor writes
//! `<state home>/perago/supervisors/<pid>.json` (the folder 0700, the file 0600) naming its
//! task types and their broker sockets, and removes it when it exits. A file whose supervisor
//! is gone (it was SIGKILLed, or its pid now belongs to another process: the file records the
//! process's start time) is ignored and removed by the next reader.

use serde::{Deserialize, Serialize};
use std::{
    collections::BTreeMap,
    fs,
    io::{self, Write as _},
    os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
};

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

/// The folder of the supervisors' files.
pub(crate) fn dir(vars: &BTreeMap<String, String>) -> PathBuf {
    super::root::state_home(vars)
        .join("perago")
        .join("supervisors")
}

/// The start time of `pid`, `None` if it is not running.
fn start_time(pid: u32) -> Option<u64> {
    perago_core::process::stat(pid)
        .filter(|s| s.state != 'Z')
        .and_then(|s| s.start_time)
}

/// This supervisor's file, removed when dropped.
#[derive(Debug)]
pub(crate) struct Registration {
    path: PathBuf,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// Writes this supervisor's file under `dir`.
pub(crate) fn register(dir: &Path, runtimes: Vec<Entry>) -> io::Result<Registration> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let pid = std::process::id();
    let record = Record {
        pid,
        started: start_time(pid).unwrap_or_default(),
        runtimes,
    };
    let path = dir.join(format!("{pid}.json"));
    let tmp = dir.join(format!(".{pid}.json.tmp"));
    let _ = fs::remove_file(&tmp);
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(&serde_json::to_vec(&record).expect("a record serializes"))?;
    fs::rename(&tmp, &path)?;
    Ok(Registration { path })
}

/// The records of the supervisors still running, by pid; the files of those gone are removed.
pub(crate) fn running(dir: &Path) -> Vec<Record> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut records = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let Some(record) = fs::read(&path)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<Record>(&bytes).ok())
        else {
            continue;
        };
        if start_time(record.pid) == Some(record.started) {
            records.push(record);
        } else {
            let _ = fs::remove_file(&path);
        }
    }
    records.sort_by_key(|r| r.pid);
    records
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
        let found = running(&dir);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].pid, std::process::id());
        assert_eq!(found[0].runtimes, runtimes);
        assert!(!stale.exists(), "a stale file is removed");
        drop(registration);
        assert!(running(&dir).is_empty());
        assert!(running(&home.path().join("nothing")).is_empty());
    }
}
