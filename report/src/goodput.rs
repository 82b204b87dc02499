//! Goodput: how much of a job's wall time, over its whole life across allocations, made progress
//! that was kept, and where the rest went (badput by category). Pure functions over a
//! [`Timeline`] drawn from the [`History`] (the ledger and the event logs); see docs/goodput.md
//! for every number and its source record. The numbers are put into text here ([`render_table`]
//! for `vigil goodput`, [`summary_line`] for `vigil ledger`); the report page draws its Goodput
//! section from [`of_history`] in the `html` module.
//!
//! The wall time is cut into consecutive pieces, each given one category, so the categories add
//! up to the wall time exactly and none is negative ("other" is what no record explains).

use serde::Serialize;

use crate::history::History;

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
    /// From the job's stop for the time limit to the allocation's end.
    StopLeadUnused,
    /// From the job's submission to its first allocation, and between one allocation's end
    /// and the next one's start.
    QueueWait,
    /// What no record explains.
    Other,
}

impl Category {
    pub const ALL: [Category; 8] = [
        Category::Goodput,
        Category::StartUp,
        Category::Checkpoint,
        Category::LostProgress,
        Category::FailureHandling,
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
            Category::StopLeadUnused => "stop lead unused",
            Category::QueueWait => "queue wait",
            Category::Other => "other",
        }
    }

    fn index(self) -> usize {
        Category::ALL.iter().position(|c| *c == self).unwrap_or(7)
    }
}

/// Seconds by category.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Breakdown {
    seconds: [f64; 8],
}

impl Breakdown {
    pub fn get(&self, c: Category) -> f64 {
        self.seconds[c.index()]
    }

    fn add(&mut self, c: Category, s: f64) {
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
        let mut m = s.serialize_map(Some(8))?;
        for c in Category::ALL {
            m.serialize_entry(c.name(), &self.get(c))?;
        }
        m.end()
    }
}

/// One attempt, job-wide: the earliest start and latest end among its nodes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AttemptSpan {
    pub cycle: u32,
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
    pub cycle: u32,
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
    pub notes: Vec<String>,
}

/// The note on the checkpoint category when no save was recorded, in the table, the page and
/// `--json`.
pub const CHECKPOINT_NOTE: &str = "checkpoint saves: no `section` record of a checkpoint section (a section whose name holds `checkpoint`, such as `checkpointing`), so saves, if any, are counted where they fall: in step time or in other";

/// The note when some rank's saves were more than its records ([`vigil_events::log::MAX_SECTION_RECORDS`]).
pub const CHECKPOINT_CAPPED_NOTE: &str = "checkpoint saves: a rank closed more checkpoint sections in one attempt than are recorded; the later ones are counted where they fall";

/// Cuts the wall time into consecutive pieces: everything up to `until` not yet given a category
/// gets `cat`, in allocation `alloc`; except that the time in a save (`saves`: sorted, disjoint)
/// is checkpoint time, whatever piece it falls in but the queue wait.
struct Cutter {
    at: f64,
    end: f64,
    job: Breakdown,
    allocs: Vec<Breakdown>,
    saves: Vec<(f64, f64)>,
    /// The first save that may end after `at`.
    next_save: usize,
}

impl Cutter {
    fn fill(&mut self, alloc: usize, cat: Category, until: f64) {
        let until = if until.is_finite() { until } else { self.at };
        let to = until.min(self.end);
        while to > self.at {
            while self
                .saves
                .get(self.next_save)
                .is_some_and(|s| s.1 <= self.at)
            {
                self.next_save += 1;
            }
            match self.saves.get(self.next_save).copied() {
                Some((s, e)) if s < to && cat != Category::QueueWait => {
                    self.put(alloc, cat, s);
                    self.put(alloc, Category::Checkpoint, e.min(to));
                }
                _ => self.put(alloc, cat, to),
            }
        }
    }

    /// `at..to` is `cat` (nothing when `to` is not past `at`).
    fn put(&mut self, alloc: usize, cat: Category, to: f64) {
        if to > self.at {
            let s = to - self.at;
            self.job.add(cat, s);
            if let Some(b) = self.allocs.get_mut(alloc) {
                b.add(cat, s);
            }
            self.at = to;
        }
    }
}

