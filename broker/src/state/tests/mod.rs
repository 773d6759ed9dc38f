//! The broker's state machine driven step by step: each test feeds inputs and checks the
//! effects and answers, with no process, socket or server.

use super::dispatch::FILL_WAIT;
use super::*;
use crate::counters::{Counters, Gauges};
use perago_core::attempt::PolledTask;
use perago_core::attempt::TaskRef;
use perago_core::conductor::{Polled, TaskTypes};
use perago_core::identity::WorkerPrefix;
use perago_core::json::RawJson;
use perago_core::result::{Outcome, ResultStatus};
use perago_proto::{admin::v1 as admin, slot::v1 as proto};
use serde_json::{Value, json};
use std::{
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};
use tonic::Status;

const TOKEN: &str = "secret-token";

struct Harness {
    m: Machine,
    counters: Arc<Counters>,
    /// The clock every input is handled at ([`Harness::advance`] moves it).
    now: Now,
}

fn task(id: &str) -> Polled {
    Polled::Task(PolledTask::from_value(raw_task(id)))
}

fn raw_task(id: &str) -> Value {
    json!({
        "taskType": "t", "taskDefName": "t", "status": "IN_PROGRESS",
        "inputData": {"params": {}}, "referenceTaskName": "t_ref",
        "retryCount": 0, "seq": 1, "workflowInstanceId": format!("wf-{id}"),
        "taskId": id, "responseTimeoutSeconds": 10
    })
}

impl Harness {
    fn new(slots: u32, v2: bool) -> Self {
        Self::with_capacity(perago_core::capacity::Capacity::fixed(slots), v2)
    }

    /// A machine with these capacity settings (`max_executors` slots).
    fn with_capacity(capacity: perago_core::capacity::Capacity, v2: bool) -> Self {
        let counters = Arc::new(Counters::default());
        let now = Now {
            instant: Instant::now(),
            wall: SystemTime::now(),
        };
        let mut m = Machine::new(
            "t".into(),
            &WorkerPrefix::derive("t").unwrap(),
            capacity,
            Arc::clone(&counters),
            Arc::new(Gauges::default()),
            now,
            ExecutionIds::counter(),
        );
        // A server without update-v2, as the machine knows once the reporter told it.
        m.v2 = v2;
        Self { m, counters, now }
    }

    fn handle(&mut self, input: Input) -> Output {
        self.m.handle(input, self.now)
    }

    fn go(&mut self, input: Input) -> Vec<Effect> {
        self.handle(input).effects
    }

    fn started(&mut self, slot: u32, generation: u64) -> Result<(), Status> {
        let out = self.handle(Input::SlotStarted(proto::SlotStarted {
            slot,
            generation,
            token: format!("{TOKEN}-{generation}"),
            pid: 0,
        }));
        match out.reply {
            Reply::SlotStarted(r) => r,
            other => panic!("{other:?}"),
        }
    }

    fn hello(&mut self, slot: u32, generation: u64) -> (Result<(u32, u64), Status>, Vec<Effect>) {
        self.hello_with(slot, generation, false)
    }

    /// [`Harness::hello`] from an executor that may start bodies at dispatch.
    fn hello_with(
        &mut self,
        slot: u32,
        generation: u64,
        body_at_dispatch: bool,
    ) -> (Result<(u32, u64), Status>, Vec<Effect>) {
        let out = self.handle(Input::Hello(proto::Hello {
            protocol_version: proto::ProtocolVersion::ProtocolVersion1 as i32,
            credentials: Some(proto::SlotCredentials {
                slot,
                generation,
                token: format!("{TOKEN}-{generation}"),
            }),
            pid: 1000 + slot,
            worker_id: String::new(),
            body_at_dispatch,
        }));
        match out.reply {
            Reply::Hello(r) => (r, out.effects),
            other => panic!("{other:?}"),
        }
    }

    /// Starts and attaches generation 1 of slots 1..=n.
    fn up(&mut self, n: u32) {
        for slot in 1..=n {
            self.started(slot, 1).unwrap();
            let (r, _) = self.hello(slot, 1);
            r.unwrap();
        }
    }

    /// Polls and returns the grant.
    fn poll(&mut self) -> Option<u32> {
        grant(&self.go(Input::PollRequest))
    }

    /// Polls once and delivers `tasks`; returns the effects of the delivery.
    fn deliver(&mut self, tasks: &[&str]) -> Vec<Effect> {
        let granted = self.poll().expect("a grant");
        assert!(granted as usize >= tasks.len(), "granted {granted}");
        self.go(Input::Polled {
            tasks: tasks.iter().map(|id| task(id)).collect(),
            reserved: granted,
        })
    }

    fn complete(
        &mut self,
        slot: u32,
        generation: u64,
        task_id: &str,
        execution_id: &str,
    ) -> Vec<Effect> {
        self.complete_recycling(slot, generation, task_id, execution_id, "")
    }

    /// A completion whose executor reached a recycling limit (`recycle` non-empty).
    fn complete_recycling(
        &mut self,
        slot: u32,
        generation: u64,
        task_id: &str,
        execution_id: &str,
        recycle: &str,
    ) -> Vec<Effect> {
        self.go(Input::Completion {
            slot,
            generation,
            completion: proto::Completion {
                task_id: task_id.into(),
                execution_id: execution_id.into(),
                result: Some(proto::TaskResult {
                    outcome: Some(proto::task_result::Outcome::Completed(proto::Completed {
                        output_json: r#"{"result":{}}"#.into(),
                    })),
                    worker_id: format!("t{slot:04}"),
                }),
                recycle: recycle.into(),
            },
        })
    }

