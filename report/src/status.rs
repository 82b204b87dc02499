//! vigil's own view of a job for `vigil status`.

use crate::fmt::{duration, utc};
use crate::history::{Allocation, History};

/// The allocations listed at most; earlier ones are counted in one line.
const MAX_ALLOCATIONS: usize = 10;

impl History {
    /// vigil's view, one line each: the allocations and their outcomes, restarts, requeues, the
    /// current and highest step, the last failure and its cause, and the last straggler report's
    /// worst rank.
    /// Text from the records is escaped for the terminal ([`crate::term_safe_line`]): an event
    /// log cannot move the cursor, retitle the window or add lines.
    pub fn status_lines(&self) -> Vec<String> {
        self.status_lines_raw()
            .iter()
            .map(|l| crate::term_safe_line(l))
            .collect()
    }

    fn status_lines_raw(&self) -> Vec<String> {
        let mut out = Vec::new();
        let restarts: usize = self.runs_restarts();
        let requeues = self.allocations.iter().filter(|a| a.requeued()).count();
        out.push(format!(
            "vigil: {} allocation{}, {} in-job restart{}, {} requeue{}",
            self.allocations.len(),
            plural(self.allocations.len()),
            restarts,
            plural(restarts),
            requeues,
            plural(requeues)
        ));
        let skip = self.allocations.len().saturating_sub(MAX_ALLOCATIONS);
        if skip > 0 {
            out.push(format!("  ({skip} earlier allocations not shown)"));
        }
        for a in &self.allocations[skip..] {
            out.push(format!("  {}", self.allocation_line(a)));
        }
        if let Some(line) = self.steps_line() {
            out.push(line);
        }
        if let Some(m) = self
            .moments()
            .into_iter()
            .rev()
            .find(|m| matches!(m.kind, "failure" | "hang" | "lost" | "node_fault"))
        {
            out.push(format!(
                "last failure: {} {}: {}",
                utc(m.ts),
                m.node,
                m.text
            ));
        }
        if let Some(r) = self.straggler_reports().last() {
            let mut line = format!("stragglers: last report {}", utc(r.ts));
            match r.worst() {
                Some(w) => line.push_str(&format!(": worst {}", w.describe())),
                None => line.push_str(": no rank scored yet"),
            }
            match (r.stragglers.len(), r.threshold) {
                (0, _) => line.push_str("; no stragglers"),
                (n, Some(t)) => line.push_str(&format!("; {n} below {t:.2}: {:?}", r.stragglers)),
                (n, None) => line.push_str(&format!("; {n} stragglers: {:?}", r.stragglers)),
            }
            out.push(line);
        }
        out
    }

    fn runs_restarts(&self) -> usize {
        // Every node logs the same restarts: count node rank 0's (or the lowest rank's) per
        // allocation.
        self.allocations
            .iter()
            .map(|a| {
                a.runs
                    .iter()
                    .map(|&i| &self.runs[i])
                    .min_by_key(|r| r.node_rank)
                    .map_or(a.restarts as usize, |r| r.restarts.len())
            })
            .sum()
    }

    fn allocation_line(&self, a: &Allocation) -> String {
        let mut s = format!("allocation {}", a.number);
        if let Some(j) = &a.job_id {
            s.push_str(&format!(" (job {j})"));
        }
        // Loopback test nodes share one host name: count node ranks too.
        let mut ranks: Vec<u32> = a.runs.iter().map(|&i| self.runs[i].node_rank).collect();
        ranks.sort();
        ranks.dedup();
        let n = a.nodes.len().max(ranks.len());
        let nodes = if a.nodes.is_empty() {
            format!("{n} node{}", plural(n))
        } else {
            format!("{n} node{} ({})", plural(n), a.nodes.join(", "))
        };
        match a.end {
            None => {
                let attempt = a
                    .runs
                    .iter()
                    .filter_map(|&i| self.runs[i].attempts.last())
                    .map(|at| at.attempt)
                    .max();
                s.push_str(&format!(": running since {}, {nodes}", utc(a.start)));
                if let Some(c) = attempt {
                    s.push_str(&format!(", attempt {c}"));
                }
            }
            Some(end) => {
                s.push_str(&format!(
                    ": {}, {}, {nodes}: {}",
                    utc(a.start),
                    duration(end - a.start),
                    a.outcome.as_deref().unwrap_or("unknown")
                ));
                if let Some(t) = &a.stop_trigger {
                    match a.stop_step {
                        Some(st) => s.push_str(&format!(" at step {st} ({t})")),
                        None => s.push_str(&format!(" ({t})")),
                    }
                }
                if a.restarts > 0 {
                    s.push_str(&format!(
                        " after {} restart{}",
                        a.restarts,
                        plural(a.restarts as usize)
                    ));
                }
                if let Some(d) = &a.decision {
                    s.push_str(&format!(" -> {d}"));
                }
                if let Some(w) = &a.why {
                    s.push_str(&format!(": {w}"));
                }
                if !a.from_ledger {
                    s.push_str(" (no ledger record)");
                }
            }
        }
        s
    }

