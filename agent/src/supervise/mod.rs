//! The supervisor: the one place on a node that decides.
//!
//! It owns the attempt number, every rank's state, the restart budget and any stop in progress, and
//! maps `(state, now, event) -> actions`. It does no I/O and never reads a clock: the runtime feeds
//! it events with the time they happened and carries out the actions it returns. `next_deadline`
//! tells the runtime when to wake it with [`Event::Tick`] if nothing else happens first.
//!
//! Every node's supervisor goes through the same attempts in lockstep: it asks to [`JobRequest::Join`] a
//! attempt and starts its ranks once the job's rendezvous answers [`Event::Joined`]; it reports how
//! its part of the attempt ended ([`JobRequest::ReportEnd`], [`JobRequest::ReportDone`]) and acts on the
//! job's verdict ([`Event::AttemptEnded`]), which is the same on every node. So the attempt number is
//! the job's restart count and `--max-restarts` is one budget for the whole job.
//!
//! State is kept by how long it lives (`state.rs`): the configuration stays as launched; what the
//! job assigned this node (rank offset, restart budget) and what lasts the allocation is the
//! `JobState`; everything about one attempt is an `Attempt`, a fresh value each time one starts, so
//! nothing is reset by hand. Hangs (`HangWatch`), the timeout calculation (`TimeoutState` and the
//! attempt's `Requests`) and the stop agreement (`StopAgreement`) are small state machines of their
//! own, each unit-tested beside its code; those an `Attempt` is made of (`HangWatch`, a rank's
//! `Pace`, `Requests`) are in `machines.rs`, so the attempt's state imports no concern.
//!
//! `handle` only dispatches; each decision lives with its concern. Where a concern needs only some
//! of the supervisor's parts it is a free function of those parts, or a method of a parts view
//! (`timeouts::Calc`, `hangs::HangParts`, `inprocess::GenParts`: borrowed fields, picked by
//! `calc()`, `hang_parts()`, `gen_parts()`), not a method of the whole; every concern below has
//! them (`ranks::reaped`, `messages::on_liveness`, `hangs::earliest_hang`, `stopstep::on_step`,
//! `stopstep::stop_learned`, `stop::begin_stop`, `nodefault::note_fault`, `verdict::report`,
//! `verdict::failure_outcome`). What stays a method of `Supervisor` either only hands those its
//! parts (the call sites other concerns use, such as `begin_stop`), or needs most of the parts
//! and goes on to other concerns (a signal to the agent, what a rank's message asks for, acting
//! on a node fault, concluding a hang, a generation that cannot go on, the job's verdict):
//! - `ranks.rs`: starting an attempt's ranks; a rank started, failed to start, exited, disconnected.
//! - `messages.rs`: what a rank's messages mean (registration, steps, workload control, signals).
//! - `timeouts.rs`: timeouts in force, calculating them and adopting the job's.
//! - `hangs.rs`: the first rank due, which ranks are stopped, root cause, diagnosis (stacks).
//! - `stopstep.rs`: stopping at one agreed step (triggers, the agreement, the ranks' window).
//! - `stop.rs`: the agent's signals, stopping with a grace, escalating to SIGKILL.
//! - `inprocess.rs`: replacing a failed or hung rank in process, following another node's
//!   generation, survivors overdue (`generation/`: the generations' state and rules).
//! - `nodefault.rs`: a node that cannot go on (GPU fault, failed health check); stragglers.
//! - `verdict.rs`: reporting this node's end of an attempt, the job's verdict, back-off, the outcome.
//! - `view.rs`: a read-only view of the attempt's ranks, for the metrics page.
//! - `backoff.rs` (restart back-off), `progress.rs` (progress over attempts) and `monitor.rs`
//!   (per-rank liveness, timeout calculation) are plain functions over plain data; `events.rs`
//!   holds every type that goes in or comes out. The tests of `handle` are in `tests/`, a file per
//!   concern.

mod backoff;
mod events;
pub mod generation;
mod hangs;
mod inprocess;
mod machines;
mod messages;
pub mod monitor;
mod nodefault;
mod phase;
pub mod progress;
mod ranks;
mod state;
mod stop;
mod stopstep;
mod timeouts;
mod verdict;
mod view;

pub use backoff::Backoff;
pub use events::*;
pub use hangs::{choose_hung, HangKey};
pub use stopstep::{choose_stop_step, is_stop_signal, StepReport, AGREEMENT_BUDGET};
pub use view::{AttemptSteps, RankView};

use std::time::Instant;

use vigil_ipc::RankMsg;

use monitor::Timeouts;
use state::{Attempt, JobState, Phase};
use stopstep::StopAgreement;
use timeouts::TimeoutState;

