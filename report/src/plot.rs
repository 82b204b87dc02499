//! The report's plots, drawn by plotters into SVG strings. plotters is built without a font
//! backend: text is laid out by its estimate and written as plain SVG `<text>`, which the browser
//! sets in its own sans-serif, so nothing reads system fonts.
//!
//! This file holds the shared axis, colours and text, and the timeline; the steps plot is in
//! `plot/steps.rs`, the stragglers plot in `plot/stragglers.rs`.

use std::collections::BTreeMap;

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::fmt::utc;
use crate::history::{History, NodeRun, StopKind};

mod steps;
mod stragglers;

pub use steps::steps;
pub use stragglers::{stragglers, worst_ranks};

const WIDTH: u32 = 1100;
const FONT: &str = "sans-serif";
/// Node rows drawn at most in the timeline; the events table lists every node.
pub const MAX_ROWS: usize = 48;
/// Ranks drawn in the straggler plot: the worst few.
pub const WORST_RANKS: usize = 5;
/// Nodes drawn in the steps plot.
pub const MAX_STEP_NODES: usize = 16;

const DONE: RGBColor = RGBColor(76, 160, 90);
const FAILED: RGBColor = RGBColor(214, 69, 65);
const STOPPED: RGBColor = RGBColor(235, 150, 40);
const LOST: RGBColor = RGBColor(130, 130, 130);
const RUNNING: RGBColor = RGBColor(70, 120, 200);
const HANG: RGBColor = RGBColor(140, 60, 170);
const RESTART: RGBColor = RGBColor(30, 90, 200);
/// Between an attempt's end and the next attempt's start.
const WAIT: RGBColor = RGBColor(150, 150, 150);

/// The time axis: seconds, minutes or hours after `t0`, whichever keeps the numbers readable.
#[derive(Debug, Clone, Copy)]
pub struct TimeAxis {
    pub t0: f64,
    pub unit: f64,
    pub name: &'static str,
    pub len: f64,
}

impl TimeAxis {
    pub fn new(t0: f64, t1: f64) -> TimeAxis {
        let span = (t1 - t0).max(1.0);
        let (unit, name) = if span <= 180.0 {
            (1.0, "seconds")
        } else if span <= 3.0 * 3600.0 {
            (60.0, "minutes")
        } else {
            (3600.0, "hours")
        };
        TimeAxis {
            t0,
            unit,
            name,
            len: span / unit,
        }
    }

    pub fn x(&self, ts: f64) -> f64 {
        (ts - self.t0) / self.unit
    }

    fn desc(&self) -> String {
        format!("{} since {}", self.name, utc(self.t0))
    }

    fn range(&self) -> std::ops::Range<f64> {
        0.0..self.len * 1.02
    }

    /// Labels in the right third are anchored at their end so they stay inside the plot.
    fn anchor(&self, x: f64, v: VPos) -> Pos {
        if x > self.len * 0.66 {
            Pos::new(HPos::Right, v)
        } else {
            Pos::new(HPos::Left, v)
        }
    }
}

fn text_style(size: u32, color: RGBColor, pos: Pos) -> TextStyle<'static> {
    TextStyle {
        font: (FONT, size).into_font(),
        color: color.to_backend_color(),
        pos,
    }
}

/// A plot the SVG backend could not draw; the page says why in its place.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PlotError(String);

fn err<E: std::fmt::Display>(e: E) -> PlotError {
    PlotError(e.to_string())
}

/// The node rows of the timeline: node ranks in order, each labelled with its host(s).
pub fn node_rows(h: &History) -> Vec<(u32, String)> {
    let mut hosts: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for r in &h.runs {
        let v = hosts.entry(r.node_rank).or_default();
        if !v.contains(&r.host) {
            v.push(r.host.clone());
        }
    }
    hosts
        .into_iter()
        .map(|(n, hs)| {
            let hs = if hs.len() > 2 {
                format!("{}, {} more", hs[0], hs.len() - 1)
            } else {
                hs.join(", ")
            };
            (n, format!("node {n} ({hs})"))
        })
        .collect()
}

