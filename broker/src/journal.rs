//! The result journal (issue #23, item 4): a result the broker is about to report is written
//! to a file of `<workspace root>/journal/<task type>/` first and settled once Conductor took
//! the update (or refused it for good). A runtime killed in between (the broker SIGKILLed, the
//! supervisor with it, Conductor unreachable to the end) leaves the entry; the next runtime on
//! the root (the root's lock makes it the only one) replays it before it polls, and reports it
//! only if a fresh read of the task shows the same attempt still `IN_PROGRESS` with the same
//! retry count: at least once, never exactly once.
//!
//! The folders are 0700 and the files 0600, this user's own; everything is reached through
//! descriptors held from the start ([`Dir`]: `mkdirat`, `openat` with `O_NOFOLLOW`), never by a
//! path resolved again. Files are reused (see [`Journal`]): an entry is one `pwrite` over a
//! free file, settling it one more (a settled file keeps its bytes, up to [`MAX_FREE_BYTES`]
//! for the free files together, so that the next entry takes no new page). An entry is not
//! fsync'd (a SIGKILLed process leaves the page cache to the kernel, which writes it) except
//! for a workspace task whose merge landed, where losing the result loses a publication's
//! report: there the file (and the folder, for a new file) is flushed before the first update
//! goes out. A reader checks each entry whole (its header names the body's length; the body
//! must be the update the header describes), so a write cut short is refused, never reported.
//! The journal is bounded ([`MAX_ENTRIES`] files, [`MAX_ENTRY_BYTES`] each, [`MAX_TOTAL_BYTES`]
//! waiting): past a bound a result is reported without an entry, with one warning. No line of
//! this module logs a result's content.

use perago_core::{
    attempt::{AttemptSnapshot, TaskStatus},
    backoff::Backoff,
    conductor::{ConductorClient, ConductorError},
};
use perago_sys::{
    fd::dir::{Dir, EntryKind},
    user::euid,
};
use serde_json::Value;
use std::{
    ffi::{OsStr, OsString},
    fs::File,
    io,
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
/// The first byte of a settled file (an entry's is `{`).
const SETTLED: u8 = b'#';
/// A settled file holding at most this keeps its bytes (marked) for the next entry.
const KEEP_BYTES: u64 = 64 << 10;
/// Above [`KEEP_BYTES`], a settled file keeps its bytes only while the free files together
/// hold at most this; past it, it is emptied. Writing a big entry over pages a file already
/// has costs a copy; into an emptied file, the kernel first finds and charges new pages (a
/// 1 MiB entry: 0.26 ms at the median and 3–6 ms at times, on the runtime's thread).
pub(crate) const MAX_FREE_BYTES: u64 = 64 << 20;

/// Why the journal cannot be used (results are then reported without it).
#[derive(Debug, thiserror::Error)]
pub(crate) enum JournalError {
    /// A folder cannot be created or opened (a symlink in its place is refused).
    #[error("cannot open the result journal folder {}", path.display())]
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

/// A header line as written: the header's fields borrowed, serialized in this order (no map
/// is built per result).
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct HeaderLine<'a> {
    format: u64,
    body_bytes: usize,
    task_type: &'a str,
    task_id: &'a str,
    workflow_instance_id: &'a str,
    retry_count: u32,
    execution_id: &'a str,
    worker_id: &'a str,
    status: &'a str,
    published_commit: Option<&'a str>,
}

impl Header {
    fn to_line(&self, body_bytes: usize) -> String {
        serde_json::to_string(&HeaderLine {
            format: FORMAT,
            body_bytes,
            task_type: &self.task_type,
            task_id: &self.task_id,
            workflow_instance_id: &self.workflow_instance_id,
            retry_count: self.retry_count,
            execution_id: &self.execution_id,
            worker_id: &self.worker_id,
            status: &self.status,
            published_commit: self.published_commit.as_deref(),
        })
        .expect("a header serializes")
    }

    /// The header of a line, and the length of the body that follows it.
    fn parse(line: &str) -> Result<(Self, usize), String> {
        let value: Value = serde_json::from_str(line).map_err(|e| {
            format!(
                "header is not JSON: {}",
                perago_core::errors::DisplayChain(&e)
            )
        })?;
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
        let body_bytes = value
            .get("bodyBytes")
            .and_then(Value::as_u64)
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n <= MAX_ENTRY_BYTES)
            .ok_or("header has no bodyBytes")?;
        let header = Self {
            task_type: text("taskType")?,
            task_id: text("taskId")?,
            workflow_instance_id: text("workflowInstanceId")?,
            retry_count,
            execution_id: text("executionId")?,
            worker_id: text("workerId")?,
            status: text("status")?,
            published_commit,
        };
        Ok((header, body_bytes))
    }
}

