//! The machine's exits: a child's end, the decision once its handling is done, and an
//! executor's completed assignment.

use super::*;

impl Machine {
    pub(super) fn on_exit(&mut self, exit: ChildExit, now: Instant, out: &mut Vec<Effect>) {
        let status = exit.ended.describe();
        match exit.kind {
            ChildKind::Broker => {
                self.broker = None;
                // A broker exits 0 only after a completed drain, also one an operator started
                // with Admin.Drain or one it started itself (run once: no task left).
                let clean = exit.ended.success();
                if clean && !self.draining {
                    tracing::info!(
                        "the broker finished a drain (Admin.Drain, or run once with no task left)"
                    );
                    self.set_draining(now);
                }
                if clean {
                    tracing::info!(pid = exit.pid, "broker finished its drain");
                    return;
                }
                let status = match self.broker_stalled.take() {
                    Some(why) => format!("{status}: {why}"),
                    None => status,
                };
                tracing::error!(pid = exit.pid, status = %status, "broker exited; stopping the runtime");
                self.broker_failed = Some(status);
                self.set_draining(now);
                for proc in self.slots.values_mut() {
                    if let Some(child) = proc.child {
                        // No result can be reported any more: executors stop their bodies
                        // (SIGTERM, a short grace, SIGKILL) as soon as their slot stream ends,
                        // and exit; an idle one exits on this signal.
                        out.push(Effect::Signal {
                            child,
                            signal: signal::SIGTERM,
                        });
                        proc.killed_by = proto::ExitCause::BrokerGone;
                    }
                }
            }
            ChildKind::Executor { slot, generation } => {
                let Some(proc) = self.slots.get_mut(&slot) else {
                    return;
                };
                if proc.generation != generation || proc.child.is_none() {
                    return;
                }
                proc.child = None;
                let cause = std::mem::replace(&mut proc.killed_by, proto::ExitCause::Unspecified);
                let status = if std::mem::take(&mut proc.force_killed) {
                    // The broker puts this in the FAILED reason Conductor gets.
                    format!(
                        "killed by the supervisor at the shutdown deadline, PERAGO_SHUTDOWN_FORCE_KILL_AFTER={}s after the drain started: {status}",
                        self.config.force_kill_after.unwrap_or_default().as_secs()
                    )
                } else {
                    status
                };
                proc.exiting = Some(PendingExit {
                    generation,
                    pid: exit.pid,
                    status: status.clone(),
                    ran: now.saturating_duration_since(proc.started_at),
                    recycled: exit.ended.recycled(),
                });
                out.push(Effect::HandleExit {
                    report: proto::SlotExited {
                        slot,
                        generation,
                        pid: exit.pid,
                        status,
                        cause: cause.into(),
                        signal: exit.ended.signal(),
                        exit_code: exit.ended.exit_code(),
                    },
                    worker_id: proc.worker_id.clone(),
                    tell_broker: self.broker.is_some(),
                    draining: self.draining,
                });
            }
        }
    }

    /// What comes after an executor's exit, now that it is reported and cleaned up: the
    /// broker's view of the slot (its answer to the report) decides.
    pub(super) fn on_exit_handled(
        &mut self,
        slot: u32,
        generation: u64,
        seen: Option<SlotView>,
        now: Instant,
    ) {
        let Some(proc) = self.slots.get_mut(&slot) else {
            return;
        };
        let Some(exit) = proc.exiting.take_if(|e| e.generation == generation) else {
            return;
        };
        let worker_id = proc.worker_id.clone();
        let seen = seen.filter(|_| !self.draining).unwrap_or_default();
        if seen.draining && !self.draining {
            tracing::info!("the broker is draining (Admin.Drain): no restarts");
            self.set_draining(now);
        }
        let (pid, status) = (exit.pid, &exit.status);
        if !self.draining && self.follows_broker() && seen.retired {
            tracing::info!(worker_id = %worker_id, pid, generation, status = %status, "executor retired (scale down): its slot stays empty until the broker wants it again");
            self.slots.get_mut(&slot).expect("checked above").restarts = 0;
            return;
        }
        let proc = self.slots.get_mut(&slot).expect("checked above");
        if self.draining {
            tracing::info!(worker_id = %worker_id, pid, generation, status = %status, "executor exited");
            return;
        }
        // Recycled: it said so with its last completion (the broker's word, for this
        // generation) and exited with the recycling code. The exit code alone is not enough: a
        // `body.executor` binary exiting 75 on its own must not restart in a tight loop.
        if exit.recycled && seen.recycling {
            // It left on purpose between assignments: no failure, no backoff.
            proc.restart_at = Some(now);
            tracing::info!(
                worker_id = %worker_id, pid, generation, status = %status,
                "executor recycled: restarting the slot at once"
            );
            return;
        }
        if exit.ran >= BACKOFF_RESET_AFTER {
            proc.restarts = 0;
        }
        let delay = restart_delay(proc.restarts);
        proc.restarts += 1;
        proc.restart_at = Some(now + delay);
        tracing::warn!(
            worker_id = %worker_id, pid, generation, status = %status,
            restart_in_s = delay.as_secs(), "executor exited; slot restart scheduled"
        );
    }

    /// An executor generation completed an assignment: it works, so the slot's next restart
    /// starts the backoff over (an agent killing executors now and then cannot park a slot at
    /// the 30 s cap while it does useful work in between).
    pub(super) fn on_completion(&mut self, kind: ChildKind) {
        if let ChildKind::Executor { slot, generation } = kind
            && let Some(proc) = self.slots.get_mut(&slot)
            && proc.generation == generation
            && proc.restarts > 0
        {
            tracing::debug!(
                slot,
                generation,
                "a replacement completed an assignment: restart backoff reset"
            );
            proc.restarts = 0;
        }
    }
}
