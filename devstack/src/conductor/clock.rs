//! Wall-clock time in epoch milliseconds (the server's timestamp unit) and the time scale that
//! shortens every Conductor duration for tests.
//!
//! Timestamps in the API stay real epoch milliseconds; only the durations that come from
//! definitions and results (`responseTimeoutSeconds`, `timeoutSeconds`, `pollTimeoutSeconds`,
//! retry delays, `callbackAfterSeconds`, `startDelay`) are multiplied by the scale when the
//! server turns them into deadlines. The default TaskDef's 60 s retry delay and 3600 s response
//! timeout would otherwise make such tests impossible.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// How much real time one Conductor second takes: 1.0 is real time, 0.01 runs timeouts and
/// retry delays a hundred times faster.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimeScale(f64);

impl TimeScale {
    /// Real time.
    pub const REAL: Self = Self(1.0);

    /// A scale factor; it must be finite and greater than zero.
    pub fn new(factor: f64) -> Option<Self> {
        (factor.is_finite() && factor > 0.0).then_some(Self(factor))
    }

    /// The factor.
    pub fn factor(self) -> f64 {
        self.0
    }

    /// Real milliseconds for `seconds` Conductor seconds.
    pub(crate) fn secs_to_ms(self, seconds: i64) -> i64 {
        self.ms(seconds.saturating_mul(1000))
    }

    /// The real time (epoch ms) `seconds` Conductor seconds after `from_ms`, saturating: absurd
    /// values from clients (`callbackAfterSeconds: 9223372036854775807`) must not overflow.
    pub(crate) fn after(self, from_ms: i64, seconds: i64) -> i64 {
        from_ms.saturating_add(self.secs_to_ms(seconds))
    }

    /// Real milliseconds for `ms` Conductor milliseconds.
    pub(crate) fn ms(self, ms: i64) -> i64 {
        // Saturating float-to-int cast: absurd durations clamp instead of wrapping.
        (ms as f64 * self.0).round() as i64
    }
}

impl Default for TimeScale {
    fn default() -> Self {
        Self::REAL
    }
}

/// Longest wait [`ms_duration`] returns; far enough for any deadline, short enough that adding
/// it to an `Instant` cannot overflow.
const MAX_WAIT: Duration = Duration::from_secs(365 * 24 * 3600);

/// A millisecond count as a `Duration`: negative counts are zero, huge ones are capped.
pub(crate) fn ms_duration(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0)).min(MAX_WAIT)
}
