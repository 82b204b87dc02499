//! Sending: a JSON POST to the webhook and the heartbeat's GET. `http://` is spoken here over a
//! plain TCP connection (HTTP/1.1, `Connection: close`); `https://` is handed to `curl`, which
//! every login node has, so that vigil carries no TLS stack (the Rust HTTP clients with TLS pull
//! in a crypto library and, through `url`, Unicode tables).
//!
//! The rules (docs/watch.md, "Sending"): a URL is checked before anything is sent ([`parse_url`]:
//! no control character, space or non-ASCII character, so nothing can be smuggled into the
//! request's head); one request, from resolving the host to the last byte read, ends within
//! [`TIMEOUT`] however the server answers; only a 2xx answer is delivered, a redirect is a failure
//! naming where it leads; at most [`MAX_HEAD`] bytes of an answer are read, and an error quotes at
//! most [`EXCERPT`] of them, escaped. Errors show a URL as its scheme and host only
//! ([`Url::shown`]): a webhook's path is its secret.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use vigil_slurm::cmd::{run_command, Cmd};

/// How long one request may take in all: resolving, connecting, sending and reading the answer.
pub const TIMEOUT: Duration = Duration::from_secs(15);
/// The most of an answer read: its status line and headers.
pub const MAX_HEAD: usize = 16 * 1024;
/// The most bytes of a server's answer quoted in an error.
pub const EXCERPT: usize = 120;

/// A checked http:// or https:// URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    pub https: bool,
    pub host: String,
    pub port: u16,
    /// The path and query, as sent in the request line (`/` when none).
    pub path: String,
    /// The URL as given (handed to curl for https).
    pub raw: String,
}

impl Url {
    /// The URL as errors show it: scheme, host and port, the path left out (a webhook's path is
    /// its secret).
    pub fn shown(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        let default = if self.https { 443 } else { 80 };
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        let port = if self.port == default {
            String::new()
        } else {
            format!(":{}", self.port)
        };
        let path = if self.path == "/" { "/" } else { "/..." };
        format!("{scheme}://{host}{port}{path}")
    }
}

/// Why a URL is refused. The text names the problem and the fix, not the URL (its secret).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("give an http:// or https:// URL")]
    Scheme,
    #[error("it has {what} at character {at}; a URL holds none (it would be sent raw into the request): percent-encode it (%0D for CR, %0A for LF, %20 for a space)")]
    Char { what: String, at: usize },
    #[error("it names no host")]
    NoHost,
    #[error("its port is not a number from 1 to 65535")]
    Port,
    #[error("it has a user name before the host (user@host), which vigil does not send; webhook services take their credential in the path or query")]
    UserInfo,
}

/// Checks `url` and splits it into host, port and path.
pub fn parse_url(url: &str) -> Result<Url, UrlError> {
    if let Some((at, c)) = url
        .chars()
        .enumerate()
        .find(|(_, c)| c.is_control() || c.is_whitespace() || !c.is_ascii())
    {
        let what = match c {
            '\r' => "a carriage return (CR)".to_string(),
            '\n' => "a line feed (LF)".to_string(),
            ' ' => "a space".to_string(),
            c if c.is_control() => format!("a control character (U+{:04X})", c as u32),
            c if c.is_whitespace() => format!("a white space character (U+{:04X})", c as u32),
            c => format!("a non-ASCII character (U+{:04X})", c as u32),
        };
        return Err(UrlError::Char { what, at: at + 1 });
    }
    let (https, rest) = if let Some(r) = url.strip_prefix("https://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("http://") {
        (false, r)
    } else {
        return Err(UrlError::Scheme);
    };
    // The fragment is the client's own, never sent.
    let rest = rest.split('#').next().unwrap_or_default();
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    if authority.contains('@') {
        return Err(UrlError::UserInfo);
    }
    let path = match path {
        "" => "/".to_string(),
        p if p.starts_with('?') => format!("/{p}"),
        p => p.to_string(),
    };
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, after) = v6.split_once(']').ok_or(UrlError::NoHost)?;
        (h, after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err(UrlError::NoHost);
    }
    let port = match port {
        None => {
            if https {
                443
            } else {
                80
            }
        }
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 && p.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => return Err(UrlError::Port),
        },
    };
    Ok(Url {
        https,
        host: host.to_string(),
        port,
        path,
        raw: url.to_string(),
    })
}

