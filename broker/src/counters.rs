//! The broker's monotonic counters, shared by the actor, the poller and the reporters.

use perago_proto::admin::v1::BrokerCounters;
use std::sync::atomic::{AtomicU64, Ordering};

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

/// Everything `Status` reports.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) polls: Counter,
    pub(crate) empty_polls: Counter,
    pub(crate) poll_errors: Counter,
    pub(crate) dispatched: Counter,
    pub(crate) completed: Counter,
    pub(crate) failed: Counter,
    pub(crate) failed_terminal: Counter,
    pub(crate) update_retries: Counter,
    pub(crate) lease_extensions: Counter,
    pub(crate) leases_lost: Counter,
    pub(crate) executor_exits: Counter,
    pub(crate) results_lost: Counter,
    pub(crate) rejected_completions: Counter,
    pub(crate) executors_recycled: Counter,
    pub(crate) tasks_poisoned: Counter,
    pub(crate) scale_ups: Counter,
    pub(crate) scale_downs: Counter,
    pub(crate) polls_withheld: Counter,
}

impl Counters {
    pub(crate) fn snapshot(&self) -> BrokerCounters {
        BrokerCounters {
            polls: self.polls.get(),
            empty_polls: self.empty_polls.get(),
            poll_errors: self.poll_errors.get(),
            dispatched: self.dispatched.get(),
            completed: self.completed.get(),
            failed: self.failed.get(),
            failed_terminal: self.failed_terminal.get(),
            update_retries: self.update_retries.get(),
            lease_extensions: self.lease_extensions.get(),
            leases_lost: self.leases_lost.get(),
            executor_exits: self.executor_exits.get(),
            results_lost: self.results_lost.get(),
            rejected_completions: self.rejected_completions.get(),
            executors_recycled: self.executors_recycled.get(),
            tasks_poisoned: self.tasks_poisoned.get(),
            scale_ups: self.scale_ups.get(),
            scale_downs: self.scale_downs.get(),
            polls_withheld: self.polls_withheld.get(),
        }
    }
}

/// Upper bounds (seconds) of the task duration histogram buckets.
pub(crate) const DURATION_BUCKETS: [f64; 12] = [
    0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0, 300.0, 1800.0,
];

/// Dispatch-to-completion durations, as a Prometheus histogram.
#[derive(Debug, Default)]
pub(crate) struct Histogram {
    buckets: [Counter; DURATION_BUCKETS.len()],
    count: Counter,
    sum_micros: AtomicU64,
}

impl Histogram {
    pub(crate) fn observe(&self, seconds: f64) {
        for (bound, bucket) in DURATION_BUCKETS.iter().zip(&self.buckets) {
            if seconds <= *bound {
                bucket.inc();
            }
        }
        self.count.inc();
        self.sum_micros
            .fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
    }
}

/// Gauges and the histogram, beside the counters.
#[derive(Debug, Default)]
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
    pub(crate) task_duration: Histogram,
}

