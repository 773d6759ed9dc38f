//! The drain: polling stops, busy executors finish first, idle ones are told to stop once
//! nothing is left for them to run, and the drain completes when every executor detached and
//! every result was reported.

use super::{
    Effect,
    machine::{Machine, Work, stop_message},
};
use perago_core::attempt::TaskRef;

impl Machine {
    pub(super) fn start_drain(&mut self) {
        if self.draining {
            return;
        }
        self.draining = true;
        tracing::info!(
            "draining: polling stops; idle executors are told to stop, busy ones finish first"
        );
        self.effects.push(Effect::DisableV2);
        // Busy slots are told now (they finish their assignment, then exit); idle ones once
        // nothing is left for them to run (see `settle_drain`). A slot awaiting update-v2's
        // next task is idle to its executor: it is told once that task has run or not come.
        for i in 0..self.slots.len() {
            if matches!(self.slots[i].work, Work::Busy(_)) {
                self.stop_slot(i);
            }
        }
    }

    pub(super) fn stop_slot(&mut self, index: usize) {
        let slot = &mut self.slots[index];
        if slot.stopping {
            return;
        }
        slot.stopping = true;
        if slot.attached {
            let (number, generation) = (slot.number, slot.generation);
            self.send(number, generation, stop_message("drain"));
        }
    }

    /// While draining: once no poll is in flight and nothing is held, every idle slot is told
    /// to stop; held tasks no executor can run any more are handed back.
    pub(super) fn settle_drain(&mut self) {
        if !self.draining || self.reserved > 0 {
            return;
        }
        if !self.held.is_empty() {
            let runnable = self.slots.iter().any(|s| s.attached && !s.stopping);
            if runnable {
                return;
            }
            while let Some(held) = self.held.pop_front() {
                self.effects.push(Effect::StopLease {
                    execution_id: held.execution_id,
                });
                let ids = TaskRef {
                    task_id: held.attempt.task_id,
                    workflow_instance_id: held.attempt.workflow_instance_id,
                };
                self.hand_back(ids, "draining and no executor left to run it");
            }
        }
        for i in 0..self.slots.len() {
            if matches!(self.slots[i].work, Work::Idle) {
                self.stop_slot(i);
            }
        }
    }

    pub(super) fn check_drained(&mut self) {
        if !self.draining || self.drained || self.updates_in_flight > 0 || self.reserved > 0 {
            return;
        }
        let quiet = self.held.is_empty()
            && self
                .slots
                .iter()
                .all(|s| !s.attached && matches!(s.work, Work::Idle));
        if quiet {
            tracing::info!("drained: every executor detached and every result reported");
            self.drained = true;
            self.effects.push(Effect::Drained);
        }
    }
}
