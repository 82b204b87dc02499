//! Step times: the spans between an attempt's `steps` records, the ideal step time and the
//! deviations from it, as ml-goodput-measurement defines them. Pure.

use super::{StepSample, StepStats, Timeline};

/// The step times of every attempt's spans between `steps` records, and the ideal step time.
pub(super) fn step_stats(t: &Timeline, notes: &mut Vec<String>) -> StepStats {
    let mut samples = Vec::new();
    for al in &t.allocations {
        for at in &al.attempts {
            for w in at.steps.windows(2) {
                let ((t0, s0), (t1, s1)) = (w[0], w[1]);
                if s1 > s0 && t1 > t0 {
                    samples.push(StepSample {
                        allocation: al.number,
                        attempt: at.attempt,
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
        return from_ranks(t, notes);
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

/// Without two `steps` records of one attempt, the step time the ranks measured themselves (each
/// attempt's `step_s`), when any record has it: the median of those is both the ideal and the
/// median step time.
fn from_ranks(t: &Timeline, notes: &mut Vec<String>) -> StepStats {
    let own: Vec<(f64, f64)> = t
        .allocations
        .iter()
        .flat_map(|al| al.attempts.iter())
        .filter_map(|at| at.step_s.map(|s| (s, 1.0)))
        .collect();
    let Some(m) = weighted_median(&own) else {
        notes.push(
            "no two `steps` records of one attempt and no step time from the ranks: no step time"
                .into(),
        );
        return StepStats::default();
    };
    notes.push(
        "no two `steps` records of one attempt: the step time is the ranks' own (`step_s`)".into(),
    );
    StepStats {
        ideal_step_time_s: Some(m),
        median_step_time_s: Some(m),
        ..StepStats::default()
    }
}
