//! Helpers for the end-to-end tests: run a real binary and keep everything about the run for
//! failure messages.

#![forbid(unsafe_code)]

pub mod otlp;

use std::{
    ffi::OsStr,
    fmt,
    path::Path,
    process::{Command, Output},
};

/// Environment variables that change perago's behaviour; tests start from none of them so a
/// developer's shell cannot change a result.
const SCRUBBED_PREFIXES: &[&str] = &["PERAGO_", "CONDUCTOR_", "LAKEFS_"];

/// A command to run a binary with a scrubbed environment.
pub fn command(binary: impl AsRef<OsStr>) -> Command {
    let mut cmd = Command::new(binary);
    for (key, _) in std::env::vars_os() {
        let key_text = key.to_string_lossy();
        if SCRUBBED_PREFIXES.iter().any(|p| key_text.starts_with(p)) {
            cmd.env_remove(&key);
        }
    }
    cmd
}

/// A finished run: command line, exit code, stdout and stderr.
#[derive(Debug)]
pub struct Run {
    /// The command line, for messages.
    pub command: String,
    /// The exit code (`None` if killed by a signal).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl Run {
    /// Runs `cmd` to completion.
    pub fn of(cmd: &mut Command) -> Self {
        let command = format!("{cmd:?}");
        let Output {
            status,
            stdout,
            stderr,
        } = cmd.output().unwrap_or_else(|e| {
            panic!(
                "cannot run {command}: {}",
                perago_core::errors::DisplayChain(&e)
            )
        });
        Self {
            command,
            code: status.code(),
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
        }
    }

    /// Asserts the exit code, printing the whole run if it differs.
    #[track_caller]
    pub fn expect_code(&self, code: i32) -> &Self {
        assert_eq!(self.code, Some(code), "unexpected exit code\n{self}");
        self
    }
}

impl fmt::Display for Run {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "command: {}", self.command)?;
        writeln!(f, "exit code: {:?}", self.code)?;
        writeln!(f, "--- stdout ---\n{}", self.stdout)?;
        write!(f, "--- stderr ---\n{}", self.stderr)
    }
}

/// The workspace root (the parent of this crate).
pub fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives in the workspace root")
}
