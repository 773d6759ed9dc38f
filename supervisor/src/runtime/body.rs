//! Body versions (issue #26 item 4): the body a runtime's executors run is an immutable
//! snapshot of the manifest as it was checked (its text and the schema files it names), version
//! 1 at start. Each executor starts from the snapshot of its slot's version, never from the
//! file on disk: editing task.toml changes nothing until a roll takes it as version N+1.
//!
//! Process mode: each version's source is written once, as JSON, to
//! `<runtime dir>/body/<version>.json` (beside the broker's socket, in the root's private 0700
//! runtime folder; the folder `body` 0700, each file 0600) and the executor
//! reads it at start ([`perago_core::env::PERAGO_BODY`]). Thread mode: the executor thread
//! takes the version's `Arc<Manifest>`; its bodies are the commands it spawns, so a new
//! version is simply a new manifest for the next executor thread.

use perago_core::manifest::{BodyKind, Manifest};
use std::{
    collections::BTreeMap,
    io,
    path::{Path, PathBuf},
    sync::Arc,
};

/// What [`Actor::roll`](super::actor) answers: the version that rolls in (`None`: the body is
/// unchanged), or every problem.
pub(crate) type RollResult = Result<Option<u32>, Vec<String>>;

/// A reload's request to one runtime: roll `snapshot` in, answer on `reply`.
#[derive(Debug)]
pub(crate) struct RollRequest {
    pub(crate) snapshot: Snapshot,
    pub(crate) reply: tokio::sync::oneshot::Sender<RollResult>,
}

/// The folder under the runtime directory holding each body version's source.
pub(crate) const BODY_DIR: &str = "body";

/// One body version: its number and the manifest it was taken from.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    pub(crate) manifest: Arc<Manifest>,
}

/// How a re-read manifest differs from the running version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change {
    /// Nothing that matters here changed.
    Same,
    /// The body changed (the fields named, e.g. `body.env`): a new version rolls.
    Body(Vec<&'static str>),
}

/// Compares `next` with the running `current`: the body fields that differ, or (an error) the
/// fields that are not the body's and differ (the TaskDef's, the workspace's, `[dev]`): such a
/// change cannot roll and is refused as a whole.
pub(crate) fn compare(current: &Manifest, next: &Manifest) -> Result<Change, Vec<String>> {
    let mut refused = Vec::new();
    let (a, b) = (&current.task, &next.task);
    let task_fields: [(&str, bool); 10] = [
        ("task.name", a.name == b.name),
        ("task.kind", a.kind == b.kind),
        ("task.description", a.description == b.description),
        ("task.owner_email", a.owner_email == b.owner_email),
        (
            "task.timeout_seconds",
            a.timeout_seconds == b.timeout_seconds,
        ),
        (
            "task.response_timeout_seconds",
            a.response_timeout_seconds == b.response_timeout_seconds,
        ),
        ("task.retry_count", a.retry_count == b.retry_count),
        ("task.retry_logic", a.retry_logic == b.retry_logic),
        (
            "task.retry_delay_seconds",
            a.retry_delay_seconds == b.retry_delay_seconds,
        ),
        ("task.timeout_policy", a.timeout_policy == b.timeout_policy),
    ];
    for (field, same) in task_fields {
        if !same {
            refused.push(format!(
                "{field} changed: it is part of the TaskDef Conductor holds; restart the runtime to change it"
            ));
        }
    }
    if current.workspace != next.workspace {
        refused.push(
            "workspace changed: the workspace settings do not roll; restart the runtime to change them"
                .to_owned(),
        );
    }
    if !refused.is_empty() {
        return Err(refused);
    }
    let mut changed = Vec::new();
    let (x, y) = (&current.body, &next.body);
    match (&x.kind, &y.kind) {
        (
            BodyKind::Command {
                argv: a,
                protocol: p,
            },
            BodyKind::Command {
                argv: b,
                protocol: q,
            },
        ) => {
            if a != b {
                changed.push("body.command");
            }
            if p != q {
                changed.push("body.protocol");
            }
        }
        (k, l) if k != l => changed.push("body.executor"),
        _ => {}
    }
    if x.env != y.env {
        changed.push("body.env");
    }
    if x.user != y.user {
        changed.push("body.user");
    }
    if x.soft_time_limit != y.soft_time_limit {
        changed.push("body.soft_time_limit");
    }
    if x.memory_limit != y.memory_limit {
        changed.push("body.memory_limit");
    }
    // A deploy that switches a symlinked folder (`current -> releases/7`): the bodies of the
    // new version run from the folder it resolves to now.
    if current.dir != next.dir {
        changed.push("the manifest's folder");
    }
    if current.guardrails != next.guardrails {
        changed.push("guardrails");
    }
    let document =
        |s: &Option<perago_core::manifest::Schema>| s.as_ref().map(|s| s.document().clone());
    if document(&current.schemas.params) != document(&next.schemas.params)
        || a.params_schema != b.params_schema
    {
        changed.push("task.params_schema");
    }
    if document(&current.schemas.result) != document(&next.schemas.result)
        || a.result_schema != b.result_schema
    {
        changed.push("task.result_schema");
    }
    Ok(if changed.is_empty() {
        Change::Same
    } else {
        Change::Body(changed)
    })
}

