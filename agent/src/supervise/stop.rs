//! Stopping: signals to the agent, stopping the ranks with a grace, and the escalation to SIGKILL.

use std::time::Instant;

use vigil_ipc::AgentMsg;

use super::events::{Action, JobEnd, Record, StopReason, SIGINT, SIGKILL, SIGTERM};
use super::phase::Phase;
use super::stopstep::is_stop_signal;
use super::{verdict, Supervisor};

impl Supervisor {
    pub(super) fn on_signal(&mut self, now: Instant, sig: i32, out: &mut Vec<Action>) {
        // SIGTERM/SIGUSR1/SIGUSR2 while ranks that call `should_stop(step)` run: checkpoint at one
        // agreed step instead of being signalled. Only this agent's own second signal is obeyed at
        // once (below): under Slurm every node gets the signal, and one that learned of the stop
        // from a faster node first must not take its own signal for a second one.
        if is_stop_signal(sig)
            && self.phase == Phase::Running
            && self.attempt.ranks.iter().any(|r| r.running() && r.listens)
            && self.stop.first_signal(sig)
        {
            let window = self.job.term_timeout;
            self.trigger_stop(now, crate::values::signal_name(sig), window, out);
            return;
        }
        // Obeyed at once: ranks that hold stop signals for `should_stop(step)` are told to stop now.
        if self.stop.under_way() && self.attempt.ranks.iter().any(|r| r.listens) {
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
                verdict::report(&mut self.attempt, self.cycle, end, out);
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
    /// gets the rank termination signal, not the graceful SIGTERM).
    pub(super) fn begin_stop_except(
        &mut self,
        now: Instant,
        reason: StopReason,
        signal: i32,
        special: Option<(i32, i32)>,
        out: &mut Vec<Action>,
    ) {
        let grace = match reason {
            StopReason::Signal => self.job.term_timeout,
            // A node stopped for good by a signal gives ours the same time to save their work.
            StopReason::Peer if matches!(self.attempt.end, Some(JobEnd::Stopped { .. })) => {
                self.job.term_timeout
            }
            StopReason::RankFailed
            | StopReason::RankHung
            | StopReason::SpawnFailed
            | StopReason::Peer => self.cfg.workers_stop_timeout,
        };
        let kill_at = now + grace;
        match &mut self.phase {
            Phase::Running => {
                self.phase = Phase::Stopping {
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
        let pids = self.attempt.live_pids();
        self.attempt.kill_holders = self.stop_is_immediate(reason);
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
            .filter(|p| self.attempt.kill_holders && self.holds(*p, sig_for(*p)))
            .collect();
        out.push(Action::Record(Record::Stop {
            cycle: self.cycle,
            reason,
            signal,
            grace_ms: grace.as_millis() as u64,
            pids: pids.clone(),
            killed: killed.clone(),
            trigger: self.stop.asked().map(|(trigger, _)| trigger),
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
    /// hold the stop signal time to save; so does a failure during such a stop, whose ranks were
    /// already asked to save at that step.
    pub(super) fn stop_is_immediate(&self, reason: StopReason) -> bool {
        !self.stop.under_way()
            && match reason {
                StopReason::RankFailed | StopReason::RankHung | StopReason::SpawnFailed => true,
                StopReason::Peer => !matches!(self.attempt.end, Some(JobEnd::Stopped { .. })),
                StopReason::Signal => false,
            }
    }

    /// Whether the rank whose process group is `pid` holds `sig` for `should_stop`.
    fn holds(&self, pid: i32, sig: i32) -> bool {
        self.attempt
            .ranks
            .iter()
            .any(|r| r.pid == Some(pid) && holds_signal(r.holds, sig))
    }

    /// A rank said which signals it holds (or that one arrived): during a stop that ends ranks at
    /// once, a rank that holds what it was sent gets SIGKILL now. A rank whose message the agent
    /// had not read yet when the stop began is caught here.
    pub(super) fn kill_if_holding(&mut self, local_rank: u32, out: &mut Vec<Action>) {
        let Some(r) = self.attempt.ranks.get(local_rank as usize) else {
            return;
        };
        let (Some(pid), true) = (r.pid, r.running()) else {
            return;
        };
        let sent = [SIGTERM, self.cfg.termination_signal];
        if self.attempt.kill_holders
            && matches!(self.phase, Phase::Stopping { killed: false, .. })
            && sent.iter().any(|s| holds_signal(r.holds, *s))
        {
            out.push(Action::SignalGroups {
                pgids: vec![pid],
                signal: SIGKILL,
            });
        }
    }

    /// A stop whose grace is over: every rank still alive gets SIGKILL, once.
    pub(super) fn escalate_tick(&mut self, now: Instant, out: &mut Vec<Action>) {
        if let Phase::Stopping {
            kill_at,
            killed: false,
            reason,
        } = self.phase
        {
            if now >= kill_at {
                self.phase = Phase::Stopping {
                    reason,
                    kill_at,
                    killed: true,
                };
                let pids = self.attempt.live_pids();
                out.push(Action::Record(Record::Escalate {
                    cycle: self.cycle,
                    signal: SIGKILL,
                    pids: pids.clone(),
                }));
                out.push(Action::SignalGroups {
                    pgids: pids,
                    signal: SIGKILL,
                });
            }
        }
    }
}

/// Whether bit `sig` is set in a `HoldsSignals` mask.
pub(super) fn holds_signal(mask: u64, sig: i32) -> bool {
    (1..64).contains(&sig) && mask & (1u64 << sig) != 0
}
