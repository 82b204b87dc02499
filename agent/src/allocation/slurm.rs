//! Slurm's commands as the agent runs them, their answers as far as the agent needs them, and
//! what it concludes from them (the window after Slurm's SIGTERM, whether the job is ending
//! early). Slurm's own forms (`show job` words, times, hostlists) and the blocking runner are
//! the `vigil_slurm` crate's.
//!
//! [`run_command`] must only be used where the agent's event loop is not running (before it
//! starts, after it ended): the loop reaps every child with `waitpid(-1)`, since the agent is a
//! subreaper, and would take the command's exit status from under the runner.

use std::time::{Duration, SystemTime};

pub use vigil_slurm::cmd::{run_command, Cmd, RunError};
use vigil_slurm::hostlist::{self, HostlistError};
use vigil_slurm::show_job;
use vigil_slurm::time::{
    local_to_epoch, parse_duration, parse_limit, parse_time, Civil, TimeError,
};

use super::blame::{usable_state, PartitionNode};

/// Every command the agent runs prints times as epoch seconds (no time zone to guess).
fn cmd(program: &str, args: &[&str]) -> Cmd {
    Cmd::new(program, args).with_env("SLURM_TIME_FORMAT", "%s")
}

/// `SLURM_TIME_FORMAT=%s squeue -h -j ID -o %e`: the job's end time, as epoch seconds.
pub fn squeue_end_time(job_id: &str) -> Cmd {
    cmd("squeue", &["-h", "-j", job_id, "-o", "%e"])
}

/// `SLURM_TIME_FORMAT=%s scontrol show job ID`.
pub fn show_job(job_id: &str) -> Cmd {
    cmd("scontrol", &["show", "job", job_id])
}

/// `scontrol requeue ID`.
pub fn requeue(job_id: &str) -> Cmd {
    cmd("scontrol", &["requeue", job_id])
}

/// `scontrol update JobId=ID ExcNodeList=a,b`: the list replaces the job's, so pass the union of
/// what it excluded already and the new nodes ([`merge_excluded`]).
pub fn exclude_nodes(job_id: &str, nodes: &[String]) -> Cmd {
    cmd(
        "scontrol",
        &[
            "update",
            &format!("JobId={job_id}"),
            &format!("ExcNodeList={}", nodes.join(",")),
        ],
    )
}

/// `sinfo -h -N -p PARTITION -o "%N %t"`: the partition's nodes, one a line, with their state.
pub fn sinfo_nodes(partition: &str) -> Cmd {
    cmd("sinfo", &["-h", "-N", "-p", partition, "-o", "%N %t"])
}

/// `scontrol show config`: `KillWait`.
pub fn show_config() -> Cmd {
    cmd("scontrol", &["show", "config"])
}

/// `scontrol show partition PARTITION`: `GraceTime`.
pub fn show_partition(partition: &str) -> Cmd {
    cmd("scontrol", &["show", "partition", partition])
}

/// A line of `sinfo` that is not a node and its state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("sinfo printed {0:?}, not a node and its state")]
pub struct SinfoError(pub String);

/// Parses `sinfo -h -N -o "%N %t"` (a node in several partitions is listed once per partition).
pub fn parse_sinfo_nodes(out: &str) -> Result<Vec<PartitionNode>, SinfoError> {
    let mut nodes: Vec<PartitionNode> = Vec::new();
    for line in out.lines().filter(|l| !l.trim().is_empty()) {
        let mut w = line.split_whitespace();
        let (Some(name), Some(state)) = (w.next(), w.next()) else {
            return Err(SinfoError(line.trim().to_string()));
        };
        if !nodes.iter().any(|n| n.name == name) {
            nodes.push(PartitionNode {
                name: name.to_string(),
                usable: usable_state(state),
            });
        }
    }
    Ok(nodes)
}

/// `KillWait = 30 sec` in `scontrol show config`: seconds from Slurm's SIGTERM to its SIGKILL.
pub fn parse_kill_wait(out: &str) -> Option<Duration> {
    out.lines()
        .find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == "KillWait").then(|| v.split_whitespace().next()?.parse().ok())?
        })
        .map(Duration::from_secs)
}

