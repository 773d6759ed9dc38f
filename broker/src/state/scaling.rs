//! The adaptive executor count (`-j MIN..MAX`): queue-depth reads, slots wanted while tasks
//! wait, slots retired after `PERAGO_SCALE_DOWN_AFTER` of idleness; and memory admission
//! (`PERAGO_MIN_FREE_MEMORY`), which withholds polls and new slots.

use super::machine::Slot;
use super::{
    Effect,
    machine::{Machine, Work, stop_message},
};
use perago_core::{capacity::PERAGO_MIN_FREE_MEMORY, identity::MAX_SLOT, memory::format_bytes};
use std::time::{Duration, Instant};
use tonic::Status;

/// How often the queue depth is read (run once, adaptive executor count).
pub(crate) const QUEUE_DEPTH_INTERVAL: Duration = Duration::from_secs(1);

impl Machine {
    /// Asks for the next queue-depth read (the first at once, then every
    /// [`QUEUE_DEPTH_INTERVAL`]) while run once or the adaptive range needs it.
    pub(super) fn request_queue_depth(&mut self) {
        // Sharing capacity: an emptied type learns of new tasks without holding a permit.
        let needed = self.capacity.once || self.capacity.adaptive() || self.share.is_some();
        if !needed || self.draining || self.depth_read_pending {
            return;
        }
        // The first read, and run once's confirming read when the last answer was asked for
        // before the empty poll, go at once.
        let stale = self.quiet_after.is_some_and(|q| self.depth_reads <= q);
        let after = if self.depth_reads == 0 || stale {
            Duration::ZERO
        } else {
            QUEUE_DEPTH_INTERVAL
        };
        self.depth_reads += 1;
        self.depth_read_pending = true;
        self.effects.push(Effect::ReadQueueDepth { after });
    }

