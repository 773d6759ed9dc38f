//! `Admin.Status`: the slots, counters and capacity figures as the machine sees them.

use super::machine::{Machine, Slot, Work};
use perago_core::{capacity::PERAGO_MIN_FREE_MEMORY, memory::format_bytes};
use perago_proto::{admin::v1 as admin, slot::v1 as proto};
use std::time::{SystemTime, UNIX_EPOCH};

/// The part of the state a supervisor acts on (see `Admin.Watch`): the actor compares it after
/// each event, in place, and tells the watchers only when it changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct WatchView {
    draining: bool,
    paused: bool,
    admission_open: bool,
    wanted_executors: u64,
    /// The executor range (`Admin.Scale` changes it).
    range: (u32, u32),
    /// Per slot: state, generation, pid, recycling, body version.
    slots: Vec<(admin::SlotState, u64, u32, bool, u32)>,
    /// Sharing capacity: limit, epoch, holding, fillable, empty, tasks started.
    share: Option<(u32, u64, u32, u32, bool, u64)>,
    /// The body version new executors start with (a roll changes it).
    body_version: u32,
}

impl Slot {
    /// What the slot is doing, as Admin.Status shows it.
    pub(super) fn state(&self) -> admin::SlotState {
        match (self.attached, &self.work) {
            (false, _) if !self.wanted => admin::SlotState::Retired,
            (false, _) if self.exited => admin::SlotState::Exited,
            (false, _) => admin::SlotState::Waiting,
            (true, _) if self.stopping => admin::SlotState::Stopping,
            (true, Work::Busy(_) | Work::AwaitingNext) => admin::SlotState::Busy,
            (true, Work::Idle) => admin::SlotState::Idle,
        }
    }
}

impl Machine {
    /// The broker's view of `slot` after an exit report of its `generation` (the answer to
    /// `Control.SlotExited`): exactly what Admin.Status would show the supervisor then.
    pub(crate) fn exit_ack(&self, slot: u32, generation: u64) -> proto::SlotExitedAck {
        let seen = usize::try_from(slot)
            .ok()
            .and_then(|n| n.checked_sub(1))
            .and_then(|i| self.slots.get(i));
        proto::SlotExitedAck {
            draining: self.draining,
            retired: seen.is_some_and(|s| s.state() == admin::SlotState::Retired),
            recycling: seen.is_some_and(|s| s.generation == generation && s.recycled),
        }
    }

    /// Brings `view` up to date with the supervisor-relevant state; true if anything changed.
    /// Cheap (no allocation once `view` has its slots): called after every event while
    /// someone watches.
    pub(crate) fn update_watch_view(&self, view: &mut WatchView) -> bool {
        let mut changed = false;
        let mut set = |field: &mut bool, value: bool| {
            if *field != value {
                *field = value;
                changed = true;
            }
        };
        set(&mut view.draining, self.draining);
        set(&mut view.paused, self.paused_since.is_some());
        set(&mut view.admission_open, self.admission_open);
        let wanted = self
            .gauges
            .wanted_executors
            .load(std::sync::atomic::Ordering::Relaxed);
        if view.wanted_executors != wanted {
            view.wanted_executors = wanted;
            changed = true;
        }
        if view.body_version != self.body_version {
            view.body_version = self.body_version;
            changed = true;
        }
        let range = (self.capacity.min_executors, self.capacity.max_executors);
        if view.range != range {
            view.range = range;
            changed = true;
        }
        if view.slots.len() != self.slots.len() {
            view.slots.clear();
            view.slots.resize(self.slots.len(), Default::default());
            changed = true;
        }
        let share = self
            .share_status()
            .map(|s| (s.limit, s.epoch, s.held, s.fillable, s.empty, s.started));
        if view.share != share {
            view.share = share;
            changed = true;
        }
        for (seen, s) in view.slots.iter_mut().zip(&self.slots) {
            let now = (s.state(), s.generation, s.pid, s.recycled, s.body_version);
            if *seen != now {
                *seen = now;
                changed = true;
            }
        }
        changed
    }

