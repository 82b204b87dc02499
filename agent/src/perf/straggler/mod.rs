//! Straggler scores: which ranks are slow, relative to the job and to themselves. Pure: no I/O,
//! no clock (callers pass `Instant`s and measured seconds in).
//!
//! Formulas and the report format: docs/stragglers.md. How it fits together:
//!
//! 1. Every agent keeps one [`RankTimes`] per local rank and feeds it what the rank sends:
//!    [`RankTimes::on_step_timing`] (`RankMsg::StepTiming`, `duration_us as f64 / 1e6`),
//!    [`RankTimes::on_section`] (each closed section with its duration; only the one named by
//!    `--straggler-section` counts) and [`RankTimes::on_step`] (each step the rank reports by
//!    `heartbeat(step)` or `Progress`). The best of those a rank has used is its only source (a
//!    better one that appears later replaces a worse one). [`RankTimes::new_attempt`] when the
//!    ranks restart.
//! 2. Once per report interval each agent builds a [`NodeSummary`] with
//!    [`NodeSummary::from_ranks`] (it closes every rank's interval) and puts
//!    [`NodeSummary::to_json`] in the store.
//! 3. Node rank 0 reads every node's summary ([`NodeSummary::parse`]), calls [`score_job`], then
//!    prints [`render_report`] (NVRx's report, seeds/002, plus one line per straggler with what
//!    its GPU was doing), logs [`report_record`] to the event log, and acts on [`stragglers`].
//!
//! ```
//! use vigil::perf::straggler::*;
//!
//! let (mut a, mut b) = (RankTimes::new(64, "step"), RankTimes::new(64, "step"));
//! for step in 0..10 {
//!     a.on_step_timing(step, 1.0);
//!     b.on_step_timing(step, 2.0);
//! }
//! let summary = NodeSummary::from_ranks(0, "n0", [(0, &mut a), (1, &mut b)]);
//! let scores = score_job(&[NodeSummary::parse(summary.to_json().as_bytes()).unwrap()]);
//! assert_eq!(scores.ranks[1].relative, 0.5);
//! let text = render_report(&scores, 5, 0.7, &|_| None, 0.001);
//! assert!(text.contains("Rank=1 Node=n0 relative=0.50 individual=1.00 no GPU telemetry\n"));
//! assert_eq!(stragglers(&scores, 0.7)[0].0, 1);
//! ```

mod render;
mod score;
mod times;

pub use render::render_report;
pub use score::{
    report_record, score_job, stragglers, JobScores, NodeSummary, RankScore, RankSummary,
    Straggler, SummaryError, SUMMARY_FORMAT,
};
pub use times::{median, RankTimes, Source};

/// Step times kept per rank (the window the median is over).
pub const DEFAULT_WINDOW: usize = 64;
/// `--straggler-section`: the section whose durations are step times.
pub const DEFAULT_SECTION: &str = "step";
/// `--straggler-threshold`: below this on either score, a rank is a straggler (NVRx's
/// `gpu_relative_perf_threshold` / `gpu_individual_perf_threshold` in NeMo's recipe).
pub const DEFAULT_THRESHOLD: f64 = 0.7;
/// `--straggler-report-interval`, seconds.
pub const DEFAULT_REPORT_INTERVAL_S: u64 = 300;
/// Ranks listed as worst and as best in a report (NVRx's `num_gpu_perf_scores_to_print`).
pub const DEFAULT_PRINTED: usize = 5;

#[cfg(test)]
mod tests;
