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
    let secs = TIMEOUT.as_secs().to_string();
    let mut args = vec!["-fsS", "-o", "/dev/null", "-m", &secs, "-X", method];
    if let Some(b) = body {
        args.extend(["-H", "Content-Type: application/json", "--data-binary", b]);
    }
    args.push(url);
    run_command(&Cmd::new("curl", &args), TIMEOUT + Duration::from_secs(5))
        .map(|_| ())
        .map_err(|e| SendError::Curl(e.to_string()))
}

#[cfg(test)]
mod tests {
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
