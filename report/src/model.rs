//! What a job's history is made of: allocations, node runs, attempts, failures, hangs, restarts,
//! stops, steps and straggler scores, as plain data with the few words each says about itself.
//! Built by `history.rs` from the records.

use std::path::PathBuf;

use vigil_events::ledger::DecisionKind;
pub use vigil_events::signal_name;

#[derive(Debug, Clone, Default)]
pub struct History {
    /// The directory the records were looked for in.
    pub root: PathBuf,
    /// In start order. From the ledger where it has a record, else inferred from the runs.
    pub allocations: Vec<Allocation>,
    /// One per `events.jsonl`: one node in one allocation. In start order.
    pub runs: Vec<NodeRun>,
    /// Skipped files and lines.
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Allocation {
    /// 1-based, as in the ledger.
    pub number: u32,
    pub job_id: Option<String>,
    pub start: f64,
    /// None while it is still running (no ledger record and no `result` yet).
    pub end: Option<f64>,
    pub nodes: Vec<String>,
    /// The ledger's `finished`, `stopped`, `failed`, `lost`, `no_progress`; for an inferred
    /// allocation, node rank 0's `result` outcome.
    pub outcome: Option<String>,
    /// `finished`, `requeue` or `stop` (ledger only).
    pub decision: Option<DecisionKind>,
    pub why: Option<String>,
    pub highest_step: Option<u64>,
    pub restarts: u32,
    pub stop_step: Option<u64>,
    pub stop_trigger: Option<String>,
    pub excluded: Vec<String>,
    pub exit_status: Option<i32>,
    /// Whether this came from a ledger record (else inferred from event logs).
    pub from_ledger: bool,
    /// Slurm's `SubmitTime` and `StartTime` of the allocation (ledger only; docs/goodput.md).
    pub submit_time: Option<f64>,
    pub slurm_start: Option<f64>,
    /// Indices into `History::runs`.
    pub runs: Vec<usize>,
}

impl Allocation {
    pub fn requeued(&self) -> bool {
        self.decision == Some(DecisionKind::Requeue)
    }