/// The supervisor's state, by lifetime: the configuration (as launched), the job's state (what it
/// assigned and what lasts the allocation), the attempt under way (fresh per attempt), and the
/// two state machines that span attempts (the timeouts in force, the stop agreement).
#[derive(Debug, Clone)]
pub struct Supervisor {
    cfg: SupervisorConfig,
    /// The attempt under way (or being joined): the job's restart count.
    attempt: u32,
    phase: Phase,
    job: JobState,
    current: Attempt,
    timeouts: TimeoutState,
    /// A stop at an agreed step, once asked for (by any node); it ends the allocation.
    stop: StopAgreement,
    /// In-process restarts: the budget and the attempt's generations.
    gens: generation::Generations,
}

impl Supervisor {
    /// A supervisor about to start attempt 0; feed it the returned actions first.
    pub fn new(cfg: SupervisorConfig) -> (Self, Vec<Action>) {
        let s = Supervisor {
            attempt: 0,
            phase: Phase::Joining,
            job: JobState::new(&cfg),
            current: Attempt::none(),
            timeouts: TimeoutState::new(&cfg.timeouts),
            stop: StopAgreement::default(),
            gens: generation::Generations::new(cfg.in_process),
            cfg,
        };
        let mut actions = Vec::new();
        if s.timeouts.in_force.any() {
            actions.push(Action::Record(Record::TimeoutsUpdated {
                source: "configured",
                timeouts: s.timeouts.in_force.clone(),
            }));
        }
        actions.push(Action::Job(JobRequest::Join {
            attempt: 0,
            calculated: s.cfg.calculated.clone(),
        }));
        (s, actions)
    }

    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The attempt's generation (in-process restarts; 0 until a rank was replaced).
    pub fn generation(&self) -> u64 {
        self.gens.generation
    }

    /// Where this node's ranks stand in the job, as the last join placed them.
    pub fn placement(&self) -> Placement {
        self.job.placement
    }

    pub fn config(&self) -> &SupervisorConfig {
        &self.cfg
    }

    /// The job's restart budget, as node rank 0 handed it over at the last join.
    pub fn max_restarts(&self) -> u32 {
        self.job.max_restarts
    }

    /// Global rank of local rank 0 in the current attempt, as the job's rendezvous assigned it.
    pub fn rank_offset(&self) -> u32 {
        self.job.placement.rank_offset
    }

    /// Failures of the current attempt, first observed first.
    pub fn failures(&self) -> &[Failure] {
        &self.current.failures
    }

    /// The timeouts in force now.
    pub fn timeouts(&self) -> &Timeouts {
        &self.timeouts.in_force
    }

    /// A step a rank reported that was read only after the job ended here (its exit was reaped
    /// first): counted in [`Self::highest_step`], and nothing else.
    pub fn note_late_step(&mut self, at: Instant, local_rank: u32, msg: &RankMsg) {
        if let RankMsg::Progress { step } | RankMsg::Heartbeat { step: Some(step) } = msg {
            stopstep::on_step(
                &mut self.current,
                &mut self.job.steps,
                at,
                local_rank,
                *step,
            );
        }
    }

    /// Whether any rank said "training finished" (the job must not be requeued).
    pub fn training_finished(&self) -> bool {
        self.job.steps.training_finished
    }

    /// The highest step any local rank reported in this allocation.
    pub fn highest_step(&self) -> Option<u64> {
        self.job.steps.highest
    }

    /// The trigger and agreed step of the stop under way, if one was asked for.
    pub fn stop_asked(&self) -> Option<(String, Option<u64>)> {
        self.stop.asked()
    }

    /// A rank asked to shut the workload down (the job is not to run again).
    pub fn shutdown_asked(&self) -> bool {
        self.job.asked.shutdown
    }

    /// A rank asked to keep this node out of the job.
    pub fn exclude_asked(&self) -> bool {
        self.job.asked.exclude
    }

    /// The nodes this node's decisions blame (straggler reports): requeue without them.
    pub fn blamed_nodes(&self) -> &[u32] {
        &self.job.asked.blamed
    }

    pub fn is_finished(&self) -> bool {
        self.phase == Phase::Finished
    }

    /// Local rank of a rank leader's pid in the current attempt.
    pub fn local_rank_of(&self, pid: i32) -> Option<u32> {
        self.current.local_rank_of(pid)
    }

    pub fn next_deadline(&self) -> Option<Instant> {
        let own = match self.phase {
            Phase::Stopping {
                kill_at,
                killed: false,
                ..
            } => Some(kill_at),
            Phase::Running => {
                let hang = self
                    .current
                    .hangs
                    .deadline(|| self.earliest_hang().map(|(_, due)| due.at));
                [hang, self.gens.deadline()].into_iter().flatten().min()
            }
            Phase::BackingOff { until } => Some(until),
            _ => None,
        };
        let stop = self.stop.deadline(self.phase == Phase::Running);
        [own, stop].into_iter().flatten().min()
    }

