//! Durations and byte sizes as operators write them: `30s`, `5m`, `250ms`, `2GiB`.

use std::time::Duration;

/// A duration string that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {value:?}: {problem}")]
pub struct DurationError {
    /// The text as given.
    pub value: String,
    /// What is wrong with it.
    pub problem: &'static str,
}

/// Parses `<int>(ms|s|m|h)`; a bare integer is seconds. Zero, negative values and unknown
/// units are errors: a duration of zero is never what an operator meant.
pub fn parse_duration(value: &str) -> Result<Duration, DurationError> {
    let err = |problem| DurationError {
        value: value.to_owned(),
        problem,
    };
    let text = value.trim();
    if text.starts_with('-') {
        return Err(err("must be positive"));
    }
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    if digits.is_empty() {
        return Err(err("expected a number followed by ms, s, m or h"));
    }
    let n: u64 = digits.parse().map_err(|_| err("number is too large"))?;
    if n == 0 {
        return Err(err("must be greater than zero"));
    }
    let millis_per_unit: u64 = match unit {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(err("unknown unit (use ms, s, m or h)")),
    };
    n.checked_mul(millis_per_unit)
        .map(Duration::from_millis)
        .ok_or_else(|| err("number is too large"))
}

/// A byte size string that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid byte size {value:?}: {problem}")]
pub struct ByteSizeError {
    /// The text as given.
    pub value: String,
    /// What is wrong with it.
    pub problem: &'static str,
}

/// Parses `<int>[unit]` with units B, KB, MB, GB, TB (powers of 1000) and KiB, MiB, GiB, TiB
/// (powers of 1024); a bare integer is bytes. Spaces between number and unit are allowed.
pub fn parse_byte_size(value: &str) -> Result<u64, ByteSizeError> {
    let err = |problem| ByteSizeError {
        value: value.to_owned(),
        problem,
    };
    let text = value.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    if digits.is_empty() {
        return Err(err(
            "expected a number, optionally followed by a unit such as MiB or GB",
        ));
    }
    let n: u64 = digits.parse().map_err(|_| err("number is too large"))?;
    let multiplier: u64 = match unit.trim() {
        "" | "B" => 1,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        _ => {
            return Err(err(
                "unknown unit (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)",
            ));
        }
    };
    n.checked_mul(multiplier)
        .ok_or_else(|| err("number is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_every_unit() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration(" 7s "), Ok(Duration::from_secs(7)));
    }

    #[test]
    fn bad_durations_say_why() {
        let msg = |v: &str| parse_duration(v).unwrap_err().to_string();
        assert_eq!(
            msg("0"),
            r#"invalid duration "0": must be greater than zero"#
        );
        assert_eq!(
            msg("0s"),
            r#"invalid duration "0s": must be greater than zero"#
        );
        assert_eq!(msg("-5s"), r#"invalid duration "-5s": must be positive"#);
        assert_eq!(
            msg("30x"),
            r#"invalid duration "30x": unknown unit (use ms, s, m or h)"#
        );
        assert_eq!(
            msg("1.5s"),
            r#"invalid duration "1.5s": unknown unit (use ms, s, m or h)"#
        );
        assert_eq!(
            msg(""),
            r#"invalid duration "": expected a number followed by ms, s, m or h"#
        );
        assert_eq!(
            msg("s"),
            r#"invalid duration "s": expected a number followed by ms, s, m or h"#
        );
        assert_eq!(
            msg("99999999999999999999h"),
            r#"invalid duration "99999999999999999999h": number is too large"#
        );
        assert_eq!(
            msg("9999999999999999h"),
            r#"invalid duration "9999999999999999h": number is too large"#
        );
    }

    #[test]
    fn byte_sizes() {
        assert_eq!(parse_byte_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_byte_size("500 MB"), Ok(500_000_000));
        assert_eq!(parse_byte_size("1024"), Ok(1024));
        assert_eq!(parse_byte_size("3KiB"), Ok(3072));
        assert_eq!(
            parse_byte_size("2gb").unwrap_err().to_string(),
            r#"invalid byte size "2gb": unknown unit (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)"#
        );
        assert_eq!(
            parse_byte_size("GiB").unwrap_err().problem,
            "expected a number, optionally followed by a unit such as MiB or GB"
        );
        assert_eq!(
            parse_byte_size("99999999999TiB").unwrap_err().problem,
            "number is too large"
        );
    }
}
