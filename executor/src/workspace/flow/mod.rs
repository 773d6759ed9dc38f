//! One workspace attempt (SPEC §6): download the input prefix at a pinned commit into
//! `<root>/attempts/<execution_id>/work`, let the body change it, then — behind the attempt
//! fence — stage the change on `perago-staging-<execution_id>` cut from that same commit, commit
//! it with the attempt's metadata, fence again, and merge it into the branch. The staging
//! branch and the attempt directory are removed on every path.
//!
//! Modules: `attempt` (the [`Attempt`] from prepare to cleanup), `dir` (the attempt directory and
//! its owner file), `download`, `publish` (stage, fence, merge, settle), `fence` and `errors`.

mod attempt;
mod dir;
mod download;
#[cfg(test)]
mod error_texts;
mod errors;
mod fence;
mod publish;
#[cfg(test)]
mod tests;

pub use attempt::Attempt;
pub(crate) use dir::AttemptDir;
pub use dir::{OWNER_FILE, Owner};
pub use download::{DEFAULT_MAX_DOWNLOAD_OBJECTS, DownloadLimits};
pub use errors::{DirChange, Transfer, WorkspaceFailure};
pub use fence::{Fence, FenceRead, check_fence};
