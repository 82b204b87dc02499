//! Helpers shared by the store's TCP tests.
#![allow(dead_code)] // each test binary uses its own subset

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::Instant;
use vigil_store::protocol::Request;
use vigil_store::VALIDATION_MAGIC;

/// The generous bound every wait in these tests has.
pub const T: Duration = Duration::from_secs(10);

/// A raw, validated connection, as torch's client opens one, for byte-level tests.
pub async fn raw(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    send(
        &mut s,
        Request::Validate {
            magic: VALIDATION_MAGIC,
        },
    )
    .await;
    s
}

pub async fn send(s: &mut TcpStream, req: Request) {
    let mut b = Vec::new();
    req.encode(&mut b);
    s.write_all(&b).await.unwrap();
}

pub async fn wait_until(mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + T;
    while !f() {
        assert!(Instant::now() < deadline, "condition not reached in time");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
