//! The problems `vigil watch` looks for, as pure functions of what was read (a job's
//! [`History`], what its event logs say of standbys, Slurm's view of the job), the thresholds
//! and the time now. No I/O here: `gather.rs` reads, `send.rs` sends. docs/watch.md lists every
//! rule.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use vigil_report::History;

/// The thresholds, from the command line.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// A restart storm: this many in-job restarts within `storm_window`.
    pub storm_restarts: usize,
    pub storm_window: Duration,
    /// No new highest step for this long while the job runs.
    pub stall: Duration,
    /// No event log written for this long while Slurm says RUNNING.
    pub silent: Duration,
    /// A requeue loop: this many allocations in a row that failed and were requeued.
    pub requeue_loop: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            storm_restarts: 3,
            storm_window: Duration::from_secs(15 * 60),
            stall: Duration::from_secs(30 * 60),
            silent: Duration::from_secs(10 * 60),
            requeue_loop: 3,
        }
    }
}

/// Slurm's view of the job (`scontrol show job`), the fields the rules read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SlurmJob {
    pub id: String,
    /// `JobState`: `RUNNING`, `PENDING`, ...
    pub state: String,
    /// `Reason`: `None`, `JobHoldMaxRequeue`, `ReqNodeNotAvail,_UnavailableNodes:n[1-2]`, ...
    pub reason: String,
    /// `ReqNodeList` and the `UnavailableNodes:` of the reason, expanded.
    pub wanted: Vec<String>,
    /// `ExcNodeList`, expanded.
    pub excluded: Vec<String>,
}

/// What the event logs of the latest allocation say about hot spares.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Spares {
    /// Hosts that waited as a standby at some time in the latest allocation.
    pub had: BTreeSet<String>,
    /// Of them, those still standing by (their last record of the two is `standby`, not a
    /// `attempt_start`).
    pub left: BTreeSet<String>,
}

/// Everything the rules read about one job.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    pub history: History,
    pub spares: Spares,
    /// The newest modification time of the latest allocation's event logs (Unix seconds).
    pub last_write: Option<f64>,
    /// None where Slurm's tools are absent or the job is unknown to them.
    pub slurm: Option<SlurmJob>,
}

/// One problem: `key` is stable across passes (the dedup key), `text` is what is said.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Problem {
    pub key: String,
    pub text: String,
}

fn problem(key: impl Into<String>, text: impl Into<String>) -> Problem {
    Problem {
        key: key.into(),
        text: text.into(),
    }
}

/// Every problem of the job now, sorted by key.
pub fn problems(f: &Facts, limits: &Limits, now: f64) -> Vec<Problem> {
    let mut out = Vec::new();
    out.extend(restart_storm(&f.history, limits, now));
    out.extend(no_progress(f, limits, now));
    out.extend(spares_exhausted(f));
    out.extend(node_blamed_twice(&f.history));
    out.extend(held_or_unreachable(f));
    out.extend(requeue_loop(&f.history, limits));
    out.extend(stopped_writing(f, limits, now));
    out.sort();
    out
}

