//! What goes into the supervisor and what comes out: its configuration, events, actions, the
//! records of the event log, the job's verdicts and the agent's outcome.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use vigil_ipc::{AgentMsg, RankMsg};

use super::backoff::Backoff;
use super::monitor::Timeouts;

// The records of the event log and the types they carry are the schema crate's.
pub use vigil_events::log::{Hang, HangKind, JobEnd, Outcome, Record, StopReason, EXIT_LOST};

/// What one node reports once a stop was asked: its ranks' highest step and fastest pace.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StepReport {
    pub max_step: Option<u64>,
    /// Steps per second of this node's fastest rank, when known.
    pub steps_per_s: Option<f64>,
}

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
    /// Ranks in the whole job (the rendezvous says, per attempt).
    pub world_size: u32,
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
    /// `--calculate-timeouts`: vigil calculates the timeouts in force on its own once enough was
    /// observed. Without it they change only when the job's code asks (NVRx's
    /// `calculate_and_set_*`, `vigil.calculate_timeouts`), as under ft_launcher.
    pub calculates: bool,
    /// What a hung rank gets after its stacks are captured (SIGTERM by default, then SIGKILL).
    pub termination_signal: i32,
    /// How long to wait for a hung rank's stack dump before terminating it anyway.
    pub stack_wait: Duration,
    /// Timeouts calculated by an earlier run of this job (the state file), if any.
    pub calculated: Option<Timeouts>,
    /// How long to wait before each restart.
    pub backoff: Backoff,
    /// Stop restarting after this many attempts in a row without progress of this many steps
    /// (`--max-no-progress`, `--min-progress-steps`); one node only (several nodes could judge
    /// differently and part ways), `None`: off.
    pub no_progress: Option<(u32, u64)>,
    /// `--checkpoint-iteration-file` (NVRx's progress tracker): an attempt's progress is the
    /// file's value after it ([`Event::CheckpointIteration`]), over the value when the job
    /// started, not the ranks' steps.
    pub progress_from_file: bool,
    /// `--min-progress-steps`: the steps past the best before that make an attempt's progress
    /// where no checkpoint is known (the back-off grows only for attempts without progress).
    pub min_progress_steps: u64,
    /// `--stop-if-straggler`: a straggler report stops the job at a step and blames the nodes.
    pub stop_if_straggler: bool,
    /// `--in-process-restarts`, `--abort-timeout` (docs/inprocess.md).
    pub in_process: super::generation::InProcessConfig,
}

