//! The job's ledger: one JSON line per allocation in `<state dir>/ledger.jsonl`, appended by node
//! rank 0 as the last thing it does, read back by the requeue policy and `vigil ledger`.
//!
//! Reading tolerates what a crash leaves (a last line cut short) and records of a format this
//! vigil does not know (skipped, with a note); it never fails on the file's contents.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use crate::job::state::STATE_DIR_PREFIX;
use crate::values::file_safe;

pub use vigil_events::ledger::{decode, DecisionKind, Outcome, Promotion, Record, FILE, FORMAT};

/// Appends `rec` as one line to `<dir>/ledger.jsonl` (created with the directory), and syncs it.
/// A last line left unterminated by a crash is closed first, so the new record stays whole.
pub fn append(dir: &Path, rec: &Record) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut line = serde_json::to_vec(rec)?;
    line.push(b'\n');
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .open(dir.join(FILE))?;
    let len = f.metadata()?.len();
    if len > 0 {
        let mut last = [0u8; 1];
        f.seek(SeekFrom::Start(len - 1))?;
        f.read_exact(&mut last)?;
        if last[0] != b'\n' {
            line.insert(0, b'\n');
        }
    }
    // One write of the whole line: with O_APPEND it lands at the end in one piece.
    f.write_all(&line)?;
    f.sync_all()?;
    if len == 0 {
        // A new file's name is durable only once its directory is synced; best effort.
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// Writes `rec` in place of the records of the same allocation (the same job, cluster, number and
/// `restart_count`: one written when its stop was agreed, or by a survivor of node rank 0's loss),
/// so the file keeps one line per allocation: the file is written whole beside the old one and
/// renamed over it. Lines it cannot read are kept as they are. Call it under [`lock`].
pub fn supersede(dir: &Path, rec: &Record) -> std::io::Result<()> {
    let path = dir.join(FILE);
    let lines = match vigil_bounded::lines(&path, vigil_bounded::LINE_LIMIT) {
        Ok(l) => l,
        Err(e) if e.is_not_found() => return append(dir, rec),
        Err(e) => return Err(e.into_io()),
    };
    let same = |r: &Record| {
        r.job_id == rec.job_id
            && r.cluster == rec.cluster
            && r.allocation == rec.allocation
            && r.restart_count == rec.restart_count
    };
    let mut text = String::new();
    for line in lines {
        let line = line.map_err(vigil_bounded::ReadError::into_io)?;
        if line.text.trim().is_empty() {
            continue;
        }
        let (recs, _) = decode(&line.text, &path);
        if recs.first().is_some_and(same) {
            continue;
        }
        text.push_str(&line.text);
        text.push('\n');
    }
    text.push_str(&serde_json::to_string(rec)?);
    text.push('\n');
    let tmp = dir.join(format!(".{FILE}.{}.tmp", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)?;
    let written = f
        .write_all(text.as_bytes())
        .and_then(|_| f.sync_all())
        .and_then(|_| std::fs::rename(&tmp, &path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Holds `<dir>/ledger.lock` exclusively while the value lives: agents that may record the same
/// allocation (node rank 0, or the survivors of its loss) read and append one at a time.
pub fn lock(dir: &Path) -> std::io::Result<nix::fcntl::Flock<std::fs::File>> {
    std::fs::create_dir_all(dir)?;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("ledger.lock"))?;
    nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| std::io::Error::from(e))
}

/// The records of `<dir>/ledger.jsonl` in file order, and notes on what was skipped. A missing
/// file is an empty ledger.
pub fn read(dir: &Path) -> std::io::Result<(Vec<Record>, Vec<String>)> {
    let path = dir.join(FILE);
    // Regular files only (a FIFO or /dev/zero is refused), each line bounded.
    let lines = match vigil_bounded::lines(&path, vigil_bounded::LINE_LIMIT) {
        Ok(l) => l,
        Err(e) if e.is_not_found() => return Ok((Vec::new(), Vec::new())),
        Err(e) => return Err(e.into_io()),
    };
    let mut text = String::new();
    for line in lines {
        let line = line.map_err(vigil_bounded::ReadError::into_io)?;
        text.push_str(&line.text);
        if line.complete {
            text.push('\n');
        }
    }
    Ok(decode(&text, &path))
}

/// The records written by the job `job_id` of `cluster`, and how many others were left out
/// (another job sharing a `--state-dir`). A record without a cluster (an older vigil) counts as
/// any cluster's. Of two records of one allocation (the same number and `restart_count`: a
/// survivor of node rank 0's loss recorded it, then node rank 0 did after all) the later one
/// stands, in the earlier one's place.
pub fn of_job(
    records: Vec<Record>,
    job_id: Option<&str>,
    cluster: Option<&str>,
) -> (Vec<Record>, usize) {
    let (all, others): (Vec<Record>, Vec<Record>) = records.into_iter().partition(|r| {
        r.job_id.as_deref() == job_id && (r.cluster.is_none() || r.cluster.as_deref() == cluster)
    });
    let mut mine: Vec<Record> = Vec::with_capacity(all.len());
    let mut at = std::collections::HashMap::new();
    for r in all {
        match at.get(&(r.allocation, r.restart_count)) {
            Some(&i) => mine[i] = r,
            None => {
                at.insert((r.allocation, r.restart_count), mine.len());
                mine.push(r);
            }
        }
    }
    (mine, others.len())
}

/// The index of the next allocation: one more than the highest recorded.
pub fn next_index(records: &[Record]) -> u32 {
    records.iter().map(|r| r.allocation).max().unwrap_or(0) + 1
}

const WIDTH: usize = 120;

/// The ledger as an aligned table that fits 120 columns: a long `why` wraps onto up to five
/// lines under its column and is shortened beyond them. The nodes column counts them; the nodes excluded from the next allocation lead the `why`.
pub fn render_table(records: &[Record]) -> String {
    let header = [
        "#",
        "start (UTC)",
        "duration",
        "nodes",
        "outcome",
        "steps",
        "restarts",
        "stop",
        "decision",
        "why",
    ];
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut best: Option<u64> = None;
    for r in records {
        let steps = match (best, r.highest_step) {
            (_, None) => "-".to_string(),
            (Some(b), Some(h)) => format!("{b}..{h}"),
            (None, Some(h)) => format!("..{h}"),
        };
        best = best.max(r.highest_step);
        let stop = match (r.stop_step, &r.stop_trigger) {
            (Some(s), Some(t)) => format!("{s}@{t}"),
            (Some(s), None) => s.to_string(),
            (None, Some(t)) => format!("@{t}"),
            (None, None) => "-".to_string(),
        };
        let why = if r.excluded.is_empty() {
            r.why.clone()
        } else {
            format!("excluded {}; {}", r.excluded.join(","), r.why)
        };
        rows.push(vec![
            r.allocation.to_string(),
            utc(r.start),
            duration(r.end - r.start),
            r.nodes.len().to_string(),
            r.outcome.name().to_string(),
            steps,
            r.restarts.to_string(),
            stop,
            r.decision.name().to_string(),
            one_line(&why),
        ]);
    }
    let cols = header.len();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row).take(cols - 1) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let fixed: usize = widths[..cols - 1].iter().map(|w| w + 2).sum();
    let why_room = WIDTH.saturating_sub(fixed).max(20);
    let mut out = String::new();
    let mut emit = |l: &str| {
        // Only columns wider than any real ledger has (steps near 2^64) need this cut.
        out.push_str(&shorten(l.trim_end(), WIDTH));
        out.push('\n');
    };
    for cells in std::iter::once(header.iter().map(|h| h.to_string()).collect()).chain(rows) {
        let cells: Vec<String> = cells;
        let mut l = String::new();
        for (i, cell) in cells[..cols - 1].iter().enumerate() {
            l.push_str(&format!("{cell:<w$}  ", w = widths[i]));
        }
        let why = wrap(&cells[cols - 1], why_room, WHY_LINES);
        l.push_str(why.first().map_or("", String::as_str));
        emit(&l);
        for more in why.iter().skip(1) {
            emit(&format!("{:fixed$}{more}", ""));
        }
    }
    out
}

/// Lines a `why` may take in the table; beyond them it is shortened.
const WHY_LINES: usize = 5;

/// Words of `s` in lines of at most `room` characters, at most `max` lines (the last one cut).
fn wrap(s: &str, room: usize, max: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut cur = String::new();
    for word in s.split_whitespace() {
        let len = cur.chars().count();
        if len > 0 && len + 1 + word.chars().count() > room {
            lines.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(word);
    }
    if !cur.is_empty() || lines.is_empty() {
        lines.push(cur);
    }
    if lines.len() > max {
        let rest = lines[max - 1..].join(" ");
        lines.truncate(max - 1);
        lines.push(rest);
    }
    lines.into_iter().map(|l| shorten(&l, room)).collect()
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn shorten(s: &str, room: usize) -> String {
    if s.chars().count() <= room {
        return s.to_string();
    }
    let mut t: String = s.chars().take(room.saturating_sub(3)).collect();
    t.push_str("...");
    t
}

fn utc(unix: f64) -> String {
    if !(unix.is_finite() && unix >= 0.0) {
        return "-".into();
    }
    let t = UNIX_EPOCH + Duration::from_secs(unix as u64);
    let text = humantime::format_rfc3339_seconds(t).to_string();
    // 2026-01-01T00:00:00Z -> 2026-01-01 00:00
    text.get(..16).unwrap_or(&text).replacen('T', " ", 1)
}

fn duration(secs: f64) -> String {
    if !(secs.is_finite() && secs >= 0.0) {
        return "-".into();
    }
    let s = secs.round() as u64;
    let (d, h, m, s) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    if d > 0 {
        format!("{d}d{h:02}h{m:02}m")
    } else if h > 0 {
        format!("{h}h{m:02}m")
    } else if m > 0 {
        format!("{m}m{s:02}s")
    } else {
        format!("{s}s")
    }
}

/// Why `vigil ledger` found nothing to print.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerError(pub String);

impl std::fmt::Display for LedgerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LedgerError {}

/// Which state directory `vigil ledger [TARGET]` means. TARGET is a state directory (it holds
/// `ledger.jsonl` or is named `vigil-job-<key>`), a log directory holding `vigil-job-<key>/` (else
/// the one ledger below it, found as `vigil report` finds it: a plain `vigil run --log-dir` or run
/// directory, an experiment), or a job id. A job id is looked up where vigil makes a job's state directory by default: the
/// Slurm submit directory (`$SLURM_SUBMIT_DIR`, else the current directory, where `vigil ledger`
/// is usually run from) and `$TMPDIR`, as `vigil-job-<id>` or `vigil-job-<cluster>-<id>`
/// (`$SLURM_CLUSTER_NAME` picks the cluster; without it, a single match). No TARGET:
/// `$SLURM_JOB_ID`.
pub fn resolve_dir(
    target: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
    cwd: &Path,
) -> Result<PathBuf, LedgerError> {
    let var = |k: &str| env(k).filter(|v| !v.trim().is_empty());
    let cluster = var("SLURM_CLUSTER_NAME");
    let by_id = |id: &str| dir_of_job(id, cluster.as_deref(), &var, cwd);
    let target = match target {
        Some(t) => t,
        None => {
            return match var("SLURM_JOB_ID") {
                Some(id) => by_id(&id),
                None => Err(LedgerError(
                    "which job? pass a state directory, a log directory or a job id (SLURM_JOB_ID is not set)".into(),
                )),
            }
        }
    };
    let path = Path::new(target);
    if path.is_dir() {
        return dir_in(path, var("SLURM_JOB_ID"), cluster.as_deref());
    }
    if target.contains('/') || path.exists() {
        return Err(LedgerError(format!("{target} is not a directory")));
    }
    let not_a_job = match by_id(target) {
        Ok(d) => return Ok(d),
        Err(e) => e,
    };
    // Not a job id here: an experiment's id or name, as `vigil report` takes it.
    match vigil_report::resolve_target(target, env).map(|d| vigil_report::target::ledger_dirs(&d)) {
        Ok(mut dirs) if dirs.len() == 1 => Ok(dirs.remove(0)),
        _ => Err(not_a_job),
    }
}

/// The state directory of job `id` where vigil makes one by default ([`resolve_dir`]): the
/// Slurm submit directory, the current directory and `$TMPDIR`. `var` reads a set variable.
fn dir_of_job(
    id: &str,
    cluster: Option<&str>,
    var: &dyn Fn(&str) -> Option<String>,
    cwd: &Path,
) -> Result<PathBuf, LedgerError> {
    let mut bases: Vec<PathBuf> = Vec::new();
    for b in [
        var("SLURM_SUBMIT_DIR").map(PathBuf::from),
        Some(cwd.to_path_buf()),
        Some(PathBuf::from(var("TMPDIR").unwrap_or("/tmp".into()))),
    ]
    .into_iter()
    .flatten()
    {
        if !bases.contains(&b) {
            bases.push(b);
        }
    }
    let mut found: Vec<PathBuf> = Vec::new();
    for b in &bases {
        for p in job_dirs(b) {
            if names_job(&p, id, cluster) && !found.contains(&p) {
                found.push(p);
            }
        }
    }
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(LedgerError(format!(
            "no state directory for job {id}: looked for vigil-job-{}{} in {} (a job run with --log-dir or --state-dir keeps it there: pass that directory)",
            cluster.map_or("[<cluster>-]".to_string(), |c| format!("[{}-]", file_safe(c))),
            file_safe(id),
            bases.iter().map(|b| b.display().to_string()).collect::<Vec<_>>().join(", ")
        ))),
        _ => Err(LedgerError(format!(
            "several state directories for job {id} (clusters sharing this directory, or ids reused): {}; pass one of them",
            found.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        ))),
    }
}

/// The state directory that the directory `path` is or holds ([`resolve_dir`]): among several
/// jobs', the one of `job_id` (`$SLURM_JOB_ID`).
fn dir_in(
    path: &Path,
    job_id: Option<String>,
    cluster: Option<&str>,
) -> Result<PathBuf, LedgerError> {
    let named = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with(STATE_DIR_PREFIX));
    if named || path.join(FILE).exists() {
        return Ok(path.to_path_buf());
    }
    let mut jobs = job_dirs(path);
    if let Some(id) = job_id {
        let mine: Vec<&PathBuf> = jobs.iter().filter(|p| names_job(p, &id, cluster)).collect();
        if let [one] = mine[..] {
            return Ok(one.clone());
        }
    }
    if jobs.is_empty() {
        // A plain `vigil run --log-dir` log directory, a run directory or an experiment:
        // the ledger below it, found as `vigil report` finds it.
        jobs = vigil_report::target::ledger_dirs(path);
    }
    match jobs.len() {
        1 => Ok(jobs.remove(0)),
        0 => Err(LedgerError(format!(
            "{} holds no ledger: neither {FILE} nor a vigil-job-<id>/ directory, nor a run directory with one below it",
            path.display()
        ))),
        _ => Err(LedgerError(format!(
            "{} holds the state of several jobs ({}): pass one of them",
            path.display(),
            jobs.iter()
                .filter_map(|p| p.file_name().and_then(|n| n.to_str()))
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// The job state directories (`vigil-job-*`) in `dir`, sorted; none when it cannot be listed.
fn job_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut jobs: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.is_dir()
                        && p.file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n.starts_with(STATE_DIR_PREFIX))
                })
                .collect()
        })
        .unwrap_or_default();
    jobs.sort();
    jobs
}

/// `dir` is the state directory of job `id`: `vigil-job-<id>`, or `vigil-job-<cluster>-<id>`
/// (any cluster when `cluster` is not known).
fn names_job(dir: &Path, id: &str, cluster: Option<&str>) -> bool {
    let Some(name) = dir.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    let id = file_safe(id);
    let Some(rest) = name.strip_prefix(STATE_DIR_PREFIX) else {
        return false;
    };
    if rest == id {
        return true;
    }
    match (
        rest.strip_suffix(id.as_str())
            .and_then(|c| c.strip_suffix('-')),
        cluster,
    ) {
        (Some(c), Some(want)) => c == file_safe(want),
        (Some(c), None) => !c.is_empty(),
        (None, _) => false,
    }
}

/// `vigil ledger [TARGET]`: the table, followed by notes on skipped lines.
pub fn ledger_command(
    target: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
    cwd: &Path,
) -> Result<String, LedgerError> {
    let dir = resolve_dir(target, env, cwd)?;
    let (records, notes) = read(&dir)
        .map_err(|e| LedgerError(format!("cannot read {}: {e}", dir.join(FILE).display())))?;
    let mut out = if records.is_empty() {
        format!(
            "no allocation recorded in {} yet (node rank 0 appends one when an allocation ends)\n",
            dir.join(FILE).display()
        )
    } else {
        render_table(&records)
    };
    // The job's goodput from its ledger and the event logs found with it (docs/goodput.md).
    if let Some(line) = vigil_report::goodput::ledger_line(&dir) {
        out.push_str(&line);
        out.push('\n');
    }
    for n in notes {
        out.push_str(&format!("note: {n}\n"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::state::job_state_dir;
    use proptest::prelude::*;

    fn rec(i: u32) -> Record {
        Record {
            promotions: Vec::new(),
            submit_time: None,
            slurm_start: None,
            format: FORMAT,
            allocation: i,
            job_id: Some("4242".into()),
            cluster: None,
            restart_count: i - 1,
            nodes: vec!["gpu-a01".into(), "gpu-a02".into(), "gpu-a03".into()],
            start: 1_767_225_600.0 + f64::from(i - 1) * 20_000.0,
            end: 1_767_225_600.0 + f64::from(i - 1) * 20_000.0 + 14_340.0,
            outcome: Outcome::Stopped,
            highest_step: Some(u64::from(i) * 1000),
            restarts: 0,
            stop_step: Some(u64::from(i) * 1000),
            stop_trigger: Some("time-limit".into()),
            decision: DecisionKind::Requeue,
            why: "time-limit, reached step 1000".into(),
            excluded: vec![],
            stop_lead_s: 60.0,
            exit_status: 75,
        }
    }

    struct Dir(PathBuf);
    impl Dir {
        fn new(name: &str) -> Dir {
            let d =
                std::env::temp_dir().join(format!("vigil-ledger-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            Dir(d)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_stop_recorded_early_is_superseded_in_place_and_the_file_keeps_one_line_each() {
        let d = Dir::new("supersede");
        append(&d.0, &rec(1)).unwrap();
        let mut early = rec(2);
        early.highest_step = Some(1990);
        append(&d.0, &early).unwrap();
        // A line of another job and one nobody can read stay as they are.
        let mut other = rec(2);
        other.job_id = Some("7".into());
        append(&d.0, &other).unwrap();
        let path = d.0.join(FILE);
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("not json\n");
        std::fs::write(&path, text).unwrap();

        let last = rec(2);
        supersede(&d.0, &last).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 4, "{text}");
        assert!(text.contains("not json"), "{text}");
        let (records, _) = read(&d.0).unwrap();
        let (mine, others) = of_job(records, Some("4242"), None);
        assert_eq!(others, 1);
        assert_eq!(mine, vec![rec(1), last]);
        // Nothing left beside the ledger.
        let names: Vec<_> = std::fs::read_dir(&d.0)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn superseding_into_no_ledger_appends() {
        let d = Dir::new("supersede-new");
        supersede(&d.0, &rec(1)).unwrap();
        assert_eq!(read(&d.0).unwrap().0, vec![rec(1)]);
    }

    #[test]
    fn a_record_has_exactly_the_documented_fields() {
        let v = serde_json::to_value(rec(1)).unwrap();
        let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "allocation",
                "decision",
                "end",
                "excluded",
                "exit_status",
                "format",
                "highest_step",
                "job_id",
                "nodes",
                "outcome",
                "restart_count",
                "restarts",
                "start",
                "stop_lead_s",
                "stop_step",
                "stop_trigger",
                "why"
            ]
        );
        assert_eq!(v["outcome"], "stopped");
        assert_eq!(v["decision"], "requeue");
        let np = Record {
            promotions: Vec::new(),
            submit_time: None,
            slurm_start: None,
            outcome: Outcome::NoProgress,
            ..rec(1)
        };
        assert_eq!(serde_json::to_value(np).unwrap()["outcome"], "no_progress");
    }

    #[test]
    fn appended_records_read_back_in_order() {
        let d = Dir::new("append");
        let state = d.0.join("vigil-job-4242");
        for i in 1..=3 {
            append(&state, &rec(i)).unwrap();
        }
        let (records, notes) = read(&state).unwrap();
        assert_eq!(records, vec![rec(1), rec(2), rec(3)]);
        assert!(notes.is_empty());
        assert_eq!(next_index(&records), 4);
        assert_eq!(next_index(&[]), 1);
        assert_eq!(read(&d.0.join("none")).unwrap(), (vec![], vec![]));
    }

    #[test]
    fn a_line_cut_short_by_a_crash_is_skipped_and_the_next_append_stays_whole() {
        let d = Dir::new("torn");
        append(&d.0, &rec(1)).unwrap();
        let whole = serde_json::to_string(&rec(2)).unwrap();
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(d.0.join(FILE))
            .unwrap();
        f.write_all(&whole.as_bytes()[..whole.len() / 2]).unwrap();
        drop(f);
        let (records, notes) = read(&d.0).unwrap();
        assert_eq!(records, vec![rec(1)]);
        assert_eq!(notes.len(), 1);
        assert!(notes[0].contains("line 2 is cut short"), "{notes:?}");
        append(&d.0, &rec(2)).unwrap();
        let (records, notes) = read(&d.0).unwrap();
        assert_eq!(records, vec![rec(1), rec(2)]);
        assert!(notes[0].contains("line 2 is not JSON"), "{notes:?}");
    }

    #[test]
    fn other_formats_and_garbage_are_skipped_with_a_note() {
        let good = serde_json::to_string(&rec(1)).unwrap();
        let text = format!(
            "{good}\n{{\"format\": 2, \"allocation\": 2}}\n{{\"allocation\": 3}}\n[1,2]\n{{\"format\":1}}\n\n"
        );
        let (records, notes) = decode(&text, Path::new("/s/ledger.jsonl"));
        assert_eq!(records, vec![rec(1)]);
        // Four skipped lines are one note: their count by kind, and the first.
        assert_eq!(
            notes,
            vec!["/s/ledger.jsonl: 4 lines skipped (3 of another format, 1 not a record); the first, line 2, has format 2; this vigil reads format 1"]
        );
        let (_, notes) = decode(&format!("{good}\n{{\"allocation\": 3}}\n"), Path::new("/l"));
        assert_eq!(
            notes,
            vec!["/l: line 2 has no format; this vigil reads format 1; skipped"]
        );
    }

    #[test]
    fn a_corrupt_ledger_is_one_note_with_the_count() {
        let good = serde_json::to_string(&rec(1)).unwrap();
        let mut text = format!("{good}\n");
        for _ in 0..11_548 {
            text.push_str("garbage\n");
        }
        text.push_str("{\"cut");
        let (records, notes) = decode(&text, Path::new("/s/ledger.jsonl"));
        assert_eq!(records, vec![rec(1)]);
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(
            notes[0].starts_with(
                "/s/ledger.jsonl: 11548 lines skipped (11548 not JSON); the first, line 2, is not JSON ("
            ),
            "{notes:?}"
        );
        assert!(notes[1].contains("line 11550 is cut short"), "{notes:?}");
    }

    #[test]
    fn the_table_of_three_allocations() {
        let first = rec(1);
        let second = Record {
            promotions: Vec::new(),
            submit_time: None,
            slurm_start: None,
            outcome: Outcome::Lost,
            highest_step: Some(1480),
            restarts: 1,
            stop_step: None,
            stop_trigger: None,
            why: "node lost, 1 in a row (--max-requeues 2)".into(),
            excluded: vec!["gpu-a02".into()],
            end: rec(2).start + 3725.0,
            ..rec(2)
        };
        let third = Record {
            promotions: Vec::new(),
            submit_time: None,
            slurm_start: None,
            nodes: vec!["gpu-a01".into(), "gpu-a03".into(), "gpu-a04".into()],
            outcome: Outcome::Finished,
            highest_step: Some(2500),
            stop_step: None,
            stop_trigger: None,
            decision: DecisionKind::Finished,
            why: "the ranks called mark_finished".into(),
            exit_status: 0,
            end: rec(3).start + 42.0,
            ..rec(3)
        };
        let table = render_table(&[first, second, third]);
        let lines: Vec<&str> = table.lines().collect();
        let col = lines[0].find("why").unwrap();
        // Rows start with their index; a `why` too long for its column goes on below it.
        let mut rows: Vec<(Vec<String>, String)> = Vec::new();
        for l in &lines {
            let (left, why) = l.split_at(col.min(l.len()));
            if left.trim().is_empty() {
                let last = rows.last_mut().unwrap();
                last.1 = format!("{} {}", last.1, why.trim());
            } else {
                let cells = left.split("  ").map(str::trim).filter(|c| !c.is_empty());
                rows.push((cells.map(String::from).collect(), why.trim().to_string()));
            }
        }
        let row = |i: usize| {
            let (cells, why) = &rows[i];
            let mut all = cells.clone();
            all.push(why.clone());
            all
        };
        assert_eq!(rows.len(), 4, "{table}");
        assert_eq!(
            row(0),
            [
                "#",
                "start (UTC)",
                "duration",
                "nodes",
                "outcome",
                "steps",
                "restarts",
                "stop",
                "decision",
                "why"
            ]
        );
        assert_eq!(
            row(1),
            [
                "1",
                "2026-01-01 00:00",
                "3h59m",
                "3",
                "stopped",
                "..1000",
                "0",
                "1000@time-limit",
                "requeue",
                "time-limit, reached step 1000"
            ]
        );
        assert_eq!(
            row(2),
            [
                "2",
                "2026-01-01 05:33",
                "1h02m",
                "3",
                "lost",
                "1000..1480",
                "1",
                "-",
                "requeue",
                "excluded gpu-a02; node lost, 1 in a row (--max-requeues 2)"
            ]
        );
        assert_eq!(
            row(3),
            [
                "3",
                "2026-01-01 11:06",
                "42s",
                "3",
                "finished",
                "1480..2500",
                "0",
                "-",
                "finished",
                "the ranks called mark_finished"
            ]
        );
        // Aligned: every column starts at the same place on every line.
        let at = |l: &str, word: &str| l.find(word).unwrap();
        let row_line = |n: &str| *lines.iter().find(|l| l.starts_with(n)).unwrap();
        assert_eq!(at(lines[0], "outcome"), at(row_line("1 "), "stopped"));
        assert_eq!(at(lines[0], "outcome"), at(row_line("2 "), "lost"));
        assert_eq!(
            at(lines[0], "decision"),
            at(row_line("3 "), "finished  the")
        );
        assert_eq!(col, at(row_line("2 "), "excluded"));
        assert!(lines.iter().all(|l| l.chars().count() <= 120), "{table}");
    }

    #[test]
    fn a_long_why_wraps_then_is_shortened_and_nodes_are_counted() {
        let r = Record {
            promotions: Vec::new(),
            submit_time: None,
            slurm_start: None,
            nodes: (1..=64).map(|i| format!("node{i:03}")).collect(),
            why: "no progress: ".to_string() + &"word ".repeat(80) + "\nsecond line",
            ..rec(1)
        };
        let table = render_table(&[r]);
        let row = table.lines().nth(1).unwrap();
        assert!(row.contains("  64  "), "{row}");
        let col = table.lines().next().unwrap().find("why").unwrap();
        let lines: Vec<&str> = table.lines().skip(1).collect();
        assert_eq!(lines.len(), WHY_LINES, "{table}");
        assert!(
            lines[0][col..].starts_with("no progress: word word"),
            "{table}"
        );
        assert!(lines[1][..col].trim().is_empty() && lines[1][col..].starts_with("word"));
        assert!(lines[WHY_LINES - 1].ends_with("..."), "{table}");
        assert!(lines.iter().all(|l| l.chars().count() <= 120), "{table}");
    }

    #[test]
    fn ledger_command_finds_a_state_dir_a_log_dir_or_a_job_id() {
        let d = Dir::new("cmd");
        let logs = d.0.join("logs");
        let state = job_state_dir(&logs, "4242");
        append(&state, &rec(1)).unwrap();
        let tmp = d.0.join("tmp");
        let cwd = d.0.join("submit");
        std::fs::create_dir_all(&cwd).unwrap();
        let env_of = |pairs: Vec<(&'static str, String)>| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
        };
        let none = env_of(vec![("TMPDIR", tmp.display().to_string())]);
        // A state dir, and a log dir holding one.
        for target in [&state, &logs] {
            let out = ledger_command(Some(target.to_str().unwrap()), &none, &cwd).unwrap();
            assert!(out.starts_with("#  "), "{out}");
            assert!(out.contains("1000@time-limit"), "{out}");
        }
        // An experiment's name (its newest launch) or id under $VIGIL_HOME, as report takes.
        let launch = d.0.join("home/experiments/demo/demo_20260101-000000");
        append(&launch.join("state"), &rec(1)).unwrap();
        let home = env_of(vec![("VIGIL_HOME", d.0.join("home").display().to_string())]);
        for name in ["demo", "demo_20260101-000000"] {
            assert_eq!(
                resolve_dir(Some(name), &home, &cwd).unwrap(),
                launch.join("state")
            );
        }
        // A job id: looked up in the current (submit) directory and under $TMPDIR.
        let e = ledger_command(Some("4242"), &none, &cwd)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("vigil-job-[<cluster>-]4242")
                && e.contains(&format!("{}, {}", cwd.display(), tmp.display())),
            "{e}"
        );
        append(&job_state_dir(&tmp, "4242"), &rec(1)).unwrap();
        assert!(ledger_command(Some("4242"), &none, &cwd)
            .unwrap()
            .contains("requeue"));
        // No target: SLURM_JOB_ID, or an error that says what to pass.
        let slurm = env_of(vec![
            ("TMPDIR", tmp.display().to_string()),
            ("SLURM_JOB_ID", "4242".into()),
        ]);
        assert!(ledger_command(None, &slurm, &cwd)
            .unwrap()
            .contains("requeue"));
        let e = ledger_command(None, &none, &cwd).unwrap_err().to_string();
        assert!(e.contains("SLURM_JOB_ID is not set"), "{e}");
        // A log dir with two jobs: SLURM_JOB_ID picks, else the error names them.
        append(&job_state_dir(&logs, "77"), &rec(1)).unwrap();
        let e = ledger_command(Some(logs.to_str().unwrap()), &none, &cwd)
            .unwrap_err()
            .to_string();
        assert!(e.contains("vigil-job-4242, vigil-job-77"), "{e}");
        assert!(ledger_command(Some(logs.to_str().unwrap()), &slurm, &cwd).is_ok());
        // Nothing there.
        let e =
            ledger_command(Some(d.0.join("nope/x").to_str().unwrap()), &none, &cwd).unwrap_err();
        assert!(e.to_string().contains("is not a directory"), "{e}");
        let empty = d.0.join("empty");
        std::fs::create_dir_all(&empty).unwrap();
        let e = ledger_command(Some(empty.to_str().unwrap()), &none, &cwd).unwrap_err();
        assert!(e.to_string().contains("holds no ledger"), "{e}");
        // A state dir with no allocation yet.
        let fresh = job_state_dir(&d.0, "9");
        std::fs::create_dir_all(&fresh).unwrap();
        let out = ledger_command(Some(fresh.to_str().unwrap()), &none, &cwd).unwrap();
        assert!(out.starts_with("no allocation recorded"), "{out}");
    }

    #[test]
    fn a_slurm_job_id_is_found_under_its_cluster_in_the_submit_directory() {
        let d = Dir::new("cluster");
        let submit = d.0.join("home");
        let tmp = d.0.join("tmp");
        let env_of = |pairs: Vec<(&'static str, String)>| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
        };
        let login = env_of(vec![("TMPDIR", tmp.display().to_string())]);
        let a = job_state_dir(&submit, "alpha-7");
        append(&a, &rec(1)).unwrap();
        // From the submit directory (the login node: no Slurm variables), the one match.
        assert_eq!(resolve_dir(Some("7"), &login, &submit).unwrap(), a);
        // Ids 17 and 7-x are other jobs.
        append(&job_state_dir(&submit, "alpha-17"), &rec(1)).unwrap();
        append(&job_state_dir(&submit, "x-7-1"), &rec(1)).unwrap();
        assert_eq!(resolve_dir(Some("7"), &login, &submit).unwrap(), a);
        // A second cluster sharing the home directory: name one, or let SLURM_CLUSTER_NAME pick.
        let b = job_state_dir(&submit, "beta-7");
        append(&b, &rec(1)).unwrap();
        let e = resolve_dir(Some("7"), &login, &submit)
            .unwrap_err()
            .to_string();
        assert!(e.contains("several state directories for job 7"), "{e}");
        let in_job = env_of(vec![
            ("SLURM_JOB_ID", "7".into()),
            ("SLURM_CLUSTER_NAME", "beta".into()),
            ("SLURM_SUBMIT_DIR", submit.display().to_string()),
        ]);
        assert_eq!(resolve_dir(None, &in_job, &d.0).unwrap(), b);
        assert_eq!(
            resolve_dir(Some(submit.to_str().unwrap()), &in_job, &d.0).unwrap(),
            b
        );
    }

    #[test]
    fn a_later_record_of_one_allocation_supersedes_the_earlier() {
        // A survivor recorded allocation 2 as lost; node rank 0 recorded it after all.
        let survivor = Record {
            why: "survivor".into(),
            ..rec(2)
        };
        let head = Record {
            why: "head".into(),
            ..rec(2)
        };
        let (kept, _) = of_job(
            vec![rec(1), survivor, rec(3), head.clone()],
            Some("4242"),
            None,
        );
        assert_eq!(kept, vec![rec(1), head, rec(3)]);
        assert_eq!(next_index(&kept), 4);
    }

    #[test]
    fn records_of_another_job_are_left_out() {
        let mine = Record {
            cluster: Some("alpha".into()),
            ..rec(1)
        };
        let older_vigil = rec(2);
        let other_cluster = Record {
            cluster: Some("beta".into()),
            ..rec(3)
        };
        let other_id = Record {
            job_id: Some("1".into()),
            ..rec(4)
        };
        let (kept, left) = of_job(
            vec![mine.clone(), older_vigil.clone(), other_cluster, other_id],
            Some("4242"),
            Some("alpha"),
        );
        assert_eq!((kept, left), (vec![mine, older_vigil], 2));
    }

    proptest! {
        #[test]
        fn reading_any_text_never_panics(text in "\\PC{0,300}") {
            let _ = decode(&text, Path::new("/x"));
        }

        #[test]
        fn any_records_render_within_120_columns(
            whys in proptest::collection::vec("\\PC{0,200}", 1..5),
            steps in proptest::collection::vec(proptest::option::of(0u64..u64::MAX), 1..5),
        ) {
            let records: Vec<Record> = whys.iter().zip(steps.iter().cycle()).enumerate().map(|(i, (w, s))| Record {
                promotions: Vec::new(),
                submit_time: None,
                slurm_start: None,
                why: w.clone(), highest_step: *s, ..rec(i as u32 + 1)
            }).collect();
            let table = render_table(&records);
            for l in table.lines() {
                prop_assert!(l.chars().count() <= 120, "{}", l);
            }
        }
    }
}
