//! Merges refused under contention (issue #24 item 6).
//!
//! lakeFS merges by compare-and-swap on the destination branch: when other writers keep moving
//! the branch, it recomputes and retries the merge internally (`BranchUpdateMaxTries` = 10, with
//! backoff) and then gives up with `429 Too many attempts, try again later`
//! (pkg/graveler/graveler.go `retryBranchUpdate`, pkg/api/controller.go `ErrTooManyTries`). The
//! branch was never updated, so the merge was not applied: a 429 is a reason to merge again, not
//! to fail the attempt and have Conductor re-run the whole body.
//!
//! [`MergeTries`] plans those tries: all of them, and the waits between them, fit in the
//! workspace's `merge_timeout_seconds` (the merge budget), each wait backing off from
//! [`FIRST_WAIT`] doubling to [`MAX_WAIT`] (jittered, so that contending executors do not retry
//! in lockstep), and a try is only started with at least [`MIN_TRY`] of the budget left.

use perago_core::backoff::Backoff;
use std::time::Duration;
use tokio::time::Instant;

/// The wait before the first retry of a merge refused 429.
pub const FIRST_WAIT: Duration = Duration::from_millis(250);
/// The longest wait between two merge tries.
pub const MAX_WAIT: Duration = Duration::from_secs(5);
/// The least budget a merge try is started with.
pub const MIN_TRY: Duration = Duration::from_secs(1);

/// The merge tries of one publish, within its budget.
#[derive(Debug, Clone)]
pub struct MergeTries {
    deadline: Instant,
    refused: u32,
    backoff: Backoff,
}

impl MergeTries {
    /// Tries that start at `now` and end within `budget`.
    pub fn new(now: Instant, budget: Duration) -> Self {
        Self {
            deadline: now + budget,
            refused: 0,
            backoff: Backoff::new(FIRST_WAIT, MAX_WAIT, 0.2).expect("valid constants"),
        }
    }

    /// The timeout of a try starting at `now`: the budget left, and never below [`MIN_TRY`].
    pub fn timeout(&self, now: Instant) -> Duration {
        self.deadline.saturating_duration_since(now).max(MIN_TRY)
    }

    /// A try was refused 429 at `now`: the wait before the next one, or `None` when the budget
    /// has no room for it (then [`refused`](Self::refused) tries were made).
    pub fn refused_at(&mut self, now: Instant) -> Option<Duration> {
        let wait = self.backoff.delay(self.refused);
        self.refused += 1;
        (now + wait + MIN_TRY <= self.deadline).then_some(wait)
    }

    /// How many tries were refused.
    pub fn refused(&self) -> u32 {
        self.refused
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_tries_back_off_within_the_budget_then_stop() {
        let start = Instant::now();
        let budget = Duration::from_secs(10);
        let mut tries = MergeTries::new(start, budget);
        assert_eq!(tries.timeout(start), budget);
        // Each try answers 429 at once; the waits grow, and the last try still has MIN_TRY.
        let mut now = start;
        let mut waits = Vec::new();
        while let Some(wait) = tries.refused_at(now) {
            assert!(
                wait >= FIRST_WAIT.mul_f64(0.8) && wait <= MAX_WAIT,
                "{wait:?}"
            );
            waits.push(wait);
            now += wait;
            assert!(tries.timeout(now) >= MIN_TRY);
            assert!(now + MIN_TRY <= start + budget);
        }
        assert!(waits.len() >= 3, "{waits:?}");
        assert!(
            waits.windows(2).all(|w| w[1] >= w[0].mul_f64(0.8)),
            "{waits:?}"
        );
        assert_eq!(tries.refused() as usize, waits.len() + 1);
    }

    #[test]
    fn a_try_that_used_the_budget_is_not_retried() {
        let start = Instant::now();
        let mut tries = MergeTries::new(start, Duration::from_secs(3));
        // The 429 came after the try had waited out most of the budget.
        assert_eq!(tries.refused_at(start + Duration::from_millis(2500)), None);
        assert_eq!(tries.refused(), 1);
        // The timeout never drops below MIN_TRY, even past the deadline.
        assert_eq!(tries.timeout(start + Duration::from_secs(5)), MIN_TRY);
    }
}
