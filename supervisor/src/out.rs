//! Standard output for the commands' reports: a reader that went away (`check … | head -0`)
//! ends the command quietly instead of panicking as `print!` does on EPIPE; any other write
//! error is reported.

use crate::errors::ExpectedError;
use std::io::{self, Write as _};

/// Writes `text` to standard output and flushes it.
pub(crate) fn print(text: &str) -> Result<(), ExpectedError> {
    let mut out = io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => Err(ExpectedError::Write {
            path: "standard output".into(),
            source: e,
        }),
        _ => Ok(()),
    }
}

/// Writes `text` to standard output and flushes it; `false` when the reader went away (a
/// command that follows something stops then).
pub(crate) fn print_while_read(text: &str) -> Result<bool, ExpectedError> {
    let mut out = io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(ExpectedError::Write {
            path: "standard output".into(),
            source: e,
        }),
    }
}
