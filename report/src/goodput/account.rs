//! The accounting: the wall time cut into consecutive pieces, each given one category, from the
//! [`Timeline`]. Pure.

use super::steps::step_stats;
use super::{
    AllocationGoodput, Breakdown, Category, GenerationCost, GenerationSpan, Goodput, Timeline,
    CHECKPOINT_CAPPED_NOTE, CHECKPOINT_NOTE,
};

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

    /// [`Self::fill`], except that each of `gens` recovered in process is in-process recovery
    /// from its failure to every rank stepping again.
    fn fill_around(&mut self, alloc: usize, cat: Category, until: f64, gens: &[GenerationSpan]) {
        for g in gens {
            if let Some(stepping) = g.stepping_at.filter(|_| g.failed_at < until) {
                self.fill(alloc, cat, g.failed_at);
                self.fill(alloc, Category::InProcessRecovery, stepping.min(until));
            }
        }
        self.fill(alloc, cat, until);
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
pub(super) fn merged_saves(t: &Timeline) -> Vec<(f64, f64)> {
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
pub(super) fn time_of_step(steps: &[(f64, u64)], step: u64) -> Option<f64> {
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
pub(super) fn resumed_from(t: &Timeline, a: usize, i: usize) -> Option<u64> {
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
    let generations = generation_costs(t);
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
        generations,
        notes,
    }
}

/// What each in-process restart cost: the time from its failure to every rank stepping again
/// and no step, or, when the whole job restarted instead, the steps since the one it went on
/// from.
fn generation_costs(t: &Timeline) -> Vec<GenerationCost> {
    let mut out = Vec::new();
    for (ai, al) in t.allocations.iter().enumerate() {
        for (i, at) in al.attempts.iter().enumerate() {
            let highest = at.steps.iter().map(|s| s.1).max();
            for g in &at.generations {
                let recovery_s = g.stepping_at.map(|s| (s - g.failed_at).max(0.0));
                let steps_lost = if recovery_s.is_some() {
                    Some(0)
                } else {
                    let reached = highest.max(g.step);
                    resumed_from(t, ai, i)
                        .zip(reached)
                        .map(|(r, h)| h.saturating_sub(r))
                };
                out.push(GenerationCost {
                    allocation: al.number,
                    attempt: at.attempt,
                    generation: g.generation,
                    ranks: g.ranks.clone(),
                    step: g.step,
                    recovery_s,
                    steps_lost,
                });
            }
        }
    }
    out
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
        let gens = &at.generations;
        // Step time up to the step the job went on from was kept; beyond it, done again.
        let kept_until = match resumed {
            Some(r) if r <= s_last => time_of_step(&at.steps, r.max(s_first)).unwrap_or(t_last),
            _ => t_last,
        };
        cut.fill_around(ai, Category::Goodput, kept_until, gens);
        cut.fill_around(ai, Category::LostProgress, t_last, gens);
        match at.failed_at {
            Some(f) => {
                // Unrecorded steps before the failure: kept only if the job went on past them.
                let tail = if resumed.is_some_and(|r| r > s_last) {
                    Category::Goodput
                } else {
                    Category::LostProgress
                };
                cut.fill_around(ai, tail, f, gens);
                cut.fill(ai, Category::FailureHandling, at.end);
            }
            None if i + 1 == n => {
                // The last attempt's steps after its last record, up to the allocation's highest
                // step at the attempt's own pace (from its records, else the ranks' step time);
                // then saving, exiting: other.
                let pace = (s_last > s_first)
                    .then(|| (t_last - t_first) / (s_last - s_first) as f64)
                    .or(at.step_s);
                if let (Some(p), Some(fin)) = (pace, al.final_step.filter(|f| *f > s_last)) {
                    let until = t_last + p * (fin - s_last) as f64;
                    cut.fill_around(ai, Category::Goodput, until, gens);
                }
                cut.fill_around(ai, Category::Other, at.end, gens);
            }
            None => cut.fill_around(ai, Category::Other, at.end, gens),
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
