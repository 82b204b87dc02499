//! The job's verdicts: reporting how this node's part of an attempt ended, acting on the job's
//! verdict (restart after a back-off, end), and settling the outcome once nothing runs.
//!
//! This concern stays a set of `Supervisor` methods: the verdict that ends an attempt reads and
//! changes nearly every part (the phase and the attempt number, the attempt's ranks and end, the
//! job's steps, back-off streak and ending, the stop agreement, the timeouts handed to the next
//! join), and hands over to the others (starting ranks, stopping them). What needs only some
//! parts is a free function of those parts, below the methods: the report of this node's end,
//! the sweep, whether attempts still progress, the outcome a verdict other than a failure makes
//! ([`ended`]), whether a failure restarts ([`failure_outcome`]) and what a leaving node tells
//! the others ([`leave_with`]).

use std::time::Instant;

use super::events::{Action, JobEnd, JobRequest, Outcome, Record, StopReason, EXIT_LOST, SIGTERM};
use super::events::{Placement, SupervisorConfig};
use super::monitor::Timeouts;
use super::progress::{attempt_no_progress, made_progress, Reached};
use super::state::{Asked, Attempt, Ending, JobState, Phase, RankState, Steps};
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
        let end = self.current.end.clone()?;
        if let JobEnd::Failed { .. } = end {
            let stopping = self.stop.under_way();
            let outcome = failure_outcome(
                &self.cfg,
                self.attempt,
                &self.current,
                &mut self.job,
                stopping,
            );
            if outcome.is_none() {
                self.restart(out);
            }
            return outcome;
        }
        ended(end, self.stop_asked(), self.job.ending.lost_requeue)
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
        let (stopping, node) = (self.stop.under_way(), self.cfg.node_rank);
        let poison = leave_with(&outcome, &self.job.ending, stopping, &self.job.asked, node);
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

/// The agent's outcome for the job's verdict `end` on an attempt, with the stop asked for (its
/// trigger and step), if any; `lost_requeue`: whether a `Lost` verdict of this node's own may be
/// requeued. `None` for a failure: that restarts, or not ([`failure_outcome`]).
pub(super) fn ended(
    end: JobEnd,
    stop: Option<(String, Option<u64>)>,
    lost_requeue: bool,
) -> Option<Outcome> {
    Some(match end {
        JobEnd::Failed { .. } => return None,
        JobEnd::Done => match stop {
            Some((trigger, step)) => Outcome::Stopped { trigger, step },
            None => Outcome::Succeeded,
        },
        JobEnd::Stopped { .. } if stop.is_some() => {
            let (trigger, step) = stop.unwrap_or_default();
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
            requeue: lost_requeue,
        },
    })
}

/// The job's verdict on attempt `attempt` (`current`) is a failure: the outcome that ends this
/// node, or `None` when another attempt follows. `stopping`: a stop is under way (it ends the
/// allocation). Keeps the attempt's highest step in `job`'s steps.
pub(super) fn failure_outcome(
    cfg: &SupervisorConfig,
    attempt: u32,
    current: &Attempt,
    job: &mut JobState,
    stopping: bool,
) -> Option<Outcome> {
    if no_progress_now(cfg, attempt, current, &mut job.steps) {
        return Some(Outcome::NoProgress {
            attempts: job.steps.per_attempt.len() as u32,
            // With a checkpoint file, its iteration is the step that did not grow.
            step: match cfg.progress_from_file {
                true => job.steps.checkpoint.latest,
                false => job.steps.highest,
            },
        });
    }
    if job.asked.exclude {
        // This node is to leave the job (ExcludeThisNode): it cannot go on without it, so
        // the job ends as for a lost node and is requeued elsewhere.
        return Some(Outcome::Lost {
            reason: exclusion_reason(cfg.node_rank, &job.asked),
            requeue: true,
        });
    }
    // A stop ends the allocation: no restart, whatever failed while stopping; so does a
    // rank's ShutdownWorkload.
    if attempt < job.max_restarts && !stopping && !job.asked.shutdown {
        return None;
    }
    Some(Outcome::Failed { restarts: attempt })
}

