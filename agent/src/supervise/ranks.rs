//! Ranks and attempts: starting a cycle's ranks, and what a rank's start, failure to start, exit
//! or lost connection means.

use super::*;

impl Supervisor {
    pub(super) fn on_spawned(
        &mut self,
        now: Instant,
        local_rank: u32,
        pid: i32,
        out: &mut Vec<Action>,
    ) {
        if let Some(r) = self.ranks.get_mut(local_rank as usize) {
            r.pid = Some(pid);
            r.state = RankState::Running;
            r.monitor = Some(RankMonitor::new(now));
            out.push(Action::Record(Record::RankStarted {
                cycle: self.cycle,
                local_rank,
                rank: self.cfg.rank_offset + local_rank,
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
    }

    pub(super) fn on_spawn_failed(
        &mut self,
        now: Instant,
        local_rank: u32,
        error: String,
        out: &mut Vec<Action>,
    ) {
        if let Some(r) = self.ranks.get_mut(local_rank as usize) {
            r.state = RankState::SpawnFailed;
            // The runtime starts no further rank of this cycle after a failed spawn.
            for r in self.ranks.iter_mut() {
                if r.state == RankState::NotStarted {
                    r.state = RankState::SpawnFailed;
                }
            }
            out.push(Action::Record(Record::RankSpawnFailed {
                cycle: self.cycle,
                local_rank,
                error: error.clone(),
            }));
            if self.spawn_error.is_none() {
                self.spawn_error = Some((local_rank, error.clone()));
            }
            self.begin_stop(now, StopReason::SpawnFailed, SIGTERM, out);
            let end = JobEnd::Stopped {
                node: self.cfg.node_rank,
                reason: format!(
                    "rank {} could not start: {error}",
                    self.cfg.rank_offset + local_rank
                ),
                exit_code: 2,
            };
            self.stopped.get_or_insert(end.clone());
            self.report(end, out);
        }
    }

    pub(super) fn on_disconnected(&mut self, local_rank: u32) {
        if let Some(m) = self
            .ranks
            .get_mut(local_rank as usize)
            .and_then(|r| r.monitor.as_mut())
        {
            m.on_disconnect();
        }
    }

    pub(super) fn start_cycle(&mut self, now: Instant, cycle: u32) -> Vec<Action> {
        self.cycle = cycle;
        self.started_at = Some(now);
        self.ended_at = None;
        self.phase = Phase::Running;
        self.end = None;
        self.reported = false;
        self.reaped = false;
        self.failures.clear();
        self.diagnosing = None;
        self.probing = false;
        self.calculated_this_cycle = false;
        self.calc_round = 0;
        self.asking = None;
        self.answering = None;
        self.hang_seen = false;
        self.kill_holders = false;
        self.ranks = (0..self.cfg.nproc)
            .map(|_| Rank {
                pid: None,
                state: RankState::NotStarted,
                monitor: None,
                pace: None,
                listens: false,
                told_to_stop: false,
                holds: 0,
            })
            .collect();
        vec![
            Action::Record(Record::CycleStart {
                cycle,
                restart_count: cycle,
                nproc: self.cfg.nproc,
                rank_offset: self.cfg.rank_offset,
                world_size: self.cfg.world_size,
                restarts_left: self.cfg.max_restarts.saturating_sub(cycle),
            }),
            Action::SpawnCycle { cycle },
        ]
    }

    pub(super) fn live_pids(&self) -> Vec<i32> {
        self.ranks
            .iter()
            .filter(|r| r.state == RankState::Running)
            .filter_map(|r| r.pid)
            .collect()
    }

    pub(super) fn on_reaped(
        &mut self,
        now: Instant,
        pid: i32,
        how: ExitKind,
        out: &mut Vec<Action>,
    ) {
        let Some(local_rank) = self.local_rank_of(pid) else {
            return;
        };
        let rank = &mut self.ranks[local_rank as usize];
        if rank.state != RankState::Running {
            return;
        }
        rank.state = RankState::Exited(how);
        let told_to_stop = rank.told_to_stop;
        if let Some(f) = self
            .failures
            .iter_mut()
            .find(|f| f.pid == pid && f.how.is_none())
        {
            f.how = Some(how);
        }
        if self
            .diagnosing
            .as_ref()
            .is_some_and(|(lr, _, _)| *lr == local_rank)
        {
            // The hung rank ended on its own while its stacks were being taken.
            self.diagnosing = None;
        }
        // A rank that ends while we are stopping the cycle was stopped by us, whatever its status.
        let stopping = matches!(self.phase, Phase::Stopping { .. }) || told_to_stop;
        let failed = !how.success() && !stopping;
        let (exit_code, signal) = match how {
            ExitKind::Code(c) => (Some(c), None),
            ExitKind::Signal(s) => (None, Some(s)),
        };
        out.push(Action::Record(Record::RankExited {
            cycle: self.cycle,
            local_rank,
            rank: self.cfg.rank_offset + local_rank,
            pid,
            exit_code,
            signal,
            expected: !failed,
        }));
        if failed {
            self.failures.push(Failure {
                cycle: self.cycle,
                local_rank,
                rank: self.cfg.rank_offset + local_rank,
                pid,
                how: Some(how),
                hang: None,
                at: now,
            });
            self.begin_stop(now, StopReason::RankFailed, SIGTERM, out);
            let reason = format!(
                "rank {} {}",
                self.cfg.rank_offset + local_rank,
                exit_phrase(how)
            );
            self.report_failure(reason, out);
        }
    }

    /// Tells the other nodes that this cycle failed here, once per cycle.
    pub(super) fn report_failure(&mut self, reason: String, out: &mut Vec<Action>) {
        let node = self.cfg.node_rank;
        self.report(JobEnd::Failed { node, reason }, out);
    }
}
