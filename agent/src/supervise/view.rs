//! Read-only views of the attempt's ranks: for the runtime's metrics page (`run/metrics_server.rs`),
//! taken when a page is asked for, never on the heartbeat path; and the steps its `steps` records
//! carry (`run/perf.rs`).

use std::time::Instant;

use super::{Phase, Supervisor};

/// This node's steps in the attempt whose ranks the supervisor holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttemptSteps {
    /// That attempt's number: during a back-off and the next rendezvous, the last attempt's (the
    /// supervisor's attempt is already the next one), so its steps are never put under the next.
    pub attempt: u32,
    /// The lowest and highest step its ranks last reported.
    pub min: u64,
    pub max: u64,
    /// When the lowest step was reached (by the last rank to reach it), in the job's time: the
    /// `steps` record is read as the job's progress at `min` (docs/goodput.md).
    pub at: Instant,
    /// Its ranks still run (the attempt has not ended on this node).
    pub running: bool,
}

/// One local rank of the attempt under way, as the supervisor sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct RankView {
    pub local_rank: u32,
    /// The global rank.
    pub rank: u32,
    pub running: bool,
    /// The step it last reported.
    pub step: Option<u64>,
    /// Its last heartbeat, in the job's time.
    pub last_heartbeat: Option<Instant>,
}

impl Supervisor {
    /// The steps of the attempt whose ranks this node holds (`None`: none reported).
    pub fn attempt_steps(&self) -> Option<AttemptSteps> {
        let paces = || self.current.ranks.iter().filter_map(|r| r.pace);
        let min = paces().map(|p| p.step).min()?;
        Some(AttemptSteps {
            attempt: self.current.attempt,
            min,
            max: paces().map(|p| p.step).max()?,
            at: paces().filter(|p| p.step == min).map(|p| p.at).max()?,
            running: self.phase == Phase::Running && self.current.attempt == self.attempt,
        })
    }

    /// The attempt's ranks (none before the first attempt, on a standby).
    pub fn rank_views(&self) -> Vec<RankView> {
        self.current
            .ranks
            .iter()
            .enumerate()
            .map(|(lr, r)| RankView {
                local_rank: lr as u32,
                rank: self.job.placement.rank_offset + lr as u32,
                running: r.running(),
                step: r.pace.map(|p| p.step),
                last_heartbeat: r.monitor.as_ref().and_then(|m| m.last_heartbeat()),
            })
            .collect()
    }
}
