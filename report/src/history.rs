//! A job's history built from its records: pure functions over the schema crate's records
//! (`vigil_events`), read from parsed JSON lines.
//!
//! Reading is lenient: unknown event kinds and fields are ignored and fields older vigils did
//! not write take their defaults (the schema's rules), so records of older and newer vigils
//! both load.
//!
//! This file builds the history (each node run from its event log, the allocations from the
//! ledgers or inferred from the runs); `history/moments.rs` tells it as a timeline.

use std::path::PathBuf;

use serde_json::Value;

use vigil_events::ledger;
use vigil_events::log::{HangKind, Line, Outcome, Record};

use crate::records::RecordFile;

mod moments;

pub use crate::model::*;

/// One node's run from its event log's records (in file order).
pub fn node_run<'a>(source: PathBuf, records: impl IntoIterator<Item = &'a Value>) -> NodeRun {
    let mut b = RunBuilder::new(source);
    for r in records {
        b.push(r);
    }
    b.finish()
}

/// Builds a [`NodeRun`] one record at a time, so an event log is read as a stream.
pub struct RunBuilder {
    run: NodeRun,
    first: bool,
}

impl RunBuilder {
    pub fn new(source: PathBuf) -> RunBuilder {
        RunBuilder {
            run: NodeRun {
                source,
                ..NodeRun::default()
            },
            first: true,
        }
    }

    /// One line of the event log as parsed JSON; a line without an `event` or a `ts` is skipped.
    pub fn push(&mut self, r: &Value) {
        if let Some(line) = Line::parse(r) {
            self.push_line(&line);
        }
    }

    /// The run's span, host and node rank, from any line.
    fn note_time_and_place(&mut self, line: &Line) {
        let run = &mut self.run;
        let ts = line.ts;
        if self.first {
            run.start = ts;
            self.first = false;
        }
        run.start = run.start.min(ts);
        run.end = run.end.max(ts);
        if run.host.is_empty() {
            if let Some(h) = &line.host {
                run.host = h.clone();
            }
        }
        if let Some(n) = line.node_rank {
            run.node_rank = n;
        }
    }

    /// One parsed line of the event log.
    pub fn push_line(&mut self, line: &Line) {
        self.note_time_and_place(line);
        let run = &mut self.run;
        let ts = line.ts;
        match &line.record {
            Record::Nodes { .. }
            | Record::AttemptStart { .. }
            | Record::AttemptEnded { .. }
            | Record::RankExited { .. } => attempt_record(run, ts, &line.record),
            Record::RankSpawnFailed { .. } => run.failures.extend(failure(ts, &line.record)),
            Record::Hang { .. } | Record::Stacks { .. } => hang_record(run, ts, &line.record),
            Record::Restart {
                from_attempt,
                to_attempt,
                restarts_left,
                backoff_ms,
                ..
            } => run.restarts.push(Restart {
                ts,
                from_attempt: *from_attempt,
                to_attempt: *to_attempt,
                restarts_left: Some(*restarts_left),
                backoff_ms: Some(*backoff_ms),
            }),
            Record::StopTriggered { .. }
            | Record::StopAgreed { .. }
            | Record::StopOverdue { .. } => run.stops.extend(stop(ts, &line.record)),
            Record::Steps {
                attempt,
                step,
                min_step,
                step_s,
            } => run.steps.push(StepPoint {
                ts,
                attempt: *attempt,
                step: *step,
                min_step: *min_step,
                step_s: *step_s,
            }),
            Record::Section {
                attempt,
                rank,
                duration_ms,
                last_recorded,
                ..
            } => run.saves.push(Save {
                ts,
                attempt: *attempt,
                rank: *rank,
                seconds: *duration_ms as f64 / 1000.0,
                last_recorded: *last_recorded,
            }),
            Record::StragglerReport { .. } => run
                .straggler_reports
                .extend(straggler_report(ts, &line.record)),
            Record::Generation { .. }
            | Record::GenerationRecovered { .. }
            | Record::GenerationStepping { .. }
            | Record::InProcessDeclined { .. } => {
                run.generations.extend(in_process(ts, &line.record));
                run.gen_marks.extend(generation_mark(ts, &line.record));
            }
            Record::NodeFault { attempt, reason } => run.node_faults.push(NodeFault {
                ts,
                attempt: *attempt,
                reason: reason.clone(),
            }),
            // One moment per change: every attempt's verdict says it.
            Record::Spares { ready, .. } if run.spares.last().map(|s| s.ready) != Some(*ready) => {
                run.spares.push(SparesChange {
                    ts,
                    ready: *ready,
                    gone: None,
                })
            }
            Record::StandbyGone {
                node,
                reason,
                ready,
            } => run.spares.push(SparesChange {
                ts,
                ready: *ready,
                gone: Some((*node, reason.clone())),
            }),
            Record::EventsLost { .. } => run.events_lost.extend(events_lost(&line.record)),
            Record::Result { outcome, exit_code } => {
                run.result = Some(run_result(ts, outcome, *exit_code))
            }
            _ => {}
        }
    }

