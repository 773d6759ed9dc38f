//! Polls, tasks received (checked, held, handed back, fetched), dispatch, completions and update-v2.

use super::*;

#[test]
fn polls_ask_for_free_slots_and_assignments_go_to_them() {
    let mut h = Harness::new(2, true);
    assert_eq!(h.poll(), None, "no slot attached: no poll");
    h.started(1, 1).unwrap();
    let (_, effects) = h.hello(1, 1);
    assert_eq!(
        grant(&effects),
        Some(1),
        "the waiting poll is granted once a slot attaches"
    );
    h.go(Input::Polled {
        tasks: vec![],
        reserved: 1,
    });
    h.started(2, 1).unwrap();
    h.hello(2, 1).0.unwrap();
    let effects = h.deliver(&[]);
    assert!(assignments(&effects).is_empty());
    // The queue looked empty: one task per poll, until one comes back full.
    assert_eq!(h.poll(), Some(1));
    let mut effects = h.go(Input::Polled {
        tasks: vec![task("a")],
        reserved: 1,
    });
    effects.extend(h.deliver(&["b"]));
    let sent = assignments(&effects);
    assert_eq!(sent.len(), 2, "{effects:?}");
    assert_eq!(sent[0].2, "a");
    assert_ne!(sent[0].1, sent[1].1, "fresh execution ids");
    assert_eq!(
        effects
            .iter()
            .filter(|e| matches!(e, Effect::StartLease { .. }))
            .count(),
        2
    );
    assert_eq!(h.poll(), None, "every slot busy: no poll");
    assert_eq!(h.counters.dispatched.get(), 2);
}

/// Each dispatch tells the actor the assignment's ids (it opens the assignment's span), and
/// the machine says which execution a slot's input concerns (the span it is handled in).
#[test]
fn a_dispatch_names_its_assignment_and_inputs_their_execution() {
    let mut h = Harness::new(1, true);
    h.started(1, 1).unwrap();
    h.hello(1, 1).0.unwrap();
    let effects = h.deliver(&["a"]);
    let (_, execution, _) = assignments(&effects).remove(0);
    let assigned: Vec<&Assigned> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::Assigned(a) => Some(&**a),
            _ => None,
        })
        .collect();
    assert_eq!(assigned.len(), 1, "{effects:?}");
    assert_eq!(
        (
            assigned[0].slot,
            assigned[0].task_id.as_str(),
            assigned[0].worker_id.as_str()
        ),
        (1, "a", "t0001")
    );
    assert_eq!(assigned[0].execution_id, execution);
    let dispatch = effects
        .iter()
        .position(|e| matches!(e, Effect::Assigned(_)))
        .unwrap();
    let send = effects
        .iter()
        .position(|e| {
            matches!(
                e,
                Effect::Send {
                    message: proto::BrokerMessage {
                        message: Some(proto::broker_message::Message::Assignment(_))
                    },
                    ..
                }
            )
        })
        .unwrap();
    assert!(
        dispatch < send,
        "the span opens before the assignment goes out"
    );
    assert_eq!(h.m.execution_of(1), Some(execution.as_str()));
    assert!(h.m.knows(&execution));
    let exited = Input::SlotExited(proto::SlotExited {
        slot: 1,
        generation: 1,
        pid: 1,
        status: "killed".into(),
        ..Default::default()
    });
    assert_eq!(h.m.execution_of_input(&exited), Some(execution.as_str()));
    let lost = Input::LeaseLost {
        execution_id: execution.clone(),
    };
    assert_eq!(h.m.execution_of_input(&lost), Some(execution.as_str()));
    assert_eq!(h.m.execution_of_input(&Input::PollRequest), None);
    h.complete(1, 1, "a", &execution);
    assert_eq!(h.m.execution_of(1), None);
    assert!(!h.m.knows(&execution));
}

#[test]
fn a_completion_must_name_the_current_assignment() {
    let mut h = Harness::new(1, false);
    h.up(1);
    let (_, execution, _) = assignments(&h.deliver(&["a"])).remove(0);
    // Wrong execution id, wrong task id, old generation: refused, nothing reported.
    assert!(reports(&h.complete(1, 1, "a", "other")).is_empty());
    assert!(reports(&h.complete(1, 1, "b", &execution)).is_empty());
    assert!(reports(&h.complete(1, 0, "a", &execution)).is_empty());
    assert_eq!(h.counters.rejected_completions.get(), 3);
    let done = reports(&h.complete(1, 1, "a", &execution));
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].result.status(), ResultStatus::Completed);
    assert!(!done[0].use_v2);
    // The same completion again is now stale.
    assert!(reports(&h.complete(1, 1, "a", &execution)).is_empty());
    assert_eq!(h.poll(), Some(1), "v1: the slot is free at once");
}

