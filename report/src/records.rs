//! Finding and reading vigil's record files: every `events.jsonl` (one per node and allocation)
//! and `ledger.jsonl` (one per job, written by node rank 0) below a directory.

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// How deep below the given directory records are looked for. An experiment directory holds them
/// at `runs/vigil_*/events.jsonl` and `state/ledger.jsonl` (or `state/vigil-job-<id>/`); a log
/// directory one level less. Rank logs sit deeper but hold no records.
pub const MAX_DEPTH: usize = 5;

/// Directories visited at most, so a mistaken `vigil report /` ends quickly.
pub const MAX_DIRS: usize = 20_000;

pub const EVENTS: &str = "events.jsonl";
pub const LEDGER: &str = "ledger.jsonl";

/// One record file's parsed lines.
#[derive(Debug, Clone)]
pub struct RecordFile {
    pub path: PathBuf,
    pub records: Vec<Value>,
}

#[derive(Debug, Default)]
pub struct Found {
    pub events: Vec<RecordFile>,
    pub ledgers: Vec<RecordFile>,
    pub notes: Vec<String>,
}

/// Walks `dir` (not following symbolic links) for record files and reads them. Unreadable
/// directories and files are skipped with a note.
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
        let mut names: Vec<_> = entries.filter_map(Result::ok).collect();
        names.sort_by_key(|e| e.file_name());
        for entry in names {
            let path = entry.path();
            let Ok(ft) = entry.file_type() else { continue };
            if ft.is_dir() {
                if depth < MAX_DEPTH {
                    queue.push((path, depth + 1));
                }
                continue;
            }
            let name = entry.file_name();
            let kind = if name == EVENTS {
                &mut found.events
            } else if name == LEDGER {
                &mut found.ledgers
            } else {
                continue;
            };
            match fs::read(&path) {
                Ok(bytes) => {
                    let text = String::from_utf8_lossy(&bytes);
                    let (records, notes) = parse_jsonl(&text, &path);
                    found.notes.extend(notes);
                    kind.push(RecordFile { path, records });
                }
                Err(e) => found.notes.push(format!("skipped {}: {e}", path.display())),
            }
        }
    }
    found.events.sort_by(|a, b| a.path.cmp(&b.path));
    found.ledgers.sort_by(|a, b| a.path.cmp(&b.path));
    found
}

/// The JSON objects in `text`, one per line. A last line without its newline that does not parse
/// is a write cut short (the agent was killed) and is dropped with a note; so is any other line
/// that is not a JSON object.
pub fn parse_jsonl(text: &str, source: &Path) -> (Vec<Value>, Vec<String>) {
    let mut records = Vec::new();
    let mut notes = Vec::new();
    let complete = text.ends_with('\n');
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        match serde_json::from_str::<Value>(line) {
            Ok(v) if v.is_object() => records.push(v),
            _ if i + 1 == lines.len() && !complete => notes.push(format!(
                "{}: skipped its last line, cut short",
                source.display()
            )),
            _ => notes.push(format!(
                "{}:{}: skipped a line that is not a JSON object",
                source.display(),
                i + 1
            )),
        }
    }
    (records, notes)
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
    fn finds_records_below_an_experiment_directory_but_not_beyond_the_depth() {
        let root = std::env::temp_dir().join(format!("vigil-report-find-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let run = root.join("runs/vigil_t_1");
        let state = root.join("state");
        let deep = root.join("a/b/c/d/e/f");
        for d in [&run, &state, &deep] {
            fs::create_dir_all(d).unwrap();
        }
        fs::write(run.join(EVENTS), "{\"event\":\"result\",\"ts\":1}\n").unwrap();
        fs::write(state.join(LEDGER), "{\"format\":1}\n").unwrap();
        fs::write(deep.join(EVENTS), "{\"event\":\"result\",\"ts\":1}\n").unwrap();
        let found = find(&root);
        fs::remove_dir_all(&root).unwrap();
        assert_eq!(found.events.len(), 1);
        assert!(found.events[0]
            .path
            .ends_with("runs/vigil_t_1/events.jsonl"));
        assert_eq!(found.ledgers.len(), 1);
        assert!(found.notes.is_empty(), "{:?}", found.notes);
    }
}
