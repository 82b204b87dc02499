//! A read-only view of the attempt's ranks, for the runtime's metrics page (`run/metrics_server.rs`):
//! taken when a page is asked for, never on the heartbeat path.

use std::time::Instant;

use super::Supervisor;

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
    /// The attempt's ranks (none before the first attempt, on a standby).
    pub fn rank_views(&self) -> Vec<RankView> {
        self.attempt
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
