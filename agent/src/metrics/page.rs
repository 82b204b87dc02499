//! Every metric of the page (docs/metrics.md lists them): its name, type, help and labels. Each
//! series carries `job_id` and `node`; a rank's also `rank`, `local_rank` and, when NVML knows
//! them, `gpu` and `UUID` (dcgm-exporter's label names, so queries can join `DCGM_FI_DEV_*`).

use super::tally::{HANG_KINDS, STOP_REASONS};
use super::text::{Kind, Page};
use super::{RankRow, Snapshot};

/// The page for `s`, in Prometheus' text format.
pub fn render(s: &Snapshot) -> String {
    let mut p = Page::default();
    agent(&mut p, s);
    counters(&mut p, s);
    ranks(&mut p, s);
    if let Some(sc) = s.scores {
        scores(&mut p, s, sc);
    }
    if let Some(j) = s.job {
        job_wide(&mut p, s, j);
    }
    p.finish()
}

/// A family of one sample, labelled with the job and the node.
fn one(p: &mut Page, s: &Snapshot, name: &str, kind: Kind, help: &str, v: f64) {
    p.family(name, kind, help);
    let labels = [
        ("job_id", Some(s.id.job_id.as_str())),
        ("node", Some(s.id.node.as_str())),
    ];
    p.sample(name, &labels, v);
}

/// The agent's own gauges: info, running, start time, attempt, ranks running.
fn agent(p: &mut Page, s: &Snapshot) {
    let job = Some(s.id.job_id.as_str());
    let node = Some(s.id.node.as_str());
    let node_rank = s.id.node_rank.to_string();
    p.family(
        "vigil_agent_info",
        Kind::Gauge,
        "The agent of this node: always 1, with the node's rank and vigil's version as labels.",
    );
    p.sample(
        "vigil_agent_info",
        &[
            ("job_id", job),
            ("node", node),
            ("node_rank", Some(&node_rank)),
            ("version", Some(env!("CARGO_PKG_VERSION"))),
        ],
        1.0,
    );
    one(
        p,
        s,
        "vigil_agent_running",
        Kind::Gauge,
        "1 while the agent supervises the job; 0 on the page written at its exit.",
        if s.running { 1.0 } else { 0.0 },
    );
    one(
        p,
        s,
        "vigil_agent_start_time_seconds",
        Kind::Gauge,
        "When the agent started, unix seconds.",
        s.started_unix,
    );
    one(
        p,
        s,
        "vigil_attempt",
        Kind::Gauge,
        "The attempt under way (0 first; the job's in-allocation restart count).",
        f64::from(s.attempt),
    );
    one(
        p,
        s,
        "vigil_ranks_running",
        Kind::Gauge,
        "Ranks of this node running now.",
        s.ranks.iter().filter(|r| r.running).count() as f64,
    );
    if let Some(ready) = s.tally.spares_ready {
        one(
            p,
            s,
            "vigil_spares_ready",
            Kind::Gauge,
            "The coordinator, with standbys: standbys ready to take a lost node's place.",
            f64::from(ready),
        );
    }
}

