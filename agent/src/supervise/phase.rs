//! Where a node's attempt stands, and where each of its ranks stands: the two small enums every
//! part of the supervisor reads. A leaf of `supervise/` (it names only the records' types), so the
//! state machines can read them without importing the state that holds them.

use std::time::Instant;

use super::events::{ExitKind, StopReason};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RankState {
    NotStarted,
    Running,
    Exited(ExitKind),
    SpawnFailed,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Phase {
    /// Waiting for the rendezvous of `attempt` (no rank runs).
    Joining,
    Running,
    Stopping {
        reason: StopReason,
        kill_at: Instant,
        killed: bool,
    },
    /// Every local rank exited 0; waiting for the other nodes.
    Waiting,
    /// The last attempt failed; join `attempt` (already the next one) at `until`.
    BackingOff {
        until: Instant,
    },
    Finished,
}
