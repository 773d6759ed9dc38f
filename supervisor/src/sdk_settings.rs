//! The Conductor SDK's worker settings, read under the SDK's own names, so a deployment's
//! environment written for an SDK runner works unchanged (issue #26 item 3).
//!
//! The names and their order are those of the Python SDK's `_get_env_value`
//! (`conductor/client/worker/worker_config.py`), first found wins:
//!
//! ```text
//! conductor.worker.<task>.<prop>
//! conductor_worker_<task>_<prop>
//! CONDUCTOR_WORKER_<TASK>_<PROP>           (the task name upper-cased as it is: no other change)
//! CONDUCTOR_WORKER_<task>_<PROP>           (the task name as written)
//! CONDUCTOR_WORKER_<TASK>_POLLING_INTERVAL (poll_interval only; then <task> as written)
//! conductor.worker.all.<prop>
//! CONDUCTOR_WORKER_ALL_<PROP>
//! conductor_worker_<prop>
//! CONDUCTOR_WORKER_<PROP>
//! ```
//!
//! `poll_interval` found nowhere is then looked up again as `polling_interval` (the SDK's old
//! name), the same way. Values are parsed as the SDK parses them (booleans `true`/`1`/`yes`/
//! `on` in any case; integers; `poll_interval` a float of milliseconds), except that a value the
//! SDK would turn into a default without a word (`thread_count=three`, `paused=ture`) is an
//! error here naming the variable. Everything is a pure function of an environment snapshot.

use std::{collections::BTreeMap, fmt, time::Duration};

/// A property of the SDK's worker configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Property {
    Domain,
    Paused,
    ThreadCount,
    PollInterval,
    PollTimeout,
    WorkerId,
    LeaseExtendEnabled,
    RegisterTaskDef,
    OverwriteTaskDef,
    StrictSchema,
    RegisterSchema,
}

impl Property {
    /// Every property the SDK resolves, in its order.
    pub(crate) const ALL: [Self; 11] = [
        Self::PollInterval,
        Self::Domain,
        Self::WorkerId,
        Self::ThreadCount,
        Self::RegisterTaskDef,
        Self::PollTimeout,
        Self::LeaseExtendEnabled,
        Self::Paused,
        Self::OverwriteTaskDef,
        Self::StrictSchema,
        Self::RegisterSchema,
    ];

    /// The SDK's name (the suffix of every variable).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Domain => "domain",
            Self::Paused => "paused",
            Self::ThreadCount => "thread_count",
            Self::PollInterval => "poll_interval",
            Self::PollTimeout => "poll_timeout",
            Self::WorkerId => "worker_id",
            Self::LeaseExtendEnabled => "lease_extend_enabled",
            Self::RegisterTaskDef => "register_task_def",
            Self::OverwriteTaskDef => "overwrite_task_def",
            Self::StrictSchema => "strict_schema",
            Self::RegisterSchema => "register_schema",
        }
    }
}