/// A runtime's body versions: each one taken so far (executors of an old version may still
/// run it) and the newest, which every new executor gets.
#[derive(Debug)]
pub(crate) struct Bodies {
    /// Process mode: where each version's source is written (`None`: thread mode).
    dir: Option<PathBuf>,
    versions: BTreeMap<u32, Arc<Manifest>>,
}

impl Bodies {
    /// Version 1: `manifest`, as the runtime checked it at start. Process mode (`dir` given):
    /// the folder is made afresh (0700) and the version's source written there.
    pub(crate) fn new(manifest: Arc<Manifest>, dir: Option<PathBuf>) -> io::Result<Self> {
        if let Some(dir) = &dir {
            match std::fs::remove_dir_all(dir) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            use std::os::unix::fs::DirBuilderExt as _;
            std::fs::DirBuilder::new().mode(0o700).create(dir)?;
        }
        let mut bodies = Self {
            dir,
            versions: BTreeMap::new(),
        };
        bodies.add(manifest)?;
        Ok(bodies)
    }

    /// The newest version.
    #[cfg(test)]
    pub(crate) fn current(&self) -> u32 {
        self.versions.keys().next_back().copied().unwrap_or(1)
    }

    /// The manifest of the newest version.
    pub(crate) fn current_manifest(&self) -> &Arc<Manifest> {
        self.versions
            .values()
            .next_back()
            .expect("version 1 at least")
    }

