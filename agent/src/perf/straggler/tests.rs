use proptest::prelude::*;
use serde_json::json;

use super::*;

const HOSTS: [&str; 3] = ["h100-001-253-012", "h100-001-010-003", "h100-004-141-026"];

/// `(rank, relative, individual)` on a job whose fastest median is 1 s: median = 1/relative,
/// best = individual * median. Four ranks per node.
fn job(ranks: &[(u32, f64, f64)], hosts: &[&str]) -> Vec<NodeSummary> {
    hosts
        .iter()
        .enumerate()
        .map(|(node, host)| NodeSummary {
            format: SUMMARY_FORMAT,
            node_rank: node as u32,
            host: host.to_string(),
            ranks: ranks
                .iter()
                .filter(|r| r.0 / 4 == node as u32)
                .map(|&(rank, rel, ind)| RankSummary {
                    rank,
                    median_s: Some(1.0 / rel),
                    best_median_s: Some(ind * (1.0 / rel)),
                    samples: 64,
                })
                .collect(),
        })
        .collect()
}

#[test]
fn the_report_is_nvrx_block_exactly() {
    let ranks = [
        (0, 0.94, 0.98),
        (1, 0.97, 1.0),
        (2, 0.99, 0.99),
        (3, 0.96, 1.0),
        (4, 0.94, 0.981),
        (5, 0.98, 1.0),
        (6, 0.95, 0.97),
        (7, 0.99, 1.0),
        (8, 1.0, 1.0),
        (9, 0.97, 0.992),
        (10, 0.95, 1.0),
        (11, 0.98, 0.979),
    ];
    let scores = score_job(&job(&ranks, &HOSTS));
    let text = render_report(&scores, 5, 0.7, &|_| panic!("no straggler"), 0.042);
    assert_eq!(
        text,
        "\
GPU relative performance:
Worst performing 5/12 ranks:
Rank=0 Node=h100-001-253-012 Score=0.94
Rank=4 Node=h100-001-010-003 Score=0.94
Rank=6 Node=h100-001-010-003 Score=0.95
Rank=10 Node=h100-004-141-026 Score=0.95
Rank=3 Node=h100-001-253-012 Score=0.96
Best performing 5/12 ranks:
Rank=8 Node=h100-004-141-026 Score=1.00
Rank=2 Node=h100-001-253-012 Score=0.99
Rank=7 Node=h100-001-010-003 Score=0.99
Rank=5 Node=h100-001-010-003 Score=0.98
Rank=11 Node=h100-004-141-026 Score=0.98
GPU individual performance:
Worst performing 5/12 ranks:
Rank=6 Node=h100-001-010-003 Score=0.97
Rank=11 Node=h100-004-141-026 Score=0.98
Rank=0 Node=h100-001-253-012 Score=0.98
Rank=4 Node=h100-001-010-003 Score=0.98
Rank=2 Node=h100-001-253-012 Score=0.99
Best performing 5/12 ranks:
Rank=1 Node=h100-001-253-012 Score=1.00
Rank=3 Node=h100-001-253-012 Score=1.00
Rank=5 Node=h100-001-010-003 Score=1.00
Rank=7 Node=h100-001-010-003 Score=1.00
Rank=8 Node=h100-004-141-026 Score=1.00
Straggler report processing time: 0.042 sec.
"
    );
}

