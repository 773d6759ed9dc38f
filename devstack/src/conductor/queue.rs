//! Per-queue delayed FIFOs of task ids, with a `Notify` per queue so long polls wake as soon as
//! something is pushed instead of sleeping in a loop.
//!
//! A queue is named `taskType`, or `domain:taskType` when the task has a domain (`QueueUtils`).
//! Messages are ordered by due time, then by push order; a message is invisible until its due
//! time. Pushing a task that already has a message replaces it, as the server's push-if-not-exists
//! plus postpone amounts to.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use tokio::sync::Notify;

/// The queue name for a task type in an optional domain.
pub(crate) fn queue_name(task_type: &str, domain: Option<&str>) -> String {
    match domain {
        Some(domain) if !domain.is_empty() => format!("{domain}:{task_type}"),
        _ => task_type.to_owned(),
    }
}

#[derive(Debug, Default)]
struct Queue {
    by_due: BTreeMap<(i64, u64), String>,
    index: HashMap<String, (i64, u64)>,
    notify: Arc<Notify>,
}

/// All queues, keyed by queue name.
#[derive(Debug, Default)]
pub(crate) struct Queues {
    queues: HashMap<String, Queue>,
    next_seq: u64,
}

impl Queues {
    /// Queues `task_id`, visible from `due_ms` on, and wakes the queue's long pollers.
    pub(crate) fn push(&mut self, queue: &str, task_id: &str, due_ms: i64) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let q = self.queues.entry(queue.to_owned()).or_default();
        if let Some(old) = q.index.insert(task_id.to_owned(), (due_ms, seq)) {
            q.by_due.remove(&old);
        }
        q.by_due.insert((due_ms, seq), task_id.to_owned());
        // Wake every waiter, even for a delayed message: each recomputes how long to wait.
        q.notify.notify_waiters();
    }

    /// Removes the message of `task_id`, if any.
    pub(crate) fn remove(&mut self, queue: &str, task_id: &str) {
        if let Some(q) = self.queues.get_mut(queue)
            && let Some(key) = q.index.remove(task_id)
        {
            q.by_due.remove(&key);
        }
    }

    /// Takes up to `max` messages due at `now_ms`, oldest due first.
    pub(crate) fn pop_ready(&mut self, queue: &str, now_ms: i64, max: usize) -> Vec<String> {
        let Some(q) = self.queues.get_mut(queue) else {
            return Vec::new();
        };
        let mut taken = Vec::new();
        while taken.len() < max {
            let Some(entry) = q.by_due.first_entry() else {
                break;
            };
            if entry.key().0 > now_ms {
                break;
            }
            let task_id = entry.remove();
            q.index.remove(&task_id);
            taken.push(task_id);
        }
        taken
    }

    /// Due time of the earliest message, if the queue has any.
    pub(crate) fn next_due(&self, queue: &str) -> Option<i64> {
        self.queues
            .get(queue)
            .and_then(|q| q.by_due.first_key_value())
            .map(|((due, _), _)| *due)
    }

    /// Messages in the queue, delayed ones included (trap 20).
    pub(crate) fn size(&self, queue: &str) -> usize {
        self.queues.get(queue).map_or(0, |q| q.index.len())
    }

    /// Sizes of every queue, sorted by name.
    pub(crate) fn sizes(&self) -> BTreeMap<String, usize> {
        self.queues
            .iter()
            .map(|(name, q)| (name.clone(), q.index.len()))
            .collect()
    }

    /// The notifier long pollers of `queue` wait on.
    pub(crate) fn notifier(&mut self, queue: &str) -> Arc<Notify> {
        Arc::clone(&self.queues.entry(queue.to_owned()).or_default().notify)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_due_messages_in_due_order_and_hides_delayed_ones() {
        let mut queues = Queues::default();
        queues.push("q", "late", 200);
        queues.push("q", "a", 100);
        queues.push("q", "b", 100);
        assert_eq!(queues.size("q"), 3);
        assert_eq!(queues.pop_ready("q", 150, 10), vec!["a", "b"]);
        assert_eq!(queues.next_due("q"), Some(200));
        assert!(queues.pop_ready("q", 150, 10).is_empty());
        assert_eq!(queues.pop_ready("q", 200, 10), vec!["late"]);
        assert_eq!(queues.size("q"), 0);
    }

    #[test]
    fn pushing_again_replaces_the_message_and_remove_forgets_it() {
        let mut queues = Queues::default();
        queues.push("q", "t", 500);
        queues.push("q", "t", 0);
        assert_eq!(queues.size("q"), 1);
        assert_eq!(queues.next_due("q"), Some(0));
        queues.remove("q", "t");
        assert_eq!(queues.size("q"), 0);
        assert!(queues.pop_ready("q", 1000, 1).is_empty());
    }

    #[test]
    fn queue_names_prefix_the_domain() {
        assert_eq!(queue_name("t", None), "t");
        assert_eq!(queue_name("t", Some("")), "t");
        assert_eq!(queue_name("t", Some("d")), "d:t");
    }
}
