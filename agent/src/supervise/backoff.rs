//! The restart back-off policy: a pure function of the streak and how long the attempt ran.

use std::time::Duration;

/// The wait before a restart: none before the first of a streak, then `base`, doubling up to
/// `cap`. An attempt that ran at least `reset_after` before it failed starts a new streak, so a
/// job that fails once a day restarts at once every time.
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

    /// The wait before the restart that follows a failed attempt which ran for `ran`, given how
    /// many restarts came before it in the current streak; returns the wait and the streak after
    /// this restart. Every node computes it from the same job-wide facts (the attempt's verdict
    /// arrives everywhere at once), so every node waits alike.
    pub fn next(&self, streak: u32, ran: Duration) -> (Duration, u32) {
        let streak = if ran >= self.reset_after { 0 } else { streak };
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
