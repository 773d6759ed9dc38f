//! The result journal (issue #23, item 4): a result the broker is about to report is written
//! to `<workspace root>/journal/<task type>/<execution id>.entry` first and removed once
//! Conductor took the update (or refused it for good). A runtime killed in between (the broker
//! SIGKILLed, the supervisor with it, Conductor unreachable to the end) leaves the entry; the
//! next runtime on the root (the root's lock makes it the only one) replays it before it
//! polls, and reports it only if a fresh read of the task shows the same attempt still
//! `IN_PROGRESS` with the same retry count: at least once, never exactly once.
//!
//! The folders are 0700 and the files 0600, this user's own; everything is reached through
//! descriptors held from the start ([`Dir`]: `openat` with `O_NOFOLLOW`), never by a path
//! resolved again. An entry is written to a temporary name and renamed into place, so a reader
//! never sees half of one; it is not fsync'd (a SIGKILLed process leaves the page cache to the
//! kernel, which writes it) except for a workspace task whose merge landed, where losing the
//! result loses a publication's report: there the file and the folder are flushed before the
//! first update goes out. The journal is bounded ([`MAX_ENTRIES`], [`MAX_ENTRY_BYTES`],
//! [`MAX_TOTAL_BYTES`]): past a bound a result is reported without an entry, with one warning.
//! No line of this module logs a result's content.

use perago_core::{
    attempt::{AttemptSnapshot, TaskStatus},
    backoff::Backoff,
    conductor::{ConductorClient, ConductorError},
    process::{
        dirfd::{Dir, EntryKind},
        euid,
    },
};
use serde_json::{Value, json};
use std::{
    ffi::{OsStr, OsString},
    io::{self, Write as _},
    path::{Path, PathBuf},
    sync::{
        Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};
use tracing::Instrument as _;

/// The most entries kept at once.
pub(crate) const MAX_ENTRIES: usize = 10_000;
/// The most one entry takes: a result as large as a slot message carries, and its header.
pub(crate) const MAX_ENTRY_BYTES: usize = perago_proto::MAX_SLOT_MESSAGE_BYTES + (64 << 10);
/// The most all entries take together.
pub(crate) const MAX_TOTAL_BYTES: u64 = 1 << 30;
/// How long the replay at start may take before polling starts anyway; entries it could not
/// settle in that time (Conductor does not answer) stay for the next start.
pub(crate) const REPLAY_PATIENCE: Duration = Duration::from_secs(30);

/// The journal's folder under the workspace root.
const JOURNAL_DIR: &str = "journal";
/// The format of an entry's header line.
const FORMAT: u64 = 1;
const SUFFIX: &str = ".entry";
const TMP_PREFIX: &str = ".tmp-";
/// The longest execution id used as a file name.
const MAX_ID_CHARS: usize = 128;

/// Why the journal cannot be used (results are then reported without it).
#[derive(Debug, thiserror::Error)]
pub(crate) enum JournalError {
    /// A folder cannot be created or opened (a symlink in its place is refused).
    #[error("cannot open the result journal folder {}: {source}", path.display())]
    Open {
        /// The folder.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A folder belongs to another user.
    #[error(
        "the result journal folder {} is owned by uid {owner}, not this user (uid {me})",
        path.display()
    )]
    NotOwned {
        /// The folder.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// This process's user.
        me: u32,
    },
}

/// What an entry says about its result, besides the update body itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Header {
    /// The Conductor task type (the journal folder's name).
    pub(crate) task_type: String,
    pub(crate) task_id: String,
    pub(crate) workflow_instance_id: String,
    /// The attempt's `retryCount`: with the task id, the fence at replay.
    pub(crate) retry_count: u32,
    pub(crate) execution_id: String,
    /// The executor's worker id, the result's.
    pub(crate) worker_id: String,
    /// `COMPLETED`, `FAILED` or `FAILED_WITH_TERMINAL_ERROR`.
    pub(crate) status: String,
    /// The lakeFS commit a workspace task published, if any.
    pub(crate) published_commit: Option<String>,
}

impl Header {
    fn to_line(&self) -> String {
        json!({
            "format": FORMAT,
            "taskType": self.task_type,
            "taskId": self.task_id,
            "workflowInstanceId": self.workflow_instance_id,
            "retryCount": self.retry_count,
            "executionId": self.execution_id,
            "workerId": self.worker_id,
            "status": self.status,
            "publishedCommit": self.published_commit,
        })
        .to_string()
    }

