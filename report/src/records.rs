//! Finding and reading vigil's record files: every `events.jsonl` (one per node and allocation)
//! and `ledger.jsonl` (one per job, written by node rank 0) below a directory, and an experiment
//! directory's `experiment.json` (written by `vigil launch`).

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;
use vigil_events::experiment::{self, Experiment};

/// How deep below the given directory records are looked for. An experiment directory holds them
/// at `runs/vigil_*/events.jsonl` and `state/ledger.jsonl` (or `state/vigil-job-<id>/`); a log
/// directory one level less. Rank logs sit deeper but hold no records.
pub const MAX_DEPTH: usize = 5;

/// Directories visited at most, so a mistaken `vigil report /` ends quickly.
pub const MAX_DIRS: usize = 20_000;

pub const EVENTS: &str = "events.jsonl";
pub const LEDGER: &str = "ledger.jsonl";

/// One record file's parsed lines (ledgers, and tests; event logs are streamed).
#[derive(Debug, Clone)]
pub struct RecordFile {
    pub path: PathBuf,
    pub records: Vec<Value>,
}

/// The record files below a directory, in path order.
#[derive(Debug, Default)]
pub struct Found {
    pub events: Vec<PathBuf>,
    pub ledgers: Vec<PathBuf>,
    pub notes: Vec<String>,
}

/// Walks `dir` (not following symbolic links) for record files. Unreadable directories are
/// skipped with a note.
pub fn find(dir: &Path) -> Found {
    let mut found = Found::default();
    let mut queue = vec![(dir.to_path_buf(), 0usize)];
    let mut visited = 0usize;
    while let Some((d, depth)) = queue.pop() {
        visited += 1;
        if visited > MAX_DIRS {
            found.notes.push(format!(
                "stopped looking after {MAX_DIRS} directories below {}; give the experiment or run directory itself",
                dir.display()
            ));
            break;
        }
        let entries = match fs::read_dir(&d) {
            Ok(e) => e,
            Err(e) => {
                found.notes.push(format!("skipped {}: {e}", d.display()));
                continue;
            }
        };
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            let Ok(ft) = entry.file_type() else { continue };
            if ft.is_dir() {
                // Another job's state, set aside by the first allocation of a job whose Slurm id
                // it reused (docs/allocations.md, "The promise").
                let aside = entry
                    .file_name()
                    .to_string_lossy()
                    .starts_with("set-aside-");
                if depth < MAX_DEPTH && !aside {
                    queue.push((path, depth + 1));
                }
            } else if ft.is_file() {
                let name = entry.file_name();
                if name == EVENTS {
                    found.events.push(path);
                } else if name == LEDGER {
                    found.ledgers.push(path);
                }
            }
        }
    }
    found.events.sort();
    found.ledgers.sort();
    found
}

/// Calls `visit` with each JSON object in the file at `path`, one line at a time, so a large
/// event log is never held whole; a line longer than [`vigil_bounded::LINE_LIMIT`] (no record of
/// vigil's is) ends the reading with an error. Returns at most one note on skipped lines: the
/// first one's (see [`parse_jsonl`]), with the count of the others, so a corrupt log of many
/// lines is one note on the page.
pub fn read_jsonl(
    path: &Path,
    visit: &mut dyn FnMut(&Value),
) -> Result<Vec<String>, vigil_bounded::ReadError> {
    let mut first = None;
    let mut skipped = 0usize;
    for line in vigil_bounded::lines(path, vigil_bounded::LINE_LIMIT)? {
        let line = line?;
        if let Some(note) = parse_line(&line.text, line.complete, line.number, path, visit) {
            skipped += 1;
            first.get_or_insert(note);
        }
    }
    // However many lines were skipped, one note: the first, and the count of the others.
    Ok(first
        .map(|n| match skipped {
            1 => n,
            2 => format!("{n} (and 1 more line skipped in this file)"),
            _ => format!("{n} (and {} more lines skipped in this file)", skipped - 1),
        })
        .into_iter()
        .collect())
}

