//! The job's clock: monotonic time minus the time the agent itself was suspended, so a job that
//! was stopped (SIGSTOP, `scontrol suspend`) is never found hung for it.

use std::time::{Duration, Instant};

/// The loop wakes at least this often, so a longer gap means the agent itself was not running
/// (SIGSTOP, `scontrol suspend`, a frozen VM): that time is not counted against any rank.
pub(super) const CLOCK_TICK: Duration = Duration::from_millis(200);
pub(super) const SUSPEND_SLACK: Duration = Duration::from_millis(800);

/// Monotonic time minus the time the agent was suspended: the clock every timeout runs on.
pub(super) struct JobClock {
    pub(super) paused: Duration,
    pub(super) last_wake: Instant,
}

impl JobClock {
    pub(super) fn new() -> Self {
        JobClock {
            paused: Duration::ZERO,
            last_wake: Instant::now(),
        }
    }

    /// Called on every wake-up; returns the job time now and how long a suspension just ended, if any.
    pub(super) fn wake(&mut self) -> (Instant, Option<Duration>) {
        let now = Instant::now();
        let gap = now.saturating_duration_since(self.last_wake);
        self.last_wake = now;
        let mut suspended = None;
        if gap > CLOCK_TICK + SUSPEND_SLACK {
            let away = gap - CLOCK_TICK;
            self.paused += away;
            suspended = Some(away);
        }
        (now - self.paused, suspended)
    }

    pub(super) fn to_real(&self, job: Instant) -> Instant {
        job + self.paused
    }
}