/// Every attempt's saves, cut to the attempt, as sorted disjoint spans: several ranks saving at
/// once are one save.
fn merged_saves(t: &Timeline) -> Vec<(f64, f64)> {
    let mut v: Vec<(f64, f64)> = t
        .allocations
        .iter()
        .flat_map(|al| al.attempts.iter())
        .flat_map(|at| {
            at.saves
                .iter()
                .map(move |&(s, e)| (s.max(at.start), e.min(at.end)))
        })
        .filter(|(s, e)| s.is_finite() && e.is_finite() && e > s)
        .collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut out: Vec<(f64, f64)> = Vec::with_capacity(v.len());
    for (s, e) in v {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// When an attempt reached `step`, from its `steps` records (linear between two of them). None
/// when it never did.
fn time_of_step(steps: &[(f64, u64)], step: u64) -> Option<f64> {
    let first = steps.first()?;
    if step <= first.1 {
        return Some(first.0);
    }
    for w in steps.windows(2) {
        let ((t0, s0), (t1, s1)) = (w[0], w[1]);
        if step <= s1 && s1 > s0 {
            let f = (step - s0) as f64 / (s1 - s0) as f64;
            return Some(t0 + f * (t1 - t0));
        }
    }
    None
}

/// The first step of the next attempt (in this allocation or a later one) that has any: where the
/// job went on from.
fn resumed_from(t: &Timeline, a: usize, i: usize) -> Option<u64> {
    let later_here = t.allocations[a].attempts[i + 1..].iter();
    let later = t.allocations[a + 1..]
        .iter()
        .flat_map(|al| al.attempts.iter());
    later_here
        .chain(later)
        .find_map(|at| at.steps.first().map(|s| s.1))
}

/// The goodput and badput of `t`. Pure; every category is non-negative and they add up to the
/// wall time (from the first allocation's start to the last one's end).
pub fn compute(t: &Timeline) -> Goodput {
    let saves = merged_saves(t);
    let mut notes = Vec::new();
    if saves.is_empty() {
        notes.push(CHECKPOINT_NOTE.to_string());
    }
    let attempts = || t.allocations.iter().flat_map(|al| al.attempts.iter());
    if attempts().any(|at| at.saves_incomplete) {
        notes.push(CHECKPOINT_CAPPED_NOTE.to_string());
    }
    let Some(first) = t.allocations.first() else {
        return Goodput {
            notes,
            ..Goodput::default()
        };
    };
    // From the job's submission, where Slurm's times are known and come before the start.
    let start = [first.submit_time, first.slurm_start]
        .into_iter()
        .flatten()
        .filter(|x| x.is_finite())
        .fold(first.start, f64::min);
    let end = t
        .allocations
        .iter()
        .map(|a| a.end)
        .filter(|e| e.is_finite())
        .fold(start, f64::max);
    let mut cut = Cutter {
        at: start,
        end,
        job: Breakdown::default(),
        allocs: vec![Breakdown::default(); t.allocations.len()],
        saves,
        next_save: 0,
    };
    for (ai, al) in t.allocations.iter().enumerate() {
        // The wait before it, if the last allocation's stop lead did not cover it: up to Slurm's
        // start of it where known (from there on the batch script, srun, a container: start-up).
        let queued_until = al.slurm_start.map_or(al.start, |s| s.min(al.start));
        cut.fill(ai, Category::QueueWait, queued_until);
        cut_allocation(t, ai, &mut cut);
        let next_start = t.allocations.get(ai + 1).map_or(end, |n| n.start);
        if let Some(s) = al.scheduled_end {
            cut.fill(ai, Category::StopLeadUnused, s.min(next_start).max(al.end));
        }
    }
    cut.fill(t.allocations.len() - 1, Category::Other, end);
    let wall = end - start;
    let steps = step_stats(t, &mut notes);
    let breakdown = cut.job;
    Goodput {
        start,
        end,
        wall_s: wall,
        goodput_fraction: if wall > 0.0 {
            breakdown.get(Category::Goodput) / wall
        } else {
            0.0
        },
        breakdown,
        allocations: t
            .allocations
            .iter()
            .zip(cut.allocs)
            .map(|(a, b)| AllocationGoodput {
                number: a.number,
                breakdown: b,
            })
            .collect(),
        steps,
        notes,
    }
}

/// One allocation, from its start to its end (the stop lead and queue wait after it are the
/// caller's).
fn cut_allocation(t: &Timeline, ai: usize, cut: &mut Cutter) {
    let al = &t.allocations[ai];
    let n = al.attempts.len();
    for (i, at) in al.attempts.iter().enumerate() {
        // Before the attempt: the agent's start-up, or what the previous attempt left (its
        // failure handling runs up to this start).
        let prev_failed = i > 0 && al.attempts[i - 1].failed_at.is_some();
        let before = if prev_failed {
            Category::FailureHandling
        } else if i == 0 {
            Category::StartUp
        } else {
            Category::Other
        };
        cut.fill(ai, before, at.start);
        let resumed = resumed_from(t, ai, i);
        let (Some(&(t_first, s_first)), Some(&(t_last, s_last))) =
            (at.steps.first(), at.steps.last())
        else {
            // No step at all: start-up until it failed or ended.
            cut.fill(ai, Category::StartUp, at.failed_at.unwrap_or(at.end));
            if at.failed_at.is_some() {
                cut.fill(ai, Category::FailureHandling, at.end);
            }
            continue;
        };
        cut.fill(ai, Category::StartUp, t_first);
        // Step time up to the step the job went on from was kept; beyond it, done again.
        let kept_until = match resumed {
            Some(r) if r <= s_last => time_of_step(&at.steps, r.max(s_first)).unwrap_or(t_last),
            _ => t_last,
        };
        cut.fill(ai, Category::Goodput, kept_until);
        cut.fill(ai, Category::LostProgress, t_last);
        match at.failed_at {
            Some(f) => {
                // Unrecorded steps before the failure: kept only if the job went on past them.
                let tail = if resumed.is_some_and(|r| r > s_last) {
                    Category::Goodput
                } else {
                    Category::LostProgress
                };
                cut.fill(ai, tail, f);
                cut.fill(ai, Category::FailureHandling, at.end);
            }
            None if i + 1 == n => {
                // The last attempt's steps after its last record, up to the allocation's highest
                // step at the attempt's own pace; then saving, exiting: other.
                let pace =
                    (s_last > s_first).then(|| (t_last - t_first) / (s_last - s_first) as f64);
                if let (Some(p), Some(fin)) = (pace, al.final_step.filter(|f| *f > s_last)) {
                    cut.fill(ai, Category::Goodput, t_last + p * (fin - s_last) as f64);
                }
                cut.fill(ai, Category::Other, at.end);
            }
            None => cut.fill(ai, Category::Other, at.end),
        }
    }
    let last_failed = al.attempts.last().is_some_and(|a| a.failed_at.is_some());
    let after = if al.attempts.is_empty() {
        Category::StartUp
    } else if last_failed {
        Category::FailureHandling
    } else if al.scheduled_end.is_some() {
        Category::StopLeadUnused
    } else {
        Category::Other
    };
    cut.fill(ai, after, al.end);
}

/// The step times of every attempt's spans between `steps` records, and the ideal step time.
fn step_stats(t: &Timeline, notes: &mut Vec<String>) -> StepStats {
    let mut samples = Vec::new();
    for al in &t.allocations {
        for at in &al.attempts {
            for w in at.steps.windows(2) {
                let ((t0, s0), (t1, s1)) = (w[0], w[1]);
                if s1 > s0 && t1 > t0 {
                    samples.push(StepSample {
                        allocation: al.number,
                        cycle: at.cycle,
                        from_step: s0,
                        to_step: s1,
                        step_time_s: (t1 - t0) / (s1 - s0) as f64,
                        deviation_s: None,
                    });
                }
            }
        }
    }
    if samples.is_empty() {
        notes.push("no two `steps` records of one attempt: no step time".into());
        return StepStats::default();
    }
    let weighted: Vec<(f64, f64)> = samples
        .iter()
        .map(|s| (s.step_time_s, (s.to_step - s.from_step) as f64))
        .collect();
    let (ideal, sub_second) = match ideal_step_time(&weighted) {
        Some(i) => (Some(i), false),
        None => (ideal_step_time_unfiltered(&weighted), true),
    };
    if sub_second {
        notes.push("every step time is under a second: the ideal step time is taken over all of them (ml-goodput-measurement leaves steps under a second out)".into());
    }
    for s in &mut samples {
        s.deviation_s = ideal.map(|i| s.step_time_s - i);
    }
    let abs_dev: Vec<(f64, f64)> = samples
        .iter()
        .zip(&weighted)
        .filter_map(|(s, (_, w))| s.deviation_s.map(|d| (d.abs(), *w)))
        .collect();
    let worst = samples
        .iter()
        .filter(|s| s.deviation_s.is_some())
        .max_by(|a, b| {
            a.deviation_s
                .unwrap_or(0.0)
                .total_cmp(&b.deviation_s.unwrap_or(0.0))
        })
        .cloned();
    StepStats {
        ideal_step_time_s: ideal,
        median_step_time_s: weighted_median(&weighted),
        median_abs_deviation_s: weighted_median(&abs_dev),
        worst,
        sub_second,
        samples,
    }
}

/// The median of weighted values (each value counted `weight` times; the lower middle one).
pub fn weighted_median(v: &[(f64, f64)]) -> Option<f64> {
    let mut v: Vec<(f64, f64)> = v
        .iter()
        .copied()
        .filter(|(x, w)| x.is_finite() && *w > 0.0)
        .collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total: f64 = v.iter().map(|x| x.1).sum();
    let half = total / 2.0;
    let mut acc = 0.0;
    for (i, (x, w)) in v.iter().enumerate() {
        acc += w;
        if acc > half {
            return Some(*x);
        }
        if acc == half {
            // An even split: the mean of the two middle values, as numpy's median.
            return Some(v.get(i + 1).map_or(*x, |n| (x + n.0) / 2.0));
        }
    }
    v.last().map(|x| x.0)
}

/// ml-goodput-measurement's ideal step time: step times under a second are left out; of the
/// rest, those at most the median plus three median absolute deviations are averaged. Each
/// `(step time, steps)` counts once per step.
pub fn ideal_step_time(v: &[(f64, f64)]) -> Option<f64> {
    let kept: Vec<(f64, f64)> = v.iter().copied().filter(|(x, _)| *x >= 1.0).collect();
    ideal_step_time_unfiltered(&kept)
}

/// [`ideal_step_time`] without the one-second filter.
pub fn ideal_step_time_unfiltered(v: &[(f64, f64)]) -> Option<f64> {
    let med = weighted_median(v)?;
    let dev: Vec<(f64, f64)> = v.iter().map(|(x, w)| ((x - med).abs(), *w)).collect();
    let mad = weighted_median(&dev)?;
    let (sum, n) = v
        .iter()
        .filter(|(x, w)| *x <= med + 3.0 * mad && *w > 0.0 && x.is_finite())
        .fold((0.0, 0.0), |(s, n), (x, w)| (s + x * w, n + w));
    (n > 0.0).then(|| sum / n)
}

/// The timeline of a history: its allocations (ledger records, else inferred from the runs),
/// each attempt job-wide.
pub fn timeline(h: &History) -> Timeline {
    let mut allocations = Vec::new();
    for a in &h.allocations {
        let runs: Vec<&crate::NodeRun> = a.runs.iter().filter_map(|&i| h.runs.get(i)).collect();
        let run_end = runs.iter().map(|r| r.end).fold(a.start, f64::max);
        let end = a.end.unwrap_or(run_end).max(a.start);
        let mut cycles: Vec<u32> = runs
            .iter()
            .flat_map(|r| r.attempts.iter().map(|x| x.cycle))
            .collect();
        cycles.sort_unstable();
        cycles.dedup();
        let mut attempts: Vec<AttemptSpan> =
            cycles.iter().map(|&c| attempt_span(&runs, c)).collect();
        // An attempt whose end was not recorded ran at most until the next one started.
        for i in 1..attempts.len() {
            let next = attempts[i].start;
            let prev = &mut attempts[i - 1];
            prev.end = prev.end.min(next).max(prev.start);
            prev.failed_at = prev.failed_at.map(|f| f.min(prev.end));
        }
        let mut scheduled_end: Option<f64> = None;
        let mut stop_step = None;
        for s in runs.iter().flat_map(|r| r.stops.iter()) {
            match &s.kind {
                crate::StopKind::Triggered { trigger }
                    if trigger == "time-limit" || trigger == "end-time" =>
                {
                    // The window of a time-limit stop is the time left to the allocation's end.
                    if let Some(w) = s.window_s {
                        let e = s.ts + w;
                        scheduled_end = Some(scheduled_end.map_or(e, |x| x.min(e)));
                    }
                }
                crate::StopKind::Agreed { step: Some(st), .. } => stop_step = Some(*st),
                _ => {}
            }
        }
        allocations.push(AllocationSpan {
            number: a.number,
            start: a.start,
            end,
            submit_time: a.submit_time,
            slurm_start: a.slurm_start,
            scheduled_end,
            final_step: [a.highest_step, a.stop_step, stop_step]
                .into_iter()
                .flatten()
                .max(),
            attempts,
        });
    }
    allocations.sort_by(|x, y| x.start.total_cmp(&y.start));
    Timeline { allocations }
}

/// Attempt `cycle` across the allocation's node runs.
fn attempt_span(runs: &[&crate::NodeRun], cycle: u32) -> AttemptSpan {
    let mine = || {
        runs.iter()
            .flat_map(|r| r.attempts.iter().filter(move |a| a.cycle == cycle))
    };
    let start = mine().map(|a| a.start).fold(f64::INFINITY, f64::min);
    let end = mine().map(|a| a.end).fold(f64::NEG_INFINITY, f64::max);
    let failed = mine().any(|a| a.end_kind.as_deref() == Some("failed"));
    let failure = runs
        .iter()
        .flat_map(|r| r.failures.iter().filter(|f| f.cycle == cycle).map(|f| f.ts))
        .chain(runs.iter().flat_map(|r| {
            r.hangs
                .iter()
                .filter(|h| h.cycle == cycle)
                .map(|h| h.ts - h.silent_ms.unwrap_or(0) as f64 / 1000.0)
        }))
        .fold(f64::INFINITY, f64::min);
    let steps: Vec<(f64, u64)> = runs
        .iter()
        .filter(|r| r.steps.iter().any(|s| s.cycle == cycle))
        .min_by_key(|r| r.node_rank)
        .map(|r| {
            r.steps
                .iter()
                .filter(|s| s.cycle == cycle)
                .map(|s| (s.ts, s.min_step.unwrap_or(s.step)))
                .collect()
        })
        .unwrap_or_default();
    let last_step = steps.last().map_or(start, |s| s.0);
    let failed_at = (failed || failure.is_finite()).then(|| {
        let f = if failure.is_finite() { failure } else { end };
        f.max(last_step).min(end)
    });
    let saves = || {
        runs.iter()
            .flat_map(|r| r.saves.iter().filter(|s| s.cycle == cycle))
    };
    AttemptSpan {
        cycle,
        start,
        end,
        failed_at,
        steps,
        saves: saves().map(|s| (s.ts - s.seconds, s.ts)).collect(),
        saves_incomplete: saves().any(|s| s.last_recorded),
    }
}

/// The goodput of the job whose records are below `dir`.
pub fn of_history(h: &History) -> Goodput {
    compute(&timeline(h))
}

/// `12.3s` with one decimal, for the table and the report page's legend.
pub(crate) fn s1(x: f64) -> String {
    format!("{x:.1}s")
}

/// The table `vigil goodput` prints.
pub fn render_table(g: &Goodput) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "wall time {} from {} to {}; goodput {:.1}%\n\n",
        s1(g.wall_s),
        crate::fmt::utc(g.start),
        crate::fmt::utc(g.end),
        100.0 * g.goodput_fraction
    ));
    let mut header = format!("{:<28}{:>12}{:>8}", "category", "seconds", "share");
    for a in &g.allocations {
        header.push_str(&format!("{:>12}", format!("alloc {}", a.number)));
    }
    out.push_str(header.trim_end());
    out.push('\n');
    let share = |x: f64| {
        if g.wall_s > 0.0 {
            format!("{:.1}%", 100.0 * x / g.wall_s)
        } else {
            "-".into()
        }
    };
    let mut row = |label: &str, total: f64, each: &dyn Fn(&Breakdown) -> f64| {
        let mut l = format!("{label:<28}{:>12}{:>8}", s1(total), share(total));
        for a in &g.allocations {
            l.push_str(&format!("{:>12}", s1(each(&a.breakdown))));
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    for c in Category::ALL {
        row(c.label(), g.breakdown.get(c), &|b| b.get(c));
    }
    row("total", g.breakdown.total(), &|b| b.total());
    out.push('\n');
    let st = &g.steps;
    match st.ideal_step_time_s {
        Some(i) => {
            out.push_str(&format!("ideal step time {i:.3}s"));
            if let Some(m) = st.median_step_time_s {
                out.push_str(&format!(" (median {m:.3}s)"));
            }
            if let Some(d) = st.median_abs_deviation_s {
                out.push_str(&format!("; step-time deviation: median {d:.3}s"));
            }
            if let Some(w) = &st.worst {
                out.push_str(&format!(
                    ", largest {:+.3}s over steps {}..{} (allocation {}, attempt {})",
                    w.deviation_s.unwrap_or(0.0),
                    w.from_step,
                    w.to_step,
                    w.allocation,
                    w.cycle
                ));
            }
            out.push('\n');
        }
        None => out.push_str("ideal step time: none (no step time recorded)\n"),
    }
    for n in &g.notes {
        out.push_str(&format!("note: {n}\n"));
    }
    out
}

/// `goodput 62.0% of 1h02m (start-up 3.1%, ...)`: one line, for `vigil ledger`.
pub fn summary_line(g: &Goodput) -> String {
    let parts: Vec<String> = Category::ALL[1..]
        .iter()
        .filter(|c| g.breakdown.get(**c) > 0.0)
        .map(|c| {
            format!(
                "{} {:.1}%",
                c.label(),
                100.0 * g.breakdown.get(*c) / g.wall_s.max(f64::MIN_POSITIVE)
            )
        })
        .collect();
    let mut s = format!(
        "goodput {:.1}% of {}",
        100.0 * g.goodput_fraction,
        crate::fmt::duration(g.wall_s)
    );
    if !parts.is_empty() {
        s.push_str(&format!(" ({})", parts.join(", ")));
    }
    s.push_str("; see vigil goodput");
    s
}

/// The ledger line for the job whose records are below `dir`, if it has any.
pub fn ledger_line(dir: &std::path::Path) -> Option<String> {
    let h = History::load(dir).ok()?;
    let g = of_history(&h);
    (g.wall_s > 0.0).then(|| summary_line(&g))
}

/// `vigil goodput TARGET [--json]`: the table, or the same numbers as JSON.
pub fn goodput_command(
    target: &str,
    json: bool,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, crate::ReportError> {
    let dir = crate::resolve_target(target, env)?;
    let h = History::load(&dir)?;
    let mut g = of_history(&h);
    g.notes.extend(h.notes.iter().cloned());
    Ok(if json {
        let mut s = serde_json::to_string_pretty(&g).unwrap_or_default();
        s.push('\n');
        s
    } else {
        render_table(&g)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn attempt(
        cycle: u32,
        start: f64,
        end: f64,
        failed_at: Option<f64>,
        steps: &[(f64, u64)],
    ) -> AttemptSpan {
        AttemptSpan {
            cycle,
            start,
            end,
            failed_at,
            steps: steps.to_vec(),
            ..AttemptSpan::default()
        }
    }

    fn sums_to_wall(g: &Goodput) {
        assert!((g.breakdown.total() - g.wall_s).abs() < 1e-6, "{g:?}");
        for c in Category::ALL {
            assert!(g.breakdown.get(c) >= 0.0, "{c:?} {g:?}");
        }
        let per: f64 = g.allocations.iter().map(|a| a.breakdown.total()).sum();
        assert!((per - g.wall_s).abs() < 1e-6, "{g:?}");
    }

    #[test]
    fn a_crash_a_restart_and_a_requeue_after_a_time_limit_stop_are_each_counted() {
        // Allocation 1 (0..100): start-up 0..5; attempt 0 steps 5..30 reaching step 25; crash at
        // 32; attempt 1 from 40 resumes at step 20, runs to step 60 at 80; the time limit's stop
        // at 80 (window 20, so the allocation would end at 100) ends the job at 90.
        // Allocation 2 (130..150) resumes at 60.
        let t = Timeline {
            allocations: vec![
                AllocationSpan {
                    number: 1,
                    start: 0.0,
                    end: 90.0,
                    scheduled_end: Some(100.0),
                    final_step: Some(60),
                    attempts: vec![
                        attempt(0, 2.0, 34.0, Some(32.0), &[(5.0, 0), (30.0, 25)]),
                        attempt(1, 40.0, 88.0, None, &[(42.0, 20), (80.0, 60)]),
                    ],
                    ..AllocationSpan::default()
                },
                AllocationSpan {
                    number: 2,
                    start: 130.0,
                    end: 150.0,
                    scheduled_end: None,
                    final_step: Some(70),
                    attempts: vec![attempt(0, 131.0, 149.0, None, &[(133.0, 60), (143.0, 70)])],
                    ..AllocationSpan::default()
                },
            ],
        };
        let g = compute(&t);
        sums_to_wall(&g);
        assert_eq!(g.wall_s, 150.0);
        let b = &g.breakdown;
        // Start-up: 0..5, 40..42, 130..133.
        assert!((b.get(Category::StartUp) - 10.0).abs() < 1e-9, "{b:?}");
        // Steps 20..25 of attempt 0 (25..30) and its unrecorded tail 30..32 were redone.
        assert!((b.get(Category::LostProgress) - 7.0).abs() < 1e-9, "{b:?}");
        // From the crash at 32 to attempt 1's start at 40.
        assert!(
            (b.get(Category::FailureHandling) - 8.0).abs() < 1e-9,
            "{b:?}"
        );
        // 5..25, 42..80, 133..143.
        assert!((b.get(Category::Goodput) - 68.0).abs() < 1e-9, "{b:?}");
        // From the stopped attempt's end at 88 to the allocation's would-be end at 100, then the
        // queue 100..130.
        assert!(
            (b.get(Category::StopLeadUnused) - 12.0).abs() < 1e-9,
            "{b:?}"
        );
        assert!((b.get(Category::QueueWait) - 30.0).abs() < 1e-9, "{b:?}");
        assert_eq!(b.get(Category::Checkpoint), 0.0);
        // 80..88 (saving at the stop step, exiting), 143..150.
        assert!((b.get(Category::Other) - 15.0).abs() < 1e-9, "{b:?}");
        assert_eq!(g.allocations[1].breakdown.get(Category::QueueWait), 30.0);
        // Step times: 1.0 (25 steps), 0.95 (40), 1.0 (10).
        let st = &g.steps;
        assert_eq!(st.samples.len(), 3);
        assert!(!st.sub_second);
        assert!((st.ideal_step_time_s.unwrap() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn saves_are_checkpoint_time_wherever_they_fall_and_ranks_saving_together_count_once() {
        // Steps 10..50 over 0..40 at one step a second; two ranks save 20..23 and 21..24 (one
        // save, 20..24), and the save at the stop step runs 42..45 after the last record (other
        // before). A save reported as longer than its attempt counts only inside it.
        let mut a = attempt(0, 0.0, 46.0, None, &[(0.0, 10), (40.0, 50)]);
        a.saves = vec![(20.0, 23.0), (21.0, 24.0), (42.0, 45.0), (-30.0, 0.5)];
        let t = Timeline {
            allocations: vec![AllocationSpan {
                number: 1,
                start: 0.0,
                end: 50.0,
                attempts: vec![a],
                ..AllocationSpan::default()
            }],
        };
        let g = compute(&t);
        sums_to_wall(&g);
        let b = &g.breakdown;
        assert!((b.get(Category::Checkpoint) - 7.5).abs() < 1e-9, "{b:?}");
        // 0.5..20 and 24..40.
        assert!((b.get(Category::Goodput) - 35.5).abs() < 1e-9, "{b:?}");
        // 40..42, 45..50.
        assert!((b.get(Category::Other) - 7.0).abs() < 1e-9, "{b:?}");
        assert!(
            !g.notes.iter().any(|n| n == CHECKPOINT_NOTE),
            "{:?}",
            g.notes
        );
        // The saves of an attempt that is redone are checkpoint time too; a capped rank is said.
        let mut t2 = t.clone();
        t2.allocations[0].attempts[0].saves_incomplete = true;
        let g2 = compute(&t2);
        assert!(g2.notes.iter().any(|n| n == CHECKPOINT_CAPPED_NOTE));
        assert_eq!(g2.breakdown, g.breakdown);
    }

    #[test]
    fn the_queue_wait_begins_at_the_submission_and_ends_at_slurms_start() {
        // Submitted at 0, started by Slurm at 30, the agent at 35, ranks stepping from 40 to 60;
        // requeued at 60, Slurm starts it again at 80 and the agent at 82.
        let t = Timeline {
            allocations: vec![
                AllocationSpan {
                    number: 1,
                    start: 35.0,
                    end: 60.0,
                    submit_time: Some(0.0),
                    slurm_start: Some(30.0),
                    attempts: vec![attempt(0, 36.0, 60.0, None, &[(40.0, 0), (60.0, 20)])],
                    ..AllocationSpan::default()
                },
                AllocationSpan {
                    number: 2,
                    start: 82.0,
                    end: 90.0,
                    submit_time: Some(0.0),
                    slurm_start: Some(80.0),
                    attempts: vec![attempt(0, 83.0, 90.0, None, &[(84.0, 20), (90.0, 26)])],
                    ..AllocationSpan::default()
                },
            ],
        };
        let g = compute(&t);
        sums_to_wall(&g);
        assert_eq!((g.start, g.wall_s), (0.0, 90.0));
        let b = &g.breakdown;
        assert!((b.get(Category::QueueWait) - 50.0).abs() < 1e-9, "{b:?}");
        // 30..40 and 80..84.
        assert!((b.get(Category::StartUp) - 14.0).abs() < 1e-9, "{b:?}");
        assert_eq!(g.allocations[0].breakdown.get(Category::QueueWait), 30.0);
        // Slurm's times after the agent's start (another clock) move nothing.
        let mut t2 = t.clone();
        t2.allocations[0].submit_time = Some(50.0);
        t2.allocations[0].slurm_start = Some(51.0);
        let g2 = compute(&t2);
        sums_to_wall(&g2);
        assert_eq!(g2.start, 35.0);
        assert!((g2.breakdown.get(Category::QueueWait) - 20.0).abs() < 1e-9);
    }

    #[test]
    fn a_hang_counts_its_detection_wait_as_failure_handling() {
        let t = Timeline {
            allocations: vec![AllocationSpan {
                number: 1,
                start: 0.0,
                end: 50.0,
                attempts: vec![
                    attempt(0, 1.0, 22.0, Some(12.0), &[(2.0, 0), (12.0, 10)]),
                    attempt(1, 23.0, 49.0, None, &[(24.0, 10), (44.0, 30)]),
                ],
                ..AllocationSpan::default()
            }],
        };
        let g = compute(&t);
        sums_to_wall(&g);
        assert!((g.breakdown.get(Category::FailureHandling) - 11.0).abs() < 1e-9);
        assert_eq!(g.breakdown.get(Category::LostProgress), 0.0);
        // 44..50: after the last record, with no final step to reach.
        assert!((g.breakdown.get(Category::Other) - 6.0).abs() < 1e-9);
    }

    #[test]
    fn the_ideal_step_time_leaves_out_slow_outliers_and_sub_second_steps() {
        let v = [
            (2.0, 1.0),
            (2.1, 1.0),
            (1.9, 1.0),
            (2.0, 1.0),
            (30.0, 1.0),
            (0.5, 1.0),
        ];
        let i = ideal_step_time(&v).unwrap();
        assert!((i - 2.0).abs() < 1e-9, "{i}");
        assert_eq!(ideal_step_time(&[(0.2, 5.0)]), None);
        assert_eq!(weighted_median(&[(1.0, 1.0), (3.0, 1.0)]), Some(2.0));
        assert_eq!(weighted_median(&[(1.0, 1.0), (3.0, 5.0)]), Some(3.0));
    }

    #[test]
    fn a_history_becomes_job_wide_attempts_with_their_failure_times() {
        use crate::records::{parse_jsonl, RecordFile};
        let log = concat!(
            r#"{"event":"cycle_start","cycle":0,"host":"a","node_rank":0,"ts":100.0}"#,
            "\n",
            r#"{"event":"steps","cycle":0,"step":5,"min_step":4,"host":"a","node_rank":0,"ts":101.0}"#,
            "\n",
            r#"{"event":"hang","cycle":0,"rank":1,"timeout":"heartbeat","silent_ms":3000,"host":"a","node_rank":0,"ts":110.0}"#,
            "\n",
            r#"{"event":"cycle_ended","cycle":0,"end":"failed","node":0,"reason":"hung","host":"a","node_rank":0,"ts":110.5}"#,
            "\n",
            r#"{"event":"cycle_start","cycle":1,"host":"a","node_rank":0,"ts":111.0}"#,
            "\n",
            r#"{"event":"stop_triggered","cycle":1,"trigger":"time-limit","window_ms":4000,"host":"a","node_rank":0,"ts":115.0}"#,
            "\n",
            r#"{"event":"stop_agreed","cycle":1,"step":9,"trigger":"time-limit","host":"a","node_rank":0,"ts":115.1}"#,
            "\n",
            r#"{"event":"section","cycle":1,"local_rank":0,"rank":0,"name":"checkpointing","duration_ms":500,"host":"a","node_rank":0,"ts":115.6}"#,
            "\n",
            r#"{"event":"cycle_ended","cycle":1,"end":"done","host":"a","node_rank":0,"ts":116.0}"#,
            "\n",
            r#"{"event":"result","outcome":"stopped","exit_code":75,"host":"a","node_rank":0,"ts":116.0}"#,
            "\n",
        );
        let file = RecordFile {
            path: "r/events.jsonl".into(),
            records: parse_jsonl(log, std::path::Path::new("r")).0,
        };
        let h = crate::history::build("d".into(), &[file], &[]);
        let t = timeline(&h);
        let a = &t.allocations[0];
        assert_eq!((a.start, a.end), (100.0, 116.0));
        assert_eq!(a.scheduled_end, Some(119.0));
        assert_eq!(a.final_step, Some(9));
        assert_eq!(a.attempts.len(), 2);
        assert_eq!(a.attempts[0].failed_at, Some(107.0));
        assert_eq!(a.attempts[0].steps, vec![(101.0, 4)]);
        assert_eq!(a.attempts[1].failed_at, None);
        assert_eq!(a.attempts[1].saves, vec![(115.1, 115.6)]);
        assert!(!a.attempts[1].saves_incomplete);
        let g = compute(&t);
        sums_to_wall(&g);
        // 107..111: the hang's silence, its detection and the restart.
        assert!(
            (g.breakdown.get(Category::FailureHandling) - 4.0).abs() < 1e-9,
            "{g:?}"
        );
        // 116..119 lies past the wall time's end (the job's last record): not counted.
        assert_eq!(g.wall_s, 16.0);
        assert!((g.breakdown.get(Category::Checkpoint) - 0.5).abs() < 1e-9);
    }

    #[test]
    fn no_allocation_is_no_wall_time() {
        let g = compute(&Timeline::default());
        assert_eq!(g.wall_s, 0.0);
        assert!(render_table(&g).contains("goodput 0.0%"));
    }

    fn arb_attempt() -> impl Strategy<Value = AttemptSpan> {
        (
            0u32..4,
            -10.0f64..200.0,
            0.0f64..100.0,
            proptest::option::of(-10.0f64..300.0),
            proptest::collection::vec((-10.0f64..300.0, 0u64..100), 0..6),
            proptest::collection::vec((-10.0f64..300.0, -5.0f64..50.0), 0..4),
        )
            .prop_map(|(cycle, start, len, failed_at, mut steps, saves)| {
                steps.sort_by(|a, b| a.0.total_cmp(&b.0));
                AttemptSpan {
                    cycle,
                    start,
                    end: start + len,
                    failed_at,
                    steps,
                    saves: saves.into_iter().map(|(s, d)| (s, s + d)).collect(),
                    saves_incomplete: false,
                }
            })
    }

    fn arb_allocation() -> impl Strategy<Value = AllocationSpan> {
        (
            -20.0f64..400.0,
            -5.0f64..200.0,
            proptest::option::of(-20.0f64..600.0),
            proptest::option::of(0u64..200),
            proptest::collection::vec(arb_attempt(), 0..4),
            proptest::option::of((-100.0f64..400.0, -100.0f64..400.0)),
        )
            .prop_map(|(start, len, scheduled_end, final_step, attempts, slurm)| {
                AllocationSpan {
                    number: 1,
                    start,
                    end: start + len,
                    scheduled_end,
                    final_step,
                    attempts,
                    submit_time: slurm.map(|s| s.0),
                    slurm_start: slurm.map(|s| s.1),
                }
            })
    }

    proptest! {
        // Whatever the records say, even out of order or overlapping: the categories add up to
        // the wall time and none is negative.
        #[test]
        fn the_categories_always_add_up_to_the_wall_time(
            mut allocations in proptest::collection::vec(arb_allocation(), 1..4)
        ) {
            allocations.sort_by(|x, y| x.start.total_cmp(&y.start));
            let g = compute(&Timeline { allocations });
            prop_assert!(g.wall_s >= 0.0);
            prop_assert!((g.breakdown.total() - g.wall_s).abs() < 1e-6 * (1.0 + g.wall_s));
            for c in Category::ALL {
                prop_assert!(g.breakdown.get(c) >= 0.0);
            }
            let per: f64 = g.allocations.iter().map(|a| a.breakdown.total()).sum();
            prop_assert!((per - g.wall_s).abs() < 1e-6 * (1.0 + g.wall_s));
            prop_assert!(g.goodput_fraction >= 0.0 && g.goodput_fraction <= 1.0 + 1e-9);
        }
    }
}