/// The node rows the timeline draws, at most `max`: every node when they fit, else node rank 0,
/// the nodes where something went wrong (a failure, a hang, a fault, a lost attempt), then the
/// lowest other node ranks; in node rank order.
pub fn timeline_rows(h: &History, max: usize) -> Vec<(u32, String)> {
    let all = node_rows(h);
    if all.len() <= max {
        return all;
    }
    let mut chosen: Vec<u32> = vec![all[0].0];
    let troubled = h.runs.iter().filter(|r| {
        !r.failures.is_empty()
            || !r.hangs.is_empty()
            || !r.node_faults.is_empty()
            || r.attempts
                .iter()
                .any(|a| a.end_kind.as_deref() == Some("lost"))
    });
    for n in troubled.map(|r| r.node_rank).chain(all.iter().map(|r| r.0)) {
        if chosen.len() >= max {
            break;
        }
        if !chosen.contains(&n) {
            chosen.push(n);
        }
    }
    all.into_iter()
        .filter(|(n, _)| chosen.contains(n))
        .collect()
}

type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// The timeline: a band per allocation, a row per node rank with a bar per attempt, and markers
/// with labels for failures, hangs (with their frame), restarts and stops.
pub fn timeline(h: &History, axis: &TimeAxis) -> Result<String, PlotError> {
    let rows = timeline_rows(h, MAX_ROWS);
    let n = rows.len().max(1);
    // Row i is drawn at y = n - 1 - i, so node 0 is on top; the band above the rows holds the
    // allocations' labels.
    let y_of = |i: usize| (n - 1 - i) as f64;
    let height = 150 + 100 * n as u32;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(10)
            .build_cartesian_2d(axis.range(), -0.6..(n as f64 - 0.4 + 0.7))
            .map_err(err)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(0)
            .x_desc(axis.desc())
            .axis_desc_style((FONT, 13))
            .label_style((FONT, 12))
            .draw()
            .map_err(err)?;
        let top = n as f64 - 0.4;
        draw_allocations(&mut chart, h, axis, top)?;
        for (i, (_, label)) in rows.iter().enumerate() {
            draw_text(
                &mut chart,
                label.clone(),
                (0.0, y_of(i) + 0.42),
                text_style(12, RGBColor(60, 60, 60), Pos::new(HPos::Left, VPos::Top)),
            )?;
        }
        for run in &h.runs {
            if let Some(i) = rows.iter().position(|(n, _)| *n == run.node_rank) {
                draw_node_run(&mut chart, run, axis, y_of(i))?;
            }
        }
        root.present().map_err(err)?;
    }
    Ok(svg)
}

fn draw_text(
    chart: &mut Chart,
    text: String,
    at: (f64, f64),
    style: TextStyle<'static>,
) -> Result<(), PlotError> {
    chart
        .draw_series(std::iter::once(Text::new(text, at, style)))
        .map_err(err)?;
    Ok(())
}

/// The allocations: alternating bands with a label above the rows, then the requeues after
/// every band, so the next allocation's band does not cover them.
fn draw_allocations(
    chart: &mut Chart,
    h: &History,
    axis: &TimeAxis,
    top: f64,
) -> Result<(), PlotError> {
    for (k, a) in h.allocations.iter().enumerate() {
        let x0 = axis.x(a.start);
        let x1 = a.end.map_or(axis.len, |e| axis.x(e));
        let shade = if k % 2 == 0 {
            RGBColor(238, 242, 250)
        } else {
            RGBColor(246, 240, 232)
        };
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(x0, -0.55), (x1, top + 0.65)],
                shade.filled(),
            )))
            .map_err(err)?;
        draw_text(
            chart,
            allocation_label(a),
            (x0, top + 0.55),
            text_style(13, BLACK, Pos::new(HPos::Left, VPos::Top)),
        )?;
    }
    for a in h.allocations.iter().filter(|a| a.requeued()) {
        let x1 = a.end.map_or(axis.len, |e| axis.x(e));
        chart
            .draw_series(DashedLineSeries::new(
                [(x1, -0.55), (x1, top + 0.65)],
                6,
                4,
                STOPPED.stroke_width(2),
            ))
            .map_err(err)?;
        let what = if a.preempted() {
            "requeue after preemption"
        } else {
            "requeue"
        };
        draw_text(
            chart,
            what.to_string(),
            (x1, top + 0.3),
            text_style(12, STOPPED, Pos::new(HPos::Right, VPos::Top)),
        )?;
    }
    Ok(())
}