    fn steps_line(&self) -> Option<String> {
        let last = self
            .runs
            .iter()
            .flat_map(|r| r.steps.iter().map(move |p| (p, r)))
            .max_by(|a, b| a.0.ts.total_cmp(&b.0.ts));
        let highest = self
            .runs
            .iter()
            .flat_map(|r| r.steps.iter().map(|p| p.step))
            .chain(self.allocations.iter().filter_map(|a| a.highest_step))
            .max();
        // `steps` records come at most every 10 s: an allocation's ledger record, written when
        // it ended, knows a later step than the last of them.
        let ledger_end = self
            .allocations
            .iter()
            .filter_map(|a| Some((a.end?, a.highest_step?, a.number)))
            .max_by(|a, b| a.0.total_cmp(&b.0));
        match (last, highest) {
            (Some((p, _)), Some(h)) if ledger_end.is_some_and(|(end, _, _)| end >= p.ts) => {
                let (end, step, n) = ledger_end.expect("checked");
                Some(format!(
                    "step: {step} (when allocation {n} ended, {}, from the ledger), highest {h}",
                    utc(end)
                ))
            }
            (Some((p, r)), Some(h)) => Some(format!(
                "step: {} ({}, {}), highest {h}",
                p.step,
                r.label(),
                utc(p.ts)
            )),
            (None, Some(h)) => Some(format!("step: highest {h} (from the ledger)")),
            _ => None,
        }
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

#[cfg(test)]
mod tests {
    use crate::history::build;
    use crate::records::{parse_jsonl, RecordFile};
    use std::path::Path;

    fn file(path: &str, text: &str) -> RecordFile {
        RecordFile {
            path: path.into(),
            records: parse_jsonl(text, Path::new(path)).0,
        }
    }

    #[test]
    fn status_names_allocations_restarts_requeues_step_failure_and_worst_straggler() {
        let ledger = file(
            "state/ledger.jsonl",
            concat!(
                r#"{"format":1,"allocation":1,"job_id":"42","nodes":["a"],"start":1767225600.0,"end":1767229200.0,"outcome":"stopped","highest_step":10,"restarts":0,"stop_step":10,"stop_trigger":"time-limit","decision":"requeue","why":"time-limit, reached step 10","excluded":[],"exit_status":75}"#,
                "\n"
            ),
        );
        let run = file(
            "runs/vigil_2/events.jsonl",
            concat!(
                r#"{"event":"cycle_start","cycle":0,"host":"a","node_rank":0,"ts":1767230000.0}"#,
                "\n",
                r#"{"event":"steps","cycle":0,"step":12,"min_step":11,"host":"a","node_rank":0,"ts":1767230010.0}"#,
                "\n",
                r#"{"event":"rank_exited","cycle":0,"rank":1,"exit_code":3,"expected":false,"host":"a","node_rank":0,"ts":1767230020.0}"#,
                "\n",
                r#"{"event":"restart","from_cycle":0,"to_cycle":1,"restarts_left":2,"host":"a","node_rank":0,"ts":1767230021.0}"#,
                "\n",
                r#"{"event":"cycle_start","cycle":1,"host":"a","node_rank":0,"ts":1767230022.0}"#,
                "\n",
                r#"{"event":"straggler_report","ranks":[{"rank":0,"relative":1.0,"individual":1.0,"host":"a"},{"rank":1,"relative":0.5,"individual":0.9,"host":"a"}],"stragglers":[1],"threshold":0.7,"unscored":0,"host":"a","node_rank":0,"ts":1767230030.0}"#,
                "\n",
            ),
        );
        let h = build("d".into(), &[run], &[ledger]);
        let lines = h.status_lines();
        let text = lines.join("\n");
        assert_eq!(
            lines[0], "vigil: 2 allocations, 1 in-job restart, 1 requeue",
            "{text}"
        );
        assert_eq!(lines[1], "  allocation 1 (job 42): 2026-01-01 00:00:00 UTC, 1h00m, 1 node (a): stopped at step 10 (time-limit) -> requeue: time-limit, reached step 10");
        assert_eq!(
            lines[2],
            "  allocation 2: running since 2026-01-01 01:13:20 UTC, 1 node (a), attempt 1"
        );
        assert_eq!(
            lines[3],
            "step: 12 (node 0 (a), 2026-01-01 01:13:30 UTC), highest 12"
        );
        assert_eq!(lines[4], "last failure: 2026-01-01 01:13:40 UTC node 0 (a): attempt 0: rank 1 exited with code 3");
        assert_eq!(lines[5], "stragglers: last report 2026-01-01 01:13:50 UTC: worst rank 1 on a (relative 0.50, individual 0.90); 1 below 0.70: [1]");
        assert_eq!(lines.len(), 6, "{text}");
    }

    #[test]
    fn an_allocation_is_numbered_as_its_ledger_numbers_it_zero_too() {
        // Field finding 45: the ledger's allocation 0 was shown as "allocation 1".
        let ledger = file(
            "state/ledger.jsonl",
            concat!(
                r#"{"format":1,"allocation":0,"job_id":"42","nodes":["a"],"start":1767225600.0,"end":1767229200.0,"outcome":"stopped","highest_step":10,"restarts":0,"decision":"requeue","why":"time-limit","excluded":[],"exit_status":75}"#,
                "\n"
            ),
        );
        let run = file(
            "runs/vigil_2/events.jsonl",
            concat!(
                r#"{"event":"cycle_start","cycle":0,"host":"a","node_rank":0,"ts":1767230000.0}"#,
                "\n"
            ),
        );
        let h = build("d".into(), &[run], &[ledger]);
        let numbers: Vec<u32> = h.allocations.iter().map(|a| a.number).collect();
        assert_eq!(numbers, vec![0, 1]);
        let lines = h.status_lines();
        assert!(
            lines[1].starts_with("  allocation 0 (job 42): "),
            "{lines:?}"
        );
        assert!(
            lines[2].starts_with("  allocation 1: running since"),
            "{lines:?}"
        );
    }

    #[test]
    fn the_step_is_the_ledgers_when_its_record_is_later_than_the_last_steps_record() {
        let ledger = file(
            "state/ledger.jsonl",
            concat!(
                r#"{"format":1,"allocation":1,"job_id":"demo","nodes":["vm"],"start":1767225600.0,"end":1767225610.0,"outcome":"finished","highest_step":29,"restarts":1,"decision":"finished","why":"done","excluded":[],"exit_status":0}"#,
                "\n"
            ),
        );
        let run = file(
            "runs/vigil_1/events.jsonl",
            concat!(
                r#"{"event":"cycle_start","cycle":0,"host":"vm","node_rank":0,"ts":1767225600.5}"#,
                "\n",
                r#"{"event":"steps","cycle":0,"step":0,"min_step":0,"host":"vm","node_rank":0,"ts":1767225603.0}"#,
                "\n",
            ),
        );
        let h = build("d".into(), &[run], &[ledger]);
        let lines = h.status_lines();
        assert!(
            lines.contains(&"step: 29 (when allocation 1 ended, 2026-01-01 00:00:10 UTC, from the ledger), highest 29".to_string()),
            "{lines:?}"
        );
    }
}