/// One line: its object to `visit`, or the note saying why it was skipped. A line without its
/// newline is the file's last; if it does not parse, the write was cut short (the agent was
/// killed).
fn parse_line(
    line: &str,
    complete: bool,
    n: usize,
    source: &Path,
    visit: &mut dyn FnMut(&Value),
) -> Option<String> {
    let line = line.trim();
    if line.is_empty() {
        return None;
    }
    match serde_json::from_str::<Value>(line) {
        Ok(v) if v.is_object() => match bad_time(&v) {
            Some((field, t)) => Some(format!(
                "{}:{n}: skipped a record whose `{field}` ({t}) is not a time between 1970 and {} (Unix seconds)",
                source.display(),
                crate::fmt::MAX_YEAR
            )),
            None => {
                visit(&v);
                None
            }
        },
        _ if !complete => Some(format!(
            "{}: skipped its last line, cut short",
            source.display()
        )),
        _ => Some(format!(
            "{}:{n}: skipped a line that is not a JSON object",
            source.display()
        )),
    }
}

/// A time field (`ts` of an event, a numeric `start`/`end` of a ledger record) that is no time
/// vigil wrote: not a number, negative, or past [`crate::fmt::MAX_TS`]. Such a value would stretch
/// every plot's axis beyond what can be drawn.
fn bad_time(v: &Value) -> Option<(&'static str, String)> {
    ["ts", "start", "end"].into_iter().find_map(|field| {
        let x = v.get(field)?;
        // An event's `end` is a word (`attempt_ended`); a ledger's is a time or null.
        if field != "ts" && !x.is_number() {
            return None;
        }
        match x.as_f64() {
            Some(t) if (0.0..=crate::fmt::MAX_TS).contains(&t) => None,
            _ => Some((field, x.to_string())),
        }
    })
}

/// The JSON objects in `text`, one per line, as [`read_jsonl`] reads a file.
pub fn parse_jsonl(text: &str, source: &Path) -> (Vec<Value>, Vec<String>) {
    let mut records = Vec::new();
    let mut notes = Vec::new();
    let mut rest = text;
    let mut n = 0;
    while !rest.is_empty() {
        n += 1;
        let (line, complete, next) = match rest.find('\n') {
            Some(i) => (&rest[..i], true, &rest[i + 1..]),
            None => (rest, false, ""),
        };
        rest = next;
        if let Some(note) = parse_line(line, complete, n, source, &mut |v| records.push(v.clone()))
        {
            notes.push(note);
        }
    }
    (records, notes)
}

/// Why an experiment directory's `experiment.json` was not read.
#[derive(Debug, thiserror::Error)]
pub enum ExperimentError {
    /// Missing, not a regular file, or larger than [`vigil_bounded::CONFIG_LIMIT`].
    #[error("{0}")]
    Read(#[from] vigil_bounded::ReadError),
    #[error("{}: not vigil's experiment record: {error}", .path.display())]
    Parse {
        path: PathBuf,
        error: serde_json::Error,
    },
}

/// The experiment record in `dir`, its `dir` set, read as a small file: whole, and at most
/// [`vigil_bounded::CONFIG_LIMIT`] bytes.
pub fn read_experiment(dir: &Path) -> Result<Experiment, ExperimentError> {
    let path = dir.join(experiment::FILE);
    let text = vigil_bounded::read_string(&path, vigil_bounded::CONFIG_LIMIT)?;
    let mut e =
        Experiment::decode(&text).map_err(|error| ExperimentError::Parse { path, error })?;
    e.dir = dir.to_path_buf();
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_last_line_and_a_bad_middle_line_are_skipped_with_notes() {
        let text = "{\"event\":\"a\",\"ts\":1}\nnot json\n[1]\n{\"event\":\"b\",\"ts\":2}\n{\"event\":\"c\",\"t";
        let (recs, notes) = parse_jsonl(text, Path::new("x/events.jsonl"));
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[1]["event"], "b");
        assert_eq!(notes.len(), 3, "{notes:?}");
        assert!(notes[2].contains("cut short"), "{notes:?}");
        assert!(notes[0].contains("x/events.jsonl:2"), "{notes:?}");
    }

    #[test]
    fn records_with_times_out_of_range_are_skipped_with_a_note() {
        let text = "{\"event\":\"a\",\"ts\":1e308}\n{\"event\":\"b\",\"ts\":-1e308}\n{\"start\":5,\"end\":null}\n{\"event\":\"c\",\"ts\":\"x\"}\n{\"event\":\"d\",\"ts\":7}\n";
        let (recs, notes) = parse_jsonl(text, Path::new("e.jsonl"));
        assert_eq!(recs.len(), 2, "{notes:?}");
        assert_eq!(recs[1]["event"], "d");
        assert_eq!(notes.len(), 3, "{notes:?}");
        assert!(
            notes[0].contains("`ts` (1e+308) is not a time"),
            "{notes:?}"
        );
    }