    /// A stop for a signal (preemption, `scancel --signal`) rather than the time limit.
    pub fn preempted(&self) -> bool {
        self.stop_trigger
            .as_deref()
            .is_some_and(vigil_events::signals::is_stop_signal_name)
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeRun {
    pub source: PathBuf,
    pub host: String,
    pub node_rank: u32,
    pub run_id: Option<String>,
    /// The agent's command line (`nodes` record; vigils before it did not write one).
    pub command: Option<Vec<String>>,
    pub nnodes: Option<u32>,
    /// First and last record's time.
    pub start: f64,
    pub end: f64,
    pub attempts: Vec<Attempt>,
    pub failures: Vec<Failure>,
    pub hangs: Vec<Hang>,
    pub restarts: Vec<Restart>,
    pub stops: Vec<Stop>,
    pub steps: Vec<StepPoint>,
    /// Closed checkpoint sections (`section` records), for goodput's checkpoint category.
    pub saves: Vec<Save>,
    pub straggler_reports: Vec<StragglerReport>,
    /// `node_fault`: this node could not run ranks any more (a critical XID, an uncorrectable
    /// ECC error, a failed health check).
    pub node_faults: Vec<NodeFault>,
    /// Node rank 0 with standbys (`spares`, `standby_gone`): when the standbys ready changed,
    /// how many, and why (a standby out of the job; `None`: an attempt's verdict).
    pub spares: Vec<SparesChange>,
    /// In-process restarts (docs/inprocess.md): generations begun and recovered, and failures
    /// that restarted the whole job instead.
    pub generations: Vec<InProcess>,
    /// `events_lost`: stretches in which the event log could not be written, so records of
    /// this node are missing.
    pub events_lost: Vec<EventsLost>,
    /// The same generations' `generation` and `generation_stepping` records, for goodput.
    pub gen_marks: Vec<GenerationMark>,
    pub result: Option<RunResult>,
}

/// The standbys ready changed (docs/spares.md).
#[derive(Debug, Clone, PartialEq)]
pub struct SparesChange {
    pub ts: f64,
    pub ready: u32,
    /// Standby `node` out of the job, for this reason.
    pub gone: Option<(u32, String)>,
}

/// A generation's record on one node (docs/inprocess.md).
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationMark {
    pub ts: f64,
    pub attempt: u32,
    pub generation: u64,
    pub kind: GenerationKind,
}

#[derive(Debug, Clone, PartialEq)]
pub enum GenerationKind {
    /// `generation`: it began, replacing the global `ranks`, the node's ranks at `step`.
    Began { ranks: Vec<u32>, step: Option<u64> },
    /// `generation_stepping`: every rank of the node stepped in it.
    Stepping,
}

/// An in-process restart's moment, described.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InProcess {
    pub ts: f64,
    pub attempt: u32,
    pub text: String,
}

/// Records of a node lost while its event log could not be written (`events_lost`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EventsLost {
    /// When the first and the last lost record were due (Unix seconds).
    pub first_ts: f64,
    pub last_ts: f64,
    pub records: u64,
    pub error: String,
}

impl EventsLost {
    pub fn describe(&self) -> String {
        format!(
            "event log not written for {:.1}s: {} record(s) lost ({})",
            self.last_ts - self.first_ts,
            self.records,
            self.error
        )
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeFault {
    pub ts: f64,
    pub attempt: u32,
    pub reason: String,
}

impl NodeRun {
    pub fn label(&self) -> String {
        format!("node {} ({})", self.node_rank, self.host)
    }

    /// A rank's attempt directory, `<run dir>/attempt_<attempt>/<local rank>/` (docs/usage.md,
    /// "The run directory"); the run directory is the event log's own.
    pub fn rank_dir(&self, attempt: u32, local_rank: u32) -> Option<PathBuf> {
        let run = self.source.parent()?;
        Some(
            run.join(format!("attempt_{attempt}"))
                .join(local_rank.to_string()),
        )
    }

    /// The wait before each attempt that followed another on this node: from the end of attempt
    /// `from` (its failure, hang or stop) to the start of the next.
    pub fn waits(&self) -> Vec<Wait> {
        let mut out = Vec::new();
        for r in &self.restarts {
            let prev = self
                .attempts
                .iter()
                .rev()
                .find(|a| a.attempt == r.from_attempt);
            let next = self.attempts.iter().find(|a| a.attempt == r.to_attempt);
            let (Some(prev), Some(next)) = (prev, next) else {
                continue;
            };
            if next.start < prev.end {
                continue;
            }
            let gone = prev
                .ranks_gone
                .unwrap_or(prev.end)
                .clamp(prev.end, r.ts.max(prev.end));
            out.push(Wait {
                from: prev.end,
                to: next.start,
                to_attempt: r.to_attempt,
                stopping_s: gone - prev.end,
                backoff_s: r.backoff_ms.unwrap_or(0) as f64 / 1000.0,
            });
        }
        out
    }
}

/// The time between an attempt's end and the restart's next attempt on one node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Wait {
    pub from: f64,
    pub to: f64,
    pub to_attempt: u32,
    /// Of it, the time the attempt's other ranks took to exit once it had ended.
    pub stopping_s: f64,
    /// Of it, the restart's back-off.
    pub backoff_s: f64,
}

impl Wait {
    /// `waited 12s (ranks stopping 11s, back-off 1s)`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.stopping_s >= 0.05 {
            parts.push(format!("ranks stopping {}", secs(self.stopping_s)));
        }
        if self.backoff_s >= 0.05 {
            parts.push(format!("back-off {}", secs(self.backoff_s)));
        }
        let mut s = format!("waited {}", secs(self.to - self.from));
        if !parts.is_empty() {
            s.push_str(&format!(" ({})", parts.join(", ")));
        }
        s
    }
}

