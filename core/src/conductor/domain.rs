//! Task domains: the name a worker polls under (`…/poll/batch/{type}?domain=D`), and the
//! queue Conductor keeps for it (`D:type`, `QueueUtils.getQueueName`).
//!
//! Conductor itself checks nothing in a domain; what it does with one fixes what can be in it:
//! the queue name joins it to the type with `:`, and puts the execution namespace after `@`;
//! `taskToDomain` lists domains split at `,` (and trimmed), where `NO_DOMAIN` (any case) means
//! the default queue and `*` is the key for every task type. A domain that holds any of these
//! would name another queue than the one its workflows use, so one is refused: a domain is
//! 1 to 255 ASCII letters, digits, `_`, `-` and `.`, and not `NO_DOMAIN`.

use std::fmt;

/// The longest domain taken.
pub const MAX_DOMAIN_LEN: usize = 255;

/// A domain a worker can poll in.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Domain(String);

/// A domain that cannot be polled in, and why (the caller names the setting).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("domain {value:?}: {problem}")]
pub struct DomainError {
    /// As given.
    pub value: String,
    /// Why.
    pub problem: &'static str,
}

impl Domain {
    /// `value` as a domain, or why it cannot be one.
    pub fn parse(value: &str) -> Result<Self, DomainError> {
        let err = |problem| DomainError {
            value: value.to_owned(),
            problem,
        };
        if value.is_empty() {
            return Err(err(
                "empty (leave the setting out to poll the default queue)",
            ));
        }
        if value.len() > MAX_DOMAIN_LEN {
            return Err(err("longer than 255 characters"));
        }
        if value.eq_ignore_ascii_case("NO_DOMAIN") {
            return Err(err(
                "NO_DOMAIN is taskToDomain's word for the default queue, which a worker polls \
                 without a domain",
            ));
        }
        if !value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        {
            return Err(err(
                "only ASCII letters, digits, '_', '-' and '.' can be in a domain (Conductor \
                 splits taskToDomain at ',', names the queue DOMAIN:TYPE and trims spaces)",
            ));
        }
        Ok(Self(value.to_owned()))
    }

    /// The domain as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Domain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Conductor's queue for `task_type` in `domain` (`QueueUtils.getQueueName`): the type alone
/// without a domain, else `domain:type`.
pub fn queue_name(task_type: &str, domain: Option<&Domain>) -> String {
    match domain {
        None => task_type.to_owned(),
        Some(domain) => format!("{domain}:{task_type}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_domain_is_what_names_its_own_queue() {
        for good in ["blue", "gpu-1", "tenant_42", "v2.3", "A"] {
            assert_eq!(Domain::parse(good).unwrap().as_str(), good);
        }
        for (bad, problem) in [
            ("", "empty"),
            ("a,b", "only ASCII"),
            ("a:b", "only ASCII"),
            (" blue", "only ASCII"),
            ("blue@ns", "only ASCII"),
            ("*", "only ASCII"),
            ("bl\u{e9}", "only ASCII"),
            ("no_domain", "NO_DOMAIN"),
        ] {
            let err = Domain::parse(bad).unwrap_err();
            assert!(err.problem.contains(problem), "{bad:?}: {err}");
            assert!(err.to_string().starts_with("domain "), "{err}");
        }
        assert!(Domain::parse(&"x".repeat(255)).is_ok());
        assert!(Domain::parse(&"x".repeat(256)).is_err());
    }

    #[test]
    fn the_queue_of_a_domain_is_prefixed_by_it() {
        let blue = Domain::parse("blue").unwrap();
        assert_eq!(queue_name("sum", Some(&blue)), "blue:sum");
        assert_eq!(queue_name("sum", None), "sum");
    }
}
