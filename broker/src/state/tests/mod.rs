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
            body_version: 0,
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
        self.complete_measured(slot, generation, task_id, execution_id, recycle, 0)
    }

    /// A completion that says what its body's memory cgroup counted as its peak (0: none).
    fn complete_measured(
        &mut self,
        slot: u32,
        generation: u64,
        task_id: &str,
        execution_id: &str,
        recycle: &str,
        body_peak_memory_bytes: u64,
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
                body_peak_memory_bytes,
                body_oom_killed: false,
                spans: Vec::new(),
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

fn started_with(h: &mut Harness, slot: u32, generation: u64, token: &str) -> Reply {
    h.handle(Input::SlotStarted(proto::SlotStarted {
        slot,
        generation,
        token: token.into(),
        pid: 0,
        body_version: 0,
    }))
    .reply
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

fn history_read(effects: &[Effect]) -> Option<HistoryRead> {
    effects.iter().find_map(|e| match e {
        Effect::ReadCrashHistory(read) => Some((**read).clone()),
        _ => None,
    })
}

const GIB: u64 = 1 << 30;

fn with_min_free_memory(slots: u32, min: u64) -> Harness {
    let mut capacity = perago_core::capacity::Capacity::fixed(slots);
    capacity.min_free_memory = Some(min);
    Harness::with_capacity(capacity, true)
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

mod dispatch;
mod drain;
mod liveness;
mod once;
mod pause;
mod poison;
mod profile;
mod props;
mod reconfigure;
mod roll;
mod scale;
mod scaling;
mod share;
mod slots;

/// Issue #26, item 1: Admin.Status says which domain the runtime polls in (empty: none).
#[test]
fn status_shows_the_domain() {
    let mut h = Harness::new(1, true);
    assert_eq!(h.status().domain, "");
    h.m = std::mem::replace(&mut h.m, Harness::new(1, true).m)
        .with_domain(Some(perago_core::conductor::Domain::parse("blue").unwrap()));
    assert_eq!(h.status().domain, "blue");
}
