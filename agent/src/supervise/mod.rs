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

pub mod monitor;

use std::time::{Duration, Instant};

use serde::Serialize;
use vigil_ipc::{AgentMsg, RankMsg};

use monitor::{CalcRequest, Calculated, Due, HangKind, Observed, RankMonitor, Timeouts};

/// How a rank's process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitKind {
    /// `exit(code)`.
    Code(i32),
    /// Killed by this signal number.
    Signal(i32),
}

impl ExitKind {
    pub fn success(self) -> bool {
        self == ExitKind::Code(0)
    }

    /// torch's convention for an exit code: negative signal number when killed by a signal.
    pub fn torch_exitcode(self) -> i32 {
        match self {
            ExitKind::Code(c) => c,
            ExitKind::Signal(s) => -s,
        }
    }
}

/// "exited with code 3" or "was killed by SIGKILL".
pub fn exit_phrase(how: ExitKind) -> String {
    match how {
        ExitKind::Code(c) => format!("exited with code {c}"),
        ExitKind::Signal(s) => format!("was killed by {}", crate::values::signal_name(s)),
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct SupervisorConfig {
    pub nproc: u32,
    /// Global rank of local rank 0 on this node.
    pub rank_offset: u32,
    pub max_restarts: u32,
    /// This node's rank among the job's nodes (named in what it reports to the others).
    pub node_rank: u32,
    /// Whether this node keeps the job's calculated timeouts (node rank 0 does, for the job).
    pub saves_timeouts: bool,
    /// Grace between SIGTERM and SIGKILL when stopping ranks after a failure.
    pub workers_stop_timeout: Duration,
    /// Grace between a forwarded signal and SIGKILL when the agent itself is asked to stop.
    pub term_timeout: Duration,
    /// Hang-detection timeouts as configured (`None`/empty: that check is off).
    pub timeouts: Timeouts,
    /// Heartbeats during which the `warmup` section timeout replaces the per-section ones.
    pub warmup_steps: u32,
    /// Calculated timeouts are this many times the longest observed.
    pub safety_factor: f64,
    /// What a hung rank gets after its stacks are captured (SIGTERM by default, then SIGKILL).
    pub termination_signal: i32,
    /// How long to wait for a hung rank's stack dump before terminating it anyway.
    pub stack_wait: Duration,
    /// Timeouts calculated by an earlier run of this job (the state file), if any.
    pub calculated: Option<Timeouts>,
    /// How long to wait before each restart.
    pub backoff: Backoff,
}

/// The wait before a restart: none before the first of a streak, then `base`, doubling up to
/// `cap`. An attempt that ran at least `reset_after` before it failed starts a new streak, so a
/// job that fails once a day restarts at once every time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The second restart's wait; zero turns back-off off.
    pub base: Duration,
    pub cap: Duration,
    pub reset_after: Duration,
}

impl Backoff {
    pub const OFF: Backoff = Backoff {
        base: Duration::ZERO,
        cap: Duration::ZERO,
        reset_after: Duration::ZERO,
    };

    /// The wait before the restart that follows a failed attempt which ran for `ran`, given how
    /// many restarts came before it in the current streak; returns the wait and the streak after
    /// this restart. Every node computes it from the same job-wide facts (the attempt's verdict
    /// arrives everywhere at once), so every node waits alike.
    pub fn next(&self, streak: u32, ran: Duration) -> (Duration, u32) {
        let streak = if ran >= self.reset_after { 0 } else { streak };
        let wait = match streak {
            0 => Duration::ZERO,
            n => {
                let factor = 1u32 << (n - 1).min(31);
                self.base.saturating_mul(factor).min(self.cap)
            }
        };
        (wait, streak.saturating_add(1))
    }
}

impl SupervisorConfig {
    /// A configuration with hang detection off, for tests and simple launches.
    pub fn basic(nproc: u32, max_restarts: u32) -> Self {
        SupervisorConfig {
            nproc,
            rank_offset: 0,
            max_restarts,
            node_rank: 0,
            saves_timeouts: true,
            workers_stop_timeout: Duration::from_secs(15),
            term_timeout: Duration::from_secs(30),
            timeouts: Timeouts::default(),
            warmup_steps: 0,
            safety_factor: 5.0,
            termination_signal: SIGTERM,
            stack_wait: Duration::from_secs(2),
            calculated: None,
            backoff: Backoff::OFF,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The runtime started this rank of the current cycle; its process group id is `pid`.
    RankSpawned { local_rank: u32, pid: i32 },
    /// The runtime could not start this rank (the command cannot be executed).
    SpawnFailed { local_rank: u32, error: String },
    /// A child of the agent was reaped. Pids that are not ranks (orphaned grandchildren reparented
    /// to the agent as subreaper) are ignored.
    Reaped { pid: i32, how: ExitKind },
    /// The agent received a signal (SIGTERM, SIGINT, SIGHUP, SIGQUIT).
    Signal(i32),
    /// A message from a rank of the current cycle, on a connection registered to `local_rank`.
    Message { local_rank: u32, msg: RankMsg },
    /// The last registered connection of this rank closed: its monitoring pauses until it
    /// registers again (`vigil.close()`, NVRx's `shutdown_workload_monitoring`).
    Disconnected { local_rank: u32 },
    /// The hung rank's stacks were captured (or the capture gave up).
    StacksCaptured { local_rank: u32 },
    /// The answer to `ProbeStopped`: the local ranks whose process is stopped (state `T`).
    Probed { stopped: Vec<u32> },
    /// Time passed; sent when `next_deadline` is reached.
    Tick,
    /// Every node joined this cycle: start the ranks. The job's rendezvous decides the global rank
    /// of local rank 0, the job's restart budget and the calculated timeouts in force.
    Joined {
        cycle: u32,
        rank_offset: u32,
        max_restarts: u32,
        calculated: Option<Timeouts>,
    },
    /// The job's verdict on this cycle, the same on every node.
    CycleEnded { cycle: u32, end: JobEnd },
    /// Timeouts calculated from every node's observations (the maximum over nodes) in calculation
    /// `round` of the cycle (0: vigil's own; 1, 2, ...: the job's requests).
    JobTimeouts {
        cycle: u32,
        round: u32,
        timeouts: Timeouts,
    },
    /// The job's coordination is gone (the store's node died or cannot be reached, or the
    /// rendezvous failed): stop and end. `requeue` tells whether running the job again may help.
    CoordinationLost { reason: String, requeue: bool },
}

/// How a cycle ended for the whole job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(tag = "end", rename_all = "snake_case")]
pub enum JobEnd {
    /// Every rank on every node exited 0.
    Done,
    /// A rank failed or hung on `node`: restart if the budget allows.
    Failed { node: u32, reason: String },
    /// `node` stopped for good (a signal, a command that cannot start): every node ends with
    /// `exit_code`, without restarting.
    Stopped {
        node: u32,
        reason: String,
        exit_code: i32,
    },
    /// A node's agent was lost: the job cannot go on with fewer nodes; end so it can be requeued.
    Lost { reason: String },
}

/// Why the ranks of a cycle are being stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// A rank failed; restart if the budget allows.
    RankFailed,
    /// The agent was signalled; forward it and end.
    Signal,
    /// A rank could not be started; the command is broken, so never restart.
    SpawnFailed,
    /// Another node reported a failure or a stop, or a node was lost.
    Peer,
}

/// What the agent ends with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    Succeeded,
    /// The restart budget is spent; the first observed failure of the last cycle is the root cause.
    Failed {
        restarts: u32,
    },
    /// The agent was asked to stop by this signal.
    Signaled {
        signal: i32,
    },
    SpawnFailed {
        local_rank: u32,
        error: String,
    },
    /// Another node stopped the job for good; this node ends with that node's status.
    PeerStopped {
        node: u32,
        reason: String,
        exit_code: i32,
    },
    /// A node was lost or the job's coordination failed.
    Lost {
        reason: String,
        requeue: bool,
    },
}

/// Exit status when a node was lost: `EX_TEMPFAIL`, "try again later", so a job script can requeue.
pub const EXIT_LOST: i32 = 75;

impl Outcome {
    /// The agent's exit status (documented in docs/usage.md).
    pub fn exit_code(&self) -> i32 {
        match self {
            Outcome::Succeeded => 0,
            Outcome::Failed { .. } => 1,
            Outcome::Signaled { signal } => 128 + signal,
            Outcome::SpawnFailed { .. } => 2,
            Outcome::PeerStopped { exit_code, .. } => *exit_code,
            Outcome::Lost { requeue: true, .. } => EXIT_LOST,
            Outcome::Lost { requeue: false, .. } => 2,
        }
    }
}

/// `loaded` values for the checks that are enabled in `configured`; the rest as configured.
fn overlay(configured: &Timeouts, loaded: &Timeouts) -> Timeouts {
    let pick = |c: Option<Duration>, l: Option<Duration>| c.and(l).or(c);
    Timeouts {
        initial: pick(configured.initial, loaded.initial),
        heartbeat: pick(configured.heartbeat, loaded.heartbeat),
        sections: configured
            .sections
            .iter()
            .map(|(k, v)| (k.clone(), loaded.sections.get(k).copied().unwrap_or(*v)))
            .collect(),
        out_of_section: pick(configured.out_of_section, loaded.out_of_section),
        warmup: configured.warmup,
    }
}

/// One rank that failed on its own (not because we stopped it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Failure {
    pub cycle: u32,
    pub local_rank: u32,
    pub rank: u32,
    pub pid: i32,
    /// How the process ended; for a hung rank, filled in once it is reaped.
    pub how: Option<ExitKind>,
    pub hang: Option<Hang>,
    #[serde(skip)]
    pub at: Instant,
}

