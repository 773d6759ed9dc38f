//! Tasks in and results out: polls granted and returned, each task received checked and run
//! on a free slot (or held, or handed back), completions turned into reports, and update-v2's
//! next task taking the slot its completion freed.

use super::{
    Assigned, Effect, HandBack, InputFailure, Report,
    machine::{Held, Machine, Running, Slot, Work},
};
use crate::wire;
use perago_core::{
    attempt::{AttemptError, AttemptSnapshot, TaskRef},
    conductor::{Polled, TaskTypes},
    json::RawJson,
    result::{Reason, RuntimeResult},
};
use perago_proto::slot::v1 as proto;
use std::{sync::Arc, time::Duration};

/// The `timeout` of a poll for more than one task. Conductor's SQL queues answer a batch poll
/// only once it holds `count` tasks or its timeout has passed, the tasks popped meanwhile
/// waiting in the server: a poll for several tasks must not wait long.
pub(crate) const FILL_WAIT: Duration = Duration::from_millis(100);

/// How long a poll for `count` tasks may wait, given `PERAGO_POLL_WAIT_MS` (`long`): a poll
/// for one task is answered by its first task on every queue backend, so it may wait the
/// whole long poll; a poll for more waits at most [`FILL_WAIT`], so no task waits for a
/// batch to fill.
pub(crate) fn poll_wait(count: u32, long: Duration) -> Duration {
    if count > 1 { FILL_WAIT.min(long) } else { long }
}

impl Machine {
    /// A poll returned: its reservation is released and each task received.
    pub(super) fn polled(&mut self, tasks: Vec<Polled>, reserved: u32) {
        self.reserved = self.reserved.saturating_sub(reserved);
        self.poll_sparse = tasks.len() < reserved as usize;
        self.share_polled(tasks.len());
        // A poll that returns empty after a pause began is no evidence of an empty queue.
        if tasks.is_empty() && self.capacity.once && self.all_idle() && self.paused_since.is_none()
        {
            self.once_idle_empty_poll();
        } else {
            self.once_empty_polls = 0;
        }
        for task in tasks {
            self.receive(task, None);
        }
    }

    /// A result update (or a hand-back) finished: the slot kept for update-v2's next task is
    /// free again, and that task, if any, takes it first.
    pub(super) fn update_done(&mut self, slot: Option<u32>, next_task: Option<Polled>) {
        self.updates_in_flight = self.updates_in_flight.saturating_sub(1);
        let mut reserved_slot = None;
        if let Some(n) = slot
            && let Some(s) = self.slot_mut(n)
            && matches!(s.work, Work::AwaitingNext)
        {
            s.work = Work::Idle;
            reserved_slot = Some(n);
        }
        // A slot of an older body version (a roll started while its update was in flight)
        // takes no next task: it is recycled now, and the task goes to a free slot or is held.
        self.roll_idle();
        if let Some(task) = next_task {
            self.receive(task, reserved_slot);
        }
    }

