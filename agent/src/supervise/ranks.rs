//! Ranks and attempts: starting an attempt's ranks, and what a rank's start, failure to start,
//! exit or lost connection means.
//!
//! Each is a free function of the parts it touches (the attempt, the phase, the attempt's number
//! and rank offset, how the job ends): [`on_spawned`], [`spawn_failed`], [`on_disconnected`],
//! [`start_attempt`], [`reaped`]. The supervisor's methods are their call sites where the concern
//! goes on to stop the attempt (`begin_stop`) or to report this node's end (`report_failure`,
//! `stop_for_good`), and where the attempt under way is replaced (`start_attempt`).

use std::time::Instant;

use super::events::{exit_phrase, Action, ExitKind, Failure, JobEnd, Record, StopReason};
use super::events::{SIGKILL, SIGTERM};
use super::monitor::RankMonitor;
use super::state::{Attempt, Ending, JobState, Phase, RankState};
use super::{verdict, Supervisor};

impl Supervisor {
    /// Local rank `local_rank` could not start: [`spawn_failed`], then the attempt stops and this
    /// node stops the job for good.
    pub(super) fn on_spawn_failed(
        &mut self,
        now: Instant,
        local_rank: u32,
        error: String,
        out: &mut Vec<Action>,
    ) {
        let ending = &mut self.job.ending;
        if !spawn_failed(
            &mut self.current,
            ending,
            self.attempt,
            (local_rank, &error),
            out,
        ) {
            return;
        }
        let rank = self.job.placement.rank_offset + local_rank;
        self.begin_stop(now, StopReason::SpawnFailed, SIGTERM, out);
        self.stop_for_good(format!("rank {rank} could not start: {error}"), 2, out);
    }

    /// Attempt `attempt` starts: a fresh [`Attempt`] replaces the last one, whole ([`start_attempt`]).
    pub(super) fn start_attempt(&mut self, now: Instant, attempt: u32) -> Vec<Action> {
        let (current, actions) = start_attempt(&self.job, self.cfg.nproc, now, attempt);
        self.attempt = attempt;
        self.phase = Phase::Running;
        self.current = current;
        self.gens.new_attempt(self.cfg.nproc);
        actions
    }

    /// A rank leader was reaped: [`reaped`]; a rank that failed stops the attempt, and this node
    /// reports the failure.
    pub(super) fn on_reaped(
        &mut self,
        now: Instant,
        pid: i32,
        how: ExitKind,
        out: &mut Vec<Action>,
    ) {
        let at = (self.attempt, self.job.placement.rank_offset);
        let Some(rank) = reaped(&mut self.current, &self.phase, at, now, (pid, how), out) else {
            return;
        };
        let local_rank = rank - self.job.placement.rank_offset;
        if self.may_replace(local_rank, out) {
            return self.gen_parts().replace(now, local_rank, pid, out);
        }
        self.begin_stop(now, StopReason::RankFailed, SIGTERM, out);
        self.report_failure(format!("rank {rank} {}", exit_phrase(how)), out);
    }

    /// Tells the other nodes that this attempt failed here, once per attempt.
    pub(super) fn report_failure(&mut self, reason: String, out: &mut Vec<Action>) {
        let node = self.cfg.node_rank;
        verdict::report(
            &mut self.current,
            self.attempt,
            JobEnd::Failed { node, reason },
            out,
        );
    }
}

/// Local rank `local_rank` of attempt `attempt` (global ranks from `rank_offset`) started as `pid`
/// at `now`. A stop that began (in `phase`) while the group was being spawned reaches it too.
pub(super) fn on_spawned(
    current: &mut Attempt,
    phase: &Phase,
    (attempt, rank_offset): (u32, u32),
    now: Instant,
    (local_rank, pid): (u32, i32),
    out: &mut Vec<Action>,
) {
    let Some(r) = current.ranks.get_mut(local_rank as usize) else {
        return;
    };
    r.pid = Some(pid);
    r.state = RankState::Running;
    r.monitor = Some(RankMonitor::new(now));
    out.push(Action::Record(Record::RankStarted {
        attempt,
        local_rank,
        rank: rank_offset + local_rank,
        pid,
    }));
    // A stop that began while the group was being spawned must reach this rank too.
    if let Phase::Stopping { killed, .. } = *phase {
        let signal = if killed { SIGKILL } else { SIGTERM };
        out.push(Action::SignalGroups {
            pgids: vec![pid],
            signal,
        });
    }
}

