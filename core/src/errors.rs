//! How perago prints an error: its message and its causes on one line.
//!
//! The convention (nextest's, STYLE.md rule 14): an error's `Display` says what failed and
//! stops there; what caused it is its `source()` (`#[source]` or `#[from]` in thiserror). Every
//! place an error becomes text (the binaries' exit message, tracing fields, the failure reason
//! sent to Conductor, gRPC status messages, status output) renders it with [`DisplayChain`],
//! which writes `message: cause: cause`, one line, good for JSONL logs and Conductor's
//! `reasonForIncompletion`.
//!
//! A cause whose text is already in the line is not written again, so a third-party error
//! that prints its own cause (or a variant whose message must carry its cause mid-sentence)
//! still reads once.

use std::error::Error;
use std::fmt;

/// Renders an error and its causes as `message: cause: cause`.
///
/// ```
/// use perago_core::errors::DisplayChain;
/// #[derive(Debug, thiserror::Error)]
/// #[error("cannot read /m")]
/// struct Read(#[source] std::io::Error);
/// let error = Read(std::io::Error::other("denied"));
/// assert_eq!(DisplayChain(&error).to_string(), "cannot read /m: denied");
/// ```
pub struct DisplayChain<'a, E: Error + ?Sized>(pub &'a E);

impl<E: Error + ?Sized> fmt::Display for DisplayChain<'_, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut line = self.0.to_string();
        let mut source = self.0.source();
        while let Some(cause) = source {
            let text = cause.to_string();
            if !text.is_empty() && !line.contains(&text) {
                line.push_str(": ");
                line.push_str(&text);
            }
            source = cause.source();
        }
        f.write_str(&line)
    }
}

impl<E: Error + ?Sized> fmt::Debug for DisplayChain<'_, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// `error` and its causes as one line: `message: cause: cause` (see [`DisplayChain`]).
pub fn chain<E: Error + ?Sized>(error: &E) -> String {
    DisplayChain(error).to_string()
}

/// Checks the convention on one error value: no message repeats the text of its own cause.
/// For the tests that walk a crate's errors; returns the offending `(message, cause)` pair.
pub fn repeated_cause<E: Error + ?Sized>(error: &E) -> Option<(String, String)> {
    let mut current: &dyn Error = &ErrorRef(error);
    loop {
        let cause = current.source()?;
        let (message, text) = (current.to_string(), cause.to_string());
        if !text.is_empty() && message.contains(&text) {
            return Some((message, text));
        }
        current = cause;
    }
}

/// Lets an unsized `E` be walked as a `dyn Error`.
struct ErrorRef<'a, E: Error + ?Sized>(&'a E);

impl<E: Error + ?Sized> fmt::Debug for ErrorRef<'_, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.0, f)
    }
}

impl<E: Error + ?Sized> fmt::Display for ErrorRef<'_, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self.0, f)
    }
}

impl<E: Error + ?Sized> Error for ErrorRef<'_, E> {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.0.source()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Middle);

    #[derive(Debug, thiserror::Error)]
    #[error("middle")]
    struct Middle(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("old style: {0}")]
    struct Repeats(#[source] std::io::Error);

    #[test]
    fn the_chain_is_one_line_of_every_cause() {
        let error = Outer(Middle(std::io::Error::other("root")));
        assert_eq!(DisplayChain(&error).to_string(), "outer: middle: root");
        assert_eq!(chain(&error as &dyn Error), "outer: middle: root");
        assert_eq!(format!("{:?}", DisplayChain(&error)), "outer: middle: root");
        assert_eq!(repeated_cause(&error), None);
    }

    #[test]
    fn a_cause_already_in_the_line_is_written_once() {
        let error = Repeats(std::io::Error::other("root"));
        assert_eq!(chain(&error), "old style: root");
        assert_eq!(
            repeated_cause(&error),
            Some(("old style: root".to_owned(), "root".to_owned()))
        );
    }
}
