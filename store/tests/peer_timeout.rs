//! TCP keepalive / user-timeout options on both ends of a store connection.
//!
//! The server runs in this process, so its accepted socket is one of this
//! process's file descriptors: the test finds it under /proc/self/fd by its
//! addresses and reads its options back.

#![cfg(target_os = "linux")]

use std::net::SocketAddr;
use std::os::fd::{BorrowedFd, RawFd};
use std::time::Duration;

use socket2::SockRef;
use tokio::net::{TcpListener, TcpStream};
use vigil_store::{set_peer_timeout, StoreClient, StoreServer};

const T: Duration = Duration::from_secs(10);

#[derive(Debug, PartialEq, Eq)]
struct Opts {
    keepalive: bool,
    idle: Duration,
    interval: Duration,
    count: u32,
    user_timeout: Option<Duration>,
}

fn opts(s: &SockRef<'_>) -> Opts {
    Opts {
        keepalive: s.keepalive().unwrap(),
        idle: s.tcp_keepalive_time().unwrap(),
        interval: s.tcp_keepalive_interval().unwrap(),
        count: s.tcp_keepalive_retries().unwrap(),
        user_timeout: s.tcp_user_timeout().unwrap(),
    }
}

fn expected(idle_s: u64, user_timeout: Duration) -> Opts {
    Opts {
        keepalive: true,
        idle: Duration::from_secs(idle_s),
        interval: Duration::from_secs(idle_s),
        count: 3,
        user_timeout: Some(user_timeout),
    }
}

/// Options of this process's TCP socket with these local and peer addresses.
fn opts_of_socket(local: SocketAddr, peer: SocketAddr) -> Opts {
    for entry in std::fs::read_dir("/proc/self/fd").unwrap() {
        let Ok(fd) = entry
            .unwrap()
            .file_name()
            .to_string_lossy()
            .parse::<RawFd>()
        else {
            continue;
        };
        // SAFETY: only socket options are read, while the socket we look
        // for is kept open by the caller; another fd closed meanwhile just
        // fails these calls or does not match the addresses.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let s = SockRef::from(&fd);
        let (Ok(l), Ok(p)) = (s.local_addr(), s.peer_addr()) else {
            continue;
        };
        if l.as_socket() == Some(local) && p.as_socket() == Some(peer) {
            return opts(&s);
        }
    }
    panic!("no socket {local} <-> {peer} in this process");
}

#[tokio::test]
async fn server_and_client_set_keepalive_and_user_timeout() {
    let mut server = StoreServer::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    server.set_peer_timeout(Some(Duration::from_secs(3)));
    let h = server.spawn();
    let c = StoreClient::connect(h.local_addr(), T).await.unwrap();

    // The handshake was answered, so the server task has set its options.
    let client_addr = c.socket().local_addr().unwrap();
    assert_eq!(
        opts_of_socket(h.local_addr(), client_addr),
        expected(1, Duration::from_secs(3)),
        "server side"
    );

    // The client's own socket: untouched until asked.
    assert!(!SockRef::from(c.socket()).keepalive().unwrap());
    c.set_peer_timeout(Duration::from_secs(3)).unwrap();
    assert_eq!(
        opts(&SockRef::from(c.socket())),
        expected(1, Duration::from_secs(3)),
        "client side"
    );
    c.set_peer_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(
        opts(&SockRef::from(c.socket())),
        expected(10, Duration::from_secs(30))
    );
    drop(c);
    h.shutdown().await;
}

#[tokio::test]
async fn without_a_peer_timeout_the_server_leaves_the_defaults() {
    let server = StoreServer::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let h = server.spawn();
    let c = StoreClient::connect(h.local_addr(), T).await.unwrap();
    let client_addr = c.socket().local_addr().unwrap();
    let o = opts_of_socket(h.local_addr(), client_addr);
    assert!(!o.keepalive);
    assert_eq!(o.user_timeout, None);
    drop(c);
    h.shutdown().await;
}

#[tokio::test]
async fn option_values_are_rounded_and_clamped() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (_b, _) = listener.accept().await.unwrap();
    let get = || opts(&SockRef::from(&a));

    // Below 3 s the probes still go every second.
    set_peer_timeout(&a, Duration::from_millis(500)).unwrap();
    assert_eq!(get(), expected(1, Duration::from_millis(500)));
    // Whole seconds, rounded down.
    set_peer_timeout(&a, Duration::from_millis(9_999)).unwrap();
    assert_eq!(get(), expected(3, Duration::from_millis(9_999)));
    set_peer_timeout(&a, Duration::from_secs(60)).unwrap();
    assert_eq!(get(), expected(20, Duration::from_secs(60)));
    // Zero would mean "system default" for TCP_USER_TIMEOUT: 1 ms instead.
    set_peer_timeout(&a, Duration::ZERO).unwrap();
    assert_eq!(get(), expected(1, Duration::from_millis(1)));
    // Huge values hit the kernel's limits instead of failing.
    set_peer_timeout(&a, Duration::MAX).unwrap();
    assert_eq!(
        get(),
        expected(32767, Duration::from_millis(i32::MAX as u64))
    );
}
