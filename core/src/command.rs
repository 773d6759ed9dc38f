//! Finding the program of a command line the way the executor will run it: a name with a `/`
//! is a path relative to the manifest folder, a bare name is looked up on `PATH`.

use std::{
    ffi::OsStr,
    os::unix::fs::PermissionsExt,
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
}
