//! Finding the program of a command line the way the executor will run it: a name with a `/`
//! is a path relative to the manifest folder, a bare name is looked up on `PATH`.

use std::{
    ffi::OsStr,
    os::unix::fs::{MetadataExt as _, PermissionsExt},
    path::{Path, PathBuf},
};

/// A program that cannot be run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    /// A path that does not exist.
    #[error("{program:?} not found (looked for {})", path.display())]
    NotFound {
        /// As written in the manifest.
        program: String,
        /// The resolved path.
        path: PathBuf,
    },
    /// A bare name not on `PATH`.
    #[error("{program:?} not found on PATH")]
    NotOnPath {
        /// As written in the manifest.
        program: String,
    },
    /// A file without execute permission, or not a regular file.
    #[error("{} is not an executable file", path.display())]
    NotExecutable {
        /// The resolved path.
        path: PathBuf,
    },
}

fn is_executable_file(path: &Path) -> Option<bool> {
    let meta = std::fs::metadata(path).ok()?;
    Some(meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

/// Resolves `program` (argv[0]) as the executor would: relative to `dir` when it contains a
/// `/`, else on `path_var` (the `PATH` value).
pub fn resolve_program(
    program: &str,
    dir: &Path,
    path_var: Option<&OsStr>,
) -> Result<PathBuf, CommandError> {
    if program.contains('/') {
        // `./run.sh` → `<dir>/run.sh`: drop `.` components so messages show a clean path.
        let path: PathBuf = dir
            .join(program)
            .components()
            .filter(|c| !matches!(c, std::path::Component::CurDir))
            .collect();
        return match is_executable_file(&path) {
            None => Err(CommandError::NotFound {
                program: program.to_owned(),
                path,
            }),
            Some(false) => Err(CommandError::NotExecutable { path }),
            Some(true) => Ok(path),
        };
    }
    let search = path_var.map(std::env::split_paths).into_iter().flatten();
    for folder in search {
        let candidate = folder.join(program);
        if is_executable_file(&candidate) == Some(true) {
            return Ok(candidate);
        }
    }
    Err(CommandError::NotOnPath {
        program: program.to_owned(),
    })
}

/// What another user (`body.user`) would be refused on the way to a program or a folder.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// A folder on the way that the user may not search (`x`).
    #[error("uid {uid} cannot pass through {}: mode {mode:04o}, owner uid {owner}, group gid {group}", dir.display())]
    Folder {
        /// The user's uid.
        uid: u32,
        /// The folder.
        dir: PathBuf,
        /// Its permission bits.
        mode: u32,
        /// Its owner.
        owner: u32,
        /// Its group.
        group: u32,
    },
    /// The file itself: not executable for the user, or a script it may not read.
    #[error("uid {uid} cannot {what} {}: mode {mode:04o}, owner uid {owner}, group gid {group}", path.display())]
    File {
        /// The user's uid.
        uid: u32,
        /// `execute` or `read` (a script is read by its interpreter).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
        /// Its owner.
        owner: u32,
        /// Its group.
        group: u32,
    },
    /// The path cannot be inspected.
    #[error("cannot inspect {}: {cause}", path.display())]
    Inspect {
        /// The path.
        path: PathBuf,
        /// The I/O error's text.
        cause: String,
    },
}

/// Whether the permission bits of `meta` grant `want` (4 read, 2 write, 1 execute) to `uid`
/// with the primary group `gid` alone: a body runs with no supplementary groups
/// (`setgroups(0)` before `setgid`/`setuid`). The owner's bits apply to the owner even where
/// the group's or others' would grant more, as the kernel does; ACLs are not read. Root
/// passes, except for execute, which needs one `x` bit.
fn grants(meta: &std::fs::Metadata, uid: u32, gid: u32, want: u32) -> bool {
    let mode = meta.mode();
    if uid == 0 {
        return want & 1 == 0 || meta.is_dir() || mode & 0o111 != 0;
    }
    let bits = if meta.uid() == uid {
        mode >> 6
    } else if meta.gid() == gid {
        mode >> 3
    } else {
        mode
    } & 0o7;
    bits & want == want
}

fn inspect(path: &Path) -> Result<std::fs::Metadata, AccessError> {
    std::fs::metadata(path).map_err(|e| AccessError::Inspect {
        path: path.to_owned(),
        cause: crate::errors::chain(&e),
    })
}

/// Every folder the kernel passes through to reach `path`: the ancestors of the path as
/// written and of its resolved form (symlinks on the way are followed, and both sides must be
/// searchable), without `path` itself.
fn folders_on_the_way(path: &Path) -> Vec<PathBuf> {
    let mut folders: Vec<PathBuf> = Vec::new();
    let resolved = std::fs::canonicalize(path).ok();
    for p in std::iter::once(path).chain(resolved.as_deref()) {
        for dir in p.ancestors().skip(1) {
            if !dir.as_os_str().is_empty() && !folders.iter().any(|f| f == dir) {
                folders.push(dir.to_owned());
            }
        }
    }
    // From the root down, so the first refusal named is the outermost.
    folders.sort_by_key(|f| f.components().count());
    folders
}

fn check_folders(path: &Path, uid: u32, gid: u32) -> Result<(), AccessError> {
    for dir in folders_on_the_way(path) {
        let meta = inspect(&dir)?;
        if !grants(&meta, uid, gid, 1) {
            return Err(AccessError::Folder {
                uid,
                dir,
                mode: meta.mode() & 0o7777,
                owner: meta.uid(),
                group: meta.gid(),
            });
        }
    }
    Ok(())
}

/// Checks that `uid`/`gid` (a `body.user`, with no supplementary groups) can execute the
/// program at `path` (resolved by [`resolve_program`]): every folder on the way searchable,
/// the file executable, and readable too when it is a script (`#!`: its interpreter opens it).
pub fn user_can_execute(path: &Path, uid: u32, gid: u32) -> Result<(), AccessError> {
    check_folders(path, uid, gid)?;
    let meta = inspect(path)?;
    let refuse = |what| AccessError::File {
        uid,
        what,
        path: path.to_owned(),
        mode: meta.mode() & 0o7777,
        owner: meta.uid(),
        group: meta.gid(),
    };
    if !grants(&meta, uid, gid, 1) {
        return Err(refuse("execute"));
    }
    let mut start = [0u8; 2];
    let script = std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut start))
        .is_ok()
        && &start == b"#!";
    if script && !grants(&meta, uid, gid, 4) {
        return Err(refuse("read"));
    }
    Ok(())
}

