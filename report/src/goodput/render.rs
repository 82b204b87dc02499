//! The numbers in text: the table of `vigil goodput`, the ledger's line, and the command itself.

use super::{of_history, Breakdown, Category, GenerationCost, Goodput};
use crate::history::History;

/// `12.3s` with one decimal, for the table and the report page's legend.
pub(crate) fn s1(x: f64) -> String {
    format!("{x:.1}s")
}

/// The table `vigil goodput` prints.
pub fn render_table(g: &Goodput) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "wall time {} from {} to {}; goodput {:.1}%\n\n",
        s1(g.wall_s),
        crate::fmt::utc(g.start),
        crate::fmt::utc(g.end),
        100.0 * g.goodput_fraction
    ));
    let mut header = format!("{:<28}{:>12}{:>8}", "category", "seconds", "share");
    for a in &g.allocations {
        header.push_str(&format!("{:>12}", format!("alloc {}", a.number)));
    }
    out.push_str(header.trim_end());
    out.push('\n');
    let share = |x: f64| {
        if g.wall_s > 0.0 {
            format!("{:.1}%", 100.0 * x / g.wall_s)
        } else {
            "-".into()
        }
    };
    let mut row = |label: &str, total: f64, each: &dyn Fn(&Breakdown) -> f64| {
        let mut l = format!("{label:<28}{:>12}{:>8}", s1(total), share(total));
        for a in &g.allocations {
            l.push_str(&format!("{:>12}", s1(each(&a.breakdown))));
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    for c in Category::ALL {
        row(c.label(), g.breakdown.get(c), &|b| b.get(c));
    }
    row("total", g.breakdown.total(), &|b| b.total());
    out.push('\n');
    let st = &g.steps;
    match st.ideal_step_time_s {
        Some(i) => {
            out.push_str(&format!("ideal step time {i:.3}s"));
            if let Some(m) = st.median_step_time_s {
                out.push_str(&format!(" (median {m:.3}s)"));
            }
            if let Some(d) = st.median_abs_deviation_s {
                out.push_str(&format!("; step-time deviation: median {d:.3}s"));
            }
            if let Some(w) = &st.worst {
                out.push_str(&format!(
                    ", largest {:+.3}s over steps {}..{} (allocation {}, attempt {})",
                    w.deviation_s.unwrap_or(0.0),
                    w.from_step,
                    w.to_step,
                    w.allocation,
                    w.attempt
                ));
            }
            out.push('\n');
        }
        None => out.push_str("ideal step time: none (no step time recorded)\n"),
    }
    if !g.generations.is_empty() {
        out.push_str("in-process restarts (from the failure to every rank stepping again):\n");
        for c in &g.generations {
            out.push_str(&format!("  {}\n", generation_line(c)));
        }
    }
    for n in &g.notes {
        out.push_str(&format!("note: {n}\n"));
    }
    out
}

/// `allocation 1, attempt 0, generation 1: rank 2 replaced at step 30; every rank stepping
/// again after 0.41s; lost: nothing`.
fn generation_line(c: &GenerationCost) -> String {
    let ranks: Vec<String> = c.ranks.iter().map(u32::to_string).collect();
    let at = c.step.map(|s| format!(" at step {s}")).unwrap_or_default();
    let what = match (c.recovery_s, c.steps_lost) {
        (Some(s), _) => format!("every rank stepping again after {s:.2}s; lost: nothing"),
        (None, Some(n)) => format!(
            "not recovered in process, the whole job restarted; lost: {n} steps since the step it went on from"
        ),
        (None, None) => "not recovered in process, the whole job restarted".to_string(),
    };
    format!(
        "allocation {}, attempt {}, generation {}: rank {} replaced{at}; {what}",
        c.allocation,
        c.attempt,
        c.generation,
        ranks.join(", ")
    )
}

/// `goodput 62.0% of 1h02m (start-up 3.1%, ...)`: one line, for `vigil ledger`.
pub fn summary_line(g: &Goodput) -> String {
    let parts: Vec<String> = Category::ALL[1..]
        .iter()
        .filter(|c| g.breakdown.get(**c) > 0.0)
        .map(|c| {
            format!(
                "{} {:.1}%",
                c.label(),
                100.0 * g.breakdown.get(*c) / g.wall_s.max(f64::MIN_POSITIVE)
            )
        })
        .collect();
    let mut s = format!(
        "goodput {:.1}% of {}",
        100.0 * g.goodput_fraction,
        crate::fmt::duration(g.wall_s)
    );
    if !parts.is_empty() {
        s.push_str(&format!(" ({})", parts.join(", ")));
    }
    s.push_str("; see vigil goodput");
    s
}

/// The ledger line for the job whose records are below `dir`, if it has any.
pub fn ledger_line(dir: &std::path::Path) -> Option<String> {
    let h = History::load(dir).ok()?;
    let g = of_history(&h);
    (g.wall_s > 0.0).then(|| summary_line(&g))
}

/// `vigil goodput TARGET [--json]`: the table, or the same numbers as JSON.
pub fn goodput_command(
    target: &str,
    json: bool,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, crate::ReportError> {
    let dir = crate::resolve_target(target, env)?;
    let h = History::load(&dir)?;
    let mut g = of_history(&h);
    g.notes.extend(h.notes.iter().cloned());
    Ok(if json {
        let mut s = serde_json::to_string_pretty(&g).unwrap_or_default();
        s.push('\n');
        s
    } else {
        render_table(&g)
    })
}