impl fmt::Display for Property {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A value and the variable it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sourced<T> {
    pub(crate) value: T,
    /// The environment variable that set it.
    pub(crate) variable: String,
}

/// The variable names of `property` for `task`, in the SDK's order (without the
/// `polling_interval` retry, which [`lookup`] adds).
pub(crate) fn variables(task: &str, property: &str) -> Vec<String> {
    let upper = property.to_uppercase();
    let mut names = vec![
        format!("conductor.worker.{task}.{property}"),
        format!("conductor_worker_{task}_{property}"),
        format!("CONDUCTOR_WORKER_{}_{upper}", task.to_uppercase()),
        format!("CONDUCTOR_WORKER_{task}_{upper}"),
    ];
    if property == "poll_interval" {
        names.push(format!(
            "CONDUCTOR_WORKER_{}_POLLING_INTERVAL",
            task.to_uppercase()
        ));
        names.push(format!("CONDUCTOR_WORKER_{task}_POLLING_INTERVAL"));
    }
    names.extend([
        format!("conductor.worker.all.{property}"),
        format!("CONDUCTOR_WORKER_ALL_{upper}"),
        format!("conductor_worker_{property}"),
        format!("CONDUCTOR_WORKER_{upper}"),
    ]);
    names
}

/// The first variable of `property` for `task` that is set, and its raw value.
pub(crate) fn lookup(
    vars: &BTreeMap<String, String>,
    task: &str,
    property: Property,
) -> Option<Sourced<String>> {
    let find = |prop: &str| {
        variables(task, prop).into_iter().find_map(|variable| {
            vars.get(&variable).map(|value| Sourced {
                value: value.clone(),
                variable,
            })
        })
    };
    find(property.name()).or_else(|| match property {
        Property::PollInterval => find("polling_interval"),
        _ => None,
    })
}

/// The effective SDK settings of one task type (`None`: no variable sets it).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct SdkSettings {
    pub(crate) domain: Option<Sourced<String>>,
    pub(crate) paused: Option<Sourced<bool>>,
    pub(crate) thread_count: Option<Sourced<u32>>,
    /// Milliseconds, as the SDK gives it (a float there).
    pub(crate) poll_interval: Option<Sourced<Duration>>,
    pub(crate) poll_timeout: Option<Sourced<Duration>>,
    pub(crate) worker_id: Option<Sourced<String>>,
    pub(crate) lease_extend_enabled: Option<Sourced<bool>>,
}

fn from<T>(raw: &Sourced<String>, value: T) -> Sourced<T> {
    Sourced {
        value,
        variable: raw.variable.clone(),
    }
}

fn problem(source: &Sourced<String>, why: &str) -> String {
    format!("{} {:?}: {why}", source.variable, source.value)
}

/// A boolean as the SDK reads it (`true`, `1`, `yes`, `on` in any case); the SDK reads every
/// other word as false, perago only `false`, `0`, `no`, `off`.
fn boolean(source: &Sourced<String>) -> Result<bool, String> {
    match source.value.to_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(problem(
            source,
            "expected true, 1, yes, on or false, 0, no, off (the SDK would read it as false)",
        )),
    }
}

/// An integer as Python's `int()` reads it (blanks around, a sign).
fn integer(source: &Sourced<String>) -> Result<i64, String> {
    source
        .value
        .trim()
        .parse::<i64>()
        .map_err(|_| problem(source, "expected a whole number"))
}

/// Milliseconds that are whole and at least `least`.
fn millis(source: &Sourced<String>, least: u64, why_least: &str) -> Result<Duration, String> {
    let ms = integer(source)?;
    match u64::try_from(ms) {
        Ok(ms) if ms >= least => Ok(Duration::from_millis(ms)),
        _ => Err(problem(source, why_least)),
    }
}