    /// Slot 1 (attached, generation 1) runs task `a` and completes it through update-v2; its
    /// executor then dies before update-v2 answers with task `b`. Returns the effects of that
    /// answer (`b` arrives for a slot that is gone).
    fn next_task_for_a_dead_slot(&mut self, status: &str) -> Vec<Effect> {
        let (_, execution, _) = assignments(&self.deliver(&["a"])).remove(0);
        self.complete(1, 1, "a", &execution);
        self.go(Input::SlotExited(proto::SlotExited {
            slot: 1,
            generation: 1,
            pid: 1,
            status: status.into(),
            ..Default::default()
        }));
        self.go(Input::UpdateDone {
            slot: Some(1),
            next_task: Some(task("b")),
        })
    }

    fn status(&mut self) -> admin::StatusResponse {
        match self.handle(Input::Status).reply {
            Reply::Status(s) => *s,
            other => panic!("{other:?}"),
        }
    }
}

fn grant(effects: &[Effect]) -> Option<u32> {
    effects.iter().find_map(|e| match e {
        Effect::GrantPoll(n) => Some(*n),
        _ => None,
    })
}

/// (slot, execution id, task id) of every assignment sent.
fn assignments(effects: &[Effect]) -> Vec<(u32, String, String)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Send {
                slot,
                message:
                    proto::BrokerMessage {
                        message: Some(proto::broker_message::Message::Assignment(a)),
                    },
                ..
            } => Some((
                *slot,
                a.execution_id.clone(),
                a.attempt.as_ref().unwrap().task_id.clone(),
            )),
            _ => None,
        })
        .collect()
}

/// Each `Stop` sent: the slot and the reason.
fn stop_reasons(effects: &[Effect]) -> Vec<(u32, String)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Send {
                slot,
                message:
                    proto::BrokerMessage {
                        message: Some(proto::broker_message::Message::Stop(stop)),
                    },
                ..
            } => Some((*slot, stop.reason.clone())),
            _ => None,
        })
        .collect()
}

fn stops(effects: &[Effect]) -> Vec<u32> {
    stop_reasons(effects)
        .into_iter()
        .map(|(slot, _)| slot)
        .collect()
}

fn reports(effects: &[Effect]) -> Vec<Report> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Report(r) => Some((**r).clone()),
            _ => None,
        })
        .collect()
}

fn hand_backs(effects: &[Effect]) -> Vec<String> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::HandBack(h) => Some(h.ids.task_id.clone()),
            _ => None,
        })
        .collect()
}

fn reason(report: &Report) -> String {
    match report.result.outcome() {
        Outcome::Failed(r) | Outcome::FailedTerminal(r) => r.as_str().to_owned(),
        Outcome::Completed(_) => String::new(),
    }
}

#[test]
fn attach_needs_the_current_generation_and_its_token() {
    let mut h = Harness::new(1, true);
    // Before the supervisor announced the slot, nothing attaches.
    assert_eq!(
        h.hello(1, 1).0.unwrap_err().code(),
        tonic::Code::Unauthenticated
    );
    h.started(1, 1).unwrap();
    let (ok, effects) = h.hello(1, 1);
    assert_eq!(ok.unwrap(), (1, 1));
    assert!(
        matches!(
            &effects[..],
            [
                Effect::Send {
                    slot: 1,
                    generation: 1,
                    message: proto::BrokerMessage {
                        message: Some(proto::broker_message::Message::Welcome(_))
                    }
                },
                ..
            ]
        ),
        "{effects:?}"
    );
    assert_eq!(
        h.hello(1, 1).0.unwrap_err().code(),
        tonic::Code::AlreadyExists
    );
    h.started(1, 2).unwrap();
    assert_eq!(
        h.hello(1, 1).0.unwrap_err().code(),
        tonic::Code::Unauthenticated
    );
    let bad = h.handle(Input::Hello(proto::Hello {
        protocol_version: proto::ProtocolVersion::ProtocolVersion1 as i32,
        credentials: Some(proto::SlotCredentials {
            slot: 1,
            generation: 2,
            token: "wrong".into(),
        }),
        pid: 1,
        worker_id: String::new(),
        body_at_dispatch: false,
    }));
    assert!(matches!(bad.reply, Reply::Hello(Err(s)) if s.message() == "wrong slot token"));
}

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

#[test]
fn exit_report_then_stream_end_fail_the_assignment_once() {
    let mut h = Harness::new(1, true);
    h.up(1);
    let (_, execution, _) = assignments(&h.deliver(&["a"])).remove(0);
    let effects = h.go(Input::SlotExited(proto::SlotExited {
        slot: 1,
        generation: 1,
        pid: 4242,
        status: "killed by signal 9".into(),
        ..Default::default()
    }));
    let failed = reports(&effects);
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].result.status(), ResultStatus::Failed);
    assert_eq!(
        reason(&failed[0]),
        format!(
            "executor t0001 (pid 4242, generation 1) exited (killed by signal 9) while running execution {execution}; crash 1 of 3 counted against this workflow task (PERAGO_POISON_AFTER=3)"
        )
    );
    assert!(effects.contains(&Effect::Detach { slot: 1 }));
    assert!(
        reports(&h.go(Input::StreamEnded {
            slot: 1,
            generation: 1
        }))
        .is_empty()
    );
    assert_eq!(h.counters.executor_exits.get(), 1);
}

#[test]
fn stream_end_then_exit_report_fail_the_assignment_once_with_the_status() {
    let mut h = Harness::new(1, true);
    h.up(1);
    let (_, execution, _) = assignments(&h.deliver(&["a"])).remove(0);
    let effects = h.go(Input::StreamEnded {
        slot: 1,
        generation: 1,
    });
    assert!(reports(&effects).is_empty(), "waits for the exit status");
    assert!(effects.contains(&Effect::ArmExitGrace {
        slot: 1,
        generation: 1
    }));
    let failed = reports(&h.go(Input::SlotExited(proto::SlotExited {
        slot: 1,
        generation: 1,
        pid: 7,
        status: "exit status 3".into(),
        ..Default::default()
    })));
    assert_eq!(failed.len(), 1);
    assert!(
        reason(&failed[0]).contains("exited (exit status 3) while running execution"),
        "{}",
        reason(&failed[0])
    );
    assert!(reason(&failed[0]).contains(&execution));
    assert!(
        reports(&h.go(Input::StreamGraceOver {
            slot: 1,
            generation: 1
        }))
        .is_empty()
    );
}