/// Why a message was not delivered.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("{url}: {why}")]
    Io { url: String, why: String },
    #[error("{url}: no whole answer within {} s (read so far: {got}); the server is too slow or not an HTTP server", TIMEOUT.as_secs())]
    Timeout { url: String, got: String },
    #[error("{url}: answered {status}")]
    Status { url: String, status: String },
    #[error("{url}: answered {status}, a redirect{}; vigil follows none (an alert sent on would not be known to arrive): give the URL it leads to", .location.as_ref().map(|l| format!(" to {l}")).unwrap_or_default())]
    Redirect {
        url: String,
        status: String,
        location: Option<String>,
    },
    #[error("{url}: {why}")]
    Curl { url: String, why: String },
}

/// `bytes` quoted for an error line: at most `max` of them, `"` `\` and every byte that is not
/// printable ASCII escaped, and how many there were in all when that is more.
pub fn excerpt(bytes: &[u8], max: usize) -> String {
    let mut q = String::from("\"");
    for &b in bytes.iter().take(max) {
        match b {
            b'"' => q.push_str("\\\""),
            b'\\' => q.push_str("\\\\"),
            b'\r' => q.push_str("\\r"),
            b'\n' => q.push_str("\\n"),
            b'\t' => q.push_str("\\t"),
            0x20..=0x7e => q.push(b as char),
            b => q.push_str(&format!("\\x{b:02x}")),
        }
    }
    q.push('"');
    if bytes.len() > max {
        q.push_str(&format!("... ({} bytes)", bytes.len()));
    }
    q
}

/// What an answer's head says.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Delivered,
    /// An answer other than 2xx or 3xx, or one that is not HTTP: its status line, quoted.
    Failed(String),
    Redirect {
        status: String,
        location: Option<String>,
    },
    /// No whole status line yet.
    Incomplete,
}

/// Judges the head read so far (`ended`: no more will come). A 3xx waits for the end of the
/// headers (its `Location`), unless `ended`.
pub fn judge(head: &[u8], ended: bool) -> Verdict {
    let Some(eol) = head.iter().position(|&b| b == b'\n') else {
        return Verdict::Incomplete;
    };
    let line = head[..eol].strip_suffix(b"\r").unwrap_or(&head[..eol]);
    let mut words = line.split(|&b| b == b' ');
    let version = words.next().unwrap_or_default();
    let code = words.next().unwrap_or_default();
    let is_code = code.len() == 3 && code.iter().all(u8::is_ascii_digit);
    if !version.starts_with(b"HTTP/1.") || !is_code {
        return Verdict::Failed(excerpt(line, EXCERPT));
    }
    match code[0] {
        b'2' => Verdict::Delivered,
        b'3' => {
            let rest = &head[eol + 1..];
            let end = header_end(rest);
            if end.is_none() && !ended {
                return Verdict::Incomplete;
            }
            let headers = &rest[..end.unwrap_or(rest.len())];
            let location = headers
                .split(|&b| b == b'\n')
                .filter_map(|h| {
                    let h = h.strip_suffix(b"\r").unwrap_or(h);
                    let colon = h.iter().position(|&b| b == b':')?;
                    h[..colon]
                        .eq_ignore_ascii_case(b"location")
                        .then(|| excerpt(h[colon + 1..].trim_ascii(), EXCERPT))
                })
                .next();
            Verdict::Redirect {
                status: excerpt(line, EXCERPT),
                location,
            }
        }
        _ => Verdict::Failed(excerpt(line, EXCERPT)),
    }
}

/// Where a head's empty line starts (`\n\n` or `\n\r\n` after the last header), if it came.
fn header_end(b: &[u8]) -> Option<usize> {
    if b.starts_with(b"\r\n") || b.starts_with(b"\n") {
        return Some(0);
    }
    (0..b.len()).find(|&i| b[i..].starts_with(b"\n\n") || b[i..].starts_with(b"\n\r\n"))
}

/// POSTs `body` (JSON) to `url`.
pub fn post_json(url: &Url, body: &str) -> Result<(), SendError> {
    request(url, "POST", Some(body))
}

