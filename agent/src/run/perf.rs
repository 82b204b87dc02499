//! The node's performance edge: the `steps` records, the ranks' step times for straggler scores,
//! sharing them with node rank 0 and, there, the job's report. Scoring and rendering are pure
//! (`perf::straggler`); whether to act on a report is the supervisor's (`Event::Stragglers`).

use std::time::{Duration, Instant};

use crate::cli::config::StragglerPlan;
use crate::perf::straggler::{self, NodeSummary, RankTimes};
use crate::supervise::{AttemptSteps, Record};
use vigil_ipc::RankMsg;

/// `steps` records come at most this often while the attempt runs, and only when the steps moved.
const STEPS_EVERY: Duration = Duration::from_secs(10);

#[derive(Default)]
pub(super) struct StepsLog {
    last: Option<(u32, u64, u64)>,
    at: Option<Instant>,
}

/// A `steps` record due, and the time it stands for when that is not now (an attempt's last
/// record: when its step last moved).
pub(super) struct DueSteps {
    pub record: serde_json::Value,
    pub at: Option<Instant>,
}

impl StepsLog {
    /// The `steps` record due now, if any: this node's ranks' lowest and highest step in their
    /// attempt, and `step_s`, the ranks' median step time as they measure it (`step_timing`,
    /// `step` sections, else the time between steps). While the attempt runs, a record when the
    /// steps moved, at most every [`STEPS_EVERY`] (an attempt's first at once); once it ended
    /// here, its last steps at once, stamped with the time they were reached, so an attempt of
    /// any length has its first and last step.
    pub(super) fn due(
        &mut self,
        now: Instant,
        steps: Option<AttemptSteps>,
        step_s: Option<f64>,
    ) -> Option<DueSteps> {
        let st = steps?;
        let key = (st.attempt, st.min, st.max);
        // An attempt's first record comes at once, whatever the last one's time: it shows the
        // step the attempt resumed from.
        let same_attempt = self.last.is_some_and(|(c, _, _)| c == st.attempt);
        let throttled = st.running
            && same_attempt
            && self.at.is_some_and(|t| now.duration_since(t) < STEPS_EVERY);
        if self.last == Some(key) || throttled {
            return None;
        }
        self.last = Some(key);
        self.at = Some(now);
        let record = serde_json::to_value(Record::Steps {
            attempt: st.attempt,
            step: st.max,
            min_step: Some(st.min),
            step_s: step_s.filter(|s| s.is_finite() && *s > 0.0),
        })
        .ok()?;
        Some(DueSteps {
            record,
            at: (!st.running).then_some(st.at),
        })
    }
}

/// One local rank's step times and when its `--straggler-section` opened (other sections are
/// not kept: a rank may use any number of names).
struct RankFeed {
    times: RankTimes,
    open: Option<Instant>,
}

/// What a node shares with node rank 0 each time: its ranks' summary and, per global rank, what
/// its GPU was doing (`None` without GPU telemetry).
#[derive(serde::Serialize, serde::Deserialize)]
struct Shared {
    summary: NodeSummary,
    #[serde(default)]
    gpus: std::collections::BTreeMap<u32, String>,
}

/// A job-wide report, ready for the console, the event log and the supervisor.
pub(super) struct Report {
    pub text: String,
    pub record: serde_json::Value,
    /// Node ranks with a straggler.
    pub nodes: Vec<u32>,
}

/// The straggler side of a node: feeding step times, sharing summaries, node rank 0's report.
pub(super) struct Stragglers {
    plan: StragglerPlan,
    ranks: Vec<RankFeed>,
    next_share: Option<Instant>,
}

impl Stragglers {
    pub(super) fn new(plan: StragglerPlan, nproc: u32) -> Self {
        let ranks = (0..nproc)
            .map(|_| RankFeed {
                times: RankTimes::new(straggler::DEFAULT_WINDOW, &plan.section),
                open: None,
            })
            .collect();
        Stragglers {
            plan,
            ranks,
            next_share: None,
        }
    }

    /// A message from a rank of the current attempt.
    pub(super) fn on_msg(&mut self, now: Instant, local_rank: u32, msg: &RankMsg) {
        let Some(r) = self.ranks.get_mut(local_rank as usize) else {
            return;
        };
        match msg {
            RankMsg::StepTiming { step, duration_us } => {
                r.times.on_step_timing(*step, *duration_us as f64 / 1e6);
            }
            RankMsg::SectionStart { name } if *name == self.plan.section => {
                r.open = Some(now);
            }
            RankMsg::SectionEnd { name } => {
                if let Some(t) = r.open.take_if(|_| *name == self.plan.section) {
                    r.times
                        .on_section(name, now.saturating_duration_since(t).as_secs_f64());
                }
            }
            RankMsg::EndAllSections => r.open = None,
            RankMsg::Heartbeat { step: Some(step) } | RankMsg::Progress { step } => {
                r.times.on_step(*step, now);
            }
            _ => {}
        }
    }

    /// The ranks were started again: times across the restart are not step times.
    pub(super) fn new_attempt(&mut self) {
        for r in &mut self.ranks {
            r.times.new_attempt();
            r.open = None;
        }
    }

