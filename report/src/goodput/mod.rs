//! Goodput: how much of a job's wall time, over its whole life across allocations, made progress
//! that was kept, and where the rest went (badput by category). Pure functions over a
//! [`Timeline`] drawn from the [`History`] (the ledger and the event logs); see docs/goodput.md
//! for every number and its source record. The numbers are put into text here ([`render_table`]
//! for `vigil goodput`, [`summary_line`] for `vigil ledger`); the report page draws its Goodput
//! section from [`of_history`] in the `html` module.
//!
//! The wall time is cut into consecutive pieces, each given one category, so the categories add
//! up to the wall time exactly and none is negative ("other" is what no record explains).
//!
//! This module holds the types; the pure accounting is `account.rs` (cutting the wall time) and
//! `steps.rs` (step times, the ideal step time); `timeline.rs` draws the [`Timeline`] from the
//! records; `render.rs` puts the numbers into text and runs `vigil goodput`.

use serde::Serialize;

mod account;
mod render;
mod steps;
mod timeline;

pub use account::compute;
pub(crate) use render::s1;
pub use render::{goodput_command, ledger_line, render_table, summary_line};
pub use steps::{ideal_step_time, ideal_step_time_unfiltered, weighted_median};
pub use timeline::{of_history, of_history_at, timeline, timeline_at};

/// Where a second of the job's wall time went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// Step time whose progress was kept.
    Goodput,
    /// From an agent's or an attempt's start to its ranks' first step.
    StartUp,
    /// Checkpoint saves: the time some rank of an attempt spent in a checkpoint section
    /// (`section` records), taken from whatever piece it fell in.
    Checkpoint,
    /// Step time whose steps were done again after a restart or a requeue.
    LostProgress,
    /// From a failure (a hung rank's last sign of life) to the next attempt's start.
    FailureHandling,
    /// From a failure recovered in process (a rank replaced alone, docs/inprocess.md) to every
    /// rank stepping again: nothing is redone.
    InProcessRecovery,
    /// From the job's stop for the time limit to the allocation's end.
    StopLeadUnused,
    /// From the job's submission to its first allocation, and between one allocation's end
    /// and the next one's start.
    QueueWait,
    /// What no record explains.
    Other,
}

impl Category {
    pub const ALL: [Category; 9] = [
        Category::Goodput,
        Category::StartUp,
        Category::Checkpoint,
        Category::LostProgress,
        Category::FailureHandling,
        Category::InProcessRecovery,
        Category::StopLeadUnused,
        Category::QueueWait,
        Category::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Category::Goodput => "goodput",
            Category::StartUp => "start_up",
            Category::Checkpoint => "checkpoint",
            Category::LostProgress => "lost_progress",
            Category::FailureHandling => "failure_handling",
            Category::InProcessRecovery => "in_process_recovery",
            Category::StopLeadUnused => "stop_lead_unused",
            Category::QueueWait => "queue_wait",
            Category::Other => "other",
        }
    }

    /// For the table and the page.
    pub fn label(self) -> &'static str {
        match self {
            Category::Goodput => "goodput (kept step time)",
            Category::StartUp => "start-up",
            Category::Checkpoint => "checkpoint saves",
            Category::LostProgress => "progress lost to failures",
            Category::FailureHandling => "failure handling",
            Category::InProcessRecovery => "in-process recovery",
            Category::StopLeadUnused => "stop lead unused",
            Category::QueueWait => "queue wait",
            Category::Other => "other",
        }
    }

    fn index(self) -> usize {
        Category::ALL
            .iter()
            .position(|c| *c == self)
            .unwrap_or(Category::ALL.len() - 1)
    }
}

/// Seconds by category.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Breakdown {
    seconds: [f64; Category::ALL.len()],
}

impl Breakdown {
    pub fn get(&self, c: Category) -> f64 {
        self.seconds[c.index()]
    }

    pub(super) fn add(&mut self, c: Category, s: f64) {
        self.seconds[c.index()] += s;
    }

    pub fn total(&self) -> f64 {
        self.seconds.iter().sum()
    }

    /// The badput categories, goodput left out.
    pub fn badput(&self) -> f64 {
        self.total() - self.get(Category::Goodput)
    }
}

impl Serialize for Breakdown {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(Category::ALL.len()))?;
        for c in Category::ALL {
            m.serialize_entry(c.name(), &self.get(c))?;
        }
        m.end()
    }
}

