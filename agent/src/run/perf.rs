//! The node's performance edge: the `steps` records, the ranks' step times for straggler scores,
//! sharing them with node rank 0 and, there, the job's report. Scoring and rendering are pure
//! (`perf::straggler`); whether to act on a report is the supervisor's (`Event::Stragglers`).

use super::*;

/// `steps` records come at most this often, and only when the steps moved.
const STEPS_EVERY: Duration = Duration::from_secs(10);

#[derive(Default)]
pub(super) struct StepsLog {
    last: Option<(u32, u64, u64)>,
    at: Option<Instant>,
}

impl StepsLog {
    /// The `steps` record due now, if any: this node's ranks' lowest and highest step.
    pub(super) fn due(
        &mut self,
        now: Instant,
        cycle: u32,
        range: Option<(u64, u64)>,
    ) -> Option<serde_json::Value> {
        let (lo, hi) = range?;
        if self.last == Some((cycle, lo, hi))
            || self.at.is_some_and(|t| now.duration_since(t) < STEPS_EVERY)
        {
            return None;
        }
        self.last = Some((cycle, lo, hi));
        self.at = Some(now);
        Some(serde_json::json!({"event": "steps", "cycle": cycle, "step": hi, "min_step": lo}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_logged_when_they_move_at_most_every_ten_seconds() {
        let t = Instant::now();
        let mut l = StepsLog::default();
        assert!(l.due(t, 0, None).is_none());
        let first = l.due(t, 0, Some((3, 5))).unwrap();
        assert_eq!(first["step"], 5);
        assert_eq!(first["min_step"], 3);
        assert!(l.due(t + Duration::from_secs(1), 0, Some((4, 6))).is_none());
        assert!(
            l.due(t + STEPS_EVERY * 2, 0, Some((3, 5))).is_none(),
            "unchanged"
        );
        assert!(l.due(t + STEPS_EVERY * 2, 0, Some((4, 6))).is_some());
    }
}
