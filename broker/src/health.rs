//! Whether Conductor answers, shared by the poller, the result reporters and the lease
//! extenders. During an outage their retries back off (to 30 s for updates and polls), so
//! none of them would notice a recovery for up to that long; instead one prober asks
//! Conductor every second while it is down, and the first answer — the prober's or anyone's —
//! wakes every waiting retry at once. An outage costs one request a second, not one per task.

use perago_core::conductor::{ConductorClient, ConductorError};
use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};
use tokio::sync::Notify;

/// How often the prober asks Conductor while it does not answer.
const PROBE_EVERY: Duration = Duration::from_secs(1);

/// The shared view of Conductor's reachability; cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Health {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    up: AtomicBool,
    recovered: Notify,
    probing: AtomicBool,
    client: ConductorClient,
    task_name: String,
}

/// The server answered: anything but a transport error, a 5xx or a 429.
fn answered<T>(outcome: &Result<T, ConductorError>) -> bool {
    match outcome {
        Ok(_) => true,
        Err(e) => !e.is_retryable(),
    }
}

impl Health {
    pub(crate) fn new(client: ConductorClient, task_name: String) -> Self {
        Self {
            inner: Arc::new(Inner {
                up: AtomicBool::new(true),
                recovered: Notify::new(),
                probing: AtomicBool::new(false),
                client,
                task_name,
            }),
        }
    }

    /// Records the outcome of a request to Conductor and passes it on.
    pub(crate) fn observe<T>(
        &self,
        outcome: Result<T, ConductorError>,
    ) -> Result<T, ConductorError> {
        if answered(&outcome) {
            self.mark_up();
        } else {
            self.mark_down();
        }
        outcome
    }

    pub(crate) fn is_up(&self) -> bool {
        self.inner.up.load(Ordering::Acquire)
    }

    fn mark_up(&self) {
        if !self.inner.up.swap(true, Ordering::AcqRel) {
            tracing::info!("Conductor answers again; waking every waiting retry");
            self.inner.recovered.notify_waiters();
        }
    }

    fn mark_down(&self) {
        if self.inner.up.swap(false, Ordering::AcqRel) {
            tracing::warn!(
                "Conductor does not answer; retries back off and a probe asks every {}s",
                PROBE_EVERY.as_secs()
            );
        }
        if !self.inner.probing.swap(true, Ordering::AcqRel) {
            let this = self.clone();
            tokio::spawn(async move { this.probe().await });
        }
    }

    async fn probe(self) {
        loop {
            while !self.is_up() {
                tokio::time::sleep(PROBE_EVERY).await;
                if self.is_up() {
                    break;
                }
                let outcome = self.inner.client.get_task_def(&self.inner.task_name).await;
                if answered(&outcome) {
                    self.mark_up();
                }
            }
            self.inner.probing.store(false, Ordering::Release);
            // A failure that raced with the end of this probe keeps it going.
            if self.is_up() || self.inner.probing.swap(true, Ordering::AcqRel) {
                return;
            }
        }
    }

    /// Waits `delay` before a retry, or less: with `wake`, until Conductor is seen answering
    /// again. Returns whether the wait was cut short, so a caller whose retry fails once more
    /// right after a recovery (a request the server keeps refusing) waits its whole backoff
    /// next time instead of following every probe.
    pub(crate) async fn retry_after(&self, delay: Duration, wake: bool) -> bool {
        let recovered = self.inner.recovered.notified();
        tokio::pin!(recovered);
        recovered.as_mut().enable();
        if !wake {
            tokio::time::sleep(delay).await;
            return false;
        }
        if self.is_up() {
            // Someone got an answer since this caller's failure: retry soon.
            tokio::time::sleep(delay.min(PROBE_EVERY)).await;
            return true;
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => false,
            () = recovered => true,
        }
    }
}

/// The retry loop's memory of [`Health::retry_after`]: wake early only if the previous early
/// wake-up was not followed by another failure.
#[derive(Debug, Default)]
pub(crate) struct Waker {
    woken: bool,
}

impl Waker {
    /// Waits before the next retry (see [`Health::retry_after`]).
    pub(crate) async fn wait(&mut self, health: &Health, delay: Duration) {
        self.woken = health.retry_after(delay, !self.woken).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn unreachable_health() -> Health {
        // A port nothing listens on: every request is a transport error.
        let client = ConductorClient::new("http://127.0.0.1:9/api").unwrap();
        Health::new(client, "t".into())
    }

    #[tokio::test]
    async fn a_recovery_wakes_a_long_wait_at_once() {
        let health = unreachable_health();
        health.inner.up.store(false, Ordering::Release);
        let waiter = {
            let health = health.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                assert!(health.retry_after(Duration::from_secs(30), true).await);
                started.elapsed()
            })
        };
        tokio::task::yield_now().await;
        health.mark_up();
        let waited = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiter woke")
            .unwrap();
        assert!(waited < Duration::from_secs(5), "{waited:?}");
    }

    #[tokio::test]
    async fn answers_and_outages_are_told_apart() {
        let ok: Result<(), ConductorError> = Ok(());
        assert!(answered(&ok));
        let health = unreachable_health();
        let refused = health.inner.client.get_task(&"x".repeat(3)).await;
        assert!(!answered(&refused), "{refused:?}");
        let _ = health.observe(refused);
        assert!(!health.is_up());
        assert!(health.inner.probing.load(Ordering::Acquire));
    }
}