/// This node's counters: attempts, restarts, failures, hangs, stops.
fn counters(p: &mut Page, s: &Snapshot) {
    let job = Some(s.id.job_id.as_str());
    let node = Some(s.id.node.as_str());
    let t = s.tally;
    one(
        p,
        s,
        "vigil_attempts_total",
        Kind::Counter,
        "Attempts whose ranks this node started.",
        t.attempts as f64,
    );
    one(
        p,
        s,
        "vigil_restarts_total",
        Kind::Counter,
        "Restarts of the job's ranks after a failure or a hang (in-job restarts, this allocation).",
        t.restarts as f64,
    );
    one(
        p,
        s,
        "vigil_in_process_restarts_total",
        Kind::Counter,
        "In-process restarts: a failed or hung rank replaced alone, the others kept (docs/inprocess.md).",
        t.in_process_restarts as f64,
    );
    one(
        p,
        s,
        "vigil_in_process_recovery_seconds_total",
        Kind::Counter,
        "Seconds from a failure to every rank back in its training function, over in-process restarts.",
        t.in_process_recovery_s,
    );
    one(
        p,
        s,
        "vigil_in_process_stepping_seconds_total",
        Kind::Counter,
        "Seconds from a failure to every rank stepping again, over in-process restarts.",
        t.in_process_stepping_s,
    );
    one(
        p,
        s,
        "vigil_in_process_generation",
        Kind::Gauge,
        "The generation this node's ranks are at in the current attempt (0: no in-process restart yet).",
        t.generation as f64,
    );
    one(
        p,
        s,
        "vigil_rank_failures_total",
        Kind::Counter,
        "Ranks of this node that exited on their own with a failure.",
        t.rank_failures as f64,
    );
    p.family(
        "vigil_hangs_total",
        Kind::Counter,
        "Ranks of this node found hung, by the timeout they ran past.",
    );
    for (kind, n) in HANG_KINDS.iter().zip(t.hangs) {
        p.sample(
            "vigil_hangs_total",
            &[("job_id", job), ("node", node), ("kind", Some(kind))],
            n as f64,
        );
    }
    p.family(
        "vigil_rank_stops_total",
        Kind::Counter,
        "Times this node stopped its ranks, by why.",
    );
    for (reason, n) in STOP_REASONS.iter().zip(t.rank_stops) {
        p.sample(
            "vigil_rank_stops_total",
            &[("job_id", job), ("node", node), ("reason", Some(reason))],
            n as f64,
        );
    }
    p.family(
        "vigil_stop_decisions_total",
        Kind::Counter,
        "Stops at an agreed step (the ranks checkpoint and exit), by their trigger.",
    );
    for (trigger, n) in &t.stop_decisions {
        p.sample(
            "vigil_stop_decisions_total",
            &[("job_id", job), ("node", node), ("reason", Some(trigger))],
            *n as f64,
        );
    }
}

/// The job's last straggler report (node rank 0).
fn scores(p: &mut Page, s: &Snapshot, sc: &super::Scores) {
    let job = Some(s.id.job_id.as_str());
    p.family(
        "vigil_straggler_score",
        Kind::Gauge,
        "A rank's straggler score in the job's last report (1 is as fast as it gets; below the threshold: a straggler); node: the rank's node.",
    );
    for r in &sc.rows {
        let rank = r.rank.to_string();
        for (score, v) in [("relative", r.relative), ("individual", r.individual)] {
            if let Some(v) = v {
                p.sample(
                    "vigil_straggler_score",
                    &[
                        ("job_id", job),
                        ("node", r.node.as_deref()),
                        ("rank", Some(&rank)),
                        ("score", Some(score)),
                    ],
                    v,
                );
            }
        }
    }
    one(
        p,
        s,
        "vigil_straggler_report_timestamp_seconds",
        Kind::Gauge,
        "When node rank 0 made the job's last straggler report, unix seconds.",
        sc.at_unix,
    );
}

/// What one per-rank family shows of a rank (`None`: no sample for it).
type RankValue = fn(&RankRow) -> Option<f64>;

/// The per-rank series: its identity (for joins), its step, its last heartbeat's age.
fn ranks(p: &mut Page, s: &Snapshot) {
    let families: [(&str, &str, RankValue); 3] = [
        (
            "vigil_rank_info",
            "A rank of this node's attempt under way: always 1, with its GPU's index and UUID (join on UUID with dcgm-exporter's series).",
            |_| Some(1.0),
        ),
        (
            "vigil_rank_step",
            "The step the rank last reported.",
            |r| r.step.map(|x| x as f64),
        ),
        (
            "vigil_rank_heartbeat_age_seconds",
            "Seconds since a running rank's last heartbeat (the agent's own suspension not counted).",
            |r| r.heartbeat_age_s.filter(|_| r.running),
        ),
    ];
    for (name, help, value) in families {
        p.family(name, Kind::Gauge, help);
        for r in &s.ranks {
            let Some(v) = value(r) else { continue };
            let (rank, local) = (r.rank.to_string(), r.local_rank.to_string());
            let gpu = r.gpu.map(|g| g.to_string());
            p.sample(
                name,
                &[
                    ("job_id", Some(s.id.job_id.as_str())),
                    ("node", Some(s.id.node.as_str())),
                    ("rank", Some(&rank)),
                    ("local_rank", Some(&local)),
                    ("gpu", gpu.as_deref()),
                    ("UUID", r.uuid.as_deref()),
                ],
                v,
            );
        }
    }
}

