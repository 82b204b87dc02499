//! How long before the allocation's end the ranks are asked to stop.
//!
//! The lead is calculated, not guessed: the longest `checkpointing` section observed plus the
//! time to reach the stop step, times the safety factor, never less than `--stop-lead` (the floor,
//! and the whole lead before anything was observed).

use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};

use crate::values::MAX_SECONDS;

/// `max(floor, factor * (longest_checkpoint + margin_steps * step_time))`; an unknown part counts
/// as zero. Capped at a year, so a wild observation cannot overflow the arithmetic.
pub fn stop_lead(
    floor: Duration,
    safety_factor: f64,
    longest_checkpoint: Option<Duration>,
    step_time: Option<Duration>,
    margin_steps: u32,
) -> Duration {
    let observed = longest_checkpoint.unwrap_or_default().as_secs_f64()
        + f64::from(margin_steps) * step_time.unwrap_or_default().as_secs_f64();
    let factor = if safety_factor.is_finite() && safety_factor > 0.0 {
        safety_factor
    } else {
        1.0
    };
    let secs = (factor * observed).min(MAX_SECONDS);
    floor
        .max(Duration::from_secs_f64(secs))
        .min(Duration::from_secs_f64(MAX_SECONDS))
}

/// The lead that leaves the allocation (`span`, from the agent's start to the end) a useful
/// part, half of it, to train in: `Some(half)` when `lead` is longer. A lead as long as the
/// allocation would ask the ranks to stop before their first step, in every allocation.
pub fn cap(lead: Duration, span: Duration) -> Option<Duration> {
    let half = span / 2;
    (lead > half).then_some(half)
}

/// What the lead is calculated from, kept in the job's state directory beside the calculated
/// timeouts so the next allocation starts with it. Seconds; `None` until observed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Observed {
    #[serde(default)]
    pub longest_checkpoint_s: Option<f64>,
    #[serde(default)]
    pub step_time_s: Option<f64>,
}

impl Observed {
    /// The longer of each: a lead only grows with what any allocation saw.
    pub fn merge(&self, other: &Observed) -> Observed {
        let max = |a: Option<f64>, b: Option<f64>| match (clean(a), clean(b)) {
            (Some(x), Some(y)) => Some(x.max(y)),
            (x, y) => x.or(y),
        };
        Observed {
            longest_checkpoint_s: max(self.longest_checkpoint_s, other.longest_checkpoint_s),
            step_time_s: max(self.step_time_s, other.step_time_s),
        }
    }

    /// [`stop_lead`] from these observations; values that are not a duration (a hand-edited
    /// file: negative, not finite, beyond a year) count as unobserved.
    pub fn lead(&self, floor: Duration, safety_factor: f64, margin_steps: u32) -> Duration {
        let d = |x: Option<f64>| clean(x).map(Duration::from_secs_f64);
        stop_lead(
            floor,
            safety_factor,
            d(self.longest_checkpoint_s),
            d(self.step_time_s),
            margin_steps,
        )
    }
}

fn clean(x: Option<f64>) -> Option<f64> {
    x.filter(|v| v.is_finite() && *v >= 0.0 && *v <= MAX_SECONDS)
}

/// How long from `now_wall` until the ranks must be asked to stop: zero when that is already due.
pub fn until_stop(end: SystemTime, lead: Duration, now_wall: SystemTime) -> Duration {
    end.checked_sub(lead)
        .and_then(|at| at.duration_since(now_wall).ok())
        .unwrap_or_default()
}