    fn parse(line: &str) -> Result<Self, String> {
        let value: Value =
            serde_json::from_str(line).map_err(|e| format!("header is not JSON: {e}"))?;
        let text = |name: &str| -> Result<String, String> {
            value
                .get(name)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .ok_or_else(|| format!("header has no {name}"))
        };
        match value.get("format").and_then(Value::as_u64) {
            Some(FORMAT) => {}
            other => return Err(format!("header format {other:?} is not {FORMAT}")),
        }
        let retry_count = value
            .get("retryCount")
            .and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
            .ok_or("header has no retryCount")?;
        let published_commit = match value.get("publishedCommit") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return Err("header publishedCommit is not text".into()),
        };
        Ok(Self {
            task_type: text("taskType")?,
            task_id: text("taskId")?,
            workflow_instance_id: text("workflowInstanceId")?,
            retry_count,
            execution_id: text("executionId")?,
            worker_id: text("workerId")?,
            status: text("status")?,
            published_commit,
        })
    }
}

/// An entry as read back: its header and the update body (a Conductor `TaskResult`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Entry {
    pub(crate) header: Header,
    pub(crate) body: Value,
}

/// The bytes of an entry: the header line, then the update body as it is sent.
fn encode(header: &Header, body: &[u8]) -> Vec<u8> {
    let line = header.to_line();
    let mut bytes = Vec::with_capacity(line.len() + 1 + body.len());
    bytes.extend_from_slice(line.as_bytes());
    bytes.push(b'\n');
    bytes.extend_from_slice(body);
    bytes
}

/// Reads an entry back, checking that its body is the update its header describes.
fn decode(text: &str) -> Result<Entry, String> {
    let (line, body) = text
        .split_once('\n')
        .ok_or("no header line (a write cut short?)")?;
    let header = Header::parse(line)?;
    let body: Value =
        serde_json::from_str(body).map_err(|e| format!("update body is not JSON: {e}"))?;
    let field = |name: &str| body.get(name).and_then(Value::as_str);
    for (name, expected) in [
        ("taskId", header.task_id.as_str()),
        ("workflowInstanceId", header.workflow_instance_id.as_str()),
        ("workerId", header.worker_id.as_str()),
        ("status", header.status.as_str()),
    ] {
        if field(name) != Some(expected) {
            return Err(format!(
                "update body's {name} is not the header's ({expected:?})"
            ));
        }
    }
    if !matches!(
        header.status.as_str(),
        "COMPLETED" | "FAILED" | "FAILED_WITH_TERMINAL_ERROR"
    ) {
        return Err(format!("status {:?} is not a final one", header.status));
    }
    Ok(Entry { header, body })
}

/// An execution id usable as a file name (the broker makes UUIDs).
fn entry_name(execution_id: &str) -> Option<OsString> {
    let plain = !execution_id.is_empty()
        && execution_id.len() <= MAX_ID_CHARS
        && execution_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    plain.then(|| OsString::from(format!("{execution_id}{SUFFIX}")))
}

/// Creates (0700) or opens the folder `name` in `parent`: this user's own, closed to others
/// (a folder of ours left open is closed again; another user's is refused).
fn own_dir(parent: &Dir, parent_path: &Path, name: &str) -> Result<Dir, JournalError> {
    let path = parent_path.join(name);
    let open = |source| JournalError::Open {
        path: path.clone(),
        source,
    };
    match parent.create_dir_at(name.as_ref(), 0o700) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(open(e)),
        _ => {}
    }
    let dir = parent.open_dir(name.as_ref()).map_err(open)?;
    let stat = dir.stat().map_err(open)?;
    let me = euid();
    if stat.uid != me {
        return Err(JournalError::NotOwned {
            path,
            owner: stat.uid,
            me,
        });
    }
    if stat.mode & 0o077 != 0 {
        dir.chmod(0o700).map_err(open)?;
    }
    Ok(dir)
}

/// An entry written, to remove once its update is settled.
#[derive(Debug)]
pub(crate) struct Written {
    name: OsString,
    bytes: u64,
}

#[derive(Debug, Default)]
struct Usage {
    entries: usize,
    bytes: u64,
}

/// One task type's journal, held open.
#[derive(Debug)]
pub(crate) struct Journal {
    path: PathBuf,
    /// `<root>/journal`: the other task types' folders are beside ours.
    top: Dir,
    dir: Dir,
    task_type: String,
    usage: Mutex<Usage>,
    /// A result was not journaled (a bound, or a write failed): said once until one is again.
    refusing: AtomicBool,
    /// Limits of this journal (the constants, smaller in tests).
    max_entries: usize,
    max_total_bytes: u64,
}

