//! The event log, `events.jsonl`: one JSON object per line, `{"event": NAME, ...}` plus what
//! the agent adds to every line (`ts`, `host`, `node_rank`; see [`Line`]).
//!
//! Every line any part of the agent writes is a [`Record`]. Lines carry no format field: this is
//! format [`FORMAT`], and a change that an older reader would misread gets a new event name
//! rather than a new meaning for an old one.
//!
//! This file holds the records ([`Record`], [`Line`]) and their small parts; the timeouts in
//! force are in `log/timeouts.rs`, how things end (hangs, an attempt's end, the run's outcome)
//! in `log/outcome.rs`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};

mod outcome;
mod timeouts;

pub use outcome::{Hang, HangKind, JobEnd, Outcome, StopReason, EXIT_LOST};
pub use timeouts::Timeouts;

/// The event log's format. Lines have no `format` field; they are all this one.
pub const FORMAT: u32 = 1;

/// Whether the closes of a section by this name are recorded (`section` records): a checkpoint
/// save, a name holding `checkpoint` (`checkpointing`, NVRx's name; `checkpoint_save`), the
/// sections whose longest duration the stop lead is calculated from.
pub fn is_checkpoint_section(name: &str) -> bool {
    name.contains("checkpoint")
}

/// Recorded checkpoint-section closes per rank and attempt: a job that opens a checkpoint section
/// at every step must not fill the disk with them.
pub const MAX_SECTION_RECORDS: u32 = 10_000;

/// A process that held GPU memory (`gpu_memory_held`, `gpu_memory_wait`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuHolder {
    pub gpu: u32,
    pub pid: u32,
    /// From /proc/<pid>/comm; empty when the process is gone or in another pid namespace.
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub mib: u64,
}

/// One check of a health report (`health_check`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthCheck {
    pub name: String,
    /// `pass`, `fail` or `skip`.
    pub status: String,
    #[serde(default)]
    pub detail: String,
}

/// One scored rank of a straggler report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankScore {
    pub rank: u32,
    #[serde(default)]
    pub node_rank: Option<u32>,
    #[serde(default)]
    pub host: Option<String>,
    /// The job's fastest median / this rank's median.
    #[serde(default)]
    pub relative: Option<f64>,
    /// This rank's best median / its current median (1.0 when it has no best yet).
    #[serde(default)]
    pub individual: Option<f64>,
    #[serde(default)]
    pub median_s: Option<f64>,
}

/// At most one `store_refused` record per this long.
pub const STORE_REFUSED_EVERY: Duration = Duration::from_secs(10);

