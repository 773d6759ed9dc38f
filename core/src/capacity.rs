//! Capacity and lifecycle controls (SPEC §8): run once, executor recycling, the adaptive
//! executor range, memory-headroom admission and poison tasks. Every one is off (or at today's
//! behaviour) by default. The supervisor resolves them from its flags and environment (a flag
//! wins), reports every bad value at once naming the flag or variable, and hands the result to
//! the broker and the executors as environment variables ([`Capacity::child_env`]), which they
//! read back with [`Capacity::from_lookup`].

use crate::{
    identity::MAX_SLOT,
    mode::WORKER_COUNT_MESSAGE,
    units::{parse_byte_size, parse_duration},
};
use std::time::Duration;

/// `1`/`true`/`yes`: run until the task type's queue is empty and every slot idle, then drain.
pub const PERAGO_ONCE: &str = "PERAGO_ONCE";
/// `1`/`true`/`yes`: start paused (no poll until `perago-supervisor resume`); `--paused`.
pub const PERAGO_PAUSED: &str = "PERAGO_PAUSED";
/// Assignments after which an executor is replaced by a new generation.
pub const PERAGO_EXECUTOR_MAX_TASKS: &str = "PERAGO_EXECUTOR_MAX_TASKS";
/// Memory (executor + its bodies' process tree) above which an executor is replaced.
pub const PERAGO_EXECUTOR_MAX_MEMORY: &str = "PERAGO_EXECUTOR_MAX_MEMORY";
/// How long a slot stays idle before an adaptive runtime retires it (default 30s).
pub const PERAGO_SCALE_DOWN_AFTER: &str = "PERAGO_SCALE_DOWN_AFTER";
/// Available memory below which the broker stops polling (and scaling up).
pub const PERAGO_MIN_FREE_MEMORY: &str = "PERAGO_MIN_FREE_MEMORY";
/// Memory kept free beyond each task type's observed peak: a type is polled (and scaled up)
/// only while available memory minus this covers its peak (see `docs/broker.md`).
pub const PERAGO_MEMORY_HEADROOM: &str = "PERAGO_MEMORY_HEADROOM";
/// `--max-runtime`: how long a run once (`--once`) may take; a type whose observed p95
/// duration exceeds the time left is not polled any more.
pub const PERAGO_MAX_RUNTIME: &str = "PERAGO_MAX_RUNTIME";
/// Executor crashes of one workflow task after which it fails for good (default 3; 0 = off).
pub const PERAGO_POISON_AFTER: &str = "PERAGO_POISON_AFTER";
/// The number of slots (the executor range's maximum), set by the supervisor for the broker.
pub const PERAGO_SLOTS: &str = "PERAGO_SLOTS";
/// The executor range's minimum, set by the supervisor for the broker.
pub const PERAGO_EXECUTORS_MIN: &str = "PERAGO_EXECUTORS_MIN";

/// The default [`Capacity::scale_down_after`].
pub const DEFAULT_SCALE_DOWN_AFTER: Duration = Duration::from_secs(30);
/// The least [`Capacity::scale_down_after`]: a shorter one would retire an executor between
/// two tasks of a steady stream and start another for the next, over and over.
pub const MIN_SCALE_DOWN_AFTER: Duration = Duration::from_secs(1);
/// The default [`Capacity::poison_after`].
pub const DEFAULT_POISON_AFTER: u32 = 3;

