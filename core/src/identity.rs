//! Worker identity: the prefix, the per-slot executor worker ids and the broker's id.
//!
//! `prodAFeaturesBuild` + slot 2 → `prodAFeaturesBuild0002`; the broker is
//! `prodAFeaturesBuildBroker`. Without `PERAGO_WORKER_ID_PREFIX` the prefix is the task name's
//! ASCII alphanumerics (`features.build` → `featuresbuild`). A restarted slot keeps its id, so
//! log folders and Conductor's `workerId` stay stable per slot.

use std::fmt;

/// The highest slot number: worker ids carry the slot as four digits.
pub const MAX_SLOT: u32 = 9999;

/// The longest prefix: log folders are named `worker_id=<prefix>Broker`, within the 255-byte
/// file name limit.
pub const MAX_PREFIX_BYTES: usize = 200;

/// A worker id prefix that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrefixError {
    /// The task name has no ASCII letter or digit to derive a prefix from.
    #[error(
        "cannot derive a worker id prefix from task name {task_name:?}: it has no ASCII letters or digits; set PERAGO_WORKER_ID_PREFIX"
    )]
    NothingToDerive {
        /// The task name.
        task_name: String,
    },
    /// `PERAGO_WORKER_ID_PREFIX` holds characters outside `[A-Za-z0-9_-]`, nothing, or more
    /// than [`MAX_PREFIX_BYTES`].
    #[error(
        "PERAGO_WORKER_ID_PREFIX {value:?} is invalid: use one to 200 of A-Z, a-z, 0-9, _ and -"
    )]
    Invalid {
        /// The value as given.
        value: String,
    },
}

/// The prefix every worker id of one runtime starts with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerPrefix(String);

impl WorkerPrefix {
    /// The prefix derived from a task name: its ASCII alphanumerics.
    pub fn derive(task_name: &str) -> Result<Self, PrefixError> {
        let prefix: String = task_name
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .collect();
        if prefix.is_empty() {
            return Err(PrefixError::NothingToDerive {
                task_name: task_name.to_owned(),
            });
        }
        Ok(Self(prefix))
    }

    /// An explicit prefix, which must match `[A-Za-z0-9_-]+`.
    pub fn explicit(value: &str) -> Result<Self, PrefixError> {
        let valid = !value.is_empty()
            && value.len() <= MAX_PREFIX_BYTES
            && value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid {
            return Err(PrefixError::Invalid {
                value: value.to_owned(),
            });
        }
        Ok(Self(value.to_owned()))
    }

    /// `PERAGO_WORKER_ID_PREFIX` when set (even if empty, which is an error), else derived.
    pub fn resolve(task_name: &str, env_value: Option<&str>) -> Result<Self, PrefixError> {
        match env_value {
            Some(value) => Self::explicit(value),
            None => Self::derive(task_name),
        }
    }

    /// The prefix itself.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The worker id of an executor slot.
    pub fn worker_id(&self, slot: Slot) -> String {
        format!("{}{slot}", self.0)
    }

    /// The broker's Conductor worker id.
    pub fn broker_id(&self) -> String {
        format!("{}Broker", self.0)
    }
}

impl fmt::Display for WorkerPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A slot number outside 1..=9999.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("slot {0} is out of range: slots are numbered 1 to 9999")]
pub struct SlotError(pub u64);

/// A stable executor slot, numbered from 1. Displays as four zero-padded digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Slot(u32);

impl Slot {
    /// A slot from its number.
    pub fn new(n: u64) -> Result<Self, SlotError> {
        match u32::try_from(n) {
            Ok(v) if (1..=MAX_SLOT).contains(&v) => Ok(Self(v)),
            _ => Err(SlotError(n)),
        }
    }

    /// The slot number.
    pub fn get(self) -> u32 {
        self.0
    }
}

impl fmt::Display for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_prefix_keeps_ascii_alphanumerics() {
        let p = WorkerPrefix::derive("features.build").unwrap();
        assert_eq!(p.as_str(), "featuresbuild");
        assert_eq!(
            WorkerPrefix::derive("app.workers.features_build")
                .unwrap()
                .as_str(),
            "appworkersfeaturesbuild"
        );
        assert_eq!(WorkerPrefix::derive("ünï-9").unwrap().as_str(), "n9");
        assert_eq!(
            WorkerPrefix::derive("._-").unwrap_err().to_string(),
            r#"cannot derive a worker id prefix from task name "._-": it has no ASCII letters or digits; set PERAGO_WORKER_ID_PREFIX"#
        );
    }

    #[test]
    fn worker_ids_pad_the_slot_to_four_digits() {
        let p = WorkerPrefix::resolve("features.build", Some("prodAFeaturesBuild")).unwrap();
        assert_eq!(p.worker_id(Slot::new(1).unwrap()), "prodAFeaturesBuild0001");
        assert_eq!(p.worker_id(Slot::new(2).unwrap()), "prodAFeaturesBuild0002");
        assert_eq!(
            p.worker_id(Slot::new(9999).unwrap()),
            "prodAFeaturesBuild9999"
        );
        assert_eq!(p.broker_id(), "prodAFeaturesBuildBroker");
        let derived = WorkerPrefix::resolve("features.build", None).unwrap();
        assert_eq!(derived.broker_id(), "featuresbuildBroker");
    }

    #[test]
    fn explicit_prefix_is_validated() {
        assert!(WorkerPrefix::explicit("prod_A-1").is_ok());
        for bad in ["", "prod A", "prod.a", "prød", "a/b"] {
            assert_eq!(
                WorkerPrefix::explicit(bad).unwrap_err(),
                PrefixError::Invalid {
                    value: bad.to_owned()
                },
                "{bad:?}"
            );
        }
        assert_eq!(
            WorkerPrefix::resolve("x", Some("a b"))
                .unwrap_err()
                .to_string(),
            r#"PERAGO_WORKER_ID_PREFIX "a b" is invalid: use one to 200 of A-Z, a-z, 0-9, _ and -"#
        );
    }

    #[test]
    fn slots_are_one_to_9999() {
        assert_eq!(Slot::new(0), Err(SlotError(0)));
        assert_eq!(Slot::new(10_000), Err(SlotError(10_000)));
        assert_eq!(Slot::new(u64::MAX), Err(SlotError(u64::MAX)));
        assert_eq!(Slot::new(42).unwrap().to_string(), "0042");
        assert_eq!(
            SlotError(0).to_string(),
            "slot 0 is out of range: slots are numbered 1 to 9999"
        );
    }
}
