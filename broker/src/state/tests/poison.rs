//! Poison detection: which executor deaths count against a workflow task, and when it fails for good.

use super::*;

#[test]
fn a_workflow_task_that_kills_its_executor_three_times_fails_for_good() {
    let mut h = Harness::new(1, false);
    let first = h.crash(1, task_in("a1", "wf-poison"));
    assert_eq!(first.result.status(), ResultStatus::Failed);
    assert!(
        reason(&first)
            .ends_with("; crash 1 of 3 counted against this workflow task (PERAGO_POISON_AFTER=3)"),
        "{}",
        reason(&first)
    );
    let second = h.crash(2, retry_in("a2", "wf-poison", "a1"));
    assert_eq!(second.result.status(), ResultStatus::Failed);
    assert!(
        reason(&second)
            .ends_with("; crash 2 of 3 counted against this workflow task (PERAGO_POISON_AFTER=3)")
    );
    // Another workflow's crashes are its own.
    let other = h.crash(3, task_in("b1", "wf-other"));
    assert_eq!(other.result.status(), ResultStatus::Failed);
    assert!(reason(&other).contains("; crash 1 of 3 counted"));
    assert_eq!(h.counters.tasks_poisoned.get(), 0);
    let third = h.crash(4, retry_in("a3", "wf-poison", "a2"));
    assert_eq!(third.task_id, "a3");
    assert_eq!(third.result.status(), ResultStatus::FailedWithTerminalError);
    assert_eq!(
        reason(&third),
        format!(
            "poison task: attempts of workflow task t_ref in workflow wf-poison killed their executor 3 times (PERAGO_POISON_AFTER=3); last: executor t0001 (pid 99, generation 4) exited (signal 9 (SIGKILL)) while running execution {}",
            third.execution_id
        )
    );
    assert_eq!(h.counters.tasks_poisoned.get(), 1);
    assert_eq!(h.status().counters.unwrap().tasks_poisoned, 1);
    // The other workflow is at its second crash: still retried.
    let other = h.crash(5, retry_in("b2", "wf-other", "b1"));
    assert_eq!(other.result.status(), ResultStatus::Failed);
    // A rerun of the poisoned workflow task (Conductor's retry of the poisoned attempt) starts
    // its count afresh: Conductor's record says so (a poison verdict resets it).
    let effects = h.crash_with(retry_in("a4", "wf-poison", "a3"), exit_of(6, Some(9), None));
    let read = history_read(&effects).expect("the ledger forgot the poisoned task: ask Conductor");
    assert_eq!(read.retried_task_id, "a3");
    let rerun = reports(&h.go(Input::CrashHistory {
        execution_id: read.execution_id,
        counted: Some(0),
    }));
    assert_eq!(rerun[0].result.status(), ResultStatus::Failed);
    assert!(
        reason(&rerun[0])
            .ends_with("crash 1 of 3 counted against this workflow task (PERAGO_POISON_AFTER=3)")
    );
    assert_eq!(h.counters.tasks_poisoned.get(), 1);
}

