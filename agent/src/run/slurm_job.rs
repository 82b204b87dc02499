//! What an agent learns from its Slurm job and does to it, where Slurm's commands may be missing
//! (a pyxis/enroot container): the window after Slurm's SIGTERM, the exclusions the partition can
//! afford, and the requeue, by `scontrol` or, where it cannot run, by the batch script
//! ([`REQUEUE_FILE_ENV`]). Blocking: only before the event loop starts or after it ended
//! (allocation::slurm's module doc).

use std::path::Path;
use std::time::{Duration, SystemTime};

use super::report::console_note;
use crate::allocation::{blame, policy, slurm};
use crate::cli::config::LaunchConfig;

/// A Slurm command that takes longer than this is given up.
const SLURM_TIMEOUT: Duration = Duration::from_secs(20);

/// Set by the batch script: the file node rank 0 writes `requeue` into when the job is to be
/// requeued and vigil could not run `scontrol requeue` itself; the script requeues after `srun`.
pub const REQUEUE_FILE_ENV: &str = "VIGIL_REQUEUE_FILE";
/// Set by the batch script where vigil cannot run `scontrol`: Slurm's `KillWait` in seconds.
pub const KILL_WAIT_ENV: &str = "VIGIL_SLURM_KILL_WAIT";
/// As [`KILL_WAIT_ENV`], the partition's `GraceTime` in seconds.
pub const GRACE_TIME_ENV: &str = "VIGIL_SLURM_GRACE_TIME";

fn env(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.trim().is_empty())
}

/// Whether Slurm's client is here to be run (inside a container it usually is not).
pub(super) fn commands_here() -> bool {
    slurm::on_path("scontrol", env("PATH").as_deref())
}

/// A batch script's variable that should hold whole seconds and does not.
#[derive(Debug, thiserror::Error)]
#[error("{var}={value:?} is not a whole number of seconds")]
struct NotSeconds {
    var: String,
    value: String,
}

fn secs_env(k: &str) -> Result<Option<Duration>, NotSeconds> {
    match env(k) {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse::<u64>()
            .map(|s| Some(Duration::from_secs(s)))
            .map_err(|_| NotSeconds {
                var: k.to_string(),
                value: v,
            }),
    }
}

/// The ranks' window after a SIGTERM to the agent: under Slurm what Slurm gives
/// (`slurm::signal_window`), else `--term-timeout`.
#[derive(Debug, Clone)]
pub(super) struct SignalWindow {
    term: Duration,
    kill_wait: Option<Duration>,
    grace: Option<Duration>,
}

impl SignalWindow {
    /// The window for a SIGTERM that comes `now`, the allocation ending at `end`.
    pub(super) fn at(&self, end: Option<SystemTime>, now: SystemTime) -> Duration {
        slurm::signal_window(self.term, self.kill_wait, self.grace, end, now).unwrap_or(self.term)
    }
}

/// Reads Slurm's KillWait and the partition's GraceTime, from the batch script's variables or
/// `scontrol`. Node rank 0 says once what it could not learn, and, inside a container, what it
/// leaves to the batch script.
pub(super) fn signal_window(cfg: &LaunchConfig) -> SignalWindow {
    let term = cfg.term_timeout;
    if cfg.allocation.slurm_job_id.is_none() {
        return SignalWindow {
            term,
            kill_wait: None,
            grace: None,
        };
    }
    let here = commands_here();
    let mut notes: Vec<String> = Vec::new();
    let mut read =
        |var: &str, what: &str, cmd: Option<slurm::Cmd>, parse: fn(&str) -> Option<Duration>| {
            match secs_env(var) {
                Ok(Some(d)) => return Some((d, var.to_string())),
                Ok(None) => {}
                Err(e) => notes.push(e.to_string()),
            }
            let cmd = cmd.filter(|_| here)?;
            match slurm::run_command(&cmd, SLURM_TIMEOUT) {
                Ok(out) => parse(&out).map(|d| (d, format!("`{}`", cmd.args.join(" ")))),
                Err(e) => {
                    notes.push(format!("cannot read Slurm's {what} ({e})"));
                    None
                }
            }
        };
    let kill_wait = read(
        KILL_WAIT_ENV,
        "KillWait",
        Some(slurm::show_config()),
        slurm::parse_kill_wait,
    );
    let partition = env("SLURM_JOB_PARTITION");
    let grace = read(
        GRACE_TIME_ENV,
        "GraceTime",
        partition.as_deref().map(slurm::show_partition),
        slurm::parse_grace_time,
    );
    let window = SignalWindow {
        term,
        kill_wait: kill_wait.as_ref().map(|k| k.0),
        grace: grace.as_ref().map(|g| g.0),
    };
    if cfg.node_rank == 0 {
        let now = SystemTime::now();
        let at_limit = window.at(Some(now), now);
        let far = window.at(Some(now + Duration::from_secs(86_400)), now);
        let told = match &kill_wait {
            Some((kw, from)) => format!(
                "after Slurm's SIGTERM the ranks get {:.1}s at the time limit (KillWait {}s from {from}){}",
                at_limit.as_secs_f64(),
                kw.as_secs(),
                grace
                    .as_ref()
                    .filter(|g| !g.0.is_zero())
                    .map(|(g, f)| format!(
                        ", {:.1}s at a preemption (GraceTime {}s from {f})",
                        far.as_secs_f64(),
                        g.as_secs()
                    ))
                    .unwrap_or_default()
            ),
            None => format!(
                "after Slurm's SIGTERM the ranks get --term-timeout {:.0}s, assuming Slurm's KillWait is no shorter ({KILL_WAIT_ENV} tells it)",
                term.as_secs_f64()
            ),
        };
        if !here {
            let end = if cfg.allocation.end_from_flags {
                "the end time is --end-time/--time-limit's"
            } else if matches!(cfg.allocation.end, crate::cli::config::EndSpec::At(_)) {
                "the end time is SLURM_JOB_END_TIME's"
            } else {
                "no stop ahead of the time limit (the batch script can pass SLURM_JOB_END_TIME)"
            };
            let requeue = if env(REQUEUE_FILE_ENV).is_some() {
                format!("a requeue is left to the batch script ({REQUEUE_FILE_ENV})")
            } else {
                format!("the job cannot be requeued from here unless the batch script does it ({REQUEUE_FILE_ENV})")
            };
            notes.push(format!(
                "Slurm's commands are not on PATH here (inside a container?): {end}; {told}; {requeue}; no node is excluded from here (docs/launch.md)"
            ));
        } else if kill_wait.is_none() {
            notes.push(told);
        }
        for n in notes {
            console_note(&n);
        }
    }
    window
}

