//! `Admin.Scale`: the executor count changed live (issue #26 item 4).

use super::*;

impl Harness {
    fn scale(&mut self, min: u32, max: u32) -> (Result<(u32, u32), Status>, Vec<Effect>) {
        let out = self.handle(Input::Scale { min, max });
        match out.reply {
            Reply::Scale(r) => (r, out.effects),
            other => panic!("{other:?}"),
        }
    }

    fn range(&mut self) -> (u32, u32) {
        let c = self.status().capacity.unwrap();
        (c.min_executors, c.max_executors)
    }
}

#[test]
fn scaling_up_adds_slots_after_the_existing_ones_with_their_own_worker_ids() {
    let mut h = Harness::new(2, true);
    h.up(2);
    let (before, effects) = h.scale(4, 4);
    assert_eq!(before.unwrap(), (2, 2));
    assert!(stops(&effects).is_empty(), "{effects:?}");
    use admin::SlotState::{Idle, Waiting};
    assert_eq!(h.states(), [Idle, Idle, Waiting, Waiting]);
    assert_eq!(h.range(), (4, 4));
    let status = h.status();
    let ids: Vec<_> = status.slots.iter().map(|s| s.worker_id.as_str()).collect();
    assert_eq!(ids, ["t0001", "t0002", "t0003", "t0004"]);
    assert_eq!(status.capacity.unwrap().wanted_executors, 4);
    // The supervisor's executors for the new slots are taken as any first generation.
    for slot in [3, 4] {
        h.started(slot, 1).unwrap();
        assert_eq!(h.hello(slot, 1).0.unwrap(), (slot, 1));
    }
    assert_eq!(h.poll(), Some(4));
}

#[test]
fn scaling_down_retires_the_highest_slots_each_after_its_current_task() {
    let mut h = Harness::new(3, true);
    h.up(3);
    let run = assignments(&h.deliver(&["a", "b", "c"]));
    assert_eq!(run.len(), 3);
    let (before, effects) = h.scale(1, 1);
    assert_eq!(before.unwrap(), (3, 3));
    // Busy: nobody is stopped yet, nothing is dropped or failed.
    assert!(stops(&effects).is_empty(), "{effects:?}");
    assert!(reports(&effects).is_empty());
    assert_eq!(h.wanted(), [1]);
    assert_eq!(h.range(), (1, 1));
    use admin::SlotState::{Busy, Retired};
    assert_eq!(h.states(), [Busy, Busy, Busy]);
    // Slot 3 finishes: its result is reported (through v1: it takes no next task) and its
    // executor is told to stop.
    let (slot, exec, task) = run.iter().find(|(s, _, _)| *s == 3).unwrap().clone();
    let done = h.complete(slot, 1, &task, &exec);
    let reported = reports(&done);
    assert_eq!(reported.len(), 1);
    assert!(!reported[0].use_v2, "a retired slot takes no next task");
    assert_eq!(reported[0].result.status().as_str(), "COMPLETED");
    assert_eq!(stop_reasons(&done), [(3, "scale down".to_owned())]);
    // Slot 1 finishes: still wanted, it goes on (update-v2 may bring its next task).
    let (slot, exec, task) = run.iter().find(|(s, _, _)| *s == 1).unwrap().clone();
    let done = h.complete(slot, 1, &task, &exec);
    assert!(reports(&done)[0].use_v2);
    assert!(stops(&done).is_empty());
    // The retired executor exits: no failure, no executor exit counted; the slot stays empty.
    h.go(Input::StreamEnded {
        slot: 3,
        generation: 1,
    });
    let exit = h.go(Input::SlotExited(proto::SlotExited {
        slot: 3,
        generation: 1,
        pid: 1003,
        status: "exit status 0".into(),
        ..Default::default()
    }));
    assert!(reports(&exit).is_empty());
    assert_eq!(h.counters.executor_exits.get(), 0);
    assert!(h.m.exit_ack(3, 1).retired);
    assert_eq!(h.states()[2], Retired);
    // Slot 2 is still running its task.
    assert_eq!(h.states()[1], Busy);
}

#[test]
fn an_idle_retired_executor_stops_at_once_and_a_task_in_flight_goes_to_a_wanted_slot() {
    let mut h = Harness::new(2, true);
    h.up(2);
    assert_eq!(h.poll(), Some(2));
    let (_, effects) = h.scale(1, 1);
    assert_eq!(stops(&effects), [2]);
    // The poll granted for two brings two: one runs on slot 1, the other is held for it.
    let run = h.go(Input::Polled {
        tasks: vec![task("a"), task("b")],
        reserved: 2,
    });
    let a = assignments(&run);
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].0, 1);
    assert!(hand_backs(&run).is_empty());
    let done = h.complete(1, 1, "a", &a[0].1);
    assert_eq!(reports(&done).len(), 1);
    let next = h.go(Input::UpdateDone {
        slot: Some(1),
        next_task: None,
    });
    assert_eq!(assignments(&next)[0].0, 1, "the held task runs on slot 1");
}

#[test]
fn scaling_back_up_brings_a_retired_slot_back_at_its_next_generation() {
    let mut h = Harness::new(2, true);
    h.up(2);
    h.scale(1, 1).0.unwrap();
    // Its executor is still attached (stopping): it comes back once it has exited.
    h.scale(2, 2).0.unwrap();
    assert_eq!(h.wanted(), [1]);
    h.go(Input::StreamEnded {
        slot: 2,
        generation: 1,
    });
    h.go(Input::SlotExited(proto::SlotExited {
        slot: 2,
        generation: 1,
        pid: 1002,
        status: "exit status 0".into(),
        ..Default::default()
    }));
    assert_eq!(h.wanted(), [1, 2]);
    use admin::SlotState::Exited;
    assert_eq!(h.states()[1], Exited);
    h.started(2, 2).unwrap();
    assert_eq!(h.hello(2, 2).0.unwrap(), (2, 2));
    assert_eq!(h.status().slots[1].worker_id, "t0002");
}

#[test]
fn a_range_makes_a_fixed_runtime_adaptive_and_its_queue_is_read() {
    let mut h = Harness::new(1, true);
    h.up(1);
    let (r, effects) = h.scale(1, 3);
    r.unwrap();
    assert_eq!(depth_reads(&effects), [Duration::ZERO]);
    use admin::SlotState::{Idle, Retired};
    assert_eq!(h.states(), [Idle, Retired, Retired]);
    h.deliver(&["a"]);
    let t0 = Instant::now();
    h.depth(5, t0, 0.0);
    assert_eq!(h.wanted(), [1, 2, 3]);
    // Lowered to 1..2: slot 3 never comes back, whatever the backlog.
    h.scale(1, 2).0.unwrap();
    assert_eq!(h.wanted(), [1, 2]);
    h.depth(50, t0, 1.0);
    assert_eq!(h.wanted(), [1, 2]);
    assert_eq!(h.range(), (1, 2));
}

#[test]
fn a_bad_range_or_a_drain_is_refused_and_changes_nothing() {
    let mut h = Harness::new(2, true);
    h.up(2);
    for (min, max) in [(0, 2), (3, 2), (1, 10_000)] {
        let err = h.scale(min, max).0.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{min}..{max}");
        assert!(err.message().contains("-j"), "{}", err.message());
    }
    assert_eq!(h.range(), (2, 2));
    h.go(Input::Drain);
    let err = h.scale(4, 4).0.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert_eq!(h.range(), (2, 2));
    assert_eq!(h.states().len(), 2);
}