/// "allocation N: outcome (stopped: trigger at step S) -> decision", or ": running".
fn allocation_label(a: &crate::model::Allocation) -> String {
    let mut label = format!("allocation {}", a.number);
    if a.end.is_none() {
        label.push_str(": running");
        return label;
    }
    label.push_str(&format!(": {}", a.outcome.as_deref().unwrap_or("ended")));
    if let Some(t) = &a.stop_trigger {
        let what = if a.preempted() {
            "preempted"
        } else {
            "stopped"
        };
        match a.stop_step {
            Some(s) => label.push_str(&format!(" ({what}: {t} at step {s})")),
            None => label.push_str(&format!(" ({what}: {t})")),
        }
    }
    if let Some(d) = &a.decision {
        label.push_str(&format!(" -> {d}"));
    }
    label
}

/// One node rank's row: a bar per attempt, the waits between attempts, and a marker with a
/// label for each failure, hang, restart, node fault and stop.
fn draw_node_run(
    chart: &mut Chart,
    run: &NodeRun,
    axis: &TimeAxis,
    y: f64,
) -> Result<(), PlotError> {
    draw_attempts(chart, run, axis, y)?;
    draw_failures_and_hangs(chart, run, axis, y)?;
    let waits = run.waits();
    for w in &waits {
        let (x0, x1) = (axis.x(w.from), axis.x(w.to));
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(x0, y - 0.05), (x1.max(x0 + axis.len * 0.002), y + 0.05)],
                WAIT.filled(),
            )))
            .map_err(err)?;
    }
    for r in &run.restarts {
        let x = axis.x(r.ts);
        let wait = waits
            .iter()
            .find(|w| w.to_attempt == r.to_attempt)
            .map_or_else(String::new, |w| format!(", {}", w.describe()));
        chart
            .draw_series(std::iter::once(Circle::new((x, y), 5, RESTART.filled())))
            .map_err(err)?;
        let label = format!("restart -> attempt {}{wait}", r.to_attempt);
        let style = text_style(12, RESTART, axis.anchor(x, VPos::Bottom));
        draw_text(chart, label, (x, y + 0.28), style)?;
    }
    for f in &run.node_faults {
        let x = axis.x(f.ts);
        chart
            .draw_series(std::iter::once(Cross::new((x, y), 7, LOST.stroke_width(3))))
            .map_err(err)?;
        let style = text_style(12, RGBColor(80, 80, 80), axis.anchor(x, VPos::Top));
        draw_text(
            chart,
            format!("node fault: {}", f.reason),
            (x, y - 0.3),
            style,
        )?;
    }
    for (ts, label) in stop_labels(run) {
        let x = axis.x(ts);
        chart
            .draw_series(std::iter::once(Circle::new((x, y), 5, STOPPED.filled())))
            .map_err(err)?;
        draw_text(
            chart,
            label,
            (x, y - 0.44),
            text_style(12, STOPPED, axis.anchor(x, VPos::Top)),
        )?;
    }
    Ok(())
}

