//! Walking a folder tree that another user may be changing, from held descriptors only: each
//! folder is opened relative to its already-open parent (`openat` with `O_NOFOLLOW`), so a name
//! checked once is never resolved again through a path, and a symlink swapped in for a file or
//! a folder is refused instead of followed. The executor uses it to hand a workspace to
//! `[body] user` and to take it back, scan it and publish it (see `docs/runtime.md`, "Trust
//! model"); the supervisor keeps its records folder this way.

use std::{
    ffi::{CString, OsStr, OsString},
    fs::File,
    io,
    os::{
        fd::{AsFd, AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
        unix::ffi::{OsStrExt as _, OsStringExt as _},
    },
    path::{Path, PathBuf},
};

/// What a folder entry is, as `lstat` sees it (a symlink is never followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A folder.
    Dir,
    /// A symbolic link.
    Symlink,
    /// A FIFO, socket or device.
    Special,
}

/// The `lstat` of an entry, or the `fstat` of an open descriptor: what identifies it and what
/// decides whether it may be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryStat {
    /// Its type.
    pub kind: EntryKind,
    /// Device and inode: the identity of the file.
    pub dev: u64,
    /// See `dev`.
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Hard links.
    pub nlink: u64,
    /// Permission bits.
    pub mode: u32,
}

impl EntryStat {
    fn of(st: &libc::stat) -> Self {
        let kind = match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => EntryKind::File,
            libc::S_IFDIR => EntryKind::Dir,
            libc::S_IFLNK => EntryKind::Symlink,
            _ => EntryKind::Special,
        };
        Self {
            kind,
            dev: st.st_dev,
            ino: st.st_ino,
            size: u64::try_from(st.st_size).unwrap_or(0),
            uid: st.st_uid,
            gid: st.st_gid,
            nlink: st.st_nlink,
            mode: st.st_mode & 0o7777,
        }
    }

    /// Whether `other` is the same file (device and inode).
    pub fn same_file(&self, other: &Self) -> bool {
        (self.dev, self.ino) == (other.dev, other.ino)
    }
}

fn c_name(name: &OsStr) -> io::Result<CString> {
    if name.is_empty() || name.as_bytes().contains(&b'/') || name == "." || name == ".." {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a plain entry name"),
        ));
    }
    CString::new(name.as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} contains a NUL byte"),
        )
    })
}

fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// The `fstat` of any open descriptor.
pub fn fstat(fd: BorrowedFd<'_>) -> io::Result<EntryStat> {
    // SAFETY: an all-zero `stat` is a valid value of the plain C struct that fstat(2) fills.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat(2) writes the struct we pass and reads nothing else of ours.
    check(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok(EntryStat::of(&st))
}

/// An open folder: every entry is opened, read or changed relative to it.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
}

