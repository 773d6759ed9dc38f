//! The poll loop: asks the actor how many tasks to poll for (the machine decides: every free
//! slot, or one while the queue looks sparse), polls Conductor for them (a long poll for one
//! task, at most `FILL_WAIT` for more: `state::poll_wait`), hands them to the actor. Errors
//! back off (capped, jittered) and are logged when the state changes, not at every retry;
//! they never stop the broker.

use crate::{
    actor::Event,
    counters::{Counters, Gauges, exception, outcome},
    health::{Health, Waker},
    state::{Input, PollSettings, poll_wait},
};
use perago_core::{backoff::Backoff, conductor::ConductorClient};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, watch};

#[derive(Debug)]
pub(crate) struct Poller {
    pub(crate) client: ConductorClient,
    pub(crate) task_name: String,
    /// How to poll, as the machine says (a reconfigure changes it, from the next poll on): the
    /// domain polled in (its queue `domain:type`; `None`: the default queue), the long poll's
    /// wait, and the wait after a poll that brought no task (`PERAGO_POLL_INTERVAL_MS`, the
    /// SDK's `poll_interval`; zero: the long poll alone paces the loop).
    pub(crate) settings: watch::Receiver<PollSettings>,
    pub(crate) broker_id: String,
    pub(crate) backoff: Backoff,
    pub(crate) counters: Arc<Counters>,
    pub(crate) gauges: Arc<Gauges>,
    pub(crate) health: Health,
}

impl Poller {
    /// Runs until the actor answers a poll request with 0 (drain) or goes away.
    pub(crate) async fn run(mut self, events: mpsc::Sender<Event>) {
        let mut failures = 0u32;
        let mut waker = Waker::default();
        loop {
            let (reply, answer) = oneshot::channel();
            if events.send(Event::PollRequest { reply }).await.is_err() {
                return;
            }
            let count = match answer.await {
                Ok(0) | Err(_) => {
                    tracing::info!("poll loop stopped");
                    return;
                }
                Ok(n) => n,
            };
            let settings = self.settings.borrow_and_update().clone();
            self.counters.polls.inc();
            let started = std::time::Instant::now();
            let started_at = std::time::SystemTime::now();
            let polled = self.health.observe(
                self.client
                    .batch_poll_in(
                        &self.task_name,
                        settings.domain.as_ref(),
                        &self.broker_id,
                        count,
                        poll_wait(count, settings.wait),
                    )
                    .await,
            );
            let sdk = &self.gauges.sdk;
            sdk.poll_time
                .get_or_create(&outcome(polled.is_ok()))
                .observe(started.elapsed().as_secs_f64());
            if let Err(e) = &polled {
                sdk.poll_errors.get_or_create(&exception(&e.kind())).inc();
            }
            match polled {
                Ok(tasks) => {
                    if failures > 0 {
                        tracing::info!(failures, "polling recovered");
                        failures = 0;
                    }
                    let empty = tasks.is_empty();
                    if empty {
                        self.counters.empty_polls.inc();
                    }
                    if events
                        .send(Event::polled(tasks, count, started_at))
                        .await
                        .is_err()
                    {
                        return;
                    }
                    if empty && !settings.idle_wait.is_zero() {
                        // A reconfigure cuts the wait short: the new settings apply at once.
                        tokio::select! {
                            () = tokio::time::sleep(settings.idle_wait) => {}
                            _ = self.settings.changed() => {}
                        }
                    }
                }
                Err(e) => {
                    self.counters.poll_errors.inc();
                    let delay = self.backoff.delay(failures);
                    if failures == 0 {
                        tracing::warn!(error = %perago_core::errors::DisplayChain(&e), "poll failed; backing off until Conductor answers again");
                    }
                    failures = failures.saturating_add(1);
                    if events
                        .send(Event::Slot(Input::PollFailed { reserved: count }))
                        .await
                        .is_err()
                    {
                        return;
                    }
                    // An outage's end wakes the retry at once (see `health`).
                    waker.wait(&self.health, delay).await;
                }
            }
        }
    }
}
