//! Stopping: signals to the agent, stopping the ranks with a grace, and the escalation to SIGKILL.
//!
//! What a stop does to the attempt is a free function of the parts it touches: [`begin_stop`]
//! (the phase, the attempt, its number and the stop agreement's trigger), [`grace`],
//! [`kill_if_holding`] and [`escalate_tick`]. The supervisor's `begin_stop`/`begin_stop_except`
//! and `kill_if_holding` are only their call sites, for the concerns that stop the attempt
//! (`ranks.rs`, `hangs.rs`, `stopstep.rs`, ...). A signal to the agent (`on_signal`) stays a method:
//! it reads or changes every part but the timeouts (the phase, the attempt, the stop agreement,
//! how the job ends, the configuration) and goes on to the stop agreement, the report of this
//! node's end and a stop.

use std::time::{Duration, Instant};

use vigil_ipc::AgentMsg;

use super::events::{
    Action, JobEnd, JobRequest, Outcome, Record, StopReason, SIGINT, SIGKILL, SIGTERM,
};
use super::phase::Phase;
use super::state::Attempt;
use super::stopstep::is_stop_signal;
use super::{verdict, Supervisor};

impl Supervisor {
    pub(super) fn on_signal(&mut self, now: Instant, sig: i32, out: &mut Vec<Action>) {
        if self.standing_by() {
            return self.leave_as_standby(sig, out);
        }
        // SIGTERM/SIGUSR1/SIGUSR2 while ranks that call `should_stop(step)` run: checkpoint at one
        // agreed step instead of being signalled. Only this agent's own second signal is obeyed at
        // once (below): under Slurm every node gets the signal, and one that learned of the stop
        // from a faster node first must not take its own signal for a second one.
        if is_stop_signal(sig)
            && self.phase == Phase::Running
            && self.current.ranks.iter().any(|r| r.running() && r.listens)
            && self.stop.first_signal(sig)
        {
            let window = self.job.term_timeout;
            self.trigger_stop(now, crate::values::signal_name(sig), window, out);
            return;
        }
        // Obeyed at once: ranks that hold stop signals for `should_stop(step)` are told to stop now.
        if self.stop.under_way() && self.current.ranks.iter().any(|r| r.listens) {
            out.push(Action::SendToAll(AgentMsg::StopRequest {
                reason: crate::values::signal_name(sig),
                at_step: None,
            }));
        }
        match self.phase {
            Phase::Stopping {
                reason: StopReason::Signal,
                killed,
                ..
            } => {
                // A second SIGINT (Ctrl-C twice) means "now".
                if sig == SIGINT && !killed {
                    self.phase = Phase::Stopping {
                        reason: StopReason::Signal,
                        kill_at: now,
                        killed: false,
                    };
                }
            }
            _ => {
                self.job.ending.signal = Some(sig);
                let end = JobEnd::Stopped {
                    node: self.cfg.node_rank,
                    reason: format!(
                        "node {} received {}",
                        self.cfg.node_rank,
                        crate::values::signal_name(sig)
                    ),
                    exit_code: vigil_events::exit::signaled(sig),
                };
                self.job.ending.stopped = Some(end.clone());
                verdict::report(&mut self.current, self.attempt, end, out);
                match &mut self.phase {
                    // No rank runs: nothing to stop, `settle` ends the agent.
                    Phase::Joining | Phase::Waiting | Phase::BackingOff { .. } => {
                        self.phase = Phase::Waiting
                    }
                    Phase::Stopping { reason, .. } => {
                        // Already stopping after a failure: no restart any more, and forward the signal.
                        *reason = StopReason::Signal;
                        self.begin_stop(now, StopReason::Signal, sig, out);
                    }
                    _ => self.begin_stop(now, StopReason::Signal, sig, out),
                }
            }
        }
    }

    /// This node is a standby between verdicts (hot spares): it runs no ranks, and no stop of
    /// the job's is under way that it must take part in.
    fn standing_by(&self) -> bool {
        self.current.standby
            && self.current.end.is_none()
            && !self.stop.under_way()
            && matches!(self.phase, Phase::Waiting | Phase::Joining)
    }