    /// This node's summary for node rank 0, when one is due (three times per report interval,
    /// so node rank 0's report is at most a third of an interval behind).
    pub(super) fn share_due(
        &mut self,
        now: Instant,
        node_rank: u32,
        host: &str,
        rank_offset: u32,
        gpu_of: &dyn Fn(u32) -> Option<String>,
    ) -> Option<Vec<u8>> {
        let next = *self.next_share.get_or_insert(now + self.plan.interval / 3);
        if now < next {
            return None;
        }
        self.next_share = Some(now + self.plan.interval / 3);
        if self.ranks.iter().all(|r| r.times.source().is_none()) {
            return None;
        }
        let summary = NodeSummary::from_ranks(
            node_rank,
            host,
            self.ranks
                .iter_mut()
                .enumerate()
                .map(|(lr, r)| (rank_offset + lr as u32, &mut r.times)),
        );
        let gpus = (0..self.ranks.len() as u32)
            .filter_map(|lr| gpu_of(lr).map(|g| (rank_offset + lr, g)))
            .collect();
        let shared = Shared { summary, gpus };
        serde_json::to_vec(&shared).ok()
    }

    /// The median step time of this node's slowest rank, as its ranks measure it (`None` before
    /// any sample).
    pub(super) fn step_s(&self) -> Option<f64> {
        self.ranks
            .iter()
            .filter_map(|r| r.times.median())
            .max_by(f64::total_cmp)
    }

    /// The threshold below which a rank is a straggler.
    pub(super) fn threshold(&self) -> f64 {
        self.plan.threshold
    }
}

/// Node rank 0: the job's report from every node's latest summary (`None`: nothing scored).
/// Blocking work (parsing and scoring every rank: about 0.3 s for 100,000), so the event loop runs
/// it on a blocking thread.
pub(super) fn report(threshold: f64, collected: &[(u32, Vec<u8>)]) -> Option<Report> {
    let t0 = Instant::now();
    let mut summaries = Vec::new();
    let mut gpus = std::collections::BTreeMap::new();
    for (_, bytes) in collected {
        let Ok(shared) = serde_json::from_slice::<Shared>(bytes) else {
            continue;
        };
        let Ok(summary) = shared.summary.checked() else {
            continue;
        };
        summaries.push(summary);
        gpus.extend(shared.gpus);
    }
    let scores = straggler::score_job(&summaries);
    if scores.ranks.is_empty() {
        return None;
    }
    let found = straggler::stragglers(&scores, threshold);
    let mut nodes: Vec<u32> = found.iter().map(|s| s.1).collect();
    nodes.sort_unstable();
    nodes.dedup();
    let mut record = straggler::report_record(&scores, threshold);
    let explain = |rank: u32| gpus.get(&rank).cloned();
    let text = straggler::render_report(
        &scores,
        straggler::DEFAULT_PRINTED,
        threshold,
        &explain,
        t0.elapsed().as_secs_f64(),
    );
    if let Some(o) = record.as_object_mut() {
        if !gpus.is_empty() {
            o.insert(
                "gpus".into(),
                serde_json::to_value(&gpus).unwrap_or_default(),
            );
        }
    }
    Some(Report {
        text,
        record,
        nodes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(attempt: u32, min: u64, max: u64, at: Instant, running: bool) -> Option<AttemptSteps> {
        Some(AttemptSteps {
            attempt,
            min,
            max,
            at,
            running,
        })
    }

    #[test]
    fn steps_are_logged_when_they_move_at_most_every_ten_seconds() {
        let t = Instant::now();
        let mut l = StepsLog::default();
        assert!(l.due(t, None, None).is_none());
        let first = l.due(t, at(0, 3, 5, t, true), Some(0.05)).unwrap();
        assert_eq!(first.record["step"], 5);
        assert_eq!(first.record["min_step"], 3);
        assert_eq!(first.record["step_s"], 0.05);
        assert!(first.at.is_none(), "stamped now");
        assert!(l
            .due(t + Duration::from_secs(1), at(0, 4, 6, t, true), None)
            .is_none());
        let later = t + STEPS_EVERY * 2;
        assert!(
            l.due(later, at(0, 3, 5, t, true), None).is_none(),
            "unchanged"
        );
        assert!(l.due(later, at(0, 4, 6, t, true), None).is_some());
    }

    #[test]
    fn an_attempt_that_ended_gets_its_last_steps_at_once_under_its_own_number() {
        let t = Instant::now();
        let mut l = StepsLog::default();
        l.due(t, at(0, 0, 1, t, true), None).unwrap();
        // 3 s later the attempt has stepped to 60 (throttled), and at 4 s it ended: its last
        // steps come at once, stamped when they were reached.
        let reached = t + Duration::from_secs(3);
        assert!(l.due(reached, at(0, 59, 60, reached, true), None).is_none());
        let end = t + Duration::from_secs(4);
        let last = l.due(end, at(0, 59, 60, reached, false), None).unwrap();
        assert_eq!(
            (
                last.record["cycle"].as_u64(),
                last.record["min_step"].as_u64()
            ),
            (Some(0), Some(59))
        );
        assert_eq!(last.at, Some(reached));
        // Only once: the back-off and the next rendezvous add nothing.
        assert!(l
            .due(
                end + Duration::from_secs(1),
                at(0, 59, 60, reached, false),
                None
            )
            .is_none());
        // The next attempt's first record is its own.
        let next = l
            .due(end + Duration::from_secs(2), at(1, 0, 0, end, true), None)
            .unwrap();
        assert_eq!(next.record["cycle"], 1);
    }
}
