//! How things end, as the event log records them: a rank's hang ([`Hang`], [`HangKind`]), the
//! job's verdict on an attempt ([`JobEnd`]), why a job stopped ([`StopReason`]) and how the
//! agent's run ended ([`Outcome`], with its exit status).

use serde::{Deserialize, Serialize};

use crate::exit;

/// Which timeout a hung rank ran past.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HangKind {
    /// No heartbeat since the rank started (it may never have connected).
    Initial,
    Heartbeat,
    Section(String),
    OutOfSection,
}

impl std::fmt::Display for HangKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HangKind::Initial => write!(f, "initial heartbeat timeout"),
            HangKind::Heartbeat => write!(f, "heartbeat timeout"),
            HangKind::Section(s) => write!(f, "section {s:?} timeout"),
            HangKind::OutOfSection => write!(f, "out-of-section timeout"),
        }
    }
}

/// Why a rank was declared hung.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hang {
    pub timeout: HangKind,
    #[serde(default)]
    pub limit_ms: u64,
    /// How long the rank had been silent (or in its section) when it was declared hung.
    #[serde(default)]
    pub silent_ms: u64,
    /// The rank's process was stopped (SIGSTOP, a debugger): frozen, and so named the root cause
    /// ahead of ranks whose timeout ran out first while they waited on it.
    #[serde(default)]
    pub stopped: bool,
    /// The rank had raised an uncaught exception (this, as it told the agent) and had not exited:
    /// named ahead of the ranks waiting for it, as a stopped one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raised: Option<String>,
}

impl Hang {
    /// What the agent measured, in the words of the timeout: `no heartbeat for 1.2s`, `in
    /// section "step" for 1.2s`, `out of any section for 1.2s` (heartbeats may have come:
    /// out-of-section time is counted from the end of the rank's last section).
    pub fn measured(&self) -> String {
        let s = self.silent_ms as f64 / 1000.0;
        match &self.timeout {
            HangKind::Initial => format!("no first heartbeat {s:.1}s after it started"),
            HangKind::Heartbeat => format!("no heartbeat for {s:.1}s"),
            HangKind::Section(name) => format!("in section {name:?} for {s:.1}s"),
            HangKind::OutOfSection => format!("out of any section for {s:.1}s"),
        }
    }

    /// `no heartbeat for 1.2s, past its heartbeat timeout of 1.0s`: what was measured and the
    /// timeout it is measured against, as every message about a hang puts it. A stopped rank is
    /// declared when another rank's timeout runs out while it waits on it, often before its own
    /// has: then its timeout is named as not yet run out.
    pub fn passed(&self) -> String {
        let limit = self.limit_ms as f64 / 1000.0;
        if self.silent_ms >= self.limit_ms {
            format!(
                "{}, past its {} of {limit:.1}s",
                self.measured(),
                self.timeout
            )
        } else {
            format!(
                "{} (its {} of {limit:.1}s had not run out)",
                self.measured(),
                self.timeout
            )
        }
    }

    /// [`Hang::passed`], led by `its process is stopped (SIGSTOP or a debugger)` when it was.
    pub fn why(&self) -> String {
        if let Some(error) = &self.raised {
            format!(
                "it raised {error} and has not exited while the others wait for it; {}",
                self.passed()
            )
        } else if self.stopped {
            format!(
                "its process is stopped (SIGSTOP or a debugger); {}",
                self.passed()
            )
        } else {
            self.passed()
        }
    }

    /// `rank 3 hung: no heartbeat for 1.2s, past its heartbeat timeout of 1.0s`: why the attempt
    /// failed, as the `attempt_ended` record's reason carries it to the console and the report.
    pub fn reason(&self, rank: u32) -> String {
        format!("rank {rank} hung: {}", self.why())
    }
}

/// How an attempt ended for the whole job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
    /// `node`: which one, when known (node rank 0 names the node it lost).
    Lost {
        reason: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node: Option<u32>,
    },
}

impl JobEnd {
    /// `done`, `failed`, `stopped` or `lost`: the `end` field.
    pub fn name(&self) -> &'static str {
        match self {
            JobEnd::Done => "done",
            JobEnd::Failed { .. } => "failed",
            JobEnd::Stopped { .. } => "stopped",
            JobEnd::Lost { .. } => "lost",
        }
    }

    pub fn reason(&self) -> Option<&str> {
        match self {
            JobEnd::Done => None,
            JobEnd::Failed { reason, .. }
            | JobEnd::Stopped { reason, .. }
            | JobEnd::Lost { reason, .. } => Some(reason),
        }
    }
}

/// Why the ranks of an attempt are being stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// A rank failed; restart if the budget allows.
    RankFailed,
    /// A rank was found hung (and is being killed after its stacks); as a failure.
    RankHung,
    /// The agent was signalled; forward it and end.
    Signal,
    /// A rank could not be started; the command is broken, so never restart.
    SpawnFailed,
    /// Another node reported a failure or a stop, or a node was lost.
    Peer,
}

/// What the agent ends with. Fields read from a line that lacks them take their defaults.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    Succeeded,
    /// The restart budget is spent; the first observed failure of the last attempt is the root cause.
    Failed {
        #[serde(default)]
        restarts: u32,
    },
    /// The agent was asked to stop by this signal.
    Signaled {
        #[serde(default)]
        signal: i32,
    },
    SpawnFailed {
        #[serde(default)]
        local_rank: u32,
        #[serde(default)]
        error: String,
    },
    /// Another node stopped the job for good; this node ends with that node's status.
    PeerStopped {
        #[serde(default)]
        node: u32,
        #[serde(default)]
        reason: String,
        #[serde(default)]
        exit_code: i32,
    },
    /// A node was lost or the job's coordination failed.
    Lost {
        #[serde(default)]
        reason: String,
        #[serde(default)]
        requeue: bool,
    },
    /// The in-job attempts stopped making progress: `attempts` in a row did not pass the best
    /// step before them (`--max-no-progress`).
    NoProgress {
        #[serde(default)]
        attempts: u32,
        step: Option<u64>,
    },
    /// Every rank stopped at the agreed step (or was stopped) because of `trigger`; the job is
    /// to go on in the next allocation.
    Stopped {
        #[serde(default)]
        trigger: String,
        step: Option<u64>,
    },
}

/// Exit status when a node was lost or the job stopped to go on later: "run me again".
pub const EXIT_LOST: i32 = crate::exit::REQUEUE;

impl Outcome {
    /// The agent's exit status (documented in docs/usage.md).
    pub fn exit_code(&self) -> i32 {
        match self {
            Outcome::Succeeded => exit::SUCCESS,
            Outcome::Failed { .. } => exit::FAILURE,
            Outcome::Signaled { signal } => exit::signaled(*signal),
            Outcome::SpawnFailed { .. } => exit::USAGE,
            Outcome::PeerStopped { exit_code, .. } => *exit_code,
            Outcome::Lost { requeue: true, .. } => exit::REQUEUE,
            Outcome::Lost { requeue: false, .. } => exit::USAGE,
            Outcome::Stopped { .. } => exit::REQUEUE,
            Outcome::NoProgress { .. } => exit::FAILURE,
        }
    }

    /// `succeeded`, `failed`, ...: the `outcome` field.
    pub fn name(&self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed { .. } => "failed",
            Outcome::Signaled { .. } => "signaled",
            Outcome::SpawnFailed { .. } => "spawn_failed",
            Outcome::PeerStopped { .. } => "peer_stopped",
            Outcome::Lost { .. } => "lost",
            Outcome::NoProgress { .. } => "no_progress",
            Outcome::Stopped { .. } => "stopped",
        }
    }
}
