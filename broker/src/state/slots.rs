//! The slots' generations: the supervisor's announcements (`SlotStarted`) and exit reports,
//! an executor's attach and the end of its stream, recycling, and the attempt fence
//! (`ReloadAttempt`).

use super::{
    Effect,
    machine::{Machine, Slot, Work, same_secret, stop_message},
};
use crate::poison::{self, ExitEvidence, Verdict};
use perago_proto::slot::v1 as proto;
use tonic::Status;

impl Machine {
    /// The supervisor reaped a slot's process: its generation is gone, with the exit status
    /// as the reason and as the evidence poison detection judges.
    pub(super) fn slot_exited(&mut self, exited: proto::SlotExited) {
        let status = exited.status.clone();
        if let Some(s) = self.slot_mut(exited.slot)
            && s.generation == exited.generation
        {
            if exited.pid != 0 {
                s.pid = exited.pid;
            }
            s.exited = true;
        }
        let evidence = ExitEvidence::of(&exited);
        self.generation_gone_with(exited.slot, exited.generation, &status, Some(evidence));
    }

    pub(super) fn attach(&mut self, hello: proto::Hello) -> Result<(u32, u64), Status> {
        if hello.protocol_version != proto::ProtocolVersion::ProtocolVersion1 as i32 {
            return Err(Status::failed_precondition(format!(
                "protocol version {} is not supported; this broker speaks version 1",
                hello.protocol_version
            )));
        }
        let creds = hello
            .credentials
            .ok_or_else(|| Status::unauthenticated("hello without credentials"))?;
        let broker_id = self.broker_id.clone();
        let stall_timeout_ms = self
            .stall_timeout
            .map_or(0, |t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX));
        let Some(slot) = self.slot_mut(creds.slot) else {
            return Err(Status::unauthenticated(format!(
                "unknown slot {}",
                creds.slot
            )));
        };
        if slot.generation == 0 || creds.generation != slot.generation {
            tracing::warn!(
                slot = creds.slot,
                generation = creds.generation,
                current = slot.generation,
                "refused an attach of a stale or unknown generation"
            );
            return Err(Status::unauthenticated(format!(
                "generation {} of slot {} is not current",
                creds.generation, creds.slot
            )));
        }
        if !same_secret(&creds.token, &slot.token) {
            tracing::warn!(
                slot = creds.slot,
                generation = creds.generation,
                "refused an attach with a wrong token"
            );
            return Err(Status::unauthenticated("wrong slot token"));
        }
        if slot.stalled {
            return Err(Status::unauthenticated(format!(
                "generation {} of slot {} was killed for not answering",
                creds.generation, creds.slot
            )));
        }
        if slot.attached {
            return Err(Status::already_exists(format!(
                "generation {} of slot {} is already attached",
                creds.generation, creds.slot
            )));
        }
        if !hello.worker_id.is_empty() && hello.worker_id != slot.worker_id {
            return Err(Status::invalid_argument(format!(
                "slot {} has worker id {}, not {}",
                creds.slot, slot.worker_id, hello.worker_id
            )));
        }
        let welcome = proto::BrokerMessage {
            message: Some(proto::broker_message::Message::Welcome(proto::Welcome {
                protocol_version: proto::ProtocolVersion::ProtocolVersion1 as i32,
                worker_id: slot.worker_id.clone(),
                broker_worker_id: broker_id,
                stall_timeout_ms,
            })),
        };
        slot.pid = hello.pid;
        slot.body_at_dispatch = hello.body_at_dispatch;
        slot.attached = true;
        slot.work = Work::Idle;
        slot.exited = false;
        // Heard: its first tick starts its liveness clock.
        slot.heard = true;
        slot.last_heard = None;
        tracing::info!(slot = slot.number, generation = slot.generation, worker_id = %slot.worker_id, pid = hello.pid, body_version = slot.body_version, "executor attached");
        let stopping = slot.stopping;
        self.send(creds.slot, creds.generation, welcome);
        if stopping && self.draining {
            // The drain told this slot to stop before its executor attached.
            self.send(creds.slot, creds.generation, stop_message("drain"));
        }
        Ok((creds.slot, creds.generation))
    }

    pub(super) fn slot_started(&mut self, started: proto::SlotStarted) -> Result<(), Status> {
        let number = started.slot;
        let Some(slot) = self.slot_mut(number) else {
            tracing::warn!(
                slot = number,
                "SlotStarted for a slot this broker does not have"
            );
            return Err(Status::not_found(format!(
                "this broker has no slot {number}"
            )));
        };
        // Generations are taken only in the order the supervisor issues them: exactly one
        // past the current. The control token is the credential; this order is what keeps a
        // leaked or replayed announcement from jumping ahead (a generation far in the future
        // would make every later one of the real supervisor look old) or from replaying an
        // old one. The supervisor's retry of the announcement it is waiting on (same
        // generation, same token, nothing attached yet) is answered as taken.
        let expected = slot.generation + 1;
        if started.generation == slot.generation
            && slot.generation != 0
            && !slot.attached
            && same_secret(&started.token, &slot.token)
        {
            return Ok(());
        }
        if started.generation != expected {
            tracing::error!(
                slot = number,
                generation = started.generation,
                current = slot.generation,
                expected,
                "refused a SlotStarted out of order (the slot keeps its executor)"
            );
            return Err(Status::failed_precondition(format!(
                "slot {number} is at generation {}: it takes generation {expected} next, not {}",
                slot.generation, started.generation
            )));
        }
        // The old generation is gone first (its assignment failed and reported, its stream
        // dropped): only then does the new one take the slot.
        let previous = slot.generation;
        self.generation_gone(number, previous, "replaced by a new generation");
        let target = self.body_version;
        let slot = self.slot_mut(number).expect("checked above");
        slot.generation = started.generation;
        slot.token = started.token;
        slot.pid = started.pid;
        slot.stopping = false;
        slot.recycled = false;
        slot.exited = false;
        slot.attached = false;
        slot.work = Work::Idle;
        slot.stalled = false;
        slot.body_version = started.body_version.max(1);
        if slot.body_version < target {
            // Announced before the roll reached the broker: it is recycled once it attaches.
            tracing::info!(
                slot = number,
                generation = started.generation,
                body_version = slot.body_version,
                target,
                "a generation of an older body version: it is recycled as soon as it attaches"
            );
        }
        Ok(())
    }

    /// The executor's stream ended. An idle slot is simply detached; a busy one waits a moment
    /// for the supervisor's exit report, whose status makes a better failure reason.
    pub(super) fn stream_ended(&mut self, number: u32, generation: u64) {
        let Some(slot) = self.slot_mut(number) else {
            return;
        };
        if slot.generation != generation || !slot.attached {
            return;
        }
        if !matches!(slot.work, Work::Busy(_)) {
            self.generation_gone(number, generation, "attach stream closed");
            return;
        }
        slot.attached = false;
        self.effects.push(Effect::Detach { slot: number });
        self.effects.push(Effect::ArmExitGrace {
            slot: number,
            generation,
        });
    }

    /// A generation is gone (stream end, exit report or replacement): fail its assignment.
    /// Idempotent: the second report finds nothing to do.
    pub(super) fn generation_gone(&mut self, number: u32, generation: u64, how: &str) {
        self.generation_gone_with(number, generation, how, None);
    }

    /// [`Machine::generation_gone`] with the supervisor's exit report, whose evidence decides
    /// whether the death counts against the task it ran (poison detection).
    pub(super) fn generation_gone_with(
        &mut self,
        number: u32,
        generation: u64,
        how: &str,
        evidence: Option<ExitEvidence>,
    ) {
        let draining = self.draining;
        let Some(slot) = self.slot_mut(number) else {
            return;
        };
        if slot.generation != generation || generation == 0 {
            return;
        }
        let retired = !slot.wanted;
        let stopping = slot.stopping;
        let had_stream = std::mem::replace(&mut slot.attached, false);
        let was_attached = had_stream || matches!(slot.work, Work::Busy(_));
        let work = std::mem::replace(&mut slot.work, Work::Idle);
        let worker_id = slot.worker_id.clone();
        let pid = slot.pid;
        let recycled = slot.recycled;
        if had_stream {
            self.effects.push(Effect::Detach { slot: number });
        }
        if was_attached {
            tracing::info!(slot = number, generation, worker_id = %worker_id, "executor detached: {how}");
            if !draining && !recycled && !retired {
                self.counters.executor_exits.inc();
            }
        }
        let verdict = poison::judge(
            evidence,
            poison::SlotState {
                draining,
                recycled,
                retired,
                stopping,
            },
        );
        if let Work::Busy(run) = work {
            let crash = format!(
                "executor {worker_id} (pid {pid}, generation {generation}) exited ({how}) while running execution {}",
                run.execution_id
            );
            // The ids come from the assignment's span, which the actor enters for this input.
            tracing::warn!("{crash}");
            self.judge_crash(*run, worker_id, crash, verdict);
        } else if was_attached && !stopping && verdict == Verdict::Outside {
            // An idle executor killed from outside is evidence of a burst too.
            self.deaths.record(self.now.instant, None);
        }
    }

    pub(super) fn fence_target(
        &mut self,
        creds: &proto::SlotCredentials,
        execution_id: &str,
    ) -> Result<String, Status> {
        let slot = self
            .slot_mut(creds.slot)
            .ok_or_else(|| Status::unauthenticated(format!("unknown slot {}", creds.slot)))?;
        if creds.generation != slot.generation || !same_secret(&creds.token, &slot.token) {
            return Err(Status::unauthenticated("wrong slot credentials"));
        }
        match &slot.work {
            Work::Busy(run) if run.execution_id == execution_id => Ok(run.attempt.task_id.clone()),
            _ => Err(Status::failed_precondition(format!(
                "execution {execution_id} is not the current assignment of slot {}",
                creds.slot
            ))),
        }
    }

    /// `Control.RollBody`: from now on every generation should run `body_version`. Each live
    /// one of an older version is recycled at its first safe moment: an idle one at once (it
    /// is marked stopping first, so no task can be dispatched to it meanwhile), a busy one
    /// once its assignment is reported (v1, so update-v2 brings it no next task), one not
    /// attached yet as soon as it attaches (see [`Machine::roll_idle`]).
    pub(super) fn roll(&mut self, body_version: u32) {
        if body_version <= self.body_version {
            return;
        }
        let older = self
            .slots
            .iter()
            .filter(|s| s.generation != 0 && !s.exited && s.body_version < body_version)
            .count();
        tracing::info!(
            from = self.body_version,
            to = body_version,
            slots = older,
            "body roll started: executors of older versions are recycled as their assignments finish"
        );
        self.body_version = body_version;
        self.roll_open = true;
    }

    /// Logs the end of a roll once no live generation runs an older version.
    pub(super) fn roll_ended(&mut self) {
        if self.roll_open && !self.rolling() {
            self.roll_open = false;
            tracing::info!(
                body_version = self.body_version,
                "body roll finished: every executor runs the new version"
            );
        }
    }

    /// Whether `slot`'s generation runs an older body version than the runtime's.
    pub(super) fn rolls(&self, slot: &Slot) -> bool {
        slot.generation != 0 && slot.body_version < self.body_version
    }

    /// Recycles every attached, idle executor of an older body version (the roll's safe
    /// moment): run after each input, before anything is dispatched.
    pub(super) fn roll_idle(&mut self) {
        if self.draining || self.body_version == 1 {
            return;
        }
        let due: Vec<u32> = self
            .slots
            .iter()
            .filter(|s| self.rolls(s) && s.attached && matches!(s.work, Work::Idle) && !s.stopping)
            .map(|s| s.number)
            .collect();
        for number in due {
            let from = self.slot_mut(number).map_or(0, |s| s.body_version);
            let why = format!("body version {from} rolls to {}", self.body_version);
            self.recycle(number, &why);
        }
    }

    /// The executor of `number` reached a recycling limit with the assignment it just
    /// completed: it is told to stop, and the supervisor starts the next generation at once.
    pub(super) fn recycle(&mut self, number: u32, why: &str) {
        let Some(slot) = self.slot_mut(number) else {
            return;
        };
        tracing::info!(slot = number, generation = slot.generation, worker_id = %slot.worker_id, pid = slot.pid, "executor recycled: {why}");
        slot.recycled = true;
        let already = std::mem::replace(&mut slot.stopping, true);
        let (generation, attached) = (slot.generation, slot.attached);
        self.counters.executors_recycled.inc();
        if !already && attached {
            self.send(
                number,
                generation,
                stop_message(perago_core::recycle::STOP_RECYCLE),
            );
        }
    }
}
