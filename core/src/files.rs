//! Reading small configuration files (manifests, schemas) without hanging and without
//! unbounded reads: only regular files, up to a size limit. A FIFO, a device or `/dev/urandom`
//! given as a manifest is refused at once instead of blocking or filling memory.

use std::{
    fs::{File, OpenOptions},
    io::{self, Read as _},
    os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _},
    path::Path,
};

/// The largest manifest or schema read: far above any real one.
pub const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

fn kind(file_type: std::fs::FileType) -> &'static str {
    if file_type.is_dir() {
        "a directory"
    } else if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_socket() {
        "a socket"
    } else if file_type.is_char_device() {
        "a character device"
    } else if file_type.is_block_device() {
        "a block device"
    } else {
        "not a regular file"
    }
}

/// Reads `path` as UTF-8 text if it is a regular file of at most `max_bytes`. Opening never
/// blocks (`O_NONBLOCK`, so a FIFO without a writer cannot hang the caller), the type and size
/// are checked on the open descriptor, and the read stops past the limit whatever the file
/// claims.
pub fn read_regular(path: &Path, max_bytes: u64) -> io::Result<String> {
    read_regular_with(path, max_bytes, 0)
}

/// [`read_regular`], refusing a symlink at the last component of `path` instead of following
/// it: for files a program writes itself (records, side files), where a symlink is never
/// what it wrote.
pub fn read_regular_nofollow(path: &Path, max_bytes: u64) -> io::Result<String> {
    read_regular_with(path, max_bytes, libc::O_NOFOLLOW)
}

fn read_regular_with(path: &Path, max_bytes: u64, flags: libc::c_int) -> io::Result<String> {
    let file: File = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | flags)
        .open(path)?;
    read_open_regular(file, max_bytes)
}

/// The rule of [`read_regular`] for a file opened already (by `openat` in a held directory):
/// only a regular file of at most `max_bytes` is read, as UTF-8 text.
pub fn read_open_regular(file: File, max_bytes: u64) -> io::Result<String> {
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} (only regular files are read)", kind(meta.file_type())),
        ));
    }
    let too_big = |size: u64| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{size} bytes is above the limit of {max_bytes} bytes"),
        )
    };
    if meta.len() > max_bytes {
        return Err(too_big(meta.len()));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(max_bytes + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max_bytes {
        return Err(too_big(bytes.len() as u64));
    }
    String::from_utf8(bytes).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("not UTF-8 text: {}", crate::errors::DisplayChain(&e)),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn regular_files_within_the_limit_are_read() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("a.toml");
        std::fs::write(&path, "x = 1\n").unwrap();
        assert_eq!(read_regular(&path, 10).unwrap(), "x = 1\n");
        let err = read_regular(&path, 3).unwrap_err().to_string();
        assert_eq!(err, "6 bytes is above the limit of 3 bytes");
    }

    #[test]
    fn fifos_devices_and_directories_are_refused_at_once() {
        let tmp = tempfile::tempdir().unwrap();
        let fifo = tmp.path().join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let started = Instant::now();
        assert_eq!(
            read_regular(&fifo, 100).unwrap_err().to_string(),
            "a FIFO (only regular files are read)"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(
            read_regular(Path::new("/dev/urandom"), 100)
                .unwrap_err()
                .to_string(),
            "a character device (only regular files are read)"
        );
        assert_eq!(
            read_regular(tmp.path(), 100).unwrap_err().to_string(),
            "a directory (only regular files are read)"
        );
    }

    #[test]
    fn nofollow_refuses_a_symlink_and_reads_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("a.json");
        std::fs::write(&path, "[]").unwrap();
        assert_eq!(read_regular_nofollow(&path, 10).unwrap(), "[]");
        let link = tmp.path().join("link.json");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert_eq!(read_regular(&link, 10).unwrap(), "[]");
        let err = read_regular_nofollow(&link, 10).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ELOOP), "{err}");
    }

    #[test]
    fn binary_content_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("bin");
        std::fs::write(&path, [0xff, 0xfe, 0]).unwrap();
        assert!(
            read_regular(&path, 100)
                .unwrap_err()
                .to_string()
                .starts_with("not UTF-8 text")
        );
    }
}
