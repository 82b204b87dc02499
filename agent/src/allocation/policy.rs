//! What happens after an allocation: finished, requeue, or stop; and `vigil run`'s exit status.
//!
//! Pure: [`decide`] takes this allocation's facts, the ledger's earlier records and the limits.
//! Node rank 0 applies the answer (ledger record, `scontrol update ExcNodeList=`, `scontrol
//! requeue`) as the last thing it does.
//!
//! | this allocation | decision | exit status |
//! |---|---|---|
//! | the ranks called `mark_finished`, or all exited 0 with no stop asked | finished | 0 (the failure's own status if a rank failed after `mark_finished`) |
//! | in-job attempts stopped making progress (outcome `no_progress`) | stop | `no_restart_exit_code`, else 1 |
//! | the highest step did not grow by `--min-progress-steps` over the last `--max-no-progress` allocations, this one included | stop | `no_restart_exit_code`, else the failure's own status, else 1 |
//! | stopped for the time limit or a signal (preemption) | requeue | 75 |
//! | failed after the in-job restarts, or a node lost, and consecutive failed allocations (this one included) <= `--max-requeues` | requeue, excluding the nodes to blame | 75 |
//! | failed or lost beyond `--max-requeues` | stop | `no_restart_exit_code`, else the failure's own status (75 becomes 1) |
//! | any requeue when Slurm says `Requeue=0` (`--no-requeue`) | stop, saying so | 75 (the work is not done) |
//!
//! A job Slurm ended early (`scancel`) is stopped, whatever the rows say; one Slurm requeued itself
//! (`scontrol requeue`, a preemption) is decided by the rows, and its record says Slurm requeued it.
//!
//! Rows are tried in order; the first that applies decides. Counting starts after the last
//! record that ended in `finished` or `stop`: a job requeued by hand after vigil stopped it gets
//! its full allowances again.
//!
//! Progress: an allocation made progress when its highest step is at least the highest of every
//! earlier allocation plus `--min-progress-steps` (the first allocation that reports a step
//! always has). An allocation stopped (time limit, preemption) in which no rank reported a step
//! made none: a lead as long as the allocation, or ranks that never reach their first step,
//! must not be requeued forever. A failed or lost allocation before any step was ever reported
//! neither counts nor resets (`--max-requeues` bounds those). `--max-no-progress 0` turns the
//! check off.
//!
//! ft_launcher (NVRx `TrainingProgressTracker`) compared: it counts *in-job attempts* whose
//! iteration, read from `--ft-checkpoint-iteration-file`, grew by less than
//! `min_progress_iterations` since the attempt started; when `max_no_progress_cycles` consecutive
//! attempts (attempt 0 included) made none, the launcher stops restarting and exits 1 (NVRx 0.7 has
//! no status of its own for it; vigil's `--ft-no-restart-exit-code` gives one); without the
//! file it stays inactive; 0 disables it. Running out of
//! `--max-restarts` exits 1, not 93. vigil keeps the same counting and the same meaning of 0,
//! with three differences: the step comes from the ranks (`should_stop(step)`), not a file; it
//! counts allocations (from the ledger) as well as in-job attempts ([`attempt_no_progress`]);
//! and vigil's do-not-requeue status is the failure's own status unless
//! `--ft-no-restart-exit-code` is given, since 75 already says "requeue".

use super::ledger::{DecisionKind, Outcome, Record};
pub use crate::supervise::progress::attempt_no_progress;
pub use crate::supervise::progress::DEFAULT_MIN_PROGRESS_STEPS;
use crate::supervise::progress::{progress, Progress};

/// The limits, from `vigil run`'s flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// `--max-requeues`: consecutive failed allocations that are still requeued.
    pub max_requeues: u32,
    /// `--max-no-progress`: consecutive allocations (or in-job attempts) without progress that
    /// end the job; 0 turns the check off.
    pub max_no_progress: u32,
    /// `--min-progress-steps`.
    pub min_progress_steps: u64,
    /// ft_launcher's `--ft-no-restart-exit-code`, when given.
    pub no_restart_exit_code: Option<i32>,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_requeues: 2,
            max_no_progress: 3,
            min_progress_steps: DEFAULT_MIN_PROGRESS_STEPS,
            no_restart_exit_code: None,
        }
    }
}

