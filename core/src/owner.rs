//! The owner file of an attempt directory, `<root>/attempts/<execution id>/.perago-owner`:
//! written by the executor that runs the attempt, read by the supervisor's workspace GC. Both
//! sides use this one type, so the fields cannot drift apart.
//!
//! The executor writes it when it creates the directory (slot, generation, pid, execution id,
//! creation time), rewrites it atomically with `repository` and `staging_branch` before it
//! creates a staging branch, and with `done` once it has finished with the directory. The GC
//! keeps an attempt whose executor generation is live, deletes the staging branch it names,
//! and removes the rest after the TTL.

use serde::{Deserialize, Serialize};

/// The owner file's name in an attempt directory.
pub const OWNER_FILE: &str = ".perago-owner";

/// What an owner file says. Every field is optional when read: a file from another version,
/// or damaged, yields what it has (and nothing when it is not JSON).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptOwner {
    /// The executor's slot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<u32>,
    /// The executor's generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// The executor's pid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// The execution id (also the directory's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_id: Option<String>,
    /// Seconds since the epoch when the directory was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<u64>,
    /// The repository of the staging branch, recorded before the branch is created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository: Option<String>,
    /// The staging branch (`perago-staging-<execution id>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staging_branch: Option<String>,
    /// The executor has finished with the directory (it could not delete its staging branch).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub done: bool,
}

impl AttemptOwner {
    /// The file's text.
    pub fn to_text(&self) -> String {
        serde_json::to_string(self).expect("plain fields always serialize")
    }

    /// Reads a file's text leniently: fields of the wrong type count as absent.
    pub fn parse(text: &str) -> Self {
        let Ok(serde_json::Value::Object(map)) = serde_json::from_str(text) else {
            return Self::default();
        };
        let read = |name: &str| map.get(name).cloned().unwrap_or_default();
        Self {
            slot: serde_json::from_value(read("slot")).ok().flatten(),
            generation: serde_json::from_value(read("generation")).ok().flatten(),
            pid: serde_json::from_value(read("pid")).ok().flatten(),
            execution_id: serde_json::from_value(read("execution_id")).ok().flatten(),
            created: serde_json::from_value(read("created")).ok().flatten(),
            repository: serde_json::from_value(read("repository")).ok().flatten(),
            staging_branch: serde_json::from_value(read("staging_branch"))
                .ok()
                .flatten(),
            done: serde_json::from_value(read("done")).unwrap_or(false),
        }
    }

    /// The staging branch to delete with the directory `dir_name`: only the one the executor of
    /// that directory makes (`perago-staging-<dir_name>`), never another branch a damaged or
    /// forged file names.
    pub fn staging(&self, dir_name: &str) -> Option<(String, String)> {
        let repository = self.repository.as_deref().filter(|r| !r.is_empty())?;
        let branch = self.staging_branch.as_deref()?;
        (branch == format!("perago-staging-{dir_name}"))
            .then(|| (repository.to_owned(), branch.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_executor_writes_the_gc_reads() {
        let owner = AttemptOwner {
            slot: Some(2),
            generation: Some(7),
            pid: Some(4242),
            execution_id: Some("e1".into()),
            created: Some(1_700_000_000),
            ..AttemptOwner::default()
        };
        let text = owner.to_text();
        assert_eq!(
            text,
            r#"{"slot":2,"generation":7,"pid":4242,"execution_id":"e1","created":1700000000}"#
        );
        assert_eq!(AttemptOwner::parse(&text), owner);
        let staged = AttemptOwner {
            repository: Some("repo".into()),
            staging_branch: Some("perago-staging-e1".into()),
            done: true,
            ..owner
        };
        let back = AttemptOwner::parse(&staged.to_text());
        assert_eq!(back, staged);
        assert_eq!(
            back.staging("e1"),
            Some(("repo".into(), "perago-staging-e1".into()))
        );
        assert_eq!(back.staging("e2"), None, "another directory's branch");
    }

    #[test]
    fn damaged_files_yield_what_they_have() {
        assert_eq!(AttemptOwner::parse("not json"), AttemptOwner::default());
        assert_eq!(AttemptOwner::parse("[1]"), AttemptOwner::default());
        let partial = AttemptOwner::parse(r#"{"slot":"two","generation":3,"done":"yes"}"#);
        assert_eq!(partial.slot, None);
        assert_eq!(partial.generation, Some(3));
        assert!(!partial.done);
        let forged = AttemptOwner::parse(r#"{"repository":"r","staging_branch":"main"}"#);
        assert_eq!(
            forged.staging("e1"),
            None,
            "never a branch but the attempt's own"
        );
        let empty =
            AttemptOwner::parse(r#"{"repository":"","staging_branch":"perago-staging-e1"}"#);
        assert_eq!(empty.staging("e1"), None);
    }
}