    pub(super) fn status(&self) -> admin::StatusResponse {
        let slots = self
            .slots
            .iter()
            .map(|s| {
                let state = s.state();
                let (task_id, execution_id, since, phase) = match &s.work {
                    Work::Busy(run) => (
                        run.attempt.task_id.clone(),
                        run.execution_id.clone(),
                        unix_ms(run.dispatched_at),
                        run.phase.status_name(),
                    ),
                    // The result is being reported; update-v2 may bring the next task.
                    Work::AwaitingNext => (
                        String::new(),
                        String::new(),
                        0,
                        proto::Phase::Reporting.status_name(),
                    ),
                    Work::Idle => (String::new(), String::new(), 0, ""),
                };
                admin::SlotStatus {
                    slot: s.number,
                    worker_id: s.worker_id.clone(),
                    generation: s.generation,
                    pid: s.pid,
                    state: state as i32,
                    task_id,
                    execution_id,
                    busy_since_unix_ms: since,
                    phase: phase.to_owned(),
                    recycling: s.recycled,
                    last_body_peak_memory_bytes: s.last_body_peak,
                    max_body_peak_memory_bytes: s.max_body_peak,
                    body_version: s.body_version,
                }
            })
            .collect();
        admin::StatusResponse {
            task_name: self.task_name.clone(),
            broker_worker_id: self.broker_id.clone(),
            draining: self.draining,
            slots,
            counters: Some(self.counters.snapshot()),
            broker_pid: std::process::id(),
            started_at_unix_ms: unix_ms(self.started_at),
            capacity: Some(self.capacity_status()),
            domain: self
                .domain
                .as_ref()
                .map_or_else(String::new, ToString::to_string),
            paused: self.paused_since.is_some(),
            paused_since_unix_ms: self.paused_since.map_or(0, unix_ms),
            // Added by the actor, which knows how the supervisor set the runtime up.
            settings: None,
            soft_time_limit_ms: self.soft_time_limit_ms,
            reconfigured_at_unix_ms: self.reconfigured_at.map_or(0, unix_ms),
            share: self.share_status(),
            body_version: self.body_version,
            rolling: self.rolling(),
        }
    }

    /// A roll is under way: a live generation runs an older body version than the runtime's.
    pub(super) fn rolling(&self) -> bool {
        self.slots.iter().any(|s| !s.exited && self.rolls(s))
    }

    /// The capacity settings and the live figures they act on, for Admin.Status.
    pub(super) fn capacity_status(&self) -> admin::Capacity {
        let c = &self.capacity;
        let relaxed = std::sync::atomic::Ordering::Relaxed;
        admin::Capacity {
            once: c.once,
            max_tasks_per_executor: c.max_tasks_per_executor.unwrap_or(0),
            max_executor_memory_bytes: c.max_executor_memory.unwrap_or(0),
            min_executors: c.min_executors,
            max_executors: c.max_executors,
            scale_down_after_ms: u64::try_from(c.scale_down_after.as_millis()).unwrap_or(u64::MAX),
            min_free_memory_bytes: c.min_free_memory.unwrap_or(0),
            poison_after: c.poison_after,
            wanted_executors: u32::try_from(self.gauges.wanted_executors.load(relaxed))
                .unwrap_or(u32::MAX),
            queue_depth: self
                .queue_depth
                .map_or(-1, |d| i64::try_from(d).unwrap_or(i64::MAX)),
            available_memory_bytes: self.gauges.available_memory.load(relaxed),
            admission_open: self.admits_new_tasks(),
            admission_reason: self.admission_reason(),
            profile_executions: u32::try_from(self.profile.executions()).unwrap_or(u32::MAX),
            profile_duration_mean_ms: ms(self.profile.mean()),
            profile_duration_p95_ms: ms(self.profile.p95()),
            profile_peak_memory_bytes: self.profile.peak().unwrap_or(0),
            memory_headroom_bytes: c.memory_headroom.unwrap_or(0),
            max_runtime_ms: ms(c.max_runtime),
            time_left_ms: ms(self.time_left()),
        }
    }

    /// Why admission is closed, for Admin.Status (empty while open): the floor, the
    /// headroom, the time left, whichever binds first.
    pub(super) fn admission_reason(&self) -> String {
        match (
            self.admission_open,
            self.available_memory,
            self.capacity.min_free_memory,
        ) {
            (false, Some(available), Some(min)) => format!(
                "available memory {} is below {PERAGO_MIN_FREE_MEMORY} {}",
                format_bytes(available),
                format_bytes(min)
            ),
            _ => self
                .out_of_time()
                .unwrap_or_else(|| self.memory_room_reason()),
        }
    }
}

/// Milliseconds of a duration, 0 for none.
fn ms(d: Option<std::time::Duration>) -> u64 {
    d.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

pub(super) fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
