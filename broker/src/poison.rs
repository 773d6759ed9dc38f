//! Poison-task detection (`PERAGO_POISON_AFTER`): how many times the attempts of one workflow
//! task have killed their executor. A death counts against its task only where the evidence
//! points at the task ([`judge`], [`RecentDeaths`]): never one the runtime caused, always one
//! the executor inflicted on itself (a fault signal, an exit code it chose), and an outside
//! kill (SIGKILL, SIGTERM, …) only when it is not part of a burst hitting other workflow tasks.
//! The running total is written at the end of each crash reason, so the next attempt, on any
//! runtime, reads it back from Conductor ([`parse_counted`]); the ledger is a bounded cache of
//! it (past [`MAX_TRACKED`] workflow tasks the oldest is forgotten).

use perago_core::attempt::AttemptSnapshot;
use perago_proto::slot::v1 as proto;
use std::{
    collections::{HashMap, VecDeque},
    time::{Duration, Instant},
};

/// Workflow tasks whose crashes are remembered at most.
pub(crate) const MAX_TRACKED: usize = 10_000;

/// One workflow task across its retries: the workflow, the task's reference name and its
/// DO_WHILE iteration. Retries keep all three; Conductor gives each loop iteration its own
/// reference name (`ref__2`), and the iteration keeps them apart on a server that does not.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct WorkflowTask {
    pub(crate) workflow_instance_id: String,
    pub(crate) reference_task_name: String,
    pub(crate) iteration: u32,
}

impl WorkflowTask {
    pub(crate) fn of(attempt: &AttemptSnapshot) -> Self {
        Self {
            workflow_instance_id: attempt.workflow_instance_id.clone(),
            reference_task_name: attempt.reference_task_name.clone(),
            iteration: attempt.iteration,
        }
    }
}

/// What the ledger knows of one workflow task: the crashes counted against it so far, and the
/// attempt whose death was judged last. The count vouches for the next attempt only if that
/// attempt was retried from exactly this one (its `retriedTaskId`); otherwise an attempt ran
/// elsewhere meanwhile (another runtime, before a restart) and Conductor's record decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) counted: u32,
    pub(crate) last_task_id: String,
}

/// Executor crashes per workflow task, oldest first forgotten. A cache: Conductor's record of
/// the earlier attempts (their reasons, see [`crate::crash_history`]) is the truth.
#[derive(Debug)]
pub(crate) struct CrashLedger {
    entries: HashMap<WorkflowTask, Entry>,
    /// Keys in the order they were first recorded.
    order: VecDeque<WorkflowTask>,
    capacity: usize,
}

impl Default for CrashLedger {
    fn default() -> Self {
        Self::with_capacity(MAX_TRACKED)
    }
}

impl CrashLedger {
    /// A ledger that remembers at most `capacity` workflow tasks.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self {
            entries: HashMap::new(),
            order: VecDeque::new(),
            capacity: capacity.max(1),
        }
    }

    /// The crashes counted before `attempt`, if this ledger can vouch for them: 0 for a first
    /// attempt (no `retriedTaskId`), the recorded count if it was recorded for exactly the
    /// attempt `attempt` was retried from, else `None` (ask Conductor).
    pub(crate) fn prior(&self, attempt: &AttemptSnapshot) -> Option<u32> {
        let Some(retried) = attempt.retried_task_id.as_deref() else {
            return Some(0);
        };
        self.entries
            .get(&WorkflowTask::of(attempt))
            .filter(|e| e.last_task_id == retried)
            .map(|e| e.counted)
    }

    /// The recorded count of `task`, vouched for or not (the fallback when Conductor's record
    /// cannot be read).
    pub(crate) fn local(&self, task: &WorkflowTask) -> u32 {
        self.entries.get(task).map_or(0, |e| e.counted)
    }

    /// Records that `counted` crashes are counted against `task` as of attempt `task_id`.
    pub(crate) fn record(&mut self, task: WorkflowTask, counted: u32, task_id: &str) {
        let entry = Entry {
            counted,
            last_task_id: task_id.to_owned(),
        };
        if let Some(e) = self.entries.get_mut(&task) {
            *e = entry;
            return;
        }
        while self.order.len() >= self.capacity {
            if let Some(oldest) = self.order.pop_front() {
                self.entries.remove(&oldest);
            }
        }
        self.order.push_back(task.clone());
        self.entries.insert(task, entry);
    }

    /// Forgets `task` (it has been failed for good: a rerun of the workflow starts afresh).
    pub(crate) fn forget(&mut self, task: &WorkflowTask) {
        if self.entries.remove(task).is_some() {
            self.order.retain(|t| t != task);
        }
    }

    /// Workflow tasks remembered now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

