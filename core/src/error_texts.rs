//! The text each error with a cause renders to, pinned: the convention of [`crate::errors`]
//! must not change what an operator or Conductor reads.

use std::io;

use crate::capacity::{CapacityError, CapacityProblem};
use crate::conductor::{ConductorError, PayloadError};
use crate::env::EnvDurationError;
use crate::lakefs::LakefsError;
use crate::logging::LogConfigError;
use crate::manifest::{ManifestError, SchemaError};
use crate::memory::MemoryError;
use crate::secrets::{HandOverError, ReceiveError};
use crate::units::{ByteSizeError, DurationError};

fn render(error: &(dyn std::error::Error + 'static)) -> String {
    crate::errors::chain(error)
}

fn denied() -> io::Error {
    io::Error::other("denied")
}

fn duration() -> DurationError {
    DurationError {
        value: "soon".to_owned(),
        problem: "expected a number",
    }
}

fn byte_size() -> ByteSizeError {
    ByteSizeError {
        value: "lots".to_owned(),
        problem: "expected a number",
    }
}

/// A reqwest error with a cause of its own (`builder error`, then the URL's).
fn reqwest_error() -> reqwest::Error {
    let client = crate::http::client_builder("http://c").build().unwrap();
    client.get("no url").build().unwrap_err()
}

/// Every error value of the crate that has a cause, with the text it renders to.
pub(crate) fn samples() -> Vec<(Box<dyn std::error::Error + 'static>, &'static str)> {
    vec![
        (
            Box::new(LakefsError::Transport {
                op: "upload".to_owned(),
                source: reqwest_error(),
            }),
            "lakeFS upload: builder error: relative URL without a base",
        ),
        (
            Box::new(ConductorError::Transport {
                method: "GET",
                url: "http://c/api/tasks/poll".to_owned(),
                source: reqwest_error(),
            }),
            "GET http://c/api/tasks/poll: builder error: relative URL without a base",
        ),
        (
            Box::new(PayloadError::Transport {
                uri: "http://s/k.json".to_owned(),
                source: reqwest_error(),
            }),
            "GET http://s/k.json (the task input in external storage): builder error: relative URL without a base",
        ),
        (
            Box::new(crate::lakefs::LakefsConfigError::Client(
                std::sync::Arc::new(reqwest_error()),
            )),
            "cannot build an HTTP client: builder error: relative URL without a base",
        ),
        (
            Box::new(ManifestError::Read {
                path: "/m.toml".into(),
                source: denied(),
            }),
            "cannot read manifest /m.toml: denied",
        ),
        (
            Box::new(SchemaError::Read {
                path: "/s.json".into(),
                source: denied(),
            }),
            "cannot read /s.json: denied",
        ),
        (
            Box::new(SchemaError::Json {
                path: "/s.json".into(),
                source: serde_json::from_str::<u8>("x").unwrap_err(),
            }),
            "/s.json is not valid JSON: expected value at line 1 column 1",
        ),
        (
            Box::new(LogConfigError::MaxBytes(byte_size())),
            "PERAGO_LOG_MAX_BYTES: invalid byte size \"lots\": expected a number",
        ),
        (
            Box::new(LogConfigError::Open {
                dir: "/log".into(),
                source: denied(),
            }),
            "cannot open the log folder /log: denied",
        ),
        (
            Box::new(LakefsError::Local {
                op: "upload".to_owned(),
                file: "/w/a".into(),
                source: denied(),
            }),
            "lakeFS upload: /w/a: denied",
        ),
        (
            Box::new(HandOverError::Io(denied())),
            "the secrets channel failed: denied",
        ),
        (
            Box::new(ReceiveError::Dumpable(denied())),
            "this process is still dumpable: denied",
        ),
        (
            Box::new(ReceiveError::Io(denied())),
            "the secrets channel failed: denied",
        ),
        (
            Box::new(MemoryError::Read {
                path: "/proc/meminfo".into(),
                source: denied(),
            }),
            "cannot read /proc/meminfo: denied",
        ),
        (
            Box::new(PayloadError::Location {
                path: "k.json".to_owned(),
                source: ConductorError::Status {
                    method: "GET",
                    url: "http://c/api/external".to_owned(),
                    status: 503,
                    body: String::new(),
                },
            }),
            "cannot ask Conductor where the task input \"k.json\" is stored: GET http://c/api/external: HTTP 503",
        ),
        (
            Box::new(EnvDurationError {
                name: "PERAGO_X",
                source: duration(),
            }),
            "PERAGO_X: invalid duration \"soon\": expected a number",
        ),
        (
            Box::new(CapacityError {
                problems: vec![
                    CapacityProblem::ByteSize {
                        label: "--max-rss".to_owned(),
                        source: byte_size(),
                    },
                    CapacityProblem::Duration {
                        label: "--idle".to_owned(),
                        source: duration(),
                    },
                ],
            }),
            "--max-rss: invalid byte size \"lots\": expected a number; --idle: invalid duration \"soon\": expected a number",
        ),
    ]
}

#[test]
fn errors_render_as_before() {
    for (error, text) in samples() {
        assert_eq!(render(error.as_ref()), text);
    }
}

/// The convention holds for every sample: no message repeats its cause's text (the renderer
/// adds the cause), so a printer walking `source()` shows each cause once.
#[test]
fn no_message_repeats_its_cause() {
    for (error, text) in samples() {
        assert_eq!(
            crate::errors::repeated_cause(error.as_ref()),
            None,
            "the message of {text:?} repeats its cause"
        );
    }
}
