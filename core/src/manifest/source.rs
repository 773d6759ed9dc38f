//! A manifest as read, once: its text and the text of every file it names that defines the
//! body (its schemas), with the folder its relative paths resolve against. The supervisor
//! reads a manifest's source once per body version and hands each executor that source, so an
//! executor that starts later runs exactly what was checked, whatever happened to the files on
//! disk since (issue #26: body versions).

use super::{ManifestError, model::Manifest};
use serde::{Deserialize, Serialize};
use std::{
    collections::BTreeMap,
    io,
    path::{Path, PathBuf},
};

/// Where the files a manifest names come from while it is parsed.
pub(crate) type Reader<'a> = &'a dyn Fn(&Path) -> io::Result<String>;

/// Reads a file a manifest names from disk (a regular file, bounded).
pub(crate) fn read_file(path: &Path) -> io::Result<String> {
    crate::files::read_regular(path, crate::files::MAX_CONFIG_BYTES)
}

/// A manifest's text and the files it names, as read at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestSource {
    /// The manifest file as the user named it (for messages).
    pub path: PathBuf,
    /// Its absolute folder, resolved when it was read: relative paths resolve against it.
    pub dir: PathBuf,
    /// The manifest's TOML text.
    pub text: String,
    /// The text of each file the manifest names (its params and result schemas), by the
    /// resolved path the manifest gives it.
    pub files: BTreeMap<PathBuf, String>,
}

impl ManifestSource {
    /// Reads the manifest at `path` and every file it names, and validates it: the source and
    /// the manifest it makes.
    pub fn read(path: &Path) -> Result<(Self, Manifest), ManifestError> {
        let (text, dir) = Manifest::read_text(path)?;
        let manifest = Manifest::parse_with(path, &dir, &text, &read_file)?;
        Ok(((*manifest.source).clone(), manifest))
    }

    /// The manifest this source makes, reading nothing from disk: a file it names that the
    /// source does not hold is a read error.
    pub fn manifest(&self) -> Result<Manifest, ManifestError> {
        let read = |file: &Path| {
            self.files.get(file).cloned().ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    "not part of the manifest's snapshot",
                )
            })
        };
        Manifest::parse_with(&self.path, &self.dir, &self.text, &read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source keeps what was read: the manifest it makes is the one checked then, whatever
    /// the files on disk say later (or whether they are still there at all).
    #[test]
    fn a_source_makes_the_manifest_as_read_whatever_the_disk_says_later() {
        let tmp = tempfile::tempdir().unwrap();
        let schema = r#"{"type": "object", "required": ["n"]}"#;
        std::fs::write(tmp.path().join("params.json"), schema).unwrap();
        let manifest = |argv: &str| {
            format!(
                "[task]\nname = \"t\"\nkind = \"workspace-free\"\ntimeout_seconds = 60\nparams_schema = \"params.json\"\n[body]\ncommand = [\"{argv}\"]\n"
            )
        };
        let path = tmp.path().join("task.toml");
        std::fs::write(&path, manifest("./old.sh")).unwrap();
        let (source, loaded) = ManifestSource::read(&path).unwrap();
        assert_eq!(source.files.len(), 1, "the schema is part of the source");
        std::fs::write(&path, manifest("./new.sh")).unwrap();
        std::fs::remove_file(tmp.path().join("params.json")).unwrap();
        let again = source.manifest().unwrap();
        assert_eq!(again.body, loaded.body);
        assert_eq!(
            again.schemas.params.as_ref().unwrap().document(),
            &serde_json::from_str::<serde_json::Value>(schema).unwrap()
        );
        // Through JSON, as the executor gets it.
        let json = serde_json::to_string(&source).unwrap();
        let back: ManifestSource = serde_json::from_str(&json).unwrap();
        assert_eq!(back.manifest().unwrap().body, loaded.body);
        assert!(Manifest::load(&path).is_err(), "the disk's schema is gone");
    }
}