/// How long an unexplained executor death stays evidence of a burst: an outside kill of an
/// executor is counted against its task only if no executor of *another* workflow task (busy
/// or idle) died unexplained within this window before it.
pub(crate) const BURST_WINDOW: Duration = Duration::from_secs(20);

/// Unexplained deaths remembered at most (a flood keeps a flat memory; the oldest go first).
const MAX_RECENT_DEATHS: usize = 1024;

/// Signals by which a process ends itself: an abort (a Rust task's panic under
/// `panic = "abort"`, an assertion in C), a memory fault, an illegal instruction, an
/// arithmetic trap, a seccomp kill, a breakpoint. No other process sends these in practice.
const SELF_INFLICTED_SIGNALS: [&str; 7] = [
    "SIGABRT", "SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGSYS", "SIGTRAP",
];

/// What the evidence of one executor death says about the task it ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The runtime ended it (a drain, a recycle, a scale-down, a supervisor kill): never
    /// counted. The text says which.
    Runtime(String),
    /// The executor ended itself (a fault signal, an exit code it chose): always counted.
    SelfInflicted,
    /// Killed asynchronously (SIGKILL, SIGTERM, …), or how is not known: counted unless it
    /// is part of a burst.
    Outside,
}

/// The exit report's evidence (from `SlotExited`), when there is one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ExitEvidence {
    pub(crate) cause: proto::ExitCause,
    pub(crate) signal: Option<i32>,
    pub(crate) exit_code: Option<i32>,
}

impl ExitEvidence {
    pub(crate) fn of(exited: &proto::SlotExited) -> Self {
        Self {
            cause: proto::ExitCause::try_from(exited.cause)
                .unwrap_or(proto::ExitCause::Unspecified),
            signal: exited.signal,
            exit_code: exited.exit_code,
        }
    }
}

/// What the broker knows of the slot whose executor died.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SlotState {
    pub(crate) draining: bool,
    /// Told to stop to be recycled.
    pub(crate) recycled: bool,
    /// Retired (scale down).
    pub(crate) retired: bool,
    /// Told to stop by the broker for any other reason (a drain's stop, or a kill the broker
    /// asked for).
    pub(crate) stopping: bool,
}

/// Judges one death from what the broker knows of the slot and the supervisor's report.
pub(crate) fn judge(exit: Option<ExitEvidence>, slot: SlotState) -> Verdict {
    let SlotState {
        draining,
        recycled,
        retired,
        stopping,
    } = slot;
    if draining {
        return Verdict::Runtime("the runtime was draining".into());
    }
    if recycled {
        return Verdict::Runtime("the executor was being recycled".into());
    }
    if retired {
        return Verdict::Runtime("the slot was retired (scale down)".into());
    }
    if stopping {
        return Verdict::Runtime("the broker had told it to stop".into());
    }
    let Some(exit) = exit else {
        return Verdict::Outside;
    };
    let by_supervisor = match exit.cause {
        proto::ExitCause::Unspecified => None,
        proto::ExitCause::ShutdownDeadline => {
            Some("the supervisor killed it at the shutdown deadline")
        }
        proto::ExitCause::BrokerGone => Some("the supervisor stopped it when the broker died"),
        proto::ExitCause::Stalled => Some("the supervisor killed it as stalled"),
        proto::ExitCause::Supervisor => Some("the supervisor killed it"),
    };
    if let Some(why) = by_supervisor {
        return Verdict::Runtime(why.into());
    }
    match (exit.signal, exit.exit_code) {
        (Some(signal), _) => {
            if SELF_INFLICTED_SIGNALS.contains(&perago_sys::signal::signal_name(signal)) {
                Verdict::SelfInflicted
            } else {
                Verdict::Outside
            }
        }
        (None, Some(code)) if code != 0 => Verdict::SelfInflicted,
        _ => Verdict::Outside,
    }
}