/// Every capacity and lifecycle setting of a runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capacity {
    /// Work until the queue is empty and every slot idle, then drain and exit 0.
    pub once: bool,
    /// Start paused: the broker polls nothing until `Admin.Resume` (`--paused`,
    /// `PERAGO_PAUSED`). What a settings layer (the SDK's `paused`) sets per task type.
    pub paused: bool,
    /// Replace an executor after this many assignments.
    pub max_tasks_per_executor: Option<u64>,
    /// Replace an executor whose RSS plus its bodies' exceeds this many bytes after an
    /// assignment.
    pub max_executor_memory: Option<u64>,
    /// Executors started at first and kept at least (`-j MIN..MAX`; `-j N`: N).
    pub min_executors: u32,
    /// Slots: executors that may run at once (`-j N`: N).
    pub max_executors: u32,
    /// Idle time after which an adaptive runtime retires a slot above the minimum.
    pub scale_down_after: Duration,
    /// Poll (and scale up) only while at least this many bytes are available.
    pub min_free_memory: Option<u64>,
    /// Poll (and scale up) only while available memory minus this covers the type's observed
    /// peak for every task in flight and the next one (`PERAGO_MEMORY_HEADROOM`).
    pub memory_headroom: Option<u64>,
    /// Run once within this time (`--max-runtime`, only with `--once`): a type whose observed
    /// p95 duration exceeds the time left is not polled any more.
    pub max_runtime: Option<Duration>,
    /// Executor crashes of one workflow task (workflow id + reference name) after which it is
    /// failed with FAILED_WITH_TERMINAL_ERROR; 0 turns poison detection off.
    pub poison_after: u32,
}

impl Default for Capacity {
    fn default() -> Self {
        Self::fixed(1)
    }
}

/// The supervisor's capacity flags, as given (values are checked by [`Capacity::resolve`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CapacityFlags {
    /// `-j N` or `-j MIN..MAX`.
    pub jobs: String,
    /// `--once`.
    pub once: bool,
    /// `--paused`.
    pub paused: bool,
    /// `--max-tasks-per-executor N`.
    pub max_tasks_per_executor: Option<String>,
    /// `--max-executor-memory SIZE`.
    pub max_executor_memory: Option<String>,
    /// `--max-runtime DURATION` (only with `--once`).
    pub max_runtime: Option<String>,
}

/// A `-j` value that is not a worker count or range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobsError {
    /// Not a number (or a range of numbers).
    #[error("-j {value:?}: expected a count such as 4 or a range such as 2..16")]
    NotACount {
        /// The `-j` value as given.
        value: String,
    },
    /// A count below 1.
    #[error("{WORKER_COUNT_MESSAGE}")]
    BelowOne,
    /// A count above the highest slot number.
    #[error("worker process count must be at most {MAX_SLOT}, got {count}")]
    AboveMax {
        /// The count as given.
        count: i64,
    },
    /// A range whose minimum is above its maximum.
    #[error("-j {value}: the minimum ({min}) is above the maximum ({max})")]
    Inverted {
        /// The `-j` value as given.
        value: String,
        /// The minimum.
        min: u32,
        /// The maximum.
        max: u32,
    },
}

/// `-j`: one count, or an adaptive range `MIN..MAX`.
pub fn parse_jobs(value: &str) -> Result<(u32, u32), JobsError> {
    let count = |text: &str| -> Result<u32, JobsError> {
        let n: i64 = text.trim().parse().map_err(|_| JobsError::NotACount {
            value: value.to_owned(),
        })?;
        if n < 1 {
            return Err(JobsError::BelowOne);
        }
        if n > i64::from(MAX_SLOT) {
            return Err(JobsError::AboveMax { count: n });
        }
        Ok(n as u32)
    };
    match value.split_once("..") {
        None => count(value).map(|n| (n, n)),
        Some((min, max)) => {
            let (min, max) = (count(min)?, count(max)?);
            if min > max {
                return Err(JobsError::Inverted {
                    value: value.to_owned(),
                    min,
                    max,
                });
            }
            Ok((min, max))
        }
    }
}

