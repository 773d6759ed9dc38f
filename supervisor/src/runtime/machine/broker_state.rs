//! The machine and the broker's state: each message of its `Admin.Watch` stream (readiness,
//! `STATUS=`, a drain, the slots it wants), the force kill's read of the phases, and the
//! broker's stall.

use super::*;

impl Machine {
    pub(super) fn on_broker_state(
        &mut self,
        seen: &admin::StatusResponse,
        now: Instant,
        out: &mut Vec<Effect>,
    ) {
        self.status_at = now;
        if self.config.notify && !self.draining {
            if self.ready {
                // A drain's STATUS= (STOPPING=1) stays: the state keeps coming through a drain
                // only for the broker's liveness.
                out.push(Effect::Notify(Notice::Status(notify::status_text(seen))));
            } else if notify::all_attached(seen, self.config.capacity.min_executors) {
                tracing::info!("every executor attached: telling systemd the service is ready");
                self.ready = true;
                out.push(Effect::Notify(Notice::Ready(notify::status_text(seen))));
            }
        }
        self.follow_roll(seen, out);
        if seen.draining {
            if !self.draining {
                tracing::info!("the broker is draining (Admin.Drain or run once): no restarts");
                self.set_draining(now);
            }
        } else {
            self.follow_scale(seen, now);
            // The state is the broker's latest (it pushes each change): a slot it retired
            // since is not in it as wanted.
            for slot in self.slots_to_start(seen) {
                tracing::info!(slot, "scaling up: the broker wants this slot's executor");
                self.start_executor(slot, Start::ScaleUp, now, out);
            }
        }
    }

    /// The broker's stream ended cleanly: it has drained and is exiting, and sends nothing
    /// more; its silence from now on is not a stall.
    pub(super) fn on_broker_drained(&mut self, now: Instant) {
        tracing::debug!("the broker's state stream ended: it has drained");
        self.broker_drained = true;
        if !self.draining {
            tracing::info!("the broker is draining (Admin.Drain or run once): no restarts");
            self.set_draining(now);
        }
    }

    /// The force kill's phases, read (`None`: no answer).
    pub(super) fn on_phases_read(
        &mut self,
        status: Option<admin::StatusResponse>,
        now: Instant,
        out: &mut Vec<Effect>,
    ) {
        self.force_kill_reading = false;
        let phases = status.map_or_else(BTreeMap::new, |s| phases(&s));
        self.force_kill(&phases, now, out);
    }

    /// Kills every executor still running. The broker stays up to report their assignments
    /// FAILED (with the deadline as the reason); it is killed [`BROKER_KILL_DELAY`] later.
    pub(super) fn force_kill(
        &mut self,
        phases: &BTreeMap<u32, String>,
        now: Instant,
        out: &mut Vec<Effect>,
    ) {
        let deadline = self.config.force_kill_after.unwrap_or_default();
        for (slot, proc) in &mut self.slots {
            if let Some(child) = proc.child {
                let phase = phases.get(slot).map_or("unknown", String::as_str);
                tracing::error!(worker_id = %proc.worker_id, pid = child.pid(), phase = %phase, deadline_s = deadline.as_secs(), "force-killing an executor still running after the shutdown deadline");
                out.push(Effect::Signal {
                    child,
                    signal: signal::SIGKILL,
                });
                proc.force_killed = true;
                proc.killed_by = proto::ExitCause::ShutdownDeadline;
                self.force_killed = true;
            }
        }
        out.push(Effect::AbortExecutors);
        self.broker_kill_at = Some(now + BROKER_KILL_DELAY);
    }

    /// The broker's state has not come for `timeout`: it is treated as dead. A broker process
    /// is SIGKILLed (its exit then stops the runtime as any broker death does: executors told
    /// to stop, exit 1); a thread-mode broker is aborted.
    pub(super) fn broker_is_stalled(&mut self, timeout: Duration, out: &mut Vec<Effect>) {
        let t = perago_core::liveness::describe(timeout);
        let why = format!(
            "the broker did not answer for {t} ({}={t}); killed",
            perago_core::liveness::PERAGO_STALL_TIMEOUT
        );
        let Some(broker) = self.broker else {
            return;
        };
        tracing::error!(pid = broker.pid(), "{why}");
        self.broker_stalled = Some(why);
        out.push(match broker {
            Child::Process(_) => Effect::Signal {
                child: broker,
                signal: signal::SIGKILL,
            },
            Child::Task => Effect::AbortAll,
        });
    }

    /// `Admin.Scale`: a range other than the one the runtime started with makes the machine
    /// follow the slots the broker wants, and a slot the broker added gets a place here.
    fn follow_scale(&mut self, seen: &admin::StatusResponse, now: Instant) {
        if let Some(c) = &seen.capacity {
            let start = &self.config.capacity;
            if !self.scaled
                && (c.min_executors, c.max_executors) != (start.min_executors, start.max_executors)
            {
                tracing::info!(
                    min = c.min_executors,
                    max = c.max_executors,
                    "the executor range was changed (Admin.Scale): following the slots the broker wants"
                );
                self.scaled = true;
            }
        }
        for s in &seen.slots {
            if let std::collections::btree_map::Entry::Vacant(place) = self.slots.entry(s.slot) {
                tracing::info!(slot = s.slot, worker_id = %s.worker_id, "a slot was added (Admin.Scale)");
                place.insert(Self::slot_proc(s.worker_id.clone(), now));
            }
        }
    }

    /// The slots the broker wants run (`-j MIN..MAX`) that have no executor here, none
    /// starting (or still to start with the runtime), none exiting and no restart pending, as of `status` (a slot whose generation
    /// moved since is not one).
    pub(super) fn slots_to_start(&self, status: &admin::StatusResponse) -> Vec<u32> {
        if !self.follows_broker() || self.draining || status.draining {
            return Vec::new();
        }
        status
            .slots
            .iter()
            .filter(|s| {
                matches!(
                    s.state(),
                    admin::SlotState::Waiting | admin::SlotState::Exited
                )
            })
            .filter(|s| {
                self.slots.get(&s.slot).is_some_and(|p| {
                    p.child.is_none()
                        && !self.startup.contains(&s.slot)
                        && p.restart_at.is_none()
                        && p.starting.is_none()
                        && p.exiting.is_none()
                        && p.generation == s.generation
                })
            })
            .map(|s| s.slot)
            .collect()
    }
}

/// Each slot's phase as the broker tells it (`idle` when it names none).
fn phases(status: &admin::StatusResponse) -> BTreeMap<u32, String> {
    status
        .slots
        .iter()
        .map(|s| {
            let phase = if s.phase.is_empty() {
                "idle".to_owned()
            } else {
                s.phase.clone()
            };
            (s.slot, phase)
        })
        .collect()
}