/// Issue #23, item 1: outside kills that hit several workflow tasks within the burst window
/// (random SIGKILLs, an OOM killer's spree) are not the tasks' doing and are not counted;
/// a body that kills its own executor on every attempt, with nothing else dying, still is.
#[test]
fn a_burst_of_outside_kills_is_not_counted_against_any_task() {
    let mut h = capacity_with(|c| c.poison_after = 2);
    let first = h.crash(1, task_in("a1", "wf-a"));
    assert!(
        reason(&first)
            .ends_with("crash 1 of 2 counted against this workflow task (PERAGO_POISON_AFTER=2)")
    );
    // Another workflow task's executor is killed 5 s later: a burst.
    h.advance(Duration::from_secs(5));
    h.started(1, 2).unwrap();
    h.hello(1, 2).0.unwrap();
    let granted = h.poll().unwrap();
    h.go(Input::Polled {
        tasks: vec![task_in("b1", "wf-b")],
        reserved: granted,
    });
    let b = reports(&h.go(Input::SlotExited(exit_of(2, Some(9), None))));
    assert_eq!(b[0].result.status(), ResultStatus::Failed);
    assert_eq!(
        reason(&b[0]),
        format!(
            "executor t0001 (pid 99, generation 2) exited (signal 9 (SIGKILL)) while running execution {}; not counted against the task: 1 other executor deaths in the last 20 s (a burst, not this task's doing); 0 of 2 counted so far",
            b[0].execution_id
        )
    );
    // wf-a's retry is killed 5 s after that: wf-b's death makes it a burst too, and the
    // running total (1) carries on for the attempt after.
    h.advance(Duration::from_secs(5));
    h.started(1, 3).unwrap();
    h.hello(1, 3).0.unwrap();
    let granted = h.poll().unwrap();
    h.go(Input::Polled {
        tasks: vec![retry_in("a2", "wf-a", "a1")],
        reserved: granted,
    });
    let a2 = reports(&h.go(Input::SlotExited(exit_of(3, Some(9), None))));
    assert_eq!(a2[0].result.status(), ResultStatus::Failed);
    assert!(
        reason(&a2[0]).ends_with("; 1 of 2 counted so far"),
        "{}",
        reason(&a2[0])
    );
    // An idle executor killed from outside is burst evidence too.
    h.advance(Duration::from_secs(30));
    h.started(1, 4).unwrap();
    h.hello(1, 4).0.unwrap();
    h.go(Input::SlotExited(exit_of(4, Some(9), None)));
    h.advance(Duration::from_secs(1));
    h.started(1, 5).unwrap();
    h.hello(1, 5).0.unwrap();
    let granted = h.poll().unwrap();
    h.go(Input::Polled {
        tasks: vec![retry_in("a3", "wf-a", "a2")],
        reserved: granted,
    });
    let a3 = reports(&h.go(Input::SlotExited(exit_of(5, Some(9), None))));
    assert_eq!(a3[0].result.status(), ResultStatus::Failed);
    assert!(
        reason(&a3[0]).contains("not counted against the task: 1 other executor deaths"),
        "{}",
        reason(&a3[0])
    );
    // Alone again, the next kill is counted, on top of the total carried along: poisoned.
    let a4 = h.crash(6, retry_in("a4", "wf-a", "a3"));
    assert_eq!(a4.result.status(), ResultStatus::FailedWithTerminalError);
    assert_eq!(h.counters.tasks_poisoned.get(), 1);
}

/// Issue #23, item 1: a death the runtime caused (a supervisor kill, whatever its signal) is
/// never counted; one the executor inflicted on itself (an abort, a fault, an exit code it
/// chose) always is, burst or not.
#[test]
fn supervisor_kills_are_never_counted_and_self_inflicted_deaths_always_are() {
    let mut h = capacity_with(|c| c.poison_after = 2);
    for (generation, cause) in [
        (1, proto::ExitCause::ShutdownDeadline),
        (2, proto::ExitCause::Stalled),
        (3, proto::ExitCause::Supervisor),
        (4, proto::ExitCause::BrokerGone),
    ] {
        let mut exited = exit_of(generation, Some(9), None);
        exited.cause = cause.into();
        let retried = (generation > 1).then(|| format!("a{}", generation - 1));
        let task = match &retried {
            Some(r) => retry_in(&format!("a{generation}"), "wf-a", r),
            None => task_in("a1", "wf-a"),
        };
        let failed = reports(&h.crash_with(task, exited));
        assert_eq!(failed[0].result.status(), ResultStatus::Failed);
        assert!(
            reason(&failed[0]).contains("; not counted against the task: the supervisor "),
            "{}",
            reason(&failed[0])
        );
        assert!(
            reason(&failed[0]).ends_with("; 0 of 2 counted so far"),
            "{}",
            reason(&failed[0])
        );
    }
    assert_eq!(h.counters.tasks_poisoned.get(), 0);
    // A Rust task that aborts its executor, inside a burst of other deaths: counted each time.
    h.advance(Duration::from_secs(1));
    h.started(1, 5).unwrap();
    h.hello(1, 5).0.unwrap();
    h.go(Input::SlotExited(exit_of(5, Some(9), None)));
    let abort = |h: &mut Harness, generation: u64, id: &str, retried: &str| {
        h.advance(Duration::from_secs(1));
        h.started(1, generation).unwrap();
        h.hello(1, generation).0.unwrap();
        let granted = h.poll().unwrap();
        h.go(Input::Polled {
            tasks: vec![retry_in(id, "wf-a", retried)],
            reserved: granted,
        });
        reports(&h.go(Input::SlotExited(exit_of(generation, Some(6), None)))).remove(0)
    };
    let first = abort(&mut h, 6, "a5", "a4");
    assert_eq!(first.result.status(), ResultStatus::Failed);
    assert!(
        reason(&first)
            .ends_with("; crash 1 of 2 counted against this workflow task (PERAGO_POISON_AFTER=2)"),
        "{}",
        reason(&first)
    );
    let second = abort(&mut h, 7, "a6", "a5");
    assert_eq!(
        second.result.status(),
        ResultStatus::FailedWithTerminalError
    );
    // An exit code the executor chose counts as well.
    let mut h = capacity_with(|c| c.poison_after = 1);
    let failed = reports(&h.crash_with(task_in("c1", "wf-c"), exit_of(1, None, Some(101))));
    assert_eq!(
        failed[0].result.status(),
        ResultStatus::FailedWithTerminalError
    );
}