    /// A queue-depth read answered: run once may drain (see `once_depth_read`), the adaptive
    /// range may scale.
    pub(super) fn queue_depth_read(&mut self, depth: Option<u64>, now: Instant) {
        self.depth_read_pending = false;
        self.depth_unreadable = depth.is_none();
        self.share_depth_read(depth);
        if let Some(depth) = depth {
            self.queue_depth = Some(depth);
            self.gauges
                .queue_depth
                .store(depth, std::sync::atomic::Ordering::Relaxed);
        }
        if self.draining {
            return;
        }
        if self.once_depth_read(depth) {
            return;
        }
        if self.capacity.adaptive() && self.paused_since.is_none() {
            // Paused: executors stay up (idle because of the pause, not the queue), and no
            // more start for tasks nobody polls.
            self.scale_up();
            self.scale_down(now);
            let wanted = self.slots.iter().filter(|s| s.wanted).count() as u64;
            self.gauges
                .wanted_executors
                .store(wanted, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Adaptive range: while tasks wait (in Conductor's queue or held here) beyond the wanted
    /// slots that can take one now or soon (free, or starting), more slots are wanted, up to
    /// the maximum. Not while memory admission is closed.
    pub(super) fn scale_up(&mut self) {
        let Some(depth) = self.queue_depth else {
            return;
        };
        if !self.admission_open {
            return;
        }
        let backlog = depth.saturating_add(self.held.len() as u64);
        let ready = self
            .slots
            .iter()
            .filter(|s| s.wanted && !s.stopping && matches!(s.work, Work::Idle))
            .count() as u64;
        let wanted = self.slots.iter().filter(|s| s.wanted).count() as u64;
        let room = u64::from(self.capacity.max_executors).saturating_sub(wanted);
        // The profile's headroom: no more slots than the type's observed peak fits.
        let room = room.min(u64::from(self.memory_room()));
        let mut add = backlog.saturating_sub(ready).min(room);
        if add == 0 {
            return;
        }
        let mut added = Vec::new();
        // A slot whose retired executor is still attached comes back once it has exited; a
        // slot above the maximum (`Admin.Scale` lowered it) never does.
        let max = self.capacity.max_executors;
        for slot in self
            .slots
            .iter_mut()
            .filter(|s| !s.wanted && !s.attached && s.number <= max)
        {
            if add == 0 {
                break;
            }
            slot.wanted = true;
            slot.idle_since = None;
            added.push(slot.number);
            self.counters.scale_ups.inc();
            add -= 1;
        }
        if !added.is_empty() {
            tracing::info!(
                queue_depth = depth, slots = ?added, wanted = wanted + added.len() as u64,
                max = self.capacity.max_executors,
                "scaling up: tasks wait and every wanted executor is busy"
            );
        }
    }

    /// Adaptive range: each slot free for `scale_down_after` makes one wanted slot above the
    /// minimum too many; as many free slots are retired, highest slot numbers first (so the
    /// low ones stay), their idle executors told to stop. A slot attached while not wanted is
    /// stopped too.
    pub(super) fn scale_down(&mut self, now: Instant) {
        let after = self.capacity.scale_down_after;
        let mut long_idle = 0u32;
        for i in 0..self.slots.len() {
            let slot = &mut self.slots[i];
            if !slot.wanted && slot.attached && !slot.stopping && matches!(slot.work, Work::Idle) {
                // Started by the supervisor for a slot no longer wanted.
                slot.stopping = true;
                let (number, generation) = (slot.number, slot.generation);
                self.send(number, generation, stop_message("scale down"));
                continue;
            }
            if !slot.free() {
                slot.idle_since = None;
                continue;
            }
            let since = *slot.idle_since.get_or_insert(now);
            if now.duration_since(since) >= after {
                long_idle += 1;
            }
        }
        let mut wanted = self.slots.iter().filter(|s| s.wanted).count() as u32;
        let mut retire = long_idle.min(wanted.saturating_sub(self.capacity.min_executors));
        for i in (0..self.slots.len()).rev() {
            if retire == 0 {
                break;
            }
            let slot = &mut self.slots[i];
            if !slot.free() {
                continue;
            }
            slot.wanted = false;
            slot.stopping = true;
            slot.idle_since = None;
            retire -= 1;
            wanted -= 1;
            let (number, generation, worker_id) =
                (slot.number, slot.generation, slot.worker_id.clone());
            self.counters.scale_downs.inc();
            tracing::info!(
                slot = number, worker_id = %worker_id, wanted,
                scale_down_after_s = after.as_secs_f64(),
                "scaling down: retiring an idle executor (slots were free for PERAGO_SCALE_DOWN_AFTER)"
            );
            self.send(number, generation, stop_message("scale down"));
        }
    }

    /// Memory admission: new tasks are polled only while at least `PERAGO_MIN_FREE_MEMORY` is
    /// available. Tasks already received run regardless; the waiting poll is granted as soon
    /// as admission opens again (see `grant_poll`).
    pub(super) fn memory_measured(&mut self, available: u64) {
        let relaxed = std::sync::atomic::Ordering::Relaxed;
        self.available_memory = Some(available);
        self.gauges.available_memory.store(available, relaxed);
        let Some(min) = self.capacity.min_free_memory else {
            return;
        };
        let open = available >= min;
        if open != self.admission_open {
            let (available, min) = (format_bytes(available), format_bytes(min));
            if open {
                tracing::info!(available = %available, min_free_memory = %min, "admission open: available memory {available} is at least {PERAGO_MIN_FREE_MEMORY} {min}; polling resumes");
            } else {
                tracing::warn!(available = %available, min_free_memory = %min, "admission closed: available memory {available} is below {PERAGO_MIN_FREE_MEMORY} {min}; no new tasks are polled until it is back (running tasks go on)");
            }
        }
        self.admission_open = open;
        self.gauges.admission_open.store(u64::from(open), relaxed);
    }

    /// `Admin.Scale`: the executor count becomes `min..=max` live (`-j N` is `N..=N`). Slots
    /// above the old maximum are added (their worker ids follow the same numbering); wanted
    /// slots above the new maximum are retired, highest first, each draining its current
    /// assignment before its executor is told to stop (`stop_unwanted`); the minimum is made
    /// up at once from slots without an executor (`fill_wanted`). Answers the range before.
    pub(super) fn scale(&mut self, min: u32, max: u32) -> Result<(u32, u32), Status> {
        if min < 1 || min > max || max > MAX_SLOT {
            return Err(Status::invalid_argument(format!(
                "-j {min}..{max}: expected 1 <= MIN <= MAX <= {MAX_SLOT}"
            )));
        }
        if self.draining {
            return Err(Status::failed_precondition(
                "the runtime is draining: its executor count no longer changes",
            ));
        }
        let before = (self.capacity.min_executors, self.capacity.max_executors);
        let have = self.slots.len() as u32;
        for n in have + 1..=max {
            self.slots.push(Slot::new(&self.prefix, n, false));
        }
        self.capacity.min_executors = min;
        self.capacity.max_executors = max;
        let mut retired = Vec::new();
        for slot in self.slots.iter_mut().filter(|s| s.number > max && s.wanted) {
            slot.wanted = false;
            slot.idle_since = None;
            retired.push(slot.number);
            self.counters.scale_downs.inc();
        }
        let added = self.fill_wanted();
        let relaxed = std::sync::atomic::Ordering::Relaxed;
        self.gauges.slots.store(self.slots.len() as u64, relaxed);
        self.publish_wanted();
        tracing::info!(
            from = %format_range(before), to = %format_range((min, max)), retired = ?retired, added = ?added,
            "scaled by Admin.Scale: retired slots finish their current assignment first"
        );
        Ok(before)
    }

    /// Wanted slots up to the minimum: slots without an executor attached, lowest first (a
    /// slot whose retired executor is still attached comes back once it has exited, at the
    /// next input). Returns the slots made wanted.
    pub(super) fn fill_wanted(&mut self) -> Vec<u32> {
        let (min, max) = (self.capacity.min_executors, self.capacity.max_executors);
        let wanted = self.slots.iter().filter(|s| s.wanted).count() as u32;
        if wanted >= min || self.draining {
            return Vec::new();
        }
        let missing = (min - wanted) as usize;
        let mut added = Vec::new();
        for slot in self
            .slots
            .iter_mut()
            .filter(|s| !s.wanted && !s.attached && s.number <= max)
            .take(missing)
        {
            slot.wanted = true;
            slot.idle_since = None;
            added.push(slot.number);
        }
        if !added.is_empty() {
            self.publish_wanted();
        }
        added
    }

    /// Every attached executor of a slot above the maximum (`Admin.Scale` lowered it) is told
    /// to stop once it is idle (a busy one finishes its assignment first: its completion frees
    /// the slot, through v1). Slots within the range are left to `scale_down`.
    pub(super) fn stop_unwanted(&mut self) {
        if self.draining {
            return;
        }
        let max = self.capacity.max_executors;
        let mut stop = Vec::new();
        for slot in self.slots.iter_mut().filter(|s| s.number > max) {
            if !slot.wanted && slot.attached && !slot.stopping && matches!(slot.work, Work::Idle) {
                slot.stopping = true;
                stop.push((slot.number, slot.generation));
            }
        }
        for (number, generation) in stop {
            self.send(number, generation, stop_message("scale down"));
        }
        self.fill_wanted();
    }

    fn publish_wanted(&self) {
        let wanted = self.slots.iter().filter(|s| s.wanted).count() as u64;
        self.gauges
            .wanted_executors
            .store(wanted, std::sync::atomic::Ordering::Relaxed);
    }
}

/// `N` or `MIN..MAX`, as `-j` takes it.
fn format_range((min, max): (u32, u32)) -> String {
    if min == max {
        min.to_string()
    } else {
        format!("{min}..{max}")
    }
}
