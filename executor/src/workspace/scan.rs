//! What the body changed: the workspace after the body, compared by MD5 with the executor's
//! own record of what it downloaded (the MD5 of the bytes it wrote, taken as they arrived and
//! kept in its memory), never with lakeFS's listed `checksum`, which is the content MD5 only
//! for API uploads. Unchanged files are not uploaded again.
//!
//! The body's user may still hold descriptors into its workspace (a leftover process, or the
//! body of another task running as the same `[body] user`), so nothing it can still touch
//! decides what is read:
//!
//! 1. [`Snapshot::take`] takes the tree back top-down from the held `work/` descriptor: each
//!    folder is opened relative to its (already taken) parent without following links, given
//!    to the executor's user with mode 0700, and only then listed. From then on the body's user
//!    can neither add, rename nor remove an entry anywhere in it, even through a descriptor it
//!    opened before (the kernel checks the folder's current owner and mode).
//! 2. Entries are recorded without reading a file: `lstat` sizes, so the publish budget is
//!    checked before anything is hashed ([`Snapshot::lower_bound`]).
//! 3. [`Snapshot::changes`] opens each file from its held parent (`O_NOFOLLOW`), checks on the
//!    descriptor that it is the same regular file of the same size, owned by the body's user,
//!    and hashes exactly that many bytes; an upload reads from that same descriptor
//!    ([`Upload::read_checked`]) and fails unless it sends exactly those bytes again.
//!
//! A symlink is never followed through the file system: its text is resolved against the
//! snapshot. A link to a file inside publishes that file's content (read from the file's own
//! descriptor) under the link's key; a link to a folder inside is skipped; a link that leaves
//! the workspace, dangles or loops fails the scan.

use super::paths::{PathError, relative_to_key};
use md5::{Digest, Md5};
use perago_sys::fd::dir::{Dir, EntryKind, EntryStat, fstat};
use std::{
    collections::{BTreeMap, BTreeSet},
    ffi::OsString,
    fs::File,
    io,
    os::{fd::AsFd as _, unix::fs::FileExt as _},
    path::{Component, Path, PathBuf},
    sync::Arc,
};

/// Links followed while resolving one symlink, as the kernel's limit.
const MAX_LINK_HOPS: usize = 40;
/// The size of the pieces a file is hashed in.
const HASH_CHUNK: usize = 64 * 1024;

/// One file to upload: the descriptor it was checked and hashed from, and what was found.
#[derive(Debug, Clone)]
pub struct Upload {
    /// The lakeFS key.
    pub key: String,
    /// The path in the workspace (of the link, for a symlink), for messages.
    pub path: PathBuf,
    /// Its size when checked.
    pub size: u64,
    /// Hex MD5 of those `size` bytes.
    pub checksum: String,
    /// The open file (a symlink's target's).
    pub content: Arc<File>,
}

impl Upload {
    /// Reads the file from its descriptor again, in pieces of `chunk` bytes handed to `send`
    /// (which says whether to go on), and fails unless it reads exactly the `size` bytes with
    /// the `checksum` that were checked: the last piece is held back until that is known, so
    /// a receiver never gets a whole object that differs from what was checked.
    pub fn read_checked(
        &self,
        chunk: usize,
        mut send: impl FnMut(Vec<u8>) -> bool,
    ) -> io::Result<()> {
        let mut hasher = Md5::new();
        let mut offset = 0u64;
        loop {
            let want = usize::try_from(self.size - offset)
                .unwrap_or(usize::MAX)
                .min(chunk.max(1));
            let mut piece = vec![0u8; want];
            let n = if want == 0 {
                0
            } else {
                self.content.read_at(&mut piece, offset)?
            };
            if n == 0 && offset < self.size {
                return Err(changed(format!(
                    "it shrank to {offset} bytes after it was checked at {}",
                    self.size
                )));
            }
            piece.truncate(n);
            hasher.update(&piece);
            offset += n as u64;
            let last = offset == self.size;
            if last {
                if grew(&self.content, self.size)? {
                    return Err(changed(format!(
                        "it grew past the {} bytes it had when it was checked",
                        self.size
                    )));
                }
                if hex(hasher.finalize_reset()) != self.checksum {
                    return Err(changed(
                        "its content changed after it was checked".to_owned(),
                    ));
                }
            }
            if !piece.is_empty() && !send(piece) {
                return Ok(());
            }
            if last {
                return Ok(());
            }
        }
    }
}

