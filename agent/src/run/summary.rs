//! The failure summary printed when the restart budget is spent, as useful as torchrun's
//! "Root Cause" table, and the reading of torch's `@record` error files.

use std::fmt::Write;

use crate::run::stacks::StackReport;
use crate::supervise::{ExitKind, Hang};
use crate::values::signal_name;

/// What the summary says about one failed rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedRank {
    pub time: String,
    pub host: String,
    pub rank: u32,
    pub local_rank: u32,
    /// How it ended (unknown if it never did).
    pub how: Option<ExitKind>,
    /// Why it was declared hung, if it was.
    pub hang: Option<Hang>,
    pub stacks: Option<StackReport>,
    pub pid: i32,
    /// The rank's directory of this attempt: stdout.log, stderr.log, stacks.txt, error.json.
    pub logs: Option<String>,
    pub error_file: Option<String>,
    /// From the error file: the exception message and Python traceback.
    pub error: Option<ErrorRecord>,
    /// Last lines of the rank's stderr.
    pub stderr_tail: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorRecord {
    pub message: String,
    pub traceback: Option<String>,
}

/// Reads torch's error file (`torch.distributed.elastic.multiprocessing.errors.record`):
/// `{"message": {"message": "...", "extraInfo": {"py_callstack": "...", "timestamp": "..."}}}`,
/// or `{"message": "..."}` from older writers.
pub fn parse_error_file(text: &str) -> Option<ErrorRecord> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let m = v.get("message")?;
    if let Some(s) = m.as_str() {
        return Some(ErrorRecord {
            message: s.to_string(),
            traceback: None,
        });
    }
    let message = m.get("message")?.as_str()?.to_string();
    let traceback = m
        .get("extraInfo")
        .and_then(|e| e.get("py_callstack"))
        .and_then(|t| t.as_str())
        .map(str::to_string);
    Some(ErrorRecord { message, traceback })
}

fn describe_exit(how: Option<ExitKind>) -> String {
    match how {
        Some(ExitKind::Code(c)) => c.to_string(),
        Some(ExitKind::Signal(s)) => format!("-{s} ({})", signal_name(s)),
        None => "<still running>".into(),
    }
}

fn rank_block(out: &mut String, idx: usize, f: &FailedRank) {
    let _ = writeln!(out, "[{idx}]:");
    let _ = writeln!(out, "  time      : {}", f.time);
    let _ = writeln!(out, "  host      : {}", f.host);
    let _ = writeln!(
        out,
        "  rank      : {} (local_rank: {})",
        f.rank, f.local_rank
    );
    let _ = writeln!(
        out,
        "  exitcode  : {} (pid: {})",
        describe_exit(f.how),
        f.pid
    );
    if let Some(logs) = &f.logs {
        let _ = writeln!(out, "  logs      : {logs}/ (stdout.log, stderr.log)");
    }
    let _ = writeln!(
        out,
        "  error_file: {}",
        f.error_file.as_deref().unwrap_or("<N/A>")
    );
    let indent = |out: &mut String, text: &str| {
        for l in text.lines() {
            let _ = writeln!(out, "    {l}");
        }
    };
    if let Some(h) = &f.hang {
        let _ = writeln!(
            out,
            "  hang      : {}{}",
            h.passed(),
            if h.stopped {
                "; the process was stopped (SIGSTOP or a debugger), so it is the root cause"
            } else {
                ""
            }
        );
    }
    if let Some(st) = &f.stacks {
        if let Some(p) = &st.python {
            let _ = writeln!(out, "  stacks    : {}", p.display());
        }
        if let Some(p) = &st.proc {
            let _ = writeln!(out, "  kernel    : {}", p.display());
        }
        if !st.innermost.is_empty() {
            let _ = writeln!(out, "  hung at   :");
            indent(out, &st.innermost.join("\n"));
        }
    }
    match &f.error {
        Some(e) => {
            let _ = writeln!(out, "  message   : {}", e.message);
            if let Some(tb) = &e.traceback {
                let _ = writeln!(out, "  traceback :");
                indent(out, tb);
            }
        }
        None if !f.stderr_tail.is_empty() => {
            let _ = writeln!(out, "  stderr (last {} lines):", f.stderr_tail.len());
            indent(out, &f.stderr_tail.join("\n"));
        }
        None => {
            let _ = writeln!(out, "  traceback : <no error file and no stderr output>");
        }
    }
}

