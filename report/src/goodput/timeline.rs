//! The [`Timeline`] goodput is computed from, drawn from a [`History`] (the ledger and the event
//! logs): allocations, and each attempt job-wide.

use super::{compute, AllocationSpan, AttemptSpan, GenerationSpan, Goodput, Timeline};
use crate::history::History;
use crate::history::{GenerationKind, NodeRun};

/// The timeline of a history: its allocations (ledger records, else inferred from the runs),
/// each attempt job-wide.
pub fn timeline(h: &History) -> Timeline {
    timeline_at(h, None)
}

/// [`timeline`] while the job runs: an allocation still running (no ledger record, and a node run
/// without its `result`) lasts until `now` (seconds since the epoch), not only until its last
/// record, so a job's wall time a second into it is a second.
pub fn timeline_at(h: &History, now: Option<f64>) -> Timeline {
    let mut allocations = Vec::new();
    for a in &h.allocations {
        let runs: Vec<&crate::NodeRun> = a.runs.iter().filter_map(|&i| h.runs.get(i)).collect();
        let running = a.end.is_none() && runs.iter().any(|r| r.result.is_none());
        let run_end = runs
            .iter()
            .map(|r| r.end)
            .chain(now.filter(|_| running))
            .fold(a.start, f64::max);
        let end = a.end.unwrap_or(run_end).max(a.start);
        let mut attempts: Vec<u32> = runs
            .iter()
            .flat_map(|r| r.attempts.iter().map(|x| x.attempt))
            .collect();
        attempts.sort_unstable();
        attempts.dedup();
        let mut attempts: Vec<AttemptSpan> =
            attempts.iter().map(|&c| attempt_span(&runs, c)).collect();
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

/// Attempt `attempt` across the allocation's node runs.
fn attempt_span(runs: &[&crate::NodeRun], attempt: u32) -> AttemptSpan {
    let mine = || {
        runs.iter()
            .flat_map(|r| r.attempts.iter().filter(move |a| a.attempt == attempt))
    };
    let start = mine().map(|a| a.start).fold(f64::INFINITY, f64::min);
    let end = mine().map(|a| a.end).fold(f64::NEG_INFINITY, f64::max);
    let failed = mine().any(|a| a.end_kind.as_deref() == Some("failed"));
    let mut failures: Vec<(f64, Option<u32>)> = runs
        .iter()
        .flat_map(|r| {
            r.failures
                .iter()
                .filter(|f| f.attempt == attempt)
                .map(|f| (f.ts, f.rank))
        })
        .chain(runs.iter().flat_map(|r| {
            r.hangs
                .iter()
                .filter(|h| h.attempt == attempt)
                .map(|h| (h.ts - h.silent_ms.unwrap_or(0) as f64 / 1000.0, h.rank))
        }))
        .collect();
    // A failure recovered in process is its generation's, not the attempt's.
    let generations = generation_spans(runs, attempt, &mut failures);
    let failure = failures.iter().map(|f| f.0).fold(f64::INFINITY, f64::min);
    // Only records from the attempt's start on: an older vigil wrote one during the back-off
    // before an attempt, under its number, with the last attempt's step.
    let node = runs
        .iter()
        .filter(|r| {
            r.steps
                .iter()
                .any(|s| s.attempt == attempt && s.ts >= start)
        })
        .min_by_key(|r| r.node_rank);
    let records = || {
        node.into_iter()
            .flat_map(|r| r.steps.iter())
            .filter(|s| s.attempt == attempt && s.ts >= start)
    };
    let mut steps: Vec<(f64, u64)> = records()
        .map(|s| (s.ts, s.min_step.unwrap_or(s.step)))
        .collect();
    // In time order (an attempt's last record carries the time its steps were reached).
    steps.sort_by(|a, b| a.0.total_cmp(&b.0));
    let step_s = records().filter_map(|s| s.step_s).next_back();
    let last_step = steps.last().map_or(start, |s| s.0);
    let failed_at = (failed || failure.is_finite()).then(|| {
        let f = if failure.is_finite() { failure } else { end };
        f.max(last_step).min(end)
    });
    let saves = || {
        runs.iter()
            .flat_map(|r| r.saves.iter().filter(|s| s.attempt == attempt))
    };
    AttemptSpan {
        attempt,
        start,
        end,
        failed_at,
        steps,
        saves: saves().map(|s| (s.ts - s.seconds, s.ts)).collect(),
        saves_incomplete: saves().any(|s| s.last_recorded),
        step_s,
        generations,
    }
}

/// Attempt `attempt`'s in-process restarts, job-wide: each begins at the earliest `generation`
/// record of any node, and its ranks step again once every node that recorded it recorded
/// `generation_stepping`. Its failure is the earliest of `failures` (time, global rank) of a
/// replaced rank since the last generation began; when the generation was recovered, that
/// failure is taken out of `failures`.
fn generation_spans(
    runs: &[&NodeRun],
    attempt: u32,
    failures: &mut Vec<(f64, Option<u32>)>,
) -> Vec<GenerationSpan> {
    let marks = || {
        runs.iter().flat_map(move |r| {
            r.gen_marks
                .iter()
                .filter(move |m| m.attempt == attempt)
                .map(move |m| (r.node_rank, m))
        })
    };
    let mut numbers: Vec<u64> = marks().map(|(_, m)| m.generation).collect();
    numbers.sort_unstable();
    numbers.dedup();
    let mut out: Vec<GenerationSpan> = Vec::new();
    let mut since = f64::NEG_INFINITY;
    for g in numbers {
        let mut span = GenerationSpan {
            generation: g,
            failed_at: f64::INFINITY,
            ..GenerationSpan::default()
        };
        let (mut began_on, mut stepping_on) = (Vec::new(), Vec::new());
        let mut stepping = f64::NEG_INFINITY;
        for (node, m) in marks().filter(|(_, m)| m.generation == g) {
            match &m.kind {
                GenerationKind::Began { ranks, step } => {
                    if m.ts < span.failed_at {
                        span.failed_at = m.ts;
                        span.ranks = ranks.clone();
                    }
                    span.step = span.step.max(*step);
                    began_on.push(node);
                }
                GenerationKind::Stepping => {
                    stepping = stepping.max(m.ts);
                    stepping_on.push(node);
                }
            }
        }
        if !span.failed_at.is_finite() {
            continue; // only `generation_stepping` records: an older log's leftovers
        }
        let began = span.failed_at;
        span.stepping_at = began_on
            .iter()
            .all(|n| stepping_on.contains(n))
            .then_some(stepping)
            .filter(|s| s.is_finite());
        let theirs = |f: &(f64, Option<u32>)| {
            f.0 > since && f.0 <= began && f.1.is_none_or(|r| span.ranks.contains(&r))
        };
        if let Some(f) = failures
            .iter()
            .filter(|f| theirs(f))
            .map(|f| f.0)
            .reduce(f64::min)
        {
            span.failed_at = f;
        }
        if span.stepping_at.is_some() {
            failures.retain(|f| !theirs(f));
        }
        since = began;
        out.push(span);
    }
    out
}

/// The goodput of the job whose records are below `dir`.
pub fn of_history(h: &History) -> Goodput {
    compute(&timeline(h))
}

/// The goodput of a job that may still run, at `now` ([`timeline_at`]).
pub fn of_history_at(h: &History, now: f64) -> Goodput {
    compute(&timeline_at(h, Some(now)))
}