/// Why a rank was declared hung.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Hang {
    pub timeout: HangKind,
    pub limit_ms: u64,
    /// How long the rank had been silent (or in its section) when it was declared hung.
    pub silent_ms: u64,
    /// The rank's process was stopped (SIGSTOP, a debugger): frozen, and so named the root cause
    /// ahead of ranks whose timeout ran out first while they waited on it.
    pub stopped: bool,
}

/// A line of the event log, without the fields the runtime adds (time, host).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Record {
    CycleStart {
        cycle: u32,
        restart_count: u32,
        nproc: u32,
    },
    RankStarted {
        cycle: u32,
        local_rank: u32,
        rank: u32,
        pid: i32,
    },
    RankSpawnFailed {
        cycle: u32,
        local_rank: u32,
        error: String,
    },
    RankExited {
        cycle: u32,
        local_rank: u32,
        rank: u32,
        pid: i32,
        #[serde(skip_serializing_if = "Option::is_none")]
        exit_code: Option<i32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        signal: Option<i32>,
        /// False when the rank ended on its own and not zero: a failure.
        expected: bool,
    },
    Stop {
        cycle: u32,
        reason: StopReason,
        /// The signal sent to every live rank's process group.
        signal: i32,
        grace_ms: u64,
        pids: Vec<i32>,
    },
    Escalate {
        cycle: u32,
        signal: i32,
        pids: Vec<i32>,
    },
    Registered {
        cycle: u32,
        local_rank: u32,
        rank: u32,
    },
    Hang {
        cycle: u32,
        local_rank: u32,
        rank: u32,
        pid: i32,
        #[serde(flatten)]
        hang: Hang,
    },
    TrainingFinished {
        cycle: u32,
        local_rank: u32,
        rank: u32,
    },
    TimeoutsUpdated {
        /// `configured`, `loaded` (from the state file) or `calculated`.
        source: &'static str,
        timeouts: Timeouts,
    },
    Restart {
        from_cycle: u32,
        to_cycle: u32,
        restarts_left: u32,
        /// How long the failed attempt ran, from its start to the job's verdict on it.
        ran_ms: u64,
        /// How long the agent waits before joining the next attempt.
        backoff_ms: u64,
    },
    Joined {
        cycle: u32,
        rank_offset: u32,
    },
    CycleEnded {
        cycle: u32,
        #[serde(flatten)]
        end: JobEnd,
    },
    Result {
        #[serde(flatten)]
        outcome: Outcome,
        exit_code: i32,
    },
}

/// What a node asks of the job's coordination (carried out by `rendezvous` through the store).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobRequest {
    /// Join this cycle's rendezvous with the other nodes; answer with `Joined`. Node rank 0
    /// hands `calculated` to every node.
    Join {
        cycle: u32,
        calculated: Option<Timeouts>,
    },
    /// Tell the other nodes this cycle failed or stopped here (the first report of a cycle wins);
    /// the verdict comes back as `CycleEnded`.
    ReportEnd { cycle: u32, end: JobEnd },
    /// Every rank of this node exited 0 in this cycle.
    ReportDone { cycle: u32 },
    /// Timeouts calculated from this node's ranks, to be combined over all nodes (`JobTimeouts`).
    /// Round 0 is vigil's own calculation; rounds 1, 2, ... answer the job's requests in order.
    ShareTimeouts {
        cycle: u32,
        round: u32,
        timeouts: Timeouts,
    },
    /// The agent ends: leave the job; when `poison` is set, make any node waiting to join that
    /// cycle end with that verdict instead of waiting for this node.
    Leave { poison: Option<(u32, JobEnd)> },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// A request to the job's coordination (`rendezvous`), answered with `Joined`, `CycleEnded`
    /// or `JobTimeouts`.
    Job(JobRequest),
    /// Start every rank of this cycle; report each with `RankSpawned` or `SpawnFailed`.
    SpawnCycle {
        cycle: u32,
    },
    /// Send `signal` to each of these process groups.
    SignalGroups {
        pgids: Vec<i32>,
        signal: i32,
    },
    /// Every rank leader of the cycle is reaped: SIGKILL whatever is left in their groups
    /// (a shell's background job, a data-loader worker) so nothing outlives its rank.
    ReapGroups {
        pgids: Vec<i32>,
    },
    Record(Record),
    /// Capture where this hung rank is (Python stacks through its shim when `via_shim`, and
    /// /proc), then report `StacksCaptured`.
    CaptureStacks {
        local_rank: u32,
        pid: i32,
        via_shim: bool,
    },
    /// A hang is due: tell which of these ranks' processes are stopped, with `Probed`, before
    /// the supervisor picks the hung rank (a frozen rank is the root cause, not the ranks that
    /// wait on it).
    ProbeStopped {
        ranks: Vec<(u32, i32)>,
    },
    /// Send to one rank's registered connection.
    SendToRank {
        local_rank: u32,
        msg: AgentMsg,
    },
    /// Send to every registered rank of the cycle.
    SendToAll(AgentMsg),
    /// Persist calculated timeouts for the next run of the job.
    SaveTimeouts(Timeouts),
    /// The agent is done: print the summary and exit with `outcome.exit_code()`.
    Finish(Outcome),
}

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
}

