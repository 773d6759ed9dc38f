//! The machine and rolling body changes (issue #26 item 4): a new body version is taken, every
//! new generation starts at it, and the broker (which alone knows when a slot is idle without
//! racing a dispatch) recycles each executor of an older version at its first safe moment; the
//! recycled exit restarts the slot at once, at the new version.

use super::*;

impl Machine {
    /// A new body version: the broker is told (`Control.RollBody`); the restarts that follow
    /// (recycled, crashed, scaled up) start at it. A version not newer than the current one
    /// changes nothing; a drain takes no roll.
    pub(super) fn on_roll(&mut self, body_version: u32, out: &mut Vec<Effect>) {
        if self.draining {
            tracing::warn!(
                body_version,
                "a new body version during a drain: not rolled (the drain goes on)"
            );
            return;
        }
        if body_version <= self.body_version {
            return;
        }
        // Every live slot runs an older version than a new one.
        let older = self
            .slots
            .values()
            .filter(|p| p.child.is_some() || p.starting.is_some())
            .count();
        if self.rolling {
            tracing::info!(
                from = self.body_version,
                to = body_version,
                "body roll superseded: every slot goes straight to the newest version"
            );
        }
        tracing::info!(
            from = self.body_version,
            to = body_version,
            slots = older,
            "body roll started: each executor of an older version is recycled after its current assignment"
        );
        self.body_version = body_version;
        self.rolling = true;
        out.push(Effect::Roll { body_version });
    }

    /// The broker's state during a roll: the call repeated if the broker has not taken it (a
    /// lost call; a broker of before body versions shows 0 and is not asked again), the roll
    /// finished once the broker shows every live generation at the newest version.
    pub(super) fn follow_roll(&mut self, seen: &admin::StatusResponse, out: &mut Vec<Effect>) {
        if !self.rolling || self.draining {
            return;
        }
        if seen.body_version != 0 && seen.body_version < self.body_version {
            out.push(Effect::Roll {
                body_version: self.body_version,
            });
            return;
        }
        let behind = self.slots.values().any(|p| {
            (p.child.is_some() && p.body_version < self.body_version) || p.starting.is_some()
        });
        if !seen.rolling && !behind {
            self.rolling = false;
            tracing::info!(
                body_version = self.body_version,
                "body roll finished: every executor runs the new version"
            );
        }
    }

    /// The body version new generations start with, and whether a roll is under way.
    #[cfg(test)]
    pub(crate) fn body_version(&self) -> (u32, bool) {
        (self.body_version, self.rolling)
    }

    /// Each slot's body version: that of its current generation (for tests).
    #[cfg(test)]
    pub(crate) fn slot_body_version(&self, slot: u32) -> u32 {
        self.slots[&slot].body_version
    }
}