/// Local rank `local_rank` of attempt `attempt` could not start (`error`): it and every rank not
/// started yet are marked so (the runtime starts no further rank), and the first such error is
/// kept in how the job ends. Whether the rank is one of the attempt's.
pub(super) fn spawn_failed(
    current: &mut Attempt,
    ending: &mut Ending,
    attempt: u32,
    (local_rank, error): (u32, &str),
    out: &mut Vec<Action>,
) -> bool {
    let Some(r) = current.ranks.get_mut(local_rank as usize) else {
        return false;
    };
    r.state = RankState::SpawnFailed;
    // The runtime starts no further rank of this attempt after a failed spawn.
    for r in current.ranks.iter_mut() {
        if r.state == RankState::NotStarted {
            r.state = RankState::SpawnFailed;
        }
    }
    out.push(Action::Record(Record::RankSpawnFailed {
        attempt,
        local_rank,
        error: error.to_string(),
    }));
    ending
        .spawn_error
        .get_or_insert_with(|| (local_rank, error.to_string()));
    true
}

/// Local rank `local_rank` of `attempt` closed its connection.
pub(super) fn on_disconnected(current: &mut Attempt, local_rank: u32) {
    if let Some(m) = current
        .ranks
        .get_mut(local_rank as usize)
        .and_then(|r| r.monitor.as_mut())
    {
        m.on_disconnect();
    }
}

/// Attempt `attempt` of `nproc` ranks starts at `now`, where the `job` placed them: the fresh
/// attempt, and the actions that start it.
pub(super) fn start_attempt(
    job: &JobState,
    nproc: u32,
    now: Instant,
    attempt: u32,
) -> (Attempt, Vec<Action>) {
    let actions = vec![
        Action::Record(Record::AttemptStart {
            attempt,
            restart_count: attempt,
            nproc,
            rank_offset: job.placement.rank_offset,
            world_size: job.placement.world_size,
            restarts_left: job.max_restarts.saturating_sub(attempt),
        }),
        Action::SpawnAttempt {
            attempt,
            placement: job.placement,
        },
    ];
    let current = Attempt {
        attempt,
        ..Attempt::start(now, nproc)
    };
    (current, actions)
}

/// The rank leader `pid` of attempt `attempt` (global ranks from `rank_offset`) was reaped at `now`,
/// having ended `how`: its state, its failure's end, the hang watch, the record. A rank that ends
/// while the attempt stops (in `phase`) or after being told to was stopped by us, whatever its
/// status; any other that did not succeed failed: the failure is kept and its global rank
/// returned.
pub(super) fn reaped(
    current: &mut Attempt,
    phase: &Phase,
    (attempt, rank_offset): (u32, u32),
    now: Instant,
    (pid, how): (i32, ExitKind),
    out: &mut Vec<Action>,
) -> Option<u32> {
    let local_rank = current.local_rank_of(pid)?;
    let rank = &mut current.ranks[local_rank as usize];
    if !rank.running() {
        return None;
    }
    rank.state = RankState::Exited(how);
    let told_to_stop = rank.told_to_stop;
    if let Some(f) = current
        .failures
        .iter_mut()
        .find(|f| f.pid == pid && f.how.is_none())
    {
        f.how = Some(how);
    }
    // The hung rank ended on its own while its stacks were being taken.
    current.hangs.rank_ended(local_rank);
    // A rank that ends while we are stopping the attempt was stopped by us, whatever its status.
    let stopping = matches!(phase, Phase::Stopping { .. }) || told_to_stop;
    let failed = !how.success() && !stopping;
    let (exit_code, signal) = match how {
        ExitKind::Code(c) => (Some(c), None),
        ExitKind::Signal(s) => (None, Some(s)),
    };
    let rank = rank_offset + local_rank;
    out.push(Action::Record(Record::RankExited {
        attempt,
        local_rank,
        rank,
        pid,
        exit_code,
        signal,
        expected: !failed,
    }));
    if !failed {
        return None;
    }
    current.failures.push(Failure {
        attempt,
        local_rank,
        rank,
        pid,
        how: Some(how),
        hang: None,
        at: now,
    });
    Some(rank)
}
