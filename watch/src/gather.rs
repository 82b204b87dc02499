//! Reads the facts the rules need about one job: its [`History`], what its latest allocation's
//! event logs say of standbys and when they were last written, and, where `scontrol` is on the
//! PATH, Slurm's view of the job.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use vigil_events::log::{Line, Record};
use vigil_report::{records, History, ReportError};
use vigil_slurm::cmd::{run_command, Cmd};
use vigil_slurm::{hostlist, show_job};

use crate::rules::{Facts, SlurmJob, Spares};

/// How long `scontrol show job` may take.
const SCONTROL_TIMEOUT: Duration = Duration::from_secs(15);

/// The facts of the job whose records are below `dir`, and what is wrong with its job id when
/// `experiment.json` names one that is no Slurm job id (Slurm is then not asked).
pub fn facts(dir: &Path, path_var: Option<&str>) -> Result<(Facts, Option<String>), ReportError> {
    let history = History::load(dir)?;
    let logs = latest_logs(&history);
    let spares = spares(&logs);
    let last_write = logs
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok()?.modified().ok())
        .filter_map(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_secs_f64())
        .reduce(f64::max);
    let (id, bad) = match job_id(dir, &history) {
        Ok(id) => (id, None),
        Err(why) => (None, Some(why)),
    };
    let slurm = id
        .filter(|_| on_path("scontrol", path_var))
        .and_then(|id| slurm_job(&id));
    let facts = Facts {
        history,
        spares,
        last_write,
        slurm,
    };
    Ok((facts, bad))
}

/// The event logs of the latest allocation (all of them when no allocation names its runs).
fn latest_logs(h: &History) -> Vec<PathBuf> {
    match h.allocations.last() {
        Some(a) if !a.runs.is_empty() => a
            .runs
            .iter()
            .filter_map(|&i| h.runs.get(i))
            .map(|r| r.source.clone())
            .collect(),
        _ => h.runs.iter().map(|r| r.source.clone()).collect(),
    }
}

/// Who stood by, and who still does: a host's last `standby` or `attempt_start` record says which.
fn spares(logs: &[PathBuf]) -> Spares {
    let mut s = Spares::default();
    for path in logs {
        let mut host = String::new();
        let mut standing_by = None;
        let _ = records::read_jsonl(path, &mut |v| {
            let Some(line) = Line::parse(v) else { return };
            if let Some(h) = &line.host {
                host.clone_from(h);
            }
            match line.record {
                Record::Standby { .. } => standing_by = Some(true),
                Record::AttemptStart { .. } => standing_by = standing_by.map(|_| false),
                _ => {}
            }
        });
        if let Some(still) = standing_by {
            let host = if host.is_empty() {
                path.display().to_string()
            } else {
                host
            };
            if still {
                s.left.insert(host.clone());
            }
            s.had.insert(host);
        }
    }
    s
}

/// The Slurm job id: `experiment.json`'s (`vigil launch`), else the ledger's latest. Only a Slurm
/// job id ([`slurm_job_id`]) is ever handed to `scontrol`: a bad one in `experiment.json` is an
/// error naming it; a ledger's that is none is a job run outside Slurm, and has no Slurm state.
fn job_id(dir: &Path, h: &History) -> Result<Option<String>, String> {
    if let Some(id) = records::read_experiment(dir).ok().and_then(|m| m.job_id) {
        return if slurm_job_id(&id) {
            Ok(Some(id))
        } else {
            Err(format!(
                "{}: job_id {} is not a Slurm job id (digits, as 1234, 1234_7 for an array task or 1234+1 for a heterogeneous component); Slurm is not asked about it: correct the file",
                dir.join("experiment.json").display(),
                crate::send::excerpt(id.as_bytes(), 64)
            ))
        };
    }
    Ok(h.allocations
        .iter()
        .rev()
        .find_map(|a| a.job_id.clone())
        .filter(|id| slurm_job_id(id)))
}

