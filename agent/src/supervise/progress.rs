//! Progress, by the highest step each attempt (or allocation) reached: pure functions shared by the
//! supervisor (in-job attempts) and the requeue policy (allocations, `allocation::policy`).
//! With `--checkpoint-iteration-file` (NVRx's `TrainingProgressTracker`) an attempt reached the
//! file's value after it, measured from the value when the job started ([`FileReads`]).

/// `--min-progress-steps`'s default: a step or two of jitter around the same point (a job stopped
/// by its time limit at about the same step each time, because it never resumes from its
/// checkpoint) is not progress.
pub const DEFAULT_MIN_PROGRESS_STEPS: u64 = 10;

/// Whether each entry of `highest` (in order) made progress over the best before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    Made,
    None,
    /// No step was ever reported up to here.
    Unknown,
}

pub fn progress(highest: &[Option<u64>], min: u64) -> Vec<Progress> {
    let mut best: Option<u64> = None;
    highest
        .iter()
        .map(|h| {
            let p = match (best, *h) {
                (None, None) => Progress::Unknown,
                (None, Some(_)) => Progress::Made,
                (Some(_), None) => Progress::None,
                (Some(b), Some(h)) if h >= b.saturating_add(min) => Progress::Made,
                (Some(_), Some(_)) => Progress::None,
            };
            best = best.max(*h);
            p
        })
        .collect()
}

/// Entries without progress at the end of `highest`, counted back to the last with progress;
/// only the last `window` entries may count.
pub fn trailing_no_progress(highest: &[Option<u64>], min: u64, window: usize) -> usize {
    let p = progress(highest, min);
    let mut n = 0;
    for x in p.iter().rev().take(window) {
        match x {
            Progress::Made => break,
            Progress::None => n += 1,
            Progress::Unknown => {}
        }
    }
    n
}

/// In-job attempts: true when the last `n` attempts of this allocation (each one's highest
/// step, in order) made no progress of `min` steps over the best before them. `n == 0`: never.
pub fn attempt_no_progress(highest: &[Option<u64>], n: u32, min: u64) -> bool {
    n > 0 && trailing_no_progress(highest, min, highest.len()) >= n as usize
}

/// What an attempt reached (or the best of several): its highest step, and the step of its last
/// checkpoint where one is known (a rank closed a checkpoint section at that step, or
/// `--checkpoint-iteration-file` held it after the attempt).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reached {
    pub step: Option<u64>,
    pub saved: Option<u64>,
}

impl Reached {
    /// The best of both, field by field.
    pub fn max(self, other: Reached) -> Reached {
        Reached {
            step: self.step.max(other.step),
            saved: self.saved.max(other.saved),
        }
    }
}

/// Whether an attempt that reached `now` made progress over the best of the attempts before it
/// (`before`), for the restart back-off: where a checkpoint is known (now or before), it saved one
/// past the best saved before (steps redone after a restart are no progress until they are
/// saved); otherwise its highest step is at least `min` steps past the best before (the first
/// step ever reported is progress). `min` is `--min-progress-steps`, so a step or two of jitter
/// around the same point is not progress.
pub fn made_progress(before: Reached, now: Reached, min: u64) -> bool {
    if before.saved.is_some() || now.saved.is_some() {
        return now.saved > before.saved;
    }
    match (before.step, now.step) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(b), Some(h)) => h >= b.saturating_add(min.max(1)),
    }
}

/// The checkpoint iteration file, as NVRx's tracker reads it: once as the job starts (the
/// baseline: training resumes from that checkpoint) and again after each attempt.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileReads {
    pub baseline: Option<u64>,
    /// The last value read.
    pub latest: Option<u64>,
}

impl FileReads {
    pub fn read(&mut self, at_start: bool, iteration: Option<u64>) {
        if at_start {
            self.baseline = iteration;
        }
        self.latest = iteration;
    }