    pub(super) fn complete(&mut self, number: u32, generation: u64, completion: proto::Completion) {
        let counters = Arc::clone(&self.counters);
        // A generation that leaves to be recycled gets no next task, nor does any while
        // paused: v1.
        let recycle = completion.recycle.clone();
        // Sharing capacity: the slot keeps its permit for the next task only within the limit.
        // An OOM-killed body is judged as a crash (poison detection), reported through v1.
        let oom = completion.body_oom_killed;
        let peak = completion.body_peak_memory_bytes;
        // The profile learns of the execution first: the next task's admission (update-v2's
        // below included) goes by it.
        let profiled = self.profile_completion(number, generation, &completion);
        // The slot's next task through update-v2 only where admission would poll one: the
        // headroom covers it beside the others in flight, and it fits in the time left.
        let admits_next = !profiled
            || (self.memory_room_beside(self.in_flight().saturating_sub(1)) > 0
                && self.out_of_time().is_none()
                && self.admission_open);
        let v2 = admits_next
            && !self.draining
            && self.paused_since.is_none()
            && recycle.is_empty()
            && !oom
            && self.v2
            && self.share_keeps_slot();
        let target = self.body_version;
        let Some(slot) = self.slot_mut(number) else {
            return;
        };
        // A slot retired by `Admin.Scale` while busy takes no next task: it stops now. Nor
        // does one of an older body version (a roll): it is recycled once idle.
        let v2 = v2 && slot.wanted && !(slot.generation != 0 && slot.body_version < target);
        let matches = slot.generation == generation
            && matches!(&slot.work, Work::Busy(run)
                if run.execution_id == completion.execution_id
                    && run.attempt.task_id == completion.task_id);
        if !matches {
            counters.rejected_completions.inc();
            // Its own ids: a completion that is no assignment of this slot has no span of its own.
            tracing::warn!(slot = number, generation, task_id = %completion.task_id, execution_id = %completion.execution_id, "rejected a completion that is not the slot's current assignment");
            return;
        }
        if completion.body_peak_memory_bytes > 0 {
            slot.last_body_peak = completion.body_peak_memory_bytes;
            slot.max_body_peak = slot.max_body_peak.max(completion.body_peak_memory_bytes);
        }
        let Work::Busy(run) = std::mem::replace(
            &mut slot.work,
            if v2 { Work::AwaitingNext } else { Work::Idle },
        ) else {
            unreachable!("matched Busy above");
        };
        let worker_id = slot.worker_id.clone();
        let result = match completion.result.map(wire::result_from_wire) {
            Some(Ok(result)) if result.worker_id() == worker_id => result,
            Some(Ok(result)) => RuntimeResult::failed(
                worker_id,
                Reason::new(format!(
                    "executor reported worker id {} for slot {number}",
                    result.worker_id()
                )),
            ),
            Some(Err(e)) => {
                RuntimeResult::failed(worker_id, Reason::new(perago_core::errors::chain(&e)))
            }
            None => {
                RuntimeResult::failed(worker_id, Reason::new("malformed completion: no result"))
            }
        };
        tracing::debug!(
            slot = number,
            status = result.status().as_str(),
            "execution finished"
        );
        if peak > 0 {
            self.gauges.body_peak_memory.observe(peak as f64);
        }
        if let Ok(took) = self.now.wall.duration_since(run.dispatched_at) {
            self.gauges.task_duration.observe(took.as_secs_f64());
            let completed = result.status() == perago_core::result::ResultStatus::Completed;
            self.gauges
                .sdk
                .execute_time
                .get_or_create(&crate::counters::outcome(completed))
                .observe(took.as_secs_f64());
        }
        if let perago_core::result::Outcome::Completed(output) = result.outcome() {
            self.gauges.sdk.result_size.observe(output.len() as f64);
        }
        match result.outcome() {
            // The kernel killed the body at its memory limit: as much the task's doing as a
            // fault that kills its executor, so it counts toward poison detection.
            perago_core::result::Outcome::Failed(reason) if oom => {
                self.gauges.body_oom_kills.inc();
                let reason = reason.to_string();
                let worker_id = result.worker_id().to_owned();
                self.judge_crash(
                    *run,
                    worker_id,
                    reason,
                    crate::poison::Verdict::SelfInflicted,
                );
            }
            _ => self.report(v2.then_some(number), *run, result, v2),
        }
        if !recycle.is_empty() {
            self.recycle(number, &recycle);
        }
    }

    /// Records a completion of the slot's current assignment in the profile (duration and
    /// the body's peak); false for a completion that is not it.
    fn profile_completion(
        &mut self,
        number: u32,
        generation: u64,
        completion: &proto::Completion,
    ) -> bool {
        let now = self.now.wall;
        let Some(slot) = self.slot_mut(number) else {
            return false;
        };
        let Work::Busy(run) = &slot.work else {
            return false;
        };
        if slot.generation != generation || run.execution_id != completion.execution_id {
            return false;
        }
        let took = now.duration_since(run.dispatched_at).ok();
        self.profile.record(took, completion.body_peak_memory_bytes);
        true
    }

