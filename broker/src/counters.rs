//! The broker's monotonic counters, shared by the actor, the poller and the reporters.

use perago_proto::admin::v1::BrokerCounters;
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{
        MetricType, counter::ConstCounter, counter::Counter as PromCounter, family::Family,
        gauge::ConstGauge, gauge::Gauge, histogram::Histogram,
    },
    registry::Registry,
};
use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

/// One counter.
#[derive(Debug, Default)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    pub(crate) fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Declares every broker counter once: the field, its Prometheus family (without `_total`) and
/// label if any, and its help. From this one list come the `Counters` struct, the
/// `Admin.Status` snapshot (whose `BrokerCounters` must then have exactly these fields: the
/// compiler checks it) and the `perago_*` families of `/metrics`.
macro_rules! counters {
    ($( $field:ident => $metric:literal $([$key:literal = $value:literal])?, $help:literal; )*) => {
        /// Every counter `Status` and `/metrics` report.
        #[derive(Debug, Default)]
        pub(crate) struct Counters {
            $( #[doc = $help] pub(crate) $field: Counter, )*
        }

        impl Counters {
            pub(crate) fn snapshot(&self) -> BrokerCounters {
                BrokerCounters { $( $field: self.$field.get(), )* }
            }

            /// Each counter as `/metrics` shows it, in the list's order.
            fn exported(&self) -> Vec<Exported> {
                vec![ $( Exported {
                    metric: $metric,
                    help: $help,
                    label: counters!(@label $($key = $value)?),
                    value: self.$field.get(),
                }, )* ]
            }
        }
    };
    (@label) => { None };
    (@label $key:literal = $value:literal) => { Some(($key, $value)) };
}

counters! {
    polls => "perago_polls", "Poll requests sent to Conductor";
    empty_polls => "perago_empty_polls", "Polls that returned no task";
    poll_errors => "perago_poll_errors", "Polls that failed";
    dispatched => "perago_tasks_dispatched", "Assignments sent to executor slots";
    completed => "perago_task_results" ["status" = "COMPLETED"], "Results reported to Conductor, by status";
    failed => "perago_task_results" ["status" = "FAILED"], "Results reported to Conductor, by status";
    failed_terminal => "perago_task_results" ["status" = "FAILED_WITH_TERMINAL_ERROR"], "Results reported to Conductor, by status";
    update_retries => "perago_update_retries", "Result updates retried after an error";
    lease_extensions => "perago_lease_extensions", "Lease extensions sent";
    leases_lost => "perago_leases_lost", "Leases found lost when reading a task back";
    executor_exits => "perago_executor_exits", "Executor generations that exited while not draining (each is restarted)";
    results_lost => "perago_results_lost", "Results given up on after retries";
    rejected_completions => "perago_completions_rejected", "Completions refused because they were not the slot's current assignment";
    executors_recycled => "perago_executors_recycled", "Executors replaced after --max-tasks-per-executor or --max-executor-memory";
    tasks_poisoned => "perago_tasks_poisoned", "Tasks failed for good after PERAGO_POISON_AFTER executor crashes";
    scale_ups => "perago_scale_ups", "Slots started above the minimum of the executor range";
    scale_downs => "perago_scale_downs", "Idle slots retired down towards the minimum of the executor range";
    polls_withheld => "perago_polls_withheld", "Poll grants withheld while available memory was below PERAGO_MIN_FREE_MEMORY";
    results_ignored => "perago_task_results_ignored", "Results Conductor answered but did not apply (the attempt was no longer in progress), as far as the broker can tell";
}

/// One counter as `/metrics` shows it.
struct Exported {
    metric: &'static str,
    help: &'static str,
    label: Option<(&'static str, &'static str)>,
    value: u64,
}

/// Upper bounds (seconds) of the `perago_task_duration_seconds` buckets.
pub(crate) const DURATION_BUCKETS: [f64; 12] = [
    0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0, 300.0, 1800.0,
];

/// The buckets (seconds) of the Conductor SDKs' canonical time histograms.
pub(crate) const SDK_TIME_BUCKETS: [f64; 12] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The buckets (bytes) of the Conductor SDKs' canonical size histograms.
pub(crate) const SDK_SIZE_BUCKETS: [f64; 6] = [100.0, 1e3, 1e4, 1e5, 1e6, 1e7];

/// Upper bounds (bytes) of the `perago_body_peak_memory_bytes` buckets: 16 MiB to 64 GiB.
pub(crate) const MEMORY_BUCKETS: [f64; 7] = [
    16.0 * 1048576.0,
    64.0 * 1048576.0,
    256.0 * 1048576.0,
    1024.0 * 1048576.0,
    4096.0 * 1048576.0,
    16384.0 * 1048576.0,
    65536.0 * 1048576.0,
];

/// Gauges and the histogram, beside the counters.
#[derive(Debug)]
pub(crate) struct Gauges {
    pub(crate) busy_slots: AtomicU64,
    pub(crate) slots: AtomicU64,
    /// Executors the runtime wants running (the adaptive range's current target).
    pub(crate) wanted_executors: AtomicU64,
    /// The task type's queue depth as last read from Conductor; `u64::MAX` = not read.
    pub(crate) queue_depth: AtomicU64,
    /// Available memory in bytes when last measured; 0 = not measured.
    pub(crate) available_memory: AtomicU64,
    /// 1 while the broker may poll (memory admission), else 0.
    pub(crate) admission_open: AtomicU64,
    /// 1 while polling is paused (`Admin.Pause`), else 0.
    pub(crate) paused: AtomicU64,
    /// The type's profile: executions in the window, their mean and p95 duration (ms), the
    /// highest body peak (bytes; 0 = none observed).
    pub(crate) profile_executions: AtomicU64,
    pub(crate) profile_duration_mean_ms: AtomicU64,
    pub(crate) profile_duration_p95_ms: AtomicU64,
    pub(crate) profile_peak_memory: AtomicU64,
    /// `PERAGO_MEMORY_HEADROOM`: tasks admitted beyond those in flight; `u64::MAX` = no headroom.
    pub(crate) memory_room: AtomicU64,
    /// `--max-runtime`: milliseconds left; `u64::MAX` = no deadline.
    pub(crate) time_left_ms: AtomicU64,
    /// Sharing capacity (`PERAGO_SHARE`): the permits granted; `u64::MAX` = not sharing.
    pub(crate) share_limit: AtomicU64,
    /// Sharing capacity: the tasks held against the permits.
    pub(crate) share_held: AtomicU64,
    /// The body version new executors start with (`Control.RollBody`; 1 at start).
    pub(crate) body_version: AtomicU64,
    /// The oldest body version a live executor runs (equal to `body_version` but mid-roll).
    pub(crate) oldest_body_version: AtomicU64,
    /// Dispatch-to-completion durations.
    pub(crate) task_duration: Histogram,
    /// The peak memory of each body whose memory cgroup measured one (`body.memory_limit`).
    pub(crate) body_peak_memory: Histogram,
    /// Bodies OOM-killed at their memory limit.
    pub(crate) body_oom_kills: PromCounter,
    /// What only the Conductor SDKs' metric surface has.
    pub(crate) sdk: SdkMetrics,
    /// `perago_runtime_info`: one label set, relabelled when a reconfigure changes the domain.
    pub(crate) runtime_info: Family<Vec<(String, String)>, Gauge>,
    /// The execution mode label of `perago_runtime_info` (set once, by [`registry`]).
    pub(crate) execution_mode: std::sync::OnceLock<String>,
}

impl Gauges {
    /// `perago_runtime_info`'s one label set, for `domain` (empty: none).
    pub(crate) fn set_runtime_info(&self, domain: Option<&perago_core::conductor::Domain>) {
        self.runtime_info.clear();
        self.runtime_info
            .get_or_create(&vec![
                (
                    "domain".to_owned(),
                    domain.map_or_else(String::new, ToString::to_string),
                ),
                (
                    "execution_mode".to_owned(),
                    self.execution_mode.get().cloned().unwrap_or_default(),
                ),
            ])
            .set(1);
    }
}

impl Default for Gauges {
    fn default() -> Self {
        Self {
            busy_slots: AtomicU64::default(),
            slots: AtomicU64::default(),
            wanted_executors: AtomicU64::default(),
            queue_depth: AtomicU64::default(),
            available_memory: AtomicU64::default(),
            admission_open: AtomicU64::default(),
            paused: AtomicU64::default(),
            profile_executions: AtomicU64::default(),
            profile_duration_mean_ms: AtomicU64::default(),
            profile_duration_p95_ms: AtomicU64::default(),
            profile_peak_memory: AtomicU64::default(),
            memory_room: AtomicU64::new(u64::MAX),
            time_left_ms: AtomicU64::new(u64::MAX),
            share_limit: AtomicU64::new(u64::MAX),
            share_held: AtomicU64::default(),
            body_version: AtomicU64::new(1),
            oldest_body_version: AtomicU64::new(1),
            task_duration: Histogram::new(DURATION_BUCKETS),
            body_peak_memory: Histogram::new(MEMORY_BUCKETS),
            body_oom_kills: PromCounter::default(),
            sdk: SdkMetrics::default(),
            runtime_info: Family::default(),
            execution_mode: std::sync::OnceLock::new(),
        }
    }
}

/// A label set of one label.
type Label = [(&'static str, String); 1];

fn time_histogram() -> Histogram {
    Histogram::new(SDK_TIME_BUCKETS)
}

/// What the Conductor SDK runners export (their canonical names, `taskType` label, seconds and
/// bytes), so dashboards built for them work unchanged. Counts the runtime keeps anyway
/// (polls, dispatches, failures, restarts, busy slots) are read from [`Counters`] and
/// [`Gauges`]; these are what only the SDK surface has.
#[derive(Debug)]
pub(crate) struct SdkMetrics {
    /// `task_poll_error_total{exception}`.
    pub(crate) poll_errors: Family<Label, PromCounter>,
    /// `task_poll_time_seconds{status}`: `SUCCESS` or `FAILURE`.
    pub(crate) poll_time: Family<Label, Histogram, fn() -> Histogram>,
    /// `task_execute_time_seconds{status}`: dispatch to completion.
    pub(crate) execute_time: Family<Label, Histogram, fn() -> Histogram>,
    /// `task_update_error_total{exception}`: every failed update attempt.
    pub(crate) update_errors: Family<Label, PromCounter>,
    /// `task_update_time_seconds{status}`.
    pub(crate) update_time: Family<Label, Histogram, fn() -> Histogram>,
    /// `task_result_size_bytes`: the output's JSON size.
    pub(crate) result_size: Histogram,
}

impl Default for SdkMetrics {
    fn default() -> Self {
        Self {
            poll_errors: Family::default(),
            poll_time: Family::new_with_constructor(time_histogram),
            execute_time: Family::new_with_constructor(time_histogram),
            update_errors: Family::default(),
            update_time: Family::new_with_constructor(time_histogram),
            result_size: Histogram::new(SDK_SIZE_BUCKETS),
        }
    }
}

/// The `status` label of the SDK time histograms.
pub(crate) fn outcome(success: bool) -> Label {
    [(
        "status",
        if success { "SUCCESS" } else { "FAILURE" }.to_owned(),
    )]
}

/// The `exception` label of the SDK error counters.
pub(crate) fn exception(kind: &str) -> Label {
    [("exception", kind.to_owned())]
}

/// The `perago_*` counters and gauges, read at each scrape.
#[derive(Debug)]
struct PeragoCollector(Arc<Counters>, Arc<Gauges>);

impl Collector for PeragoCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let exported = self.0.exported();
        let mut rest = exported.as_slice();
        // Consecutive entries of one family (results by status) share their descriptor.
        while let Some(first) = rest.first() {
            let n = rest.iter().take_while(|e| e.metric == first.metric).count();
            let (family, others) = rest.split_at(n);
            let mut descriptor =
                encoder.encode_descriptor(first.metric, first.help, None, MetricType::Counter)?;
            for entry in family {
                let value = ConstCounter::new(entry.value);
                match entry.label {
                    Some((key, label)) => {
                        value.encode(descriptor.encode_family(&[(key, label)])?)?
                    }
                    None => value.encode(descriptor.encode_family(&NO_LABELS)?)?,
                }
            }
            rest = others;
        }
        // Kept by the logging (every worker of this process), not by the broker's counters.
        let mut descriptor = encoder.encode_descriptor(
            "perago_log_lines_dropped",
            "JSONL log lines this process could not write (a full log root) and dropped",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(perago_core::logging::lines_dropped())
            .encode(descriptor.encode_family(&NO_LABELS)?)?;
        let g = &self.1;
        let mut gauge = |name: &str, help: &str, value: u64| -> Result<(), std::fmt::Error> {
            let descriptor = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX)).encode(descriptor)
        };
        gauge(
            "perago_busy_slots",
            "Slots running an assignment",
            g.busy_slots.load(Ordering::Relaxed),
        )?;
        gauge(
            "perago_slots",
            "Executor slots",
            g.slots.load(Ordering::Relaxed),
        )?;
        gauge(
            "perago_wanted_executors",
            "Executors the runtime wants running (between the -j range's bounds)",
            g.wanted_executors.load(Ordering::Relaxed),
        )?;
        gauge(
            "perago_body_version",
            "The body version new executors start with (1 at start, +1 per roll of a changed body)",
            g.body_version.load(Ordering::Relaxed),
        )?;
        gauge(
            "perago_body_version_oldest",
            "The oldest body version a live executor runs (below perago_body_version while a roll is under way)",
            g.oldest_body_version.load(Ordering::Relaxed),
        )?;
        let depth = g.queue_depth.load(Ordering::Relaxed);
        if depth != u64::MAX {
            gauge(
                "perago_queue_depth",
                "The task type's queue depth as Conductor last reported it",
                depth,
            )?;
        }
        let available = g.available_memory.load(Ordering::Relaxed);
        if available > 0 {
            gauge(
                "perago_available_memory_bytes",
                "Available memory when last measured (cgroup v1 and v2 aware)",
                available,
            )?;
        }
        gauge(
            "perago_admission_open",
            "1 while the broker may poll for new tasks, 0 while memory admission (PERAGO_MIN_FREE_MEMORY, PERAGO_MEMORY_HEADROOM) or --max-runtime holds them back",
            g.admission_open.load(Ordering::Relaxed),
        )?;
        gauge(
            "perago_profile_executions",
            "Executions in the type's rolling profile (the last 100)",
            g.profile_executions.load(Ordering::Relaxed),
        )?;
        let executions = g.profile_executions.load(Ordering::Relaxed);
        if executions > 0 {
            gauge(
                "perago_profile_duration_mean_milliseconds",
                "The mean dispatch-to-completion duration over the type's profile",
                g.profile_duration_mean_ms.load(Ordering::Relaxed),
            )?;
            gauge(
                "perago_profile_duration_p95_milliseconds",
                "The 95th percentile dispatch-to-completion duration over the type's profile (--max-runtime compares it with the time left)",
                g.profile_duration_p95_ms.load(Ordering::Relaxed),
            )?;
        }
        let peak = g.profile_peak_memory.load(Ordering::Relaxed);
        if peak > 0 {
            gauge(
                "perago_profile_peak_memory_bytes",
                "The highest body peak memory over the type's profile (PERAGO_MEMORY_HEADROOM admits by it)",
                peak,
            )?;
        }
        let room = g.memory_room.load(Ordering::Relaxed);
        if room != u64::MAX {
            gauge(
                "perago_memory_room_tasks",
                "PERAGO_MEMORY_HEADROOM: how many more tasks of the type available memory admits beside those in flight",
                room,
            )?;
        }
        let left = g.time_left_ms.load(Ordering::Relaxed);
        if left != u64::MAX {
            gauge(
                "perago_time_left_milliseconds",
                "--once --max-runtime: the time left before the run's deadline",
                left,
            )?;
        }
        let share_limit = g.share_limit.load(Ordering::Relaxed);
        if share_limit != u64::MAX {
            gauge(
                "perago_share_permits",
                "Capacity shared across task types (start --pool, concurrency groups): the tasks the supervisor lets this type hold at once",
                share_limit,
            )?;
            gauge(
                "perago_share_held",
                "Capacity shared across task types: the tasks this type holds against its permits (busy, awaiting the next, polled for, held)",
                g.share_held.load(Ordering::Relaxed),
            )?;
        }
        gauge(
            "perago_paused",
            "1 while polling is paused (perago-supervisor pause, start --paused), else 0",
            g.paused.load(Ordering::Relaxed),
        )
    }
}