/// `body.memory_limit`: each completion may say its body's peak; the slot shows the last one
/// measured and the highest, and a completion that measured none changes neither.
#[test]
fn a_slot_shows_the_last_and_the_highest_body_peak_its_completions_measured() {
    let mut h = Harness::new(1, false);
    h.up(1);
    let peaks = |h: &mut Harness| {
        let slot = &h.status().slots[0];
        (
            slot.last_body_peak_memory_bytes,
            slot.max_body_peak_memory_bytes,
        )
    };
    assert_eq!(peaks(&mut h), (0, 0), "nothing measured yet");
    for (task, peak, expected) in [
        ("a", 64 << 20, (64 << 20, 64 << 20)),
        ("b", 3 << 20, (3 << 20, 64 << 20)),
        ("c", 0, (3 << 20, 64 << 20)),
    ] {
        let (_, execution, _) = assignments(&h.deliver(&[task])).remove(0);
        let done = h.complete_measured(1, 1, task, &execution, "", peak);
        assert_eq!(reports(&done).len(), 1);
        assert_eq!(peaks(&mut h), expected, "after {task}");
    }
    // A refused completion (not the slot's assignment) is no measurement of the slot's.
    let (_, execution, _) = assignments(&h.deliver(&["d"])).remove(0);
    h.complete_measured(1, 1, "d", "other", "", 1 << 30);
    assert_eq!(peaks(&mut h), (3 << 20, 64 << 20));
    h.complete(1, 1, "d", &execution);
}

#[test]
fn update_v2_keeps_the_slot_for_the_next_task() {
    let mut h = Harness::new(1, true);
    h.up(1);
    let (_, execution, _) = assignments(&h.deliver(&["a"])).remove(0);
    let done = reports(&h.complete(1, 1, "a", &execution));
    assert!(done[0].use_v2);
    assert_eq!(done[0].slot, Some(1));
    assert_eq!(h.poll(), None, "reserved for update-v2's next task");
    let effects = h.go(Input::UpdateDone {
        slot: Some(1),
        next_task: Some(task("b")),
    });
    let sent = assignments(&effects);
    assert_eq!((sent[0].0, sent[0].2.as_str()), (1, "b"));
}

/// The reporter that finds the server without update-v2 tells the machine: the completions
/// after that go through v1 and keep no slot, so the slot is polled for at once.
#[test]
fn once_told_update_v2_is_missing_completions_go_through_v1_and_free_their_slot() {
    let mut h = Harness::new(1, true);
    h.up(1);
    let (_, execution, _) = assignments(&h.deliver(&["a"])).remove(0);
    let done = reports(&h.complete(1, 1, "a", &execution));
    assert!(done[0].use_v2);
    // Its update met a 405: the reporter says so, then resends it through v1.
    assert!(h.go(Input::UpdateV2Unsupported).is_empty());
    h.go(Input::UpdateDone {
        slot: Some(1),
        next_task: None,
    });
    let (_, execution, _) = assignments(&h.deliver(&["b"])).remove(0);
    let done = reports(&h.complete(1, 1, "b", &execution));
    assert!(!done[0].use_v2);
    assert_eq!(done[0].slot, None);
    assert_eq!(h.poll(), Some(1), "the slot is free at once");
}

/// The machine reads no clock and makes no ids of its own: the time a task was dispatched is
/// the time given with the input, and its execution id comes from the source it was built
/// with.
#[test]
fn the_dispatch_time_and_execution_id_are_the_ones_given() {
    let mut h = Harness::new(1, false);
    h.up(1);
    h.advance(Duration::from_secs(90));
    let sent = assignments(&h.deliver(&["a"]));
    assert_eq!(sent[0].1, "exec-1");
    let since = h.now.wall.duration_since(std::time::UNIX_EPOCH).unwrap();
    assert_eq!(
        h.status().slots[0].busy_since_unix_ms,
        i64::try_from(since.as_millis()).unwrap()
    );
    h.complete(1, 1, "a", "exec-1");
    h.go(Input::UpdateDone {
        slot: None,
        next_task: None,
    });
    let sent = assignments(&h.deliver(&["b"]));
    assert_eq!(sent[0].1, "exec-2");
}

