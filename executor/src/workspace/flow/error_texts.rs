//! The text the workspace's errors with a cause render to, pinned (see
//! `perago_core::errors`), including the variants whose cause sits mid-sentence.

use super::WorkspaceFailure;
use perago_core::errors::chain;
use perago_core::lakefs::LakefsError;
use std::io;

#[test]
fn errors_render_as_before() {
    let cases = [
        (
            WorkspaceFailure::AttemptDir {
                action: "create",
                path: "/w/a".into(),
                source: io::Error::other("denied"),
            },
            "cannot create the attempt directory /w/a: denied",
        ),
        (
            WorkspaceFailure::OwnerFile {
                file: "/w/a/owner".into(),
                source: io::Error::other("denied"),
            },
            "cannot record the staging branch in /w/a/owner: denied; nothing was published",
        ),
        (
            WorkspaceFailure::Download(LakefsError::Local {
                op: "download".to_owned(),
                file: "/w/a/f".into(),
                source: io::Error::other("disk full"),
            }),
            "workspace download failed: lakeFS download: /w/a/f: disk full",
        ),
    ];
    for (error, text) in cases {
        assert_eq!(chain(&error), text);
    }
}
