//! Run once: the queue-depth reads and empty polls that end the run.

use super::*;

#[test]
fn run_once_drains_when_a_read_after_an_empty_poll_says_zero_and_all_is_idle() {
    let mut h = Harness::with_capacity(once(2), true);
    // The first read is asked for at once, the next a second after each answer.
    assert_eq!(depth_reads(&h.go(Input::PollRequest)), [Duration::ZERO]);
    h.up(2);
    let t0 = Instant::now();
    // A read that was asked for before the empty poll does not count.
    h.go(Input::Polled {
        tasks: vec![],
        reserved: 2,
    });
    assert_eq!(h.poll(), None, "polls wait for the confirming read");
    let stale = h.depth(0, t0, 0.0);
    assert!(stops(&stale).is_empty() && !h.status().draining);
    assert_eq!(
        depth_reads(&stale),
        [Duration::ZERO],
        "the confirming read goes at once"
    );
    let drain = h.depth(0, t0, 0.1);
    assert!(h.status().draining);
    assert_eq!(stops(&drain), [1, 2]);
    assert_eq!(grant(&drain), Some(0), "the waiting poller is stopped");
    assert!(depth_reads(&drain).is_empty());
    h.go(Input::StreamEnded {
        slot: 1,
        generation: 1,
    });
    let end = h.go(Input::StreamEnded {
        slot: 2,
        generation: 1,
    });
    assert!(end.contains(&Effect::Drained));
    assert_eq!(h.counters.executor_exits.get(), 0);
}

#[test]
fn run_once_polls_on_while_tasks_wait_or_run() {
    let mut h = Harness::with_capacity(once(2), false);
    h.up(2);
    let t0 = Instant::now();
    // Slot 1 runs a task while slot 2's poll comes back empty: not quiet.
    let (_, a, _) = assignments(&h.deliver(&["a"])).remove(0);
    let granted = h.poll().unwrap();
    h.go(Input::Polled {
        tasks: vec![],
        reserved: granted,
    });
    h.depth(0, t0, 0.0);
    h.depth(0, t0, 1.0);
    assert!(!h.status().draining);
    h.complete(1, 1, "a", &a);
    h.go(Input::UpdateDone {
        slot: None,
        next_task: None,
    });
    // Idle now, and an empty poll: a confirming read that finds a (delayed) task resumes polls.
    let granted = h.poll().unwrap();
    h.go(Input::Polled {
        tasks: vec![],
        reserved: granted,
    });
    assert_eq!(h.poll(), None);
    assert_eq!(
        grant(&h.depth(3, t0, 2.0)),
        None,
        "a read asked for before it"
    );
    let more = h.depth(3, t0, 2.5);
    assert!(!h.status().draining);
    assert_eq!(grant(&more), Some(1), "polling resumes, one task per poll");
    // A failed read decides nothing.
    h.go(Input::Polled {
        tasks: vec![],
        reserved: 1,
    });
    h.go(Input::QueueDepth {
        depth: None,
        now: t0 + Duration::from_secs(3),
    });
    assert!(!h.status().draining);
    assert_eq!(h.status().capacity.unwrap().queue_depth, 3);
    h.depth(0, t0, 4.0);
    assert!(h.status().draining);
}

/// Run once while every queue-depth read fails (the deprecated route refused, the other one
/// too): polls go on rather than waiting for a read that never works, and
/// [`ONCE_EMPTY_POLLS`](crate::state::ONCE_EMPTY_POLLS) empty polls in a row with everything
/// idle end the run; a task in between starts the count again.
#[test]
fn run_once_ends_after_empty_polls_when_the_queue_depth_cannot_be_read() {
    let mut h = Harness::with_capacity(once(2), true);
    h.up(2);
    let t0 = Instant::now();
    let failed = |h: &mut Harness, at: u64| {
        h.go(Input::QueueDepth {
            depth: None,
            now: t0 + Duration::from_secs(at),
        })
    };
    // The first read fails before any poll answers; then an empty poll.
    failed(&mut h, 0);
    let granted = h.poll().expect("polls are granted");
    h.go(Input::Polled {
        tasks: vec![],
        reserved: granted,
    });
    // A task arrives and runs: the count starts again.
    let granted = h.poll().expect("polling goes on after an empty poll");
    assert_eq!(granted, 1, "a sparse queue: one task per poll");
    let (_, a, _) = assignments(&h.go(Input::Polled {
        tasks: vec![task("a")],
        reserved: granted,
    }))
    .remove(0);
    failed(&mut h, 1);
    h.complete(1, 1, "a", &a);
    h.go(Input::UpdateDone {
        slot: Some(1),
        next_task: None,
    });
    for n in 1..crate::state::ONCE_EMPTY_POLLS {
        let granted = h.poll().unwrap_or_else(|| panic!("poll {n} is granted"));
        h.go(Input::Polled {
            tasks: vec![],
            reserved: granted,
        });
        // The read asked for after it fails too: polling resumes all the same.
        failed(&mut h, 1 + u64::from(n));
        assert!(!h.status().draining, "after {n} empty polls");
    }
    let granted = h.poll().expect("the last poll is granted");
    let drain = h.go(Input::Polled {
        tasks: vec![],
        reserved: granted,
    });
    assert!(h.status().draining);
    assert_eq!(stops(&drain), [1, 2]);
}

/// A read that fails right after an empty poll (the one that would confirm it) does not hold
/// polls back: the next poll is granted at once.
#[test]
fn run_once_polls_again_when_the_confirming_read_fails() {
    let mut h = Harness::with_capacity(once(2), true);
    h.up(2);
    let t0 = Instant::now();
    h.depth(1, t0, 0.0);
    let granted = h.poll().unwrap();
    h.go(Input::Polled {
        tasks: vec![],
        reserved: granted,
    });
    assert_eq!(h.poll(), None, "polls wait for the confirming read");
    // The read in flight was asked for before the empty poll: it decides nothing.
    let stale = h.go(Input::QueueDepth {
        depth: None,
        now: t0 + Duration::from_secs(1),
    });
    assert_eq!(grant(&stale), None, "{stale:?}");
    let resumed = h.go(Input::QueueDepth {
        depth: None,
        now: t0 + Duration::from_secs(1),
    });
    assert_eq!(grant(&resumed), Some(1), "one task per poll: {resumed:?}");
    assert!(!h.status().draining);
}