    /// Takes `manifest` as the next version; returns its number.
    pub(crate) fn add(&mut self, manifest: Arc<Manifest>) -> io::Result<u32> {
        let version = self.versions.keys().next_back().map_or(1, |v| v + 1);
        if let Some(dir) = &self.dir {
            let json = serde_json::to_vec(&*manifest.source).map_err(io::Error::other)?;
            let file = Self::file_in(dir, version);
            let temporary = file.with_extension("json.new");
            // What a write that failed half-way (a full disk) left: the next try takes the
            // same version number.
            match std::fs::remove_file(&temporary) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            use std::{io::Write as _, os::unix::fs::OpenOptionsExt as _};
            let mut out = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&temporary)?;
            out.write_all(&json)?;
            out.sync_all()?;
            std::fs::rename(&temporary, &file)?;
        }
        self.versions.insert(version, manifest);
        Ok(version)
    }

    /// What an executor of `version` starts from: its manifest, and (process mode) the file
    /// holding its source.
    pub(crate) fn get(&self, version: u32) -> Option<(Arc<Manifest>, Option<PathBuf>)> {
        let manifest = self.versions.get(&version)?;
        Some((
            Arc::clone(manifest),
            self.dir.as_ref().map(|d| Self::file_in(d, version)),
        ))
    }

    fn file_in(dir: &Path, version: u32) -> PathBuf {
        dir.join(format!("{version}.json"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(dir: &Path, extra_task: &str, body: &str) -> Manifest {
        let text = format!(
            "[task]\nname = \"t\"\nkind = \"workspace-free\"\ntimeout_seconds = 60\n{extra_task}\n[body]\n{body}\n"
        );
        Manifest::parse(&dir.join("task.toml"), dir, &text).unwrap()
    }

    #[test]
    fn a_body_change_rolls_and_a_taskdef_change_is_refused_naming_the_field() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        let v1 = manifest(d, "", "command = [\"./a.sh\"]\nenv = { V = \"1\" }");
        assert_eq!(compare(&v1, &v1.clone()), Ok(Change::Same));
        let env = manifest(d, "", "command = [\"./a.sh\"]\nenv = { V = \"2\" }");
        assert_eq!(compare(&v1, &env), Ok(Change::Body(vec!["body.env"])));
        let command = manifest(d, "", "command = [\"./b.sh\"]\nenv = { V = \"1\" }");
        assert_eq!(
            compare(&v1, &command),
            Ok(Change::Body(vec!["body.command"]))
        );
        let moved = tempfile::tempdir().unwrap();
        let release = manifest(
            moved.path(),
            "",
            "command = [\"./a.sh\"]\nenv = { V = \"1\" }",
        );
        assert_eq!(
            compare(&v1, &release),
            Ok(Change::Body(vec!["the manifest's folder"])),
            "a new release folder rolls"
        );
        let retries = manifest(d, "retry_count = 9", "command = [\"./b.sh\"]");
        let refused = compare(&v1, &retries).unwrap_err();
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert!(
            refused[0].starts_with("task.retry_count changed"),
            "{refused:?}"
        );
    }

    #[test]
    fn each_version_is_written_once_private_and_kept() {
        use std::os::unix::fs::PermissionsExt as _;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join(BODY_DIR);
        let v1 = Arc::new(manifest(tmp.path(), "", "command = [\"./a.sh\"]"));
        let mut bodies = Bodies::new(v1, Some(dir.clone())).unwrap();
        assert_eq!(bodies.current(), 1);
        let v2 = Arc::new(manifest(tmp.path(), "", "command = [\"./b.sh\"]"));
        assert_eq!(bodies.add(v2).unwrap(), 2);
        assert_eq!(bodies.current(), 2);
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let (m1, f1) = bodies.get(1).unwrap();
        let f1 = f1.unwrap();
        let mode = std::fs::metadata(&f1).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let lookup =
            |name: &str| (name == perago_core::env::PERAGO_BODY).then(|| f1.display().to_string());
        let read = perago_executor::cli::manifest_from(lookup, Path::new("/nonexistent")).unwrap();
        assert_eq!(read.body, m1.body);
    }

    /// A write that failed half-way leaves `N.json.new`: the next try of that version
    /// replaces it. An executor refuses a version file that is a symlink (the supervisor never
    /// writes one).
    #[test]
    fn a_half_written_version_is_written_again_and_a_symlink_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join(BODY_DIR);
        let v1 = Arc::new(manifest(tmp.path(), "", "command = [\"./a.sh\"]"));
        let mut bodies = Bodies::new(v1, Some(dir.clone())).unwrap();
        std::fs::write(dir.join("2.json.new"), "{\"half").unwrap();
        let v2 = Arc::new(manifest(tmp.path(), "", "command = [\"./b.sh\"]"));
        assert_eq!(bodies.add(v2).unwrap(), 2);
        assert!(!dir.join("2.json.new").exists());
        let (_, f2) = bodies.get(2).unwrap();
        let link = dir.join("link.json");
        std::os::unix::fs::symlink(f2.unwrap(), &link).unwrap();
        let lookup = |name: &str| {
            (name == perago_core::env::PERAGO_BODY).then(|| link.display().to_string())
        };
        let err =
            perago_executor::cli::manifest_from(lookup, Path::new("/nonexistent")).unwrap_err();
        assert!(err.starts_with("cannot read the body version"), "{err}");
    }
}