/// The instant (on the monotonic clock read as `now` at the same moment as `now_wall`) at which
/// to ask the ranks to stop so that a checkpoint taking `lead` ends by `end`.
pub fn when_to_stop(
    end: SystemTime,
    lead: Duration,
    now_wall: SystemTime,
    now: Instant,
) -> Instant {
    let wait = until_stop(end, lead, now_wall);
    now.checked_add(wait).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn s(x: f64) -> Duration {
        Duration::from_secs_f64(x)
    }

    #[test]
    fn the_floor_rules_until_something_was_observed() {
        assert_eq!(stop_lead(s(60.0), 5.0, None, None, 2), s(60.0));
        assert_eq!(stop_lead(s(60.0), 5.0, Some(s(4.0)), None, 2), s(60.0));
        assert_eq!(stop_lead(s(60.0), 5.0, None, Some(s(1.0)), 2), s(60.0));
    }

    #[test]
    fn an_observed_checkpoint_and_steps_raise_the_lead() {
        // 5 x (30 s checkpoint + 2 steps of 3 s) = 180 s.
        assert_eq!(
            stop_lead(s(60.0), 5.0, Some(s(30.0)), Some(s(3.0)), 2),
            s(180.0)
        );
        // No margin steps: only the checkpoint counts.
        assert_eq!(
            stop_lead(s(60.0), 2.0, Some(s(40.0)), Some(s(3.0)), 0),
            s(80.0)
        );
    }

    #[test]
    fn absurd_inputs_are_bounded_not_a_panic() {
        let year = s(MAX_SECONDS);
        assert_eq!(
            stop_lead(s(1.0), 1e300, Some(s(1e9)), Some(s(1e9)), u32::MAX),
            year
        );
        assert_eq!(stop_lead(s(1.0), f64::NAN, Some(s(10.0)), None, 0), s(10.0));
        assert_eq!(stop_lead(s(1.0), -3.0, Some(s(10.0)), None, 0), s(10.0));
        assert_eq!(stop_lead(Duration::MAX, 1.0, None, None, 0), year);
    }

    #[test]
    fn the_stop_comes_lead_before_the_end() {
        let now_wall = SystemTime::UNIX_EPOCH + s(1000.0);
        let now = Instant::now();
        let end = now_wall + s(600.0);
        assert_eq!(until_stop(end, s(60.0), now_wall), s(540.0));
        assert_eq!(when_to_stop(end, s(60.0), now_wall, now), now + s(540.0));
        // Already due, or the end already passed: at once.
        assert_eq!(when_to_stop(end, s(600.0), now_wall, now), now);
        assert_eq!(when_to_stop(end, s(900.0), now_wall, now), now);
        assert_eq!(when_to_stop(now_wall - s(5.0), s(1.0), now_wall, now), now);
        assert_eq!(when_to_stop(end, Duration::MAX, now_wall, now), now);
    }

    #[test]
    fn a_lead_past_half_the_allocation_is_capped_at_half() {
        assert_eq!(cap(s(20.0), s(60.0)), None);
        assert_eq!(cap(s(30.0), s(60.0)), None);
        assert_eq!(cap(s(60.0), s(60.0)), Some(s(30.0)));
        assert_eq!(cap(s(60.0), s(40.0)), Some(s(20.0)));
        assert_eq!(cap(s(1.0), Duration::ZERO), Some(Duration::ZERO));
    }

    #[test]
    fn observations_merge_to_the_longest_and_bad_values_count_as_unseen() {
        let a = Observed {
            longest_checkpoint_s: Some(30.0),
            step_time_s: None,
        };
        let b = Observed {
            longest_checkpoint_s: Some(f64::NAN),
            step_time_s: Some(2.0),
        };
        let m = a.merge(&b);
        assert_eq!(m.longest_checkpoint_s, Some(30.0));
        assert_eq!(m.step_time_s, Some(2.0));
        // 5 x (30 + 2 x 2) = 170 s.
        assert_eq!(m.lead(s(60.0), 5.0, 2), s(170.0));
        let wild = Observed {
            longest_checkpoint_s: Some(-4.0),
            step_time_s: Some(1e300),
        };
        assert_eq!(wild.lead(s(60.0), 5.0, 2), s(60.0));
        let text = serde_json::to_string(&m).unwrap();
        assert_eq!(text, r#"{"longest_checkpoint_s":30.0,"step_time_s":2.0}"#);
        assert_eq!(
            serde_json::from_str::<Observed>("{}").unwrap(),
            Observed::default()
        );
    }

    proptest! {
        #[test]
        fn the_lead_is_at_least_the_floor_and_grows_with_what_was_seen(
            floor in 0.0f64..600.0, f in 1.0f64..20.0, ck in 0.0f64..3600.0,
            st in 0.0f64..60.0, m in 0u32..8, more in 0.0f64..100.0,
        ) {
            let a = stop_lead(s(floor), f, Some(s(ck)), Some(s(st)), m);
            let b = stop_lead(s(floor), f, Some(s(ck + more)), Some(s(st)), m);
            prop_assert!(a >= s(floor));
            prop_assert!(b >= a);
        }
    }
}