    pub(super) fn report(
        &mut self,
        slot: Option<u32>,
        run: Running,
        result: RuntimeResult,
        v2: bool,
    ) {
        self.updates_in_flight += 1;
        self.reported.insert(&run.attempt.task_id);
        self.effects.push(Effect::Report(Box::new(Report {
            workflow_instance_id: run.attempt.workflow_instance_id,
            task_id: run.attempt.task_id,
            execution_id: run.execution_id,
            result,
            use_v2: v2,
            slot,
            retry_count: Some(run.attempt.retry_count),
        })));
    }

    /// Hands a task the broker cannot run back to Conductor, re-queued without spending a
    /// retry. Its `startTime` stays, so the task's `timeoutSeconds` keeps running.
    pub(super) fn hand_back(&mut self, ids: TaskRef, why: &str) {
        tracing::warn!(task_id = %ids.task_id, "handing a task back to Conductor: {why}; its timeout keeps running from its first start");
        self.updates_in_flight += 1;
        self.effects
            .push(Effect::HandBack(HandBack { ids, output: None }));
    }

    /// Hands back, untouched, a task of another type than the broker's: it is not run, failed
    /// or completed here. Conductor re-queues it in its own type's queue, for its own workers.
    pub(super) fn hand_back_foreign(
        &mut self,
        ids: TaskRef,
        types: &TaskTypes,
        output: Option<serde_json::Value>,
    ) {
        tracing::warn!(task_id = %ids.task_id, workflow_instance_id = %ids.workflow_instance_id, "handing back a task of another type without running it: this broker runs {:?}, the task has {types}", self.task_name);
        self.updates_in_flight += 1;
        self.effects
            .push(Effect::HandBack(HandBack { ids, output }));
    }

    /// Why a task arriving now must not run: it is running or held here already, or a result
    /// for it was reported lately (each report is terminal: Conductor does not hand such a
    /// task out again, so one that does is not believed).
    pub(super) fn already_here(&self, task_id: &str) -> Option<String> {
        if let Some(slot) = self
            .slots
            .iter()
            .find(|s| matches!(&s.work, Work::Busy(run) if run.attempt.task_id == task_id))
        {
            return Some(format!("it is running on slot {}", slot.number));
        }
        if self.held.iter().any(|h| h.attempt.task_id == task_id) {
            return Some("it is held here already, waiting for a slot".to_owned());
        }
        if self.reported.contains(task_id) {
            return Some("a result for it was reported moments ago".to_owned());
        }
        None
    }

    /// Tasks received or held now, free slots excluded.
    pub(super) fn tasks_held(&self) -> usize {
        self.held.len()
            + self
                .slots
                .iter()
                .filter(|s| !matches!(s.work, Work::Idle))
                .count()
    }

    /// Fails a task the broker cannot map, for good: a retry would get the same task.
    pub(super) fn fail_unmappable(&mut self, ids: TaskRef, problem: &str) {
        tracing::warn!(task_id = %ids.task_id, "failing a task that cannot be run: {problem}");
        let result = RuntimeResult::failed_terminal(self.broker_id.clone(), Reason::new(problem));
        self.updates_in_flight += 1;
        self.reported.insert(&ids.task_id);
        self.effects.push(Effect::Report(Box::new(Report {
            workflow_instance_id: ids.workflow_instance_id,
            task_id: ids.task_id,
            execution_id: String::from("-"),
            result,
            use_v2: false,
            slot: None,
            retry_count: None,
        })));
    }

