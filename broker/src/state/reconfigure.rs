//! `Admin.Reconfigure` (issue #26 item 4, `perago-supervisor reload`): the settings that apply
//! live. Each changes from the next use on: the soft time limit and the recycling limits ride
//! on every assignment dispatched from now on (an assignment already running keeps what it
//! started with; an executor checks its recycling limits after each assignment), the poll
//! settings and the domain on the next poll and queue-depth read (a poll already waiting
//! finishes), memory admission at once (from the last measurement). A request is checked as a
//! whole first: one bad field refuses it all and changes nothing.

use super::{interface::Effect, machine::Machine};
use perago_core::{conductor::Domain, env, memory::format_bytes};
use std::time::Duration;
use tonic::Status;

/// The live settings a reconfigure sets; `None`: keep what is in force.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Reconfig {
    /// `body.soft_time_limit` in milliseconds; 0: none.
    pub(crate) soft_time_limit_ms: Option<u64>,
    /// The wait after an empty poll, in milliseconds; 0: none.
    pub(crate) poll_interval_ms: Option<u64>,
    /// The long poll's wait, in milliseconds.
    pub(crate) poll_timeout_ms: Option<u64>,
    /// The task domain polled in; empty: none (the default queue).
    pub(crate) domain: Option<String>,
    /// Assignments after which an executor is replaced; 0: off.
    pub(crate) max_tasks_per_executor: Option<u64>,
    /// Bytes above which an executor is replaced after an assignment; 0: off.
    pub(crate) max_executor_memory_bytes: Option<u64>,
    /// Memory admission's floor in bytes; 0: admission always open.
    pub(crate) min_free_memory_bytes: Option<u64>,
}

/// What a reconfigure did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reconfigured {
    /// Every field set already had that value.
    pub(crate) unchanged: bool,
    /// The soft time limit before (`None`: never told).
    pub(crate) previous_soft_time_limit_ms: Option<u64>,
    /// Each setting changed, `name: old -> new`.
    pub(crate) changed: Vec<String>,
}

/// How the poll loop polls: what the machine hands the poller and the queue-depth reader
/// (`Effect::PollSettings`) when a reconfigure changes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PollSettings {
    /// The task domain polled in; `None`: the default queue.
    pub(crate) domain: Option<Domain>,
    /// The long poll's wait.
    pub(crate) wait: Duration,
    /// The wait after a poll that brought no task.
    pub(crate) idle_wait: Duration,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A setting's value for the log: `off` for none or 0.
fn off_or(value: Option<u64>, show: impl Fn(u64) -> String) -> String {
    match value {
        None | Some(0) => "off".to_owned(),
        Some(v) => show(v),
    }
}

impl Machine {
    /// The soft time limit the runtime started with (`PERAGO_SOFT_TIME_LIMIT_MS`, from the
    /// supervisor's manifest), 0 for none; `None`: not told (the executors use theirs).
    pub(crate) fn with_soft_time_limit(mut self, ms: Option<u64>) -> Self {
        self.soft_time_limit_ms = ms;
        self
    }

    /// How the runtime started polling (`PERAGO_POLL_WAIT_MS`, `PERAGO_POLL_INTERVAL_MS`), as
    /// Admin.Status shows it and a reconfigure changes it.
    pub(crate) fn with_poll(mut self, wait: Duration, idle_wait: Duration) -> Self {
        self.poll_wait = wait;
        self.poll_interval = idle_wait;
        self
    }

    /// The metrics it keeps.
    pub(crate) fn gauges(&self) -> &crate::counters::Gauges {
        &self.gauges
    }

    /// The poll settings in force.
    pub(crate) fn poll_settings(&self) -> PollSettings {
        PollSettings {
            domain: self.domain.clone(),
            wait: self.poll_wait,
            idle_wait: self.poll_interval,
        }
    }