#[test]
fn stragglers_are_listed_worst_first_with_what_their_gpu_did() {
    let ranks = [
        (0, 1.0, 1.0),
        (1, 0.9, 1.0),
        (2, 1.0, 0.5),
        (3, 1.0 / 3.2, 0.95),
    ];
    let mut summaries = job(&ranks, &["n0"]);
    // Rank 3 on a second node.
    let r3 = summaries[0].ranks.pop().unwrap();
    summaries.push(NodeSummary {
        format: SUMMARY_FORMAT,
        node_rank: 1,
        host: "n1".into(),
        ranks: vec![r3],
    });
    let scores = score_job(&summaries);
    let explain = |rank: u32| {
        (rank == 3).then(|| {
            "GPU 1: SM clock 1,110 of 1,980 MHz, throttled by HW slowdown and power brake, 88 C"
                .to_string()
        })
    };
    let text = render_report(&scores, 5, 0.7, &explain, 0.0004);
    assert_eq!(
        text,
        "\
GPU relative performance:
Worst performing 4/4 ranks:
Rank=3 Node=n1 Score=0.31
Rank=1 Node=n0 Score=0.90
Rank=0 Node=n0 Score=1.00
Rank=2 Node=n0 Score=1.00
Best performing 4/4 ranks:
Rank=0 Node=n0 Score=1.00
Rank=2 Node=n0 Score=1.00
Rank=1 Node=n0 Score=0.90
Rank=3 Node=n1 Score=0.31
GPU individual performance:
Worst performing 4/4 ranks:
Rank=2 Node=n0 Score=0.50
Rank=3 Node=n1 Score=0.95
Rank=0 Node=n0 Score=1.00
Rank=1 Node=n0 Score=1.00
Best performing 4/4 ranks:
Rank=0 Node=n0 Score=1.00
Rank=1 Node=n0 Score=1.00
Rank=3 Node=n1 Score=0.95
Rank=2 Node=n0 Score=0.50
Stragglers (score below 0.70):
Rank=3 Node=n1 relative=0.31 individual=0.95 GPU 1: SM clock 1,110 of 1,980 MHz, throttled by HW slowdown and power brake, 88 C
Rank=2 Node=n0 relative=1.00 individual=0.50 no GPU telemetry
Straggler report processing time: 0.000 sec.
"
    );
    let got = stragglers(&scores, 0.7);
    assert_eq!(got.len(), 2);
    assert_eq!((got[0].0, got[0].1, got[0].2.as_str()), (3, 1, "n1"));
    assert_eq!((got[1].0, got[1].1, got[1].2.as_str()), (2, 0, "n0"));
    assert_eq!(got[1].4, 0.5);
    // With nothing printed per score, only the stragglers and the time remain.
    let short = render_report(&scores, 0, 0.4, &|_| None, 0.042);
    assert_eq!(
        short,
        "Stragglers (score below 0.40):\n\
         Rank=3 Node=n1 relative=0.31 individual=0.95 no GPU telemetry\n\
         Straggler report processing time: 0.042 sec.\n"
    );
}

#[test]
fn the_count_is_of_ranks_scored_and_ranks_without_samples_are_counted_apart() {
    let hosts: Vec<String> = (0..128).map(|n| format!("node{n:03}")).collect();
    let host_refs: Vec<&str> = hosts.iter().map(String::as_str).collect();
    let ranks: Vec<(u32, f64, f64)> = (0..512).map(|r| (r, 1.0, 1.0)).collect();
    let mut summaries = job(&ranks, &host_refs);
    summaries[3].ranks.push(RankSummary {
        rank: 900,
        median_s: None,
        best_median_s: None,
        samples: 0,
    });
    summaries[3].ranks[0].median_s = Some(0.0); // not a usable median either
    let scores = score_job(&summaries);
    assert_eq!((scores.ranks.len(), scores.unscored), (511, 2));
    let text = render_report(&scores, 5, 0.7, &|_| None, 0.0);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[1], "Worst performing 5/511 ranks:");
    assert_eq!(lines[2], "Rank=0 Node=node000 Score=1.00");
    assert_eq!(lines[7], "Best performing 5/511 ranks:");
    assert_eq!(lines.len(), 2 * (1 + 2 * (1 + 5)) + 1);
}

