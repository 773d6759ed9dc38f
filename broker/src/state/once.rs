//! Run once (`--once`): the runtime drains when the task type's queue is empty and every
//! slot idle, as a queue-depth read after an empty poll says (or, while the depth cannot be
//! read, that many empty polls in a row).

use super::machine::Machine;

/// Run once while the queue depth cannot be read: this many empty polls in a row, every slot
/// idle throughout, end the run.
pub(crate) const ONCE_EMPTY_POLLS: u32 = 3;

impl Machine {
    /// Run once: a poll came back empty while everything was idle. With the queue depth
    /// readable, a read asked for after it decides (`quiet_after`); without, the poll itself
    /// is the evidence: [`ONCE_EMPTY_POLLS`] in a row drain, and polling goes on until then.
    pub(super) fn once_idle_empty_poll(&mut self) {
        if !self.depth_unreadable {
            self.once_empty_polls = 0;
            self.quiet_after.get_or_insert(self.depth_reads);
            return;
        }
        self.once_empty_polls += 1;
        if self.once_empty_polls >= ONCE_EMPTY_POLLS {
            tracing::info!(
                "run once: no task of {} left ({} empty polls in a row, the queue depth \
                 unreadable) and every slot idle; draining",
                self.task_name,
                self.once_empty_polls
            );
            self.start_drain();
        }
    }

    /// Run once: a queue-depth read answered (`depth`, `None`: it failed). A read asked for
    /// after the empty poll decides: 0 with everything idle drains (true: drained), more
    /// polls again; a failed one lets the polls decide instead.
    pub(super) fn once_depth_read(&mut self, depth: Option<u64>) -> bool {
        if let Some(quiet) = self.quiet_after
            && depth.is_none()
            && self.depth_reads > quiet
        {
            // The confirming read failed: polls decide instead (see `once_idle_empty_poll`),
            // so polling resumes rather than waiting for a read that may never work.
            self.quiet_after = None;
        }
        if let Some(quiet) = self.quiet_after
            && depth.is_some()
        {
            // A read asked for after the empty poll decides: 0 drains, more polls again.
            if self.depth_reads > quiet {
                if depth == Some(0) && self.all_idle() {
                    tracing::info!(
                        "run once: no task of {} left and every slot idle; draining",
                        self.task_name
                    );
                    self.start_drain();
                    return true;
                }
                self.quiet_after = None;
            }
        }
        false
    }
}
