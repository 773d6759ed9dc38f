//! What can be wrong with a manifest, with the file and key it concerns.

use std::{fmt, io, path::PathBuf};

/// One thing wrong with a manifest: the dotted key (`task.retry_count`, `body.command`) and
/// what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Dotted key path, e.g. `workspace.publish_budget.max_bytes`.
    pub key: String,
    /// What is wrong, e.g. `must be at least 1, found 0`.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

/// A manifest that could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The file could not be read.
    #[error("cannot read manifest {}", path.display())]
    Read {
        /// The manifest path as given.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The file is not valid TOML: one line, `manifest <path>:<line>:<column>: …`.
    #[error("manifest {}{}: not valid TOML: {message}", path.display(), position.map(|(l, c)| format!(":{l}:{c}")).unwrap_or_default())]
    Syntax {
        /// The manifest path as given.
        path: PathBuf,
        /// The line and column (1-based, in characters) the parser points at.
        position: Option<(usize, usize)>,
        /// The parser's message on one line, without the source line it quotes.
        message: String,
    },
    /// The TOML is valid but the manifest is not: every problem found, one per line, each
    /// prefixed with the manifest path.
    #[error("{}", render(path, problems))]
    Invalid {
        /// The manifest path as given.
        path: PathBuf,
        /// Every problem found, in file order.
        problems: Vec<Problem>,
    },
}

fn render(path: &std::path::Path, problems: &[Problem]) -> String {
    problems
        .iter()
        .map(|p| format!("manifest {}: {p}", path.display()))
        .collect::<Vec<_>>()
        .join("\n")
}
