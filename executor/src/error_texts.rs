//! The text the executor's errors with a cause render to, pinned (see `perago_core::errors`);
//! the workspace's are in `workspace::flow::error_texts`, the body protocol's in `jsonl::line`.

use crate::assignment::{HandOverError, RunnerError};
use crate::slot::SlotError;
use perago_core::errors::{chain, repeated_cause};
use std::io;

fn denied() -> io::Error {
    io::Error::other("denied")
}

fn samples() -> Vec<(Box<dyn std::error::Error + 'static>, &'static str)> {
    vec![
        (
            Box::new(RunnerError::Program {
                key: "body.command",
                source: perago_core::command::CommandError::NotOnPath {
                    program: "run".to_owned(),
                },
            }),
            "body.command: \"run\" not found on PATH",
        ),
        (
            Box::new(RunnerError::User(perago_sys::user::UserError::Lookup {
                name: "body".to_owned(),
                source: denied(),
            })),
            "cannot look up user \"body\": denied",
        ),
        (
            Box::new(HandOverError::Chown {
                uid: 1001,
                source: denied(),
            }),
            "cannot hand the workspace to body.user (uid 1001): denied",
        ),
        (
            Box::new(HandOverError::Read {
                dir: "/w".into(),
                source: denied(),
            }),
            "cannot read /w: denied",
        ),
        (
            Box::new(HandOverError::Open {
                dir: "/w/a".into(),
                source: denied(),
            }),
            "cannot open /w/a to body.user: denied",
        ),
        (
            Box::new(SlotError::Stream(tonic::Status::permission_denied("no"))),
            "the broker refused or dropped the slot stream: code: 'The caller does not have permission to execute the specified operation', message: \"no\"",
        ),
    ]
}

#[test]
fn errors_render_as_before() {
    for (error, text) in samples() {
        assert_eq!(chain(error.as_ref()), text);
    }
}

#[tokio::test]
async fn an_unreachable_broker_renders_every_cause() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("none.sock");
    let error = SlotError::Connect {
        path: path.clone(),
        source: perago_core::socket::connect(&path).await.unwrap_err(),
    };
    assert_eq!(
        chain(&error),
        format!(
            "cannot reach the broker at {}: transport error: No such file or directory (os error 2)",
            path.display()
        )
    );
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