impl Journal {
    /// Opens (creating as needed) the journal of `task_type` under the workspace `root`.
    pub(crate) fn open(root: &Path, task_type: &str) -> Result<Self, JournalError> {
        let root_dir = Dir::open(root).map_err(|source| JournalError::Open {
            path: root.to_owned(),
            source,
        })?;
        let top = own_dir(&root_dir, root, JOURNAL_DIR)?;
        let top_path = root.join(JOURNAL_DIR);
        let dir = own_dir(&top, &top_path, task_type)?;
        let path = top_path.join(task_type);
        let mut usage = Usage::default();
        for name in dir.entries().unwrap_or_default() {
            if let Ok(stat) = dir.stat_at(&name) {
                usage.entries += 1;
                usage.bytes += stat.size;
            }
        }
        Ok(Self {
            path,
            top,
            dir,
            task_type: task_type.to_owned(),
            usage: Mutex::new(usage),
            refusing: AtomicBool::new(false),
            max_entries: MAX_ENTRIES,
            max_total_bytes: MAX_TOTAL_BYTES,
        })
    }

    /// The task type journaled.
    pub(crate) fn task_type(&self) -> &str {
        &self.task_type
    }

    /// The journal's folder, for messages.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    fn usage(&self) -> std::sync::MutexGuard<'_, Usage> {
        self.usage
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Says once (until a result is journaled again) that results go unjournaled.
    fn refuse(&self, why: &str) {
        if !self.refusing.swap(true, Ordering::Relaxed) {
            tracing::warn!(journal = %self.path.display(), "results are reported without a journal entry from now on: {why}; a runtime killed before Conductor takes such an update loses it");
        }
    }

    /// Writes the entry of a result about to be reported; `durable`: flushed to the disk
    /// (file and folder) before returning. `None` when it was not written (a bound, a bad
    /// execution id, a failed write: said once).
    pub(crate) fn record(&self, header: &Header, body: &[u8], durable: bool) -> Option<Written> {
        let Some(name) = entry_name(&header.execution_id) else {
            tracing::warn!("result not journaled: its execution id is not a plain name");
            return None;
        };
        let bytes = encode(header, body);
        let size = bytes.len() as u64;
        if bytes.len() > MAX_ENTRY_BYTES {
            self.refuse(&format!(
                "a result of {size} bytes is above the entry limit of {MAX_ENTRY_BYTES} bytes"
            ));
            return None;
        }
        {
            let mut usage = self.usage();
            if usage.entries >= self.max_entries {
                drop(usage);
                self.refuse(&format!(
                    "the journal holds {} entries, its limit",
                    self.max_entries
                ));
                return None;
            }
            if usage.bytes + size > self.max_total_bytes {
                drop(usage);
                self.refuse(&format!(
                    "the journal would hold more than {} bytes, its limit",
                    self.max_total_bytes
                ));
                return None;
            }
            usage.entries += 1;
            usage.bytes += size;
        }
        let mut tmp = OsString::from(TMP_PREFIX);
        tmp.push(&name);
        let write = || -> io::Result<()> {
            match self.dir.unlink_at(&tmp) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            let mut file = self.dir.create_new(&tmp, 0o600)?;
            file.write_all(&bytes)?;
            if durable {
                file.sync_data()?;
            }
            drop(file);
            self.dir.rename_at(&tmp, &name)?;
            if durable {
                self.dir.sync()?;
            }
            Ok(())
        };
        match write() {
            Ok(()) => {
                if self.refusing.swap(false, Ordering::Relaxed) {
                    tracing::info!(journal = %self.path.display(), "results are journaled again");
                }
                Some(Written { name, bytes: size })
            }
            Err(e) => {
                let _ = self.dir.unlink_at(&tmp);
                self.release(size);
                self.refuse(&format!("cannot write an entry: {e}"));
                None
            }
        }
    }

    fn release(&self, bytes: u64) {
        let mut usage = self.usage();
        usage.entries = usage.entries.saturating_sub(1);
        usage.bytes = usage.bytes.saturating_sub(bytes);
    }

    /// Removes an entry written by [`Journal::record`]: its update is settled.
    pub(crate) fn remove(&self, written: Written) {
        self.remove_name(&written.name, written.bytes);
    }

    fn remove_name(&self, name: &OsStr, bytes: u64) {
        match self.dir.unlink_at(name) {
            Ok(()) => self.release(bytes),
            Err(e) if e.kind() == io::ErrorKind::NotFound => self.release(bytes),
            Err(e) => {
                tracing::warn!(error = %e, entry = ?name, journal = %self.path.display(), "cannot remove a settled journal entry; the next start will find its attempt settled and drop it");
            }
        }
    }