/// Recent unexplained deaths (outside kills, or deaths of unknown cause), busy or idle: the
/// evidence of a burst.
#[derive(Debug, Default)]
pub(crate) struct RecentDeaths {
    deaths: VecDeque<(Instant, Option<WorkflowTask>)>,
}

impl RecentDeaths {
    /// Records an unexplained death at `now` (`task`: what it ran, `None` when idle); returns
    /// how many deaths of *other* workflow tasks (or idle executors) fell within
    /// [`BURST_WINDOW`] before it.
    pub(crate) fn record(&mut self, now: Instant, task: Option<&WorkflowTask>) -> usize {
        while let Some((at, _)) = self.deaths.front()
            && now.saturating_duration_since(*at) > BURST_WINDOW
        {
            self.deaths.pop_front();
        }
        let others = self
            .deaths
            .iter()
            .filter(|(_, t)| task.is_none() || t.as_ref() != task)
            .count();
        if self.deaths.len() >= MAX_RECENT_DEATHS {
            self.deaths.pop_front();
        }
        self.deaths.push_back((now, task.cloned()));
        others
    }
}

/// The end of the reason of a crash counted against its task: the running total, which the
/// next attempt reads back from Conductor (see [`parse_counted`]).
pub(crate) fn counted_suffix(counted: u32, limit: u32) -> String {
    format!(
        "; crash {counted} of {limit} counted against this workflow task ({}={limit})",
        perago_core::capacity::PERAGO_POISON_AFTER
    )
}

/// The end of the reason of a crash not counted against its task; the running total, when
/// this runtime can vouch for it.
pub(crate) fn not_counted_suffix(why: &str, counted: Option<u32>, limit: u32) -> String {
    match counted {
        Some(n) => format!("; not counted against the task: {why}; {n} of {limit} counted so far"),
        None => format!("; not counted against the task: {why}"),
    }
}

/// Where a crash reason starts: perago's own crash reasons, and nothing a body writes.
pub(crate) const CRASH_PREFIX: &str = "executor ";
/// Where the reason of a body OOM-killed at its `body.memory_limit` starts (counted as a
/// crash; a body cannot choose how its reason starts).
pub(crate) const OOM_PREFIX: &str = "OOM-killed ";
/// Where the final poison reason starts.
pub(crate) const POISON_PREFIX: &str = "poison task: ";

/// What an earlier attempt's `reasonForIncompletion` says of the crashes counted so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counted {
    /// This many crashes were counted as of that attempt.
    Total(u32),
    /// That attempt failed the workflow task for good: a rerun starts from 0.
    Reset,
    /// The reason says nothing (another failure, or a crash of unknown total): look further
    /// back.
    Silent,
}