/// Node rank 0's job-wide series.
fn job_wide(p: &mut Page, s: &Snapshot, j: &super::JobWide) {
    let job = Some(s.id.job_id.as_str());
    let node = Some(s.id.node.as_str());
    let base = [("job_id", job), ("node", node)];
    p.family(
        "vigil_job_wall_seconds",
        Kind::Gauge,
        "The job's wall time over its allocations so far, as goodput counts it (docs/goodput.md).",
    );
    p.sample("vigil_job_wall_seconds", &base, j.wall_s);
    p.family(
        "vigil_goodput_seconds",
        Kind::Gauge,
        "Seconds of the job's wall time whose step progress was kept (docs/goodput.md).",
    );
    let good = j
        .seconds
        .iter()
        .find(|(c, _)| *c == "goodput")
        .map_or(0.0, |x| x.1);
    p.sample("vigil_goodput_seconds", &base, good);
    p.family(
        "vigil_badput_seconds",
        Kind::Gauge,
        "Seconds of the job's wall time lost, by category (docs/goodput.md); with goodput they add up to the wall time.",
    );
    for (c, v) in j.seconds.iter().filter(|(c, _)| *c != "goodput") {
        p.sample(
            "vigil_badput_seconds",
            &[("job_id", job), ("node", node), ("category", Some(c))],
            *v,
        );
    }
    p.family(
        "vigil_goodput_computed_timestamp_seconds",
        Kind::Gauge,
        "When the goodput series were last computed from the job's records, unix seconds.",
    );
    p.sample(
        "vigil_goodput_computed_timestamp_seconds",
        &base,
        j.computed_unix,
    );
    p.family(
        "vigil_allocation_decisions_total",
        Kind::Counter,
        "The job's ended allocations, by what node rank 0 decided (requeue, stop, finished) and why (the stop's trigger, else the outcome), from its ledger.",
    );
    for d in &j.decisions {
        p.sample(
            "vigil_allocation_decisions_total",
            &[
                ("job_id", job),
                ("node", node),
                ("decision", Some(&d.decision)),
                ("reason", Some(&d.reason)),
            ],
            d.count as f64,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use std::collections::HashMap;

    fn id() -> Identity {
        Identity {
            job_id: "job \"7\"".into(),
            node: "gpu-a\\01".into(),
            node_rank: 0,
        }
    }

    /// The page's samples by their line's name and labels, and every family's type; panics on a
    /// sample of a family without `# HELP` and `# TYPE` before it, or a family seen twice.
    fn parse(page: &str) -> (HashMap<String, f64>, HashMap<String, String>) {
        let mut samples = HashMap::new();
        let mut types = HashMap::new();
        let mut helped = std::collections::HashSet::new();
        let mut current = String::new();
        for line in page.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let name = rest.split(' ').next().unwrap().to_string();
                assert!(helped.insert(name.clone()), "family {name} twice");
                current = name;
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut it = rest.split(' ');
                let name = it.next().unwrap();
                assert_eq!(name, current);
                types.insert(name.to_string(), it.next().unwrap().to_string());
            } else {
                let (key, value) = line.rsplit_once(' ').unwrap();
                let name = key.split('{').next().unwrap();
                assert_eq!(name, current, "{line}");
                assert!(types.contains_key(name));
                samples.insert(key.to_string(), value.parse::<f64>().unwrap());
            }
        }
        (samples, types)
    }

    #[test]
    fn a_node_page_has_every_counter_and_each_ranks_series() {
        let id = id();
        let mut tally = Tally {
            restarts: 1,
            in_process_restarts: 2,
            in_process_recovery_s: 1.5,
            in_process_stepping_s: 2.25,
            generation: 2,
            attempts: 2,
            ..Default::default()
        };
        tally.hangs[1] = 3;
        tally.stop_decisions.insert("time-limit".into(), 1);
        let s = Snapshot {
            id: &id,
            running: true,
            started_unix: 100.0,
            attempt: 1,
            tally: &tally,
            ranks: vec![
                RankRow {
                    local_rank: 0,
                    rank: 4,
                    running: true,
                    step: Some(12),
                    heartbeat_age_s: Some(0.5),
                    gpu: Some(2),
                    uuid: Some("GPU-abc".into()),
                },
                RankRow {
                    local_rank: 1,
                    rank: 5,
                    running: false,
                    heartbeat_age_s: Some(30.0),
                    ..Default::default()
                },
            ],
            scores: None,
            job: None,
        };
        let (samples, types) = parse(&render(&s));
        let l = r#"job_id="job \"7\"",node="gpu-a\\01""#;
        assert_eq!(samples[&format!("vigil_restarts_total{{{l}}}")], 1.0);
        assert_eq!(
            samples[&format!("vigil_in_process_restarts_total{{{l}}}")],
            2.0
        );
        assert_eq!(
            samples[&format!("vigil_in_process_recovery_seconds_total{{{l}}}")],
            1.5
        );
        assert_eq!(
            samples[&format!("vigil_in_process_stepping_seconds_total{{{l}}}")],
            2.25
        );
        assert_eq!(samples[&format!("vigil_in_process_generation{{{l}}}")], 2.0);
        assert_eq!(samples[&format!("vigil_attempts_total{{{l}}}")], 2.0);
        assert_eq!(samples[&format!("vigil_ranks_running{{{l}}}")], 1.0);
        assert_eq!(
            samples[&format!("vigil_hangs_total{{{l},kind=\"heartbeat\"}}")],
            3.0
        );
        assert_eq!(
            samples[&format!("vigil_hangs_total{{{l},kind=\"initial\"}}")],
            0.0
        );
        assert_eq!(
            samples[&format!("vigil_stop_decisions_total{{{l},reason=\"time-limit\"}}")],
            1.0
        );
        let r0 = format!(r#"{l},rank="4",local_rank="0",gpu="2",UUID="GPU-abc""#);
        assert_eq!(samples[&format!("vigil_rank_step{{{r0}}}")], 12.0);
        assert_eq!(
            samples[&format!("vigil_rank_heartbeat_age_seconds{{{r0}}}")],
            0.5
        );
        // A rank without a step or a GPU: its info only, without gpu and UUID labels.
        let r1 = format!(r#"{l},rank="5",local_rank="1""#);
        assert_eq!(samples[&format!("vigil_rank_info{{{r1}}}")], 1.0);
        assert!(!samples.contains_key(&format!("vigil_rank_step{{{r1}}}")));
        // It exited: its silence is no news.
        assert!(!samples.contains_key(&format!("vigil_rank_heartbeat_age_seconds{{{r1}}}")));
        assert_eq!(types["vigil_restarts_total"], "counter");
        assert_eq!(types["vigil_rank_step"], "gauge");
        assert!(
            !types.contains_key("vigil_goodput_seconds"),
            "node rank 0 only"
        );
        assert!(!types.contains_key("vigil_straggler_score"));
    }

    #[test]
    fn node_rank_0_adds_goodput_decisions_and_scores() {
        let id = id();
        let tally = Tally::default();
        let job = JobWide {
            seconds: vec![("goodput", 60.0), ("start_up", 5.0), ("other", 1.5)],
            wall_s: 66.5,
            decisions: vec![DecisionCount {
                decision: "requeue".into(),
                reason: "time-limit".into(),
                count: 2,
            }],
            computed_unix: 9.0,
        };
        let scores = Scores {
            rows: vec![ScoreRow {
                rank: 3,
                node: Some("n1".into()),
                relative: Some(0.5),
                individual: None,
            }],
            at_unix: 8.0,
        };
        let s = Snapshot {
            id: &id,
            running: false,
            started_unix: 1.0,
            attempt: 0,
            tally: &tally,
            ranks: vec![],
            scores: Some(&scores),
            job: Some(&job),
        };
        let (samples, types) = parse(&render(&s));
        let l = r#"job_id="job \"7\"",node="gpu-a\\01""#;
        assert_eq!(samples[&format!("vigil_agent_running{{{l}}}")], 0.0);
        assert_eq!(samples[&format!("vigil_goodput_seconds{{{l}}}")], 60.0);
        assert_eq!(
            samples[&format!("vigil_badput_seconds{{{l},category=\"start_up\"}}")],
            5.0
        );
        assert!(!samples.contains_key(&format!("vigil_badput_seconds{{{l},category=\"goodput\"}}")));
        assert_eq!(
            samples[&format!(
                "vigil_allocation_decisions_total{{{l},decision=\"requeue\",reason=\"time-limit\"}}"
            )],
            2.0
        );
        assert_eq!(
            samples[r#"vigil_straggler_score{job_id="job \"7\"",node="n1",rank="3",score="relative"}"#],
            0.5
        );
        assert_eq!(types["vigil_allocation_decisions_total"], "counter");
        assert_eq!(types["vigil_badput_seconds"], "gauge");
    }
}
