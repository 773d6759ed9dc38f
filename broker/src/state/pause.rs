//! Pause and resume polling (`Admin.Pause` / `Admin.Resume`, `start --paused`): while paused
//! no poll is granted and no completion asks update-v2 for a next task; tasks already received
//! (running, held, a poll or an update-v2 in flight) run and are reported as always, their
//! leases extended; executors stay up (the adaptive count neither grows nor retires while
//! paused); run once does not take the quiet of a pause for an empty queue. A drain while
//! paused drains.

use super::machine::Machine;

impl Machine {
    /// Pauses polling; true if it was paused already.
    pub(super) fn pause(&mut self) -> super::Reply {
        if let Some(since) = self.paused_since {
            return super::Reply::Pause {
                already: true,
                since,
            };
        }
        let since = self.now.wall;
        self.paused_since = Some(since);
        // Run once: an empty poll seen before the pause proves nothing after it.
        self.quiet_after = None;
        self.once_empty_polls = 0;
        self.gauges
            .paused
            .store(1, std::sync::atomic::Ordering::Relaxed);
        tracing::info!(
            "paused: no new task is polled until resumed; running tasks finish and are reported"
        );
        super::Reply::Pause {
            already: false,
            since,
        }
    }

    /// Resumes polling; true if it was running already.
    pub(super) fn resume(&mut self) -> bool {
        if self.paused_since.take().is_none() {
            return true;
        }
        // The pause's idle time is no reason to retire an executor.
        for slot in &mut self.slots {
            slot.idle_since = None;
        }
        self.gauges
            .paused
            .store(0, std::sync::atomic::Ordering::Relaxed);
        tracing::info!("resumed: polling again");
        false
    }
}
