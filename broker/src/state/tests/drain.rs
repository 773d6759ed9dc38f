//! The drain: polls in flight, held tasks, stopping executors, completion.

use super::*;

/// A drain that starts while a long poll is in flight waits for it and runs what it brings;
/// only then are the idle executors stopped, and the drain completes once all is reported.
#[test]
fn drain_with_a_poll_in_flight_runs_what_the_poll_returns() {
    let mut h = Harness::new(2, true);
    h.up(2);
    let granted = h.poll().unwrap();
    assert_eq!(granted, 2);
    let drain = h.handle(Input::Drain);
    assert!(matches!(drain.reply, Reply::Drain(false)));
    assert!(drain.effects.contains(&Effect::DisableV2));
    assert!(
        stops(&drain.effects).is_empty(),
        "idle slots wait for the poll: {:?}",
        drain.effects
    );
    let effects = h.go(Input::Polled {
        tasks: vec![task("a")],
        reserved: granted,
    });
    let sent = assignments(&effects);
    assert_eq!(sent.len(), 1, "{effects:?}");
    assert!(hand_backs(&effects).is_empty());
    let busy = sent[0].0;
    let idle = 3 - busy;
    assert_eq!(
        stops(&effects),
        [idle],
        "the idle slot is stopped after the dispatch"
    );
    // The poller asks again: it is told to stop.
    assert_eq!(h.poll(), Some(0));
    // The idle executor leaves.
    h.go(Input::StreamEnded {
        slot: idle,
        generation: 1,
    });
    let effects = h.complete(busy, 1, "a", &sent[0].1);
    let done = reports(&effects);
    assert!(!done[0].use_v2, "updates go through v1 while draining");
    assert_eq!(
        stops(&effects),
        [busy],
        "stopped once its assignment is done"
    );
    let effects = h.go(Input::UpdateDone {
        slot: None,
        next_task: None,
    });
    assert!(
        !effects.contains(&Effect::Drained),
        "the busy executor is still attached"
    );
    let effects = h.go(Input::StreamEnded {
        slot: busy,
        generation: 1,
    });
    assert!(effects.contains(&Effect::Drained), "{effects:?}");
}

#[test]
fn drain_when_idle_stops_everyone_and_completes() {
    let mut h = Harness::new(2, true);
    h.up(2);
    let drain = h.go(Input::Drain);
    assert_eq!(stops(&drain), [1, 2]);
    assert!(matches!(h.handle(Input::Drain).reply, Reply::Drain(true)));
    h.go(Input::StreamEnded {
        slot: 1,
        generation: 1,
    });
    let effects = h.go(Input::StreamEnded {
        slot: 2,
        generation: 1,
    });
    assert!(effects.contains(&Effect::Drained));
    assert!(h.status().draining);
}

#[test]
fn drain_while_awaiting_update_v2s_next_task_runs_it() {
    let mut h = Harness::new(1, true);
    h.up(1);
    let (_, execution, _) = assignments(&h.deliver(&["a"])).remove(0);
    h.complete(1, 1, "a", &execution);
    let drain = h.go(Input::Drain);
    assert!(stops(&drain).is_empty(), "the slot waits for its next task");
    let effects = h.go(Input::UpdateDone {
        slot: Some(1),
        next_task: Some(task("b")),
    });
    assert_eq!(assignments(&effects).len(), 1);
    assert!(hand_backs(&effects).is_empty());
}

#[test]
fn drain_hands_back_held_tasks_only_when_no_executor_is_left() {
    let mut h = Harness::new(1, true);
    h.up(1);
    h.next_task_for_a_dead_slot("gone");
    let effects = h.go(Input::Drain);
    assert_eq!(hand_backs(&effects), ["b"], "{effects:?}");
    assert!(
        effects
            .iter()
            .any(|e| matches!(e, Effect::StopLease { .. }))
    );
    let effects = h.go(Input::UpdateDone {
        slot: None,
        next_task: None,
    });
    assert!(effects.contains(&Effect::Drained));
}

#[test]
fn a_slot_a_drain_stopped_before_its_executor_attached_is_told_on_attach() {
    let mut h = Harness::new(1, true);
    h.started(1, 1).unwrap();
    let drain = h.go(Input::Drain);
    assert!(stops(&drain).is_empty(), "nothing attached to tell");
    let (attached, effects) = h.hello(1, 1);
    attached.unwrap();
    assert_eq!(stops(&effects), [1]);
}