    /// Applies what `Admin.Reconfigure` set, or refuses all of it (a bad field, or a drain
    /// under way).
    pub(super) fn reconfigure(&mut self, r: Reconfig) -> Result<Reconfigured, Status> {
        if self.draining {
            return Err(Status::failed_precondition(
                "the runtime is draining: there is nothing left to reconfigure",
            ));
        }
        // Checked as a whole before anything changes.
        let domain = match r.domain.as_deref().map(str::trim) {
            None => None,
            Some("") => Some(None),
            Some(text) => Some(Some(Domain::parse(text).map_err(|e| {
                Status::invalid_argument(format!(
                    "domain: {}",
                    perago_core::errors::DisplayChain(&e)
                ))
            })?)),
        };
        if let Some(wait) = r.poll_timeout_ms
            && wait < env::MIN_POLL_WAIT_MS
        {
            return Err(Status::invalid_argument(format!(
                "poll_timeout_ms {wait}: must be at least {} (a shorter long poll turns an empty queue into a loop of requests)",
                env::MIN_POLL_WAIT_MS
            )));
        }
        if let Some(interval) = r.poll_interval_ms
            && interval > env::MAX_POLL_INTERVAL_MS
        {
            return Err(Status::invalid_argument(format!(
                "poll_interval_ms {interval}: must be at most {}",
                env::MAX_POLL_INTERVAL_MS
            )));
        }
        let previous_soft_time_limit_ms = self.soft_time_limit_ms;
        let mut changed = Vec::new();
        let duration = |ms: u64| format!("{:?}", Duration::from_millis(ms));
        if let Some(limit) = r.soft_time_limit_ms
            && previous_soft_time_limit_ms != Some(limit)
        {
            let before = match previous_soft_time_limit_ms {
                None => "the manifest's".to_owned(),
                before => off_or(before, duration),
            };
            changed.push(format!(
                "body.soft_time_limit: {before} -> {}",
                off_or(Some(limit), duration)
            ));
            self.soft_time_limit_ms = Some(limit);
        }
        let poll_before = self.poll_settings();
        if let Some(domain) = domain
            && domain != self.domain
        {
            let shown =
                |d: &Option<Domain>| d.as_ref().map_or("none".to_owned(), |d| d.to_string());
            changed.push(format!(
                "domain: {} -> {}",
                shown(&self.domain),
                shown(&domain)
            ));
            self.domain = domain;
        }
        if let Some(wait) = r.poll_timeout_ms.map(Duration::from_millis)
            && wait != self.poll_wait
        {
            changed.push(format!("poll_timeout: {:?} -> {wait:?}", self.poll_wait));
            self.poll_wait = wait;
        }
        if let Some(interval) = r.poll_interval_ms.map(Duration::from_millis)
            && interval != self.poll_interval
        {
            changed.push(format!(
                "poll_interval: {:?} -> {interval:?}",
                self.poll_interval
            ));
            self.poll_interval = interval;
        }
        let positive = |v: u64| (v > 0).then_some(v);
        if let Some(max) = r.max_tasks_per_executor.map(positive)
            && max != self.capacity.max_tasks_per_executor
        {
            changed.push(format!(
                "max_tasks_per_executor: {} -> {}",
                off_or(self.capacity.max_tasks_per_executor, |n| n.to_string()),
                off_or(max, |n| n.to_string())
            ));
            self.capacity.max_tasks_per_executor = max;
        }
        if let Some(max) = r.max_executor_memory_bytes.map(positive)
            && max != self.capacity.max_executor_memory
        {
            changed.push(format!(
                "max_executor_memory: {} -> {}",
                off_or(self.capacity.max_executor_memory, format_bytes),
                off_or(max, format_bytes)
            ));
            self.capacity.max_executor_memory = max;
        }
        if let Some(min) = r.min_free_memory_bytes.map(positive)
            && min != self.capacity.min_free_memory
        {
            changed.push(format!(
                "min_free_memory: {} -> {}",
                off_or(self.capacity.min_free_memory, format_bytes),
                off_or(min, format_bytes)
            ));
            self.min_free_memory_changed(min);
        }
        if self.poll_settings() != poll_before {
            self.effects
                .push(Effect::PollSettings(Box::new(self.poll_settings())));
        }
        if !changed.is_empty() {
            self.reconfigured_at = Some(self.now.wall);
            for change in &changed {
                tracing::info!(change = %change, "reconfigured: {change}");
            }
        }
        Ok(Reconfigured {
            unchanged: changed.is_empty(),
            previous_soft_time_limit_ms,
            changed,
        })
    }

    /// Memory admission's floor changed: judged at once against the last measurement (the
    /// measurements start now if none ran); without a floor admission is open.
    fn min_free_memory_changed(&mut self, min: Option<u64>) {
        self.capacity.min_free_memory = min;
        match (min, self.available_memory) {
            (None, _) => {
                if !self.admission_open {
                    tracing::info!("admission open: no memory floor any more; polling resumes");
                }
                self.admission_open = true;
                self.gauges
                    .admission_open
                    .store(1, std::sync::atomic::Ordering::Relaxed);
            }
            (Some(_), Some(available)) => self.memory_measured(available),
            (Some(_), None) => self.effects.push(Effect::WatchMemory),
        }
    }

    /// The recycling limits each assignment carries: `(max tasks, max memory)`, 0 for off.
    pub(super) fn recycle_limits(&self) -> (u64, u64) {
        (
            self.capacity.max_tasks_per_executor.unwrap_or(0),
            self.capacity.max_executor_memory.unwrap_or(0),
        )
    }

    /// The poll settings in force, in milliseconds, for Admin.Status: `(wait, idle wait)`.
    pub(crate) fn poll_ms(&self) -> (u64, u64) {
        (ms(self.poll_wait), ms(self.poll_interval))
    }
}