/// The nodes the next allocation will avoid, of those `decision` wants: only under Slurm with
/// its commands here, and only while the partition keeps enough usable nodes for the job (asked
/// of `sinfo`). Says what is not excluded and why.
pub(super) fn exclusions(
    cfg: &LaunchConfig,
    decision: &policy::Decision,
    info: Option<&slurm::JobInfo>,
) -> Vec<String> {
    let wanted = decision.exclude();
    if wanted.is_empty() || cfg.allocation.slurm_job_id.is_none() {
        return wanted.to_vec();
    }
    let list = wanted.join(",");
    if !commands_here() {
        console_note(&format!(
            "{list} not kept out of the next allocation: Slurm's commands are not on PATH here (the batch script only requeues)"
        ));
        return Vec::new();
    }
    let Some(partition) = info
        .and_then(|i| i.partition.clone())
        .or_else(|| env("SLURM_JOB_PARTITION"))
    else {
        console_note(&format!(
            "{list} not kept out of the next allocation: the job's partition is not known, so whether it could still run is not either"
        ));
        return Vec::new();
    };
    let needed = info
        .and_then(|i| i.num_nodes)
        .or_else(|| env("SLURM_JOB_NUM_NODES").and_then(|n| n.trim().parse().ok()))
        .unwrap_or(cfg.nnodes);
    let nodes = match slurm::run_command(&slurm::sinfo_nodes(&partition), SLURM_TIMEOUT)
        .map_err(|e| e.to_string())
        .and_then(|out| slurm::parse_sinfo_nodes(&out).map_err(|e| e.to_string()))
    {
        Ok(n) => n,
        Err(e) => {
            console_note(&format!(
                "{list} not kept out of the next allocation: cannot ask whether partition {partition} could still run the job without them ({e})"
            ));
            return Vec::new();
        }
    };
    let already = info.map(|i| i.excluded.clone()).unwrap_or_default();
    let capped = blame::cap_to_partition(&already, wanted, &nodes, needed);
    if !capped.kept.is_empty() {
        console_note(&format!(
            "{} not kept out of the next allocation: partition {partition} would have fewer than the {needed} usable node(s) the job needs without them (sinfo)",
            capped.kept.join(",")
        ));
    }
    capped.excluded
}

/// Node rank 0 carries out a requeue: `scontrol requeue`, then the exclusions; where `scontrol`
/// cannot run, the batch script's requeue file.
pub(super) fn requeue(
    id: &str,
    why: &str,
    exclude: &[String],
    info: Option<&slurm::JobInfo>,
    already: bool,
) {
    let here = commands_here();
    // Slurm refuses ExcNodeList on a running job: requeue first (the job is then COMPLETING and
    // takes the update), and the update ignores the SIGTERM the requeue sends to every process
    // of the job (allocation::slurm::run_command).
    let failed = if already {
        console_note(&format!("Slurm job {id} is requeued: {why}"));
        None
    } else if here {
        match slurm::run_command(&slurm::requeue(id), SLURM_TIMEOUT) {
            Ok(_) => {
                console_note(&format!("requeued Slurm job {id}: {why}"));
                None
            }
            Err(err) => Some(err.to_string()),
        }
    } else {
        Some("scontrol is not on PATH here".to_string())
    };
    if let Some(err) = failed {
        match env(REQUEUE_FILE_ENV) {
            Some(file) => match write_requeue_file(Path::new(&file)) {
                Ok(()) => console_note(&format!(
                    "the batch script requeues Slurm job {id} ({err}; {REQUEUE_FILE_ENV} written): {why}"
                )),
                Err(e) => console_note(&format!(
                    "could not requeue Slurm job {id} ({err}) nor write {file} ({e}); requeue it by hand to go on"
                )),
            },
            None => console_note(&format!(
                "could not requeue Slurm job {id} ({err}); requeue it by hand to go on, or let the batch script do it ({REQUEUE_FILE_ENV}, docs/launch.md)"
            )),
        }
        return;
    }
    if !exclude.is_empty() {
        let current = info.map(|i| i.excluded.clone()).unwrap_or_default();
        let all = slurm::merge_excluded(&current, exclude);
        match slurm::run_command(&slurm::exclude_nodes(id, &all), SLURM_TIMEOUT) {
            Ok(_) => console_note(&format!("the next allocation avoids {}", all.join(","))),
            Err(err) => console_note(&format!(
                "cannot keep {} out of the next allocation: {err}",
                all.join(",")
            )),
        }
    }
}

fn write_requeue_file(path: &Path) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, "requeue\n")
}