/// No labels beyond the registry's own.
const NO_LABELS: [(&str, &str); 0] = [];

/// The SDK names for counts the runtime keeps anyway, read at each scrape.
#[derive(Debug)]
struct SdkCollector(Arc<Counters>, Arc<Gauges>);

impl Collector for SdkCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let c = &self.0;
        let mut counter = |name: &str, help: &str, value: u64| -> Result<(), std::fmt::Error> {
            let descriptor = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            ConstCounter::new(value).encode(descriptor)
        };
        counter(
            "task_poll",
            "Poll requests issued to the server",
            c.polls.get(),
        )?;
        counter(
            "task_execution_started",
            "Polled tasks dispatched to an executor",
            c.dispatched.get(),
        )?;
        counter(
            "worker_restart",
            "Executors that exited while not draining (each is restarted)",
            c.executor_exits.get(),
        )?;
        let mut errors = encoder.encode_descriptor(
            "task_execute_error",
            "Executions that ended FAILED or FAILED_WITH_TERMINAL_ERROR (the exception label)",
            None,
            MetricType::Counter,
        )?;
        for (status, value) in [
            ("FAILED", c.failed.get()),
            ("FAILED_WITH_TERMINAL_ERROR", c.failed_terminal.get()),
        ] {
            ConstCounter::new(value).encode(errors.encode_family(&[("exception", status)])?)?;
        }
        let busy = self.1.busy_slots.load(Ordering::Relaxed);
        let descriptor = encoder.encode_descriptor(
            "active_workers",
            "Executors running a task now",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(i64::try_from(busy).unwrap_or(i64::MAX)).encode(descriptor)
    }
}

