//! The ledger driven step by step: brokers' states in, grants out.

use super::*;

fn pool(n: u64, types: usize, priority: Priority) -> Ledger {
    Ledger::new(SharePlan {
        types: (0..types).map(|i| format!("t{i}")).collect(),
        priority,
        constraints: vec![Constraint {
            what: "--pool".into(),
            cap: n,
            costs: vec![1; types],
        }],
    })
}

fn share(limit: u32, epoch: u64, held: u32, fillable: u32, empty: bool) -> admin::ShareStatus {
    admin::ShareStatus {
        limit,
        epoch,
        held,
        fillable,
        empty,
        started: 0,
    }
}

fn report(l: &mut Ledger, index: usize, s: admin::ShareStatus, started: u64) -> Vec<Grant> {
    l.handle(Input::Reported {
        index,
        broker: (100 + index as u32, 1),
        share: s,
        started,
    })
}

fn grant(index: usize, limit: u32, epoch: u64) -> Grant {
    Grant {
        index,
        limit,
        epoch,
    }
}

#[test]
fn strict_offers_the_pool_to_the_first_type_with_something_to_give() {
    let mut l = pool(2, 2, Priority::Strict);
    // Nothing before every broker of the pool has reported.
    assert!(report(&mut l, 1, share(0, 0, 0, 2, false), 0).is_empty());
    assert_eq!(
        report(&mut l, 0, share(0, 0, 0, 2, false), 0),
        [grant(0, 2, 1)]
    );
    // The critical type has nothing more to give: the low one gets what is left.
    let mut l = pool(2, 2, Priority::Strict);
    report(&mut l, 0, share(0, 0, 0, 0, false), 0);
    assert_eq!(
        report(&mut l, 1, share(0, 0, 0, 2, false), 0),
        [grant(1, 2, 1)]
    );
    // The critical type shows up with a backlog: the low one is lowered at once, the critical
    // one raised only as the low one's holding comes down.
    let grants = report(&mut l, 0, share(0, 0, 0, 2, false), 0);
    assert_eq!(
        grants,
        [grant(1, 0, 2)],
        "no room under the low type's bound yet"
    );
    // The low type answered with nothing held: room for the critical one.
    let grants = l.handle(Input::Answered {
        index: 1,
        share: share(0, 2, 0, 2, false),
    });
    assert_eq!(grants, [grant(0, 2, 1)]);
    assert_eq!((l.bound(0), l.bound(1)), (2, 0));
}

#[test]
fn a_lowered_limit_counts_what_the_broker_still_holds_until_it_sheds() {
    let mut l = pool(2, 2, Priority::Strict);
    report(&mut l, 1, share(0, 0, 0, 2, false), 0);
    l.handle(Input::Answered {
        index: 1,
        share: share(2, 1, 0, 2, false),
    });
    // The low type runs two tasks; then the critical one asks.
    report(&mut l, 1, share(2, 1, 2, 0, false), 2);
    let grants = report(&mut l, 0, share(0, 0, 0, 2, false), 0);
    assert_eq!(grants, [grant(1, 0, 2)]);
    // The answer: still two held. Nothing for the critical type: never more than 2 at once.
    let grants = l.handle(Input::Answered {
        index: 1,
        share: share(0, 2, 2, 0, false),
    });
    assert!(grants.is_empty(), "{grants:?}");
    assert_eq!(l.bound(1), 2);
    // One finished (reported through v1): one permit moves.
    let grants = report(&mut l, 1, share(0, 2, 1, 1, false), 2);
    assert_eq!(grants, [grant(0, 1, 1)]);
    let grants = report(&mut l, 1, share(0, 2, 0, 2, false), 2);
    assert_eq!(grants, [grant(0, 2, 2)]);
}

