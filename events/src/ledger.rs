//! The job's ledger, `ledger.jsonl`: one JSON line per allocation, appended by node rank 0 as
//! the last thing it does, read back by the requeue policy, `vigil ledger` and `vigil report`.
//!
//! Every line has a `format`; a reader skips lines of a format it does not know. Fields added
//! since format 1 began are optional, so older lines still read.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// Bumped when a record's meaning changes; records of another format are skipped.
pub const FORMAT: u32 = 1;
pub const FILE: &str = "ledger.jsonl";

/// How an allocation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The ranks called `mark_finished`, or all exited 0 with no stop asked.
    Finished,
    /// Stopped for the time limit or a signal (preemption), at the agreed step.
    Stopped,
    /// A rank failed (or hung) and the in-job restarts were spent.
    Failed,
    /// A node was lost.
    Lost,
    /// The in-job attempts stopped making progress.
    NoProgress,
}

impl Outcome {
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Finished => "finished",
            Outcome::Stopped => "stopped",
            Outcome::Failed => "failed",
            Outcome::Lost => "lost",
            Outcome::NoProgress => "no_progress",
        }
    }

    /// Counts towards `--max-requeues` (consecutive failed allocations).
    pub fn is_failure(self) -> bool {
        matches!(self, Outcome::Failed | Outcome::Lost | Outcome::NoProgress)
    }
}

/// What node rank 0 decided after the allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionKind {
    Finished,
    Requeue,
    Stop,
}

impl std::fmt::Display for DecisionKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl DecisionKind {
    pub fn name(self) -> &'static str {
        match self {
            DecisionKind::Finished => "finished",
            DecisionKind::Requeue => "requeue",
            DecisionKind::Stop => "stop",
        }
    }
}

/// One allocation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub format: u32,
    /// 1-based.
    pub allocation: u32,
    #[serde(default)]
    pub job_id: Option<String>,
    /// `SLURM_CLUSTER_NAME`, for a Slurm job id (ids start again at 1 with a new controller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// `SLURM_RESTART_COUNT`, or 0.
    #[serde(default)]
    pub restart_count: u32,
    #[serde(default)]
    pub nodes: Vec<String>,
    /// Unix seconds.
    pub start: f64,
    pub end: f64,
    pub outcome: Outcome,
    #[serde(default)]
    pub highest_step: Option<u64>,
    /// In-job restarts used.
    #[serde(default)]
    pub restarts: u32,
    #[serde(default)]
    pub stop_step: Option<u64>,
    /// `SIGTERM`, `SIGUSR1`, `end-time`, `time-limit`, ...
    #[serde(default)]
    pub stop_trigger: Option<String>,
    pub decision: DecisionKind,
    #[serde(default)]
    pub why: String,
    #[serde(default)]
    pub excluded: Vec<String>,
    #[serde(default)]
    pub stop_lead_s: f64,
    #[serde(default)]
    pub exit_status: i32,
    /// Standbys that took lost or unfit nodes' places during the allocation (hot spares).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub promotions: Vec<Promotion>,
    /// Slurm's `SubmitTime` (Unix seconds), as `scontrol show job` gave it at the allocation's
    /// end: the queue wait before the first allocation begins there (docs/goodput.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submit_time: Option<f64>,
    /// Slurm's `StartTime` of this allocation (Unix seconds): the queue wait ends there; from it
    /// to `start` (the batch script, srun, a container) is start-up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_start: Option<f64>,
}

/// One promotion: in attempt `attempt`, node `standby` played group rank `slot` instead of `lost`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Promotion {
    #[serde(rename = "cycle")]
    pub attempt: u32,
    pub slot: u32,
    pub lost: u32,
    pub standby: u32,
}

/// The records of a ledger file's text (`path` names it in the notes), and notes on what was
/// skipped: a last line cut short by a crash, a line that is not JSON, a record of another
/// format or one without the fields a record needs. However many lines are skipped, the notes
/// are at most two lines: the cut-short last line, and the others as one note with their count
/// (by kind) and the first one's number and reason (a corrupt ledger of 10,000 lines is one
/// line at every `vigil run`, not 10,000).
pub fn decode(text: &str, path: &Path) -> (Vec<Record>, Vec<String>) {
    let mut records = Vec::new();
    let mut notes = Vec::new();
    let mut skipped = Skipped::default();
    let lines: Vec<&str> = text.split('\n').collect();
    let unterminated = !text.is_empty() && !text.ends_with('\n');
    for (i, line) in lines.iter().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let n = i + 1;
        let last = i + 1 == lines.len();
        let v: serde_json::Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(_) if last && unterminated => {
                notes.push(format!(
                    "{}: line {n} is cut short (a crash while it was written); ignored",
                    path.display()
                ));
                continue;
            }
            Err(e) => {
                skipped.add(n, "not JSON", format!("is not JSON ({e})"));
                continue;
            }
        };
        match v.get("format").and_then(|f| f.as_u64()) {
            Some(f) if f == u64::from(FORMAT) => {}
            other => {
                let what = other.map_or("no format".to_string(), |f| format!("format {f}"));
                skipped.add(
                    n,
                    "of another format",
                    format!("has {what}; this vigil reads format {FORMAT}"),
                );
                continue;
            }
        }
        match serde_json::from_value::<Record>(v) {
            Ok(r) => records.push(r),
            Err(e) => skipped.add(n, "not a record", format!("is not a ledger record ({e})")),
        }
    }
    notes.splice(0..0, skipped.note(path));
    (records, notes)
}