impl SdkSettings {
    /// Reads the SDK's settings of `task` from `vars`: every problem (a value that does not
    /// parse, a property perago cannot honour) named by its variable.
    pub(crate) fn resolve(
        vars: &BTreeMap<String, String>,
        task: &str,
    ) -> Result<Self, Vec<String>> {
        let mut problems = Vec::new();
        let mut settings = Self::default();
        for property in Property::ALL {
            let Some(raw) = lookup(vars, task, property) else {
                continue;
            };
            let refused = |why: &str| {
                problem(
                    &raw,
                    &format!("{why} (the Conductor SDK's {property} for the task {task})"),
                )
            };
            match property {
                Property::Domain => {
                    // The SDK hands an empty domain on as none.
                    let value = raw.value.trim();
                    if !value.is_empty() {
                        settings.domain = Some(from(&raw, value.to_owned()));
                    }
                }
                Property::WorkerId => {
                    let value = raw.value.trim();
                    if value.is_empty() {
                        problems.push(refused("a worker id cannot be empty"));
                    } else {
                        settings.worker_id = Some(from(&raw, value.to_owned()));
                    }
                }
                Property::Paused => match boolean(&raw) {
                    Ok(b) => settings.paused = Some(from(&raw, b)),
                    Err(e) => problems.push(e),
                },
                Property::LeaseExtendEnabled => match boolean(&raw) {
                    Ok(true) => settings.lease_extend_enabled = Some(from(&raw, true)),
                    Ok(false) => problems.push(refused(
                        "perago always extends the lease of a running task (it is how a long task keeps its lease and how a lost one is found); it cannot turn that off",
                    )),
                    Err(e) => problems.push(e),
                },
                Property::ThreadCount => match integer(&raw) {
                    Ok(n) if (1..=i64::from(perago_core::identity::MAX_SLOT)).contains(&n) => {
                        settings.thread_count = Some(from(&raw, n as u32));
                    }
                    Ok(_) => problems.push(refused(&format!(
                        "the executor count must be 1 to {}",
                        perago_core::identity::MAX_SLOT
                    ))),
                    Err(e) => problems.push(e),
                },
                Property::PollTimeout => {
                    match millis(
                        &raw,
                        perago_core::env::MIN_POLL_WAIT_MS,
                        &format!(
                            "perago's long poll waits at least {} ms (a shorter one turns an empty queue into a loop of requests)",
                            perago_core::env::MIN_POLL_WAIT_MS
                        ),
                    ) {
                        Ok(d) => settings.poll_timeout = Some(from(&raw, d)),
                        Err(e) => problems.push(e),
                    }
                }
                Property::PollInterval => match raw.value.trim().parse::<f64>() {
                    Ok(ms) if (0.0..=3_600_000.0).contains(&ms) => {
                        settings.poll_interval =
                            Some(from(&raw, Duration::from_micros((ms * 1000.0).round() as u64)));
                    }
                    _ => problems.push(problem(
                        &raw,
                        "expected milliseconds from 0 to 3600000, such as 100",
                    )),
                },
                Property::RegisterTaskDef | Property::RegisterSchema => match boolean(&raw) {
                    Ok(false) => {}
                    Ok(true) => problems.push(refused(
                        "perago never registers TaskDefs or schemas: write them with `perago-supervisor extract` and register them before `start`",
                    )),
                    Err(e) => problems.push(e),
                },
                // What the SDK does only while registering, which perago never does: a value
                // changes nothing there either.
                Property::OverwriteTaskDef | Property::StrictSchema => {
                    if let Err(e) = boolean(&raw) {
                        problems.push(e);
                    }
                }
            }
        }
        if problems.is_empty() {
            Ok(settings)
        } else {
            Err(problems)
        }
    }

    /// The task domain the SDK's settings give (`domain`), for i26-domain's plan field.
    pub(crate) fn domain_for(&self) -> Option<&Sourced<String>> {
        self.domain.as_ref()
    }

    /// Whether the SDK's settings start the task paused (`paused`), for i26-pause's plan field.
    pub(crate) fn paused_for(&self) -> Option<&Sourced<bool>> {
        self.paused.as_ref()
    }

