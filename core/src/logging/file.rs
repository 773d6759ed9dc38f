//! A worker's JSONL file: appended to by whole lines (one system call for every line a runtime
//! held between two wake-ups), rotated by size, never waited for when it cannot be written.

use super::FILE_NAME;
use std::{
    fs::{self, File, OpenOptions},
    io::{self, Write as _},
    os::fd::{AsFd, BorrowedFd},
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
};

/// JSONL lines this process could not write (every worker of the process: thread mode runs
/// several in one).
static LINES_DROPPED: AtomicU64 = AtomicU64::new(0);

/// How many JSONL lines this process has dropped because they could not be written.
pub fn lines_dropped() -> u64 {
    LINES_DROPPED.load(Ordering::Relaxed)
}

/// Whether a log file's writes fail, so that the change is said once each way.
#[derive(Debug, Default)]
struct DropState {
    /// Lines dropped since the writes started failing; `None` while they work.
    dropping: Option<u64>,
}

/// What to tell stderr about a log file's writes.
#[derive(Debug, PartialEq, Eq)]
enum DropNotice {
    /// The first line dropped (with the error).
    Started(String),
    /// The first line written again after `dropped` lines were lost.
    Recovered { dropped: u64 },
}

impl DropState {
    /// Records the write of `lines` lines; returns what to say, if anything.
    fn record(&mut self, written: &io::Result<()>, lines: u64) -> Option<DropNotice> {
        match (written, &mut self.dropping) {
            (Ok(()), None) => None,
            (Ok(()), dropping @ Some(_)) => {
                let dropped = dropping.take().unwrap_or(0);
                Some(DropNotice::Recovered { dropped })
            }
            (Err(e), None) => {
                self.dropping = Some(lines);
                Some(DropNotice::Started(crate::errors::chain(&e)))
            }
            (Err(_), Some(n)) => {
                *n += lines;
                None
            }
        }
    }
}

/// A file writer that rotates by size.
#[derive(Debug)]
pub struct RotatingFile {
    dir: PathBuf,
    max_bytes: u64,
    max_files: usize,
    file: File,
    size: u64,
    drops: DropState,
    /// A failed write may have left part of a line: the next line starts on a new one.
    torn: bool,
}

/// Opens `path` for appending, created 0600. A symlink in its place is refused (the open
/// would follow it, and the 0600 that follows would be set on whatever it points at), and so
/// is anything but a regular file (a FIFO would block the writer; `O_NONBLOCK` keeps the open
/// itself from blocking, and means nothing for a regular file).
fn open_log(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a regular file", path.display()),
        ));
    }
    Ok(file)
}

/// The file being written now (a signal handler's last write goes to it, unrotated).
impl AsFd for RotatingFile {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

impl RotatingFile {
    /// Opens (appending) `dir/perago.jsonl`, creating `dir`. Logs name tasks, workflows and
    /// body output: the folders are 0700 and the files 0600 (an existing worker folder and
    /// file are closed too), whatever the umask.
    pub fn open(dir: &Path, max_bytes: u64, max_files: usize) -> io::Result<Self> {
        use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        // Through a descriptor of the folder itself: a symlink put in its place is refused,
        // not followed to chmod what it points at.
        perago_sys::fd::dir::Dir::open(dir)?.chmod(0o700)?;
        let file = open_log(&dir.join(FILE_NAME))?;
        file.set_permissions(fs::Permissions::from_mode(0o600))?;
        let size = file.metadata()?.len();
        Ok(Self {
            dir: dir.to_owned(),
            max_bytes,
            max_files: max_files.max(1),
            file,
            size,
            drops: DropState::default(),
            torn: false,
        })
    }

    /// Writes one whole line as [`Self::write_line`] does; a line that cannot be written is
    /// dropped and counted, and the first drop and the first line written after drops are
    /// said on stderr (not through `tracing`: this is the log).
    pub fn write_line_or_drop(&mut self, line: &[u8]) {
        self.write_run_or_drop(line, 1);
    }