/// One bad capacity setting; `label` names the flag or variable and its value
/// (`--flag "value"` or `VARIABLE="value"`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CapacityProblem {
    /// `-j` (or the slots the supervisor handed a child).
    #[error(transparent)]
    Jobs(#[from] JobsError),
    /// Not a boolean.
    #[error("{label}: expected 1 or 0 (true or false)")]
    NotABool {
        /// The setting and its value.
        label: String,
    },
    /// Not a count of at least 1.
    #[error("{label}: expected a count of at least 1")]
    NotAPositiveCount {
        /// The setting and its value.
        label: String,
    },
    /// Not a count (the poison threshold, where 0 is allowed).
    #[error("{label}: expected a count (0 turns poison detection off)")]
    NotACount {
        /// The setting and its value.
        label: String,
    },
    /// A size or duration of zero.
    #[error("{label}: must be above 0")]
    Zero {
        /// The setting and its value.
        label: String,
    },
    /// A duration below the least allowed.
    #[error("{label}: must be at least {least_ms}ms")]
    TooShort {
        /// The setting and its value.
        label: String,
        /// The least allowed, in milliseconds.
        least_ms: u128,
    },
    /// Not a byte size.
    #[error("{label}")]
    ByteSize {
        /// The setting and its value.
        label: String,
        /// What is wrong with the size.
        #[source]
        source: crate::units::ByteSizeError,
    },
    /// `--max-runtime` without `--once`.
    #[error("{label} needs --once (or {PERAGO_ONCE}=1): only a run once has a time left to count")]
    MaxRuntimeWithoutOnce {
        /// The setting and its value.
        label: String,
    },
    /// Not a duration.
    #[error("{label}")]
    Duration {
        /// The setting and its value.
        label: String,
        /// What is wrong with the duration.
        #[source]
        source: crate::units::DurationError,
    },
}

/// Capacity settings with at least one bad value: every problem, in the order checked.
/// Displays as the problems joined by `; `.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", problems.iter().map(crate::errors::chain).collect::<Vec<_>>().join("; "))]
pub struct CapacityError {
    /// Every bad setting.
    pub problems: Vec<CapacityProblem>,
}

/// A flag and its value, if it was given.
fn flag<'a>(name: &'a str, value: &'a Option<String>) -> Option<(&'a str, &'a str)> {
    value.as_deref().map(|v| (name, v))
}

/// A setting as given: the flag's value if there is one, else the variable's (unset or blank:
/// none), with its name for an error message (`--flag "value"` or `VARIABLE="value"`).
fn given(
    flag: Option<(&str, &str)>,
    variable: &str,
    lookup: &impl Fn(&str) -> Option<String>,
) -> Option<(String, String)> {
    if let Some((name, value)) = flag {
        return Some((value.to_owned(), format!("{name} {value:?}")));
    }
    let value = lookup(variable).filter(|v| !v.trim().is_empty())?;
    let label = format!("{variable}={value:?}");
    Some((value, label))
}

fn parse_bool(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "0" | "false" | "no" | "off" => Some(false),
        "1" | "true" | "yes" | "on" => Some(true),
        _ => None,
    }
}

impl Capacity {
    /// Today's behaviour with `n` executors.
    pub fn fixed(n: u32) -> Self {
        Self {
            once: false,
            paused: false,
            max_tasks_per_executor: None,
            max_executor_memory: None,
            min_executors: n,
            max_executors: n,
            scale_down_after: DEFAULT_SCALE_DOWN_AFTER,
            min_free_memory: None,
            memory_headroom: None,
            max_runtime: None,
            poison_after: DEFAULT_POISON_AFTER,
        }
    }

    /// Whether the executor count adapts to the queue (`-j MIN..MAX` with MIN < MAX).
    pub fn adaptive(&self) -> bool {
        self.min_executors < self.max_executors
    }