/// GETs `url` (the heartbeat).
pub fn get(url: &Url) -> Result<(), SendError> {
    request(url, "GET", None)
}

fn request(url: &Url, method: &str, body: Option<&str>) -> Result<(), SendError> {
    let deadline = Instant::now() + TIMEOUT;
    if url.https {
        return curl(url, method, body, deadline);
    }
    let shown = url.shown();
    let io = |e: std::io::Error| SendError::Io {
        url: shown.clone(),
        why: e.to_string(),
    };
    let mut s = connect(url, deadline).map_err(io)?;
    let body = body.unwrap_or_default();
    let head = format!(
        "{method} {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: vigil-watch\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        url.path,
        host_header(url),
        body.len()
    );
    let out = [head.as_bytes(), body.as_bytes()].concat();
    let mut sent = 0;
    while sent < out.len() {
        s.set_write_timeout(Some(left(deadline).map_err(io)?))
            .map_err(io)?;
        match s.write(&out[sent..]) {
            Ok(0) => return Err(io(std::io::ErrorKind::WriteZero.into())),
            Ok(n) => sent += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io(e)),
        }
    }
    let (answer, ended) = read_head(&mut s, deadline).map_err(io)?;
    match judge(&answer, true) {
        Verdict::Delivered => Ok(()),
        Verdict::Failed(status) => Err(SendError::Status { url: shown, status }),
        Verdict::Redirect { status, location } => Err(SendError::Redirect {
            url: shown,
            status,
            location,
        }),
        Verdict::Incomplete if ended == Ended::Deadline => Err(SendError::Timeout {
            url: shown,
            got: excerpt(&answer, EXCERPT),
        }),
        Verdict::Incomplete if answer.is_empty() => Err(SendError::Status {
            url: shown,
            status: "nothing".into(),
        }),
        Verdict::Incomplete => Err(SendError::Status {
            url: shown,
            status: format!("no HTTP status line: {}", excerpt(&answer, EXCERPT)),
        }),
    }
}

fn host_header(url: &Url) -> String {
    if url.host.contains(':') {
        format!("[{}]:{}", url.host, url.port)
    } else {
        format!("{}:{}", url.host, url.port)
    }
}

/// The time left before `deadline`; an error once it has passed.
fn left(deadline: Instant) -> std::io::Result<Duration> {
    let d = deadline.saturating_duration_since(Instant::now());
    if d < Duration::from_millis(1) {
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer within {} s", TIMEOUT.as_secs()),
        ))
    } else {
        Ok(d)
    }
}

/// Resolves the host (on a thread, so that a hanging resolver is cut at the deadline too) and
/// connects to its first address that answers.
fn connect(url: &Url, deadline: Instant) -> std::io::Result<TcpStream> {
    let (tx, rx) = std::sync::mpsc::channel();
    let (host, port) = (url.host.clone(), url.port);
    std::thread::spawn(move || {
        let addrs = (host.as_str(), port)
            .to_socket_addrs()
            .map(|a| a.collect::<Vec<SocketAddr>>());
        let _ = tx.send(addrs);
    });
    let addrs = rx.recv_timeout(left(deadline)?).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("the host was not resolved within {} s", TIMEOUT.as_secs()),
        )
    })??;
    let mut last = std::io::Error::other("the host has no address");
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, left(deadline)?) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// How reading an answer's head ended.
#[derive(Debug, PartialEq, Eq)]
enum Ended {
    /// The status is known (and, for a redirect, its headers are read).
    Judged,
    Closed,
    Full,
    Deadline,
}

/// Reads an answer's head: until it can be judged, the server closes, [`MAX_HEAD`] bytes or the
/// deadline. The head is judged again only when a line ends in what was just read, and it is at
/// most [`MAX_HEAD`] bytes, so an endless answer costs little before it is cut.
fn read_head(s: &mut TcpStream, deadline: Instant) -> std::io::Result<(Vec<u8>, Ended)> {
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let Ok(wait) = left(deadline) else {
            return Ok((answer, Ended::Deadline));
        };
        s.set_read_timeout(Some(wait))?;
        let room = (MAX_HEAD - answer.len()).min(buf.len());
        let n = match s.read(&mut buf[..room]) {
            Ok(0) => return Ok((answer, Ended::Closed)),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Ok((answer, Ended::Deadline))
            }
            Err(e) => return Err(e),
        };
        answer.extend_from_slice(&buf[..n]);
        if buf[..n].contains(&b'\n') && judge(&answer, false) != Verdict::Incomplete {
            return Ok((answer, Ended::Judged));
        }
        if answer.len() >= MAX_HEAD {
            return Ok((answer, Ended::Full));
        }
    }
}