/// Issue #23, item 1: the count of a retry this broker did not see fail (it ran on another
/// runtime, or before a restart) comes from Conductor's record; the result waits for it,
/// a drain waits for it, and a failed read falls back on the local count.
#[test]
fn a_crash_the_ledger_cannot_vouch_for_waits_for_conductors_record() {
    let mut h = capacity_with(|c| c.poison_after = 3);
    let effects = h.crash_with(retry_in("a3", "wf-a", "a2"), exit_of(1, Some(9), None));
    assert!(reports(&effects).is_empty(), "parked: {effects:?}");
    let read = history_read(&effects).expect("a history read");
    assert_eq!(
        read,
        HistoryRead {
            execution_id: read.execution_id.clone(),
            task_id: "a3".into(),
            retried_task_id: "a2".into(),
            workflow_instance_id: "wf-a".into(),
            reference_task_name: "t_ref".into(),
            task_def_name: "t".into(),
        }
    );
    assert!(
        !effects
            .iter()
            .any(|e| matches!(e, Effect::StopLease { .. })),
        "the lease goes on"
    );
    // A drain waits for the parked result.
    let drained = |effects: &[Effect]| effects.iter().any(|e| matches!(e, Effect::Drained));
    let d = h.go(Input::Drain);
    assert!(!drained(&d), "{d:?}");
    let d = h.go(Input::StreamEnded {
        slot: 1,
        generation: 1,
    });
    assert!(!drained(&d), "{d:?}");
    // Conductor says two crashes were counted before: this is the third.
    let out = h.go(Input::CrashHistory {
        execution_id: read.execution_id.clone(),
        counted: Some(2),
    });
    let failed = reports(&out);
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].task_id, "a3");
    assert_eq!(
        failed[0].result.status(),
        ResultStatus::FailedWithTerminalError
    );
    assert!(reason(&failed[0]).starts_with("poison task: attempts of workflow task t_ref in workflow wf-a killed their executor 3 times"));
    // A second answer for it finds nothing parked.
    assert!(
        reports(&h.go(Input::CrashHistory {
            execution_id: read.execution_id,
            counted: Some(0)
        }))
        .is_empty()
    );
    let d = h.go(Input::UpdateDone {
        slot: None,
        next_task: None,
    });
    assert!(drained(&d), "{d:?}");

    // A failed read counts on this broker's own count: never more.
    let mut h = capacity_with(|c| c.poison_after = 2);
    let effects = h.crash_with(retry_in("b5", "wf-b", "b4"), exit_of(1, Some(9), None));
    let read = history_read(&effects).unwrap();
    let failed = reports(&h.go(Input::CrashHistory {
        execution_id: read.execution_id,
        counted: None,
    }));
    assert_eq!(failed[0].result.status(), ResultStatus::Failed);
    assert!(
        reason(&failed[0])
            .ends_with("crash 1 of 2 counted against this workflow task (PERAGO_POISON_AFTER=2)")
    );
    // That count vouches for the next retry of exactly this attempt: no read.
    let effects = h.crash_with(retry_in("b6", "wf-b", "b5"), exit_of(2, Some(9), None));
    assert!(history_read(&effects).is_none());
    assert_eq!(
        reports(&effects)[0].result.status(),
        ResultStatus::FailedWithTerminalError
    );
}