    /// The names of the entries left (temporary files of a write cut short are removed).
    pub(crate) fn names(&self) -> io::Result<Vec<OsString>> {
        let mut names = Vec::new();
        for name in self.dir.entries()? {
            if name.as_encoded_bytes().starts_with(TMP_PREFIX.as_bytes()) {
                let size = self.dir.stat_at(&name).map_or(0, |s| s.size);
                self.remove_name(&name, size);
            } else {
                names.push(name);
            }
        }
        Ok(names)
    }

    /// Reads the entry `name`: a regular file of this user within [`MAX_ENTRY_BYTES`], of
    /// this task type, named after its execution; else why not.
    pub(crate) fn read(&self, name: &OsStr) -> Result<Entry, String> {
        let file = self.dir.open_file(name).map_err(|e| e.to_string())?;
        let stat = perago_core::process::dirfd::fstat(std::os::fd::AsFd::as_fd(&file))
            .map_err(|e| e.to_string())?;
        if stat.kind != EntryKind::File {
            return Err("not a regular file".into());
        }
        if stat.uid != euid() {
            return Err(format!(
                "owned by uid {}, not this user (uid {})",
                stat.uid,
                euid()
            ));
        }
        let text = perago_core::files::read_open_regular(file, MAX_ENTRY_BYTES as u64)
            .map_err(|e| e.to_string())?;
        let entry = decode(&text)?;
        if entry.header.task_type != self.task_type {
            return Err(format!(
                "an entry of task type {:?}, not {:?}",
                entry.header.task_type, self.task_type
            ));
        }
        if entry_name(&entry.header.execution_id).as_deref() != Some(name) {
            return Err("its name is not its execution id's".into());
        }
        Ok(entry)
    }

    /// Removes the entry `name` that cannot be used.
    fn discard(&self, name: &OsStr) {
        let size = self.dir.stat_at(name).map_or(0, |s| s.size);
        self.remove_name(name, size);
    }

    /// The other task types with journal folders beside this one (left alone).
    pub(crate) fn other_types(&self) -> Vec<String> {
        self.top
            .entries()
            .unwrap_or_default()
            .into_iter()
            .filter(|name| name.as_os_str() != OsStr::new(&self.task_type))
            .map(|name| name.to_string_lossy().into_owned())
            .collect()
    }
}

/// What to do with a journaled result, given the task as Conductor has it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The attempt is still in progress: report the result.
    Report,
    /// Drop the entry, for this reason.
    Drop(String),
}

/// The fence of a replay: report only if `task` (a fresh `GET /tasks/{id}`) is the journaled
/// attempt — same task id, workflow and type — still `IN_PROGRESS` with the same retry count.
pub(crate) fn verdict(header: &Header, task: &Value) -> Verdict {
    let fresh = match AttemptSnapshot::from_conductor(task) {
        Ok(fresh) => fresh,
        Err(e) => return Verdict::Drop(format!("Conductor's answer is not a task: {e}")),
    };
    if fresh.task_id != header.task_id {
        return Verdict::Drop(format!(
            "Conductor answered with task {:?}, not this one",
            fresh.task_id
        ));
    }
    if fresh.workflow_instance_id != header.workflow_instance_id {
        return Verdict::Drop(format!(
            "the task belongs to workflow {:?}, not {:?}",
            fresh.workflow_instance_id, header.workflow_instance_id
        ));
    }
    if fresh.task_def_name != header.task_type {
        return Verdict::Drop(format!(
            "the task is of type {:?}, not {:?}",
            fresh.task_def_name, header.task_type
        ));
    }
    if fresh.status != TaskStatus::InProgress {
        return Verdict::Drop(format!(
            "the attempt is {} now, no longer in progress",
            fresh.status.as_str()
        ));
    }
    if fresh.retry_count != header.retry_count {
        return Verdict::Drop(format!(
            "the task is at retry {} now, not {}",
            fresh.retry_count, header.retry_count
        ));
    }
    Verdict::Report
}

/// What a replay did, for its summary line and tests.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Replayed {
    pub(crate) reported: usize,
    pub(crate) dropped: usize,
    pub(crate) discarded: usize,
    pub(crate) left: usize,
}