    /// Writes `count` whole lines (each ending in `\n`) as [`Self::write_line_or_drop`]
    /// does, in one system call while they fit the current file; across a rotation, line by
    /// line, so that no file grows past the rotation size by more than one line.
    pub fn write_lines_or_drop(&mut self, lines: &[u8], count: u64) {
        if count > 1 && self.size > 0 && self.size + lines.len() as u64 > self.max_bytes {
            for line in lines.split_inclusive(|b| *b == b'\n') {
                self.write_run_or_drop(line, 1);
            }
        } else {
            self.write_run_or_drop(lines, count);
        }
    }

    fn write_run_or_drop(&mut self, lines: &[u8], count: u64) {
        let written = self.write_whole_line(lines);
        if written.is_err() {
            LINES_DROPPED.fetch_add(count, Ordering::Relaxed);
        }
        match self.drops.record(&written, count) {
            None => {}
            Some(DropNotice::Started(problem)) => eprintln!(
                "perago: cannot write the log file {}: {problem}; dropping its lines until \
                 writing works again (counted in perago_log_lines_dropped_total)",
                self.path(0).display()
            ),
            Some(DropNotice::Recovered { dropped }) => eprintln!(
                "perago: writing the log file {} again; {dropped} lines were dropped",
                self.path(0).display()
            ),
        }
    }

    /// [`Self::write_line`], after a newline if an earlier failed write left part of a line.
    fn write_whole_line(&mut self, line: &[u8]) -> io::Result<()> {
        if self.torn {
            self.file.write_all(b"\n")?;
            self.size += 1;
            self.torn = false;
        }
        let before = self.size;
        let written = self.write_line(line);
        if written.is_err()
            && let Ok(meta) = self.file.metadata()
        {
            // Some bytes may have gone out: the file is longer than before the line. (Read
            // only after a failure: the common path costs no system call more.)
            self.torn = meta.len() > before;
            self.size = meta.len();
        }
        written
    }

    fn path(&self, n: usize) -> PathBuf {
        if n == 0 {
            self.dir.join(FILE_NAME)
        } else {
            self.dir.join(format!("{FILE_NAME}.{n}"))
        }
    }

    fn rotate(&mut self) -> io::Result<()> {
        if self.max_files == 1 {
            self.file.set_len(0)?;
        } else {
            let _ = fs::remove_file(self.path(self.max_files - 1));
            for n in (0..self.max_files - 1).rev() {
                let from = self.path(n);
                if from.exists() {
                    fs::rename(&from, self.path(n + 1))?;
                }
            }
            self.file = open_log(&self.path(0))?;
        }
        self.size = 0;
        Ok(())
    }

    /// Writes one whole line, rotating first if it would overflow the current file.
    pub fn write_line(&mut self, line: &[u8]) -> io::Result<()> {
        if self.size > 0 && self.size + line.len() as u64 > self.max_bytes {
            self.rotate()?;
        }
        self.file.write_all(line)?;
        self.size += line.len() as u64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_symlink_in_place_of_a_log_file_or_folder_is_refused_not_followed() {
        use std::os::unix::fs::PermissionsExt as _;
        let tmp = tempfile::tempdir().unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        // Someone else's file, which a log opened through a symlink would append to and close.
        let victim = tmp.path().join("victim");
        fs::write(&victim, "theirs\n").unwrap();
        fs::set_permissions(&victim, fs::Permissions::from_mode(0o644)).unwrap();
        let dir = tmp.path().join("worker_id=w1");
        fs::create_dir(&dir).unwrap();
        std::os::unix::fs::symlink(&victim, dir.join(FILE_NAME)).unwrap();
        let err = RotatingFile::open(&dir, 1000, 2).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ELOOP), "{err}");
        assert_eq!(fs::read_to_string(&victim).unwrap(), "theirs\n");
        assert_eq!(mode(&victim), 0o644);
        // A folder replaced by a symlink to another folder: that folder keeps its mode.
        let other = tmp.path().join("other");
        fs::create_dir(&other).unwrap();
        fs::set_permissions(&other, fs::Permissions::from_mode(0o755)).unwrap();
        let linked = tmp.path().join("worker_id=w2");
        std::os::unix::fs::symlink(&other, &linked).unwrap();
        assert!(RotatingFile::open(&linked, 1000, 2).is_err());
        assert_eq!(mode(&other), 0o755);
        assert!(!other.join(FILE_NAME).exists());
    }