/// `GraceTime=10` in `scontrol show partition`: a preempted job's seconds before it is ended.
pub fn parse_grace_time(out: &str) -> Option<Duration> {
    out.split_whitespace()
        .find_map(|w| w.strip_prefix("GraceTime="))
        .and_then(|v| v.parse().ok())
        .map(Duration::from_secs)
}

/// A SIGTERM this close to the allocation's end, or later, may be the time limit's (Slurm
/// enforces limits every 30 s).
const NEAR_THE_END: Duration = Duration::from_secs(30);

/// The window vigil gives the ranks after Slurm's SIGTERM: what Slurm gives, less a fifth (1 to
/// 5 s) for vigil to record and requeue before Slurm's SIGKILL, and never more than
/// `term_timeout`. Slurm gives KillWait at the time limit and the partition's GraceTime (when set)
/// at a preemption; far from the `end` a SIGTERM cannot be the time limit's, near it or with the
/// end unknown it may be either, and the shorter is told. `None` when KillWait is not known.
pub fn signal_window(
    term_timeout: Duration,
    kill_wait: Option<Duration>,
    grace: Option<Duration>,
    end: Option<SystemTime>,
    now: SystemTime,
) -> Option<Duration> {
    let kill_wait = kill_wait?;
    let grace = grace.filter(|g| !g.is_zero());
    let far_from_end = end.is_some_and(|e| now + NEAR_THE_END < e);
    let slurm = match grace {
        Some(g) if far_from_end => g,
        Some(g) => kill_wait.min(g),
        None => kill_wait,
    };
    let margin = (slurm / 5).clamp(Duration::from_secs(1), Duration::from_secs(5));
    let told = if slurm > margin {
        slurm - margin
    } else {
        slurm / 2
    };
    Some(told.min(term_timeout))
}