/// What node `node`, ending with `outcome`, tells the nodes still heading for another attempt
/// so that they do not wait for it (`None`: nothing; they reach the same verdict).
pub(super) fn leave_with(
    outcome: &Outcome,
    ending: &Ending,
    stopping: bool,
    asked: &Asked,
    node: u32,
) -> Option<JobEnd> {
    match outcome {
        Outcome::Signaled { .. } | Outcome::SpawnFailed { .. } => ending.stopped.clone(),
        _ if stopping => ending.stopped.clone(),
        Outcome::Lost { reason, .. } => Some(JobEnd::Lost {
            node: asked.exclude.then_some(node),
            reason: reason.clone(),
        }),
        _ => None,
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

/// The outcome of a verdict, on the parts it reads alone.
#[cfg(test)]
mod tests {
    use super::*;

    fn stopped(node: u32) -> JobEnd {
        JobEnd::Stopped {
            node,
            reason: "asked".into(),
            exit_code: 143,
        }
    }

    #[test]
    fn a_verdict_other_than_a_failure_ends_the_node_as_the_stop_asked_says() {
        let stop = Some(("SIGTERM".to_string(), Some(40)));
        let asked_stop = Outcome::Stopped {
            trigger: "SIGTERM".into(),
            step: Some(40),
        };
        assert_eq!(ended(JobEnd::Done, None, true), Some(Outcome::Succeeded));
        assert_eq!(
            ended(JobEnd::Done, stop.clone(), true),
            Some(asked_stop.clone())
        );
        assert_eq!(ended(stopped(2), stop, true), Some(asked_stop));
        let peer = Outcome::PeerStopped {
            node: 2,
            reason: "asked".into(),
            exit_code: 143,
        };
        assert_eq!(ended(stopped(2), None, true), Some(peer));
        let lost = JobEnd::Lost {
            reason: "gone".into(),
            node: None,
        };
        let requeue = |o: Option<Outcome>| match o {
            Some(Outcome::Lost { requeue, .. }) => requeue,
            other => panic!("{other:?}"),
        };
        assert!(!requeue(ended(lost, None, false)));
        let failed = JobEnd::Failed {
            node: 0,
            reason: "rank 1 exited 1".into(),
        };
        assert_eq!(ended(failed, None, true), None, "a failure restarts or not");
    }

    #[test]
    fn a_failure_restarts_within_the_budget_unless_stopping_shut_down_or_excluded() {
        let cfg = SupervisorConfig::basic(2, 3);
        let current = Attempt::none();
        let mut job = JobState::new(&cfg);
        assert_eq!(failure_outcome(&cfg, 2, &current, &mut job, false), None);
        let spent = Some(Outcome::Failed { restarts: 3 });
        assert_eq!(failure_outcome(&cfg, 3, &current, &mut job, false), spent);
        let ends = Some(Outcome::Failed { restarts: 1 });
        assert_eq!(failure_outcome(&cfg, 1, &current, &mut job, true), ends);
        job.asked.shutdown = true;
        assert_eq!(failure_outcome(&cfg, 1, &current, &mut job, false), ends);
        job.asked.exclude = true;
        let Some(Outcome::Lost { reason, requeue }) =
            failure_outcome(&cfg, 1, &current, &mut job, false)
        else {
            panic!("an excluded node leaves the job");
        };
        assert!(requeue && reason.contains("ExcludeThisNode"), "{reason}");
    }

    #[test]
    fn a_leaving_node_tells_the_others_how_it_stopped_or_that_it_is_lost() {
        let cfg = SupervisorConfig::basic(2, 3);
        let mut job = JobState::new(&cfg);
        let signaled = Outcome::Signaled { signal: 15 };
        let asked = job.asked.clone();
        assert_eq!(leave_with(&signaled, &job.ending, false, &asked, 1), None);
        job.ending.stopped = Some(stopped(1));
        assert_eq!(
            leave_with(&signaled, &job.ending, false, &asked, 1),
            Some(stopped(1))
        );
        let failed = Outcome::Failed { restarts: 3 };
        assert_eq!(leave_with(&failed, &job.ending, false, &asked, 1), None);
        assert_eq!(
            leave_with(&failed, &job.ending, true, &asked, 1),
            Some(stopped(1)),
            "a stop under way"
        );
        let lost = Outcome::Lost {
            reason: "excluded".into(),
            requeue: true,
        };
        let mut excluded = asked.clone();
        excluded.exclude = true;
        let end = JobEnd::Lost {
            reason: "excluded".into(),
            node: Some(1),
        };
        assert_eq!(
            leave_with(&lost, &job.ending, false, &excluded, 1),
            Some(end)
        );
    }
}