/// The registry `/metrics` serves: the `perago_*` families labelled `task`, and the Conductor
/// SDKs' canonical families labelled `taskType`. `perago_runtime_info` (always 1) carries the
/// runtime's settings as labels: `domain` (empty: the default queue) and `execution_mode`
/// (empty: not told by a supervisor); `perago_sdk_setting_info` (1 each) names every Conductor
/// SDK worker setting that applied, with its value and the variable it came from.
pub(crate) fn registry(
    task: &str,
    domain: Option<&perago_core::conductor::Domain>,
    settings: &perago_proto::admin::v1::RuntimeSettings,
    counters: &Arc<Counters>,
    gauges: &Arc<Gauges>,
) -> Registry {
    let mut root = Registry::default();
    let perago = root.sub_registry_with_label(("task".into(), task.to_owned().into()));
    let _ = gauges.execution_mode.set(settings.execution_mode.clone());
    gauges.set_runtime_info(domain);
    perago.register(
        "perago_runtime_info",
        "The runtime's settings, as labels (domain: the task domain polled in, empty for none; execution_mode: process or thread); always 1",
        gauges.runtime_info.clone(),
    );
    let sdk_settings = Family::<Vec<(String, String)>, Gauge>::default();
    for setting in &settings.sdk_settings {
        sdk_settings
            .get_or_create(&vec![
                ("property".to_owned(), setting.property.clone()),
                ("value".to_owned(), setting.value.clone()),
                ("variable".to_owned(), setting.variable.clone()),
            ])
            .set(1);
    }
    perago.register(
        "perago_sdk_setting_info",
        "A Conductor SDK worker setting that applied (README: the Conductor SDK's worker settings), with its value and the variable that set it; always 1",
        sdk_settings,
    );
    perago.register_collector(Box::new(PeragoCollector(
        Arc::clone(counters),
        Arc::clone(gauges),
    )));
    perago.register(
        "perago_task_duration_seconds",
        "Time from dispatch to completion",
        gauges.task_duration.clone(),
    );
    perago.register(
        "perago_body_peak_memory_bytes",
        "The peak memory of each body, as its memory cgroup counted it (body.memory_limit)",
        gauges.body_peak_memory.clone(),
    );
    perago.register(
        "perago_body_oom_kills",
        "Bodies the kernel OOM-killed at their body.memory_limit (each failed its task)",
        gauges.body_oom_kills.clone(),
    );
    let sdk = root.sub_registry_with_label(("taskType".into(), task.to_owned().into()));
    sdk.register_collector(Box::new(SdkCollector(
        Arc::clone(counters),
        Arc::clone(gauges),
    )));
    let s = &gauges.sdk;
    sdk.register(
        "task_poll_error",
        "Poll requests that failed client-side, by error kind",
        s.poll_errors.clone(),
    );
    sdk.register(
        "task_poll_time_seconds",
        "Poll request latency (a long poll waits up to PERAGO_POLL_WAIT_MS)",
        s.poll_time.clone(),
    );
    sdk.register(
        "task_execute_time_seconds",
        "Time from dispatch to completion, by outcome",
        s.execute_time.clone(),
    );
    sdk.register(
        "task_update_error",
        "Result update attempts that failed, by error kind",
        s.update_errors.clone(),
    );
    sdk.register(
        "task_update_time_seconds",
        "Result update latency, by outcome",
        s.update_time.clone(),
    );
    sdk.register(
        "task_result_size_bytes",
        "Size of the task output's JSON",
        s.result_size.clone(),
    );
    root
}