/// One attempt, job-wide: the earliest start and latest end among its nodes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AttemptSpan {
    pub attempt: u32,
    pub start: f64,
    pub end: f64,
    /// When it failed: the first failed rank's exit, or a hung rank's last heartbeat (the hang's
    /// time less its silence). None for an attempt that did not fail.
    pub failed_at: Option<f64>,
    /// `(time, step)` of its `steps` records, in time order: the lowest step of the node with the
    /// lowest node rank that wrote any.
    pub steps: Vec<(f64, u64)>,
    /// `(start, end)` of every checkpoint section any rank of any node closed in it (`section`
    /// records), in any order, overlapping; only their part within the attempt counts.
    pub saves: Vec<(f64, f64)>,
    /// Some rank closed more checkpoint sections than were recorded.
    pub saves_incomplete: bool,
    /// The ranks' own median step time (seconds) from its last `steps` record that has one
    /// (`step_s`: `step_timing`, `step` sections, else the time between steps).
    pub step_s: Option<f64>,
    /// Its in-process restarts (docs/inprocess.md), job-wide, in generation order.
    pub generations: Vec<GenerationSpan>,
}

/// One in-process restart of an attempt, job-wide.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationSpan {
    pub generation: u64,
    /// The global ranks replaced.
    pub ranks: Vec<u32>,
    /// The highest step the ranks had reached when it began.
    pub step: Option<u64>,
    /// When the replaced rank failed (its exit, or a hung rank's last sign of life), else when
    /// the generation began.
    pub failed_at: f64,
    /// When every rank of every node stepped in it; None when it never did (the whole job
    /// restarted instead).
    pub stepping_at: Option<f64>,
}

/// What one in-process restart cost, for the table and `--json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GenerationCost {
    pub allocation: u32,
    #[serde(rename = "cycle")]
    pub attempt: u32,
    pub generation: u64,
    pub ranks: Vec<u32>,
    pub step: Option<u64>,
    /// From the failure to every rank stepping again; None when the whole job restarted.
    pub recovery_s: Option<f64>,
    /// Steps done again: 0 when recovered in process; on a whole restart, the steps since the
    /// step the job went on from (None when that is not known).
    pub steps_lost: Option<u64>,
}

/// One allocation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AllocationSpan {
    pub number: u32,
    pub start: f64,
    pub end: f64,
    /// Where the allocation would have ended: a time-limit stop's trigger time plus its window.
    pub scheduled_end: Option<f64>,
    /// The highest step it reached: the highest of the ledger's `highest_step` and stop step and
    /// the `stop_agreed` step.
    pub final_step: Option<u64>,
    pub attempts: Vec<AttemptSpan>,
    /// Slurm's submit time (ledger): the first allocation's queue wait begins here.
    pub submit_time: Option<f64>,
    /// Slurm's start of the allocation (ledger): the queue wait before it ends here, and its
    /// start-up begins.
    pub slurm_start: Option<f64>,
}

/// What goodput is computed from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timeline {
    /// In start order.
    pub allocations: Vec<AllocationSpan>,
}

/// One span of steps between two `steps` records of an attempt: their mean step time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepSample {
    pub allocation: u32,
    #[serde(rename = "cycle")]
    pub attempt: u32,
    pub from_step: u64,
    pub to_step: u64,
    pub step_time_s: f64,
    /// `step_time_s` less the ideal step time.
    pub deviation_s: Option<f64>,
}

/// The ideal step time and the deviations from it, as ml-goodput-measurement defines them.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StepStats {
    pub ideal_step_time_s: Option<f64>,
    pub median_step_time_s: Option<f64>,
    /// The median of the deviations' sizes.
    pub median_abs_deviation_s: Option<f64>,
    /// The span with the largest deviation.
    pub worst: Option<StepSample>,
    /// Whether every step time was under a second and the library's one-second filter was
    /// skipped (it would have left nothing).
    pub sub_second: bool,
    pub samples: Vec<StepSample>,
}

/// One allocation's share of the wall time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AllocationGoodput {
    pub number: u32,
    /// The queue wait before it, and the stop lead unused after it, are counted in it.
    pub breakdown: Breakdown,
}

/// The whole job's goodput.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Goodput {
    pub start: f64,
    pub end: f64,
    pub wall_s: f64,
    pub breakdown: Breakdown,
    /// `goodput / wall`, 0 when there is no wall time.
    pub goodput_fraction: f64,
    pub allocations: Vec<AllocationGoodput>,
    pub steps: StepStats,
    /// Every in-process restart and what it cost.
    pub generations: Vec<GenerationCost>,
    pub notes: Vec<String>,
}

/// The note on the checkpoint category when no save was recorded, in the table, the page and
/// `--json`.
pub const CHECKPOINT_NOTE: &str = "checkpoint saves: no `section` record of a checkpoint section (a section whose name holds `checkpoint`, such as `checkpointing`), so saves, if any, are counted where they fall: in step time or in other";

/// The note when some rank's saves were more than its records ([`vigil_events::log::MAX_SECTION_RECORDS`]).
pub const CHECKPOINT_CAPPED_NOTE: &str = "checkpoint saves: a rank closed more checkpoint sections in one attempt than are recorded; the later ones are counted where they fall";

#[cfg(test)]
mod tests;
