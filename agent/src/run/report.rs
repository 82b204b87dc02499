//! All text the agent prints about the job. The reporter is pure: it turns an event-log record
//! (or the agent's outcome, or a capture's report) into console text, from what the record
//! carries and the few facts of this node that never change; the event loop only writes it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::output::{self, ConsoleStream};
use super::stacks::StackReport;
use crate::allocation::ledger::Promotion;
use crate::cli::config::LaunchConfig;
use crate::supervise::monitor::Timeouts;
use crate::supervise::{Hang, JobEnd, Outcome, Record, StopReason};
use crate::values::signal_name;

pub(super) fn console_note(msg: &str) {
    output::note(msg);
}

pub(super) fn note_refused(n: u64) {
    console_note(&format!(
        "refused {n} more connection(s) on the ranks' socket (each is in the event log)"
    ));
}

/// A line for the console's stderr (never blocks: see `output`).
pub(super) fn console_err(line: String) {
    output::console_text(ConsoleStream::Stderr, &(line + "\n"));
}

/// Where the logs of one rank of one attempt are.
pub(super) fn attempt_dir(run_dir: &Path, attempt: u32, local_rank: u32) -> PathBuf {
    run_dir
        .join(format!("attempt_{attempt}"))
        .join(local_rank.to_string())
}

pub(super) fn describe_timeouts(t: &Timeouts) -> String {
    let f =
        |d: Option<Duration>| d.map_or("off".to_string(), |d| format!("{:.2}s", d.as_secs_f64()));
    let mut s = format!(
        "initial {}, heartbeat {}, out-of-section {}",
        f(t.initial),
        f(t.heartbeat),
        f(t.out_of_section)
    );
    for (k, v) in &t.sections {
        s.push_str(&format!(", section {k} {:.2}s", v.as_secs_f64()));
    }
    if let Some(w) = t.warmup {
        s.push_str(&format!(", warmup {:.2}s", w.as_secs_f64()));
    }
    s
}

/// "stopping 4 rank(s) after a rank failed: ...": who gets which signal. Ranks that hold the
/// signal for `vigil.should_stop` (`killed` of them) get SIGKILL at once in a stop that saves
/// nothing.
fn stop_line(why: &str, signal: i32, grace_ms: u64, n: usize, killed: usize) -> String {
    let sig = signal_name(signal);
    let graceful = format!("{sig} then SIGKILL after {:.1}s", grace_ms as f64 / 1000.0);
    let held =
        format!("SIGKILL now (they hold {sig} for vigil.should_stop, and this stop saves nothing)");
    match (killed, n - killed.min(n)) {
        (0, _) => format!("stopping {n} rank(s) {why}: {graceful}"),
        (_, 0) => format!("stopping {n} rank(s) {why}: {held}"),
        (k, rest) => format!("stopping {n} rank(s) {why}: {k} {held}, {rest} {graceful}"),
    }
}

/// Why ranks are stopped "on a signal": the trigger that asked for the stop, when one did (the
/// allocation's end is no signal).
fn stop_cause(trigger: Option<&str>) -> String {
    match trigger {
        Some("time-limit") => "for the allocation's time limit".into(),
        Some("end-time") => "for the allocation's end (--end-time)".into(),
        Some(t) if t.starts_with("SIG") => format!("on {t} to the agent"),
        Some(t) => format!("for {t}"),
        None => "on a signal to the agent".into(),
    }
}

/// Turns records into console text. Holds only what never changes while the agent runs.
pub(super) struct Reporter {
    pub(super) run_dir: PathBuf,
    pub(super) node_rank: u32,
    pub(super) nnodes: u32,
}

impl Reporter {
    /// The console text for this record (newline-terminated), if it is worth telling.
    pub(super) fn line(&self, rec: &Record) -> Option<String> {
        if let Record::NodeFault { reason, .. } = rec {
            return Some(format!(
                "vigil: this node cannot run ranks: {reason}; the job ends after this attempt and is requeued without this node\n"
            ));
        }
        self.note(rec).map(|n| output::note_line(&n))
    }