#[test]
fn stream_end_without_an_exit_report_fails_after_the_grace() {
    let mut h = Harness::new(1, true);
    h.up(1);
    h.deliver(&["a"]);
    h.go(Input::StreamEnded {
        slot: 1,
        generation: 1,
    });
    let failed = reports(&h.go(Input::StreamGraceOver {
        slot: 1,
        generation: 1,
    }));
    assert_eq!(failed.len(), 1);
    assert!(reason(&failed[0]).contains("(attach stream closed)"));
}

/// The bug this machine was written to test: a SlotStarted that arrives before the previous
/// generation's SlotExited used to set the new generation first, so the old one's in-flight
/// task was never reported (and its lease extended forever).
#[test]
fn slot_started_before_slot_exited_fails_the_old_generations_task() {
    let mut h = Harness::new(1, true);
    h.up(1);
    let (_, execution, _) = assignments(&h.deliver(&["a"])).remove(0);
    let out = h.handle(Input::SlotStarted(proto::SlotStarted {
        slot: 1,
        generation: 2,
        token: format!("{TOKEN}-2"),
        pid: 0,
    }));
    assert!(matches!(out.reply, Reply::SlotStarted(Ok(()))));
    let failed = reports(&out.effects);
    assert_eq!(failed.len(), 1, "{:?}", out.effects);
    assert_eq!(failed[0].task_id, "a");
    assert_eq!(failed[0].execution_id, execution);
    assert!(reason(&failed[0]).contains("replaced by a new generation"));
    assert!(out.effects.contains(&Effect::Detach { slot: 1 }));
    // The late exit report of generation 1 changes nothing.
    assert!(
        h.go(Input::SlotExited(proto::SlotExited {
            slot: 1,
            generation: 1,
            pid: 1,
            status: "x".into(),
            ..Default::default()
        }))
        .iter()
        .all(|e| !matches!(e, Effect::Report(_)))
    );
    // Generation 2 attaches and works.
    h.hello(1, 2).0.unwrap();
    assert_eq!(h.poll(), Some(1));
}

#[test]
fn an_old_or_unknown_slot_started_is_refused() {
    let mut h = Harness::new(1, true);
    h.started(1, 1).unwrap();
    h.started(1, 2).unwrap();
    assert_eq!(
        h.started(1, 1).unwrap_err().code(),
        tonic::Code::FailedPrecondition
    );
    assert_eq!(
        h.started(1, 0).unwrap_err().code(),
        tonic::Code::FailedPrecondition
    );
    assert_eq!(h.started(2, 1).unwrap_err().code(), tonic::Code::NotFound);
}

fn started_with(h: &mut Harness, slot: u32, generation: u64, token: &str) -> Reply {
    h.handle(Input::SlotStarted(proto::SlotStarted {
        slot,
        generation,
        token: token.into(),
        pid: 0,
    }))
    .reply
}

/// A control message holding the token but out of order (a stolen token used to jump ahead,
/// a replay) is refused and changes nothing: the live executor keeps its slot and its task,
/// and the supervisor's own next generation is still taken afterwards.
#[test]
fn slot_started_takes_generations_only_in_order() {
    let mut h = Harness::new(1, true);
    h.up(1);
    let (_, execution, _) = assignments(&h.deliver(&["a"])).remove(0);
    for (generation, token) in [
        (5, "forged"),
        (u64::MAX, "forged"),
        (1, "forged"),
        (0, ""),
        // A replay of the current generation's own announcement: it is attached already.
        (1, &*format!("{TOKEN}-1")),
    ] {
        let out = h.handle(Input::SlotStarted(proto::SlotStarted {
            slot: 1,
            generation,
            token: token.into(),
            pid: 0,
        }));
        let Reply::SlotStarted(Err(status)) = out.reply else {
            panic!("generation {generation} was taken: {:?}", out.reply);
        };
        assert_eq!(status.code(), tonic::Code::FailedPrecondition);
        assert_eq!(
            status.message(),
            format!("slot 1 is at generation 1: it takes generation 2 next, not {generation}")
        );
        assert!(out.effects.is_empty(), "{:?}", out.effects);
    }
    // Generation 1 still runs its task and completes it.
    let done = h.complete(1, 1, "a", &execution);
    assert_eq!(reports(&done).len(), 1);
    assert_eq!(reports(&done)[0].result.status(), ResultStatus::Completed);
    // The supervisor's next generation is taken; its retry (same token, before the executor
    // attached) is answered as taken and changes nothing; another token is not.
    h.started(1, 2).unwrap();
    let retry = h.handle(Input::SlotStarted(proto::SlotStarted {
        slot: 1,
        generation: 2,
        token: format!("{TOKEN}-2"),
        pid: 0,
    }));
    assert!(matches!(retry.reply, Reply::SlotStarted(Ok(()))));
    assert!(retry.effects.is_empty());
    assert!(matches!(
        started_with(&mut h, 1, 2, "forged"),
        Reply::SlotStarted(Err(_))
    ));
    h.hello(1, 2).0.unwrap();
    // Once attached, even the right token cannot announce generation 2 again.
    assert!(matches!(
        started_with(&mut h, 1, 2, &format!("{TOKEN}-2")),
        Reply::SlotStarted(Err(_))
    ));
    assert_eq!(h.poll(), Some(1));
}

