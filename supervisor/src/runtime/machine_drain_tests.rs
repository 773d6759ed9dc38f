//! The machine's drains, deadlines and periodic work, step by step (the harness is the
//! parent module's).

use super::*;

/// SIGTERM drains (Admin.Drain, no restarts); a second signal during the drain is ignored; a
/// drain the broker cannot be asked for is a SIGTERM to the broker.
#[test]
fn a_signal_drains_once_and_stops_restarts() {
    let mut rig = Rig::running(config(2, 2));
    rig.exit(1, 1, code(1));
    rig.handled(1, 1, None);
    assert_eq!(rig.wake_in(), Some(secs(1)));
    assert_eq!(rig.go(Input::Signal("SIGTERM")), [Effect::Drain]);
    assert!(rig.m.draining());
    assert_eq!(rig.m.slot(1).2, None, "the pending restart is dropped");
    assert_eq!(rig.go(Input::Signal("SIGINT")), []);
    assert_eq!(rig.go(Input::Stop("another runtime".into())), []);
    assert_eq!(
        rig.go(Input::DrainFailed(tonic::Status::unavailable("gone"))),
        [Effect::Signal {
            child: BROKER,
            signal: signal::SIGTERM
        }]
    );
    // An exit during the drain: reported, no status read, never restarted.
    let out = rig.go(Input::Exited(ChildExit {
        kind: ChildKind::Executor {
            slot: 2,
            generation: 1,
        },
        pid: Rig::pid(2, 1),
        ended: code(0),
    }));
    assert!(
        matches!(
            out.as_slice(),
            [Effect::HandleExit {
                tell_broker: true,
                draining: true,
                ..
            }]
        ),
        "{out:?}"
    );
    assert_eq!(rig.handled(2, 1, None), []);
    assert!(!rig.m.done(), "the broker still runs");
    assert_eq!(rig.broker_exit(code(0)), []);
    assert!(rig.m.done());
    assert!(rig.m.outcome().is_ok());
}

/// `stop` (another runtime failed) drains like a signal.
#[test]
fn stop_drains_like_a_signal() {
    let mut rig = Rig::running(config(1, 1));
    assert_eq!(
        rig.go(Input::Stop("the runtime of task b stopped".into())),
        [Effect::Drain]
    );
    assert!(rig.m.draining());
}

/// Admin.Drain seen in the broker's state (or in its view after an exit): no restarts.
#[test]
fn a_drain_seen_in_the_brokers_state_stops_restarts() {
    let mut rig = Rig::running(config(1, 1));
    rig.exit(1, 1, code(1));
    rig.handled(1, 1, None);
    assert!(rig.m.slot(1).2.is_some());
    assert_eq!(rig.go(Input::BrokerState(state(&[], true))), []);
    assert!(rig.m.draining());
    assert_eq!(rig.m.slot(1).2, None);

    let mut rig = Rig::running(config(1, 1));
    rig.exit(1, 1, code(1));
    let out = rig.handled(1, 1, Some(state(&[(1, Exited, 1, false)], true)));
    assert_eq!(out, []);
    assert!(rig.m.draining());
    assert_eq!(rig.m.slot(1).2, None);
}

/// The broker's clean exit is a finished drain (Admin.Drain, run once): no restarts, and the
/// runtime ends Ok once its executors are gone.
#[test]
fn the_brokers_clean_exit_is_a_finished_drain() {
    let mut rig = Rig::running(config(1, 1));
    assert_eq!(rig.broker_exit(code(0)), []);
    assert!(rig.m.draining());
    assert!(!rig.m.done(), "an executor still runs");
    let out = rig.go(Input::Exited(ChildExit {
        kind: ChildKind::Executor {
            slot: 1,
            generation: 1,
        },
        pid: Rig::pid(1, 1),
        ended: code(0),
    }));
    assert!(
        matches!(
            out.as_slice(),
            [Effect::HandleExit {
                tell_broker: false,
                ..
            }]
        ),
        "{out:?}"
    );
    assert!(!rig.m.done(), "its exit is being handled");
    rig.handled(1, 1, None);
    assert!(rig.m.done());
    assert!(rig.m.outcome().is_ok());
}