fn dur(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

/// N or more in-job restarts within the window ending now (each restart counted once, though
/// every node's log records it).
pub fn restart_storm(h: &History, l: &Limits, now: f64) -> Option<Problem> {
    let since = now - l.storm_window.as_secs_f64();
    let mut seen = BTreeSet::new();
    for (i, run) in h.runs.iter().enumerate() {
        // Every node of an allocation logs the same restart; a requeued job's next allocation
        // counts its attempts from 0 again under the same run id.
        let job = match h.allocations.iter().find(|a| a.runs.contains(&i)) {
            Some(a) => format!("allocation {}", a.number),
            None => run
                .run_id
                .clone()
                .unwrap_or_else(|| run.source.display().to_string()),
        };
        for r in run.restarts.iter().filter(|r| r.ts >= since && r.ts <= now) {
            seen.insert((job.clone(), r.to_attempt));
        }
    }
    (seen.len() >= l.storm_restarts.max(1)).then(|| {
        problem(
            "restart_storm",
            format!(
                "restart storm: {} in-job restarts in the last {} (alert at {})",
                seen.len(),
                dur(l.storm_window),
                l.storm_restarts
            ),
        )
    })
}

/// Whether the job runs: Slurm's word where there is one, else the latest allocation has no end
/// (no ledger record, no `result`).
fn running(f: &Facts) -> bool {
    match &f.slurm {
        Some(s) => s.state == "RUNNING",
        None => f
            .history
            .allocations
            .last()
            .is_some_and(|a| a.end.is_none()),
    }
}

/// The latest allocation's runs (all runs when there is no allocation).
fn latest_runs(h: &History) -> Vec<&vigil_report::NodeRun> {
    match h.allocations.last() {
        Some(a) if !a.runs.is_empty() => a.runs.iter().filter_map(|&i| h.runs.get(i)).collect(),
        _ => h.runs.iter().collect(),
    }
}

/// The job runs, has reported steps in its latest allocation, and its highest step was first
/// reached longer than `stall` ago.
pub fn no_progress(f: &Facts, l: &Limits, now: f64) -> Option<Problem> {
    if !running(f) {
        return None;
    }
    let mut best: Option<(u64, f64)> = None;
    for run in latest_runs(&f.history) {
        for p in &run.steps {
            best = match best {
                Some((s, t)) if p.step < s || (p.step == s && p.ts >= t) => Some((s, t)),
                _ => Some((p.step, p.ts)),
            };
        }
    }
    let (step, at) = best?;
    let idle = now - at;
    (idle > l.stall.as_secs_f64()).then(|| {
        problem(
            "no_progress",
            format!(
                "no progress: step {step} was reached {} ago and none since, while the job runs (alert after {})",
                dur(Duration::from_secs_f64(idle.max(0.0))),
                dur(l.stall)
            ),
        )
    })
}

/// The latest allocation had standbys and none is left, or an attempt ended for want of one.
pub fn spares_exhausted(f: &Facts) -> Option<Problem> {
    let wanted = latest_runs(&f.history).into_iter().any(|r| {
        r.attempts.iter().any(|a| {
            a.reason
                .as_deref()
                .is_some_and(|w| w.contains("no standby left"))
        })
    });
    let used_up = !f.spares.had.is_empty() && f.spares.left.is_empty();
    (wanted || used_up).then(|| {
        let had = f.spares.had.iter().cloned().collect::<Vec<_>>().join(", ");
        let text = if had.is_empty() {
            "spares exhausted: an attempt found no standby left to take a lost node's place".into()
        } else {
            format!("spares exhausted: every standby ({had}) has taken a node's place; the next lost node ends the allocation")
        };
        problem("spares_exhausted", text)
    })
}

/// A host blamed in two or more allocations or attempts: excluded in the ledger, or a
/// `node_fault` in its event log. Within one allocation, an exclusion and the faults that led
/// to it count once; faults in different attempts count each.
pub fn node_blamed_twice(h: &History) -> Vec<Problem> {
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    let mut in_allocation = BTreeSet::new();
    for a in &h.allocations {
        let mut here: BTreeMap<&str, BTreeSet<u32>> = BTreeMap::new();
        for &i in &a.runs {
            let Some(run) = h.runs.get(i) else { continue };
            in_allocation.insert(i);
            for nf in &run.node_faults {
                here.entry(run.host.as_str())
                    .or_default()
                    .insert(nf.attempt);
            }
        }
        for x in &a.excluded {
            here.entry(x.as_str()).or_default();
        }
        for (host, attempts) in here {
            *count.entry(host).or_default() += attempts.len().max(1);
        }
    }
    for (i, run) in h.runs.iter().enumerate() {
        if !in_allocation.contains(&i) {
            let attempts: BTreeSet<u32> = run.node_faults.iter().map(|n| n.attempt).collect();
            *count.entry(run.host.as_str()).or_default() += attempts.len();
        }
    }
    count
        .into_iter()
        .filter(|(host, n)| *n >= 2 && !host.is_empty())
        .map(|(host, n)| {
            problem(
                format!("node_blamed:{host}"),
                format!("node {host} blamed {n} times (excluded or faulted); check or drain it"),
            )
        })
        .collect()
}

/// Slurm holds the job for too many requeues, or it waits for nodes it excluded.
pub fn held_or_unreachable(f: &Facts) -> Option<Problem> {
    let s = f.slurm.as_ref()?;
    if s.reason.starts_with("JobHoldMaxRequeue") {
        return Some(problem(
            "held",
            format!(
                "job {} held by Slurm (JobHoldMaxRequeue: requeued too many times); `scontrol release {}` once the cause is fixed",
                s.id, s.id
            ),
        ));
    }
    if !s.reason.starts_with("ReqNodeNotAvail") {
        return None;
    }
    let mut excluded: BTreeSet<&str> = s.excluded.iter().map(String::as_str).collect();
    for a in &f.history.allocations {
        excluded.extend(a.excluded.iter().map(String::as_str));
    }
    let never: Vec<&str> = s
        .wanted
        .iter()
        .map(String::as_str)
        .filter(|n| excluded.contains(n))
        .collect();
    (!never.is_empty()).then(|| {
        problem(
            "unreachable_nodes",
            format!(
                "job {} is {} ({}) on node(s) it excluded: {}; it can never start as it is",
                s.id,
                s.state,
                s.reason,
                never.join(", ")
            ),
        )
    })
}

/// The ledger's last N allocations all failed (failed, lost, no_progress) and were requeued.
pub fn requeue_loop(h: &History, l: &Limits) -> Option<Problem> {
    let n = l.requeue_loop.max(1);
    let ledger: Vec<_> = h.allocations.iter().filter(|a| a.from_ledger).collect();
    let tail = ledger.get(ledger.len().checked_sub(n)?..)?;
    let failing = tail.iter().all(|a| {
        a.requeued()
            && matches!(
                a.outcome.as_deref(),
                Some("failed" | "lost" | "no_progress")
            )
    });
    failing.then(|| {
        let last = tail[tail.len() - 1];
        let why = last.why.as_deref().filter(|w| !w.is_empty());
        problem(
            "requeue_loop",
            format!(
                "requeue loop: the last {n} allocations ({}..{}) failed and were requeued{}",
                tail[0].number,
                last.number,
                why.map(|w| format!("; the last: {w}")).unwrap_or_default()
            ),
        )
    })
}

/// Slurm says RUNNING but no event log was written for longer than `silent`.
pub fn stopped_writing(f: &Facts, l: &Limits, now: f64) -> Option<Problem> {
    let s = f.slurm.as_ref().filter(|s| s.state == "RUNNING")?;
    let last = f.last_write?;
    let quiet = now - last;
    (quiet > l.silent.as_secs_f64()).then(|| {
        problem(
            "stopped_writing",
            format!(
                "job {} is RUNNING but its agents wrote nothing for {} (alert after {}): an agent hung or was stopped",
                s.id,
                dur(Duration::from_secs_f64(quiet.max(0.0))),
                dur(l.silent)
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use vigil_events::ledger::DecisionKind;
    use vigil_report::{Allocation, Attempt, NodeRun, Restart, StepPoint};

    fn run(host: &str) -> NodeRun {
        NodeRun {
            host: host.into(),
            run_id: Some("r".into()),
            ..NodeRun::default()
        }
    }

    fn restart(ts: f64, to: u32) -> Restart {
        Restart {
            ts,
            from_attempt: to - 1,
            to_attempt: to,
            ..Restart::default()
        }
    }

    fn alloc(n: u32, outcome: &str, decision: DecisionKind) -> Allocation {
        Allocation {
            number: n,
            outcome: Some(outcome.into()),
            decision: Some(decision),
            end: Some(1.0),
            from_ledger: true,
            ..Allocation::default()
        }
    }

    fn keys(p: &[Problem]) -> Vec<&str> {
        p.iter().map(|p| p.key.as_str()).collect()
    }

    #[test]
    fn a_restart_storm_counts_each_restart_once_within_the_window() {
        let mut a = run("n1");
        let mut b = run("n2");
        a.restarts = vec![restart(100.0, 1), restart(200.0, 2), restart(300.0, 3)];
        b.restarts = a.restarts.clone();
        let h = History {
            runs: vec![a, b],
            ..History::default()
        };
        let l = Limits {
            storm_window: Duration::from_secs(250),
            ..Limits::default()
        };
        assert!(restart_storm(&h, &l, 320.0).is_some());
        // The first restart has left the window: two remain, under the three.
        assert!(restart_storm(&h, &l, 360.0).is_none());
    }

    #[test]
    fn requeued_allocations_restarting_from_attempt_0_under_one_run_id_count_each() {
        let runs: Vec<NodeRun> = (0..3)
            .map(|i| {
                let mut r = run("n1");
                r.restarts = vec![restart(100.0 + f64::from(i), 1)];
                r
            })
            .collect();
        let allocations = (0..3)
            .map(|i| Allocation {
                number: i as u32 + 1,
                runs: vec![i],
                ..Allocation::default()
            })
            .collect();
        let h = History {
            runs,
            allocations,
            ..History::default()
        };
        assert!(restart_storm(&h, &Limits::default(), 200.0).is_some());
    }

    #[test]
    fn no_progress_only_while_running_and_after_the_stall() {
        let mut r = run("n1");
        r.steps = vec![
            StepPoint {
                ts: 10.0,
                step: 5,
                ..StepPoint::default()
            },
            StepPoint {
                ts: 50.0,
                step: 5,
                ..StepPoint::default()
            },
        ];
        let mut f = Facts {
            history: History {
                runs: vec![r],
                allocations: vec![Allocation {
                    runs: vec![0],
                    ..Allocation::default()
                }],
                ..History::default()
            },
            ..Facts::default()
        };
        let l = Limits {
            stall: Duration::from_secs(100),
            ..Limits::default()
        };
        assert!(no_progress(&f, &l, 100.0).is_none());
        // Step 5 was first reached at 10.
        assert!(no_progress(&f, &l, 111.0).is_some());
        f.history.allocations[0].end = Some(60.0);
        assert!(no_progress(&f, &l, 111.0).is_none(), "ended");
        f.slurm = Some(SlurmJob {
            state: "RUNNING".into(),
            ..SlurmJob::default()
        });
        assert!(no_progress(&f, &l, 111.0).is_some(), "Slurm's word wins");
    }

    #[test]
    fn spares_are_exhausted_when_none_is_left_or_an_attempt_wanted_one() {
        let mut f = Facts::default();
        assert!(spares_exhausted(&f).is_none(), "no spares at all");
        f.spares.had.insert("n3".into());
        f.spares.left.insert("n3".into());
        assert!(spares_exhausted(&f).is_none());
        f.spares.left.clear();
        assert!(spares_exhausted(&f).is_some());
        let mut r = run("n1");
        r.attempts.push(Attempt {
            reason: Some("attempt 2: no standby left to take the place of lost node(s) [1]".into()),
            ..Attempt::default()
        });
        let f = Facts {
            history: History {
                runs: vec![r],
                ..History::default()
            },
            ..Facts::default()
        };
        assert!(spares_exhausted(&f).is_some());
    }

    #[test]
    fn a_node_blamed_in_two_allocations_or_two_attempts_is_one_problem() {
        let mut faulty = run("n2");
        faulty.node_faults.push(vigil_report::history::NodeFault {
            ts: 1.0,
            attempt: 0,
            reason: "xid 79".into(),
        });
        let mut a1 = alloc(1, "lost", DecisionKind::Requeue);
        a1.excluded = vec!["n2".into()];
        a1.runs = vec![0];
        let h = History {
            runs: vec![faulty.clone()],
            allocations: vec![a1.clone()],
            ..History::default()
        };
        assert!(
            node_blamed_twice(&h).is_empty(),
            "a fault and its exclusion are one"
        );
        let mut a2 = alloc(2, "lost", DecisionKind::Requeue);
        a2.excluded = vec!["n2".into()];
        let h = History {
            runs: vec![faulty],
            allocations: vec![a1, a2],
            ..History::default()
        };
        assert_eq!(keys(&node_blamed_twice(&h)), ["node_blamed:n2"]);
    }

    #[test]
    fn a_held_job_and_one_waiting_for_its_excluded_nodes() {
        let mut f = Facts {
            slurm: Some(SlurmJob {
                id: "7".into(),
                state: "PENDING".into(),
                reason: "JobHoldMaxRequeue".into(),
                ..SlurmJob::default()
            }),
            ..Facts::default()
        };
        assert_eq!(held_or_unreachable(&f).unwrap().key, "held");
        let s = f.slurm.as_mut().unwrap();
        s.reason = "ReqNodeNotAvail,_UnavailableNodes:n1".into();
        s.wanted = vec!["n1".into()];
        assert!(held_or_unreachable(&f).is_none(), "n1 is not excluded");
        f.slurm.as_mut().unwrap().excluded = vec!["n1".into()];
        assert_eq!(held_or_unreachable(&f).unwrap().key, "unreachable_nodes");
        f.slurm.as_mut().unwrap().excluded.clear();
        let mut a = alloc(1, "lost", DecisionKind::Requeue);
        a.excluded = vec!["n1".into()];
        f.history.allocations.push(a);
        assert!(
            held_or_unreachable(&f).is_some(),
            "the ledger's exclusions count"
        );
    }

    #[test]
    fn a_requeue_loop_is_the_last_n_allocations_failed_and_requeued() {
        let l = Limits::default();
        let mut h = History {
            allocations: (1..=3)
                .map(|n| alloc(n, "failed", DecisionKind::Requeue))
                .collect(),
            ..History::default()
        };
        assert!(requeue_loop(&h, &l).is_some());
        h.allocations[1].outcome = Some("stopped".into());
        assert!(
            requeue_loop(&h, &l).is_none(),
            "a time-limit stop is no failure"
        );
        h.allocations.truncate(1);
        assert!(requeue_loop(&h, &l).is_none(), "too few");
        h.allocations = (1..=4)
            .map(|n| alloc(n, "failed", DecisionKind::Requeue))
            .collect();
        h.allocations
            .push(alloc(5, "finished", DecisionKind::Finished));
        assert!(requeue_loop(&h, &l).is_none(), "it got out of the loop");
    }

    #[test]
    fn an_agent_that_stopped_writing_only_counts_while_slurm_says_running() {
        let l = Limits {
            silent: Duration::from_secs(60),
            ..Limits::default()
        };
        let mut f = Facts {
            last_write: Some(1000.0),
            ..Facts::default()
        };
        assert!(stopped_writing(&f, &l, 2000.0).is_none(), "no Slurm");
        f.slurm = Some(SlurmJob {
            id: "9".into(),
            state: "RUNNING".into(),
            ..SlurmJob::default()
        });
        assert!(stopped_writing(&f, &l, 1050.0).is_none());
        assert_eq!(
            stopped_writing(&f, &l, 1061.0).unwrap().key,
            "stopped_writing"
        );
        f.slurm.as_mut().unwrap().state = "COMPLETED".into();
        assert!(stopped_writing(&f, &l, 2000.0).is_none());
    }

    #[test]
    fn problems_are_sorted_by_key() {
        let f = Facts {
            last_write: Some(0.0),
            slurm: Some(SlurmJob {
                id: "1".into(),
                state: "RUNNING".into(),
                reason: "JobHoldMaxRequeue".into(),
                ..SlurmJob::default()
            }),
            ..Facts::default()
        };
        let p = problems(&f, &Limits::default(), 1e6);
        assert_eq!(keys(&p), ["held", "stopped_writing"]);
    }
}
