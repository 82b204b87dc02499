//! Hang verdicts: which rank is hung first, asking the runtime which ranks are stopped, naming the
//! root cause, and the diagnosis (stacks) before the stop.

use super::*;

impl Supervisor {
    /// The running rank that will be hung first, and when.
    pub(super) fn earliest_hang(&self) -> Option<(u32, Due)> {
        self.ranks
            .iter()
            .enumerate()
            .filter(|(_, r)| r.state == RankState::Running)
            .filter_map(|(i, r)| {
                r.monitor
                    .as_ref()?
                    .deadline(&self.timeouts, self.cfg.warmup_steps)
                    .map(|d| (i as u32, d))
            })
            .min_by_key(|(_, d)| d.at)
    }

    pub(super) fn on_stacks_captured(
        &mut self,
        now: Instant,
        local_rank: u32,
        out: &mut Vec<Action>,
    ) {
        if self
            .diagnosing
            .as_ref()
            .is_some_and(|(lr, _, _)| *lr == local_rank)
        {
            self.conclude_hang(now, out);
        }
    }

    /// A tick while ranks run: a diagnosis whose wait is over ends; a hang that is due makes the
    /// runtime look which ranks are stopped before anything is declared.
    pub(super) fn hang_tick(&mut self, now: Instant, out: &mut Vec<Action>) {
        if self
            .diagnosing
            .as_ref()
            .is_some_and(|(_, _, until)| now >= *until)
        {
            self.conclude_hang(now, out);
        } else if self.diagnosing.is_none()
            && !self.probing
            && self.earliest_hang().is_some_and(|(_, d)| now >= d.at)
        {
            self.probing = true;
            let ranks = self
                .ranks
                .iter()
                .enumerate()
                .filter(|(_, r)| r.state == RankState::Running)
                .filter_map(|(i, r)| Some((i as u32, r.pid?)))
                .collect();
            out.push(Action::ProbeStopped { ranks });
        }
    }

    pub(super) fn on_probed(&mut self, now: Instant, stopped: Vec<u32>, out: &mut Vec<Action>) {
        if std::mem::take(&mut self.probing)
            && self.phase == Phase::Running
            && self.diagnosing.is_none()
        {
            // Still due? A message may have come in while the runtime looked.
            if let Some((lr, due)) = self.earliest_hang().filter(|(_, d)| now >= d.at) {
                let (lr, due, frozen) = self.root_of_hang(lr, due, &stopped);
                self.begin_diagnosis(now, lr, due, frozen, out);
            }
        }
    }

    /// The rank to declare hung when `due_rank`'s timeout ran out: a running rank whose process
    /// is stopped, if any (the one silent longest), since ranks waiting on a frozen one (in a
    /// barrier, a collective) go silent too and may run out first. Returns the rank, its own
    /// timeout if it has one (else `due`'s), and whether it is stopped.
    pub(super) fn root_of_hang(
        &self,
        due_rank: u32,
        due: Due,
        stopped: &[u32],
    ) -> (u32, Due, bool) {
        if stopped.contains(&due_rank) {
            return (due_rank, due, true);
        }
        let frozen = stopped
            .iter()
            .filter(|lr| {
                self.ranks
                    .get(**lr as usize)
                    .is_some_and(|r| r.state == RankState::Running)
            })
            .map(|lr| {
                let own = self.ranks[*lr as usize]
                    .monitor
                    .as_ref()
                    .and_then(|m| m.deadline(&self.timeouts, self.cfg.warmup_steps));
                (*lr, own)
            })
            .min_by_key(|(lr, own)| (own.is_none(), own.as_ref().map(|d| d.since), *lr));
        match frozen {
            Some((lr, own)) => (lr, own.unwrap_or(due), true),
            None => (due_rank, due, false),
        }
    }

    pub(super) fn begin_diagnosis(
        &mut self,
        now: Instant,
        local_rank: u32,
        due: Due,
        stopped: bool,
        out: &mut Vec<Action>,
    ) {
        let Some(pid) = self.ranks[local_rank as usize].pid else {
            return;
        };
        self.hang_seen = true;
        for m in self.ranks.iter_mut().filter_map(|r| r.monitor.as_mut()) {
            m.freeze();
        }
        let hang = Hang {
            timeout: due.kind.clone(),
            limit_ms: due.limit.as_millis() as u64,
            silent_ms: now.saturating_duration_since(due.since).as_millis() as u64,
            stopped,
        };
        out.push(Action::Record(Record::Hang {
            cycle: self.cycle,
            local_rank,
            rank: self.cfg.rank_offset + local_rank,
            pid,
            hang: hang.clone(),
        }));
        out.push(Action::CaptureStacks {
            local_rank,
            pid,
            via_shim: self.ranks[local_rank as usize]
                .monitor
                .as_ref()
                .is_some_and(RankMonitor::registered),
        });
        self.diagnosing = Some((local_rank, hang, now + self.cfg.stack_wait));
    }

    /// The hung rank's stacks are taken (or the wait is over): terminate it and stop the cycle.
    pub(super) fn conclude_hang(&mut self, now: Instant, out: &mut Vec<Action>) {
        let Some((local_rank, hang, _)) = self.diagnosing.take() else {
            return;
        };
        let r = &self.ranks[local_rank as usize];
        let (Some(pid), RankState::Running) = (r.pid, r.state) else {
            return;
        };
        self.failures.push(Failure {
            cycle: self.cycle,
            local_rank,
            rank: self.cfg.rank_offset + local_rank,
            pid,
            how: None,
            hang: Some(hang.clone()),
            at: now,
        });
        let term = self.cfg.termination_signal;
        self.begin_stop_except(now, StopReason::RankHung, SIGTERM, Some((pid, term)), out);
        let reason = format!(
            "rank {} hung: {} of {:.1}s passed",
            self.cfg.rank_offset + local_rank,
            hang.timeout,
            hang.limit_ms as f64 / 1000.0
        );
        self.report_failure(reason, out);
    }
}