    fn note(&self, rec: &Record) -> Option<String> {
        match rec {
            Record::AttemptStart {
                attempt,
                nproc,
                rank_offset,
                world_size,
                restarts_left,
                ..
            } => Some(self.attempt_start(*attempt, *nproc, (*rank_offset, *world_size), *restarts_left)),
            Record::AttemptEnded {
                attempt,
                end,
                requeue,
            } => self.attempt_ended(*attempt, end, *requeue),
            Record::RankExited {
                attempt,
                local_rank,
                rank,
                pid,
                exit_code,
                signal,
                expected: false,
            } => Some(format!(
                "rank {rank} (pid {pid}) failed: {}; its output: {}",
                match (exit_code, signal) {
                    (Some(c), _) => format!("exit code {c}"),
                    (_, Some(s)) => format!("killed by {}", signal_name(*s)),
                    _ => "unknown".into(),
                },
                self.log(*attempt, *local_rank, "stderr.log")
            )),
            Record::Stop {
                reason,
                signal,
                grace_ms,
                pids,
                killed,
                trigger,
                ..
            } if !pids.is_empty() => Some(stop_line(
                &match reason {
                    StopReason::RankFailed => "after a rank failed".to_string(),
                    StopReason::RankHung => "after a rank hung".to_string(),
                    StopReason::Signal => stop_cause(trigger.as_deref()),
                    StopReason::SpawnFailed => "after a rank could not start".to_string(),
                    StopReason::Peer => "as the job's other nodes do".to_string(),
                },
                *signal,
                *grace_ms,
                pids.len(),
                killed.len(),
            )),
            Record::RankRaised {
                rank, pid, error, ..
            } => Some(format!(
                "rank {rank} (pid {pid}) raised {error}: it is failing (its exit is awaited)"
            )),
            Record::RankSignalled { rank, signal, .. } => Some(format!(
                "rank {rank} received {} (sent to the rank, not to vigil): the job stops at one step, as for a signal to vigil",
                signal_name(*signal)
            )),
            Record::Escalate { pids, .. } => Some(format!(
                "{} rank(s) still running after the grace period: SIGKILL",
                pids.len()
            )),
            Record::RankSpawnFailed { error, .. } => Some(error.clone()),
            Record::Hang {
                attempt,
                local_rank,
                rank,
                pid,
                hang,
            } => Some(self.hang(*attempt, *local_rank, *rank, *pid, hang)),
            Record::Restart {
                to_attempt,
                ran_ms,
                backoff_ms,
                ..
            } if *backoff_ms > 0 => Some(format!(
                "attempt {} failed after {:.1}s; waiting {:.1}s before attempt {to_attempt} (restart back-off)",
                to_attempt - 1,
                *ran_ms as f64 / 1000.0,
                *backoff_ms as f64 / 1000.0
            )),
            _ => generation_note(rec).or_else(|| stop_and_control_note(rec)),
        }
    }

    fn attempt_start(
        &self,
        attempt: u32,
        nproc: u32,
        (rank_offset, world_size): (u32, u32),
        restarts_left: u32,
    ) -> String {
        let ranks = if self.nnodes > 1 {
            format!(
                " as ranks {rank_offset}-{} of {world_size}",
                rank_offset + nproc - 1
            )
        } else {
            String::new()
        };
        format!(
            "starting {nproc} rank(s){ranks}, attempt {attempt} (restarts left: {restarts_left}); logs in {}",
            self.run_dir.display()
        )
    }

    /// A file in one rank's logs of one attempt.
    fn log(&self, attempt: u32, local_rank: u32, name: &str) -> String {
        attempt_dir(&self.run_dir, attempt, local_rank)
            .join(name)
            .display()
            .to_string()
    }

    /// The job's verdict on an attempt another node ended (this node's own end was told as it
    /// happened). A job that refused this agent ends with one error line, and no note about
    /// stopping ranks it never had.
    fn attempt_ended(&self, attempt: u32, end: &JobEnd, requeue: Option<bool>) -> Option<String> {
        match end {
            JobEnd::Failed { node, reason } if *node != self.node_rank => Some(format!(
                "attempt {attempt} failed on node {node}: {reason}; every node stops its ranks"
            )),
            JobEnd::Stopped { node, reason, .. } if *node != self.node_rank => Some(format!(
                "the job is stopping ({reason}, on node {node}); stopping this node's ranks"
            )),
            JobEnd::Lost { reason, .. } if requeue != Some(false) => Some(format!(
                "{reason}; stopping this node's ranks, the job ends (requeue it to go on)"
            )),
            _ => None,
        }
    }

    fn hang(&self, attempt: u32, local_rank: u32, rank: u32, pid: i32, hang: &Hang) -> String {
        format!(
            "rank {rank} (pid {pid}) is hung: {}; capturing its stacks into {}",
            hang.why(),
            self.log(attempt, local_rank, "stacks.txt")
        )
    }
}