    pub fn finish(mut self) -> NodeRun {
        // An attempt the log ends inside runs to the log's last record.
        let end = self.run.end;
        for a in self
            .run
            .attempts
            .iter_mut()
            .filter(|a| a.end_kind.is_none())
        {
            a.end = end;
        }
        self.run
    }
}

/// Records lost while the event log could not be written.
fn events_lost(r: &Record) -> Option<EventsLost> {
    match r {
        Record::EventsLost {
            records,
            first_ts,
            last_ts,
            error,
        } => Some(EventsLost {
            first_ts: *first_ts,
            last_ts: *last_ts,
            records: *records,
            error: error.clone(),
        }),
        _ => None,
    }
}

/// A rank's failure: it exited non-zero on its own, or could not be started.
fn failure(ts: f64, r: &Record) -> Option<Failure> {
    match r {
        Record::RankExited {
            attempt,
            local_rank,
            rank,
            exit_code,
            signal,
            expected: false,
            ..
        } => Some(Failure {
            ts,
            attempt: *attempt,
            rank: Some(*rank),
            local_rank: Some(*local_rank),
            exit_code: *exit_code,
            signal: *signal,
            error: None,
        }),
        Record::RankSpawnFailed {
            attempt,
            local_rank,
            error,
        } => Some(Failure {
            ts,
            attempt: *attempt,
            rank: None,
            local_rank: Some(*local_rank),
            error: Some(error.clone()),
            ..Failure::default()
        }),
        _ => None,
    }
}

/// A stop asked, agreed or overdue.
fn stop(ts: f64, r: &Record) -> Option<Stop> {
    let window_s = match r {
        Record::StopTriggered { window_ms, .. } | Record::StopOverdue { window_ms, .. } => {
            Some(*window_ms as f64 / 1000.0)
        }
        _ => None,
    };
    let (attempt, kind) = match r {
        Record::StopTriggered {
            attempt, trigger, ..
        } => (
            attempt,
            StopKind::Triggered {
                trigger: trigger.clone(),
            },
        ),
        Record::StopAgreed {
            attempt,
            step,
            trigger,
        } => (
            attempt,
            StopKind::Agreed {
                step: *step,
                trigger: Some(trigger.clone()),
            },
        ),
        Record::StopOverdue { attempt, ranks, .. } => (
            attempt,
            StopKind::Overdue {
                ranks: ranks.clone(),
            },
        ),
        _ => return None,
    };
    Some(Stop {
        ts,
        attempt: *attempt,
        kind,
        window_s,
    })
}

/// The records that shape the run's attempts: the job's command, each attempt's start and end,
/// and the last rank exit of each (a rank's failure is kept too).
fn attempt_record(run: &mut NodeRun, ts: f64, record: &Record) {
    match record {
        Record::Nodes {
            nnodes,
            run_id,
            command,
            ..
        } => {
            run.run_id = run_id.clone();
            run.command = command.clone();
            run.nnodes = *nnodes;
        }
        Record::AttemptStart { attempt, nproc, .. } => run.attempts.push(Attempt {
            attempt: *attempt,
            start: ts,
            end: ts,
            end_kind: None,
            reason: None,
            nproc: Some(*nproc),
            ranks_gone: None,
        }),
        Record::AttemptEnded { attempt, end, .. } => {
            if let Some(a) = run
                .attempts
                .iter_mut()
                .rev()
                .find(|a| a.attempt == *attempt)
            {
                a.end = ts;
                a.end_kind = Some(end.name().to_string());
                a.reason = end.reason().map(str::to_string);
            }
        }
        Record::RankExited { attempt, .. } => {
            if let Some(a) = run
                .attempts
                .iter_mut()
                .rev()
                .find(|a| a.attempt == *attempt)
            {
                a.ranks_gone = Some(a.ranks_gone.map_or(ts, |g| g.max(ts)));
            }
            run.failures.extend(failure(ts, record))
        }
        _ => {}
    }
}

/// A hang, and the stacks captured from the hung rank, which name where it hung.
fn hang_record(run: &mut NodeRun, ts: f64, record: &Record) {
    match record {
        Record::Hang {
            attempt,
            rank,
            local_rank,
            hang,
            ..
        } => run.hangs.push(Hang {
            ts,
            attempt: *attempt,
            rank: Some(*rank),
            timeout: timeout_name(&hang.timeout),
            silent_ms: Some(hang.silent_ms),
            measured: Some(hang.why()),
            frames: Vec::new(),
            local_rank: Some(*local_rank),
            stacks_files: Vec::new(),
        }),
        Record::Stacks {
            attempt,
            rank,
            innermost,
            python_stacks,
            proc_stacks,
            ..
        } => {
            if let Some(h) = run
                .hangs
                .iter_mut()
                .rev()
                .find(|h| h.attempt == *attempt && h.rank == Some(*rank) && h.frames.is_empty())
            {
                h.frames = innermost.clone();
                h.stacks_files = python_stacks.iter().chain(proc_stacks).cloned().collect();
            }
        }
        _ => {}
    }
}