impl SupervisorConfig {
    /// A configuration with hang detection off, for tests and simple launches.
    pub fn basic(nproc: u32, max_restarts: u32) -> Self {
        SupervisorConfig {
            nproc,
            rank_offset: 0,
            world_size: nproc,
            max_restarts,
            node_rank: 0,
            saves_timeouts: true,
            workers_stop_timeout: Duration::from_secs(15),
            term_timeout: Duration::from_secs(30),
            timeouts: Timeouts::default(),
            warmup_steps: 0,
            safety_factor: 5.0,
            calculates: false,
            termination_signal: SIGTERM,
            stack_wait: Duration::from_secs(2),
            calculated: None,
            backoff: Backoff::OFF,
            no_progress: None,
            progress_from_file: false,
            min_progress_steps: super::progress::DEFAULT_MIN_PROGRESS_STEPS,
            stop_if_straggler: false,
            in_process: super::generation::InProcessConfig::OFF,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The runtime started this rank of the current attempt; its process group id is `pid`.
    RankSpawned { local_rank: u32, pid: i32 },
    /// The runtime could not start this rank (the command cannot be executed).
    SpawnFailed { local_rank: u32, error: String },
    /// A child of the agent was reaped. Pids that are not ranks (orphaned grandchildren reparented
    /// to the agent as subreaper) are ignored.
    Reaped { pid: i32, how: ExitKind },
    /// The agent received a signal (SIGTERM, SIGINT, SIGHUP, SIGQUIT). `window`: how long the
    /// ranks are given to end after it (Slurm's window when the signal is the time limit's or a
    /// preemption's, which the runtime measures when it comes; `--term-timeout` otherwise).
    Signal { signal: i32, window: Duration },
    /// A message from a rank of the current attempt, on a connection registered to `local_rank`.
    Message { local_rank: u32, msg: RankMsg },
    /// The last registered connection of this rank closed: its monitoring pauses until it
    /// registers again (`vigil.close()`, NVRx's `shutdown_workload_monitoring`).
    Disconnected { local_rank: u32 },
    /// The hung rank's stacks were captured (or the capture gave up).
    StacksCaptured { local_rank: u32 },
    /// The checkpoint iteration file's value (`None`: missing, empty or not a number), read as
    /// the job started (`at_start`) or after a rank exited.
    CheckpointIteration {
        at_start: bool,
        iteration: Option<u64>,
    },
    /// The answer to `ProbeStopped`: the local ranks whose process is stopped (state `T`), and
    /// where the main thread is of each rank asked (`true`: inside torch's collective machinery,
    /// waiting for another rank); a rank that did not answer in time is not in `waiting`.
    Probed {
        stopped: Vec<u32>,
        waiting: Vec<(u32, bool)>,
    },
    /// Time passed; sent when `next_deadline` is reached.
    Tick,
    /// Every node joined this attempt: start the ranks. The job's rendezvous decides where this
    /// node's ranks stand in the job ([`Placement`]), the job's restart budget and the calculated
    /// timeouts in force.
    Joined {
        attempt: u32,
        placement: Placement,
        max_restarts: u32,
        calculated: Option<Timeouts>,
    },
    /// The job's verdict on this attempt, the same on every node.
    AttemptEnded { attempt: u32, end: JobEnd },
    /// Timeouts calculated from every node's observations (the maximum over nodes) in calculation
    /// `round` of the attempt (0: vigil's own; 1, 2, ...: the job's requests).
    JobTimeouts {
        attempt: u32,
        round: u32,
        timeouts: Timeouts,
    },
    /// The job's coordination is gone (the store's node died or cannot be reached, or the
    /// rendezvous failed): stop and end. `requeue` tells whether running the job again may help.
    CoordinationLost { reason: String, requeue: bool },
    /// When to ask for a stop ahead of the allocation's end (`None`: no end known), and how long
    /// the ranks then get to stop on their own. From the runtime, again whenever the end moves.
    StopAt {
        at: Option<Instant>,
        window: Duration,
    },
    /// A node (maybe this one) asked the job to stop at a step, for `trigger`.
    StopAsked { attempt: u32, trigger: String },
    /// The job's stop step (`None`: no rank reported a step; stop now).
    StopStep { attempt: u32, step: Option<u64> },
    /// This node cannot run ranks any more (a critical XID, an uncorrectable ECC error, a failed
    /// health check): it leaves the job, which is requeued without it. `at_gate`: found by the
    /// checks before a rendezvous, whose join was therefore never sent: leave at once.
    NodeFault { reason: String, at_gate: bool },
    /// This node has no slot in `attempt`: a standby (hot spares). It runs no ranks and waits for
    /// the attempt's verdict like a node whose ranks all finished.
    Standby { attempt: u32 },
    /// In-process generation `generation` of `attempt` began somewhere in the job (maybe on this
    /// node), replacing these global ranks (`None`: the store's record could not be read).
    GenerationBegun {
        attempt: u32,
        generation: u64,
        replaced: Option<Vec<u32>>,
    },
    /// Node rank 0's straggler report found stragglers on these nodes.
    Stragglers { nodes: Vec<u32> },
    /// A node (maybe this one) asks every node for its hang candidates, for the job's hang
    /// verdict `round` of `attempt` (`JobRequest::HangReport`).
    HangAsked { attempt: u32, round: u32 },
    /// The job's hang verdict `round` of `attempt`: the rank to name hung (`None`: no node had
    /// a candidate; each node then decides alone).
    HangNamed {
        attempt: u32,
        round: u32,
        hung: Option<HungRank>,
    },
}

/// The rank a job-wide hang verdict names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HungRank {
    /// The global rank.
    pub rank: u32,
    pub pid: i32,
    pub stopped: bool,
}

/// A rank that may be the hung one, as its node sees it when a hang is due (`hangs.rs`). Across
/// nodes each node hands its own to the coordinator (`JobRequest::HangReport`), which picks one
/// with `choose_hung`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HangCandidate {
    pub local_rank: u32,
    /// The global rank.
    pub rank: u32,
    pub pid: i32,
    /// The last step it reported (`None`: none yet).
    pub step: Option<u64>,
    /// The section it is in, if any.
    pub section: Option<String>,
    /// When its silence began: the last message it sent.
    pub since: Instant,
    /// A definite culprit: its process is stopped (SIGSTOP, a debugger), it raised an uncaught
    /// exception and has not exited, or this node already named it hung.
    pub stopped: bool,
    /// Where its main thread is: `Some(true)` inside torch's collective machinery (it waits for
    /// another rank), `Some(false)` elsewhere, `None` unknown (no shim, no answer in time).
    pub waiting: Option<bool>,
}

/// One rank that failed on its own (not because we stopped it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Failure {
    #[serde(rename = "cycle")]
    pub attempt: u32,
    pub local_rank: u32,
    pub rank: u32,
    pub pid: i32,
    /// How the process ended; for a hung rank, filled in once it is reaped.
    pub how: Option<ExitKind>,
    pub hang: Option<Hang>,
    #[serde(skip)]
    pub at: Instant,
}