#[test]
fn a_type_with_nothing_to_give_yields_to_the_next_and_keeps_one_probe_when_the_pool_idles() {
    let mut l = pool(2, 2, Priority::Strict);
    report(&mut l, 0, share(0, 0, 0, 2, false), 0);
    l.handle(Input::Answered {
        index: 0,
        share: share(2, 1, 0, 2, false),
    });
    report(&mut l, 1, share(0, 0, 0, 2, false), 0);
    // The critical queue ran dry: its last poll came back empty.
    let grants = report(&mut l, 0, share(2, 1, 0, 0, true), 5);
    assert_eq!(grants, [grant(0, 0, 2)]);
    let grants = l.handle(Input::Answered {
        index: 0,
        share: share(0, 2, 0, 0, true),
    });
    assert_eq!(grants, [grant(1, 2, 1)]);
    // The low type is done too: each keeps one long poll.
    l.handle(Input::Answered {
        index: 1,
        share: share(2, 1, 0, 2, false),
    });
    let grants = report(&mut l, 1, share(2, 1, 0, 0, true), 3);
    assert_eq!(grants, [grant(1, 1, 2)]);
    let grants = l.handle(Input::Answered {
        index: 1,
        share: share(1, 2, 0, 0, true),
    });
    assert_eq!(grants, [grant(0, 1, 3)]);
}

#[test]
fn weighted_shares_follow_the_starts() {
    let mut l = pool(1, 2, Priority::Weighted(vec![3, 1]));
    // Each broker's limit and epoch in force; a grant applies when it is answered.
    let mut limits = [0u32, 0];
    let mut epochs = [0u64, 0];
    let mut pending = report(&mut l, 0, share(0, 0, 0, 1, false), 0);
    pending.extend(report(&mut l, 1, share(0, 0, 0, 1, false), 0));
    // One permit, passed back and forth as each task ends; count who gets it.
    let mut starts = [0u64; 2];
    for _ in 0..400 {
        while let Some(g) = pending.pop() {
            limits[g.index] = g.limit;
            epochs[g.index] = g.epoch;
            pending.extend(l.handle(Input::Answered {
                index: g.index,
                share: share(g.limit, g.epoch, 0, 1, false),
            }));
        }
        let Some(i) = (0..2).find(|&i| limits[i] > 0) else {
            panic!("nobody holds the permit: {starts:?}");
        };
        // It starts a task and finishes it (through v1: the ledger decides who is next).
        starts[i] += 1;
        pending.extend(report(
            &mut l,
            i,
            share(limits[i], epochs[i], 1, 0, false),
            starts[i],
        ));
        pending.extend(report(
            &mut l,
            i,
            share(limits[i], epochs[i], 0, 1, false),
            starts[i],
        ));
        if starts.iter().sum::<u64>() == 40 {
            break;
        }
    }
    assert_eq!(starts.iter().sum::<u64>(), 40, "{starts:?}");
    assert_eq!(starts, [30, 10]);
}

#[test]
fn a_group_caps_its_members_summed_cost_beside_the_pool() {
    let mut l = Ledger::new(SharePlan {
        types: vec!["a".into(), "b".into(), "c".into()],
        priority: Priority::Strict,
        constraints: vec![Constraint {
            what: "group providers budget".into(),
            cap: 12,
            costs: vec![5, 5, 0],
        }],
    });
    assert!(report(&mut l, 1, share(0, 0, 0, 4, false), 0).is_empty());
    // The first member takes two (10 of 12: a task costs 5); nothing is left for the other.
    assert_eq!(
        report(&mut l, 0, share(0, 0, 0, 4, false), 0),
        [grant(0, 2, 1)]
    );
    // The third type is under no cap: its broker does not share, nothing is granted.
    assert!(report(&mut l, 2, share(0, 0, 0, 4, false), 0).is_empty());
}

#[test]
fn a_new_broker_starts_from_what_it_says() {
    let mut l = pool(2, 1, Priority::Strict);
    report(&mut l, 0, share(0, 0, 0, 2, false), 0);
    l.handle(Input::Answered {
        index: 0,
        share: share(2, 1, 2, 0, false),
    });
    // Another broker process on the same type: it holds nothing and was granted nothing.
    let grants = l.handle(Input::Reported {
        index: 0,
        broker: (999, 2),
        share: share(0, 0, 0, 2, false),
        started: 0,
    });
    assert_eq!(grants, [grant(0, 2, 2)], "epochs keep increasing");
}