    #[test]
    fn logs_are_readable_by_their_user_only() {
        use std::os::unix::fs::PermissionsExt as _;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("task/worker_id=w1");
        // An earlier, open folder is closed too.
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        let mut f = RotatingFile::open(&dir, 100, 3).unwrap();
        for _ in 0..5 {
            f.write_line(&[b'x'; 60]).unwrap();
        }
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        RotatingFile::open(&tmp.path().join("new/worker_id=w2"), 100, 3).unwrap();
        assert_eq!(mode(&tmp.path().join("new")), 0o700);
        for name in ["perago.jsonl", "perago.jsonl.1", "perago.jsonl.2"] {
            assert_eq!(mode(&dir.join(name)), 0o600, "{name}");
        }
    }

    /// A full log root: the first dropped line is said, the others only counted, and the
    /// first line written again is said with the count; writing never fails the caller.
    #[test]
    fn drops_are_said_once_each_way() {
        let enospc = || Err(io::Error::from_raw_os_error(28));
        let mut state = DropState::default();
        assert_eq!(state.record(&Ok(()), 1), None);
        let started = state.record(&enospc(), 1);
        assert!(
            matches!(&started, Some(DropNotice::Started(e)) if e.contains("No space left on device")),
            "{started:?}"
        );
        for _ in 0..4 {
            assert_eq!(state.record(&enospc(), 1), None, "said once");
        }
        assert_eq!(
            state.record(&Ok(()), 1),
            Some(DropNotice::Recovered { dropped: 5 })
        );
        assert_eq!(state.record(&Ok(()), 1), None);
        assert!(matches!(
            state.record(&enospc(), 1),
            Some(DropNotice::Started(_))
        ));
    }

    /// Lines to a sink that answers ENOSPC (`/dev/full`) are dropped and counted in
    /// `lines_dropped`; the writer goes on.
    #[test]
    fn lines_to_a_full_sink_are_counted_as_dropped() {
        let tmp = tempfile::tempdir().unwrap();
        let mut f = RotatingFile::open(tmp.path(), 1 << 20, 2).unwrap();
        // The sink swapped for /dev/full (opened here, never chmod-ed: it is the system's).
        f.file = OpenOptions::new().append(true).open("/dev/full").unwrap();
        let before = lines_dropped();
        for _ in 0..3 {
            f.write_line_or_drop(b"{\"message\":\"x\"}\n");
        }
        // Other tests of this process may drop lines too: at least ours.
        assert!(lines_dropped() >= before + 3);
        assert_eq!(f.drops.dropping, Some(3));
        // Back on a file: the next line goes in, whole, and ends the drop.
        f.file = open_log(&tmp.path().join(FILE_NAME)).unwrap();
        f.write_line_or_drop(b"{\"message\":\"y\"}\n");
        assert_eq!(f.drops.dropping, None);
        let text = fs::read_to_string(tmp.path().join(FILE_NAME)).unwrap();
        assert!(text.ends_with("{\"message\":\"y\"}\n"), "{text:?}");
    }