/// What a node asks of the job's coordination (carried out by `rendezvous` through the store).
#[derive(Debug, Clone, PartialEq)]
pub enum JobRequest {
    /// Join this attempt's rendezvous with the other nodes; answer with `Joined`. Node rank 0
    /// hands `calculated` to every node.
    Join {
        attempt: u32,
        calculated: Option<Timeouts>,
    },
    /// From the checks before a rendezvous, with standbys in the job (hot spares): whether this
    /// node may be given ranks. An unfit node stays a member and is never given a slot.
    Health { healthy: bool },
    /// Tell the other nodes this attempt failed or stopped here (the first report of an attempt wins);
    /// the verdict comes back as `AttemptEnded`.
    ReportEnd { attempt: u32, end: JobEnd },
    /// Every rank of this node exited 0 in this attempt.
    ReportDone { attempt: u32 },
    /// Timeouts calculated from this node's ranks, to be combined over all nodes (`JobTimeouts`).
    /// Round 0 is vigil's own calculation; rounds 1, 2, ... answer the job's requests in order.
    ShareTimeouts {
        attempt: u32,
        round: u32,
        timeouts: Timeouts,
    },
    /// The agent ends: leave the job; when `poison` is set, make any node waiting to join that
    /// attempt end with that verdict instead of waiting for this node. `highest_step`: the highest
    /// step this node's ranks reported, left for node rank 0's ledger.
    Leave {
        poison: Option<(u32, JobEnd)>,
        highest_step: Option<u64>,
    },
    /// A standby leaves the job on a signal, for `reason` (before `Leave`): the coordinator
    /// takes it out of the job and the attempts run on without it.
    Depart { reason: String },
    /// Record a stop trigger for the job (the first one recorded wins); every node then gets
    /// `StopAsked`.
    StopTrigger { attempt: u32, trigger: String },
    /// This node's steps, once a stop was asked; when every node reported, every node gets
    /// `StopStep`.
    StopSteps { attempt: u32, report: StepReport },
    /// In-process generation `generation` of `attempt` begins here, replacing these global
    /// ranks: tell every node (the first node to begin a generation wins); every node, this
    /// one too, gets `GenerationBegun` with the winner.
    BeginGeneration {
        attempt: u32,
        generation: u64,
        replaced: Vec<u32>,
    },
    /// A hang is due here and no rank of this node is stopped, or another node asked
    /// (`HangAsked`): this node's candidates for the job's hang verdict `round`. The first
    /// report of a round asks every node for theirs; once every node reported, every node gets
    /// `HangNamed`.
    HangReport {
        attempt: u32,
        round: u32,
        candidates: Vec<HangCandidate>,
    },
}

/// Where this node's ranks stand in an attempt, as the job's rendezvous placed them: what the
/// ranks are told (GROUP_RANK, RANK, WORLD_SIZE).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Placement {
    /// GROUP_RANK: the node rank, unless this node took a lost node's place (hot spares).
    pub group_rank: u32,
    /// The global rank of local rank 0.
    pub rank_offset: u32,
    /// Ranks in the whole job.
    pub world_size: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// A request to the job's coordination (`rendezvous`), answered with `Joined`, `AttemptEnded`
    /// or `JobTimeouts`.
    Job(JobRequest),
    /// Start every rank of this attempt; report each with `RankSpawned` or `SpawnFailed`.
    SpawnAttempt {
        attempt: u32,
        placement: Placement,
    },
    /// Start one rank of the attempt again, in its place (an in-process restart): the same
    /// rank numbers, at `generation`, told which ranks are `replaced`; report it with
    /// `RankSpawned` or `SpawnFailed`.
    SpawnRank {
        attempt: u32,
        local_rank: u32,
        generation: u64,
        replaced: Vec<u32>,
    },
    /// Send `signal` to each of these process groups.
    SignalGroups {
        pgids: Vec<i32>,
        signal: i32,
    },
    /// Every rank leader of the attempt is reaped: SIGKILL whatever is left in their groups
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
    /// A hang is due: tell which of these ranks' processes are stopped, and where the main
    /// thread of each of `ask_where` is, with `Probed`, before the supervisor picks the hung rank
    /// (a frozen rank is the root cause, and so is one not waiting in a collective, not the ranks
    /// that wait on it).
    ProbeStopped {
        ranks: Vec<(u32, i32)>,
        /// The ranks among them whose main thread's place is asked of their shim (registered).
        ask_where: Vec<u32>,
    },
    /// Send to one rank's registered connection.
    SendToRank {
        local_rank: u32,
        msg: AgentMsg,
    },
    /// Send to every registered rank of the attempt.
    SendToAll(AgentMsg),
    /// Persist calculated timeouts for the next run of the job.
    SaveTimeouts(Timeouts),
    /// The agent is done: print the summary and exit with `outcome.exit_code()`.
    Finish(Outcome),
}

pub const SIGKILL: i32 = libc::SIGKILL;
pub const SIGTERM: i32 = libc::SIGTERM;
pub const SIGINT: i32 = libc::SIGINT;
