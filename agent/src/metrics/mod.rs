//! Prometheus metrics of one agent (docs/metrics.md): what the page says and how it is written,
//! pure. The runtime takes a [`Snapshot`] of what its loop already holds when a page is asked for
//! (`run/metrics_server.rs` serves it over HTTP and writes it for node_exporter's textfile
//! collector); [`render`] turns it into Prometheus' text format (version 0.0.4).
//!
//! - `text.rs`: the format: families, samples, escaping.
//! - `tally.rs`: the counters, kept by counting the records the supervisor emits.
//! - `jobwide.rs`: node rank 0's job-wide numbers (goodput and badput, allocation decisions,
//!   straggler scores) from the job's records.
//! - `page.rs`: every metric, its type, help and labels.

mod jobwide;
mod page;
mod tally;
pub mod text;

pub use jobwide::{job_wide, scores_of, DecisionCount, JobWide, ScoreRow, Scores};
pub use page::render;
pub use tally::{Tally, HANG_KINDS, STOP_REASONS};

/// Who the page is about: the labels every series carries.
#[derive(Debug, Clone, PartialEq)]
pub struct Identity {
    /// The job's id (`--rdzv-id`, Slurm's, NGC's), else its run id.
    pub job_id: String,
    /// The node's name (Slurm's, else the host name).
    pub node: String,
    pub node_rank: u32,
}

/// One local rank of the attempt under way.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RankRow {
    pub local_rank: u32,
    /// The global rank.
    pub rank: u32,
    pub running: bool,
    /// The step it last reported.
    pub step: Option<u64>,
    /// Seconds since its last heartbeat, in the job's time (the agent's own suspension left out).
    pub heartbeat_age_s: Option<f64>,
    /// The GPU it uses (NVML's index) and that GPU's UUID, when NVML says.
    pub gpu: Option<u32>,
    pub uuid: Option<String>,
}

/// What the page shows, taken when it is asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot<'a> {
    pub id: &'a Identity,
    /// The agent's loop runs (false on the page written at exit).
    pub running: bool,
    /// When the agent started, unix seconds.
    pub started_unix: f64,
    /// The attempt under way (the job's restart count).
    pub attempt: u32,
    pub tally: &'a Tally,
    pub ranks: Vec<RankRow>,
    /// Node rank 0: the job's last straggler report.
    pub scores: Option<&'a Scores>,
    /// Node rank 0: goodput and the allocations' decisions, as last computed.
    pub job: Option<&'a JobWide>,
}
