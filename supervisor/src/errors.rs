//! Errors the command line expects, and the exit code of each.

use perago_core::{manifest::ManifestError, mode::ExecutionModeError, mode::WorkerCountError};
use std::{io, path::PathBuf, time::Duration};

#[cfg(feature = "dev")]
pub use crate::dev::DevError;
pub use crate::runtime::root::RootError;
pub use crate::status::{NoAnswer, ProbeError};

/// Thread mode cannot run this manifest.
#[derive(Debug, thiserror::Error)]
pub enum ThreadModeError {
    /// A `body.executor` binary is a process of its own.
    #[error(
        "body.executor {} cannot run in thread mode; use --execution-mode process",
        path.display()
    )]
    ExecutorBinary {
        /// The executor binary.
        path: PathBuf,
    },
}

/// Why the runtime ended with a failure.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The supervision of the runtime panicked (a bug); the other task types' runtimes drain.
    #[error("the supervision of this runtime failed: {cause}")]
    Panicked {
        /// The panic, as the task's join error tells it.
        cause: String,
    },
    /// A child process or thread cannot be started.
    #[error("cannot start {what}")]
    Spawn {
        /// What was being started.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The broker did not serve within the start-up deadline.
    #[error("the broker did not start serving on {} within {}s", socket.display(), crate::runtime::supervise::BROKER_START_DEADLINE.as_secs())]
    BrokerStart {
        /// The runtime's socket.
        socket: PathBuf,
    },
    /// The broker exited before it served.
    #[error("the broker exited during start-up ({status})")]
    BrokerDiedAtStart {
        /// Its exit status.
        status: String,
    },
    /// Another runtime's broker answers on the socket.
    #[error(
        "another runtime is running under this workspace root: {who} already answers on {}; this supervisor did not start it and will not use it (stop that runtime first)",
        socket.display()
    )]
    ForeignBroker {
        /// The runtime's socket.
        socket: PathBuf,
        /// Who answers there.
        who: String,
    },
    /// The broker's control service failed.
    #[error("cannot reach the broker's control service")]
    Control(#[from] tonic::Status),
    /// The broker exited while the runtime ran.
    #[error("the broker exited ({status}) while the runtime was running")]
    BrokerDied {
        /// Its exit status.
        status: String,
    },
    /// The broker refused a generation this supervisor announced.
    #[error(
        "the broker refused generation {generation} of slot {slot} ({reason}): the slot's generations no longer follow this supervisor's, so another process holding the control token has announced one (the runtime's credentials may have leaked); the runtime stopped rather than fight over the slot"
    )]
    GenerationRefused {
        /// The slot.
        slot: u32,
        /// The generation refused.
        generation: u64,
        /// The broker's reason.
        reason: String,
    },
    /// The drain hit the shutdown deadline and running executors were killed.
    #[error(
        "the drain did not finish within PERAGO_SHUTDOWN_FORCE_KILL_AFTER ({}s): executors still running were killed and their tasks reported FAILED",
        deadline.as_secs()
    )]
    ForceKilled {
        /// `PERAGO_SHUTDOWN_FORCE_KILL_AFTER`.
        deadline: Duration,
    },
}

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
    /// `reload` was refused or applied only in part: the supervisor's report, one line each.
    #[error("{}", .0.join("\n"))]
    Reload(Vec<String>),
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
    #[error("cannot write {}", path.display())]
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
    #[error(transparent)]
    Root(#[from] RootError),
    /// The async runtime cannot start.
    #[error("cannot start the async runtime")]
    AsyncRuntime(#[source] io::Error),
    /// Thread mode cannot run this manifest.
    #[error(transparent)]
    ThreadMode(#[from] ThreadModeError),
    /// The runtime failed (the broker died, refused a generation, another runtime owns the
    /// socket, …) or, with [`RuntimeError::ForceKilled`], its drain hit the shutdown deadline
    /// and running executors were killed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// `dev` could not set up or finish its devstack run.
    #[cfg(feature = "dev")]
    #[error(transparent)]
    Dev(#[from] DevError),
    /// `status` (or a probe) found no runtime, or a ready probe found it draining.
    #[error(transparent)]
    Probe(#[from] ProbeError),
    /// Several problems at once (several manifests, several TaskDefs), one per line.
    #[error("{}", .0.iter().map(perago_core::errors::chain).collect::<Vec<_>>().join("\n"))]
    Each(Vec<ExpectedError>),
    /// The runtimes of several task types, of which these failed: one line each, named by
    /// task.
    #[error("{}", .0.iter().map(|(task, e)| format!("task {task}: {}", perago_core::errors::DisplayChain(e))).collect::<Vec<_>>().join("\n"))]
    Runtimes(Vec<(String, RuntimeError)>),
}

impl ExpectedError {
    /// The exit code for this error.
    pub fn process_exit_code(&self) -> i32 {
        match self {
            Self::WorkerCount(_) | Self::Usage(_) => exit_codes::USAGE,
            Self::Runtime(RuntimeError::ForceKilled { .. }) => exit_codes::FORCE_KILLED,
            Self::Each(all) => all
                .first()
                .map_or(exit_codes::FAILURE, Self::process_exit_code),
            // A broker death outweighs a deadline.
            Self::Runtimes(failed)
                if failed
                    .iter()
                    .all(|(_, e)| matches!(e, RuntimeError::ForceKilled { .. })) =>
            {
                exit_codes::FORCE_KILLED
            }
            _ => exit_codes::FAILURE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(feature = "dev")]
    fn a_forced_shutdown_has_its_own_exit_code() {
        let forced = ExpectedError::from(RuntimeError::ForceKilled {
            deadline: std::time::Duration::from_secs(5),
        });
        assert_eq!(forced.process_exit_code(), exit_codes::FORCE_KILLED);
        assert_eq!(exit_codes::FORCE_KILLED, 3);
        assert_eq!(
            forced.to_string(),
            "the drain did not finish within PERAGO_SHUTDOWN_FORCE_KILL_AFTER (5s): executors still running were killed and their tasks reported FAILED"
        );
        let died = ExpectedError::from(RuntimeError::BrokerDied {
            status: "exit status: 1".to_owned(),
        });
        assert_eq!(died.process_exit_code(), exit_codes::FAILURE);
        assert_eq!(
            died.to_string(),
            "the broker exited (exit status: 1) while the runtime was running"
        );
        let failures = [
            ExpectedError::from(RootError::Locked {
                root: "/r".into(),
                pid: "7".to_owned(),
                host: "h".to_owned(),
            }),
            ExpectedError::AsyncRuntime(io::Error::other("no threads")),
            ExpectedError::from(ThreadModeError::ExecutorBinary { path: "/x".into() }),
            ExpectedError::from(DevError::Incomplete { count: 2 }),
            ExpectedError::from(ProbeError::NotServing {
                socket: "/s".into(),
                status: "NOT_SERVING",
            }),
        ];
        for failure in &failures {
            assert_eq!(
                failure.process_exit_code(),
                exit_codes::FAILURE,
                "{failure}"
            );
        }
        assert_eq!(
            failures.map(|f| perago_core::errors::chain(&f)),
            [
                "workspace root /r is locked by perago supervisor pid 7 on h",
                "cannot start the async runtime: no threads",
                "body.executor /x cannot run in thread mode; use --execution-mode process",
                "2 workflow(s) did not complete",
                "the broker at /s is NOT_SERVING (draining)",
            ]
        );
    }

    #[test]
    fn errors_keep_their_causes() {
        use std::error::Error as _;
        let error = ExpectedError::AsyncRuntime(io::Error::other("no threads"));
        assert_eq!(error.source().unwrap().to_string(), "no threads");
        let error = ExpectedError::from(RootError::Io {
            path: "/r".into(),
            source: io::Error::other("denied"),
        });
        assert!(matches!(error, ExpectedError::Root(RootError::Io { .. })));
        assert_eq!(error.source().unwrap().to_string(), "denied");
    }
}
