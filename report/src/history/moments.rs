//! What a history tells as a timeline: its moments in time order ([`History::moments`]: the
//! allocations, attempts' ends, failures, hangs, in-process restarts, stops, requeues and
//! results), its span and its straggler reports.

use crate::model::{Allocation, History, Moment, NodeRun, StragglerReport};

impl History {
    /// The events that matter, in time order: allocations, attempts' ends, failures, hangs,
    /// restarts, stops, requeues, results.
    pub fn moments(&self) -> Vec<Moment> {
        let mut m: Vec<Moment> = self
            .allocations
            .iter()
            .flat_map(allocation_moments)
            .collect();
        // Each failure once: an attempt that failed for a rank's failure or hang listed here is
        // not listed again as `attempt N failed: <the same>` (every node of the job ends it with
        // the same reason), and an attempt's end every node saw alike is listed once.
        let mut alloc_of = vec![None; self.runs.len()];
        for a in &self.allocations {
            for &i in &a.runs {
                if let Some(x) = alloc_of.get_mut(i) {
                    *x = Some(a.number);
                }
            }
        }
        let mut explained = std::collections::BTreeSet::new();
        for (i, r) in self.runs.iter().enumerate() {
            for c in r
                .failures
                .iter()
                .map(|f| f.attempt)
                .chain(r.hangs.iter().map(|h| h.attempt))
            {
                explained.insert((alloc_of[i], c));
            }
        }
        let mut ends_seen = std::collections::BTreeSet::new();
        for (i, r) in self.runs.iter().enumerate() {
            let node = r.label();
            for a in &r.attempts {
                let Some(k) = a.end_kind.as_deref().filter(|k| *k != "done") else {
                    continue;
                };
                let key = (alloc_of[i], a.attempt);
                if (k == "failed" && explained.contains(&key))
                    || !ends_seen.insert((key, a.end_kind.clone(), a.reason.clone()))
                {
                    continue;
                }
                let mut text = format!("attempt {} {k}", a.attempt);
                if let Some(why) = &a.reason {
                    text.push_str(&format!(": {why}"));
                }
                m.push(Moment {
                    ts: a.end,
                    node: node.clone(),
                    kind: if k == "lost" { "lost" } else { "attempt" },
                    text,
                });
            }
            m.extend(run_moments(r, &node));
        }
        m.sort_by(|a, b| a.ts.total_cmp(&b.ts));
        m
    }

    /// Earliest and latest time in any record.
    pub fn span(&self) -> Option<(f64, f64)> {
        let starts = self
            .runs
            .iter()
            .map(|r| r.start)
            .chain(self.allocations.iter().map(|a| a.start));
        let ends = self
            .runs
            .iter()
            .map(|r| r.end)
            .chain(self.allocations.iter().filter_map(|a| a.end));
        let lo = starts.fold(f64::INFINITY, f64::min);
        let hi = ends.fold(f64::NEG_INFINITY, f64::max);
        (lo.is_finite() && hi.is_finite()).then_some((lo, hi.max(lo)))
    }

    /// Every straggler report, in time order.
    pub fn straggler_reports(&self) -> Vec<&StragglerReport> {
        let mut v: Vec<_> = self
            .runs
            .iter()
            .flat_map(|r| r.straggler_reports.iter())
            .collect();
        v.sort_by(|a, b| a.ts.total_cmp(&b.ts));
        v
    }
}