/// Notes on timeouts, the ranks' own requests and stops at a step.
fn stop_and_control_note(rec: &Record) -> Option<String> {
    match rec {
        Record::SectionNamesCapped { rank, kept, .. } => Some(format!(
            "rank {rank} used more than {kept} distinct section names: new names are no longer timed or used for calculated timeouts (name sections by phase, not by step or file)"
        )),
        Record::TimeoutsUpdated { source, timeouts } => Some(format!(
            "timeouts ({source}): {}",
            describe_timeouts(timeouts)
        )),
        Record::WorkloadControl {
            rank,
            action,
            description,
            ..
        } => {
            let (asked, then) = if *action == "shutdown_workload" {
                (
                    "shut the workload down",
                    "no further attempt, and the job is not requeued",
                )
            } else {
                (
                    "exclude this node",
                    "the job ends after this attempt and is requeued without this node",
                )
            };
            Some(format!("rank {rank} asked to {asked} ({description}): {then}"))
        }
        Record::StopTriggered {
            trigger, window_ms, ..
        } => Some(format!(
            "{trigger}: asking every rank to checkpoint at one agreed step and exit (they have {:.0}s)",
            *window_ms as f64 / 1000.0
        )),
        Record::StopAgreed { step, .. } => Some(match step {
            Some(s) => format!("every rank stops after step {s}"),
            None => "no rank reported a step: every rank stops now".to_string(),
        }),
        Record::StopOverdue {
            ranks, window_ms, ..
        } => Some(format!(
            "rank(s) {} did not stop within {:.0}s of being asked: stopping them",
            ranks
                .iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            *window_ms as f64 / 1000.0
        )),
        _ => None,
    }
}

/// The agent's last line about the job, after the failure summary where there is one (`None`
/// for a failure: the summary says it all).
pub(super) fn ending(outcome: &Outcome, cfg: &LaunchConfig) -> Option<String> {
    let note = |s: String| Some(output::note_line(&s));
    let status = outcome.exit_code();
    match outcome {
        // With hot spares or `--nnodes MIN:MAX`, some agents never ran ranks.
        Outcome::Succeeded if cfg.nnodes > 1 && cfg.active_nodes == cfg.nnodes => note(format!(
            "every rank on all {} nodes finished successfully",
            cfg.nnodes
        )),
        Outcome::Succeeded if cfg.active_nodes > 1 => note(format!(
            "every rank finished successfully ({} of the {} nodes run ranks)",
            cfg.active_nodes,
            cfg.nnodes
        )),
        Outcome::Succeeded => note("all ranks finished successfully".into()),
        Outcome::Failed { .. } => None,
        Outcome::NoProgress { attempts, step } => note(format!(
            "not restarting after {attempts} attempts: the last {n} in a row did not get {m} step(s) past step {} (--max-no-progress {n}, --min-progress-steps {m})",
            step.map_or("none".to_string(), |s| s.to_string()),
            n = cfg.allocation.limits.max_no_progress,
            m = cfg.allocation.limits.min_progress_steps
        )),
        Outcome::Signaled { signal } => note(format!(
            "stopped by {}; exit status {status}",
            signal_name(*signal)
        )),
        Outcome::SpawnFailed { error, .. } => Some(format!("vigil: error: {error}\n")),
        Outcome::PeerStopped {
            node,
            reason,
            exit_code,
        } => note(format!(
            "stopped because node {node} stopped the job ({reason}); exit status {exit_code}"
        )),
        Outcome::Lost {
            reason,
            requeue: true,
        } => Some(format!(
            "vigil: {reason}; exit status {status}: requeue the job to go on\n"
        )),
        Outcome::Lost {
            reason,
            requeue: false,
        } => Some(format!("vigil: error: {reason}\n")),
        Outcome::Stopped { trigger, step } => note(match step {
            Some(s) => format!(
                "stopped for {trigger} at step {s}; exit status {status}: run the job again to go on from its checkpoint"
            ),
            None => format!("stopped for {trigger}; exit status {status}: run the job again to go on"),
        }),
    }
}

