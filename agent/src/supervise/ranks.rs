//! Ranks and attempts: starting an attempt's ranks, and what a rank's start, failure to start,
//! exit or lost connection means.

use std::time::Instant;

use super::events::{exit_phrase, Action, ExitKind, Failure, JobEnd, Record, StopReason};
use super::events::{SIGKILL, SIGTERM};
use super::monitor::RankMonitor;
use super::state::{Attempt, Phase, RankState};
use super::{verdict, Supervisor};

impl Supervisor {
    pub(super) fn on_spawned(
        &mut self,
        now: Instant,
        local_rank: u32,
        pid: i32,
        out: &mut Vec<Action>,
    ) {
        let Some(r) = self.attempt.ranks.get_mut(local_rank as usize) else {
            return;
        };
        r.pid = Some(pid);
        r.state = RankState::Running;
        r.monitor = Some(RankMonitor::new(now));
        out.push(Action::Record(Record::RankStarted {
            cycle: self.cycle,
            local_rank,
            rank: self.job.placement.rank_offset + local_rank,
            pid,
        }));
        // A stop that began while the group was being spawned must reach this rank too.
        if let Phase::Stopping { killed, .. } = self.phase {
            let signal = if killed { SIGKILL } else { SIGTERM };
            out.push(Action::SignalGroups {
                pgids: vec![pid],
                signal,
            });
        }
    }

    pub(super) fn on_spawn_failed(
        &mut self,
        now: Instant,
        local_rank: u32,
        error: String,
        out: &mut Vec<Action>,
    ) {
        let Some(r) = self.attempt.ranks.get_mut(local_rank as usize) else {
            return;
        };
        r.state = RankState::SpawnFailed;
        // The runtime starts no further rank of this attempt after a failed spawn.
        for r in self.attempt.ranks.iter_mut() {
            if r.state == RankState::NotStarted {
                r.state = RankState::SpawnFailed;
            }
        }
        out.push(Action::Record(Record::RankSpawnFailed {
            cycle: self.cycle,
            local_rank,
            error: error.clone(),
        }));
        let rank = self.job.placement.rank_offset + local_rank;
        self.job
            .ending
            .spawn_error
            .get_or_insert_with(|| (local_rank, error.clone()));
        self.begin_stop(now, StopReason::SpawnFailed, SIGTERM, out);
        self.stop_for_good(format!("rank {rank} could not start: {error}"), 2, out);
    }

    pub(super) fn on_disconnected(&mut self, local_rank: u32) {
        if let Some(m) = self
            .attempt
            .ranks
            .get_mut(local_rank as usize)
            .and_then(|r| r.monitor.as_mut())
        {
            m.on_disconnect();
        }
    }

    /// Attempt `cycle` starts: a fresh [`Attempt`] replaces the last one, whole.
    pub(super) fn start_cycle(&mut self, now: Instant, cycle: u32) -> Vec<Action> {
        self.cycle = cycle;
        self.phase = Phase::Running;
        self.attempt = Attempt::start(now, self.cfg.nproc);
        vec![
            Action::Record(Record::CycleStart {
                cycle,
                restart_count: cycle,
                nproc: self.cfg.nproc,
                rank_offset: self.job.placement.rank_offset,
                world_size: self.job.placement.world_size,
                restarts_left: self.job.max_restarts.saturating_sub(cycle),
            }),
            Action::SpawnCycle {
                cycle,
                placement: self.job.placement,
            },
        ]
    }

    pub(super) fn on_reaped(
        &mut self,
        now: Instant,
        pid: i32,
        how: ExitKind,
        out: &mut Vec<Action>,
    ) {
        let Some(local_rank) = self.attempt.local_rank_of(pid) else {
            return;
        };
        let rank = &mut self.attempt.ranks[local_rank as usize];
        if !rank.running() {
            return;
        }
        rank.state = RankState::Exited(how);
        let told_to_stop = rank.told_to_stop;
        if let Some(f) = self
            .attempt
            .failures
            .iter_mut()
            .find(|f| f.pid == pid && f.how.is_none())
        {
            f.how = Some(how);
        }
        // The hung rank ended on its own while its stacks were being taken.
        self.attempt.hangs.rank_ended(local_rank);
        // A rank that ends while we are stopping the cycle was stopped by us, whatever its status.
        let stopping = matches!(self.phase, Phase::Stopping { .. }) || told_to_stop;
        let failed = !how.success() && !stopping;
        let (exit_code, signal) = match how {
            ExitKind::Code(c) => (Some(c), None),
            ExitKind::Signal(s) => (None, Some(s)),
        };
        let rank = self.job.placement.rank_offset + local_rank;
        out.push(Action::Record(Record::RankExited {
            cycle: self.cycle,
            local_rank,
            rank,
            pid,
            exit_code,
            signal,
            expected: !failed,
        }));
        if failed {
            self.attempt.failures.push(Failure {
                cycle: self.cycle,
                local_rank,
                rank,
                pid,
                how: Some(how),
                hang: None,
                at: now,
            });
            self.begin_stop(now, StopReason::RankFailed, SIGTERM, out);
            self.report_failure(format!("rank {rank} {}", exit_phrase(how)), out);
        }
    }

    /// Tells the other nodes that this attempt failed here, once per attempt.
    pub(super) fn report_failure(&mut self, reason: String, out: &mut Vec<Action>) {
        let node = self.cfg.node_rank;
        verdict::report(
            &mut self.attempt,
            self.cycle,
            JobEnd::Failed { node, reason },
            out,
        );
    }
}
