//! `Admin.Reconfigure` (issue #26 item 4): the soft time limit changes for the assignments
//! dispatched from then on, status shows the value in force, an unchanged value is a no-op,
//! and a drain refuses it.

use super::*;

impl Harness {
    fn reconfigure(&mut self, soft: Option<u64>) -> Result<(bool, Option<u64>), Status> {
        let (done, effects) = self.reconfigure_with(Reconfig {
            soft_time_limit_ms: soft,
            ..Reconfig::default()
        });
        assert!(effects.is_empty(), "{effects:?}");
        done.map(|d| (d.unchanged, d.previous_soft_time_limit_ms))
    }

    fn reconfigure_with(
        &mut self,
        settings: Reconfig,
    ) -> (Result<Reconfigured, Status>, Vec<Effect>) {
        let out = self.handle(Input::Reconfigure(settings));
        match out.reply {
            Reply::Reconfigure(r) => (r, out.effects),
            other => panic!("{other:?}"),
        }
    }
}

/// The recycling limits each assignment sent carries.
fn recycle_limits(effects: &[Effect]) -> Vec<(Option<u64>, Option<u64>)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Send {
                message:
                    proto::BrokerMessage {
                        message: Some(proto::broker_message::Message::Assignment(a)),
                    },
                ..
            } => Some((a.max_tasks_per_executor, a.max_executor_memory_bytes)),
            _ => None,
        })
        .collect()
}

fn poll_settings(effects: &[Effect]) -> Vec<PollSettings> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::PollSettings(s) => Some((**s).clone()),
            _ => None,
        })
        .collect()
}

/// The soft time limit each assignment sent carries.
fn soft_limits(effects: &[Effect]) -> Vec<Option<u64>> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Send {
                message:
                    proto::BrokerMessage {
                        message: Some(proto::broker_message::Message::Assignment(a)),
                    },
                ..
            } => Some(a.soft_time_limit_ms),
            _ => None,
        })
        .collect()
}

#[test]
fn a_new_soft_limit_goes_with_the_assignments_dispatched_after_it() {
    let mut h = Harness::new(2, true);
    h.m = std::mem::replace(&mut h.m, Harness::new(2, true).m).with_soft_time_limit(Some(60_000));
    h.up(2);
    assert_eq!(h.status().soft_time_limit_ms, Some(60_000));
    assert_eq!(h.status().reconfigured_at_unix_ms, 0);
    assert_eq!(soft_limits(&h.deliver(&["a"])), [Some(60_000)]);
    // Changed: the next assignment carries the new one; status shows it and when.
    assert_eq!(h.reconfigure(Some(30_000)).unwrap(), (false, Some(60_000)));
    let status = h.status();
    assert_eq!(status.soft_time_limit_ms, Some(30_000));
    assert!(status.reconfigured_at_unix_ms > 0);
    assert_eq!(soft_limits(&h.deliver(&["b"])), [Some(30_000)]);
    // The same value again, or nothing set: unchanged.
    assert_eq!(h.reconfigure(Some(30_000)).unwrap(), (true, Some(30_000)));
    assert_eq!(h.reconfigure(None).unwrap(), (true, Some(30_000)));
    // 0 is "no soft limit", carried as such.
    assert_eq!(h.reconfigure(Some(0)).unwrap(), (false, Some(30_000)));
    assert_eq!(h.status().soft_time_limit_ms, Some(0));
}

#[test]
fn a_broker_never_told_leaves_the_soft_limit_to_the_executors() {
    let mut h = Harness::new(1, true);
    h.up(1);
    assert_eq!(h.status().soft_time_limit_ms, None);
    assert_eq!(soft_limits(&h.deliver(&["a"])), [None]);
}

#[test]
fn a_drain_refuses_a_reconfigure() {
    let mut h = Harness::new(1, true);
    h.up(1);
    h.handle(Input::Drain);
    let refused = h.reconfigure(Some(1000)).unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert_eq!(h.status().soft_time_limit_ms, None);
}

/// Recycling limits ride on every assignment: the start's, then a reconfigure's from the
/// next assignment on (0: off); status shows the ones in force.
#[test]
fn recycling_limits_go_with_the_assignments_dispatched_after_a_reconfigure() {
    let mut h = capacity_with(|c| c.max_tasks_per_executor = Some(100));
    h.up(1);
    let first = h.deliver(&["a"]);
    assert_eq!(recycle_limits(&first), [(Some(100), Some(0))]);
    let execution = assignments(&first)[0].1.clone();
    let (done, effects) = h.reconfigure_with(Reconfig {
        max_tasks_per_executor: Some(3),
        max_executor_memory_bytes: Some(512 << 20),
        ..Reconfig::default()
    });
    let done = done.unwrap();
    assert!(!done.unchanged);
    assert_eq!(
        done.changed,
        [
            "max_tasks_per_executor: 100 -> 3",
            "max_executor_memory: off -> 512MiB"
        ]
    );
    assert!(effects.is_empty(), "{effects:?}");
    let capacity = h.status().capacity.unwrap();
    assert_eq!(
        (
            capacity.max_tasks_per_executor,
            capacity.max_executor_memory_bytes
        ),
        (3, 512 << 20)
    );
    h.complete(1, 1, "a", &execution);
    assert_eq!(
        recycle_limits(&h.deliver(&["b"])),
        [(Some(3), Some(512 << 20))]
    );
    // 0 turns a limit off.
    let (done, _) = h.reconfigure_with(Reconfig {
        max_tasks_per_executor: Some(0),
        ..Reconfig::default()
    });
    assert_eq!(done.unwrap().changed, ["max_tasks_per_executor: 3 -> off"]);
    assert_eq!(h.status().capacity.unwrap().max_tasks_per_executor, 0);
}

