//! `vigil report` and the reading of vigil's records: every `events.jsonl` and `ledger.jsonl`
//! below a directory become a [`History`] (allocations, attempts, failures, hangs, restarts,
//! requeues, stops, steps, straggler scores), shown as `vigil status`'s lines or as one
//! self-contained HTML page with SVG plots. See docs/report.md.

mod fmt;
pub mod goodput;
pub mod history;
mod html;
mod model;
mod plot;
mod ranklogs;
pub mod records;
mod status;
pub mod target;

use std::path::{Path, PathBuf};

pub use fmt::{term_safe, term_safe_line};
pub use history::{
    Allocation, Attempt, Failure, Hang, History, Moment, NodeRun, RankScore, Restart, RunResult,
    StepPoint, Stop, StopKind, StragglerReport,
};
pub use html::render_html;

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{0}: not a directory; give an experiment directory, a run directory (vigil_*), a state directory (holding ledger.jsonl) or an experiment's name")]
    NotADirectory(PathBuf),
    #[error("{}: no vigil records in it (looked for events.jsonl and ledger.jsonl up to {} levels down{}); give an experiment directory, a run directory (vigil_*) or a state directory (holding ledger.jsonl)", .dir.display(), records::MAX_DEPTH, .skipped)]
    NoRecords { dir: PathBuf, skipped: String },
    #[error("{0}: no such directory, and no experiment of that name in {1}; give an experiment directory, a run directory (vigil_*) or a state directory")]
    NotFound(String, String),
    #[error("cannot write {}: {}; give a writable place with -o FILE", .0.display(), .1)]
    Write(PathBuf, std::io::Error),
}

impl History {
    /// Every record below `dir`: an experiment directory, a log directory, a run directory or a
    /// state directory. An error when there is none.
    pub fn load(dir: impl AsRef<Path>) -> Result<History, ReportError> {
        let dir = dir.as_ref();
        if !dir.is_dir() {
            return Err(ReportError::NotADirectory(dir.to_path_buf()));
        }
        History::from_found(dir, target::event_logs(dir))
    }

    /// Every record below each of `dirs` (a file found twice is read once), as one history: a
    /// running job's state directory with its own run directory, which may be elsewhere. The
    /// first directory names the history. An error when there is none.
    pub fn load_all(dirs: &[PathBuf]) -> Result<History, ReportError> {
        let Some(first) = dirs.first() else {
            return Err(ReportError::NotADirectory(PathBuf::new()));
        };
        let mut found = records::Found::default();
        let mut seen = std::collections::BTreeSet::new();
        for d in dirs.iter().filter(|d| d.is_dir()) {
            let f = target::event_logs(d);
            let mut keep = |p: PathBuf| {
                seen.insert(std::fs::canonicalize(&p).unwrap_or(p.clone()))
                    .then_some(p)
            };
            let events: Vec<PathBuf> = f.events.into_iter().filter_map(&mut keep).collect();
            let ledgers: Vec<PathBuf> = f.ledgers.into_iter().filter_map(&mut keep).collect();
            found.events.extend(events);
            found.ledgers.extend(ledgers);
            found.notes.extend(f.notes);
        }
        History::from_found(first, found)
    }

    fn from_found(dir: &Path, found: records::Found) -> Result<History, ReportError> {
        if found.events.is_empty() && found.ledgers.is_empty() {
            let skipped = if found.notes.is_empty() {
                String::new()
            } else {
                format!("; {}", found.notes.join("; "))
            };
            return Err(ReportError::NoRecords {
                dir: dir.to_path_buf(),
                skipped,
            });
        }
        let mut notes = found.notes;
        let mut runs = Vec::new();
        for path in &found.events {
            let mut b = history::RunBuilder::new(path.clone());
            match records::read_jsonl(path, &mut |v| b.push(v)) {
                Ok(n) => notes.extend(n),
                Err(e) => notes.push(format!("skipped {}: {e}", path.display())),
            }
            runs.push(b.finish());
        }
        let mut ledgers = Vec::new();
        for path in &found.ledgers {
            // Each record becomes an allocation as it is read: a ledger of 100,000 allocations
            // is never held as JSON.
            let mut file = history::LedgerAllocations::new(path.clone());
            match records::read_jsonl(path, &mut |v| file.push(v)) {
                Ok(n) => notes.extend(n),
                Err(e) => notes.push(format!("skipped {}: {e}", path.display())),
            }
            ledgers.push(file);
        }
        let mut h = history::build_from_runs(dir.to_path_buf(), runs, ledgers);
        notes.append(&mut h.notes);
        h.notes = notes;
        if h.runs.is_empty() && h.allocations.is_empty() {
            return Err(ReportError::NoRecords {
                dir: dir.to_path_buf(),
                skipped: std::iter::once("; the files found hold no timed records".to_string())
                    .chain(h.notes.iter().map(|n| format!("; {n}")))
                    .collect(),
            });
        }
        Ok(h)
    }
}