/// Calls `call` until it succeeds, fails for good, or a retry would pass `deadline`.
async fn until<T, F, Fut>(
    deadline: Instant,
    backoff: &Backoff,
    mut call: F,
) -> Result<T, ConductorError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ConductorError>>,
{
    let mut attempt = 0u32;
    loop {
        match call().await {
            Err(e) if e.is_retryable() => {
                let delay = backoff.delay(attempt);
                if Instant::now() + delay >= deadline {
                    return Err(e);
                }
                tokio::time::sleep(delay).await;
                attempt = attempt.saturating_add(1);
            }
            other => return other,
        }
    }
}

/// Replays the journal before the broker polls: each entry's task is read from Conductor and
/// its result reported only where [`verdict`] says so; the others are dropped, saying why.
/// Entries that cannot be used are removed with a warning; when Conductor does not answer
/// within `patience`, what is left stays for the next start.
pub(crate) async fn replay(
    journal: &Journal,
    client: &ConductorClient,
    backoff: &Backoff,
    patience: Duration,
) -> Replayed {
    let mut done = Replayed::default();
    let others = journal.other_types();
    if !others.is_empty() {
        tracing::warn!(journal = %journal.path().display(), types = ?others, "the result journal holds folders of task types this runtime does not run; they are left for a runtime of those types on this root");
    }
    let names = match journal.names() {
        Ok(names) => names,
        Err(e) => {
            tracing::warn!(error = %e, journal = %journal.path().display(), "cannot list the result journal; nothing replayed");
            return done;
        }
    };
    if names.is_empty() {
        return done;
    }
    tracing::info!(entries = names.len(), journal = %journal.path().display(), "replaying the result journal before polling");
    let deadline = Instant::now() + patience;
    for (n, name) in names.iter().enumerate() {
        let entry = match journal.read(name) {
            Ok(entry) => entry,
            Err(cause) => {
                tracing::warn!(entry = ?name, cause, "removing a journal entry that cannot be used");
                journal.discard(name);
                done.discarded += 1;
                continue;
            }
        };
        let span = tracing::error_span!(
            parent: None,
            "replay",
            task_id = %entry.header.task_id,
            execution_id = %entry.header.execution_id,
            executor_worker_id = %entry.header.worker_id,
        );
        let settled = replay_one(journal, name, entry, client, backoff, deadline)
            .instrument(span)
            .await;
        match settled {
            Some(true) => done.reported += 1,
            Some(false) => done.dropped += 1,
            None => {
                done.left = names.len() - n;
                tracing::warn!(
                    left = done.left,
                    "the result journal cannot be settled now (Conductor did not answer within {}s, or not usably); the entries left are replayed at the next start",
                    patience.as_secs()
                );
                break;
            }
        }
    }
    tracing::info!(
        reported = done.reported,
        dropped = done.dropped,
        unusable = done.discarded,
        left = done.left,
        "result journal replayed"
    );
    done
}

/// One entry: `Some(true)` reported, `Some(false)` dropped, `None` Conductor did not answer.
async fn replay_one(
    journal: &Journal,
    name: &OsStr,
    entry: Entry,
    client: &ConductorClient,
    backoff: &Backoff,
    deadline: Instant,
) -> Option<bool> {
    let Entry { header, body } = entry;
    let status = header.status.as_str();
    let drop_entry = |reason: &str| {
        tracing::warn!(
            status,
            retry_count = header.retry_count,
            "journaled result dropped, not reported: {reason}"
        );
        journal.discard(name);
        Some(false)
    };
    let task = match until(deadline, backoff, || client.get_task(&header.task_id)).await {
        Ok(task) => task,
        Err(e) if e.is_not_found() => return drop_entry("Conductor no longer knows the task"),
        Err(e) if e.is_retryable() => {
            tracing::warn!(error = %e, "cannot read the task of a journaled result");
            return None;
        }
        Err(e) => {
            // Credentials or a garbled answer: nothing shows the attempt settled; kept.
            tracing::warn!(error = %e, "cannot read the task of a journaled result; it stays in the journal");
            return None;
        }
    };
    match verdict(&header, &task) {
        Verdict::Drop(reason) => drop_entry(&reason),
        Verdict::Report => match until(deadline, backoff, || client.update_task(&body)).await {
            Ok(()) => {
                tracing::info!(
                    status,
                    retry_count = header.retry_count,
                    published_commit = header.published_commit.as_deref(),
                    "journaled result reported: the attempt was still in progress"
                );
                journal.discard(name);
                Some(true)
            }
            Err(e) if e.is_retryable() => {
                tracing::warn!(error = %e, "cannot report a journaled result");
                None
            }
            Err(e) => drop_entry(&format!("Conductor refused the update: {e}")),
        },
    }
}

#[cfg(test)]
#[path = "journal_tests.rs"]
mod tests;
