//! A directory held open: checked once on its descriptor, then used only through it
//! (`openat`, `unlinkat`, `renameat`), so a rename or a symlink swapped in after the check
//! cannot send a later step elsewhere. Names given to its methods are single path
//! components (no `/`); the last component is never followed (`O_NOFOLLOW`).

use std::{
    ffi::{CString, OsStr, OsString},
    fs::{File, Metadata},
    io,
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::ffi::OsStrExt as _,
    },
    path::Path,
};

/// A directory held open by its descriptor.
#[derive(Debug)]
pub struct Dir {
    file: File,
}

fn c_path(path: &OsStr) -> io::Result<CString> {
    CString::new(path.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))
}

/// `name` as one path component, or an error.
fn component(name: &OsStr) -> io::Result<CString> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.contains(&b'/') || bytes == b"." || bytes == b".." {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{:?} is not a file name", name.to_string_lossy()),
        ));
    }
    c_path(name)
}

fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

impl Dir {
    /// Opens the directory `path` without following a symlink at its last component; a
    /// symlink, a file or a FIFO there is an error (`ENOTDIR`), never followed or waited on.
    pub fn open_nofollow(path: &Path) -> io::Result<Self> {
        let c = c_path(path.as_os_str())?;
        // SAFETY: open(2) with a NUL-terminated path; the descriptor returned is owned below.
        let fd = check(unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        })?;
        // SAFETY: `fd` was just opened by this process and is owned by nothing else.
        let file = unsafe { File::from_raw_fd(fd) };
        Ok(Self { file })
    }

    /// The directory's own metadata (`fstat` of the held descriptor).
    pub fn metadata(&self) -> io::Result<Metadata> {
        self.file.metadata()
    }

    /// Opens `name` in this directory with `flags` (`O_NOFOLLOW | O_CLOEXEC` are always
    /// added; `mode` is used when creating).
    pub fn open_at(&self, name: &OsStr, flags: libc::c_int, mode: u32) -> io::Result<File> {
        let c = component(name)?;
        // SAFETY: openat(2) on a held directory descriptor with a NUL-terminated name; the
        // descriptor returned is owned below.
        let fd = check(unsafe {
            libc::openat(
                self.file.as_raw_fd(),
                c.as_ptr(),
                flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                mode as libc::c_uint,
            )
        })?;
        // SAFETY: `fd` was just opened by this process and is owned by nothing else.
        Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Creates the file `name` for writing with `mode`; an existing file or symlink there is
    /// an error (`O_CREAT | O_EXCL`).
    pub fn create_new(&self, name: &OsStr, mode: u32) -> io::Result<File> {
        self.open_at(name, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, mode)
    }

    /// Opens `name` for reading without blocking (a FIFO has no writer to wait for) and
    /// without following a symlink.
    pub fn open_read(&self, name: &OsStr) -> io::Result<File> {
        self.open_at(name, libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY, 0)
    }

    /// Removes the file `name` of this directory (never what a symlink there points to).
    pub fn unlink_at(&self, name: &OsStr) -> io::Result<()> {
        let c = component(name)?;
        // SAFETY: unlinkat(2) on a held directory descriptor with a NUL-terminated name.
        check(unsafe { libc::unlinkat(self.file.as_raw_fd(), c.as_ptr(), 0) }).map(drop)
    }

    /// Renames `from` to `to`, both in this directory.
    pub fn rename_at(&self, from: &OsStr, to: &OsStr) -> io::Result<()> {
        let (from, to) = (component(from)?, component(to)?);
        let fd = self.file.as_raw_fd();
        // SAFETY: renameat(2) within one held directory descriptor, NUL-terminated names.
        check(unsafe { libc::renameat(fd, from.as_ptr(), fd, to.as_ptr()) }).map(drop)
    }

    /// The names of this directory's entries (not `.` and `..`), read through the held
    /// descriptor.
    pub fn names(&self) -> io::Result<Vec<OsString>> {
        // /proc/self/fd/N names the open directory itself, whatever its path is now.
        let path = format!("/proc/self/fd/{}", self.file.as_raw_fd());
        std::fs::read_dir(path)?
            .map(|entry| entry.map(|e| e.file_name()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read as _, Write as _};

    #[test]
    fn a_held_directory_is_used_through_its_descriptor() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("d");
        std::fs::create_dir(&dir).unwrap();
        let held = Dir::open_nofollow(&dir).unwrap();
        assert!(held.metadata().unwrap().is_dir());
        let mut file = held.create_new("a.tmp".as_ref(), 0o600).unwrap();
        assert!(held.create_new("a.tmp".as_ref(), 0o600).is_err());
        file.write_all(b"hi").unwrap();
        held.rename_at("a.tmp".as_ref(), "a".as_ref()).unwrap();
        // The folder is moved away and a new one put in its place: the held one is still used.
        std::fs::rename(&dir, tmp.path().join("moved")).unwrap();
        std::fs::create_dir(&dir).unwrap();
        let mut text = String::new();
        held.open_read("a".as_ref())
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "hi");
        assert_eq!(held.names().unwrap(), vec![OsString::from("a")]);
        held.unlink_at("a".as_ref()).unwrap();
        assert!(held.names().unwrap().is_empty());
        assert!(held.open_read("../x".as_ref()).is_err());
        assert!(held.open_read("..".as_ref()).is_err());
    }

    #[test]
    fn symlinks_are_never_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::fs::write(real.join("secret"), "s").unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        // With O_DIRECTORY, Linux answers ENOTDIR for a symlink to a directory.
        let err = Dir::open_nofollow(&link).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOTDIR), "{err}");
        let held = Dir::open_nofollow(&real).unwrap();
        std::os::unix::fs::symlink(real.join("secret"), real.join("alias")).unwrap();
        let err = held.open_read("alias".as_ref()).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ELOOP), "{err}");
        // Unlinking a symlink removes the link, not its target.
        held.unlink_at("alias".as_ref()).unwrap();
        assert!(real.join("secret").exists());
        let file = tmp.path().join("file");
        std::fs::write(&file, "").unwrap();
        let err = Dir::open_nofollow(&file).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOTDIR), "{err}");
    }
}