/// The directory `vigil report TARGET` means: TARGET itself when it is a directory, else the
/// newest launch of the experiment named TARGET (`$VIGIL_HOME/experiments/TARGET/TARGET_<time>/`)
/// or the launch named TARGET (`$VIGIL_HOME/experiments/<name>/TARGET`). `$VIGIL_HOME` defaults
/// to `~/.vigil`.
pub fn resolve_target(
    target: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<PathBuf, ReportError> {
    let p = Path::new(target);
    if p.is_dir() {
        return Ok(p.to_path_buf());
    }
    if p.exists() {
        return Err(ReportError::NotADirectory(p.to_path_buf()));
    }
    let home = env("VIGIL_HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .or_else(|| env("HOME").map(|h| Path::new(&h).join(".vigil")));
    let not_found = |where_: String| Err(ReportError::NotFound(target.to_string(), where_));
    let Some(home) = home else {
        return not_found("$VIGIL_HOME/experiments ($VIGIL_HOME and $HOME are unset)".into());
    };
    let experiments = home.join("experiments");
    // A name is one path component: anything else was meant as a path.
    if target.is_empty() || target.contains('/') || target == "." || target == ".." {
        return Err(ReportError::NotADirectory(p.to_path_buf()));
    }
    let by_name = experiments.join(target);
    if by_name.is_dir() {
        let prefix = format!("{target}_");
        let newest = std::fs::read_dir(&by_name)
            .ok()
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(&prefix))
            .max_by_key(|n| launch_order(n));
        return Ok(match newest {
            Some(n) => by_name.join(n),
            None => by_name,
        });
    }
    if let Some((name, _)) = target.rsplit_once('_') {
        let launch = experiments.join(name).join(target);
        if launch.is_dir() {
            return Ok(launch);
        }
    }
    not_found(experiments.display().to_string())
}

/// `name_20260101-000000` and the later launches of the same second, `..-2`, `..-10`, in order.
fn launch_order(id: &str) -> (String, u32) {
    let stamp = id.rsplit_once('_').map_or(id, |(_, s)| s);
    match stamp.split('-').collect::<Vec<_>>()[..] {
        [day, time, n] => (format!("{day}-{time}"), n.parse().unwrap_or(0)),
        _ => (stamp.to_string(), 1),
    }
}

/// `vigil report TARGET [-o FILE]`: writes the page (default `<dir>/report.html`) and returns
/// its path.
pub fn report_command(
    target: &str,
    out: Option<&Path>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<PathBuf, ReportError> {
    let dir = resolve_target(target, env)?;
    let history = History::load(&dir)?;
    let html = render_html(&history);
    let path = out.map_or_else(|| dir.join("report.html"), Path::to_path_buf);
    std::fs::write(&path, html).map_err(|e| ReportError::Write(path.clone(), e))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("vigil-report-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn an_experiment_name_is_its_newest_launch_and_a_launch_name_is_found_under_its_name() {
        let home = scratch("home");
        let exp = home.join("experiments/demo");
        for d in [
            "demo_20260101-000000",
            "demo_20260102-000000",
            "demo_20260102-000000-9",
            "demo_20260102-000000-10",
        ] {
            fs::create_dir_all(exp.join(d)).unwrap();
        }
        let h = home.display().to_string();
        let env = move |k: &str| (k == "VIGIL_HOME").then(|| h.clone());
        assert_eq!(
            resolve_target("demo", &env).unwrap(),
            exp.join("demo_20260102-000000-10")
        );
        assert_eq!(
            resolve_target("demo_20260101-000000", &env).unwrap(),
            exp.join("demo_20260101-000000")
        );
        let e = resolve_target("nothing", &env).unwrap_err().to_string();
        assert!(e.contains("no experiment of that name"), "{e}");
        let e = resolve_target("no/such/dir", &env).unwrap_err().to_string();
        assert!(e.starts_with("no/such/dir: not a directory"), "{e}");
        let file = home.join("events.jsonl");
        fs::write(&file, "").unwrap();
        let e = resolve_target(file.to_str().unwrap(), &env)
            .unwrap_err()
            .to_string();
        assert!(e.contains("events.jsonl: not a directory; give"), "{e}");
        fs::remove_dir_all(&home).unwrap();
    }

    #[test]
    fn several_directories_are_one_history_and_a_file_found_twice_is_read_once() {
        let d = scratch("load-all");
        let (state, run) = (d.join("state"), d.join("runs/vigil_x_1"));
        fs::create_dir_all(&state).unwrap();
        fs::create_dir_all(&run).unwrap();
        fs::write(
            run.join("events.jsonl"),
            "{\"cycle\":0,\"event\":\"cycle_start\",\"host\":\"vm\",\"node_rank\":0,\"nproc\":1,\"ts\":100.0}\n",
        )
        .unwrap();
        let h = History::load_all(&[state.clone(), run.clone(), run.clone()]).unwrap();
        assert_eq!(h.runs.len(), 1);
        assert_eq!(h.root, state);
        assert!(History::load_all(std::slice::from_ref(&state)).is_err());
        assert!(History::load_all(&[]).is_err());
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_directory_without_records_is_an_error_naming_what_was_looked_for() {
        let d = scratch("empty");
        fs::create_dir_all(d.join("sub")).unwrap();
        fs::write(d.join("sub/other.jsonl"), "{}\n").unwrap();
        let e = History::load(&d).unwrap_err().to_string();
        fs::remove_dir_all(&d).unwrap();
        assert!(e.contains("no vigil records"), "{e}");
        assert!(e.contains("events.jsonl and ledger.jsonl"), "{e}");
    }
}
