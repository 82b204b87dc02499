//! The job's verdicts: reporting how this node's part of an attempt ended, acting on the job's
//! verdict (restart after a back-off, end), and settling the outcome once nothing runs. What needs
//! only some parts (the report of this node's end, the sweep, whether attempts still progress)
//! is a free function of those parts, below the supervisor's methods.

use std::time::Instant;

use super::events::{Action, JobEnd, JobRequest, Outcome, Record, StopReason, EXIT_LOST, SIGTERM};
use super::events::{Placement, SupervisorConfig};
use super::monitor::Timeouts;
use super::progress::{attempt_no_progress, made_progress, Reached};
use super::state::{Asked, Attempt, Phase, RankState, Steps};
use super::Supervisor;

impl Supervisor {
    pub(super) fn on_joined(
        &mut self,
        now: Instant,
        attempt: u32,
        placement: Placement,
        max_restarts: u32,
        calculated: Option<Timeouts>,
        out: &mut Vec<Action>,
    ) {
        if self.phase != Phase::Joining || attempt != self.attempt {
            return;
        }
        // What the job assigned this node for this attempt.
        self.job.placement = placement;
        self.job.max_restarts = max_restarts;
        out.push(Action::Record(Record::Joined {
            attempt,
            rank_offset: placement.rank_offset,
        }));
        if let Some(t) = calculated.filter(|t| Some(t) != self.timeouts.calculated.as_ref()) {
            let source = if attempt == 0 { "loaded" } else { "calculated" };
            self.calc().adopt_timeouts(&t, source, out);
        }
        let start = self.start_attempt(now, attempt);
        if self.fault_at_start(out) {
            // No rank starts on a node that cannot run them; the job's verdict ends it.
            for r in self.current.ranks.iter_mut() {
                r.state = RankState::SpawnFailed;
            }
            return;
        }
        out.extend(start);
    }

    /// A standby in `attempt`: as a node whose ranks all finished at once, it only waits for the
    /// attempt's verdict, then goes on (or ends) with every other node.
    pub(super) fn on_standby(&mut self, now: Instant, attempt: u32, out: &mut Vec<Action>) {
        if self.phase != Phase::Joining || attempt != self.attempt {
            return;
        }
        out.push(Action::Record(Record::Standby { attempt }));
        self.current = Attempt {
            attempt,
            ..Attempt::standby(now)
        };
        self.phase = Phase::Waiting;
    }

    pub(super) fn on_attempt_ended(
        &mut self,
        now: Instant,
        attempt: u32,
        end: JobEnd,
        out: &mut Vec<Action>,
    ) {
        if attempt != self.attempt || self.current.end.is_some() {
            return;
        }
        out.push(Action::Record(Record::AttemptEnded {
            attempt,
            end: end.clone(),
            requeue: None,
        }));
        self.current.end = Some(end);
        self.current.ended_at = Some(now);
        if self.phase == Phase::Joining {
            // The rendezvous itself was ended by a node that stopped or was lost.
            self.phase = Phase::Waiting;
        }
        self.stop_for_peer(now, out);
    }

    pub(super) fn on_coordination_lost(
        &mut self,
        now: Instant,
        reason: String,
        requeue: bool,
        out: &mut Vec<Action>,
    ) {
        // Whatever the attempt's verdict was, no further attempt can be agreed on.
        let end = JobEnd::Lost { reason, node: None };
        out.push(Action::Record(Record::AttemptEnded {
            attempt: self.attempt,
            end: end.clone(),
            requeue: Some(requeue),
        }));
        self.job.ending.lost_requeue = requeue;
        self.current.end = Some(end);
        if matches!(self.phase, Phase::Joining | Phase::BackingOff { .. }) {
            self.phase = Phase::Waiting;
        }
        self.stop_for_peer(now, out);
    }

    /// A back-off that is over: join the next attempt's rendezvous.
    pub(super) fn backoff_tick(&mut self, now: Instant, out: &mut Vec<Action>) {
        let Phase::BackingOff { until } = self.phase else {
            return;
        };
        if self.stop.under_way() {
            // The allocation ends before the next attempt could do anything: no restart, and
            // nodes that did not see the stop must not wait for this one at the next attempt.
            self.phase = Phase::Waiting;
            self.job.ending.stopped.get_or_insert(JobEnd::Stopped {
                node: self.cfg.node_rank,
                reason: "the allocation ends".into(),
                exit_code: EXIT_LOST,
            });
            self.settle(out);
        } else if now >= until {
            self.join_next(out);
        }
    }

