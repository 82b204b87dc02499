//! The report page: one self-contained HTML file (inline CSS and SVG, no scripts).

use std::fmt::Write;

use vigil_events::ledger::DecisionKind;

use crate::fmt::{duration, utc};
use crate::goodput::{self, Category};
use crate::history::History;
use crate::plot::{self, PlotError, TimeAxis};

const STYLE: &str = "
body { font-family: sans-serif; margin: 24px; color: #222; max-width: 1160px; }
h1 { font-size: 22px; margin-bottom: 4px; }
h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
.meta { color: #555; }
pre.status { background: #f6f6f6; padding: 10px; white-space: pre-wrap; }
pre.command { background: #f6f6f6; padding: 6px 10px; white-space: pre-wrap; overflow-wrap: anywhere; }
p.empty { color: #666; font-style: italic; }
p.error { color: #b00; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 3px 6px; text-align: left; vertical-align: top; }
td pre { white-space: pre-wrap; overflow-wrap: anywhere; margin: 0; }
th { background: #f0f0f0; }
tr.failure td, tr.rank-failure td, tr.hang td, tr.lost td, tr.node_fault td { background: #fdf0ef; }
tr.straggler td { background: #f5eefa; }
tr.restart td { background: #eef3fc; }
tr.requeue td, tr.preempted td, tr.stop td { background: #fdf6ea; }
.legend span { display: inline-block; margin-right: 14px; font-size: 13px; }
.legend i { display: inline-block; width: 14px; height: 10px; margin-right: 4px; vertical-align: middle; }
figure { margin: 8px 0; }
pre.excerpt { margin: 4px 0 0; font-size: 12px; white-space: pre-wrap; max-width: 560px; }
b.exception { color: #b00; }
div.path { font-family: monospace; font-size: 12px; word-break: break-all; }
#failures table { width: 100%; table-layout: fixed; }
#failures col.t { width: 92px; } #failures col.p { width: 36px; } #failures col.w { width: 130px; }
#failures col.x { width: 170px; } #failures col.l { width: 300px; }
";

/// HTML-escapes text for element content and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Each distinct command line the agents were started with (node rank 0's first), quoted as a
/// shell would need it.
fn command_lines(out: &mut String, h: &History) {
    let mut seen: Vec<&Vec<String>> = Vec::new();
    let mut runs: Vec<&crate::model::NodeRun> = h.runs.iter().collect();
    runs.sort_by_key(|r| r.node_rank);
    for c in runs.iter().filter_map(|r| r.command.as_ref()) {
        if !seen.contains(&c) {
            seen.push(c);
        }
    }
    if seen.is_empty() {
        return;
    }
    out.push_str("<p class=\"meta\">Command line:</p>\n");
    for c in seen {
        let line: Vec<String> = c.iter().map(|a| shell_word(a)).collect();
        let _ = writeln!(out, "<pre class=\"command\">{}</pre>", esc(&line.join(" ")));
    }
}

/// `a` as one shell word: as it is when it needs no quoting, else in single quotes.
fn shell_word(a: &str) -> String {
    let plain = !a.is_empty()
        && a.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if plain {
        a.to_string()
    } else {
        format!("'{}'", a.replace('\'', "'\\''"))
    }
}

fn figure(out: &mut String, id: &str, plot: Option<Result<String, PlotError>>, empty: &str) {
    match plot {
        Some(Ok(svg)) => {
            let _ = write!(out, "<figure id=\"{id}\">\n{svg}\n</figure>\n");
        }
        Some(Err(e)) => {
            let _ = writeln!(
                out,
                "<p class=\"error\" id=\"{id}\">This plot could not be drawn: {}</p>",
                esc(&e.to_string())
            );
        }
        None => {
            let _ = writeln!(out, "<p class=\"empty\" id=\"{id}\">{}</p>", esc(empty));
        }
    }
}

/// The whole report page for `h`.
pub fn render_html(h: &History) -> String {
    let full = h;
    let (view, summarised) = recent(full);
    let h: &History = &view;
    let mut out = String::new();
    let title = format!("vigil report: {}", job_name(full));
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<h1>{}</h1>\n<p class=\"meta\" id=\"source\">From the records in {}.</p>\n",
        esc(&title),
        esc(&title),
        esc(&h.root.display().to_string())
    );
    if let Some((t0, t1)) = full.span() {
        let _ = writeln!(
            out,
            "<p class=\"meta\">{} to {} ({}); {} event log{}, {} allocation{}.</p>",
            utc(t0),
            utc(t1),
            duration(t1 - t0),
            full.runs.len(),
            if full.runs.len() == 1 { "" } else { "s" },
            full.allocations.len(),
            if full.allocations.len() == 1 { "" } else { "s" },
        );
    }
    // The plots and tables cover what the page shows one by one.
    let span = h.span();
    if let Some(p) = &summarised {
        let _ = writeln!(out, "<p class=\"meta\" id=\"summarised\">{}</p>", esc(p));
    }
    out.push_str("<section id=\"summary\">\n<h2>Summary</h2>\n<pre class=\"status\">");
    out.push_str(&esc(&full.status_lines().join("\n")));
    out.push_str("</pre>\n");
    command_lines(&mut out, h);
    out.push_str("</section>\n");
    failures_table(&mut out, h, span.map_or(0.0, |s| s.0));

    let axis = span.map(|(t0, t1)| TimeAxis::new(t0, t1));

    timeline_section(&mut out, h, axis.as_ref());

    out.push_str("<section id=\"steps\">\n<h2>Steps over time</h2>\n");
    figure(
        &mut out,
        "steps-plot",
        axis.as_ref().and_then(|a| plot::steps(h, a)),
        "No steps recorded: the event logs hold no `steps` events (a vigil that records them, and ranks that report their step through vigil.should_stop(step) or heartbeats with a step).",
    );
    out.push_str("</section>\n");

    out.push_str(&goodput_section(full));

    out.push_str("<section id=\"stragglers\">\n<h2>Straggler scores</h2>\n");
    let worst = plot::worst_ranks(h, plot::WORST_RANKS);
    if !worst.is_empty() {
        let _ = writeln!(
            out,
            "<p class=\"meta\">Relative score (the job's fastest median step time / the rank's) of the {} rank{} that scored lowest in any report.</p>",
            worst.len(),
            if worst.len() == 1 { "" } else { "s" }
        );
    }
    figure(
        &mut out,
        "stragglers-plot",
        axis.as_ref().and_then(|a| plot::stragglers(h, a)),
        "No straggler scores recorded: the event logs hold no `straggler_report` events with scored ranks.",
    );
    out.push_str("</section>\n");

    allocations_table(&mut out, h);
    events_table(&mut out, h, span.map_or(0.0, |s| s.0));

    if !full.notes.is_empty() {
        out.push_str("<section id=\"notes\">\n<h2>Notes</h2>\n<ul>\n");
        for n in &full.notes {
            let _ = writeln!(out, "<li>{}</li>", esc(n));
        }
        out.push_str("</ul>\n</section>\n");
    }
    out.push_str("</body>\n</html>\n");
    out
}

/// The most allocations the page draws and lists one by one: the latest ones. The earlier ones
/// are summarised in one paragraph, so a job of 100,000 allocations makes a page of the size of
/// one of a few hundred (`vigil ledger` lists every one).
pub const PAGE_ALLOCATIONS: usize = 300;

/// The page's view of `h`: its last [`PAGE_ALLOCATIONS`] allocations and their node runs, and
/// the paragraph that summarises the earlier ones (`None` when every one is shown).
fn recent(h: &History) -> (std::borrow::Cow<'_, History>, Option<String>) {
    let skip = h.allocations.len().saturating_sub(PAGE_ALLOCATIONS);
    if skip == 0 {
        return (std::borrow::Cow::Borrowed(h), None);
    }
    let (earlier, kept) = h.allocations.split_at(skip);
    let mut runs = Vec::new();
    let mut allocations = Vec::with_capacity(kept.len());
    for a in kept {
        let mut a = a.clone();
        for i in a.runs.iter_mut() {
            runs.push(h.runs[*i].clone());
            *i = runs.len() - 1;
        }
        allocations.push(a);
    }
    let mut outcomes = std::collections::BTreeMap::new();
    for a in earlier {
        *outcomes
            .entry(a.outcome.as_deref().unwrap_or("running"))
            .or_insert(0usize) += 1;
    }
    let outcomes: Vec<String> = outcomes.iter().map(|(o, n)| format!("{n} {o}")).collect();
    let restarts: u64 = earlier.iter().map(|a| u64::from(a.restarts)).sum();
    let (first, last) = (&earlier[0], &earlier[earlier.len() - 1]);
    let text = format!(
        "This page shows the last {} of {} allocations one by one; the {skip} before them (allocations {} to {}, {} to {}) are summarised: {}; {restarts} in-job restart{}. `vigil ledger` lists every one.",
        kept.len(),
        h.allocations.len(),
        first.number,
        last.number,
        utc(first.start),
        utc(last.end.unwrap_or(last.start)),
        outcomes.join(", "),
        if restarts == 1 { "" } else { "s" },
    );
    let view = History {
        root: h.root.clone(),
        allocations,
        runs,
        notes: Vec::new(),
    };
    (std::borrow::Cow::Owned(view), Some(text))
}

/// The timeline section: its legend, the plot, and a note when it shows only some node ranks.
fn timeline_section(out: &mut String, h: &History, axis: Option<&TimeAxis>) {
    out.push_str("<section id=\"timeline\">\n<h2>Timeline: allocations and attempts</h2>\n");
    out.push_str(concat!(
        "<p class=\"legend\">",
        "<span><i style=\"background:#4ca05a\"></i>attempt done</span>",
        "<span><i style=\"background:#d64541\"></i>attempt failed / failure (x)</span>",
        "<span><i style=\"background:#eb9628\"></i>attempt stopped / stop, requeue (dashed)</span>",
        "<span><i style=\"background:#828282\"></i>node lost / node fault (x)</span>",
        "<span><i style=\"background:#4678c8\"></i>running or log ended</span>",
        "<span><i style=\"background:#8c3caa\"></i>hang (triangle)</span>",
        "<span><i style=\"background:#1e5ac8\"></i>restart (dot)</span>",
        "<span><i style=\"background:#969696;height:4px\"></i>wait between attempts</span>",
        "</p>\n"
    ));
    let rows = plot::node_rows(h).len();
    if rows > plot::MAX_ROWS {
        let _ = writeln!(
            out,
            "<p class=\"empty\">The plot shows {} of {rows} node ranks: node rank 0 and those where something went wrong first, then the lowest; the events table lists every node.</p>",
            plot::MAX_ROWS
        );
    }
    figure(
        out,
        "timeline-plot",
        match (axis, h.runs.is_empty()) {
            (Some(a), false) => Some(plot::timeline(h, a)),
            _ => None,
        },
        "No event logs (events.jsonl) were found: only the ledger's allocations are known, listed below.",
    );
    out.push_str("</section>\n");
}

/// What to call the job: the experiment's name (`experiment.json` in the directory given), the
/// job id of the ledger, the job id or script name in the run directory's name
/// (`vigil_<job id or script>_<time>_<hex>`), else the directory's own name.
pub fn job_name(h: &History) -> String {
    let meta = crate::records::read_experiment(&h.root).ok();
    if let Some(m) = meta.filter(|m| !m.name.is_empty()) {
        return match m.job_id {
            Some(j) => format!("{} (job {j})", m.name),
            None => m.name,
        };
    }
    if let Some(j) = h.allocations.iter().find_map(|a| a.job_id.clone()) {
        return format!("job {j}");
    }
    let run_name = h.runs.iter().find_map(|r| {
        let dir = r
            .source
            .parent()?
            .file_name()?
            .to_string_lossy()
            .into_owned();
        let rest = dir.strip_prefix("vigil_")?;
        // `<who>_<YYYYMMDD-HHMMSS>_<hex>`: `who` may hold `_` itself.
        let mut parts = rest.rsplitn(3, '_');
        let (_, _, who) = (parts.next()?, parts.next()?, parts.next()?);
        Some(who.to_string())
    });
    if let Some(who) = run_name.filter(|w| !w.is_empty()) {
        return who;
    }
    h.root
        .canonicalize()
        .unwrap_or_else(|_| h.root.clone())
        .file_name()
        .map_or_else(
            || h.root.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
}

/// Rows in the failures table at most (a collective abort fails every rank at once); the events
/// table lists them all.
const MAX_FAILURE_ROWS: usize = 40;

/// A rank failure or hang, as the failures table shows it.
struct FailureRow<'a> {
    ts: f64,
    run: &'a crate::history::NodeRun,
    attempt: u32,
    rank: Option<u32>,
    local_rank: Option<u32>,
    what: String,
    /// Files to list beside the rank's logs: a hang's stacks.
    extra: Vec<std::path::PathBuf>,
}

/// Every rank failure and hang of `h`, in time order.
fn failure_rows(h: &History) -> Vec<FailureRow<'_>> {
    let mut rows: Vec<FailureRow> = Vec::new();
    for r in &h.runs {
        for f in &r.failures {
            rows.push(FailureRow {
                ts: f.ts,
                run: r,
                attempt: f.attempt,
                rank: f.rank,
                local_rank: f.local_rank,
                what: f.describe(),
                extra: Vec::new(),
            });
        }
        for hg in &r.hangs {
            rows.push(FailureRow {
                ts: hg.ts,
                run: r,
                attempt: hg.attempt,
                rank: hg.rank,
                local_rank: hg.local_rank,
                what: hg.describe(),
                extra: hg.stacks_files.clone(),
            });
        }
    }
    rows.sort_by(|a, b| a.ts.total_cmp(&b.ts));
    rows
}

/// One row per rank failure and hang: when, where, what, the exception that ended its stderr.log
/// and its last traceback, and the files to read.
fn failures_table(out: &mut String, h: &History, t0: f64) {
    out.push_str("<section id=\"failures\">\n<h2>Failures</h2>\n");
    let rows = failure_rows(h);
    if rows.is_empty() {
        out.push_str("<p class=\"empty\">No rank failed or hung.</p>\n</section>\n");
        return;
    }
    if rows.len() > MAX_FAILURE_ROWS {
        let _ = writeln!(
            out,
            "<p class=\"meta\">The first {MAX_FAILURE_ROWS} of {} failures and hangs; the events table lists them all.</p>",
            rows.len()
        );
    }
    out.push_str("<table>\n<colgroup><col class=\"t\"><col class=\"p\"><col class=\"w\"><col class=\"x\"><col><col class=\"l\"></colgroup>\n<tr><th>time (UTC)</th><th>+</th><th>where</th><th>what</th><th>exception and the end of stderr.log</th><th>logs</th></tr>\n");
    for row in rows.iter().take(MAX_FAILURE_ROWS) {
        failure_row(out, row, t0);
    }
    out.push_str("</table>\n</section>\n");
}

/// A failure's or hang's row: its cells, with the rank's logs read for the exception.
fn failure_row(out: &mut String, row: &FailureRow, t0: f64) {
    let logs = row
        .local_rank
        .and_then(|l| row.run.rank_dir(row.attempt, l))
        .map(|d| crate::ranklogs::read(&d, &row.extra));
    let who = match (row.rank, row.local_rank) {
        (Some(r), Some(l)) => format!("rank {r} (local {l})"),
        (Some(r), None) => format!("rank {r}"),
        (None, Some(l)) => format!("local rank {l}"),
        _ => "a rank".into(),
    };
    let mut exc = String::new();
    let mut files = String::new();
    match &logs {
        Some(l) => {
            if let Some(e) = &l.exception {
                let _ = write!(exc, "<b class=\"exception\">{}</b>", esc(e));
            }
            if let Some(x) = &l.excerpt {
                let _ = write!(exc, "<pre class=\"excerpt\">{}</pre>", esc(x));
            }
            if l.files.is_empty() {
                let _ = write!(
                    files,
                    "{} (no log files there)",
                    esc(&l.dir.display().to_string())
                );
            }
            for f in &l.files {
                let _ = write!(
                    files,
                    "<div class=\"path\">{}</div>",
                    esc(&f.display().to_string())
                );
            }
        }
        None => files.push('-'),
    }
    if exc.is_empty() {
        exc.push('-');
    }
    let _ = writeln!(
        out,
        "<tr class=\"rank-failure\"><td>{}</td><td>{}</td><td>{}, {}, attempt {}</td><td>{}</td><td>{exc}</td><td>{files}</td></tr>",
        esc(&utc(row.ts)),
        duration(row.ts - t0),
        esc(&row.run.label()),
        esc(&who),
        row.attempt,
        esc(&row.what),
    );
}

fn allocations_table(out: &mut String, h: &History) {
    out.push_str("<section id=\"allocations\">\n<h2>Allocations</h2>\n");
    if h.allocations.is_empty() {
        out.push_str("<p class=\"empty\">No allocations.</p>\n</section>\n");
        return;
    }
    out.push_str("<table>\n<tr><th>#</th><th>job</th><th>start (UTC)</th><th>duration</th><th>nodes</th><th>outcome</th><th>highest step</th><th>restarts</th><th>stop</th><th>decision</th><th>why</th><th>source</th></tr>\n");
    for a in &h.allocations {
        let stop = match (&a.stop_step, &a.stop_trigger) {
            (Some(s), Some(t)) => format!("{s}@{t}"),
            (None, Some(t)) => t.clone(),
            _ => "-".into(),
        };
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            a.number,
            esc(a.job_id.as_deref().unwrap_or("-")),
            esc(&utc(a.start)),
            a.end.map_or_else(|| "running".to_string(), |e| duration(e - a.start)),
            esc(&a.nodes.join(", ")),
            esc(a.outcome.as_deref().unwrap_or("-")),
            a.highest_step.map_or_else(|| "-".to_string(), |s| s.to_string()),
            a.restarts,
            esc(&stop),
            esc(a.decision.map_or("-", DecisionKind::name)),
            esc(a.why.as_deref().unwrap_or("")),
            if a.from_ledger { "ledger" } else { "event logs" },
        );
    }
    out.push_str("</table>\n</section>\n");
}

fn events_table(out: &mut String, h: &History, t0: f64) {
    out.push_str("<section id=\"events\">\n<h2>Events</h2>\n");
    let moments = h.moments();
    if moments.is_empty() {
        out.push_str("<p class=\"empty\">No events.</p>\n</section>\n");
        return;
    }
    out.push_str("<table>\n<tr><th>time (UTC)</th><th>+</th><th>where</th><th>what</th><th>detail</th></tr>\n");
    for m in moments {
        let _ = writeln!(
            out,
            "<tr class=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            m.kind,
            esc(&utc(m.ts)),
            duration(m.ts - t0),
            esc(&m.node),
            m.kind,
            esc(&m.text)
        );
    }
    out.push_str("</table>\n</section>\n");
}

/// Each category's colour on the page.
fn colour(c: Category) -> &'static str {
    match c {
        Category::Goodput => "#4ca05a",
        Category::StartUp => "#4678c8",
        Category::Checkpoint => "#8c3caa",
        Category::LostProgress => "#d64541",
        Category::FailureHandling => "#f08c82",
        Category::InProcessRecovery => "#f5c24c",
        Category::StopLeadUnused => "#eb9628",
        Category::QueueWait => "#b4b4b4",
        Category::Other => "#e6e6e6",
    }
}

/// The report's Goodput section: the figures, a stacked bar per allocation (inline SVG, each
/// bar's length its share of the wall time) and the notes. The legend carries the seconds: no
/// SVG `<title>` tooltips, which a page's text (and its title, to a naive reader) would take in.
fn goodput_section(h: &History) -> String {
    let g = goodput::of_history(h);
    let mut out = String::from("<section id=\"goodput\">\n<h2>Goodput</h2>\n");
    if g.wall_s <= 0.0 {
        out.push_str("<p class=\"empty\" id=\"goodput-plot\">No wall time: no allocation with a start and an end.</p>\n</section>\n");
        return out;
    }
    out.push_str(&format!(
        "<p class=\"meta\">{:.1}% of {} made progress that was kept (docs/goodput.md; <code>vigil goodput</code> prints the numbers).</p>\n<p class=\"legend\">",
        100.0 * g.goodput_fraction,
        esc(&duration(g.wall_s))
    ));
    for c in Category::ALL {
        out.push_str(&format!(
            "<span><i style=\"background:{}\"></i>{} {}</span>",
            colour(c),
            esc(c.label()),
            esc(&goodput::s1(g.breakdown.get(c)))
        ));
    }
    out.push_str("</p>\n");
    let (width, left, row) = (900.0, 110.0, 26.0);
    // A bar for each of the latest allocations the page shows; the figures above count all.
    let bars = &g.allocations[g.allocations.len().saturating_sub(PAGE_ALLOCATIONS)..];
    if bars.len() < g.allocations.len() {
        out.push_str(&format!(
            "<p class=\"meta\">Bars for the last {} of {} allocations.</p>\n",
            bars.len(),
            g.allocations.len()
        ));
    }
    let height = row * bars.len() as f64 + 8.0;
    out.push_str(&format!(
        "<figure id=\"goodput-plot\"><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\">\n"
    ));
    let longest = bars
        .iter()
        .map(|a| a.breakdown.total())
        .fold(0.0, f64::max)
        .max(f64::MIN_POSITIVE);
    // Room on the right for each bar's label.
    let scale = (width - left - 170.0) / longest;
    for (i, a) in bars.iter().enumerate() {
        let y = 4.0 + row * i as f64;
        out.push_str(&format!(
            "<text x=\"0\" y=\"{:.1}\" font-size=\"12\">allocation {}</text>\n",
            y + 15.0,
            a.number
        ));
        let mut x = left;
        for c in Category::ALL {
            let w = a.breakdown.get(c) * scale;
            if w <= 0.0 {
                continue;
            }
            out.push_str(&format!(
                "<rect x=\"{x:.2}\" y=\"{y:.1}\" width=\"{w:.2}\" height=\"{:.1}\" fill=\"{}\"/>\n",
                row - 6.0,
                colour(c),
            ));
            x += w;
        }
        let total = a.breakdown.total();
        let pct = if total > 0.0 {
            100.0 * a.breakdown.get(Category::Goodput) / total
        } else {
            0.0
        };
        out.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\">{}, goodput {pct:.0}%</text>\n",
            x + 6.0,
            y + 15.0,
            esc(&duration(total))
        ));
    }
    out.push_str("</svg></figure>\n");
    if let Some(i) = g.steps.ideal_step_time_s {
        out.push_str(&format!(
            "<p class=\"meta\">Ideal step time {i:.3}s; step-time deviation: median {:.3}s.</p>\n",
            g.steps.median_abs_deviation_s.unwrap_or(0.0)
        ));
    }
    out.push_str("<ul>\n");
    for n in &g.notes {
        out.push_str(&format!("<li>{}</li>\n", esc(n)));
    }
    out.push_str("</ul>\n</section>\n");
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_command_line_is_quoted_only_where_a_shell_needs_it() {
        assert_eq!(super::shell_word("--lr=1e-4"), "--lr=1e-4");
        assert_eq!(super::shell_word("a b"), "'a b'");
        assert_eq!(super::shell_word(""), "''");
        assert_eq!(super::shell_word("it's"), "'it'\\''s'");
    }

    use super::*;
    use crate::history::build;
    use crate::records::{parse_jsonl, RecordFile};
    use std::path::Path;

    fn file(path: &str, text: &str) -> RecordFile {
        RecordFile {
            path: path.into(),
            records: parse_jsonl(text, Path::new(path)).0,
        }
    }

    /// The text of every SVG `<text>` element in `html`, unescaped enough for the checks.
    fn svg_texts(html: &str) -> Vec<String> {
        html.split("<text")
            .skip(1)
            .filter_map(|t| {
                let body = t.split_once('>')?.1;
                Some(
                    body.split("</text>")
                        .next()?
                        .trim()
                        .replace("&lt;", "<")
                        .replace("&gt;", ">"),
                )
            })
            .collect()
    }

    const RUN: &str = concat!(
        r#"{"event":"cycle_start","cycle":0,"nproc":2,"host":"vm","node_rank":0,"ts":1000.0}"#,
        "\n",
        r#"{"event":"steps","cycle":0,"step":3,"min_step":2,"host":"vm","node_rank":0,"ts":1010.0}"#,
        "\n",
        r#"{"event":"hang","cycle":0,"rank":1,"timeout":"heartbeat","silent_ms":5000,"host":"vm","node_rank":0,"ts":1020.0}"#,
        "\n",
        r#"{"event":"stacks","cycle":0,"rank":1,"innermost":["File \"/x/train.py\", line 7 in <lambda>"],"host":"vm","node_rank":0,"ts":1020.1}"#,
        "\n",
        r#"{"event":"cycle_ended","cycle":0,"end":"failed","reason":"rank 1 hung","host":"vm","node_rank":0,"ts":1021.0}"#,
        "\n",
        r#"{"event":"restart","from_cycle":0,"to_cycle":1,"restarts_left":0,"host":"vm","node_rank":0,"ts":1022.0}"#,
        "\n",
        r#"{"event":"cycle_start","cycle":1,"nproc":2,"host":"vm","node_rank":0,"ts":1022.5}"#,
        "\n",
        r#"{"event":"steps","cycle":1,"step":9,"min_step":9,"host":"vm","node_rank":0,"ts":1030.0}"#,
        "\n",
        r#"{"event":"straggler_report","ranks":[{"rank":0,"relative":1.0,"host":"vm"},{"rank":1,"relative":0.4,"host":"vm"}],"stragglers":[1],"threshold":0.7,"host":"vm","node_rank":0,"ts":1031.0}"#,
        "\n",
        r#"{"event":"straggler_report","ranks":[{"rank":0,"relative":1.0,"host":"vm"},{"rank":1,"relative":0.6,"host":"vm"}],"stragglers":[1],"threshold":0.7,"host":"vm","node_rank":0,"ts":1041.0}"#,
        "\n",
        r#"{"event":"cycle_ended","cycle":1,"end":"done","host":"vm","node_rank":0,"ts":1050.0}"#,
        "\n",
        r#"{"event":"result","outcome":"succeeded","exit_code":0,"host":"vm","node_rank":0,"ts":1050.0}"#,
        "\n",
    );

    #[test]
    fn the_page_has_all_three_plots_with_their_labels_and_escapes_frames() {
        let h = build("exp<1>".into(), &[file("r/events.jsonl", RUN)], &[]);
        let html = render_html(&h);
        // The three plots and the goodput bars.
        assert_eq!(html.matches("<svg").count(), 4, "{html}");
        assert!(html.contains("<section id=\"goodput\">"));
        assert!(!html.contains("<script"));
        assert!(html.contains("<title>vigil report: exp&lt;1&gt;</title>"));
        assert!(html.contains("<section id=\"failures\">"));
        let texts = svg_texts(&html);
        let has = |s: &str| texts.iter().any(|t| t.contains(s));
        assert!(
            has("hang: rank 1 hung (heartbeat timeout) in train.py:7 in <lambda>"),
            "{texts:?}"
        );
        assert!(has("restart -> attempt 1"), "{texts:?}");
        assert!(has("allocation 1: succeeded"), "{texts:?}");
        assert!(has("node 0 (vm)"), "{texts:?}");
        assert!(has("rank 1 (vm)"), "straggler legend: {texts:?}");
        assert!(has("threshold 0.70"), "{texts:?}");
        assert!(has("seconds since"), "{texts:?}");
        // The steps plot has node 0's line: both points are drawn.
        let steps = html
            .split("id=\"steps-plot\"")
            .nth(1)
            .unwrap()
            .split("</figure>")
            .next()
            .unwrap();
        assert_eq!(steps.matches("<circle").count(), 2, "{steps}");
        assert!(html.contains("<tr class=\"hang\">"));
    }

    /// The SVG text of one figure.
    fn figure_texts(html: &str, id: &str) -> Vec<String> {
        let fig = html
            .split(&format!("id=\"{id}\""))
            .nth(1)
            .unwrap()
            .split("</figure>")
            .next()
            .unwrap();
        svg_texts(fig)
    }

    #[test]
    fn a_short_jobs_steps_axis_has_whole_distinct_steps_and_a_resume_is_drawn() {
        let one = concat!(
            r#"{"event":"cycle_start","cycle":0,"host":"vm","node_rank":0,"ts":1000.0}"#,
            "\n",
            r#"{"event":"steps","cycle":0,"step":0,"min_step":0,"host":"vm","node_rank":0,"ts":1002.8}"#,
            "\n",
            r#"{"event":"result","outcome":"succeeded","exit_code":0,"host":"vm","node_rank":0,"ts":1006.0}"#,
            "\n",
        );
        let html = render_html(&build("d".into(), &[file("r/events.jsonl", one)], &[]));
        let labels: Vec<String> = figure_texts(&html, "steps-plot")
            .into_iter()
            .filter(|t| t.parse::<f64>().is_ok())
            .collect();
        let ys: Vec<&String> = labels.iter().filter(|t| !t.contains('.')).collect();
        let mut distinct = ys.clone();
        distinct.dedup();
        assert!(ys.len() >= 2 && ys == distinct, "{labels:?}");
        let html = render_html(&build(
            "d".into(),
            &[file("r/events.jsonl", RUN_RESUMED)],
            &[],
        ));
        let texts = figure_texts(&html, "steps-plot");
        assert!(
            texts
                .iter()
                .any(|t| t == "attempt 1 resumed below step 30 (first step seen 12)"),
            "{texts:?}"
        );
    }

    const RUN_RESUMED: &str = concat!(
        r#"{"event":"cycle_start","cycle":0,"host":"vm","node_rank":0,"ts":1000.0}"#,
        "\n",
        r#"{"event":"steps","cycle":0,"step":10,"host":"vm","node_rank":0,"ts":1010.0}"#,
        "\n",
        r#"{"event":"steps","cycle":0,"step":30,"host":"vm","node_rank":0,"ts":1020.0}"#,
        "\n",
        r#"{"event":"cycle_ended","cycle":0,"end":"failed","reason":"x","host":"vm","node_rank":0,"ts":1021.0}"#,
        "\n",
        r#"{"event":"cycle_start","cycle":1,"host":"vm","node_rank":0,"ts":1022.0}"#,
        "\n",
        r#"{"event":"steps","cycle":1,"step":12,"host":"vm","node_rank":0,"ts":1030.0}"#,
        "\n",
    );

    #[test]
    fn the_title_names_the_job() {
        let h = build(
            "/x/logs".into(),
            &[file(
                "/x/logs/vigil_train_20260101-000000_abcdef/events.jsonl",
                RUN,
            )],
            &[],
        );
        assert_eq!(job_name(&h), "train");
        assert!(render_html(&h).contains("<title>vigil report: train</title>"));
    }

    #[test]
    fn sections_without_data_say_so() {
        let h = build(
            "d".into(),
            &[file(
                "r/events.jsonl",
                concat!(
                    r#"{"event":"cycle_start","cycle":0,"host":"vm","node_rank":0,"ts":1000.0}"#,
                    "\n",
                    r#"{"event":"result","outcome":"succeeded","exit_code":0,"host":"vm","node_rank":0,"ts":1001.0}"#,
                    "\n",
                ),
            )],
            &[],
        );
        let html = render_html(&h);
        // The timeline and the goodput bars.
        assert_eq!(html.matches("<svg").count(), 2);
        assert!(html.contains("<p class=\"empty\" id=\"steps-plot\">No steps recorded"));
        assert!(
            html.contains("<p class=\"empty\" id=\"stragglers-plot\">No straggler scores recorded")
        );
    }

    #[test]
    fn a_ledger_without_event_logs_still_renders() {
        let h = build(
            "d".into(),
            &[],
            &[file(
                "l/ledger.jsonl",
                concat!(
                    r#"{"format":1,"allocation":1,"start":1000.0,"end":2000.0,"outcome":"stopped","stop_trigger":"SIGTERM","stop_step":5,"decision":"requeue","why":"SIGTERM <x>"}"#,
                    "\n"
                ),
            )],
        );
        let html = render_html(&h);
        assert!(html.contains("id=\"timeline-plot\">No event logs"));
        assert!(html.contains("SIGTERM &lt;x&gt;"));
        assert!(html.contains("<tr class=\"preempted\">"));
    }
}

#[cfg(test)]
mod props {
    use super::*;
    use crate::history::build;
    use crate::records::{parse_jsonl, RecordFile};
    use proptest::prelude::*;
    use serde_json::json;
    use std::path::Path;

    const KINDS: &[&str] = &[
        "cycle_start",
        "cycle_ended",
        "rank_exited",
        "rank_spawn_failed",
        "hang",
        "stacks",
        "restart",
        "stop_triggered",
        "stop_agreed",
        "stop_overdue",
        "steps",
        "straggler_report",
        "node_fault",
        "result",
        "unknown_kind",
    ];

    fn record() -> impl Strategy<Value = serde_json::Value> {
        (
            0..KINDS.len(),
            prop_oneof![
                Just(0.0),
                -1e12..1e12f64,
                1.7e9..1.8e9f64,
                Just(1e300),
                Just(-1e300)
            ],
            0u32..4,
            0u32..3,
            prop_oneof![Just(json!(null)), Just(json!("x")), (-5i64..500).prop_map(|n| json!(n)), Just(json!(0.5))],
        )
            .prop_map(|(k, ts, attempt, node, v)| {
                json!({
                    "event": KINDS[k], "ts": ts, "cycle": attempt, "node_rank": node, "host": format!("h{node}"),
                    "rank": v, "exit_code": v, "signal": v, "expected": false, "end": "failed",
                    "reason": v, "step": v, "min_step": v, "trigger": v, "timeout": v,
                    "innermost": [v.to_string()], "outcome": v,
                    "ranks": [{"rank": 1, "relative": v, "individual": v, "host": v}],
                    "stragglers": [v], "threshold": v, "from_cycle": attempt, "to_cycle": attempt + 1,
                })
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Whatever the records say, the status and the page come out, without a panic, and the
        /// page's sections are all there.
        #[test]
        fn any_records_render(files in prop::collection::vec(prop::collection::vec(record(), 0..30), 1..4)) {
            let events: Vec<RecordFile> = files
                .iter()
                .enumerate()
                .map(|(i, recs)| {
                    let text: String = recs.iter().map(|r| format!("{r}\n")).collect();
                    let path = format!("run{i}/events.jsonl");
                    RecordFile { path: path.clone().into(), records: parse_jsonl(&text, Path::new(&path)).0 }
                })
                .collect();
            let h = build("d".into(), &events, &[]);
            let _ = h.status_lines();
            let html = render_html(&h);
            for id in ["summary", "timeline", "steps", "stragglers", "allocations", "events"] {
                let section = format!("<section id=\"{id}\">");
                prop_assert!(html.contains(&section), "{}", id);
            }
            prop_assert!(html.ends_with("</html>\n"));
        }

        #[test]
        fn any_text_parses_without_panicking(text in ".{0,200}") {
            let (recs, notes) = parse_jsonl(&text, Path::new("x"));
            prop_assert!(recs.len() + notes.len() <= text.split('\n').count());
        }
    }
}
