//! Which domain a task is queued in: `taskToDomain` as the real server applies it
//! (`WorkflowExecutorOps.setTaskDomains` and `getActiveDomain`).
//!
//! The `*` entry applies to every task, then the entry of the task's own type overrides it.
//! An entry is a comma list of domains, tried in order: the first with a worker that polled
//! it within the last [`ACTIVE_WORKER_LAST_POLL_MS`] (its poll data) wins. When none has,
//! the last of the list is taken, unless it is `NO_DOMAIN` (any case): then the default
//! queue. `NO_DOMAIN` earlier in the list is skipped (the real server never checks the
//! default queue's poll data). Domains are trimmed; an empty `*` entry is ignored.

use std::collections::{BTreeMap, HashMap};

use super::model::PollData;
use super::queue::queue_name;

/// `conductor.app.activeWorkerLastPollTimeout`'s default: a domain polled within this long
/// has an active worker.
pub(crate) const ACTIVE_WORKER_LAST_POLL_MS: i64 = 10_000;

/// The domain a task of `task_type` is queued in by a workflow's `task_to_domain` at `now`
/// (epoch ms), given the poll data of every queue; `None`: the default queue.
pub(crate) fn task_domain(
    task_type: &str,
    task_to_domain: &HashMap<String, String>,
    poll_data: &BTreeMap<String, PollData>,
    now: i64,
) -> Option<String> {
    let mut domain = None;
    if let Some(every) = task_to_domain.get("*").filter(|d| !d.trim().is_empty()) {
        domain = active_domain(task_type, every, poll_data, now);
    }
    if let Some(own) = task_to_domain.get(task_type) {
        domain = active_domain(task_type, own, poll_data, now);
    }
    domain
}

/// `getActiveDomain` for one comma list.
fn active_domain(
    task_type: &str,
    list: &str,
    poll_data: &BTreeMap<String, PollData>,
    now: i64,
) -> Option<String> {
    let domains: Vec<&str> = list.split(',').collect();
    let active = domains
        .iter()
        .filter(|d| !d.eq_ignore_ascii_case("NO_DOMAIN"))
        .map(|d| d.trim())
        .find(|d| {
            poll_data
                .get(&queue_name(task_type, Some(d)))
                .is_some_and(|p| p.last_poll_time > now - ACTIVE_WORKER_LAST_POLL_MS)
        });
    if let Some(domain) = active {
        return Some(domain.to_owned());
    }
    let last = domains.last()?.trim();
    (!last.eq_ignore_ascii_case("NO_DOMAIN")).then(|| last.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn polled(entries: &[(&str, i64)]) -> BTreeMap<String, PollData> {
        entries
            .iter()
            .map(|(queue, at)| {
                (
                    (*queue).to_owned(),
                    PollData {
                        queue_name: (*queue).to_owned(),
                        domain: queue.split_once(':').map(|(d, _)| d.to_owned()),
                        worker_id: None,
                        last_poll_time: *at,
                    },
                )
            })
            .collect()
    }

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    const NOW: i64 = 1_000_000;

    #[test]
    fn the_type_entry_overrides_the_star_entry() {
        let none = polled(&[]);
        let d = |pairs: &[(&str, &str)], t: &str| task_domain(t, &map(pairs), &none, NOW);
        assert_eq!(d(&[], "t"), None);
        assert_eq!(d(&[("*", "blue")], "t").as_deref(), Some("blue"));
        assert_eq!(d(&[("t", "blue")], "t").as_deref(), Some("blue"));
        assert_eq!(d(&[("t", "blue")], "u"), None);
        assert_eq!(
            d(&[("*", "blue"), ("t", "green")], "t").as_deref(),
            Some("green")
        );
        assert_eq!(
            d(&[("*", "blue"), ("t", "green")], "u").as_deref(),
            Some("blue")
        );
        // An explicit NO_DOMAIN for the type takes it out of the `*` domain.
        assert_eq!(d(&[("*", "blue"), ("t", "NO_DOMAIN")], "t"), None);
        assert_eq!(d(&[("*", " ")], "t"), None);
    }

    #[test]
    fn a_comma_list_takes_the_first_domain_with_an_active_worker() {
        let recent = NOW - ACTIVE_WORKER_LAST_POLL_MS + 1;
        let stale = NOW - ACTIVE_WORKER_LAST_POLL_MS;
        let list = map(&[("t", "blue, green,red")]);
        let d = |polls: &[(&str, i64)]| task_domain("t", &list, &polled(polls), NOW);
        // Nobody polls: the last of the list.
        assert_eq!(d(&[]).as_deref(), Some("red"));
        assert_eq!(d(&[("green:t", recent)]).as_deref(), Some("green"));
        assert_eq!(
            d(&[("green:t", recent), ("blue:t", recent)]).as_deref(),
            Some("blue")
        );
        // A poll older than the window is no active worker.
        assert_eq!(d(&[("blue:t", stale)]).as_deref(), Some("red"));
        // Another type's poll in the domain does not count.
        assert_eq!(d(&[("blue:u", recent)]).as_deref(), Some("red"));
        // The default queue's poll data is not what makes a domain active.
        assert_eq!(d(&[("t", recent)]).as_deref(), Some("red"));
    }

    #[test]
    fn no_domain_last_means_the_default_queue_when_nothing_is_active() {
        let recent = NOW - 1;
        let list = map(&[("t", "blue,NO_DOMAIN")]);
        let d = |polls: &[(&str, i64)]| task_domain("t", &list, &polled(polls), NOW);
        assert_eq!(d(&[]), None);
        assert_eq!(d(&[("blue:t", recent)]).as_deref(), Some("blue"));
        // NO_DOMAIN first is skipped while a later domain is active, else it is not last.
        let first = map(&[("t", "no_domain,blue")]);
        assert_eq!(
            task_domain("t", &first, &polled(&[]), NOW).as_deref(),
            Some("blue")
        );
        assert_eq!(
            task_domain("t", &map(&[("*", "NO_DOMAIN")]), &polled(&[]), NOW),
            None
        );
    }
}