    /// The job's verdict arrived: a node that is still running its ranks stops them.
    pub(super) fn stop_for_peer(&mut self, now: Instant, out: &mut Vec<Action>) {
        if self.phase == Phase::Running && self.current.end != Some(JobEnd::Done) {
            self.current.hangs.cancel();
            self.begin_stop(now, StopReason::Peer, SIGTERM, out);
        }
    }

    /// Join the rendezvous of the (already incremented) next attempt.
    pub(super) fn join_next(&mut self, out: &mut Vec<Action>) {
        self.phase = Phase::Joining;
        // The last attempt's verdict is spent: a verdict on the next one (a node that left the
        // job poisons it) must not be taken for a repeat and ignored.
        self.current.end = None;
        out.push(Action::Job(JobRequest::Join {
            attempt: self.attempt,
            calculated: self.timeouts.calculated.clone(),
        }));
    }

    /// Once no rank of the attempt is running and the job's verdict is known, decide what comes
    /// next: another attempt, or the agent's outcome.
    pub(super) fn settle(&mut self, out: &mut Vec<Action>) {
        if matches!(
            self.phase,
            Phase::Joining | Phase::Finished | Phase::BackingOff { .. }
        ) || self.current.any_left()
        {
            return;
        }
        sweep(&mut self.current, out);
        if self.phase == Phase::Running {
            // Every rank exited 0 on its own.
            self.phase = Phase::Waiting;
            if !self.current.reported {
                self.current.reported = true;
                out.push(Action::Job(JobRequest::ReportDone {
                    attempt: self.attempt,
                }));
            }
        }
        if let Some(outcome) = self.outcome(out) {
            self.finish(outcome, out);
        }
    }

    /// The agent's outcome, once this node must end; `None` while the verdict is not known yet,
    /// or when another attempt follows (already under way).
    fn outcome(&mut self, out: &mut Vec<Action>) -> Option<Outcome> {
        if let Some(signal) = self.job.ending.signal {
            return Some(Outcome::Signaled { signal });
        }
        if let Some((local_rank, error)) = self.job.ending.spawn_error.clone() {
            return Some(Outcome::SpawnFailed { local_rank, error });
        }
        Some(match self.current.end.clone()? {
            JobEnd::Done => match self.stop_asked() {
                Some((trigger, step)) => Outcome::Stopped { trigger, step },
                None => Outcome::Succeeded,
            },
            JobEnd::Failed { .. } => return self.after_failure(out),
            JobEnd::Stopped { .. } if self.stop.under_way() => {
                let (trigger, step) = self.stop_asked().unwrap_or_default();
                Outcome::Stopped { trigger, step }
            }
            JobEnd::Stopped {
                node,
                reason,
                exit_code,
            } => Outcome::PeerStopped {
                node,
                reason,
                exit_code,
            },
            JobEnd::Lost { reason, .. } => Outcome::Lost {
                reason,
                requeue: self.job.ending.lost_requeue,
            },
        })
    }

    /// The job's verdict is a failure: restart, or the outcome that ends this node.
    fn after_failure(&mut self, out: &mut Vec<Action>) -> Option<Outcome> {
        if no_progress_now(&self.cfg, self.attempt, &self.current, &mut self.job.steps) {
            return Some(Outcome::NoProgress {
                attempts: self.job.steps.per_attempt.len() as u32,
                // With a checkpoint file, its iteration is the step that did not grow.
                step: match self.cfg.progress_from_file {
                    true => self.job.steps.checkpoint.latest,
                    false => self.job.steps.highest,
                },
            });
        }
        if self.job.asked.exclude {
            // This node is to leave the job (ExcludeThisNode): it cannot go on without it, so
            // the job ends as for a lost node and is requeued elsewhere.
            return Some(Outcome::Lost {
                reason: exclusion_reason(self.cfg.node_rank, &self.job.asked),
                requeue: true,
            });
        }
        // A stop ends the allocation: no restart, whatever failed while stopping; so does a
        // rank's ShutdownWorkload.
        if self.attempt < self.job.max_restarts
            && !self.stop.under_way()
            && !self.job.asked.shutdown
        {
            self.restart(out);
            return None;
        }
        Some(Outcome::Failed {
            restarts: self.attempt,
        })
    }