#[test]
fn a_grant_that_was_not_answered_is_sent_again() {
    let mut l = pool(2, 1, Priority::Strict);
    assert_eq!(
        report(&mut l, 0, share(0, 0, 0, 2, false), 0),
        [grant(0, 2, 1)]
    );
    let grants = l.handle(Input::Failed { index: 0, epoch: 1 });
    assert_eq!(grants, [grant(0, 2, 2)]);
}

fn members<'a>(
    names: &'a [&'a str],
    groups: &'a [Option<perago_core::manifest::ConcurrencyGroup>],
) -> Vec<Member<'a>> {
    names
        .iter()
        .zip(groups)
        .map(|(name, group)| Member {
            name,
            manifest: std::path::Path::new(name),
            group: group.as_ref(),
        })
        .collect()
}

fn pool_flags(
    pool: Option<u32>,
    priority: Option<&str>,
    types: &[&str],
) -> Result<Option<SharePlan>, ShareError> {
    let none = vec![None; types.len()];
    resolve(pool, priority, &[], None, &members(types, &none))
}

#[test]
fn the_flags_resolve_or_name_what_is_wrong() {
    let types = ["a", "b", "c"];
    assert_eq!(pool_flags(None, None, &types).unwrap(), None);
    let plan = pool_flags(Some(2), None, &types).unwrap().unwrap();
    assert_eq!(plan.priority, Priority::Strict);
    assert_eq!(plan.constraints[0].cap, 2);
    assert!((0..3).all(|i| plan.shares(i)));
    let plan = pool_flags(Some(2), Some("weighted=3,2,1"), &types)
        .unwrap()
        .unwrap();
    assert_eq!(plan.priority, Priority::Weighted(vec![3, 2, 1]));
    let bad = [
        (
            Some(2),
            Some("weighted=3,1"),
            "--priority weighted=3,1: 2 weights for 3 task types (a, b, c): give one per manifest, in order",
        ),
        (
            Some(2),
            Some("weighted=3,0,1"),
            "--priority weighted=3,0,1: each weight must be a whole number of at least 1",
        ),
        (
            Some(2),
            Some("fair"),
            "--priority fair: expected strict or weighted=W,… (one weight per manifest, in order)",
        ),
        (
            None,
            Some("strict"),
            "--priority needs --pool N or a concurrency group: it orders the types sharing capacity",
        ),
        (
            Some(0),
            None,
            "--pool 0: the pool needs at least 1 executor",
        ),
    ];
    for (pool, priority, want) in bad {
        assert_eq!(
            pool_flags(pool, priority, &types).unwrap_err(),
            ShareError::Usage(want.to_owned())
        );
    }
}

fn group(
    name: &str,
    limit: Option<u32>,
    cost_units: u32,
) -> Option<perago_core::manifest::ConcurrencyGroup> {
    Some(perago_core::manifest::ConcurrencyGroup {
        name: name.into(),
        limit,
        cost_units,
    })
}

#[test]
fn groups_resolve_into_a_limit_and_a_budget_over_their_members() {
    let names = ["a", "b", "c"];
    let groups = [
        group("providers", Some(3), 5),
        group("providers", None, 2),
        None,
    ];
    let flags = ["providers=12".to_owned()];
    let plan = resolve(
        None,
        None,
        &flags,
        Some("ignored=1"),
        &members(&names, &groups),
    )
    .unwrap()
    .unwrap();
    assert_eq!(
        plan.constraints,
        [
            Constraint {
                what: "group providers limit".into(),
                cap: 3,
                costs: vec![1, 1, 0]
            },
            Constraint {
                what: "group providers budget".into(),
                cap: 12,
                costs: vec![5, 2, 0]
            },
        ]
    );
    assert!(plan.shares(0) && plan.shares(1) && !plan.shares(2));
    // The variable, when no flag is given.
    let plan = resolve(
        None,
        None,
        &[],
        Some("providers=7"),
        &members(&names, &groups),
    )
    .unwrap()
    .unwrap();
    assert_eq!(plan.constraints[1].cap, 7);
}

