//! Sending: a JSON POST to the webhook and the heartbeat's GET. `http://` is spoken here over a
//! plain TCP connection (HTTP/1.1, `Connection: close`); `https://` is handed to `curl`, which
//! every login node has, so that vigil carries no TLS stack (the Rust HTTP clients with TLS pull
//! in a crypto library and, through `url`, Unicode tables).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use vigil_slurm::cmd::{run_command, Cmd};

/// How long one request may take, connecting included.
pub const TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("{0}: give an http:// or https:// URL")]
    BadUrl(String),
    #[error("{url}: {why}")]
    Io { url: String, why: String },
    #[error("{url}: answered {status}")]
    Status { url: String, status: String },
    #[error("{0}")]
    Curl(String),
}

/// POSTs `body` (JSON) to `url`.
pub fn post_json(url: &str, body: &str) -> Result<(), SendError> {
    request(url, "POST", Some(body))
}

/// GETs `url` (the heartbeat).
pub fn get(url: &str) -> Result<(), SendError> {
    request(url, "GET", None)
}

fn request(url: &str, method: &str, body: Option<&str>) -> Result<(), SendError> {
    if url.starts_with("https://") {
        return curl(url, method, body);
    }
    let (host, port, path) = split_http(url).ok_or_else(|| SendError::BadUrl(url.into()))?;
    let io = |e: std::io::Error| SendError::Io {
        url: url.into(),
        why: e.to_string(),
    };
    let addr = (host.as_str(), port)
        .to_socket_addrs()
        .map_err(io)?
        .next()
        .ok_or_else(|| SendError::Io {
            url: url.into(),
            why: "the host has no address".into(),
        })?;
    let mut s = TcpStream::connect_timeout(&addr, TIMEOUT).map_err(io)?;
    s.set_read_timeout(Some(TIMEOUT)).map_err(io)?;
    s.set_write_timeout(Some(TIMEOUT)).map_err(io)?;
    let body = body.unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: vigil-watch\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(&[head.as_bytes(), body.as_bytes()].concat())
        .map_err(io)?;
    let mut answer = Vec::new();
    // The status line is enough; a server that keeps the connection open is cut at the timeout.
    let mut buf = [0u8; 1024];
    while !answer.windows(2).any(|w| w == b"\r\n") {
        match s.read(&mut buf).map_err(io)? {
            0 => break,
            n => answer.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&answer);
    let status = text.lines().next().unwrap_or_default().to_string();
    let code = status.split_whitespace().nth(1).unwrap_or_default();
    if code.starts_with('2') {
        Ok(())
    } else {
        Err(SendError::Status {
            url: url.into(),
            status: if status.is_empty() {
                "nothing".into()
            } else {
                status
            },
        })
    }
}

/// `http://host[:port][/path]` as its host, port and path.
fn split_http(url: &str) -> Option<(String, u16, String)> {
    let rest = url.strip_prefix("http://")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !p.contains(']') => (h, p.parse().ok()?),
        _ => (authority, 80),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (!host.is_empty()).then(|| (host.to_string(), port, path.to_string()))
}

fn curl(url: &str, method: &str, body: Option<&str>) -> Result<(), SendError> {
    // The URL (a webhook's is its secret) and the body go in a config file only this user can
    // read, not on curl's command line, where `ps` shows them to everyone on the node.
    let fail = |why: String| SendError::Curl(why);
    let mut config = tempfile::NamedTempFile::new().map_err(|e| fail(e.to_string()))?;
    config
        .write_all(curl_config(url, method, body).as_bytes())
        .and_then(|()| config.flush())
        .map_err(|e| fail(e.to_string()))?;
    let secs = TIMEOUT.as_secs().to_string();
    let path = config.path().to_string_lossy().into_owned();
    let args = ["-fsS", "-o", "/dev/null", "-m", &secs, "-K", &path];
    run_command(&Cmd::new("curl", &args), TIMEOUT + Duration::from_secs(5))
        .map(|_| ())
        .map_err(|e| fail(e.to_string()))
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
        curl(&format!("http://127.0.0.1:{port}/hook"), "POST", Some(body)).unwrap();
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
        assert_eq!(
            split_http("http://127.0.0.1:8080/hook/a?b=1"),
            Some(("127.0.0.1".into(), 8080, "/hook/a?b=1".into()))
        );
        assert_eq!(
            split_http("http://example.org"),
            Some(("example.org".into(), 80, "/".into()))
        );
        assert_eq!(split_http("ftp://x"), None);
        assert_eq!(split_http("http://:80/"), None);
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
        let url = format!("http://127.0.0.1:{port}/h");
        post_json(&url, "{\"text\":\"hi\"}").unwrap();
        assert!(matches!(get(&url), Err(SendError::Status { .. })));
        let got = server.join().unwrap();
        assert!(got[0].starts_with("POST /h HTTP/1.1\r\n"), "{}", got[0]);
        assert!(got[0].ends_with("{\"text\":\"hi\"}"), "{}", got[0]);
        assert!(got[1].starts_with("GET /h HTTP/1.1\r\n"), "{}", got[1]);
    }
}
