//! `Control.RollBody`: a new body version rolls (issue #26 item 4). Each live generation of an
//! older version is recycled at its first safe moment: nothing is dropped, no lease lapses,
//! no retry is burned.

use super::*;

impl Harness {
    /// The supervisor announces `slot`'s `generation` at `body_version`.
    fn started_at(&mut self, slot: u32, generation: u64, body_version: u32) {
        let out = self.handle(Input::SlotStarted(proto::SlotStarted {
            slot,
            generation,
            token: format!("{TOKEN}-{generation}"),
            pid: 0,
            body_version,
        }));
        assert!(
            matches!(out.reply, Reply::SlotStarted(Ok(()))),
            "{:?}",
            out.reply
        );
    }

    fn roll(&mut self, body_version: u32) -> Vec<Effect> {
        self.go(Input::Roll { body_version })
    }

    /// The supervisor reaped `slot`'s `generation` (it exited as recycled).
    fn recycled_exit(&mut self, slot: u32, generation: u64) -> proto::SlotExitedAck {
        self.go(Input::StreamEnded { slot, generation });
        self.go(Input::SlotExited(proto::SlotExited {
            slot,
            generation,
            pid: 1000 + slot,
            status: "exit status 75".into(),
            exit_code: Some(perago_core::recycle::EXIT_RECYCLED),
            ..Default::default()
        }));
        self.m.exit_ack(slot, generation)
    }

    /// `perago_body_version` and `perago_body_version_oldest`.
    fn body_gauges(&self) -> (u64, u64) {
        let relaxed = std::sync::atomic::Ordering::Relaxed;
        (
            self.m.gauges.body_version.load(relaxed),
            self.m.gauges.oldest_body_version.load(relaxed),
        )
    }

    fn versions(&mut self) -> (Vec<u32>, u32, bool) {
        let s = self.status();
        (
            s.slots.iter().map(|s| s.body_version).collect(),
            s.body_version,
            s.rolling,
        )
    }
}

/// An idle executor of the old version is recycled at once (marked stopping first: no task
/// can reach it); a busy one finishes its task, which is reported through v1 so update-v2
/// brings it no next task, then is recycled. Each exit is a recycle (the supervisor restarts
/// at once), no failure; status shows both versions until the roll ends.
#[test]
fn a_roll_recycles_idle_slots_at_once_and_busy_ones_after_their_task() {
    let mut h = Harness::new(2, true);
    h.up(2);
    assert_eq!(
        h.versions(),
        (vec![1, 1], 1, false),
        "0 from the supervisor is 1"
    );
    let run = assignments(&h.deliver(&["a"]));
    let [(busy, execution, task)] = run.as_slice() else {
        panic!("{run:?}");
    };
    let idle = 3 - busy;
    let effects = h.roll(2);
    assert_eq!(stop_reasons(&effects), [(idle, "recycle".to_owned())]);
    assert!(
        reports(&effects).is_empty(),
        "nothing is failed or handed back"
    );
    assert_eq!(h.versions(), (vec![1, 1], 2, true));
    assert_eq!(h.body_gauges(), (2, 1), "/metrics shows both versions");
    assert_eq!(h.poll(), None, "no slot of the old version takes a task");
    let done = h.complete(*busy, 1, task, execution);
    let reported = reports(&done);
    assert_eq!(reported.len(), 1);
    assert_eq!(reported[0].result.status(), ResultStatus::Completed);
    assert!(!reported[0].use_v2, "an old version takes no next task");
    assert_eq!(stop_reasons(&done), [(*busy, "recycle".to_owned())]);
    for slot in [idle, *busy] {
        let ack = h.recycled_exit(slot, 1);
        assert!(ack.recycling, "a recycle: the supervisor restarts at once");
        h.started_at(slot, 2, 2);
        assert_eq!(h.hello(slot, 2).0.unwrap(), (slot, 2));
    }
    assert_eq!(h.versions(), (vec![2, 2], 2, false), "the roll is over");
    assert_eq!(h.body_gauges(), (2, 2));
    assert_eq!(h.counters.snapshot().executor_exits, 0);
    assert!(h.poll().is_some(), "the new version takes tasks");
    // A repeat, or an older version, changes nothing.
    assert!(stops(&h.roll(2)).is_empty());
    assert!(stops(&h.roll(1)).is_empty());
}