    /// A task arrived (from a poll or update-v2): checked first, then run on a free slot
    /// (`preferred` first), else held while fewer than N tasks are held, else handed back.
    /// Checked: a task without ids is dropped (nothing can be told about it); one already
    /// running, held or lately reported here is dropped (the same task id twice in one answer
    /// would run twice at once); one of another type is handed back as it came; one that
    /// cannot be decoded or mapped is failed for good.
    pub(super) fn receive(&mut self, task: Polled, preferred: Option<u32>) {
        let (ids, types) = match &task {
            Polled::Task(task) => match task.task_ref() {
                Ok(ids) => (ids, TaskTypes::of(&task.fields)),
                Err(e) => {
                    tracing::error!(
                        "dropped a polled task that cannot be identified: {}",
                        perago_core::errors::DisplayChain(&e)
                    );
                    return;
                }
            },
            Polled::Undecodable {
                ids: Some(ids),
                types,
                ..
            } => (ids.clone(), types.clone()),
            Polled::Undecodable {
                ids: None, problem, ..
            } => {
                tracing::error!(
                    "dropped a polled task that cannot be decoded or identified: {problem}"
                );
                return;
            }
        };
        if let Some(why) = self.already_here(&ids.task_id) {
            tracing::warn!(task_id = %ids.task_id, workflow_instance_id = %ids.workflow_instance_id, "dropped a task Conductor handed out again: {why}");
            return;
        }
        if !types.is(&self.task_name) {
            let output = match &task {
                Polled::Task(task) => task.fields.get("outputData").cloned(),
                Polled::Undecodable { .. } => None,
            };
            self.hand_back_foreign(ids, &types, output);
            return;
        }
        let task = match task {
            Polled::Task(task) => task,
            Polled::Undecodable { problem, .. } => {
                self.fail_unmappable(ids, &format!("the task cannot be decoded: {problem}"));
                return;
            }
        };
        let external = task.external_input_path().map(str::to_owned);
        let attempt = match AttemptSnapshot::from_polled(task) {
            Ok(a) => a,
            Err(AttemptError::Unidentifiable { field }) => {
                tracing::error!(
                    field,
                    "dropped a polled task that cannot be identified: {field} is missing"
                );
                return;
            }
            Err(e) => {
                self.fail_unmappable(ids, &perago_core::errors::chain(&e));
                return;
            }
        };
        if let Some(path) = external {
            self.fetch_input(attempt, path);
            return;
        }
        // The whole input crosses the slot protocol in one message: above Conductor's largest
        // payload threshold it is failed here, naming the size and the limit.
        let input_bytes = wire::input_json_len(&attempt);
        if input_bytes > perago_proto::MAX_TASK_PAYLOAD_BYTES {
            let ids = TaskRef {
                task_id: attempt.task_id,
                workflow_instance_id: attempt.workflow_instance_id,
            };
            self.fail_unmappable(
                ids,
                &format!(
                    "task input is {input_bytes} bytes; perago takes at most {} bytes inline (Conductor's largest payload threshold)",
                    perago_proto::MAX_TASK_PAYLOAD_BYTES
                ),
            );
            return;
        }
        let execution_id = self.ids.next();
        let index = preferred
            .and_then(|n| usize::try_from(n).ok()?.checked_sub(1))
            .filter(|&i| self.slots.get(i).is_some_and(Slot::free))
            .or_else(|| self.slots.iter().position(Slot::free));
        if let Some(index) = index {
            self.effects.push(Effect::StartLease {
                execution_id: execution_id.clone(),
                attempt: Box::new(attempt.without_input()),
            });
            self.assign(index, execution_id, attempt);
            return;
        }
        let can_run_later = !self.draining || self.slots.iter().any(|s| s.attached && !s.stopping);
        if self.tasks_held() < self.slots.len() && can_run_later {
            // Its own ids: the execution's span opens with the lease that follows.
            tracing::info!(task_id = %attempt.task_id, execution_id = %execution_id, "holding a task until a slot is free; its lease is extended meanwhile");
            self.effects.push(Effect::StartLease {
                execution_id: execution_id.clone(),
                attempt: Box::new(attempt.without_input()),
            });
            self.held.push_back(Held {
                execution_id,
                attempt,
                fetching: false,
            });
            return;
        }
        let ids = TaskRef {
            task_id: attempt.task_id,
            workflow_instance_id: attempt.workflow_instance_id,
        };
        let why = if can_run_later {
            "more tasks than slots"
        } else {
            "draining and no executor left to run it"
        };
        self.hand_back(ids, why);
    }

