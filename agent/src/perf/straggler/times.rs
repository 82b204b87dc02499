//! One rank's recent step times, fed by whichever source the rank uses.

use std::collections::VecDeque;
use std::time::Instant;

/// Where a rank's step times come from, best first. A rank's samples all come from one source: a
/// step timed twice (by `step_timing` and as a section) must not count twice, and the sources
/// measure slightly different spans. The best source the rank has used so far wins: when a better
/// one appears (a loop that calls `should_stop(step)` before its first `step_timing`), the samples
/// of the worse one are dropped and the better one is used from then on; a worse one is ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    /// `vigil.step_timing(step, seconds)` (`RankMsg::StepTiming`).
    StepTiming,
    /// The durations of the section named by `--straggler-section`.
    Section,
    /// The time between increases of the step the rank reports (`heartbeat(step)`, `Progress`).
    Progress,
}

/// A rank's last `window` step times (seconds) and the best (lowest) median it has had.
///
/// The best median is taken from the window's median each time the window has filled with
/// `window` new samples, and at [`RankTimes::close_interval`] (once per report interval) when
/// any sample arrived since the last time. So it is never above the median that
/// `close_interval` returns, and the individual score is at most 1.0.
#[derive(Clone, Debug)]
pub struct RankTimes {
    window: usize,
    section: String,
    source: Option<Source>,
    times: VecDeque<f64>,
    total: u64,
    since_best: usize,
    best: Option<f64>,
    last_step: Option<(u64, Instant)>,
}

impl RankTimes {
    /// `window` (at least 1; 0 is taken as 1) recent samples are kept; `section` is the section
    /// whose durations count as step times (`--straggler-section`, default `step`).
    pub fn new(window: usize, section: &str) -> Self {
        let window = window.max(1);
        RankTimes {
            window,
            section: section.to_owned(),
            source: None,
            times: VecDeque::with_capacity(window),
            total: 0,
            since_best: 0,
            best: None,
            last_step: None,
        }
    }

    /// A `StepTiming` message: step `_step` took `seconds`. Returns whether it was used.
    pub fn on_step_timing(&mut self, _step: u64, seconds: f64) -> bool {
        self.push(Source::StepTiming, seconds)
    }

    /// A section named `name` closed after `seconds`; used only for the configured section.
    pub fn on_section(&mut self, name: &str, seconds: f64) -> bool {
        name == self.section && self.push(Source::Section, seconds)
    }

    /// The rank reported `step` at `now`. When the step went up since the last report, the time
    /// since then divided by the increase is one sample (a rank that reports every 10th step
    /// still gives per-step times). A step that goes down (a restart from a checkpoint) starts
    /// again from there without a sample; the same step again is ignored.
    pub fn on_step(&mut self, step: u64, now: Instant) -> bool {
        if matches!(self.last_step, Some((s, _)) if s == step) {
            return false;
        }
        match self.last_step.replace((step, now)) {
            Some((s, t)) if step > s => {
                let secs = now.saturating_duration_since(t).as_secs_f64() / (step - s) as f64;
                self.push(Source::Progress, secs)
            }
            _ => false,
        }
    }

    /// A new attempt started (the ranks were restarted): the time across the restart is not a
    /// step time, so the next step report only sets the starting point. Samples and the best
    /// median stay: the GPU did not change.
    pub fn new_attempt(&mut self) {
        self.last_step = None;
    }

    fn push(&mut self, source: Source, seconds: f64) -> bool {
        if !(seconds.is_finite() && seconds > 0.0) {
            return false;
        }
        match self.source {
            Some(s) if s < source => return false,
            Some(s) if s == source => {}
            Some(_) => {
                // A better source: start over with it.
                self.times.clear();
                self.best = None;
                self.since_best = 0;
                self.source = Some(source);
            }
            None => self.source = Some(source),
        }
        if self.times.len() == self.window {
            self.times.pop_front();
        }
        self.times.push_back(seconds);
        self.total += 1;
        self.since_best += 1;
        if self.since_best >= self.window {
            self.update_best();
        }
        true
    }

    fn update_best(&mut self) {
        if let Some(m) = self.median() {
            self.best = Some(self.best.map_or(m, |b| b.min(m)));
        }
        self.since_best = 0;
    }

    /// Ends a report interval: the current median becomes a candidate for the best median if any
    /// sample arrived since the last candidate. Returns `(median, best median)`, None before the
    /// first sample.
    pub fn close_interval(&mut self) -> Option<(f64, f64)> {
        if self.since_best > 0 {
            self.update_best();
        }
        Some((self.median()?, self.best?))
    }

    /// Median of the window (mean of the middle two for an even count); None while empty.
    pub fn median(&self) -> Option<f64> {
        median(self.times.iter().copied())
    }

    /// The lowest median so far (see the type's doc for when it is taken).
    pub fn best_median(&self) -> Option<f64> {
        self.best
    }

