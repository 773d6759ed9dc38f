//! The start of a child process of the runtime (the broker, an executor): the environment
//! check, JSONL logging, the one-thread async runtime, how a failure is printed, and the exit
//! codes the supervisor reads. Each child's `cli::main` is its configuration and its work
//! between these steps; what hardens the process itself (memory, dumpability, the root lock)
//! it does first, through the system layer.
//!
//! A step that fails has printed `error: …` on stderr (and logged it once logging is up) and
//! gives the exit code as an [`Exit`], so a child's start reads as a chain of `?`:
//!
//! ```no_run
//! use perago_core::bootstrap::{self, Exit, EXIT_OK};
//!
//! fn child_main() -> i32 {
//!     bootstrap::exit_code(start())
//! }
//!
//! fn start() -> Result<i32, Exit> {
//!     bootstrap::check_environment()?;
//!     let name: String = std::env::var("PERAGO_TASK_NAME").map_err(bootstrap::config_error)?;
//!     bootstrap::init_logging("perago-example", &name, "worker-1")?;
//!     let runtime = bootstrap::runtime()?;
//!     // Held log lines are written whenever the runtime goes idle, and when this returns.
//!     let done: Result<(), std::io::Error> =
//!         perago_core::logging::block_on(&runtime, async { Ok(()) });
//!     Ok(done.map_or_else(|e| bootstrap::failed("example failed", &e), |()| EXIT_OK))
//! }
//! ```

use std::fmt::Display;

/// The process ended as asked: a drain completed, a stop was obeyed.
pub const EXIT_OK: i32 = 0;

/// It failed at run time: logging or the async runtime could not start, a file it needs
/// (the manifest) could not be read, or its work failed. The error was printed on stderr.
pub const EXIT_FAILURE: i32 = 1;

/// Its environment cannot be run with: a variable the supervisor sets is missing, malformed
/// or not UTF-8. Nothing was started; the error names the variable.
pub const EXIT_CONFIG: i32 = 2;

/// A start that stopped early, with the exit code to end with (the error is printed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit(pub i32);

/// The exit code of a child's start: its own code, or the one a failed step gave.
pub fn exit_code(start: Result<i32, Exit>) -> i32 {
    start.unwrap_or_else(|Exit(code)| code)
}

/// Prints `error: {message}`: the environment cannot be run with ([`EXIT_CONFIG`]). An error
/// is given rendered (`DisplayChain(&e)`).
pub fn config_error(message: impl Display) -> Exit {
    eprintln!("error: {message}");
    Exit(EXIT_CONFIG)
}

/// Prints `error: {message}`: a failure before the work started ([`EXIT_FAILURE`]). An error
/// is given rendered (`DisplayChain(&e)`).
pub fn start_error(message: impl Display) -> Exit {
    eprintln!("error: {message}");
    Exit(EXIT_FAILURE)
}

/// No setting may fall back to its default because its value is not UTF-8: each bad one is
/// printed, and the start ends with [`EXIT_CONFIG`].
pub fn check_environment() -> Result<(), Exit> {
    crate::env::check_process_environment().map_err(|errors| {
        errors
            .iter()
            .for_each(|e| eprintln!("error: {}", crate::errors::DisplayChain(e)));
        Exit(EXIT_CONFIG)
    })
}

/// JSONL logging as `process` (the name its lines carry) for `task` and `worker_id`, from the
/// environment the supervisor sets; [`EXIT_FAILURE`] when it cannot start.
pub fn init_logging(process: &str, task: &str, worker_id: &str) -> Result<(), Exit> {
    crate::logging::init_worker_from_env(process, task, worker_id)
        .map_err(|e| start_error(crate::errors::DisplayChain(&e)))
}

/// The one-thread async runtime a child runs on: its work per task is a few small messages
/// and HTTP calls, and a second worker thread costs more in wake-ups and hand-offs (futex,
/// park/unpark) than it saves; thread mode has always run the children this way. It writes
/// the log lines it held when it goes idle: run it with [`crate::logging::block_on`].
/// [`EXIT_FAILURE`] when it cannot be built.
pub fn runtime() -> Result<tokio::runtime::Runtime, Exit> {
    crate::logging::idle_flushing(&mut tokio::runtime::Builder::new_current_thread())
        .enable_all()
        .build()
        .map_err(|e| {
            start_error(format_args!(
                "cannot start the async runtime: {}",
                crate::errors::DisplayChain(&e)
            ))
        })
}

/// The work failed: logged as `what` with the error, printed as `error: {message}`; gives
/// [`EXIT_FAILURE`]. The error is given rendered (`&DisplayChain(&e)`).
pub fn failed(what: &str, message: &dyn Display) -> i32 {
    tracing::error!(error = %message, "{what}");
    eprintln!("error: {message}");
    EXIT_FAILURE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_step_ends_with_its_code_and_a_start_with_its_own() {
        fn start(fail: Option<Exit>, code: i32) -> Result<i32, Exit> {
            if let Some(exit) = fail {
                return Err(exit);
            }
            Ok(code)
        }
        assert_eq!(exit_code(start(None, 75)), 75);
        assert_eq!(exit_code(start(Some(config_error("bad")), 0)), EXIT_CONFIG);
        assert_eq!(exit_code(start(Some(start_error("bad")), 0)), EXIT_FAILURE);
        assert_eq!((EXIT_OK, EXIT_FAILURE, EXIT_CONFIG), (0, 1, 2));
    }
}
