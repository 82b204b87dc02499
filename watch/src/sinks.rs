//! Where messages go: the webhook's URL, taken from a file (`--webhook-file`), the environment
//! (`VIGIL_WEBHOOK_URL`) or, deprecated, the command line (`--webhook`), and the heartbeat's;
//! both checked ([`send::parse_url`]) before the first pass, so a bad URL is a usage error and
//! never a request. See docs/watch.md, "The webhook's URL".

use std::path::Path;

use crate::send::{self, Url};
use crate::WatchArgs;

/// The environment variable that may hold the webhook's URL.
pub const WEBHOOK_ENV: &str = "VIGIL_WEBHOOK_URL";
/// The most a webhook file may hold.
const MAX_WEBHOOK_FILE: u64 = 8 * 1024;

/// The checked URLs, and what to say on stderr before the first pass.
#[derive(Debug, PartialEq, Eq)]
pub struct Sinks {
    pub webhook: Option<Url>,
    pub heartbeat: Option<Url>,
    pub warnings: Vec<String>,
}

/// The webhook's URL as given, and where it was given.
#[derive(Debug, PartialEq, Eq)]
struct Given {
    url: String,
    from: String,
}

/// The webhook's URL from the flags and the environment: `--webhook-file` or `--webhook` (one of
/// them), else `$VIGIL_WEBHOOK_URL`; `read` reads the file. A flag wins over the environment.
fn webhook_given(
    file: Option<&Path>,
    flag: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
    read: &dyn Fn(&Path) -> Result<String, String>,
) -> Result<Option<Given>, String> {
    match (file, flag) {
        (Some(_), Some(_)) => Err(
            "give the webhook's URL one way: --webhook-file FILE (or $VIGIL_WEBHOOK_URL), not --webhook as well".into(),
        ),
        (Some(f), None) => {
            let text = read(f).map_err(|e| format!("--webhook-file {}: {e}", f.display()))?;
            let url = text.trim();
            if url.is_empty() {
                return Err(format!(
                    "--webhook-file {}: the file is empty; write the webhook's URL into it (one line)",
                    f.display()
                ));
            }
            Ok(Some(Given {
                url: url.to_string(),
                from: format!("--webhook-file {}", f.display()),
            }))
        }
        (None, Some(u)) => Ok(Some(Given {
            url: u.to_string(),
            from: "--webhook".into(),
        })),
        (None, None) => Ok(env(WEBHOOK_ENV)
            .filter(|u| !u.trim().is_empty())
            .map(|u| Given {
                url: u.trim().to_string(),
                from: format!("${WEBHOOK_ENV}"),
            })),
    }
}

/// The warning `--webhook` gets: it keeps working (a cron line written for an older vigil must
/// not stop alerting at an upgrade), but says what it exposes and the fix.
pub const WEBHOOK_FLAG_WARNING: &str = "vigil watch: warning: --webhook puts the webhook's URL, which is its secret, on the command line, where `ps` shows it to every user of this machine; write it into a file only you can read and give --webhook-file FILE, or set $VIGIL_WEBHOOK_URL";

/// The webhook's and the heartbeat's URLs, checked; the error is the usage error's text.
pub fn sinks(
    args: &WatchArgs,
    env: &dyn Fn(&str) -> Option<String>,
    read: &dyn Fn(&Path) -> Result<String, String>,
) -> Result<Sinks, String> {
    let mut warnings = Vec::new();
    let given = webhook_given(
        args.webhook_file.as_deref(),
        args.webhook.as_deref(),
        env,
        read,
    )?;
    let webhook = match given {
        None => None,
        Some(g) => {
            if args.webhook.is_some() {
                warnings.push(WEBHOOK_FLAG_WARNING.to_string());
            }
            Some(
                send::parse_url(&g.url)
                    .map_err(|e| format!("the webhook's URL ({}): {e}", g.from))?,
            )
        }
    };
    let heartbeat = match &args.heartbeat_url {
        None => None,
        Some(u) => Some(send::parse_url(u).map_err(|e| format!("--heartbeat-url: {e}"))?),
    };
    Ok(Sinks {
        webhook,
        heartbeat,
        warnings,
    })
}

/// Reads a webhook file: a regular file of at most 8 KiB (vigil-bounded refuses FIFOs and
/// devices), with a note when others can read it.
pub fn read_webhook_file(path: &Path) -> Result<String, String> {
    use std::os::unix::fs::PermissionsExt;
    let text = vigil_bounded::read_string(path, MAX_WEBHOOK_FILE).map_err(|e| e.reason())?;
    if let Ok(m) = std::fs::metadata(path) {
        let mode = m.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            eprintln!(
                "vigil watch: note: {} is readable by others (mode {mode:03o}): chmod 600 it, the webhook's URL is its secret",
                path.display()
            );
        }
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        w: WatchArgs,
    }

    fn args(a: &[&str]) -> WatchArgs {
        Cli::parse_from([&["watch"], a].concat()).w
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn files(p: &Path) -> Result<String, String> {
        match p.to_str() {
            Some("/hook") => Ok("  http://h/secret\n".into()),
            Some("/empty") => Ok("\n".into()),
            Some("/crlf") => Ok("http://h/a\r\nX: 1\n".into()),
            _ => Err("no such file".into()),
        }
    }

    #[test]
    fn the_webhook_comes_from_a_file_the_environment_or_the_deprecated_flag() {
        let s = sinks(&args(&["--webhook-file", "/hook"]), &no_env, &files).unwrap();
        assert_eq!(s.webhook.unwrap().raw, "http://h/secret");
        assert!(s.warnings.is_empty());

        let env = |k: &str| (k == WEBHOOK_ENV).then(|| "https://e/x".to_string());
        let s = sinks(&args(&[]), &env, &files).unwrap();
        assert_eq!(s.webhook.unwrap().raw, "https://e/x");
        // A flag wins over the environment.
        let s = sinks(&args(&["--webhook-file", "/hook"]), &env, &files).unwrap();
        assert_eq!(s.webhook.unwrap().raw, "http://h/secret");

        let s = sinks(&args(&["--webhook", "http://h/f"]), &no_env, &files).unwrap();
        assert_eq!(s.webhook.unwrap().raw, "http://h/f");
        assert_eq!(s.warnings, [WEBHOOK_FLAG_WARNING]);

        let s = sinks(&args(&[]), &no_env, &files).unwrap();
        assert_eq!((s.webhook, s.heartbeat), (None, None));
    }

    #[test]
    fn a_bad_webhook_or_heartbeat_is_a_usage_error_naming_where_it_came_from() {
        let e = |a: &[&str]| sinks(&args(a), &no_env, &files).unwrap_err();
        assert!(e(&["--webhook-file", "/hook", "--webhook", "http://x"])
            .starts_with("give the webhook's URL one way"));
        assert_eq!(
            e(&["--webhook-file", "/nope"]),
            "--webhook-file /nope: no such file"
        );
        assert!(e(&["--webhook-file", "/empty"]).contains("the file is empty"));
        let crlf = e(&["--webhook-file", "/crlf"]);
        assert!(
            crlf.starts_with("the webhook's URL (--webhook-file /crlf): it has a carriage return (CR) at character 11"),
            "{crlf}"
        );
        assert!(e(&["--heartbeat-url", "http://h/\nx"])
            .starts_with("--heartbeat-url: it has a line feed (LF)"));
        assert_eq!(
            e(&["--webhook", "hooks.slack.com/x"]),
            "the webhook's URL (--webhook): give an http:// or https:// URL"
        );
    }
}