/// `initial`, `heartbeat`, `out_of_section` or `section NAME`.
fn timeout_name(k: &HangKind) -> String {
    match k {
        HangKind::Initial => "initial".into(),
        HangKind::Heartbeat => "heartbeat".into(),
        HangKind::OutOfSection => "out_of_section".into(),
        HangKind::Section(s) => format!("section {s}"),
    }
}

/// A straggler report, each rank with what its GPU was doing when the report knew.
fn straggler_report(ts: f64, r: &Record) -> Option<StragglerReport> {
    let Record::StragglerReport {
        ranks,
        stragglers,
        threshold,
        unscored,
        gpus,
    } = r
    else {
        return None;
    };
    Some(StragglerReport {
        ts,
        ranks: ranks
            .iter()
            .map(|r| RankScore {
                rank: r.rank,
                gpu: gpus.get(&r.rank).cloned(),
                node_rank: r.node_rank,
                host: r.host.clone(),
                relative: r.relative,
                individual: r.individual,
                median_s: r.median_s,
            })
            .collect(),
        stragglers: stragglers.clone(),
        threshold: *threshold,
        unscored: *unscored,
    })
}

/// The agent's `result`: its outcome's name, and the outcome's own fields as `key=value`.
fn run_result(ts: f64, outcome: &Outcome, exit_code: i32) -> RunResult {
    let mut detail = Vec::new();
    if let Ok(Value::Object(o)) = serde_json::to_value(outcome) {
        for (k, v) in o.iter().filter(|(k, _)| k.as_str() != "outcome") {
            let v = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            detail.push(format!("{k}={v}"));
        }
    }
    RunResult {
        ts,
        outcome: outcome.name().to_string(),
        exit_code: Some(exit_code),
        restarts: match outcome {
            Outcome::Failed { restarts } => Some(*restarts),
            _ => None,
        },
        detail: detail.join(" "),
    }
}

/// A ledger record as an allocation (runs not yet assigned). None for records of another format
/// or without a start time.
pub fn ledger_allocation(r: &Value) -> Option<Allocation> {
    let r = ledger::Record::from_value(r)?;
    Some(Allocation {
        number: r.allocation,
        job_id: r.job_id,
        start: r.start,
        end: Some(r.end),
        nodes: r.nodes,
        outcome: Some(r.outcome.name().to_string()),
        decision: Some(r.decision),
        why: Some(r.why),
        highest_step: r.highest_step,
        restarts: r.restarts,
        stop_step: r.stop_step,
        stop_trigger: r.stop_trigger,
        excluded: r.excluded,
        exit_status: Some(r.exit_status),
        from_ledger: true,
        submit_time: r.submit_time.filter(|t| t.is_finite()),
        slurm_start: r.slurm_start.filter(|t| t.is_finite()),
        runs: Vec::new(),
    })
}

/// One ledger's records as allocations, and how many records it held of another format.
#[derive(Debug, Default)]
pub struct LedgerAllocations {
    pub path: PathBuf,
    pub allocations: Vec<Allocation>,
    pub other_format: usize,
}

impl LedgerAllocations {
    pub fn new(path: PathBuf) -> Self {
        LedgerAllocations {
            path,
            ..Default::default()
        }
    }

    /// Takes one record: kept as an allocation, or counted as of another format. A ledger is
    /// read one record at a time into this, never held whole as JSON.
    pub fn push(&mut self, r: &Value) {
        match ledger_allocation(r) {
            Some(a) => self.allocations.push(a),
            None => self.other_format += 1,
        }
    }

    fn from_records(f: &RecordFile) -> Self {
        let mut l = LedgerAllocations::new(f.path.clone());
        for r in &f.records {
            l.push(r);
        }
        l
    }
}

/// The history from event logs and ledgers read whole (tests; `History::load` streams).
pub fn build(root: PathBuf, events: &[RecordFile], ledgers: &[RecordFile]) -> History {
    let runs = events
        .iter()
        .map(|f| node_run(f.path.clone(), &f.records))
        .collect();
    let ledgers = ledgers
        .iter()
        .map(LedgerAllocations::from_records)
        .collect();
    build_from_runs(root, runs, ledgers)
}