/// A node rank's bar per attempt, coloured by how it ended.
fn draw_attempts(
    chart: &mut Chart,
    run: &NodeRun,
    axis: &TimeAxis,
    y: f64,
) -> Result<(), PlotError> {
    for a in &run.attempts {
        let color = match a.end_kind.as_deref() {
            Some("done") => DONE,
            Some("failed") => FAILED,
            Some("stopped") => STOPPED,
            Some("lost") => LOST,
            _ => RUNNING,
        };
        let (x0, x1) = (axis.x(a.start), axis.x(a.end));
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(x0, y - 0.12), (x1.max(x0 + axis.len * 0.002), y + 0.12)],
                color.mix(0.85).filled(),
            )))
            .map_err(err)?;
        draw_text(
            chart,
            format!("attempt {}", a.attempt),
            (x0, y + 0.14),
            text_style(11, BLACK, Pos::new(HPos::Left, VPos::Bottom)),
        )?;
    }
    Ok(())
}

/// A node rank's failures (crosses) and hangs (triangles), each labelled.
fn draw_failures_and_hangs(
    chart: &mut Chart,
    run: &NodeRun,
    axis: &TimeAxis,
    y: f64,
) -> Result<(), PlotError> {
    // Ranks of one attempt often fail or hang together (a collective aborts): one label per
    // attempt, for the first, naming how many more.
    for (f, more) in first_per_attempt(&run.failures, |f| (f.attempt, f.ts)) {
        let x = axis.x(f.ts);
        chart
            .draw_series(std::iter::once(Cross::new(
                (x, y),
                7,
                FAILED.stroke_width(3),
            )))
            .map_err(err)?;
        let label = format!("failure: {}{}", f.describe(), more_ranks(more));
        draw_text(
            chart,
            label,
            (x, y - 0.16),
            text_style(12, FAILED, axis.anchor(x, VPos::Top)),
        )?;
    }
    for (hang, more) in first_per_attempt(&run.hangs, |h| (h.attempt, h.ts)) {
        let x = axis.x(hang.ts);
        chart
            .draw_series(std::iter::once(TriangleMarker::new(
                (x, y),
                8,
                HANG.filled(),
            )))
            .map_err(err)?;
        let label = format!("hang: {}{}", hang.describe(), more_ranks(more));
        draw_text(
            chart,
            label,
            (x, y - 0.3),
            text_style(12, HANG, axis.anchor(x, VPos::Top)),
        )?;
    }
    Ok(())
}

/// The earliest item of each attempt, with how many more the attempt has, in attempt order.
pub fn first_per_attempt<T>(items: &[T], key: impl Fn(&T) -> (u32, f64)) -> Vec<(&T, usize)> {
    let mut out: Vec<(&T, usize)> = Vec::new();
    let mut by_attempt: BTreeMap<u32, (usize, usize)> = BTreeMap::new();
    for (i, it) in items.iter().enumerate() {
        let (attempt, ts) = key(it);
        let e = by_attempt.entry(attempt).or_insert((i, 0));
        e.1 += 1;
        if ts < key(&items[e.0]).1 {
            e.0 = i;
        }
    }
    for (_, (i, n)) in by_attempt {
        out.push((&items[i], n - 1));
    }
    out
}

fn more_ranks(more: usize) -> String {
    match more {
        0 => String::new(),
        1 => " (+1 more rank)".into(),
        n => format!(" (+{n} more ranks)"),
    }
}