/// update-v2 brings the next task for a slot whose executor died meanwhile: the task is held
/// (lease running) and runs on the next free slot, never handed back.
#[test]
fn update_v2_next_task_for_a_dead_slot_is_held_then_run() {
    let mut h = Harness::new(1, true);
    h.up(1);
    let effects = h.next_task_for_a_dead_slot("killed by signal 9");
    assert!(hand_backs(&effects).is_empty(), "{effects:?}");
    assert!(assignments(&effects).is_empty());
    assert!(
        effects
            .iter()
            .any(|e| matches!(e, Effect::StartLease { .. })),
        "held with its lease"
    );
    h.started(1, 2).unwrap();
    assert_eq!(
        h.poll(),
        None,
        "the held task takes the slot before any poll"
    );
    let (_, effects) = h.hello(1, 2);
    let sent = assignments(&effects);
    assert_eq!((sent[0].0, sent[0].2.as_str()), (1, "b"), "{effects:?}");
}

#[test]
fn never_more_than_n_tasks_are_held() {
    let mut h = Harness::new(2, false);
    h.up(2);
    // A server returns more tasks than asked for: two run, the third is handed back.
    let granted = h.poll().unwrap();
    let effects = h.go(Input::Polled {
        tasks: vec![task("a"), task("b"), task("c")],
        reserved: granted,
    });
    assert_eq!(assignments(&effects).len(), 2);
    assert_eq!(hand_backs(&effects), ["c"]);
}

#[test]
fn a_held_task_whose_lease_is_lost_is_dropped() {
    let mut h = Harness::new(1, true);
    h.up(1);
    let effects = h.next_task_for_a_dead_slot("gone");
    let held_execution = effects
        .iter()
        .find_map(|e| match e {
            Effect::StartLease { execution_id, .. } => Some(execution_id.clone()),
            _ => None,
        })
        .unwrap();
    h.go(Input::LeaseLost {
        execution_id: held_execution,
    });
    h.started(1, 2).unwrap();
    let (_, effects) = h.hello(1, 2);
    assert!(
        assignments(&effects).is_empty(),
        "the lost task does not run"
    );
    assert_eq!(h.poll(), Some(1));
}

#[test]
fn a_lost_lease_of_a_running_task_lets_it_finish_and_report() {
    let mut h = Harness::new(1, false);
    h.up(1);
    let (_, execution, _) = assignments(&h.deliver(&["a"])).remove(0);
    assert!(
        h.go(Input::LeaseLost {
            execution_id: execution.clone()
        })
        .is_empty()
    );
    assert_eq!(reports(&h.complete(1, 1, "a", &execution)).len(), 1);
}

#[test]
fn a_malformed_task_is_failed_by_the_broker_and_frees_nothing() {
    let mut h = Harness::new(1, true);
    h.up(1);
    let mut bad = raw_task("a");
    bad.as_object_mut().unwrap().remove("seq");
    let granted = h.poll().unwrap();
    let effects = h.go(Input::Polled {
        tasks: vec![Polled::Task(PolledTask::from_value(bad))],
        reserved: granted,
    });
    let failed = reports(&effects);
    assert_eq!(failed.len(), 1);
    assert!(reason(&failed[0]).contains("seq"));
    assert_eq!(
        failed[0].result.status(),
        ResultStatus::FailedWithTerminalError
    );
    assert_eq!(failed[0].result.worker_id(), "tBroker");
    assert_eq!(h.poll(), Some(1));
}

/// One task nested deeper than anything can decode fails alone: its batch-mates run.
#[test]
fn an_undecodable_task_fails_alone_and_its_batch_runs() {
    let mut h = Harness::new(2, true);
    h.up(2);
    let deep = format!(
        r#"{{"taskId": "deep", "workflowInstanceId": "wf-deep", "taskType": "t", "inputData": {{"params": {{"x": {}1{}}}}}}}"#,
        "[".repeat(5000),
        "]".repeat(5000)
    );
    let polled = Polled::decode(&deep);
    assert!(
        matches!(&polled, Polled::Undecodable { ids: Some(_), .. }),
        "{polled:?}"
    );
    let granted = h.poll().unwrap();
    let effects = h.go(Input::Polled {
        tasks: vec![polled, task("ok")],
        reserved: granted,
    });
    let failed = reports(&effects);
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].task_id, "deep");
    assert_eq!(
        failed[0].result.status(),
        ResultStatus::FailedWithTerminalError
    );
    assert_eq!(
        reason(&failed[0]),
        "the task cannot be decoded: JSON nested 1001 levels deep; at most 1000 are accepted"
    );
    let sent = assignments(&effects);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].2, "ok");
    // Without readable ids there is nothing to tell Conductor: dropped, nothing sent.
    let effects = h.go(Input::UpdateDone {
        slot: None,
        next_task: Some(Polled::Undecodable {
            ids: None,
            types: TaskTypes::default(),
            problem: "x".into(),
        }),
    });
    assert!(reports(&effects).is_empty() && assignments(&effects).is_empty());
}

