//! Pause and resume polling (issue #26 item 2): no grant while paused, running tasks finish
//! and are reported through v1 (no next task), executors stay up, run once does not end, a
//! drain still drains.

use super::*;

impl Harness {
    fn pause(&mut self) -> (bool, Vec<Effect>) {
        let out = self.handle(Input::Pause);
        match out.reply {
            Reply::Pause { already, .. } => (already, out.effects),
            other => panic!("{other:?}"),
        }
    }

    fn resume(&mut self) -> (bool, Vec<Effect>) {
        let out = self.handle(Input::Resume);
        match out.reply {
            Reply::Resume(already) => (already, out.effects),
            other => panic!("{other:?}"),
        }
    }
}

fn paused(slots: u32) -> perago_core::capacity::Capacity {
    perago_core::capacity::Capacity {
        paused: true,
        ..perago_core::capacity::Capacity::fixed(slots)
    }
}

#[test]
fn a_paused_machine_grants_no_poll_until_resumed() {
    let mut h = Harness::new(2, true);
    h.up(2);
    let (already, _) = h.pause();
    assert!(!already);
    assert_eq!(h.poll(), None, "paused: the poller waits");
    let status = h.status();
    assert!(status.paused);
    assert!(status.paused_since_unix_ms > 0);
    assert!(!status.draining);
    assert_eq!(
        h.m.gauges.paused.load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    // Idempotent: the pause in force stays, with its start.
    let (already, effects) = h.pause();
    assert!(already && effects.is_empty(), "{effects:?}");
    assert_eq!(h.status().paused_since_unix_ms, status.paused_since_unix_ms);
    // The poll request waiting is granted at the resume.
    let (already, effects) = h.resume();
    assert!(!already);
    assert_eq!(grant(&effects), Some(2));
    let status = h.status();
    assert!(!status.paused);
    assert_eq!(status.paused_since_unix_ms, 0);
    assert_eq!(
        h.m.gauges.paused.load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    let (already, effects) = h.resume();
    assert!(already && effects.is_empty(), "{effects:?}");
}

#[test]
fn started_paused_polls_nothing_until_resumed() {
    let mut h = Harness::with_capacity(paused(1), true);
    assert!(h.status().paused);
    assert_eq!(
        h.m.gauges.paused.load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    h.up(1);
    assert_eq!(h.poll(), None);
    let (already, effects) = h.resume();
    assert!(!already);
    assert_eq!(grant(&effects), Some(1));
}

#[test]
fn running_tasks_finish_and_are_reported_through_v1_while_paused() {
    let mut h = Harness::new(2, true);
    h.up(2);
    let effects = h.deliver(&["a", "b"]);
    let running = assignments(&effects);
    assert_eq!(running.len(), 2);
    h.pause();
    assert_eq!(h.poll(), None);
    // A completion while paused is reported without asking update-v2 for a next task, and
    // frees its slot without a grant.
    let (slot, execution, task_id) = running[0].clone();
    let done = h.complete(slot, 1, &task_id, &execution);
    let sent = reports(&done);
    assert_eq!(sent.len(), 1);
    assert!(!sent[0].use_v2 && sent[0].slot.is_none(), "{:?}", sent[0]);
    assert_eq!(grant(&done), None);
    assert!(stops(&done).is_empty(), "executors stay up");
    h.go(Input::UpdateDone {
        slot: None,
        next_task: None,
    });
    // The other one too; nothing is stopped and nothing polled.
    let (slot, execution, task_id) = running[1].clone();
    let done = h.complete(slot, 1, &task_id, &execution);
    assert_eq!(reports(&done).len(), 1);
    assert_eq!(grant(&done), None);
    let states = h.states();
    assert_eq!(
        states,
        [admin::SlotState::Idle, admin::SlotState::Idle],
        "executors stay attached and idle"
    );
}

#[test]
fn a_next_task_already_on_its_way_runs_while_paused() {
    // update-v2 asked before the pause: the task it brings was taken from Conductor and runs.
    let mut h = Harness::new(1, true);
    h.up(1);
    let (_, execution, _) = assignments(&h.deliver(&["a"])).remove(0);
    let done = h.complete(1, 1, "a", &execution);
    assert!(reports(&done)[0].use_v2);
    h.pause();
    let next = h.go(Input::UpdateDone {
        slot: Some(1),
        next_task: Some(task("b")),
    });
    assert_eq!(assignments(&next).len(), 1, "{next:?}");
    assert!(
        next.iter().any(|e| matches!(e, Effect::StartLease { .. })),
        "its lease is extended"
    );
    // A poll in flight at the pause returns its tasks too: they run (here: held).
    assert!(hand_backs(&next).is_empty());
}

#[test]
fn a_drain_while_paused_drains() {
    let mut h = Harness::new(1, true);
    h.up(1);
    h.pause();
    assert_eq!(h.poll(), None);
    let drain = h.go(Input::Drain);
    assert_eq!(grant(&drain), Some(0), "the waiting poller is stopped");
    assert_eq!(stops(&drain), [1]);
    let end = h.go(Input::StreamEnded {
        slot: 1,
        generation: 1,
    });
    assert!(end.contains(&Effect::Drained));
}

#[test]
fn run_once_does_not_end_while_paused() {
    let mut h = Harness::with_capacity(once(1), true);
    h.up(1);
    let t0 = Instant::now();
    assert_eq!(h.poll(), Some(1));
    h.pause();
    // The poll in flight comes back empty after the pause: no evidence of an empty queue.
    h.go(Input::Polled {
        tasks: vec![],
        reserved: 1,
    });
    h.depth(0, t0, 0.0);
    h.depth(0, t0, 1.0);
    h.depth(0, t0, 2.0);
    assert!(!h.status().draining, "a paused run once waits");
    // Resumed: polling goes on, and an empty poll then a read of 0 end the run.
    let (_, effects) = h.resume();
    assert_eq!(grant(&effects), None, "no poll request waits");
    assert_eq!(h.poll(), Some(1));
    h.go(Input::Polled {
        tasks: vec![],
        reserved: 1,
    });
    h.depth(0, t0, 3.0);
    h.depth(0, t0, 4.0);
    assert!(h.status().draining);
}

#[test]
fn an_empty_poll_before_the_pause_is_forgotten_by_run_once() {
    let mut h = Harness::with_capacity(once(1), true);
    h.up(1);
    let t0 = Instant::now();
    assert_eq!(h.poll(), Some(1));
    h.go(Input::Polled {
        tasks: vec![],
        reserved: 1,
    });
    h.pause();
    h.depth(0, t0, 0.0);
    h.depth(0, t0, 1.0);
    assert!(!h.status().draining);
}

#[test]
fn a_pause_neither_retires_nor_adds_executors() {
    let mut h = Harness::with_capacity(adaptive(1, 3), true);
    let t0 = Instant::now();
    h.up(1);
    // A backlog: slots 2 and 3 are wanted and attach.
    let (_, execution, _) = assignments(&h.deliver(&["a"])).remove(0);
    h.depth(5, t0, 0.0);
    assert_eq!(h.wanted(), [1, 2, 3]);
    for slot in 2..=3 {
        h.started(slot, 1).unwrap();
        h.hello(slot, 1).0.unwrap();
    }
    h.complete(1, 1, "a", &execution);
    h.go(Input::UpdateDone {
        slot: Some(1),
        next_task: None,
    });
    h.pause();
    // Idle far longer than PERAGO_SCALE_DOWN_AFTER (2 s) while paused: nothing retired.
    for at in [1.0, 5.0, 10.0, 20.0] {
        let effects = h.depth(0, t0, at);
        assert!(stops(&effects).is_empty(), "{effects:?}");
    }
    assert_eq!(h.wanted(), [1, 2, 3]);
    // Nor does a backlog grow the count of a paused runtime: back to the minimum, pause, and
    // a deep queue adds nothing.
    h.resume();
    h.depth(0, t0, 21.0);
    let retired = h.depth(0, t0, 24.0);
    assert_eq!(stops(&retired).len(), 2, "{retired:?}");
    assert_eq!(h.wanted(), [1]);
    for slot in 2..=3 {
        h.go(Input::StreamEnded {
            slot,
            generation: 1,
        });
    }
    h.pause();
    h.depth(50, t0, 25.0);
    assert_eq!(
        h.wanted(),
        [1],
        "paused: no executor starts for tasks nobody polls"
    );
    // The pause's idle time does not count after the resume.
    h.resume();
    h.depth(50, t0, 26.0);
    assert_eq!(h.wanted(), [1, 2, 3]);
}

#[test]
fn the_watch_view_sees_a_pause_and_a_resume() {
    let mut h = Harness::new(1, true);
    h.up(1);
    let mut view = WatchView::default();
    h.m.update_watch_view(&mut view);
    assert!(!h.m.update_watch_view(&mut view));
    h.pause();
    assert!(h.m.update_watch_view(&mut view));
    assert!(!h.m.update_watch_view(&mut view));
    h.resume();
    assert!(h.m.update_watch_view(&mut view));
}
