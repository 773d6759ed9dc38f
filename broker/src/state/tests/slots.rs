//! Generations, attach, stream ends and exit reports, recycling, the fence and the status of each slot.

use super::*;

#[test]
fn attach_needs_the_current_generation_and_its_token() {
    let mut h = Harness::new(1, true);
    // Before the supervisor announced the slot, nothing attaches.
    assert_eq!(
        h.hello(1, 1).0.unwrap_err().code(),
        tonic::Code::Unauthenticated
    );
    h.started(1, 1).unwrap();
    let (ok, effects) = h.hello(1, 1);
    assert_eq!(ok.unwrap(), (1, 1));
    assert!(
        matches!(
            &effects[..],
            [
                Effect::Send {
                    slot: 1,
                    generation: 1,
                    message: proto::BrokerMessage {
                        message: Some(proto::broker_message::Message::Welcome(_))
                    }
                },
                ..
            ]
        ),
        "{effects:?}"
    );
    assert_eq!(
        h.hello(1, 1).0.unwrap_err().code(),
        tonic::Code::AlreadyExists
    );
    h.started(1, 2).unwrap();
    assert_eq!(
        h.hello(1, 1).0.unwrap_err().code(),
        tonic::Code::Unauthenticated
    );
    let bad = h.handle(Input::Hello(proto::Hello {
        protocol_version: proto::ProtocolVersion::ProtocolVersion1 as i32,
        credentials: Some(proto::SlotCredentials {
            slot: 1,
            generation: 2,
            token: "wrong".into(),
        }),
        pid: 1,
        worker_id: String::new(),
        body_at_dispatch: false,
    }));
    assert!(matches!(bad.reply, Reply::Hello(Err(s)) if s.message() == "wrong slot token"));
}

#[test]
fn exit_report_then_stream_end_fail_the_assignment_once() {
    let mut h = Harness::new(1, true);
    h.up(1);
    let (_, execution, _) = assignments(&h.deliver(&["a"])).remove(0);
    let effects = h.go(Input::SlotExited(proto::SlotExited {
        slot: 1,
        generation: 1,
        pid: 4242,
        status: "killed by signal 9".into(),
        ..Default::default()
    }));
    let failed = reports(&effects);
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].result.status(), ResultStatus::Failed);
    assert_eq!(
        reason(&failed[0]),
        format!(
            "executor t0001 (pid 4242, generation 1) exited (killed by signal 9) while running execution {execution}; crash 1 of 3 counted against this workflow task (PERAGO_POISON_AFTER=3)"
        )
    );
    assert!(effects.contains(&Effect::Detach { slot: 1 }));
    assert!(
        reports(&h.go(Input::StreamEnded {
            slot: 1,
            generation: 1
        }))
        .is_empty()
    );
    assert_eq!(h.counters.executor_exits.get(), 1);
}

#[test]
fn stream_end_then_exit_report_fail_the_assignment_once_with_the_status() {
    let mut h = Harness::new(1, true);
    h.up(1);
    let (_, execution, _) = assignments(&h.deliver(&["a"])).remove(0);
    let effects = h.go(Input::StreamEnded {
        slot: 1,
        generation: 1,
    });
    assert!(reports(&effects).is_empty(), "waits for the exit status");
    assert!(effects.contains(&Effect::ArmExitGrace {
        slot: 1,
        generation: 1
    }));
    let failed = reports(&h.go(Input::SlotExited(proto::SlotExited {
        slot: 1,
        generation: 1,
        pid: 7,
        status: "exit status 3".into(),
        ..Default::default()
    })));
    assert_eq!(failed.len(), 1);
    assert!(
        reason(&failed[0]).contains("exited (exit status 3) while running execution"),
        "{}",
        reason(&failed[0])
    );
    assert!(reason(&failed[0]).contains(&execution));
    assert!(
        reports(&h.go(Input::StreamGraceOver {
            slot: 1,
            generation: 1
        }))
        .is_empty()
    );
}

#[test]
fn stream_end_without_an_exit_report_fails_after_the_grace() {
    let mut h = Harness::new(1, true);
    h.up(1);
    h.deliver(&["a"]);
    h.go(Input::StreamEnded {
        slot: 1,
        generation: 1,
    });
    let failed = reports(&h.go(Input::StreamGraceOver {
        slot: 1,
        generation: 1,
    }));
    assert_eq!(failed.len(), 1);
    assert!(reason(&failed[0]).contains("(attach stream closed)"));
}

