//! Whether Conductor answers, shared by the poller, the result reporters and the lease
//! extenders. During an outage their retries back off (to 30 s for updates and polls), so
//! none of them would notice a recovery for up to that long; instead, while Conductor does not
//! answer, one waiting retry at a time is the probe: it waits at most a second and goes, and
//! the first answer wakes every waiting retry at once. An outage costs about one request a
//! second per route (below), not one per task.
//!
//! The probe is always a retry of a request that failed, never a request of its own: a
//! partial outage (the task routes refused while, say, `GET /metadata/taskdefs` answers) is
//! not taken for a recovery. An earlier prober asked for the TaskDef: in such an outage it
//! saw an answer every second, woke every retry to fail again, and the state flapped (22
//! times in 30 s) while the retries that had been woken and failed waited out their whole
//! backoff, so recovery took 6.65 s instead of one probe period.
//!
//! Each route (polls; updates and lease extensions) has its own state, made with
//! [`Health::route`]: an answer to a poll says nothing about updates. The outage is logged
//! once, at warn, when the first route stops answering, and once, at info, when the last one
//! answers again.

use perago_core::conductor::ConductorError;
use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};
use tokio::{sync::Notify, time::Instant};

/// How long the probe (one waiting retry per route) waits while Conductor does not answer.
const PROBE_EVERY: Duration = Duration::from_secs(1);

/// How long a retry waits whose request failed while another one got an answer.
const RETRY_SOON: Duration = Duration::from_millis(100);

/// The shared view of one route's reachability; cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Health {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Which requests this is about, for the log (`polls`, `updates`).
    route: &'static str,
    up: AtomicBool,
    recovered: Notify,
    /// While down: a waiting retry holds the probe's turn.
    probing: AtomicBool,
    /// The probe's turn was given up: a waiting retry may take it.
    probe_free: Notify,
    outage: Arc<Outage>,
}

/// What the routes share: how many of them do not answer, so that an outage is logged once.
#[derive(Debug, Default)]
struct Outage {
    down: AtomicUsize,
}

/// The server answered: anything but a transport error, a 5xx or a 429.
fn answered<T>(outcome: &Result<T, ConductorError>) -> bool {
    match outcome {
        Ok(_) => true,
        Err(e) => !e.is_retryable(),
    }
}

impl Health {
    /// The state of the requests named `route`; [`Self::route`] makes the others.
    pub(crate) fn new(route: &'static str) -> Self {
        Self::with_outage(route, Arc::default())
    }

    fn with_outage(route: &'static str, outage: Arc<Outage>) -> Self {
        Self {
            inner: Arc::new(Inner {
                route,
                up: AtomicBool::new(true),
                recovered: Notify::new(),
                probing: AtomicBool::new(false),
                probe_free: Notify::new(),
                outage,
            }),
        }
    }

    /// The state of another route, logged as part of the same outage.
    pub(crate) fn route(&self, route: &'static str) -> Self {
        Self::with_outage(route, Arc::clone(&self.inner.outage))
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
            let route = self.inner.route;
            if self.inner.outage.down.fetch_sub(1, Ordering::AcqRel) == 1 {
                tracing::info!(route, "Conductor answers again; waking every waiting retry");
            } else {
                tracing::debug!(route, "Conductor answers these requests again");
            }
            self.inner.recovered.notify_waiters();
        }
    }

    fn mark_down(&self) {
        if self.inner.up.swap(false, Ordering::AcqRel) {
            let route = self.inner.route;
            if self.inner.outage.down.fetch_add(1, Ordering::AcqRel) == 0 {
                tracing::warn!(
                    route,
                    "Conductor does not answer; retries back off and one of them goes every {}s \
                     until it answers (logged again when it does)",
                    PROBE_EVERY.as_secs()
                );
            } else {
                tracing::debug!(route, "Conductor does not answer these requests either");
            }
        }
    }

    /// Waits `delay` before a retry, or less: with `wake`, until Conductor is seen answering
    /// again, and while it does not, at most [`PROBE_EVERY`] when this retry takes the probe's
    /// turn (one waiting retry per route holds it). Returns whether the wait was cut short by
    /// an answer, so a caller whose retry fails once more right after a recovery (a request
    /// the server keeps refusing) waits its whole backoff next time instead of following
    /// every recovery; a probe that failed keeps probing.
    pub(crate) async fn retry_after(&self, delay: Duration, wake: bool) -> bool {
        let deadline = Instant::now() + delay;
        if !wake {
            tokio::time::sleep_until(deadline).await;
            return false;
        }
        loop {
            let recovered = self.inner.recovered.notified();
            tokio::pin!(recovered);
            recovered.as_mut().enable();
            let probe_free = self.inner.probe_free.notified();
            tokio::pin!(probe_free);
            probe_free.as_mut().enable();
            let now = Instant::now();
            let soon = deadline.min(now + PROBE_EVERY);
            if self.is_up() {
                // Someone got an answer since this caller's failure (it raced with the end
                // of the outage): retry almost at once. (The caller's next wait, should this
                // retry fail too, is its whole backoff.)
                tokio::time::sleep_until(deadline.min(now + RETRY_SOON)).await;
                return true;
            }
            if let Some(_turn) = ProbeTurn::take(&self.inner) {
                // This retry is the probe: it goes within a second (its turn is given up
                // when it goes, or when the caller drops the wait).
                return tokio::select! {
                    () = tokio::time::sleep_until(soon) => false,
                    () = recovered => true,
                };
            }
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => return false,
                () = recovered => return true,
                // The probe went (or its caller went away): take its turn if still down.
                () = probe_free => {}
            }
        }
    }
}

