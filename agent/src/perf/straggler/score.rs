//! What each agent sends (`NodeSummary`), and the job's scores that node rank 0 makes of them.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::times::RankTimes;

/// `NodeSummary::format` this code writes and reads.
pub const SUMMARY_FORMAT: u32 = 1;

/// One rank's medians, as its agent computed them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankSummary {
    /// Global rank.
    pub rank: u32,
    /// Median step time over the window, seconds; null before the rank's first sample.
    pub median_s: Option<f64>,
    /// The rank's lowest median so far, seconds.
    pub best_median_s: Option<f64>,
    /// Step times the median is over (at most the window).
    pub samples: u64,
}

/// What one agent puts in the store once per report interval: its ranks' medians.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeSummary {
    /// Always [`SUMMARY_FORMAT`].
    pub format: u32,
    pub node_rank: u32,
    pub host: String,
    pub ranks: Vec<RankSummary>,
}

impl NodeSummary {
    /// Closes the report interval of every rank (`RankTimes::close_interval`) and summarises
    /// them, sorted by rank. A rank without samples is listed with null medians.
    pub fn from_ranks<'a>(
        node_rank: u32,
        host: &str,
        ranks: impl IntoIterator<Item = (u32, &'a mut RankTimes)>,
    ) -> Self {
        let mut out: Vec<RankSummary> = ranks
            .into_iter()
            .map(|(rank, times)| {
                let closed = times.close_interval();
                RankSummary {
                    rank,
                    median_s: closed.map(|c| c.0),
                    best_median_s: closed.map(|c| c.1),
                    samples: times.samples() as u64,
                }
            })
            .collect();
        out.sort_by_key(|r| r.rank);
        NodeSummary {
            format: SUMMARY_FORMAT,
            node_rank,
            host: host.to_owned(),
            ranks: out,
        }
    }

    /// The JSON put in the store.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a NodeSummary always serialises")
    }

    /// Reads a peer's summary; the error names what is wrong, for a one-line warning.
    pub fn parse(bytes: &[u8]) -> Result<Self, SummaryError> {
        let s: NodeSummary = serde_json::from_slice(bytes).map_err(SummaryError::Unreadable)?;
        s.checked()
    }

    /// A summary read inside another message: refused unless this vigil reads its format.
    pub fn checked(self) -> Result<Self, SummaryError> {
        if self.format != SUMMARY_FORMAT {
            return Err(SummaryError::Format {
                node_rank: self.node_rank,
                format: self.format,
            });
        }
        Ok(self)
    }
}

/// A peer's summary this vigil cannot use.
#[derive(Debug, thiserror::Error)]
pub enum SummaryError {
    #[error("unreadable straggler summary: {0}")]
    Unreadable(serde_json::Error),
    #[error("straggler summary of node {node_rank} has format {format}, this vigil reads {SUMMARY_FORMAT}: run the same vigil version on every node")]
    Format { node_rank: u32, format: u32 },
}

/// One scored rank. Scores are in (0, 1]; 1.0 is best.
#[derive(Clone, Debug, PartialEq)]
pub struct RankScore {
    pub rank: u32,
    pub node_rank: u32,
    /// The job's fastest median / this rank's median.
    pub relative: f64,
    /// This rank's best median / its current median (1.0 when it has no best yet).
    pub individual: f64,
    pub median_s: f64,
}

/// The job's scores: every rank with a median, sorted by rank.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobScores {
    pub ranks: Vec<RankScore>,
    /// Ranks listed without a usable median (no samples yet), left out of `ranks`.
    pub unscored: usize,
    /// The fastest median in the job, seconds (the relative score's reference).
    pub fastest_median_s: Option<f64>,
    hosts: Vec<(u32, String)>,
}

impl JobScores {
    /// The host name of node `node_rank`, as its summary gave it (`?` if none did).
    pub fn host(&self, node_rank: u32) -> &str {
        match self.hosts.binary_search_by_key(&node_rank, |h| h.0) {
            Ok(i) => &self.hosts[i].1,
            Err(_) => "?",
        }
    }
}

fn usable(v: Option<f64>) -> Option<f64> {
    v.filter(|x| x.is_finite() && *x > 0.0)
}

/// Scores the whole job from every node's summary. A rank listed twice counts once (the first
/// listing, by node order); a rank without a positive, finite median is counted in `unscored`.
pub fn score_job(nodes: &[NodeSummary]) -> JobScores {
    let total = nodes.iter().map(|n| n.ranks.len()).sum();
    let mut ranks = Vec::with_capacity(total);
    let mut hosts = Vec::with_capacity(nodes.len());
    let mut unscored = 0;
    for node in nodes {
        hosts.push((node.node_rank, node.host.clone()));
        for r in &node.ranks {
            let Some(median_s) = usable(r.median_s) else {
                unscored += 1;
                continue;
            };
            let individual = usable(r.best_median_s).map_or(1.0, |b| (b / median_s).min(1.0));
            ranks.push(RankScore {
                rank: r.rank,
                node_rank: node.node_rank,
                relative: 1.0,
                individual,
                median_s,
            });
        }
    }
    // Stable: the first listing of a duplicated rank stays first and is kept.
    ranks.sort_by_key(|r| r.rank);
    ranks.dedup_by_key(|r| r.rank);
    hosts.sort_by_key(|h| h.0);
    hosts.dedup_by_key(|h| h.0);
    let fastest = ranks.iter().map(|r| r.median_s).reduce(f64::min);
    if let Some(min) = fastest {
        for r in &mut ranks {
            r.relative = min / r.median_s;
        }
    }
    JobScores {
        ranks,
        unscored,
        fastest_median_s: fastest,
        hosts,
    }
}

/// A straggler: `(rank, node_rank, host, relative, individual)`.
pub type Straggler = (u32, u32, String, f64, f64);

/// Ranks with either score below `threshold`, worst (lowest of its two scores) first, ties by
/// rank.
pub fn stragglers(scores: &JobScores, threshold: f64) -> Vec<Straggler> {
    let mut out: Vec<&RankScore> = scores
        .ranks
        .iter()
        .filter(|r| r.relative < threshold || r.individual < threshold)
        .collect();
    out.sort_by(|a, b| {
        a.relative
            .min(a.individual)
            .total_cmp(&b.relative.min(b.individual))
            .then(a.rank.cmp(&b.rank))
    });
    out.into_iter()
        .map(|r| {
            let host = scores.host(r.node_rank).to_owned();
            (r.rank, r.node_rank, host, r.relative, r.individual)
        })
        .collect()
}

/// The event log's record of a report (docs/stragglers.md): every scored rank, the stragglers,
/// the threshold and how many ranks had no median yet.
pub fn report_record(scores: &JobScores, threshold: f64) -> Value {
    let ranks = scores
        .ranks
        .iter()
        .map(|r| vigil_events::log::RankScore {
            rank: r.rank,
            node_rank: Some(r.node_rank),
            host: Some(scores.host(r.node_rank).to_string()),
            relative: Some(r.relative),
            individual: Some(r.individual),
            median_s: Some(r.median_s),
        })
        .collect();
    let slow: Vec<u32> = stragglers(scores, threshold)
        .into_iter()
        .map(|s| s.0)
        .collect();
    serde_json::to_value(vigil_events::Record::StragglerReport {
        ranks,
        stragglers: slow,
        threshold: Some(threshold),
        unscored: Some(scores.unscored as u64),
        gpus: Default::default(),
    })
    .unwrap_or_default()
}