impl AsFd for Dir {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Dir {
    /// Opens the folder at `path`; a symlink as its last component is refused.
    pub fn open(path: &Path) -> io::Result<Self> {
        let path = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))?;
        // SAFETY: open(2) reads the NUL-terminated path; it returns a new descriptor we own.
        let fd = check(unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        })?;
        // SAFETY: `fd` was just returned by open(2) and is owned by nobody else.
        Ok(Self {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// A second descriptor of an open folder (e.g. a `File` held on it); it must be a folder.
    pub fn from_fd(fd: BorrowedFd<'_>) -> io::Result<Self> {
        let fd = fd.try_clone_to_owned()?;
        if fstat(fd.as_fd())?.kind != EntryKind::Dir {
            return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
        }
        Ok(Self { fd })
    }

    /// The `fstat` of the folder itself.
    pub fn stat(&self) -> io::Result<EntryStat> {
        fstat(self.fd.as_fd())
    }

    /// The `lstat` of the entry `name`.
    pub fn stat_at(&self, name: &OsStr) -> io::Result<EntryStat> {
        let name = c_name(name)?;
        // SAFETY: an all-zero `stat` is a valid value of the plain C struct fstatat(2) fills.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstatat(2) reads the NUL-terminated name and writes the struct we pass.
        check(unsafe {
            libc::fstatat(
                self.fd.as_raw_fd(),
                name.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        })?;
        Ok(EntryStat::of(&st))
    }

    /// Opens `name` in this folder with `flags` (`O_NOFOLLOW | O_CLOEXEC` are always added;
    /// `mode` is used when creating).
    fn open_at(&self, name: &OsStr, flags: libc::c_int, mode: u32) -> io::Result<OwnedFd> {
        let name = c_name(name)?;
        // SAFETY: openat(2) reads the NUL-terminated name; it returns a new descriptor we own.
        let fd = check(unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                name.as_ptr(),
                flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                mode as libc::c_uint,
            )
        })?;
        // SAFETY: `fd` was just returned by openat(2) and is owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Opens the folder `name` in this one; a symlink is refused (`ELOOP`/`ENOTDIR`).
    pub fn open_dir(&self, name: &OsStr) -> io::Result<Self> {
        let fd = self.open_at(name, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
        Ok(Self { fd })
    }

    /// Opens the entry `name` for reading without following a symlink and without blocking
    /// (a FIFO opens at once and reads nothing); the caller checks what it is with [`fstat`].
    pub fn open_file(&self, name: &OsStr) -> io::Result<File> {
        let fd = self.open_at(name, libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY, 0)?;
        Ok(File::from(fd))
    }

    /// Creates the file `name` for writing with `mode`; an existing file or symlink there is
    /// an error (`O_CREAT | O_EXCL`).
    pub fn create_new(&self, name: &OsStr, mode: u32) -> io::Result<File> {
        let fd = self.open_at(name, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, mode)?;
        Ok(File::from(fd))
    }

    /// Removes the file `name` of this folder (a symlink itself, never what it points to).
    pub fn unlink_at(&self, name: &OsStr) -> io::Result<()> {
        let name = c_name(name)?;
        // SAFETY: unlinkat(2) reads the NUL-terminated name; no other memory is involved.
        check(unsafe { libc::unlinkat(self.fd.as_raw_fd(), name.as_ptr(), 0) }).map(drop)
    }

    /// Renames `from` to `to`, both in this folder.
    pub fn rename_at(&self, from: &OsStr, to: &OsStr) -> io::Result<()> {
        let (from, to) = (c_name(from)?, c_name(to)?);
        let fd = self.fd.as_raw_fd();
        // SAFETY: renameat(2) within one held folder, with NUL-terminated names.
        check(unsafe { libc::renameat(fd, from.as_ptr(), fd, to.as_ptr()) }).map(drop)
    }

    /// The target of the symlink `name`, as written in it.
    pub fn read_link_at(&self, name: &OsStr) -> io::Result<PathBuf> {
        let name = c_name(name)?;
        let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
        // SAFETY: readlinkat(2) reads the NUL-terminated name and writes at most `buf.len()`
        // bytes into `buf`.
        let n = unsafe {
            libc::readlinkat(
                self.fd.as_raw_fd(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        let n = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
        buf.truncate(n);
        Ok(PathBuf::from(OsString::from_vec(buf)))
    }

    /// The names in this folder (`.` and `..` left out), sorted.
    pub fn entries(&self) -> io::Result<Vec<OsString>> {
        // fdopendir(3) takes the descriptor over, and its position: give it a fresh one, and
        // rewind it (a descriptor shares its offset with the one it was duplicated from).
        let fd = self.fd.try_clone()?;
        // SAFETY: the descriptor is ours; on success the DIR stream owns it and closedir(3)
        // closes it, on failure it is still ours (and closed by `fd`'s drop).
        let stream = unsafe { libc::fdopendir(fd.as_raw_fd()) };
        if stream.is_null() {
            return Err(io::Error::last_os_error());
        }
        std::mem::forget(fd);
        let mut names = Vec::new();
        // SAFETY: `stream` is a valid DIR stream until the closedir below.
        unsafe { libc::rewinddir(stream) };
        let result = loop {
            // readdir(3) signals the end and errors both with NULL; errno tells them apart.
            // SAFETY: __errno_location returns this thread's errno slot.
            unsafe { *libc::__errno_location() = 0 };
            // SAFETY: `stream` is valid; the entry it returns lives until the next readdir.
            let entry = unsafe { libc::readdir(stream) };
            if entry.is_null() {
                let errno = io::Error::last_os_error();
                break match errno.raw_os_error() {
                    Some(0) | None => Ok(()),
                    Some(_) => Err(errno),
                };
            }
            // SAFETY: d_name is a NUL-terminated string inside the entry.
            let name = unsafe { std::ffi::CStr::from_ptr((*entry).d_name.as_ptr()) };
            let bytes = name.to_bytes();
            if bytes != b"." && bytes != b".." {
                names.push(OsString::from_vec(bytes.to_vec()));
            }
        };
        // SAFETY: `stream` is valid and closed exactly once.
        unsafe { libc::closedir(stream) };
        result?;
        names.sort();
        Ok(names)
    }

    /// Gives the folder itself to `uid`:`gid`.
    pub fn chown(&self, uid: u32, gid: u32) -> io::Result<()> {
        std::os::unix::fs::fchown(&self.fd, Some(uid), Some(gid))
    }

    /// Sets the folder's permission bits.
    pub fn chmod(&self, mode: u32) -> io::Result<()> {
        // SAFETY: fchmod(2) on a descriptor we hold; no memory is involved.
        check(unsafe { libc::fchmod(self.fd.as_raw_fd(), mode as libc::mode_t) }).map(drop)
    }

    /// Creates the folder `name` in this one with `mode` (less the umask); an existing entry
    /// there, a symlink included, is an error (`EEXIST`).
    pub fn create_dir_at(&self, name: &OsStr, mode: u32) -> io::Result<()> {
        let name = c_name(name)?;
        // SAFETY: mkdirat(2) reads the NUL-terminated name; no other memory is involved.
        check(unsafe { libc::mkdirat(self.fd.as_raw_fd(), name.as_ptr(), mode as libc::mode_t) })
            .map(drop)
    }

    /// Flushes the folder's entries (names created, renamed or removed) to the disk.
    pub fn sync(&self) -> io::Result<()> {
        // SAFETY: fsync(2) on a descriptor we hold; no memory is involved.
        check(unsafe { libc::fsync(self.fd.as_raw_fd()) }).map(drop)
    }

    /// Gives the entry `name` to `uid`:`gid`, a symlink itself (never what it points to).
    pub fn chown_at(&self, name: &OsStr, uid: u32, gid: u32) -> io::Result<()> {
        let name = c_name(name)?;
        // SAFETY: fchownat(2) reads the NUL-terminated name; no other memory is involved.
        check(unsafe {
            libc::fchownat(
                self.fd.as_raw_fd(),
                name.as_ptr(),
                uid,
                gid,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        })
        .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn entries_are_read_and_opened_from_the_held_folder_without_following_links() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("sub")).unwrap();
        std::fs::write(tmp.path().join("f"), "data").unwrap();
        symlink("/etc", tmp.path().join("link")).unwrap();
        let dir = Dir::open(tmp.path()).unwrap();
        assert_eq!(dir.entries().unwrap(), ["f", "link", "sub"]);
        // Twice: the listing does not consume the folder's position.
        assert_eq!(dir.entries().unwrap().len(), 3);
        assert_eq!(dir.stat_at("f".as_ref()).unwrap().kind, EntryKind::File);
        assert_eq!(
            dir.stat_at("link".as_ref()).unwrap().kind,
            EntryKind::Symlink
        );
        assert_eq!(
            dir.read_link_at("link".as_ref()).unwrap(),
            Path::new("/etc")
        );
        assert!(dir.open_dir("link".as_ref()).is_err());
        assert!(dir.open_file("link".as_ref()).is_err());
        assert!(dir.open_dir("sub".as_ref()).is_ok());
        let file = dir.open_file("f".as_ref()).unwrap();
        assert_eq!(fstat(file.as_fd()).unwrap().size, 4);
        for bad in ["", ".", "..", "a/b"] {
            assert!(dir.stat_at(bad.as_ref()).is_err(), "{bad:?}");
        }
        // The held folder is still the one opened after its path is swapped for a link.
        std::fs::rename(tmp.path(), tmp.path().with_extension("moved")).unwrap();
        symlink("/etc", tmp.path()).unwrap();
        assert_eq!(dir.entries().unwrap(), ["f", "link", "sub"]);
        std::fs::remove_file(tmp.path()).unwrap();
        std::fs::rename(tmp.path().with_extension("moved"), tmp.path()).unwrap();
        assert!(Dir::open(&tmp.path().join("link")).is_err());
    }

    #[test]
    fn files_are_created_renamed_and_removed_through_the_held_folder() {
        use std::io::{Read as _, Write as _};
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("d");
        std::fs::create_dir(&dir).unwrap();
        let held = Dir::open(&dir).unwrap();
        assert_eq!(held.stat().unwrap().kind, EntryKind::Dir);
        let mut file = held.create_new("a.tmp".as_ref(), 0o600).unwrap();
        assert!(held.create_new("a.tmp".as_ref(), 0o600).is_err());
        file.write_all(b"hi").unwrap();
        held.rename_at("a.tmp".as_ref(), "a".as_ref()).unwrap();
        // The folder is moved away and a new one put in its place: the held one is still used.
        std::fs::rename(&dir, tmp.path().join("moved")).unwrap();
        std::fs::create_dir(&dir).unwrap();
        let mut text = String::new();
        held.open_file("a".as_ref())
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "hi");
        assert_eq!(held.entries().unwrap(), [OsString::from("a")]);
        // Unlinking a symlink removes the link, not its target.
        symlink(tmp.path().join("moved/a"), tmp.path().join("moved/alias")).unwrap();
        held.unlink_at("alias".as_ref()).unwrap();
        held.unlink_at("a".as_ref()).unwrap();
        assert!(held.entries().unwrap().is_empty());
        assert!(held.open_file("../x".as_ref()).is_err());
        assert!(held.rename_at("..".as_ref(), "x".as_ref()).is_err());
        // A symlink or a file where a folder is expected: ENOTDIR, never followed.
        let link = tmp.path().join("link");
        symlink(&dir, &link).unwrap();
        assert_eq!(
            Dir::open(&link).unwrap_err().raw_os_error(),
            Some(libc::ENOTDIR)
        );
        std::fs::write(tmp.path().join("file"), "").unwrap();
        assert_eq!(
            Dir::open(&tmp.path().join("file"))
                .unwrap_err()
                .raw_os_error(),
            Some(libc::ENOTDIR)
        );
    }

    #[test]
    fn folders_are_created_from_the_held_folder_and_never_through_a_link() {
        use std::os::unix::fs::PermissionsExt as _;
        let tmp = tempfile::tempdir().unwrap();
        let dir = Dir::open(tmp.path()).unwrap();
        dir.create_dir_at("made".as_ref(), 0o700).unwrap();
        let mode = std::fs::metadata(tmp.path().join("made"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        // An existing entry, a symlink included, is EEXIST: nothing is made through it.
        let elsewhere = tempfile::tempdir().unwrap();
        symlink(elsewhere.path(), tmp.path().join("link")).unwrap();
        for name in ["made", "link"] {
            let err = dir.create_dir_at(name.as_ref(), 0o700).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::AlreadyExists, "{name}");
        }
        assert!(dir.create_dir_at("../up".as_ref(), 0o700).is_err());
        assert!(
            std::fs::read_dir(elsewhere.path())
                .unwrap()
                .next()
                .is_none()
        );
        dir.sync().unwrap();
    }
}
