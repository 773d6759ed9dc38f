//! Liveness: pings, stalled executors, late ticks.

use super::*;

#[test]
fn without_a_stall_timeout_nothing_is_pinged_or_killed() {
    let mut h = Harness::new(1, false);
    h.up(1);
    let start = Instant::now();
    for effects in ticks(&mut h, start, 0, 10) {
        assert!(effects.is_empty(), "{effects:?}");
    }
}

#[test]
fn the_welcome_carries_the_stall_timeout_and_ticks_ping_every_attached_executor() {
    let mut h = stall_harness(2);
    h.started(1, 1).unwrap();
    h.started(2, 1).unwrap();
    let (r, effects) = h.hello(1, 1);
    r.unwrap();
    let welcome = effects.iter().find_map(|e| match e {
        Effect::Send {
            message:
                proto::BrokerMessage {
                    message: Some(proto::broker_message::Message::Welcome(w)),
                },
            ..
        } => Some(w.clone()),
        _ => None,
    });
    assert_eq!(welcome.unwrap().stall_timeout_ms, 6000);
    // Slot 2 has not attached: only slot 1 is pinged, with a fresh sequence each time.
    let start = Instant::now();
    let effects = ticks(&mut h, start, 0, 2);
    assert_eq!(pinged(&effects[0]), vec![1]);
    assert_eq!(pinged(&effects[1]), vec![1]);
    let sequences: Vec<u64> = effects
        .iter()
        .flatten()
        .filter_map(|e| match e {
            Effect::Send {
                message:
                    proto::BrokerMessage {
                        message: Some(proto::broker_message::Message::Ping(p)),
                    },
                ..
            } => Some(p.sequence),
            _ => None,
        })
        .collect();
    assert_eq!(sequences, vec![1, 2]);
}

#[test]
fn an_executor_that_answers_is_never_judged_stalled() {
    let mut h = stall_harness(1);
    h.up(1);
    let start = Instant::now();
    for k in 0..30 {
        let effects = h.go(Input::Tick {
            now: start + STALL / 3 * k,
        });
        assert!(kills(&effects).is_empty(), "tick {k}: {effects:?}");
        assert_eq!(pinged(&effects), vec![1]);
        // Any message counts: pongs, or progress of a busy executor.
        h.go(Input::Pong {
            slot: 1,
            generation: 1,
        });
    }
    // A pong of another generation is no sign of life of this one.
    let (_, execution, _) = assignments(&h.deliver(&["a"])).remove(0);
    let start = start + STALL * 11;
    for k in 0..3 {
        h.go(Input::Tick {
            now: start + STALL / 3 * k,
        });
        h.go(Input::Pong {
            slot: 1,
            generation: 2,
        });
        h.go(Input::Progress {
            slot: 1,
            generation: 1,
            progress: proto::Progress {
                execution_id: execution.clone(),
                phase: proto::Phase::Body as i32,
            },
        });
    }
    let effects = h.go(Input::Tick {
        now: start + STALL / 3 * 3,
    });
    assert!(kills(&effects).is_empty(), "progress counts: {effects:?}");
}