/// The history from every node run and ledger found.
pub fn build_from_runs(
    root: PathBuf,
    runs: Vec<NodeRun>,
    ledgers: Vec<LedgerAllocations>,
) -> History {
    let mut notes = Vec::new();
    // A log with no timed record holds nothing to show.
    let mut runs: Vec<NodeRun> = runs.into_iter().filter(|r| r.end > 0.0).collect();
    runs.sort_by(|a, b| {
        a.start
            .total_cmp(&b.start)
            .then(a.node_rank.cmp(&b.node_rank))
    });

    let mut allocations: Vec<Allocation> = Vec::new();
    // The same record seen twice (a ledger copied into the experiment) counts once.
    let mut seen = std::collections::HashSet::new();
    for f in ledgers {
        for a in f.allocations {
            if seen.insert((a.start.to_bits(), a.job_id.clone())) {
                allocations.push(a);
            }
        }
        if f.other_format > 0 {
            notes.push(format!(
                "{}: skipped {} ledger record{} of another format",
                f.path.display(),
                f.other_format,
                if f.other_format == 1 { "" } else { "s" }
            ));
        }
    }
    allocations.sort_by(|a, b| a.start.total_cmp(&b.start));

    // Each run belongs to the ledger allocation its time overlaps most; a run that overlaps none
    // (an allocation still running, or one whose node rank 0 died before writing its record)
    // goes into allocations inferred from the runs' own times.
    let mut unassigned = Vec::new();
    for (i, run) in runs.iter().enumerate() {
        let best = allocations
            .iter()
            .enumerate()
            .map(|(j, a)| {
                let end = a.end.unwrap_or(f64::INFINITY);
                (j, run.end.min(end) - run.start.max(a.start))
            })
            .filter(|(_, overlap)| *overlap >= 0.0)
            .max_by(|x, y| x.1.total_cmp(&y.1));
        match best {
            Some((j, _)) => allocations[j].runs.push(i),
            None => unassigned.push(i),
        }
    }
    for group in overlapping_groups(&runs, &unassigned) {
        allocations.push(inferred_allocation(&runs, group));
    }
    allocations.sort_by(|a, b| a.start.total_cmp(&b.start));
    // A ledger's number is kept as written, 0 too (as `vigil ledger` shows it); an allocation
    // inferred from event logs takes the number after the one before it.
    let mut next = 1;
    for a in allocations.iter_mut() {
        if a.from_ledger {
            next = a.number + 1;
        } else {
            a.number = next;
            next += 1;
        }
    }
    History {
        root,
        allocations,
        runs,
        notes,
    }
}

/// `idx` (runs in start order) grouped into runs whose times overlap: the nodes of one
/// allocation run at the same time, allocations one after another.
fn overlapping_groups(runs: &[NodeRun], idx: &[usize]) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut group_end = f64::NEG_INFINITY;
    for &i in idx {
        let r = &runs[i];
        match groups.last_mut() {
            Some(g) if r.start <= group_end => {
                g.push(i);
                group_end = group_end.max(r.end);
            }
            _ => {
                groups.push(vec![i]);
                group_end = r.end;
            }
        }
    }
    groups
}

fn inferred_allocation(runs: &[NodeRun], group: Vec<usize>) -> Allocation {
    let lead = group
        .iter()
        .map(|&i| &runs[i])
        .min_by_key(|r| r.node_rank)
        .expect("a group is never empty");
    let ended = lead.result.is_some();
    let mut nodes: Vec<(u32, String)> = group
        .iter()
        .map(|&i| (runs[i].node_rank, runs[i].host.clone()))
        .collect();
    nodes.sort();
    nodes.dedup();
    Allocation {
        number: 0,
        job_id: None,
        start: group
            .iter()
            .map(|&i| runs[i].start)
            .fold(f64::INFINITY, f64::min),
        end: ended.then(|| {
            group
                .iter()
                .map(|&i| runs[i].end)
                .fold(f64::NEG_INFINITY, f64::max)
        }),
        nodes: nodes.into_iter().map(|(_, h)| h).collect(),
        outcome: lead.result.as_ref().map(|r| r.outcome.clone()),
        highest_step: group
            .iter()
            .flat_map(|&i| runs[i].steps.iter().map(|s| s.step))
            .max(),
        restarts: lead.restarts.len() as u32,
        stop_step: lead.stops.iter().rev().find_map(|s| match s.kind {
            StopKind::Agreed { step, .. } => step,
            _ => None,
        }),
        stop_trigger: lead.stops.iter().find_map(|s| match &s.kind {
            StopKind::Triggered { trigger } => Some(trigger.clone()),
            _ => None,
        }),
        exit_status: lead.result.as_ref().and_then(|r| r.exit_code),
        from_ledger: false,
        runs: group,
        ..Allocation::default()
    }
}

/// An in-process restart's record, described for the report (docs/inprocess.md).
fn in_process(ts: f64, rec: &Record) -> Option<InProcess> {
    let (attempt, text) = match rec {
        Record::Generation {
            attempt,
            generation,
            ranks,
            step,
        } => {
            let ranks: Vec<String> = ranks.iter().map(u32::to_string).collect();
            let at = step.map(|s| format!(" at step {s}")).unwrap_or_default();
            let text = format!(
                "in-process restart: generation {generation}{at}, rank {} replaced, no step redone",
                ranks.join(", ")
            );
            (*attempt, text)
        }
        Record::GenerationRecovered {
            attempt,
            generation,
            seconds,
        } => (
            *attempt,
            format!("generation {generation} recovered in {seconds:.2}s"),
        ),
        Record::GenerationStepping {
            attempt,
            generation,
            seconds,
        } => (
            *attempt,
            format!("generation {generation}: every rank stepping again {seconds:.2}s after the failure"),
        ),
        Record::InProcessDeclined { attempt, reason } => {
            (*attempt, format!("no in-process restart: {reason}"))
        }
        _ => return None,
    };
    Some(InProcess { ts, attempt, text })
}

