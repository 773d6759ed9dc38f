//! Capacity shared across task types (`start --pool N`, `--priority`, concurrency groups;
//! docs/sharing.md): the ledger that decides how many tasks each type's broker may hold. A
//! pure machine: [`Ledger::handle`] takes what a broker said (its `Admin.Watch` state, or the
//! answer to a grant) and returns the grants (`Admin.ShareGrant`) to send; the coordinator
//! task (`runtime/share_task.rs`) carries them out.
//!
//! Safety: a broker is counted as occupying `bound = max(limit sent, holding last reported at
//! that epoch)`: after a grant its holding only grows up to the limit, and above the limit only
//! shrinks. Limits are lowered at once (the broker sheds at its next completions) and raised
//! only within what the bounds leave, so every cap holds at every moment.

use perago_proto::admin::v1 as admin;

/// How capacity is offered to the types when it frees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Priority {
    /// In the order the manifests were given: a lower type gets a permit only while every
    /// higher one has nothing more to give.
    Strict,
    /// Shares of the starts under contention (one weight per type, in order).
    Weighted(Vec<u32>),
}

/// A cap on the summed cost of the tasks in flight of its member types.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Constraint {
    /// What it is, for logs: `--pool`, `group providers limit`, `group providers budget`.
    pub(crate) what: String,
    pub(crate) cap: u64,
    /// Per type (in order): the cost of one of its tasks; 0 for a type outside it.
    pub(crate) costs: Vec<u64>,
}

/// What `start` resolved: the types (in the order given), how they are offered capacity,
/// and the caps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SharePlan {
    pub(crate) types: Vec<String>,
    pub(crate) priority: Priority,
    pub(crate) constraints: Vec<Constraint>,
}

impl SharePlan {
    /// Whether type `index` is under any cap (its broker shares capacity).
    pub(crate) fn shares(&self, index: usize) -> bool {
        self.constraints
            .iter()
            .any(|c| c.costs.get(index).is_some_and(|&cost| cost > 0))
    }
}

/// `PERAGO_GROUP_BUDGETS`: `NAME=UNITS[,NAME=UNITS…]`, what `--group-budget` gives (the flags
/// win).
pub(crate) const PERAGO_GROUP_BUDGETS: &str = "PERAGO_GROUP_BUDGETS";

/// One task type as `start` was given it: its name, its manifest, its concurrency group.
pub(crate) struct Member<'a> {
    pub(crate) name: &'a str,
    pub(crate) manifest: &'a std::path::Path,
    pub(crate) group: Option<&'a perago_core::manifest::ConcurrencyGroup>,
}

/// Why the sharing settings do not resolve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ShareError {
    /// A bad flag (exit 2), naming it.
    Usage(String),
    /// Manifests or variables that do not fit together, naming them.
    Config(String),
    /// A budget for a group no manifest given names (`--group-budget`: a usage error;
    /// `PERAGO_GROUP_BUDGETS`: a configuration error; `check` of some of the manifests
    /// leaves it alone).
    UnknownGroup { message: String, flag: bool },
}

impl From<ShareError> for crate::errors::ExpectedError {
    fn from(e: ShareError) -> Self {
        match e {
            ShareError::Usage(message)
            | ShareError::UnknownGroup {
                message,
                flag: true,
            } => Self::Usage(message),
            ShareError::Config(message) | ShareError::UnknownGroup { message, .. } => {
                Self::Config(vec![message])
            }
        }
    }
}

