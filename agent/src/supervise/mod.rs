//! The supervisor: the one place on a node that decides.
//!
//! It owns the cycle number, every rank's state, the restart budget and any stop in progress, and
//! maps `(state, now, event) -> actions`. It does no I/O and never reads a clock: the runtime feeds
//! it events with the time they happened and carries out the actions it returns. `next_deadline`
//! tells the runtime when to wake it with [`Event::Tick`] if nothing else happens first.
//!
//! Every node's supervisor goes through the same cycles in lockstep: it asks to [`JobRequest::Join`] a
//! cycle and starts its ranks once the job's rendezvous answers [`Event::Joined`]; it reports how
//! its part of the cycle ended ([`JobRequest::ReportEnd`], [`JobRequest::ReportDone`]) and acts on the
//! job's verdict ([`Event::CycleEnded`]), which is the same on every node. So the cycle number is
//! the job's restart count and `--max-restarts` is one budget for the whole job.
//!
//! `handle` only dispatches; each decision lives with its concern:
//! - `ranks.rs`: starting a cycle's ranks; a rank started, failed to start, exited, disconnected.
//! - `timeouts.rs`: rank messages, timeouts in force, calculating them and adopting the job's.
//! - `hangs.rs`: the first rank due, which ranks are stopped, root cause, diagnosis (stacks).
//! - `stop.rs`: the agent's signals, stopping with a grace, escalating to SIGKILL.
//! - `nodefault.rs`: a node that cannot go on (GPU fault, failed health check); stragglers.
//! - `verdict.rs`: reporting this node's end of a cycle, the job's verdict, back-off, the outcome.
//! - `backoff.rs` (restart back-off) and `monitor.rs` (per-rank liveness, timeout calculation) are
//!   plain functions over plain data; `events.rs` holds every type that goes in or comes out.

mod backoff;
mod events;
mod hangs;
pub mod monitor;
mod nodefault;
pub mod progress;
mod ranks;
mod stop;
mod stopstep;
mod timeouts;
mod verdict;

pub use backoff::Backoff;
pub use events::*;
pub use stopstep::{choose_stop_step, is_stop_signal, StepReport, AGREEMENT_BUDGET};
use stopstep::{Pace, StopState};

use std::time::{Duration, Instant};

use serde::Serialize;
use vigil_ipc::{AgentMsg, RankMsg};

use monitor::{CalcRequest, Calculated, Due, HangKind, Observed, RankMonitor, Timeouts};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RankState {
    NotStarted,
    Running,
    Exited(ExitKind),
    SpawnFailed,
}

#[derive(Debug, Clone)]
struct Rank {
    pid: Option<i32>,
    state: RankState,
    /// Liveness, from the moment the rank was started.
    monitor: Option<RankMonitor>,
    /// The steps it reported (`should_stop(step)`, heartbeats with a step).
    pace: Option<Pace>,
    /// It reported its step through `vigil.should_stop(step)`, so it stops at the agreed step.
    listens: bool,
    /// It cannot be asked to stop at a step and was signalled instead: its exit is expected.
    told_to_stop: bool,
    /// The signals it holds for `should_stop(step)` (bit n: signal n): they would not end it.
    holds: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// Waiting for the rendezvous of `cycle` (no rank runs).
    Joining,
    Running,
    Stopping {
        reason: StopReason,
        kill_at: Instant,
        killed: bool,
    },
    /// Every local rank exited 0; waiting for the other nodes.
    Waiting,
    /// The last attempt failed; join `cycle` (already the next one) at `until`.
    BackingOff {
        until: Instant,
    },
    Finished,
}

/// A calculation this node shared with the others, waiting for the job's result: what this node
/// could calculate (and which sections), and which local ranks to answer.
#[derive(Debug, Clone)]
struct Answering {
    round: u32,
    done: Calculated,
    sections: Vec<String>,
    ranks: Vec<u32>,
}

