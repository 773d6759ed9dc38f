//! Property tests: random sequences of inputs (polls returning none, some or too many tasks,
//! starts, attaches, completions, exits, update answers, crash-history answers, queue
//! depths, lost leases, ticks, live scales, drains), fed to the machine through a small world
//! that plays the actor, the executors, the supervisor, the poller and Conductor as the effects
//! say.
//! After every step: never more than N tasks are held; no task ends twice (a report, a
//! hand-back or, for a held task whose lease was lost, its drop); a drain that completes
//! leaves nothing in flight. At the end a drain settles everything, and every task received
//! has ended exactly once.

use super::*;
use perago_core::capacity::Capacity;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// One thing that happens around the machine. Indices pick among what is possible now (a
/// slot, an outstanding update); a step that is not possible now does nothing.
#[derive(Debug, Clone)]
enum Step {
    /// The supervisor starts the next generation of a slot whose process is not running (and
    /// its executor attaches at once, or not yet).
    Start(u8, bool),
    /// That generation's executor attaches.
    Attach(u8),
    /// The granted poll returns this many tasks (at most one more than granted).
    PollReturn(u8),
    /// The granted poll fails.
    PollFail,
    /// A slot's executor completes its assignment (recycling or not).
    Complete(u8, bool),
    /// A slot's process dies: 0 exit report only, 1 stream end then exit report, 2 stream
    /// end, the grace, then the exit report; by a crash (code 1) or a SIGKILL.
    Exit(u8, u8, bool),
    /// An outstanding update is answered: 0 ok, 1 ok with a next task (update-v2), 2 failed
    /// or lost, 3 the server has no update-v2 (then it goes through v1).
    Answer(u8, u8),
    /// An outstanding crash-history read is answered (or could not be read).
    History(u8, bool),
    /// An outstanding queue-depth read is answered with this depth (or could not be read).
    Depth(u8, bool),
    /// The lease of a task received is found lost.
    LeaseLost(u8),
    /// Time passes (milliseconds), with a liveness tick.
    Tick(u16),
    /// Polling is paused (true) or resumed (false).
    Pause(bool),
    /// `Admin.Scale` within the slots the runtime has (the range's minimum and width, each
    /// taken modulo what fits): retired slots drain their task first.
    Scale(u8, u8),
    /// A drain starts.
    Drain,
}

fn step() -> impl Strategy<Value = Step> {
    // A drain is rare, so that most sequences get to run tasks before it.
    prop_oneof![
        16 => (any::<u8>(), prop::bool::weighted(0.8)).prop_map(|(s, a)| Step::Start(s, a)),
        4 => any::<u8>().prop_map(Step::Attach),
        24 => (0u8..5).prop_map(Step::PollReturn),
        4 => Just(Step::PollFail),
        20 => (any::<u8>(), prop::bool::weighted(0.2)).prop_map(|(s, r)| Step::Complete(s, r)),
        8 => (any::<u8>(), 0u8..3, any::<bool>()).prop_map(|(s, h, c)| Step::Exit(s, h, c)),
        20 => (any::<u8>(), 0u8..4).prop_map(|(i, h)| Step::Answer(i, h)),
        4 => (any::<u8>(), any::<bool>()).prop_map(|(i, r)| Step::History(i, r)),
        8 => (0u8..4, prop::bool::weighted(0.8)).prop_map(|(d, r)| Step::Depth(d, r)),
        4 => any::<u8>().prop_map(Step::LeaseLost),
        8 => (0u16..4000).prop_map(Step::Tick),
        3 => any::<bool>().prop_map(Step::Pause),
        3 => (any::<u8>(), any::<u8>()).prop_map(|(a, b)| Step::Scale(a, b)),
        1 => Just(Step::Drain),
    ]
}

/// The runtime's settings: slots, and fixed (0), adaptive (1) or run once (2); liveness on or
/// off; whether the server has update-v2.
#[derive(Debug, Clone)]
struct Setup {
    slots: u32,
    mode: u8,
    stall: bool,
    v2: bool,
}

fn setup() -> impl Strategy<Value = Setup> {
    (1u32..=3, 0u8..3, any::<bool>(), any::<bool>()).prop_map(|(slots, mode, stall, v2)| Setup {
        slots,
        mode,
        stall,
        v2,
    })
}

