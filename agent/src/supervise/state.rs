//! The supervisor's state, by how long it lives.
//!
//! - [`JobState`]: what the job assigned this node (its rank offset, the job's restart budget) and
//!   what this node keeps for the whole allocation (steps reached, how it ends, what it was asked).
//! - [`Attempt`]: everything about one attempt: its ranks, failures, the job's verdict on
//!   it, the hang watch and the timeout requests. A fresh value at each attempt's start, so nothing
//!   of one attempt leaks into the next.
//!
//! The configuration ([`SupervisorConfig`]) stays as the launch gave it.

use std::time::{Duration, Instant};

use super::events::{Failure, JobEnd, Placement, SupervisorConfig};
pub(super) use super::machines::{HangStep, HangWatch, Pace, Requests};
use super::monitor::{Observed, RankMonitor};
pub(super) use super::phase::{Phase, RankState};

#[derive(Debug, Clone)]
pub(super) struct Rank {
    pub pid: Option<i32>,
    pub state: RankState,
    /// Liveness, from the moment the rank was started.
    pub monitor: Option<RankMonitor>,
    /// The steps it reported (`should_stop(step)`, heartbeats with a step).
    pub pace: Option<Pace>,
    /// It reported its step through `vigil.should_stop(step)`, so it stops at the agreed step.
    pub listens: bool,
    /// It cannot be asked to stop at a step and was signalled instead: its exit is expected.
    pub told_to_stop: bool,
    /// The signals it holds for `should_stop(step)` (bit n: signal n): they would not end it.
    pub holds: u64,
    /// The uncaught exception its main thread ended with, as it told (`vigil`'s exception hook):
    /// it is on its way out, however long that takes.
    pub raised: Option<String>,
}

impl Rank {
    fn new() -> Self {
        Rank {
            pid: None,
            state: RankState::NotStarted,
            monitor: None,
            pace: None,
            listens: false,
            told_to_stop: false,
            holds: 0,
            raised: None,
        }
    }

    pub fn running(&self) -> bool {
        self.state == RankState::Running
    }
}

/// One attempt: created when its ranks start (or this node stands by in it); the next attempt's
/// start drops it.
#[derive(Debug, Clone)]
pub(super) struct Attempt {
    /// The attempt's number: during a back-off and the next rendezvous the supervisor's attempt is
    /// already the next one while this is still the last attempt.
    pub attempt: u32,
    pub ranks: Vec<Rank>,
    /// Failures in the order observed; the first is the root cause.
    pub failures: Vec<Failure>,
    /// The job's verdict on the attempt, once known. Cleared when the next attempt is joined: a
    /// verdict on that one (a node that left the job poisons it) must not be taken for a repeat.
    pub end: Option<JobEnd>,
    /// This node already reported how the attempt ended here.
    pub reported: bool,
    /// The attempt's process groups were already swept.
    pub reaped: bool,
    /// When the attempt started and when the job's verdict on it came.
    pub started_at: Option<Instant>,
    pub ended_at: Option<Instant>,
    /// The ranks are being stopped at once (a failure, a hang, a lost node): a rank that holds
    /// the stop signal gets SIGKILL.
    pub kill_holders: bool,
    pub hangs: HangWatch,
    /// Timeout calculations asked for (or done by vigil) in this attempt.
    pub requests: Requests,
    /// The highest step a rank had reached when it closed a checkpoint section in this attempt.
    pub saved: Option<u64>,
    /// This node stands by in the attempt (hot spares): no ranks, no slot.
    pub standby: bool,
}

impl Attempt {
    /// Before the first attempt: no ranks, nothing observed.
    pub fn none() -> Self {
        Attempt {
            attempt: 0,
            ranks: Vec::new(),
            failures: Vec::new(),
            end: None,
            reported: false,
            reaped: false,
            started_at: None,
            ended_at: None,
            kill_holders: false,
            hangs: HangWatch::default(),
            requests: Requests::default(),
            saved: None,
            standby: false,
        }
    }

    /// An attempt whose `nproc` ranks are about to be started.
    pub fn start(now: Instant, nproc: u32) -> Self {
        Attempt {
            ranks: (0..nproc).map(|_| Rank::new()).collect(),
            started_at: Some(now),
            ..Attempt::none()
        }
    }

    /// An attempt this node stands by in: no ranks, and nothing to report.
    pub fn standby(now: Instant) -> Self {
        Attempt {
            reported: true,
            standby: true,
            ..Attempt::start(now, 0)
        }
    }