/// Checks that `uid`/`gid` can make `dir` its working folder (every folder on the way and
/// `dir` itself searchable), as a body run from the manifest's folder must.
pub fn user_can_enter(dir: &Path, uid: u32, gid: u32) -> Result<(), AccessError> {
    check_folders(dir, uid, gid)?;
    let meta = inspect(dir)?;
    if !grants(&meta, uid, gid, 1) {
        return Err(AccessError::Folder {
            uid,
            dir: dir.to_owned(),
            mode: meta.mode() & 0o7777,
            owner: meta.uid(),
            group: meta.gid(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn relative_paths_resolve_against_the_folder() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("run.sh");
        fs::write(&script, "#!/bin/sh\n").unwrap();
        assert_eq!(
            resolve_program("./run.sh", dir.path(), None),
            Err(CommandError::NotExecutable {
                path: dir.path().join("run.sh")
            })
        );
        fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(
            resolve_program("./run.sh", dir.path(), None),
            Ok(dir.path().join("run.sh"))
        );
        let missing = resolve_program("./gone.sh", dir.path(), None).unwrap_err();
        assert_eq!(
            missing.to_string(),
            format!(
                "\"./gone.sh\" not found (looked for {})",
                dir.path().join("gone.sh").display()
            )
        );
        // A folder is not a program.
        fs::create_dir(dir.path().join("sub")).unwrap();
        assert!(matches!(
            resolve_program("./sub", dir.path(), None),
            Err(CommandError::NotExecutable { .. })
        ));
    }

    #[test]
    fn bare_names_are_looked_up_on_path() {
        let bin = tempfile::tempdir().unwrap();
        let tool = bin.path().join("mytool");
        fs::write(&tool, "#!/bin/sh\n").unwrap();
        fs::set_permissions(&tool, fs::Permissions::from_mode(0o700)).unwrap();
        let path = std::env::join_paths(["/nonexistent", bin.path().to_str().unwrap()]).unwrap();
        assert_eq!(
            resolve_program("mytool", Path::new("/"), Some(&path)),
            Ok(tool)
        );
        assert_eq!(
            resolve_program("nosuchtool", Path::new("/"), Some(&path))
                .unwrap_err()
                .to_string(),
            "\"nosuchtool\" not found on PATH"
        );
        assert!(resolve_program("mytool", Path::new("/"), None).is_err());
    }

    #[test]
    fn another_users_access_is_read_from_the_mode_bits_on_the_way() {
        use std::os::unix::fs::chown;
        let tmp = tempfile::tempdir().unwrap();
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let dir = tmp.path().join("task");
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        let script = dir.join("run.sh");
        fs::write(&script, "#!/bin/sh\n").unwrap();
        fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
        let (me, my_gid) = (
            fs::metadata(&dir).unwrap().uid(),
            fs::metadata(&dir).unwrap().gid(),
        );
        let other = if me == 0 { 65534 } else { 0 };
        let other_gid = 65534;
        assert_eq!(user_can_execute(&script, other, other_gid), Ok(()));
        assert_eq!(user_can_enter(&dir, other, other_gid), Ok(()));
        // A 0700 script of its owner: neither run nor read by another user.
        fs::set_permissions(&script, fs::Permissions::from_mode(0o700)).unwrap();
        let err = user_can_execute(&script, other, other_gid).unwrap_err();
        assert!(
            matches!(
                err,
                AccessError::File {
                    what: "execute",
                    mode: 0o700,
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(user_can_execute(&script, me, my_gid), Ok(()));
        // Executable but unreadable: a script cannot be read by its interpreter.
        fs::set_permissions(&script, fs::Permissions::from_mode(0o711)).unwrap();
        let err = user_can_execute(&script, other, other_gid).unwrap_err();
        assert!(
            matches!(err, AccessError::File { what: "read", .. }),
            "{err}"
        );
        fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
        // A folder on the way closed to others.
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        let err = user_can_execute(&script, other, other_gid).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "uid {other} cannot pass through {}: mode 0700, owner uid {me}, group gid {my_gid}",
                dir.display()
            )
        );
        assert!(matches!(
            user_can_enter(&dir, other, other_gid),
            Err(AccessError::Folder { .. })
        ));
        if me == 0 {
            // The group's bits apply to the primary group; the owner's bits to the owner
            // even when others' would grant more.
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o710)).unwrap();
            chown(&dir, None, Some(other_gid)).unwrap();
            assert_eq!(user_can_execute(&script, other, other_gid), Ok(()));
            assert!(user_can_execute(&script, other, 12345).is_err());
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o055)).unwrap();
            chown(&dir, Some(other), None).unwrap();
            assert!(user_can_execute(&script, other, other_gid).is_err());
        }
        // Through a symlink, the folders of the target count too.
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        chown(&dir, Some(me), Some(my_gid)).unwrap();
        let link = tmp.path().join("link.sh");
        std::os::unix::fs::symlink(&script, &link).unwrap();
        assert!(matches!(
            user_can_execute(&link, other, other_gid),
            Err(AccessError::Folder { .. })
        ));
    }
}