/// What a capture of a hung rank's stacks found.
pub(super) fn stacks(rank: u32, report: &StackReport) -> String {
    let mut msg = format!("rank {rank} stacks captured");
    match &report.python {
        Some(p) if report.missing.is_empty() => {
            msg.push_str(&format!(" (Python: {})", p.display()))
        }
        Some(p) => msg.push_str(&format!(
            " (Python: {}, perhaps cut short: {})",
            p.display(),
            report.missing
        )),
        None => msg.push_str(&format!(" (no Python stacks: {})", report.missing)),
    }
    if let Some(p) = &report.proc {
        msg.push_str(&format!(", kernel view: {}", p.display()));
    }
    if !report.innermost.is_empty() {
        msg.push_str("; innermost frames:");
        for f in &report.innermost {
            msg.push_str(&format!("\n    {f}"));
        }
    }
    msg
}

/// A standby took a lost node's place.
pub(super) fn promotion(p: &Promotion) -> String {
    format!(
        "attempt {}: standby node {} takes the place of lost node {} (group rank {})",
        p.attempt, p.standby, p.lost, p.slot
    )
}

/// The agent itself did not run for `away`.
pub(super) fn suspended(away: Duration) -> String {
    format!(
        "the agent was suspended for {:.1}s; that time does not count against any timeout",
        away.as_secs_f64()
    )
}

/// The console's lines for in-process restarts (docs/inprocess.md).
fn generation_note(rec: &Record) -> Option<String> {
    match rec {
        Record::Generation {
            generation,
            ranks,
            step,
            ..
        } => {
            let ranks: Vec<String> = ranks.iter().map(u32::to_string).collect();
            let at = step.map(|s| format!(" at step {s}")).unwrap_or_default();
            Some(format!(
                "in-process restart: generation {generation} begins{at}; rank {} is replaced by a new process, the other ranks keep theirs",
                ranks.join(", ")
            ))
        }
        Record::GenerationRecovered {
            generation,
            seconds,
            ..
        } => Some(format!(
            "generation {generation}: every rank is back in its training function {seconds:.2}s after the failure"
        )),
        Record::GenerationStepping {
            generation,
            seconds,
            ..
        } => Some(format!(
            "generation {generation}: every rank is stepping again {seconds:.2}s after the failure"
        )),
        Record::InProcessDeclined { reason, .. } => Some(format!("no in-process restart: {reason}")),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reporter(nnodes: u32) -> Reporter {
        Reporter {
            run_dir: PathBuf::from("/runs/r"),
            node_rank: 0,
            nnodes,
        }
    }

    #[test]
    fn attempts_start_with_their_ranks_on_several_nodes_only() {
        let rec = Record::AttemptStart {
            attempt: 1,
            restart_count: 1,
            nproc: 2,
            rank_offset: 2,
            world_size: 4,
            restarts_left: 2,
        };
        assert_eq!(
            reporter(2).line(&rec).unwrap(),
            "[vigil] starting 2 rank(s) as ranks 2-3 of 4, attempt 1 (restarts left: 2); logs in /runs/r\n"
        );
        assert_eq!(
            reporter(1).line(&rec).unwrap(),
            "[vigil] starting 2 rank(s), attempt 1 (restarts left: 2); logs in /runs/r\n"
        );
    }

    #[test]
    fn a_job_that_refused_the_agent_says_nothing_of_stopping_ranks() {
        let lost = |requeue| Record::AttemptEnded {
            attempt: 0,
            end: JobEnd::Lost {
                reason: "gone".into(),
                node: None,
            },
            requeue,
        };
        assert!(reporter(2).line(&lost(Some(false))).is_none());
        assert!(reporter(2).line(&lost(Some(true))).is_some());
        assert!(reporter(2).line(&lost(None)).is_some());
    }

    #[test]
    fn a_stop_names_the_trigger_that_asked_for_it() {
        let stop = |trigger: Option<&str>| Record::Stop {
            attempt: 0,
            reason: StopReason::Signal,
            signal: libc::SIGTERM,
            grace_ms: 1500,
            pids: vec![7],
            killed: vec![],
            trigger: trigger.map(str::to_string),
        };
        assert_eq!(
            reporter(1).line(&stop(Some("time-limit"))).unwrap(),
            "[vigil] stopping 1 rank(s) for the allocation's time limit: SIGTERM then SIGKILL after 1.5s\n"
        );
        assert!(reporter(1)
            .line(&stop(None))
            .unwrap()
            .contains("on a signal to the agent"));
    }

    #[test]
    fn a_node_fault_is_an_error_line() {
        let rec = Record::NodeFault {
            attempt: 0,
            reason: "GPU 0: hot".into(),
        };
        assert!(reporter(1)
            .line(&rec)
            .unwrap()
            .starts_with("vigil: this node cannot run ranks: GPU 0: hot;"));
    }
}