/// Whether `id` is a Slurm job id: digits, optionally an array task (`1234_7`) or a
/// heterogeneous job's component (`1234+1`).
pub fn slurm_job_id(id: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
    match id.split_once(['_', '+']) {
        Some((job, sub)) => digits(job) && digits(sub),
        None => digits(id),
    }
}

fn on_path(program: &str, path_var: Option<&str>) -> bool {
    path_var
        .unwrap_or_default()
        .split(':')
        .filter(|d| !d.is_empty())
        .any(|d| Path::new(d).join(program).is_file())
}

/// `scontrol show job -o ID`; None when it fails (an unknown, long-finished job).
fn slurm_job(id: &str) -> Option<SlurmJob> {
    let out = run_command(
        &Cmd::new("scontrol", &["show", "job", "-o", id]),
        SCONTROL_TIMEOUT,
    )
    .ok()?;
    Some(slurm_fields(id, &show_job::parse(&out)))
}

/// The fields the rules read, with the node lists expanded.
pub fn slurm_fields(id: &str, f: &show_job::Fields) -> SlurmJob {
    let get = |k: &str| f.get(k).cloned().unwrap_or_default();
    let expand = |list: &str| -> Vec<String> {
        if show_job::unset(list) {
            Vec::new()
        } else {
            hostlist::expand(list).unwrap_or_default()
        }
    };
    let reason = get("Reason");
    let mut wanted: BTreeSet<String> = expand(&get("ReqNodeList")).into_iter().collect();
    if let Some((_, nodes)) = reason.split_once("UnavailableNodes:") {
        wanted.extend(expand(nodes.trim()));
    }
    SlurmJob {
        id: id.to_string(),
        state: get("JobState"),
        reason,
        wanted: wanted.into_iter().collect(),
        excluded: expand(&get("ExcNodeList")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_slurm_job_ids_are_taken() {
        for ok in ["4242", "1234_7", "1234+1", "0"] {
            assert!(slurm_job_id(ok), "{ok}");
        }
        for bad in [
            "",
            "-1",
            "--help",
            "12 3",
            "4242;rm -rf ~",
            "1_2_3",
            "1+",
            "_1",
            "12a",
            "1234_[1-3]",
            "\u{661}",
            "123456789012345678901",
        ] {
            assert!(!slurm_job_id(bad), "{bad}");
        }
    }

    #[test]
    fn slurm_fields_expand_the_wanted_and_the_excluded_nodes() {
        let text = "JobId=7 JobState=PENDING Reason=ReqNodeNotAvail,_UnavailableNodes:n[3-4] ReqNodeList=n1 ExcNodeList=n[3,5]";
        let s = slurm_fields("7", &show_job::parse(text));
        assert_eq!(s.state, "PENDING");
        assert_eq!(s.wanted, ["n1", "n3", "n4"]);
        assert_eq!(s.excluded, ["n3", "n5"]);
    }

    #[test]
    fn a_standby_that_later_started_an_attempt_is_no_spare_left() {
        let d = std::env::temp_dir().join(format!("vigil-watch-spares-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let used = d.join("used.jsonl");
        let left = d.join("left.jsonl");
        std::fs::write(
            &used,
            "{\"ts\":1,\"event\":\"standby\",\"host\":\"n3\",\"cycle\":0}\n{\"ts\":2,\"event\":\"cycle_start\",\"host\":\"n3\",\"cycle\":1,\"nproc\":1}\n",
        )
        .unwrap();
        std::fs::write(
            &left,
            "{\"ts\":1,\"event\":\"standby\",\"host\":\"n4\",\"cycle\":0}\n",
        )
        .unwrap();
        let s = spares(&[used.clone(), left]);
        assert_eq!(s.had.len(), 2);
        assert_eq!(s.left.iter().collect::<Vec<_>>(), ["n4"]);
        assert!(spares(&[used]).left.is_empty());
        let _ = std::fs::remove_dir_all(&d);
    }
}