/// What the world knows of one slot's process.
#[derive(Debug, Default)]
struct Process {
    generation: u64,
    /// Started and not exited.
    alive: bool,
    /// This generation said hello (attached or refused).
    greeted: bool,
    /// The generation whose stream the broker holds (the actor's connection).
    conn: Option<u64>,
    /// The assignment it was sent and has not completed: (execution id, task id).
    assignment: Option<(String, String)>,
}

/// An update (a report or a hand-back) waiting for its answer.
#[derive(Debug)]
struct Pending {
    slot: Option<u32>,
    v2: bool,
}

/// The machine with everything around it.
struct World {
    h: Harness,
    slots: usize,
    processes: Vec<Process>,
    /// The poller waits for a grant.
    poll_waiting: bool,
    /// The grant of the poll in flight.
    granted: Option<u32>,
    /// The poller was told to stop (a grant of 0).
    poller_stopped: bool,
    updates: Vec<Pending>,
    /// Crash-history reads in flight, by execution id.
    histories: Vec<String>,
    depth_reads: usize,
    graces: Vec<(u32, u64)>,
    tasks_made: u32,
    received: BTreeSet<String>,
    /// How each task received ended.
    ended: BTreeMap<String, &'static str>,
    /// Execution id → task id (from leases and assignments).
    executions: BTreeMap<String, String>,
    drained: bool,
}

impl World {
    fn new(setup: &Setup) -> Self {
        let n = setup.slots;
        let capacity = match setup.mode {
            0 => Capacity::fixed(n),
            1 => Capacity {
                min_executors: 1,
                scale_down_after: Duration::from_secs(2),
                ..Capacity::fixed(n)
            },
            _ => Capacity {
                once: true,
                ..Capacity::fixed(n)
            },
        };
        let mut h = Harness::with_capacity(capacity, setup.v2);
        if setup.stall {
            h.m = h.m.with_stall_timeout(Some(Duration::from_secs(6)));
        }
        Self {
            h,
            slots: n as usize,
            processes: (0..n).map(|_| Process::default()).collect(),
            poll_waiting: false,
            granted: None,
            poller_stopped: false,
            updates: Vec::new(),
            histories: Vec::new(),
            depth_reads: 0,
            graces: Vec::new(),
            tasks_made: 0,
            received: BTreeSet::new(),
            ended: BTreeMap::new(),
            executions: BTreeMap::new(),
            drained: false,
        }
    }

    /// A new task; every third is a retry whose earlier attempt this broker never saw (its
    /// crash count waits for Conductor's record).
    fn new_task(&mut self) -> Polled {
        self.tasks_made += 1;
        let n = self.tasks_made;
        let id = format!("task-{n}");
        let mut raw = raw_task(&id);
        raw["workflowInstanceId"] = json!(format!("wf-{}", n % 3));
        raw["referenceTaskName"] = json!(format!("ref-{}", n % 2));
        if n.is_multiple_of(3) {
            raw["retryCount"] = json!(1);
            raw["retriedTaskId"] = json!(format!("earlier-{n}"));
        }
        self.received.insert(id);
        Polled::Task(PolledTask::from_value(raw))
    }

    /// Feeds one input as the actor does: the reply first (an accepted hello gets its
    /// connection), then the effects in order, each failed send fed back at once.
    fn feed(&mut self, input: Input) -> Reply {
        let hello = match &input {
            Input::Hello(hello) => hello.credentials.as_ref().map(|c| (c.slot, c.generation)),
            _ => None,
        };
        let out = self.h.handle(input);
        if let (Some((slot, generation)), Reply::Hello(Ok(_))) = (hello, &out.reply) {
            self.processes[slot as usize - 1].conn = Some(generation);
        }
        let mut queue = VecDeque::from(out.effects);
        while let Some(effect) = queue.pop_front() {
            if let Some(feedback) = self.perform(effect) {
                queue.extend(self.h.handle(feedback).effects);
            }
        }
        self.check();
        out.reply
    }