#[derive(Debug, Clone)]
pub struct Supervisor {
    cfg: SupervisorConfig,
    cycle: u32,
    ranks: Vec<Rank>,
    phase: Phase,
    /// Failures of the current cycle in the order observed; the first is the root cause.
    failures: Vec<Failure>,
    /// The signal that ended the agent, if any.
    signal: Option<i32>,
    spawn_error: Option<(u32, String)>,
    /// The timeouts in force now.
    timeouts: Timeouts,
    /// The last calculated timeouts (loaded or from this run), blended into the next calculation.
    calculated: Option<Timeouts>,
    calculated_this_cycle: bool,
    /// The job's code calculates timeouts when it asks (NVRx's client announced itself or asked):
    /// vigil then never calculates on its own.
    on_request: bool,
    /// Calculation requests of this cycle so far (the round of the latest one).
    calc_round: u32,
    /// The request being collected: what was asked and which local ranks asked.
    asking: Option<(CalcRequest, Vec<u32>)>,
    /// The round shared with the other nodes, waiting for the job's result.
    answering: Option<Answering>,
    /// A rank of this cycle was declared hung: nothing it or the others do from then on says what
    /// the job needs, so nothing more is calculated in this cycle.
    hang_seen: bool,
    /// A hung rank whose stacks are being captured: rank, why, and when to stop waiting.
    diagnosing: Option<(u32, Hang, Instant)>,
    /// A hang is due and the runtime was asked which ranks are stopped (`ProbeStopped`).
    probing: bool,
    training_finished: bool,
    /// The job's verdict on the current cycle, once known.
    end: Option<JobEnd>,
    /// Whether this node already reported how the current cycle ended here.
    reported: bool,
    /// For a `Lost` verdict that came from this node's own coordination: may a requeue help?
    lost_requeue: bool,
    /// Whether the current cycle's process groups were already swept.
    reaped: bool,
    /// How this node stopped the job for good (a signal beats a rank that could not start): what
    /// nodes still heading for another cycle are told when this one leaves.
    stopped: Option<JobEnd>,
    /// When the current cycle started and when the job's verdict on it came.
    started_at: Option<Instant>,
    ended_at: Option<Instant>,
    /// Restarts in the current back-off streak.
    streak: u32,
    /// A stop at an agreed step, once asked for (by any node); it ends the allocation.
    stop: Option<StopState>,
    /// The stop signal this agent received, forwarded to ranks that cannot be asked.
    stop_sig: Option<i32>,
    /// The ranks are being stopped at once (a failure, a hang, a lost node): a rank that holds
    /// the stop signal gets SIGKILL.
    kill_holders: bool,
    /// When to ask for a stop ahead of the allocation's end, and the window the ranks then get.
    stop_at: Option<(Instant, Duration)>,
    /// The highest step any local rank reported in this allocation.
    highest_step: Option<u64>,
    /// The highest step reached in each attempt that ended, in order.
    attempt_steps: Vec<Option<u64>>,
    /// Why this node cannot run ranks any more (`NodeFault`); it leaves the job.
    fault: Option<String>,
    /// Nodes to requeue without, found by straggler reports (node rank 0).
    blamed: Vec<u32>,
    /// A rank asked (NVRx's workload control) for no further attempt / to exclude this node.
    shutdown_asked: bool,
    exclude_asked: bool,
}