/// A poll that returns another type's task (or one naming no type) does not run, fail or
/// complete it: it is handed back as it came, its output sent back with it, and the tasks of
/// the broker's own type in the same answer run.
#[test]
fn a_task_of_another_type_is_handed_back_untouched() {
    let mut h = Harness::new(2, true);
    h.up(2);
    for (def_name, task_type) in [
        (Some("other"), Some("other")),
        (Some("other"), None),
        (None, Some("other")),
        (Some("t"), Some("other")),
        (Some("other"), Some("t")),
        (None, None),
        (Some(""), Some("")),
    ] {
        let granted = h.poll().unwrap();
        let effects = h.go(Input::Polled {
            tasks: vec![typed_task("foreign", def_name, task_type)],
            reserved: granted,
        });
        let what = format!("{def_name:?} {task_type:?}");
        assert!(assignments(&effects).is_empty(), "{what}: {effects:?}");
        assert!(reports(&effects).is_empty(), "{what}: {effects:?}");
        assert!(
            !effects
                .iter()
                .any(|e| matches!(e, Effect::StartLease { .. })),
            "{what}"
        );
        assert_eq!(
            hand_back_effects(&effects),
            vec![HandBack {
                ids: TaskRef {
                    task_id: "foreign".into(),
                    workflow_instance_id: "wf-foreign".into(),
                },
                output: Some(json!({"saved": "by its own worker"})),
            }],
            "{what}"
        );
        h.go(Input::UpdateDone {
            slot: None,
            next_task: None,
        });
    }
    // Its own type, named either way, runs; in a batch with a foreign one, only it runs.
    let granted = h.poll().unwrap();
    let effects = h.go(Input::Polled {
        tasks: vec![
            typed_task("x", Some("other"), Some("other")),
            typed_task("a", Some("t"), None),
            typed_task("b", None, Some("t")),
        ],
        reserved: granted,
    });
    let sent: Vec<_> = assignments(&effects).into_iter().map(|a| a.2).collect();
    assert_eq!(sent, ["a", "b"]);
    assert_eq!(hand_backs(&effects), ["x"]);
    // update-v2's next task is checked the same way.
    let (_, execution, _) = assignments(&effects).remove(0);
    h.complete(1, 1, "a", &execution);
    let effects = h.go(Input::UpdateDone {
        slot: Some(1),
        next_task: Some(typed_task("y", Some("other"), Some("other"))),
    });
    assert_eq!(hand_backs(&effects), ["y"]);
    assert!(assignments(&effects).is_empty());
    assert_eq!(h.poll(), Some(1), "the slot update-v2 kept is free again");
}

/// Another type's task that cannot be decoded is handed back too, never failed here.
#[test]
fn an_undecodable_task_of_another_type_is_handed_back_not_failed() {
    let mut h = Harness::new(1, true);
    h.up(1);
    let deep = format!(
        r#"{{"taskId": "deep", "workflowInstanceId": "wf-deep", "taskType": "other", "inputData": {{"x": {}1{}}}}}"#,
        "[".repeat(5000),
        "]".repeat(5000)
    );
    let polled = Polled::decode(&deep);
    let granted = h.poll().unwrap();
    let effects = h.go(Input::Polled {
        tasks: vec![polled],
        reserved: granted,
    });
    assert!(reports(&effects).is_empty(), "{effects:?}");
    assert_eq!(hand_backs(&effects), ["deep"]);
    assert_eq!(hand_back_effects(&effects)[0].output, None);
}