#[test]
fn the_fence_answers_only_the_current_assignment_of_the_caller() {
    let mut h = Harness::new(2, true);
    h.up(2);
    let sent = assignments(&h.deliver(&["a"]));
    let (slot, execution, _) = &sent[0];
    let fence = |h: &mut Harness, slot: u32, token: String, execution: &str| match h
        .handle(Input::FenceTarget {
            credentials: proto::SlotCredentials {
                slot,
                generation: 1,
                token,
            },
            execution_id: execution.to_owned(),
        })
        .reply
    {
        Reply::Fence(r) => r,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        fence(&mut h, *slot, format!("{TOKEN}-1"), execution).unwrap(),
        "a"
    );
    let other = if *slot == 1 { 2 } else { 1 };
    assert_eq!(
        fence(&mut h, other, format!("{TOKEN}-1"), execution)
            .unwrap_err()
            .code(),
        tonic::Code::FailedPrecondition
    );
    assert_eq!(
        fence(&mut h, *slot, "stolen".into(), execution)
            .unwrap_err()
            .code(),
        tonic::Code::Unauthenticated
    );
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
fn a_failed_send_fails_the_assignment() {
    let mut h = Harness::new(1, true);
    h.up(1);
    let (_, execution, _) = assignments(&h.deliver(&["a"])).remove(0);
    let failed = reports(&h.go(Input::SendFailed {
        slot: 1,
        generation: 1,
    }));
    assert_eq!(failed.len(), 1);
    assert!(reason(&failed[0]).contains(&execution));
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

fn hand_back_effects(effects: &[Effect]) -> Vec<HandBack> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::HandBack(h) => Some(h.clone()),
            _ => None,
        })
        .collect()
}