/// The shutdown deadline: PERAGO_SHUTDOWN_FORCE_KILL_AFTER after the drain started, the
/// phases are read, the executors still running are SIGKILLed (their reports say so), the
/// broker gets 2 s to report, and the runtime ends with exit 3.
#[test]
fn the_shutdown_deadline_kills_executors_then_the_broker_and_exits_3() {
    let mut c = config(2, 2);
    c.force_kill_after = Some(secs(1));
    let mut rig = Rig::running(c);
    rig.go(Input::Signal("SIGTERM"));
    assert_eq!(rig.wake_in(), Some(secs(1)));
    // A second drain does not move the deadline.
    rig.after(Duration::from_millis(500));
    rig.go(Input::BrokerState(state(&[], true)));
    assert_eq!(rig.wake_in(), Some(Duration::from_millis(500)));
    // Slot 2 finishes in time.
    rig.exit(2, 1, code(0));
    rig.handled(2, 1, None);
    assert_eq!(rig.after(Duration::from_millis(500)), [Effect::ReadPhases]);
    let mut phases = state(&[(1, Busy, 1, false)], true);
    phases.slots[0].phase = "body".into();
    let out = rig.go(Input::PhasesRead(Some(phases)));
    assert_eq!(
        out,
        [
            Effect::Signal {
                child: Child::Process(Rig::pid(1, 1)),
                signal: signal::SIGKILL
            },
            Effect::AbortExecutors
        ]
    );
    assert_eq!(rig.wake_in(), Some(secs(2)));
    let report = rig.exit(1, 1, killed(signal::SIGKILL));
    assert_eq!(
        report.status,
        "killed by the supervisor at the shutdown deadline, PERAGO_SHUTDOWN_FORCE_KILL_AFTER=1s after the drain started: signal 9 (SIGKILL)"
    );
    assert_eq!(report.cause, proto::ExitCause::ShutdownDeadline as i32);
    assert_eq!(report.signal, Some(signal::SIGKILL));
    rig.handled(1, 1, None);
    // The broker reports and exits in time.
    rig.broker_exit(code(0));
    assert!(rig.m.done());
    let error = rig.m.outcome().unwrap_err();
    assert!(
        matches!(error, RuntimeError::ForceKilled { deadline } if deadline == secs(1)),
        "{error}"
    );
    assert_eq!(ExpectedError::from(error).process_exit_code(), 3);
}

/// A broker that does not exit within 2 s of the force kill is killed too.
#[test]
fn a_broker_still_there_2_seconds_after_the_force_kill_is_killed() {
    let mut c = config(1, 1);
    c.force_kill_after = Some(secs(5));
    let mut rig = Rig::running(c);
    rig.go(Input::Signal("SIGINT"));
    assert_eq!(rig.after(secs(5)), [Effect::ReadPhases]);
    let out = rig.go(Input::PhasesRead(None));
    assert_eq!(signals(&out), [(Rig::pid(1, 1), signal::SIGKILL)]);
    assert_eq!(rig.after(secs(1)), []);
    assert_eq!(
        rig.after(secs(1)),
        [
            Effect::Signal {
                child: BROKER,
                signal: signal::SIGKILL
            },
            Effect::AbortAll
        ]
    );
}

/// The broker's death: every executor gets SIGTERM (its report says BROKER_GONE, and is not
/// sent: nobody listens), nothing restarts, and the runtime ends with the broker's status
/// (exit 1) once every executor is gone.
#[test]
fn the_brokers_death_stops_the_executors_and_exits_1() {
    let mut rig = Rig::running(config(2, 2));
    rig.exit(2, 1, code(1));
    rig.handled(2, 1, None);
    let out = rig.broker_exit(code(1));
    assert_eq!(signals(&out), [(Rig::pid(1, 1), signal::SIGTERM)]);
    assert!(rig.m.draining());
    assert_eq!(rig.m.slot(2).2, None, "no restart after the broker's death");
    let out = rig.go(Input::Exited(ChildExit {
        kind: ChildKind::Executor {
            slot: 1,
            generation: 1,
        },
        pid: Rig::pid(1, 1),
        ended: killed(signal::SIGTERM),
    }));
    let [
        Effect::HandleExit {
            report,
            tell_broker: false,
            ..
        },
    ] = out.as_slice()
    else {
        panic!("{out:?}");
    };
    assert_eq!(report.cause, proto::ExitCause::BrokerGone as i32);
    assert!(!rig.m.done());
    rig.handled(1, 1, None);
    assert!(rig.m.done());
    let error = rig.m.outcome().unwrap_err();
    assert_eq!(
        error.to_string(),
        "the broker exited (exit status 1) while the runtime was running"
    );
    assert_eq!(ExpectedError::from(error).process_exit_code(), 1);
}

