//! Node rank 0's job-wide numbers: goodput and badput by category and the allocations' decisions
//! (from the job's records, through the report crate's goodput code), and the straggler scores
//! of the job's last report.

use std::collections::BTreeMap;

use vigil_events::log::RankScore;
use vigil_report::goodput::{self, Category};
use vigil_report::History;

/// The job's goodput and decisions, as computed at `computed_unix`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct JobWide {
    /// Seconds by goodput category (`goodput`, `start_up`, ... `other`), in the report's order.
    pub seconds: Vec<(&'static str, f64)>,
    /// The job's wall time so far, over its allocations.
    pub wall_s: f64,
    /// How the job's ended allocations were decided, counted.
    pub decisions: Vec<DecisionCount>,
    pub computed_unix: f64,
}

/// Allocations decided `decision` (`requeue`, `stop`, `finished`) for `reason`.
#[derive(Debug, Clone, PartialEq)]
pub struct DecisionCount {
    pub decision: String,
    /// The stop's trigger (`time-limit`, `SIGTERM`, ...), else the allocation's outcome.
    pub reason: String,
    pub count: u64,
}

/// The job-wide numbers of a job's history (its ledger and event logs).
pub fn job_wide(h: &History, now_unix: f64) -> JobWide {
    // The allocation under way lasts until now, not until its last record.
    let g = goodput::of_history_at(h, now_unix);
    let mut counts: BTreeMap<(String, String), u64> = BTreeMap::new();
    for a in &h.allocations {
        let Some(d) = a.decision else { continue };
        let reason = a
            .stop_trigger
            .clone()
            .or_else(|| a.outcome.clone())
            .unwrap_or_else(|| "unknown".into());
        *counts.entry((d.name().to_string(), reason)).or_default() += 1;
    }
    JobWide {
        seconds: Category::ALL
            .iter()
            .map(|c| (c.name(), g.breakdown.get(*c)))
            .collect(),
        wall_s: g.wall_s,
        decisions: counts
            .into_iter()
            .map(|((decision, reason), count)| DecisionCount {
                decision,
                reason,
                count,
            })
            .collect(),
        computed_unix: now_unix,
    }
}

/// One rank's scores in the job's last straggler report.
#[derive(Debug, Clone, PartialEq)]
pub struct ScoreRow {
    pub rank: u32,
    /// The node the rank runs on.
    pub node: Option<String>,
    pub relative: Option<f64>,
    pub individual: Option<f64>,
}

/// The job's last straggler report, for the page.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Scores {
    pub rows: Vec<ScoreRow>,
    pub at_unix: f64,
}

/// The scores of a `straggler_report` record.
pub fn scores_of(record: &serde_json::Value, at_unix: f64) -> Scores {
    let ranks: Vec<RankScore> = record
        .get("ranks")
        .and_then(|r| serde_json::from_value(r.clone()).ok())
        .unwrap_or_default();
    Scores {
        rows: ranks
            .into_iter()
            .map(|r| ScoreRow {
                rank: r.rank,
                node: r.host,
                relative: r.relative,
                individual: r.individual,
            })
            .collect(),
        at_unix,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_come_from_the_report_record() {
        let rec = serde_json::json!({
            "event": "straggler_report",
            "ranks": [
                {"rank": 0, "host": "n0", "relative": 1.0, "individual": 0.98},
                {"rank": 3, "relative": 0.5}
            ],
            "stragglers": [3]
        });
        let s = scores_of(&rec, 7.0);
        assert_eq!(s.at_unix, 7.0);
        assert_eq!(s.rows.len(), 2);
        assert_eq!(s.rows[0].node.as_deref(), Some("n0"));
        assert_eq!(s.rows[1].individual, None);
        assert_eq!(scores_of(&serde_json::json!({}), 0.0).rows, vec![]);
    }

    #[test]
    fn an_empty_history_has_every_category_at_zero() {
        let h = vigil_report::history::build(std::path::PathBuf::from("/x"), &[], &[]);
        let j = job_wide(&h, 5.0);
        assert_eq!(j.seconds.len(), Category::ALL.len());
        assert!(j.seconds.iter().all(|(_, s)| *s == 0.0));
        assert_eq!(j.decisions, vec![]);
    }
}
