//! The job's verdicts: reporting how this node's part of a cycle ended, acting on the job's verdict
//! (restart after a back-off, end), and settling the outcome once nothing runs.

use super::*;

impl Supervisor {
    pub(super) fn on_joined(
        &mut self,
        now: Instant,
        cycle: u32,
        (rank_offset, world_size): (u32, u32),
        max_restarts: u32,
        calculated: Option<Timeouts>,
        out: &mut Vec<Action>,
    ) {
        if self.phase == Phase::Joining && cycle == self.cycle {
            self.cfg.rank_offset = rank_offset;
            self.cfg.world_size = world_size;
            self.cfg.max_restarts = max_restarts;
            out.push(Action::Record(Record::Joined { cycle, rank_offset }));
            if let Some(t) = calculated.filter(|t| Some(t) != self.calculated.as_ref()) {
                let source = if cycle == 0 { "loaded" } else { "calculated" };
                self.adopt_timeouts(&t, source, out);
            }
            let start = self.start_cycle(now, cycle);
            if self.fault_at_start(out) {
                // No rank starts on a node that cannot run them; the job's verdict ends it.
                for r in self.ranks.iter_mut() {
                    r.state = RankState::SpawnFailed;
                }
                return;
            }
            out.extend(start);
        }
    }

    /// A standby in `cycle`: as a node whose ranks all finished at once, it only waits for the
    /// cycle's verdict, then goes on (or ends) with every other node.
    pub(super) fn on_standby(&mut self, now: Instant, cycle: u32, out: &mut Vec<Action>) {
        if self.phase != Phase::Joining || cycle != self.cycle {
            return;
        }
        out.push(Action::Record(Record::Standby { cycle }));
        let _ = self.start_cycle(now, cycle);
        self.ranks.clear();
        self.reported = true;
        self.phase = Phase::Waiting;
    }

    pub(super) fn on_cycle_ended(
        &mut self,
        now: Instant,
        cycle: u32,
        end: JobEnd,
        out: &mut Vec<Action>,
    ) {
        if cycle == self.cycle && self.end.is_none() {
            out.push(Action::Record(Record::CycleEnded {
                cycle,
                end: end.clone(),
                requeue: None,
            }));
            self.end = Some(end);
            self.ended_at = Some(now);
            if self.phase == Phase::Joining {
                // The rendezvous itself was ended by a node that stopped or was lost.
                self.phase = Phase::Waiting;
            }
            self.stop_for_peer(now, out);
        }
    }

    pub(super) fn on_coordination_lost(
        &mut self,
        now: Instant,
        reason: String,
        requeue: bool,
        out: &mut Vec<Action>,
    ) {
        // Whatever the cycle's verdict was, no further cycle can be agreed on.
        let end = JobEnd::Lost { reason, node: None };
        out.push(Action::Record(Record::CycleEnded {
            cycle: self.cycle,
            end: end.clone(),
            requeue: Some(requeue),
        }));
        self.lost_requeue = requeue;
        self.end = Some(end);
        if matches!(self.phase, Phase::Joining | Phase::BackingOff { .. }) {
            self.phase = Phase::Waiting;
        }
        self.stop_for_peer(now, out);
    }

    /// A back-off that is over: join the next cycle's rendezvous.
    pub(super) fn backoff_tick(&mut self, now: Instant, out: &mut Vec<Action>) {
        if let Phase::BackingOff { until } = self.phase {
            if self.stop.is_some() {
                // The allocation ends before the next attempt could do anything: no restart, and
                // nodes that did not see the stop must not wait for this one at the next attempt.
                self.phase = Phase::Waiting;
                self.stopped.get_or_insert(JobEnd::Stopped {
                    node: self.cfg.node_rank,
                    reason: "the allocation ends".into(),
                    exit_code: EXIT_LOST,
                });
                self.settle(out);
            } else if now >= until {
                self.join_next(out);
            }
        }
    }

    pub(super) fn report(&mut self, end: JobEnd, out: &mut Vec<Action>) {
        if !self.reported && self.end.is_none() {
            self.reported = true;
            out.push(Action::Job(JobRequest::ReportEnd {
                cycle: self.cycle,
                end,
            }));
        }
    }

    /// The job's verdict arrived: a node that is still running its ranks stops them.
    pub(super) fn stop_for_peer(&mut self, now: Instant, out: &mut Vec<Action>) {
        if self.phase == Phase::Running && self.end != Some(JobEnd::Done) {
            self.diagnosing = None;
            self.begin_stop(now, StopReason::Peer, SIGTERM, out);
        }
    }

    /// Join the rendezvous of the (already incremented) next cycle.
    pub(super) fn join_next(&mut self, out: &mut Vec<Action>) {
        self.phase = Phase::Joining;
        // The last attempt's verdict is spent: a verdict on the next one (a node that left the
        // job poisons it) must not be taken for a repeat and ignored.
        self.end = None;
        out.push(Action::Job(JobRequest::Join {
            cycle: self.cycle,
            calculated: self.calculated.clone(),
        }));
    }

