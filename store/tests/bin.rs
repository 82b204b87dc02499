//! The `vigil-store-server` binary: first line, serving, stopping.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use vigil_store::StoreClient;

fn spawn_server() -> (std::process::Child, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_vigil-store-server"))
        .args(["--host", "127.0.0.1", "--port", "0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn vigil-store-server");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("first line was {line:?}"));
    let addr: SocketAddr = addr.parse().unwrap();
    assert_ne!(addr.port(), 0);
    (child, addr)
}

fn wait_exit(child: &mut std::process::Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        assert!(Instant::now() < deadline, "server did not exit");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[tokio::test]
async fn serves_and_stops_on_stdin_eof() {
    let (mut child, addr) = spawn_server();
    let mut c = StoreClient::connect(addr, Duration::from_secs(10))
        .await
        .unwrap();
    c.set("k", b"v").await.unwrap();
    assert_eq!(c.get("k").await.unwrap(), b"v");
    drop(child.stdin.take());
    assert!(wait_exit(&mut child).success());
    assert!(c.ping().await.is_err(), "the server is gone");
}

#[tokio::test]
async fn stops_on_sigterm() {
    let (mut child, addr) = spawn_server();
    let mut c = StoreClient::connect(addr, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(c.add("n", 3).await.unwrap(), 3);
    let st = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    assert!(wait_exit(&mut child).success());
    std::net::TcpListener::bind(addr).expect("the port is free again");
}

#[test]
fn rejects_bad_arguments() {
    let out = Command::new(env!("CARGO_BIN_EXE_vigil-store-server"))
        .args(["--port", "99999"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad --port"));
}