    #[test]
    fn a_file_is_read_as_its_text_is_parsed() {
        let path =
            std::env::temp_dir().join(format!("vigil-report-read-{}.jsonl", std::process::id()));
        let text = "{\"a\":1}\n\nnot json\n{\"b\":2}\n{\"c\":";
        fs::write(&path, text).unwrap();
        let mut seen = Vec::new();
        let notes = read_jsonl(&path, &mut |v| seen.push(v.clone())).unwrap();
        fs::remove_file(&path).unwrap();
        let (recs, expected) = parse_jsonl(text, &path);
        assert_eq!(seen, recs);
        assert_eq!(expected.len(), 2, "{expected:?}");
        // Read from a file, the skipped lines are one note: the first, and the count of the rest.
        assert_eq!(
            notes,
            vec![format!(
                "{} (and 1 more line skipped in this file)",
                expected[0]
            )]
        );
        assert!(
            expected[0].ends_with(":3: skipped a line that is not a JSON object"),
            "{notes:?}"
        );
    }

    #[test]
    fn finds_records_below_an_experiment_directory_but_not_beyond_the_depth() {
        let root = std::env::temp_dir().join(format!("vigil-report-find-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let run = root.join("runs/vigil_t_1");
        let state = root.join("state");
        let deep = root.join("a/b/c/d/e/f");
        let aside = state.join("set-aside-2026-01-01T000000Z");
        for d in [&run, &state, &deep, &aside] {
            fs::create_dir_all(d).unwrap();
        }
        fs::write(run.join(EVENTS), "{\"event\":\"result\",\"ts\":1}\n").unwrap();
        fs::write(state.join(LEDGER), "{\"format\":1}\n").unwrap();
        fs::write(aside.join(LEDGER), "{\"format\":1}\n").unwrap();
        fs::write(deep.join(EVENTS), "{\"event\":\"result\",\"ts\":1}\n").unwrap();
        let found = find(&root);
        let mut seen = Vec::new();
        let notes = read_jsonl(&found.events[0], &mut |v| seen.push(v.clone())).unwrap();
        fs::remove_dir_all(&root).unwrap();
        assert_eq!(found.events.len(), 1);
        assert!(found.events[0].ends_with("runs/vigil_t_1/events.jsonl"));
        assert_eq!((seen.len(), notes.len()), (1, 0));
        assert_eq!(found.ledgers.len(), 1, "not another job's, set aside");
        assert!(found.notes.is_empty(), "{:?}", found.notes);
    }

    #[test]
    fn an_experiment_record_is_read_with_its_directory() {
        let dir = std::env::temp_dir().join(format!("vigil-report-exp-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let e = Experiment {
            id: "t_1".into(),
            name: "t".into(),
            job_id: Some("7".into()),
            dir: dir.clone(),
            ..Experiment::default()
        };
        fs::write(dir.join(experiment::FILE), e.encode()).unwrap();
        let back = read_experiment(&dir);
        fs::write(dir.join(experiment::FILE), "{\"name\":").unwrap();
        let bad = read_experiment(&dir).unwrap_err().to_string();
        fs::remove_dir_all(&dir).unwrap();
        assert_eq!(back.unwrap(), e);
        assert!(
            bad.contains("experiment.json: not vigil's experiment record: "),
            "{bad}"
        );
    }

    #[test]
    fn an_experiment_record_over_the_bound_is_refused() {
        let dir = std::env::temp_dir().join(format!("vigil-report-exp-big-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join(experiment::FILE);
        let padding = " ".repeat(vigil_bounded::CONFIG_LIMIT as usize);
        fs::write(&path, format!("{{\"job_id\":\"7\"}}{padding}")).unwrap();
        let e = read_experiment(&dir).unwrap_err();
        fs::remove_dir_all(&dir).unwrap();
        assert!(matches!(e, ExperimentError::Read(_)), "{e:?}");
        assert_eq!(
            e.to_string(),
            format!(
                "{} is larger than {} bytes",
                path.display(),
                vigil_bounded::CONFIG_LIMIT
            )
        );
    }
}