/// Renders the summary: the first observed failure is the root cause, later ones are listed too.
/// `elsewhere` names the root cause when it happened on another node (no local failure).
pub fn render(
    entrypoint: &str,
    restarts: u32,
    failures: &[FailedRank],
    elsewhere: Option<&str>,
) -> String {
    let rule = "=".repeat(60);
    let thin = "-".repeat(60);
    let mut out = String::new();
    let _ = writeln!(out, "{rule}");
    let _ = writeln!(
        out,
        "{entrypoint} FAILED after {restarts} restart{}",
        if restarts == 1 { "" } else { "s" }
    );
    let _ = writeln!(out, "{thin}");
    let _ = writeln!(out, "Failures:");
    if failures.len() <= 1 {
        let _ = writeln!(out, "  <NO_OTHER_FAILURES>");
    } else {
        for (i, f) in failures.iter().enumerate().skip(1) {
            rank_block(&mut out, i, f);
        }
    }
    let _ = writeln!(out, "{thin}");
    let _ = writeln!(out, "Root Cause (first observed failure):");
    match failures.first() {
        Some(f) => rank_block(&mut out, 0, f),
        None => {
            let _ = writeln!(out, "  {}", elsewhere.unwrap_or("<unknown>"));
        }
    }
    let _ = writeln!(out, "{rule}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_torch_record_format() {
        let text = r#"{"message": {"message": "RuntimeError: boom", "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  File \"t.py\", line 3\nRuntimeError: boom", "timestamp": "1700000000"}}}"#;
        let r = parse_error_file(text).unwrap();
        assert_eq!(r.message, "RuntimeError: boom");
        assert!(r.traceback.unwrap().contains("line 3"));
        assert_eq!(
            parse_error_file(r#"{"message": "plain"}"#).unwrap().message,
            "plain"
        );
        assert!(parse_error_file("not json").is_none());
    }

    #[test]
    fn summary_names_root_cause_and_others() {
        let f = |rank, how, tail: &[&str]| FailedRank {
            time: "2026-11-21T10:00:00Z".into(),
            host: "node1".into(),
            rank,
            local_rank: rank,
            how: Some(how),
            hang: None,
            stacks: None,
            pid: 100 + rank as i32,
            logs: None,
            error_file: None,
            error: None,
            stderr_tail: tail.iter().map(|s| s.to_string()).collect(),
        };
        let text = render(
            "train.py",
            2,
            &[
                f(1, ExitKind::Code(3), &["ValueError: bad batch"]),
                f(0, ExitKind::Signal(9), &[]),
            ],
            None,
        );
        assert!(text.contains("train.py FAILED after 2 restarts"));
        let root = text.split("Root Cause").nth(1).unwrap();
        assert!(root.contains("rank      : 1 (local_rank: 1)"));
        assert!(root.contains("exitcode  : 3 (pid: 101)"));
        assert!(root.contains("ValueError: bad batch"));
        let others = text.split("Root Cause").next().unwrap();
        assert!(others.contains("-9 (SIGKILL)"));
    }

    #[test]
    fn a_stopped_hung_rank_is_said_to_be_stopped() {
        let hang = |stopped| Hang {
            timeout: crate::supervise::monitor::HangKind::Heartbeat,
            limit_ms: 2000,
            silent_ms: 2500,
            stopped,
            raised: None,
        };
        let f = |stopped| FailedRank {
            time: "2026-11-21T10:00:00Z".into(),
            host: "node1".into(),
            rank: 0,
            local_rank: 0,
            how: Some(ExitKind::Signal(15)),
            hang: Some(hang(stopped)),
            stacks: None,
            pid: 100,
            logs: None,
            error_file: None,
            error: None,
            stderr_tail: Vec::new(),
        };
        let text = render("train.py", 0, &[f(true)], None);
        assert!(text.contains(
            "hang      : no heartbeat for 2.5s, past its heartbeat timeout of 2.0s; the process was stopped (SIGSTOP"
        ));
        let text = render("train.py", 0, &[f(false)], None);
        assert!(
            text.contains("no heartbeat for 2.5s, past its heartbeat timeout of 2.0s\n"),
            "{text}"
        );
    }
}
