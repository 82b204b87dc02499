//! The Slurm edge: sinfo, sbatch, squeue, scontrol and scancel, run as the user's own client
//! commands (with the caller's environment, `SLURM_CONF` included). Parsing is pure.

use std::process::Output;

use vigil_slurm::cmd::Cmd;
pub use vigil_slurm::show_job::{parse as parse_show_job, Fields};
pub use vigil_slurm::time::{format_duration as slurm_time, parse_duration};

use crate::{err, Error};

fn one_line(s: &[u8]) -> String {
    String::from_utf8_lossy(s)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// Runs one Slurm command (no timeout: the user is there to interrupt it); a missing command is
/// an error that says where to run vigil.
pub fn run(cmd: &str, args: &[&str]) -> Result<Output, Error> {
    Cmd::new(cmd, args).command().output().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            Error(format!(
                "`{cmd}` is not on PATH: this needs Slurm's client commands; run it on a login node of the cluster"
            ))
        } else {
            Error(format!("cannot run `{cmd}`: {e}"))
        }
    })
}

fn checked(cmd: &str, args: &[&str]) -> Result<String, Error> {
    let out = run(cmd, args)?;
    if !out.status.success() {
        return err(format!(
            "`{cmd} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            one_line(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The partitions `sinfo` lists, in its order, each once.
pub fn partitions() -> Result<Vec<String>, Error> {
    Ok(parse_partitions(&checked("sinfo", &["-h", "-o", "%R"])?))
}

pub fn parse_partitions(out: &str) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for l in out.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if !v.iter().any(|p| p == l) {
            v.push(l.to_string());
        }
    }
    v
}

/// Submits a batch script; returns the job id (`--parsable` prints `id` or `id;cluster`).
pub fn submit(script: &std::path::Path) -> Result<String, Error> {
    let path = script.display().to_string();
    let out = run("sbatch", &["--parsable", &path])?;
    if !out.status.success() {
        return err(format!("sbatch refused the job: {}", one_line(&out.stderr)));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let id = text.trim().split(';').next().unwrap_or("").to_string();
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
        return err(format!(
            "sbatch printed no job id ({:?}); check `squeue --me`",
            text.trim()
        ));
    }
    Ok(id)
}

/// `scontrol show job -o ID` as fields; None when Slurm no longer knows the job (without
/// accounting, MinJobAge after it ended).
pub fn show_job(id: &str) -> Result<Option<Fields>, Error> {
    let out = run("scontrol", &["show", "job", "-o", id])?;
    if !out.status.success() {
        return Ok(None);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text.lines().next().map(parse_show_job))
}

/// Job id to state, as squeue names them.
pub type JobStates = std::collections::BTreeMap<String, String>;

/// Every job squeue knows, id to state (`squeue -t all`).
pub fn states() -> Result<JobStates, Error> {
    let out = checked("squeue", &["-h", "-t", "all", "-o", "%i|%T"])?;
    Ok(out
        .lines()
        .filter_map(|l| l.trim().split_once('|'))
        .map(|(i, s)| (i.to_string(), s.to_string()))
        .collect())
}

/// The job's state as squeue says it, None when unknown.
pub fn state(id: &str) -> Result<Option<String>, Error> {
    Ok(show_job(id)?.and_then(|f| f.get("JobState").cloned()))
}

/// Cancels a job for good. vigil's agent requeues a job its ranks stopped on a SIGTERM (that
/// is how it lives through time limits and preemptions), and scancel's SIGTERM looks the same,
/// so the job is first marked not requeueable (`Requeue=0`, which vigil obeys and
/// `scontrol requeue` refuses), then cancelled.
pub fn cancel(id: &str) -> Result<(), Error> {
    checked("scontrol", &["update", &format!("JobId={id}"), "Requeue=0"])?;
    checked("scancel", &[id]).map(|_| ())
}

/// Slurm's states after which a job runs no more.
pub fn is_terminal(state: &str) -> bool {
    matches!(
        state,
        "COMPLETED"
            | "FAILED"
            | "CANCELLED"
            | "TIMEOUT"
            | "NODE_FAIL"
            | "OUT_OF_MEMORY"
            | "PREEMPTED"
            | "BOOT_FAIL"
            | "DEADLINE"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_once_each() {
        assert_eq!(
            parse_partitions("debug\nlow\ndebug\n\nhigh\n"),
            ["debug", "low", "high"]
        );
    }

    #[test]
    fn durations_in_slurm_form() {
        let secs = |t: &str| parse_duration(t).unwrap().as_secs();
        assert_eq!(slurm_time(secs("4h")), "04:00:00");
        assert_eq!(slurm_time(secs("90m")), "01:30:00");
        assert_eq!(slurm_time(secs("1h30m")), "01:30:00");
        assert_eq!(slurm_time(secs("1d")), "1-00:00:00");
        assert_eq!(slurm_time(secs("1-2:03")), "1-02:03:00");
        assert_eq!(slurm_time(secs("04:00:00")), "04:00:00");
        assert_eq!(slurm_time(secs("90")), "01:30:00");
        assert!(parse_duration("soon").is_err());
    }
}
