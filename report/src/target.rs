//! What a job is called on the command line, the same for `vigil logs`, `status`, `ledger` and
//! `report` (docs/usage.md, "Naming a job"): an experiment (its id, its name or its directory), a
//! log directory (`vigil run --log-dir`), a run directory (`vigil_*`) or a state directory. A
//! directory is read for the record files below it, wherever vigil put them.

use std::path::{Path, PathBuf};

use serde_json::Value;
use vigil_events::file_safe;

use crate::records;

/// The event logs `dir` stands for: those below it; and for a state directory read alone (a
/// ledger below `dir`, no event log), those of the run directories its job wrote elsewhere.
/// The ledger records no run directory's path, so they are looked for where vigil puts them:
/// next to the state directory (under Slurm the state directory is `<log dir>/vigil-job-..`,
/// beside the run directories) and one level into the directories beside it (an experiment's
/// `runs/` beside its `state/`; `--log-dir logs --state-dir state`). A run directory there is the job's when its name carries the ledger's job id
/// (`vigil_<job id>_<time>_<hex>`), else when its first record falls inside one of the ledger's
/// allocations.
pub fn event_logs(dir: &Path) -> records::Found {
    let mut found = records::find(dir);
    if !found.events.is_empty() || found.ledgers.is_empty() {
        return found;
    }
    let mut extra = Vec::new();
    for ledger in &found.ledgers {
        extra.extend(runs_of_ledger(ledger));
    }
    extra.sort();
    extra.dedup();
    if !extra.is_empty() {
        found.notes.push(format!(
            "{} holds no event log: read the run directories of its job found beside it ({})",
            dir.display(),
            extra
                .iter()
                .filter_map(|p| p.parent())
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    found.events = extra;
    found
}

/// Directories beside a state directory looked into for run directories, at most.
const MAX_SIBLINGS: usize = 64;

/// The `events.jsonl` of the run directories beside the state directory holding `ledger`.
fn runs_of_ledger(ledger: &Path) -> Vec<PathBuf> {
    // A relative `state/` has the empty path for its parent.
    let Some(state) = ledger.parent().and_then(|s| std::fs::canonicalize(s).ok()) else {
        return Vec::new();
    };
    let state = state.as_path();
    let Some(parent) = state.parent() else {
        return Vec::new();
    };
    let mut ids: Vec<String> = Vec::new();
    let mut spans: Vec<(f64, f64)> = Vec::new();
    let _ = records::read_jsonl(ledger, &mut |v| {
        if let Some(r) = vigil_events::ledger::Record::from_value(v) {
            if let Some(j) = r.job_id {
                // A Slurm job's id may carry its cluster (`<cluster>-<id>`); the run
                // directory's name may hold either.
                let bare = r
                    .cluster
                    .as_deref()
                    .and_then(|c| j.strip_prefix(c).and_then(|rest| rest.strip_prefix('-')));
                ids.extend(bare.map(file_safe));
                ids.push(file_safe(&j));
            }
            spans.push((r.start, r.end));
        }
    });
    ids.sort();
    ids.dedup();
    let mut runs: Vec<PathBuf> = Vec::new();
    // The parent and its other directories (`runs/`, `logs/`), a bounded few.
    let mut bases = vec![parent.to_path_buf()];
    if let Ok(entries) = std::fs::read_dir(parent) {
        bases.extend(
            entries
                .filter_map(Result::ok)
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .filter(|e| !e.file_name().to_string_lossy().starts_with("vigil_"))
                .map(|e| e.path())
                .filter(|p| p != state)
                .take(MAX_SIBLINGS),
        );
    }
    for base in bases {
        let Ok(entries) = std::fs::read_dir(&base) else {
            continue;
        };
        for e in entries.filter_map(Result::ok) {
            let name = e.file_name().to_string_lossy().into_owned();
            let events = e.path().join(records::EVENTS);
            if name.starts_with("vigil_") && events.is_file() {
                runs.push(events);
            }
        }
    }
    let by_name: Vec<PathBuf> = runs
        .iter()
        .filter(|p| {
            let name = p
                .parent()
                .and_then(Path::file_name)
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            ids.iter()
                .any(|id| name.starts_with(&format!("vigil_{id}_")))
        })
        .cloned()
        .collect();
    if !by_name.is_empty() {
        return by_name;
    }
    runs.into_iter()
        .filter(|p| {
            first_ts(p).is_some_and(|t| spans.iter().any(|(s, e)| t >= *s - 1.0 && t <= *e))
        })
        .collect()
}

/// The time of an event log's first record.
fn first_ts(events: &Path) -> Option<f64> {
    let mut lines = vigil_bounded::lines(events, vigil_bounded::LINE_LIMIT).ok()?;
    let line = lines.next()?.ok()?;
    serde_json::from_str::<Value>(&line.text).ok()?["ts"].as_f64()
}

/// The state directories below `dir` (each holds a `ledger.jsonl`), in path order.
pub fn ledger_dirs(dir: &Path) -> Vec<PathBuf> {
    records::find(dir)
        .ledgers
        .iter()
        .filter_map(|p| p.parent().map(Path::to_path_buf))
        .collect()
}

/// Rank `rank`'s latest attempt directory (holding its stdout.log and stderr.log) below `dir`,
/// from the `rank_started` records of the event logs there (each names its attempt and local
/// rank; the run directory is the event log's own). A state directory stands for its job's run
/// directories ([`event_logs`]).
pub fn rank_dir(dir: &Path, rank: u32) -> Option<PathBuf> {
    let mut best: Option<(f64, PathBuf)> = None;
    for events in event_logs(dir).events {
        let Some(run) = events.parent() else { continue };
        // Streamed, each line bounded: an event log may be large.
        let Ok(lines) = vigil_bounded::lines(&events, vigil_bounded::LINE_LIMIT) else {
            continue;
        };
        for line in lines.map_while(Result::ok) {
            let Ok(ev) = serde_json::from_str::<serde_json::Value>(&line.text) else {
                continue;
            };
            if ev["event"] != "rank_started" || ev["rank"].as_u64() != Some(rank.into()) {
                continue;
            }
            let (Some(ts), Some(attempt), Some(local)) = (
                ev["ts"].as_f64(),
                ev["cycle"].as_u64(),
                ev["local_rank"].as_u64(),
            ) else {
                continue;
            };
            if best.as_ref().is_none_or(|(b, _)| ts > *b) {
                best = Some((
                    ts,
                    run.join(format!("attempt_{attempt}"))
                        .join(local.to_string()),
                ));
            }
        }
    }
    best.map(|(_, d)| d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("vigil-target-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn started(ts: f64, rank: u32, attempt: u32, local: u32) -> String {
        format!(
            "{{\"event\":\"rank_started\",\"ts\":{ts},\"rank\":{rank},\"cycle\":{attempt},\"local_rank\":{local}}}\n"
        )
    }

    #[test]
    fn a_rank_is_found_in_a_log_a_run_and_an_experiment_directory_alike() {
        let d = scratch("rank");
        // A plain `vigil run --log-dir d` and a launched experiment's `runs/`.
        let run = d.join("logs/vigil_x_1");
        fs::create_dir_all(&run).unwrap();
        fs::write(
            run.join("events.jsonl"),
            started(1.0, 3, 0, 1) + &started(2.0, 3, 1, 1) + &started(3.0, 2, 1, 0),
        )
        .unwrap();
        fs::write(run.join("ledger.jsonl"), "").unwrap();
        let want = run.join("attempt_1/1");
        assert_eq!(rank_dir(&d.join("logs"), 3), Some(want.clone()));
        assert_eq!(rank_dir(&run, 3), Some(want.clone()));
        assert_eq!(rank_dir(&d, 3), Some(want));
        assert_eq!(rank_dir(&run, 9), None);
        assert_eq!(ledger_dirs(&d.join("logs")), vec![run.clone()]);
        assert_eq!(ledger_dirs(&run), vec![run]);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_state_directory_alone_stands_for_the_run_directories_of_its_job_beside_it() {
        let d = scratch("state");
        let ledger = "{\"format\":1,\"allocation\":1,\"job_id\":\"77\",\"start\":10.0,\"end\":20.0,\"outcome\":\"finished\",\"decision\":\"finished\",\"why\":\"\"}\n";
        // Under Slurm: `<log dir>/vigil-job-c-77/` beside `<log dir>/vigil_77_*`; another
        // job's run directory there is not read.
        let state = d.join("logs/vigil-job-c-77");
        let ours = d.join("logs/vigil_77_20260101-000000_abcdef");
        let other = d.join("logs/vigil_78_20260101-000000_abcdef");
        for dir in [&state, &ours, &other] {
            fs::create_dir_all(dir).unwrap();
        }
        fs::write(state.join("ledger.jsonl"), ledger).unwrap();
        fs::write(ours.join("events.jsonl"), started(12.0, 1, 0, 1)).unwrap();
        fs::write(other.join("events.jsonl"), started(12.0, 1, 0, 1)).unwrap();
        let found = event_logs(&state);
        assert_eq!(found.events, vec![ours.join("events.jsonl")]);
        assert!(
            found.notes[0].contains("holds no event log"),
            "{:?}",
            found.notes
        );
        assert_eq!(rank_dir(&state, 1), Some(ours.join("attempt_0/1")));
        // `--state-dir state --log-dir logs` of a job without a matching name: by time.
        let exp = d.join("exp");
        let run = exp.join("logs/vigil_train_20260101-000000_abcdef");
        fs::create_dir_all(exp.join("state")).unwrap();
        fs::create_dir_all(&run).unwrap();
        fs::write(exp.join("state/ledger.jsonl"), ledger).unwrap();
        fs::write(run.join("events.jsonl"), started(15.0, 0, 0, 0)).unwrap();
        assert_eq!(
            event_logs(&exp.join("state")).events,
            vec![run.join("events.jsonl")]
        );
        fs::write(run.join("events.jsonl"), started(25.0, 0, 0, 0)).unwrap();
        assert!(event_logs(&exp.join("state")).events.is_empty());
        fs::remove_dir_all(&d).unwrap();
    }
}
