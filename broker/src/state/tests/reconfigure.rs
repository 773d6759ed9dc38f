//! `Admin.Reconfigure` (issue #26 item 4): the soft time limit changes for the assignments
//! dispatched from then on, status shows the value in force, an unchanged value is a no-op,
//! and a drain refuses it.

use super::*;

impl Harness {
    fn reconfigure(&mut self, soft: Option<u64>) -> Result<(bool, Option<u64>), Status> {
        let out = self.handle(Input::Reconfigure {
            soft_time_limit_ms: soft,
        });
        assert!(out.effects.is_empty(), "{:?}", out.effects);
        match out.reply {
            Reply::Reconfigure(r) => r,
            other => panic!("{other:?}"),
        }
    }
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