/// The bug this machine was written to test: a SlotStarted that arrives before the previous
/// generation's SlotExited used to set the new generation first, so the old one's in-flight
/// task was never reported (and its lease extended forever).
#[test]
fn slot_started_before_slot_exited_fails_the_old_generations_task() {
    let mut h = Harness::new(1, true);
    h.up(1);
    let (_, execution, _) = assignments(&h.deliver(&["a"])).remove(0);
    let out = h.handle(Input::SlotStarted(proto::SlotStarted {
        slot: 1,
        generation: 2,
        token: format!("{TOKEN}-2"),
        pid: 0,
        body_version: 0,
    }));
    assert!(matches!(out.reply, Reply::SlotStarted(Ok(()))));
    let failed = reports(&out.effects);
    assert_eq!(failed.len(), 1, "{:?}", out.effects);
    assert_eq!(failed[0].task_id, "a");
    assert_eq!(failed[0].execution_id, execution);
    assert!(reason(&failed[0]).contains("replaced by a new generation"));
    assert!(out.effects.contains(&Effect::Detach { slot: 1 }));
    // The late exit report of generation 1 changes nothing.
    assert!(
        h.go(Input::SlotExited(proto::SlotExited {
            slot: 1,
            generation: 1,
            pid: 1,
            status: "x".into(),
            ..Default::default()
        }))
        .iter()
        .all(|e| !matches!(e, Effect::Report(_)))
    );
    // Generation 2 attaches and works.
    h.hello(1, 2).0.unwrap();
    assert_eq!(h.poll(), Some(1));
}

#[test]
fn an_old_or_unknown_slot_started_is_refused() {
    let mut h = Harness::new(1, true);
    h.started(1, 1).unwrap();
    h.started(1, 2).unwrap();
    assert_eq!(
        h.started(1, 1).unwrap_err().code(),
        tonic::Code::FailedPrecondition
    );
    assert_eq!(
        h.started(1, 0).unwrap_err().code(),
        tonic::Code::FailedPrecondition
    );
    assert_eq!(h.started(2, 1).unwrap_err().code(), tonic::Code::NotFound);
}

/// A control message holding the token but out of order (a stolen token used to jump ahead,
/// a replay) is refused and changes nothing: the live executor keeps its slot and its task,
/// and the supervisor's own next generation is still taken afterwards.
#[test]
fn slot_started_takes_generations_only_in_order() {
    let mut h = Harness::new(1, true);
    h.up(1);
    let (_, execution, _) = assignments(&h.deliver(&["a"])).remove(0);
    for (generation, token) in [
        (5, "forged"),
        (u64::MAX, "forged"),
        (1, "forged"),
        (0, ""),
        // A replay of the current generation's own announcement: it is attached already.
        (1, &*format!("{TOKEN}-1")),
    ] {
        let out = h.handle(Input::SlotStarted(proto::SlotStarted {
            slot: 1,
            generation,
            token: token.into(),
            pid: 0,
            body_version: 0,
        }));
        let Reply::SlotStarted(Err(status)) = out.reply else {
            panic!("generation {generation} was taken: {:?}", out.reply);
        };
        assert_eq!(status.code(), tonic::Code::FailedPrecondition);
        assert_eq!(
            status.message(),
            format!("slot 1 is at generation 1: it takes generation 2 next, not {generation}")
        );
        assert!(out.effects.is_empty(), "{:?}", out.effects);
    }
    // Generation 1 still runs its task and completes it.
    let done = h.complete(1, 1, "a", &execution);
    assert_eq!(reports(&done).len(), 1);
    assert_eq!(reports(&done)[0].result.status(), ResultStatus::Completed);
    // The supervisor's next generation is taken; its retry (same token, before the executor
    // attached) is answered as taken and changes nothing; another token is not.
    h.started(1, 2).unwrap();
    let retry = h.handle(Input::SlotStarted(proto::SlotStarted {
        slot: 1,
        generation: 2,
        token: format!("{TOKEN}-2"),
        pid: 0,
        body_version: 0,
    }));
    assert!(matches!(retry.reply, Reply::SlotStarted(Ok(()))));
    assert!(retry.effects.is_empty());
    assert!(matches!(
        started_with(&mut h, 1, 2, "forged"),
        Reply::SlotStarted(Err(_))
    ));
    h.hello(1, 2).0.unwrap();
    // Once attached, even the right token cannot announce generation 2 again.
    assert!(matches!(
        started_with(&mut h, 1, 2, &format!("{TOKEN}-2")),
        Reply::SlotStarted(Err(_))
    ));
    assert_eq!(h.poll(), Some(1));
}

#[test]
fn the_fence_answers_only_the_current_assignment_of_the_caller() {
    let mut h = Harness::new(2, true);
    h.up(2);
    let sent = assignments(&h.deliver(&["a"]));
    let (slot, execution, _) = &sent[0];
    let fence = |h: &mut Harness, slot: u32, token: String, execution: &str| match h
        .handle(Input::FenceTarget {
            credentials: proto::SlotCredentials {
                slot,
                generation: 1,
                token,
            },
            execution_id: execution.to_owned(),
        })
        .reply
    {
        Reply::Fence(r) => r,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        fence(&mut h, *slot, format!("{TOKEN}-1"), execution).unwrap(),
        "a"
    );
    let other = if *slot == 1 { 2 } else { 1 };
    assert_eq!(
        fence(&mut h, other, format!("{TOKEN}-1"), execution)
            .unwrap_err()
            .code(),
        tonic::Code::FailedPrecondition
    );
    assert_eq!(
        fence(&mut h, *slot, "stolen".into(), execution)
            .unwrap_err()
            .code(),
        tonic::Code::Unauthenticated
    );
}

