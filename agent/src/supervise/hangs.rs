//! Hang verdicts: which rank is hung first, asking the runtime which ranks are stopped, naming the
//! root cause, and the diagnosis (stacks) before the stop.
//!
//! `HangWatch` (`machines.rs`) is the attempt's hang state machine: watching, then probing (the runtime looks
//! which ranks are stopped), then diagnosing one rank (its stacks are taken), then concluding (the
//! rank is terminated and the attempt stops). Once a hang was seen, nothing more is calculated in
//! the attempt. The functions below pick the ranks from the parts they are given (the attempt,
//! the timeouts in force) and turn each step into actions; the supervisor's methods hand them
//! those parts, and stop the attempt when a hang is concluded.

use std::time::{Duration, Instant};

use super::events::{Action, Failure, Hang, Record, StopReason, SIGTERM};
use super::monitor::{Due, RankMonitor, Timeouts};
use super::phase::{Phase, RankState};
use super::state::{Attempt, HangStep};
use super::Supervisor;

/// The running rank of `attempt` that will be hung first under the timeouts `in_force`, and when.
pub(super) fn earliest_hang(
    current: &Attempt,
    in_force: &Timeouts,
    warmup_steps: u32,
) -> Option<(u32, Due)> {
    current
        .ranks
        .iter()
        .enumerate()
        .filter(|(_, r)| r.running())
        .filter_map(|(i, r)| {
            r.monitor
                .as_ref()?
                .deadline(in_force, warmup_steps)
                .map(|d| (i as u32, d))
        })
        .min_by_key(|(_, d)| d.at)
}

/// The rank to declare hung when `due_rank`'s timeout ran out: a running rank whose process
/// is stopped, if any (the one silent longest), since ranks waiting on a frozen one (in a
/// barrier, a collective) go silent too and may run out first. Returns the rank, its own
/// timeout if it has one (else `due`'s), and whether it is stopped.
pub(super) fn root_of_hang(
    current: &Attempt,
    in_force: &Timeouts,
    warmup_steps: u32,
    (due_rank, due): (u32, Due),
    stopped: &[u32],
) -> (u32, Due, bool) {
    if stopped.contains(&due_rank) {
        return (due_rank, due, true);
    }
    let ranks = &current.ranks;
    let frozen = stopped
        .iter()
        .filter(|lr| ranks.get(**lr as usize).is_some_and(|r| r.running()))
        .map(|lr| {
            let own = ranks[*lr as usize]
                .monitor
                .as_ref()
                .and_then(|m| m.deadline(in_force, warmup_steps));
            (*lr, own)
        })
        .min_by_key(|(lr, own)| (own.is_none(), own.as_ref().map(|d| d.since), *lr));
    match frozen {
        Some((lr, own)) => (lr, own.unwrap_or(due), true),
        None => (due_rank, due, false),
    }
}

/// Declares `local_rank` of attempt `attempt` hung (`due`: its timeout; `stopped`: its process is):
/// every rank's watch freezes, the record, and its stacks are taken, for `stack_wait` at most.
pub(super) fn begin_diagnosis(
    current: &mut Attempt,
    (attempt, rank_offset): (u32, u32),
    stack_wait: Duration,
    now: Instant,
    (local_rank, due, stopped): (u32, Due, bool),
    out: &mut Vec<Action>,
) {
    let Some(pid) = current.ranks[local_rank as usize].pid else {
        return;
    };
    for m in current.ranks.iter_mut().filter_map(|r| r.monitor.as_mut()) {
        m.freeze();
    }
    let hang = Hang {
        timeout: due.kind.clone(),
        limit_ms: due.limit.as_millis() as u64,
        silent_ms: now.saturating_duration_since(due.since).as_millis() as u64,
        stopped,
    };
    out.push(Action::Record(Record::Hang {
        attempt,
        local_rank,
        rank: rank_offset + local_rank,
        pid,
        hang: hang.clone(),
    }));
    out.push(Action::CaptureStacks {
        local_rank,
        pid,
        via_shim: current.ranks[local_rank as usize]
            .monitor
            .as_ref()
            .is_some_and(RankMonitor::registered),
    });
    current.hangs.begin(local_rank, hang, now + stack_wait);
}

impl Supervisor {
    /// The running rank that will be hung first, and when.
    pub(super) fn earliest_hang(&self) -> Option<(u32, Due)> {
        earliest_hang(
            &self.current,
            &self.timeouts.in_force,
            self.cfg.warmup_steps,
        )
    }

    pub(super) fn on_stacks_captured(
        &mut self,
        now: Instant,
        local_rank: u32,
        out: &mut Vec<Action>,
    ) {
        if self.current.hangs.diagnosing(local_rank) {
            self.conclude_hang(now, out);
        }
    }

    /// A tick while ranks run: a diagnosis whose wait is over ends; a hang that is due makes the
    /// runtime look which ranks are stopped before anything is declared.
    pub(super) fn hang_tick(&mut self, now: Instant, out: &mut Vec<Action>) {
        let due = self.earliest_hang().map(|(_, d)| d.at);
        match self.current.hangs.tick(now, due) {
            HangStep::Conclude => self.conclude_hang(now, out),
            HangStep::Probe => {
                let ranks = self
                    .current
                    .ranks
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| r.running())
                    .filter_map(|(i, r)| Some((i as u32, r.pid?)))
                    .collect();
                out.push(Action::ProbeStopped { ranks });
            }
            HangStep::Nothing => {}
        }
    }

    pub(super) fn on_probed(&mut self, now: Instant, stopped: Vec<u32>, out: &mut Vec<Action>) {
        if self.current.hangs.probed() && self.phase == Phase::Running {
            // Still due? A message may have come in while the runtime looked.
            if let Some(due) = self.earliest_hang().filter(|(_, d)| now >= d.at) {
                let (in_force, warmup) = (&self.timeouts.in_force, self.cfg.warmup_steps);
                let hung = root_of_hang(&self.current, in_force, warmup, due, &stopped);
                let at = (self.attempt, self.job.placement.rank_offset);
                begin_diagnosis(&mut self.current, at, self.cfg.stack_wait, now, hung, out);
            }
        }
    }

    /// The hung rank's stacks are taken (or the wait is over): terminate it and stop the attempt.
    pub(super) fn conclude_hang(&mut self, now: Instant, out: &mut Vec<Action>) {
        let Some((local_rank, hang)) = self.current.hangs.conclude() else {
            return;
        };
        let r = &self.current.ranks[local_rank as usize];
        let (Some(pid), RankState::Running) = (r.pid, r.state) else {
            return;
        };
        if self.may_replace(local_rank, out) {
            // Its exit replaces it (`replace`).
            return self.kill_for_replacement(pid, out);
        }
        let rank = self.job.placement.rank_offset + local_rank;
        self.current.failures.push(Failure {
            attempt: self.attempt,
            local_rank,
            rank,
            pid,
            how: None,
            hang: Some(hang.clone()),
            at: now,
        });
        let term = self.cfg.termination_signal;
        self.begin_stop_except(now, StopReason::RankHung, SIGTERM, Some((pid, term)), out);
        self.report_failure(hang.reason(rank), out);
    }
}