    /// A signal to a standby's agent (a node drained, a spare preempted): the standby leaves
    /// the job, which runs on without it; the coordinator records it. The agent ends as
    /// signalled, poisoning nothing.
    fn leave_as_standby(&mut self, sig: i32, out: &mut Vec<Action>) {
        let node = self.cfg.node_rank;
        let reason = format!(
            "standby node {node} left the job: its agent received {}",
            crate::values::signal_name(sig)
        );
        out.push(Action::Job(JobRequest::Depart { reason }));
        self.finish(Outcome::Signaled { signal: sig }, out);
    }

    /// Signal every live rank and arm the escalation deadline. A stop already under way keeps its
    /// earlier deadline but takes the stronger reason (a signal to the agent beats a restart).
    pub(super) fn begin_stop(
        &mut self,
        now: Instant,
        reason: StopReason,
        signal: i32,
        out: &mut Vec<Action>,
    ) {
        self.begin_stop_except(now, reason, signal, None, out)
    }

    /// As `begin_stop`, but the group `special.0` gets signal `special.1` instead (a hung rank
    /// gets the rank termination signal, not the graceful SIGTERM). The call site of
    /// [`begin_stop`]: it hands over the parts a stop reads.
    pub(super) fn begin_stop_except(
        &mut self,
        now: Instant,
        reason: StopReason,
        signal: i32,
        special: Option<(i32, i32)>,
        out: &mut Vec<Action>,
    ) {
        let graces = (self.job.term_timeout, self.cfg.workers_stop_timeout);
        let grace = grace(reason, &self.current, graces);
        let under_way = (self.attempt, self.stop.asked().map(|(trigger, _)| trigger));
        let order = (reason, signal, special);
        let (phase, current) = (&mut self.phase, &mut self.current);
        begin_stop(phase, current, under_way, grace, now, order, out);
    }

    /// A rank said which signals it holds (or that one arrived): [`kill_if_holding`].
    pub(super) fn kill_if_holding(&mut self, local_rank: u32, out: &mut Vec<Action>) {
        let term = self.cfg.termination_signal;
        kill_if_holding(&self.current, &self.phase, term, local_rank, out);
    }
}

/// The grace a stop for `reason` gives the ranks, from `--term-timeout` as the runtime last set it
/// and `--workers-stop-timeout` (`graces`, in that order).
pub(super) fn grace(
    reason: StopReason,
    current: &Attempt,
    (term_timeout, workers_stop_timeout): (Duration, Duration),
) -> Duration {
    match reason {
        StopReason::Signal => term_timeout,
        // A node stopped for good by a signal gives ours the same time to save their work.
        StopReason::Peer if matches!(current.end, Some(JobEnd::Stopped { .. })) => term_timeout,
        StopReason::RankFailed
        | StopReason::RankHung
        | StopReason::SpawnFailed
        | StopReason::Peer => workers_stop_timeout,
    }
}

/// Stops attempt `attempt`'s ranks for `reason`: `signal` to every live rank's group (`special.0`
/// gets `special.1` instead), and the escalation armed at `now + grace`. `trigger` is that of the
/// stop agreement under way (`None`: no stop was asked for). A stop already under way keeps its
/// earlier deadline but takes the stronger reason (a signal to the agent beats a restart).
pub(super) fn begin_stop(
    phase: &mut Phase,
    current: &mut Attempt,
    (attempt, trigger): (u32, Option<String>),
    grace: Duration,
    now: Instant,
    (reason, signal, special): (StopReason, i32, Option<(i32, i32)>),
    out: &mut Vec<Action>,
) {
    let kill_at = now + grace;
    match phase {
        Phase::Running => {
            *phase = Phase::Stopping {
                reason,
                kill_at,
                killed: false,
            };
        }
        Phase::Stopping {
            reason: r,
            kill_at: k,
            ..
        } => {
            if reason == StopReason::Signal {
                *r = reason;
                *k = (*k).min(kill_at);
            } else {
                return;
            }
        }
        Phase::Finished | Phase::Joining | Phase::Waiting | Phase::BackingOff { .. } => return,
    }
    let pids = current.live_pids();
    current.kill_holders = stop_is_immediate(reason, trigger.is_some(), current);
    let sig_for = |p: i32| {
        special
            .filter(|(sp, _)| *sp == p)
            .map_or(signal, |(_, s)| s)
    };
    // A rank that holds the signal for `should_stop` would only note it and run on (or stay
    // blocked in a collective) until the grace ends: a stop that must end it gets SIGKILL.
    let killed: Vec<i32> = pids
        .iter()
        .copied()
        .filter(|p| current.kill_holders && holds(current, *p, sig_for(*p)))
        .collect();
    out.push(Action::Record(Record::Stop {
        attempt,
        reason,
        signal,
        grace_ms: grace.as_millis() as u64,
        pids: pids.clone(),
        killed: killed.clone(),
        trigger,
    }));
    if !killed.is_empty() {
        out.push(Action::SignalGroups {
            pgids: killed.clone(),
            signal: SIGKILL,
        });
    }
    let (special_pids, rest): (Vec<i32>, Vec<i32>) = pids
        .into_iter()
        .filter(|p| !killed.contains(p))
        .partition(|p| special.is_some_and(|(sp, _)| sp == *p));
    if !rest.is_empty() {
        out.push(Action::SignalGroups {
            pgids: rest,
            signal,
        });
    }
    if let (Some((_, sig)), false) = (special, special_pids.is_empty()) {
        out.push(Action::SignalGroups {
            pgids: special_pids,
            signal: sig,
        });
    }
}