#[test]
fn loop_iterations_are_counted_apart() {
    let mut h = capacity_with(|c| c.poison_after = 2);
    let iteration = |id: &str, n: u32| {
        let mut t = raw_task(id);
        t["iteration"] = json!(n);
        Polled::Task(PolledTask::from_value(t))
    };
    // raw_task puts each id in its own workflow: keep one workflow for every attempt.
    let in_one = |p: Polled| match p {
        Polled::Task(mut t) => {
            assert!(t.fields.set("workflowInstanceId", json!("wf-loop")));
            Polled::Task(t)
        }
        other => other,
    };
    let first = h.crash(1, in_one(iteration("i1", 1)));
    let second = h.crash(2, in_one(iteration("i2", 2)));
    assert_eq!(first.result.status(), ResultStatus::Failed);
    assert_eq!(second.result.status(), ResultStatus::Failed);
    let retry = match in_one(iteration("i3", 2)) {
        Polled::Task(mut t) => {
            assert!(t.fields.set("retriedTaskId", json!("i2")));
            Polled::Task(t)
        }
        other => other,
    };
    let again = h.crash(3, retry);
    assert_eq!(again.result.status(), ResultStatus::FailedWithTerminalError);
}

#[test]
fn poison_after_zero_never_fails_a_task_for_good() {
    let mut h = capacity_with(|c| c.poison_after = 0);
    for generation in 1..=6 {
        let failed = h.crash(generation, task_in(&format!("a{generation}"), "wf"));
        assert_eq!(failed.result.status(), ResultStatus::Failed);
    }
    assert_eq!(h.counters.tasks_poisoned.get(), 0);
}

#[test]
fn a_kill_during_a_drain_is_not_the_tasks_doing() {
    let mut h = capacity_with(|c| c.poison_after = 1);
    h.up(1);
    let granted = h.poll().unwrap();
    h.go(Input::Polled {
        tasks: vec![task_in("a1", "wf")],
        reserved: granted,
    });
    h.go(Input::Drain);
    let failed = reports(&h.go(Input::SlotExited(proto::SlotExited {
        slot: 1,
        generation: 1,
        pid: 99,
        status: "killed by the supervisor at the shutdown deadline".into(),
        ..Default::default()
    })));
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].result.status(), ResultStatus::Failed);
    assert_eq!(h.counters.tasks_poisoned.get(), 0);
    // The same threshold outside a drain fails the first crash for good.
    let mut h = capacity_with(|c| c.poison_after = 1);
    let failed = h.crash(1, task_in("a1", "wf"));
    assert_eq!(
        failed.result.status(),
        ResultStatus::FailedWithTerminalError
    );
}

#[test]
fn the_crash_ledger_stays_bounded() {
    let mut h = capacity_with(|c| c.poison_after = 2);
    let total = crate::poison::MAX_TRACKED as u64 + 1;
    for n in 0..total {
        h.crash(n + 1, task_in(&format!("t{n}"), &format!("wf{n}")));
    }
    assert_eq!(h.m.crashes.len(), crate::poison::MAX_TRACKED);
    // The oldest workflow task was forgotten: its next crash asks Conductor.
    let effects = h.crash_with(
        retry_in("again", "wf0", "t0"),
        exit_of(total + 1, Some(9), None),
    );
    assert!(history_read(&effects).is_some(), "{effects:?}");
    // The newest is remembered: its second crash poisons it.
    let failed = h.crash(
        total + 2,
        retry_in(
            "again2",
            &format!("wf{}", total - 1),
            &format!("t{}", total - 1),
        ),
    );
    assert_eq!(
        failed.result.status(),
        ResultStatus::FailedWithTerminalError
    );
}

