//! The machine's clock and its execution ids are given to it, never read by it: the actor
//! passes the time with every input ([`Now`]) and the machine draws execution ids from the
//! source it was built with ([`ExecutionIds`]), so a test replays any sequence exactly.

use std::time::{Duration, Instant, SystemTime};

/// The time an input is handled at: the monotonic clock (idleness, bursts, liveness) and the
/// wall clock (dispatch times shown by `status`, task durations).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Now {
    pub(crate) instant: Instant,
    pub(crate) wall: SystemTime,
}

impl Now {
    /// `by` later on both clocks.
    #[cfg_attr(not(test), expect(dead_code, reason = "tests move the clock"))]
    pub(crate) fn after(self, by: Duration) -> Self {
        Self {
            instant: self.instant + by,
            wall: self.wall + by,
        }
    }
}

/// Where the machine's execution ids come from: one fresh id per task received.
pub(crate) struct ExecutionIds(Box<dyn FnMut() -> String + Send>);

impl ExecutionIds {
    /// Ids from `next` (the broker passes random UUIDs).
    pub(crate) fn new(next: impl FnMut() -> String + Send + 'static) -> Self {
        Self(Box::new(next))
    }

    /// `exec-1`, `exec-2`, …: ids a test can predict.
    #[cfg(test)]
    pub(crate) fn counter() -> Self {
        let mut n = 0u64;
        Self::new(move || {
            n += 1;
            format!("exec-{n}")
        })
    }

    pub(super) fn next(&mut self) -> String {
        (self.0)()
    }
}

impl std::fmt::Debug for ExecutionIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ExecutionIds")
    }
}
