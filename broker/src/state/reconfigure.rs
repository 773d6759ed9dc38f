//! `Admin.Reconfigure` (issue #26 item 4, `perago-supervisor reload`): the settings that apply
//! live, changed for every assignment dispatched from now on. Today that is the soft time
//! limit (`body.soft_time_limit`), which each assignment carries to its executor in place of
//! the executor's manifest's; an assignment already running keeps the one it started with.

use super::machine::Machine;
use std::time::Duration;
use tonic::Status;

impl Machine {
    /// The soft time limit the runtime started with (`PERAGO_SOFT_TIME_LIMIT_MS`, from the
    /// supervisor's manifest), 0 for none; `None`: not told (the executors use theirs).
    pub(crate) fn with_soft_time_limit(mut self, ms: Option<u64>) -> Self {
        self.soft_time_limit_ms = ms;
        self
    }

    /// Applies what `Admin.Reconfigure` set: whether nothing changed, and the soft time limit
    /// before. Refused while draining.
    pub(super) fn reconfigure(
        &mut self,
        soft_time_limit_ms: Option<u64>,
    ) -> Result<(bool, Option<u64>), Status> {
        if self.draining {
            return Err(Status::failed_precondition(
                "the runtime is draining: there is nothing left to reconfigure",
            ));
        }
        let previous = self.soft_time_limit_ms;
        let Some(ms) = soft_time_limit_ms else {
            return Ok((true, previous));
        };
        if previous == Some(ms) {
            return Ok((true, previous));
        }
        self.soft_time_limit_ms = Some(ms);
        self.reconfigured_at = Some(self.now.wall);
        let shown = |ms: Option<u64>| match ms {
            None => "the manifest's".to_owned(),
            Some(0) => "none".to_owned(),
            Some(ms) => format!("{:?}", Duration::from_millis(ms)),
        };
        tracing::info!(
            soft_time_limit_ms = ms,
            "reconfigured: body.soft_time_limit {} -> {} for the assignments dispatched from now on",
            shown(previous),
            shown(Some(ms))
        );
        Ok((false, previous))
    }
}
