//! The poll loop: asks the actor how many tasks to poll for (the machine decides: every free
//! slot, or one while the queue looks sparse), polls Conductor for them (a long poll for one
//! task, at most `FILL_WAIT` for more: `state::poll_wait`), hands them to the actor. Errors
//! back off (capped, jittered) and are logged when the state changes, not at every retry;
//! they never stop the broker.

use crate::{
    actor::Event,
    counters::{Counters, Gauges, exception, outcome},
    health::{Health, Waker},
    state::{Input, poll_wait},
};
use perago_core::{
    backoff::Backoff,
    conductor::{ConductorClient, Domain},
};
use std::{sync::Arc, time::Duration};
use tokio::sync::{mpsc, oneshot};

#[derive(Debug)]
pub(crate) struct Poller {
    pub(crate) client: ConductorClient,
    pub(crate) task_name: String,
    /// Polled in this domain only (its queue `domain:type`); `None`: the default queue.
    pub(crate) domain: Option<Domain>,
    pub(crate) broker_id: String,
    pub(crate) wait: Duration,
    /// The wait after a poll that brought no task, before the next (`PERAGO_POLL_INTERVAL_MS`,
    /// the SDK's `poll_interval`; zero: the long poll alone paces the loop).
    pub(crate) idle_wait: Duration,
    pub(crate) backoff: Backoff,
    pub(crate) counters: Arc<Counters>,
    pub(crate) gauges: Arc<Gauges>,
    pub(crate) health: Health,
}

impl Poller {
    /// Runs until the actor answers a poll request with 0 (drain) or goes away.
    pub(crate) async fn run(self, events: mpsc::Sender<Event>) {
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
            self.counters.polls.inc();
            let started = std::time::Instant::now();
            let polled = self.health.observe(
                self.client
                    .batch_poll_in(
                        &self.task_name,
                        self.domain.as_ref(),
                        &self.broker_id,
                        count,
                        poll_wait(count, self.wait),
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
                    if events.send(Event::polled(tasks, count)).await.is_err() {
                        return;
                    }
                    if empty && !self.idle_wait.is_zero() {
                        tokio::time::sleep(self.idle_wait).await;
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