/// Whether a stop for `reason` ends the ranks at once: a failure, a hang or a lost node is not
/// a preemption, so there is nothing to save at a step and nothing to wait for. Only a stop
/// at an agreed step (a signal, the time limit, a node stopped for good) gives the ranks that
/// hold the stop signal time to save; so does a failure during such a stop (`agreed_stop`: one is
/// under way), whose ranks were already asked to save at that step.
fn stop_is_immediate(reason: StopReason, agreed_stop: bool, current: &Attempt) -> bool {
    !agreed_stop
        && match reason {
            StopReason::RankFailed | StopReason::RankHung | StopReason::SpawnFailed => true,
            StopReason::Peer => !matches!(current.end, Some(JobEnd::Stopped { .. })),
            StopReason::Signal => false,
        }
}

/// Whether the rank of `attempt` whose process group is `pid` holds `sig` for `should_stop`.
fn holds(current: &Attempt, pid: i32, sig: i32) -> bool {
    current
        .ranks
        .iter()
        .any(|r| r.pid == Some(pid) && holds_signal(r.holds, sig))
}

/// A rank said which signals it holds (or that one arrived): during a stop that ends ranks at
/// once (in `phase`), a rank that holds what it was sent (SIGTERM, or the rank `termination`
/// signal) gets SIGKILL now. A rank whose message the agent had not read yet when the stop began
/// is caught here.
pub(super) fn kill_if_holding(
    current: &Attempt,
    phase: &Phase,
    termination: i32,
    local_rank: u32,
    out: &mut Vec<Action>,
) {
    let Some(r) = current.ranks.get(local_rank as usize) else {
        return;
    };
    let (Some(pid), true) = (r.pid, r.running()) else {
        return;
    };
    let sent = [SIGTERM, termination];
    if current.kill_holders
        && matches!(phase, Phase::Stopping { killed: false, .. })
        && sent.iter().any(|s| holds_signal(r.holds, *s))
    {
        out.push(Action::SignalGroups {
            pgids: vec![pid],
            signal: SIGKILL,
        });
    }
}

/// A tick at `now`: a stop of attempt `attempt` whose grace is over gets every rank still alive
/// SIGKILL, once.
pub(super) fn escalate_tick(
    phase: &mut Phase,
    current: &Attempt,
    attempt: u32,
    now: Instant,
    out: &mut Vec<Action>,
) {
    let Phase::Stopping {
        kill_at,
        killed: false,
        reason,
    } = *phase
    else {
        return;
    };
    if now < kill_at {
        return;
    }
    *phase = Phase::Stopping {
        reason,
        kill_at,
        killed: true,
    };
    let pids = current.live_pids();
    out.push(Action::Record(Record::Escalate {
        attempt,
        signal: SIGKILL,
        pids: pids.clone(),
    }));
    out.push(Action::SignalGroups {
        pgids: pids,
        signal: SIGKILL,
    });
}

/// Whether bit `sig` is set in a `HoldsSignals` mask.
pub(super) fn holds_signal(mask: u64, sig: i32) -> bool {
    (1..64).contains(&sig) && mask & (1u64 << sig) != 0
}