    /// Once no rank of the cycle is running and the job's verdict is known, decide what comes next.
    pub(super) fn settle(&mut self, out: &mut Vec<Action>) {
        if matches!(
            self.phase,
            Phase::Joining | Phase::Finished | Phase::BackingOff { .. }
        ) || self
            .ranks
            .iter()
            .any(|r| matches!(r.state, RankState::Running | RankState::NotStarted))
        {
            return;
        }
        if !self.reaped {
            self.reaped = true;
            let pgids: Vec<i32> = self.ranks.iter().filter_map(|r| r.pid).collect();
            if !pgids.is_empty() {
                out.push(Action::ReapGroups { pgids });
            }
        }
        if self.phase == Phase::Running {
            // Every rank exited 0 on its own.
            self.phase = Phase::Waiting;
            if !self.reported {
                self.reported = true;
                out.push(Action::Job(JobRequest::ReportDone { cycle: self.cycle }));
            }
        }
        let outcome = if let Some(signal) = self.signal {
            Outcome::Signaled { signal }
        } else if let Some((local_rank, error)) = self.spawn_error.clone() {
            Outcome::SpawnFailed { local_rank, error }
        } else {
            match self.end.clone() {
                None => return,
                Some(JobEnd::Done) => match self.stop_asked() {
                    Some((trigger, step)) => Outcome::Stopped { trigger, step },
                    None => Outcome::Succeeded,
                },
                Some(JobEnd::Failed { .. }) if self.no_progress_now() => Outcome::NoProgress {
                    attempts: self.attempt_steps.len() as u32,
                    step: self.highest_step,
                },
                // This node is to leave the job (ExcludeThisNode): it cannot go on without it, so
                // the job ends as for a lost node and is requeued elsewhere.
                Some(JobEnd::Failed { .. }) if self.exclude_asked => Outcome::Lost {
                    reason: match &self.fault {
                        Some(f) => format!(
                            "node {} cannot run ranks ({f}), and the job cannot go on without it",
                            self.cfg.node_rank
                        ),
                        None => format!(
                            "a rank asked to exclude node {} (ExcludeThisNode), and the job cannot go on without it",
                            self.cfg.node_rank
                        ),
                    },
                    requeue: true,
                },
                // A stop ends the allocation: no restart, whatever failed while stopping; so does
                // a rank's ShutdownWorkload.
                Some(JobEnd::Failed { .. })
                    if self.cycle < self.cfg.max_restarts
                        && self.stop.is_none()
                        && !self.shutdown_asked =>
                {
                    let next = self.cycle + 1;
                    let ran = match (self.started_at, self.ended_at) {
                        (Some(s), Some(e)) => e.saturating_duration_since(s),
                        _ => Duration::ZERO,
                    };
                    let (wait, streak) = self.cfg.backoff.next(self.streak, ran);
                    self.streak = streak;
                    out.push(Action::Record(Record::Restart {
                        from_cycle: self.cycle,
                        to_cycle: next,
                        restarts_left: self.cfg.max_restarts - next,
                        ran_ms: ran.as_millis() as u64,
                        backoff_ms: wait.as_millis() as u64,
                    }));
                    self.cycle = next;
                    match self.ended_at {
                        Some(at) if !wait.is_zero() => {
                            self.phase = Phase::BackingOff { until: at + wait };
                        }
                        _ => self.join_next(out),
                    }
                    return;
                }
                Some(JobEnd::Failed { .. }) => Outcome::Failed {
                    restarts: self.cycle,
                },
                Some(JobEnd::Stopped { .. }) if self.stop.is_some() => {
                    let (trigger, step) = self.stop_asked().unwrap_or_default();
                    Outcome::Stopped { trigger, step }
                }
                Some(JobEnd::Stopped {
                    node,
                    reason,
                    exit_code,
                }) => Outcome::PeerStopped {
                    node,
                    reason,
                    exit_code,
                },
                Some(JobEnd::Lost { reason, .. }) => Outcome::Lost {
                    reason,
                    requeue: self.lost_requeue,
                },
            }
        };
        // Nodes still heading for another cycle must not wait for this one.
        let poison = match &outcome {
            Outcome::Signaled { .. } | Outcome::SpawnFailed { .. } => self.stopped.clone(),
            _ if self.stop.is_some() => self.stopped.clone(),
            Outcome::Lost { reason, .. } => Some(JobEnd::Lost {
                node: self.exclude_asked.then_some(self.cfg.node_rank),
                reason: reason.clone(),
            }),
            _ => None,
        };
        self.phase = Phase::Finished;
        out.push(Action::Job(JobRequest::Leave {
            poison: poison.map(|p| (self.cycle, p)),
            highest_step: self.highest_step,
        }));
        out.push(Action::Record(Record::Result {
            exit_code: outcome.exit_code(),
            outcome: outcome.clone(),
        }));
        out.push(Action::Finish(outcome));
    }

    /// Called once per failed attempt, when its verdict settles: records the attempt's highest
    /// step and says whether the attempts stopped making progress.
    fn no_progress_now(&mut self) -> bool {
        let Some((n, min)) = self.cfg.no_progress else {
            return false;
        };
        if self.attempt_steps.len() as u32 <= self.cycle {
            let reached = self
                .ranks
                .iter()
                .filter_map(|r| r.pace.map(|p| p.step))
                .max();
            self.attempt_steps.push(reached);
        }
        super::progress::attempt_no_progress(&self.attempt_steps, n, min)
    }
}
