//! Liveness (`PERAGO_STALL_TIMEOUT`): every message of an attached executor is a sign of
//! life; the tick pings, and kills an executor not heard from for the whole timeout.

use super::{
    Effect, Input,
    machine::{Machine, Work},
};
use perago_core::result::{Reason, RuntimeResult};
use perago_proto::slot::v1 as proto;
use std::time::{Duration, Instant};

impl Machine {
    /// Any message of the attached generation is a sign of life (a completion, a progress
    /// report, a pong).
    pub(super) fn note_heard(&mut self, input: &Input) {
        let (slot, generation) = match input {
            Input::Completion {
                slot, generation, ..
            }
            | Input::Progress {
                slot, generation, ..
            }
            | Input::Pong { slot, generation } => (*slot, *generation),
            _ => return,
        };
        if let Some(s) = self.slot_mut(slot)
            && s.attached
            && s.generation == generation
        {
            s.heard = true;
        }
    }

    /// The liveness clock: every attached executor heard from since the last tick is alive
    /// as of `now`; one not heard from for `PERAGO_STALL_TIMEOUT` is stalled (killed, its
    /// assignment failed); the others are pinged. A tick that comes far later than the last
    /// one means the broker itself was not running (stopped, starved): nobody is judged on
    /// the silence that caused, every clock starts over.
    pub(super) fn tick(&mut self, now: Instant) {
        let Some(timeout) = self.stall_timeout else {
            return;
        };
        let interval = perago_core::liveness::ping_interval(timeout);
        let late = self
            .last_tick
            .is_some_and(|last| now.saturating_duration_since(last) > interval * 2);
        self.last_tick = Some(now);
        for index in 0..self.slots.len() {
            let slot = &mut self.slots[index];
            if !slot.attached {
                continue;
            }
            let heard = std::mem::take(&mut slot.heard);
            match slot.last_heard {
                Some(since) if !heard && !late => {
                    if now.saturating_duration_since(since) >= timeout {
                        self.stalled(index, timeout);
                        continue;
                    }
                }
                _ => slot.last_heard = Some(now),
            }
            let (number, generation) = (slot.number, slot.generation);
            self.ping_sequence += 1;
            let ping = proto::BrokerMessage {
                message: Some(proto::broker_message::Message::Ping(proto::Ping {
                    sequence: self.ping_sequence,
                })),
            };
            self.send(number, generation, ping);
        }
    }

    /// The attached executor of slot `index` has not been heard from for `timeout`: it is
    /// killed and detached, and its assignment (if any) failed with FAILED, a reason that says
    /// so, and no poison count (the runtime killed it; its task did nothing). Its later stream
    /// end and exit report find nothing left to do; the supervisor restarts the slot as after
    /// any exit.
    pub(super) fn stalled(&mut self, index: usize, timeout: Duration) {
        let draining = self.draining;
        let slot = &mut self.slots[index];
        let (number, generation, pid) = (slot.number, slot.generation, slot.pid);
        let worker_id = slot.worker_id.clone();
        let quiet_exit = draining || slot.recycled || !slot.wanted;
        slot.attached = false;
        slot.stalled = true;
        slot.heard = false;
        slot.last_heard = None;
        let work = std::mem::replace(&mut slot.work, Work::Idle);
        let t = perago_core::liveness::describe(timeout);
        let what = format!(
            "executor {worker_id} (pid {pid}, generation {generation}) did not answer for {t} ({}={t}); killed",
            perago_core::liveness::PERAGO_STALL_TIMEOUT
        );
        tracing::error!(slot = number, generation, worker_id = %worker_id, pid, "{what}");
        self.effects.push(Effect::KillExecutor {
            slot: number,
            generation,
            why: what.clone(),
        });
        self.effects.push(Effect::Detach { slot: number });
        if !quiet_exit {
            self.counters.executor_exits.inc();
        }
        if let Work::Busy(run) = work {
            let reason = format!("{what} while running execution {}", run.execution_id);
            tracing::warn!("{reason}");
            let result = RuntimeResult::failed(worker_id, Reason::new(reason));
            self.report(None, *run, result, false);
        }
    }

    /// Whether the current generation of slot `number` was killed for stalling (its death is
    /// the runtime's doing).
    #[cfg_attr(
        not(test),
        expect(dead_code, reason = "read by poison detection and tests")
    )]
    pub(crate) fn stalled_generation(&self, number: u32, generation: u64) -> bool {
        let Some(slot) = usize::try_from(number)
            .ok()
            .and_then(|n| n.checked_sub(1))
            .and_then(|i| self.slots.get(i))
        else {
            return false;
        };
        slot.generation == generation && slot.stalled
    }
}