    /// Local rank of a rank leader's pid.
    pub fn local_rank_of(&self, pid: i32) -> Option<u32> {
        self.ranks
            .iter()
            .position(|r| r.pid == Some(pid))
            .map(|i| i as u32)
    }

    pub fn live_pids(&self) -> Vec<i32> {
        self.ranks
            .iter()
            .filter(|r| r.running())
            .filter_map(|r| r.pid)
            .collect()
    }

    /// A rank still runs or is yet to start.
    pub fn any_left(&self) -> bool {
        self.ranks
            .iter()
            .any(|r| matches!(r.state, RankState::Running | RankState::NotStarted))
    }

    /// What every rank was seen to need (the maximum over ranks).
    pub fn merged_observations(&self) -> Observed {
        self.ranks
            .iter()
            .filter_map(|r| r.monitor.as_ref().map(|m| m.observed.clone()))
            .reduce(|a, b| a.merge(&b))
            .unwrap_or_default()
    }

    /// The highest step any rank last reported.
    pub fn highest_step(&self) -> Option<u64> {
        self.ranks
            .iter()
            .filter_map(|r| r.pace.map(|p| p.step))
            .max()
    }

    /// How long the attempt ran, from its start to the job's verdict.
    pub fn ran(&self) -> Duration {
        match (self.started_at, self.ended_at) {
            (Some(s), Some(e)) => e.saturating_duration_since(s),
            _ => Duration::ZERO,
        }
    }
}

/// What the job assigned this node and what lasts for the whole allocation, across attempts.
#[derive(Debug, Clone)]
pub(super) struct JobState {
    /// Where this node's ranks stand, assigned by the job's rendezvous at each join.
    pub placement: Placement,
    /// The job's restart budget (node rank 0's), handed over at each join.
    pub max_restarts: u32,
    /// `--term-timeout` as the runtime last set it (Slurm's window for the signal it expects).
    pub term_timeout: Duration,
    /// Restarts in the current back-off streak.
    pub streak: u32,
    pub steps: Steps,
    pub ending: Ending,
    pub asked: Asked,
}

impl JobState {
    pub fn new(cfg: &SupervisorConfig) -> Self {
        JobState {
            placement: Placement {
                group_rank: cfg.node_rank,
                rank_offset: cfg.rank_offset,
                world_size: cfg.world_size,
            },
            max_restarts: cfg.max_restarts,
            term_timeout: cfg.term_timeout,
            streak: 0,
            steps: Steps::default(),
            ending: Ending {
                signal: None,
                spawn_error: None,
                stopped: None,
                lost_requeue: true,
            },
            asked: Asked::default(),
        }
    }
}

/// The steps this node's ranks reached in the allocation.
#[derive(Debug, Clone, Default)]
pub(super) struct Steps {
    /// The highest step any local rank reported.
    pub highest: Option<u64>,
    /// The highest step reached in each attempt that ended, in order (with
    /// `--checkpoint-iteration-file`: the file's value after it).
    pub per_attempt: Vec<Option<u64>>,
    /// A rank said "training finished" (the job must not be requeued).
    pub training_finished: bool,
    /// The checkpoint iteration file's reads (`--checkpoint-iteration-file`).
    pub checkpoint: super::progress::FileReads,
    /// The best every failed attempt before the current one reached (for the back-off).
    pub best: super::progress::Reached,
}

/// How this node ends the job, once it must.
#[derive(Debug, Clone)]
pub(super) struct Ending {
    /// The signal that ended the agent, if any.
    pub signal: Option<i32>,
    pub spawn_error: Option<(u32, String)>,
    /// How this node stopped the job for good (a signal beats a rank that could not start): what
    /// nodes still heading for another attempt are told when this one leaves.
    pub stopped: Option<JobEnd>,
    /// For a `Lost` verdict that came from this node's own coordination: may a requeue help?
    pub lost_requeue: bool,
}

/// What this node was asked to do about the job beyond this attempt.
#[derive(Debug, Clone, Default)]
pub(super) struct Asked {
    /// Why this node cannot run ranks any more (`NodeFault`); it leaves the job.
    pub fault: Option<String>,
    /// Nodes to requeue without, found by straggler reports (node rank 0).
    pub blamed: Vec<u32>,
    /// A rank asked (NVRx's workload control) for no further attempt / to exclude this node.
    pub shutdown: bool,
    pub exclude: bool,
}