/// The lines [`decode`] skipped: how many of each kind, and the first one.
#[derive(Default)]
struct Skipped {
    kinds: Vec<(&'static str, usize)>,
    first: Option<(usize, String)>,
    count: usize,
}

impl Skipped {
    fn add(&mut self, line: usize, kind: &'static str, why: String) {
        self.count += 1;
        match self.kinds.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, n)) => *n += 1,
            None => self.kinds.push((kind, 1)),
        }
        self.first.get_or_insert((line, why));
    }

    fn note(self, path: &Path) -> Option<String> {
        let (line, why) = self.first?;
        if self.count == 1 {
            return Some(format!("{}: line {line} {why}; skipped", path.display()));
        }
        let kinds: Vec<String> = self.kinds.iter().map(|(k, n)| format!("{n} {k}")).collect();
        Some(format!(
            "{}: {} lines skipped ({}); the first, line {line}, {why}",
            path.display(),
            self.count,
            kinds.join(", ")
        ))
    }
}

impl Record {
    /// One line already parsed as JSON: `None` when it is of another format or lacks what a
    /// record needs.
    pub fn from_value(v: &serde_json::Value) -> Option<Record> {
        if v.get("format").and_then(serde_json::Value::as_u64) != Some(u64::from(FORMAT)) {
            return None;
        }
        Record::deserialize(v).ok()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::{decode, DecisionKind, Outcome, Promotion, Record, FORMAT};

    fn rec() -> Record {
        Record {
            format: FORMAT,
            allocation: 2,
            job_id: Some("42".into()),
            cluster: Some("c1".into()),
            restart_count: 1,
            nodes: vec!["a".into(), "b".into()],
            start: 100.0,
            end: 150.5,
            outcome: Outcome::NoProgress,
            highest_step: Some(10),
            restarts: 3,
            stop_step: None,
            stop_trigger: Some("SIGTERM".into()),
            decision: DecisionKind::Requeue,
            why: "SIGTERM, reached step 10".into(),
            excluded: vec!["b".into()],
            stop_lead_s: 120.0,
            exit_status: 75,
            promotions: vec![Promotion {
                attempt: 1,
                slot: 0,
                lost: 0,
                standby: 2,
            }],
            submit_time: Some(40.0),
            slurm_start: Some(98.5),
        }
    }

    #[test]
    fn a_record_round_trips() {
        for r in [
            rec(),
            Record {
                cluster: None,
                promotions: vec![],
                submit_time: None,
                slurm_start: None,
                ..rec()
            },
        ] {
            let text = serde_json::to_string(&r).unwrap();
            assert_eq!(serde_json::from_str::<Record>(&text).unwrap(), r);
            assert_eq!(
                Record::from_value(&serde_json::from_str(&text).unwrap()),
                Some(r)
            );
        }
    }

    #[test]
    fn old_lines_read_and_other_formats_are_skipped() {
        let old = r#"{"format":1,"allocation":1,"job_id":"42","nodes":["a","b"],"start":100.0,"end":150.0,"outcome":"stopped","highest_step":10,"restarts":0,"stop_step":10,"stop_trigger":"SIGTERM","decision":"requeue","why":"SIGTERM, reached step 10","excluded":[],"exit_status":75}"#;
        let newer = r#"{"format":2,"allocation":2}"#;
        let (records, notes) = decode(&format!("{old}\n{newer}\n"), Path::new("l"));
        assert_eq!(records.len(), 1);
        assert_eq!(
            (records[0].cluster.as_deref(), records[0].restart_count),
            (None, 0)
        );
        assert_eq!(
            (records[0].submit_time, records[0].slurm_start),
            (None, None)
        );
        assert!(notes[0].contains("format 2"), "{notes:?}");
        assert_eq!(
            Record::from_value(&serde_json::from_str(newer).unwrap()),
            None
        );
    }
}
