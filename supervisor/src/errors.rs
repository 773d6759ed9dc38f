//! Errors the command line expects, and the exit code of each.

use perago_core::{manifest::ManifestError, mode::ExecutionModeError, mode::WorkerCountError};
use std::{io, path::PathBuf};

/// Exit codes, documented in the README.
pub mod exit_codes {
    /// Success, or a clean drain.
    pub const OK: i32 = 0;
    /// Preflight, validation, lock or runtime failure.
    pub const FAILURE: i32 = 1;
    /// Bad command-line usage.
    pub const USAGE: i32 = 2;
    /// `start`: the shutdown deadline (`PERAGO_SHUTDOWN_FORCE_KILL_AFTER`) passed and running
    /// executors were killed; their tasks were reported FAILED.
    pub const FORCE_KILLED: i32 = 3;
}

/// An error the command line reports as `error: <message>` and exits with.
#[derive(Debug, thiserror::Error)]
pub enum ExpectedError {
    /// The manifest does not load.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// `check` found problems beyond the manifest itself (commands that do not exist).
    #[error("{}", .0.join("\n"))]
    CheckFailed(Vec<String>),
    /// `-j` out of range.
    #[error(transparent)]
    WorkerCount(#[from] WorkerCountError),
    /// A bad command-line value (e.g. `-j 0`, `-j 8..2`).
    #[error("{0}")]
    Usage(String),
    /// A bad `PERAGO_EXECUTION_MODE`.
    #[error(transparent)]
    ExecutionMode(#[from] ExecutionModeError),
    /// Required configuration is missing or invalid, one line per problem.
    #[error("{}", .0.join("\n"))]
    Config(Vec<String>),
    /// The TaskDef file could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The output path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The TaskDef is not registered on the Conductor server.
    #[error(
        "Conductor TaskDef '{0}' is not registered; run perago extract and register it before start"
    )]
    TaskDefMissing(String),
    /// The TaskDef could not be checked.
    #[error("cannot check TaskDef '{name}' at {url}: {cause}")]
    TaskDefCheck {
        /// The task name.
        name: String,
        /// The Conductor base URL.
        url: String,
        /// What went wrong.
        cause: String,
    },
    /// The workspace root is locked or cannot be prepared.
    #[error("{0}")]
    Root(String),
    /// The runtime failed (e.g. the broker died).
    #[error("{0}")]
    Runtime(String),
    /// The drain hit the shutdown deadline and running executors were killed.
    #[error("{0}")]
    ForceKilled(String),
    /// Several problems at once (several manifests, several TaskDefs), one per line.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Each(Vec<ExpectedError>),
}

impl ExpectedError {
    /// The exit code for this error.
    pub fn process_exit_code(&self) -> i32 {
        match self {
            Self::WorkerCount(_) | Self::Usage(_) => exit_codes::USAGE,
            Self::ForceKilled(_) => exit_codes::FORCE_KILLED,
            Self::Each(all) => all
                .first()
                .map_or(exit_codes::FAILURE, Self::process_exit_code),
            _ => exit_codes::FAILURE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forced_shutdown_has_its_own_exit_code() {
        let forced = ExpectedError::ForceKilled("deadline".to_owned());
        assert_eq!(forced.process_exit_code(), exit_codes::FORCE_KILLED);
        assert_eq!(exit_codes::FORCE_KILLED, 3);
        let died = ExpectedError::Runtime("the broker exited".to_owned());
        assert_eq!(died.process_exit_code(), exit_codes::FAILURE);
    }
}