    fn perform(&mut self, effect: Effect) -> Option<Input> {
        match effect {
            Effect::Send {
                slot,
                generation,
                message,
            } => {
                let process = &mut self.processes[slot as usize - 1];
                if process.conn != Some(generation) {
                    return Some(Input::SendFailed { slot, generation });
                }
                if let Some(proto::broker_message::Message::Assignment(a)) = message.message {
                    let task_id = a.attempt.expect("an attempt").task_id;
                    self.executions
                        .insert(a.execution_id.clone(), task_id.clone());
                    process.assignment = Some((a.execution_id, task_id));
                }
            }
            Effect::Detach { slot } => self.processes[slot as usize - 1].conn = None,
            Effect::StartLease {
                execution_id,
                attempt,
            } => {
                self.executions.insert(execution_id, attempt.task_id);
            }
            Effect::Report(report) => {
                self.end(&report.task_id, "report");
                self.updates.push(Pending {
                    slot: report.slot,
                    v2: report.use_v2,
                });
            }
            Effect::HandBack(hand_back) => {
                self.end(&hand_back.ids.task_id, "hand-back");
                self.updates.push(Pending {
                    slot: None,
                    v2: false,
                });
            }
            Effect::ArmExitGrace { slot, generation } => self.graces.push((slot, generation)),
            Effect::GrantPoll(n) => {
                assert!(self.poll_waiting, "a grant nobody asked for");
                assert!(
                    self.granted.is_none(),
                    "a second poll granted while one is in flight"
                );
                self.poll_waiting = false;
                if n > 0 {
                    self.granted = Some(n);
                } else {
                    self.poller_stopped = true;
                }
            }
            Effect::Drained => {
                assert!(!self.drained, "drained twice");
                self.drained = true;
            }
            Effect::ReadQueueDepth { .. } => self.depth_reads += 1,
            Effect::ReadCrashHistory(read) => self.histories.push(read.execution_id),
            Effect::FetchInput { .. } => panic!("no task here has an externalized input"),
            Effect::Assigned(_)
            | Effect::StopLease { .. }
            | Effect::DisableV2
            | Effect::PollSettings(_)
            | Effect::WatchMemory
            | Effect::KillExecutor { .. } => {}
        }
        None
    }

    fn end(&mut self, task_id: &str, how: &'static str) {
        assert!(
            self.received.contains(task_id),
            "{how} of task {task_id}, never received"
        );
        if let Some(before) = self.ended.insert(task_id.to_owned(), how) {
            panic!("task {task_id} ended twice: {before}, then {how}");
        }
    }

    /// Tasks received that hold a slot or wait for one: not ended, not a crash waiting for
    /// its history (whose slot is free again).
    fn held(&self) -> usize {
        let parked: BTreeSet<&String> = self
            .histories
            .iter()
            .filter_map(|e| self.executions.get(e))
            .collect();
        self.received
            .iter()
            .filter(|t| !self.ended.contains_key(*t) && !parked.contains(t))
            .count()
    }

    fn check(&self) {
        let held = self.held();
        assert!(
            held <= self.slots,
            "{held} tasks held by {} slots",
            self.slots
        );
        let machine_held = self.h.m.tasks_held();
        assert!(
            machine_held <= self.slots,
            "the machine counts {machine_held} tasks held by {} slots",
            self.slots
        );
        if self.drained {
            assert!(self.updates.is_empty(), "drained with updates in flight");
            assert!(self.histories.is_empty(), "drained with a crash unreported");
            assert!(self.granted.is_none(), "drained with a poll in flight");
            assert_eq!(held, 0, "drained with tasks held");
            assert!(
                self.processes.iter().all(|p| p.conn.is_none()),
                "drained with an executor attached"
            );
        }
    }

    /// The poller asks for its next grant as soon as a poll is over (until it is told to
    /// stop).
    fn poll_again(&mut self) {
        if !self.poll_waiting && !self.poller_stopped && !self.drained {
            self.poll_waiting = true;
            self.feed(Input::PollRequest);
        }
    }

    fn slot(&self, pick: u8) -> usize {
        usize::from(pick) % self.slots
    }

