//! Capacity shared across task types (`PERAGO_SHARE`, docs/sharing.md): the broker holds at
//! most `limit` tasks at once (busy, awaiting update-v2's next task, reserved for a poll,
//! held), the limit granted by the supervisor (`Admin.ShareGrant`). A poll asks only for what
//! the limit leaves, so a task is polled only once its permit is held; a completion keeps its
//! slot for update-v2's next task only while the holding is within the limit.

use super::machine::{Machine, Work};
use perago_proto::admin::v1 as admin;
use tonic::Status;

/// The grant in force.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Permits {
    pub(super) limit: u32,
    pub(super) epoch: u64,
    /// The last poll came back empty, and no task or queue-depth read has shown work since.
    pub(super) empty: bool,
}

impl Machine {
    /// Starts the machine sharing capacity: no permit until the supervisor's first grant.
    pub(crate) fn with_share(mut self, share: bool) -> Self {
        self.share = share.then(Permits::default);
        self
    }

    /// Tasks held against the permits: busy slots, slots awaiting update-v2's next task,
    /// tasks reserved for the poll in flight, tasks held.
    pub(super) fn share_holding(&self) -> u32 {
        let slots = self
            .slots
            .iter()
            .filter(|s| !matches!(s.work, Work::Idle))
            .count();
        u32::try_from(slots + self.held.len())
            .unwrap_or(u32::MAX)
            .saturating_add(self.reserved)
    }

    /// How many more tasks the permits allow now (`u32::MAX` when not sharing).
    pub(super) fn share_room(&self) -> u32 {
        match self.share {
            None => u32::MAX,
            Some(p) => p.limit.saturating_sub(self.share_holding()),
        }
    }

    /// Whether a completion may keep its slot (and permit) for update-v2's next task: the
    /// holding, this slot included, is within the limit.
    pub(super) fn share_keeps_slot(&self) -> bool {
        self.share.is_none_or(|p| self.share_holding() <= p.limit)
    }

    /// Tasks this broker could start now (or once its starting executors attach) beyond what
    /// it holds, when it has something to give.
    pub(super) fn share_fillable(&self) -> u32 {
        let Some(p) = self.share else {
            return 0;
        };
        if p.empty
            || self.draining
            || self.paused_since.is_some()
            || !self.admission_open
            || self.quiet_after.is_some()
        {
            return 0;
        }
        // Slots whose executor is starting count: a type whose executors attach later than
        // another's must not lose its place to it at start-up (a slot in restart backoff
        // does not count).
        let free = self
            .slots
            .iter()
            .filter(|s| s.free() || (s.wanted && !s.attached && !s.exited))
            .count() as u32;
        let held = u32::try_from(self.held.len()).unwrap_or(u32::MAX);
        free.saturating_sub(self.reserved)
            .saturating_sub(held)
            .min(self.memory_room())
    }

    /// A poll returned `got` tasks: none means nothing to give; any means work.
    pub(super) fn share_polled(&mut self, got: usize) {
        if let Some(p) = &mut self.share {
            p.empty = got == 0;
        }
    }

    /// A queue-depth read: tasks waiting mean something to give again.
    pub(super) fn share_depth_read(&mut self, depth: Option<u64>) {
        if let Some(p) = &mut self.share
            && depth.is_some_and(|d| d > 0)
        {
            p.empty = false;
        }
    }

    /// `Admin.ShareGrant`.
    pub(super) fn share_grant(
        &mut self,
        limit: u32,
        epoch: u64,
    ) -> Result<admin::ShareStatus, Status> {
        let Some(p) = &mut self.share else {
            return Err(Status::failed_precondition(
                "this broker does not share capacity (PERAGO_SHARE is not set)",
            ));
        };
        if epoch > p.epoch {
            p.limit = limit;
            p.epoch = epoch;
        }
        Ok(self.share_status().expect("sharing"))
    }

    /// The permits as Admin.Status shows them (`None`: not sharing).
    pub(crate) fn share_status(&self) -> Option<admin::ShareStatus> {
        let p = self.share?;
        Some(admin::ShareStatus {
            limit: p.limit,
            epoch: p.epoch,
            held: self.share_holding(),
            fillable: self.share_fillable(),
            empty: p.empty,
            started: self.counters.dispatched.get(),
        })
    }
}