/// Reads the running total out of one of perago's own reasons (see [`counted_suffix`],
/// [`not_counted_suffix`]); anything else, a body's text included, says nothing.
pub(crate) fn parse_counted(reason: &str) -> Counted {
    if reason.starts_with(POISON_PREFIX) {
        return Counted::Reset;
    }
    if !reason.starts_with(CRASH_PREFIX) && !reason.starts_with(OOM_PREFIX) {
        return Counted::Silent;
    }
    // `… <n> of <limit>` ends `head`.
    let total = |head: &str| -> Option<u32> {
        let (before, limit) = head.rsplit_once(" of ")?;
        limit.parse::<u32>().ok()?;
        before.rsplit(' ').next()?.parse().ok()
    };
    let counted = reason
        .rsplit_once(" counted against this workflow task (")
        .filter(|(_, tail)| !tail.contains(';'))
        .and_then(|(head, _)| total(head));
    let so_far = reason
        .strip_suffix(" counted so far")
        .filter(|head| head.contains("; not counted against the task: "))
        .and_then(total);
    match counted.or(so_far) {
        Some(n) => Counted::Total(n),
        None => Counted::Silent,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(workflow: &str, reference: &str, iteration: u32) -> WorkflowTask {
        WorkflowTask {
            workflow_instance_id: workflow.into(),
            reference_task_name: reference.into(),
            iteration,
        }
    }

    fn attempt(workflow: &str, task_id: &str, retried: Option<&str>) -> AttemptSnapshot {
        let mut raw = serde_json::json!({
            "taskType": "t", "taskDefName": "t", "status": "IN_PROGRESS",
            "inputData": {}, "referenceTaskName": "a", "retryCount": 0, "seq": 1,
            "workflowInstanceId": workflow, "taskId": task_id,
        });
        if let Some(retried) = retried {
            raw["retriedTaskId"] = retried.into();
        }
        AttemptSnapshot::from_polled(perago_core::attempt::PolledTask::from_value(raw)).unwrap()
    }

    #[test]
    fn the_ledger_vouches_only_for_the_attempt_retried_from_the_one_it_recorded() {
        let mut ledger = CrashLedger::default();
        // A first attempt has nothing before it.
        assert_eq!(ledger.prior(&attempt("w1", "t1", None)), Some(0));
        // A retry of an attempt this ledger never saw: ask Conductor.
        assert_eq!(ledger.prior(&attempt("w1", "t2", Some("t1"))), None);
        ledger.record(key("w1", "a", 0), 1, "t1");
        assert_eq!(ledger.prior(&attempt("w1", "t2", Some("t1"))), Some(1));
        // An attempt in between ran elsewhere: the count no longer vouches.
        assert_eq!(ledger.prior(&attempt("w1", "t3", Some("t2"))), None);
        assert_eq!(ledger.local(&key("w1", "a", 0)), 1);
        assert_eq!(ledger.prior(&attempt("w2", "u2", Some("t1"))), None);
        ledger.forget(&key("w1", "a", 0));
        assert_eq!(ledger.prior(&attempt("w1", "t2", Some("t1"))), None);
        assert_eq!(ledger.local(&key("w1", "a", 0)), 0);
    }

    #[test]
    fn the_oldest_is_forgotten_past_the_bound() {
        let mut ledger = CrashLedger::with_capacity(3);
        for w in ["w1", "w2", "w3"] {
            ledger.record(key(w, "a", 0), 1, "x");
        }
        ledger.record(key("w1", "a", 0), 2, "x");
        ledger.record(key("w4", "a", 0), 1, "x");
        assert_eq!(ledger.len(), 3);
        // w1 was recorded first, so it went, in spite of its second crash.
        assert_eq!(ledger.local(&key("w1", "a", 0)), 0);
        assert_eq!(ledger.local(&key("w2", "a", 0)), 1);
        assert_eq!(ledger.order.len(), 3);
    }

    fn exit(cause: proto::ExitCause, signal: Option<i32>, code: Option<i32>) -> ExitEvidence {
        ExitEvidence {
            cause,
            signal,
            exit_code: code,
        }
    }

    #[test]
    fn deaths_are_judged_by_their_evidence() {
        use proto::ExitCause as C;
        let plain = |signal, code| {
            judge(
                Some(exit(C::Unspecified, signal, code)),
                SlotState::default(),
            )
        };
        for sig in [6, 11, 7, 4, 8, 31, 5] {
            assert_eq!(
                plain(Some(sig), None),
                Verdict::SelfInflicted,
                "signal {sig}"
            );
        }
        assert_eq!(plain(None, Some(1)), Verdict::SelfInflicted);
        assert_eq!(plain(None, Some(101)), Verdict::SelfInflicted);
        for sig in [9, 15, 1, 2, 10] {
            assert_eq!(plain(Some(sig), None), Verdict::Outside, "signal {sig}");
        }
        assert_eq!(plain(None, Some(0)), Verdict::Outside);
        assert_eq!(plain(None, None), Verdict::Outside);
        let free = SlotState::default();
        assert_eq!(judge(None, free), Verdict::Outside);
        for cause in [
            C::ShutdownDeadline,
            C::BrokerGone,
            C::Stalled,
            C::Supervisor,
        ] {
            // Even a SIGKILL alone: the supervisor's kill it was.
            let v = judge(Some(exit(cause, Some(9), None)), free);
            assert!(matches!(v, Verdict::Runtime(_)), "{cause:?}: {v:?}");
        }
        let abort = Some(exit(C::Unspecified, Some(6), None));
        for slot in [
            SlotState {
                draining: true,
                ..free
            },
            SlotState {
                recycled: true,
                ..free
            },
            SlotState {
                retired: true,
                ..free
            },
            SlotState {
                stopping: true,
                ..free
            },
        ] {
            assert!(
                matches!(judge(abort, slot), Verdict::Runtime(_)),
                "{slot:?}"
            );
        }
    }

    #[test]
    fn a_burst_is_deaths_of_other_workflow_tasks_within_the_window() {
        let mut recent = RecentDeaths::default();
        let t0 = Instant::now();
        let (a, b) = (key("w1", "a", 0), key("w2", "a", 0));
        assert_eq!(recent.record(t0, Some(&a)), 0);
        // The same workflow task again (a body killing its executor every attempt): no burst.
        assert_eq!(recent.record(t0 + Duration::from_secs(1), Some(&a)), 0);
        assert_eq!(recent.record(t0 + Duration::from_secs(2), Some(&b)), 2);
        assert_eq!(recent.record(t0 + Duration::from_secs(3), None), 3);
        assert_eq!(recent.record(t0 + Duration::from_secs(4), Some(&a)), 2);
        // Past the window, what came before is forgotten.
        let later = t0 + Duration::from_secs(4) + BURST_WINDOW + Duration::from_millis(1);
        assert_eq!(recent.record(later, Some(&b)), 0);
    }

    #[test]
    fn the_running_total_is_read_back_from_perago_reasons_only() {
        let crash = "executor t0001 (pid 9, generation 2) exited (signal 9 (SIGKILL)) while running execution e";
        assert_eq!(
            parse_counted(&format!("{crash}{}", counted_suffix(2, 3))),
            Counted::Total(2)
        );
        assert_eq!(
            parse_counted(&format!(
                "{crash}{}",
                not_counted_suffix("4 other executors died in the last 20 s", Some(1), 3)
            )),
            Counted::Total(1)
        );
        assert_eq!(
            parse_counted(&format!(
                "{crash}{}",
                not_counted_suffix("the runtime was draining", None, 3)
            )),
            Counted::Silent
        );
        assert_eq!(parse_counted(crash), Counted::Silent);
        assert_eq!(
            parse_counted(&format!(
                "poison task: attempts … last: {crash}{}",
                counted_suffix(3, 3)
            )),
            Counted::Reset
        );
        // A body's failure reason can say anything: it is not believed.
        assert_eq!(
            parse_counted(&format!(
                "command exited with status 1: {}",
                counted_suffix(2, 3)
            )),
            Counted::Silent
        );
        assert_eq!(parse_counted("TIMED_OUT"), Counted::Silent);
        assert_eq!(
            parse_counted(&format!(
                "{crash}; crash x of 3 counted against this workflow task (P=3)"
            )),
            Counted::Silent
        );
    }
}
