//! Scoring the whole job on node rank 0: N ranks (8 per node) as the nodes' JSON summaries that
//! node rank 0 reads from the store, then `score_job` and `render_report` (5 worst / 5 best per
//! score, one slow node's 8 ranks listed as stragglers). Prints a table; each figure is the median
//! of several runs.
//!
//!     cargo bench -p vigil --bench straggler [-- 512,10000,100000]
//!
//! Columns: `parse` is reading every node's summary (`NodeSummary::parse`); `score + report` is
//! `score_job` then `render_report` (the target: 50 ms for 100,000 ranks, the figure NVRx's report
//! prints for 512 being 0.042 s); `event record` is `report_record` serialised to one JSON line.

use std::time::{Duration, Instant};

use vigil::perf::straggler::{
    render_report, report_record, score_job, NodeSummary, RankSummary, SUMMARY_FORMAT,
};

const PER_NODE: u32 = 8;
const RUNS: usize = 7;

/// Medians between 1.00 and 1.05 s from a fixed LCG (no dependency needed for noise); the node
/// `nodes / 2` runs at 0.6 of the pace.
fn summaries(ranks: u32) -> Vec<String> {
    let nodes = ranks.div_ceil(PER_NODE);
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut noise = move || {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 11) as f64 / (1u64 << 53) as f64
    };
    (0..nodes)
        .map(|node| {
            let slow = if node == nodes / 2 { 1.0 / 0.6 } else { 1.0 };
            let ranks = (node * PER_NODE..((node + 1) * PER_NODE).min(ranks))
                .map(|rank| {
                    let median = (1.0 + 0.05 * noise()) * slow;
                    RankSummary {
                        rank,
                        median_s: Some(median),
                        best_median_s: Some(median * (0.97 + 0.03 * noise())),
                        samples: 64,
                    }
                })
                .collect();
            NodeSummary {
                format: SUMMARY_FORMAT,
                node_rank: node,
                host: format!(
                    "h100-{:03}-{:03}-{:03}",
                    node / 10_000,
                    node / 100 % 100,
                    node % 100
                ),
                ranks,
            }
            .to_json()
        })
        .collect()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let sizes: Vec<u32> = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .map(|s| s.split(',').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_else(|| vec![512, 10_000, 100_000]);
    println!("| ranks | nodes | parse | score + report | event record |");
    println!("|---|---|---|---|---|");
    for n in sizes {
        let raw = summaries(n);
        let (mut parse, mut score, mut record) = (Vec::new(), Vec::new(), Vec::new());
        let mut printed = String::new();
        for _ in 0..RUNS {
            let t0 = Instant::now();
            let nodes: Vec<NodeSummary> = raw
                .iter()
                .map(|s| NodeSummary::parse(s.as_bytes()).expect("own summaries parse"))
                .collect();
            let t1 = Instant::now();
            let scores = score_job(&nodes);
            let explain = |rank: u32| Some(format!("GPU {}: no telemetry in a bench", rank % 8));
            printed = render_report(&scores, 5, 0.7, &explain, t1.elapsed().as_secs_f64());
            let t2 = Instant::now();
            let line = report_record(&scores, 0.7).to_string();
            let t3 = Instant::now();
            assert!(line.len() > n as usize);
            parse.push(t1 - t0);
            score.push(t2 - t1);
            record.push(t3 - t2);
        }
        let stragglers = printed.lines().filter(|l| l.contains(" relative=")).count();
        assert_eq!(stragglers, PER_NODE.min(n) as usize, "{printed}");
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "| {n} | {} | {:.1} ms | {:.1} ms | {:.1} ms |",
            raw.len(),
            ms(median(parse)),
            ms(median(score)),
            ms(median(record))
        );
    }
}