/// A broker whose state has not come for PERAGO_STALL_TIMEOUT is SIGKILLed (a thread-mode one
/// aborted), and its death names the stall; a fresh state holds it off.
#[test]
fn a_stalled_broker_is_killed_and_its_death_names_the_stall() {
    let mut c = config(1, 1);
    c.stall_timeout = Some(secs(5));
    let mut rig = Rig::running(c.clone());
    assert_eq!(rig.wake_in(), Some(secs(5)));
    rig.after(secs(4));
    rig.go(Input::BrokerState(state(&[(1, Idle, 1, false)], false)));
    assert_eq!(rig.after(secs(4)), []);
    let out = rig.after(secs(1));
    assert_eq!(
        out,
        [Effect::Signal {
            child: BROKER,
            signal: signal::SIGKILL
        }]
    );
    assert_eq!(rig.after(secs(10)), [], "killed once");
    rig.broker_exit(killed(signal::SIGKILL));
    rig.exit(1, 1, killed(signal::SIGTERM));
    rig.handled(1, 1, None);
    let error = rig.m.outcome().unwrap_err();
    assert_eq!(
        error.to_string(),
        "the broker exited (signal 9 (SIGKILL): the broker did not answer for 5s (PERAGO_STALL_TIMEOUT=5s); killed) while the runtime was running"
    );

    // Thread mode: the broker's task is aborted.
    let t0 = Instant::now();
    let mut m = Machine::new(c, token, Child::Task, t0);
    m.handle(Input::Begin, t0);
    assert_eq!(
        m.handle(Input::Tick, t0 + secs(5)),
        [Effect::AbortAll],
        "thread mode"
    );
}

/// The periodic GC: every interval, with each slot's current generation, never two at once;
/// the runtime waits for one under way.
#[test]
fn the_gc_runs_every_interval_one_at_a_time() {
    let mut rig = Rig::running(config(2, 3));
    assert_eq!(rig.wake_in(), Some(secs(300)));
    let out = rig.after(secs(300));
    assert_eq!(out, [Effect::SweepExpired]);
    assert_eq!(
        rig.m.generations(),
        BTreeMap::from([(1, 1), (2, 1), (3, 0)])
    );
    assert_eq!(rig.m.next_wake(), None, "no second sweep while one runs");
    assert_eq!(rig.after(secs(600)), []);
    assert!(
        matches!(rig.go(Input::GcDone).as_slice(), [Effect::SweepExpired]),
        "overdue: at once"
    );
    // The runtime ends only once the sweep is done.
    rig.broker_exit(code(0));
    for slot in [1, 2] {
        rig.exit(slot, 1, code(0));
        rig.handled(slot, 1, None);
    }
    assert!(!rig.m.done());
    rig.go(Input::GcDone);
    assert!(rig.m.done());
}

/// Under systemd: READY=1 with the first state in which every start-up executor is
/// attached (no reads of its own), STATUS= with each state afterwards but not during a drain,
/// STOPPING=1 at the drain.
#[test]
fn systemd_hears_ready_status_and_stopping() {
    let mut c = config(2, 3);
    c.notify = true;
    let mut rig = Rig::new(c.clone());
    let out = rig.go(Input::Begin);
    assert_eq!(announced(&out), Some((1, 1)));
    assert_eq!(out.len(), 1, "nothing is read: {out:?}");
    assert_eq!(rig.after(Duration::from_millis(25)), [], "no polling");
    let one = state(&[(1, Idle, 1, false), (2, Waiting, 0, false)], false);
    assert_eq!(
        rig.go(Input::BrokerState(one.clone())),
        [],
        "not ready, and no STATUS= before READY=1"
    );
    let both = state(&[(1, Idle, 1, false), (2, Busy, 1, false)], false);
    assert_eq!(
        rig.go(Input::BrokerState(both.clone())),
        [Effect::Notify(Notice::Ready("t: 1 busy, 1 idle".into()))]
    );
    assert_eq!(
        rig.go(Input::BrokerState(one)),
        [Effect::Notify(Notice::Status("t: 0 busy, 1 idle".into()))]
    );
    assert_eq!(
        rig.go(Input::Signal("SIGTERM")),
        [
            Effect::Notify(Notice::Stopping("SIGTERM".into())),
            Effect::Drain
        ]
    );
    assert_eq!(rig.go(Input::BrokerState(both.clone())), []);

    // A drain before readiness: never ready.
    let mut rig = Rig::new(c);
    rig.go(Input::Begin);
    rig.go(Input::Signal("SIGTERM"));
    assert_eq!(rig.go(Input::BrokerState(both)), []);
}