/// A line of the event log, without the fields the runtime adds (time, host, node rank).
///
/// Fields an older vigil may not have written read as their defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Record {
    #[serde(rename = "cycle_start")]
    AttemptStart {
        #[serde(rename = "cycle")]
        attempt: u32,
        #[serde(default)]
        restart_count: u32,
        #[serde(default)]
        nproc: u32,
        /// The attempt's ranks are `rank_offset..rank_offset + nproc` of `world_size`.
        #[serde(default)]
        rank_offset: u32,
        #[serde(default)]
        world_size: u32,
        /// What is left of the job's restart budget once this attempt started.
        #[serde(default)]
        restarts_left: u32,
    },
    RankStarted {
        #[serde(rename = "cycle")]
        attempt: u32,
        local_rank: u32,
        rank: u32,
        pid: i32,
    },
    RankSpawnFailed {
        #[serde(default)]
        #[serde(rename = "cycle")]
        attempt: u32,
        #[serde(default)]
        local_rank: u32,
        #[serde(default = "unknown")]
        error: String,
    },
    RankExited {
        #[serde(default)]
        #[serde(rename = "cycle")]
        attempt: u32,
        #[serde(default)]
        local_rank: u32,
        #[serde(default)]
        rank: u32,
        #[serde(default)]
        pid: i32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exit_code: Option<i32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signal: Option<i32>,
        /// False when the rank ended on its own and not zero: a failure.
        expected: bool,
    },
    Stop {
        #[serde(rename = "cycle")]
        attempt: u32,
        reason: StopReason,
        /// The signal sent to every live rank's process group.
        signal: i32,
        grace_ms: u64,
        pids: Vec<i32>,
        /// Of `pids`, those sent SIGKILL at once instead: they hold `signal` for
        /// `vigil.should_stop`, and this stop (a failure, a hang, a lost node) saves nothing.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        killed: Vec<i32>,
        /// What asked for the stop at a step under way (`time-limit`, `SIGTERM`, ...), if one is.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        trigger: Option<String>,
    },
    Escalate {
        #[serde(rename = "cycle")]
        attempt: u32,
        signal: i32,
        pids: Vec<i32>,
    },
    Registered {
        #[serde(rename = "cycle")]
        attempt: u32,
        local_rank: u32,
        rank: u32,
    },
    /// The rank closed a section under a new name past `kept` distinct names: that name's
    /// durations, and those of every later new name, are not kept (once per rank and attempt).
    SectionNamesCapped {
        #[serde(rename = "cycle")]
        attempt: u32,
        local_rank: u32,
        rank: u32,
        kept: usize,
    },
    Hang {
        #[serde(default)]
        #[serde(rename = "cycle")]
        attempt: u32,
        #[serde(default)]
        local_rank: u32,
        #[serde(default)]
        rank: u32,
        #[serde(default)]
        pid: i32,
        #[serde(flatten)]
        hang: Hang,
    },
    TrainingFinished {
        #[serde(rename = "cycle")]
        attempt: u32,
        local_rank: u32,
        rank: u32,
    },
    TimeoutsUpdated {
        /// `configured`, `loaded` (from the state file) or `calculated`.
        #[serde(deserialize_with = "timeouts_source")]
        source: FixedName,
        timeouts: Timeouts,
    },
    Restart {
        #[serde(default)]
        #[serde(rename = "from_cycle")]
        from_attempt: u32,
        #[serde(default)]
        #[serde(rename = "to_cycle")]
        to_attempt: u32,
        #[serde(default)]
        restarts_left: u32,
        /// How long the failed attempt ran, from its start to the job's verdict on it.
        #[serde(default)]
        ran_ms: u64,
        /// How long the agent waits before joining the next attempt.
        #[serde(default)]
        backoff_ms: u64,
    },
    Joined {
        #[serde(rename = "cycle")]
        attempt: u32,
        rank_offset: u32,
    },
    #[serde(rename = "cycle_ended")]
    AttemptEnded {
        #[serde(default)]
        #[serde(rename = "cycle")]
        attempt: u32,
        #[serde(flatten)]
        end: JobEnd,
        /// When the job's coordination itself was lost: whether running the job again may help
        /// (`false`: the job refused this agent).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        requeue: Option<bool>,
    },
    Result {
        #[serde(flatten)]
        outcome: Outcome,
        #[serde(default)]
        exit_code: i32,
    },
    /// A rank asked, through NVRx's workload control, for `action` (`exclude_this_node`,
    /// `shutdown_workload`).
    WorkloadControl {
        #[serde(rename = "cycle")]
        attempt: u32,
        rank: u32,
        #[serde(deserialize_with = "workload_action")]
        action: FixedName,
        description: String,
    },
    /// This node is a standby in `attempt` (hot spares): no ranks here.
    Standby {
        #[serde(rename = "cycle")]
        attempt: u32,
    },
    /// This node cannot run ranks any more; it leaves the job.
    NodeFault {
        #[serde(default)]
        #[serde(rename = "cycle")]
        attempt: u32,
        #[serde(default = "unknown")]
        reason: String,
    },
    /// This node saw a stop trigger (a signal, the allocation's end within the lead).
    StopTriggered {
        #[serde(default)]
        #[serde(rename = "cycle")]
        attempt: u32,
        #[serde(default)]
        node: u32,
        #[serde(default = "unknown")]
        trigger: String,
        #[serde(default)]
        window_ms: u64,
    },
    /// The job's stop step, told to every rank that speaks to the shim.
    StopAgreed {
        #[serde(default)]
        #[serde(rename = "cycle")]
        attempt: u32,
        #[serde(default)]
        step: Option<u64>,
        #[serde(default = "unknown")]
        trigger: String,
    },
    /// A rank received a stop signal it holds for `vigil.should_stop`, sent to it rather than to
    /// the agent; the job stops at one step as for a signal to the agent.
    RankSignalled {
        #[serde(rename = "cycle")]
        attempt: u32,
        local_rank: u32,
        rank: u32,
        signal: i32,
    },
    /// A rank's main thread ended with an uncaught exception (the shim's exception hook told the
    /// agent before the interpreter shut down): the rank is failing, whatever its exit then takes.
    RankRaised {
        #[serde(rename = "cycle")]
        attempt: u32,
        local_rank: u32,
        rank: u32,
        pid: i32,
        /// The exception's type and message, as the rank sent them (cut to 1 KiB).
        error: String,
    },
    /// These ranks were still running when the stop window ended; they are stopped now.
    StopOverdue {
        #[serde(default)]
        #[serde(rename = "cycle")]
        attempt: u32,
        #[serde(default)]
        ranks: Vec<u32>,
        #[serde(default)]
        window_ms: u64,
    },
    /// The agent's first line: the cgroup its ranks run in, if it has one of its own.
    Containment { cgroup: Option<PathBuf> },
    /// The job's size, the store the ranks are told and the run id.
    Nodes {
        #[serde(default)]
        nnodes: Option<u32>,
        #[serde(default)]
        store: Option<String>,
        #[serde(default)]
        run_id: Option<String>,
        /// The agent's own command line (`vigil run ... train.py --lr 1e-4`), as it was started.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        command: Option<Vec<String>>,
    },
    /// The agent's process was suspended this long (the clock jumped); not counted as silence.
    Suspended { seconds: f64 },
    /// A connection on the ranks' socket was refused.
    IpcRejected {
        peer_pid: Option<i32>,
        reason: String,
    },
    /// In attempt `attempt`, node `standby` plays group rank `slot` instead of node `lost`.
    Promotion {
        #[serde(rename = "cycle")]
        attempt: u32,
        slot: u32,
        lost: u32,
        standby: u32,
    },
    /// The coordinator, hot spares: `ready` standbys could take a lost node's place as of
    /// attempt `attempt`'s verdict.
    Spares {
        #[serde(rename = "cycle")]
        attempt: u32,
        ready: u32,
    },
    /// The coordinator, hot spares: standby `node` is out of the job (it left on a signal, was
    /// lost, or was silent for the node timeout), for `reason`; `ready` standbys are left.
    StandbyGone {
        node: u32,
        reason: String,
        ready: u32,
    },
    /// Processes the ranks of attempt `attempt` left running outside their process groups, killed.
    LeftoversKilled {
        #[serde(rename = "cycle")]
        attempt: u32,
        count: usize,
    },
    /// A hung rank's stacks: where they were written and the innermost frames, innermost first.
    Stacks {
        #[serde(default)]
        #[serde(rename = "cycle")]
        attempt: u32,
        #[serde(default)]
        local_rank: u32,
        #[serde(default)]
        rank: u32,
        #[serde(default)]
        python_stacks: Option<PathBuf>,
        #[serde(default)]
        proc_stacks: Option<PathBuf>,
        #[serde(default)]
        innermost: Vec<String>,
    },
    /// Before attempt `attempt`: these GPUs still hold memory; the agent waits for them.
    GpuMemoryHeld {
        #[serde(rename = "cycle")]
        attempt: u32,
        gpus: Vec<u32>,
        holders: Vec<GpuHolder>,
    },
    /// How the wait for GPU memory before attempt `attempt` ended.
    GpuMemoryWait {
        #[serde(rename = "cycle")]
        attempt: u32,
        gpus: Vec<u32>,
        waited_ms: u64,
        released: bool,
        /// Who still held memory on a GPU over the tolerance when the wait ended.
        holders: Vec<GpuHolder>,
    },
    /// The checks before attempt `attempt`.
    HealthCheck {
        #[serde(rename = "cycle")]
        attempt: u32,
        healthy: bool,
        /// The names of the checks that failed.
        failed: Vec<String>,
        checks: Vec<HealthCheck>,
    },
    /// GPU telemetry is on (for `gpus` GPUs) or off (and `why`).
    GpuTelemetry {
        on: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gpus: Option<usize>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        why: Option<String>,
    },
    /// An XID error NVML reported for `gpu`.
    GpuXid {
        gpu: u32,
        xid: u64,
        critical: bool,
        text: String,
    },
    /// The highest and lowest step this node's ranks reported in attempt `attempt`.
    Steps {
        #[serde(default)]
        #[serde(rename = "cycle")]
        attempt: u32,
        step: u64,
        #[serde(default)]
        min_step: Option<u64>,
        /// The median step time (seconds) of the node's slowest rank, as the ranks measure it
        /// (`step_timing`, `step` sections, else the time between steps), when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        step_s: Option<f64>,
    },
    /// Node rank 0's straggler report (docs/stragglers.md): every scored rank, the stragglers,
    /// the threshold and how many ranks had no median yet.
    StragglerReport {
        #[serde(default)]
        ranks: Vec<RankScore>,
        #[serde(default)]
        stragglers: Vec<u32>,
        #[serde(default)]
        threshold: Option<f64>,
        #[serde(default)]
        unscored: Option<u64>,
        /// What each rank's GPU was doing, when the report knew.
        #[serde(
            default,
            skip_serializing_if = "BTreeMap::is_empty",
            deserialize_with = "by_rank"
        )]
        gpus: BTreeMap<u32, String>,
    },
    /// A rank closed a checkpoint section ([`is_checkpoint_section`]) after `duration_ms`: the
    /// line's `ts` is when it closed, so it ran from `ts - duration_ms` (docs/goodput.md).
    Section {
        #[serde(default)]
        #[serde(rename = "cycle")]
        attempt: u32,
        #[serde(default)]
        local_rank: u32,
        #[serde(default)]
        rank: u32,
        #[serde(default = "unknown")]
        name: String,
        #[serde(default)]
        duration_ms: u64,
        /// The rank's last recorded close in this attempt: it closed [`MAX_SECTION_RECORDS`]
        /// checkpoint sections, and later ones are not recorded.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        last_recorded: bool,
    },
    /// In-process restart (docs/inprocess.md): generation `generation` of attempt `attempt`
    /// began; `ranks` (global) are replaced by new processes and every other rank keeps its
    /// process. `step`: the highest step the node's ranks had reported.
    Generation {
        #[serde(default)]
        #[serde(rename = "cycle")]
        attempt: u32,
        #[serde(default)]
        generation: u64,
        #[serde(default)]
        ranks: Vec<u32>,
        #[serde(default)]
        step: Option<u64>,
    },
    /// Every rank of the node is back in its training function at `generation` (survivors
    /// returned to the wrapper, the replacements registered), `seconds` after the failure.
    GenerationRecovered {
        #[serde(default)]
        #[serde(rename = "cycle")]
        attempt: u32,
        #[serde(default)]
        generation: u64,
        #[serde(default)]
        seconds: f64,
    },
    /// Every rank of the node reported a step of generation `generation`, `seconds` after the
    /// failure: the job trains again (what `vigil goodput` counts as the generation's recovery).
    GenerationStepping {
        #[serde(default)]
        #[serde(rename = "cycle")]
        attempt: u32,
        #[serde(default)]
        generation: u64,
        #[serde(default)]
        seconds: f64,
    },
    /// In-process restarts were asked for but this failure restarts the whole job: `reason`.
    InProcessDeclined {
        #[serde(default)]
        #[serde(rename = "cycle")]
        attempt: u32,
        #[serde(default = "unknown")]
        reason: String,
    },
    /// Node rank 0's store turned away connections that never completed their handshake (a
    /// client without the job's secret: junk, a flood, a node of another job; docs/store.md,
    /// "Connections turned away"): `new` since the last such record, then the totals since the
    /// store started, by kind, and the last one's peer address and reason. At most one record per
    /// [`STORE_REFUSED_EVERY`].
    StoreRefused {
        #[serde(default)]
        new: u64,
        #[serde(default)]
        bad_bytes: u64,
        #[serde(default)]
        wrong_secret: u64,
        #[serde(default)]
        closed_in_handshake: u64,
        #[serde(default)]
        over_budget: u64,
        #[serde(default)]
        last_peer: Option<String>,
        #[serde(default)]
        last_reason: Option<String>,
    },
    /// The event log could not be written (its directory full, an I/O error): `records` records
    /// were lost, the first at `first_ts` and the last at `last_ts` (Unix seconds); `error`: the
    /// last write's error. Written as the first record once the log can be written again.
    EventsLost {
        #[serde(default)]
        records: u64,
        #[serde(default)]
        first_ts: f64,
        #[serde(default)]
        last_ts: f64,
        #[serde(default)]
        error: String,
    },
    /// An event this vigil does not know (written by a newer one): read, never written.
    #[serde(other)]
    Unknown,
}

