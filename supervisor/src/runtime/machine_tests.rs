//! The supervisor's machine, step by step: each test feeds inputs at chosen instants and reads
//! the effects. The children are stand-ins ([`Child::Process`] with made-up pids, [`Ended`]
//! built from raw wait statuses): no process runs.

use super::*;
use crate::errors::ExpectedError;
use crate::runtime::children::Ended;
use admin::SlotState::{Busy, Exited, Idle, Retired, Stopping, Waiting};
use std::{os::unix::process::ExitStatusExt as _, process::ExitStatus};

const BROKER: Child = Child::Process(100);

/// Tokens `tok-1`, `tok-2`, … (unique in the process).
fn token() -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    format!(
        "tok-{}",
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1
    )
}

fn config(min: u32, max: u32) -> Config {
    let mut capacity = Capacity::fixed(max);
    capacity.min_executors = min;
    Config {
        capacity,
        worker_ids: (1..=max).map(|n| format!("w{n:04}")).collect(),
        force_kill_after: None,
        gc_interval: Duration::from_secs(300),
        stall_timeout: None,
        notify: false,
        watchdog: None,
    }
}

/// An exit with `code`.
fn code(code: i32) -> Ended {
    Ended::Process(Ok(ExitStatus::from_raw(code << 8)))
}

/// A death by `signal`.
fn killed(signal: i32) -> Ended {
    Ended::Process(Ok(ExitStatus::from_raw(signal)))
}

/// A slot as the broker shows it: `(slot, state, generation, recycling)`.
type Seen = (u32, admin::SlotState, u64, bool);

