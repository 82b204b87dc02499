//! The Slurm edge: sinfo, sbatch, squeue, scontrol and scancel, run as the user's own client
//! commands (with the caller's environment, `SLURM_CONF` included). Parsing is pure.

use std::collections::BTreeMap;
use std::process::{Command, Output};
use std::time::Duration;

use crate::{err, Error};

/// Slurm's duration forms (`M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S`) or a number with
/// units (`90s`, `45m`, `2h`, `1d`, `1h30m`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    if s.is_empty() {
        return Err("it is empty".into());
    }
    if s.starts_with('-') {
        return Err("it is negative".into());
    }
    if s.bytes().any(|b| b.is_ascii_alphabetic()) {
        return humantime::parse_duration(s).map_err(|e| format!("{e}"));
    }
    let num = |t: &str| -> Result<u64, String> {
        if t.is_empty() || !t.bytes().all(|c| c.is_ascii_digit()) {
            return Err(format!("{t:?} is not a whole number"));
        }
        t.parse::<u64>().map_err(|_| format!("{t:?} is too large"))
    };
    let (days, clock) = match s.split_once('-') {
        Some((d, rest)) => (Some(num(d)?), rest),
        None => (None, s),
    };
    let parts = clock
        .split(':')
        .map(num)
        .collect::<Result<Vec<u64>, String>>()?;
    let (h, m, sec) = match (days.is_some(), parts.as_slice()) {
        (false, [m]) => (0, *m, 0),
        (false, [m, s]) => (0, *m, *s),
        (false, [h, m, s]) | (true, [h, m, s]) => (*h, *m, *s),
        (true, [h]) => (*h, 0, 0),
        (true, [h, m]) => (*h, *m, 0),
        _ => return Err("it has too many fields".into()),
    };
    let total = days
        .unwrap_or(0)
        .checked_mul(86_400)
        .and_then(|d| d.checked_add(h.checked_mul(3600)?))
        .and_then(|t| t.checked_add(m.checked_mul(60)?))
        .and_then(|t| t.checked_add(sec))
        .ok_or("it is too large")?;
    Ok(Duration::from_secs(total))
}

/// A duration in Slurm's `--time` form: `HH:MM:SS`, or `D-HH:MM:SS` from a day on.
pub fn slurm_time(secs: u64) -> String {
    let (d, r) = (secs / 86_400, secs % 86_400);
    let hms = format!("{:02}:{:02}:{:02}", r / 3600, r % 3600 / 60, r % 60);
    if d > 0 {
        format!("{d}-{hms}")
    } else {
        hms
    }
}

fn one_line(s: &[u8]) -> String {
    String::from_utf8_lossy(s)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// Runs one Slurm command; a missing command is an error that says where to run vigil.
pub fn run(cmd: &str, args: &[&str]) -> Result<Output, Error> {
    Command::new(cmd).args(args).output().map_err(|e| {
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
pub fn show_job(id: &str) -> Result<Option<BTreeMap<String, String>>, Error> {
    let out = run("scontrol", &["show", "job", "-o", id])?;
    if !out.status.success() {
        return Ok(None);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text.lines().next().map(parse_show_job))
}

/// One line of `scontrol show job -o`: `Key=Value` pairs; a token without `=` belongs to the
/// value before it (`Reason=...`, `Command=...` may hold spaces).
pub fn parse_show_job(line: &str) -> BTreeMap<String, String> {
    let mut fields = BTreeMap::new();
    let mut key: Option<String> = None;
    for tok in line.split(' ').filter(|t| !t.is_empty()) {
        match tok.split_once('=') {
            Some((k, v)) if !k.is_empty() => {
                fields.insert(k.to_string(), v.to_string());
                key = Some(k.to_string());
            }
            _ => {
                if let Some(k) = &key {
                    if let Some(v) = fields.get_mut(k) {
                        v.push(' ');
                        v.push_str(tok);
                    }
                }
            }
        }
    }
    fields
}

/// Every job squeue knows, id to state (`squeue -t all`).
pub fn states() -> Result<BTreeMap<String, String>, Error> {
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
    fn show_job_line() {
        let f = parse_show_job("JobId=7 JobName=a b=c Reason=None Command=/x/y z JobState=RUNNING");
        assert_eq!(f["JobId"], "7");
        assert_eq!(f["Command"], "/x/y z");
        assert_eq!(f["JobState"], "RUNNING");
    }

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