impl Record {
    /// The `event` field.
    pub fn name(&self) -> String {
        match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(o)) => match o.get("event") {
                Some(serde_json::Value::String(s)) => s.clone(),
                _ => "unknown".into(),
            },
            _ => "unknown".into(),
        }
    }
}

/// A whole line as read back: the record and the fields the runtime stamps on every line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Line {
    /// Unix seconds.
    pub ts: f64,
    #[serde(default)]
    pub host: Option<String>,
    #[serde(default)]
    pub node_rank: Option<u32>,
    #[serde(flatten)]
    pub record: Record,
}

impl Line {
    /// One line of `events.jsonl`; `None` for a line without an `event` or a `ts`. A known
    /// event without the fields this vigil needs (a hand-written line, another vigil's) still
    /// counts for its time and node, as [`Record::Unknown`].
    pub fn parse(v: &serde_json::Value) -> Option<Line> {
        v.get("event")?.as_str()?;
        if let Ok(line) = Line::deserialize(v) {
            return Some(line);
        }
        let s = Stamp::deserialize(v).ok()?;
        Some(Line {
            ts: s.ts,
            host: s.host,
            node_rank: s.node_rank,
            record: Record::Unknown,
        })
    }
}

/// What the runtime adds to every line.
#[derive(Deserialize)]
struct Stamp {
    ts: f64,
    #[serde(default)]
    host: Option<String>,
    #[serde(default)]
    node_rank: Option<u32>,
}