/// The probe's turn, held by one waiting retry; given up (and the other waiters told) on drop.
struct ProbeTurn<'a>(&'a Inner);

impl<'a> ProbeTurn<'a> {
    fn take(inner: &'a Inner) -> Option<Self> {
        inner
            .probing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| Self(inner))
    }
}

impl Drop for ProbeTurn<'_> {
    fn drop(&mut self) {
        self.0.probing.store(false, Ordering::Release);
        self.0.probe_free.notify_waiters();
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
    use perago_core::conductor::ConductorClient;

    fn down(route: &'static str) -> Health {
        let health = Health::new(route);
        health.mark_down();
        health
    }

    async fn refused() -> Result<(), ConductorError> {
        // A port nothing listens on: a transport error.
        let client = ConductorClient::new("http://127.0.0.1:9/api").unwrap();
        client.get_task("xxx").await.map(|_| ())
    }

    #[tokio::test]
    async fn a_recovery_wakes_a_long_wait_at_once() {
        let health = down("updates");
        let waiter = {
            let health = health.clone();
            tokio::spawn(async move {
                let started = std::time::Instant::now();
                // Not the probe: another waiter holds its turn.
                let _turn = ProbeTurn::take(&health.inner).unwrap();
                let woken = health.retry_after(Duration::from_secs(30), true).await;
                (woken, started.elapsed())
            })
        };
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        health.mark_up();
        let (woken, waited) = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiter woke")
            .unwrap();
        assert!(woken);
        assert!(waited < Duration::from_secs(5), "{waited:?}");
    }

    /// While Conductor does not answer, one waiter at a time goes after at most a second (the
    /// probe; not woken by an answer, so it may probe again), the others keep waiting; when the
    /// probe's request gets an answer, they all go at once. Before, waiters slept their whole
    /// backoff unless a TaskDef read answered (and then all of them went, whether the task
    /// routes answered or not).
    #[tokio::test]
    async fn one_waiter_at_a_time_probes_and_its_answer_wakes_the_rest() {
        // Real time (the broker's tokio has no test clock), on a loaded machine: the bounds
        // tell a probe period (1 s) from the 30 s backoff, not 1 s from 1.2 s.
        let soon = Duration::from_secs(10);
        let health = down("polls");
        let (done, mut finished) = tokio::sync::mpsc::unbounded_channel();
        for _ in 0..5 {
            let health = health.clone();
            let done = done.clone();
            tokio::spawn(async move {
                let woken = health.retry_after(Duration::from_secs(30), true).await;
                let _ = done.send(woken);
            });
        }
        let started = Instant::now();
        let woken = finished.recv().await.unwrap();
        assert!(!woken, "the probe was not woken by an answer");
        assert!(started.elapsed() < soon, "{:?}", started.elapsed());
        // Its retry fails (nothing marks the route up): the others take the turn, one at a
        // time.
        let woken = finished.recv().await.unwrap();
        assert!(!woken);
        assert!(finished.try_recv().is_err(), "one probe at a time");
        // The next probe's request is answered: everyone still waiting goes at once.
        health.observe(Ok::<_, ConductorError>(())).unwrap();
        let answered = Instant::now();
        for _ in 0..3 {
            assert!(finished.recv().await.unwrap(), "woken by the answer");
        }
        assert!(answered.elapsed() < soon, "{:?}", answered.elapsed());
    }

    /// An answer on one route (polls) does not wake the retries of another (updates), and the
    /// outage is one outage for the log: down while any route is down.
    #[tokio::test]
    async fn routes_recover_separately() {
        let polls = Health::new("polls");
        let updates = polls.route("updates");
        polls.mark_down();
        updates.mark_down();
        assert_eq!(polls.inner.outage.down.load(Ordering::Acquire), 2);
        let _turn = ProbeTurn::take(&updates.inner).unwrap();
        let waiter = {
            let updates = updates.clone();
            tokio::spawn(async move { updates.retry_after(Duration::from_secs(30), true).await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        polls.observe(Ok::<_, ConductorError>(())).unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(!waiter.is_finished(), "an answer to a poll woke an update");
        assert_eq!(polls.inner.outage.down.load(Ordering::Acquire), 1);
        updates.mark_up();
        assert!(waiter.await.unwrap());
        assert_eq!(polls.inner.outage.down.load(Ordering::Acquire), 0);
    }

    /// A probe whose caller goes away (a lease extender aborted) gives its turn to another.
    #[tokio::test]
    async fn a_dropped_probe_hands_its_turn_on() {
        let health = down("updates");
        let first = {
            let health = health.clone();
            tokio::spawn(async move { health.retry_after(Duration::from_secs(30), true).await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(health.inner.probing.load(Ordering::Acquire));
        let second = {
            let health = health.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                health.retry_after(Duration::from_secs(30), true).await;
                started.elapsed()
            })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        first.abort();
        let waited = second.await.unwrap();
        assert!(
            waited <= PROBE_EVERY + Duration::from_millis(400),
            "{waited:?}"
        );
    }

    #[tokio::test]
    async fn answers_and_outages_are_told_apart() {
        let ok: Result<(), ConductorError> = Ok(());
        assert!(answered(&ok));
        let health = Health::new("updates");
        let refused = refused().await;
        assert!(!answered(&refused), "{refused:?}");
        let _ = health.observe(refused);
        assert!(!health.is_up());
    }
}