/// What this allocation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    pub outcome: Outcome,
    /// The agent's own status for how the allocation ended (the failure's status; 0 when all
    /// ranks exited 0).
    pub status: i32,
    /// Some rank called `mark_finished`.
    pub marked_finished: bool,
    /// The highest step any rank reported.
    pub highest_step: Option<u64>,
    /// The stop's trigger, for a stopped allocation (`SIGTERM`, `time-limit`, ...).
    pub stop_trigger: Option<String>,
    /// Nodes to keep out of the next allocation (a lost node, one whose ranks failed or hung in
    /// consecutive attempts).
    pub blame: Vec<String>,
    /// Slurm's `Requeue=`: `Some(false)` when the job was submitted with `--no-requeue`;
    /// `None` outside Slurm or when unknown.
    pub requeue_allowed: Option<bool>,
    /// The job has an identity to count allocations by (Slurm job id, `--rdzv-id`,
    /// `--state-dir`); without one a failure is final.
    pub counted: bool,
    /// Slurm says the job was cancelled.
    pub cancelled: bool,
    /// Slurm has already requeued the job itself (`scontrol requeue`, a preemption): it shows
    /// as ending early but is not cancelled, and vigil does not requeue it a second time.
    pub requeued_by_slurm: bool,
    /// A person stopped it (Ctrl-C, SIGHUP, SIGQUIT to the agent).
    pub interrupted: bool,
    /// A rank asked to shut the workload down (NVRx's `ShutdownWorkload`).
    pub shutdown_asked: bool,
    /// The ranks were signalled rather than stopping at a step: the status stays `status`
    /// (128 + the signal, or the stopping node's).
    pub keeps_status: bool,
}

/// The decision and why, in one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Finished { why: String },
    Requeue { exclude: Vec<String>, why: String },
    Stop { why: String },
}

impl Decision {
    pub fn kind(&self) -> DecisionKind {
        match self {
            Decision::Finished { .. } => DecisionKind::Finished,
            Decision::Requeue { .. } => DecisionKind::Requeue,
            Decision::Stop { .. } => DecisionKind::Stop,
        }
    }

    pub fn why(&self) -> &str {
        match self {
            Decision::Finished { why } | Decision::Requeue { why, .. } | Decision::Stop { why } => {
                why
            }
        }
    }

    pub fn exclude(&self) -> &[String] {
        match self {
            Decision::Requeue { exclude, .. } => exclude,
            _ => &[],
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub decision: Decision,
    pub exit_status: i32,
}

/// A status that means "do not requeue": never 0 or 75, always 1..=255.
fn do_not_requeue(status: i32) -> i32 {
    match status {
        0 | crate::exit::REQUEUE => 1,
        s if (1..=255).contains(&s) => s,
        _ => 1,
    }
}

fn step(s: Option<u64>) -> String {
    s.map_or("none".into(), |s| s.to_string())
}

/// Decides what follows this allocation. `history` is the ledger's earlier records, in order.
pub fn decide(facts: &Facts, history: &[Record], limits: &Limits) -> Verdict {
    let stop = |why: String, exit_status| Verdict {
        decision: Decision::Stop { why },
        exit_status,
    };
    let base = by_history(facts, history, limits);
    let mut v = if facts.outcome == Outcome::Failed && !facts.counted {
        // No earlier allocation to count failures against: a wrapper that reruns on 75 must not
        // loop on a broken job.
        stop(
            "failed; a job without an identity (Slurm job id, --rdzv-id, --state-dir) is not run again".into(),
            facts.status,
        )
    } else if facts.shutdown_asked && base.decision.kind() != DecisionKind::Finished {
        stop(
            "a rank asked to shut the workload down (ShutdownWorkload)".into(),
            match facts.status {
                0 | crate::exit::REQUEUE => 1,
                s => s,
            },
        )
    } else if facts.cancelled && !facts.requeued_by_slurm {
        stop(
            "the Slurm job is ending before its time limit (scancel, or a preemption past its grace)".into(),
            facts.status,
        )
    } else if facts.interrupted {
        let by = facts.stop_trigger.clone().unwrap_or_default();
        stop(format!("{by}: not requeued"), facts.status)
    } else {
        base
    };
    if facts.keeps_status {
        v.exit_status = facts.status;
    }
    if facts.requeued_by_slurm {
        v = requeued_by_slurm(v);
    }
    v
}

/// A verdict for a job Slurm has already requeued: a requeue says so (node rank 0 does not ask
/// for another); a stop says the next allocation runs all the same.
fn requeued_by_slurm(mut v: Verdict) -> Verdict {
    const BY_SLURM: &str = "Slurm requeued the job itself (scontrol requeue, or a preemption)";
    match &mut v.decision {
        Decision::Requeue { why, .. } => *why = format!("{why}; {BY_SLURM}"),
        Decision::Stop { why } => {
            *why = format!("{why}; {BY_SLURM}, so it runs again unless cancelled (scancel)")
        }
        Decision::Finished { .. } => {}
    }
    v
}

/// The rules of the table above, from this allocation and the ledger's earlier records.
fn by_history(facts: &Facts, history: &[Record], limits: &Limits) -> Verdict {
    // 1. Finished.
    if facts.marked_finished || facts.outcome == Outcome::Finished {
        return finished(facts);
    }
    // 2. No progress over the in-job attempts.
    if facts.outcome == Outcome::NoProgress {
        return Verdict {
            decision: Decision::Stop {
                why: format!(
                    "no progress: the in-job attempts stayed at step {} (--max-no-progress {}, --min-progress-steps {})",
                    step(facts.highest_step),
                    limits.max_no_progress,
                    limits.min_progress_steps
                ),
            },
            exit_status: limits.no_restart_exit_code.unwrap_or(1),
        };
    }
    // 3. No progress over the allocations.
    let window = since_last_end(history);
    let p = AllocationProgress::of(facts, history, limits, window.len());
    if limits.max_no_progress > 0 && p.stuck >= limits.max_no_progress as usize {
        return Verdict {
            decision: Decision::Stop {
                why: p.stop_why(limits),
            },
            exit_status: failed_status(facts, limits),
        };
    }
    match facts.outcome {
        // 4. Stopped for the time limit or preemption.
        Outcome::Stopped => requeue(
            facts,
            format!(
                "{}, {}",
                facts.stop_trigger.as_deref().unwrap_or("stop request"),
                p.note(limits)
            ),
        ),
        // 5. Failed or lost: requeued while the consecutive failures allow.
        _ => failed_or_lost(facts, window, limits),
    }
}

/// The records after the last one that ended the job's run: a hand requeue starts afresh.
fn since_last_end(history: &[Record]) -> &[Record] {
    let since = history
        .iter()
        .rposition(|r| r.decision != DecisionKind::Requeue)
        .map_or(0, |i| i + 1);
    &history[since..]
}

/// The status of a job that is not to run again: `--ft-no-restart-exit-code`, else the
/// failure's own.
fn failed_status(facts: &Facts, limits: &Limits) -> i32 {
    limits
        .no_restart_exit_code
        .unwrap_or(do_not_requeue(facts.status))
}

/// Rule 1: the ranks are done; a failure after `mark_finished` keeps its status but is not
/// requeued.
fn finished(facts: &Facts) -> Verdict {
    let why = if facts.marked_finished {
        "the ranks called mark_finished"
    } else {
        "every rank exited 0 with no stop asked"
    };
    let (why, status) = if facts.outcome.is_failure() {
        (
            format!(
                "{why}; the {} after it is not requeued",
                facts.outcome.name()
            ),
            do_not_requeue(facts.status),
        )
    } else {
        (why.to_string(), 0)
    };
    Verdict {
        decision: Decision::Finished { why },
        exit_status: status,
    }
}

/// How the highest step moved over the allocations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct AllocationProgress {
    /// Allocations without progress at the end, this one included ([`stuck_allocations`]).
    stuck: usize,
    /// The highest step of every earlier allocation.
    best_before: Option<u64>,
    /// This allocation's highest step.
    highest: Option<u64>,
}

impl AllocationProgress {
    /// `window` is the number of earlier records since the last that ended the job's run.
    fn of(facts: &Facts, history: &[Record], limits: &Limits, window: usize) -> Self {
        let mut entries: Vec<(Outcome, Option<u64>)> = history
            .iter()
            .map(|r| (r.outcome, r.highest_step))
            .collect();
        entries.push((facts.outcome, facts.highest_step));
        AllocationProgress {
            stuck: stuck_allocations(&entries, limits.min_progress_steps, window + 1),
            best_before: history.iter().filter_map(|r| r.highest_step).max(),
            highest: facts.highest_step,
        }
    }

