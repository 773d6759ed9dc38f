//! Liveness on the slot stream (`PERAGO_STALL_TIMEOUT`): how long a runtime process may stay
//! silent before its peer treats it as hung. The broker pings every attached executor every
//! third of the timeout and kills one it has heard nothing from for the whole timeout; an
//! executor that hears nothing from the broker for as long and one ping period more treats it
//! as gone; the supervisor kills a broker whose `Admin.Status` has not answered for as long. A stopped process
//! (SIGSTOP, a debugger, a wedged kernel call) keeps its sockets open, so without this nobody
//! would notice it: a busy executor's lease would be extended until `timeoutSeconds`.

use crate::units::parse_duration;
use std::time::Duration;

/// The stall timeout: a duration (`30s`, `5000ms`; a bare integer is seconds), or `off`.
pub const PERAGO_STALL_TIMEOUT: &str = "PERAGO_STALL_TIMEOUT";
/// The default [`PERAGO_STALL_TIMEOUT`].
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(30);
/// The least [`PERAGO_STALL_TIMEOUT`]: pings go every third of it, and a busy 2-core machine
/// can delay a process by a good fraction of a second.
pub const MIN_STALL_TIMEOUT: Duration = Duration::from_secs(2);

/// A `PERAGO_STALL_TIMEOUT` value that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{PERAGO_STALL_TIMEOUT} {value:?}: {problem}")]
pub struct StallTimeoutError {
    /// The value as given.
    pub value: String,
    /// What is wrong with it.
    pub problem: String,
}

/// `PERAGO_STALL_TIMEOUT` from its value: unset or empty is the default, `off` turns liveness
/// off (`None`), anything else is a duration of at least [`MIN_STALL_TIMEOUT`].
pub fn stall_timeout(value: Option<&str>) -> Result<Option<Duration>, StallTimeoutError> {
    let Some(text) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(Some(DEFAULT_STALL_TIMEOUT));
    };
    if text.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    let err = |problem: String| StallTimeoutError {
        value: text.to_owned(),
        problem,
    };
    let timeout = parse_duration(text).map_err(|e| {
        err(format!(
            "{}; expected a duration such as 30s, or off",
            e.problem
        ))
    })?;
    if timeout < MIN_STALL_TIMEOUT {
        return Err(err(format!(
            "must be at least {}s (pings go every third of it)",
            MIN_STALL_TIMEOUT.as_secs()
        )));
    }
    Ok(Some(timeout))
}

/// The value to hand a child for `timeout` (read back by [`stall_timeout`]).
pub fn child_value(timeout: Option<Duration>) -> String {
    timeout.map_or_else(|| "off".to_owned(), |t| format!("{}ms", t.as_millis()))
}

/// How often a peer is pinged (or asked) within `timeout`: three chances before it is called
/// stalled.
pub fn ping_interval(timeout: Duration) -> Duration {
    timeout / 3
}

/// `timeout` as the reason texts write it: `5s`, `2.5s`.
pub fn describe(timeout: Duration) -> String {
    let ms = timeout.as_millis();
    if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{}s", timeout.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_default_turn_off_or_are_named_errors() {
        assert_eq!(stall_timeout(None), Ok(Some(DEFAULT_STALL_TIMEOUT)));
        assert_eq!(stall_timeout(Some(" ")), Ok(Some(DEFAULT_STALL_TIMEOUT)));
        assert_eq!(stall_timeout(Some("off")), Ok(None));
        assert_eq!(stall_timeout(Some("OFF")), Ok(None));
        assert_eq!(stall_timeout(Some("5")), Ok(Some(Duration::from_secs(5))));
        assert_eq!(
            stall_timeout(Some("2500ms")),
            Ok(Some(Duration::from_millis(2500)))
        );
        assert_eq!(
            stall_timeout(Some("1s")).unwrap_err().to_string(),
            "PERAGO_STALL_TIMEOUT \"1s\": must be at least 2s (pings go every third of it)"
        );
        assert_eq!(
            stall_timeout(Some("0")).unwrap_err().to_string(),
            "PERAGO_STALL_TIMEOUT \"0\": must be greater than zero; expected a duration such as 30s, or off"
        );
        assert!(stall_timeout(Some("soon")).is_err());
        assert!(stall_timeout(Some("-5s")).is_err());
    }

    #[test]
    fn a_childs_value_reads_back() {
        for t in [
            None,
            Some(Duration::from_secs(5)),
            Some(Duration::from_millis(2500)),
        ] {
            assert_eq!(stall_timeout(Some(&child_value(t))), Ok(t));
        }
        assert_eq!(describe(Duration::from_secs(5)), "5s");
        assert_eq!(describe(Duration::from_millis(2500)), "2.5s");
        assert_eq!(
            ping_interval(Duration::from_secs(30)),
            Duration::from_secs(10)
        );
    }
}