impl Supervisor {
    /// A supervisor about to start cycle 0; feed it the returned actions first.
    pub fn new(cfg: SupervisorConfig) -> (Self, Vec<Action>) {
        let mut s = Supervisor {
            ranks: Vec::new(),
            cfg,
            cycle: 0,
            phase: Phase::Running,
            failures: Vec::new(),
            signal: None,
            spawn_error: None,
            timeouts: Timeouts::default(),
            calculated: None,
            calculated_this_cycle: false,
            on_request: false,
            calc_round: 0,
            asking: None,
            answering: None,
            hang_seen: false,
            diagnosing: None,
            probing: false,
            training_finished: false,
            end: None,
            reported: false,
            lost_requeue: true,
            reaped: false,
            stopped: None,
            started_at: None,
            ended_at: None,
            streak: 0,
            stop: None,
            stop_sig: None,
            kill_holders: false,
            stop_at: None,
            highest_step: None,
            attempt_steps: Vec::new(),
            shutdown_asked: false,
            exclude_asked: false,
            fault: None,
            blamed: Vec::new(),
        };
        let mut actions = Vec::new();
        s.timeouts = s.cfg.timeouts.clone();
        if s.timeouts.any() {
            actions.push(Action::Record(Record::TimeoutsUpdated {
                source: "configured",
                timeouts: s.timeouts.clone(),
            }));
        }
        s.phase = Phase::Joining;
        actions.push(Action::Job(JobRequest::Join {
            cycle: 0,
            calculated: s.cfg.calculated.clone(),
        }));
        (s, actions)
    }

    pub fn cycle(&self) -> u32 {
        self.cycle
    }

    pub fn config(&self) -> &SupervisorConfig {
        &self.cfg
    }

    /// `--term-timeout` from now on: the runtime gives a signal Slurm's window (KillWait at the
    /// time limit, GraceTime at a preemption), which depends on when it comes.
    pub fn set_term_timeout(&mut self, window: Duration) {
        self.cfg.term_timeout = window;
    }

    /// Failures of the current cycle, first observed first.
    pub fn failures(&self) -> &[Failure] {
        &self.failures
    }

    /// The timeouts in force now.
    pub fn timeouts(&self) -> &Timeouts {
        &self.timeouts
    }

    /// A step a rank reported that was read only after the job ended here (its exit was reaped
    /// first): counted in [`Self::highest_step`], and nothing else.
    pub fn note_late_step(&mut self, at: Instant, local_rank: u32, msg: &RankMsg) {
        if let RankMsg::Progress { step } | RankMsg::Heartbeat { step: Some(step) } = msg {
            self.on_step(at, local_rank, *step);
        }
    }

    /// Whether any rank said "training finished" (the job must not be requeued).
    pub fn training_finished(&self) -> bool {
        self.training_finished
    }

    /// The highest step any local rank reported in this allocation.
    pub fn highest_step(&self) -> Option<u64> {
        self.highest_step
    }

    /// The lowest and highest step this attempt's ranks last reported (`None`: none reported).
    pub fn step_range(&self) -> Option<(u64, u64)> {
        let steps = self.ranks.iter().filter_map(|r| r.pace.map(|p| p.step));
        let (lo, hi) = steps.fold((u64::MAX, None), |(lo, hi): (u64, Option<u64>), s| {
            (lo.min(s), Some(hi.map_or(s, |h| h.max(s))))
        });
        hi.map(|h| (lo, h))
    }

    /// The trigger and agreed step of the stop under way, if one was asked for.
    pub fn stop_asked(&self) -> Option<(String, Option<u64>)> {
        self.stop
            .as_ref()
            .map(|s| (s.trigger.clone(), s.agreed.flatten()))
    }

    /// A rank asked to shut the workload down (the job is not to run again).
    pub fn shutdown_asked(&self) -> bool {
        self.shutdown_asked
    }

    /// A rank asked to keep this node out of the job.
    pub fn exclude_asked(&self) -> bool {
        self.exclude_asked
    }

    /// The nodes this node's decisions blame (straggler reports): requeue without them.
    pub fn blamed_nodes(&self) -> &[u32] {
        &self.blamed
    }

    pub fn is_finished(&self) -> bool {
        self.phase == Phase::Finished
    }

    /// Local rank of a rank leader's pid in the current cycle.
    pub fn local_rank_of(&self, pid: i32) -> Option<u32> {
        self.ranks
            .iter()
            .position(|r| r.pid == Some(pid))
            .map(|i| i as u32)
    }

