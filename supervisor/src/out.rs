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