/// A generation announced at an old version after the roll (the announcement crossed it) is
/// recycled the moment it attaches, before any task can reach it; a second roll supersedes
/// the first: a slot of version 2 rolls again, to 3.
#[test]
fn an_old_generation_attaching_after_the_roll_is_recycled_and_a_second_roll_supersedes() {
    let mut h = Harness::new(2, true);
    h.up(2);
    h.roll(2);
    h.recycled_exit(1, 1);
    h.started_at(1, 2, 1);
    let (attached, effects) = h.hello(1, 2);
    attached.unwrap();
    assert_eq!(stop_reasons(&effects), [(1, "recycle".to_owned())]);
    assert!(assignments(&effects).is_empty());
    h.recycled_exit(1, 2);
    h.started_at(1, 3, 2);
    h.hello(1, 3).0.unwrap();
    // Slot 2 rolled to 2 already; a roll to 3 recycles both.
    h.recycled_exit(2, 1);
    h.started_at(2, 2, 2);
    h.hello(2, 2).0.unwrap();
    assert_eq!(h.versions(), (vec![2, 2], 2, false));
    let effects = h.roll(3);
    assert_eq!(stops(&effects), [1, 2]);
    assert_eq!(h.versions(), (vec![2, 2], 3, true));
}

/// A drain during a roll just drains: the roll recycles nobody any more (the drain stops
/// every executor as it does), and an executor that was already told to recycle leaves as
/// such.
#[test]
fn a_drain_during_a_roll_just_drains() {
    let mut h = Harness::new(2, true);
    h.up(2);
    let run = assignments(&h.deliver(&["a"]));
    let [(busy, execution, task)] = run.as_slice() else {
        panic!("{run:?}");
    };
    h.roll(2);
    let mut effects = h.go(Input::Drain);
    let done = h.complete(*busy, 1, task, execution);
    assert_eq!(reports(&done).len(), 1, "its task is reported");
    effects.extend(done);
    assert_eq!(stop_reasons(&effects), [(*busy, "drain".to_owned())]);
}

/// A roll that starts while a completion's update-v2 is in flight: the next task it brings
/// back does not go to the old version's executor (recycled now); it is held, its lease
/// extended, until the new generation attaches, and runs there.
#[test]
fn update_v2s_next_task_never_reaches_an_executor_of_the_old_version() {
    let mut h = Harness::new(1, true);
    h.up(1);
    let (_, execution, _) = assignments(&h.deliver(&["a"])).remove(0);
    let done = h.complete(1, 1, "a", &execution);
    assert!(reports(&done)[0].use_v2, "before the roll: update-v2");
    assert!(
        stops(&h.roll(2)).is_empty(),
        "its update is in flight: not idle yet"
    );
    let effects = h.go(Input::UpdateDone {
        slot: Some(1),
        next_task: Some(task("b")),
    });
    assert!(assignments(&effects).is_empty(), "{effects:?}");
    assert_eq!(stop_reasons(&effects), [(1, "recycle".to_owned())]);
    assert!(
        effects
            .iter()
            .any(|e| matches!(e, Effect::StartLease { .. })),
        "held, its lease extended: {effects:?}"
    );
    h.recycled_exit(1, 1);
    h.started_at(1, 2, 2);
    let (attached, effects) = h.hello(1, 2);
    attached.unwrap();
    let run = assignments(&effects);
    assert_eq!(run.len(), 1, "{effects:?}");
    assert_eq!((run[0].0, run[0].2.as_str()), (1, "b"));
}