/// `--pool N`, `--priority …`, `--group-budget NAME=UNITS` (else `PERAGO_GROUP_BUDGETS`) and
/// each type's concurrency group, for the task types in the order given: the plan, `None`
/// when nothing is shared.
pub(crate) fn resolve(
    pool: Option<u32>,
    priority: Option<&str>,
    budget_flags: &[String],
    budget_var: Option<&str>,
    members: &[Member<'_>],
) -> Result<Option<SharePlan>, ShareError> {
    let names: Vec<&str> = members.iter().map(|m| m.name).collect();
    let usage = ShareError::Usage;
    let given = priority.is_some();
    let priority = match priority.map(str::trim) {
        None | Some("strict") => Priority::Strict,
        Some(p) => match p.strip_prefix("weighted=") {
            None => {
                return Err(usage(format!(
                    "--priority {p}: expected strict or weighted=W,… (one weight per manifest, in order)"
                )));
            }
            Some(list) => {
                let weights = list
                    .split(',')
                    .map(|w| w.trim().parse::<u32>().ok().filter(|&w| w > 0))
                    .collect::<Option<Vec<u32>>>()
                    .ok_or_else(|| {
                        usage(format!(
                            "--priority {p}: each weight must be a whole number of at least 1"
                        ))
                    })?;
                if weights.len() != names.len() {
                    return Err(usage(format!(
                        "--priority {p}: {} weights for {} task types ({}): give one per manifest, in order",
                        weights.len(),
                        names.len(),
                        names.join(", ")
                    )));
                }
                Priority::Weighted(weights)
            }
        },
    };
    let mut constraints = Vec::new();
    if let Some(n) = pool {
        if n == 0 {
            return Err(usage(
                "--pool 0: the pool needs at least 1 executor".to_owned(),
            ));
        }
        constraints.push(Constraint {
            what: "--pool".to_owned(),
            cap: u64::from(n),
            costs: vec![1; names.len()],
        });
    }
    // The groups, in order of first appearance, with the limit their members agree on.
    let mut groups: Vec<(&str, Option<(u32, &std::path::Path)>)> = Vec::new();
    for m in members {
        let Some(g) = m.group else { continue };
        let at = match groups.iter().position(|(name, _)| *name == g.name) {
            Some(at) => at,
            None => {
                groups.push((g.name.as_str(), None));
                groups.len() - 1
            }
        };
        if let Some(limit) = g.limit {
            match groups[at].1 {
                None => groups[at].1 = Some((limit, m.manifest)),
                Some((first, path)) if first != limit => {
                    return Err(ShareError::Config(format!(
                        "task.concurrency_limit: the members of the concurrency group {} disagree: {} says {first}, {} says {limit}; give every member the same limit",
                        g.name,
                        path.display(),
                        m.manifest.display()
                    )));
                }
                Some(_) => {}
            }
        }
    }
    let budgets = parse_budgets(budget_flags, budget_var)?;
    for (name, units, source) in &budgets {
        if !groups.iter().any(|(g, _)| g == name) {
            return Err(ShareError::UnknownGroup {
                message: format!(
                    "{source} {name}={units}: no manifest given is in the concurrency group {name}"
                ),
                flag: *source != PERAGO_GROUP_BUDGETS,
            });
        }
    }
    for (name, limit) in &groups {
        let member_costs = |cost: fn(&perago_core::manifest::ConcurrencyGroup) -> u64| -> Vec<u64> {
            members
                .iter()
                .map(|m| m.group.filter(|g| g.name == *name).map_or(0, cost))
                .collect()
        };
        if let Some((limit, _)) = limit {
            constraints.push(Constraint {
                what: format!("group {name} limit"),
                cap: u64::from(*limit),
                costs: member_costs(|_| 1),
            });
        }
        if let Some((_, units, source)) = budgets.iter().find(|(g, _, _)| g == name) {
            let costs = member_costs(|g| u64::from(g.cost_units));
            if let Some((i, cost)) = costs.iter().enumerate().find(|(_, c)| **c > *units) {
                return Err(ShareError::Config(format!(
                    "{source} {name}={units}: a task of {} costs {cost} units ({}): none could ever run",
                    names[i],
                    members[i].manifest.display()
                )));
            }
            constraints.push(Constraint {
                what: format!("group {name} budget"),
                cap: *units,
                costs,
            });
        }
    }
    if constraints.is_empty() {
        if given {
            return Err(usage(
                "--priority needs --pool N or a concurrency group: it orders the types sharing capacity"
                    .to_owned(),
            ));
        }
        return Ok(None);
    }
    Ok(Some(SharePlan {
        types: names.iter().map(|t| (*t).to_owned()).collect(),
        priority,
        constraints,
    }))
}

/// The group budgets: every `--group-budget NAME=UNITS`, else `PERAGO_GROUP_BUDGETS`; each
/// with the setting it came from.
fn parse_budgets(
    flags: &[String],
    var: Option<&str>,
) -> Result<Vec<(String, u64, &'static str)>, ShareError> {
    let (items, source): (Vec<&str>, &'static str) = if flags.is_empty() {
        match var.map(str::trim).filter(|v| !v.is_empty()) {
            None => return Ok(Vec::new()),
            Some(v) => (v.split(',').collect(), PERAGO_GROUP_BUDGETS),
        }
    } else {
        (flags.iter().map(String::as_str).collect(), "--group-budget")
    };
    let bad = |item: &str, why: &str| {
        let message = format!("{source} {item}: {why}");
        if source == PERAGO_GROUP_BUDGETS {
            ShareError::Config(message)
        } else {
            ShareError::Usage(message)
        }
    };
    let mut budgets: Vec<(String, u64, &'static str)> = Vec::new();
    for item in items {
        let item = item.trim();
        let Some((name, units)) = item.split_once('=') else {
            return Err(bad(item, "expected NAME=UNITS (e.g. providers=12)"));
        };
        let name = name.trim();
        let Some(units) = units.trim().parse::<u64>().ok().filter(|&u| u > 0) else {
            return Err(bad(item, "UNITS must be a whole number of at least 1"));
        };
        if budgets.iter().any(|(n, _, _)| n == name) {
            return Err(bad(item, "the group is given twice"));
        }
        budgets.push((name.to_owned(), units, source));
    }
    Ok(budgets)
}

/// What a broker said.
#[derive(Debug, Clone)]
pub(crate) enum Input {
    /// Its state (`Admin.Watch`): which broker process, its permits, its starts so far.
    Reported {
        index: usize,
        broker: (u32, i64),
        share: admin::ShareStatus,
        started: u64,
    },
    /// The answer to a grant.
    Answered {
        index: usize,
        share: admin::ShareStatus,
    },
    /// A grant was not answered (the call failed): it is sent again.
    Failed { index: usize, epoch: u64 },
}

/// A grant to send: `Admin.ShareGrant{limit, epoch}` to type `index`'s broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grant {
    pub(crate) index: usize,
    pub(crate) limit: u32,
    pub(crate) epoch: u64,
}

#[derive(Debug, Default, Clone)]
struct Seen {
    broker: Option<(u32, i64)>,
    limit_sent: u32,
    epoch_sent: u64,
    /// The epoch the broker last said is in force.
    epoch_seen: u64,
    next_epoch: u64,
    in_flight: u32,
    /// The most it may hold now (see the module's doc).
    bound: u32,
    held: u32,
    fillable: u32,
    empty: bool,
    started: u64,
    /// Weighted: starts not counted against its share (it was idle meanwhile).
    forgiven: f64,
    active: bool,
}

/// The ledger (see the module's doc).
#[derive(Debug)]
pub(crate) struct Ledger {
    plan: SharePlan,
    seen: Vec<Seen>,
}

impl Ledger {
    pub(crate) fn new(plan: SharePlan) -> Self {
        let seen = vec![
            Seen {
                next_epoch: 1,
                ..Seen::default()
            };
            plan.types.len()
        ];
        Self { plan, seen }
    }

    pub(crate) fn plan(&self) -> &SharePlan {
        &self.plan
    }

    /// What type `index` may hold at most now, as the ledger counts it.
    #[cfg(test)]
    pub(crate) fn bound(&self, index: usize) -> u32 {
        self.seen[index].bound
    }

    /// A reload changed the caps (a concurrency limit, a cost): the same types share, under
    /// `plan`'s caps from now on. A lower cap is met as the brokers shed at their next
    /// completions (their bounds count until they answer), a higher one is granted within
    /// what the bounds leave, as always. The caller checks that the types and which of them
    /// share are unchanged.
    pub(crate) fn replan(&mut self, plan: SharePlan) -> Vec<Grant> {
        debug_assert_eq!(plan.types, self.plan.types);
        self.plan = plan;
        self.allocate()
    }

    /// One step: the grants to send now, in order.
    pub(crate) fn handle(&mut self, input: Input) -> Vec<Grant> {
        match input {
            Input::Reported {
                index,
                broker,
                share,
                started,
            } => {
                let Some(s) = self.seen.get_mut(index) else {
                    return Vec::new();
                };
                if s.broker != Some(broker) {
                    // A new broker (or the first seen): it has what it says, nothing more.
                    s.broker = Some(broker);
                    s.limit_sent = share.limit;
                    s.epoch_sent = share.epoch;
                    s.next_epoch = s.next_epoch.max(share.epoch + 1);
                    s.in_flight = 0;
                    s.forgiven = 0.0;
                    s.active = false;
                }
                s.started = started;
                Self::note(s, &share);
            }
            Input::Answered { index, share } => {
                let Some(s) = self.seen.get_mut(index) else {
                    return Vec::new();
                };
                s.in_flight = s.in_flight.saturating_sub(1);
                Self::note(s, &share);
            }
            Input::Failed { index, epoch } => {
                let Some(s) = self.seen.get_mut(index) else {
                    return Vec::new();
                };
                s.in_flight = s.in_flight.saturating_sub(1);
                tracing::debug!(
                    index,
                    epoch,
                    "a share grant was not answered; it is sent again"
                );
            }
        }
        self.allocate()
    }

    /// What a broker said of its permits.
    fn note(s: &mut Seen, share: &admin::ShareStatus) {
        if share.epoch > s.epoch_sent {
            // Set by someone else (by hand): it is what is in force.
            s.limit_sent = share.limit;
            s.epoch_sent = share.epoch;
            s.next_epoch = s.next_epoch.max(share.epoch + 1);
        }
        s.epoch_seen = s.epoch_seen.max(share.epoch);
        if share.epoch == s.epoch_sent {
            s.bound = s.limit_sent.max(share.held);
        } else {
            // A grant is on its way: the bound already covers it.
            s.bound = s.bound.max(share.held);
        }
        s.held = share.held;
        s.fillable = share.fillable;
        s.empty = share.empty;
    }

    fn fits(&self, index: usize, used: &[u64]) -> bool {
        self.plan.constraints.iter().zip(used).all(|(c, &u)| {
            let cost = c.costs[index];
            cost == 0 || u + cost <= c.cap
        })
    }

    fn take(&self, index: usize, used: &mut [u64]) {
        for (c, u) in self.plan.constraints.iter().zip(used) {
            *u += c.costs[index];
        }
    }

    /// The limits wanted now: every type's want (what it holds and could fill) offered the
    /// caps by priority, then one permit each to idle types with nothing to give (a long poll
    /// that a new task answers at once) while room is left.
    // Several per-type arrays (wants, limits, what the ledger saw) are walked together.
    #[allow(clippy::needless_range_loop)]
    fn desired(&mut self) -> Vec<u32> {
        let n = self.seen.len();
        let want: Vec<u32> = self
            .seen
            .iter()
            .enumerate()
            .map(|(i, s)| {
                if s.broker.is_some() && self.plan.shares(i) {
                    s.held.saturating_add(s.fillable)
                } else {
                    0
                }
            })
            .collect();
        let mut d = vec![0u32; n];
        let mut used = vec![0u64; self.plan.constraints.len()];
        match &self.plan.priority {
            Priority::Strict => {
                for i in 0..n {
                    while d[i] < want[i] && self.fits(i, &used) {
                        d[i] += 1;
                        self.take(i, &mut used);
                    }
                }
            }
            Priority::Weighted(weights) => {
                let weight = |i: usize| f64::from(weights.get(i).copied().unwrap_or(1).max(1));
                // A type that starts wanting again joins at the least-served active type's
                // pass: what it did not ask for while idle is not owed to it.
                let pass = |s: &Seen, i: usize| (s.started as f64 - s.forgiven) / weight(i);
                let floor = (0..n)
                    .filter(|&i| self.seen[i].active && want[i] > 0)
                    .map(|i| pass(&self.seen[i], i))
                    .fold(f64::INFINITY, f64::min);
                for i in 0..n {
                    let now_active = want[i] > 0;
                    if now_active && !self.seen[i].active && floor.is_finite() {
                        let behind = floor - pass(&self.seen[i], i);
                        if behind > 0.0 {
                            self.seen[i].forgiven -= behind * weight(i);
                        }
                    }
                    self.seen[i].active = now_active;
                }
                // No active type lags more than two rounds (a round: each type its weight in
                // starts) behind the most served one: a
                // type the others outran while the supervisor heard late is not owed a burst.
                let top = (0..n)
                    .filter(|&i| want[i] > 0)
                    .map(|i| pass(&self.seen[i], i))
                    .fold(f64::NEG_INFINITY, f64::max);
                for i in 0..n {
                    let lag = top - 2.0 - pass(&self.seen[i], i);
                    if want[i] > 0 && lag > 0.0 {
                        self.seen[i].forgiven -= lag * weight(i);
                    }
                }
                loop {
                    let next = (0..n)
                        .filter(|&i| d[i] < want[i] && self.fits(i, &used))
                        .min_by(|&a, &b| {
                            let pa = pass(&self.seen[a], a) + f64::from(d[a] + 1) / weight(a);
                            let pb = pass(&self.seen[b], b) + f64::from(d[b] + 1) / weight(b);
                            pa.total_cmp(&pb).then(a.cmp(&b))
                        });
                    let Some(i) = next else { break };
                    d[i] += 1;
                    self.take(i, &mut used);
                }
            }
        }
        for i in 0..n {
            let s = &self.seen[i];
            if want[i] == 0
                && s.broker.is_some()
                && self.plan.shares(i)
                && s.empty
                && s.held == 0
                && self.fits(i, &used)
            {
                d[i] = 1;
                self.take(i, &mut used);
            }
        }
        d
    }

    fn allocate(&mut self) -> Vec<Grant> {
        // Nothing is granted until every sharing broker has said what it has: the first to
        // start must not take the pool from a higher type starting beside it.
        if (0..self.seen.len()).any(|i| self.plan.shares(i) && self.seen[i].broker.is_none()) {
            return Vec::new();
        }
        let d = self.desired();
        let mut grants = Vec::new();
        let mut send = |s: &mut Seen, index: usize, limit: u32| {
            s.limit_sent = limit;
            s.epoch_sent = s.next_epoch;
            s.next_epoch += 1;
            s.in_flight += 1;
            s.bound = s.bound.max(limit);
            grants.push(Grant {
                index,
                limit,
                epoch: s.epoch_sent,
            });
        };
        // Lower first: the broker sheds at its next completions; the bound follows its answers.
        for (i, &want) in d.iter().enumerate() {
            let s = &mut self.seen[i];
            if s.broker.is_none() {
                continue;
            }
            let lost = s.in_flight == 0 && s.epoch_seen < s.epoch_sent;
            if want < s.limit_sent || (lost && want <= s.limit_sent) {
                send(s, i, want);
            }
        }
        // Raise within what every cap leaves under the bounds.
        for (i, &want) in d.iter().enumerate() {
            if self.seen[i].broker.is_none() || want <= self.seen[i].limit_sent {
                continue;
            }
            let mut room = u64::MAX;
            for c in &self.plan.constraints {
                let cost = c.costs[i];
                if cost == 0 {
                    continue;
                }
                let used: u64 = self
                    .seen
                    .iter()
                    .zip(&c.costs)
                    .map(|(s, &k)| u64::from(s.bound) * k)
                    .sum();
                room = room.min(c.cap.saturating_sub(used) / cost);
            }
            let s = &mut self.seen[i];
            let most = u64::from(s.bound).saturating_add(room);
            let limit = u32::try_from(u64::from(want).min(most)).unwrap_or(u32::MAX);
            if limit > s.limit_sent {
                send(s, i, limit);
            }
        }
        grants
    }
}

#[cfg(test)]
#[path = "share_tests.rs"]
mod tests;