/// WATCHDOG=1 every period while the broker's state is fresh (younger than the period, and
/// at least 3 s), and through a drain.
#[test]
fn the_watchdog_is_pinged_while_the_brokers_state_is_fresh() {
    let mut c = config(1, 1);
    c.notify = true;
    c.watchdog = Some(secs(10));
    let mut rig = Rig::new(c);
    let out = rig.go(Input::Begin);
    assert!(out.contains(&Effect::Notify(Notice::Ping)), "{out:?}");
    rig.start(1, 1);
    rig.now += secs(9);
    rig.go(Input::BrokerState(state(&[(1, Idle, 1, false)], false)));
    assert_eq!(rig.after(secs(1)), [Effect::Notify(Notice::Ping)]);
    assert_eq!(rig.after(secs(10)), [], "the state is 11 s old");
    rig.go(Input::Signal("SIGTERM"));
    assert_eq!(rig.after(secs(10)), [Effect::Notify(Notice::Ping)]);
}

/// The broker's stream ended cleanly (it drained): no more messages come, and that silence is
/// not a stall; nothing restarts.
#[test]
fn a_broker_that_drained_is_not_a_stalled_one() {
    let mut c = config(1, 1);
    c.stall_timeout = Some(secs(5));
    let mut rig = Rig::running(c);
    rig.exit(1, 1, code(1));
    rig.handled(1, 1, None);
    assert_eq!(rig.go(Input::BrokerDrained), []);
    assert!(rig.m.draining());
    assert_eq!(rig.m.slot(1).2, None, "no restart");
    assert_eq!(rig.after(secs(60)), [], "no stall kill");
    rig.broker_exit(code(0));
    assert!(rig.m.done());
    assert!(rig.m.outcome().is_ok());
}

/// The exit decision reads the broker's answer to the report: `SlotExitedAck` is the view.
#[test]
fn the_exit_reports_answer_is_the_brokers_view() {
    let view = SlotView::from(proto::SlotExitedAck {
        draining: false,
        retired: true,
        recycling: true,
    });
    assert_eq!(
        view,
        SlotView {
            draining: false,
            retired: true,
            recycling: true
        }
    );
    let mut rig = Rig::running(config(1, 2));
    rig.exit(1, 1, code(75));
    let out = rig.go(Input::ExitHandled {
        slot: 1,
        generation: 1,
        seen: Some(SlotView {
            recycling: true,
            ..SlotView::default()
        }),
    });
    assert_eq!(announced(&out), Some((1, 2)), "recycled");
    rig.start(1, 2);
    rig.exit(1, 2, code(0));
    let out = rig.go(Input::ExitHandled {
        slot: 1,
        generation: 2,
        seen: Some(SlotView {
            retired: true,
            ..SlotView::default()
        }),
    });
    assert_eq!(out, []);
    assert_eq!(rig.m.slot(1).2, None, "retired");
}

/// A drain that starts while a slot's next generation is being started (a recycle restarts it
/// at once) starts nothing more: an announcement the broker takes after it spawns nothing, and
/// an executor whose spawn was already under way is told to stop at once. Before, it was
/// started, found the broker gone once the drain finished, and the runtime waited the
/// executor's whole 10 s connect patience for it.
#[test]
fn a_drain_during_a_restart_starts_no_executor() {
    let mut rig = Rig::running(config(1, 1));
    rig.exit(1, 1, code(75));
    let out = rig.handled(1, 1, Some(state(&[(1, Exited, 1, true)], false)));
    assert_eq!(announced(&out), Some((1, 2)), "{out:?}");
    assert_eq!(rig.go(Input::Signal("SIGTERM")), [Effect::Drain]);
    let out = rig.go(Input::Announced {
        slot: 1,
        generation: 2,
        result: Ok(()),
    });
    assert_eq!(out, [], "no spawn once draining");
    assert_eq!(rig.broker_exit(code(0)), []);
    assert!(rig.m.done(), "nothing left to wait for");
    assert!(rig.m.outcome().is_ok());

    // The spawn was under way when the drain started: the new executor is stopped at once.
    let mut rig = Rig::running(config(1, 1));
    rig.exit(1, 1, code(75));
    rig.handled(1, 1, Some(state(&[(1, Exited, 1, true)], false)));
    let out = rig.go(Input::Announced {
        slot: 1,
        generation: 2,
        result: Ok(()),
    });
    assert!(matches!(out.as_slice(), [Effect::Spawn { .. }]), "{out:?}");
    rig.go(Input::Signal("SIGTERM"));
    let out = rig.go(Input::Spawned {
        slot: 1,
        generation: 2,
        result: Ok(Child::Process(Rig::pid(1, 2))),
    });
    assert_eq!(signals(&out), [(Rig::pid(1, 2), signal::SIGTERM)]);
    // Its exit is the supervisor's doing, never a crash against a task.
    let report = rig.exit(1, 2, killed(signal::SIGTERM));
    assert_eq!(report.cause, proto::ExitCause::Supervisor as i32);
}