/// A generation's beginning or its ranks stepping again, for goodput.
fn generation_mark(ts: f64, rec: &Record) -> Option<GenerationMark> {
    let (attempt, generation, kind) = match rec {
        Record::Generation {
            attempt,
            generation,
            ranks,
            step,
        } => (
            *attempt,
            *generation,
            GenerationKind::Began {
                ranks: ranks.clone(),
                step: *step,
            },
        ),
        Record::GenerationStepping {
            attempt,
            generation,
            ..
        } => (*attempt, *generation, GenerationKind::Stepping),
        _ => return None,
    };
    Some(GenerationMark {
        ts,
        attempt,
        generation,
        kind,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The moments of a history of this one node run, as (time, kind, text).
    fn moments_of(run: NodeRun) -> Vec<(f64, &'static str, String)> {
        let h = History {
            runs: vec![run],
            ..History::default()
        };
        (h.moments().into_iter())
            .map(|m| (m.ts, m.kind, m.text))
            .collect()
    }
    use crate::records::parse_jsonl;
    use std::path::Path;

    pub(crate) fn recs(text: &str) -> Vec<Value> {
        parse_jsonl(text, Path::new("t")).0
    }

    pub(crate) const CRASH_THEN_DONE: &str = r#"{"cgroup":null,"event":"containment","host":"vm","node_rank":0,"ts":100.0}
{"event":"nodes","host":"vm","nnodes":1,"node_rank":0,"run_id":"r1","store":"127.0.0.1:1","ts":100.0}
{"cycle":0,"event":"joined","host":"vm","node_rank":0,"rank_offset":0,"ts":100.1}
{"cycle":0,"event":"cycle_start","host":"vm","node_rank":0,"nproc":2,"restart_count":0,"ts":100.1}
{"cycle":0,"event":"rank_exited","exit_code":1,"expected":false,"host":"vm","local_rank":1,"node_rank":0,"pid":9,"rank":1,"ts":102.4}
{"cycle":0,"event":"stop","grace_ms":15000,"host":"vm","node_rank":0,"pids":[8],"reason":"rank_failed","signal":15,"ts":102.4}
{"cycle":0,"end":"failed","event":"cycle_ended","host":"vm","node":0,"node_rank":0,"reason":"rank 1 exited with code 1","ts":102.5}
{"cycle":0,"event":"rank_exited","exit_code":1,"expected":true,"host":"vm","local_rank":0,"node_rank":0,"pid":8,"rank":0,"ts":103.1}
{"backoff_ms":0,"event":"restart","from_cycle":0,"host":"vm","node_rank":0,"ran_ms":2282,"restarts_left":0,"to_cycle":1,"ts":103.2}
{"cycle":1,"event":"cycle_start","host":"vm","node_rank":0,"nproc":2,"restart_count":1,"ts":103.2}
{"cycle":1,"event":"some_future_event","host":"vm","node_rank":0,"ts":103.3,"new":{"x":1}}
{"cycle":1,"event":"steps","host":"vm","node_rank":0,"step":7,"min_step":5,"ts":104.0}
{"cycle":1,"end":"done","event":"cycle_ended","host":"vm","node_rank":0,"ts":106.3}
{"event":"result","exit_code":0,"host":"vm","node_rank":0,"outcome":"succeeded","ts":106.3}
"#;

    pub(crate) const HANG: &str = r#"{"event":"nodes","host":"vm","nnodes":1,"node_rank":0,"run_id":"r2","ts":200.0}
{"cycle":0,"event":"cycle_start","host":"vm","node_rank":0,"nproc":1,"restart_count":0,"ts":200.0}
{"cycle":0,"event":"hang","host":"vm","limit_ms":1000,"local_rank":0,"node_rank":0,"pid":5,"rank":0,"silent_ms":1001,"stopped":false,"timeout":"heartbeat","ts":202.0}
{"cycle":0,"event":"stacks","host":"vm","innermost":["Current thread 0x00007f: File \"/tmp/t.py\", line 4 in wait_forever_in_this_function","Current thread 0x00007f: File \"/tmp/t.py\", line 10 in <module>"],"local_rank":0,"node_rank":0,"rank":0,"ts":202.1}
{"cycle":0,"end":"failed","event":"cycle_ended","host":"vm","node":0,"node_rank":0,"reason":"rank 0 hung","ts":202.2}
{"event":"result","exit_code":1,"host":"vm","node_rank":0,"outcome":"failed","ts":203.0}
"#;

    #[test]
    fn a_crash_and_its_restart_become_attempts_a_failure_and_a_restart() {
        let run = node_run("e".into(), &recs(CRASH_THEN_DONE));
        assert_eq!((run.host.as_str(), run.node_rank), ("vm", 0));
        assert_eq!(run.run_id.as_deref(), Some("r1"));
        assert_eq!(run.attempts.len(), 2);
        assert_eq!(run.attempts[0].end_kind.as_deref(), Some("failed"));
        assert_eq!(run.attempts[0].end, 102.5);
        assert_eq!(run.attempts[1].end_kind.as_deref(), Some("done"));
        assert_eq!(run.failures.len(), 1, "a rank vigil stopped is no failure");
        assert_eq!(run.failures[0].describe(), "rank 1 exited with code 1");
        assert_eq!(run.restarts.len(), 1);
        assert_eq!(
            (run.restarts[0].from_attempt, run.restarts[0].to_attempt),
            (0, 1)
        );
        assert_eq!(
            run.steps,
            vec![StepPoint {
                ts: 104.0,
                attempt: 1,
                step: 7,
                min_step: Some(5),
                step_s: None,
            }]
        );
        assert_eq!(run.result.as_ref().unwrap().outcome, "succeeded");
        assert_eq!((run.start, run.end), (100.0, 106.3));
    }

    #[test]
    fn a_hang_gets_the_innermost_frame_of_its_stacks() {
        let run = node_run("e".into(), &recs(HANG));
        assert_eq!(run.hangs.len(), 1);
        let h = &run.hangs[0];
        assert_eq!(
            h.frame().as_deref(),
            Some("t.py:4 in wait_forever_in_this_function")
        );
        assert_eq!(
            h.describe(),
            "rank 0 hung (heartbeat timeout) in t.py:4 in wait_forever_in_this_function"
        );
    }

    #[test]
    fn section_timeouts_and_signals_are_named() {
        let run = node_run(
            "e".into(),
            &recs(concat!(
                r#"{"event":"hang","ts":1,"cycle":0,"rank":2,"timeout":{"section":"checkpointing"}}"#,
                "\n",
                r#"{"event":"rank_exited","ts":2,"cycle":0,"rank":3,"signal":9,"expected":false}"#,
                "\n",
                r#"{"event":"rank_spawn_failed","ts":3,"cycle":0,"local_rank":1,"error":"No such file"}"#,
                "\n"
            )),
        );
        assert_eq!(
            run.hangs[0].describe(),
            "rank 2 hung (section checkpointing timeout)"
        );
        assert_eq!(run.failures[0].describe(), "rank 3 killed by SIGKILL");
        assert_eq!(
            run.failures[1].describe(),
            "local rank 1 could not start: No such file"
        );
    }

    #[test]
    fn short_frames() {
        assert_eq!(
            short_frame("Current thread 0x1: File \"/a/b/train.py\", line 12 in step"),
            "train.py:12 in step"
        );
        assert_eq!(short_frame("  File \"x.py\", line 3"), "x.py:3");
        assert_eq!(
            short_frame("[<0>] futex_wait+0x1/0x2"),
            "[<0>] futex_wait+0x1/0x2"
        );
    }

    #[test]
    fn without_a_ledger_allocations_are_inferred_from_overlapping_runs() {
        let node = |rank: u32, start: f64, end: f64, result: bool| {
            let mut t = format!(
                "{{\"event\":\"cycle_start\",\"cycle\":0,\"host\":\"n{rank}\",\"node_rank\":{rank},\"ts\":{start}}}\n"
            );
            if result {
                t.push_str(&format!(
                    "{{\"event\":\"result\",\"outcome\":\"stopped\",\"exit_code\":75,\"host\":\"n{rank}\",\"node_rank\":{rank},\"ts\":{end}}}\n"
                ));
            } else {
                t.push_str(&format!(
                    "{{\"event\":\"registered\",\"cycle\":0,\"host\":\"n{rank}\",\"node_rank\":{rank},\"ts\":{end}}}\n"
                ));
            }
            RecordFile {
                path: format!("r{rank}_{start}").into(),
                records: recs(&t),
            }
        };
        let files = vec![
            node(0, 10.0, 50.0, true),
            node(1, 9.5, 50.5, true),
            node(1, 100.0, 120.0, false),
            node(0, 100.2, 130.0, false),
        ];
        let h = build("d".into(), &files, &[]);
        assert_eq!(h.allocations.len(), 2);
        let (a, b) = (&h.allocations[0], &h.allocations[1]);
        assert_eq!((a.number, b.number), (1, 2));
        assert_eq!(a.runs.len(), 2);
        assert_eq!(a.nodes, vec!["n0", "n1"]);
        assert_eq!(a.outcome.as_deref(), Some("stopped"));
        assert_eq!(a.end, Some(50.5));
        assert!(!a.from_ledger);
        assert_eq!(b.end, None, "node rank 0 has no result yet: still running");
    }

    #[test]
    fn ledger_records_are_allocations_and_runs_join_the_one_they_overlap() {
        let ledger = RecordFile {
            path: "state/ledger.jsonl".into(),
            records: recs(concat!(
                r#"{"format":1,"allocation":1,"job_id":"42","nodes":["a","b"],"start":100.0,"end":150.0,"outcome":"stopped","highest_step":10,"restarts":0,"stop_step":10,"stop_trigger":"SIGTERM","decision":"requeue","why":"SIGTERM, reached step 10","excluded":[],"exit_status":75}"#,
                "\n",
                r#"{"format":2,"allocation":9}"#,
                "\n",
                r#"{"format":1,"allocation":2,"job_id":"42","nodes":["a","c"],"start":200.0,"end":260.0,"outcome":"failed","highest_step":30,"restarts":2,"decision":"stop","why":"failed","excluded":["c"],"exit_status":1}"#,
                "\n"
            )),
        };
        let run = |start: f64, end: f64| {
            RecordFile {
            path: format!("run{start}").into(),
            records: recs(&format!(
                "{{\"event\":\"cycle_start\",\"cycle\":0,\"host\":\"a\",\"node_rank\":0,\"ts\":{start}}}\n{{\"event\":\"result\",\"outcome\":\"x\",\"host\":\"a\",\"node_rank\":0,\"ts\":{end}}}\n"
            )),
        }
        };
        let h = build(
            "d".into(),
            &[run(99.0, 150.0), run(200.0, 259.0), run(300.0, 310.0)],
            std::slice::from_ref(&ledger),
        );
        assert_eq!(h.notes.len(), 1, "{:?}", h.notes);
        assert_eq!(h.allocations.len(), 3);
        let a = &h.allocations[0];
        assert!(a.from_ledger && a.requeued() && a.preempted());
        assert_eq!(a.runs, vec![0]);
        assert_eq!(h.allocations[1].runs, vec![1]);
        let c = &h.allocations[2];
        assert!(!c.from_ledger);
        assert_eq!(c.number, 3);
        assert_eq!(c.runs, vec![2]);
        let kinds: Vec<_> = h.moments().iter().map(|m| m.kind).collect();
        assert!(kinds.contains(&"preempted"), "{kinds:?}");
    }

    #[test]
    fn straggler_reports_are_read_and_the_worst_rank_is_the_lowest_relative_score() {
        let run = node_run(
            "e".into(),
            &recs(concat!(
                r#"{"event":"straggler_report","ts":5,"host":"a","node_rank":0,"ranks":[{"rank":0,"node_rank":0,"host":"a","relative":1.0,"individual":0.98,"median_s":0.1},{"rank":3,"node_rank":1,"host":"b","relative":0.31,"individual":0.95,"median_s":0.32},{"rank":1}],"stragglers":[3],"threshold":0.7,"unscored":1}"#,
                "\n"
            )),
        );
        let r = &run.straggler_reports[0];
        assert_eq!(r.ranks.len(), 3);
        assert_eq!(r.stragglers, vec![3]);
        assert_eq!(r.threshold, Some(0.7));
        assert_eq!(r.unscored, Some(1));
        let w = r.worst().unwrap();
        assert_eq!((w.rank, w.host.as_deref()), (3, Some("b")));
    }

    #[test]
    fn in_process_restarts_are_events_of_the_report() {
        let run = node_run(
            "e".into(),
            &recs(concat!(
                r#"{"event":"generation","ts":5,"cycle":0,"generation":1,"ranks":[2],"step":30,"host":"a","node_rank":0}"#,
                "\n",
                r#"{"event":"generation_recovered","ts":6.5,"cycle":0,"generation":1,"seconds":1.5,"host":"a","node_rank":0}"#,
                "\n",
                r#"{"event":"in_process_declined","ts":9,"cycle":0,"reason":"rank 1 failed and the whole job restarts: the 1 in-process restarts are used up","host":"a","node_rank":0}"#,
                "\n"
            )),
        );
        let m = moments_of(run);
        let texts: Vec<&str> = m.iter().map(|(_, _, t)| t.as_str()).collect();
        assert!(texts.iter().any(|t| t.contains(
            "attempt 0: in-process restart: generation 1 at step 30, rank 2 replaced, no step redone"
        )), "{texts:?}");
        assert!(texts
            .iter()
            .any(|t| t.contains("generation 1 recovered in 1.50s")));
        assert!(texts
            .iter()
            .any(|t| t.contains("no in-process restart: rank 1 failed")));
        assert!(m.iter().all(|(_, k, _)| *k == "generation"));
    }

    #[test]
    fn node_faults_gpu_texts_and_changes_in_the_stragglers_are_events() {
        let run = node_run(
            "e".into(),
            &recs(concat!(
                r#"{"event":"straggler_report","ts":1,"host":"a","node_rank":0,"ranks":[{"rank":3,"host":"b","relative":0.31,"individual":0.95}],"stragglers":[3],"threshold":0.7,"gpus":{"3":"SM clock 1,110 of 1,980 MHz"}}"#,
                "\n",
                r#"{"event":"straggler_report","ts":2,"host":"a","node_rank":0,"ranks":[{"rank":3,"host":"b","relative":0.3,"individual":0.9}],"stragglers":[3],"threshold":0.7}"#,
                "\n",
                r#"{"event":"straggler_report","ts":3,"host":"a","node_rank":0,"ranks":[{"rank":3,"host":"b","relative":0.9,"individual":0.9}],"stragglers":[],"threshold":0.7}"#,
                "\n",
                r#"{"event":"node_fault","ts":4,"cycle":0,"host":"a","node_rank":0,"reason":"XID 79 on GPU 2"}"#,
                "\n"
            )),
        );
        assert_eq!(
            run.straggler_reports[0].ranks[0].gpu.as_deref(),
            Some("SM clock 1,110 of 1,980 MHz")
        );
        let m = moments_of(run);
        assert_eq!(
            m,
            vec![
                (1.0, "straggler", "stragglers below 0.70: rank 3 on b (relative 0.31, individual 0.95, GPU: SM clock 1,110 of 1,980 MHz)".to_string()),
                (3.0, "straggler", "no stragglers below 0.70 any more".to_string()),
                (4.0, "node_fault", "attempt 0: node fault: XID 79 on GPU 2".to_string()),
            ]
        );
    }

    #[test]
    fn records_lost_to_a_full_log_are_a_moment_at_their_start() {
        let run = node_run(
            "e".into(),
            &recs(concat!(
                r#"{"event":"cycle_start","ts":1,"cycle":0,"host":"a","node_rank":0}"#,
                "\n",
                r#"{"event":"events_lost","ts":30,"records":12,"first_ts":10,"last_ts":29.5,"error":"No space left on device (os error 28)","host":"a","node_rank":0}"#,
                "\n",
                r#"{"event":"result","ts":31,"outcome":"succeeded","exit_code":0,"host":"a","node_rank":0}"#,
                "\n"
            )),
        );
        let m = moments_of(run);
        assert_eq!(
            m[0],
            (10.0, "events_lost", "event log not written for 19.5s: 12 record(s) lost (No space left on device (os error 28))".to_string())
        );
        assert_eq!(m[1].1, "result");
    }

    #[test]
    fn the_standbys_ready_are_events_when_they_change() {
        let run = node_run(
            "e".into(),
            &recs(concat!(
                r#"{"event":"spares","ts":1,"cycle":0,"ready":1,"host":"a","node_rank":0}"#,
                "\n",
                r#"{"event":"spares","ts":2,"cycle":1,"ready":1,"host":"a","node_rank":0}"#,
                "\n",
                r#"{"event":"standby_gone","ts":3,"node":2,"reason":"standby node 2 left the job: its agent received SIGTERM","ready":0,"host":"a","node_rank":0}"#,
                "\n"
            )),
        );
        let m = moments_of(run);
        assert_eq!(
            m,
            vec![
                (1.0, "spares", "standbys ready: 1".to_string()),
                (3.0, "spares", "standby node 2 out of the job (standby node 2 left the job: its agent received SIGTERM); standbys ready: 0".to_string()),
            ]
        );
    }

    #[test]
    fn records_without_an_event_or_time_and_mistyped_fields_are_ignored() {
        let run = node_run(
            "e".into(),
            &recs("{\"ts\":1}\n{\"event\":\"hang\"}\n{\"event\":\"restart\",\"ts\":\"x\"}\n{\"event\":\"steps\",\"ts\":3,\"step\":\"many\"}\n"),
        );
        assert!(run.hangs.is_empty() && run.restarts.is_empty() && run.steps.is_empty());
    }

    #[test]
    fn a_failure_is_one_event_and_the_wait_before_the_restart_is_measured() {
        let h = build(
            "d".into(),
            &[RecordFile {
                path: "r/events.jsonl".into(),
                records: recs(CRASH_THEN_DONE),
            }],
            &[],
        );
        let m = h.moments();
        let failures: Vec<_> = m
            .iter()
            .filter(|m| m.text.contains("exited with code 1"))
            .collect();
        assert_eq!(failures.len(), 1, "{m:?}");
        let w = h.runs[0].waits();
        assert_eq!(w.len(), 1);
        assert_eq!((w[0].from, w[0].to, w[0].to_attempt), (102.5, 103.2, 1));
        assert!((w[0].stopping_s - 0.6).abs() < 1e-9, "{w:?}");
        assert_eq!(w[0].describe(), "waited 0.7s (ranks stopping 0.6s)");
        let restart = m.iter().find(|m| m.kind == "restart").unwrap();
        assert!(
            restart.text.ends_with("waited 0.7s (ranks stopping 0.6s)"),
            "{restart:?}"
        );
    }
}