fn typed_task(id: &str, def_name: Option<&str>, task_type: Option<&str>) -> Polled {
    let mut raw = raw_task(id);
    let fields = raw.as_object_mut().unwrap();
    fields.remove("taskDefName");
    fields.remove("taskType");
    if let Some(name) = def_name {
        fields.insert("taskDefName".into(), name.into());
    }
    if let Some(name) = task_type {
        fields.insert("taskType".into(), name.into());
    }
    fields.insert("outputData".into(), json!({"saved": "by its own worker"}));
    Polled::Task(PolledTask::from_value(raw))
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

#[test]
fn status_shows_each_slot() {
    let mut h = Harness::new(2, true);
    h.up(1);
    h.deliver(&["a"]);
    h.go(Input::Progress {
        slot: 1,
        generation: 1,
        progress: proto::Progress {
            execution_id: String::new(),
            phase: proto::Phase::Body as i32,
        },
    });
    let status = h.status();
    assert_eq!(status.slots[0].state, admin::SlotState::Busy as i32);
    assert_eq!(status.slots[0].task_id, "a");
    assert_eq!(status.slots[1].state, admin::SlotState::Waiting as i32);
}

/// An executor that starts bodies at dispatch sends no `Body` progress: the broker shows the
/// body phase from the assignment on. One that prepares first shows "preparing" until it
/// reports a phase, and a new generation says afresh which kind it is.
#[test]
fn the_phase_at_dispatch_is_what_the_executor_said_at_attach() {
    let mut h = Harness::new(2, true);
    h.started(1, 1).unwrap();
    h.hello_with(1, 1, true).0.unwrap();
    h.started(2, 1).unwrap();
    h.hello_with(2, 1, false).0.unwrap();
    h.deliver(&["a", "b"]);
    let status = h.status();
    assert!(
        status.slots.iter().all(|s| !s.task_id.is_empty()),
        "both busy"
    );
    assert_eq!(status.slots[0].phase, "body");
    assert_eq!(status.slots[1].phase, "preparing");
    let execution_id = h.status().slots[1].execution_id.clone();
    h.go(Input::Progress {
        slot: 2,
        generation: 1,
        progress: proto::Progress {
            execution_id,
            phase: proto::Phase::Body as i32,
        },
    });
    assert_eq!(h.status().slots[1].phase, "body");
}

/// Attempt `id` of workflow task `t_ref` in `workflow`.
fn task_in(id: &str, workflow: &str) -> Polled {
    let mut t = raw_task(id);
    t["workflowInstanceId"] = json!(workflow);
    Polled::Task(PolledTask::from_value(t))
}

/// Attempt `id` of workflow task `t_ref` in `workflow`, Conductor's retry of `retried`.
fn retry_in(id: &str, workflow: &str, retried: &str) -> Polled {
    let mut t = raw_task(id);
    t["workflowInstanceId"] = json!(workflow);
    t["retriedTaskId"] = json!(retried);
    Polled::Task(PolledTask::from_value(t))
}

fn capacity_with(change: impl FnOnce(&mut perago_core::capacity::Capacity)) -> Harness {
    let mut capacity = perago_core::capacity::Capacity::fixed(1);
    change(&mut capacity);
    Harness::with_capacity(capacity, false)
}

/// An exit report of slot 1's `generation`: ended by `signal`, or exited with `code`.
fn exit_of(generation: u64, signal: Option<i32>, code: Option<i32>) -> proto::SlotExited {
    let status = match (signal, code) {
        (Some(9), _) => "signal 9 (SIGKILL)".to_owned(),
        (Some(n), _) => format!("signal {n}"),
        (None, Some(c)) => format!("exit status {c}"),
        (None, None) => "unknown status".to_owned(),
    };
    proto::SlotExited {
        slot: 1,
        generation,
        pid: 99,
        status,
        signal,
        exit_code: code,
        ..Default::default()
    }
}

impl Harness {
    /// Generation `generation` of slot 1 starts, runs `task` and is SIGKILLed, well apart
    /// (past the burst window) from any earlier death; the report of its failure.
    fn crash(&mut self, generation: u64, task: Polled) -> Report {
        let mut failed = reports(&self.crash_with(task, exit_of(generation, Some(9), None)));
        assert_eq!(failed.len(), 1);
        failed.remove(0)
    }

    /// Slot 1 starts `exited.generation`, runs `task` and ends as `exited` says, a burst
    /// window after the last death; the effects of the exit report.
    fn crash_with(&mut self, task: Polled, exited: proto::SlotExited) -> Vec<Effect> {
        let generation = exited.generation;
        self.advance(crate::poison::BURST_WINDOW + Duration::from_secs(1));
        self.started(1, generation).unwrap();
        self.hello(1, generation).0.unwrap();
        let granted = self.poll().expect("a grant");
        let effects = self.go(Input::Polled {
            tasks: vec![task],
            reserved: granted,
        });
        assert_eq!(assignments(&effects).len(), 1, "{effects:?}");
        self.go(Input::SlotExited(exited))
    }

    /// Moves the machine's clock (burst detection) on by `by`.
    fn advance(&mut self, by: Duration) {
        self.now = self.now.after(by);
    }
}

#[test]
fn a_workflow_task_that_kills_its_executor_three_times_fails_for_good() {
    let mut h = Harness::new(1, false);
    let first = h.crash(1, task_in("a1", "wf-poison"));
    assert_eq!(first.result.status(), ResultStatus::Failed);
    assert!(
        reason(&first)
            .ends_with("; crash 1 of 3 counted against this workflow task (PERAGO_POISON_AFTER=3)"),
        "{}",
        reason(&first)
    );
    let second = h.crash(2, retry_in("a2", "wf-poison", "a1"));
    assert_eq!(second.result.status(), ResultStatus::Failed);
    assert!(
        reason(&second)
            .ends_with("; crash 2 of 3 counted against this workflow task (PERAGO_POISON_AFTER=3)")
    );
    // Another workflow's crashes are its own.
    let other = h.crash(3, task_in("b1", "wf-other"));
    assert_eq!(other.result.status(), ResultStatus::Failed);
    assert!(reason(&other).contains("; crash 1 of 3 counted"));
    assert_eq!(h.counters.tasks_poisoned.get(), 0);
    let third = h.crash(4, retry_in("a3", "wf-poison", "a2"));
    assert_eq!(third.task_id, "a3");
    assert_eq!(third.result.status(), ResultStatus::FailedWithTerminalError);
    assert_eq!(
        reason(&third),
        format!(
            "poison task: attempts of workflow task t_ref in workflow wf-poison killed their executor 3 times (PERAGO_POISON_AFTER=3); last: executor t0001 (pid 99, generation 4) exited (signal 9 (SIGKILL)) while running execution {}",
            third.execution_id
        )
    );
    assert_eq!(h.counters.tasks_poisoned.get(), 1);
    assert_eq!(h.status().counters.unwrap().tasks_poisoned, 1);
    // The other workflow is at its second crash: still retried.
    let other = h.crash(5, retry_in("b2", "wf-other", "b1"));
    assert_eq!(other.result.status(), ResultStatus::Failed);
    // A rerun of the poisoned workflow task (Conductor's retry of the poisoned attempt) starts
    // its count afresh: Conductor's record says so (a poison verdict resets it).
    let effects = h.crash_with(retry_in("a4", "wf-poison", "a3"), exit_of(6, Some(9), None));
    let read = history_read(&effects).expect("the ledger forgot the poisoned task: ask Conductor");
    assert_eq!(read.retried_task_id, "a3");
    let rerun = reports(&h.go(Input::CrashHistory {
        execution_id: read.execution_id,
        counted: Some(0),
    }));
    assert_eq!(rerun[0].result.status(), ResultStatus::Failed);
    assert!(
        reason(&rerun[0])
            .ends_with("crash 1 of 3 counted against this workflow task (PERAGO_POISON_AFTER=3)")
    );
    assert_eq!(h.counters.tasks_poisoned.get(), 1);
}

fn history_read(effects: &[Effect]) -> Option<HistoryRead> {
    effects.iter().find_map(|e| match e {
        Effect::ReadCrashHistory(read) => Some((**read).clone()),
        _ => None,
    })
}

/// Issue #23, item 1: outside kills that hit several workflow tasks within the burst window
/// (random SIGKILLs, an OOM killer's spree) are not the tasks' doing and are not counted;
/// a body that kills its own executor on every attempt, with nothing else dying, still is.
#[test]
fn a_burst_of_outside_kills_is_not_counted_against_any_task() {
    let mut h = capacity_with(|c| c.poison_after = 2);
    let first = h.crash(1, task_in("a1", "wf-a"));
    assert!(
        reason(&first)
            .ends_with("crash 1 of 2 counted against this workflow task (PERAGO_POISON_AFTER=2)")
    );
    // Another workflow task's executor is killed 5 s later: a burst.
    h.advance(Duration::from_secs(5));
    h.started(1, 2).unwrap();
    h.hello(1, 2).0.unwrap();
    let granted = h.poll().unwrap();
    h.go(Input::Polled {
        tasks: vec![task_in("b1", "wf-b")],
        reserved: granted,
    });
    let b = reports(&h.go(Input::SlotExited(exit_of(2, Some(9), None))));
    assert_eq!(b[0].result.status(), ResultStatus::Failed);
    assert_eq!(
        reason(&b[0]),
        format!(
            "executor t0001 (pid 99, generation 2) exited (signal 9 (SIGKILL)) while running execution {}; not counted against the task: 1 other executor deaths in the last 20 s (a burst, not this task's doing); 0 of 2 counted so far",
            b[0].execution_id
        )
    );
    // wf-a's retry is killed 5 s after that: wf-b's death makes it a burst too, and the
    // running total (1) carries on for the attempt after.
    h.advance(Duration::from_secs(5));
    h.started(1, 3).unwrap();
    h.hello(1, 3).0.unwrap();
    let granted = h.poll().unwrap();
    h.go(Input::Polled {
        tasks: vec![retry_in("a2", "wf-a", "a1")],
        reserved: granted,
    });
    let a2 = reports(&h.go(Input::SlotExited(exit_of(3, Some(9), None))));
    assert_eq!(a2[0].result.status(), ResultStatus::Failed);
    assert!(
        reason(&a2[0]).ends_with("; 1 of 2 counted so far"),
        "{}",
        reason(&a2[0])
    );
    // An idle executor killed from outside is burst evidence too.
    h.advance(Duration::from_secs(30));
    h.started(1, 4).unwrap();
    h.hello(1, 4).0.unwrap();
    h.go(Input::SlotExited(exit_of(4, Some(9), None)));
    h.advance(Duration::from_secs(1));
    h.started(1, 5).unwrap();
    h.hello(1, 5).0.unwrap();
    let granted = h.poll().unwrap();
    h.go(Input::Polled {
        tasks: vec![retry_in("a3", "wf-a", "a2")],
        reserved: granted,
    });
    let a3 = reports(&h.go(Input::SlotExited(exit_of(5, Some(9), None))));
    assert_eq!(a3[0].result.status(), ResultStatus::Failed);
    assert!(
        reason(&a3[0]).contains("not counted against the task: 1 other executor deaths"),
        "{}",
        reason(&a3[0])
    );
    // Alone again, the next kill is counted, on top of the total carried along: poisoned.
    let a4 = h.crash(6, retry_in("a4", "wf-a", "a3"));
    assert_eq!(a4.result.status(), ResultStatus::FailedWithTerminalError);
    assert_eq!(h.counters.tasks_poisoned.get(), 1);
}

/// Issue #23, item 1: a death the runtime caused (a supervisor kill, whatever its signal) is
/// never counted; one the executor inflicted on itself (an abort, a fault, an exit code it
/// chose) always is, burst or not.
#[test]
fn supervisor_kills_are_never_counted_and_self_inflicted_deaths_always_are() {
    let mut h = capacity_with(|c| c.poison_after = 2);
    for (generation, cause) in [
        (1, proto::ExitCause::ShutdownDeadline),
        (2, proto::ExitCause::Stalled),
        (3, proto::ExitCause::Supervisor),
        (4, proto::ExitCause::BrokerGone),
    ] {
        let mut exited = exit_of(generation, Some(9), None);
        exited.cause = cause.into();
        let retried = (generation > 1).then(|| format!("a{}", generation - 1));
        let task = match &retried {
            Some(r) => retry_in(&format!("a{generation}"), "wf-a", r),
            None => task_in("a1", "wf-a"),
        };
        let failed = reports(&h.crash_with(task, exited));
        assert_eq!(failed[0].result.status(), ResultStatus::Failed);
        assert!(
            reason(&failed[0]).contains("; not counted against the task: the supervisor "),
            "{}",
            reason(&failed[0])
        );
        assert!(
            reason(&failed[0]).ends_with("; 0 of 2 counted so far"),
            "{}",
            reason(&failed[0])
        );
    }
    assert_eq!(h.counters.tasks_poisoned.get(), 0);
    // A Rust task that aborts its executor, inside a burst of other deaths: counted each time.
    h.advance(Duration::from_secs(1));
    h.started(1, 5).unwrap();
    h.hello(1, 5).0.unwrap();
    h.go(Input::SlotExited(exit_of(5, Some(9), None)));
    let abort = |h: &mut Harness, generation: u64, id: &str, retried: &str| {
        h.advance(Duration::from_secs(1));
        h.started(1, generation).unwrap();
        h.hello(1, generation).0.unwrap();
        let granted = h.poll().unwrap();
        h.go(Input::Polled {
            tasks: vec![retry_in(id, "wf-a", retried)],
            reserved: granted,
        });
        reports(&h.go(Input::SlotExited(exit_of(generation, Some(6), None)))).remove(0)
    };
    let first = abort(&mut h, 6, "a5", "a4");
    assert_eq!(first.result.status(), ResultStatus::Failed);
    assert!(
        reason(&first)
            .ends_with("; crash 1 of 2 counted against this workflow task (PERAGO_POISON_AFTER=2)"),
        "{}",
        reason(&first)
    );
    let second = abort(&mut h, 7, "a6", "a5");
    assert_eq!(
        second.result.status(),
        ResultStatus::FailedWithTerminalError
    );
    // An exit code the executor chose counts as well.
    let mut h = capacity_with(|c| c.poison_after = 1);
    let failed = reports(&h.crash_with(task_in("c1", "wf-c"), exit_of(1, None, Some(101))));
    assert_eq!(
        failed[0].result.status(),
        ResultStatus::FailedWithTerminalError
    );
}

/// Issue #23, item 1: the count of a retry this broker did not see fail (it ran on another
/// runtime, or before a restart) comes from Conductor's record; the result waits for it,
/// a drain waits for it, and a failed read falls back on the local count.
#[test]
fn a_crash_the_ledger_cannot_vouch_for_waits_for_conductors_record() {
    let mut h = capacity_with(|c| c.poison_after = 3);
    let effects = h.crash_with(retry_in("a3", "wf-a", "a2"), exit_of(1, Some(9), None));
    assert!(reports(&effects).is_empty(), "parked: {effects:?}");
    let read = history_read(&effects).expect("a history read");
    assert_eq!(
        read,
        HistoryRead {
            execution_id: read.execution_id.clone(),
            task_id: "a3".into(),
            retried_task_id: "a2".into(),
            workflow_instance_id: "wf-a".into(),
            reference_task_name: "t_ref".into(),
            task_def_name: "t".into(),
        }
    );
    assert!(
        !effects
            .iter()
            .any(|e| matches!(e, Effect::StopLease { .. })),
        "the lease goes on"
    );
    // A drain waits for the parked result.
    let drained = |effects: &[Effect]| effects.iter().any(|e| matches!(e, Effect::Drained));
    let d = h.go(Input::Drain);
    assert!(!drained(&d), "{d:?}");
    let d = h.go(Input::StreamEnded {
        slot: 1,
        generation: 1,
    });
    assert!(!drained(&d), "{d:?}");
    // Conductor says two crashes were counted before: this is the third.
    let out = h.go(Input::CrashHistory {
        execution_id: read.execution_id.clone(),
        counted: Some(2),
    });
    let failed = reports(&out);
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].task_id, "a3");
    assert_eq!(
        failed[0].result.status(),
        ResultStatus::FailedWithTerminalError
    );
    assert!(reason(&failed[0]).starts_with("poison task: attempts of workflow task t_ref in workflow wf-a killed their executor 3 times"));
    // A second answer for it finds nothing parked.
    assert!(
        reports(&h.go(Input::CrashHistory {
            execution_id: read.execution_id,
            counted: Some(0)
        }))
        .is_empty()
    );
    let d = h.go(Input::UpdateDone {
        slot: None,
        next_task: None,
    });
    assert!(drained(&d), "{d:?}");

    // A failed read counts on this broker's own count: never more.
    let mut h = capacity_with(|c| c.poison_after = 2);
    let effects = h.crash_with(retry_in("b5", "wf-b", "b4"), exit_of(1, Some(9), None));
    let read = history_read(&effects).unwrap();
    let failed = reports(&h.go(Input::CrashHistory {
        execution_id: read.execution_id,
        counted: None,
    }));
    assert_eq!(failed[0].result.status(), ResultStatus::Failed);
    assert!(
        reason(&failed[0])
            .ends_with("crash 1 of 2 counted against this workflow task (PERAGO_POISON_AFTER=2)")
    );
    // That count vouches for the next retry of exactly this attempt: no read.
    let effects = h.crash_with(retry_in("b6", "wf-b", "b5"), exit_of(2, Some(9), None));
    assert!(history_read(&effects).is_none());
    assert_eq!(
        reports(&effects)[0].result.status(),
        ResultStatus::FailedWithTerminalError
    );
}