    /// Samples in the window (what the median is over).
    pub fn samples(&self) -> usize {
        self.times.len()
    }

    /// Samples ever taken.
    pub fn total_samples(&self) -> u64 {
        self.total
    }

    /// The source this rank's samples come from, once it has one.
    pub fn source(&self) -> Option<Source> {
        self.source
    }
}

/// Median of `values` (mean of the middle two for an even count); None when empty.
pub fn median(values: impl Iterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = values.collect();
    let n = v.len();
    if n == 0 {
        return None;
    }
    let (_, mid, _) = v.select_nth_unstable_by(n / 2, f64::total_cmp);
    let hi = *mid;
    if n % 2 == 1 {
        return Some(hi);
    }
    // The lower middle is the largest of the values left of n/2.
    let lo = v[..n / 2].iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some((lo + hi) / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median([3.0, 1.0, 2.0].into_iter()), Some(2.0));
        assert_eq!(median([4.0, 1.0, 3.0, 2.0].into_iter()), Some(2.5));
        assert_eq!(median(std::iter::empty()), None);
    }

    #[test]
    fn the_window_keeps_the_last_samples() {
        let mut r = RankTimes::new(3, "step");
        for s in [10.0, 1.0, 2.0, 3.0] {
            assert!(r.on_step_timing(0, s));
        }
        assert_eq!(r.samples(), 3);
        assert_eq!(r.total_samples(), 4);
        assert_eq!(r.median(), Some(2.0));
    }

    #[test]
    fn the_best_source_wins_and_sources_never_mix() {
        let mut r = RankTimes::new(8, "step");
        let t0 = Instant::now();
        // Steps first (a loop that calls should_stop(step) before timing anything)...
        r.on_step(1, t0);
        assert!(r.on_step(2, t0 + Duration::from_secs(7)));
        assert_eq!(r.source(), Some(Source::Progress));
        // ...then a section: better, so the step intervals are dropped.
        assert!(r.on_section("step", 2.0));
        assert_eq!(r.source(), Some(Source::Section));
        assert_eq!(r.median(), Some(2.0));
        assert!(!r.on_step(3, t0 + Duration::from_secs(9)), "worse: ignored");
        assert!(!r.on_section("checkpointing", 9.0));
        // step_timing beats both.
        assert!(r.on_step_timing(1, 5.0));
        assert!(!r.on_section("step", 1.0));
        assert_eq!(r.source(), Some(Source::StepTiming));
        assert_eq!(r.median(), Some(5.0));
        assert_eq!(r.samples(), 1);
    }

    #[test]
    fn only_the_configured_section_counts() {
        let mut r = RankTimes::new(8, "train");
        assert!(!r.on_section("step", 1.0));
        assert!(r.on_section("train", 2.0));
        assert_eq!(r.median(), Some(2.0));
    }

    #[test]
    fn step_increases_give_per_step_times() {
        let mut r = RankTimes::new(8, "step");
        let t0 = Instant::now();
        assert!(!r.on_step(10, t0));
        assert!(!r.on_step(10, t0 + Duration::from_secs(1)));
        assert!(r.on_step(12, t0 + Duration::from_secs(3)));
        assert_eq!(r.median(), Some(1.5));
        // Back to a checkpoint's step: a new starting point, no sample.
        assert!(!r.on_step(5, t0 + Duration::from_secs(60)));
        assert!(r.on_step(6, t0 + Duration::from_secs(62)));
        assert_eq!(r.samples(), 2);
        assert_eq!(r.median(), Some(1.75));
        r.new_attempt();
        assert!(!r.on_step(7, t0 + Duration::from_secs(200)));
        assert_eq!(r.samples(), 2);
    }

    #[test]
    fn bad_durations_are_ignored() {
        let mut r = RankTimes::new(8, "step");
        for s in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(!r.on_step_timing(1, s));
        }
        assert_eq!(r.source(), None);
        assert_eq!(r.close_interval(), None);
    }

    #[test]
    fn best_median_from_full_windows_and_intervals() {
        let mut r = RankTimes::new(2, "step");
        r.on_step_timing(1, 1.0);
        assert_eq!(r.best_median(), None);
        r.on_step_timing(2, 1.0); // window full: candidate 1.0
        assert_eq!(r.best_median(), Some(1.0));
        r.on_step_timing(3, 3.0);
        assert_eq!(r.close_interval(), Some((2.0, 1.0)));
        r.on_step_timing(4, 3.0); // median 3.0 now; the best stays 1.0
        assert_eq!(r.close_interval(), Some((3.0, 1.0)));
        // No new sample: the same answer, no new candidate.
        assert_eq!(r.close_interval(), Some((3.0, 1.0)));
    }

    #[test]
    fn the_first_interval_sets_the_best() {
        let mut r = RankTimes::new(64, "step");
        r.on_step_timing(1, 2.0);
        assert_eq!(r.close_interval(), Some((2.0, 2.0)));
    }
}