#[test]
fn the_event_record_lists_every_rank() {
    let summaries = job(&[(0, 1.0, 1.0), (1, 0.5, 1.0)], &["n0"]);
    let mut scores = score_job(&summaries);
    scores.unscored = 3;
    assert_eq!(
        report_record(&scores, 0.7),
        json!({
            "event": "straggler_report",
            "ranks": [
                {"rank": 0, "node_rank": 0, "host": "n0", "relative": 1.0, "individual": 1.0, "median_s": 1.0},
                {"rank": 1, "node_rank": 0, "host": "n0", "relative": 0.5, "individual": 1.0, "median_s": 2.0},
            ],
            "stragglers": [1],
            "threshold": 0.7,
            "unscored": 3,
        })
    );
}

#[test]
fn summaries_round_trip_and_a_foreign_format_is_named() {
    let mut a = RankTimes::new(DEFAULT_WINDOW, DEFAULT_SECTION);
    let mut b = RankTimes::new(DEFAULT_WINDOW, DEFAULT_SECTION);
    a.on_step_timing(1, 0.5);
    let s = NodeSummary::from_ranks(2, "n2", [(9, &mut b), (8, &mut a)]);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&s.to_json()).unwrap(),
        json!({"format": 1, "node_rank": 2, "host": "n2", "ranks": [
            {"rank": 8, "median_s": 0.5, "best_median_s": 0.5, "samples": 1},
            {"rank": 9, "median_s": null, "best_median_s": null, "samples": 0},
        ]})
    );
    assert_eq!(NodeSummary::parse(s.to_json().as_bytes()).unwrap(), s);
    let err = NodeSummary::parse(br#"{"format":2,"node_rank":4,"host":"x","ranks":[]}"#)
        .unwrap_err()
        .to_string();
    assert!(err.contains("node 4 has format 2") && err.contains("same vigil version"));
    let err = NodeSummary::parse(b"{").unwrap_err().to_string();
    assert!(err.starts_with("unreadable straggler summary"), "{err}");
}

#[test]
fn a_rank_listed_twice_counts_once_and_an_empty_job_renders() {
    let mut summaries = job(&[(0, 1.0, 1.0)], &["n0"]);
    summaries.push(NodeSummary {
        format: SUMMARY_FORMAT,
        node_rank: 1,
        host: "n1".into(),
        ranks: vec![RankSummary {
            rank: 0,
            median_s: Some(5.0),
            best_median_s: None,
            samples: 1,
        }],
    });
    let scores = score_job(&summaries);
    assert_eq!(scores.ranks.len(), 1);
    assert_eq!(scores.ranks[0].node_rank, 0);
    let empty = score_job(&[]);
    assert_eq!(
        render_report(&empty, 5, 0.7, &|_| None, 0.0),
        "GPU relative performance:\nWorst performing 0/0 ranks:\nBest performing 0/0 ranks:\n\
         GPU individual performance:\nWorst performing 0/0 ranks:\nBest performing 0/0 ranks:\n\
         Straggler report processing time: 0.000 sec.\n"
    );
}

fn summaries_strategy() -> impl Strategy<Value = Vec<NodeSummary>> {
    let rank = (1e-3f64..1e3, prop::option::of(1e-3f64..1e3));
    prop::collection::vec(prop::collection::vec(rank, 1..8), 1..6).prop_map(|nodes| {
        let mut next = 0u32;
        nodes
            .into_iter()
            .enumerate()
            .map(|(n, ranks)| NodeSummary {
                format: SUMMARY_FORMAT,
                node_rank: n as u32,
                host: format!("n{n}"),
                ranks: ranks
                    .into_iter()
                    .map(|(m, b)| {
                        next += 1;
                        RankSummary {
                            rank: next - 1,
                            median_s: Some(m),
                            best_median_s: b,
                            samples: 1,
                        }
                    })
                    .collect(),
            })
            .collect()
    })
}

