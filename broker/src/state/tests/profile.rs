//! Admission from the type's observed profile (issue #27 item 3): `PERAGO_MEMORY_HEADROOM`
//! against the observed peak of every task in flight and the next, and `--once
//! --max-runtime` against the observed p95 duration.

use super::*;

const MIB: u64 = 1 << 20;

fn with_headroom(capacity: perago_core::capacity::Capacity, headroom: u64) -> Harness {
    let mut capacity = capacity;
    capacity.memory_headroom = Some(headroom);
    Harness::with_capacity(capacity, true)
}

fn with_max_runtime(slots: u32, max: Duration) -> Harness {
    let mut capacity = once(slots);
    capacity.max_runtime = Some(max);
    Harness::with_capacity(capacity, true)
}

/// The effects' one report, and whether it asks update-v2 for a next task.
fn report_v2(effects: &[Effect]) -> bool {
    let reports = reports(effects);
    assert_eq!(reports.len(), 1, "{effects:?}");
    reports[0].use_v2
}

#[test]
fn the_headroom_runs_one_task_at_a_time_until_a_peak_is_observed_then_by_the_peak() {
    // A 600 MiB cgroup with 520 MiB available, 64 MiB headroom, two slots.
    let mut h = with_headroom(perago_core::capacity::Capacity::fixed(2), 64 * MIB);
    h.go(Input::Memory {
        available: 520 * MIB,
    });
    h.up(2);
    assert_eq!(
        h.poll(),
        Some(1),
        "no peak observed yet: one task at a time"
    );
    let (slot, a, _) = assignments(&h.go(Input::Polled {
        tasks: vec![task("a")],
        reserved: 1,
    }))
    .remove(0);
    // Slot 2 is free, but one task of unknown peak is in flight.
    assert_eq!(h.poll(), None);
    assert_eq!(h.counters.polls_withheld.get(), 1);
    let capacity = h.status().capacity.unwrap();
    assert!(!capacity.admission_open);
    assert_eq!(
        capacity.admission_reason,
        "PERAGO_MEMORY_HEADROOM: one task at a time until a peak is observed (1 in flight)"
    );
    assert_eq!(capacity.memory_headroom_bytes, 64 * MIB);
    // It peaked at 400 MiB: 520 − 64 covers one more, so update-v2 may bring the next.
    h.advance(Duration::from_secs(2));
    let effects = h.complete_measured(slot, 1, "a", &a, "", 400 * MIB);
    assert!(report_v2(&effects));
    let capacity = h.status().capacity.unwrap();
    assert_eq!(capacity.profile_peak_memory_bytes, 400 * MIB);
    assert_eq!(capacity.profile_executions, 1);
    assert_eq!(capacity.profile_duration_mean_ms, 2000);
    assert_eq!(capacity.profile_duration_p95_ms, 2000);
    let effects = h.go(Input::UpdateDone {
        slot: Some(slot),
        next_task: Some(task("b")),
    });
    let (slot_b, b, _) = assignments(&effects).remove(0);
    assert_eq!(slot_b, slot);
    // One 400 MiB task in flight, counted at its whole peak though available memory does
    // not show it yet: no second one beside it.
    assert_eq!(
        grant(&h.go(Input::Memory {
            available: 520 * MIB
        })),
        None
    );
    let capacity = h.status().capacity.unwrap();
    assert!(!capacity.admission_open);
    assert_eq!(
        capacity.admission_reason,
        "available memory 520MiB minus PERAGO_MEMORY_HEADROOM 64MiB does not cover the observed peak 400MiB for 2 task(s) (1 in flight and the next)"
    );
    assert_eq!(
        h.m.gauges
            .memory_room
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    // Grown to its peak: still none.
    assert_eq!(
        grant(&h.go(Input::Memory {
            available: 120 * MIB
        })),
        None
    );
    // The completion leaves too little for its next through update-v2: v1, slot free.
    let effects = h.complete_measured(slot, 1, "b", &b, "", 400 * MIB);
    assert!(!report_v2(&effects), "available memory is still 120 MiB");
    h.go(Input::UpdateDone {
        slot: None,
        next_task: None,
    });
    // Memory is back: one task, not two, though both slots are free.
    assert_eq!(
        grant(&h.go(Input::Memory {
            available: 520 * MIB
        })),
        Some(1)
    );
    // With room for two beside nothing in flight, two.
    h.go(Input::Polled {
        tasks: vec![],
        reserved: 1,
    });
    h.go(Input::Memory {
        available: 900 * MIB,
    });
    h.m.poll_sparse = false;
    assert_eq!(h.poll(), Some(2));
}

#[test]
fn a_small_peak_leaves_room_for_every_slot_and_the_floor_still_binds() {
    let mut capacity = perago_core::capacity::Capacity::fixed(4);
    capacity.min_free_memory = Some(100 * MIB);
    let mut h = with_headroom(capacity, 64 * MIB);
    h.go(Input::Memory {
        available: 120 * MIB,
    });
    h.up(4);
    let (slot, a, _) = assignments(&h.deliver(&["a"])).remove(0);
    let effects = h.complete_measured(slot, 1, "a", &a, "", 5 * MIB);
    assert!(report_v2(&effects));
    h.go(Input::UpdateDone {
        slot: Some(slot),
        next_task: None,
    });
    // 120 − 64 = 56 MiB: room for 11 tasks of 5 MiB, so every free slot is polled for.
    h.m.poll_sparse = false;
    assert_eq!(h.poll(), Some(4));
    h.go(Input::Polled {
        tasks: vec![],
        reserved: 4,
    });
    // Below PERAGO_MIN_FREE_MEMORY the floor closes admission whatever the headroom says.
    h.m.poll_sparse = false;
    assert_eq!(
        grant(&h.go(Input::Memory {
            available: 90 * MIB
        })),
        None
    );
    let reason = h.status().capacity.unwrap().admission_reason;
    assert_eq!(
        reason,
        "available memory 90MiB is below PERAGO_MIN_FREE_MEMORY 100MiB"
    );
}

#[test]
fn scaling_up_respects_the_headroom() {
    let mut h = with_headroom(adaptive(1, 4), 64 * MIB);
    h.go(Input::Memory {
        available: 10 * GIB,
    });
    h.up(1);
    h.deliver(&["a"]);
    let t0 = Instant::now();
    // No peak observed and one task in flight: no slot is added for the backlog.
    h.depth(5, t0, 0.0);
    assert_eq!(h.wanted(), [1]);
    // Without the headroom the same backlog adds three.
    let mut plain = Harness::with_capacity(adaptive(1, 4), true);
    plain.up(1);
    plain.deliver(&["a"]);
    plain.depth(5, t0, 0.0);
    assert_eq!(plain.wanted(), [1, 2, 3, 4]);
}

#[test]
fn max_runtime_stops_polling_once_the_p95_exceeds_the_time_left() {
    let mut h = with_max_runtime(1, Duration::from_secs(10));
    h.up(1);
    let capacity = h.status().capacity.unwrap();
    assert_eq!(capacity.max_runtime_ms, 10_000);
    assert_eq!(capacity.time_left_ms, 10_000);
    // Nothing observed yet: the first task is polled.
    let (_, a, _) = assignments(&h.deliver(&["a"])).remove(0);
    h.advance(Duration::from_secs(3));
    // 3 s observed, 7 s left: the next comes through update-v2.
    assert!(report_v2(&h.complete(1, 1, "a", &a)));
    let (_, b, _) = assignments(&h.go(Input::UpdateDone {
        slot: Some(1),
        next_task: Some(task("b")),
    }))
    .remove(0);
    h.advance(Duration::from_secs(3));
    assert!(report_v2(&h.complete(1, 1, "b", &b)));
    let (_, c, _) = assignments(&h.go(Input::UpdateDone {
        slot: Some(1),
        next_task: Some(task("c")),
    }))
    .remove(0);
    assert!(!h.status().draining);
    // At 9 s: 1 s left, p95 3 s. The completion asks for no next task, and the run drains.
    h.advance(Duration::from_secs(3));
    let effects = h.complete(1, 1, "c", &c);
    assert!(!report_v2(&effects), "{effects:?}");
    assert_eq!(stops(&effects), [1], "the idle executor is told to stop");
    let status = h.status();
    assert!(status.draining);
    let capacity = status.capacity.unwrap();
    assert_eq!(capacity.time_left_ms, 1000);
    assert_eq!(capacity.profile_duration_p95_ms, 3000);
    assert_eq!(
        capacity.admission_reason,
        "--max-runtime 10s: the observed p95 duration 3s exceeds the 1s left"
    );
    assert_eq!(grant(&h.go(Input::PollRequest)), Some(0), "no more polls");
    h.go(Input::UpdateDone {
        slot: None,
        next_task: None,
    });
    let end = h.go(Input::StreamEnded {
        slot: 1,
        generation: 1,
    });
    assert!(end.contains(&Effect::Drained));
}

#[test]
fn a_running_task_finishes_past_the_point_of_no_more_polls() {
    let mut h = with_max_runtime(2, Duration::from_secs(10));
    h.up(2);
    // Two 4 s tasks, the second dispatched later.
    let (_, a, _) = assignments(&h.deliver(&["a"])).remove(0);
    h.advance(Duration::from_secs(3));
    let (_, b, _) = assignments(&h.deliver(&["b"])).remove(0);
    h.advance(Duration::from_secs(4));
    // At 7 s: a took 7 s, more than the 3 s left: drains, b (running) is not cut.
    let effects = h.complete(1, 1, "a", &a);
    assert!(!report_v2(&effects));
    assert!(h.status().draining);
    // Slot 2 is told to stop once its task is done (a stop to a busy executor waits for it).
    assert_eq!(stops(&effects), [2, 1]);
    h.advance(Duration::from_secs(1));
    let effects = h.complete(2, 1, "b", &b);
    assert_eq!(reports(&effects).len(), 1, "b is reported");
}

#[test]
fn the_deadline_drains_a_run_that_observed_nothing() {
    let mut h = with_max_runtime(1, Duration::from_secs(10));
    h.up(1);
    let t0 = Instant::now();
    // Empty polls with tasks said to wait (no empty queue): the run goes on.
    h.go(Input::Polled {
        tasks: vec![],
        reserved: 1,
    });
    h.depth(3, t0, 0.0);
    assert!(!h.status().draining);
    h.advance(Duration::from_secs(10));
    let effects = h.depth(3, t0, 10.0);
    assert!(h.status().draining, "{effects:?}");
    assert_eq!(
        h.status().capacity.unwrap().admission_reason,
        "--max-runtime 10s: the deadline has come"
    );
    assert_eq!(stops(&effects), [1]);
}
