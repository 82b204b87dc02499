//! What a failed or hung rank left in its attempt directory (docs/usage.md, "The run
//! directory"): which files there are worth opening, and the end of its stderr.log (the last
//! Python traceback and the exception that ends it), for the report's failures table.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::model::RankLogs;

/// How much of the end of a stderr.log is read.
const TAIL_BYTES: u64 = 64 * 1024;
/// Lines of a traceback (or of the log's end) kept.
const EXCERPT_LINES: usize = 24;

/// The files in `dir` a person reads after a failure, those not empty, and the end of its
/// stderr.log; `extra` (a hang's stacks files) are listed too.
pub fn read(dir: &Path, extra: &[PathBuf]) -> RankLogs {
    // Absolute, so the paths can be copied from the page wherever it is read.
    let dir = &std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    const NAMES: [&str; 5] = [
        "stderr.log",
        "stdout.log",
        "error.json",
        "stacks.txt",
        "proc_stacks.txt",
    ];
    // A `stacks` record names the same files, relative to where the agent ran: listed once.
    let elsewhere = extra.iter().filter(|p| {
        !p.file_name()
            .is_some_and(|n| NAMES.iter().any(|k| n == std::ffi::OsStr::new(k)))
    });
    let files: Vec<PathBuf> = NAMES
        .iter()
        .map(|f| dir.join(f))
        .chain(elsewhere.cloned())
        .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.len() > 0))
        .collect();
    let tail = tail(&dir.join("stderr.log")).unwrap_or_default();
    let (excerpt, mut exception) = last_traceback(&tail);
    if exception.is_none() {
        exception = error_json_message(&dir.join("error.json"));
    }
    RankLogs {
        dir: dir.to_path_buf(),
        files,
        excerpt,
        exception,
    }
}

/// The last [`TAIL_BYTES`] of a regular file, as text.
fn tail(path: &Path) -> Option<String> {
    let mut f = vigil_bounded::open_regular(path).ok()?;
    let len = f.metadata().ok()?.len();
    f.seek(SeekFrom::Start(len.saturating_sub(TAIL_BYTES)))
        .ok()?;
    let mut buf = Vec::new();
    f.take(TAIL_BYTES).read_to_end(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// The last traceback in `text` and the exception line that ends it; without a traceback, the
/// last lines and no exception.
pub fn last_traceback(text: &str) -> (Option<String>, Option<String>) {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.iter().rposition(|l| {
        l.trim_start()
            .starts_with("Traceback (most recent call last)")
    });
    let Some(start) = start else {
        let kept: Vec<&str> = lines
            .iter()
            .rev()
            .filter(|l| !l.trim().is_empty())
            .take(EXCERPT_LINES / 3)
            .copied()
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        return ((!kept.is_empty()).then(|| kept.join("\n")), None);
    };
    let tb = &lines[start..];
    // The traceback ends at its exception line: the first line after the frames that is not
    // indented (a frame is `  File ...` and its source line).
    let end = tb
        .iter()
        .enumerate()
        .skip(1)
        .find(|(_, l)| !l.starts_with(' ') && !l.trim().is_empty())
        .map_or(tb.len(), |(i, _)| i + 1);
    let tb = &tb[..end];
    let exception = tb
        .last()
        .filter(|l| !l.starts_with(' ') && !l.starts_with("Traceback"))
        .map(|l| l.trim().to_string());
    let excerpt = if tb.len() > EXCERPT_LINES {
        let mut v = vec![
            tb[0].to_string(),
            format!("  ... {} lines", tb.len() - EXCERPT_LINES + 1),
        ];
        v.extend(
            tb[tb.len() - EXCERPT_LINES + 2..]
                .iter()
                .map(|l| l.to_string()),
        );
        v.join("\n")
    } else {
        tb.join("\n")
    };
    (Some(excerpt), exception)
}

/// torch's `@record` error file: `{"message": {"message": "ValueError: ..."}}`, its first line.
fn error_json_message(path: &Path) -> Option<String> {
    let text = vigil_bounded::read_string(path, vigil_bounded::CONFIG_LIMIT).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let m = &v["message"];
    let msg = m["message"].as_str().or_else(|| m.as_str())?;
    msg.lines().next().map(|l| l.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_traceback_and_its_exception_are_found() {
        let text = "warming up\nTraceback (most recent call last):\n  File \"a.py\", line 1, in <module>\n    f()\nKeyError: 1\nmore\nTraceback (most recent call last):\n  File \"t.py\", line 9, in <module>\n    step(x)\n  File \"t.py\", line 4, in step\n    raise ValueError(\"bad batch 7\")\nValueError: bad batch 7\n[rank1]: exiting\n";
        let (excerpt, exc) = last_traceback(text);
        assert_eq!(exc.as_deref(), Some("ValueError: bad batch 7"));
        let e = excerpt.unwrap();
        assert!(
            e.starts_with("Traceback") && e.ends_with("ValueError: bad batch 7"),
            "{e}"
        );
        assert!(!e.contains("KeyError"));
        let (excerpt, exc) = last_traceback("a\n\nb\nc\n");
        assert_eq!((excerpt.as_deref(), exc), (Some("a\nb\nc"), None));
        assert_eq!(last_traceback(""), (None, None));
    }
}