fn state(slots: &[Seen], draining: bool) -> admin::StatusResponse {
    admin::StatusResponse {
        task_name: "t".into(),
        draining,
        slots: slots
            .iter()
            .map(|&(slot, state, generation, recycling)| admin::SlotStatus {
                slot,
                state: state as i32,
                generation,
                recycling,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// The machine and its clock.
struct Rig {
    m: Machine,
    t0: Instant,
    now: Instant,
}

impl Rig {
    fn new(config: Config) -> Self {
        let t0 = Instant::now();
        Self {
            m: Machine::new(config, token, BROKER, t0),
            t0,
            now: t0,
        }
    }

    /// A runtime that has begun, with each start-up slot's executor running.
    fn running(config: Config) -> Self {
        let mut rig = Self::new(config);
        let mut out = rig.go(Input::Begin);
        while let Some((slot, generation)) = announced(&out) {
            out = rig.start(slot, generation);
        }
        rig
    }

    fn go(&mut self, input: Input) -> Vec<Effect> {
        self.m.handle(input, self.now)
    }

    /// Time passes by `d`.
    fn after(&mut self, d: Duration) -> Vec<Effect> {
        self.now += d;
        self.go(Input::Tick)
    }

    /// The stand-in pid of a slot's generation.
    fn pid(slot: u32, generation: u64) -> u32 {
        1000 + slot * 100 + u32::try_from(generation).unwrap()
    }

    /// The broker takes the announcement and the executor spawns; the effects after it.
    fn start(&mut self, slot: u32, generation: u64) -> Vec<Effect> {
        let out = self.go(Input::Announced {
            slot,
            generation,
            result: Ok(()),
        });
        assert!(
            matches!(out.as_slice(), [Effect::Spawn { slot: s, generation: g, .. }] if *s == slot && *g == generation),
            "{out:?}"
        );
        self.go(Input::Spawned {
            slot,
            generation,
            result: Ok(Child::Process(Self::pid(slot, generation))),
        })
    }

    /// The executor of `slot` at `generation` ends as `ended`; returns the exit report.
    fn exit(&mut self, slot: u32, generation: u64, ended: Ended) -> proto::SlotExited {
        let out = self.go(Input::Exited(ChildExit {
            kind: ChildKind::Executor { slot, generation },
            pid: Self::pid(slot, generation),
            ended,
        }));
        match out.as_slice() {
            [Effect::HandleExit { report, .. }] => report.clone(),
            other => panic!("{other:?}"),
        }
    }

    /// The exit's handling ended with the broker's view `seen`.
    fn handled(
        &mut self,
        slot: u32,
        generation: u64,
        seen: Option<admin::StatusResponse>,
    ) -> Vec<Effect> {
        self.go(Input::ExitHandled {
            slot,
            generation,
            seen: seen.map(|s| SlotView::from_status(&s, slot, generation)),
        })
    }

    fn broker_exit(&mut self, ended: Ended) -> Vec<Effect> {
        self.go(Input::Exited(ChildExit {
            kind: ChildKind::Broker,
            pid: BROKER.pid(),
            ended,
        }))
    }

    /// How long from now until the machine next wakes.
    fn wake_in(&self) -> Option<Duration> {
        self.m
            .next_wake()
            .map(|at| at.saturating_duration_since(self.now))
    }
}

/// The (slot, generation) of the one announcement in `out`, if any.
fn announced(out: &[Effect]) -> Option<(u32, u64)> {
    out.iter().find_map(|e| match e {
        Effect::Announce {
            slot, generation, ..
        } => Some((*slot, *generation)),
        _ => None,
    })
}

fn signals(out: &[Effect]) -> Vec<(u32, i32)> {
    out.iter()
        .filter_map(|e| match e {
            Effect::Signal { child, signal } => Some((child.pid(), *signal)),
            _ => None,
        })
        .collect()
}

#[test]
fn restart_backoff_steps() {
    let delays: Vec<u64> = (0..9).map(|n| restart_delay(n).as_secs()).collect();
    assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30, 30, 30]);
    assert_eq!(restart_delay(u32::MAX).as_secs(), 30);
}

/// Start-up: slots 1..=MIN are announced one at a time, each before its process exists; the
/// next only once the previous one spawned.
#[test]
fn the_minimum_starts_one_slot_at_a_time_announced_before_spawned() {
    let mut rig = Rig::new(config(2, 3));
    assert_eq!(rig.m.next_wake(), None, "nothing is due before the start");
    let out = rig.go(Input::Begin);
    let [
        Effect::Announce {
            slot: 1,
            generation: 1,
            token,
            body_version: 1,
        },
    ] = out.as_slice()
    else {
        panic!("{out:?}");
    };
    let token = token.clone();
    let out = rig.go(Input::Announced {
        slot: 1,
        generation: 1,
        result: Ok(()),
    });
    assert_eq!(
        out,
        [Effect::Spawn {
            slot: 1,
            generation: 1,
            token,
            worker_id: "w0001".into(),
            body_version: 1,
        }]
    );
    let out = rig.go(Input::Spawned {
        slot: 1,
        generation: 1,
        result: Ok(Child::Process(7)),
    });
    assert_eq!(announced(&out), Some((2, 1)));
    let out = rig.start(2, 1);
    assert_eq!(out, [], "slot 3 is above the minimum");
}

/// A crashing executor restarts after 1, 2, 4, 8, 16, 30, 30 s; each restart is a new
/// generation, announced when its delay is over and not a moment before.
#[test]
fn a_crashing_slot_restarts_after_1_2_4_8_16_30_30_seconds() {
    let mut rig = Rig::running(config(1, 1));
    let mut generation = 1;
    for delay in [1, 2, 4, 8, 16, 30, 30] {
        rig.after(secs(5));
        let report = rig.exit(1, generation, code(1));
        assert_eq!(
            (report.status.as_str(), report.exit_code, report.signal),
            ("exit status 1", Some(1), None)
        );
        assert_eq!(report.cause, proto::ExitCause::Unspecified as i32);
        assert_eq!(rig.handled(1, generation, None), []);
        assert_eq!(rig.wake_in(), Some(secs(delay)));
        assert_eq!(rig.after(secs(delay) - Duration::from_millis(1)), []);
        let out = rig.after(Duration::from_millis(1));
        assert_eq!(announced(&out), Some((1, generation + 1)), "{out:?}");
        generation += 1;
        assert_eq!(rig.start(1, generation), []);
    }
}

/// A replacement that ran 60 s starts the backoff over; 59 s is not enough.
#[test]
fn the_backoff_resets_after_a_60_second_run() {
    let mut rig = Rig::running(config(1, 1));
    let mut generation = 1;
    for (ran, expected) in [(1, 1), (1, 2), (59, 4), (60, 1)] {
        rig.after(secs(ran));
        rig.exit(1, generation, code(1));
        rig.handled(1, generation, None);
        assert_eq!(rig.wake_in(), Some(secs(expected)), "after a {ran} s run");
        let out = rig.after(secs(expected));
        generation += 1;
        assert_eq!(announced(&out), Some((1, generation)));
        rig.start(1, generation);
    }
}

/// A completed assignment (the generation's completion byte) starts the backoff over; one
/// from an older generation does not.
#[test]
fn the_backoff_resets_after_a_completed_assignment() {
    let mut rig = Rig::running(config(1, 1));
    for generation in 1..=3 {
        rig.exit(1, generation, code(1));
        rig.handled(1, generation, None);
        let delay = rig.wake_in().unwrap();
        rig.after(delay);
        rig.start(1, generation + 1);
    }
    assert_eq!(rig.m.slot(1).1, 3);
    rig.go(Input::Completed(ChildKind::Executor {
        slot: 1,
        generation: 3,
    }));
    assert_eq!(rig.m.slot(1).1, 3, "an older generation's byte");
    rig.go(Input::Completed(ChildKind::Executor {
        slot: 1,
        generation: 4,
    }));
    assert_eq!(rig.m.slot(1).1, 0);
    rig.exit(1, 4, code(1));
    rig.handled(1, 4, None);
    assert_eq!(rig.wake_in(), Some(secs(1)));
}

/// Exit 75 with the broker's recycling flag for that generation is a recycle (at once, no
/// restart counted); exit 75 alone, or the flag of another generation, is a crash.
#[test]
fn a_recycle_needs_exit_75_and_the_brokers_flag() {
    let mut rig = Rig::running(config(1, 1));
    // The flag and the code: at once, in the same step.
    rig.exit(1, 1, code(75));
    let out = rig.handled(1, 1, Some(state(&[(1, Exited, 1, true)], false)));
    assert_eq!(announced(&out), Some((1, 2)), "{out:?}");
    assert_eq!(rig.m.slot(1).1, 0, "no restart counted");
    rig.start(1, 2);
    // The code alone: a crash.
    rig.exit(1, 2, code(75));
    assert_eq!(
        rig.handled(1, 2, Some(state(&[(1, Exited, 2, false)], false))),
        []
    );
    assert_eq!(rig.wake_in(), Some(secs(1)));
    rig.after(secs(1));
    rig.start(1, 3);
    // The flag of another generation: a crash.
    rig.exit(1, 3, code(75));
    rig.handled(1, 3, Some(state(&[(1, Exited, 2, true)], false)));
    assert_eq!(rig.wake_in(), Some(secs(2)));
    rig.after(secs(2));
    rig.start(1, 4);
    // The flag and another code: a crash.
    rig.exit(1, 4, code(1));
    rig.handled(1, 4, Some(state(&[(1, Exited, 4, true)], false)));
    assert_eq!(rig.wake_in(), Some(secs(4)));
    rig.after(secs(4));
    rig.start(1, 5);
    // Thread mode: a task that ended recycled, with the flag.
    rig.exit(1, 5, Ended::Recycled("max tasks".into()));
    let out = rig.handled(1, 5, Some(state(&[(1, Exited, 5, true)], false)));
    assert_eq!(announced(&out), Some((1, 6)));
}

/// Scaling down: the slot of an adaptive runtime the broker retired stays empty and its
/// backoff resets; a fixed runtime restarts it all the same.
#[test]
fn a_retired_slot_stays_empty_and_resets_its_backoff() {
    let mut rig = Rig::running(config(1, 3));
    rig.exit(1, 1, code(1));
    rig.handled(1, 1, None);
    rig.after(secs(1));
    rig.start(1, 2);
    assert_eq!(rig.m.slot(1).1, 1);
    rig.exit(1, 2, code(0));
    let out = rig.handled(1, 2, Some(state(&[(1, Retired, 2, false)], false)));
    assert_eq!(out, []);
    assert_eq!(rig.m.slot(1), (2, 0, None));
    assert_eq!(
        rig.m.next_wake(),
        Some(rig.t0 + secs(300)),
        "only the GC is due"
    );

    let mut fixed = Rig::running(config(2, 2));
    fixed.exit(2, 1, code(0));
    fixed.handled(2, 1, Some(state(&[(2, Retired, 1, false)], false)));
    assert_eq!(fixed.wake_in(), Some(secs(1)));
}

/// Scaling up: a slot the broker wants (waiting or exited at this supervisor's generation,
/// with nothing running, starting, exiting or pending) starts at once, as the broker's state
/// says; a retired one is left alone.
#[test]
fn scaling_up_starts_the_slots_the_broker_wants() {
    let mut rig = Rig::running(config(1, 3));
    let wanted = state(
        &[
            (1, Idle, 1, false),
            (2, Waiting, 0, false),
            (3, Retired, 0, false),
        ],
        false,
    );
    let out = rig.go(Input::BrokerState(wanted.clone()));
    assert_eq!(announced(&out), Some((2, 1)), "{out:?}");
    assert_eq!(out.len(), 1, "slot 3 is retired: {out:?}");
    // Starting: not wanted again.
    assert_eq!(rig.go(Input::BrokerState(wanted)), []);
    rig.start(2, 1);
    // Exiting (its exit not handled yet): not started beside the decision.
    rig.exit(2, 1, code(0));
    let exited = state(&[(2, Exited, 1, false)], false);
    assert_eq!(rig.go(Input::BrokerState(exited.clone())), []);
    rig.handled(2, 1, Some(state(&[(2, Retired, 1, false)], false)));
    assert_eq!(
        rig.go(Input::BrokerState(state(&[(2, Retired, 1, false)], false))),
        []
    );
    // Retired, then wanted again at the generation it ended with.
    let out = rig.go(Input::BrokerState(exited));
    assert_eq!(announced(&out), Some((2, 2)));
    // A slot at another generation than this supervisor's is not one it can start.
    let mut other = Rig::running(config(1, 2));
    assert_eq!(
        other.go(Input::BrokerState(state(&[(2, Waiting, 4, false)], false))),
        []
    );
    // Nor one still to start with the runtime.
    let mut starting = Rig::new(config(2, 3));
    starting.go(Input::Begin);
    assert_eq!(
        starting.go(Input::BrokerState(state(&[(2, Waiting, 0, false)], false))),
        []
    );
    // Nor anything while the broker drains.
    assert_eq!(
        other.go(Input::BrokerState(state(&[(2, Waiting, 0, false)], true))),
        []
    );
    // A fixed runtime never scales.
    let mut fixed = Rig::running(config(1, 1));
    assert_eq!(
        fixed.go(Input::BrokerState(state(&[(1, Waiting, 1, false)], false))),
        []
    );
}

/// A refused announcement stops the runtime with GenerationRefused, at start-up or later.
#[test]
fn a_refused_generation_stops_the_runtime() {
    let mut rig = Rig::running(config(1, 1));
    rig.exit(1, 1, code(1));
    rig.handled(1, 1, None);
    rig.after(secs(1));
    let out = rig.go(Input::Announced {
        slot: 1,
        generation: 2,
        result: Err(AnnounceError::Refused("slot 1 is at generation 7".into())),
    });
    assert_eq!(out, [Effect::Drain]);
    assert_eq!(rig.m.slot(1), (1, 1, None), "no retry");
    rig.broker_exit(code(0));
    let error = rig.m.outcome().unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("the broker refused generation 2 of slot 1 (slot 1 is at generation 7)"),
        "{error}"
    );

    let mut rig = Rig::new(config(2, 2));
    rig.go(Input::Begin);
    let out = rig.go(Input::Announced {
        slot: 1,
        generation: 1,
        result: Err(AnnounceError::Refused("no".into())),
    });
    assert_eq!(out, [Effect::Drain], "slot 2 is not started");
    rig.broker_exit(code(0));
    assert!(matches!(
        rig.m.outcome(),
        Err(RuntimeError::GenerationRefused {
            slot: 1,
            generation: 1,
            ..
        })
    ));
}

/// A lost announcement is retried with backoff, repeating the same generation and token; at
/// start-up it stops the runtime.
#[test]
fn a_lost_announcement_is_repeated_with_the_same_token() {
    let mut rig = Rig::running(config(1, 1));
    rig.exit(1, 1, code(1));
    rig.handled(1, 1, None);
    let out = rig.after(secs(1));
    let [
        Effect::Announce {
            generation: 2,
            token,
            ..
        },
    ] = out.as_slice()
    else {
        panic!("{out:?}");
    };
    let token = token.clone();
    let out = rig.go(Input::Announced {
        slot: 1,
        generation: 2,
        result: Err(AnnounceError::Lost(tonic::Status::deadline_exceeded(
            "late",
        ))),
    });
    assert_eq!(out, []);
    assert_eq!(rig.m.slot(1).0, 1, "the generation moves only once taken");
    assert_eq!(rig.wake_in(), Some(secs(2)));
    let out = rig.after(secs(2));
    assert_eq!(
        out,
        [Effect::Announce {
            slot: 1,
            generation: 2,
            token,
            body_version: 1,
        }]
    );
    rig.start(1, 2);
    assert_eq!(rig.m.slot(1).0, 2);

    let mut rig = Rig::new(config(1, 1));
    rig.go(Input::Begin);
    let out = rig.go(Input::Announced {
        slot: 1,
        generation: 1,
        result: Err(AnnounceError::Lost(tonic::Status::unavailable("down"))),
    });
    assert_eq!(out, [Effect::Drain]);
    rig.broker_exit(code(0));
    assert!(matches!(
        rig.m.outcome(),
        Err(RuntimeError::BrokerDied { status }) if status.contains("cannot reach the broker's control service")
    ));
}

/// A spawn that fails is retried with backoff (at a new generation: the broker took the last
/// one); at start-up it stops the runtime.
#[test]
fn a_failed_spawn_is_retried_with_backoff() {
    let mut rig = Rig::running(config(1, 1));
    rig.exit(1, 1, code(1));
    rig.handled(1, 1, None);
    rig.after(secs(1));
    rig.go(Input::Announced {
        slot: 1,
        generation: 2,
        result: Ok(()),
    });
    let out = rig.go(Input::Spawned {
        slot: 1,
        generation: 2,
        result: Err(std::io::Error::other("no such file")),
    });
    assert_eq!(out, []);
    assert_eq!(rig.wake_in(), Some(secs(2)));
    let out = rig.after(secs(2));
    assert_eq!(announced(&out), Some((1, 3)));

    let mut rig = Rig::new(config(1, 1));
    rig.go(Input::Begin);
    rig.go(Input::Announced {
        slot: 1,
        generation: 1,
        result: Ok(()),
    });
    let out = rig.go(Input::Spawned {
        slot: 1,
        generation: 1,
        result: Err(std::io::Error::other("no such file")),
    });
    assert_eq!(out, [Effect::Drain]);
    rig.broker_exit(code(0));
    assert!(matches!(
        rig.m.outcome(),
        Err(RuntimeError::BrokerDied { status }) if status == "cannot start executor w0001: no such file"
    ));
}

/// A start under way when a drain begins is not retried when it fails.
#[test]
fn a_start_that_fails_during_a_drain_is_not_retried() {
    let mut rig = Rig::running(config(1, 1));
    rig.exit(1, 1, code(1));
    rig.handled(1, 1, None);
    rig.after(secs(1));
    rig.go(Input::Signal("SIGTERM"));
    rig.go(Input::Announced {
        slot: 1,
        generation: 2,
        result: Err(AnnounceError::Lost(tonic::Status::unavailable("down"))),
    });
    assert_eq!(rig.m.slot(1).2, None);
}

/// An exit of an older generation, or of a slot it does not know, changes nothing; the
/// announcement a dead broker took spawns nothing.
#[test]
fn stale_exits_are_ignored_and_nothing_starts_without_a_broker() {
    let mut rig = Rig::running(config(1, 1));
    assert_eq!(
        rig.go(Input::Exited(ChildExit {
            kind: ChildKind::Executor {
                slot: 1,
                generation: 0
            },
            pid: 1,
            ended: code(1),
        })),
        []
    );
    assert_eq!(
        rig.go(Input::Exited(ChildExit {
            kind: ChildKind::Executor {
                slot: 9,
                generation: 1
            },
            pid: 1,
            ended: code(1),
        })),
        []
    );
    rig.exit(1, 1, code(1));
    rig.handled(1, 1, None);
    rig.after(secs(1));
    rig.broker_exit(code(1));
    let out = rig.go(Input::Announced {
        slot: 1,
        generation: 2,
        result: Ok(()),
    });
    assert_eq!(out, []);
    assert!(rig.m.done());
}

#[path = "machine_drain_tests.rs"]
mod drain;

/// A state whose capacity reads `min..=max` (what `Admin.Scale` set).
fn scaled(slots: &[Seen], min: u32, max: u32) -> admin::StatusResponse {
    let mut s = state(slots, false);
    s.capacity = Some(admin::Capacity {
        min_executors: min,
        max_executors: max,
        ..Default::default()
    });
    for slot in &mut s.slots {
        slot.worker_id = format!("w{:04}", slot.slot);
    }
    s
}

/// `Admin.Scale` (issue #26 item 4): a fixed runtime whose range was changed follows the slots
/// the broker wants as an adaptive one does: slots the broker added start under the worker id
/// it gave them, and a slot it retired stays empty after its executor leaves.
#[test]
fn a_scaled_fixed_runtime_follows_the_slots_the_broker_wants() {
    let mut rig = Rig::running(config(2, 2));
    let up = scaled(
        &[
            (1, Idle, 1, false),
            (2, Idle, 1, false),
            (3, Waiting, 0, false),
            (4, Waiting, 0, false),
        ],
        4,
        4,
    );
    let out = rig.go(Input::BrokerState(up.clone()));
    let starts: Vec<_> = out
        .iter()
        .filter_map(|e| match e {
            Effect::Announce {
                slot, generation, ..
            } => Some((*slot, *generation)),
            _ => None,
        })
        .collect();
    assert_eq!(starts, [(3, 1), (4, 1)], "{out:?}");
    for slot in [3, 4] {
        let out = rig.go(Input::Announced {
            slot,
            generation: 1,
            result: Ok(()),
        });
        assert!(
            matches!(out.as_slice(), [Effect::Spawn { slot: s, worker_id, .. }] if *s == slot && *worker_id == format!("w{slot:04}")),
            "{out:?}"
        );
        rig.go(Input::Spawned {
            slot,
            generation: 1,
            result: Ok(Child::Process(Rig::pid(slot, 1))),
        });
    }
    assert_eq!(rig.go(Input::BrokerState(up)), [], "all started");
    // Scaled down to 1: slot 4 finishes its task, leaves, and stays empty (no backoff, no
    // restart), at once or later.
    rig.exit(4, 1, code(0));
    let out = rig.handled(4, 1, Some(scaled(&[(4, Retired, 1, false)], 1, 1)));
    assert_eq!(out, []);
    assert_eq!(rig.m.slot(4), (1, 0, None));
    rig.after(secs(30));
    assert_eq!(
        rig.go(Input::BrokerState(scaled(&[(4, Retired, 1, false)], 1, 1))),
        []
    );
    // Wanted again: it starts at its next generation.
    let out = rig.go(Input::BrokerState(scaled(&[(4, Exited, 1, false)], 4, 4)));
    assert_eq!(announced(&out), Some((4, 2)));
}

/// The broker's state during a roll: `slots` as [`state`] makes them, the runtime's body
/// version and whether some live generation still runs an older one.
fn rolled(slots: &[Seen], body_version: u32, rolling: bool) -> admin::StatusResponse {
    admin::StatusResponse {
        body_version,
        rolling,
        ..state(slots, false)
    }
}

/// The (slot, generation, body version) of the one announcement in `out`, if any.
fn announced_at(out: &[Effect]) -> Option<(u32, u64, u32)> {
    out.iter().find_map(|e| match e {
        Effect::Announce {
            slot,
            generation,
            body_version,
            ..
        } => Some((*slot, *generation, *body_version)),
        _ => None,
    })
}

/// The broker takes the announcement of `slot` at `generation`: the spawn's body version.
fn spawned_at(rig: &mut Rig, slot: u32, generation: u64) -> u32 {
    let out = rig.go(Input::Announced {
        slot,
        generation,
        result: Ok(()),
    });
    let [Effect::Spawn { body_version, .. }] = out.as_slice() else {
        panic!("{out:?}");
    };
    let version = *body_version;
    rig.go(Input::Spawned {
        slot,
        generation,
        result: Ok(Child::Process(Rig::pid(slot, generation))),
    });
    version
}

/// A roll: the broker is told (it alone knows when a slot is idle without racing a dispatch,
/// and recycles each executor of an older version then); each recycled exit restarts its slot
/// at once, with no backoff, at the new version; the roll ends once the broker shows every
/// live generation at it.
#[test]
fn a_roll_recycles_each_slot_into_the_new_version_at_once() {
    let mut rig = Rig::running(config(2, 2));
    assert_eq!(rig.m.body_version(), (1, false));
    let out = rig.go(Input::Roll { body_version: 2 });
    assert_eq!(out, [Effect::Roll { body_version: 2 }]);
    assert_eq!(rig.m.body_version(), (2, true));
    // The broker took it: no second call.
    let seen = rolled(&[(1, Idle, 1, false), (2, Busy, 1, false)], 2, true);
    assert_eq!(rig.go(Input::BrokerState(seen)), []);
    // Slot 1 was idle: the broker recycled it at once.
    rig.exit(1, 1, code(perago_core::recycle::EXIT_RECYCLED));
    let out = rig.handled(1, 1, Some(state(&[(1, Exited, 1, true)], false)));
    assert_eq!(announced_at(&out), Some((1, 2, 2)), "at once, at version 2");
    assert_eq!(spawned_at(&mut rig, 1, 2), 2);
    assert_eq!(rig.m.slot_body_version(1), 2);
    assert_eq!(rig.m.slot(1).1, 0, "a recycle is no failure: no backoff");
    // Slot 2 finishes its assignment first, then goes the same way.
    let seen = rolled(&[(1, Idle, 2, false), (2, Busy, 1, false)], 2, true);
    assert_eq!(rig.go(Input::BrokerState(seen)), []);
    assert_eq!(rig.m.body_version(), (2, true), "slot 2 is still at 1");
    rig.exit(2, 1, code(perago_core::recycle::EXIT_RECYCLED));
    let out = rig.handled(2, 1, Some(state(&[(2, Exited, 1, true)], false)));
    assert_eq!(announced_at(&out), Some((2, 2, 2)));
    assert_eq!(spawned_at(&mut rig, 2, 2), 2);
    let seen = rolled(&[(1, Idle, 2, false), (2, Idle, 2, false)], 2, false);
    assert_eq!(rig.go(Input::BrokerState(seen)), []);
    assert_eq!(rig.m.body_version(), (2, false), "the roll is finished");
    // An old or repeated version changes nothing.
    assert_eq!(rig.go(Input::Roll { body_version: 2 }), []);
    assert_eq!(rig.go(Input::Roll { body_version: 1 }), []);
}

/// A roll the broker has not taken (the call was lost: its state still shows the old
/// version) is asked again; a slot that crashes mid-roll restarts, after its backoff, at the
/// new version.
#[test]
fn a_lost_roll_is_asked_again_and_a_crash_mid_roll_restarts_at_the_new_version() {
    let mut rig = Rig::running(config(1, 1));
    rig.go(Input::Roll { body_version: 2 });
    let seen = rolled(&[(1, Busy, 1, false)], 1, false);
    assert_eq!(
        rig.go(Input::BrokerState(seen)),
        [Effect::Roll { body_version: 2 }]
    );
    assert_eq!(
        rig.m.body_version(),
        (2, true),
        "not finished: the broker is behind"
    );
    rig.exit(1, 1, killed(9));
    let out = rig.handled(1, 1, Some(state(&[(1, Exited, 1, false)], false)));
    assert_eq!(out, [], "a crash backs off");
    let out = rig.after(secs(1));
    assert_eq!(announced_at(&out), Some((1, 2, 2)));
    assert_eq!(spawned_at(&mut rig, 1, 2), 2);
    let seen = rolled(&[(1, Idle, 2, false)], 2, false);
    rig.go(Input::BrokerState(seen));
    assert_eq!(rig.m.body_version(), (2, false));
}

/// A second roll during a roll supersedes it: the broker is told the newest version, and
/// slots go straight to it. An announcement made before a roll and lost is repeated as it
/// was (same generation, token and version): the broker recycles that generation as soon as
/// it attaches, into the newest.
#[test]
fn a_second_roll_supersedes_the_first_and_slots_go_straight_to_the_newest() {
    let mut rig = Rig::running(config(2, 2));
    rig.go(Input::Roll { body_version: 2 });
    let out = rig.go(Input::Roll { body_version: 3 });
    assert_eq!(out, [Effect::Roll { body_version: 3 }]);
    rig.exit(1, 1, code(perago_core::recycle::EXIT_RECYCLED));
    let out = rig.handled(1, 1, Some(state(&[(1, Exited, 1, true)], false)));
    assert_eq!(
        announced_at(&out),
        Some((1, 2, 3)),
        "straight to 3, never 2"
    );
    assert_eq!(spawned_at(&mut rig, 1, 2), 3);
    // Slot 2's restart was announced at 3 and lost; a roll to 4 comes meanwhile.
    rig.exit(2, 1, code(perago_core::recycle::EXIT_RECYCLED));
    let out = rig.handled(2, 1, Some(state(&[(2, Exited, 1, true)], false)));
    let Some(Effect::Announce { token, .. }) = out.first() else {
        panic!("{out:?}");
    };
    let token = token.clone();
    assert_eq!(announced_at(&out), Some((2, 2, 3)));
    let out = rig.go(Input::Announced {
        slot: 2,
        generation: 2,
        result: Err(AnnounceError::Lost(tonic::Status::unavailable("lost"))),
    });
    assert_eq!(out, []);
    assert_eq!(
        rig.go(Input::Roll { body_version: 4 }),
        [Effect::Roll { body_version: 4 }]
    );
    let out = rig.after(secs(1));
    assert_eq!(
        out,
        [Effect::Announce {
            slot: 2,
            generation: 2,
            token,
            body_version: 3,
        }],
        "the repeat is the same announcement"
    );
    assert_eq!(spawned_at(&mut rig, 2, 2), 3);
    let seen = rolled(&[(1, Idle, 3, false), (2, Stopping, 2, true)], 4, true);
    rig.go(Input::BrokerState(seen));
    assert_eq!(rig.m.body_version(), (4, true));
    // The broker recycles it as it attaches: it restarts at 4.
    rig.exit(2, 2, code(perago_core::recycle::EXIT_RECYCLED));
    let out = rig.handled(2, 2, Some(state(&[(2, Exited, 2, true)], false)));
    assert_eq!(announced_at(&out), Some((2, 3, 4)));
}

/// A drain during a roll just drains: no slot restarts, whatever version it ran, and a roll
/// asked for during the drain is not started.
#[test]
fn draining_during_a_roll_just_drains() {
    let mut rig = Rig::running(config(2, 2));
    rig.go(Input::Roll { body_version: 2 });
    let out = rig.go(Input::Signal("SIGTERM"));
    assert!(out.contains(&Effect::Drain), "{out:?}");
    assert_eq!(rig.m.body_version(), (2, false), "the drain ends the roll");
    rig.exit(1, 1, code(perago_core::recycle::EXIT_RECYCLED));
    let out = rig.handled(1, 1, Some(state(&[(1, Exited, 1, true)], true)));
    assert_eq!(out, []);
    assert_eq!(rig.m.slot(1), (1, 0, None), "no restart");
    assert_eq!(rig.go(Input::Roll { body_version: 3 }), []);
    rig.exit(2, 1, code(0));
    assert_eq!(rig.handled(2, 1, None), []);
}