#[test]
fn loop_iterations_are_counted_apart() {
    let mut h = capacity_with(|c| c.poison_after = 2);
    let iteration = |id: &str, n: u32| {
        let mut t = raw_task(id);
        t["iteration"] = json!(n);
        Polled::Task(PolledTask::from_value(t))
    };
    // raw_task puts each id in its own workflow: keep one workflow for every attempt.
    let in_one = |p: Polled| match p {
        Polled::Task(mut t) => {
            t.fields["workflowInstanceId"] = json!("wf-loop");
            Polled::Task(t)
        }
        other => other,
    };
    let first = h.crash(1, in_one(iteration("i1", 1)));
    let second = h.crash(2, in_one(iteration("i2", 2)));
    assert_eq!(first.result.status(), ResultStatus::Failed);
    assert_eq!(second.result.status(), ResultStatus::Failed);
    let retry = match in_one(iteration("i3", 2)) {
        Polled::Task(mut t) => {
            t.fields.insert("retriedTaskId".into(), json!("i2"));
            Polled::Task(t)
        }
        other => other,
    };
    let again = h.crash(3, retry);
    assert_eq!(again.result.status(), ResultStatus::FailedWithTerminalError);
}

#[test]
fn poison_after_zero_never_fails_a_task_for_good() {
    let mut h = capacity_with(|c| c.poison_after = 0);
    for generation in 1..=6 {
        let failed = h.crash(generation, task_in(&format!("a{generation}"), "wf"));
        assert_eq!(failed.result.status(), ResultStatus::Failed);
    }
    assert_eq!(h.counters.tasks_poisoned.get(), 0);
}

