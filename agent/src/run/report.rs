//! All text the agent prints about the job: one line per event-log record worth telling, notes,
//! the failure summary.

use super::*;

/// The most of a rank's error file (torch's `error.json`) read.
const ERROR_FILE_LIMIT: u64 = 4 << 20;

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
    let sig = crate::values::signal_name(signal);
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

impl Agent {
    pub(super) fn note(&self, rec: &Record) {
        match rec {
            Record::CycleStart { cycle, nproc, .. } => console_note(&format!(
                "starting {nproc} rank(s){}, attempt {cycle} (restarts left: {}); logs in {}",
                if self.cfg.nnodes > 1 {
                    format!(
                        " as ranks {}-{} of {}",
                        self.rank_offset,
                        self.rank_offset + nproc - 1,
                        self.world_size
                    )
                } else {
                    String::new()
                },
                self.max_restarts.saturating_sub(*cycle),
                self.run_dir.display()
            )),
            Record::CycleEnded { cycle, end, .. } => match end {
                JobEnd::Done => {}
                JobEnd::Failed { node, reason } if *node != self.cfg.node_rank => {
                    console_note(&format!(
                        "attempt {cycle} failed on node {node}: {reason}; every node stops its ranks"
                    ))
                }
                JobEnd::Stopped { node, reason, .. } if *node != self.cfg.node_rank => {
                    console_note(&format!(
                        "the job is stopping ({reason}, on node {node}); stopping this node's ranks"
                    ))
                }
                JobEnd::Lost { reason, .. } if !self.refused => console_note(&format!(
                    "{reason}; stopping this node's ranks, the job ends (requeue it to go on)"
                )),
                _ => {}
            },
            Record::RankExited {
                cycle,
                local_rank,
                rank,
                pid,
                exit_code,
                signal,
                expected: false,
            } => console_note(&format!(
                "rank {rank} (pid {pid}) failed: {}; its output: {}",
                match (exit_code, signal) {
                    (Some(c), _) => format!("exit code {c}"),
                    (_, Some(s)) => format!("killed by {}", crate::values::signal_name(*s)),
                    _ => "unknown".into(),
                },
                self.attempt_dir(*cycle, *local_rank)
                    .join("stderr.log")
                    .display()
            )),
            Record::Stop {
                reason,
                signal,
                grace_ms,
                pids,
                killed,
                ..
            } if !pids.is_empty() => console_note(&stop_line(
                &match reason {
                    StopReason::RankFailed => "after a rank failed".to_string(),
                    StopReason::RankHung => "after a rank hung".to_string(),
                    StopReason::Signal => stop_cause(self.stop_trigger.as_deref()),
                    StopReason::SpawnFailed => "after a rank could not start".to_string(),
                    StopReason::Peer => "as the job's other nodes do".to_string(),
                },
                *signal,
                *grace_ms,
                pids.len(),
                killed.len(),
            )),
            Record::RankSignalled { rank, signal, .. } => console_note(&format!(
                "rank {rank} received {} (sent to the rank, not to vigil): the job stops at one step, as for a signal to vigil",
                crate::values::signal_name(*signal)
            )),
            Record::Escalate { pids, .. } => console_note(&format!(
                "{} rank(s) still running after the grace period: SIGKILL",
                pids.len()
            )),
            Record::RankSpawnFailed { error, .. } => console_note(error),
            Record::Hang {
                cycle,
                local_rank,
                rank,
                pid,
                hang,
            } => console_note(&format!(
                "rank {rank} (pid {pid}) is hung: {} of {:.1}s passed (silent for {:.1}s){}; capturing its stacks into {}",
                hang.timeout,
                hang.limit_ms as f64 / 1000.0,
                hang.silent_ms as f64 / 1000.0,
                if hang.stopped {
                    ", its process is stopped (SIGSTOP?)"
                } else {
                    ""
                },
                self.attempt_dir(*cycle, *local_rank)
                    .join("stacks.txt")
                    .display()
            )),
            Record::Restart {
                to_cycle,
                ran_ms,
                backoff_ms,
                ..
            } if *backoff_ms > 0 => console_note(&format!(
                "attempt {} failed after {:.1}s; waiting {:.1}s before attempt {to_cycle} (restart back-off)",
                to_cycle - 1,
                *ran_ms as f64 / 1000.0,
                *backoff_ms as f64 / 1000.0
            )),
            Record::SectionNamesCapped { rank, kept, .. } => console_note(&format!(
                "rank {rank} used more than {kept} distinct section names: new names are no longer timed or used for calculated timeouts (name sections by phase, not by step or file)"
            )),
            Record::TimeoutsUpdated { source, timeouts } => console_note(&format!(
                "timeouts ({source}): {}",
                describe_timeouts(timeouts)
            )),
            Record::WorkloadControl {
                rank,
                action,
                description,
                ..
            } => console_note(&format!(
                "rank {rank} asked to {} ({description}): {}",
                if *action == "shutdown_workload" {
                    "shut the workload down"
                } else {
                    "exclude this node"
                },
                if *action == "shutdown_workload" {
                    "no further attempt, and the job is not requeued"
                } else {
                    "the job ends after this attempt and is requeued without this node"
                }
            )),
            Record::NodeFault { reason, .. } => console_err(format!(
                "vigil: this node cannot run ranks: {reason}; the job ends after this attempt and is requeued without this node"
            )),
            Record::StopTriggered {
                trigger, window_ms, ..
            } => console_note(&format!(
                "{trigger}: asking every rank to checkpoint at one agreed step and exit (they have {:.0}s)",
                *window_ms as f64 / 1000.0
            )),
            Record::StopAgreed { step, .. } => console_note(&match step {
                Some(s) => format!("every rank stops after step {s}"),
                None => "no rank reported a step: every rank stops now".to_string(),
            }),
            Record::StopOverdue {
                ranks, window_ms, ..
            } => console_note(&format!(
                "rank(s) {} did not stop within {:.0}s of being asked: stopping them",
                ranks
                    .iter()
                    .map(|r| r.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                *window_ms as f64 / 1000.0
            )),
            _ => {}
        }
    }

    pub(super) fn failure_summary(&self, sup: &Supervisor, now_i: Instant) -> String {
        let now_s = SystemTime::now();
        let failed: Vec<FailedRank> = sup
            .failures()
            .iter()
            .map(|f| {
                let error_path = self.attempt_dir(f.cycle, f.local_rank).join("error.json");
                // The rank writes it: a regular file, bounded, or nothing.
                let error = vigil_bounded::read_string(&error_path, ERROR_FILE_LIMIT)
                    .ok()
                    .and_then(|t| summary::parse_error_file(&t));
                let when = now_s - now_i.saturating_duration_since(f.at);
                let stacks = self
                    .stack_reports
                    .iter()
                    .find(|(c, lr, _)| *c == f.cycle && *lr == f.local_rank)
                    .map(|(_, _, r)| r.clone());
                FailedRank {
                    time: humantime::format_rfc3339_seconds(when).to_string(),
                    host: self.host.clone(),
                    rank: f.rank,
                    local_rank: f.local_rank,
                    how: f.how,
                    hang: f.hang.clone(),
                    stacks,
                    pid: f.pid,
                    logs: Some(
                        self.attempt_dir(f.cycle, f.local_rank)
                            .to_string_lossy()
                            .into_owned(),
                    ),
                    error_file: error
                        .as_ref()
                        .map(|_| error_path.to_string_lossy().into_owned()),
                    error,
                    stderr_tail: self
                        .tails
                        .get(f.local_rank as usize)
                        .map(|t| t.borrow().iter().cloned().collect())
                        .unwrap_or_default(),
                }
            })
            .collect();
        let elsewhere = match &self.peer_end {
            Some(JobEnd::Failed { node, reason }) if failed.is_empty() => Some(format!(
                "on node {node}: {reason} (its agent's log has the details)"
            )),
            _ => None,
        };
        summary::render(
            &self.cfg.entrypoint_name,
            sup.cycle(),
            &failed,
            elsewhere.as_deref(),
        )
    }
}
