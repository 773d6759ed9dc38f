//! Executor recycling (`--max-tasks-per-executor`, `--max-executor-memory`): after each
//! assignment the executor checks its limits; one that is reached goes with the completion to
//! the broker, which answers with `Stop{reason: "recycle"}`, and the executor exits with
//! [`EXIT_RECYCLED`](perago_core::recycle::EXIT_RECYCLED) so the supervisor starts the next
//! generation at once.

use perago_core::capacity::Capacity;

const MIB: u64 = 1 << 20;

/// Whose memory counts against `--max-executor-memory`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryScope {
    /// This process and every process below it (process mode: the executor, its bodies and
    /// what they started, a persistent `jsonl` body too).
    Process,
    /// Only the body processes the executor keeps between assignments (thread mode: the
    /// executor shares its process with the supervisor, whose memory is not its own).
    Bodies,
}

/// The recycling limits of one executor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecycleLimits {
    /// Assignments after which the executor leaves.
    pub max_tasks: Option<u64>,
    /// Resident bytes at or above which it leaves, measured after each assignment.
    pub max_memory: Option<u64>,
    /// What is measured.
    pub scope: MemoryScope,
}

impl Default for RecycleLimits {
    fn default() -> Self {
        Self {
            max_tasks: None,
            max_memory: None,
            scope: MemoryScope::Process,
        }
    }
}

impl RecycleLimits {
    /// The limits the supervisor passed (`PERAGO_EXECUTOR_MAX_TASKS`,
    /// `PERAGO_EXECUTOR_MAX_MEMORY`).
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, perago_core::capacity::CapacityError> {
        let capacity = Capacity::from_lookup(lookup)?;
        Ok(Self {
            max_tasks: capacity.max_tasks_per_executor,
            max_memory: capacity.max_executor_memory,
            scope: MemoryScope::Process,
        })
    }

    /// The limits an assignment carries (the broker's, which a reload may have changed), in
    /// place of these: each `Some(0)` turns its limit off, `None` keeps it.
    pub fn with_broker(self, max_tasks: Option<u64>, max_memory: Option<u64>) -> Self {
        let limit =
            |given: Option<u64>, own: Option<u64>| given.map_or(own, |n| (n > 0).then_some(n));
        Self {
            max_tasks: limit(max_tasks, self.max_tasks),
            max_memory: limit(max_memory, self.max_memory),
            scope: self.scope,
        }
    }

    /// Whether any limit is set.
    pub fn any(&self) -> bool {
        self.max_tasks.is_some() || self.max_memory.is_some()
    }

    /// After `done` assignments: why the executor should leave now, if it should.
    /// `body_pid` is the persistent body process, if one runs (counted in thread mode).
    pub fn check(&self, done: u64, body_pid: Option<u32>) -> Option<String> {
        if let Some(max) = self.max_tasks
            && done >= max
        {
            return Some(format!(
                "{done} assignments reached --max-tasks-per-executor {max}"
            ));
        }
        let max = self.max_memory?;
        let (measured, what) = match self.scope {
            MemoryScope::Process => (
                perago_core::rss::tree_rss(std::process::id()),
                "executor and bodies",
            ),
            MemoryScope::Bodies => match body_pid {
                Some(pid) => (perago_core::rss::tree_rss(pid), "bodies"),
                None => (Ok(0), "bodies"),
            },
        };
        match measured {
            Ok(bytes) => memory_reason(bytes, max, what),
            Err(e) => {
                tracing::warn!(error = %perago_core::errors::DisplayChain(&e), "cannot measure the executor's memory for --max-executor-memory");
                None
            }
        }
    }
}

fn memory_reason(bytes: u64, max: u64, what: &str) -> Option<String> {
    (bytes >= max).then(|| {
        format!(
            "resident memory {} ({what}) above --max-executor-memory {}",
            size(bytes),
            size(max)
        )
    })
}

/// `612MiB`; a limit that is no whole number of MiB in bytes.
fn size(bytes: u64) -> String {
    if bytes.is_multiple_of(MIB) || bytes >= 16 * MIB {
        format!("{}MiB", bytes.div_ceil(MIB))
    } else {
        format!("{bytes}B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_task_count_is_reached_at_the_nth_assignment() {
        let limits = RecycleLimits {
            max_tasks: Some(3),
            ..RecycleLimits::default()
        };
        assert_eq!(limits.check(2, None), None);
        assert_eq!(
            limits.check(3, None).as_deref(),
            Some("3 assignments reached --max-tasks-per-executor 3")
        );
        assert_eq!(RecycleLimits::default().check(1000, None), None);
    }

    /// Issue #26 item 4: the limits an assignment carries (a reload changed them) replace
    /// the executor's own from that assignment's check on; unset keeps the executor's.
    #[test]
    fn the_broker_limits_of_an_assignment_win() {
        let own = RecycleLimits {
            max_tasks: Some(100),
            max_memory: Some(512 * MIB),
            scope: MemoryScope::Bodies,
        };
        assert_eq!(own.with_broker(None, None), own);
        let lowered = own.with_broker(Some(3), Some(0));
        assert_eq!(
            lowered,
            RecycleLimits {
                max_tasks: Some(3),
                max_memory: None,
                scope: MemoryScope::Bodies,
            }
        );
        assert_eq!(
            lowered.check(3, None).as_deref(),
            Some("3 assignments reached --max-tasks-per-executor 3")
        );
        assert_eq!(
            RecycleLimits::default()
                .with_broker(Some(0), None)
                .max_tasks,
            None
        );
    }

    #[test]
    fn memory_is_compared_with_the_limit() {
        assert_eq!(
            memory_reason(511 * MIB, 512 * MIB, "executor and bodies"),
            None
        );
        assert_eq!(
            memory_reason(612 * MIB, 512 * MIB, "executor and bodies").as_deref(),
            Some("resident memory 612MiB (executor and bodies) above --max-executor-memory 512MiB")
        );
        // This test process is larger than a 1 MiB limit.
        let limits = RecycleLimits {
            max_memory: Some(MIB),
            ..RecycleLimits::default()
        };
        let why = limits.check(1, None).unwrap();
        assert!(why.starts_with("resident memory "), "{why}");
        // Thread mode without a persistent body: nothing of its own to measure.
        let limits = RecycleLimits {
            scope: MemoryScope::Bodies,
            ..limits
        };
        assert_eq!(limits.check(1, None), None);
    }

    #[test]
    fn limits_come_from_the_supervisors_environment() {
        let env = |name: &str| match name {
            "PERAGO_EXECUTOR_MAX_TASKS" => Some("3".to_owned()),
            "PERAGO_EXECUTOR_MAX_MEMORY" => Some("67108864".to_owned()),
            _ => None,
        };
        let limits = RecycleLimits::from_lookup(env).unwrap();
        assert_eq!(limits.max_tasks, Some(3));
        assert_eq!(limits.max_memory, Some(64 * MIB));
        assert!(!RecycleLimits::from_lookup(|_| None).unwrap().any());
        let bad = RecycleLimits::from_lookup(|name| {
            (name == perago_core::capacity::PERAGO_EXECUTOR_MAX_TASKS).then(|| "0".to_owned())
        })
        .unwrap_err();
        assert!(matches!(
            bad.problems.as_slice(),
            [perago_core::capacity::CapacityProblem::NotAPositiveCount { .. }]
        ));
        assert_eq!(
            bad.to_string(),
            "PERAGO_EXECUTOR_MAX_TASKS=\"0\": expected a count of at least 1"
        );
    }
}
