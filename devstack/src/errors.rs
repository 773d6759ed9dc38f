//! Errors of the devstack library and binary.

/// A devstack server could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum DevstackError {
    /// The listening socket could not be bound.
    #[error("failed to bind the listening socket")]
    Bind {
        #[source]
        source: std::io::Error,
    },
    /// The lakeFS access key id or secret is empty.
    #[error("lakeFS credentials must not be empty")]
    EmptyCredentials,
    /// The Conductor auth key id or secret is empty.
    #[error("Conductor auth key id and secret must not be empty (--conductor-auth KEY:SECRET)")]
    EmptyConductorCredentials,
    /// `--time-scale` was zero, negative or not finite.
    #[error("time scale must be a finite number greater than 0, got {0}")]
    InvalidTimeScale(f64),
    /// No server was asked for.
    #[error("nothing to serve: pass --conductor ADDR and/or --lakefs ADDR")]
    NothingToServe,
    /// Installing the signal handlers failed.
    #[error("failed to install signal handlers")]
    Signal {
        #[source]
        source: std::io::Error,
    },
    /// Writing the address line to stdout failed.
    #[error("failed to print the bound addresses")]
    Stdout {
        #[source]
        source: std::io::Error,
    },
}

impl DevstackError {
    /// The process exit code for this error: 2 for usage errors (as clap), 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::EmptyCredentials
            | Self::EmptyConductorCredentials
            | Self::InvalidTimeScale(_)
            | Self::NothingToServe => 2,
            Self::Bind { .. } | Self::Signal { .. } | Self::Stdout { .. } => 1,
        }
    }
}

/// Renders an error and its causes as `message: cause: cause`, one line: the same rendering as
/// `perago_core::errors::DisplayChain` (devstack does not depend on perago-core), for the
/// servers' logs and the texts they answer with.
pub(crate) struct DisplayChain<'a, E: std::error::Error + ?Sized>(pub(crate) &'a E);

impl<E: std::error::Error + ?Sized> std::fmt::Display for DisplayChain<'_, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

/// `error` and its causes as one line (see [`DisplayChain`]).
pub(crate) fn chain<E: std::error::Error + ?Sized>(error: &E) -> String {
    DisplayChain(error).to_string()
}
