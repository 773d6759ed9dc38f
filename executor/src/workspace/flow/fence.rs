//! The attempt fence: the attempt is read back through the broker before anything is published.

use super::*;
use perago_core::attempt::AttemptSnapshot;
use std::time::Duration;

/// How long the fence keeps trying when the broker cannot read the task.
pub(super) const FENCE_PATIENCE: Duration = Duration::from_secs(10);

/// A fresh read of the attempt through the broker.
#[derive(Debug)]
pub enum FenceRead {
    /// Conductor's current view of the task.
    Fresh(Box<AttemptSnapshot>),
    /// Conductor no longer knows the task.
    Gone,
    /// The read failed; it may work if tried again.
    Unavailable(String),
}

/// Reads the attempt back (the broker's `ReloadAttempt`).
pub trait Fence: Send + Sync {
    /// One read.
    fn reload(&self) -> std::pin::Pin<Box<dyn Future<Output = FenceRead> + Send + '_>>;
}

/// The attempt fence: a positive fresh read, or FAILED. Read errors are retried for a few
/// seconds, then fail closed.
pub async fn check_fence(
    fence: &dyn Fence,
    polled: &AttemptSnapshot,
    when: &'static str,
) -> Result<(), WorkspaceFailure> {
    let deadline = tokio::time::Instant::now() + FENCE_PATIENCE;
    let mut wait = Duration::from_millis(100);
    loop {
        match fence.reload().await {
            FenceRead::Fresh(fresh) => {
                return polled
                    .fence(&fresh)
                    .map_err(|cause| WorkspaceFailure::Fence { cause, when });
            }
            FenceRead::Gone => {
                return Err(WorkspaceFailure::TaskGone {
                    task_id: polled.task_id.clone(),
                    when,
                });
            }
            FenceRead::Unavailable(cause) if tokio::time::Instant::now() >= deadline => {
                return Err(WorkspaceFailure::FenceUnavailable { cause });
            }
            FenceRead::Unavailable(cause) => {
                tracing::warn!(cause = %cause, "attempt fence read failed; retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(2));
            }
        }
    }
}
