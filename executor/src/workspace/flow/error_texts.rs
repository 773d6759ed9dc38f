//! The text the workspace's errors with a cause render to, pinned (see
//! `perago_core::errors`), including the variants whose cause sits mid-sentence.

use super::{DirChange, WorkspaceFailure};
use crate::workspace::scan::ScanError;
use perago_core::attempt::{FenceError, TaskStatus};
use perago_core::errors::{chain, repeated_cause};
use perago_core::lakefs::LakefsError;
use std::io;

fn denied() -> io::Error {
    io::Error::other("denied")
}

fn local() -> LakefsError {
    LakefsError::Local {
        op: "download".to_owned(),
        file: "/w/a/f".into(),
        source: io::Error::other("disk full"),
    }
}

fn status() -> LakefsError {
    LakefsError::Status {
        op: "merge".to_owned(),
        status: 429,
        message: "too many".to_owned(),
    }
}

fn samples() -> Vec<(Box<dyn std::error::Error + 'static>, &'static str)> {
    vec![
        (
            Box::new(WorkspaceFailure::AttemptDir {
                action: "create",
                path: "/w/a".into(),
                source: denied(),
            }),
            "cannot create the attempt directory /w/a: denied",
        ),
        (
            Box::new(WorkspaceFailure::OwnerFile {
                file: "/w/a/owner".into(),
                cause: denied(),
            }),
            "cannot record the staging branch in /w/a/owner: denied; nothing was published",
        ),
        (
            Box::new(WorkspaceFailure::AttemptDirReplaced {
                path: "/w/a".into(),
                change: DirChange::Unreadable {
                    path: "/w/a".into(),
                    source: denied(),
                },
            }),
            "the attempt directory /w/a is no longer the one this executor created and filled: cannot read /w/a: denied; its input snapshot is lost, so the change cannot be known; nothing was published",
        ),
        (
            Box::new(WorkspaceFailure::AttemptDirReplaced {
                path: "/w/a".into(),
                change: DirChange::Removed {
                    path: "/w/a".into(),
                    cause: io::Error::from(io::ErrorKind::NotFound),
                },
            }),
            "the attempt directory /w/a is no longer the one this executor created and filled: /w/a was removed (entity not found); its input snapshot is lost, so the change cannot be known; nothing was published",
        ),
        (
            Box::new(DirChange::OwnerGone { cause: denied() }),
            "its .perago-owner file is gone (denied)",
        ),
        (
            Box::new(WorkspaceFailure::Download(local())),
            "workspace download failed: lakeFS download: /w/a/f: disk full",
        ),
        (
            Box::new(WorkspaceFailure::CreateFolder {
                path: "/w/a/d".into(),
                source: denied(),
            }),
            "cannot create /w/a/d: denied",
        ),
        (
            Box::new(WorkspaceFailure::Scan(ScanError::Io {
                path: "/w/a/x".into(),
                source: denied(),
            })),
            "cannot read /w/a/x: denied",
        ),
        (
            Box::new(WorkspaceFailure::Scan(ScanError::TakeBack {
                path: "/w/a/x".into(),
                cause: denied(),
            })),
            "cannot take /w/a/x back from the body's user: denied; nothing was published",
        ),
        (
            Box::new(WorkspaceFailure::Staging(local())),
            "staging failed: lakeFS download: /w/a/f: disk full",
        ),
        (
            Box::new(WorkspaceFailure::StagingCommit(status())),
            "staging commit failed: lakeFS merge: HTTP 429: too many",
        ),
        (
            Box::new(WorkspaceFailure::Publish(status())),
            "publish failed: lakeFS merge: HTTP 429: too many",
        ),
        (
            Box::new(WorkspaceFailure::Fence {
                cause: FenceError::NotInProgress {
                    status: TaskStatus::TimedOut,
                },
                when: "before publishing",
            }),
            "stale attempt: task status is TIMED_OUT, expected IN_PROGRESS (before publishing); nothing was published",
        ),
        (
            Box::new(WorkspaceFailure::EarlierUnknown {
                branch: "main".to_owned(),
                when: "before staging",
                cause: status(),
            }),
            "publication unknown: cannot read main to learn whether an earlier attempt of this workflow task published (before staging): lakeFS merge: HTTP 429: too many; nothing was published",
        ),
        (
            Box::new(WorkspaceFailure::MergeContended {
                branch: "main".to_owned(),
                staged: "c1".to_owned(),
                tries: 3,
                budget_seconds: 30,
                last: status(),
            }),
            "publish failed: lakeFS refused all 3 merges of staging commit c1 into main within merge_timeout_seconds (30 s) because other writers kept moving main (lakeFS merge: HTTP 429: too many); nothing was published",
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