impl perago_core::lakefs::CheckedUpload for Upload {
    fn key(&self) -> &str {
        &self.key
    }

    fn path(&self) -> &Path {
        &self.path
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn read_checked(&self, chunk: usize, send: impl FnMut(Vec<u8>) -> bool) -> io::Result<()> {
        Upload::read_checked(self, chunk, send)
    }
}

fn changed(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// Whether `file` has a byte at offset `size`.
fn grew(file: &File, size: u64) -> io::Result<bool> {
    let mut probe = [0u8; 1];
    Ok(file.read_at(&mut probe, size)? != 0)
}

fn hex(digest: impl AsRef<[u8]>) -> String {
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// The change set of one attempt.
#[derive(Debug, Default, Clone)]
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
    #[error("cannot read {}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A folder cannot be taken back from the body's user.
    #[error("cannot take {} back from the body's user: {}; nothing was published", path.display(), perago_core::errors::DisplayChain(cause))]
    TakeBack {
        /// The folder.
        path: PathBuf,
        /// The cause (mid-sentence: in the message, not a source).
        cause: io::Error,
    },
    /// Something that is neither a file nor a folder.
    #[error("{0} is not a regular file; only files are published")]
    Special(String),
    /// An entry is not what it was when the tree was taken back.
    #[error(
        "{path} changed while the workspace was read for publishing: {what}; nothing was published"
    )]
    Changed {
        /// The entry, relative to the workspace.
        path: String,
        /// How.
        what: String,
    },
    /// A file the body's user does not own (a hard link to someone else's file).
    #[error(
        "{path} is owned by uid {uid}, not by the body's uid {expected}; only the body's own files are published"
    )]
    NotOwned {
        /// The file, relative to the workspace.
        path: String,
        /// Its owner.
        uid: u32,
        /// The body's uid.
        expected: u32,
    },
    /// A symlink to nothing in the workspace.
    #[error(
        "{path} is a symlink to {target}, which is no file or folder in the workspace; refusing to publish it"
    )]
    Dangling {
        /// The link, relative to the workspace.
        path: String,
        /// Its text.
        target: String,
    },
    /// A symlink that resolves through too many others.
    #[error(
        "{path} is a symlink that does not resolve within {MAX_LINK_HOPS} links; refusing to publish it"
    )]
    LinkLoop {
        /// The link, relative to the workspace.
        path: String,
    },
}

/// Who the tree belongs to after the body, and whose files may be published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// The uid every published file must be owned by: the body's.
    pub body_uid: u32,
    /// The uid and gid every folder is given back to: the executor's.
    pub keeper: (u32, u32),
}

#[derive(Debug)]
struct FoundFile {
    relative: PathBuf,
    key: String,
    parent: Arc<Dir>,
    name: OsString,
    stat: EntryStat,
    /// Published under other keys too, through symlinks.
    linked: bool,
}

#[derive(Debug)]
enum Node {
    Dir,
    File(usize),
    Link(PathBuf),
}

/// The workspace, taken back from the body's user and listed, before any file is read.
#[derive(Debug)]
pub struct Snapshot {
    files: Vec<FoundFile>,
    /// `(key, link path, file index)` of every symlink to a file inside.
    links: Vec<(String, PathBuf, usize)>,
    work: PathBuf,
    rules: Rules,
}

