//! How perago prints an error: its message and its causes on one line.
//!
//! The convention (nextest's, STYLE.md rule 14): an error's `Display` says what failed and
//! stops there; what caused it is its `source()` (`#[source]` or `#[from]` in thiserror). Every
//! place an error becomes text (the binaries' exit message, tracing fields, the failure reason
//! sent to Conductor, gRPC status messages, status output) renders it with [`DisplayChain`],
//! which writes `message: cause: cause`, one line, good for JSONL logs and Conductor's
//! `reasonForIncompletion`.
//!
//! Each cause is written as it is: the convention is what keeps a cause from reading twice
//! (each crate's `error_texts` tests check it with [`repeated_cause`]). A variant whose
//! message must carry its cause mid-sentence (`… ({cause}); nothing was published`) renders
//! it there with [`DisplayChain`] and does not make it a source. One third-party error prints
//! its own source: `tonic::Status` (`code: …, message: …, source: …`), so the chain ends at a
//! status; and one is its source's text: `tonic::ConnectError`, which is not written.

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
        write!(f, "{}", self.0)?;
        // A status given itself (not as a cause) is known by its type's name: `E` need not
        // be `'static`, so it cannot be downcast.
        let top = std::any::type_name::<E>();
        if top == std::any::type_name::<tonic::Status>()
            || top == std::any::type_name::<Box<tonic::Status>>()
        {
            return Ok(());
        }
        write_causes(f, self.0.source(), ": ")
    }
}

/// Writes `source` and its causes, each after `separator` (the first one too).
fn write_causes(
    f: &mut dyn fmt::Write,
    mut source: Option<&(dyn Error + 'static)>,
    separator: &str,
) -> fmt::Result {
    while let Some(cause) = source {
        if !is_transparent(cause) {
            write!(f, "{separator}{cause}")?;
        }
        if prints_its_source(cause) {
            break;
        }
        source = cause.source();
    }
    Ok(())
}

/// The causes of `error` without its own message, `cause: cause`, as [`DisplayChain`] writes
/// them; `None` when it has none. For a wrapper that says nothing an operator can use
/// (tonic's `transport error`).
pub fn causes<E: Error + ?Sized>(error: &E) -> Option<String> {
    let mut text = String::new();
    write_causes(&mut text, error.source(), ": ").expect("a String takes any text");
    text.strip_prefix(": ").map(str::to_owned)
}

impl<E: Error + ?Sized> fmt::Debug for DisplayChain<'_, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Whether `error`'s own text already shows its source, so the chain ends there:
/// `tonic::Status` writes `source: {source:?}` into its `Display`.
fn prints_its_source(error: &(dyn Error + 'static)) -> bool {
    error.is::<tonic::Status>()
}

/// Whether `error` is a wrapper whose text is its source's, so only the source is written:
/// `tonic::ConnectError` (the cause of a failed connect) displays what it wraps and gives it
/// as its source.
fn is_transparent(error: &(dyn Error + 'static)) -> bool {
    error.is::<tonic::ConnectError>()
}

/// `error` and its causes as one line: `message: cause: cause` (see [`DisplayChain`]).
pub fn chain<E: Error + ?Sized>(error: &E) -> String {
    DisplayChain(error).to_string()
}

/// Checks the convention on one error value: no message repeats the text of its own cause.
/// For the tests that walk a crate's errors; returns the offending `(message, cause)` pair.
pub fn repeated_cause<E: Error + ?Sized>(error: &E) -> Option<(String, String)> {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        if is_transparent(cause) {
            source = cause.source();
            continue;
        }
        let text = cause.to_string();
        if !text.is_empty() && message.contains(&text) {
            return Some((message, text));
        }
        if prints_its_source(cause) {
            return None;
        }
        message = text;
        source = cause.source();
    }
    None
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
        assert_eq!(causes(&error).as_deref(), Some("middle: root"));
        assert_eq!(causes(&std::io::Error::other("root")), None);
    }

    /// The renderer trusts the convention: a message that repeats its cause reads it twice,
    /// and `repeated_cause` is what finds it.
    #[test]
    fn a_message_that_repeats_its_cause_is_found() {
        let error = Repeats(std::io::Error::other("root"));
        assert_eq!(chain(&error), "old style: root: root");
        assert_eq!(
            repeated_cause(&error),
            Some(("old style: root".to_owned(), "root".to_owned()))
        );
    }

    #[derive(Debug, thiserror::Error)]
    #[error("cannot call")]
    struct Call(#[source] tonic::Status);

    /// A status shows its own source (`source: …`): the chain ends at it.
    #[test]
    fn the_chain_ends_at_a_status() {
        let status = tonic::Status::from_error(Box::new(Middle(std::io::Error::other("root"))));
        let error = Call(status);
        let text = chain(&error);
        assert!(text.starts_with("cannot call: code: "), "{text}");
        assert_eq!(text.matches("root").count(), 1, "{text}");
        assert_eq!(repeated_cause(&error), None);
    }
}