/// The same task id twice in one answer runs once: the second is dropped, not run on another
/// slot, failed or handed back.
#[test]
fn the_same_task_twice_in_one_answer_runs_once() {
    let mut h = Harness::new(3, true);
    h.up(3);
    let effects = h.deliver(&["a", "a", "b"]);
    let sent: Vec<_> = assignments(&effects).into_iter().map(|a| a.2).collect();
    assert_eq!(sent, ["a", "b"]);
    assert!(reports(&effects).is_empty() && hand_backs(&effects).is_empty());
    let leases = effects
        .iter()
        .filter(|e| matches!(e, Effect::StartLease { .. }))
        .count();
    assert_eq!(leases, 2);
    assert_eq!(h.poll(), Some(1), "the third slot is still free");
}

/// A task already running, held, or reported lately is dropped when a later answer hands it
/// out again, whether from a poll or from update-v2.
#[test]
fn a_task_running_held_or_just_reported_is_not_run_again() {
    let mut h = Harness::new(1, true);
    h.up(1);
    let (_, execution, _) = assignments(&h.deliver(&["a"])).remove(0);
    // Running: a second answer with it changes nothing.
    let effects = h.go(Input::UpdateDone {
        slot: None,
        next_task: Some(task("a")),
    });
    assert!(effects.is_empty(), "{effects:?}");
    // Held: update-v2 of slot 1 returns "b" after its executor died, then "b" comes again.
    let mut h2 = Harness::new(1, true);
    h2.up(1);
    let effects = h2.next_task_for_a_dead_slot("killed");
    assert!(
        effects
            .iter()
            .any(|e| matches!(e, Effect::StartLease { .. })),
        "b is held: {effects:?}"
    );
    let effects = h2.go(Input::UpdateDone {
        slot: None,
        next_task: Some(task("b")),
    });
    assert!(effects.is_empty(), "{effects:?}");
    // Reported: the completion of "a" goes out; update-v2 answers with "a" again.
    let effects = h.complete(1, 1, "a", &execution);
    assert_eq!(reports(&effects).len(), 1);
    let effects = h.go(Input::UpdateDone {
        slot: Some(1),
        next_task: Some(task("a")),
    });
    assert!(assignments(&effects).is_empty() && reports(&effects).is_empty());
    assert!(hand_backs(&effects).is_empty());
    // And a later poll returning it: dropped, the slot stays free for the rest.
    let granted = h.poll().unwrap();
    let effects = h.go(Input::Polled {
        tasks: vec![task("a"), task("c")],
        reserved: granted,
    });
    let sent: Vec<_> = assignments(&effects).into_iter().map(|a| a.2).collect();
    assert_eq!(sent, ["c"]);
    // A task the broker failed itself is remembered too.
    let mut h3 = Harness::new(1, true);
    h3.up(1);
    let mut bad = raw_task("m");
    bad.as_object_mut().unwrap().remove("seq");
    let granted = h3.poll().unwrap();
    let effects = h3.go(Input::Polled {
        tasks: vec![Polled::Task(PolledTask::from_value(bad.clone()))],
        reserved: granted,
    });
    assert_eq!(reports(&effects).len(), 1);
    let granted = h3.poll().unwrap();
    let effects = h3.go(Input::Polled {
        tasks: vec![Polled::Task(PolledTask::from_value(bad))],
        reserved: granted,
    });
    assert!(reports(&effects).is_empty(), "{effects:?}");
}

