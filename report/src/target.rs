//! What a job is called on the command line, the same for `vigil logs`, `status`, `ledger` and
//! `report` (docs/usage.md, "Naming a job"): an experiment (its id, its name or its directory), a
//! log directory (`vigil run --log-dir`), a run directory (`vigil_*`) or a state directory. A
//! directory is read for the record files below it, wherever vigil put them.

use std::path::{Path, PathBuf};

use crate::records;

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
/// rank; the run directory is the event log's own).
pub fn rank_dir(dir: &Path, rank: u32) -> Option<PathBuf> {
    let mut best: Option<(f64, PathBuf)> = None;
    for events in records::find(dir).events {
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
            let (Some(ts), Some(cycle), Some(local)) = (
                ev["ts"].as_f64(),
                ev["cycle"].as_u64(),
                ev["local_rank"].as_u64(),
            ) else {
                continue;
            };
            if best.as_ref().is_none_or(|(b, _)| ts > *b) {
                best = Some((
                    ts,
                    run.join(format!("attempt_{cycle}")).join(local.to_string()),
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

    fn started(ts: f64, rank: u32, cycle: u32, local: u32) -> String {
        format!(
            "{{\"event\":\"rank_started\",\"ts\":{ts},\"rank\":{rank},\"cycle\":{cycle},\"local_rank\":{local}}}\n"
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
}