/// An entry as read back: its header and the update body (a Conductor `TaskResult`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Entry {
    pub(crate) header: Header,
    pub(crate) body: Value,
}

/// The bytes of an entry: the header line (which names the body's length), then the update
/// body as it is sent.
fn encode(header: &Header, body: &[u8]) -> Vec<u8> {
    let line = header.to_line(body.len());
    let mut bytes = Vec::with_capacity(line.len() + 1 + body.len());
    bytes.extend_from_slice(line.as_bytes());
    bytes.push(b'\n');
    bytes.extend_from_slice(body);
    bytes
}

/// What a journal file holds.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Read {
    /// A result waiting to be settled.
    Entry(Box<Entry>),
    /// A file whose result was settled (marked, or empty): free.
    Settled,
}

/// Reads a file's bytes back: an entry whose body is the update its header describes, or a
/// settled file. Bytes after the body (of a longer entry the file held before) are ignored.
fn decode(bytes: &[u8]) -> Result<Read, String> {
    if bytes.is_empty() || bytes[0] == SETTLED {
        return Ok(Read::Settled);
    }
    let split = bytes
        .iter()
        .position(|&b| b == b'\n')
        .ok_or("no header line (a write cut short?)")?;
    let line = std::str::from_utf8(&bytes[..split]).map_err(|_| "header is not UTF-8")?;
    let (header, body_len) = Header::parse(line)?;
    let body = bytes[split + 1..]
        .get(..body_len)
        .ok_or("shorter than its header says (a write cut short?)")?;
    let body: Value = serde_json::from_slice(body).map_err(|e| {
        format!(
            "update body is not JSON: {}",
            perago_core::errors::DisplayChain(&e)
        )
    })?;
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
    Ok(Read::Entry(Box::new(Entry { header, body })))
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

/// A journal file this broker created, held open for writing.
#[derive(Debug)]
struct Slot {
    name: OsString,
    file: File,
    /// The bytes it holds (a settled entry's are left, marked, unless emptied: see
    /// [`MAX_FREE_BYTES`]).
    len: u64,
}

/// Which of the `free` files an entry of `size` bytes goes into: the smallest that holds that
/// many already (written over, it takes no new page), else the largest. Only the last 64 of
/// the list are looked at, so thousands of free files (after an outage) are not scanned each
/// time.
fn fitting(free: &[Slot], size: u64) -> Option<usize> {
    let from = free.len().saturating_sub(64);
    let recent = free.iter().enumerate().skip(from);
    recent
        .clone()
        .filter(|(_, slot)| slot.len >= size)
        .min_by_key(|(_, slot)| slot.len)
        .or_else(|| recent.max_by_key(|(_, slot)| slot.len))
        .map(|(at, _)| at)
}

/// An entry written, to remove once its update is settled.
#[derive(Debug)]
pub(crate) struct Written {
    slot: Slot,
    bytes: u64,
}

#[derive(Debug, Default)]
struct Usage {
    /// Files of this journal: holding an entry, or free, or left from before (until settled).
    files: usize,
    /// Bytes of the entries waiting.
    bytes: u64,
    /// Files free to write the next entry into.
    free: Vec<Slot>,
    /// The bytes the free files hold.
    free_bytes: u64,
    /// The number of the next file created.
    next: u64,
}

/// One task type's journal, held open.
///
/// Writing a file per result and unlinking it costs an inode and two folder changes (about
/// 50 µs of kernel time on ext4, a third of the broker's whole cost per task). So files are
/// kept and reused: an entry is written over a free file in place (`pwrite` at 0: its header
/// names its length, and what follows of an earlier longer entry is ignored), and settled by
/// writing one byte, the mark [`SETTLED`], over its first. A file is created only when none is
/// free (as many as updates are in flight at once).
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
    max_free_bytes: u64,
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
        // What an earlier runtime left counts until the replay settles it.
        let mut usage = Usage::default();
        for name in dir.entries().unwrap_or_default() {
            if let Ok(stat) = dir.stat_at(&name) {
                usage.files += 1;
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
            max_free_bytes: MAX_FREE_BYTES,
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

    /// A free file, or a new one (`None` at the bound on files, or when none can be made).
    /// Of the free files, the smallest that holds `size` bytes already, else the largest.
    fn take_slot(&self, size: u64) -> Result<(Slot, bool), String> {
        let next = {
            let mut usage = self.usage();
            if let Some(at) = fitting(&usage.free, size) {
                let slot = usage.free.swap_remove(at);
                usage.free_bytes -= slot.len;
                return Ok((slot, false));
            }
            if usage.files >= self.max_entries {
                return Err(format!(
                    "the journal holds {} files, its limit",
                    self.max_entries
                ));
            }
            usage.files += 1;
            usage.next += 1;
            usage.next
        };
        // A name an earlier runtime's file still holds is skipped.
        let mut n = next;
        for _ in 0..64 {
            let name = OsString::from(format!("{n}{SUFFIX}"));
            match self.dir.create_new(&name, 0o600) {
                Ok(file) => return Ok((Slot { name, file, len: 0 }, true)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    n = {
                        let mut usage = self.usage();
                        usage.next += 1;
                        usage.next
                    };
                }
                Err(e) => {
                    self.usage().files -= 1;
                    return Err(format!(
                        "cannot create an entry file: {}",
                        perago_core::errors::DisplayChain(&e)
                    ));
                }
            }
        }
        self.usage().files -= 1;
        Err("cannot find a free entry file name".into())
    }

    /// Gives a file back: free (settled) when `settled`, else closed and removed.
    fn put_slot(&self, slot: Slot, settled: bool) {
        if settled {
            let mut usage = self.usage();
            usage.free_bytes += slot.len;
            usage.free.push(slot);
            return;
        }
        let _ = self.dir.unlink_at(&slot.name);
        self.usage().files -= 1;
    }

    /// Writes the entry of a result about to be reported; `durable`: flushed to the disk
    /// before returning. `None` when it was not written (a bound, a failed write: said once).
    pub(crate) fn record(&self, header: &Header, body: &[u8], durable: bool) -> Option<Written> {
        use std::os::unix::fs::FileExt as _;
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
            if usage.bytes + size > self.max_total_bytes {
                drop(usage);
                self.refuse(&format!(
                    "the journal would hold more than {} bytes, its limit",
                    self.max_total_bytes
                ));
                return None;
            }
            usage.bytes += size;
        }
        let (mut slot, created) = match self.take_slot(size) {
            Ok(slot) => slot,
            Err(why) => {
                self.release(size);
                self.refuse(&why);
                return None;
            }
        };
        let write = |slot: &mut Slot| -> io::Result<()> {
            slot.file.write_all_at(&bytes, 0)?;
            slot.len = slot.len.max(size);
            if durable {
                slot.file.sync_data()?;
                if created {
                    self.dir.sync()?;
                }
            }
            Ok(())
        };
        match write(&mut slot) {
            Ok(()) => {
                if self.refusing.swap(false, Ordering::Relaxed) {
                    tracing::info!(journal = %self.path.display(), "results are journaled again");
                }
                Some(Written { slot, bytes: size })
            }
            Err(e) => {
                self.put_slot(slot, false);
                self.release(size);
                self.refuse(&format!(
                    "cannot write an entry: {}",
                    perago_core::errors::DisplayChain(&e)
                ));
                None
            }
        }
    }

    fn release(&self, bytes: u64) {
        let mut usage = self.usage();
        usage.bytes = usage.bytes.saturating_sub(bytes);
    }

    /// Settles an entry written by [`Journal::record`]: its update is settled. The file is
    /// marked and kept for the next entry (emptied first if it held many bytes and the free
    /// files hold [`MAX_FREE_BYTES`] already).
    pub(crate) fn remove(&self, written: Written) {
        use std::os::unix::fs::FileExt as _;
        let Written { mut slot, bytes } = written;
        self.release(bytes);
        let room = self.max_free_bytes.saturating_sub(self.usage().free_bytes);
        let mut mark = || -> io::Result<()> {
            slot.file.write_all_at(&[SETTLED], 0)?;
            if slot.len > KEEP_BYTES && slot.len > room {
                slot.file.set_len(0)?;
                slot.len = 0;
            }
            Ok(())
        };
        match mark() {
            Ok(()) => self.put_slot(slot, true),
            Err(e) => {
                tracing::warn!(error = %perago_core::errors::DisplayChain(&e), entry = ?slot.name, journal = %self.path.display(), "cannot mark a settled journal entry; it is removed");
                self.put_slot(slot, false);
            }
        }
    }

    /// The names of the files left by an earlier runtime (read before this one writes any).
    pub(crate) fn names(&self) -> io::Result<Vec<OsString>> {
        self.dir.entries()
    }

    /// Reads the file `name`: a regular file of this user within [`MAX_ENTRY_BYTES`] holding
    /// an entry of this task type, or settled; else why not.
    pub(crate) fn read(&self, name: &OsStr) -> Result<Read, String> {
        use std::io::Read as _;
        if !name.as_encoded_bytes().ends_with(SUFFIX.as_bytes()) {
            return Err("not an entry file".into());
        }
        let file = self
            .dir
            .open_file(name)
            .map_err(|e| perago_core::errors::chain(&e))?;
        let stat = perago_sys::fd::dir::fstat(std::os::fd::AsFd::as_fd(&file))
            .map_err(|e| perago_core::errors::chain(&e))?;
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
        // A settled file may keep a big entry's bytes (see [`MAX_FREE_BYTES`]): its first
        // byte says so, and the rest is not read.
        let mut first = [0u8; 1];
        let n = std::os::unix::fs::FileExt::read_at(&file, &mut first, 0)
            .map_err(|e| perago_core::errors::chain(&e))?;
        if n == 0 || first[0] == SETTLED {
            return Ok(Read::Settled);
        }
        // What follows the entry may be a longer one's tail: read only as much as an entry
        // can take.
        let mut bytes = Vec::new();
        file.take(MAX_ENTRY_BYTES as u64)
            .read_to_end(&mut bytes)
            .map_err(|e| perago_core::errors::chain(&e))?;
        let read = decode(&bytes)?;
        if let Read::Entry(entry) = &read
            && entry.header.task_type != self.task_type
        {
            return Err(format!(
                "an entry of task type {:?}, not {:?}",
                entry.header.task_type, self.task_type
            ));
        }
        Ok(read)
    }

    /// Removes the file `name` left by an earlier runtime: settled, or unusable.
    fn discard(&self, name: &OsStr) {
        let size = self.dir.stat_at(name).map_or(0, |s| s.size);
        match self.dir.unlink_at(name) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(error = %perago_core::errors::DisplayChain(&e), entry = ?name, journal = %self.path.display(), "cannot remove a journal file");
                return;
            }
        }
        let mut usage = self.usage();
        usage.files = usage.files.saturating_sub(1);
        usage.bytes = usage.bytes.saturating_sub(size);
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
        Err(e) => {
            return Verdict::Drop(format!(
                "Conductor's answer is not a task: {}",
                perago_core::errors::DisplayChain(&e)
            ));
        }
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
            tracing::warn!(error = %perago_core::errors::DisplayChain(&e), journal = %journal.path().display(), "cannot list the result journal; nothing replayed");
            return done;
        }
    };
    // Settled files (the earlier runtime's free ones) and unusable ones go first.
    let mut live = Vec::new();
    for name in names {
        match journal.read(&name) {
            Ok(Read::Entry(_)) => live.push(name),
            Ok(Read::Settled) => journal.discard(&name),
            Err(cause) => {
                tracing::warn!(entry = ?name, cause, "removing a journal file that cannot be used");
                journal.discard(&name);
                done.discarded += 1;
            }
        }
    }
    if live.is_empty() {
        return done;
    }
    tracing::info!(entries = live.len(), journal = %journal.path().display(), "replaying the result journal before polling");
    let deadline = Instant::now() + patience;
    for (n, name) in live.iter().enumerate() {
        let entry = match journal.read(name) {
            Ok(Read::Entry(entry)) => *entry,
            Ok(Read::Settled) => {
                journal.discard(name);
                continue;
            }
            Err(cause) => {
                tracing::warn!(entry = ?name, cause, "removing a journal file that cannot be used");
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
                done.left = live.len() - n;
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
            tracing::warn!(error = %perago_core::errors::DisplayChain(&e), "cannot read the task of a journaled result");
            return None;
        }
        Err(e) => {
            // Credentials or a garbled answer: nothing shows the attempt settled; kept.
            tracing::warn!(error = %perago_core::errors::DisplayChain(&e), "cannot read the task of a journaled result; it stays in the journal");
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
                tracing::warn!(error = %perago_core::errors::DisplayChain(&e), "cannot report a journaled result");
                None
            }
            Err(e) => drop_entry(&format!(
                "Conductor refused the update: {}",
                perago_core::errors::DisplayChain(&e)
            )),
        },
    }
}

#[cfg(test)]
#[path = "journal_tests.rs"]
mod tests;
