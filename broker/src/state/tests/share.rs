//! Capacity shared across task types (issue #27 items 1-2, docs/sharing.md): a sharing broker
//! polls only within the permits granted, keeps a slot for update-v2's next task only within
//! them, and says what it holds and could fill.

use super::*;

impl Harness {
    fn sharing(slots: u32) -> Self {
        let mut h = Self::new(slots, true);
        h.m.share = Some(super::super::share::Permits::default());
        h
    }

    fn share_grant(&mut self, limit: u32, epoch: u64) -> admin::ShareStatus {
        match self.handle(Input::ShareGrant { limit, epoch }).reply {
            Reply::ShareGrant(r) => r.unwrap(),
            other => panic!("{other:?}"),
        }
    }

    fn share(&mut self) -> admin::ShareStatus {
        self.status().share.expect("sharing")
    }
}

#[test]
fn a_sharing_broker_polls_nothing_before_its_first_grant_then_only_what_the_permits_leave() {
    let mut h = Harness::sharing(3);
    h.up(3);
    assert_eq!(h.poll(), None, "no permit: the poller waits");
    let share = h.share();
    assert_eq!((share.limit, share.held, share.fillable), (0, 0, 3));
    // One permit: a poll for one task, granted at once to the waiting poller.
    let out = h.handle(Input::ShareGrant { limit: 1, epoch: 1 });
    assert_eq!(grant(&out.effects), Some(1));
    let Reply::ShareGrant(Ok(s)) = out.reply else {
        panic!("{:?}", out.reply)
    };
    // The answer is the state at the grant; the reservation follows within the limit.
    assert_eq!((s.limit, s.epoch, s.held), (1, 1, 0));
    assert_eq!(h.share().held, 1, "the reservation is held");
    let effects = h.go(Input::Polled {
        tasks: vec![task("a")],
        reserved: 1,
    });
    assert_eq!(assignments(&effects).len(), 1);
    assert_eq!(h.poll(), None, "the one permit is busy");
    let share = h.share();
    assert_eq!((share.held, share.fillable), (1, 2));
    // /metrics shows the permits and what holds them.
    let relaxed = std::sync::atomic::Ordering::Relaxed;
    assert_eq!(h.m.gauges.share_limit.load(relaxed), 1);
    assert_eq!(h.m.gauges.share_held.load(relaxed), 1);
}

#[test]
fn a_completion_keeps_its_permit_for_the_next_task_only_within_the_limit() {
    let mut h = Harness::sharing(2);
    h.up(2);
    h.share_grant(2, 1);
    let (_, a, _) = assignments(&h.deliver(&["a", "b"])).remove(0);
    // Within the limit: update-v2, the slot waits for the next task with its permit.
    let effects = h.complete(1, 1, "a", &a);
    assert!(reports(&effects)[0].use_v2, "{effects:?}");
    assert_eq!(h.share().held, 2);
    // The supervisor takes a permit back: it is lowered below the holding, nothing stops.
    let s = h.share_grant(1, 2);
    assert_eq!((s.limit, s.held), (1, 2));
    let effects = h.go(Input::UpdateDone {
        slot: Some(1),
        next_task: Some(task("c")),
    });
    assert_eq!(
        assignments(&effects).len(),
        1,
        "the next task takes its slot"
    );
    // Above the limit now: the next completion reports through v1 and frees its permit.
    let b = h.m.execution_of(2).unwrap().to_owned();
    let effects = h.complete(2, 1, "b", &b);
    assert!(!reports(&effects)[0].use_v2, "{effects:?}");
    h.go(Input::UpdateDone {
        slot: None,
        next_task: None,
    });
    assert_eq!(h.share().held, 1);
    assert_eq!(h.poll(), None, "the one permit is held by task c");
}

#[test]
fn an_older_grant_is_ignored() {
    let mut h = Harness::sharing(2);
    h.up(2);
    h.share_grant(2, 5);
    let s = h.share_grant(0, 4);
    assert_eq!((s.limit, s.epoch), (2, 5));
    assert_eq!(h.poll(), Some(2));
}

#[test]
fn an_empty_poll_means_nothing_to_give_until_a_task_or_the_queue_depth_shows_work() {
    let mut h = Harness::sharing(2);
    h.up(2);
    h.share_grant(1, 1);
    assert!(
        h.go(Input::PollRequest)
            .iter()
            .any(|e| matches!(e, Effect::GrantPoll(1)))
    );
    h.go(Input::Polled {
        tasks: vec![],
        reserved: 1,
    });
    let share = h.share();
    assert!(share.empty);
    assert_eq!((share.held, share.fillable), (0, 0));
    // A sharing broker reads its queue depth (every second) to learn of new work.
    h.go(Input::QueueDepth {
        depth: Some(0),
        now: h.now.instant,
    });
    assert!(h.share().empty);
    h.go(Input::QueueDepth {
        depth: Some(4),
        now: h.now.instant,
    });
    let share = h.share();
    assert!(!share.empty);
    assert_eq!(share.fillable, 2);
}

#[test]
fn a_paused_or_draining_sharing_broker_has_nothing_to_give() {
    let mut h = Harness::sharing(2);
    h.up(2);
    assert_eq!(h.share().fillable, 2);
    h.handle(Input::Pause);
    assert_eq!(h.share().fillable, 0);
    h.handle(Input::Resume);
    h.handle(Input::Drain);
    assert_eq!(h.share().fillable, 0);
}

#[test]
fn a_broker_that_does_not_share_refuses_a_grant_and_shows_no_permits() {
    let mut h = Harness::new(2, true);
    h.up(2);
    match h.handle(Input::ShareGrant { limit: 1, epoch: 1 }).reply {
        Reply::ShareGrant(Err(status)) => {
            assert_eq!(status.code(), tonic::Code::FailedPrecondition);
        }
        other => panic!("{other:?}"),
    }
    assert!(h.status().share.is_none());
    let relaxed = std::sync::atomic::Ordering::Relaxed;
    assert_eq!(
        h.m.gauges.share_limit.load(relaxed),
        u64::MAX,
        "no permits in /metrics"
    );
    assert_eq!(h.poll(), Some(2), "no limit");
}

#[test]
fn starting_executors_count_as_room_but_a_slot_in_backoff_does_not() {
    let mut h = Harness::sharing(2);
    assert_eq!(h.share().fillable, 2, "both executors are starting");
    h.up(1);
    h.go(Input::SlotExited(proto::SlotExited {
        slot: 1,
        generation: 1,
        pid: 1,
        status: "exit status 1".into(),
        ..Default::default()
    }));
    assert_eq!(h.share().fillable, 1, "slot 1 waits for its restart");
}
