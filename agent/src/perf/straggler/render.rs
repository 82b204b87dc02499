//! The report text node rank 0 prints: NVRx's block (seeds/002), then vigil's straggler lines.

use std::cmp::Ordering;
use std::fmt::Write;

use super::score::{stragglers, JobScores, RankScore};

/// The `k` ranks that come first by `order`, in that order. One pass, so 100,000 ranks cost
/// little more than reading them.
fn first_k(
    ranks: &[RankScore],
    k: usize,
    order: impl Fn(&RankScore, &RankScore) -> Ordering,
) -> Vec<&RankScore> {
    let mut top: Vec<&RankScore> = Vec::with_capacity(k + 1);
    if k == 0 {
        return top;
    }
    for r in ranks {
        if top.len() == k && order(r, top[k - 1]) != Ordering::Less {
            continue;
        }
        let at = top.partition_point(|t| order(t, r) != Ordering::Greater);
        top.insert(at, r);
        top.truncate(k);
    }
    top
}

fn block(
    out: &mut String,
    scores: &JobScores,
    n: usize,
    title: &str,
    score: impl Fn(&RankScore) -> f64,
) {
    let m = scores.ranks.len();
    let k = n.min(m);
    let worst = first_k(&scores.ranks, k, |a, b| {
        score(a).total_cmp(&score(b)).then(a.rank.cmp(&b.rank))
    });
    let best = first_k(&scores.ranks, k, |a, b| {
        score(b).total_cmp(&score(a)).then(a.rank.cmp(&b.rank))
    });
    let _ = writeln!(out, "{title}");
    for (label, list) in [("Worst", worst), ("Best", best)] {
        let _ = writeln!(out, "{label} performing {k}/{m} ranks:");
        for r in list {
            let _ = writeln!(
                out,
                "Rank={} Node={} Score={:.2}",
                r.rank,
                scores.host(r.node_rank),
                score(r)
            );
        }
    }
}

/// The report, one line per `\n` (the last one too). For `n` > 0, NVRx's block exactly as
/// seeds/002 shows it: `GPU relative performance:`, the worst `n` ranks (lowest score first,
/// ties by rank) and the best `n` (highest first, ties by rank) as `Rank=76
/// Node=h100-001-253-012 Score=0.94`, under `Worst performing 5/512 ranks:` where 512 is the
/// number of ranks scored (all of them when fewer than `n`); the same for `GPU individual
/// performance:`. With `n` = 0 those blocks are left out (NVRx's `num_gpu_perf_scores_to_print=0`).
/// Then, when any rank is below `threshold` on either score, `Stragglers (score below 0.70):` and
/// one line per straggler, worst first: `Rank=3 Node=n1 relative=0.31 individual=0.95 <GPU>`,
/// where `<GPU>` is `explain(rank)` (e.g. `GPU 1: SM clock 1,110 of 1,980 MHz, ...`) or `no GPU
/// telemetry`. Last, `Straggler report processing time: 0.042 sec.` from `secs`.
pub fn render_report(
    scores: &JobScores,
    n: usize,
    threshold: f64,
    explain: &dyn Fn(u32) -> Option<String>,
    secs: f64,
) -> String {
    let mut out = String::with_capacity(1024);
    if n > 0 {
        block(&mut out, scores, n, "GPU relative performance:", |r| {
            r.relative
        });
        block(&mut out, scores, n, "GPU individual performance:", |r| {
            r.individual
        });
    }
    let slow = stragglers(scores, threshold);
    if !slow.is_empty() {
        let _ = writeln!(out, "Stragglers (score below {threshold:.2}):");
        for (rank, _, host, relative, individual) in slow {
            let why = explain(rank).unwrap_or_else(|| "no GPU telemetry".to_owned());
            let _ = writeln!(
                out,
                "Rank={rank} Node={host} relative={relative:.2} individual={individual:.2} {why}"
            );
        }
    }
    let _ = writeln!(out, "Straggler report processing time: {secs:.3} sec.");
    out
}