    fn run(&mut self, step: Step) {
        if self.drained {
            // The broker stops once drained: nothing reaches it any more.
            return;
        }
        match step {
            Step::Start(pick, attach) => {
                let i = self.slot(pick);
                if self.processes[i].alive {
                    return;
                }
                let generation = self.processes[i].generation + 1;
                self.processes[i] = Process {
                    generation,
                    alive: true,
                    ..Process::default()
                };
                let reply = self.feed(Input::SlotStarted(proto::SlotStarted {
                    slot: i as u32 + 1,
                    generation,
                    token: format!("{TOKEN}-{generation}"),
                    pid: 100 + i as u32,
                    body_version: 0,
                }));
                assert!(matches!(reply, Reply::SlotStarted(Ok(()))), "{reply:?}");
                if attach {
                    self.run(Step::Attach(pick));
                }
            }
            Step::Attach(pick) => {
                let i = self.slot(pick);
                let p = &mut self.processes[i];
                if !p.alive || p.greeted {
                    return;
                }
                p.greeted = true;
                let generation = p.generation;
                self.feed(Input::Hello(proto::Hello {
                    protocol_version: proto::ProtocolVersion::ProtocolVersion1 as i32,
                    credentials: Some(proto::SlotCredentials {
                        slot: i as u32 + 1,
                        generation,
                        token: format!("{TOKEN}-{generation}"),
                    }),
                    pid: 100 + i as u32,
                    worker_id: String::new(),
                    body_at_dispatch: false,
                }));
            }
            Step::PollReturn(count) => {
                let Some(granted) = self.granted.take() else {
                    return;
                };
                let count = u32::from(count).min(granted + 1);
                let tasks = (0..count).map(|_| self.new_task()).collect();
                self.feed(Input::Polled {
                    tasks,
                    reserved: granted,
                });
                self.poll_again();
            }
            Step::PollFail => {
                if let Some(reserved) = self.granted.take() {
                    self.feed(Input::PollFailed { reserved });
                    self.poll_again();
                }
            }
            Step::Complete(pick, recycle) => {
                let i = self.slot(pick);
                let p = &mut self.processes[i];
                let Some(generation) = p.conn else {
                    return;
                };
                let Some((execution_id, task_id)) = p.assignment.take() else {
                    return;
                };
                let slot = i as u32 + 1;
                self.feed(Input::Completion {
                    slot,
                    generation,
                    completion: proto::Completion {
                        task_id,
                        execution_id,
                        result: Some(proto::TaskResult {
                            outcome: Some(proto::task_result::Outcome::Completed(
                                proto::Completed {
                                    output_json: r#"{"result":{}}"#.into(),
                                },
                            )),
                            worker_id: format!("t{slot:04}"),
                        }),
                        recycle: if recycle {
                            "max tasks".into()
                        } else {
                            String::new()
                        },
                        body_peak_memory_bytes: 0,
                        body_oom_killed: false,
                        spans: Vec::new(),
                    },
                });
            }
            Step::Exit(pick, how, crashed) => {
                let i = self.slot(pick);
                let p = &mut self.processes[i];
                if !p.alive {
                    return;
                }
                p.alive = false;
                p.assignment = None;
                let had_stream = p.conn.take().is_some();
                let (slot, generation) = (i as u32 + 1, p.generation);
                if had_stream && how > 0 {
                    self.feed(Input::StreamEnded { slot, generation });
                    if how == 2 {
                        self.graces.retain(|g| *g != (slot, generation));
                        self.feed(Input::StreamGraceOver { slot, generation });
                    }
                } else if had_stream {
                    // The machine still holds the stream until the exit report detaches it.
                    self.processes[i].conn = Some(generation);
                }
                let (signal, exit_code, status) = if crashed {
                    (None, Some(1), "exit status: 1")
                } else {
                    (Some(9), None, "signal: 9 (SIGKILL)")
                };
                self.feed(Input::SlotExited(proto::SlotExited {
                    slot,
                    generation,
                    pid: 100 + i as u32,
                    status: status.into(),
                    signal,
                    exit_code,
                    ..Default::default()
                }));
                // Whatever the machine did, this process has no stream any more.
                self.processes[i].conn = None;
            }
            Step::Answer(pick, how) => {
                if self.updates.is_empty() {
                    return;
                }
                let pending = self.updates.remove(usize::from(pick) % self.updates.len());
                let next_task = (how == 1 && pending.v2).then(|| self.new_task());
                if how == 3 && pending.v2 {
                    self.feed(Input::UpdateV2Unsupported);
                }
                self.feed(Input::UpdateDone {
                    slot: pending.slot,
                    next_task,
                });
            }
            Step::History(pick, readable) => {
                if self.histories.is_empty() {
                    return;
                }
                let execution_id = self
                    .histories
                    .remove(usize::from(pick) % self.histories.len());
                self.feed(Input::CrashHistory {
                    execution_id,
                    counted: readable.then_some(1),
                });
            }
            Step::Depth(depth, readable) => {
                if self.depth_reads == 0 {
                    return;
                }
                self.depth_reads -= 1;
                let now = self.h.now.instant;
                self.feed(Input::QueueDepth {
                    depth: readable.then_some(u64::from(depth)),
                    now,
                });
            }
            Step::LeaseLost(pick) => {
                let live: Vec<(String, String)> = self
                    .executions
                    .iter()
                    .filter(|(e, t)| !self.ended.contains_key(*t) && self.h.m.knows(e))
                    .map(|(e, t)| (e.clone(), t.clone()))
                    .collect();
                if live.is_empty() {
                    return;
                }
                let (execution_id, task_id) = live[usize::from(pick) % live.len()].clone();
                self.feed(Input::LeaseLost {
                    execution_id: execution_id.clone(),
                });
                if !self.h.m.knows(&execution_id) && !self.ended.contains_key(&task_id) {
                    // A held task whose lease is lost is dropped: that is its end.
                    self.end(&task_id, "dropped, its lease lost");
                }
            }
            Step::Tick(ms) => {
                self.h.advance(Duration::from_millis(u64::from(ms)));
                let now = self.h.now.instant;
                self.feed(Input::Tick { now });
            }
            Step::Pause(true) => {
                self.feed(Input::Pause);
            }
            Step::Pause(false) => {
                self.feed(Input::Resume);
            }
            Step::Scale(a, b) => {
                let n = self.slots as u32;
                let min = 1 + u32::from(a) % n;
                let max = min + u32::from(b) % (n - min + 1);
                let reply = self.feed(Input::Scale { min, max });
                let draining = self.h.m.draining();
                assert!(
                    matches!(reply, Reply::Scale(Ok(_))) != draining,
                    "{min}..{max}, draining {draining}: {reply:?}"
                );
            }
            Step::Drain => {
                self.feed(Input::Drain);
            }
        }
    }

