//! Capped, jittered exponential backoff for retries of classified-retryable errors (poll and
//! update failures, executor reconnects). Validated at construction; the cap always holds.

use std::time::Duration;

/// Backoff settings that make no sense.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid backoff: {0}")]
pub struct BackoffError(&'static str);

/// `min · 2^attempt`, capped at `max`, with up to `jitter` of it taken off at random so that
/// many clients do not retry in lockstep.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    jitter: f64,
}

impl Backoff {
    /// `min` > 0, `max` ≥ `min`, `jitter` in `0.0..=1.0`.
    pub fn new(min: Duration, max: Duration, jitter: f64) -> Result<Self, BackoffError> {
        if min.is_zero() {
            return Err(BackoffError("the minimum delay must be above zero"));
        }
        if max < min {
            return Err(BackoffError("the maximum delay is below the minimum"));
        }
        if !(0.0..=1.0).contains(&jitter) {
            return Err(BackoffError("jitter must be between 0 and 1"));
        }
        Ok(Self { min, max, jitter })
    }

    /// The poll/update default: 0.5 s doubling to 30 s, 20 % jitter.
    pub fn default_remote() -> Self {
        Self {
            min: Duration::from_millis(500),
            max: Duration::from_secs(30),
            jitter: 0.2,
        }
    }

    /// The delay before retry number `attempt` (0 = the first retry).
    pub fn delay(&self, attempt: u32) -> Duration {
        let base = self
            .min
            .checked_mul(1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX))
            .unwrap_or(self.max)
            .min(self.max);
        let cut = base.mul_f64(self.jitter * fastrand::f64());
        base.saturating_sub(cut).max(self.min.min(base))
    }

    /// The cap.
    pub fn max(&self) -> Duration {
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_then_caps() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1), 0.0).unwrap();
        let delays: Vec<u128> = (0..8).map(|a| b.delay(a).as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1000, 1000, 1000, 1000]);
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(1));
    }

    #[test]
    fn jitter_stays_within_bounds() {
        let b = Backoff::default_remote();
        for attempt in 0..40 {
            for _ in 0..50 {
                let d = b.delay(attempt);
                assert!(d <= Duration::from_secs(30), "{d:?}");
                assert!(d >= Duration::from_millis(500), "{d:?}");
            }
        }
    }

    #[test]
    fn invalid_settings_are_refused() {
        let ms = Duration::from_millis;
        assert!(Backoff::new(Duration::ZERO, ms(1), 0.1).is_err());
        assert!(Backoff::new(ms(10), ms(1), 0.1).is_err());
        assert_eq!(
            Backoff::new(ms(1), ms(10), 1.5).unwrap_err().to_string(),
            "invalid backoff: jitter must be between 0 and 1"
        );
    }
}
