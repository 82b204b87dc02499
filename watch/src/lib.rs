//! `vigil watch`: run from cron or a login node, outside the job. Each pass reads every watched
//! job's records (ledger and event logs, through `vigil-report`'s [`History`]) and, where
//! `scontrol` is on the PATH, Slurm's view of the job; finds the problems (`rules.rs`, pure);
//! tells each new one once on a webhook (a JSON POST with a Slack-compatible `text`), and tells
//! when it clears; keeps the open alerts in a small file between passes (`state.rs`); and pings
//! a dead-man heartbeat URL after a healthy pass. See docs/watch.md.
//!
//! Parts: `rules.rs` (the problems, pure), `gather.rs` (reading the facts), `state.rs` (the open
//! alerts), `sinks.rs` (the webhook's and the heartbeat's URLs), `send.rs` (HTTP).

mod gather;
pub mod rules;
pub mod send;
pub mod sinks;
pub mod state;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use serde_json::json;

use rules::{Limits, Problem};
use state::{Alerts, Open};
use vigil_report::{resolve_target, ReportError};

#[derive(Debug, Clone, Args)]
pub struct WatchArgs {
    /// Jobs to watch: experiment names or ids, experiment, log, run or state directories
    /// (default: every experiment under $VIGIL_HOME/experiments, its newest launch).
    #[arg(value_name = "EXPERIMENT|STATE_DIR")]
    pub targets: Vec<String>,
    /// A file holding the URL alerts are POSTed to as JSON with a Slack-compatible `text` (one
    /// line; keep it 0600). Without it, $VIGIL_WEBHOOK_URL; without either, alerts are printed
    /// only.
    #[arg(long = "webhook-file", value_name = "FILE")]
    pub webhook_file: Option<PathBuf>,
    /// The webhook URL itself: deprecated, `ps` shows it (its secret) to every user of the
    /// machine; use --webhook-file or $VIGIL_WEBHOOK_URL.
    #[arg(long, value_name = "URL")]
    pub webhook: Option<String>,
    /// A dead-man switch: GET after every pass that found no open problem.
    #[arg(long = "heartbeat-url")]
    pub heartbeat_url: Option<String>,
    /// One pass, then exit (for cron).
    #[arg(long)]
    pub once: bool,
    /// The time between passes without --once.
    #[arg(long, default_value = "60s", value_parser = duration)]
    pub interval: Duration,
    /// The open alerts between passes (default: $VIGIL_HOME/watch/alerts.json).
    #[arg(long = "state-file")]
    pub state_file: Option<PathBuf>,
    /// A restart storm: this many in-job restarts within --storm-window.
    #[arg(long = "storm-restarts", default_value_t = 3)]
    pub storm_restarts: usize,
    /// The window a restart storm is counted in, ending now.
    #[arg(long = "storm-window", default_value = "15m", value_parser = duration)]
    pub storm_window: Duration,
    /// No progress: no new highest step for this long while the job runs.
    #[arg(long, default_value = "30m", value_parser = duration)]
    pub stall: Duration,
    /// An agent stopped writing: no event log written for this long while Slurm says RUNNING.
    #[arg(long, default_value = "10m", value_parser = duration)]
    pub silent: Duration,
    /// A requeue loop: this many allocations in a row failed and were requeued.
    #[arg(long = "requeue-loop", default_value_t = 3)]
    pub requeue_loop: usize,
}

/// `90`, `90s`, `15m`, `1h 30m`.
fn duration(s: &str) -> Result<Duration, humantime::DurationError> {
    match s.parse::<u64>() {
        Ok(n) => Ok(Duration::from_secs(n)),
        Err(_) => humantime::parse_duration(s),
    }
}

impl WatchArgs {
    fn limits(&self) -> Limits {
        Limits {
            storm_restarts: self.storm_restarts,
            storm_window: self.storm_window,
            stall: self.stall,
            silent: self.silent,
            requeue_loop: self.requeue_loop,
        }
    }
}

/// What to send for one job: the problems new since the last pass and those that cleared.
#[derive(Debug, Default, PartialEq)]
pub struct Change {
    pub opened: Vec<Problem>,
    pub resolved: Vec<(String, Open)>,
}

/// The change from the open alerts to the problems found now.
pub fn change(open: &BTreeMap<String, Open>, now: &[Problem]) -> Change {
    Change {
        opened: now
            .iter()
            .filter(|p| !open.contains_key(&p.key))
            .cloned()
            .collect(),
        resolved: open
            .iter()
            .filter(|(k, _)| !now.iter().any(|p| &p.key == *k))
            .map(|(k, o)| (k.clone(), o.clone()))
            .collect(),
    }
}

