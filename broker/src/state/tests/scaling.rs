//! Memory admission and the adaptive executor count.

use super::*;

#[test]
fn admission_closed_withholds_polls_and_reopening_grants_the_waiting_one() {
    let mut h = with_min_free_memory(2, GIB);
    h.go(Input::Memory { available: 2 * GIB });
    h.up(2);
    assert_eq!(h.poll(), Some(2), "open: polls as before");
    h.go(Input::Polled {
        tasks: vec![task("a")],
        reserved: 2,
    });
    // Memory drops: the next poll request waits, counted once however many inputs pass.
    h.go(Input::Memory {
        available: 812 << 20,
    });
    assert_eq!(h.poll(), None);
    assert_eq!(h.counters.polls_withheld.get(), 1);
    for _ in 0..3 {
        assert_eq!(grant(&h.go(Input::Memory { available: GIB - 1 })), None);
    }
    h.go(Input::Memory {
        available: 812 << 20,
    });
    assert_eq!(h.counters.polls_withheld.get(), 1);
    let status = h.status();
    let capacity = status.capacity.unwrap();
    assert!(!capacity.admission_open);
    assert_eq!(
        capacity.admission_reason,
        "available memory 812MiB is below PERAGO_MIN_FREE_MEMORY 1GiB"
    );
    assert_eq!(capacity.available_memory_bytes, 812 << 20);
    assert_eq!(status.counters.unwrap().polls_withheld, 1);
    assert_eq!(
        h.m.gauges
            .admission_open
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    // The task already received runs on: it completes and reports.
    let status = h.status();
    let running = &status.slots.iter().find(|s| s.task_id == "a").unwrap();
    let effects = h.complete(running.slot, 1, "a", &running.execution_id.clone());
    assert_eq!(reports(&effects).len(), 1);
    // Memory is back: the waiting poll is granted for every free slot.
    let effects = h.go(Input::Memory { available: GIB });
    assert_eq!(grant(&effects), Some(1), "{effects:?}");
    let capacity = h.status().capacity.unwrap();
    assert!(capacity.admission_open);
    assert_eq!(capacity.admission_reason, "");
    // A second request withheld is counted again.
    h.go(Input::Polled {
        tasks: vec![],
        reserved: 1,
    });
    h.go(Input::Memory { available: 0 });
    assert_eq!(h.poll(), None);
    assert_eq!(h.counters.polls_withheld.get(), 2);
}

#[test]
fn a_poll_waiting_for_a_slot_is_not_counted_as_withheld_by_memory() {
    let mut h = with_min_free_memory(1, GIB);
    h.go(Input::Memory { available: 0 });
    assert_eq!(h.poll(), None, "no slot attached");
    assert_eq!(h.counters.polls_withheld.get(), 0);
    h.up(1);
    assert_eq!(h.counters.polls_withheld.get(), 1, "a slot is free now");
    // A drain stops the waiting poller as usual.
    assert_eq!(grant(&h.go(Input::Drain)), Some(0));
}

#[test]
fn without_a_minimum_memory_is_only_reported() {
    let mut h = Harness::new(1, true);
    h.up(1);
    h.go(Input::Memory { available: 1 });
    assert_eq!(h.poll(), Some(1));
    let capacity = h.status().capacity.unwrap();
    assert!(capacity.admission_open);
    assert_eq!(capacity.available_memory_bytes, 1);
    assert_eq!(h.counters.polls_withheld.get(), 0);
}

#[test]
fn an_adaptive_runtime_grows_under_a_backlog_up_to_its_maximum() {
    let mut h = Harness::with_capacity(adaptive(1, 4), true);
    h.up(1);
    use admin::SlotState::{Busy, Retired, Waiting};
    assert_eq!(
        h.states()[1..],
        [Retired, Retired, Retired],
        "not wanted yet"
    );
    h.deliver(&["a"]);
    let t0 = Instant::now();
    // Two tasks wait and the one slot is busy: two slots more.
    h.depth(2, t0, 0.0);
    assert_eq!(h.wanted(), [1, 2, 3]);
    assert_eq!(h.counters.scale_ups.get(), 2);
    assert_eq!(h.states(), [Busy, Waiting, Waiting, Retired]);
    let capacity = h.status().capacity.unwrap();
    assert_eq!((capacity.wanted_executors, capacity.queue_depth), (3, 2));
    // Their executors are starting: the same backlog asks for nothing more.
    h.depth(2, t0, 1.0);
    assert_eq!(h.wanted(), [1, 2, 3]);
    for slot in [2, 3] {
        h.started(slot, 1).unwrap();
        h.hello(slot, 1).0.unwrap();
    }
    assert_eq!(assignments(&h.deliver(&["b", "c"])).len(), 2);
    // A large backlog with every slot busy: up to the maximum, not beyond.
    h.depth(10, t0, 2.0);
    assert_eq!(h.wanted(), [1, 2, 3, 4]);
    h.started(4, 1).unwrap();
    h.hello(4, 1).0.unwrap();
    h.deliver(&["d"]);
    h.depth(10, t0, 3.0);
    assert_eq!(h.wanted(), [1, 2, 3, 4]);
    assert_eq!(h.counters.scale_ups.get(), 3);
    assert_eq!(h.status().capacity.unwrap().wanted_executors, 4);
}

#[test]
fn no_slot_is_added_while_admission_is_closed() {
    let mut h = Harness::with_capacity(adaptive(1, 4), true);
    h.up(1);
    h.deliver(&["a"]);
    h.m.admission_open = false;
    let t0 = Instant::now();
    h.depth(5, t0, 0.0);
    assert_eq!(h.wanted(), [1]);
    h.m.admission_open = true;
    h.depth(5, t0, 1.0);
    assert_eq!(h.wanted(), [1, 2, 3, 4]);
}

#[test]
fn idle_slots_are_retired_after_the_delay_down_to_the_minimum_and_their_exit_is_clean() {
    let mut h = Harness::with_capacity(adaptive(1, 3), false);
    h.up(1);
    let (_, a, _) = assignments(&h.deliver(&["a"])).remove(0);
    let t0 = Instant::now();
    h.depth(2, t0, 0.0);
    for slot in [2, 3] {
        h.started(slot, 1).unwrap();
        h.hello(slot, 1).0.unwrap();
    }
    h.complete(1, 1, "a", &a);
    h.go(Input::UpdateDone {
        slot: None,
        next_task: None,
    });
    // Every slot free from 0.5 s on; retired 2 s later, highest first, slot 1 kept.
    assert!(stops(&h.depth(0, t0, 0.5)).is_empty());
    assert!(stops(&h.depth(0, t0, 2.0)).is_empty());
    let retire = h.depth(0, t0, 2.5);
    assert_eq!(stops(&retire), [3, 2]);
    let reason = retire.iter().find_map(|e| match e {
        Effect::Send {
            message:
                proto::BrokerMessage {
                    message: Some(proto::broker_message::Message::Stop(stop)),
                },
            ..
        } => Some(stop.reason.clone()),
        _ => None,
    });
    assert_eq!(reason.as_deref(), Some("scale down"));
    assert_eq!(h.wanted(), [1]);
    assert_eq!(h.counters.scale_downs.get(), 2);
    assert_eq!(h.status().capacity.unwrap().wanted_executors, 1);
    // Polls ask for the one free wanted slot, and what they bring never goes to a retiring one.
    assert_eq!(h.poll(), Some(1));
    let run = h.go(Input::Polled {
        tasks: vec![task("b")],
        reserved: 1,
    });
    assert_eq!(assignments(&run)[0].0, 1);
    // The retired executors exit: no failure, no executor exit counted.
    h.go(Input::StreamEnded {
        slot: 3,
        generation: 1,
    });
    let exit = h.go(Input::SlotExited(proto::SlotExited {
        slot: 2,
        generation: 1,
        pid: 1002,
        status: "exit status 0".into(),
        ..Default::default()
    }));
    assert!(reports(&exit).is_empty());
    h.go(Input::StreamEnded {
        slot: 2,
        generation: 1,
    });
    assert_eq!(h.counters.executor_exits.get(), 0);
    use admin::SlotState::{Busy, Exited, Retired, Waiting};
    assert_eq!(h.states(), [Busy, Retired, Retired]);
    // Not below the minimum, however long slot 1 idles.
    let b = assignments(&run).remove(0).1;
    h.complete(1, 1, "b", &b);
    h.go(Input::UpdateDone {
        slot: None,
        next_task: None,
    });
    h.depth(0, t0, 3.0);
    assert!(stops(&h.depth(0, t0, 60.0)).is_empty());
    assert_eq!(h.wanted(), [1]);
    // A backlog brings a retired slot back; it keeps its worker id, at its next generation.
    h.deliver(&["c"]);
    h.depth(1, t0, 61.0);
    assert_eq!(h.wanted(), [1, 2]);
    assert_eq!(h.states(), [Busy, Exited, Retired]);
    assert_eq!(h.states().len(), 3);
    h.started(2, 2).unwrap();
    assert_eq!(h.states()[1], Waiting);
    assert_eq!(h.hello(2, 2).0.unwrap(), (2, 2));
    assert_eq!(h.status().slots[1].worker_id, "t0002");
}

#[test]
fn a_slot_that_takes_a_task_is_not_retired() {
    let mut h = Harness::with_capacity(adaptive(1, 2), false);
    h.up(1);
    let (_, a, _) = assignments(&h.deliver(&["a"])).remove(0);
    let t0 = Instant::now();
    h.depth(1, t0, 0.0);
    h.started(2, 1).unwrap();
    h.hello(2, 1).0.unwrap();
    h.complete(1, 1, "a", &a);
    h.go(Input::UpdateDone {
        slot: None,
        next_task: None,
    });
    h.depth(0, t0, 0.5);
    // Both slots take a task at 1.5 s; slot 2's ends at 2 s.
    let run = assignments(&h.deliver(&["b", "c"]));
    let (slot, c, _) = run.iter().find(|(_, _, id)| id == "c").unwrap().clone();
    assert_eq!(slot, 2);
    h.complete(2, 1, "c", &c);
    h.go(Input::UpdateDone {
        slot: None,
        next_task: None,
    });
    // Free since the read at 2.6 s: 2 s of idleness only at 4.6 s.
    assert!(stops(&h.depth(0, t0, 2.6)).is_empty());
    assert!(stops(&h.depth(0, t0, 4.0)).is_empty());
    assert_eq!(stops(&h.depth(0, t0, 4.6)), [2]);
    assert_eq!(h.wanted(), [1]);
}

#[test]
fn a_fixed_runtime_neither_reads_the_queue_nor_scales() {
    let mut h = Harness::new(2, true);
    let effects = h.go(Input::PollRequest);
    assert!(
        !effects
            .iter()
            .any(|e| matches!(e, Effect::ReadQueueDepth { .. })),
        "{effects:?}"
    );
    assert_eq!(h.wanted(), [1, 2]);
}

#[test]
fn an_executor_attached_to_a_slot_not_wanted_gets_no_task_and_is_stopped() {
    let mut h = Harness::with_capacity(adaptive(1, 2), true);
    h.up(1);
    // A start that raced a retirement: slot 2 attaches while not wanted.
    h.started(2, 1).unwrap();
    h.hello(2, 1).0.unwrap();
    assert_eq!(h.poll(), Some(1), "only the wanted slot is free");
    let effects = h.go(Input::Polled {
        tasks: vec![task("a"), task("b")],
        reserved: 1,
    });
    assert_eq!(
        assignments(&effects)
            .iter()
            .map(|(slot, _, _)| *slot)
            .collect::<Vec<_>>(),
        [1]
    );
    let t0 = Instant::now();
    // The backlog (b, held) cannot take slot 2 back while its executor is attached.
    let stop = h.depth(0, t0, 0.0);
    assert_eq!(stops(&stop), [2]);
    assert_eq!(h.wanted(), [1]);
    assert_eq!(h.counters.scale_downs.get(), 0, "nothing was retired");
}