    pub fn next_deadline(&self) -> Option<Instant> {
        let own = match self.phase {
            Phase::Stopping {
                kill_at,
                killed: false,
                ..
            } => Some(kill_at),
            Phase::Running => match &self.diagnosing {
                Some((_, _, until)) => Some(*until),
                None => self.earliest_hang().map(|(_, due)| due.at),
            },
            Phase::BackingOff { until } => Some(until),
            _ => None,
        };
        let stop = match &self.stop {
            None => self.stop_at.map(|(at, _)| at),
            Some(st) if !st.overdue && self.phase == Phase::Running => Some(st.deadline),
            Some(_) => None,
        };
        [own, stop].into_iter().flatten().min()
    }

    /// Decides what `event`, which happened at `now`, means: the one entry point. Each kind of event
    /// goes to the concern that owns it (ranks.rs, timeouts.rs, hangs.rs, stop.rs, verdict.rs);
    /// afterwards the job's verdict is settled the same way whatever the event was.
    pub fn handle(&mut self, now: Instant, event: Event) -> Vec<Action> {
        if self.phase == Phase::Finished {
            return Vec::new();
        }
        let mut out = Vec::new();
        match event {
            Event::RankSpawned { local_rank, pid } => {
                self.on_spawned(now, local_rank, pid, &mut out)
            }
            Event::SpawnFailed { local_rank, error } => {
                self.on_spawn_failed(now, local_rank, error, &mut out)
            }
            Event::Reaped { pid, how } => self.on_reaped(now, pid, how, &mut out),
            Event::Signal(sig) => self.on_signal(now, sig, &mut out),
            Event::Message { local_rank, msg } => self.on_message(now, local_rank, msg, &mut out),
            Event::Disconnected { local_rank } => self.on_disconnected(local_rank),
            Event::StacksCaptured { local_rank } => {
                self.on_stacks_captured(now, local_rank, &mut out)
            }
            // While ranks run, a tick is about hangs; otherwise about a back-off or an escalation.
            Event::Tick if self.phase == Phase::Running => {
                self.stop_at_tick(now, &mut out);
                self.stop_window_tick(now, &mut out);
                if self.phase == Phase::Running {
                    self.hang_tick(now, &mut out);
                }
            }
            Event::Tick => {
                self.stop_at_tick(now, &mut out);
                self.backoff_tick(now, &mut out);
                self.escalate_tick(now, &mut out);
            }
            Event::StopAt { at, window } => self.stop_at = at.map(|a| (a, window)),
            Event::StopAsked { cycle, trigger } => {
                self.on_stop_asked(now, cycle, trigger, &mut out)
            }
            Event::StopStep { cycle, step } => self.on_stop_step(cycle, step, &mut out),
            Event::Probed { stopped } => self.on_probed(now, stopped, &mut out),
            Event::Joined {
                cycle,
                rank_offset,
                world_size,
                max_restarts,
                calculated,
            } => self.on_joined(
                now,
                cycle,
                (rank_offset, world_size),
                max_restarts,
                calculated,
                &mut out,
            ),
            Event::CycleEnded { cycle, end } => self.on_cycle_ended(now, cycle, end, &mut out),
            Event::JobTimeouts {
                cycle,
                round,
                timeouts,
            } => self.on_job_timeouts(cycle, round, timeouts, &mut out),
            Event::CoordinationLost { reason, requeue } => {
                self.on_coordination_lost(now, reason, requeue, &mut out)
            }
            Event::NodeFault { reason, at_gate } => {
                self.on_node_fault(now, reason, at_gate, &mut out)
            }
            Event::Stragglers { nodes } => self.on_stragglers(now, nodes, &mut out),
            Event::Standby { cycle } => self.on_standby(now, cycle, &mut out),
        }
        // A rank that ended or closed its connection is no longer waited for.
        self.maybe_answer_requests(&mut out);
        self.settle(&mut out);
        out
    }
}

#[cfg(test)]
mod tests;