/// The webhook's body: Slack's `text`, and the same in fields for other receivers.
pub fn message(label: &str, dir: &Path, key: &str, text: &str, resolved: bool) -> String {
    let status = if resolved { "resolved" } else { "open" };
    let said = if resolved {
        format!("[vigil] {label}: resolved: {text}")
    } else {
        format!("[vigil] {label}: {text}")
    };
    json!({
        "text": said,
        "vigil": {"target": label, "dir": dir, "problem": key, "status": status, "detail": text},
    })
    .to_string()
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The jobs watched: the targets given, or every experiment's newest launch.
fn jobs(
    args: &WatchArgs,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<(String, PathBuf)>, ReportError> {
    let mut names = args.targets.clone();
    if names.is_empty() {
        let home = env("VIGIL_HOME")
            .filter(|h| !h.is_empty())
            .map(PathBuf::from)
            .or_else(|| env("HOME").map(|h| Path::new(&h).join(".vigil")));
        if let Some(Ok(entries)) = home.map(|h| std::fs::read_dir(h.join("experiments"))) {
            names = entries
                .filter_map(Result::ok)
                .filter(|e| e.path().is_dir())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
        }
    }
    names
        .into_iter()
        // The alerts file is keyed by the absolute path, the same from any directory.
        .map(|t| resolve_target(&t, env).map(|d| (t, std::fs::canonicalize(&d).unwrap_or(d))))
        .collect::<Result<Vec<_>, _>>()
        .map(|mut jobs| {
            // Two names of one job are one job: its problems are told once.
            let mut seen = std::collections::BTreeSet::new();
            jobs.retain(|(_, d)| seen.insert(d.clone()));
            jobs
        })
}

/// Where one pass's messages go, and whether one of them already failed: the rest of the pass's
/// messages then wait for the next pass, so a dead webhook costs one [`send::TIMEOUT`] a pass,
/// not one per message.
struct Out<'a> {
    webhook: Option<&'a send::Url>,
    down: bool,
}

/// Sends (or, without a webhook, only prints) one message; whether it went.
fn tell(out: &mut Out, body: &str, text: &str) -> bool {
    println!("{}", vigil_report::term_safe_line(text));
    let Some(url) = out.webhook else {
        return true;
    };
    if out.down {
        return false;
    }
    match send::post_json(url, body) {
        Ok(()) => true,
        Err(e) => {
            let e = vigil_report::term_safe_line(&e.to_string());
            eprintln!("vigil watch: cannot send an alert: {e}; the rest of this pass's alerts wait for the next pass");
            out.down = true;
            false
        }
    }
}

/// How a pass went.
#[derive(Default)]
struct Pass {
    /// A job had a problem open.
    open: bool,
    /// A message could not be sent or a job not read.
    failed: bool,
}

/// One pass over every job.
fn pass(args: &WatchArgs, out: &mut Out, jobs: &[(String, PathBuf)], alerts: &mut Alerts) -> Pass {
    let path_var = std::env::var("PATH").ok();
    let mut done = Pass::default();
    for (label, dir) in jobs {
        let facts = match gather::facts(dir, path_var.as_deref()) {
            Ok((f, None)) => f,
            // The job's other rules still run; the pass is not healthy.
            Ok((f, Some(why))) => {
                eprintln!(
                    "vigil watch: {label}: {}",
                    vigil_report::term_safe_line(&why)
                );
                done.failed = true;
                f
            }
            // A job that has not written yet has nothing to watch.
            Err(ReportError::NoRecords { .. }) => continue,
            Err(e) => {
                eprintln!("vigil watch: {label}: {e}");
                done.failed = true;
                continue;
            }
        };
        let open = alerts.jobs.entry(dir.display().to_string()).or_default();
        done.failed |= !pass_job(args, out, label, dir, &facts, open);
        done.open |= !open.is_empty();
    }
    alerts.jobs.retain(|_, open| !open.is_empty());
    done
}

/// Tells one job's new and cleared problems and updates its open alerts; whether every message
/// went.
fn pass_job(
    args: &WatchArgs,
    out: &mut Out,
    label: &str,
    dir: &Path,
    facts: &rules::Facts,
    open: &mut BTreeMap<String, Open>,
) -> bool {
    let t = now();
    let c = change(open, &rules::problems(facts, &args.limits(), t));
    let mut sent = true;
    for p in c.opened {
        let body = message(label, dir, &p.key, &p.text, false);
        if tell(out, &body, &format!("{label}: {}", p.text)) {
            open.insert(
                p.key,
                Open {
                    text: p.text,
                    since: t,
                },
            );
        } else {
            sent = false;
        }
    }
    for (k, o) in c.resolved {
        let body = message(label, dir, &k, &o.text, true);
        if tell(out, &body, &format!("{label}: resolved: {}", o.text)) {
            open.remove(&k);
        } else {
            sent = false;
        }
    }
    sent
}

/// `vigil watch`: the exit status (0: the pass ran; 1: an alert or the heartbeat could not be
/// sent, a job not read (its records, or a job id that is none), or the alerts file not written,
/// on the --once pass; 2: a target names no job at the first pass, or a URL is refused). Without
/// --once it runs until it is stopped.
pub fn watch_command(args: &WatchArgs, env: &dyn Fn(&str) -> Option<String>) -> i32 {
    let Some(file) = args.state_file.clone().or_else(|| state::default_path(env)) else {
        eprintln!("vigil watch: error: $VIGIL_HOME and $HOME are unset; give --state-file FILE");
        return 2;
    };
    let sinks = match sinks::sinks(args, env, &sinks::read_webhook_file) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("vigil watch: error: {}", vigil_report::term_safe_line(&e));
            return 2;
        }
    };
    for w in &sinks.warnings {
        eprintln!("{w}");
    }
    let mut first = true;
    loop {
        // Resolved again at each pass: an experiment's name means its newest launch.
        let jobs = match jobs(args, env) {
            Ok(j) => j,
            Err(e) => {
                let e = vigil_report::term_safe_line(&e.to_string());
                eprintln!("vigil watch: error: {e}");
                if first || args.once {
                    return 2;
                }
                std::thread::sleep(args.interval);
                continue;
            }
        };
        first = false;
        let mut alerts = Alerts::load(&file);
        let mut out = Out {
            webhook: sinks.webhook.as_ref(),
            down: false,
        };
        let done = pass(args, &mut out, &jobs, &mut alerts);
        let mut ok = !done.failed;
        if let Err(e) = alerts.save(&file) {
            eprintln!("vigil watch: cannot write {}: {e}", file.display());
            ok = false;
        }
        if let Some(url) = sinks.heartbeat.as_ref().filter(|_| ok && !done.open) {
            if let Err(e) = send::get(url) {
                let e = vigil_report::term_safe_line(&e.to_string());
                eprintln!("vigil watch: heartbeat: {e}");
                ok = false;
            }
        }
        if args.once {
            // An open problem is told, not failed: only what could not be done fails.
            return if ok { 0 } else { 1 };
        }
        std::thread::sleep(args.interval);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(key: &str) -> Problem {
        Problem {
            key: key.into(),
            text: format!("{key} text"),
        }
    }

    #[test]
    fn a_problem_is_opened_once_and_resolved_once() {
        let mut open = BTreeMap::new();
        let c = change(&open, &[p("a"), p("b")]);
        assert_eq!(c.opened, [p("a"), p("b")]);
        assert!(c.resolved.is_empty());
        for q in c.opened {
            open.insert(
                q.key,
                Open {
                    text: q.text,
                    since: 0.0,
                },
            );
        }
        assert_eq!(change(&open, &[p("a"), p("b")]), Change::default());
        let c = change(&open, &[p("b")]);
        assert!(c.opened.is_empty());
        assert_eq!(c.resolved.len(), 1);
        assert_eq!(c.resolved[0].0, "a");
    }

    #[test]
    fn the_message_has_slacks_text_and_the_fields() {
        let m: serde_json::Value = serde_json::from_str(&message(
            "demo",
            Path::new("/x"),
            "requeue_loop",
            "requeue loop",
            true,
        ))
        .unwrap();
        assert_eq!(m["text"], "[vigil] demo: resolved: requeue loop");
        assert_eq!(m["vigil"]["status"], "resolved");
        assert_eq!(m["vigil"]["problem"], "requeue_loop");
    }

    #[test]
    fn a_failed_send_ends_the_passs_sending() {
        use std::io::{Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        l.set_nonblocking(true).unwrap();
        let url = send::parse_url(&format!("http://127.0.0.1:{port}/h")).unwrap();
        let server = std::thread::spawn(move || {
            let mut conns = 0;
            let until = std::time::Instant::now() + Duration::from_secs(5);
            while std::time::Instant::now() < until {
                match l.accept() {
                    Ok((mut c, _)) => {
                        conns += 1;
                        c.set_nonblocking(false).unwrap();
                        let mut buf = [0u8; 4096];
                        let _ = c.read(&mut buf);
                        let _ = c.write_all(b"HTTP/1.1 503 Busy\r\n\r\n");
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
            conns
        });
        let mut out = Out {
            webhook: Some(&url),
            down: false,
        };
        assert!(!tell(&mut out, "{}", "first"));
        assert!(out.down);
        assert!(!tell(&mut out, "{}", "second"));
        assert_eq!(
            server.join().unwrap(),
            1,
            "the second message was not tried"
        );
    }

    #[test]
    fn durations_are_seconds_or_humantime() {
        assert_eq!(duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(duration("15m"), Ok(Duration::from_secs(900)));
        assert!(duration("soon").is_err());
    }
}