/// A name the agent writes from a fixed set ([`TIMEOUTS_SOURCES`], [`WORKLOAD_ACTIONS`]). An
/// alias, so that serde does not take the field for one borrowed from the input.
pub type FixedName = &'static str;

/// What each rank's GPU was doing (`straggler_report`'s `gpus`).
pub type ByRank = BTreeMap<u32, String>;

/// A map keyed by rank: JSON keeps the keys as strings (`"3"`); one that is not a rank is left
/// out.
fn by_rank<'de, D: Deserializer<'de>>(d: D) -> Result<ByRank, D::Error> {
    let m = BTreeMap::<String, String>::deserialize(d)?;
    Ok(m.into_iter()
        .filter_map(|(k, v)| Some((k.parse().ok()?, v)))
        .collect())
}

/// What a missing name reads as.
fn unknown() -> String {
    "unknown".into()
}

/// The sources of `timeouts_updated`.
pub const TIMEOUTS_SOURCES: [&str; 3] = ["configured", "loaded", "calculated"];
/// The actions of `workload_control`.
pub const WORKLOAD_ACTIONS: [&str; 2] = ["exclude_this_node", "shutdown_workload"];

/// A name the agent writes from a fixed set, read back as that set's own string; one outside
/// it (a newer vigil's) reads as `unknown`.
fn one_of<'de, D: Deserializer<'de>>(d: D, set: &[&'static str]) -> Result<&'static str, D::Error> {
    let s = String::deserialize(d)?;
    Ok(set.iter().find(|n| **n == s).copied().unwrap_or("unknown"))
}

fn timeouts_source<'de, D: Deserializer<'de>>(d: D) -> Result<&'static str, D::Error> {
    one_of(d, &TIMEOUTS_SOURCES)
}

fn workload_action<'de, D: Deserializer<'de>>(d: D) -> Result<&'static str, D::Error> {
    one_of(d, &WORKLOAD_ACTIONS)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::{
        is_checkpoint_section, GpuHolder, Hang, HangKind, HealthCheck, JobEnd, Line, Outcome,
        RankScore, Record, StopReason, Timeouts,
    };
    use std::time::Duration;

    /// Each variant's place, by an exhaustive match: a new variant does not compile until it
    /// has a place here, and the round trip below fails until it has a sample.
    fn place(r: &Record) -> usize {
        match r {
            Record::AttemptStart { .. } => 0,
            Record::RankStarted { .. } => 1,
            Record::RankSpawnFailed { .. } => 2,
            Record::RankExited { .. } => 3,
            Record::Stop { .. } => 4,
            Record::Escalate { .. } => 5,
            Record::Registered { .. } => 6,
            Record::SectionNamesCapped { .. } => 7,
            Record::Hang { .. } => 8,
            Record::TrainingFinished { .. } => 9,
            Record::TimeoutsUpdated { .. } => 10,
            Record::Restart { .. } => 11,
            Record::Joined { .. } => 12,
            Record::AttemptEnded { .. } => 13,
            Record::Result { .. } => 14,
            Record::WorkloadControl { .. } => 15,
            Record::Standby { .. } => 16,
            Record::NodeFault { .. } => 17,
            Record::StopTriggered { .. } => 18,
            Record::StopAgreed { .. } => 19,
            Record::RankSignalled { .. } => 20,
            Record::StopOverdue { .. } => 21,
            Record::Containment { .. } => 22,
            Record::Nodes { .. } => 23,
            Record::Suspended { .. } => 24,
            Record::IpcRejected { .. } => 25,
            Record::Promotion { .. } => 26,
            Record::LeftoversKilled { .. } => 27,
            Record::Stacks { .. } => 28,
            Record::GpuMemoryHeld { .. } => 29,
            Record::GpuMemoryWait { .. } => 30,
            Record::HealthCheck { .. } => 31,
            Record::GpuTelemetry { .. } => 32,
            Record::GpuXid { .. } => 33,
            Record::Steps { .. } => 34,
            Record::StragglerReport { .. } => 35,
            Record::Section { .. } => 36,
            Record::Spares { .. } => 38,
            Record::StandbyGone { .. } => 39,
            Record::Generation { .. } => 40,
            Record::GenerationRecovered { .. } => 41,
            Record::InProcessDeclined { .. } => 42,
            Record::StoreRefused { .. } => 43,
            Record::EventsLost { .. } => 44,
            Record::GenerationStepping { .. } => 45,
            Record::RankRaised { .. } => 46,
            Record::Unknown => 37,
        }
    }

    fn timeouts() -> Timeouts {
        Timeouts {
            initial: Some(Duration::from_secs(60)),
            heartbeat: Some(Duration::from_millis(2500)),
            sections: [("step".to_string(), Duration::from_secs(30))].into(),
            out_of_section: None,
            warmup: Some(Duration::from_secs(900)),
        }
    }

    fn holder() -> GpuHolder {
        GpuHolder {
            gpu: 1,
            pid: 77,
            name: "python".into(),
            mib: 2048,
        }
    }

    fn samples() -> Vec<Record> {
        let hang = |timeout| Hang {
            timeout,
            limit_ms: 1000,
            silent_ms: 1001,
            stopped: false,
            raised: None,
        };
        vec![
            Record::AttemptStart {
                attempt: 1,
                restart_count: 1,
                nproc: 8,
                rank_offset: 8,
                world_size: 16,
                restarts_left: 2,
            },
            Record::RankStarted {
                attempt: 0,
                local_rank: 1,
                rank: 9,
                pid: 4242,
            },
            Record::RankSpawnFailed {
                attempt: 0,
                local_rank: 0,
                error: "No such file".into(),
            },
            Record::RankExited {
                attempt: 0,
                local_rank: 1,
                rank: 1,
                pid: 9,
                exit_code: None,
                signal: Some(9),
                expected: false,
            },
            Record::Stop {
                attempt: 0,
                reason: StopReason::RankFailed,
                signal: 15,
                grace_ms: 15000,
                pids: vec![8, 9],
                killed: vec![9],
                trigger: Some("time-limit".into()),
            },
            Record::Escalate {
                attempt: 0,
                signal: 9,
                pids: vec![8],
            },
            Record::Registered {
                attempt: 2,
                local_rank: 0,
                rank: 4,
            },
            Record::SectionNamesCapped {
                attempt: 0,
                local_rank: 0,
                rank: 0,
                kept: 64,
            },
            Record::Hang {
                attempt: 0,
                local_rank: 0,
                rank: 0,
                pid: 5,
                hang: hang(HangKind::Section("checkpointing".into())),
            },
            Record::Hang {
                attempt: 0,
                local_rank: 0,
                rank: 0,
                pid: 5,
                hang: hang(HangKind::OutOfSection),
            },
            Record::TrainingFinished {
                attempt: 0,
                local_rank: 0,
                rank: 0,
            },
            Record::TimeoutsUpdated {
                source: "calculated",
                timeouts: timeouts(),
            },
            Record::Restart {
                from_attempt: 0,
                to_attempt: 1,
                restarts_left: 2,
                ran_ms: 2282,
                backoff_ms: 500,
            },
            Record::Joined {
                attempt: 0,
                rank_offset: 8,
            },
            Record::AttemptEnded {
                attempt: 0,
                end: JobEnd::Done,
                requeue: None,
            },
            Record::AttemptEnded {
                attempt: 1,
                end: JobEnd::Stopped {
                    node: 1,
                    reason: "SIGTERM".into(),
                    exit_code: 143,
                },
                requeue: None,
            },
            Record::AttemptEnded {
                attempt: 1,
                end: JobEnd::Lost {
                    reason: "gone".into(),
                    node: None,
                },
                requeue: Some(false),
            },
            Record::Result {
                outcome: Outcome::NoProgress {
                    attempts: 3,
                    step: Some(7),
                },
                exit_code: 1,
            },
            Record::Result {
                outcome: Outcome::Succeeded,
                exit_code: 0,
            },
            Record::WorkloadControl {
                attempt: 0,
                rank: 3,
                action: "exclude_this_node",
                description: "bad GPU".into(),
            },
            Record::Standby { attempt: 0 },
            Record::NodeFault {
                attempt: 0,
                reason: "GPU 0: critical XID 79".into(),
            },
            Record::StopTriggered {
                attempt: 0,
                node: 1,
                trigger: "SIGUSR1".into(),
                window_ms: 60000,
            },
            Record::StopAgreed {
                attempt: 0,
                step: Some(42),
                trigger: "time-limit".into(),
            },
            Record::RankSignalled {
                attempt: 0,
                local_rank: 0,
                rank: 0,
                signal: 10,
            },
            Record::RankRaised {
                attempt: 0,
                local_rank: 1,
                rank: 3,
                pid: 4242,
                error: "RuntimeError: Parent directory /ckpt does not exist.".into(),
            },
            Record::StopOverdue {
                attempt: 0,
                ranks: vec![1],
                window_ms: 30000,
            },
            Record::Containment {
                cgroup: Some("/sys/fs/cgroup/job/vigil".into()),
            },
            Record::Nodes {
                nnodes: Some(2),
                store: Some("n0:29500".into()),
                run_id: Some("r1".into()),
                command: Some(vec!["vigil".into(), "run".into(), "train.py".into()]),
            },
            Record::Suspended { seconds: 12.5 },
            Record::IpcRejected {
                peer_pid: None,
                reason: "not a rank".into(),
            },
            Record::Promotion {
                attempt: 1,
                slot: 0,
                lost: 0,
                standby: 2,
            },
            Record::Spares {
                attempt: 1,
                ready: 1,
            },
            Record::StandbyGone {
                node: 3,
                reason: "standby node 3 left the job".into(),
                ready: 0,
            },
            Record::LeftoversKilled {
                attempt: 0,
                count: 3,
            },
            Record::Stacks {
                attempt: 0,
                local_rank: 0,
                rank: 0,
                python_stacks: Some("/tmp/s.py.txt".into()),
                proc_stacks: None,
                innermost: vec!["File \"t.py\", line 4 in f".into()],
            },
            Record::GpuMemoryHeld {
                attempt: 1,
                gpus: vec![1],
                holders: vec![holder()],
            },
            Record::GpuMemoryWait {
                attempt: 1,
                gpus: vec![0, 1],
                waited_ms: 1200,
                released: false,
                holders: vec![holder()],
            },
            Record::HealthCheck {
                attempt: 0,
                healthy: false,
                failed: vec!["gpus".into()],
                checks: vec![HealthCheck {
                    name: "gpus".into(),
                    status: "fail".into(),
                    detail: "0 of 8".into(),
                }],
            },
            Record::GpuTelemetry {
                on: true,
                gpus: Some(8),
                why: None,
            },
            Record::GpuTelemetry {
                on: false,
                gpus: None,
                why: Some("no NVML".into()),
            },
            Record::GpuXid {
                gpu: 0,
                xid: 79,
                critical: true,
                text: "fell off the bus".into(),
            },
            Record::Steps {
                attempt: 1,
                step: 7,
                min_step: Some(5),
                step_s: None,
            },
            Record::StragglerReport {
                ranks: vec![RankScore {
                    rank: 3,
                    node_rank: Some(1),
                    host: Some("n1".into()),
                    relative: Some(0.25),
                    individual: Some(1.0),
                    median_s: Some(0.5),
                }],
                stragglers: vec![3],
                threshold: Some(0.7),
                unscored: Some(0),
                gpus: [(3, "SM clock 300 MHz".to_string())].into(),
            },
            Record::Section {
                attempt: 2,
                local_rank: 1,
                rank: 5,
                name: "checkpointing".into(),
                duration_ms: 2500,
                last_recorded: false,
            },
            Record::Generation {
                attempt: 0,
                generation: 1,
                ranks: vec![2],
                step: Some(30),
            },
            Record::GenerationRecovered {
                attempt: 0,
                generation: 1,
                seconds: 1.5,
            },
            Record::InProcessDeclined {
                attempt: 0,
                reason: "rank 1 is not restartable".into(),
            },
            Record::StoreRefused {
                new: 301,
                bad_bytes: 1,
                wrong_secret: 0,
                closed_in_handshake: 256,
                over_budget: 44,
                last_peer: Some("10.0.0.7:51234".into()),
                last_reason: Some("VALIDATE with a wrong magic number".into()),
            },
            Record::EventsLost {
                records: 12,
                first_ts: 1796162011.1,
                last_ts: 1796162030.9,
                error: "No space left on device (os error 28)".into(),
            },
            Record::GenerationStepping {
                attempt: 0,
                generation: 1,
                seconds: 1.75,
            },
            Record::Unknown,
        ]
    }

    #[test]
    fn a_store_refused_line_reads_back_with_its_counts_and_defaults() {
        let v = serde_json::json!({"event": "store_refused", "ts": 5.0, "host": "n1",
            "node_rank": 0, "new": 3, "bad_bytes": 1, "closed_in_handshake": 2,
            "last_peer": "10.0.0.7:5"});
        let line = Line::parse(&v).unwrap();
        assert_eq!(line.node_rank, Some(0));
        assert_eq!(
            line.record,
            Record::StoreRefused {
                new: 3,
                bad_bytes: 1,
                wrong_secret: 0,
                closed_in_handshake: 2,
                over_budget: 0,
                last_peer: Some("10.0.0.7:5".into()),
                last_reason: None,
            }
        );
        assert_eq!(line.record.name(), "store_refused");
    }

    #[test]
    fn an_events_lost_line_reads_back_with_its_count_and_times() {
        let v = serde_json::json!({"event": "events_lost", "ts": 9.5, "host": "n1",
            "node_rank": 0, "records": 4, "first_ts": 2.0, "last_ts": 8.0,
            "error": "No space left on device (os error 28)"});
        let line = Line::parse(&v).unwrap();
        assert_eq!(
            line.record,
            Record::EventsLost {
                records: 4,
                first_ts: 2.0,
                last_ts: 8.0,
                error: "No space left on device (os error 28)".into(),
            }
        );
        assert_eq!(line.record.name(), "events_lost");
    }

    #[test]
    fn every_record_round_trips() {
        let all = samples();
        let places: BTreeSet<usize> = all.iter().map(place).collect();
        assert_eq!(places, (0..=46).collect(), "a record without a sample");
        for r in all {
            let text = serde_json::to_string(&r).unwrap();
            let back: Record =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(back, r, "{text}");
            assert_eq!(
                serde_json::to_value(&r).unwrap()["event"],
                r.name().as_str()
            );
        }
    }

    #[test]
    fn lines_are_written_as_before() {
        let v = serde_json::to_value(Record::Stop {
            attempt: 0,
            reason: StopReason::RankFailed,
            signal: 15,
            grace_ms: 15000,
            pids: vec![8],
            killed: vec![],
            trigger: None,
        })
        .unwrap();
        assert_eq!(
            v.to_string(),
            r#"{"cycle":0,"event":"stop","grace_ms":15000,"pids":[8],"reason":"rank_failed","signal":15}"#
        );
        let v = serde_json::to_value(Record::AttemptEnded {
            attempt: 0,
            end: JobEnd::Failed {
                node: 0,
                reason: "rank 1 exited with code 1".into(),
            },
            requeue: None,
        })
        .unwrap();
        assert_eq!(
            v.to_string(),
            r#"{"cycle":0,"end":"failed","event":"cycle_ended","node":0,"reason":"rank 1 exited with code 1"}"#
        );
    }

    /// The lines that were `json!` objects before they were records read as they did.
    #[test]
    fn former_json_lines_are_written_as_before() {
        let line = |r: Record| serde_json::to_value(r).unwrap().to_string();
        assert_eq!(
            line(Record::GpuTelemetry {
                on: true,
                gpus: Some(8),
                why: None
            }),
            r#"{"event":"gpu_telemetry","gpus":8,"on":true}"#
        );
        assert_eq!(
            line(Record::GpuTelemetry {
                on: false,
                gpus: None,
                why: Some("no NVML".into())
            }),
            r#"{"event":"gpu_telemetry","on":false,"why":"no NVML"}"#
        );
        assert_eq!(
            line(Record::Steps {
                attempt: 1,
                step: 7,
                min_step: Some(5),
                step_s: None,
            }),
            r#"{"cycle":1,"event":"steps","min_step":5,"step":7}"#
        );
        assert_eq!(
            line(Record::Containment { cgroup: None }),
            r#"{"cgroup":null,"event":"containment"}"#
        );
        assert_eq!(
            line(Record::Nodes {
                nnodes: Some(1),
                store: Some("127.0.0.1:1".into()),
                run_id: Some("r1".into()),
                command: None,
            }),
            r#"{"event":"nodes","nnodes":1,"run_id":"r1","store":"127.0.0.1:1"}"#
        );
    }

    #[test]
    fn a_section_line_says_when_the_save_began_through_its_duration() {
        let line = |r: Record| serde_json::to_value(r).unwrap().to_string();
        let rec = |last_recorded| Record::Section {
            attempt: 0,
            local_rank: 1,
            rank: 3,
            name: "checkpointing".into(),
            duration_ms: 1500,
            last_recorded,
        };
        assert_eq!(
            line(rec(false)),
            r#"{"cycle":0,"duration_ms":1500,"event":"section","local_rank":1,"name":"checkpointing","rank":3}"#
        );
        assert!(line(rec(true)).contains(r#""last_recorded":true"#));
        let back = Line::parse(
            &serde_json::from_str(r#"{"event":"section","ts":9.5,"rank":3,"duration_ms":1500}"#)
                .unwrap(),
        )
        .unwrap();
        assert!(matches!(
            back.record,
            Record::Section { rank: 3, duration_ms: 1500, ref name, last_recorded: false, .. } if name == "unknown"
        ));
        assert!(is_checkpoint_section("checkpointing"));
        assert!(is_checkpoint_section("async_checkpoint_save"));
        assert!(!is_checkpoint_section("step"));
    }

    #[test]
    fn a_hang_is_worded_with_its_timeout_and_limit() {
        let h = Hang {
            timeout: HangKind::Section("step".into()),
            limit_ms: 1000,
            silent_ms: 1500,
            stopped: false,
            raised: None,
        };
        assert_eq!(
            h.passed(),
            "in section \"step\" for 1.5s, past its section \"step\" timeout of 1.0s"
        );
        assert_eq!(
            h.reason(3),
            "rank 3 hung: in section \"step\" for 1.5s, past its section \"step\" timeout of 1.0s"
        );
        // Field finding 45: a stopped rank is declared before its own timeout ran out, and
        // out-of-section time is not silence.
        let h = Hang {
            timeout: HangKind::OutOfSection,
            limit_ms: 30_000,
            silent_ms: 1000,
            stopped: true,
            raised: None,
        };
        assert_eq!(
            h.reason(1),
            "rank 1 hung: its process is stopped (SIGSTOP or a debugger); out of any section for 1.0s (its out-of-section timeout of 30.0s had not run out)"
        );
        let h = Hang {
            timeout: HangKind::Heartbeat,
            limit_ms: 3000,
            silent_ms: 2000,
            stopped: true,
            raised: None,
        };
        assert!(!h.passed().contains("passed"), "{}", h.passed());
        assert!(h
            .passed()
            .starts_with("no heartbeat for 2.0s (its heartbeat timeout of 3.0s had not run out)"));
    }

    #[test]
    fn a_rank_that_raised_and_did_not_exit_is_named_for_its_exception() {
        let h = Hang {
            timeout: HangKind::Heartbeat,
            limit_ms: 120_000,
            silent_ms: 6_000,
            stopped: false,
            raised: Some("RuntimeError: Parent directory /ckpt does not exist.".into()),
        };
        assert_eq!(
            h.reason(3),
            "rank 3 hung: it raised RuntimeError: Parent directory /ckpt does not exist. and has not exited while the others wait for it; no heartbeat for 6.0s (its heartbeat timeout of 120.0s had not run out)"
        );
        let back: Hang = serde_json::from_str(&serde_json::to_string(&h).unwrap()).unwrap();
        assert_eq!(back, h);
        let old: Hang =
            serde_json::from_str(r#"{"timeout":"heartbeat","limit_ms":1,"silent_ms":1}"#).unwrap();
        assert_eq!(old.raised, None);
    }

    #[test]
    fn old_and_newer_lines_still_read() {
        let parse = |s: &str| Line::parse(&serde_json::from_str(s).unwrap());
        // A newer vigil's event, and a known one with a field this vigil does not know.
        let l = parse(r#"{"cycle":1,"event":"some_future_event","host":"vm","node_rank":0,"ts":103.3,"new":{"x":1}}"#).unwrap();
        assert_eq!(l.record, Record::Unknown);
        let l = parse(r#"{"cycle":1,"event":"cycle_start","nproc":2,"restart_count":1,"ts":1.0,"later":true}"#).unwrap();
        assert_eq!(
            l.record,
            Record::AttemptStart {
                attempt: 1,
                restart_count: 1,
                nproc: 2,
                rank_offset: 0,
                world_size: 0,
                restarts_left: 0,
            }
        );
        // Fields older vigils did not write: `killed`, `stopped`, `ran_ms`, `backoff_ms`.
        let l = parse(r#"{"cycle":0,"event":"stop","grace_ms":15000,"host":"vm","node_rank":0,"pids":[8],"reason":"rank_failed","signal":15,"ts":102.4}"#).unwrap();
        assert!(matches!(l.record, Record::Stop { ref killed, .. } if killed.is_empty()));
        let l = parse(
            r#"{"event":"hang","ts":1,"cycle":0,"rank":2,"timeout":{"section":"checkpointing"}}"#,
        )
        .unwrap();
        let Record::Hang { rank, hang, .. } = l.record else {
            panic!()
        };
        assert_eq!(
            (rank, hang.timeout, hang.stopped),
            (2, HangKind::Section("checkpointing".into()), false)
        );
        let l =
            parse(r#"{"event":"restart","from_cycle":0,"to_cycle":1,"restarts_left":0,"ts":5}"#)
                .unwrap();
        assert!(matches!(
            l.record,
            Record::Restart {
                backoff_ms: 0,
                ran_ms: 0,
                ..
            }
        ));
        // A source this vigil does not know reads as `unknown`.
        let l = parse(r#"{"event":"timeouts_updated","source":"guessed","timeouts":{},"ts":1}"#)
            .unwrap();
        assert!(matches!(
            l.record,
            Record::TimeoutsUpdated {
                source: "unknown",
                ..
            }
        ));
        // A known event without the fields it needs still has a time and a node.
        let l = parse(r#"{"event":"registered","cycle":0,"host":"n1","node_rank":1,"ts":50.5}"#)
            .unwrap();
        assert_eq!(
            (l.ts, l.node_rank, l.record),
            (50.5, Some(1), Record::Unknown)
        );
        // No `ts` or no `event`: not a line of the log.
        assert!(parse(r#"{"event":"cycle_start","cycle":0}"#).is_none());
        assert!(parse(r#"{"ts":1.0,"cycle":0}"#).is_none());
    }
}