/// The timeline's stop markers for one node: a trigger and the step agreed after it make one
/// label (`stop: time-limit, at step 297`); an agreement without a trigger on
/// this node (another node saw it) is labelled alone. Overdue ranks are left to the table.
pub fn stop_labels(run: &NodeRun) -> Vec<(f64, String)> {
    let mut out: Vec<(f64, String)> = Vec::new();
    let mut open: Option<usize> = None;
    for s in &run.stops {
        match &s.kind {
            StopKind::Triggered { trigger } => {
                out.push((s.ts, format!("stop: {trigger}")));
                open = Some(out.len() - 1);
            }
            StopKind::Agreed { step, trigger } => {
                let at = match step {
                    Some(n) => format!("at step {n}"),
                    None => "now".to_string(),
                };
                match open.take() {
                    Some(i) => out[i].1.push_str(&format!(", {at}")),
                    None => out.push((
                        s.ts,
                        match trigger {
                            Some(t) => format!("stop: {t}, {at}"),
                            None => format!("stop {at}"),
                        },
                    )),
                }
            }
            StopKind::Overdue { .. } => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Stop;

    fn stop(ts: f64, kind: StopKind) -> Stop {
        Stop {
            ts,
            attempt: 0,
            kind,
            window_s: None,
        }
    }

    #[test]
    fn a_trigger_and_its_agreed_step_make_one_label() {
        let run = NodeRun {
            stops: vec![
                stop(
                    1.0,
                    StopKind::Triggered {
                        trigger: "time-limit".into(),
                    },
                ),
                stop(
                    2.0,
                    StopKind::Agreed {
                        step: Some(297),
                        trigger: Some("time-limit".into()),
                    },
                ),
                stop(3.0, StopKind::Overdue { ranks: vec![1] }),
                stop(
                    9.0,
                    StopKind::Agreed {
                        step: None,
                        trigger: Some("SIGTERM".into()),
                    },
                ),
            ],
            ..NodeRun::default()
        };
        assert_eq!(
            stop_labels(&run),
            vec![
                (1.0, "stop: time-limit, at step 297".to_string()),
                (9.0, "stop: SIGTERM, now".to_string())
            ]
        );
    }

    #[test]
    fn the_worst_ranks_are_the_lowest_relative_scores_in_any_report() {
        use crate::history::{RankScore, StragglerReport};
        let score = |rank, relative| RankScore {
            rank,
            relative: Some(relative),
            ..RankScore::default()
        };
        let h = History {
            runs: vec![NodeRun {
                straggler_reports: vec![
                    StragglerReport {
                        ts: 1.0,
                        ranks: vec![score(0, 1.0), score(1, 0.9), score(2, 0.3)],
                        ..Default::default()
                    },
                    StragglerReport {
                        ts: 2.0,
                        ranks: vec![score(0, 0.5), score(1, 0.95), score(2, 0.8)],
                        ..Default::default()
                    },
                ],
                ..NodeRun::default()
            }],
            ..History::default()
        };
        assert_eq!(worst_ranks(&h, 2), vec![2, 0]);
        assert_eq!(worst_ranks(&h, 5), vec![2, 0, 1]);
    }

    #[test]
    fn a_large_job_shows_node_0_and_the_troubled_nodes_first() {
        let run = |node_rank: u32, fails: bool| NodeRun {
            host: format!("h{node_rank}"),
            node_rank,
            start: 1.0,
            end: 2.0,
            failures: if fails {
                vec![crate::history::Failure::default()]
            } else {
                vec![]
            },
            ..NodeRun::default()
        };
        let h = History {
            runs: (0..60).map(|n| run(n, n == 55 || n == 7)).collect(),
            ..History::default()
        };
        let rows: Vec<u32> = timeline_rows(&h, 4).into_iter().map(|r| r.0).collect();
        assert_eq!(rows, vec![0, 1, 7, 55]);
        assert_eq!(timeline_rows(&h, 100).len(), 60);
    }

    #[test]
    fn failures_of_one_attempt_share_one_label() {
        let items = [(0u32, 5.0), (0, 4.0), (0, 6.0), (2, 9.0)];
        let got: Vec<((u32, f64), usize)> = first_per_attempt(&items, |x| *x)
            .into_iter()
            .map(|(x, n)| (*x, n))
            .collect();
        assert_eq!(got, vec![((0, 4.0), 2), ((2, 9.0), 0)]);
        assert_eq!(more_ranks(2), " (+2 more ranks)");
    }

    #[test]
    fn the_time_axis_picks_a_readable_unit() {
        assert_eq!(TimeAxis::new(0.0, 100.0).name, "seconds");
        assert_eq!(TimeAxis::new(0.0, 3600.0).name, "minutes");
        let a = TimeAxis::new(0.0, 5.0 * 3600.0);
        assert_eq!((a.name, a.x(7200.0)), ("hours", 2.0));
    }
}
