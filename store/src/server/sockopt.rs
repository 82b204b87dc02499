//! Socket options of the store's connections: the peer timeout (keepalive spread per connection,
//! `TCP_USER_TIMEOUT`) and the kernel's listen-queue cap.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpStream;

/// The kernel's cap on a listen backlog (`net.core.somaxconn`), where it can be read.
pub fn somaxconn() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// A connection's keepalive timing for a peer timeout `t`, with `jitter` in `0..=u16::MAX`
/// drawn per connection: (idle before the first probe, interval between probes, probe count).
///
/// Every connection of a job goes idle at about the same moment (after a rendezvous); probes with
/// one idle time then fire together on every connection, and at 512+ agents the burst overflowed
/// the receive queue and aborted connections (field finding 28). So the idle time is spread over
/// `t/6..t/3` and the interval over `t/12..t/8` (at least 1 s) per connection, and a connection is
/// given enough probes to lose most of them: the kernel ends it only once nothing at all came back
/// for `t` (`TCP_USER_TIMEOUT`, which overrides the count once set).
pub fn keepalive_timing(t: Duration, jitter: u16) -> (Duration, Duration, u32) {
    let frac = f64::from(jitter) / f64::from(u16::MAX);
    let secs = t.as_secs_f64();
    let whole = |s: f64| Duration::from_secs((s.round() as u64).clamp(1, 32767));
    let idle = whole(secs / 6.0 + frac * secs / 6.0);
    let interval = whole(secs / 12.0 + frac * secs / 24.0);
    let left = t.saturating_sub(idle).as_secs_f64();
    let count = ((left / interval.as_secs_f64()).ceil() as u32)
        .saturating_add(1)
        .clamp(3, 127);
    (idle, interval, count)
}

/// A per-connection jitter in `0..=u16::MAX` from the connection's two ports, which differ between
/// connections and spread evenly; no randomness needed.
fn connection_jitter(stream: &TcpStream) -> u16 {
    let port = |a: io::Result<SocketAddr>| a.map(|a| a.port()).unwrap_or(0);
    let (l, p) = (port(stream.local_addr()), port(stream.peer_addr()));
    // Multiplicative hashing (Knuth): neighbouring ports land far apart.
    let h = (u32::from(l) << 16 | u32::from(p)).wrapping_mul(0x9E37_79B1);
    (h >> 16) as u16
}

/// Applies the peer-timeout socket options to a connected TCP socket:
/// `SO_KEEPALIVE` on with [`keepalive_timing`] (the idle time and interval spread per
/// connection, many probes), and on Linux `TCP_USER_TIMEOUT` = `t` in milliseconds (at least
/// 1 ms, at most `i32::MAX` ms, about 24.8 days). A peer that stops answering (no FIN, no RST)
/// then fails the connection after roughly `t`: idle connections through the keepalive probes,
/// connections with unacknowledged data through the user timeout; a lost probe or two does not.
/// Used by [`StoreServer::set_peer_timeout`] and
/// [`StoreClient::set_peer_timeout`](crate::StoreClient::set_peer_timeout).
pub fn set_peer_timeout(stream: &TcpStream, t: Duration) -> io::Result<()> {
    let sock = socket2::SockRef::from(stream);
    let (idle, interval, count) = keepalive_timing(t, connection_jitter(stream));
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(idle)
        .with_interval(interval)
        .with_retries(count);
    sock.set_tcp_keepalive(&keepalive)?;
    // The kernel reads the option as an int and rejects negative values.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    sock.set_tcp_user_timeout(Some(t.clamp(
        Duration::from_millis(1),
        Duration::from_millis(i32::MAX as u64),
    )))?;
    Ok(())
}