proptest! {
    #[test]
    fn scores_are_in_0_1_and_the_fastest_is_1(nodes in summaries_strategy()) {
        let scores = score_job(&nodes);
        for r in &scores.ranks {
            prop_assert!(r.relative > 0.0 && r.relative <= 1.0);
            prop_assert!(r.individual > 0.0 && r.individual <= 1.0);
        }
        let fastest = scores.ranks.iter().min_by(|a, b| a.median_s.total_cmp(&b.median_s)).unwrap();
        prop_assert_eq!(fastest.relative, 1.0);
    }

    #[test]
    fn scaling_every_time_leaves_relative_scores(nodes in summaries_strategy(), k in 1e-3f64..1e3) {
        let scaled: Vec<NodeSummary> = nodes.iter().cloned().map(|mut n| {
            for r in &mut n.ranks {
                r.median_s = r.median_s.map(|m| m * k);
                r.best_median_s = r.best_median_s.map(|b| b * k);
            }
            n
        }).collect();
        let (a, b) = (score_job(&nodes), score_job(&scaled));
        for (x, y) in a.ranks.iter().zip(&b.ranks) {
            prop_assert!((x.relative - y.relative).abs() < 1e-9);
            prop_assert!((x.individual - y.individual).abs() < 1e-9);
        }
    }

    #[test]
    fn individual_is_1_when_the_current_median_is_the_best(
        times in prop::collection::vec(1e-3f64..10.0, 1..200),
        window in 1usize..16,
        closes in prop::collection::vec(0usize..200, 0..5),
    ) {
        let mut r = RankTimes::new(window, "step");
        for (i, t) in times.iter().enumerate() {
            prop_assert!(r.on_step_timing(i as u64, *t));
            if closes.contains(&i) {
                r.close_interval();
            }
        }
        let s = NodeSummary::from_ranks(0, "n0", [(0, &mut r)]);
        let (m, b) = (s.ranks[0].median_s.unwrap(), s.ranks[0].best_median_s.unwrap());
        prop_assert!(b <= m);
        let scores = score_job(&[s]);
        prop_assert!(scores.ranks[0].individual <= 1.0);
        if m == b {
            prop_assert_eq!(scores.ranks[0].individual, 1.0);
        }
    }

    #[test]
    fn a_window_holds_one_source_the_most_preferred_seen(
        events in prop::collection::vec((any::<bool>(), 1e-3f64..10.0), 1..100),
        window in 1usize..16,
    ) {
        let mut r = RankTimes::new(window, "step");
        for &(timing, secs) in &events {
            if timing {
                r.on_step_timing(0, secs);
            } else {
                r.on_section("step", secs);
            }
        }
        let preferred = events.iter().any(|e| e.0);
        let kept: Vec<f64> = events.iter().filter(|e| e.0 == preferred).map(|e| e.1).collect();
        let last = &kept[kept.len().saturating_sub(window)..];
        prop_assert_eq!(r.samples(), last.len());
        prop_assert_eq!(r.median(), median(last.iter().copied()));
        let want = if preferred { Source::StepTiming } else { Source::Section };
        prop_assert_eq!(r.source(), Some(want));
    }

    #[test]
    fn printed_lists_are_the_sorted_ends(nodes in summaries_strategy(), n in 0usize..10) {
        let scores = score_job(&nodes);
        let text = render_report(&scores, n, 0.0, &|_| None, 0.0);
        let mut by_rel: Vec<&RankScore> = scores.ranks.iter().collect();
        by_rel.sort_by(|a, b| a.relative.total_cmp(&b.relative).then(a.rank.cmp(&b.rank)));
        let k = n.min(by_rel.len());
        let worst: Vec<String> = by_rel[..k].iter().map(|r| format!("Rank={} ", r.rank)).collect();
        let lines: Vec<&str> = text.lines().collect();
        if n > 0 {
            for (i, w) in worst.iter().enumerate() {
                prop_assert!(lines[2 + i].starts_with(w.as_str()));
            }
            by_rel.sort_by(|a, b| b.relative.total_cmp(&a.relative).then(a.rank.cmp(&b.rank)));
            for (i, r) in by_rel[..k].iter().enumerate() {
                let want = format!("Rank={} ", r.rank);
                prop_assert!(lines[3 + k + i].starts_with(want.as_str()));
            }
        }
    }
}