/// `under 0.1s`, `0.4s`, `12s`, `3m05s`.
pub fn secs(s: f64) -> String {
    if s < 0.05 {
        "under 0.1s".to_string()
    } else if s < 10.0 {
        format!("{s:.1}s")
    } else {
        crate::fmt::duration(s)
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Attempt {
    pub attempt: u32,
    pub start: f64,
    /// `attempt_ended`'s time, else the run's last record.
    pub end: f64,
    /// `done`, `failed`, `stopped`, `lost`; None when the log ends inside the attempt.
    pub end_kind: Option<String>,
    pub reason: Option<String>,
    pub nproc: Option<u32>,
    /// When the last of its ranks on this node was seen exiting (`rank_exited`): after a
    /// failure, the others are stopped before the next attempt starts.
    pub ranks_gone: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Failure {
    pub ts: f64,
    pub attempt: u32,
    pub rank: Option<u32>,
    pub local_rank: Option<u32>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// `rank_spawn_failed`'s error.
    pub error: Option<String>,
}

/// What a failed or hung rank left in its attempt directory, read for the page.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RankLogs {
    /// `<run dir>/attempt_<n>/<local rank>/`.
    pub dir: PathBuf,
    /// The files there worth opening (not empty): stderr.log, stdout.log, error.json, stacks.
    pub files: Vec<PathBuf>,
    /// The last Python traceback in its stderr.log (or, without one, its last lines), cut to a
    /// few lines.
    pub excerpt: Option<String>,
    /// The exception line that ends the traceback (`ValueError: bad batch`).
    pub exception: Option<String>,
}

impl Failure {
    pub fn describe(&self) -> String {
        let who = match (self.rank, self.local_rank) {
            (Some(r), _) => format!("rank {r}"),
            (None, Some(l)) => format!("local rank {l}"),
            _ => "a rank".into(),
        };
        if let Some(e) = &self.error {
            return format!("{who} could not start: {e}");
        }
        match (self.exit_code, self.signal) {
            (_, Some(s)) => format!("{who} killed by {}", signal_name(s)),
            (Some(c), None) => format!("{who} exited with code {c}"),
            (None, None) => format!("{who} failed"),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Hang {
    pub ts: f64,
    pub attempt: u32,
    pub rank: Option<u32>,
    /// `initial`, `heartbeat`, `out_of_section` or `section NAME`.
    pub timeout: String,
    pub silent_ms: Option<u64>,
    /// What the agent measured against which timeout (`no heartbeat for 1.2s, past its
    /// heartbeat timeout of 1.0s`), as the agent's console said it.
    pub measured: Option<String>,
    /// The innermost frames from the `stacks` event that followed, innermost first.
    pub frames: Vec<String>,
    pub local_rank: Option<u32>,
    /// Where the `stacks` event says the stacks were written.
    pub stacks_files: Vec<PathBuf>,
}

impl Hang {
    /// The frame it hung in, shortened: `t.py:4 in wait_forever`.
    pub fn frame(&self) -> Option<String> {
        self.frames.first().map(|f| short_frame(f))
    }

    pub fn describe(&self) -> String {
        let who = self
            .rank
            .map_or_else(|| "a rank".to_string(), |r| format!("rank {r}"));
        let mut s = format!("{who} hung ({} timeout)", self.timeout);
        if let Some(f) = self.frame() {
            s.push_str(&format!(" in {f}"));
        }
        s
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Restart {
    pub ts: f64,
    pub from_attempt: u32,
    pub to_attempt: u32,
    pub restarts_left: Option<u32>,
    pub backoff_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum StopKind {
    /// `stop_triggered`: SIGTERM, SIGUSR1, SIGUSR2, time-limit.
    Triggered { trigger: String },
    /// `stop_agreed`: the job's stop step (None: stop now).
    Agreed {
        step: Option<u64>,
        trigger: Option<String>,
    },
    /// `stop_overdue`: ranks still running when the window ended.
    Overdue { ranks: Vec<u32> },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Stop {
    pub ts: f64,
    pub attempt: u32,
    pub kind: StopKind,
    /// The ranks' window (`window_ms`): for a time-limit stop, the time left to the allocation's
    /// end. None for an agreement.
    pub window_s: Option<f64>,
}

impl Stop {
    pub fn describe(&self) -> String {
        match &self.kind {
            StopKind::Triggered { trigger } => format!("stop asked ({trigger})"),
            StopKind::Agreed { step: Some(s), .. } => format!("stop agreed at step {s}"),
            StopKind::Agreed { step: None, .. } => "stop agreed: now".into(),
            StopKind::Overdue { ranks } => format!("stop overdue: ranks {ranks:?}"),
        }
    }
}

/// A rank's checkpoint section (`section`): it closed at `ts` after `seconds`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Save {
    pub ts: f64,
    pub attempt: u32,
    pub rank: u32,
    pub seconds: f64,
    /// The rank's last recorded one in the attempt: later saves are not in the log.
    pub last_recorded: bool,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepPoint {
    pub ts: f64,
    pub attempt: u32,
    pub step: u64,
    pub min_step: Option<u64>,
    /// The ranks' median step time, as they measured it (seconds), when the record has it.
    pub step_s: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct RankScore {
    pub rank: u32,
    pub node_rank: Option<u32>,
    pub host: Option<String>,
    pub relative: Option<f64>,
    pub individual: Option<f64>,
    pub median_s: Option<f64>,
    /// What its GPU was doing, when the report knew (`gpus`).
    pub gpu: Option<String>,
}

impl RankScore {
    /// `rank 3 on n1 (relative 0.25, individual 1.00, GPU: SM clock ...)`.
    pub fn describe(&self) -> String {
        let mut s = format!("rank {}", self.rank);
        if let Some(h) = &self.host {
            s.push_str(&format!(" on {h}"));
        }
        let mut parts = Vec::new();
        if let Some(v) = self.relative {
            parts.push(format!("relative {v:.2}"));
        }
        if let Some(v) = self.individual {
            parts.push(format!("individual {v:.2}"));
        }
        if let Some(g) = &self.gpu {
            parts.push(format!("GPU: {g}"));
        }
        if !parts.is_empty() {
            s.push_str(&format!(" ({})", parts.join(", ")));
        }
        s
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct StragglerReport {
    pub ts: f64,
    pub ranks: Vec<RankScore>,
    pub stragglers: Vec<u32>,
    pub threshold: Option<f64>,
    pub unscored: Option<u64>,
}

impl StragglerReport {
    /// `stragglers below 0.70: rank 3 on n1 (relative 0.25, individual 1.00; GPU ...)`, or
    /// that there are none.
    pub fn describe_stragglers(&self) -> String {
        let below = self
            .threshold
            .map_or_else(String::new, |t| format!(" below {t:.2}"));
        if self.stragglers.is_empty() {
            return format!("no stragglers{below} any more");
        }
        let each: Vec<String> = self
            .stragglers
            .iter()
            .map(|rank| match self.ranks.iter().find(|r| r.rank == *rank) {
                Some(r) => r.describe(),
                None => format!("rank {rank}"),
            })
            .collect();
        format!("stragglers{below}: {}", each.join("; "))
    }

    /// The rank with the lowest relative score (1.0 is best).
    pub fn worst(&self) -> Option<&RankScore> {
        self.ranks
            .iter()
            .filter(|r| r.relative.is_some())
            .min_by(|a, b| a.relative.partial_cmp(&b.relative).unwrap())
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunResult {
    pub ts: f64,
    pub outcome: String,
    pub exit_code: Option<i32>,
    pub restarts: Option<u32>,
    /// The outcome's own fields, as `key=value` pairs.
    pub detail: String,
}

/// One thing that happened, for the events table and the status view.
#[derive(Debug, Clone, PartialEq)]
pub struct Moment {
    pub ts: f64,
    /// `node N (host)`, or `job` for an allocation's own moments.
    pub node: String,
    pub kind: &'static str,
    pub text: String,
}

/// `Current thread 0x..: File "/a/b/t.py", line 4 in f` becomes `t.py:4 in f`; a frame of
/// another shape (a kernel stack line) is kept as it is, trimmed.
pub fn short_frame(frame: &str) -> String {
    let f = frame.trim();
    let Some(at) = f.find("File \"") else {
        return f.to_string();
    };
    let rest = &f[at + 6..];
    let Some(q) = rest.find('"') else {
        return f.to_string();
    };
    let file = rest[..q].rsplit('/').next().unwrap_or(&rest[..q]);
    let tail = rest[q + 1..].trim_start_matches(',').trim();
    match tail.strip_prefix("line ") {
        Some(t) => match t.split_once(' ') {
            Some((line, func)) => format!("{file}:{line} {}", func.trim()),
            None => format!("{file}:{t}"),
        },
        None => format!("{file} {tail}").trim().to_string(),
    }
}