/// An allocation's start and, when it ended, its end with its outcome, stop, decision and
/// exclusions.
fn allocation_moments(a: &Allocation) -> Vec<Moment> {
    let nodes = if a.nodes.is_empty() {
        String::new()
    } else {
        format!(" on {}", a.nodes.join(", "))
    };
    let mut m = vec![Moment {
        ts: a.start,
        node: "job".into(),
        kind: "allocation",
        text: format!("allocation {} started{nodes}", a.number),
    }];
    let Some(end) = a.end else {
        return m;
    };
    let mut text = format!(
        "allocation {} ended: {}",
        a.number,
        a.outcome.as_deref().unwrap_or("unknown")
    );
    if let Some(t) = &a.stop_trigger {
        match a.stop_step {
            Some(s) => text.push_str(&format!(" at step {s} ({t})")),
            None => text.push_str(&format!(" ({t})")),
        }
    }
    if let Some(d) = &a.decision {
        text.push_str(&format!(" -> {d}"));
    }
    if let Some(w) = &a.why {
        text.push_str(&format!(": {w}"));
    }
    if !a.excluded.is_empty() {
        text.push_str(&format!("; excluded {}", a.excluded.join(", ")));
    }
    let kind = match (a.requeued(), a.preempted()) {
        (true, true) => "preempted",
        (true, false) => "requeue",
        (false, _) => "allocation",
    };
    m.push(Moment {
        ts: end,
        node: "job".into(),
        kind,
        text,
    });
    m
}

/// One node's failures, hangs, restarts, stops, node faults, changed straggler reports and
/// result, in that order (ties in time keep it).
fn run_moments(r: &NodeRun, node: &str) -> Vec<Moment> {
    let mut m = Vec::new();
    let mut push = |ts: f64, kind: &'static str, text: String| {
        m.push(Moment {
            ts,
            node: node.to_string(),
            kind,
            text,
        })
    };
    for f in &r.failures {
        push(
            f.ts,
            "failure",
            format!("attempt {}: {}", f.attempt, f.describe()),
        );
    }
    for h in &r.hangs {
        let mut text = format!("attempt {}: {}", h.attempt, h.describe());
        if let Some(m) = &h.measured {
            text.push_str(&format!(": {m}"));
        }
        push(h.ts, "hang", text);
    }
    let waits = r.waits();
    for s in &r.restarts {
        let mut text = format!("restart: attempt {} -> {}", s.from_attempt, s.to_attempt);
        if let Some(left) = s.restarts_left {
            text.push_str(&format!(", {left} left"));
        }
        match waits.iter().find(|w| w.to_attempt == s.to_attempt) {
            Some(w) => text.push_str(&format!(", {}", w.describe())),
            None => {
                if let Some(b) = s.backoff_ms.filter(|b| *b > 0) {
                    text.push_str(&format!(", after {:.1}s", b as f64 / 1000.0));
                }
            }
        }
        push(s.ts, "restart", text);
    }
    for s in &r.stops {
        push(
            s.ts,
            "stop",
            format!("attempt {}: {}", s.attempt, s.describe()),
        );
    }
    for f in &r.node_faults {
        let text = format!("attempt {}: node fault: {}", f.attempt, f.reason);
        push(f.ts, "node_fault", text);
    }
    for s in &r.spares {
        let text = match &s.gone {
            Some((node, why)) => format!(
                "standby node {node} out of the job ({why}); standbys ready: {}",
                s.ready
            ),
            None => format!("standbys ready: {}", s.ready),
        };
        push(s.ts, "spares", text);
    }
    for g in &r.generations {
        push(
            g.ts,
            "generation",
            format!("attempt {}: {}", g.attempt, g.text),
        );
    }
    // A straggler report is an event when its stragglers differ from the last one's.
    let mut last: Vec<u32> = Vec::new();
    for rep in &r.straggler_reports {
        let mut now = rep.stragglers.clone();
        now.sort_unstable();
        if now != last {
            push(rep.ts, "straggler", rep.describe_stragglers());
        }
        last = now;
    }
    for l in &r.events_lost {
        push(l.first_ts, "events_lost", l.describe());
    }
    if let Some(res) = &r.result {
        let mut text = format!("result: {}", res.outcome);
        if let Some(c) = res.exit_code {
            text.push_str(&format!(", exit code {c}"));
        }
        if !res.detail.is_empty() {
            text.push_str(&format!(" ({})", res.detail));
        }
        push(res.ts, "result", text);
    }
    m
}