    /// A write cut short (part of a line written, then ENOSPC) leaves no torn line in front
    /// of the next one.
    #[test]
    fn a_torn_line_is_ended_before_the_next() {
        let tmp = tempfile::tempdir().unwrap();
        let mut f = RotatingFile::open(tmp.path(), 1 << 20, 2).unwrap();
        f.write_line_or_drop(b"{\"n\":1}\n");
        // What a write cut short leaves: part of a line, the rest refused.
        f.file.write_all(b"{\"n\":").unwrap();
        f.file = OpenOptions::new().append(true).open("/dev/full").unwrap();
        f.write_line_or_drop(b"{\"n\":2}\n");
        f.torn = true;
        f.file = open_log(&tmp.path().join(FILE_NAME)).unwrap();
        f.write_line_or_drop(b"{\"n\":3}\n");
        let text = fs::read_to_string(tmp.path().join(FILE_NAME)).unwrap();
        assert_eq!(text, "{\"n\":1}\n{\"n\":\n{\"n\":3}\n");
    }

    /// Held lines go out in one write while they fit the file; a batch that would cross the
    /// rotation size is written line by line, so rotation happens at a line as before; a
    /// batch that cannot be written counts every line it held.
    #[test]
    fn a_batch_is_one_write_rotated_at_its_lines_and_dropped_by_its_lines() {
        let tmp = tempfile::tempdir().unwrap();
        let mut f = RotatingFile::open(tmp.path(), 100, 3).unwrap();
        let line = b"{\"pad\":\"xxxxxxxxxxxxxxxxxxxxxxxxxx\"}\n";
        let two = [&line[..], &line[..]].concat();
        f.write_lines_or_drop(&two, 2);
        assert_eq!(f.size, 2 * line.len() as u64);
        // A third line would pass 100 bytes: it rotates, and the fourth joins it.
        f.write_lines_or_drop(&two, 2);
        let current = fs::read_to_string(tmp.path().join(FILE_NAME)).unwrap();
        let rotated = fs::read_to_string(tmp.path().join("perago.jsonl.1")).unwrap();
        assert_eq!((rotated.lines().count(), current.lines().count()), (2, 2));
        let mut f = RotatingFile::open(&tmp.path().join("full"), 1 << 20, 3).unwrap();
        f.file = OpenOptions::new().append(true).open("/dev/full").unwrap();
        let before = lines_dropped();
        f.write_lines_or_drop(&[&line[..], &line[..], &line[..]].concat(), 3);
        assert_eq!(f.drops.dropping, Some(3));
        assert!(lines_dropped() >= before + 3);
    }

    #[test]
    fn rotation_keeps_max_files() {
        let tmp = tempfile::tempdir().unwrap();
        let mut f = RotatingFile::open(tmp.path(), 100, 3).unwrap();
        for n in 0..20 {
            f.write_line(
                format!("{{\"n\": {n:>3}, \"pad\": \"xxxxxxxxxxxxxxxxxxxx\"}}\n").as_bytes(),
            )
            .unwrap();
        }
        let mut names: Vec<String> = fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["perago.jsonl", "perago.jsonl.1", "perago.jsonl.2"]);
        for name in &names {
            let text = fs::read_to_string(tmp.path().join(name)).unwrap();
            assert!(text.len() <= 100, "{name}: {} bytes", text.len());
            for line in text.lines() {
                serde_json::from_str::<serde_json::Value>(line).unwrap();
            }
        }
        // The newest line is in the current file.
        let current = fs::read_to_string(tmp.path().join("perago.jsonl")).unwrap();
        assert!(current.contains("\"n\":  19"));
    }

    #[test]
    fn one_file_is_truncated_in_place() {
        let tmp = tempfile::tempdir().unwrap();
        let mut f = RotatingFile::open(tmp.path(), 50, 1).unwrap();
        for _ in 0..10 {
            f.write_line(b"0123456789012345678901234567890\n").unwrap();
        }
        let text = fs::read_to_string(tmp.path().join("perago.jsonl")).unwrap();
        assert_eq!(text.lines().count(), 1);
    }
}