impl Harness {
    /// Slot 1 (generation 1, attached) runs `task` and completes it FAILED with `reason`, the
    /// executor saying whether its body was OOM-killed at its memory limit.
    fn fail_body(&mut self, task: Polled, reason: &str, oom: bool) -> Report {
        let granted = self
            .poll()
            .unwrap_or_else(|| panic!("no grant before {reason}: {:?}", self.status()));
        let effects = self.go(Input::Polled {
            tasks: vec![task],
            reserved: granted,
        });
        let (slot, execution_id, task_id) = assignments(&effects)
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("no assignment: {effects:?}"));
        let mut done = reports(&self.go(Input::Completion {
            slot,
            generation: 1,
            completion: proto::Completion {
                task_id,
                execution_id,
                result: Some(proto::TaskResult {
                    outcome: Some(proto::task_result::Outcome::Failed(proto::Failed {
                        reason: reason.into(),
                    })),
                    worker_id: format!("t{slot:04}"),
                }),
                recycle: String::new(),
                body_peak_memory_bytes: 64 << 20,
                body_oom_killed: oom,
                spans: Vec::new(),
            },
        }));
        assert_eq!(done.len(), 1);
        let done = done.remove(0);
        if done.use_v2 {
            // Update-v2 brings no next task: the slot is free again.
            self.go(Input::UpdateDone {
                slot: Some(slot),
                next_task: None,
            });
        }
        done
    }
}

/// Issue #27 item 4: a body the kernel OOM-kills at its `body.memory_limit` counts toward
/// poison detection as a crash does (the executor lives on); any other body failure does not.
#[test]
fn a_body_oom_killed_at_its_memory_limit_counts_toward_poison_detection() {
    let mut h = Harness::new(1, true);
    h.up(1);
    const OOM: &str = "OOM-killed at 64.0 MiB (limit 64 MiB): Killed";
    let first = h.fail_body(task_in("m1", "wf-mem"), OOM, true);
    assert_eq!(first.result.status(), ResultStatus::Failed);
    assert_eq!(
        reason(&first),
        format!("{OOM}; crash 1 of 3 counted against this workflow task (PERAGO_POISON_AFTER=3)")
    );
    assert!(!first.use_v2, "judged as a crash: reported through v1");
    assert_eq!(
        crate::poison::parse_counted(&reason(&first)),
        crate::poison::Counted::Total(1),
        "the next attempt reads the count back from Conductor"
    );
    // A body that fails otherwise is no crash: not counted, and the count stands.
    let plain = h.fail_body(
        retry_in("m2", "wf-mem", "m1"),
        "body failed (exit status 1)",
        false,
    );
    assert_eq!(reason(&plain), "body failed (exit status 1)");
    let second = h.fail_body(retry_in("m3", "wf-mem", "m1"), OOM, true);
    assert!(
        reason(&second)
            .ends_with("; crash 2 of 3 counted against this workflow task (PERAGO_POISON_AFTER=3)")
    );
    let third = h.fail_body(retry_in("m4", "wf-mem", "m3"), OOM, true);
    assert_eq!(third.result.status(), ResultStatus::FailedWithTerminalError);
    assert_eq!(
        reason(&third),
        format!(
            "poison task: attempts of workflow task t_ref in workflow wf-mem killed their executor 3 times (PERAGO_POISON_AFTER=3); last: {OOM}"
        )
    );
    assert_eq!(h.counters.tasks_poisoned.get(), 1);
    // The slot is free again for the next task (no update-v2 next task was asked for).
    assert_eq!(h.poll(), Some(1));
}