impl Snapshot {
    /// Takes the tree under `work` (the held `work/` folder, at `work_path`) back for the
    /// executor and lists it (see the module doc). Reads no file.
    pub fn take(
        work: &Dir,
        work_path: &Path,
        prefix: &str,
        rules: Rules,
    ) -> Result<Self, ScanError> {
        let path_of = |relative: &Path| work_path.join(relative);
        let take_back = |dir: &Dir, relative: &Path| {
            dir.chown(rules.keeper.0, rules.keeper.1)
                .and_then(|()| dir.chmod(0o700))
                .map_err(|source| ScanError::TakeBack {
                    path: path_of(relative),
                    cause: source,
                })
        };
        let work = Arc::new(Dir::from_fd(work.as_fd()).map_err(|source| ScanError::Io {
            path: work_path.to_owned(),
            source,
        })?);
        take_back(&work, Path::new(""))?;
        let mut files = Vec::new();
        let mut nodes = BTreeMap::new();
        let mut stack = vec![(PathBuf::new(), work)];
        while let Some((relative_dir, dir)) = stack.pop() {
            let io_err = |relative: &Path| {
                let path = path_of(relative);
                move |source| ScanError::Io { path, source }
            };
            for name in dir.entries().map_err(io_err(&relative_dir))? {
                let relative = relative_dir.join(&name);
                let stat = dir.stat_at(&name).map_err(io_err(&relative))?;
                match stat.kind {
                    EntryKind::Dir => {
                        let sub = dir.open_dir(&name).map_err(io_err(&relative))?;
                        let opened = sub.stat().map_err(io_err(&relative))?;
                        if !opened.same_file(&stat) {
                            return Err(ScanError::Changed {
                                path: relative.display().to_string(),
                                what: "it is another folder now".to_owned(),
                            });
                        }
                        take_back(&sub, &relative)?;
                        nodes.insert(relative.clone(), Node::Dir);
                        stack.push((relative, Arc::new(sub)));
                    }
                    EntryKind::File => {
                        let key = relative_to_key(prefix, &relative)?;
                        nodes.insert(relative.clone(), Node::File(files.len()));
                        files.push(FoundFile {
                            relative,
                            key,
                            parent: Arc::clone(&dir),
                            name,
                            stat,
                            linked: false,
                        });
                    }
                    EntryKind::Symlink => {
                        let target = dir.read_link_at(&name).map_err(io_err(&relative))?;
                        nodes.insert(relative, Node::Link(target));
                    }
                    EntryKind::Special => {
                        return Err(ScanError::Special(relative.display().to_string()));
                    }
                }
            }
        }
        // The workspace's own path, as given and resolved, for links written as absolute paths.
        let mut anchors = vec![work_path.to_owned()];
        if let Ok(canonical) = std::fs::canonicalize(work_path)
            && canonical != work_path
        {
            anchors.push(canonical);
        }
        let mut links = Vec::new();
        for (relative, node) in &nodes {
            let Node::Link(target) = node else { continue };
            let shown = || relative.display().to_string();
            match resolve(&nodes, &anchors, relative) {
                Ok(Some(file)) => {
                    files[file].linked = true;
                    links.push((relative_to_key(prefix, relative)?, relative.clone(), file));
                }
                Ok(None) => {
                    tracing::info!(link = %relative.display(), "a symlink to a folder inside the workspace is not published");
                }
                Err(LinkProblem::Escapes) => {
                    return Err(PathError::SymlinkEscapes {
                        path: shown(),
                        target: target.display().to_string(),
                    }
                    .into());
                }
                Err(LinkProblem::Missing) => {
                    return Err(ScanError::Dangling {
                        path: shown(),
                        target: target.display().to_string(),
                    });
                }
                Err(LinkProblem::Loop) => return Err(ScanError::LinkLoop { path: shown() }),
            }
        }
        Ok(Self {
            files,
            links,
            work: work_path.to_owned(),
            rules,
        })
    }

    fn keys(&self) -> impl Iterator<Item = (&str, &FoundFile)> {
        self.files.iter().map(|f| (f.key.as_str(), f)).chain(
            self.links
                .iter()
                .map(|(k, _, i)| (k.as_str(), &self.files[*i])),
        )
    }