    /// A tick while ranks run: a stop that is due, then (still running) a generation's waits,
    /// then hangs.
    fn running_tick(&mut self, now: Instant, out: &mut Vec<Action>) {
        self.stop_at_tick(now, out);
        self.stop_window_tick(now, out);
        if self.phase == Phase::Running {
            self.generation_tick(now, out);
        }
        if self.phase == Phase::Running {
            self.hang_tick(now, out);
        }
    }

    /// Decides what `event`, which happened at `now`, means: the one entry point. Each kind of event
    /// goes to the concern that owns it (ranks.rs, timeouts.rs, hangs.rs, stop.rs, verdict.rs);
    /// afterwards the job's verdict is settled the same way whatever the event was.
    pub fn handle(&mut self, now: Instant, event: Event) -> Vec<Action> {
        // A signal brings its window (Slurm's, which depends on when it came); a stop a peer asked
        // for or one ahead of the allocation's end keeps --term-timeout.
        self.job.term_timeout = match &event {
            Event::Signal { window, .. } => *window,
            _ => self.cfg.term_timeout,
        };
        if self.phase == Phase::Finished {
            return Vec::new();
        }
        let mut out = Vec::new();
        match event {
            Event::RankSpawned { local_rank, pid } => {
                let at = (self.attempt, self.job.placement.rank_offset);
                let rank = (local_rank, pid);
                ranks::on_spawned(&mut self.current, &self.phase, at, now, rank, &mut out)
            }
            Event::SpawnFailed { local_rank, error } => {
                self.on_spawn_failed(now, local_rank, error, &mut out)
            }
            Event::Reaped { pid, how } => self.on_reaped(now, pid, how, &mut out),
            Event::Signal { signal, .. } => self.on_signal(now, signal, &mut out),
            Event::Message { local_rank, msg } => self.on_message(now, local_rank, msg, &mut out),
            Event::Disconnected { local_rank } => {
                ranks::on_disconnected(&mut self.current, local_rank)
            }
            Event::StacksCaptured { local_rank } => {
                self.on_stacks_captured(now, local_rank, &mut out)
            }
            // While ranks run, a tick is about hangs; otherwise about a back-off or an escalation.
            Event::Tick if self.phase == Phase::Running => self.running_tick(now, &mut out),
            Event::Tick => {
                self.stop_at_tick(now, &mut out);
                self.backoff_tick(now, &mut out);
                stop::escalate_tick(&mut self.phase, &self.current, self.attempt, now, &mut out);
            }
            Event::StopAt { at, window } => self.stop.set_end(at, window),
            Event::StopAsked { attempt, trigger } => {
                self.on_stop_asked(now, attempt, trigger, &mut out)
            }
            Event::GenerationBegun {
                attempt,
                generation,
                replaced,
            } => self.on_generation_begun(now, attempt, generation, replaced, &mut out),
            Event::StopStep { attempt, step } => {
                let here = (self.attempt, &self.phase);
                stopstep::on_stop_step(&mut self.stop, here, attempt, step, &mut out)
            }
            Event::Probed { stopped, waiting } => {
                self.hang_parts()
                    .on_probed(now, (stopped, waiting), &mut out)
            }
            Event::HangAsked { attempt, round } => self
                .hang_parts()
                .on_hang_asked(now, attempt, round, &mut out),
            Event::HangNamed {
                attempt,
                round,
                hung,
            } => self
                .hang_parts()
                .on_hang_named(now, attempt, round, hung, &mut out),
            Event::Joined {
                attempt,
                placement,
                max_restarts,
                calculated,
            } => self.on_joined(now, attempt, placement, max_restarts, calculated, &mut out),
            Event::AttemptEnded { attempt, end } => {
                self.on_attempt_ended(now, attempt, end, &mut out)
            }
            Event::JobTimeouts {
                attempt,
                round,
                timeouts,
            } => self
                .calc()
                .on_job_timeouts(attempt, round, timeouts, &mut out),
            Event::CoordinationLost { reason, requeue } => {
                self.on_coordination_lost(now, reason, requeue, &mut out)
            }
            Event::NodeFault { reason, at_gate } => {
                self.on_node_fault(now, reason, at_gate, &mut out)
            }
            Event::Stragglers { nodes } => self.on_stragglers(now, nodes, &mut out),
            Event::Standby { attempt } => self.on_standby(now, attempt, &mut out),
            Event::CheckpointIteration {
                at_start,
                iteration,
            } => self.job.steps.checkpoint.read(at_start, iteration),
        }
        // A rank that ended or closed its connection is no longer waited for.
        self.calc().maybe_answer_requests(&mut out);
        self.settle(&mut out);
        out
    }
}

#[cfg(test)]
mod tests;
