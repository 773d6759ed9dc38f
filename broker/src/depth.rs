//! Reading the task type's queue depth (run once, adaptive executor count): the route the API
//! keeps (`GET /tasks/queue/size`), then the deprecated one (`GET /tasks/queue/sizes`) when that
//! fails. A failure of both is logged at warn once, and once more (at info) when a read works
//! again; the machine then falls back to what polls show (see `state.rs`, run once).

use perago_core::conductor::ConductorClient;
use std::sync::atomic::{AtomicBool, Ordering};

/// Reads the depth of `task_type`; `None` when neither route answers with one. `failing`
/// remembers across reads whether the last one failed, so each change is logged once.
pub(crate) async fn read(
    client: &ConductorClient,
    task_type: &str,
    failing: &AtomicBool,
) -> Option<u64> {
    let first = match client.queue_size(task_type).await {
        Ok(depth) => return Some(recovered(depth, failing)),
        Err(e) => e,
    };
    match client.queue_sizes(task_type).await {
        Ok(depth) => Some(recovered(depth, failing)),
        Err(second) => {
            if !failing.swap(true, Ordering::AcqRel) {
                tracing::warn!(
                    task = task_type,
                    error = %first,
                    fallback_error = %second,
                    "cannot read the queue depth; run once ends after {} empty polls in a row \
                     instead, the adaptive executor count keeps the last depth read; polling \
                     goes on (logged again when a read works)",
                    crate::state::ONCE_EMPTY_POLLS
                );
            }
            None
        }
    }
}

fn recovered(depth: u64, failing: &AtomicBool) -> u64 {
    if failing.swap(false, Ordering::AcqRel) {
        tracing::info!(depth, "the queue depth can be read again");
    }
    depth
}
