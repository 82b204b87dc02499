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

/// The options a connection with peer timeout `t` gets: its keepalive spread over the allowed
/// ranges (the exact values depend on the connection's ports), enough probes to cover `t`, and
/// the user timeout.
fn check(o: &Opts, t: Duration, user_timeout: Duration) {
    let secs = |d: Duration| d.as_secs_f64();
    let whole = |s: f64| Duration::from_secs((s.round() as u64).clamp(1, 32767));
    assert!(o.keepalive, "{o:?}");
    assert_eq!(o.user_timeout, Some(user_timeout), "{o:?}");
    let t = secs(t);
    assert!(
        o.idle >= whole(t / 6.0) && o.idle <= whole(t / 3.0),
        "idle {o:?} for {t}s"
    );
    assert!(
        o.interval >= whole(t / 12.0) && o.interval <= whole(t / 8.0),
        "interval {o:?} for {t}s"
    );
    assert!((3..=127).contains(&o.count), "{o:?}");
    // The probes reach past the timeout (or the count is at the kernel's limit).
    assert!(
        o.count == 127 || secs(o.idle) + f64::from(o.count) * secs(o.interval) >= t.min(32767.0),
        "{o:?} for {t}s"
    );
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
    let d3 = Duration::from_secs(3);
    check(&opts_of_socket(h.local_addr(), client_addr), d3, d3);

    // The client's own socket: untouched until asked.
    assert!(!SockRef::from(c.socket()).keepalive().unwrap());
    c.set_peer_timeout(d3).unwrap();
    check(&opts(&SockRef::from(c.socket())), d3, d3);
    let d30 = Duration::from_secs(30);
    c.set_peer_timeout(d30).unwrap();
    check(&opts(&SockRef::from(c.socket())), d30, d30);
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
    let ms = Duration::from_millis;
    set_peer_timeout(&a, ms(500)).unwrap();
    check(&get(), ms(500), ms(500));
    set_peer_timeout(&a, ms(9_999)).unwrap();
    check(&get(), ms(9_999), ms(9_999));
    set_peer_timeout(&a, Duration::from_secs(60)).unwrap();
    check(&get(), Duration::from_secs(60), Duration::from_secs(60));
    // Zero would mean "system default" for TCP_USER_TIMEOUT: 1 ms instead.
    set_peer_timeout(&a, Duration::ZERO).unwrap();
    check(&get(), Duration::ZERO, ms(1));
    // Huge values hit the kernel's limits instead of failing.
    set_peer_timeout(&a, Duration::MAX).unwrap();
    let o = get();
    assert_eq!(
        (o.idle, o.interval, o.count),
        (Duration::from_secs(32767), Duration::from_secs(32767), 127)
    );
    assert_eq!(o.user_timeout, Some(ms(i32::MAX as u64)));
}

/// Connections that went idle together probe at different times (field finding 28: probes that
/// fire together on every connection overflowed the receive queue at 512+ agents).
#[tokio::test]
async fn connections_probe_at_spread_times() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let t = Duration::from_secs(30);
    let mut idles = std::collections::BTreeSet::new();
    let mut keep = Vec::new();
    for _ in 0..32 {
        let a = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (b, _) = listener.accept().await.unwrap();
        set_peer_timeout(&a, t).unwrap();
        let o = opts(&SockRef::from(&a));
        check(&o, t, t);
        idles.insert((o.idle, o.interval));
        keep.push((a, b));
    }
    assert!(idles.len() >= 4, "32 connections, timings {idles:?}");
}

#[test]
fn a_timeout_is_covered_by_many_probes() {
    for jitter in [0, 1 << 15, u16::MAX] {
        let t = Duration::from_secs(30);
        let (idle, interval, count) = vigil_store::keepalive_timing(t, jitter);
        // At least five probes go out before the timeout: losing two no longer ends the
        // connection (it took three probes at t/3 before).
        let before = (t - idle).as_secs() / interval.as_secs() + 1;
        assert!(before >= 5, "{idle:?} {interval:?} {count}");
        assert!(idle + interval * count >= t);
    }
}
