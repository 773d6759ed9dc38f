//! The text the broker's errors with a cause render to, pinned (see `perago_core::errors`).

use perago_core::errors::{chain, repeated_cause};
use std::io;

fn samples() -> Vec<(Box<dyn std::error::Error + 'static>, &'static str)> {
    vec![
        (
            Box::new(crate::BrokerError::Socket {
                path: "/run/b.sock".into(),
                source: io::Error::other("denied"),
            }),
            "cannot serve on /run/b.sock: denied",
        ),
        (
            Box::new(crate::BrokerError::Metrics {
                addr: "127.0.0.1:9".parse().unwrap(),
                source: io::Error::other("in use"),
            }),
            "cannot serve metrics on 127.0.0.1:9: in use",
        ),
        (
            Box::new(crate::journal::JournalError::Open {
                path: "/j".into(),
                source: io::Error::other("denied"),
            }),
            "cannot open the result journal folder /j: denied",
        ),
        (
            Box::new(crate::crash_history::HistoryError::Read {
                task_id: "t1".to_owned(),
                source: perago_core::conductor::ConductorError::Status {
                    method: "GET",
                    url: "http://c/api/tasks/t1".to_owned(),
                    status: 503,
                    body: String::new(),
                },
            }),
            "cannot read earlier attempt t1: GET http://c/api/tasks/t1: HTTP 503",
        ),
    ]
}

#[test]
fn errors_render_as_before() {
    for (error, text) in samples() {
        assert_eq!(chain(error.as_ref()), text);
    }
}

/// The convention holds for every sample: no message repeats its cause's text.
#[test]
fn no_message_repeats_its_cause() {
    for (error, text) in samples() {
        assert_eq!(
            repeated_cause(error.as_ref()),
            None,
            "the message of {text:?} repeats its cause"
        );
    }
}