#[test]
fn a_busy_executor_silent_for_the_timeout_is_killed_and_its_task_failed_not_poisoned() {
    // One crash would poison: the stall must not be counted as the task's doing.
    let mut h = stall_harness(1);
    h.m.capacity.poison_after = 1;
    h.up(1);
    let (_, execution, _) = assignments(&h.deliver(&["a"])).remove(0);
    let start = Instant::now();
    // Tick 0 starts its clock (it was heard: the hello); ticks 1 and 2 find it silent for
    // less than the timeout and ping it.
    for (k, effects) in ticks(&mut h, start, 0, 3).into_iter().enumerate() {
        assert!(kills(&effects).is_empty(), "tick {k}: {effects:?}");
        assert_eq!(pinged(&effects), vec![1], "tick {k}");
    }
    // Tick 3: silent for the whole timeout.
    let effects = h.go(Input::Tick { now: start + STALL });
    assert_eq!(kills(&effects), vec![(1, 1)], "{effects:?}");
    assert!(effects.contains(&Effect::Detach { slot: 1 }), "{effects:?}");
    assert!(pinged(&effects).is_empty());
    let failed = reports(&effects);
    assert_eq!(failed.len(), 1, "{effects:?}");
    // The report ends the execution's lease (the actor stops it with the report).
    assert_eq!(failed[0].execution_id, execution);
    assert_eq!(failed[0].task_id, "a");
    assert_eq!(failed[0].result.status(), ResultStatus::Failed);
    assert!(!failed[0].use_v2);
    assert_eq!(
        reason(&failed[0]),
        format!(
            "executor t0001 (pid 1001, generation 1) did not answer for 6s (PERAGO_STALL_TIMEOUT=6s); killed while running execution {execution}"
        )
    );
    assert_eq!(h.counters.tasks_poisoned.get(), 0);
    assert!(h.m.stalled_generation(1, 1));
    // Its stream end and its exit report (the SIGKILL) find nothing more to fail.
    assert!(
        reports(&h.go(Input::StreamEnded {
            slot: 1,
            generation: 1
        }))
        .is_empty()
    );
    assert!(
        reports(&h.go(Input::StreamGraceOver {
            slot: 1,
            generation: 1
        }))
        .is_empty()
    );
    let exited = h.go(Input::SlotExited(proto::SlotExited {
        slot: 1,
        generation: 1,
        pid: 1001,
        status: "signal 9 (SIGKILL)".into(),
        ..Default::default()
    }));
    assert!(reports(&exited).is_empty(), "{exited:?}");
    assert_eq!(h.counters.tasks_poisoned.get(), 0);
    // A late completion of the killed execution is rejected; the killed generation cannot
    // attach again; the slot is not free until the next generation attaches.
    h.complete(1, 1, "a", &execution);
    assert_eq!(h.counters.rejected_completions.get(), 1);
    let (again, _) = h.hello(1, 1);
    assert_eq!(again.unwrap_err().code(), tonic::Code::Unauthenticated);
    assert!(grant(&h.go(Input::PollRequest)).is_none());
    h.started(1, 2).unwrap();
    assert!(!h.m.stalled_generation(1, 2));
    let (attached, effects) = h.hello(1, 2);
    attached.unwrap();
    assert_eq!(grant(&effects), Some(1), "the waiting poll: {effects:?}");
}

#[test]
fn an_idle_executor_silent_for_the_timeout_is_killed_with_nothing_to_report() {
    let mut h = stall_harness(2);
    h.up(2);
    let start = Instant::now();
    ticks(&mut h, start, 0, 1);
    for k in 1..=2 {
        h.go(Input::Tick {
            now: start + STALL / 3 * k,
        });
        // Slot 2 answers, slot 1 does not.
        h.go(Input::Pong {
            slot: 2,
            generation: 1,
        });
    }
    let effects = h.go(Input::Tick { now: start + STALL });
    assert_eq!(kills(&effects), vec![(1, 1)], "{effects:?}");
    assert_eq!(pinged(&effects), vec![2]);
    assert!(reports(&effects).is_empty());
    assert_eq!(h.counters.executor_exits.get(), 1);
    assert_eq!(h.status().slots[0].state, admin::SlotState::Waiting as i32);
}

#[test]
fn a_late_tick_judges_nobody_on_the_brokers_own_silence() {
    let mut h = stall_harness(1);
    h.up(1);
    let start = Instant::now();
    ticks(&mut h, start, 0, 2);
    // The broker was stopped for a minute: the executor's pongs are still queued behind
    // this tick. Nobody is killed; the clock starts over.
    let resumed = start + Duration::from_secs(60);
    let effects = h.go(Input::Tick { now: resumed });
    assert!(kills(&effects).is_empty(), "{effects:?}");
    assert_eq!(pinged(&effects), vec![1]);
    // Silent from then on: killed a whole timeout after the resumption, not before.
    for k in 1..3 {
        let effects = h.go(Input::Tick {
            now: resumed + STALL / 3 * k,
        });
        assert!(kills(&effects).is_empty(), "{k}: {effects:?}");
    }
    let effects = h.go(Input::Tick {
        now: resumed + STALL,
    });
    assert_eq!(kills(&effects), vec![(1, 1)]);
}