fn curl(url: &Url, method: &str, body: Option<&str>, deadline: Instant) -> Result<(), SendError> {
    // The URL (a webhook's is its secret) and the body go in a config file only this user can
    // read, not on curl's command line, where `ps` shows them to everyone on the node.
    let shown = url.shown();
    let fail = |why: String| SendError::Curl {
        url: shown.clone(),
        why: excerpt(why.as_bytes(), 2 * EXCERPT),
    };
    let mut config = tempfile::NamedTempFile::new().map_err(|e| fail(e.to_string()))?;
    config
        .write_all(curl_config(&url.raw, method, body).as_bytes())
        .and_then(|()| config.flush())
        .map_err(|e| fail(e.to_string()))?;
    let wait = left(deadline).map_err(|e| fail(e.to_string()))?;
    // curl's -m takes fractions of a second.
    let secs = format!("{:.3}", wait.as_secs_f64());
    let path = config.path().to_string_lossy().into_owned();
    // No -f: curl fails only from 400 and takes a 3xx as done; vigil judges the status itself.
    let args = [
        "-sS",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code} %{redirect_url}",
        "--max-redirs",
        "0",
        "-m",
        &secs,
        "-K",
        &path,
    ];
    let out = run_command(&Cmd::new("curl", &args), wait + Duration::from_secs(2))
        .map_err(|e| fail(e.to_string()))?;
    match curl_verdict(&out) {
        Verdict::Delivered => Ok(()),
        Verdict::Redirect { status, location } => Err(SendError::Redirect {
            url: shown,
            status,
            location,
        }),
        Verdict::Failed(status) => Err(SendError::Status { url: shown, status }),
        Verdict::Incomplete => Err(fail(format!(
            "curl said {}",
            excerpt(out.as_bytes(), EXCERPT)
        ))),
    }
}

/// What curl's `-w "%{http_code} %{redirect_url}"` says.
fn curl_verdict(out: &str) -> Verdict {
    let (code, location) = out.trim().split_once(' ').unwrap_or((out.trim(), ""));
    if code.len() != 3 || !code.bytes().all(|b| b.is_ascii_digit()) || code == "000" {
        return Verdict::Incomplete;
    }
    match code.as_bytes()[0] {
        b'2' => Verdict::Delivered,
        b'3' => Verdict::Redirect {
            status: format!("HTTP {code}"),
            location: (!location.is_empty()).then(|| excerpt(location.as_bytes(), EXCERPT)),
        },
        _ => Verdict::Failed(format!("HTTP {code}")),
    }
}

