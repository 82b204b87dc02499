//! The stragglers plot ([`stragglers`]): the relative score over time of the worst few ranks
//! ([`worst_ranks`]), with the threshold.

use std::collections::BTreeMap;

use plotters::prelude::*;

use crate::history::History;

use super::{err, PlotError, TimeAxis, FAILED, FONT, WIDTH, WORST_RANKS};

/// The ranks with the lowest relative score in any report, worst first, at most `n`.
pub fn worst_ranks(h: &History, n: usize) -> Vec<u32> {
    let mut low: BTreeMap<u32, f64> = BTreeMap::new();
    for rep in h.straggler_reports() {
        for r in &rep.ranks {
            if let Some(s) = r.relative {
                let e = low.entry(r.rank).or_insert(f64::INFINITY);
                *e = e.min(s);
            }
        }
    }
    let mut v: Vec<(u32, f64)> = low.into_iter().collect();
    v.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
    v.into_iter().take(n).map(|(r, _)| r).collect()
}

/// Straggler scores over time: the relative score of the worst few ranks, and the threshold.
pub fn stragglers(h: &History, axis: &TimeAxis) -> Option<Result<String, PlotError>> {
    let worst = worst_ranks(h, WORST_RANKS);
    if worst.is_empty() {
        return None;
    }
    Some(stragglers_svg(h, axis, &worst))
}

fn stragglers_svg(h: &History, axis: &TimeAxis, worst: &[u32]) -> Result<String, PlotError> {
    let reports = h.straggler_reports();
    let threshold = reports.iter().rev().find_map(|r| r.threshold);
    let mut svg = String::new();
    {
        // Scores are at most 1.0: the room above holds the legend, clear of every line.
        let root = SVGBackend::with_string(&mut svg, (WIDTH, 460)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(axis.range(), 0.0..1.45)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc(axis.desc())
            .y_desc("relative score (1.0 best)")
            .y_label_formatter(&|v| {
                if *v > 1.0001 {
                    String::new()
                } else {
                    format!("{v:.1}")
                }
            })
            .axis_desc_style((FONT, 13))
            .label_style((FONT, 12))
            .draw()
            .map_err(err)?;
        if let Some(t) = threshold {
            chart
                .draw_series(DashedLineSeries::new(
                    [(0.0, t), (axis.len, t)],
                    6,
                    4,
                    FAILED.stroke_width(1),
                ))
                .map_err(err)?
                .label(format!("threshold {t:.2}"))
                .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], FAILED.stroke_width(1)));
        }
        for (k, rank) in worst.iter().enumerate() {
            let pts: Vec<(f64, f64)> = reports
                .iter()
                .filter_map(|rep| {
                    rep.ranks
                        .iter()
                        .find(|r| r.rank == *rank)
                        .and_then(|r| r.relative)
                        .map(|s| (axis.x(rep.ts), s))
                })
                .collect();
            let host = reports
                .iter()
                .flat_map(|rep| rep.ranks.iter())
                .find(|r| r.rank == *rank)
                .and_then(|r| r.host.clone());
            let label = match host {
                Some(h) => format!("rank {rank} ({h})"),
                None => format!("rank {rank}"),
            };
            let color = Palette99::pick(k).to_rgba();
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
                .map_err(err)?
                .label(label)
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2))
                });
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(err)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .label_font((FONT, 12))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}