/// The Prometheus text exposition of everything the broker counts.
pub(crate) fn prometheus(task: &str, c: &Counters, g: &Gauges) -> String {
    use std::fmt::Write as _;
    let label = format!(
        "task=\"{}\"",
        task.replace('\\', "\\\\").replace('"', "\\\"")
    );
    let mut out = String::new();
    let mut counter = |name: &str, help: &str, value: u64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{{label}}} {value}"
        );
    };
    counter(
        "perago_polls_total",
        "Poll requests sent to Conductor.",
        c.polls.get(),
    );
    counter(
        "perago_empty_polls_total",
        "Polls that returned no task.",
        c.empty_polls.get(),
    );
    counter(
        "perago_poll_errors_total",
        "Polls that failed.",
        c.poll_errors.get(),
    );
    counter(
        "perago_tasks_dispatched_total",
        "Assignments sent to executor slots.",
        c.dispatched.get(),
    );
    counter(
        "perago_update_retries_total",
        "Result updates retried after an error.",
        c.update_retries.get(),
    );
    counter(
        "perago_lease_extensions_total",
        "Lease extensions sent.",
        c.lease_extensions.get(),
    );
    counter(
        "perago_leases_lost_total",
        "Leases found lost when reading a task back.",
        c.leases_lost.get(),
    );
    counter(
        "perago_executor_exits_total",
        "Executor generations that exited while not draining (each is restarted).",
        c.executor_exits.get(),
    );
    counter(
        "perago_results_lost_total",
        "Results given up on after retries.",
        c.results_lost.get(),
    );
    counter(
        "perago_completions_rejected_total",
        "Completions refused because they were not the slot's current assignment.",
        c.rejected_completions.get(),
    );
    counter(
        "perago_executors_recycled_total",
        "Executors replaced after --max-tasks-per-executor or --max-executor-memory.",
        c.executors_recycled.get(),
    );
    counter(
        "perago_tasks_poisoned_total",
        "Tasks failed for good after PERAGO_POISON_AFTER executor crashes.",
        c.tasks_poisoned.get(),
    );
    counter(
        "perago_scale_ups_total",
        "Slots started above the minimum of the executor range.",
        c.scale_ups.get(),
    );
    counter(
        "perago_scale_downs_total",
        "Idle slots retired down towards the minimum of the executor range.",
        c.scale_downs.get(),
    );
    counter(
        "perago_polls_withheld_total",
        "Poll grants withheld while available memory was below PERAGO_MIN_FREE_MEMORY.",
        c.polls_withheld.get(),
    );
    let _ = writeln!(
        out,
        "# HELP perago_task_results_total Results reported to Conductor, by status.\n# TYPE perago_task_results_total counter"
    );
    for (status, value) in [
        ("COMPLETED", c.completed.get()),
        ("FAILED", c.failed.get()),
        ("FAILED_WITH_TERMINAL_ERROR", c.failed_terminal.get()),
    ] {
        let _ = writeln!(
            out,
            "perago_task_results_total{{{label},status=\"{status}\"}} {value}"
        );
    }
    let _ = writeln!(
        out,
        "# HELP perago_busy_slots Slots running an assignment.\n# TYPE perago_busy_slots gauge\nperago_busy_slots{{{label}}} {}",
        g.busy_slots.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "# HELP perago_slots Executor slots.\n# TYPE perago_slots gauge\nperago_slots{{{label}}} {}",
        g.slots.load(Ordering::Relaxed)
    );
    let mut gauge = |name: &str, help: &str, value: u64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{label}}} {value}"
        );
    };
    gauge(
        "perago_wanted_executors",
        "Executors the runtime wants running (between the -j range's bounds).",
        g.wanted_executors.load(Ordering::Relaxed),
    );
    let depth = g.queue_depth.load(Ordering::Relaxed);
    if depth != u64::MAX {
        gauge(
            "perago_queue_depth",
            "The task type's queue depth as Conductor last reported it.",
            depth,
        );
    }
    let available = g.available_memory.load(Ordering::Relaxed);
    if available > 0 {
        gauge(
            "perago_available_memory_bytes",
            "Available memory when last measured (cgroup v2 aware).",
            available,
        );
    }
    gauge(
        "perago_admission_open",
        "1 while the broker may poll for new tasks, 0 while memory admission is closed.",
        g.admission_open.load(Ordering::Relaxed),
    );
    let h = &g.task_duration;
    let _ = writeln!(
        out,
        "# HELP perago_task_duration_seconds Time from dispatch to completion.\n# TYPE perago_task_duration_seconds histogram"
    );
    for (bound, bucket) in DURATION_BUCKETS.iter().zip(&h.buckets) {
        let _ = writeln!(
            out,
            "perago_task_duration_seconds_bucket{{{label},le=\"{bound}\"}} {}",
            bucket.get()
        );
    }
    let _ = writeln!(
        out,
        "perago_task_duration_seconds_bucket{{{label},le=\"+Inf\"}} {}\nperago_task_duration_seconds_sum{{{label}}} {}\nperago_task_duration_seconds_count{{{label}}} {}",
        h.count.get(),
        h.sum_micros.load(Ordering::Relaxed) as f64 / 1e6,
        h.count.get()
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_has_every_family_and_a_consistent_histogram() {
        let c = Counters::default();
        c.polls.inc();
        c.completed.inc();
        let g = Gauges::default();
        g.task_duration.observe(0.003);
        g.task_duration.observe(2.0);
        let text = prometheus("features.build", &c, &g);
        assert!(text.contains("perago_polls_total{task=\"features.build\"} 1"));
        assert!(
            text.contains(
                "perago_task_results_total{task=\"features.build\",status=\"COMPLETED\"} 1"
            )
        );
        assert!(text.contains(
            "perago_task_duration_seconds_bucket{task=\"features.build\",le=\"0.005\"} 1"
        ));
        assert!(
            text.contains(
                "perago_task_duration_seconds_bucket{task=\"features.build\",le=\"5\"} 2"
            )
        );
        assert!(text.contains("perago_task_duration_seconds_count{task=\"features.build\"} 2"));
        // Every sample line belongs to a family announced by a TYPE line.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let family = line.split(['{', ' ']).next().unwrap();
            let base = family
                .trim_end_matches("_bucket")
                .trim_end_matches("_sum")
                .trim_end_matches("_count");
            assert!(text.contains(&format!("# TYPE {base} ")), "{line}");
        }
    }
}