/// The Prometheus text exposition (version 0.0.4) of `registry`.
pub(crate) fn prometheus(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut out, registry)
        .expect("writing into a String cannot fail");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape(c: Counters, g: Gauges) -> String {
        prometheus(&registry(
            "features.build",
            None,
            &perago_proto::admin::v1::RuntimeSettings::default(),
            &Arc::new(c),
            &Arc::new(g),
        ))
    }

    /// Issue #26, items 3 and 5: the execution mode is a label of `perago_runtime_info`, and
    /// each SDK setting that applied is a `perago_sdk_setting_info` series.
    #[test]
    fn the_runtime_info_carries_the_mode_and_the_sdk_settings() {
        let settings = perago_proto::admin::v1::RuntimeSettings {
            execution_mode: "thread".to_owned(),
            sdk_settings: vec![perago_proto::admin::v1::SdkSetting {
                property: "thread_count".to_owned(),
                value: "3".to_owned(),
                variable: "CONDUCTOR_WORKER_ALL_THREAD_COUNT".to_owned(),
            }],
            ..Default::default()
        };
        let text = prometheus(&registry(
            "t",
            None,
            &settings,
            &Arc::default(),
            &Arc::default(),
        ));
        assert!(
            text.contains(
                "perago_runtime_info{task=\"t\",domain=\"\",execution_mode=\"thread\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("perago_sdk_setting_info{task=\"t\",property=\"thread_count\",value=\"3\",variable=\"CONDUCTOR_WORKER_ALL_THREAD_COUNT\"} 1"),
            "{text}"
        );
    }

    /// Issue #26, item 1: the domain polled in is a label of `perago_runtime_info`.
    #[test]
    fn the_runtime_info_carries_the_domain() {
        let blue = perago_core::conductor::Domain::parse("blue").unwrap();
        let text = prometheus(&registry(
            "features.build",
            Some(&blue),
            &perago_proto::admin::v1::RuntimeSettings::default(),
            &Arc::default(),
            &Arc::default(),
        ));
        assert!(
            text.contains(
                "perago_runtime_info{task=\"features.build\",domain=\"blue\",execution_mode=\"\"} 1"
            ),
            "{text}"
        );
        assert!(scrape(Counters::default(), Gauges::default()).contains(
            "perago_runtime_info{task=\"features.build\",domain=\"\",execution_mode=\"\"} 1"
        ));
    }

    /// Issue #26, item 4: a reconfigured domain relabels `perago_runtime_info` (one series,
    /// the new domain, the execution mode kept).
    #[test]
    fn a_reconfigured_domain_relabels_the_runtime_info() {
        let gauges = Arc::new(Gauges::default());
        let registry = registry(
            "features.build",
            Some(&perago_core::conductor::Domain::parse("blue").unwrap()),
            &perago_proto::admin::v1::RuntimeSettings {
                execution_mode: "process".to_owned(),
                ..Default::default()
            },
            &Arc::default(),
            &gauges,
        );
        gauges.set_runtime_info(Some(
            &perago_core::conductor::Domain::parse("green").unwrap(),
        ));
        let text = prometheus(&registry);
        let info: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("perago_runtime_info{"))
            .collect();
        assert_eq!(
            info,
            [
                "perago_runtime_info{task=\"features.build\",domain=\"green\",execution_mode=\"process\"} 1"
            ]
        );
    }

    #[test]
    fn exposition_has_every_family_and_a_consistent_histogram() {
        let c = Counters::default();
        c.polls.inc();
        c.completed.inc();
        c.failed.inc();
        c.failed.inc();
        let g = Gauges::default();
        g.task_duration.observe(0.003);
        g.task_duration.observe(2.0);
        g.body_peak_memory.observe(100.0 * 1048576.0);
        g.body_oom_kills.inc();
        let text = scrape(c, g);
        for line in [
            "perago_polls_total{task=\"features.build\"} 1",
            "perago_task_results_total{task=\"features.build\",status=\"COMPLETED\"} 1",
            "perago_task_results_total{task=\"features.build\",status=\"FAILED\"} 2",
            "perago_task_duration_seconds_bucket{task=\"features.build\",le=\"0.005\"} 1",
            "perago_task_duration_seconds_bucket{task=\"features.build\",le=\"5\"} 2",
            "perago_task_duration_seconds_count{task=\"features.build\"} 2",
            "perago_body_peak_memory_bytes_bucket{task=\"features.build\",le=\"6.7108864e+07\"} 0",
            "perago_body_peak_memory_bytes_bucket{task=\"features.build\",le=\"2.68435456e+08\"} 1",
            "perago_body_oom_kills_total{task=\"features.build\"} 1",
            // Kept by the logging, per process: its value is whatever this process dropped.
            "perago_log_lines_dropped_total{task=\"features.build\"} ",
        ] {
            assert!(text.contains(line), "{line} missing:\n{text}");
        }
        // One family per name: a TYPE line each, and every sample under its own family.
        let mut types: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split(' ').next().unwrap())
            .collect();
        let all = types.len();
        types.sort_unstable();
        types.dedup();
        assert_eq!(types.len(), all, "a family announced twice:\n{text}");
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let family = line.split(['{', ' ']).next().unwrap();
            let base = family
                .trim_end_matches("_bucket")
                .trim_end_matches("_sum")
                .trim_end_matches("_count");
            assert!(types.contains(&base), "{line}");
        }
    }

    /// Every counter of Admin.Status is on /metrics too: both come from the one list (and
    /// `snapshot` names every field of `BrokerCounters`, or it does not compile).
    #[test]
    fn every_status_counter_is_exported() {
        let c = Counters::default();
        let exported = c.exported();
        let text = scrape(c, Gauges::default());
        for entry in exported {
            assert!(
                text.contains(&format!("# TYPE {}_total counter", entry.metric)),
                "{}",
                entry.metric
            );
        }
    }

    /// The Conductor SDKs' canonical names, with `taskType`, so their dashboards work.
    #[test]
    fn the_sdk_families_carry_the_task_type() {
        let c = Counters::default();
        c.polls.inc();
        c.dispatched.inc();
        c.failed_terminal.inc();
        let g = Gauges::default();
        g.busy_slots.store(2, Ordering::Relaxed);
        g.sdk.poll_time.get_or_create(&outcome(true)).observe(0.02);
        g.sdk
            .poll_errors
            .get_or_create(&exception("Transport"))
            .inc();
        g.sdk
            .execute_time
            .get_or_create(&outcome(false))
            .observe(1.5);
        g.sdk
            .update_errors
            .get_or_create(&exception("Status"))
            .inc();
        g.sdk
            .update_time
            .get_or_create(&outcome(true))
            .observe(0.004);
        g.sdk.result_size.observe(1200.0);
        let text = scrape(c, g);
        for line in [
            "task_poll_total{taskType=\"features.build\"} 1",
            "task_execution_started_total{taskType=\"features.build\"} 1",
            "task_execute_error_total{taskType=\"features.build\",exception=\"FAILED_WITH_TERMINAL_ERROR\"} 1",
            "active_workers{taskType=\"features.build\"} 2",
            "task_poll_error_total{taskType=\"features.build\",exception=\"Transport\"} 1",
            "task_poll_time_seconds_bucket{taskType=\"features.build\",status=\"SUCCESS\",le=\"0.025\"} 1",
            "task_execute_time_seconds_count{taskType=\"features.build\",status=\"FAILURE\"} 1",
            "task_update_error_total{taskType=\"features.build\",exception=\"Status\"} 1",
            "task_update_time_seconds_count{taskType=\"features.build\",status=\"SUCCESS\"} 1",
            "task_result_size_bytes_bucket{taskType=\"features.build\",le=\"10000\"} 1",
            "worker_restart_total{taskType=\"features.build\"} 0",
        ] {
            assert!(text.contains(line), "{line} missing:\n{text}");
        }
    }
}