#[test]
fn members_that_disagree_on_a_limit_and_budgets_that_fit_no_task_are_errors() {
    let names = ["a.toml", "b.toml"];
    let groups = [
        group("providers", Some(2), 1),
        group("providers", Some(3), 1),
    ];
    assert_eq!(
        resolve(None, None, &[], None, &members(&names, &groups)).unwrap_err(),
        ShareError::Config("task.concurrency_limit: the members of the concurrency group providers disagree: a.toml says 2, b.toml says 3; give every member the same limit".into())
    );
    let groups = [group("providers", None, 5), None];
    let err = |flags: &[&str], var: Option<&str>| {
        let flags: Vec<String> = flags.iter().map(|f| (*f).to_owned()).collect();
        resolve(None, None, &flags, var, &members(&names, &groups)).unwrap_err()
    };
    assert_eq!(
        err(&["providers=4"], None),
        ShareError::Config("--group-budget providers=4: a task of a.toml costs 5 units (a.toml): none could ever run".into())
    );
    assert_eq!(
        err(&["others=4"], None),
        ShareError::UnknownGroup {
            message:
                "--group-budget others=4: no manifest given is in the concurrency group others"
                    .into(),
            flag: true,
        }
    );
    assert_eq!(
        err(&[], Some("others=4")),
        ShareError::UnknownGroup {
            message:
                "PERAGO_GROUP_BUDGETS others=4: no manifest given is in the concurrency group others"
                    .into(),
            flag: false,
        }
    );
    assert_eq!(
        err(&["providers"], None),
        ShareError::Usage(
            "--group-budget providers: expected NAME=UNITS (e.g. providers=12)".into()
        )
    );
    assert_eq!(
        err(&[], Some("providers=x")),
        ShareError::Config(
            "PERAGO_GROUP_BUDGETS providers=x: UNITS must be a whole number of at least 1".into()
        )
    );
}

/// Issue #26 item 4: a reload replaces the caps. A lowered cap lowers the grants at once, and
/// nothing more is granted until the holdings come down under it; a raised one grants the
/// room it leaves.
#[test]
fn a_replanned_cap_lowers_at_once_and_raises_within_the_bounds() {
    let mut l = pool(4, 1, Priority::Strict);
    assert_eq!(
        report(&mut l, 0, share(0, 0, 0, 4, false), 0),
        [grant(0, 4, 1)]
    );
    // It runs 4 at once; the cap goes down to 2.
    l.handle(Input::Answered {
        index: 0,
        share: share(4, 1, 4, 0, false),
    });
    let lowered = SharePlan {
        constraints: vec![Constraint {
            what: "group g limit".into(),
            cap: 2,
            costs: vec![1],
        }],
        ..l.plan().clone()
    };
    assert_eq!(l.replan(lowered), [grant(0, 2, 2)]);
    assert_eq!(l.bound(0), 4, "what it still holds counts until it sheds");
    // Shed to 2, wanting more: nothing above the new cap.
    let grants = l.handle(Input::Answered {
        index: 0,
        share: share(2, 2, 2, 3, false),
    });
    assert!(grants.is_empty(), "{grants:?}");
    assert_eq!(l.bound(0), 2);
    // Raised to 5: granted up to its want (2 held + 3 fillable).
    let raised = SharePlan {
        constraints: vec![Constraint {
            what: "group g limit".into(),
            cap: 5,
            costs: vec![1],
        }],
        ..l.plan().clone()
    };
    assert_eq!(l.replan(raised), [grant(0, 5, 3)]);
}