pub const SIGKILL: i32 = libc::SIGKILL;
pub const SIGTERM: i32 = libc::SIGTERM;
pub const SIGINT: i32 = libc::SIGINT;

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

    /// Timeouts handed over by the job (loaded from the state file by node rank 0, or calculated
    /// over all nodes) replace the ones in force for the checks that are enabled.
    fn adopt_timeouts(&mut self, job: &Timeouts, source: &'static str, out: &mut Vec<Action>) {
        let merged = overlay(&self.cfg.timeouts, job);
        self.calculated = Some(job.clone());
        if merged != self.timeouts {
            self.timeouts = merged;
            out.push(Action::Record(Record::TimeoutsUpdated {
                source,
                timeouts: self.timeouts.clone(),
            }));
            out.push(Action::SendToAll(self.timeouts.to_msg()));
        }
    }

    pub fn cycle(&self) -> u32 {
        self.cycle
    }

    pub fn config(&self) -> &SupervisorConfig {
        &self.cfg
    }

    /// Failures of the current cycle, first observed first.
    pub fn failures(&self) -> &[Failure] {
        &self.failures
    }

    /// The timeouts in force now.
    pub fn timeouts(&self) -> &Timeouts {
        &self.timeouts
    }

    /// Whether any rank said "training finished" (the job must not be requeued).
    pub fn training_finished(&self) -> bool {
        self.training_finished
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
        match self.phase {
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
        }
    }

    /// The running rank that will be hung first, and when.
    fn earliest_hang(&self) -> Option<(u32, Due)> {
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

    pub fn handle(&mut self, now: Instant, event: Event) -> Vec<Action> {
        if self.phase == Phase::Finished {
            return Vec::new();
        }
        let mut out = Vec::new();
        match event {
            Event::RankSpawned { local_rank, pid } => {
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
            Event::SpawnFailed { local_rank, error } => {
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
                    self.begin_stop(now, StopReason::SpawnFailed, SIGTERM, &mut out);
                    let end = JobEnd::Stopped {
                        node: self.cfg.node_rank,
                        reason: format!(
                            "rank {} could not start: {error}",
                            self.cfg.rank_offset + local_rank
                        ),
                        exit_code: 2,
                    };
                    self.stopped.get_or_insert(end.clone());
                    self.report(end, &mut out);
                }
            }
            Event::Reaped { pid, how } => self.on_reaped(now, pid, how, &mut out),
            Event::Signal(sig) => self.on_signal(now, sig, &mut out),
            Event::Message { local_rank, msg } => self.on_message(now, local_rank, msg, &mut out),
            Event::Disconnected { local_rank } => {
                if let Some(m) = self
                    .ranks
                    .get_mut(local_rank as usize)
                    .and_then(|r| r.monitor.as_mut())
                {
                    m.on_disconnect();
                }
            }
            Event::StacksCaptured { local_rank } => {
                if self
                    .diagnosing
                    .as_ref()
                    .is_some_and(|(lr, _, _)| *lr == local_rank)
                {
                    self.conclude_hang(now, &mut out);
                }
            }
            Event::Tick if self.phase == Phase::Running => {
                if self
                    .diagnosing
                    .as_ref()
                    .is_some_and(|(_, _, until)| now >= *until)
                {
                    self.conclude_hang(now, &mut out);
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
            Event::Probed { stopped } => {
                if std::mem::take(&mut self.probing)
                    && self.phase == Phase::Running
                    && self.diagnosing.is_none()
                {
                    // Still due? A message may have come in while the runtime looked.
                    if let Some((lr, due)) = self.earliest_hang().filter(|(_, d)| now >= d.at) {
                        let (lr, due, frozen) = self.root_of_hang(lr, due, &stopped);
                        self.begin_diagnosis(now, lr, due, frozen, &mut out);
                    }
                }
            }
            Event::Joined {
                cycle,
                rank_offset,
                max_restarts,
                calculated,
            } => {
                if self.phase == Phase::Joining && cycle == self.cycle {
                    self.cfg.rank_offset = rank_offset;
                    self.cfg.max_restarts = max_restarts;
                    out.push(Action::Record(Record::Joined { cycle, rank_offset }));
                    if let Some(t) = calculated.filter(|t| Some(t) != self.calculated.as_ref()) {
                        let source = if cycle == 0 { "loaded" } else { "calculated" };
                        self.adopt_timeouts(&t, source, &mut out);
                    }
                    out.extend(self.start_cycle(now, cycle));
                }
            }
            Event::CycleEnded { cycle, end } => {
                if cycle == self.cycle && self.end.is_none() {
                    out.push(Action::Record(Record::CycleEnded {
                        cycle,
                        end: end.clone(),
                    }));
                    self.end = Some(end);
                    self.ended_at = Some(now);
                    if self.phase == Phase::Joining {
                        // The rendezvous itself was ended by a node that stopped or was lost.
                        self.phase = Phase::Waiting;
                    }
                    self.stop_for_peer(now, &mut out);
                }
            }
            Event::JobTimeouts {
                cycle,
                round,
                timeouts,
            } => {
                if cycle == self.cycle && round > 0 {
                    self.answer(round, timeouts, &mut out);
                } else if cycle == self.cycle {
                    if self.cfg.saves_timeouts {
                        out.push(Action::SaveTimeouts(timeouts.clone()));
                    }
                    self.adopt_timeouts(&timeouts, "calculated", &mut out);
                }
            }
            Event::CoordinationLost { reason, requeue } => {
                // Whatever the cycle's verdict was, no further cycle can be agreed on.
                let end = JobEnd::Lost { reason };
                out.push(Action::Record(Record::CycleEnded {
                    cycle: self.cycle,
                    end: end.clone(),
                }));
                self.lost_requeue = requeue;
                self.end = Some(end);
                if matches!(self.phase, Phase::Joining | Phase::BackingOff { .. }) {
                    self.phase = Phase::Waiting;
                }
                self.stop_for_peer(now, &mut out);
            }
            Event::Tick => {
                if let Phase::BackingOff { until } = self.phase {
                    if now >= until {
                        self.join_next(&mut out);
                    }
                }
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
                        let pids = self.live_pids();
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
        // A rank that ended or closed its connection is no longer waited for.
        self.maybe_answer_requests(&mut out);
        self.settle(&mut out);
        out
    }

    fn start_cycle(&mut self, now: Instant, cycle: u32) -> Vec<Action> {
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
        self.ranks = (0..self.cfg.nproc)
            .map(|_| Rank {
                pid: None,
                state: RankState::NotStarted,
                monitor: None,
            })
            .collect();
        vec![
            Action::Record(Record::CycleStart {
                cycle,
                restart_count: cycle,
                nproc: self.cfg.nproc,
            }),
            Action::SpawnCycle { cycle },
        ]
    }

    fn live_pids(&self) -> Vec<i32> {
        self.ranks
            .iter()
            .filter(|r| r.state == RankState::Running)
            .filter_map(|r| r.pid)
            .collect()
    }

    fn on_reaped(&mut self, now: Instant, pid: i32, how: ExitKind, out: &mut Vec<Action>) {
        let Some(local_rank) = self.local_rank_of(pid) else {
            return;
        };
        let rank = &mut self.ranks[local_rank as usize];
        if rank.state != RankState::Running {
            return;
        }
        rank.state = RankState::Exited(how);
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
        let stopping = matches!(self.phase, Phase::Stopping { .. });
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
    fn report_failure(&mut self, reason: String, out: &mut Vec<Action>) {
        let node = self.cfg.node_rank;
        self.report(JobEnd::Failed { node, reason }, out);
    }

    fn report(&mut self, end: JobEnd, out: &mut Vec<Action>) {
        if !self.reported && self.end.is_none() {
            self.reported = true;
            out.push(Action::Job(JobRequest::ReportEnd {
                cycle: self.cycle,
                end,
            }));
        }
    }

    /// The job's verdict arrived: a node that is still running its ranks stops them.
    fn stop_for_peer(&mut self, now: Instant, out: &mut Vec<Action>) {
        if self.phase == Phase::Running && self.end != Some(JobEnd::Done) {
            self.diagnosing = None;
            self.begin_stop(now, StopReason::Peer, SIGTERM, out);
        }
    }

    fn on_message(&mut self, now: Instant, local_rank: u32, msg: RankMsg, out: &mut Vec<Action>) {
        let Some(m) = self
            .ranks
            .get_mut(local_rank as usize)
            .filter(|r| r.state == RankState::Running)
            .and_then(|r| r.monitor.as_mut())
        else {
            return;
        };
        let (registered, finished) = (m.registered(), m.finished());
        m.on_msg(now, &msg);
        let rank = self.cfg.rank_offset + local_rank;
        match &msg {
            RankMsg::Register { .. } if !registered => {
                out.push(Action::Record(Record::Registered {
                    cycle: self.cycle,
                    local_rank,
                    rank,
                }));
                out.push(Action::SendToRank {
                    local_rank,
                    msg: self.timeouts.to_msg(),
                });
            }
            RankMsg::Finished if !finished => {
                self.training_finished = true;
                out.push(Action::Record(Record::TrainingFinished {
                    cycle: self.cycle,
                    local_rank,
                    rank,
                }));
            }
            _ => {}
        }
        match msg {
            RankMsg::CalculateTimeouts {
                heartbeat,
                out_of_section,
                all_sections,
                sections,
            } => {
                let req = CalcRequest {
                    heartbeat,
                    out_of_section,
                    all_sections,
                    sections,
                };
                self.on_calc_request(now, local_rank, req, out);
            }
            RankMsg::Heartbeat { .. } | RankMsg::SectionEnd { .. } => self.maybe_calculate(out),
            _ => {}
        }
    }

    /// A rank asks for timeouts to be calculated (NVRx's `calculate_and_set_*`, which every rank
    /// calls together). Once every registered rank of the node asked, this node calculates what
    /// was asked and shares it; the ranks are answered when the job's result comes (`answer`).
    fn on_calc_request(
        &mut self,
        now: Instant,
        local_rank: u32,
        req: CalcRequest,
        out: &mut Vec<Action>,
    ) {
        if !self.on_request {
            self.on_request = true;
            self.adopt_calculated_for_requests(out);
        }
        if req == CalcRequest::default() {
            // Only the announcement that this code calculates when it asks.
            return;
        }
        if self.hang_seen || self.phase != Phase::Running {
            out.push(Action::SendToRank {
                local_rank,
                msg: AgentMsg::TimeoutsCalculated {
                    heartbeat: false,
                    sections: false,
                    out_of_section: false,
                },
            });
            return;
        }
        if req.out_of_section {
            if let Some(m) = self.ranks[local_rank as usize].monitor.as_mut() {
                m.bump_out_of_section(now);
            }
        }
        let (all, mut ranks) = self.asking.take().unwrap_or_default();
        if !ranks.contains(&local_rank) {
            ranks.push(local_rank);
        }
        self.asking = Some((all.union(&req), ranks));
        self.maybe_answer_requests(out);
    }

    /// Calculates the collected request once every running, registered rank of the node asked
    /// (a rank that ended or closed its connection is not waited for).
    fn maybe_answer_requests(&mut self, out: &mut Vec<Action>) {
        let Some((_, ranks)) = &self.asking else {
            return;
        };
        if self.answering.is_some() || self.hang_seen || self.phase != Phase::Running {
            return;
        }
        let waiting = self.ranks.iter().enumerate().any(|(i, r)| {
            r.state == RankState::Running
                && r.monitor.as_ref().is_some_and(|m| m.watched())
                && !ranks.contains(&(i as u32))
        });
        if waiting {
            return;
        }
        let Some((req, ranks)) = self.asking.take() else {
            return;
        };
        let observed = self.merged_observations();
        let (next, done) = monitor::calculate_requested(
            &self.timeouts,
            &observed,
            self.calculated.as_ref(),
            self.cfg.safety_factor,
            &req,
        );
        let sections = match (done.sections, req.all_sections) {
            (false, _) => Vec::new(),
            (true, true) => observed.sections.keys().cloned().collect(),
            (true, false) => req.sections,
        };
        self.calc_round += 1;
        self.answering = Some(Answering {
            round: self.calc_round,
            done,
            sections,
            ranks,
        });
        out.push(Action::Job(JobRequest::ShareTimeouts {
            cycle: self.cycle,
            round: self.calc_round,
            timeouts: next,
        }));
    }

    /// The job's result of a requested calculation: put it in force, keep and save what was
    /// calculated, and tell each rank that asked what was set.
    fn answer(&mut self, round: u32, job: Timeouts, out: &mut Vec<Action>) {
        let Some(Answering {
            done,
            sections,
            ranks,
            ..
        }) = self.answering.take_if(|a| a.round == round)
        else {
            return;
        };
        let mut kept = self.calculated.clone().unwrap_or_default();
        if done.heartbeat {
            kept.initial = job.initial;
            kept.heartbeat = job.heartbeat;
        }
        for name in &sections {
            if let Some(d) = job.sections.get(name) {
                kept.sections.insert(name.clone(), *d);
            }
        }
        if done.out_of_section {
            kept.out_of_section = job.out_of_section;
        }
        let calculated_any = done.heartbeat || done.sections || done.out_of_section;
        if calculated_any {
            self.calculated = Some(kept.clone());
            if self.cfg.saves_timeouts {
                out.push(Action::SaveTimeouts(kept));
            }
        }
        if job != self.timeouts {
            self.timeouts = job;
            out.push(Action::Record(Record::TimeoutsUpdated {
                source: "calculated",
                timeouts: self.timeouts.clone(),
            }));
            out.push(Action::SendToAll(self.timeouts.to_msg()));
        }
        for local_rank in ranks {
            out.push(Action::SendToRank {
                local_rank,
                msg: AgentMsg::TimeoutsCalculated {
                    heartbeat: done.heartbeat,
                    sections: done.sections,
                    out_of_section: done.out_of_section,
                },
            });
        }
        self.maybe_answer_requests(out);
    }

    /// Under NVRx's rule calculated timeouts take precedence over configured ones, disabled ones
    /// included: timeouts this job calculated before (the state file, an earlier cycle) apply to
    /// every check once the job turns out to calculate on request.
    fn adopt_calculated_for_requests(&mut self, out: &mut Vec<Action>) {
        let Some(c) = self.calculated.clone() else {
            return;
        };
        let mut next = self.timeouts.clone();
        next.initial = c.initial.or(next.initial);
        next.heartbeat = c.heartbeat.or(next.heartbeat);
        next.out_of_section = c.out_of_section.or(next.out_of_section);
        next.sections.extend(c.sections);
        if next != self.timeouts {
            self.timeouts = next;
            out.push(Action::Record(Record::TimeoutsUpdated {
                source: "loaded",
                timeouts: self.timeouts.clone(),
            }));
            out.push(Action::SendToAll(self.timeouts.to_msg()));
        }
    }

    /// What every rank of this node was seen to need (the maximum over ranks).
    fn merged_observations(&self) -> Observed {
        self.ranks
            .iter()
            .filter_map(|r| r.monitor.as_ref().map(|m| m.observed.clone()))
            .reduce(|a, b| a.merge(&b))
            .unwrap_or_default()
    }

    /// Flags mode: once every rank has been observed long enough, set the timeouts from what they
    /// needed. Never when the job's code calculates on request, or after a hang in this cycle.
    fn maybe_calculate(&mut self, out: &mut Vec<Action>) {
        if self.calculated_this_cycle
            || self.on_request
            || self.hang_seen
            || !self.timeouts.any()
            || self.ranks.iter().any(|r| r.monitor.is_none())
        {
            return;
        }
        let merged = self.merged_observations();
        if !merged.ready_for(&self.cfg.timeouts) {
            return;
        }
        self.calculated_this_cycle = true;
        let fresh = monitor::calculate(
            &self.timeouts,
            &merged,
            self.calculated.as_ref(),
            self.cfg.safety_factor,
        );
        // Applied when every node has calculated (`JobTimeouts`): the job's value is the maximum.
        out.push(Action::Job(JobRequest::ShareTimeouts {
            cycle: self.cycle,
            round: 0,
            timeouts: fresh,
        }));
    }

    /// The rank to declare hung when `due_rank`'s timeout ran out: a running rank whose process
    /// is stopped, if any (the one silent longest), since ranks waiting on a frozen one (in a
    /// barrier, a collective) go silent too and may run out first. Returns the rank, its own
    /// timeout if it has one (else `due`'s), and whether it is stopped.
    fn root_of_hang(&self, due_rank: u32, due: Due, stopped: &[u32]) -> (u32, Due, bool) {
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

    fn begin_diagnosis(
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
    fn conclude_hang(&mut self, now: Instant, out: &mut Vec<Action>) {
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
        self.begin_stop_except(now, StopReason::RankFailed, SIGTERM, Some((pid, term)), out);
        let reason = format!(
            "rank {} hung: {} of {:.1}s passed",
            self.cfg.rank_offset + local_rank,
            hang.timeout,
            hang.limit_ms as f64 / 1000.0
        );
        self.report_failure(reason, out);
    }

    fn on_signal(&mut self, now: Instant, sig: i32, out: &mut Vec<Action>) {
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
                self.signal = Some(sig);
                let end = JobEnd::Stopped {
                    node: self.cfg.node_rank,
                    reason: format!(
                        "node {} received {}",
                        self.cfg.node_rank,
                        crate::values::signal_name(sig)
                    ),
                    exit_code: 128 + sig,
                };
                self.stopped = Some(end.clone());
                self.report(end, out);
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
    fn begin_stop(&mut self, now: Instant, reason: StopReason, signal: i32, out: &mut Vec<Action>) {
        self.begin_stop_except(now, reason, signal, None, out)
    }

    /// As `begin_stop`, but the group `special.0` gets signal `special.1` instead (a hung rank
    /// gets the rank termination signal, not the graceful SIGTERM).
    fn begin_stop_except(
        &mut self,
        now: Instant,
        reason: StopReason,
        signal: i32,
        special: Option<(i32, i32)>,
        out: &mut Vec<Action>,
    ) {
        let grace = match reason {
            StopReason::Signal => self.cfg.term_timeout,
            // A node stopped for good by a signal gives ours the same time to save their work.
            StopReason::Peer if matches!(self.end, Some(JobEnd::Stopped { .. })) => {
                self.cfg.term_timeout
            }
            StopReason::RankFailed | StopReason::SpawnFailed | StopReason::Peer => {
                self.cfg.workers_stop_timeout
            }
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
        let pids = self.live_pids();
        out.push(Action::Record(Record::Stop {
            cycle: self.cycle,
            reason,
            signal,
            grace_ms: grace.as_millis() as u64,
            pids: pids.clone(),
        }));
        let (special_pids, rest): (Vec<i32>, Vec<i32>) = pids
            .into_iter()
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

    /// Join the rendezvous of the (already incremented) next cycle.
    fn join_next(&mut self, out: &mut Vec<Action>) {
        self.phase = Phase::Joining;
        out.push(Action::Job(JobRequest::Join {
            cycle: self.cycle,
            calculated: self.calculated.clone(),
        }));
    }

    /// Once no rank of the cycle is running and the job's verdict is known, decide what comes next.
    fn settle(&mut self, out: &mut Vec<Action>) {
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
                Some(JobEnd::Done) => Outcome::Succeeded,
                Some(JobEnd::Failed { .. }) if self.cycle < self.cfg.max_restarts => {
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
                Some(JobEnd::Stopped {
                    node,
                    reason,
                    exit_code,
                }) => Outcome::PeerStopped {
                    node,
                    reason,
                    exit_code,
                },
                Some(JobEnd::Lost { reason }) => Outcome::Lost {
                    reason,
                    requeue: self.lost_requeue,
                },
            }
        };
        // Nodes still heading for another cycle must not wait for this one.
        let poison = match &outcome {
            Outcome::Signaled { .. } | Outcome::SpawnFailed { .. } => self.stopped.clone(),
            Outcome::Lost { reason, .. } => Some(JobEnd::Lost {
                reason: reason.clone(),
            }),
            _ => None,
        };
        self.phase = Phase::Finished;
        out.push(Action::Job(JobRequest::Leave {
            poison: poison.map(|p| (self.cycle, p)),
        }));
        out.push(Action::Record(Record::Result {
            exit_code: outcome.exit_code(),
            outcome: outcome.clone(),
        }));
        out.push(Action::Finish(outcome));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// A supervisor whose coordination is looped back: what the job's rendezvous and store answer
    /// when this is the only node. (`multi_node_*` tests below drive the coordination events by
    /// hand instead.)
    struct Solo {
        s: Supervisor,
        /// Local ranks whose process the loopback runtime reports stopped.
        stopped: Vec<u32>,
    }

    impl std::ops::Deref for Solo {
        type Target = Supervisor;
        fn deref(&self) -> &Supervisor {
            &self.s
        }
    }

    impl Solo {
        fn new(cfg: SupervisorConfig) -> (Solo, Vec<Action>) {
            let (s, first) = Supervisor::new(cfg);
            let mut solo = Solo {
                s,
                stopped: Vec::new(),
            };
            let out = solo.loopback(Instant::now(), first);
            (solo, out)
        }

        fn handle(&mut self, now: Instant, ev: Event) -> Vec<Action> {
            let a = self.s.handle(now, ev);
            self.loopback(now, a)
        }

        fn loopback(&mut self, now: Instant, actions: Vec<Action>) -> Vec<Action> {
            let mut out = Vec::new();
            let mut queue: VecDeque<Action> = actions.into();
            while let Some(a) = queue.pop_front() {
                let reply = match &a {
                    Action::Job(JobRequest::Join { cycle, calculated }) => Some(Event::Joined {
                        cycle: *cycle,
                        rank_offset: self.s.cfg.rank_offset,
                        max_restarts: self.s.cfg.max_restarts,
                        calculated: calculated.clone(),
                    }),
                    Action::Job(JobRequest::ReportEnd { cycle, end }) => Some(Event::CycleEnded {
                        cycle: *cycle,
                        end: end.clone(),
                    }),
                    Action::Job(JobRequest::ReportDone { cycle }) => Some(Event::CycleEnded {
                        cycle: *cycle,
                        end: JobEnd::Done,
                    }),
                    Action::ProbeStopped { ranks } => Some(Event::Probed {
                        stopped: ranks
                            .iter()
                            .map(|(lr, _)| *lr)
                            .filter(|lr| self.stopped.contains(lr))
                            .collect(),
                    }),
                    Action::Job(JobRequest::ShareTimeouts {
                        cycle,
                        round,
                        timeouts,
                    }) => Some(Event::JobTimeouts {
                        cycle: *cycle,
                        round: *round,
                        timeouts: timeouts.clone(),
                    }),
                    _ => None,
                };
                out.push(a);
                if let Some(ev) = reply {
                    queue.extend(self.s.handle(now, ev));
                }
            }
            out
        }
    }

    fn cfg(nproc: u32, max_restarts: u32) -> SupervisorConfig {
        SupervisorConfig::basic(nproc, max_restarts)
    }

    /// Spawns every rank of the current cycle with pids `base + local_rank`.
    fn spawn_all(s: &mut Solo, now: Instant, base: i32) -> Vec<Action> {
        let mut out = Vec::new();
        for lr in 0..s.config().nproc {
            out.extend(s.handle(
                now,
                Event::RankSpawned {
                    local_rank: lr,
                    pid: base + lr as i32,
                },
            ));
        }
        out
    }

    fn send(s: &mut Solo, now: Instant, local_rank: u32, msg: RankMsg) -> Vec<Action> {
        s.handle(now, Event::Message { local_rank, msg })
    }

    fn calc_hb() -> RankMsg {
        RankMsg::CalculateTimeouts {
            heartbeat: true,
            out_of_section: false,
            all_sections: false,
            sections: vec![],
        }
    }

    #[test]
    fn on_request_configured_timeouts_stay_until_every_rank_asks() {
        let t = Instant::now();
        let mut c = cfg(2, 0);
        c.timeouts.heartbeat = Some(Duration::from_secs(30));
        let (mut s, _) = Solo::new(c);
        spawn_all(&mut s, t, 100);
        let announce = RankMsg::CalculateTimeouts {
            heartbeat: false,
            out_of_section: false,
            all_sections: false,
            sections: vec![],
        };
        for lr in 0..2 {
            let reg = RankMsg::Register {
                rank: lr,
                local_rank: lr,
                pid: 100 + lr,
                cycle: 0,
            };
            send(&mut s, t, lr, reg);
            assert!(
                send(&mut s, t, lr, announce.clone()).is_empty(),
                "not answered"
            );
        }
        let mut now = t;
        for _ in 0..40 {
            now += Duration::from_millis(10);
            for lr in 0..2 {
                let a = send(&mut s, now, lr, RankMsg::Heartbeat { step: None });
                assert!(a.is_empty(), "nothing calculated unasked: {a:?}");
            }
        }
        assert_eq!(s.timeouts().heartbeat, Some(Duration::from_secs(30)));
        let a = send(&mut s, now, 0, calc_hb());
        assert!(a.is_empty(), "rank 1 has not asked yet: {a:?}");
        let a = send(&mut s, now, 1, calc_hb());
        assert!(a.contains(&Action::SaveTimeouts(s.timeouts().clone())));
        assert_eq!(s.timeouts().heartbeat, Some(monitor::CALC_FLOOR));
        let answer = AgentMsg::TimeoutsCalculated {
            heartbeat: true,
            sections: false,
            out_of_section: false,
        };
        for local_rank in 0..2 {
            assert!(a.contains(&Action::SendToRank {
                local_rank,
                msg: answer.clone()
            }));
        }
    }

    #[test]
    fn nothing_is_learned_after_a_hang() {
        let t = Instant::now();
        let mut c = cfg(1, 0);
        c.timeouts.heartbeat = Some(Duration::from_secs(2));
        let (mut s, _) = Solo::new(c);
        spawn_all(&mut s, t, 100);
        let reg = RankMsg::Register {
            rank: 0,
            local_rank: 0,
            pid: 100,
            cycle: 0,
        };
        send(&mut s, t, 0, reg);
        let mut now = t;
        for _ in 0..5 {
            now += Duration::from_millis(10);
            send(&mut s, now, 0, RankMsg::Heartbeat { step: None });
        }
        let hung = now + Duration::from_secs(2);
        s.handle(hung, Event::Tick);
        // The rank wakes up after 3 s and heartbeats on while it is being stopped.
        now += Duration::from_secs(3);
        for _ in 0..20 {
            now += Duration::from_millis(10);
            let a = send(&mut s, now, 0, RankMsg::Heartbeat { step: None });
            assert!(
                !a.iter()
                    .any(|x| matches!(x, Action::Job(JobRequest::ShareTimeouts { .. }))),
                "the hang's gap must not be learned: {a:?}"
            );
        }
        assert_eq!(s.timeouts().heartbeat, Some(Duration::from_secs(2)));
    }

    fn finish(actions: &[Action]) -> Option<&Outcome> {
        actions.iter().find_map(|a| match a {
            Action::Finish(o) => Some(o),
            _ => None,
        })
    }

    fn signals(actions: &[Action]) -> Vec<(Vec<i32>, i32)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::SignalGroups { pgids, signal } => Some((pgids.clone(), *signal)),
                _ => None,
            })
            .collect()
    }

    fn spawns(actions: &[Action]) -> Vec<u32> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::SpawnCycle { cycle } => Some(*cycle),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn starts_cycle_zero() {
        let (_, actions) = Solo::new(cfg(2, 0));
        assert_eq!(spawns(&actions), vec![0]);
    }

    #[test]
    fn all_ranks_zero_is_success() {
        let t = Instant::now();
        let (mut s, _) = Solo::new(cfg(2, 3));
        spawn_all(&mut s, t, 100);
        let a = s.handle(
            t,
            Event::Reaped {
                pid: 100,
                how: ExitKind::Code(0),
            },
        );
        assert!(finish(&a).is_none());
        let a = s.handle(
            t,
            Event::Reaped {
                pid: 101,
                how: ExitKind::Code(0),
            },
        );
        assert_eq!(finish(&a), Some(&Outcome::Succeeded));
        assert!(a.contains(&Action::ReapGroups {
            pgids: vec![100, 101]
        }));
        assert!(s.is_finished());
    }

    #[test]
    fn failure_stops_others_then_restarts_with_next_cycle() {
        let t = Instant::now();
        let (mut s, _) = Solo::new(cfg(3, 1));
        spawn_all(&mut s, t, 100);
        let a = s.handle(
            t,
            Event::Reaped {
                pid: 101,
                how: ExitKind::Code(3),
            },
        );
        assert_eq!(signals(&a), vec![(vec![100, 102], SIGTERM)]);
        assert_eq!(s.next_deadline(), Some(t + Duration::from_secs(15)));
        assert_eq!(s.failures()[0].local_rank, 1);
        // The ranks we stopped are not failures.
        s.handle(
            t,
            Event::Reaped {
                pid: 100,
                how: ExitKind::Signal(SIGTERM),
            },
        );
        let a = s.handle(
            t,
            Event::Reaped {
                pid: 102,
                how: ExitKind::Code(1),
            },
        );
        assert_eq!(spawns(&a), vec![1]);
        assert_eq!(s.cycle(), 1);
        assert!(s.failures().is_empty());
        assert_eq!(s.next_deadline(), None);
    }

    #[test]
    fn budget_spent_fails_with_root_cause() {
        let t = Instant::now();
        let (mut s, _) = Solo::new(cfg(1, 1));
        spawn_all(&mut s, t, 10);
        let a = s.handle(
            t,
            Event::Reaped {
                pid: 10,
                how: ExitKind::Code(1),
            },
        );
        assert_eq!(spawns(&a), vec![1]);
        spawn_all(&mut s, t, 20);
        let a = s.handle(
            t,
            Event::Reaped {
                pid: 20,
                how: ExitKind::Signal(libc::SIGSEGV),
            },
        );
        assert_eq!(finish(&a), Some(&Outcome::Failed { restarts: 1 }));
        assert_eq!(s.failures()[0].how, Some(ExitKind::Signal(libc::SIGSEGV)));
        assert_eq!(finish(&a).unwrap().exit_code(), 1);
    }

    #[test]
    fn rank_ignoring_sigterm_is_killed_at_deadline() {
        let t = Instant::now();
        let (mut s, _) = Solo::new(cfg(2, 0));
        spawn_all(&mut s, t, 100);
        s.handle(
            t,
            Event::Reaped {
                pid: 100,
                how: ExitKind::Code(1),
            },
        );
        let early = s.handle(t + Duration::from_secs(14), Event::Tick);
        assert!(signals(&early).is_empty());
        let a = s.handle(t + Duration::from_secs(15), Event::Tick);
        assert_eq!(signals(&a), vec![(vec![101], SIGKILL)]);
        assert_eq!(s.next_deadline(), None);
        let a = s.handle(
            t + Duration::from_secs(15),
            Event::Reaped {
                pid: 101,
                how: ExitKind::Signal(SIGKILL),
            },
        );
        assert_eq!(finish(&a), Some(&Outcome::Failed { restarts: 0 }));
    }

    #[test]
    fn signal_is_forwarded_and_never_restarts() {
        let t = Instant::now();
        let (mut s, _) = Solo::new(cfg(2, 5));
        spawn_all(&mut s, t, 100);
        let a = s.handle(t, Event::Signal(libc::SIGHUP));
        assert_eq!(signals(&a), vec![(vec![100, 101], libc::SIGHUP)]);
        assert_eq!(s.next_deadline(), Some(t + Duration::from_secs(30)));
        s.handle(
            t,
            Event::Reaped {
                pid: 100,
                how: ExitKind::Code(1),
            },
        );
        let a = s.handle(
            t,
            Event::Reaped {
                pid: 101,
                how: ExitKind::Signal(libc::SIGHUP),
            },
        );
        let o = finish(&a).unwrap();
        assert_eq!(
            o,
            &Outcome::Signaled {
                signal: libc::SIGHUP
            }
        );
        assert_eq!(o.exit_code(), 128 + libc::SIGHUP);
        assert!(spawns(&a).is_empty());
    }

    #[test]
    fn second_sigint_escalates_at_once() {
        let t = Instant::now();
        let (mut s, _) = Solo::new(cfg(1, 0));
        spawn_all(&mut s, t, 100);
        s.handle(t, Event::Signal(SIGINT));
        let t1 = t + Duration::from_millis(200);
        s.handle(t1, Event::Signal(SIGINT));
        assert_eq!(s.next_deadline(), Some(t1));
        let a = s.handle(t1, Event::Tick);
        assert_eq!(signals(&a), vec![(vec![100], SIGKILL)]);
    }

    #[test]
    fn signal_during_failure_stop_cancels_restart() {
        let t = Instant::now();
        let (mut s, _) = Solo::new(cfg(2, 5));
        spawn_all(&mut s, t, 100);
        s.handle(
            t,
            Event::Reaped {
                pid: 100,
                how: ExitKind::Code(1),
            },
        );
        let a = s.handle(t, Event::Signal(SIGTERM));
        assert_eq!(signals(&a), vec![(vec![101], SIGTERM)]);
        let a = s.handle(
            t,
            Event::Reaped {
                pid: 101,
                how: ExitKind::Code(0),
            },
        );
        assert_eq!(finish(&a), Some(&Outcome::Signaled { signal: SIGTERM }));
    }

    #[test]
    fn spawn_failure_stops_started_ranks_and_never_restarts() {
        let t = Instant::now();
        let (mut s, _) = Solo::new(cfg(2, 5));
        s.handle(
            t,
            Event::RankSpawned {
                local_rank: 0,
                pid: 100,
            },
        );
        let a = s.handle(
            t,
            Event::SpawnFailed {
                local_rank: 1,
                error: "no such file".into(),
            },
        );
        assert_eq!(signals(&a), vec![(vec![100], SIGTERM)]);
        let a = s.handle(
            t,
            Event::Reaped {
                pid: 100,
                how: ExitKind::Signal(SIGTERM),
            },
        );
        let o = finish(&a).unwrap();
        assert_eq!(o.exit_code(), 2);
        assert!(spawns(&a).is_empty());
    }

    #[test]
    fn hung_rank_gets_only_the_termination_signal() {
        let t = Instant::now();
        let mut c = cfg(2, 0);
        c.timeouts.heartbeat = Some(Duration::from_secs(1));
        c.termination_signal = SIGKILL;
        let (mut s, _) = Solo::new(c);
        spawn_all(&mut s, t, 100);
        for lr in 0..2 {
            let reg = RankMsg::Register {
                rank: lr,
                local_rank: lr,
                pid: 100 + lr,
                cycle: 0,
            };
            s.handle(
                t,
                Event::Message {
                    local_rank: lr,
                    msg: reg,
                },
            );
            s.handle(
                t,
                Event::Message {
                    local_rank: lr,
                    msg: RankMsg::Heartbeat { step: None },
                },
            );
        }
        let t1 = t + Duration::from_millis(500);
        s.handle(
            t1,
            Event::Message {
                local_rank: 0,
                msg: RankMsg::Heartbeat { step: None },
            },
        );
        assert_eq!(
            s.next_deadline(),
            Some(t + Duration::from_secs(1)),
            "rank 1 is due first"
        );
        let a = s.handle(t + Duration::from_secs(1), Event::Tick);
        assert!(a.iter().any(|x| matches!(
            x,
            Action::CaptureStacks {
                local_rank: 1,
                pid: 101,
                via_shim: true
            }
        )));
        assert!(signals(&a).is_empty(), "stacks first, then signals");
        let a = s.handle(
            t + Duration::from_secs(1),
            Event::StacksCaptured { local_rank: 1 },
        );
        assert_eq!(
            signals(&a),
            vec![(vec![100], SIGTERM), (vec![101], SIGKILL)]
        );
        assert_eq!(
            s.failures()[0].hang.as_ref().unwrap().timeout,
            HangKind::Heartbeat
        );
    }

    /// Two registered ranks that heartbeat at `t`; local rank 0 once more at `t + 500 ms`.
    fn two_beating(t: Instant, stopped: Vec<u32>) -> Solo {
        let mut c = cfg(2, 0);
        c.timeouts.heartbeat = Some(Duration::from_secs(1));
        let (mut s, _) = Solo::new(c);
        s.stopped = stopped;
        spawn_all(&mut s, t, 100);
        for lr in 0..2 {
            let reg = RankMsg::Register {
                rank: lr,
                local_rank: lr,
                pid: 100 + lr,
                cycle: 0,
            };
            for msg in [reg, RankMsg::Heartbeat { step: None }] {
                s.handle(
                    t,
                    Event::Message {
                        local_rank: lr,
                        msg,
                    },
                );
            }
        }
        let msg = RankMsg::Heartbeat { step: None };
        s.handle(
            t + Duration::from_millis(500),
            Event::Message { local_rank: 0, msg },
        );
        s
    }

    fn hangs(actions: &[Action]) -> Vec<(u32, Hang)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Record(Record::Hang {
                    local_rank, hang, ..
                }) => Some((*local_rank, hang.clone())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_stopped_rank_is_named_hung_before_the_ranks_waiting_on_it() {
        let t = Instant::now();
        // Rank 1 went silent first (waiting on rank 0), but rank 0's process is stopped.
        let mut s = two_beating(t, vec![0]);
        let now = t + Duration::from_secs(1);
        let a = s.handle(now, Event::Tick);
        assert!(a.iter().any(
            |x| matches!(x, Action::ProbeStopped { ranks } if ranks == &[(0, 100), (1, 101)])
        ));
        let h = hangs(&a);
        assert_eq!(h.len(), 1);
        assert_eq!(h[0].0, 0);
        assert!(h[0].1.stopped);
        assert_eq!(h[0].1.silent_ms, 500);
        s.handle(now, Event::StacksCaptured { local_rank: 0 });
        assert_eq!(s.failures().len(), 1);
        assert_eq!(s.failures()[0].local_rank, 0);

        // Nothing stopped: the rank that ran out first is hung, as before.
        let mut s = two_beating(t, vec![]);
        let h = hangs(&s.handle(now, Event::Tick));
        assert_eq!((h[0].0, h[0].1.stopped), (1, false));
    }

    #[test]
    fn a_probe_answer_after_the_rank_spoke_again_declares_nothing() {
        let t = Instant::now();
        let mut c = cfg(1, 0);
        c.timeouts.heartbeat = Some(Duration::from_secs(1));
        let (s, _) = Solo::new(c);
        let mut s = s.s;
        // Driven by hand: the probe's answer comes after a heartbeat.
        s.handle(
            t,
            Event::RankSpawned {
                local_rank: 0,
                pid: 7,
            },
        );
        let reg = RankMsg::Register {
            rank: 0,
            local_rank: 0,
            pid: 7,
            cycle: 0,
        };
        for msg in [reg, RankMsg::Heartbeat { step: None }] {
            s.handle(t, Event::Message { local_rank: 0, msg });
        }
        let now = t + Duration::from_secs(2);
        let a = s.handle(now, Event::Tick);
        assert!(a.iter().any(|x| matches!(x, Action::ProbeStopped { .. })));
        assert!(s.handle(now, Event::Tick).is_empty(), "one probe at a time");
        let msg = RankMsg::Heartbeat { step: None };
        s.handle(now, Event::Message { local_rank: 0, msg });
        let a = s.handle(now, Event::Probed { stopped: vec![] });
        assert!(hangs(&a).is_empty(), "{a:?}");
    }

    #[test]
    fn disconnect_pauses_monitoring_until_reregistration() {
        let t = Instant::now();
        let mut c = cfg(1, 0);
        c.timeouts.heartbeat = Some(Duration::from_secs(1));
        let (mut s, _) = Solo::new(c);
        spawn_all(&mut s, t, 100);
        let reg = RankMsg::Register {
            rank: 0,
            local_rank: 0,
            pid: 100,
            cycle: 0,
        };
        s.handle(
            t,
            Event::Message {
                local_rank: 0,
                msg: reg.clone(),
            },
        );
        s.handle(
            t,
            Event::Message {
                local_rank: 0,
                msg: RankMsg::Heartbeat { step: None },
            },
        );
        assert!(s.next_deadline().is_some());
        s.handle(t, Event::Disconnected { local_rank: 0 });
        assert_eq!(s.next_deadline(), None);
        let t5 = t + Duration::from_secs(5);
        s.handle(
            t5,
            Event::Message {
                local_rank: 0,
                msg: reg,
            },
        );
        assert_eq!(
            s.next_deadline(),
            Some(t5 + Duration::from_secs(1)),
            "a fresh window after reconnecting"
        );
    }

    #[test]
    fn orphans_and_unknown_pids_are_ignored() {
        let t = Instant::now();
        let (mut s, _) = Solo::new(cfg(1, 0));
        spawn_all(&mut s, t, 100);
        let a = s.handle(
            t,
            Event::Reaped {
                pid: 4242,
                how: ExitKind::Code(1),
            },
        );
        assert!(a.is_empty());
    }

    #[test]
    fn rank_spawned_during_stop_is_signalled() {
        let t = Instant::now();
        let (mut s, _) = Solo::new(cfg(2, 0));
        s.handle(
            t,
            Event::RankSpawned {
                local_rank: 0,
                pid: 100,
            },
        );
        s.handle(t, Event::Signal(SIGTERM));
        let a = s.handle(
            t,
            Event::RankSpawned {
                local_rank: 1,
                pid: 101,
            },
        );
        assert_eq!(signals(&a), vec![(vec![101], SIGTERM)]);
    }

    // Multi-node: the coordination events are driven by hand, as the store would deliver them.

    fn joined(cycle: u32, rank_offset: u32, max_restarts: u32) -> Event {
        Event::Joined {
            cycle,
            rank_offset,
            max_restarts,
            calculated: None,
        }
    }

    fn node(node_rank: u32, nproc: u32, max_restarts: u32) -> (Supervisor, Vec<Action>) {
        let mut c = cfg(nproc, max_restarts);
        c.node_rank = node_rank;
        c.saves_timeouts = node_rank == 0;
        Supervisor::new(c)
    }

    fn started(s: &mut Supervisor, t: Instant, base: i32) {
        for lr in 0..s.config().nproc {
            s.handle(
                t,
                Event::RankSpawned {
                    local_rank: lr,
                    pid: base + lr as i32,
                },
            );
        }
    }

    fn has(actions: &[Action], pred: impl Fn(&Action) -> bool) -> bool {
        actions.iter().any(pred)
    }

    #[test]
    fn multi_node_requests_are_answered_with_the_job_value_of_their_round() {
        let t = Instant::now();
        let (mut s, _) = node(1, 1, 0);
        s.handle(t, joined(0, 1, 0));
        started(&mut s, t, 300);
        let reg = RankMsg::Register {
            rank: 1,
            local_rank: 0,
            pid: 300,
            cycle: 0,
        };
        let msg = |m: RankMsg| Event::Message {
            local_rank: 0,
            msg: m,
        };
        s.handle(t, msg(reg));
        for i in 1..=3 {
            s.handle(
                t + Duration::from_millis(100 * i),
                msg(RankMsg::Heartbeat { step: None }),
            );
        }
        let a = s.handle(t + Duration::from_millis(300), msg(calc_hb()));
        let shared = a.iter().find_map(|x| match x {
            Action::Job(JobRequest::ShareTimeouts {
                cycle: 0,
                round,
                timeouts,
            }) => Some((*round, timeouts.clone())),
            _ => None,
        });
        let (round, mine) = shared.expect("this node shares its calculation");
        assert_eq!(
            round, 1,
            "requests count from round 1; round 0 is vigil's own"
        );
        assert!(mine.heartbeat.is_some());
        let job = Timeouts {
            initial: Some(Duration::from_secs(40)),
            heartbeat: Some(Duration::from_secs(9)),
            ..Default::default()
        };
        let stale = s.handle(
            t,
            Event::JobTimeouts {
                cycle: 0,
                round: 7,
                timeouts: job.clone(),
            },
        );
        assert!(stale.is_empty(), "another round's result is not this one's");
        let a = s.handle(
            t,
            Event::JobTimeouts {
                cycle: 0,
                round: 1,
                timeouts: job.clone(),
            },
        );
        assert_eq!(
            s.timeouts(),
            &job,
            "the job's maximum over nodes is in force"
        );
        assert!(
            !has(&a, |x| matches!(x, Action::SaveTimeouts(_))),
            "node rank 0 saves"
        );
        assert!(a.contains(&Action::SendToRank {
            local_rank: 0,
            msg: AgentMsg::TimeoutsCalculated {
                heartbeat: true,
                sections: false,
                out_of_section: false
            }
        }));
    }

    #[test]
    fn multi_node_ranks_start_only_once_every_node_joined() {
        let t = Instant::now();
        let (mut s, first) = node(1, 2, 3);
        assert!(spawns(&first).is_empty());
        assert!(first.contains(&Action::Job(JobRequest::Join {
            cycle: 0,
            calculated: None
        })));
        // The job's budget and this node's global ranks come from the rendezvous.
        let a = s.handle(t, joined(0, 6, 1));
        assert_eq!(spawns(&a), vec![0]);
        assert_eq!(s.config().max_restarts, 1);
        let a = s.handle(
            t,
            Event::RankSpawned {
                local_rank: 1,
                pid: 50,
            },
        );
        assert!(a.contains(&Action::Record(Record::RankStarted {
            cycle: 0,
            local_rank: 1,
            rank: 7,
            pid: 50
        })));
        // A Joined for another cycle is not ours.
        assert!(spawns(&s.handle(t, joined(5, 0, 1))).is_empty());
    }

    #[test]
    fn multi_node_local_failure_is_reported_and_the_verdict_decides() {
        let t = Instant::now();
        let (mut s, _) = node(1, 2, 1);
        s.handle(t, joined(0, 2, 1));
        started(&mut s, t, 10);
        let a = s.handle(
            t,
            Event::Reaped {
                pid: 11,
                how: ExitKind::Code(4),
            },
        );
        let reported = a.iter().find_map(|x| match x {
            Action::Job(JobRequest::ReportEnd { cycle: 0, end }) => Some(end.clone()),
            _ => None,
        });
        assert_eq!(
            reported,
            Some(JobEnd::Failed {
                node: 1,
                reason: "rank 3 exited with code 4".into()
            })
        );
        let a = s.handle(
            t,
            Event::Reaped {
                pid: 10,
                how: ExitKind::Signal(SIGTERM),
            },
        );
        // Every local rank is down, but the job's verdict has not come: no decision yet.
        assert!(!has(&a, |x| matches!(
            x,
            Action::Job(JobRequest::Join { .. }) | Action::Finish(_)
        )));
        let a = s.handle(
            t,
            Event::CycleEnded {
                cycle: 0,
                end: reported.unwrap(),
            },
        );
        assert!(a.contains(&Action::Job(JobRequest::Join {
            cycle: 1,
            calculated: None
        })));
        assert_eq!(s.cycle(), 1);
    }

    #[test]
    fn multi_node_peer_failure_stops_ours_without_counting_them_as_failures() {
        let t = Instant::now();
        let (mut s, _) = node(0, 2, 0);
        s.handle(t, joined(0, 0, 0));
        started(&mut s, t, 10);
        let end = JobEnd::Failed {
            node: 3,
            reason: "rank 9 hung".into(),
        };
        let a = s.handle(t, Event::CycleEnded { cycle: 0, end });
        assert_eq!(signals(&a), vec![(vec![10, 11], SIGTERM)]);
        assert!(!has(&a, |x| matches!(
            x,
            Action::Job(JobRequest::ReportEnd { .. })
        )));
        s.handle(
            t,
            Event::Reaped {
                pid: 10,
                how: ExitKind::Code(1),
            },
        );
        let a = s.handle(
            t,
            Event::Reaped {
                pid: 11,
                how: ExitKind::Signal(SIGTERM),
            },
        );
        assert!(s.failures().is_empty());
        // Budget 0: the job failed; nobody else needs poisoning, every node got the same verdict.
        assert_eq!(finish(&a), Some(&Outcome::Failed { restarts: 0 }));
        assert!(a.contains(&Action::Job(JobRequest::Leave { poison: None })));
    }

    #[test]
    fn multi_node_done_here_waits_for_the_others() {
        let t = Instant::now();
        let (mut s, _) = node(1, 1, 2);
        s.handle(t, joined(0, 1, 2));
        started(&mut s, t, 10);
        let a = s.handle(
            t,
            Event::Reaped {
                pid: 10,
                how: ExitKind::Code(0),
            },
        );
        assert!(a.contains(&Action::Job(JobRequest::ReportDone { cycle: 0 })));
        assert!(finish(&a).is_none());
        // Another node failed after ours finished: this node restarts with the job.
        let failed = JobEnd::Failed {
            node: 0,
            reason: "x".into(),
        };
        let a = s.handle(
            t,
            Event::CycleEnded {
                cycle: 0,
                end: failed,
            },
        );
        assert!(a.contains(&Action::Job(JobRequest::Join {
            cycle: 1,
            calculated: None
        })));
        s.handle(t, joined(1, 1, 2));
        started(&mut s, t, 20);
        s.handle(
            t,
            Event::Reaped {
                pid: 20,
                how: ExitKind::Code(0),
            },
        );
        let a = s.handle(
            t,
            Event::CycleEnded {
                cycle: 1,
                end: JobEnd::Done,
            },
        );
        assert_eq!(finish(&a), Some(&Outcome::Succeeded));
    }

    #[test]
    fn multi_node_signal_stops_everyone_for_good() {
        let t = Instant::now();
        let (mut s, _) = node(2, 1, 5);
        s.handle(t, joined(0, 2, 5));
        started(&mut s, t, 10);
        let a = s.handle(t, Event::Signal(SIGTERM));
        let stopped = JobEnd::Stopped {
            node: 2,
            reason: "node 2 received SIGTERM".into(),
            exit_code: 143,
        };
        assert!(a.contains(&Action::Job(JobRequest::ReportEnd {
            cycle: 0,
            end: stopped.clone()
        })));
        let a = s.handle(
            t,
            Event::Reaped {
                pid: 10,
                how: ExitKind::Signal(SIGTERM),
            },
        );
        assert_eq!(finish(&a), Some(&Outcome::Signaled { signal: SIGTERM }));
        assert!(a.contains(&Action::Job(JobRequest::Leave {
            poison: Some((0, stopped))
        })));
        // Another node learns of it, even while joining, and ends with the same status.
        let (mut other, _) = node(0, 1, 5);
        let a = other.handle(
            t,
            Event::CycleEnded {
                cycle: 0,
                end: JobEnd::Stopped {
                    node: 2,
                    reason: "r".into(),
                    exit_code: 143,
                },
            },
        );
        assert_eq!(finish(&a).map(Outcome::exit_code), Some(143));
    }

    #[test]
    fn multi_node_lost_coordination_ends_with_the_requeue_status() {
        let t = Instant::now();
        let (mut s, _) = node(1, 2, 5);
        s.handle(t, joined(0, 2, 5));
        started(&mut s, t, 10);
        let a = s.handle(
            t,
            Event::CoordinationLost {
                reason: "gone".into(),
                requeue: true,
            },
        );
        assert_eq!(signals(&a), vec![(vec![10, 11], SIGTERM)]);
        s.handle(
            t,
            Event::Reaped {
                pid: 10,
                how: ExitKind::Signal(SIGTERM),
            },
        );
        let a = s.handle(
            t,
            Event::Reaped {
                pid: 11,
                how: ExitKind::Signal(SIGTERM),
            },
        );
        let o = finish(&a).unwrap();
        assert_eq!(o.exit_code(), EXIT_LOST);
        assert!(!has(&a, |x| matches!(
            x,
            Action::Job(JobRequest::Join { .. })
        )));
        // Refused before joining (a node rank taken twice): bad input, not a requeue.
        let (mut r, _) = node(1, 1, 0);
        let a = r.handle(
            t,
            Event::CoordinationLost {
                reason: "taken".into(),
                requeue: false,
            },
        );
        assert_eq!(finish(&a).map(Outcome::exit_code), Some(2));
    }

    #[test]
    fn multi_node_timeouts_apply_the_job_value_and_only_node_zero_saves() {
        let t = Instant::now();
        let job = Timeouts {
            heartbeat: Some(Duration::from_secs(9)),
            ..Default::default()
        };
        for node_rank in [0, 1] {
            let mut c = cfg(1, 0);
            c.node_rank = node_rank;
            c.saves_timeouts = node_rank == 0;
            c.timeouts.heartbeat = Some(Duration::from_secs(60));
            let (mut s, _) = Supervisor::new(c);
            s.handle(t, joined(0, node_rank, 0));
            let a = s.handle(
                t,
                Event::JobTimeouts {
                    cycle: 0,
                    round: 0,
                    timeouts: job.clone(),
                },
            );
            assert_eq!(s.timeouts().heartbeat, Some(Duration::from_secs(9)));
            assert_eq!(
                a.contains(&Action::SaveTimeouts(job.clone())),
                node_rank == 0
            );
            assert!(a.contains(&Action::SendToAll(s.timeouts().to_msg())));
        }
    }

    const B: Backoff = Backoff {
        base: Duration::from_secs(1),
        cap: Duration::from_secs(30),
        reset_after: Duration::from_secs(300),
    };

    #[test]
    fn backoff_is_immediate_first_then_doubles_to_the_cap() {
        let quick = Duration::from_millis(10);
        let mut streak = 0;
        let mut waits = Vec::new();
        for _ in 0..8 {
            let (w, s) = B.next(streak, quick);
            waits.push(w.as_secs());
            streak = s;
        }
        assert_eq!(waits, vec![0, 1, 2, 4, 8, 16, 30, 30]);
        // A long attempt starts a new streak: immediate again, then the base.
        let (w, s) = B.next(streak, Duration::from_secs(300));
        assert_eq!((w, s), (Duration::ZERO, 1));
        assert_eq!(B.next(s, quick).0, Duration::from_secs(1));
        assert_eq!(Backoff::OFF.next(7, quick).0, Duration::ZERO);
    }

    /// Fails the one rank of the current cycle at `t` (the verdict comes back at once).
    fn fail_at(s: &mut Solo, t: Instant, pid: i32) -> Vec<Action> {
        s.handle(
            t,
            Event::Reaped {
                pid,
                how: ExitKind::Code(1),
            },
        )
    }

    fn restart_waits(actions: &[Action]) -> Vec<u64> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Record(Record::Restart { backoff_ms, .. }) => Some(*backoff_ms),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn restarts_back_off_through_next_deadline() {
        let t = Instant::now();
        let (mut s, _) = Solo::new(SupervisorConfig {
            backoff: B,
            ..cfg(1, 10)
        });
        spawn_all(&mut s, t, 10);
        let a = fail_at(&mut s, t, 10);
        assert_eq!((restart_waits(&a), spawns(&a)), (vec![0], vec![1]));
        spawn_all(&mut s, t, 20);
        let failed = t + Duration::from_secs(1);
        let a = fail_at(&mut s, failed, 20);
        assert_eq!((restart_waits(&a), spawns(&a)), (vec![1000], vec![]));
        let until = failed + Duration::from_secs(1);
        assert_eq!(s.next_deadline(), Some(until));
        let early = s.handle(until - Duration::from_millis(1), Event::Tick);
        assert!(spawns(&early).is_empty());
        assert_eq!(spawns(&s.handle(until, Event::Tick)), vec![2]);
        assert_eq!(s.cycle(), 2);
    }

    #[test]
    fn a_signal_during_a_backoff_ends_the_agent() {
        let t = Instant::now();
        let (mut s, _) = Solo::new(SupervisorConfig {
            backoff: B,
            ..cfg(1, 10)
        });
        spawn_all(&mut s, t, 10);
        fail_at(&mut s, t, 10);
        spawn_all(&mut s, t, 20);
        fail_at(&mut s, t, 20);
        assert!(s.next_deadline().is_some());
        let a = s.handle(t, Event::Signal(SIGTERM));
        assert_eq!(finish(&a), Some(&Outcome::Signaled { signal: SIGTERM }));
        assert!(spawns(&a).is_empty());
        assert_eq!(s.next_deadline(), None);
    }

    #[test]
    fn lost_coordination_during_a_backoff_ends_the_agent() {
        let t = Instant::now();
        let (mut s, _) = Solo::new(SupervisorConfig {
            backoff: B,
            ..cfg(1, 10)
        });
        spawn_all(&mut s, t, 10);
        fail_at(&mut s, t, 10);
        spawn_all(&mut s, t, 20);
        fail_at(&mut s, t, 20);
        let a = s.handle(
            t,
            Event::CoordinationLost {
                reason: "gone".into(),
                requeue: true,
            },
        );
        assert!(matches!(finish(&a), Some(Outcome::Lost { .. })));
    }

    proptest::proptest! {
        /// The first restart of a streak never waits; no wait exceeds the cap; within a streak
        /// waits never shrink; a long attempt always restarts at once.
        #[test]
        fn backoff_bounds(
            base_ms in 0u64..5_000,
            cap_ms in 0u64..60_000,
            reset_ms in 0u64..600_000,
            rans in proptest::collection::vec(0u64..700_000, 1..40),
        ) {
            let b = Backoff {
                base: Duration::from_millis(base_ms),
                cap: Duration::from_millis(cap_ms),
                reset_after: Duration::from_millis(reset_ms),
            };
            let mut streak = 0;
            let mut last = Duration::ZERO;
            for ran in rans {
                let ran = Duration::from_millis(ran);
                let (w, next) = b.next(streak, ran);
                proptest::prop_assert!(w <= b.cap);
                if streak == 0 || ran >= b.reset_after {
                    proptest::prop_assert_eq!(w, Duration::ZERO);
                    proptest::prop_assert_eq!(next, 1);
                } else {
                    proptest::prop_assert!(w >= last);
                    proptest::prop_assert!(w <= b.base.saturating_mul(1 << (streak - 1).min(31)));
                }
                last = w;
                streak = next;
            }
        }

        /// Whatever order ranks exit in, the supervisor ends exactly once, restarts at most
        /// `max_restarts` times and only ever signals pids of its own cycle.
        #[test]
        fn ends_once_within_budget(
            nproc in 1u32..5,
            max_restarts in 0u32..4,
            codes in proptest::collection::vec(0i32..3, 1..60),
        ) {
            let t = Instant::now();
            let (mut s, _) = Solo::new(cfg(nproc, max_restarts));
            let mut base = 1000;
            spawn_all(&mut s, t, base);
            let mut finishes = 0;
            let mut restarts = 0;
            for (i, code) in codes.iter().enumerate() {
                if s.is_finished() { break; }
                let lr = (i as u32) % nproc;
                let pid = base + lr as i32;
                let a = s.handle(t, Event::Reaped { pid, how: ExitKind::Code(*code) });
                for (pgids, _) in signals(&a) {
                    for p in pgids { proptest::prop_assert!(p >= base && p < base + nproc as i32); }
                }
                if finish(&a).is_some() { finishes += 1; }
                if !spawns(&a).is_empty() {
                    restarts += 1;
                    base += 100;
                    spawn_all(&mut s, t, base);
                }
            }
            proptest::prop_assert!(finishes <= 1);
            proptest::prop_assert!(restarts <= max_restarts);
        }
    }
}
