//! The steps plot ([`steps`]): each node rank's highest step over time per attempt, the drops
//! where an attempt resumed lower, and each allocation's last step from its ledger record.

use plotters::coord::types::{RangedCoordf64, RangedCoordi64};
use plotters::prelude::*;
use plotters::style::text_anchor::VPos;

use crate::history::History;

use super::{err, text_style, PlotError, TimeAxis, FONT, MAX_STEP_NODES, WIDTH};

/// The steps plot: time across, whole steps up.
type StepChart<'a, 'b> =
    ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordi64>>;

/// One node's steps in one attempt, in time order: (x, step).
struct StepLine {
    node: u32,
    attempt: u32,
    /// The attempt's start on the axis.
    start: f64,
    pts: Vec<(f64, i64)>,
}

/// Steps over time: a line per node rank and attempt (its ranks' highest step), a dashed drop
/// where an attempt resumed below where the one before it got, and each allocation's highest
/// step from its ledger record at its end (`steps` records come at most every 10 s, so a short
/// job's last one is far behind).
pub fn steps(h: &History, axis: &TimeAxis) -> Option<Result<String, PlotError>> {
    let mut lines: Vec<StepLine> = Vec::new();
    for r in h.runs.iter().filter(|r| !r.steps.is_empty()) {
        let mut attempts: Vec<u32> = r.steps.iter().map(|p| p.attempt).collect();
        attempts.sort_unstable();
        attempts.dedup();
        for c in attempts {
            let mut pts: Vec<(f64, i64)> = r
                .steps
                .iter()
                .filter(|p| p.attempt == c)
                .map(|p| (axis.x(p.ts), clamp_step(p.step)))
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            let start = r
                .attempts
                .iter()
                .find(|a| a.attempt == c)
                .map_or(pts[0].0, |a| axis.x(a.start));
            lines.push(StepLine {
                node: r.node_rank,
                attempt: c,
                start,
                pts,
            });
        }
    }
    let ends: Vec<(f64, i64, u32)> = h
        .allocations
        .iter()
        .filter_map(|a| Some((axis.x(a.end?), clamp_step(a.highest_step?), a.number)))
        .collect();
    if lines.is_empty() {
        return None;
    }
    let mut nodes: Vec<u32> = lines.iter().map(|l| l.node).collect();
    nodes.sort();
    nodes.dedup();
    nodes.truncate(MAX_STEP_NODES);
    lines.retain(|l| nodes.contains(&l.node));
    // Runs are in start order: each node's attempts follow one another.
    lines.sort_by(|a, b| a.node.cmp(&b.node).then(a.start.total_cmp(&b.start)));
    Some(steps_svg(&lines, &nodes, &ends, axis))
}

fn clamp_step(s: u64) -> i64 {
    i64::try_from(s).unwrap_or(i64::MAX / 2).min(i64::MAX / 2)
}

/// The step axis: whole steps only, with room above and below.
fn step_range(lines: &[StepLine], ends: &[(f64, i64, u32)]) -> std::ops::Range<i64> {
    let (lo, hi) = lines
        .iter()
        .flat_map(|l| l.pts.iter().map(|p| p.1))
        .chain(ends.iter().map(|e| e.1))
        .fold((i64::MAX, i64::MIN), |(lo, hi), s| (lo.min(s), hi.max(s)));
    let pad = ((hi - lo) / 20).max(1);
    (lo - pad).max(0)..hi + pad
}

/// Where attempt `l` started, and a dashed line from where the attempt before it on the same
/// node (`prev`) got to the first step recorded in `l`: a drop when it resumed from an earlier
/// checkpoint. The step it resumed from is not recorded (docs/report.md).
fn draw_resume(
    chart: &mut StepChart,
    prev: &StepLine,
    l: &StepLine,
    color: RGBAColor,
    y: &std::ops::Range<i64>,
    axis: &TimeAxis,
) -> Result<(), PlotError> {
    let last = *prev.pts.last().expect("a line has points");
    let first = l.pts[0];
    chart
        .draw_series(DashedLineSeries::new(
            [(l.start, y.start), (l.start, y.end)],
            2,
            4,
            RGBColor(150, 150, 150).stroke_width(1),
        ))
        .map_err(err)?;
    chart
        .draw_series(DashedLineSeries::new(
            [last, first],
            5,
            4,
            color.stroke_width(1),
        ))
        .map_err(err)?;
    let text = if first.1 < last.1 {
        format!(
            "attempt {} resumed below step {} (first step seen {})",
            l.attempt, last.1, first.1
        )
    } else {
        format!("attempt {} (first step seen {})", l.attempt, first.1)
    };
    chart
        .draw_series(std::iter::once(Text::new(
            text,
            (l.start, y.end),
            text_style(12, RGBColor(60, 60, 60), axis.anchor(l.start, VPos::Top)),
        )))
        .map_err(err)?;
    Ok(())
}

/// A cross at the highest step of each allocation the ledger says ended, labelled.
fn draw_ends(
    chart: &mut StepChart,
    ends: &[(f64, i64, u32)],
    axis: &TimeAxis,
) -> Result<(), PlotError> {
    for &(x, step, n) in ends {
        chart
            .draw_series(std::iter::once(Cross::new(
                (x, step),
                6,
                BLACK.stroke_width(2),
            )))
            .map_err(err)?;
        chart
            .draw_series(std::iter::once(Text::new(
                format!("allocation {n} ended at step {step} (ledger)"),
                (x, step),
                text_style(12, BLACK, axis.anchor(x, VPos::Bottom)),
            )))
            .map_err(err)?;
    }
    Ok(())
}

fn steps_svg(
    lines: &[StepLine],
    nodes: &[u32],
    ends: &[(f64, i64, u32)],
    axis: &TimeAxis,
) -> Result<String, PlotError> {
    let y = step_range(lines, ends);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, 380)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(axis.range(), y.clone())
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc(axis.desc())
            .y_desc("step")
            .y_labels(((y.end - y.start) as usize + 1).min(10))
            .axis_desc_style((FONT, 13))
            .label_style((FONT, 12))
            .draw()
            .map_err(err)?;
        let mut labelled = Vec::new();
        for (i, l) in lines.iter().enumerate() {
            let k = nodes.iter().position(|n| *n == l.node).unwrap_or(0);
            let color = Palette99::pick(k).to_rgba();
            // The attempt before this one on the same node: where it got to.
            let prev = i
                .checked_sub(1)
                .map(|j| &lines[j])
                .filter(|p| p.node == l.node && p.attempt < l.attempt);
            if let Some(prev) = prev {
                draw_resume(&mut chart, prev, l, color, &y, axis)?;
            }
            let series = chart
                .draw_series(LineSeries::new(
                    l.pts.iter().copied(),
                    color.stroke_width(2),
                ))
                .map_err(err)?;
            if !labelled.contains(&l.node) {
                labelled.push(l.node);
                series
                    .label(format!("node {}", l.node))
                    .legend(move |(x, y)| {
                        PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2))
                    });
            }
            chart
                .draw_series(l.pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(err)?;
        }
        draw_ends(&mut chart, ends, axis)?;
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .label_font((FONT, 12))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}