    /// Sends an assignment to slot `index` (free, checked by the caller).
    pub(super) fn assign(
        &mut self,
        index: usize,
        execution_id: String,
        mut attempt: AttemptSnapshot,
    ) {
        let (max_tasks, max_memory) = self.recycle_limits();
        let slot = &mut self.slots[index];
        let message = proto::BrokerMessage {
            message: Some(proto::broker_message::Message::Assignment(
                proto::Assignment {
                    execution_id: execution_id.clone(),
                    attempt: Some(wire::attempt_into_wire(&mut attempt)),
                    soft_time_limit_ms: self.soft_time_limit_ms,
                    max_tasks_per_executor: Some(max_tasks),
                    max_executor_memory_bytes: Some(max_memory),
                    // The actor sets it, when the attempt is traced.
                    trace: None,
                },
            )),
        };
        self.effects.push(Effect::Assigned(Box::new(Assigned {
            slot: slot.number,
            worker_id: slot.worker_id.clone(),
            task_id: attempt.task_id.clone(),
            execution_id: execution_id.clone(),
            retry_count: attempt.retry_count,
            response_timeout_seconds: attempt.response_timeout_seconds.unwrap_or(0),
        })));
        slot.idle_since = None;
        slot.work = Work::Busy(Box::new(Running {
            execution_id,
            attempt,
            dispatched_at: self.now.wall,
            // Shown as "preparing" until the executor reports a phase, unless it starts the
            // body at once and reports nothing.
            phase: if slot.body_at_dispatch {
                proto::Phase::Body
            } else {
                proto::Phase::Unspecified
            },
        }));
        let (number, generation) = (slot.number, slot.generation);
        self.counters.dispatched.inc();
        self.send(number, generation, message);
    }

    /// Held tasks take free slots first, in arrival order.
    pub(super) fn run_held(&mut self) {
        while let Some(next) = self.held.iter().position(|h| !h.fetching) {
            let Some(index) = self.slots.iter().position(Slot::free) else {
                return;
            };
            let held = self.held.remove(next).expect("index from position");
            self.assign(index, held.execution_id, held.attempt);
        }
    }

    /// A task whose input Conductor moved to external payload storage: held (its lease
    /// extended) while the actor fetches the input, then run as if it had come inline. Like
    /// any held task it counts against the polls, so no slot is promised twice.
    pub(super) fn fetch_input(&mut self, attempt: AttemptSnapshot, path: String) {
        let can_run_later = !self.draining || self.slots.iter().any(|s| s.attached && !s.stopping);
        if self.tasks_held() >= self.slots.len() || !can_run_later {
            let ids = TaskRef {
                task_id: attempt.task_id,
                workflow_instance_id: attempt.workflow_instance_id,
            };
            self.hand_back(ids, "no slot for a task whose input is in external storage");
            return;
        }
        let execution_id = self.ids.next();
        tracing::info!(task_id = %attempt.task_id, execution_id = %execution_id, path = %path, "fetching the task input from Conductor's external payload storage");
        self.effects.push(Effect::StartLease {
            execution_id: execution_id.clone(),
            attempt: Box::new(attempt.without_input()),
        });
        self.effects.push(Effect::FetchInput {
            execution_id: execution_id.clone(),
            task_id: attempt.task_id.clone(),
            path,
        });
        self.held.push_back(Held {
            execution_id,
            attempt,
            fetching: true,
        });
    }