#[test]
fn a_kill_during_a_drain_is_not_the_tasks_doing() {
    let mut h = capacity_with(|c| c.poison_after = 1);
    h.up(1);
    let granted = h.poll().unwrap();
    h.go(Input::Polled {
        tasks: vec![task_in("a1", "wf")],
        reserved: granted,
    });
    h.go(Input::Drain);
    let failed = reports(&h.go(Input::SlotExited(proto::SlotExited {
        slot: 1,
        generation: 1,
        pid: 99,
        status: "killed by the supervisor at the shutdown deadline".into(),
        ..Default::default()
    })));
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].result.status(), ResultStatus::Failed);
    assert_eq!(h.counters.tasks_poisoned.get(), 0);
    // The same threshold outside a drain fails the first crash for good.
    let mut h = capacity_with(|c| c.poison_after = 1);
    let failed = h.crash(1, task_in("a1", "wf"));
    assert_eq!(
        failed.result.status(),
        ResultStatus::FailedWithTerminalError
    );
}

#[test]
fn the_crash_ledger_stays_bounded() {
    let mut h = capacity_with(|c| c.poison_after = 2);
    let total = crate::poison::MAX_TRACKED as u64 + 1;
    for n in 0..total {
        h.crash(n + 1, task_in(&format!("t{n}"), &format!("wf{n}")));
    }
    assert_eq!(h.m.crashes.len(), crate::poison::MAX_TRACKED);
    // The oldest workflow task was forgotten: its next crash asks Conductor.
    let effects = h.crash_with(
        retry_in("again", "wf0", "t0"),
        exit_of(total + 1, Some(9), None),
    );
    assert!(history_read(&effects).is_some(), "{effects:?}");
    // The newest is remembered: its second crash poisons it.
    let failed = h.crash(
        total + 2,
        retry_in(
            "again2",
            &format!("wf{}", total - 1),
            &format!("t{}", total - 1),
        ),
    );
    assert_eq!(
        failed.result.status(),
        ResultStatus::FailedWithTerminalError
    );
}

const GIB: u64 = 1 << 30;