    /// Drains and answers everything until the drain completes: executors finish what they
    /// run and exit, updates and reads are answered, the poll in flight comes back empty.
    fn settle(&mut self) {
        self.run(Step::Drain);
        for _ in 0..100 {
            if self.drained {
                return;
            }
            if self.granted.is_some() {
                self.run(Step::PollReturn(0));
            } else if !self.updates.is_empty() {
                self.run(Step::Answer(0, 0));
            } else if !self.histories.is_empty() {
                self.run(Step::History(0, true));
            } else if self.depth_reads > 0 {
                self.run(Step::Depth(0, true));
            } else if let Some((slot, generation)) = self.graces.pop() {
                self.feed(Input::StreamGraceOver { slot, generation });
            } else if let Some(i) = self
                .processes
                .iter()
                .position(|p| p.assignment.is_some() && p.conn.is_some())
            {
                self.run(Step::Complete(i as u8, false));
            } else if let Some(i) = self.processes.iter().position(|p| p.alive) {
                self.run(Step::Exit(i as u8, 1, false));
            } else {
                self.run(Step::Tick(1000));
            }
        }
        panic!("the drain did not complete");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Never more than N tasks held; every task received ends in exactly one report,
    /// hand-back or stop; a completed drain leaves nothing in flight.
    #[test]
    fn any_sequence_of_inputs_keeps_the_machines_promises(
        setup in setup(),
        steps in prop::collection::vec(step(), 10..100),
    ) {
        let mut world = World::new(&setup);
        world.poll_again();
        for step in steps {
            world.run(step);
        }
        world.settle();
        let unended: Vec<&String> = world
            .received
            .iter()
            .filter(|t| !world.ended.contains_key(*t))
            .collect();
        prop_assert!(unended.is_empty(), "tasks received that never ended: {unended:?}");
    }
}
