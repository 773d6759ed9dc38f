//! Memory admission's measurements (`PERAGO_MIN_FREE_MEMORY`, `PERAGO_MEMORY_HEADROOM`):
//! available memory (cgroup v1 and v2 aware, see [`perago_core::memory`]) read every second
//! and fed to the machine, which opens or closes admission (the headroom's decisions: see
//! `state::profile`).

use crate::{actor::Event, state::Input};
use std::time::Duration;
use tokio::sync::mpsc;

/// How often available memory is measured.
const MEASURE_EVERY: Duration = Duration::from_secs(1);

/// Measures once and feeds the machine; false when the actor is gone.
pub(crate) async fn measure(events: &mpsc::Sender<Event>, failing: &mut bool) -> bool {
    match perago_core::memory::available_memory() {
        Ok(available) => {
            if std::mem::take(failing) {
                tracing::info!("available memory can be measured again");
            }
            events
                .send(Event::Slot(Input::Memory { available }))
                .await
                .is_ok()
        }
        Err(e) => {
            // Admission keeps its last state: a runtime that cannot measure is not stopped.
            if !std::mem::replace(failing, true) {
                tracing::warn!(error = %perago_core::errors::DisplayChain(&e), "cannot measure available memory; memory admission keeps its last state until it can");
            }
            true
        }
    }
}

/// Measures every [`MEASURE_EVERY`] until the actor is gone.
pub(crate) async fn watch(events: mpsc::Sender<Event>, mut failing: bool) {
    let mut tick = tokio::time::interval(MEASURE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if !measure(&events, &mut failing).await {
            return;
        }
    }
}