    /// Rule 3's reason: no step ever, the step stayed, or it grew too little.
    fn stop_why(&self, limits: &Limits) -> String {
        let stuck = self.stuck;
        let what = if self.best_before.is_none() && self.highest.is_none() {
            format!(
                "no rank reported a step to vigil.should_stop(step) in the last {stuck} allocations"
            )
        } else if limits.min_progress_steps <= 1 {
            format!(
                "the highest step stayed at {} over the last {stuck} allocations",
                step(self.best_before.max(self.highest))
            )
        } else {
            format!(
                "the highest step ({}) grew by less than {} in each of the last {stuck} allocations",
                step(self.best_before.max(self.highest)),
                limits.min_progress_steps
            )
        };
        format!(
            "no progress: {what} (--max-no-progress {}, --min-progress-steps {})",
            limits.max_no_progress, limits.min_progress_steps
        )
    }

    /// The progress part of a stopped allocation's requeue reason.
    fn note(&self, limits: &Limits) -> String {
        let stuck = self.stuck;
        match (self.best_before, self.highest) {
            (Some(b), Some(h)) if stuck == 0 => format!("progress {b}..{h}"),
            (None, Some(h)) if stuck == 0 => format!("reached step {h}"),
            (_, None) if stuck > 0 => format!(
                "no step reported ({stuck} of --max-no-progress {} in a row)",
                limits.max_no_progress
            ),
            _ if stuck > 0 => format!(
                "no progress ({stuck} of --max-no-progress {} in a row)",
                limits.max_no_progress
            ),
            _ => "no steps reported".to_string(),
        }
    }
}

/// A requeue excluding the nodes to blame, unless Slurm cannot requeue the job.
fn requeue(facts: &Facts, why: String) -> Verdict {
    if facts.requeue_allowed == Some(false) {
        return Verdict {
            decision: Decision::Stop {
                why: format!(
                    "{why}, but Slurm cannot requeue this job (Requeue=0: submitted with --no-requeue); resubmit it to go on"
                ),
            },
            exit_status: crate::exit::REQUEUE,
        };
    }
    Verdict {
        decision: Decision::Requeue {
            exclude: facts.blame.clone(),
            why,
        },
        exit_status: crate::exit::REQUEUE,
    }
}

/// Rule 5: a failed or lost allocation is requeued while the failures in a row (this one
/// included, within `window`) are at most `--max-requeues`.
fn failed_or_lost(facts: &Facts, window: &[Record], limits: &Limits) -> Verdict {
    let failed = 1 + window
        .iter()
        .rev()
        .take_while(|r| r.outcome.is_failure())
        .count();
    let what = if facts.outcome == Outcome::Lost {
        "node lost"
    } else {
        "failed"
    };
    if failed <= limits.max_requeues as usize {
        requeue(
            facts,
            format!(
                "{what}, {failed} in a row (--max-requeues {})",
                limits.max_requeues
            ),
        )
    } else {
        Verdict {
            decision: Decision::Stop {
                why: format!(
                    "{what}, {failed} in a row: more than --max-requeues {}",
                    limits.max_requeues
                ),
            },
            exit_status: failed_status(facts, limits),
        }
    }
}

/// The verdict when this allocation's record could not be written to the ledger in `dir`: a
/// requeue becomes a stop (the next allocation could not count it, so a job failing on a full
/// disk would be requeued forever); anything else stands.
pub fn unrecorded(v: Verdict, status: i32, dir: &str) -> Verdict {
    match v.decision {
        Decision::Requeue { why, .. } => Verdict {
            decision: Decision::Stop {
                why: format!(
                    "{why}, but the ledger in {dir} cannot be written, so this requeue could not be counted; make it writable, then requeue or run the job again by hand"
                ),
            },
            exit_status: do_not_requeue(status),
        },
        _ => v,
    }
}

/// Allocations without progress at the end of `entries` (each one's outcome and highest step),
/// counted back to the last with progress, within the last `window`. A stopped allocation
/// without a step made none even before any step was ever reported; a failed or lost one then
/// stays unknown (neither counts nor resets).
fn stuck_allocations(entries: &[(Outcome, Option<u64>)], min: u64, window: usize) -> usize {
    let highest: Vec<Option<u64>> = entries.iter().map(|e| e.1).collect();
    let mut n = 0;
    for ((outcome, _), p) in entries
        .iter()
        .zip(progress(&highest, min))
        .rev()
        .take(window)
    {
        match p {
            Progress::Made => break,
            Progress::None => n += 1,
            Progress::Unknown if *outcome == Outcome::Stopped => n += 1,
            Progress::Unknown => {}
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocation::ledger::FORMAT;
    use proptest::prelude::*;

    fn facts(outcome: Outcome, highest: Option<u64>) -> Facts {
        Facts {
            outcome,
            status: match outcome {
                Outcome::Finished | Outcome::Stopped => 0,
                Outcome::Lost => 75,
                _ => 1,
            },
            marked_finished: false,
            highest_step: highest,
            stop_trigger: (outcome == Outcome::Stopped).then(|| "time-limit".into()),
            blame: vec![],
            requeue_allowed: Some(true),
            counted: true,
            cancelled: false,
            requeued_by_slurm: false,
            interrupted: false,
            shutdown_asked: false,
            keeps_status: false,
        }
    }

    #[test]
    fn what_overrides_the_ledger_and_which_status_follows() {
        let limits = Limits::default();
        let d = |f: &Facts| decide(f, &[], &limits);
        // Without an identity a failure is final, with its own status.
        let mut f = facts(Outcome::Failed, Some(3));
        assert_eq!(d(&f).decision.kind(), DecisionKind::Requeue);
        f.counted = false;
        assert_eq!(
            (d(&f).decision.kind(), d(&f).exit_status),
            (DecisionKind::Stop, 1)
        );
        // ShutdownWorkload: never requeued, never 0 or 75; a finished job stays finished.
        let mut f = facts(Outcome::Stopped, Some(3));
        f.shutdown_asked = true;
        assert_eq!(
            (d(&f).decision.kind(), d(&f).exit_status),
            (DecisionKind::Stop, 1)
        );
        let mut f = facts(Outcome::Finished, Some(3));
        f.shutdown_asked = true;
        assert_eq!(d(&f).decision.kind(), DecisionKind::Finished);
        // Cancelled, or a person's signal: not requeued, the outcome's own status.
        let mut f = facts(Outcome::Stopped, Some(3));
        f.cancelled = true;
        assert!(d(&f).decision.why().contains("scancel"));
        assert_eq!(d(&f).decision.kind(), DecisionKind::Stop);
        let mut f = facts(Outcome::Stopped, Some(3));
        (f.interrupted, f.status, f.stop_trigger) = (true, 130, Some("SIGINT".into()));
        assert_eq!(d(&f).exit_status, 130);
        assert_eq!(d(&f).decision.why(), "SIGINT: not requeued");
        // Signalled ranks: requeued, but the status stays theirs.
        let mut f = facts(Outcome::Stopped, Some(3));
        (f.keeps_status, f.status) = (true, 143);
        assert_eq!(
            (d(&f).decision.kind(), d(&f).exit_status),
            (DecisionKind::Requeue, 143)
        );
    }

    #[test]
    fn a_job_slurm_requeued_itself_is_recorded_as_requeued_not_cancelled() {
        let limits = Limits::default();
        // `scontrol requeue`: COMPLETING before the time limit (cancelled), Restarts= counted.
        let mut f = facts(Outcome::Stopped, Some(3));
        (f.cancelled, f.requeued_by_slurm) = (true, true);
        let v = decide(&f, &[], &limits);
        assert_eq!(
            (v.decision.kind(), v.exit_status),
            (DecisionKind::Requeue, 75)
        );
        assert!(
            v.decision.why().contains("Slurm requeued the job itself"),
            "{v:?}"
        );
        // A stop vigil decides for its own reasons stays a stop, and says the job runs again.
        let stuck = run(&vec![facts(Outcome::Stopped, Some(3)); 3], &limits);
        let v = decide(&f, &stuck, &limits);
        assert_eq!(v.decision.kind(), DecisionKind::Stop, "{v:?}");
        assert!(
            v.decision.why().contains("runs again unless cancelled"),
            "{v:?}"
        );
        // A cancel is still a cancel.
        f.requeued_by_slurm = false;
        assert_eq!(decide(&f, &[], &limits).decision.kind(), DecisionKind::Stop);
    }

    #[test]
    fn progress_reasons_name_the_steps_and_the_count() {
        let limits = Limits::default();
        let p = |stuck, best_before, highest| AllocationProgress {
            stuck,
            best_before,
            highest,
        };
        assert_eq!(p(0, Some(3), Some(9)).note(&limits), "progress 3..9");
        assert_eq!(p(0, None, Some(9)).note(&limits), "reached step 9");
        assert_eq!(
            p(2, Some(3), None).note(&limits),
            "no step reported (2 of --max-no-progress 3 in a row)"
        );
        assert_eq!(p(0, None, None).note(&limits), "no steps reported");
        assert!(p(3, None, None)
            .stop_why(&limits)
            .starts_with("no progress: no rank reported a step"));
        let one = Limits {
            min_progress_steps: 1,
            ..Limits::default()
        };
        assert!(p(3, Some(5), Some(5))
            .stop_why(&one)
            .contains("the highest step stayed at 5 over the last 3 allocations"));
        assert!(p(3, Some(5), Some(5)).stop_why(&limits).contains(
            "the highest step (5) grew by less than 10 in each of the last 3 allocations"
        ));
    }

    #[test]
    fn a_hand_requeue_after_a_stop_starts_the_count_afresh() {
        let limits = Limits::default();
        let failed = facts(Outcome::Failed, Some(1));
        let mut ledger = run(&[failed.clone(), failed.clone(), failed.clone()], &limits);
        assert_eq!(ledger[2].decision, DecisionKind::Stop);
        assert!(since_last_end(&ledger).is_empty());
        ledger.push(record(4, &failed, &limits, &ledger));
        assert_eq!(ledger[3].decision, DecisionKind::Requeue);
        assert_eq!(since_last_end(&ledger).len(), 1);
    }

    fn record(i: u32, f: &Facts, limits: &Limits, history: &[Record]) -> Record {
        let v = decide(f, history, limits);
        Record {
            promotions: Vec::new(),
            submit_time: None,
            slurm_start: None,
            format: FORMAT,
            allocation: i,
            job_id: Some("1".into()),
            cluster: None,
            restart_count: i - 1,
            nodes: vec!["n1".into()],
            start: 0.0,
            end: 1.0,
            outcome: f.outcome,
            highest_step: f.highest_step,
            restarts: 0,
            stop_step: None,
            stop_trigger: None,
            decision: v.decision.kind(),
            why: v.decision.why().into(),
            excluded: v.decision.exclude().to_vec(),
            stop_lead_s: 60.0,
            exit_status: v.exit_status,
        }
    }

    /// Runs allocations one after another, each decided on the ledger so far.
    fn run(allocs: &[Facts], limits: &Limits) -> Vec<Record> {
        let mut ledger = Vec::new();
        for (i, f) in allocs.iter().enumerate() {
            let r = record(i as u32 + 1, f, limits, &ledger);
            ledger.push(r);
        }
        ledger
    }

    fn decisions(ledger: &[Record]) -> Vec<(DecisionKind, i32)> {
        ledger.iter().map(|r| (r.decision, r.exit_status)).collect()
    }

    use DecisionKind::{Finished as F, Requeue as R, Stop as S};

    #[test]
    fn a_finished_job_is_never_requeued() {
        let l = Limits::default();
        let v = decide(&facts(Outcome::Finished, Some(10)), &[], &l);
        assert_eq!((v.decision.kind(), v.exit_status), (F, 0));
        assert_eq!(v.decision.why(), "every rank exited 0 with no stop asked");
        // mark_finished wins even over a stop or a failure after it.
        let stopped = Facts {
            marked_finished: true,
            ..facts(Outcome::Stopped, Some(10))
        };
        assert_eq!(decide(&stopped, &[], &l).decision.kind(), F);
        let failed = Facts {
            marked_finished: true,
            status: 75,
            ..facts(Outcome::Failed, Some(10))
        };
        let v = decide(&failed, &[], &l);
        assert_eq!((v.decision.kind(), v.exit_status), (F, 1));
        assert!(v.decision.why().contains("failed after it is not requeued"));
    }

    #[test]
    fn a_stop_after_progress_always_requeues() {
        let l = Limits::default();
        let allocs: Vec<Facts> = (1..=10)
            .map(|i| facts(Outcome::Stopped, Some(i * 100)))
            .collect();
        let ledger = run(&allocs, &l);
        assert!(decisions(&ledger).iter().all(|d| *d == (R, 75)));
        assert_eq!(ledger[1].why, "time-limit, progress 100..200");
        assert_eq!(ledger[0].why, "time-limit, reached step 100");
    }

    #[test]
    fn an_always_failing_job_is_requeued_exactly_max_requeues_times() {
        for max in [0u32, 1, 2, 5] {
            let l = Limits {
                max_requeues: max,
                max_no_progress: 0,
                ..Limits::default()
            };
            let allocs = vec![facts(Outcome::Failed, None); max as usize + 1];
            let ledger = run(&allocs, &l);
            let mut want = vec![(R, 75); max as usize];
            want.push((S, 1));
            assert_eq!(decisions(&ledger), want, "max {max}");
            let last = &ledger.last().unwrap().why;
            assert!(
                last.contains(&format!(
                    "failed, {} in a row: more than --max-requeues {max}",
                    max + 1
                )),
                "{last}"
            );
        }
    }

    #[test]
    fn a_stopped_allocation_breaks_the_run_of_failures() {
        let l = Limits::default();
        let ledger = run(
            &[
                facts(Outcome::Failed, Some(100)),
                facts(Outcome::Lost, Some(200)),
                facts(Outcome::Stopped, Some(300)),
                facts(Outcome::Failed, Some(400)),
                facts(Outcome::Failed, Some(500)),
                facts(Outcome::Lost, Some(600)),
            ],
            &l,
        );
        assert_eq!(
            decisions(&ledger),
            [(R, 75), (R, 75), (R, 75), (R, 75), (R, 75), (S, 1)]
        );
        assert_eq!(
            ledger[5].why,
            "node lost, 3 in a row: more than --max-requeues 2"
        );
        assert_eq!(ledger[4].why, "failed, 2 in a row (--max-requeues 2)");
    }

    #[test]
    fn the_failure_status_or_no_restart_exit_code_says_do_not_requeue() {
        let failed = Facts {
            status: 137,
            ..facts(Outcome::Failed, None)
        };
        let l = Limits {
            max_requeues: 0,
            ..Limits::default()
        };
        assert_eq!(decide(&failed, &[], &l).exit_status, 137);
        let lost = facts(Outcome::Lost, None);
        assert_eq!(
            decide(&lost, &[], &l).exit_status,
            1,
            "75 would say requeue"
        );
        let ft = Limits {
            no_restart_exit_code: Some(93),
            ..l
        };
        assert_eq!(decide(&failed, &[], &ft).exit_status, 93);
        assert_eq!(decide(&lost, &[], &ft).exit_status, 93);
    }

    #[test]
    fn a_lost_node_is_excluded_from_the_next_allocation() {
        let lost = Facts {
            blame: vec!["n2".into()],
            ..facts(Outcome::Lost, Some(5))
        };
        let v = decide(&lost, &[], &Limits::default());
        assert_eq!(v.decision.exclude(), ["n2".to_string()]);
        assert_eq!(v.exit_status, 75);
        // A stop excludes nobody.
        let l = Limits {
            max_requeues: 0,
            ..Limits::default()
        };
        assert!(decide(&lost, &[], &l).decision.exclude().is_empty());
    }

    #[test]
    fn no_progress_over_the_allocations_stops_requeueing_and_says_so() {
        let l = Limits::default();
        // Preempted again and again at the same step.
        let mut allocs = vec![facts(Outcome::Stopped, Some(500))];
        allocs.extend(vec![facts(Outcome::Stopped, Some(500)); 3]);
        let ledger = run(&allocs, &l);
        assert_eq!(decisions(&ledger), [(R, 75), (R, 75), (R, 75), (S, 1)]);
        assert_eq!(
            ledger[3].why,
            "no progress: the highest step (500) grew by less than 10 in each of the last 3 allocations (--max-no-progress 3, --min-progress-steps 10)"
        );
        assert_eq!(
            ledger[1].why,
            "time-limit, no progress (1 of --max-no-progress 3 in a row)"
        );
        // Growing by less than --min-progress-steps is no progress; 0 turns the check off.
        let l100 = Limits {
            min_progress_steps: 100,
            ..l.clone()
        };
        let slow: Vec<Facts> = (0..4)
            .map(|i| facts(Outcome::Stopped, Some(500 + i * 10)))
            .collect();
        let ledger = run(&slow, &l100);
        assert_eq!(decisions(&ledger).last(), Some(&(S, 1)));
        assert_eq!(
            ledger[3].why,
            "no progress: the highest step (530) grew by less than 100 in each of the last 3 allocations (--max-no-progress 3, --min-progress-steps 100)"
        );
        let off = Limits {
            max_no_progress: 0,
            ..l
        };
        assert!(decisions(&run(&allocs, &off)).iter().all(|d| *d == (R, 75)));
    }

    #[test]
    fn a_step_or_two_of_jitter_is_not_progress_by_default() {
        // Field finding 40: a job that never resumes from its checkpoint is stopped for its time
        // limit at about the same step each time; a one-step gain must not reset the count.
        let allocs: Vec<Facts> = [158, 159, 160, 159]
            .iter()
            .map(|&s| facts(Outcome::Stopped, Some(s)))
            .collect();
        let ledger = run(&allocs, &Limits::default());
        assert_eq!(decisions(&ledger), [(R, 75), (R, 75), (R, 75), (S, 1)]);
        // 10 steps more is progress.
        let growing: Vec<Facts> = (0..5)
            .map(|i| facts(Outcome::Stopped, Some(158 + 10 * i)))
            .collect();
        let ledger = run(&growing, &Limits::default());
        assert!(decisions(&ledger).iter().all(|d| *d == (R, 75)));
    }

    #[test]
    fn allocations_stopped_before_any_step_made_no_progress() {
        let l = Limits::default();
        // Stopped before a first step, again and again (a lead as long as the allocation).
        let ledger = run(&vec![facts(Outcome::Stopped, None); 3], &l);
        assert_eq!(decisions(&ledger), [(R, 75), (R, 75), (S, 1)]);
        assert_eq!(
            ledger[0].why,
            "time-limit, no step reported (1 of --max-no-progress 3 in a row)"
        );
        assert_eq!(
            ledger[2].why,
            "no progress: no rank reported a step to vigil.should_stop(step) in the last 3 allocations (--max-no-progress 3, --min-progress-steps 10)"
        );
        // Once steps were reported, an allocation without any made none either.
        let mut allocs = vec![facts(Outcome::Stopped, Some(7))];
        allocs.extend(vec![facts(Outcome::Stopped, None); 3]);
        assert_eq!(decisions(&run(&allocs, &l)).last(), Some(&(S, 1)));
        // 0 turns the check off.
        let off = Limits {
            max_no_progress: 0,
            ..l.clone()
        };
        let ledger = run(&vec![facts(Outcome::Stopped, None); 6], &off);
        assert!(decisions(&ledger).iter().all(|d| *d == (R, 75)));
    }

    #[test]
    fn a_requeue_that_cannot_be_recorded_is_a_stop() {
        let l = Limits::default();
        let v = decide(&facts(Outcome::Failed, None), &[], &l);
        assert_eq!(v.decision.kind(), R);
        let u = unrecorded(v, 3, "/s");
        assert_eq!((u.decision.kind(), u.exit_status), (S, 3));
        assert!(u.decision.why().starts_with(
            "failed, 1 in a row (--max-requeues 2), but the ledger in /s cannot be written"
        ));
        let stopped = unrecorded(decide(&facts(Outcome::Stopped, Some(4)), &[], &l), 75, "/s");
        assert_eq!((stopped.decision.kind(), stopped.exit_status), (S, 1));
        let done = decide(&facts(Outcome::Finished, Some(4)), &[], &l);
        assert_eq!(unrecorded(done.clone(), 0, "/s"), done);
    }

    #[test]
    fn failures_without_steps_are_bounded_by_max_requeues_as_before() {
        // Ranks that never call should_stop(step) and just fail: --max-requeues decides, even
        // when it allows more than --max-no-progress.
        let l = Limits {
            max_requeues: 4,
            ..Limits::default()
        };
        let ledger = run(&vec![facts(Outcome::Failed, None); 5], &l);
        assert_eq!(
            decisions(&ledger),
            [(R, 75), (R, 75), (R, 75), (R, 75), (S, 1)]
        );
        assert!(ledger[4].why.contains("more than --max-requeues 4"));
    }

    #[test]
    fn in_job_no_progress_stops() {
        let v = decide(
            &facts(Outcome::NoProgress, Some(40)),
            &[],
            &Limits::default(),
        );
        assert_eq!((v.decision.kind(), v.exit_status), (S, 1));
        assert!(
            v.decision.why().contains("stayed at step 40"),
            "{}",
            v.decision.why()
        );
        let ft = Limits {
            no_restart_exit_code: Some(93),
            ..Limits::default()
        };
        assert_eq!(
            decide(&facts(Outcome::NoProgress, None), &[], &ft).exit_status,
            93
        );
    }

    #[test]
    fn attempts_without_progress() {
        let a = |v: &[Option<u64>], n| attempt_no_progress(v, n, 1);
        assert!(!a(&[Some(10), Some(20), Some(30)], 2));
        assert!(a(&[Some(10), Some(20), Some(20), Some(15)], 2));
        assert!(!a(&[Some(10), Some(20), Some(20), Some(21)], 2));
        assert!(a(&[Some(10), None, None], 2));
        assert!(
            !a(&[None, None, None], 1),
            "no step ever: unknown, not stuck"
        );
        assert!(!a(&[Some(10), Some(10)], 0), "0 turns it off");
        assert!(!a(&[], 1));
        assert!(attempt_no_progress(&[Some(10), Some(50)], 1, 100));
    }

    #[test]
    fn a_job_that_cannot_be_requeued_ends_with_a_clear_message() {
        let stopped = Facts {
            requeue_allowed: Some(false),
            ..facts(Outcome::Stopped, Some(10))
        };
        let v = decide(&stopped, &[], &Limits::default());
        assert_eq!((v.decision.kind(), v.exit_status), (S, 75));
        assert!(
            v.decision
                .why()
                .contains("Requeue=0: submitted with --no-requeue"),
            "{}",
            v.decision.why()
        );
    }

    #[test]
    fn a_requeue_by_hand_after_a_stop_starts_the_counts_afresh() {
        let l = Limits {
            max_requeues: 1,
            ..Limits::default()
        };
        let mut ledger = run(&vec![facts(Outcome::Failed, Some(1)); 2], &l);
        assert_eq!(decisions(&ledger), [(R, 75), (S, 1)]);
        let again = record(3, &facts(Outcome::Failed, Some(2)), &l, &ledger);
        assert_eq!((again.decision, again.exit_status), (R, 75));
        ledger.push(again);
    }

    proptest! {
        /// The promise: allocations that make no progress end in a stop, never an endless
        /// requeue, whatever mix of stops, failures and lost nodes they are.
        #[test]
        fn allocations_without_progress_are_never_requeued_forever(
            outcomes in proptest::collection::vec(0u8..3, 1..200),
            stuck_at in proptest::option::of(0u64..1000),
            max_requeues in 0u32..4, max_np in 1u32..4,
        ) {
            let l = Limits { max_requeues, max_no_progress: max_np, ..Limits::default() };
            let bound = ((max_np + 1) * (max_requeues + 1)) as usize;
            let mut ledger: Vec<Record> = Vec::new();
            for (i, o) in outcomes.iter().enumerate() {
                let outcome = [Outcome::Stopped, Outcome::Failed, Outcome::Lost][*o as usize];
                let r = record(i as u32 + 1, &facts(outcome, stuck_at), &l, &ledger);
                let requeued = r.decision == DecisionKind::Requeue;
                ledger.push(r);
                if !requeued {
                    break;
                }
            }
            let requeues = ledger.iter().filter(|r| r.decision == DecisionKind::Requeue).count();
            prop_assert!(requeues < bound, "{} requeues: {:?}", requeues, decisions(&ledger));
        }

        #[test]
        fn decisions_and_statuses_agree(
            outcomes in proptest::collection::vec(0u8..5, 1..12),
            steps in proptest::collection::vec(proptest::option::of(0u64..1000), 12),
            status in -5i32..300,
            max_requeues in 0u32..4, max_np in 0u32..4, min in 0u64..50,
            no_restart in proptest::option::of(1i32..255),
            allowed in proptest::option::of(proptest::bool::ANY),
            marked in proptest::bool::ANY,
        ) {
            let l = Limits { max_requeues, max_no_progress: max_np, min_progress_steps: min, no_restart_exit_code: no_restart };
            let mut ledger: Vec<Record> = Vec::new();
            for (i, o) in outcomes.iter().enumerate() {
                let outcome = [Outcome::Finished, Outcome::Stopped, Outcome::Failed, Outcome::Lost, Outcome::NoProgress][*o as usize];
                let f = Facts { status, marked_finished: marked && i % 3 == 0, requeue_allowed: allowed, ..facts(outcome, steps[i]) };
                let v = decide(&f, &ledger, &l);
                match v.decision.kind() {
                    DecisionKind::Finished => {
                        prop_assert!(f.marked_finished || outcome == Outcome::Finished);
                        prop_assert!(v.exit_status != 75);
                    }
                    DecisionKind::Requeue => {
                        prop_assert_eq!(v.exit_status, 75);
                        prop_assert!(allowed != Some(false));
                        prop_assert!(matches!(outcome, Outcome::Stopped | Outcome::Failed | Outcome::Lost));
                    }
                    DecisionKind::Stop => {
                        prop_assert!(v.exit_status != 0);
                        prop_assert!((1..=255).contains(&v.exit_status));
                    }
                }
                prop_assert!(!v.decision.why().is_empty() && !v.decision.why().contains('\n'));
                let r = record(i as u32 + 1, &f, &l, &ledger);
                ledger.push(r);
            }
            // Never more consecutive requeued failures than allowed.
            let mut run = 0;
            for r in &ledger {
                if r.outcome.is_failure() && r.decision == DecisionKind::Requeue { run += 1; } else if !r.outcome.is_failure() || r.decision != DecisionKind::Requeue { run = 0; }
                prop_assert!(run <= max_requeues);
            }
        }
    }
}
