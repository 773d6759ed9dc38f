//! The task ids this broker reported a result for lately, so that a poll (or update-v2)
//! that hands one of them out again does not run it a second time. Every result the broker
//! reports is terminal, and Conductor never hands out a task again after a terminal update;
//! a server that does is not believed. The memory is bounded: past [`MAX_REMEMBERED`] ids the
//! oldest is forgotten, so a broker that runs for months keeps a flat memory.

use std::collections::{HashSet, VecDeque};

/// Reported task ids remembered at most (about 50 bytes each).
pub(crate) const MAX_REMEMBERED: usize = 10_000;

/// Recently reported task ids, oldest first forgotten.
#[derive(Debug)]
pub(crate) struct RecentlyReported {
    ids: HashSet<String>,
    /// The ids in the order they were reported.
    order: VecDeque<String>,
    capacity: usize,
}

impl Default for RecentlyReported {
    fn default() -> Self {
        Self::with_capacity(MAX_REMEMBERED)
    }
}

impl RecentlyReported {
    /// A memory of at most `capacity` ids.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self {
            ids: HashSet::new(),
            order: VecDeque::new(),
            capacity: capacity.max(1),
        }
    }

    /// Remembers that a result for `task_id` was reported.
    pub(crate) fn insert(&mut self, task_id: &str) {
        if self.ids.contains(task_id) {
            return;
        }
        while self.order.len() >= self.capacity {
            if let Some(oldest) = self.order.pop_front() {
                self.ids.remove(&oldest);
            }
        }
        self.order.push_back(task_id.to_owned());
        self.ids.insert(task_id.to_owned());
    }

    /// Whether a result for `task_id` was reported lately.
    pub(crate) fn contains(&self, task_id: &str) -> bool {
        self.ids.contains(task_id)
    }

    /// Ids remembered now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_id_is_forgotten_first_and_the_memory_stays_bounded() {
        let mut recent = RecentlyReported::with_capacity(3);
        for id in ["a", "b", "c", "a"] {
            recent.insert(id);
        }
        assert_eq!(recent.len(), 3);
        recent.insert("d");
        assert!(!recent.contains("a") && recent.contains("b") && recent.contains("d"));
        for n in 0..10_000 {
            recent.insert(&n.to_string());
        }
        assert_eq!(recent.len(), 3);
        assert_eq!(RecentlyReported::default().capacity, MAX_REMEMBERED);
    }
}