    /// Every setting found, as `(property, value, variable)`, for `status` and the start log.
    pub(crate) fn effective(&self) -> Vec<(Property, String, String)> {
        fn row<T>(
            property: Property,
            s: &Option<Sourced<T>>,
            show: impl Fn(&T) -> String,
        ) -> Option<(Property, String, String)> {
            s.as_ref()
                .map(|s| (property, show(&s.value), s.variable.clone()))
        }
        let ms = |d: &Duration| format!("{}", d.as_secs_f64() * 1000.0);
        [
            row(Property::Domain, &self.domain, Clone::clone),
            row(Property::Paused, &self.paused, ToString::to_string),
            row(
                Property::ThreadCount,
                &self.thread_count,
                ToString::to_string,
            ),
            row(Property::PollInterval, &self.poll_interval, ms),
            row(Property::PollTimeout, &self.poll_timeout, ms),
            row(Property::WorkerId, &self.worker_id, Clone::clone),
            row(
                Property::LeaseExtendEnabled,
                &self.lease_extend_enabled,
                ToString::to_string,
            ),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// Every name of the SDK's order, each one set alone and then with every lower one set too:
    /// the highest set always wins.
    #[test]
    fn the_whole_precedence_table_of_the_sdk() {
        let order = [
            "conductor.worker.orders.ship.thread_count",
            "conductor_worker_orders.ship_thread_count",
            "CONDUCTOR_WORKER_ORDERS.SHIP_THREAD_COUNT",
            "CONDUCTOR_WORKER_orders.ship_THREAD_COUNT",
            "conductor.worker.all.thread_count",
            "CONDUCTOR_WORKER_ALL_THREAD_COUNT",
            "conductor_worker_thread_count",
            "CONDUCTOR_WORKER_THREAD_COUNT",
        ];
        assert_eq!(variables("orders.ship", "thread_count"), order);
        for (rank, winner) in order.iter().enumerate() {
            let mut env = BTreeMap::new();
            for (i, name) in order.iter().enumerate().skip(rank) {
                env.insert((*name).to_owned(), (i + 1).to_string());
            }
            let s = SdkSettings::resolve(&env, "orders.ship").unwrap();
            assert_eq!(
                s.thread_count,
                Some(Sourced {
                    value: rank as u32 + 1,
                    variable: (*winner).to_owned()
                }),
                "{winner}"
            );
        }
        // Another task's names are not this task's.
        let env = vars(&[("CONDUCTOR_WORKER_OTHER_THREAD_COUNT", "4")]);
        assert_eq!(
            SdkSettings::resolve(&env, "orders.ship").unwrap(),
            SdkSettings::default()
        );
    }

    #[test]
    fn poll_interval_has_the_old_names_too() {
        assert_eq!(
            variables("a", "poll_interval"),
            [
                "conductor.worker.a.poll_interval",
                "conductor_worker_a_poll_interval",
                "CONDUCTOR_WORKER_A_POLL_INTERVAL",
                "CONDUCTOR_WORKER_a_POLL_INTERVAL",
                "CONDUCTOR_WORKER_A_POLLING_INTERVAL",
                "CONDUCTOR_WORKER_a_POLLING_INTERVAL",
                "conductor.worker.all.poll_interval",
                "CONDUCTOR_WORKER_ALL_POLL_INTERVAL",
                "conductor_worker_poll_interval",
                "CONDUCTOR_WORKER_POLL_INTERVAL",
            ]
        );
        let interval = |pairs: &[(&str, &str)]| {
            SdkSettings::resolve(&vars(pairs), "a")
                .unwrap()
                .poll_interval
                .map(|s| (s.value, s.variable))
        };
        // The task's POLLING_INTERVAL is above the global poll_interval.
        assert_eq!(
            interval(&[
                ("CONDUCTOR_WORKER_A_POLLING_INTERVAL", "250"),
                ("CONDUCTOR_WORKER_ALL_POLL_INTERVAL", "100"),
            ]),
            Some((
                Duration::from_millis(250),
                "CONDUCTOR_WORKER_A_POLLING_INTERVAL".into()
            ))
        );
        // Any poll_interval is above every polling_interval.
        assert_eq!(
            interval(&[
                ("conductor.worker.a.polling_interval", "300"),
                ("CONDUCTOR_WORKER_POLL_INTERVAL", "100.5"),
            ]),
            Some((
                Duration::from_micros(100_500),
                "CONDUCTOR_WORKER_POLL_INTERVAL".into()
            ))
        );
        assert_eq!(
            interval(&[("conductor.worker.all.polling_interval", "300")]),
            Some((
                Duration::from_millis(300),
                "conductor.worker.all.polling_interval".into()
            ))
        );
    }

    #[test]
    fn values_parse_as_the_sdk_parses_them() {
        let s = SdkSettings::resolve(
            &vars(&[
                ("CONDUCTOR_WORKER_ALL_PAUSED", "YES"),
                ("CONDUCTOR_WORKER_ALL_LEASE_EXTEND_ENABLED", "On"),
                ("CONDUCTOR_WORKER_ALL_THREAD_COUNT", " +3 "),
                ("CONDUCTOR_WORKER_ALL_POLL_TIMEOUT", "250"),
                ("CONDUCTOR_WORKER_ALL_DOMAIN", "blue"),
                ("CONDUCTOR_WORKER_ALL_WORKER_ID", "pod-7"),
                ("CONDUCTOR_WORKER_ALL_REGISTER_TASK_DEF", "false"),
                ("CONDUCTOR_WORKER_ALL_STRICT_SCHEMA", "true"),
            ]),
            "t",
        )
        .unwrap();
        assert_eq!(s.paused_for().map(|p| p.value), Some(true));
        assert_eq!(s.lease_extend_enabled.as_ref().map(|p| p.value), Some(true));
        assert_eq!(s.thread_count.as_ref().map(|p| p.value), Some(3));
        assert_eq!(
            s.poll_timeout.as_ref().map(|p| p.value),
            Some(Duration::from_millis(250))
        );
        assert_eq!(s.domain_for().map(|d| d.value.as_str()), Some("blue"));
        assert_eq!(
            s.worker_id.as_ref().map(|d| d.value.as_str()),
            Some("pod-7")
        );
        assert_eq!(
            s.effective()
                .iter()
                .map(|(p, v, _)| format!("{p}={v}"))
                .collect::<Vec<_>>(),
            [
                "domain=blue",
                "paused=true",
                "thread_count=3",
                "poll_timeout=250",
                "worker_id=pod-7",
                "lease_extend_enabled=true"
            ]
        );
        let paused = |v: &str| {
            SdkSettings::resolve(&vars(&[("conductor.worker.t.paused", v)]), "t")
                .map(|s| s.paused.map(|p| p.value))
        };
        for v in ["false", "0", "NO", "off"] {
            assert_eq!(paused(v), Ok(Some(false)), "{v}");
        }
        // An empty domain is none, as in the SDK.
        let s = SdkSettings::resolve(&vars(&[("CONDUCTOR_WORKER_ALL_DOMAIN", "")]), "t").unwrap();
        assert_eq!(s.domain_for(), None);
    }

    #[test]
    fn bad_values_and_what_perago_cannot_honour_name_the_variable() {
        let problems =
            |pairs: &[(&str, &str)]| SdkSettings::resolve(&vars(pairs), "t").unwrap_err();
        assert_eq!(
            problems(&[
                ("conductor.worker.t.paused", "ture"),
                ("CONDUCTOR_WORKER_T_THREAD_COUNT", "three"),
                ("CONDUCTOR_WORKER_ALL_POLL_TIMEOUT", "50"),
                ("CONDUCTOR_WORKER_POLL_INTERVAL", "-1"),
            ]),
            [
                "CONDUCTOR_WORKER_POLL_INTERVAL \"-1\": expected milliseconds from 0 to 3600000, such as 100",
                "CONDUCTOR_WORKER_T_THREAD_COUNT \"three\": expected a whole number",
                "CONDUCTOR_WORKER_ALL_POLL_TIMEOUT \"50\": perago's long poll waits at least 100 ms (a shorter one turns an empty queue into a loop of requests)",
                "conductor.worker.t.paused \"ture\": expected true, 1, yes, on or false, 0, no, off (the SDK would read it as false)",
            ]
        );
        assert_eq!(
            problems(&[("CONDUCTOR_WORKER_ALL_LEASE_EXTEND_ENABLED", "false")]),
            [
                "CONDUCTOR_WORKER_ALL_LEASE_EXTEND_ENABLED \"false\": perago always extends the lease of a running task (it is how a long task keeps its lease and how a lost one is found); it cannot turn that off (the Conductor SDK's lease_extend_enabled for the task t)"
            ]
        );
        assert_eq!(
            problems(&[("conductor.worker.all.register_task_def", "true")]),
            [
                "conductor.worker.all.register_task_def \"true\": perago never registers TaskDefs or schemas: write them with `perago-supervisor extract` and register them before `start` (the Conductor SDK's register_task_def for the task t)"
            ]
        );
        assert_eq!(
            problems(&[("CONDUCTOR_WORKER_ALL_THREAD_COUNT", "0")]),
            [
                "CONDUCTOR_WORKER_ALL_THREAD_COUNT \"0\": the executor count must be 1 to 9999 (the Conductor SDK's thread_count for the task t)"
            ]
        );
        assert_eq!(
            problems(&[("CONDUCTOR_WORKER_ALL_WORKER_ID", " ")]),
            [
                "CONDUCTOR_WORKER_ALL_WORKER_ID \" \": a worker id cannot be empty (the Conductor SDK's worker_id for the task t)"
            ]
        );
    }
}
