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
        }
    }
}