    /// The next attempt: at once, or after the back-off from the job's verdict on this one.
    fn restart(&mut self, out: &mut Vec<Action>) {
        let next = self.attempt + 1;
        let ran = self.current.ran();
        let progressed = progressed(&self.cfg, &self.current, &mut self.job.steps);
        let (wait, streak) = self.cfg.backoff.next(self.job.streak, ran, progressed);
        self.job.streak = streak;
        out.push(Action::Record(Record::Restart {
            from_attempt: self.attempt,
            to_attempt: next,
            restarts_left: self.job.max_restarts - next,
            ran_ms: ran.as_millis() as u64,
            backoff_ms: wait.as_millis() as u64,
        }));
        self.attempt = next;
        match self.current.ended_at {
            Some(at) if !wait.is_zero() => {
                self.phase = Phase::BackingOff { until: at + wait };
            }
            _ => self.join_next(out),
        }
    }

    /// This node ends with `outcome`: leave the job and tell the runtime.
    pub(super) fn finish(&mut self, outcome: Outcome, out: &mut Vec<Action>) {
        // Nodes still heading for another attempt must not wait for this one.
        let poison = match &outcome {
            Outcome::Signaled { .. } | Outcome::SpawnFailed { .. } => {
                self.job.ending.stopped.clone()
            }
            _ if self.stop.under_way() => self.job.ending.stopped.clone(),
            Outcome::Lost { reason, .. } => Some(JobEnd::Lost {
                node: self.job.asked.exclude.then_some(self.cfg.node_rank),
                reason: reason.clone(),
            }),
            _ => None,
        };
        self.phase = Phase::Finished;
        out.push(Action::Job(JobRequest::Leave {
            poison: poison.map(|p| (self.attempt, p)),
            highest_step: self.job.steps.highest,
        }));
        out.push(Action::Record(Record::Result {
            exit_code: outcome.exit_code(),
            outcome: outcome.clone(),
        }));
        out.push(Action::Finish(outcome));
    }
}

/// Whether the attempt that just failed (`current`) made progress over those before it (for the
/// back-off), and keeps what it reached as the best for the next one (in `steps`).
fn progressed(cfg: &SupervisorConfig, current: &Attempt, steps: &mut Steps) -> bool {
    let (saved, before_saved) = match cfg.progress_from_file {
        // The file's value after the attempt, over the best after earlier ones (or at the
        // job's start).
        true => (
            steps.checkpoint.latest.filter(|&i| i > 0),
            steps
                .best
                .saved
                .or(steps.checkpoint.baseline.filter(|&i| i > 0)),
        ),
        false => (current.saved, steps.best.saved),
    };
    let before = Reached {
        step: steps.best.step,
        saved: before_saved,
    };
    let now = Reached {
        step: current.highest_step(),
        saved,
    };
    steps.best = before.max(now);
    made_progress(before, now, cfg.min_progress_steps)
}

/// This node's end of attempt `attempt`, for the job's verdict: told once, and not when the verdict
/// is already known.
pub(super) fn report(current: &mut Attempt, attempt: u32, end: JobEnd, out: &mut Vec<Action>) {
    if !current.reported && current.end.is_none() {
        current.reported = true;
        out.push(Action::Job(JobRequest::ReportEnd { attempt, end }));
    }
}

/// Every rank leader of the attempt is reaped: sweep their process groups, once.
fn sweep(current: &mut Attempt, out: &mut Vec<Action>) {
    if std::mem::replace(&mut current.reaped, true) {
        return;
    }
    let pgids: Vec<i32> = current.ranks.iter().filter_map(|r| r.pid).collect();
    if !pgids.is_empty() {
        out.push(Action::ReapGroups { pgids });
    }
}

/// Why node `node` leaves the job for good, as it was asked to.
fn exclusion_reason(node: u32, asked: &Asked) -> String {
    match &asked.fault {
        Some(f) => {
            format!("node {node} cannot run ranks ({f}), and the job cannot go on without it")
        }
        None => format!(
            "a rank asked to exclude node {node} (ExcludeThisNode), and the job cannot go on without it"
        ),
    }
}

/// Called once per failed attempt (`attempt`), when its verdict settles: records the attempt's
/// highest step in the job's `steps` and says whether the attempts stopped making progress.
fn no_progress_now(
    cfg: &SupervisorConfig,
    attempt: u32,
    current: &Attempt,
    steps: &mut Steps,
) -> bool {
    let Some((n, min)) = cfg.no_progress else {
        return false;
    };
    let from_file = cfg.progress_from_file;
    let reached = match from_file {
        true => steps.checkpoint.latest,
        false => current.highest_step(),
    };
    let per_attempt = &mut steps.per_attempt;
    if per_attempt.len() as u32 <= attempt {
        per_attempt.push(reached);
    }
    match from_file {
        true => steps.checkpoint.no_progress(per_attempt, n, min),
        false => attempt_no_progress(per_attempt, n, min),
    }
}