    /// The fetch of a held task's input ended: with the input it waits for a slot as any held
    /// task; without, the attempt fails (FAILED, so Conductor retries it, or for good when a
    /// retry would meet the same answer), reason given.
    pub(super) fn input_fetched(
        &mut self,
        execution_id: &str,
        input: Result<RawJson, InputFailure>,
    ) {
        let Some(i) = self
            .held
            .iter()
            .position(|h| h.execution_id == execution_id && h.fetching)
        else {
            tracing::debug!(
                execution_id,
                "a fetched input for a task no longer held here"
            );
            return;
        };
        match input {
            Ok(input) => {
                let held = &mut self.held[i];
                held.attempt.input_data = input;
                held.fetching = false;
            }
            Err(failure) => {
                let held = self.held.remove(i).expect("index from position");
                let reason = Reason::new(&failure.reason);
                let result = if failure.terminal {
                    RuntimeResult::failed_terminal(self.broker_id.clone(), reason)
                } else {
                    RuntimeResult::failed(self.broker_id.clone(), reason)
                };
                let run = Running {
                    execution_id: held.execution_id,
                    attempt: held.attempt,
                    dispatched_at: self.now.wall,
                    phase: proto::Phase::Unspecified,
                };
                tracing::warn!(task_id = %run.attempt.task_id, terminal = failure.terminal, "failing a task whose input cannot be fetched: {}", failure.reason);
                self.report(None, run, result, false);
            }
        }
    }

    pub(super) fn lease_lost(&mut self, execution_id: &str) {
        if let Some(i) = self
            .held
            .iter()
            .position(|h| h.execution_id == execution_id)
        {
            self.held.remove(i).expect("index from position");
            tracing::warn!("dropped a held task: Conductor no longer has its attempt in progress");
            return;
        }
        // A running attempt goes on: a workspace task's fence stops it from publishing, and
        // Conductor ignores the late result.
        tracing::warn!(
            "the lease of a running execution is lost; its result will be ignored by Conductor"
        );
    }

    pub(super) fn grant_poll(&mut self) {
        if !self.poll_wanted {
            return;
        }
        if self.draining {
            if !self.poll_stopped {
                self.poll_wanted = false;
                self.poll_stopped = true;
                self.effects.push(Effect::GrantPoll(0));
            }
            return;
        }
        if self.paused_since.is_some() {
            // Paused: the poller waits for a grant until resumed.
            return;
        }
        if self.quiet_after.is_some() {
            // Run once: the queue looked empty; a queue-depth read confirms it first.
            return;
        }
        let free = self.slots.iter().filter(|s| s.free()).count() as u32;
        let held = u32::try_from(self.held.len()).unwrap_or(u32::MAX);
        // Sharing capacity: never more than the permits leave (none: wait for a grant).
        let available = free
            .saturating_sub(self.reserved)
            .saturating_sub(held)
            .min(self.share_room());
        // The profile's headroom: never more tasks than the type's observed peak fits.
        let room = self.memory_room();
        if available > 0 && (!self.admission_open || room == 0) {
            // Counted once per poll request that memory alone keeps waiting.
            if !self.poll_withheld {
                self.poll_withheld = true;
                self.counters.polls_withheld.inc();
                if room == 0 {
                    tracing::info!(
                        in_flight = self.in_flight(),
                        "poll withheld: {}",
                        self.memory_room_reason()
                    );
                }
            }
            return;
        }
        let available = available.min(room);
        if available > 0 {
            // A sparse queue: one task per poll, so none waits for a batch to fill.
            let count = if self.poll_sparse { 1 } else { available };
            self.poll_wanted = false;
            self.poll_withheld = false;
            self.reserved += count;
            self.effects.push(Effect::GrantPoll(count));
        }
    }
}
