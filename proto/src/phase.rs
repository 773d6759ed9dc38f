//! `SlotStatus.phase` and `perago.slot.v1.Phase`: the wire field is a string (grpcurl readers
//! see `"body"`), Rust code reads and writes it through the enum.

impl crate::slot::v1::Phase {
    /// The phase's name in `SlotStatus.phase` (`body`, `staging`, …), the one mapping between
    /// the enum and the wire string. A dispatched assignment that reported nothing yet
    /// ([`Phase::Unspecified`](crate::slot::v1::Phase::Unspecified)) is `preparing`: the executor
    /// checks the input and runs the pre guardrail without a message for it.
    pub fn status_name(self) -> &'static str {
        use crate::slot::v1::Phase;
        match self {
            Phase::Unspecified | Phase::Preparing => "preparing",
            Phase::Idle => "idle",
            Phase::Downloading => "downloading",
            Phase::Body => "body",
            Phase::Staging => "staging",
            Phase::Publishing => "publishing",
            Phase::Cleanup => "cleanup",
            Phase::Reporting => "reporting",
        }
    }

    /// The phase a `SlotStatus.phase` names; `None` for an empty one (no assignment) or one
    /// this version does not know.
    pub fn from_status_name(name: &str) -> Option<Self> {
        use crate::slot::v1::Phase;
        [
            Phase::Idle,
            Phase::Preparing,
            Phase::Downloading,
            Phase::Body,
            Phase::Staging,
            Phase::Publishing,
            Phase::Cleanup,
            Phase::Reporting,
        ]
        .into_iter()
        .find(|p| p.status_name() == name)
    }
}

impl crate::admin::v1::SlotStatus {
    /// `phase` as the enum (the wire field stays a string for grpcurl readers); `None` when
    /// the slot has no assignment or the name is unknown.
    pub fn phase_kind(&self) -> Option<crate::slot::v1::Phase> {
        crate::slot::v1::Phase::from_status_name(&self.phase)
    }
}