/// curl's config-file lines for one request (`-K`): each value a quoted string, escaped as curl
/// reads it.
fn curl_config(url: &str, method: &str, body: Option<&str>) -> String {
    let quote = |v: &str| {
        let mut q = String::from("\"");
        for c in v.chars() {
            match c {
                '\\' => q.push_str("\\\\"),
                '"' => q.push_str("\\\""),
                '\n' => q.push_str("\\n"),
                '\r' => q.push_str("\\r"),
                '\t' => q.push_str("\\t"),
                c => q.push(c),
            }
        }
        q.push('"');
        q
    };
    let mut out = format!("url = {}\nrequest = {}\n", quote(url), quote(method));
    if let Some(b) = body {
        out.push_str("header = \"Content-Type: application/json\"\n");
        out.push_str(&format!("data-binary = {}\n", quote(b)));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn curl_sends_the_body_from_its_private_config() {
        if std::process::Command::new("curl")
            .arg("--version")
            .output()
            .is_err()
        {
            eprintln!("no curl here: skipped");
            return;
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            conn.set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !String::from_utf8_lossy(&got).contains("}") {
                let n = conn.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                .unwrap();
            String::from_utf8_lossy(&got).into_owned()
        });
        let body = r#"{"text":"a \"quoted\" \\ word"}"#;
        let url = parse_url(&format!("http://127.0.0.1:{port}/hook")).unwrap();
        curl(&url, "POST", Some(body), Instant::now() + TIMEOUT).unwrap();
        let got = server.join().unwrap();
        assert!(got.starts_with("POST /hook HTTP/1.1"), "{got}");
        assert!(got.ends_with(body), "{got}");
    }

    #[test]
    fn curl_gets_the_url_and_body_as_quoted_config_values() {
        let c = curl_config("https://h/x?a=\"1\"", "POST", Some("{\"text\":\"a\\\\b\"}"));
        assert_eq!(
            c,
            "url = \"https://h/x?a=\\\"1\\\"\"\nrequest = \"POST\"\nheader = \"Content-Type: application/json\"\ndata-binary = \"{\\\"text\\\":\\\"a\\\\\\\\b\\\"}\"\n"
        );
        assert_eq!(
            curl_config("https://h", "GET", None),
            "url = \"https://h\"\nrequest = \"GET\"\n"
        );
    }

    use super::*;

    #[test]
    fn http_urls_split_into_host_port_and_path() {
        let u = parse_url("http://127.0.0.1:8080/hook/a?b=1#frag").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str(), u.https),
            ("127.0.0.1", 8080, "/hook/a?b=1", false)
        );
        let u = parse_url("https://example.org?x=1").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str(), u.https),
            ("example.org", 443, "/?x=1", true)
        );
        let u = parse_url("http://[::1]:81").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.path.as_str()), ("::1", 81, "/"));
        assert_eq!(parse_url("ftp://x"), Err(UrlError::Scheme));
        assert_eq!(parse_url("http://:80/"), Err(UrlError::NoHost));
        assert_eq!(parse_url("http://h:0/"), Err(UrlError::Port));
        assert_eq!(parse_url("http://h:+80/"), Err(UrlError::Port));
        assert_eq!(parse_url("http://h:99999/"), Err(UrlError::Port));
        assert_eq!(parse_url("http://u:p@h/"), Err(UrlError::UserInfo));
    }

    #[test]
    fn a_url_with_a_control_character_a_space_or_non_ascii_is_refused_named() {
        let e = parse_url("http://h/a\r\nX-Injected: 1").unwrap_err();
        assert_eq!(
            e,
            UrlError::Char {
                what: "a carriage return (CR)".into(),
                at: 11
            }
        );
        assert!(e.to_string().contains("percent-encode it"), "{e}");
        let what = |u: &str| match parse_url(u) {
            Err(UrlError::Char { what, .. }) => what,
            other => panic!("{other:?}"),
        };
        assert_eq!(what("http://h/\n"), "a line feed (LF)");
        assert_eq!(what("https://h/a b"), "a space");
        assert_eq!(what("http://h/\u{0}"), "a control character (U+0000)");
        assert_eq!(what("http://h/\u{7f}"), "a control character (U+007F)");
        assert_eq!(what("http://h/\u{e9}"), "a non-ASCII character (U+00E9)");
    }

    #[test]
    fn errors_show_a_url_without_its_path() {
        let u = parse_url("https://hooks.slack.com/services/T0/B0/SECRET").unwrap();
        assert_eq!(u.shown(), "https://hooks.slack.com/...");
        assert_eq!(
            parse_url("http://h:8080").unwrap().shown(),
            "http://h:8080/"
        );
    }

    #[test]
    fn an_excerpt_is_short_and_escaped() {
        assert_eq!(
            excerpt(b"HTTP/1.1 500 \"x\"\r\n\x1b[2J", 100),
            "\"HTTP/1.1 500 \\\"x\\\"\\r\\n\\x1b[2J\""
        );
        let long = vec![b'a'; 10_000_000];
        let e = excerpt(&long, 8);
        assert_eq!(e, "\"aaaaaaaa\"... (10000000 bytes)");
    }

    #[test]
    fn only_2xx_is_delivered_and_a_redirect_names_where_it_leads() {
        assert_eq!(
            judge(b"HTTP/1.1 204 No Content\r\n", false),
            Verdict::Delivered
        );
        assert_eq!(judge(b"HTTP/1.1 200", false), Verdict::Incomplete);
        assert_eq!(
            judge(b"HTTP/1.1 500 Oops\r\n", false),
            Verdict::Failed("\"HTTP/1.1 500 Oops\"".into())
        );
        assert_eq!(
            judge(b"SSH-2.0-OpenSSH\r\n", false),
            Verdict::Failed("\"SSH-2.0-OpenSSH\"".into())
        );
        // A redirect waits for its headers.
        let head = b"HTTP/1.1 302 Found\r\nServer: x\r\nlocation: https://elsewhere/x\r\n";
        assert_eq!(judge(head, false), Verdict::Incomplete);
        let want = Verdict::Redirect {
            status: "\"HTTP/1.1 302 Found\"".into(),
            location: Some("\"https://elsewhere/x\"".into()),
        };
        assert_eq!(judge(head, true), want);
        assert_eq!(judge(&[&head[..], b"\r\nbody"].concat(), false), want);
        assert_eq!(
            judge(b"HTTP/1.1 301 Moved\n\n", false),
            Verdict::Redirect {
                status: "\"HTTP/1.1 301 Moved\"".into(),
                location: None
            }
        );
        assert_eq!(curl_verdict("200 "), Verdict::Delivered);
        assert_eq!(
            curl_verdict("302 https://elsewhere/"),
            Verdict::Redirect {
                status: "HTTP 302".into(),
                location: Some("\"https://elsewhere/\"".into())
            }
        );
        assert_eq!(curl_verdict("404 "), Verdict::Failed("HTTP 404".into()));
        assert_eq!(curl_verdict("000 "), Verdict::Incomplete);
    }

    /// A server on a thread that answers each of `answers` to one connection and returns what
    /// each request was.
    fn server(answers: Vec<Vec<u8>>) -> (u16, std::thread::JoinHandle<Vec<String>>) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let t = std::thread::spawn(move || {
            let mut got = Vec::new();
            for a in answers {
                let (mut c, _) = l.accept().unwrap();
                let mut buf = [0u8; 4096];
                let n = c.read(&mut buf).unwrap();
                got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
                let _ = c.write_all(&a);
            }
            got
        });
        (port, t)
    }

    #[test]
    fn a_redirect_over_http_is_no_delivery_and_says_where_it_leads() {
        let (port, t) = server(vec![
            b"HTTP/1.1 302 Found\r\nLocation: http://x/y\r\n\r\n".to_vec()
        ]);
        let url = parse_url(&format!("http://127.0.0.1:{port}/h")).unwrap();
        let e = post_json(&url, "{}").unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("http://127.0.0.1:{port}/...: answered \"HTTP/1.1 302 Found\", a redirect to \"http://x/y\"; vigil follows none")),
            "{e}"
        );
        t.join().unwrap();
    }

    #[test]
    fn an_endless_answer_is_cut_at_the_cap_and_quoted_short() {
        let (port, t) = server(vec![vec![b'x'; 3 * MAX_HEAD]]);
        let url = parse_url(&format!("http://127.0.0.1:{port}/")).unwrap();
        let e = get(&url).unwrap_err().to_string();
        assert!(e.contains("no HTTP status line: \"xxxx"), "{e}");
        assert!(e.len() < 400, "{e}");
        t.join().unwrap();
    }

    #[test]
    fn a_post_reaches_a_server_and_its_status_is_read() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let mut got = Vec::new();
            for code in ["204 No Content", "500 Oops"] {
                let (mut c, _) = l.accept().unwrap();
                let mut buf = [0u8; 4096];
                let n = c.read(&mut buf).unwrap();
                got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
                c.write_all(format!("HTTP/1.1 {code}\r\n\r\n").as_bytes())
                    .unwrap();
            }
            got
        });
        let url = parse_url(&format!("http://127.0.0.1:{port}/h")).unwrap();
        post_json(&url, "{\"text\":\"hi\"}").unwrap();
        assert!(matches!(get(&url), Err(SendError::Status { .. })));
        let got = server.join().unwrap();
        assert!(got[0].starts_with("POST /h HTTP/1.1\r\n"), "{}", got[0]);
        assert!(got[0].ends_with("{\"text\":\"hi\"}"), "{}", got[0]);
        assert!(got[1].starts_with("GET /h HTTP/1.1\r\n"), "{}", got[1]);
    }
}