    /// NVRx's `should_terminate_early`: the last `n` attempts (each one's value in `per_attempt`)
    /// grew the file by less than `min` each, counted from the baseline. A file that was never
    /// there (or held 0) neither counts nor resets, as NVRx's "iterations not reported".
    pub fn no_progress(&self, per_attempt: &[Option<u64>], n: u32, min: u64) -> bool {
        let reported = |v: Option<u64>| v.filter(|&i| i > 0);
        let mut all = vec![reported(self.baseline)];
        all.extend(per_attempt.iter().map(|v| reported(*v)));
        // The baseline is no attempt: it only sets the level the first attempt must beat.
        n > 0 && trailing_no_progress(&all, min, per_attempt.len()) >= n as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reads(baseline: Option<u64>) -> FileReads {
        FileReads {
            baseline,
            latest: None,
        }
    }

    #[test]
    fn file_progress_counts_from_the_baseline_as_nvrx() {
        // Resumed at 100; the first attempt saved nothing new, nor the second: 2 attempts -> stop.
        let r = reads(Some(100));
        assert!(!r.no_progress(&[Some(100)], 2, 1));
        assert!(r.no_progress(&[Some(100), Some(100)], 2, 1));
        // A checkpoint in between resets the count.
        assert!(!r.no_progress(&[Some(100), Some(150), Some(150)], 2, 1));
        // min_progress_iterations: 40 more is not 50 more.
        assert!(r.no_progress(&[Some(140), Some(180)], 2, 50));
    }

    #[test]
    fn a_file_never_written_neither_counts_nor_resets() {
        let r = reads(None);
        assert!(!r.no_progress(&[None, None, None], 1, 1));
        let r = reads(Some(0));
        assert!(!r.no_progress(&[Some(0), Some(0)], 1, 1));
        // The first checkpoint is progress.
        assert!(!r.no_progress(&[None, Some(10)], 1, 1));
        assert!(r.no_progress(&[None, Some(10), Some(10)], 1, 1));
    }

    fn r(step: Option<u64>, saved: Option<u64>) -> Reached {
        Reached { step, saved }
    }

    #[test]
    fn progress_for_the_backoff_is_a_checkpoint_past_the_last_where_one_is_known() {
        // Steps past the best, but no checkpoint past the last one saved: no progress.
        assert!(!made_progress(
            r(Some(250), Some(200)),
            r(Some(290), Some(200)),
            10
        ));
        assert!(made_progress(
            r(Some(250), Some(200)),
            r(Some(260), Some(300)),
            10
        ));
        // The first checkpoint ever is progress; an attempt that saved none after one was is not.
        assert!(made_progress(
            r(Some(50), None),
            r(Some(120), Some(100)),
            10
        ));
        assert!(!made_progress(
            r(Some(250), Some(200)),
            r(Some(400), None),
            10
        ));
    }

    #[test]
    fn without_checkpoints_progress_is_min_steps_past_the_best() {
        assert!(made_progress(r(None, None), r(Some(3), None), 10));
        assert!(!made_progress(r(None, None), r(None, None), 10));
        // A step or two of jitter is not progress (field finding 40: 158..159, 159..160).
        assert!(!made_progress(r(Some(158), None), r(Some(159), None), 10));
        assert!(made_progress(r(Some(158), None), r(Some(168), None), 10));
        // min 0 or 1: any new step.
        assert!(made_progress(r(Some(158), None), r(Some(159), None), 0));
        assert!(!made_progress(r(Some(158), None), r(Some(158), None), 0));
    }

    #[test]
    fn zero_attempts_turn_it_off() {
        assert!(!reads(Some(5)).no_progress(&[Some(5), Some(5)], 0, 1));
    }

    #[test]
    fn the_baseline_is_the_latest_until_an_attempt_reads_again() {
        let mut r = FileReads::default();
        r.read(true, Some(7));
        r.read(false, Some(9));
        assert_eq!((r.baseline, r.latest), (Some(7), Some(9)));
    }
}