/// The domain and the poll settings go to the poll loop (one effect with all of them), and
/// status shows them; the same values again change nothing and send nothing.
#[test]
fn the_domain_and_poll_settings_go_to_the_poll_loop() {
    let mut h = Harness::new(1, true);
    h.m = std::mem::replace(&mut h.m, Harness::new(1, true).m)
        .with_poll(Duration::from_secs(5), Duration::ZERO);
    h.up(1);
    let (done, effects) = h.reconfigure_with(Reconfig {
        domain: Some("blue".to_owned()),
        poll_timeout_ms: Some(1000),
        poll_interval_ms: Some(250),
        ..Reconfig::default()
    });
    assert_eq!(
        done.unwrap().changed,
        [
            "domain: none -> blue",
            "poll_timeout: 5s -> 1s",
            "poll_interval: 0ns -> 250ms"
        ]
    );
    assert_eq!(
        poll_settings(&effects),
        [PollSettings {
            domain: Some(perago_core::conductor::Domain::parse("blue").unwrap()),
            wait: Duration::from_secs(1),
            idle_wait: Duration::from_millis(250),
        }]
    );
    assert_eq!(h.status().domain, "blue");
    assert_eq!(h.m.poll_ms(), (1000, 250));
    let (done, effects) = h.reconfigure_with(Reconfig {
        domain: Some("blue".to_owned()),
        poll_interval_ms: Some(250),
        ..Reconfig::default()
    });
    assert!(done.unwrap().unchanged);
    assert!(poll_settings(&effects).is_empty(), "{effects:?}");
    // Empty: back to the default queue.
    let (_, effects) = h.reconfigure_with(Reconfig {
        domain: Some(String::new()),
        ..Reconfig::default()
    });
    assert_eq!(poll_settings(&effects)[0].domain, None);
    assert_eq!(h.status().domain, "");
}

/// A request with one bad field is refused as a whole: nothing of it applies.
#[test]
fn a_bad_field_refuses_the_whole_reconfigure() {
    let mut h = Harness::new(1, true);
    h.up(1);
    for (bad, field) in [
        (
            Reconfig {
                domain: Some("a:b".to_owned()),
                max_tasks_per_executor: Some(5),
                ..Reconfig::default()
            },
            "domain: ",
        ),
        (
            Reconfig {
                poll_timeout_ms: Some(10),
                max_tasks_per_executor: Some(5),
                ..Reconfig::default()
            },
            "poll_timeout_ms 10: must be at least 100",
        ),
        (
            Reconfig {
                poll_interval_ms: Some(4_000_000),
                max_tasks_per_executor: Some(5),
                ..Reconfig::default()
            },
            "poll_interval_ms 4000000: must be at most",
        ),
    ] {
        let (done, effects) = h.reconfigure_with(bad);
        let refused = done.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument);
        assert!(
            refused.message().starts_with(field),
            "{}",
            refused.message()
        );
        assert!(effects.is_empty());
        assert_eq!(h.status().capacity.unwrap().max_tasks_per_executor, 0);
    }
}

/// A memory floor set live closes admission at once against the last measurement (no poll
/// is granted), and removing it opens admission again (the waiting poll is granted); set
/// with no measurement yet, the measurements are started.
#[test]
fn a_memory_floor_set_live_judges_admission_at_once() {
    let mut h = with_min_free_memory(1, GIB);
    h.up(1);
    h.go(Input::Memory { available: 2 * GIB });
    assert!(h.status().capacity.unwrap().admission_open);
    let (done, _) = h.reconfigure_with(Reconfig {
        min_free_memory_bytes: Some(4 * GIB),
        ..Reconfig::default()
    });
    assert_eq!(done.unwrap().changed, ["min_free_memory: 1GiB -> 4GiB"]);
    assert!(!h.status().capacity.unwrap().admission_open);
    assert_eq!(h.poll(), None);
    let (done, effects) = h.reconfigure_with(Reconfig {
        min_free_memory_bytes: Some(0),
        ..Reconfig::default()
    });
    assert_eq!(done.unwrap().changed, ["min_free_memory: 4GiB -> off"]);
    assert!(h.status().capacity.unwrap().admission_open);
    assert_eq!(grant(&effects), Some(1));

    let mut fresh = Harness::new(1, true);
    fresh.up(1);
    let (_, effects) = fresh.reconfigure_with(Reconfig {
        min_free_memory_bytes: Some(GIB),
        ..Reconfig::default()
    });
    assert!(
        effects.iter().any(|e| matches!(e, Effect::WatchMemory)),
        "{effects:?}"
    );
}