    /// The supervisor's settings: `flags` first, then the environment (`lookup`). Every
    /// problem is reported, each naming the flag or variable.
    pub fn resolve(
        flags: &CapacityFlags,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, CapacityError> {
        let mut problems = Vec::new();
        let (min_executors, max_executors) = parse_jobs(&flags.jobs)
            .map_err(|e| problems.push(e.into()))
            .unwrap_or((1, 1));
        let mut capacity = Self::fixed(1);
        capacity.min_executors = min_executors;
        capacity.max_executors = max_executors;
        if let Some((value, label)) = given(None, PERAGO_ONCE, &lookup) {
            match parse_bool(&value) {
                Some(on) => capacity.once = on,
                None => problems.push(CapacityProblem::NotABool { label }),
            }
        }
        capacity.once |= flags.once;
        if let Some((value, label)) = given(None, PERAGO_PAUSED, &lookup) {
            match parse_bool(&value) {
                Some(on) => capacity.paused = on,
                None => problems.push(CapacityProblem::NotABool { label }),
            }
        }
        capacity.paused |= flags.paused;
        if let Some((value, label)) = given(
            flag("--max-tasks-per-executor", &flags.max_tasks_per_executor),
            PERAGO_EXECUTOR_MAX_TASKS,
            &lookup,
        ) {
            match value.trim().parse::<u64>() {
                Ok(n) if n >= 1 => capacity.max_tasks_per_executor = Some(n),
                _ => problems.push(CapacityProblem::NotAPositiveCount { label }),
            }
        }
        let mut size = |given: Option<(String, String)>| -> Option<u64> {
            let (value, label) = given?;
            match parse_byte_size(&value) {
                Ok(0) => problems.push(CapacityProblem::Zero { label }),
                Ok(n) => return Some(n),
                Err(source) => problems.push(CapacityProblem::ByteSize { label, source }),
            }
            None
        };
        capacity.max_executor_memory = size(given(
            flag("--max-executor-memory", &flags.max_executor_memory),
            PERAGO_EXECUTOR_MAX_MEMORY,
            &lookup,
        ));
        capacity.min_free_memory = size(given(None, PERAGO_MIN_FREE_MEMORY, &lookup));
        capacity.memory_headroom = size(given(None, PERAGO_MEMORY_HEADROOM, &lookup));
        if let Some((value, label)) = given(
            flag("--max-runtime", &flags.max_runtime),
            PERAGO_MAX_RUNTIME,
            &lookup,
        ) {
            match parse_duration(&value) {
                Ok(d) if d.is_zero() => problems.push(CapacityProblem::Zero { label }),
                Ok(_) if !capacity.once => {
                    problems.push(CapacityProblem::MaxRuntimeWithoutOnce { label });
                }
                Ok(d) => capacity.max_runtime = Some(d),
                Err(source) => problems.push(CapacityProblem::Duration { label, source }),
            }
        }
        if let Some((value, label)) = given(None, PERAGO_SCALE_DOWN_AFTER, &lookup) {
            match parse_duration(&value) {
                Ok(d) if d >= MIN_SCALE_DOWN_AFTER => capacity.scale_down_after = d,
                Ok(_) => problems.push(CapacityProblem::TooShort {
                    label,
                    least_ms: MIN_SCALE_DOWN_AFTER.as_millis(),
                }),
                Err(source) => problems.push(CapacityProblem::Duration { label, source }),
            }
        }
        if let Some((value, label)) = given(None, PERAGO_POISON_AFTER, &lookup) {
            match value.trim().parse::<u32>() {
                Ok(n) => capacity.poison_after = n,
                Err(_) => problems.push(CapacityProblem::NotACount { label }),
            }
        }
        if problems.is_empty() {
            Ok(capacity)
        } else {
            Err(CapacityError { problems })
        }
    }

    /// The environment the supervisor gives the broker and the executors.
    pub fn child_env(&self) -> Vec<(String, String)> {
        let mut env = vec![
            (
                PERAGO_ONCE.to_owned(),
                if self.once { "1" } else { "0" }.to_owned(),
            ),
            (
                PERAGO_PAUSED.to_owned(),
                if self.paused { "1" } else { "0" }.to_owned(),
            ),
            (PERAGO_SLOTS.to_owned(), self.max_executors.to_string()),
            (
                PERAGO_EXECUTORS_MIN.to_owned(),
                self.min_executors.to_string(),
            ),
            (
                PERAGO_SCALE_DOWN_AFTER.to_owned(),
                format!("{}ms", self.scale_down_after.as_millis()),
            ),
            (
                PERAGO_POISON_AFTER.to_owned(),
                self.poison_after.to_string(),
            ),
        ];
        if let Some(n) = self.max_tasks_per_executor {
            env.push((PERAGO_EXECUTOR_MAX_TASKS.to_owned(), n.to_string()));
        }
        if let Some(n) = self.max_executor_memory {
            env.push((PERAGO_EXECUTOR_MAX_MEMORY.to_owned(), n.to_string()));
        }
        if let Some(n) = self.min_free_memory {
            env.push((PERAGO_MIN_FREE_MEMORY.to_owned(), n.to_string()));
        }
        if let Some(n) = self.memory_headroom {
            env.push((PERAGO_MEMORY_HEADROOM.to_owned(), n.to_string()));
        }
        if let Some(d) = self.max_runtime {
            env.push((
                PERAGO_MAX_RUNTIME.to_owned(),
                format!("{}ms", d.as_millis()),
            ));
        }
        env
    }

    /// A child's settings, from the environment [`Capacity::child_env`] wrote. `PERAGO_SLOTS`
    /// is optional (an executor has none: it then reads as one slot).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, CapacityError> {
        let slots = lookup(PERAGO_SLOTS).unwrap_or_else(|| "1".to_owned());
        let jobs = match lookup(PERAGO_EXECUTORS_MIN).filter(|v| !v.is_empty()) {
            Some(min) => format!("{min}..{slots}"),
            None => slots,
        };
        let flags = CapacityFlags {
            jobs,
            ..CapacityFlags::default()
        };
        Self::resolve(&flags, lookup)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    fn jobs(j: &str) -> CapacityFlags {
        CapacityFlags {
            jobs: j.to_owned(),
            ..CapacityFlags::default()
        }
    }

    #[test]
    fn defaults_are_todays_behaviour() {
        let c = Capacity::resolve(&jobs("4"), vars(&[])).unwrap();
        assert_eq!(c, Capacity::fixed(4));
        assert!(!c.adaptive());
        assert!(!c.once);
        assert_eq!(c.poison_after, 3);
        assert_eq!(c.scale_down_after, Duration::from_secs(30));
    }

    #[test]
    fn jobs_count_or_range() {
        let text = |j: &str| parse_jobs(j).map_err(|e| e.to_string());
        assert_eq!(parse_jobs("3"), Ok((3, 3)));
        assert_eq!(parse_jobs("2..16"), Ok((2, 16)));
        assert_eq!(text("0"), Err(WORKER_COUNT_MESSAGE.to_owned()));
        assert_eq!(text("-1"), Err(WORKER_COUNT_MESSAGE.to_owned()));
        assert_eq!(text("0..4"), Err(WORKER_COUNT_MESSAGE.to_owned()));
        assert_eq!(
            text("8..2"),
            Err("-j 8..2: the minimum (8) is above the maximum (2)".to_owned())
        );
        assert_eq!(
            text("10000"),
            Err("worker process count must be at most 9999, got 10000".to_owned())
        );
        assert!(text("two").unwrap_err().contains("expected a count"));
        assert_eq!(parse_jobs("0"), Err(JobsError::BelowOne));
        assert_eq!(
            parse_jobs("10000"),
            Err(JobsError::AboveMax { count: 10000 })
        );
        assert!(matches!(
            parse_jobs("8..2"),
            Err(JobsError::Inverted { min: 8, max: 2, .. })
        ));
        assert!(matches!(
            parse_jobs("two"),
            Err(JobsError::NotACount { .. })
        ));
        assert!(
            Capacity::resolve(&jobs("1..4"), vars(&[]))
                .unwrap()
                .adaptive()
        );
    }

    #[test]
    fn a_flag_wins_over_the_variable() {
        let flags = CapacityFlags {
            jobs: "1".to_owned(),
            once: false,
            paused: false,
            max_tasks_per_executor: Some("5".to_owned()),
            max_executor_memory: Some("512MiB".to_owned()),
            max_runtime: None,
        };
        let env = vars(&[
            (PERAGO_EXECUTOR_MAX_TASKS, "9"),
            (PERAGO_EXECUTOR_MAX_MEMORY, "1GiB"),
            (PERAGO_ONCE, "1"),
        ]);
        let c = Capacity::resolve(&flags, env).unwrap();
        assert_eq!(c.max_tasks_per_executor, Some(5));
        assert_eq!(c.max_executor_memory, Some(512 << 20));
        assert!(c.once, "the variable turns it on when the flag is absent");
    }

    #[test]
    fn the_scale_down_delay_has_a_floor() {
        let flags = CapacityFlags {
            jobs: "1..4".to_owned(),
            ..CapacityFlags::default()
        };
        let error =
            Capacity::resolve(&flags, vars(&[(PERAGO_SCALE_DOWN_AFTER, "1ms")])).unwrap_err();
        assert_eq!(
            error.to_string(),
            r#"PERAGO_SCALE_DOWN_AFTER="1ms": must be at least 1000ms"#
        );
        let ok = Capacity::resolve(&flags, vars(&[(PERAGO_SCALE_DOWN_AFTER, "1s")])).unwrap();
        assert_eq!(ok.scale_down_after, MIN_SCALE_DOWN_AFTER);
    }

    #[test]
    fn every_bad_value_is_named() {
        let flags = CapacityFlags {
            jobs: "0".to_owned(),
            once: false,
            paused: false,
            max_tasks_per_executor: Some("0".to_owned()),
            max_executor_memory: Some("lots".to_owned()),
            max_runtime: None,
        };
        let env = vars(&[
            (PERAGO_ONCE, "maybe"),
            (PERAGO_MIN_FREE_MEMORY, "1 parsec"),
            (PERAGO_SCALE_DOWN_AFTER, "soon"),
            (PERAGO_POISON_AFTER, "-1"),
        ]);
        let error = Capacity::resolve(&flags, env).unwrap_err();
        let problems = &error.problems;
        let text = problems
            .iter()
            .map(crate::errors::chain)
            .collect::<Vec<_>>()
            .join("\n");
        for name in [
            WORKER_COUNT_MESSAGE,
            "PERAGO_ONCE",
            "--max-tasks-per-executor",
            "--max-executor-memory",
            "PERAGO_MIN_FREE_MEMORY",
            "PERAGO_SCALE_DOWN_AFTER",
            "PERAGO_POISON_AFTER",
        ] {
            assert!(text.contains(name), "{name} not named in:\n{text}");
        }
        assert_eq!(problems.len(), 7, "{text}");
        assert!(matches!(
            problems.as_slice(),
            [
                CapacityProblem::Jobs(JobsError::BelowOne),
                CapacityProblem::NotABool { .. },
                CapacityProblem::NotAPositiveCount { .. },
                CapacityProblem::ByteSize { .. },
                CapacityProblem::ByteSize { .. },
                CapacityProblem::Duration { .. },
                CapacityProblem::NotACount { .. },
            ]
        ));
        assert_eq!(error.to_string(), text.replace('\n', "; "));
    }

    #[test]
    fn children_read_back_what_the_supervisor_resolved() {
        let flags = CapacityFlags {
            jobs: "2..6".to_owned(),
            once: true,
            paused: false,
            max_tasks_per_executor: Some("7".to_owned()),
            max_executor_memory: Some("64MiB".to_owned()),
            max_runtime: Some("10s".to_owned()),
        };
        let env = vars(&[
            (PERAGO_MIN_FREE_MEMORY, "1GiB"),
            (PERAGO_MEMORY_HEADROOM, "256MiB"),
            (PERAGO_SCALE_DOWN_AFTER, "1500ms"),
            (PERAGO_POISON_AFTER, "0"),
        ]);
        let resolved = Capacity::resolve(&flags, env).unwrap();
        let child: BTreeMap<String, String> = resolved.child_env().into_iter().collect();
        let read = Capacity::from_lookup(|name| child.get(name).cloned()).unwrap();
        assert_eq!(read, resolved);
    }

    /// `--paused` and `PERAGO_PAUSED` start a runtime paused; the children read it back; a
    /// bad value names the variable (issue #26 item 2).
    #[test]
    fn paused_from_the_flag_or_the_variable() {
        let c = Capacity::resolve(&jobs("1"), vars(&[])).unwrap();
        assert!(!c.paused);
        let c = Capacity::resolve(&jobs("1"), vars(&[(PERAGO_PAUSED, "true")])).unwrap();
        assert!(c.paused);
        let flags = CapacityFlags {
            paused: true,
            ..jobs("1")
        };
        let c = Capacity::resolve(&flags, vars(&[(PERAGO_PAUSED, "0")])).unwrap();
        assert!(c.paused, "the flag wins");
        let child: BTreeMap<String, String> = c.child_env().into_iter().collect();
        assert!(
            Capacity::from_lookup(|n| child.get(n).cloned())
                .unwrap()
                .paused
        );
        let error = Capacity::resolve(&jobs("1"), vars(&[(PERAGO_PAUSED, "later")])).unwrap_err();
        assert_eq!(
            error.to_string(),
            r#"PERAGO_PAUSED="later": expected 1 or 0 (true or false)"#
        );
    }

    /// `PERAGO_MEMORY_HEADROOM` is a size; `--max-runtime` a duration that needs `--once`,
    /// and the message names both (issue #27 item 3).
    #[test]
    fn headroom_and_max_runtime() {
        let c = Capacity::resolve(&jobs("2"), vars(&[(PERAGO_MEMORY_HEADROOM, "256MiB")])).unwrap();
        assert_eq!(c.memory_headroom, Some(256 << 20));
        assert_eq!(c.max_runtime, None);
        let error =
            Capacity::resolve(&jobs("2"), vars(&[(PERAGO_MEMORY_HEADROOM, "lots")])).unwrap_err();
        assert!(
            error.to_string().contains("PERAGO_MEMORY_HEADROOM"),
            "{error}"
        );
        let flags = CapacityFlags {
            max_runtime: Some("10s".to_owned()),
            ..jobs("1")
        };
        let error = Capacity::resolve(&flags, vars(&[])).unwrap_err();
        assert_eq!(
            error.to_string(),
            r#"--max-runtime "10s" needs --once (or PERAGO_ONCE=1): only a run once has a time left to count"#
        );
        let once = CapacityFlags {
            once: true,
            ..flags.clone()
        };
        let c = Capacity::resolve(&once, vars(&[])).unwrap();
        assert_eq!(c.max_runtime, Some(Duration::from_secs(10)));
        let zero = CapacityFlags {
            max_runtime: Some("0s".to_owned()),
            ..once.clone()
        };
        let error = Capacity::resolve(&zero, vars(&[])).unwrap_err();
        assert_eq!(error.problems.len(), 1, "{error}");
        assert!(
            error.to_string().starts_with(r#"--max-runtime "0s""#),
            "{error}"
        );
        let bad = CapacityFlags {
            max_runtime: Some("a while".to_owned()),
            ..once
        };
        let error = Capacity::resolve(&bad, vars(&[])).unwrap_err();
        assert!(
            error.to_string().starts_with(r#"--max-runtime "a while""#),
            "{error}"
        );
    }
}