    /// What the publication touches at least, known before any file is read: the new keys
    /// (and their `lstat` sizes) and the removed ones. `(objects, bytes)`.
    pub fn lower_bound(&self, downloaded: &BTreeMap<String, String>) -> (u64, u64) {
        let (mut objects, mut bytes) = (0u64, 0u64);
        let mut seen = BTreeSet::new();
        for (key, file) in self.keys() {
            seen.insert(key);
            if !downloaded.contains_key(key) {
                objects += 1;
                bytes = bytes.saturating_add(file.stat.size);
            }
        }
        objects += downloaded
            .keys()
            .filter(|k| !seen.contains(k.as_str()))
            .count() as u64;
        (objects, bytes)
    }

    /// Opens, checks and hashes every file (see the module doc) and compares it with
    /// `downloaded` (key → MD5 of the bytes downloaded). Only the files to upload stay open.
    pub fn changes(self, downloaded: &BTreeMap<String, String>) -> Result<Changes, ScanError> {
        let mut opened: Vec<Option<(Arc<File>, String)>> = Vec::with_capacity(self.files.len());
        let mut changes = Changes::default();
        let mut seen = BTreeSet::new();
        let mut upload =
            |key: &str, path: &Path, file: &FoundFile, content: &(Arc<File>, String)| {
                let upload = Upload {
                    key: key.to_owned(),
                    path: path.to_owned(),
                    size: file.stat.size,
                    checksum: content.1.clone(),
                    content: Arc::clone(&content.0),
                };
                match downloaded.get(key) {
                    Some(old) if *old == content.1 => {}
                    Some(_) => changes.changed.push(upload),
                    None => changes.added.push(upload),
                }
            };
        for file in &self.files {
            let content = self.open_checked(file)?;
            seen.insert(file.key.clone());
            upload(&file.key, &file.relative, file, &content);
            // Kept open only while an upload or a link still needs it.
            opened.push(file.linked.then_some(content));
        }
        for (key, path, index) in &self.links {
            let content = opened[*index].as_ref().expect("a linked file stays open");
            seen.insert(key.clone());
            upload(key, path, &self.files[*index], content);
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

    /// Opens `file` from its held parent and hashes it, if it is still what was listed.
    fn open_checked(&self, file: &FoundFile) -> Result<(Arc<File>, String), ScanError> {
        let shown = || file.relative.display().to_string();
        let io_err = |source| ScanError::Io {
            path: self.work.join(&file.relative),
            source,
        };
        let content = file.parent.open_file(&file.name).map_err(io_err)?;
        let now = fstat(content.as_fd()).map_err(io_err)?;
        let what = if now.kind != EntryKind::File || !now.same_file(&file.stat) {
            Some("it is another file now".to_owned())
        } else if now.size != file.stat.size {
            Some(format!(
                "its size changed from {} to {} bytes",
                file.stat.size, now.size
            ))
        } else {
            None
        };
        if let Some(what) = what {
            return Err(ScanError::Changed {
                path: shown(),
                what,
            });
        }
        if now.uid != self.rules.body_uid {
            return Err(ScanError::NotOwned {
                path: shown(),
                uid: now.uid,
                expected: self.rules.body_uid,
            });
        }
        let checksum = match hash_exactly(&content, now.size).map_err(io_err)? {
            Some(checksum) => checksum,
            None => {
                return Err(ScanError::Changed {
                    path: shown(),
                    what: format!(
                        "its size changed from {} bytes while it was hashed",
                        now.size
                    ),
                });
            }
        };
        Ok((Arc::new(content), checksum))
    }
}

/// Hex MD5 of exactly the first `size` bytes of `file`; `None` if it has fewer or more.
fn hash_exactly(file: &File, size: u64) -> io::Result<Option<String>> {
    let mut hasher = Md5::new();
    let mut buf = vec![0u8; HASH_CHUNK];
    let mut offset = 0u64;
    while offset < size {
        let want = usize::try_from(size - offset)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        let n = file.read_at(&mut buf[..want], offset)?;
        if n == 0 {
            return Ok(None);
        }
        hasher.update(&buf[..n]);
        offset += n as u64;
    }
    if grew(file, size)? {
        return Ok(None);
    }
    Ok(Some(hex(hasher.finalize())))
}

#[derive(Debug, PartialEq, Eq)]
enum LinkProblem {
    Escapes,
    Missing,
    Loop,
}

enum Segment {
    Up,
    Name(OsString),
}

/// Where the symlink at `link` leads within `nodes`: `Some(file)`, or `None` for a folder;
/// resolved as the kernel would (`..` from where each link lives), but only in the snapshot.
fn resolve(
    nodes: &BTreeMap<PathBuf, Node>,
    anchors: &[PathBuf],
    link: &Path,
) -> Result<Option<usize>, LinkProblem> {
    fn push(
        todo: &mut Vec<Segment>,
        current: &mut Vec<OsString>,
        anchors: &[PathBuf],
        target: &Path,
    ) -> Result<(), LinkProblem> {
        let rest = if target.is_absolute() {
            current.clear();
            anchors
                .iter()
                .find_map(|a| target.strip_prefix(a).ok())
                .ok_or(LinkProblem::Escapes)?
        } else {
            target
        };
        let segments: Vec<_> = rest
            .components()
            .filter_map(|c| match c {
                Component::Normal(name) => Some(Segment::Name(name.to_owned())),
                Component::ParentDir => Some(Segment::Up),
                _ => None,
            })
            .collect();
        todo.extend(segments.into_iter().rev());
        Ok(())
    }
    let Some(Node::Link(target)) = nodes.get(link) else {
        return Err(LinkProblem::Missing);
    };
    let mut current: Vec<OsString> = link
        .parent()
        .into_iter()
        .flat_map(Path::components)
        .map(|c| c.as_os_str().to_owned())
        .collect();
    let mut todo = Vec::new();
    push(&mut todo, &mut current, anchors, target)?;
    let mut hops = 1;
    while let Some(segment) = todo.pop() {
        match segment {
            Segment::Up => {
                current.pop().ok_or(LinkProblem::Escapes)?;
            }
            Segment::Name(name) => {
                current.push(name);
                let here: PathBuf = current.iter().collect();
                match nodes.get(&here) {
                    None => return Err(LinkProblem::Missing),
                    Some(Node::Dir) => {}
                    // A file in the middle of a path is no folder.
                    Some(Node::File(_)) if !todo.is_empty() => return Err(LinkProblem::Missing),
                    Some(Node::File(index)) => return Ok(Some(*index)),
                    Some(Node::Link(next)) => {
                        hops += 1;
                        if hops > MAX_LINK_HOPS {
                            return Err(LinkProblem::Loop);
                        }
                        current.pop();
                        push(&mut todo, &mut current, anchors, next)?;
                    }
                }
            }
        }
    }
    Ok(None)
}

/// Hex MD5 of the file at `path`, as lakeFS reports the checksum of an API upload (for tests
/// and tools).
pub fn md5_hex(path: &Path) -> io::Result<String> {
    let file = File::open(path)?;
    let size = file.metadata()?.len();
    hash_exactly(&file, size)?.ok_or_else(|| changed("it changed while it was hashed".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{fs, os::unix::fs::symlink};

    fn write(root: &Path, rel: &str, text: &str) {
        let path = root.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    fn rules() -> Rules {
        let me = perago_sys::user::euid();
        let gid = fs::metadata("/proc/self").map_or(0, |m| std::os::unix::fs::MetadataExt::gid(&m));
        Rules {
            body_uid: me,
            keeper: (me, gid),
        }
    }

    fn take(root: &Path, prefix: &str) -> Result<Snapshot, ScanError> {
        let dir = Dir::open(root).unwrap();
        Snapshot::take(&dir, root, prefix, rules())
    }

    fn scan(
        root: &Path,
        prefix: &str,
        downloaded: &BTreeMap<String, String>,
    ) -> Result<Changes, ScanError> {
        take(root, prefix)?.changes(downloaded)
    }

    /// What an upload would send.
    fn sent(upload: &Upload) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        upload.read_checked(3, |piece| {
            out.extend(piece);
            true
        })?;
        Ok(out)
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
        assert_eq!(sent(&changes.added[0]).unwrap(), b"hello");
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
    fn the_tree_is_taken_back_before_it_is_listed() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        write(root, "sub/deep/f", "x");
        for dir in [root.to_owned(), root.join("sub"), root.join("sub/deep")] {
            fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        }
        take(root, "").unwrap();
        for dir in [root.to_owned(), root.join("sub"), root.join("sub/deep")] {
            let mode =
                std::os::unix::fs::PermissionsExt::mode(&fs::metadata(&dir).unwrap().permissions());
            assert_eq!(mode & 0o777, 0o700, "{}", dir.display());
        }
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
        fs::remove_file(root.join("etc")).unwrap();
        // Out and back in again is out: `..` is resolved from where the link lives.
        symlink("../ws/../secret", root.join("round")).unwrap();
        assert!(matches!(
            scan(&root, "", &BTreeMap::new()),
            Err(ScanError::Path(PathError::SymlinkEscapes { .. }))
        ));
        fs::remove_file(root.join("round")).unwrap();
        symlink("nothing", root.join("dangling")).unwrap();
        assert_eq!(
            scan(&root, "", &BTreeMap::new()).unwrap_err().to_string(),
            "dangling is a symlink to nothing, which is no file or folder in the workspace; refusing to publish it"
        );
        fs::remove_file(root.join("dangling")).unwrap();
        symlink("b", root.join("a")).unwrap();
        symlink("a", root.join("b")).unwrap();
        assert!(matches!(
            scan(&root, "", &BTreeMap::new()),
            Err(ScanError::LinkLoop { .. })
        ));
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
        write(root, "sub/other.txt", "other");
        symlink("real.txt", root.join("alias.txt")).unwrap();
        // Through a link to a folder, and by the workspace's absolute path.
        symlink("sub", root.join("s")).unwrap();
        symlink("s/other.txt", root.join("via.txt")).unwrap();
        symlink(root.join("sub/other.txt"), root.join("abs.txt")).unwrap();
        let changes = scan(root, "", &BTreeMap::new()).unwrap();
        let content = |key: &str| {
            let upload = changes.added.iter().find(|u| u.key == key).unwrap();
            String::from_utf8(sent(upload).unwrap()).unwrap()
        };
        assert_eq!(content("alias.txt"), "data");
        assert_eq!(content("via.txt"), "other");
        assert_eq!(content("abs.txt"), "other");
        assert_eq!(changes.added.len(), 5, "{:?}", changes.added);
    }

    /// Between the listing and the read, a file is swapped for a link to a file outside, and a
    /// folder for a link to `/etc`: what is read is what was listed, or nothing.
    #[test]
    fn what_is_swapped_after_the_listing_is_never_read() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("ws");
        write(&root, "out.txt", "mine");
        write(&root, "sub/f.txt", "in the folder");
        let secret = tmp.path().join("secret");
        fs::write(&secret, "top secret").unwrap();

        let snapshot = take(&root, "").unwrap();
        fs::remove_file(root.join("out.txt")).unwrap();
        symlink(&secret, root.join("out.txt")).unwrap();
        let err = snapshot.changes(&BTreeMap::new()).unwrap_err();
        assert!(
            matches!(err, ScanError::Io { ref source, .. } if source.raw_os_error() == Some(libc_eloop())),
            "{err:?}"
        );

        fs::remove_file(root.join("out.txt")).unwrap();
        write(&root, "out.txt", "mine");
        let snapshot = take(&root, "").unwrap();
        fs::rename(root.join("sub"), tmp.path().join("sub.moved")).unwrap();
        symlink("/etc", root.join("sub")).unwrap();
        // The folder's held descriptor still reads the folder listed.
        let changes = snapshot.changes(&BTreeMap::new()).unwrap();
        let f = changes.added.iter().find(|u| u.key == "sub/f.txt").unwrap();
        assert_eq!(sent(f).unwrap(), b"in the folder");

        // A file made again under the same name is another file.
        fs::remove_file(root.join("sub")).unwrap();
        let snapshot = take(&root, "").unwrap();
        fs::remove_file(root.join("out.txt")).unwrap();
        write(&root, "out.txt", "mine");
        assert!(matches!(
            snapshot.changes(&BTreeMap::new()),
            Err(ScanError::Changed { ref what, .. }) if what == "it is another file now"
        ));
    }

    fn libc_eloop() -> i32 {
        40
    }

    #[test]
    fn a_file_that_grows_or_changes_after_the_check_is_never_sent_whole() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        write(root, "out.txt", "checked");
        let snapshot = take(root, "").unwrap();
        // Grown between the listing and the hash.
        fs::write(root.join("out.txt"), "checked and more").unwrap();
        assert!(matches!(
            snapshot.changes(&BTreeMap::new()),
            Err(ScanError::Changed { ref what, .. }) if what.starts_with("its size changed from 7 to 16")
        ));

        fs::write(root.join("out.txt"), "checked").unwrap();
        let changes = scan(root, "", &BTreeMap::new()).unwrap();
        let upload = &changes.added[0];
        // Written to through a descriptor opened before: grown, shrunk, or the same size.
        let writer = fs::OpenOptions::new()
            .write(true)
            .open(root.join("out.txt"))
            .unwrap();
        for (content, why) in [
            (&b"checked and grown"[..], "it grew past the 7 bytes"),
            (b"check", "it shrank to 5 bytes"),
            (b"CHECKED", "its content changed after it was checked"),
        ] {
            writer.set_len(0).unwrap();
            writer.write_all_at(content, 0).unwrap();
            let mut received = Vec::new();
            let err = upload
                .read_checked(3, |piece| {
                    received.extend(piece);
                    true
                })
                .unwrap_err();
            assert!(err.to_string().starts_with(why), "{err}");
            assert!(received.len() < 7, "never the whole object: {received:?}");
        }
        writer.set_len(0).unwrap();
        writer.write_all_at(b"checked", 0).unwrap();
        assert_eq!(sent(upload).unwrap(), b"checked");
    }

    #[test]
    fn the_budget_bound_is_known_before_any_file_is_read() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        // 64 GiB, sparse: hashing it would take minutes; its size is known at once.
        let big = fs::File::create(root.join("big.bin")).unwrap();
        big.set_len(64 << 30).unwrap();
        write(root, "kept.txt", "kept");
        let downloaded = BTreeMap::from([
            ("kept.txt".to_owned(), "0".repeat(32)),
            ("gone.txt".to_owned(), "1".repeat(32)),
        ]);
        let snapshot = take(root, "").unwrap();
        assert_eq!(snapshot.lower_bound(&downloaded), (2, 64 << 30));
    }

    #[test]
    fn a_file_the_body_does_not_own_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        write(root, "mine.txt", "x");
        let dir = Dir::open(root).unwrap();
        let mut other = rules();
        other.body_uid = other.body_uid.wrapping_add(4242);
        let err = Snapshot::take(&dir, root, "", other)
            .unwrap()
            .changes(&BTreeMap::new())
            .unwrap_err();
        assert!(matches!(err, ScanError::NotOwned { .. }), "{err:?}");
        // A hard link to a file of another user (made here as root: the kernel's
        // protected_hardlinks stops others) is that user's file.
        if perago_sys::user::euid() == 0 {
            let foreign = tmp.path().join("foreign");
            write(root, "sub/x", "");
            fs::write(&foreign, "root only").unwrap();
            std::os::unix::fs::chown(&foreign, Some(4242), None).unwrap();
            fs::hard_link(&foreign, root.join("sub/linked")).unwrap();
            let err = scan(root, "", &BTreeMap::new()).unwrap_err();
            assert!(
                matches!(err, ScanError::NotOwned { uid: 4242, .. }),
                "{err:?}"
            );
        }
    }

    #[test]
    fn fifos_are_refused_without_blocking() {
        let tmp = tempfile::tempdir().unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(tmp.path().join("pipe"))
            .status()
            .unwrap();
        assert!(made.success());
        assert_eq!(
            scan(tmp.path(), "", &BTreeMap::new())
                .unwrap_err()
                .to_string(),
            "pipe is not a regular file; only files are published"
        );
    }
}
