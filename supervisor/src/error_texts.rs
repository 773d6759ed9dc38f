//! The text the supervisor's errors with a cause render to, pinned (see
//! `perago_core::errors`): the convention must not change what an operator reads.

use crate::errors::{ExpectedError, NoAnswer, ProbeError, RootError, RuntimeError};
use crate::runtime::registry::{FolderError, RegisterError};
use std::io;

fn denied() -> io::Error {
    io::Error::other("denied")
}

/// Every error value of the crate that has a cause, with the text it renders to.
pub(crate) fn samples() -> Vec<(Box<dyn std::error::Error + 'static>, &'static str)> {
    let spawn = || RuntimeError::Spawn {
        what: "the broker".to_owned(),
        source: denied(),
    };
    #[allow(unused_mut)]
    let mut samples: Vec<(Box<dyn std::error::Error + 'static>, &'static str)> = vec![
        (Box::new(spawn()), "cannot start the broker: denied"),
        (
            Box::new(RuntimeError::Control(tonic::Status::unavailable("gone"))),
            "cannot reach the broker's control service: code: 'The service is currently unavailable', message: \"gone\"",
        ),
        (
            Box::new(ExpectedError::Write {
                path: "/t.json".into(),
                source: denied(),
            }),
            "cannot write /t.json: denied",
        ),
        (
            Box::new(ExpectedError::AsyncRuntime(io::Error::other("no threads"))),
            "cannot start the async runtime: no threads",
        ),
        (
            Box::new(ExpectedError::Runtime(spawn())),
            "cannot start the broker: denied",
        ),
        (
            Box::new(ExpectedError::Runtimes(vec![
                ("a".to_owned(), spawn()),
                (
                    "b".to_owned(),
                    RuntimeError::Spawn {
                        what: "slot 1".to_owned(),
                        source: io::Error::other("no memory"),
                    },
                ),
            ])),
            "task a: cannot start the broker: denied\ntask b: cannot start slot 1: no memory",
        ),
        (
            Box::new(ExpectedError::Each(vec![
                ExpectedError::AsyncRuntime(io::Error::other("no threads")),
                ExpectedError::Root(RootError::Io {
                    path: "/r/lock".into(),
                    source: denied(),
                }),
            ])),
            "cannot start the async runtime: no threads\ncannot prepare /r/lock: denied",
        ),
        (
            Box::new(RootError::Io {
                path: "/r/lock".into(),
                source: denied(),
            }),
            "cannot prepare /r/lock: denied",
        ),
        (
            Box::new(RegisterError::Write {
                dir: "/run/p".into(),
                source: denied(),
            }),
            "cannot write a record in /run/p: denied",
        ),
        (
            Box::new(RegisterError::Folder(FolderError::NotOwned {
                dir: "/run/p".into(),
                owner: 0,
                me: 1000,
            })),
            "the supervisors' records folder /run/p is owned by uid 0, not this user (uid 1000): it is not used",
        ),
        (
            Box::new(ProbeError::NoAnswer {
                socket: "/run/b.sock".into(),
                cause: NoAnswer::Timeout,
            }),
            "no perago runtime answers at /run/b.sock: no answer within 5 s",
        ),
        (
            Box::new(ProbeError::NoAnswer {
                socket: "/run/b.sock".into(),
                cause: NoAnswer::Call(Box::new(tonic::Status::unavailable("gone away"))),
            }),
            "no perago runtime answers at /run/b.sock: gone away",
        ),
    ];
    #[cfg(feature = "dev")]
    {
        use crate::dev::DevError;
        use perago_core::lakefs::{LakefsConfigError, LakefsError};
        let local = || LakefsError::Local {
            op: "upload".to_owned(),
            file: "/seed/a".into(),
            source: denied(),
        };
        samples.extend([
            (
                Box::new(DevError::Conductor(perago_devstack::DevstackError::Bind {
                    source: io::Error::other("in use"),
                })) as Box<dyn std::error::Error>,
                "cannot start devstack: failed to bind the listening socket: in use",
            ),
            (
                Box::new(DevError::LakefsStart(
                    perago_devstack::DevstackError::Signal { source: denied() },
                )),
                "cannot start devstack lakeFS: failed to install signal handlers: denied",
            ),
            (
                Box::new(DevError::Setup(
                    perago_core::conductor::ConductorError::Status {
                        method: "POST",
                        url: "http://c/api/metadata/taskdefs".to_owned(),
                        status: 500,
                        body: String::new(),
                    },
                )),
                "cannot set up devstack: POST http://c/api/metadata/taskdefs: HTTP 500",
            ),
            (
                Box::new(DevError::ThisProgram {
                    role: "__perago-broker",
                    source: denied(),
                }),
                "cannot find this program to run the __perago-broker role: denied",
            ),
            (
                Box::new(DevError::LakefsClient(LakefsConfigError::Endpoint {
                    endpoint: "x".to_owned(),
                })),
                "cannot reach devstack lakeFS: LAKEFS_ENDPOINT \"x\" is invalid: expected an http:// or https:// URL",
            ),
            (
                Box::new(DevError::Repository(local())),
                "cannot create the dev repository: lakeFS upload: /seed/a: denied",
            ),
            (
                Box::new(DevError::SeedFolder {
                    dir: "/seed".into(),
                    source: denied(),
                }),
                "cannot read the seed folder /seed: denied",
            ),
            (
                Box::new(DevError::SeedFile {
                    path: "/seed/a".into(),
                    source: denied(),
                }),
                "cannot read /seed/a: denied",
            ),
            (
                Box::new(DevError::Seed(local())),
                "cannot seed the dev repository: lakeFS upload: /seed/a: denied",
            ),
            (
                Box::new(DevError::CommitSeed(local())),
                "cannot commit the seed: lakeFS upload: /seed/a: denied",
            ),
            (
                Box::new(ExpectedError::Dev(DevError::SeedFolder {
                    dir: "/seed".into(),
                    source: denied(),
                })),
                "cannot read the seed folder /seed: denied",
            ),
        ]);
    }
    samples
}

#[test]
fn errors_render_as_before() {
    for (error, text) in samples() {
        assert_eq!(perago_core::errors::chain(error.as_ref()), text);
    }
}

#[tokio::test]
async fn a_refused_connection_renders_its_cause_only() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("none.sock");
    let cause = perago_core::socket::connect(&socket)
        .await
        .map_err(NoAnswer::Connect)
        .unwrap_err();
    let error = ProbeError::NoAnswer {
        socket: "/run/b.sock".into(),
        cause,
    };
    assert_eq!(
        perago_core::errors::chain(&error),
        "no perago runtime answers at /run/b.sock: No such file or directory (os error 2)"
    );
}

/// The convention holds for every sample: no message repeats its cause's text.
#[test]
fn no_message_repeats_its_cause() {
    for (error, text) in samples() {
        assert_eq!(
            perago_core::errors::repeated_cause(error.as_ref()),
            None,
            "the message of {text:?} repeats its cause"
        );
    }
}
