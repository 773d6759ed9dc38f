//! What the body changed: the workspace after the body, compared by MD5 with what was
//! downloaded. Unchanged files are not uploaded again; symlinks are followed only inside.

use super::paths::{PathError, relative_to_key};
use md5::{Digest, Md5};
use std::{
    collections::BTreeMap,
    fs, io,
    path::{Path, PathBuf},
};

/// One file to upload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upload {
    /// The lakeFS key.
    pub key: String,
    /// The file to read (a symlink's in-workspace target, resolved).
    pub file: PathBuf,
    /// Its size.
    pub size: u64,
}

/// The change set of one attempt.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Changes {
    /// New keys.
    pub added: Vec<Upload>,
    /// Keys whose content changed.
    pub changed: Vec<Upload>,
    /// Keys whose file is gone.
    pub removed: Vec<String>,
}

impl Changes {
    /// Objects the publication touches.
    pub fn objects(&self) -> u64 {
        (self.added.len() + self.changed.len() + self.removed.len()) as u64
    }

    /// Bytes to upload.
    pub fn upload_bytes(&self) -> u64 {
        self.added.iter().chain(&self.changed).map(|u| u.size).sum()
    }

    /// Nothing to publish.
    pub fn is_empty(&self) -> bool {
        self.objects() == 0
    }
}

/// Why a workspace could not be scanned.
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    /// An unsafe path.
    #[error(transparent)]
    Path(#[from] PathError),
    /// A file system error.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Something that is neither a file nor a folder.
    #[error("{0} is not a regular file; only files are published")]
    Special(String),
}

/// Hex MD5 of a file, as lakeFS reports checksums.
pub fn md5_hex(path: &Path) -> io::Result<String> {
    use std::io::Read as _;
    let mut file = fs::File::open(path)?;
    let mut hasher = Md5::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// Compares the workspace `root` with `downloaded` (key → MD5) under `prefix`.
pub fn scan(
    root: &Path,
    prefix: &str,
    downloaded: &BTreeMap<String, String>,
) -> Result<Changes, ScanError> {
    let io_err = |path: &Path| {
        let path = path.to_owned();
        move |source| ScanError::Io { path, source }
    };
    let canonical_root = fs::canonicalize(root).map_err(io_err(root))?;
    let mut changes = Changes::default();
    let mut seen = std::collections::BTreeSet::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(relative_dir) = stack.pop() {
        let dir = root.join(&relative_dir);
        let mut entries: Vec<_> = fs::read_dir(&dir)
            .map_err(io_err(&dir))?
            .collect::<Result<_, _>>()
            .map_err(io_err(&dir))?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let relative = relative_dir.join(entry.file_name());
            let path = root.join(&relative);
            let meta = fs::symlink_metadata(&path).map_err(io_err(&path))?;
            let file = if meta.file_type().is_symlink() {
                // Follow a link only if it resolves to a file inside the workspace. A link to
                // a folder inside is not followed (the folder's files are published under their
                // own paths, and a link loop cannot arise).
                let target = fs::canonicalize(&path).map_err(io_err(&path))?;
                if !target.starts_with(&canonical_root) {
                    return Err(PathError::SymlinkEscapes {
                        path: relative.display().to_string(),
                        target: target.display().to_string(),
                    }
                    .into());
                }
                if target.is_dir() {
                    tracing::info!(link = %relative.display(), "a symlink to a folder inside the workspace is not published");
                    continue;
                }
                if !target.is_file() {
                    return Err(ScanError::Special(relative.display().to_string()));
                }
                target
            } else if meta.is_dir() {
                stack.push(relative);
                continue;
            } else if meta.is_file() {
                path.clone()
            } else {
                return Err(ScanError::Special(relative.display().to_string()));
            };
            let key = relative_to_key(prefix, &relative)?;
            let size = fs::metadata(&file).map_err(io_err(&file))?.len();
            let checksum = md5_hex(&file).map_err(io_err(&file))?;
            let upload = Upload {
                key: key.clone(),
                file,
                size,
            };
            match downloaded.get(&key) {
                Some(old) if *old == checksum => {}
                Some(_) => changes.changed.push(upload),
                None => changes.added.push(upload),
            }
            seen.insert(key);
        }
    }
    changes.removed = downloaded
        .keys()
        .filter(|k| !seen.contains(*k))
        .cloned()
        .collect();
    changes.added.sort_by(|a, b| a.key.cmp(&b.key));
    changes.changed.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(changes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn write(root: &Path, rel: &str, text: &str) {
        let path = root.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    #[test]
    fn changes_are_found_by_content() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        write(root, "same.txt", "same");
        write(root, "edited.txt", "new text");
        write(root, "sub/new.txt", "hello");
        let downloaded = BTreeMap::from([
            (
                "p/same.txt".to_owned(),
                md5_hex(&root.join("same.txt")).unwrap(),
            ),
            ("p/edited.txt".to_owned(), "0".repeat(32)),
            ("p/gone.txt".to_owned(), "1".repeat(32)),
        ]);
        let changes = scan(root, "p/", &downloaded).unwrap();
        let keys = |v: &[Upload]| v.iter().map(|u| u.key.clone()).collect::<Vec<_>>();
        assert_eq!(keys(&changes.added), ["p/sub/new.txt"]);
        assert_eq!(keys(&changes.changed), ["p/edited.txt"]);
        assert_eq!(changes.removed, ["p/gone.txt"]);
        assert_eq!(changes.objects(), 3);
        assert_eq!(changes.upload_bytes(), 5 + 8);
    }

    #[test]
    fn md5_matches_lakefs_checksums() {
        let tmp = tempfile::tempdir().unwrap();
        write(tmp.path(), "f", "hello");
        assert_eq!(
            md5_hex(&tmp.path().join("f")).unwrap(),
            "5d41402abc4b2a76b9719d911017c592"
        );
    }

    #[test]
    fn symlinks_out_of_the_workspace_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("ws");
        fs::create_dir(&root).unwrap();
        let outside = tmp.path().join("secret");
        fs::write(&outside, "top secret").unwrap();
        symlink(&outside, root.join("leak")).unwrap();
        let err = scan(&root, "", &BTreeMap::new()).unwrap_err().to_string();
        assert!(
            err.starts_with("leak is a symlink that points outside the workspace"),
            "{err}"
        );

        fs::remove_file(root.join("leak")).unwrap();
        symlink("/etc", root.join("etc")).unwrap();
        assert!(scan(&root, "", &BTreeMap::new()).is_err());
    }

    #[test]
    fn a_symlink_to_a_folder_inside_is_skipped_not_called_an_escape() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        write(root, "runs/3/out.txt", "data");
        symlink("runs/3", root.join("latest")).unwrap();
        symlink(root.join("runs"), root.join("all")).unwrap();
        let changes = scan(root, "p/", &BTreeMap::new()).unwrap();
        let keys: Vec<_> = changes.added.iter().map(|u| u.key.as_str()).collect();
        assert_eq!(keys, ["p/runs/3/out.txt"]);
    }

    #[test]
    fn symlinks_inside_publish_their_target() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        write(root, "real.txt", "data");
        symlink("real.txt", root.join("alias.txt")).unwrap();
        let changes = scan(root, "", &BTreeMap::new()).unwrap();
        let alias = changes.added.iter().find(|u| u.key == "alias.txt").unwrap();
        assert_eq!(alias.file, fs::canonicalize(root.join("real.txt")).unwrap());
    }
}