#[test]
fn a_failed_send_fails_the_assignment() {
    let mut h = Harness::new(1, true);
    h.up(1);
    let (_, execution, _) = assignments(&h.deliver(&["a"])).remove(0);
    let failed = reports(&h.go(Input::SendFailed {
        slot: 1,
        generation: 1,
    }));
    assert_eq!(failed.len(), 1);
    assert!(reason(&failed[0]).contains(&execution));
}

#[test]
fn status_shows_each_slot() {
    let mut h = Harness::new(2, true);
    h.up(1);
    h.deliver(&["a"]);
    h.go(Input::Progress {
        slot: 1,
        generation: 1,
        progress: proto::Progress {
            execution_id: String::new(),
            phase: proto::Phase::Body as i32,
        },
    });
    let status = h.status();
    assert_eq!(status.slots[0].state, admin::SlotState::Busy as i32);
    assert_eq!(status.slots[0].task_id, "a");
    assert_eq!(status.slots[1].state, admin::SlotState::Waiting as i32);
}

/// An executor that starts bodies at dispatch sends no `Body` progress: the broker shows the
/// body phase from the assignment on. One that prepares first shows "preparing" until it
/// reports a phase, and a new generation says afresh which kind it is.
#[test]
fn the_phase_at_dispatch_is_what_the_executor_said_at_attach() {
    let mut h = Harness::new(2, true);
    h.started(1, 1).unwrap();
    h.hello_with(1, 1, true).0.unwrap();
    h.started(2, 1).unwrap();
    h.hello_with(2, 1, false).0.unwrap();
    h.deliver(&["a", "b"]);
    let status = h.status();
    assert!(
        status.slots.iter().all(|s| !s.task_id.is_empty()),
        "both busy"
    );
    assert_eq!(status.slots[0].phase, "body");
    assert_eq!(status.slots[1].phase, "preparing");
    let execution_id = h.status().slots[1].execution_id.clone();
    h.go(Input::Progress {
        slot: 2,
        generation: 1,
        progress: proto::Progress {
            execution_id,
            phase: proto::Phase::Body as i32,
        },
    });
    assert_eq!(h.status().slots[1].phase, "body");
}

#[test]
fn a_recycling_executor_reports_through_v1_is_stopped_and_its_exit_is_no_failure() {
    let mut h = Harness::new(1, true);
    h.up(1);
    let (_, execution, _) = assignments(&h.deliver(&["a"])).remove(0);
    let effects = h.complete_recycling(
        1,
        1,
        "a",
        &execution,
        "3 assignments reached --max-tasks-per-executor 3",
    );
    let done = reports(&effects);
    assert_eq!(done.len(), 1, "{effects:?}");
    assert_eq!(done[0].result.status(), ResultStatus::Completed);
    assert!(!done[0].use_v2, "no next task for a slot that is leaving");
    assert_eq!(done[0].slot, None);
    assert_eq!(stop_reasons(&effects), vec![(1, "recycle".to_owned())]);
    assert_eq!(h.counters.executors_recycled.get(), 1);
    assert_eq!(h.poll(), None, "a leaving slot takes no task");
    assert_eq!(h.status().slots[0].state, admin::SlotState::Stopping as i32);

    // The executor exits: its stream ends, then the supervisor reports the exit.
    let effects = h.go(Input::StreamEnded {
        slot: 1,
        generation: 1,
    });
    assert!(reports(&effects).is_empty(), "{effects:?}");
    let effects = h.go(Input::SlotExited(proto::SlotExited {
        slot: 1,
        generation: 1,
        pid: 1001,
        status: "exit status 75".into(),
        ..Default::default()
    }));
    assert!(reports(&effects).is_empty(), "{effects:?}");
    assert_eq!(
        h.counters.executor_exits.get(),
        0,
        "a recycled exit is no crash"
    );

    // The next generation takes tasks at once.
    h.started(1, 2).unwrap();
    let (r, effects) = h.hello(1, 2);
    r.unwrap();
    assert_eq!(grant(&effects), Some(1));
    h.go(Input::Polled {
        tasks: vec![task("b")],
        reserved: 1,
    });
    assert_eq!(h.counters.executors_recycled.get(), 1);

    // A crash of that generation still counts.
    h.go(Input::SlotExited(proto::SlotExited {
        slot: 1,
        generation: 2,
        pid: 1001,
        status: "signal 9 (SIGKILL)".into(),
        ..Default::default()
    }));
    assert_eq!(h.counters.executor_exits.get(), 1);
}

#[test]
fn a_drain_after_a_recycle_sends_no_second_stop() {
    let mut h = Harness::new(1, false);
    h.up(1);
    let (_, execution, _) = assignments(&h.deliver(&["a"])).remove(0);
    let effects = h.complete_recycling(
        1,
        1,
        "a",
        &execution,
        "resident memory 80MiB (executor and bodies) above --max-executor-memory 64MiB",
    );
    assert_eq!(reports(&effects).len(), 1);
    assert_eq!(stops(&effects), vec![1]);
    // A drain after it sends no second Stop.
    let effects = h.go(Input::Drain);
    assert!(stops(&effects).is_empty(), "{effects:?}");
    assert_eq!(h.counters.executors_recycled.get(), 1);
}
