//! The restart back-off policy: a pure function of the streak, how long the attempt ran and
//! whether it made progress.

use std::time::Duration;

/// The wait before a restart: none before the first of a streak, then `base`, doubling up to
/// `cap`. A streak is a run of attempts that failed without progress: an attempt that made
/// progress ([`super::progress::made_progress`]: a checkpoint past the last one where checkpoints
/// are known, else `--min-progress-steps` steps past the best) or ran at least `reset_after`
/// before it failed starts a new streak, so a job that keeps saving progress between failures,
/// or fails once a day, restarts at once every time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The second restart's wait; zero turns back-off off.
    pub base: Duration,
    pub cap: Duration,
    pub reset_after: Duration,
}

impl Backoff {
    pub const OFF: Backoff = Backoff {
        base: Duration::ZERO,
        cap: Duration::ZERO,
        reset_after: Duration::ZERO,
    };

    /// The wait before the restart that follows a failed attempt which ran for `ran` and made
    /// progress or not (`progressed`), given how many restarts came before it in the current
    /// streak; returns the wait and the streak after this restart. Every node computes it from
    /// job-wide facts (the attempt's verdict arrives everywhere at once; in a synchronous job
    /// every node's ranks reach the same steps), so the nodes wait alike; where their steps
    /// differ, the next rendezvous waits for the longest wait.
    pub fn next(&self, streak: u32, ran: Duration, progressed: bool) -> (Duration, u32) {
        let streak = if progressed || ran >= self.reset_after {
            0
        } else {
            streak
        };
        let wait = match streak {
            0 => Duration::ZERO,
            n => {
                let factor = 1u32 << (n - 1).min(31);
                self.base.saturating_mul(factor).min(self.cap)
            }
        };
        (wait, streak.saturating_add(1))
    }
}