/// A task whose input Conductor moved to external payload storage is held (its lease
/// extended, its slot not promised to another poll) while the input is fetched, then runs
/// with the real input; a failed fetch fails the attempt (FAILED: retried; terminal when a
/// retry would meet the same answer), and a fetch ending after the task left is ignored.
#[test]
fn an_externalized_input_is_fetched_before_the_task_runs() {
    use crate::state::InputFailure;
    let mut h = Harness::new(1, false);
    h.up(1);
    let external = |id: &str| {
        let mut raw = raw_task(id);
        raw["inputData"] = json!({});
        raw["externalInputPayloadStoragePath"] = json!(format!("{id}.json"));
        Polled::Task(PolledTask::from_value(raw))
    };
    let granted = h.poll().unwrap();
    let effects = h.go(Input::Polled {
        tasks: vec![external("big")],
        reserved: granted,
    });
    assert!(assignments(&effects).is_empty(), "{effects:?}");
    let Some(Effect::FetchInput {
        execution_id, path, ..
    }) = effects
        .iter()
        .find(|e| matches!(e, Effect::FetchInput { .. }))
        .cloned()
    else {
        panic!("no fetch: {effects:?}")
    };
    assert_eq!(path, "big.json");
    assert!(
        effects
            .iter()
            .any(|e| matches!(e, Effect::StartLease { execution_id: e, .. } if *e == execution_id))
    );
    assert_eq!(
        h.poll(),
        None,
        "the slot is taken by the task being fetched"
    );
    let effects = h.go(Input::PayloadFetched {
        execution_id: execution_id.clone(),
        input: Ok(RawJson::parse(r#"{"params": {"blob": "real"}}"#.to_owned()).unwrap()),
    });
    let sent = effects
        .iter()
        .find_map(|e| match e {
            Effect::Send {
                message:
                    proto::BrokerMessage {
                        message: Some(proto::broker_message::Message::Assignment(a)),
                    },
                ..
            } => Some(a.clone()),
            _ => None,
        })
        .expect("assigned");
    assert_eq!(sent.execution_id, execution_id);
    assert_eq!(
        sent.attempt.unwrap().input_data_json,
        r#"{"params": {"blob": "real"}}"#
    );

    for terminal in [false, true] {
        let mut h = Harness::new(1, false);
        h.up(1);
        let granted = h.poll().unwrap();
        let effects = h.go(Input::Polled {
            tasks: vec![external("gone")],
            reserved: granted,
        });
        let execution_id = effects
            .iter()
            .find_map(|e| match e {
                Effect::FetchInput { execution_id, .. } => Some(execution_id.clone()),
                _ => None,
            })
            .unwrap();
        let effects = h.go(Input::PayloadFetched {
            execution_id: execution_id.clone(),
            input: Err(InputFailure {
                reason: "GET http://s/k.json: HTTP 503".to_owned(),
                terminal,
            }),
        });
        assert!(assignments(&effects).is_empty());
        let report = reports(&effects).pop().expect("reported");
        assert_eq!(report.execution_id, execution_id);
        let want = if terminal {
            ResultStatus::FailedWithTerminalError
        } else {
            ResultStatus::Failed
        };
        assert_eq!(report.result.status(), want, "{report:?}");
        assert!(
            matches!(report.result.outcome(), Outcome::Failed(r) | Outcome::FailedTerminal(r) if r.as_str().contains("HTTP 503")),
            "{report:?}"
        );
        let effects = h.go(Input::PayloadFetched {
            execution_id,
            input: Ok(RawJson::parse("{}".to_owned()).unwrap()),
        });
        assert!(assignments(&effects).is_empty() && reports(&effects).is_empty());
    }
}

/// Issue #24, item 3: Conductor's SQL queues answer a batch poll only once it holds `count`
/// tasks or its timeout has passed. After a poll that came back short, the queue looks sparse
/// and the next poll asks for one task, which its first task answers at once.
#[test]
fn a_poll_that_came_back_short_asks_for_one_task_next() {
    let mut h = Harness::new(4, true);
    h.up(4);
    assert_eq!(h.poll(), Some(4), "the first poll asks for every free slot");
    h.go(Input::Polled {
        tasks: vec![],
        reserved: 4,
    });
    assert_eq!(h.poll(), Some(1), "an empty poll: the queue looks sparse");
    // One task of one asked for: full, so the next poll asks for every free slot again.
    let run = h.go(Input::Polled {
        tasks: vec![task("a")],
        reserved: 1,
    });
    assert_eq!(assignments(&run).len(), 1);
    assert_eq!(h.poll(), Some(3), "a full poll: the free slots again");
    // Two of three: short again.
    let run = h.go(Input::Polled {
        tasks: vec![task("b"), task("c")],
        reserved: 3,
    });
    assert_eq!(assignments(&run).len(), 2);
    assert_eq!(h.poll(), Some(1));
    h.go(Input::Polled {
        tasks: vec![task("d")],
        reserved: 1,
    });
    // Every slot busy: no grant until one is free, then only that one.
    assert_eq!(h.poll(), None);
}

/// A poll for one task waits the whole long poll (its first task answers it on every queue
/// backend); a poll for more waits at most `FILL_WAIT`, so no task waits for a batch to fill.
#[test]
fn only_a_poll_for_one_task_waits_the_long_poll() {
    let long = Duration::from_secs(5);
    assert_eq!(poll_wait(1, long), long);
    assert_eq!(poll_wait(2, long), FILL_WAIT);
    assert_eq!(poll_wait(64, long), Duration::from_millis(100));
    assert_eq!(poll_wait(4, Duration::from_millis(100)), FILL_WAIT);
}