fn with_min_free_memory(slots: u32, min: u64) -> Harness {
    let mut capacity = perago_core::capacity::Capacity::fixed(slots);
    capacity.min_free_memory = Some(min);
    Harness::with_capacity(capacity, true)
}

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
fn a_recycling_executor_reports_through_v1_is_stopped_and_its_exit_is_no_failure() {
    let mut h = Harness::new(1, true);
    h.up(1);
    let (_, execution, _) = assignments(&h.deliver(&["a"])).remove(0);
    let effects = h.complete_recycling(
        1,
        1,
        "a",
        &execution,
        "3 assignments reached --max-tasks-per-executor 3",
    );
    let done = reports(&effects);
    assert_eq!(done.len(), 1, "{effects:?}");
    assert_eq!(done[0].result.status(), ResultStatus::Completed);
    assert!(!done[0].use_v2, "no next task for a slot that is leaving");
    assert_eq!(done[0].slot, None);
    assert_eq!(stop_reasons(&effects), vec![(1, "recycle".to_owned())]);
    assert_eq!(h.counters.executors_recycled.get(), 1);
    assert_eq!(h.poll(), None, "a leaving slot takes no task");
    assert_eq!(h.status().slots[0].state, admin::SlotState::Stopping as i32);

    // The executor exits: its stream ends, then the supervisor reports the exit.
    let effects = h.go(Input::StreamEnded {
        slot: 1,
        generation: 1,
    });
    assert!(reports(&effects).is_empty(), "{effects:?}");
    let effects = h.go(Input::SlotExited(proto::SlotExited {
        slot: 1,
        generation: 1,
        pid: 1001,
        status: "exit status 75".into(),
        ..Default::default()
    }));
    assert!(reports(&effects).is_empty(), "{effects:?}");
    assert_eq!(
        h.counters.executor_exits.get(),
        0,
        "a recycled exit is no crash"
    );

    // The next generation takes tasks at once.
    h.started(1, 2).unwrap();
    let (r, effects) = h.hello(1, 2);
    r.unwrap();
    assert_eq!(grant(&effects), Some(1));
    h.go(Input::Polled {
        tasks: vec![task("b")],
        reserved: 1,
    });
    assert_eq!(h.counters.executors_recycled.get(), 1);

    // A crash of that generation still counts.
    h.go(Input::SlotExited(proto::SlotExited {
        slot: 1,
        generation: 2,
        pid: 1001,
        status: "signal 9 (SIGKILL)".into(),
        ..Default::default()
    }));
    assert_eq!(h.counters.executor_exits.get(), 1);
}

#[test]
fn a_drain_after_a_recycle_sends_no_second_stop() {
    let mut h = Harness::new(1, false);
    h.up(1);
    let (_, execution, _) = assignments(&h.deliver(&["a"])).remove(0);
    let effects = h.complete_recycling(
        1,
        1,
        "a",
        &execution,
        "resident memory 80MiB (executor and bodies) above --max-executor-memory 64MiB",
    );
    assert_eq!(reports(&effects).len(), 1);
    assert_eq!(stops(&effects), vec![1]);
    // A drain after it sends no second Stop.
    let effects = h.go(Input::Drain);
    assert!(stops(&effects).is_empty(), "{effects:?}");
    assert_eq!(h.counters.executors_recycled.get(), 1);
}

/// `-j MIN..MAX` with `PERAGO_SCALE_DOWN_AFTER=2s`.
fn adaptive(min: u32, max: u32) -> perago_core::capacity::Capacity {
    perago_core::capacity::Capacity {
        min_executors: min,
        scale_down_after: Duration::from_secs(2),
        ..perago_core::capacity::Capacity::fixed(max)
    }
}

impl Harness {
    /// A queue-depth read of `depth` taken `at` seconds after `t0`.
    fn depth(&mut self, depth: u64, t0: Instant, at: f64) -> Vec<Effect> {
        self.go(Input::QueueDepth {
            depth: Some(depth),
            now: t0 + Duration::from_secs_f64(at),
        })
    }

    fn wanted(&self) -> Vec<u32> {
        self.m
            .slots
            .iter()
            .filter(|s| s.wanted)
            .map(|s| s.number)
            .collect()
    }

    fn states(&mut self) -> Vec<admin::SlotState> {
        self.status().slots.iter().map(|s| s.state()).collect()
    }
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

fn once(slots: u32) -> perago_core::capacity::Capacity {
    perago_core::capacity::Capacity {
        once: true,
        ..perago_core::capacity::Capacity::fixed(slots)
    }
}

fn depth_reads(effects: &[Effect]) -> Vec<Duration> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::ReadQueueDepth { after } => Some(*after),
            _ => None,
        })
        .collect()
}

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

// Liveness (`PERAGO_STALL_TIMEOUT`, issue #23 item 2): the broker pings every attached
// executor at each tick and kills one it has not heard from for the whole timeout.

const STALL: Duration = Duration::from_secs(6);

fn stall_harness(slots: u32) -> Harness {
    let Harness { m, counters, now } = Harness::new(slots, false);
    Harness {
        m: m.with_stall_timeout(Some(STALL)),
        counters,
        now,
    }
}

/// The slots pinged by `effects`.
fn pinged(effects: &[Effect]) -> Vec<u32> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Send {
                slot,
                message:
                    proto::BrokerMessage {
                        message: Some(proto::broker_message::Message::Ping(_)),
                    },
                ..
            } => Some(*slot),
            _ => None,
        })
        .collect()
}

/// The (slot, generation) of every kill ordered.
fn kills(effects: &[Effect]) -> Vec<(u32, u64)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::KillExecutor {
                slot, generation, ..
            } => Some((*slot, *generation)),
            _ => None,
        })
        .collect()
}

/// Ticks every third of the timeout from `start`, `n` times; the effects of each.
fn ticks(h: &mut Harness, start: Instant, from: u32, n: u32) -> Vec<Vec<Effect>> {
    (from..from + n)
        .map(|k| {
            h.go(Input::Tick {
                now: start + STALL / 3 * k,
            })
        })
        .collect()
}

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

mod props;
