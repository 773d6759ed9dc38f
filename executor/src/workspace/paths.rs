//! Mapping lakeFS keys to files and back without ever leaving the attempt directory: a key
//! with `..`, an absolute path, an empty segment or a NUL is refused, and a symlink the body
//! leaves behind is followed only when it stays inside the workspace.

use std::path::{Component, Path, PathBuf};

/// A key or file that cannot be mapped safely.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// A lakeFS key that would land outside the attempt directory.
    #[error("object key {key:?} is unsafe: {why}")]
    UnsafeKey {
        /// The key.
        key: String,
        /// Why.
        why: &'static str,
    },
    /// A symlink whose target is outside the workspace.
    #[error(
        "{path} is a symlink that points outside the workspace ({target}); refusing to publish it"
    )]
    SymlinkEscapes {
        /// The link, relative to the workspace.
        path: String,
        /// Its target.
        target: String,
    },
    /// A file name lakeFS cannot take as a key.
    #[error("{0} has a name that is not valid UTF-8")]
    NotUtf8(String),
}

/// The path, relative to the workspace, where the object `key` under `prefix` is written.
pub fn key_to_relative(prefix: &str, key: &str) -> Result<PathBuf, PathError> {
    let unsafe_key = |why| PathError::UnsafeKey {
        key: key.to_owned(),
        why,
    };
    let rest = key
        .strip_prefix(prefix)
        .ok_or_else(|| unsafe_key("it is not under the workspace prefix"))?;
    if rest.is_empty() {
        return Err(unsafe_key(
            "it names the prefix itself, not a file under it",
        ));
    }
    if rest.contains('\0') {
        return Err(unsafe_key("it contains a NUL byte"));
    }
    if rest.starts_with('/') {
        return Err(unsafe_key("it is an absolute path below the prefix"));
    }
    let mut relative = PathBuf::new();
    for segment in rest.split('/') {
        match segment {
            "" => return Err(unsafe_key("it has an empty path segment")),
            "." | ".." => return Err(unsafe_key("it has a '.' or '..' segment")),
            s => relative.push(s),
        }
    }
    // Belt and braces: every component must be a plain name.
    if !relative
        .components()
        .all(|c| matches!(c, Component::Normal(_)))
    {
        return Err(unsafe_key("it does not map to a plain relative path"));
    }
    Ok(relative)
}

/// The lakeFS key of a workspace file.
pub fn relative_to_key(prefix: &str, relative: &Path) -> Result<String, PathError> {
    let mut parts = Vec::new();
    for c in relative.components() {
        match c {
            Component::Normal(name) => parts.push(
                name.to_str()
                    .ok_or_else(|| PathError::NotUtf8(relative.display().to_string()))?,
            ),
            _ => return Err(PathError::NotUtf8(relative.display().to_string())),
        }
    }
    Ok(format!("{prefix}{}", parts.join("/")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_map_under_the_prefix() {
        assert_eq!(
            key_to_relative("data/", "data/a/b.csv"),
            Ok(PathBuf::from("a/b.csv"))
        );
        assert_eq!(key_to_relative("", "x"), Ok(PathBuf::from("x")));
        assert_eq!(
            relative_to_key("data/", Path::new("a/b.csv")),
            Ok("data/a/b.csv".to_owned())
        );
    }

    #[test]
    fn escaping_keys_are_refused() {
        for (key, why) in [
            ("data/../etc/passwd", "it has a '.' or '..' segment"),
            ("data/a/../../x", "it has a '.' or '..' segment"),
            (
                "data//etc/passwd",
                "it is an absolute path below the prefix",
            ),
            ("data/a//b", "it has an empty path segment"),
            ("data/a/", "it has an empty path segment"),
            ("data/./a", "it has a '.' or '..' segment"),
            ("data/a\0b", "it contains a NUL byte"),
            ("data/", "it names the prefix itself, not a file under it"),
            ("other/a", "it is not under the workspace prefix"),
        ] {
            assert_eq!(
                key_to_relative("data/", key),
                Err(PathError::UnsafeKey {
                    key: key.to_owned(),
                    why
                }),
                "{key:?}"
            );
        }
        assert_eq!(
            key_to_relative("", "/etc/passwd").unwrap_err().to_string(),
            "object key \"/etc/passwd\" is unsafe: it is an absolute path below the prefix"
        );
    }
}
