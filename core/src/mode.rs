//! How many executors run, and how: `-j N` and the execution mode.

use std::{fmt, str::FromStr};

/// The message for `-j 0` or a negative count, as the seed prints it.
pub const WORKER_COUNT_MESSAGE: &str = "worker process count must be at least 1";

/// `-j` below 1, or above the slot range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WorkerCountError {
    /// Zero or negative.
    #[error("worker process count must be at least 1")]
    TooSmall(i64),
    /// More slots than four-digit worker ids can name.
    #[error("worker process count must be at most 9999, got {0}")]
    TooLarge(i64),
}

/// The executor count: at least 1, at most 9999 (the slot range).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerCount(u32);

impl WorkerCount {
    /// One executor.
    pub const ONE: Self = Self(1);

    /// Checks a count as given on the command line (signed, so `-j -1` gets the same message
    /// as `-j 0`).
    pub fn new(n: i64) -> Result<Self, WorkerCountError> {
        if n < 1 {
            return Err(WorkerCountError::TooSmall(n));
        }
        if n > i64::from(crate::identity::MAX_SLOT) {
            return Err(WorkerCountError::TooLarge(n));
        }
        Ok(Self(n as u32))
    }

    /// The count.
    pub fn get(self) -> u32 {
        self.0
    }
}

/// Where task bodies run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExecutionMode {
    /// One broker process and N executor processes (the default).
    #[default]
    Process,
    /// Broker and executor slots in the supervisor process; bodies are still subprocesses.
    Thread,
}

/// An execution mode name that is neither `process` nor `thread`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid execution mode {value:?}{source_suffix}: expected process or thread")]
pub struct ExecutionModeError {
    /// The value as given.
    pub value: String,
    /// `" in PERAGO_EXECUTION_MODE"` when it came from the environment.
    source_suffix: &'static str,
}

impl FromStr for ExecutionMode {
    type Err = ExecutionModeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "process" => Ok(Self::Process),
            "thread" => Ok(Self::Thread),
            _ => Err(ExecutionModeError {
                value: s.to_owned(),
                source_suffix: "",
            }),
        }
    }
}

impl fmt::Display for ExecutionMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Process => "process",
            Self::Thread => "thread",
        })
    }
}

impl ExecutionMode {
    /// The flag wins, then `PERAGO_EXECUTION_MODE` (whose bad value is an error naming it,
    /// never a silent fallback), then `process`.
    pub fn resolve(
        flag: Option<Self>,
        env_value: Option<&str>,
    ) -> Result<Self, ExecutionModeError> {
        if let Some(mode) = flag {
            return Ok(mode);
        }
        match env_value {
            None => Ok(Self::default()),
            Some(v) => v
                .parse()
                .map_err(|e: ExecutionModeError| ExecutionModeError {
                    source_suffix: " in PERAGO_EXECUTION_MODE",
                    ..e
                }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_count_bounds() {
        assert_eq!(WorkerCount::new(1).unwrap().get(), 1);
        assert_eq!(WorkerCount::new(9999).unwrap().get(), 9999);
        for n in [0, -1, i64::MIN] {
            assert_eq!(
                WorkerCount::new(n).unwrap_err().to_string(),
                WORKER_COUNT_MESSAGE
            );
        }
        assert_eq!(
            WorkerCount::new(10_000).unwrap_err().to_string(),
            "worker process count must be at most 9999, got 10000"
        );
    }

    #[test]
    fn flag_beats_env_beats_default() {
        use ExecutionMode::*;
        assert_eq!(ExecutionMode::resolve(None, None), Ok(Process));
        assert_eq!(ExecutionMode::resolve(None, Some("thread")), Ok(Thread));
        assert_eq!(
            ExecutionMode::resolve(Some(Process), Some("thread")),
            Ok(Process)
        );
        assert_eq!(ExecutionMode::resolve(Some(Thread), None), Ok(Thread));
        // The flag wins even over a bad env value: the env is never consulted.
        assert_eq!(
            ExecutionMode::resolve(Some(Thread), Some("bogus")),
            Ok(Thread)
        );
    }

    #[test]
    fn bad_env_mode_is_an_error_naming_the_value() {
        assert_eq!(
            ExecutionMode::resolve(None, Some("threads"))
                .unwrap_err()
                .to_string(),
            r#"invalid execution mode "threads" in PERAGO_EXECUTION_MODE: expected process or thread"#
        );
        assert_eq!(
            ExecutionMode::resolve(None, Some(""))
                .unwrap_err()
                .to_string(),
            r#"invalid execution mode "" in PERAGO_EXECUTION_MODE: expected process or thread"#
        );
        assert_eq!(
            "Process".parse::<ExecutionMode>().unwrap_err().to_string(),
            r#"invalid execution mode "Process": expected process or thread"#
        );
    }
}