/// Whether `program` is an executable file in one of `path`'s directories.
pub fn on_path(program: &str, path: Option<&str>) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.unwrap_or("")
        .split(':')
        .filter(|d| !d.is_empty())
        .any(|d| {
            std::fs::metadata(std::path::Path::new(d).join(program))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// The nodes a job already excludes followed by the new ones, without repeats.
pub fn merge_excluded(current: &[String], new: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for n in current.iter().chain(new) {
        if !out.contains(n) {
            out.push(n.clone());
        }
    }
    out
}

/// What `scontrol show job` says about the job, as far as vigil needs it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobInfo {
    pub state: Option<String>,
    pub end_time: Option<SystemTime>,
    pub time_limit: Option<Duration>,
    /// `RunTime=`: how long the job has run (in this allocation).
    pub run_time: Option<Duration>,
    /// `Requeue=1`: the job may be requeued; `Requeue=0`: it was submitted with `--no-requeue`.
    pub requeue: Option<bool>,
    pub restarts: Option<u32>,
    pub nodes: Vec<String>,
    pub excluded: Vec<String>,
    /// `Partition=`: where the job runs.
    pub partition: Option<String>,
    /// `NumNodes=`: how many nodes the job needs.
    pub num_nodes: Option<u32>,
    /// `SubmitTime=` and `StartTime=`, for the ledger's queue wait (docs/goodput.md). Only
    /// reported, so a value that is not a time reads as unknown rather than failing the answer.
    pub submit_time: Option<SystemTime>,
    pub start_time: Option<SystemTime>,
}

/// Whether Slurm is ending the job before its time limit: cancelled (`scancel`), or preempted past
/// its grace (Slurm then requeues it itself). `scancel` shows `JobState=COMPLETING`, not
/// `CANCELLED`, while the job's processes are still being signalled, which is when the agent asks;
/// a job killed at its time limit is `COMPLETING` too, but has run its limit. vigil must not requeue
/// a job ending early: a person (or Slurm) ended it. One Slurm requeued itself looks the same and
/// is told apart by [`requeued_by_slurm`].
pub fn ending_early(info: &JobInfo) -> bool {
    /// Slurm enforces limits every 30 s and a job may be stopped a little before the limit.
    const SLACK: Duration = Duration::from_secs(5);
    match info.state.as_deref() {
        Some(s) if s.starts_with("CANCELLED") => true,
        Some("COMPLETING") => match (info.run_time, info.time_limit) {
            (Some(run), Some(limit)) => run + SLACK < limit,
            // No limit: nothing but a cancel or a preemption ends it.
            (_, None) => true,
            (None, Some(_)) => false,
        },
        _ => false,
    }
}

/// Whether Slurm has requeued the job itself (`scontrol requeue`, a preemption with
/// `PreemptMode=REQUEUE`): its `Restarts=` already counts a start after this allocation's
/// `SLURM_RESTART_COUNT`, and its `RunTime=` is back at 0. Such a job shows `COMPLETING` before
/// its time limit, as a cancelled one does ([`ending_early`]), but it runs again: it was not
/// ended for good. The run time guards a `SLURM_RESTART_COUNT` lost on the way (a container that
/// drops it reads 0): a job killed at its limit or cancelled has run, and stays what it was.
pub fn requeued_by_slurm(info: &JobInfo, restart_count: u32) -> bool {
    const JUST_STARTED: Duration = Duration::from_secs(5);
    info.restarts.is_some_and(|r| r > restart_count)
        && info.state.as_deref() != Some("RUNNING")
        && info.run_time.is_some_and(|t| t < JUST_STARTED)
}

/// Why `scontrol show job` gave no [`JobInfo`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShowJobError {
    #[error("scontrol show job did not describe a job (it printed {0:?})")]
    NotAJob(String),
    #[error("{key}={list}: {source}")]
    Hostlist {
        key: &'static str,
        list: String,
        source: HostlistError,
    },
    #[error(transparent)]
    Time(#[from] TimeError),
}

/// Parses `scontrol show job ID` (`Key=Value` words; `EndTime=` as epoch seconds or local time).
pub fn parse_show_job(out: &str) -> Result<JobInfo, ShowJobError> {
    parse_show_job_with(out, &local_to_epoch)
}

pub fn parse_show_job_with(
    out: &str,
    local: &dyn Fn(Civil) -> Option<i64>,
) -> Result<JobInfo, ShowJobError> {
    let fields = show_job::parse(out);
    let field = |key: &str| fields.get(key).map(String::as_str);
    if field("JobId").is_none() {
        let first = out.lines().next().unwrap_or("").trim();
        return Err(ShowJobError::NotAJob(first.to_string()));
    }
    let hosts = |key: &'static str| -> Result<Vec<String>, ShowJobError> {
        match field(key) {
            None => Ok(Vec::new()),
            Some(list) if show_job::unset(list) => Ok(Vec::new()),
            Some(list) => hostlist::expand(list).map_err(|source| ShowJobError::Hostlist {
                key,
                list: list.to_string(),
                source,
            }),
        }
    };
    Ok(JobInfo {
        state: field("JobState").map(str::to_string),
        end_time: match field("EndTime") {
            None => None,
            Some(t) => parse_time(t, local)?,
        },
        time_limit: field("TimeLimit").and_then(parse_limit),
        run_time: field("RunTime").and_then(|t| parse_duration(t).ok()),
        requeue: match field("Requeue") {
            Some("1") => Some(true),
            Some("0") => Some(false),
            _ => None,
        },
        restarts: field("Restarts").and_then(|r| r.parse().ok()),
        nodes: hosts("NodeList")?,
        excluded: hosts("ExcNodeList")?,
        partition: field("Partition")
            .filter(|p| !p.is_empty() && *p != "(null)")
            .map(str::to_string),
        // `NumNodes=2` or, while pending, `NumNodes=2-2`.
        num_nodes: field("NumNodes").and_then(|n| n.split('-').next()?.parse().ok()),
        submit_time: field("SubmitTime").and_then(|t| parse_time(t, local).ok().flatten()),
        start_time: field("StartTime").and_then(|t| parse_time(t, local).ok().flatten()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;
    use vigil_slurm::time::civil_to_epoch;

    const SHOW_EPOCH: &str = "JobId=75 JobName=pretrain
   UserId=root(0) GroupId=root(0) MCS_label=N/A
   Priority=4294901757 Nice=0 Account=(null) QOS=(null)
   JobState=RUNNING Reason=None Dependency=(null)
   Requeue=1 Restarts=2 BatchFlag=1 Reboot=0 ExitCode=0:0
   RunTime=00:00:05 TimeLimit=00:10:00 TimeMin=N/A
   SubmitTime=1767225000 EligibleTime=1767225000
   StartTime=1767225600 EndTime=1767226200 Deadline=N/A
   Partition=debug AllocNode:Sid=host:123
   ReqNodeList=(null) ExcNodeList=n[3-4]
   NodeList=n[1-2]
   BatchHost=n1
   NumNodes=2 NumCPUs=2 NumTasks=2 CPUs/Task=1 ReqB:S:C:T=0:0:*:*
";

    fn utc(c: Civil) -> Option<i64> {
        Some(civil_to_epoch(c))
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn show_job_gives_end_limit_requeue_restarts_and_nodes() {
        let j = parse_show_job_with(SHOW_EPOCH, &utc).unwrap();
        assert_eq!(
            j,
            JobInfo {
                state: Some("RUNNING".into()),
                end_time: Some(UNIX_EPOCH + Duration::from_secs(1_767_226_200)),
                time_limit: Some(Duration::from_secs(600)),
                run_time: Some(Duration::from_secs(5)),
                requeue: Some(true),
                restarts: Some(2),
                nodes: names(&["n1", "n2"]),
                excluded: names(&["n3", "n4"]),
                partition: Some("debug".into()),
                num_nodes: Some(2),
                submit_time: Some(UNIX_EPOCH + Duration::from_secs(1_767_225_000)),
                start_time: Some(UNIX_EPOCH + Duration::from_secs(1_767_225_600)),
            }
        );
    }

    #[test]
    fn submit_and_start_times_in_local_time_and_unknown_ones_are_only_unknown() {
        let text = SHOW_EPOCH
            .replace("SubmitTime=1767225000", "SubmitTime=2026-01-01T00:00:00")
            .replace("StartTime=1767225600", "StartTime=Unknown");
        let j = parse_show_job_with(&text, &utc).unwrap();
        assert_eq!(
            j.submit_time,
            Some(UNIX_EPOCH + Duration::from_secs(1_767_225_600))
        );
        assert_eq!(j.start_time, None);
        let bad = SHOW_EPOCH.replace("SubmitTime=1767225000", "SubmitTime=yesterday");
        let j = parse_show_job_with(&bad, &utc).unwrap();
        assert_eq!((j.submit_time, j.end_time.is_some()), (None, true));
    }

    #[test]
    fn a_job_completing_before_its_time_limit_is_ending_early() {
        let job = |state: &str, run: &str, limit: &str| {
            let text = SHOW_EPOCH
                .replace("JobState=RUNNING", &format!("JobState={state}"))
                .replace("RunTime=00:00:05", &format!("RunTime={run}"))
                .replace("TimeLimit=00:10:00", &format!("TimeLimit={limit}"));
            parse_show_job_with(&text, &utc).unwrap()
        };
        // scancel, seen on the test cluster: COMPLETING while the steps are being signalled.
        assert!(ending_early(&job("COMPLETING", "00:00:04", "00:10:00")));
        assert!(ending_early(&job("COMPLETING", "1-00:00:04", "UNLIMITED")));
        assert!(ending_early(&job("CANCELLED", "00:00:04", "00:10:00")));
        // Killed at its time limit: requeued (vigil checkpoints first when it can).
        assert!(!ending_early(&job("COMPLETING", "00:10:00", "00:10:00")));
        assert!(!ending_early(&job("COMPLETING", "00:09:57", "00:10:00")));
        // Running: a preemption's grace, `scancel --signal`, vigil's own stop ahead of the end.
        assert!(!ending_early(&job("RUNNING", "00:00:04", "00:10:00")));
    }

    #[test]
    fn a_job_whose_restarts_count_past_this_allocation_was_requeued_by_slurm() {
        // Seen on the test cluster at once after `scontrol requeue` of a job in its first
        // allocation (SLURM_RESTART_COUNT unset): COMPLETING, RunTime=00:00:00, Restarts=1.
        let text = SHOW_EPOCH
            .replace("JobState=RUNNING", "JobState=COMPLETING")
            .replace("RunTime=00:00:05", "RunTime=00:00:00")
            .replace("Restarts=2", "Restarts=1");
        let j = parse_show_job_with(&text, &utc).unwrap();
        assert!(ending_early(&j) && requeued_by_slurm(&j, 0));
        assert!(
            !requeued_by_slurm(&j, 1),
            "counted in this allocation already"
        );
        let running = parse_show_job_with(SHOW_EPOCH, &utc).unwrap(); // Restarts=2
        assert!(!requeued_by_slurm(&running, 2));
        let unknown = JobInfo::default();
        assert!(!requeued_by_slurm(&unknown, 0));
        // A SLURM_RESTART_COUNT lost on the way reads 0: a job of a later allocation killed at its
        // limit, or cancelled, has run, and is not taken for a requeue.
        let ran = |run: &str| {
            let text = SHOW_EPOCH
                .replace("JobState=RUNNING", "JobState=COMPLETING")
                .replace("RunTime=00:00:05", &format!("RunTime={run}"));
            parse_show_job_with(&text, &utc).unwrap()
        };
        assert!(!requeued_by_slurm(&ran("00:10:00"), 0));
        assert!(!requeued_by_slurm(&ran("00:01:00"), 0));
        assert!(requeued_by_slurm(&ran("00:00:00"), 0));
    }

    #[test]
    fn show_job_in_local_time_with_no_requeue_and_no_limit() {
        let text = SHOW_EPOCH
            .replace("EndTime=1767226200", "EndTime=2026-01-01T00:10:00")
            .replace("Requeue=1", "Requeue=0")
            .replace("TimeLimit=00:10:00", "TimeLimit=UNLIMITED")
            .replace("ExcNodeList=n[3-4]", "ExcNodeList=(null)");
        let j = parse_show_job_with(&text, &utc).unwrap();
        assert_eq!(
            j.end_time,
            Some(UNIX_EPOCH + Duration::from_secs(1_767_226_200))
        );
        assert_eq!(j.requeue, Some(false));
        assert_eq!(j.time_limit, None);
        assert_eq!(j.excluded, Vec::<String>::new());
        // `ReqNodeList=` is not `NodeList=`.
        assert_eq!(j.nodes, names(&["n1", "n2"]));
        let unknown = SHOW_EPOCH.replace("EndTime=1767226200", "EndTime=Unknown");
        assert_eq!(parse_show_job_with(&unknown, &utc).unwrap().end_time, None);
    }

    #[test]
    fn values_with_spaces_and_a_second_record_leave_the_fields_alone() {
        let text = SHOW_EPOCH
            .replace("JobName=pretrain", "JobName=pre train run")
            .replace("Reason=None", "Reason=ReqNodeNotAvail, UnavailableNodes:n3")
            + "\nJobId=76 JobName=second\n   JobState=PENDING NodeList=(null)\n";
        let j = parse_show_job_with(&text, &utc).unwrap();
        assert_eq!(j, parse_show_job_with(SHOW_EPOCH, &utc).unwrap());
    }

    #[test]
    fn show_job_errors_are_one_line_and_name_what_was_wrong() {
        let e = parse_show_job_with("slurm_load_jobs error: Invalid job id specified\n", &utc)
            .unwrap_err()
            .to_string();
        assert!(e.contains("Invalid job id"), "{e}");
        let e = parse_show_job_with(&SHOW_EPOCH.replace("n[1-2]", "n[1-"), &utc)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("NodeList=n[1-"), "{e}");
        let e = parse_show_job_with(
            &SHOW_EPOCH.replace("EndTime=1767226200", "EndTime=soon"),
            &utc,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("\"soon\""), "{e}");
    }

    #[test]
    fn command_lines_as_data() {
        assert_eq!(
            squeue_end_time("75").to_string(),
            "SLURM_TIME_FORMAT=%s squeue -h -j 75 -o %e"
        );
        assert_eq!(show_job("75").args, names(&["show", "job", "75"]));
        assert_eq!(requeue("75").args, names(&["requeue", "75"]));
        let nodes = merge_excluded(&names(&["n3", "n4"]), &names(&["n4", "n1"]));
        assert_eq!(nodes, names(&["n3", "n4", "n1"]));
        assert_eq!(
            exclude_nodes("75", &nodes).args,
            names(&["update", "JobId=75", "ExcNodeList=n3,n4,n1"])
        );
    }

    #[test]
    fn sinfo_config_and_partition_answers() {
        let nodes = parse_sinfo_nodes("n1 alloc\nn2 idle*\nn3 drain\nn1 alloc\n").unwrap();
        let got: Vec<(&str, bool)> = nodes.iter().map(|n| (n.name.as_str(), n.usable)).collect();
        assert_eq!(got, vec![("n1", true), ("n2", true), ("n3", false)]);
        assert!(parse_sinfo_nodes("n1\n")
            .unwrap_err()
            .to_string()
            .contains("\"n1\""));
        assert_eq!(
            sinfo_nodes("debug").args,
            names(&["-h", "-N", "-p", "debug", "-o", "%N %t"])
        );
        let config = "JobCompType             = jobcomp/none\nKillWait                = 5 sec\nKillOnBadExit           = 0\n";
        assert_eq!(parse_kill_wait(config), Some(Duration::from_secs(5)));
        assert_eq!(parse_kill_wait("KillOnBadExit = 0\n"), None);
        let part = "PartitionName=debug\n   AllowGroups=ALL AllowAccounts=ALL\n   DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=10 Hidden=NO\n";
        assert_eq!(parse_grace_time(part), Some(Duration::from_secs(10)));
        assert_eq!(parse_grace_time("PartitionName=x\n"), None);
    }

    #[test]
    fn the_window_after_slurms_sigterm_is_what_slurm_gives_less_vigils_own() {
        let s = Duration::from_secs;
        let now = UNIX_EPOCH + s(1_000_000);
        let w = |term: u64, kw: Option<u64>, grace: Option<u64>, end: Option<SystemTime>| {
            signal_window(s(term), kw.map(s), grace.map(s), end, now)
        };
        // The field run: KillWait 10 s, no grace: 8 s, not --term-timeout's 30.
        assert_eq!(w(30, Some(10), Some(0), None), Some(s(8)));
        // Far from the end only a preemption (GraceTime) or scancel --signal sends SIGTERM.
        let far = Some(now + s(3600));
        assert_eq!(w(30, Some(5), Some(20), far), Some(s(16)));
        assert_eq!(w(30, Some(10), None, far), Some(s(8)));
        // Near the end, past it, or with the end unknown: the time limit's KillWait, or a
        // shorter grace.
        for end in [Some(now + s(10)), Some(now - s(10)), None] {
            assert_eq!(w(30, Some(5), Some(20), end), Some(s(4)), "{end:?}");
            assert_eq!(w(30, Some(10), Some(5), end), Some(s(4)), "{end:?}");
        }
        // --term-timeout below Slurm's window stays; a long KillWait loses at most 5 s.
        assert_eq!(w(3, Some(10), None, None), Some(s(3)));
        assert_eq!(w(300, Some(120), None, None), Some(s(115)));
        assert_eq!(w(30, Some(1), None, None), Some(Duration::from_millis(500)));
        // Unknown KillWait: nothing to say.
        assert_eq!(w(30, None, Some(10), far), None);
    }

    #[test]
    fn programs_are_found_on_path_only_where_they_are() {
        assert!(on_path("sh", Some("/nonexistent:/bin:/usr/bin")));
        assert!(!on_path("sh", Some("/nonexistent")));
        assert!(!on_path("sh", Some("")));
        assert!(!on_path("sh", None));
    }
}
