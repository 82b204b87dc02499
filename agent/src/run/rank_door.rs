//! The ranks' door: a loopback port on every node through which this node's ranks reach vigil's
//! store. It owns that listener and every connection through it: it admits only processes of
//! this agent's own uid (found in `/proc/net/tcp`, [`socket_uid`]), opens for each one its own
//! connection to the store, proves the job's secret there as the agent does, and then carries
//! the bytes both ways untouched, so that torch's `TCPStore` client (`MASTER_ADDR`/`MASTER_PORT`)
//! works as before against a store that requires the secret from every connection
//! (docs/store.md, "Who may use the store").
//!
//! It runs on a thread of its own (like the store), so a busy agent loop cannot stall the ranks'
//! requests, and lives as long as the agent: it has no shutdown of its own.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use super::report::console_note;
use super::store_host::DROP_NOTE_EVERY;

/// How long the door waits before accepting again after a failed accept (out of descriptors).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);

/// Longest `/proc/net/tcp` (or `tcp6`) read: about 1.7 million sockets at 150 bytes a line.
const PROC_NET_LIMIT: u64 = 256 << 20;

/// Connections the door carries at once for a node of `nproc` ranks: torch's client and its
/// watchdog's clone per rank, twice over for ranks restarting while their old connections
/// close, and some for tools of the job's own.
pub(super) fn max_connections(nproc: u32) -> usize {
    (nproc as usize).saturating_mul(4).saturating_add(64)
}

/// The ranks' door, once open: the port the ranks are told (`MASTER_PORT`; `MASTER_ADDR` is
/// 127.0.0.1).
pub(super) struct RankDoor {
    pub(super) port: u16,
}

/// What a door needs to know of the store it leads to.
#[derive(Clone)]
pub(super) struct Upstream {
    /// vigil's store as this node's agent reaches it.
    pub(super) store: SocketAddr,
    /// The job's secret, proved on every connection (`None`: the store requires none).
    pub(super) secret: Option<Arc<[u8]>>,
    /// How long a connection to the store may take to open and prove the secret.
    pub(super) connect_timeout: Duration,
    /// How long a silent store is waited for (TCP_USER_TIMEOUT and keepalive, as the agent's
    /// own connection: `--node-timeout`).
    pub(super) peer_timeout: Duration,
}

/// Opens the ranks' door on 127.0.0.1, port 0, and serves it on a thread of its own.
pub(super) fn open(up: Upstream, max_conns: usize) -> std::io::Result<RankDoor> {
    let std_listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    std_listener.set_nonblocking(true)?;
    let port = std_listener.local_addr()?.port();
    super::store_host::serve_on_own_thread("vigil-door", move || async move {
        let listener = TcpListener::from_std(std_listener)?;
        Ok(((), serve(listener, up, max_conns)))
    })?;
    Ok(RankDoor { port })
}

/// Accepts forever: each connection is checked and carried on a task of its own.
async fn serve(listener: TcpListener, up: Upstream, max_conns: usize) {
    let slots = Arc::new(Semaphore::new(max_conns));
    let note = Notice::new();
    let me = nix::unistd::geteuid().as_raw();
    loop {
        let (down, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(_) => {
                // EMFILE and friends: the pending connection stays queued; try again shortly.
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            note.say(&format!(
                "the ranks' door closed a connection from {peer}: {max_conns} connections are open through it already"
            ));
            continue;
        };
        let up = up.clone();
        let note = note.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let door = match down.local_addr() {
                Ok(a) => a,
                Err(_) => return,
            };
            if let Some(why) = refusal(peer_uid(peer, door), me) {
                note.say(&format!(
                    "the ranks' door closed a connection from {peer}: {why}"
                ));
                return;
            }
            if let Err(why) = carry(down, &up).await {
                note.say(&format!(
                    "the ranks' door closed a connection from {peer}: {why}"
                ));
            }
        });
    }
}

/// Opens an authenticated connection to the store for one rank's connection and carries the
/// bytes both ways until either side ends. `Err`: why the store could not be reached.
async fn carry(mut down: TcpStream, up: &Upstream) -> Result<(), String> {
    let mut upstream = connect_upstream(up).await?;
    let _ = down.set_nodelay(true);
    // Either side's end (or error) ends both: dropping the streams closes them.
    let _ = tokio::io::copy_bidirectional(&mut down, &mut upstream).await;
    Ok(())
}

/// A connection to the store that has sent VALIDATE, proved the job's secret (when the store
/// asks for one) and turned itself into a rank's connection (RANK_ONLY: torch's operations on
/// keys outside `/vigil/` only), ready for the rank's own bytes.
pub(super) async fn connect_upstream(up: &Upstream) -> Result<TcpStream, String> {
    let mut c = vigil_store::StoreClient::connect(up.store, up.connect_timeout)
        .await
        .map_err(|e| format!("cannot reach vigil's store at {}: {e}", up.store))?;
    c.set_peer_timeout(up.peer_timeout)
        .map_err(|e| format!("cannot set the store connection's timeout: {e}"))?;
    c.authenticate(up.secret.as_deref())
        .await
        .map_err(|e| format!("vigil's store at {}: {e}", up.store))?;
    c.rank_only()
        .await
        .map_err(|e| format!("vigil's store at {}: {e}", up.store))?;
    c.into_stream()
        .map_err(|e| format!("vigil's store at {}: {e}", up.store))
}

/// One console line per [`DROP_NOTE_EVERY`] at most about connections the door closed; the rest
/// are counted into the next.
#[derive(Clone)]
struct Notice(Arc<Mutex<(Option<Instant>, u64)>>);

impl Notice {
    fn new() -> Notice {
        Notice(Arc::new(Mutex::new((None, 0))))
    }

    fn say(&self, line: &str) {
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if g.0.is_some_and(|t| now.duration_since(t) < DROP_NOTE_EVERY) {
            g.1 += 1;
            return;
        }
        let more = std::mem::take(&mut g.1);
        g.0 = Some(now);
        drop(g);
        if more > 0 {
            console_note(&format!("{line} ({more} more closed since the last note)"));
        } else {
            console_note(line);
        }
    }
}

/// Why the door closes a connection whose socket belongs to `found` (`None`: not found), when
/// this agent runs as `me`; `None`: it is admitted. Pure.
pub(super) fn refusal(found: Option<u32>, me: u32) -> Option<String> {
    match found {
        Some(uid) if uid == me => None,
        Some(uid) => Some(format!(
            "its process runs as uid {uid}, not as this agent's uid {me}"
        )),
        None => Some("its socket is not in /proc/net/tcp, so whose it is is unknown".into()),
    }
}

/// The uid owning the socket at `peer` connected to `door` on this machine: its line in
/// `/proc/net/tcp`, else `/proc/net/tcp6`. `None`: in neither (gone already, or unreadable).
fn peer_uid(peer: SocketAddr, door: SocketAddr) -> Option<u32> {
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().find_map(|p| {
        let text = vigil_bounded::read_string(Path::new(p), PROC_NET_LIMIT).ok()?;
        socket_uid(&text, peer, door)
    })
}

/// In the text of `/proc/net/tcp` or `/proc/net/tcp6`, the uid column of the socket whose local
/// address is `local` and whose remote address is `remote`. IPv4-mapped IPv6 addresses match
/// their IPv4 address. Pure.
pub(super) fn socket_uid(table: &str, local: SocketAddr, remote: SocketAddr) -> Option<u32> {
    let (local, remote) = (plain(local), plain(remote));
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 {
            return None;
        }
        let l = plain(parse_proc_addr(f[1])?);
        let r = plain(parse_proc_addr(f[2])?);
        if l != local || r != remote {
            return None;
        }
        f[7].parse().ok()
    })
}

/// An IPv4-mapped IPv6 address as its IPv4 address; any other as it is.
fn plain(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), v6.port()),
            None => a,
        },
        v4 => v4,
    }
}

/// `0100007F:1F90` (IPv4) or 32 hex digits and a port (IPv6), as the kernel writes them: the
/// address as 32-bit words in the machine's byte order, the port in hex.
fn parse_proc_addr(s: &str) -> Option<SocketAddr> {
    let (ip, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |h: &str| u32::from_str_radix(h, 16).ok().map(u32::to_ne_bytes);
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(ip)?)),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[i * 4..i * 4 + 4].copy_from_slice(&word(ip.get(i * 8..i * 8 + 8)?)?);
            }
            IpAddr::V6(Ipv6Addr::from(b))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Lines as a little-endian machine's kernel writes them (x86_64, aarch64).
    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:A3C1 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4711 1 0000000000000000 100 0 0 10 0
   1: 0100007F:D431 0100007F:A3C1 01 00000000:00000000 00:00000000 00000000  1000        0 4712 1 0000000000000000 20 4 30 10 -1
   2: 0100007F:D432 0100007F:A3C1 01 00000000:00000000 00:00000000 00000000  1001        0 4713 1 0000000000000000 20 4 30 10 -1
   3: 0100007F:A3C1 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 4714 1 0000000000000000 20 4 30 10 -1
   4: 0A01A8C0:0016 6401A8C0:D431 01 00000000:00000000 02:000AF6E6 00000000     0        0 4715 2 0000000000000000 20 4 30 10 -1
";
    const TCP6: &str = "  sl  local_address                         remote address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0000000000000000FFFF00000100007F:D433 0000000000000000FFFF00000100007F:A3C1 01 00000000:00000000 00:00000000 00000000  1002        0 4716 1 0000000000000000 20 4 30 10 -1
   1: 00000000000000000000000001000000:D434 00000000000000000000000001000000:1F90 01 00000000:00000000 00:00000000 00000000  1003        0 4717 1 0000000000000000 20 4 30 10 -1
";

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[cfg(target_endian = "little")]
    #[test]
    fn the_peers_socket_is_found_by_both_ends_in_the_kernels_byte_order() {
        let door = a("127.0.0.1:41921"); // A3C1
        assert_eq!(socket_uid(TCP, a("127.0.0.1:54321"), door), Some(1000));
        // Another uid's socket is found as such: the door compares it with its own.
        assert_eq!(socket_uid(TCP, a("127.0.0.1:54322"), door), Some(1001));
        // The door's own end of the connection (local = door) is not the peer's.
        assert_eq!(socket_uid(TCP, door, a("127.0.0.1:54321")), Some(0));
        assert_eq!(socket_uid(TCP, a("127.0.0.1:54323"), door), None);
        // 192.168.1.10 in the kernel's order is 0A01A8C0.
        assert_eq!(
            socket_uid(TCP, a("192.168.1.10:22"), a("192.168.1.100:54321")),
            Some(0)
        );
        // IPv4-mapped addresses in tcp6 match their IPv4 address; ::1 is ::1.
        assert_eq!(socket_uid(TCP6, a("127.0.0.1:54323"), door), Some(1002));
        assert_eq!(
            socket_uid(TCP6, a("[::1]:54324"), a("[::1]:8080")),
            Some(1003)
        );
        assert_eq!(socket_uid(TCP6, a("127.0.0.1:54321"), door), None);
    }

    #[cfg(target_endian = "little")]
    #[test]
    fn a_peer_of_another_uid_is_refused() {
        let door = a("127.0.0.1:41921");
        let uid = |port| socket_uid(TCP, a(&format!("127.0.0.1:{port}")), door);
        assert_eq!(refusal(uid(54321), 1000), None);
        let e = refusal(uid(54322), 1000).unwrap();
        assert!(e.contains("uid 1001") && e.contains("uid 1000"), "{e}");
        assert!(refusal(uid(54399), 1000).is_some());
    }

    #[test]
    fn a_table_with_nothing_or_rubbish_in_it_finds_nothing() {
        let door = a("127.0.0.1:41921");
        assert_eq!(socket_uid("", a("127.0.0.1:1"), door), None);
        assert_eq!(
            socket_uid(
                "header\n 0: zz:zz 0100007F:A3C1 01 x x x 1000\n",
                a("127.0.0.1:1"),
                door
            ),
            None
        );
        assert_eq!(parse_proc_addr("0100007F"), None);
        assert_eq!(parse_proc_addr("0100007:0016"), None);
    }

    #[test]
    fn the_door_is_sized_for_the_node() {
        assert_eq!(max_connections(8), 96);
        assert_eq!(max_connections(0), 64);
    }

    /// Over real sockets: torch's bytes through the door reach a store that requires the secret,
    /// as a rank's connection (its own keys work, a `/vigil/` key closes it), and this process is
    /// its own uid.
    #[test]
    fn a_plain_client_through_the_door_reaches_a_store_that_requires_the_secret() {
        use std::io::{Read, Write};
        let secret = b"door-test-secret-0123456789".to_vec();
        let (store, keys, _leases) = super::super::store_host::host_store(
            a("127.0.0.1:0"),
            Duration::from_secs(10),
            Some(secret.clone()),
        )
        .unwrap();
        let door = open(
            Upstream {
                store,
                secret: Some(Arc::from(secret)),
                connect_timeout: Duration::from_secs(10),
                peer_timeout: Duration::from_secs(10),
            },
            4,
        )
        .unwrap();
        let mut s = std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, door.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        // This test's own socket is found, as this process's uid.
        let me = nix::unistd::geteuid().as_raw();
        assert_eq!(
            peer_uid(s.local_addr().unwrap(), s.peer_addr().unwrap()),
            Some(me)
        );
        let b = |x: &[u8]| {
            let mut v = (x.len() as u64).to_le_bytes().to_vec();
            v.extend_from_slice(x);
            v
        };
        let mut req = vec![0u8];
        req.extend_from_slice(&vigil_store::VALIDATION_MAGIC.to_le_bytes());
        for key in [&b"/torch"[..], b"/vigil/door"] {
            req.push(1); // SET
            req.extend(b(key));
            req.extend(b(b"v1"));
            req.push(3); // GET
            req.extend(b(key));
        }
        s.write_all(&req).unwrap();
        let mut n = [0u8; 8];
        s.read_exact(&mut n).unwrap();
        assert_eq!(u64::from_le_bytes(n), 2);
        let mut v = [0u8; 2];
        s.read_exact(&mut v).unwrap();
        assert_eq!(&v, b"v1");
        // The rank's connection may not touch vigil's keys: closed, nothing stored.
        assert!(matches!(s.read(&mut v), Ok(0) | Err(_)));
        assert_eq!(keys.get_raw(b"/vigil/door"), None);
        // The client's end closes the store's: a second connection still works.
        drop(s);
        let mut s = std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, door.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut req = vec![0u8];
        req.extend_from_slice(&vigil_store::VALIDATION_MAGIC.to_le_bytes());
        req.push(3);
        req.extend(b(b"/torch"));
        s.write_all(&req).unwrap();
        let mut n = [0u8; 10];
        s.read_exact(&mut n).unwrap();
        assert_eq!(&n[8..], b"v1");
    }

    /// A store whose secret differs refuses the door's proof: the rank's connection is closed.
    #[test]
    fn a_door_with_the_wrong_secret_closes_the_ranks_connection() {
        use std::io::{Read, Write};
        let (store, _keys, _leases) = super::super::store_host::host_store(
            a("127.0.0.1:0"),
            Duration::from_secs(10),
            Some(b"the-stores-secret-0123456789".to_vec()),
        )
        .unwrap();
        let door = open(
            Upstream {
                store,
                secret: Some(Arc::from(&b"another-secret-0123456789"[..])),
                connect_timeout: Duration::from_secs(10),
                peer_timeout: Duration::from_secs(10),
            },
            4,
        )
        .unwrap();
        let mut s = std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, door.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut req = vec![0u8];
        req.extend_from_slice(&vigil_store::VALIDATION_MAGIC.to_le_bytes());
        req.extend_from_slice(&[13, 1, 2, 3, 4]); // PING
        let _ = s.write_all(&req);
        let mut buf = [0u8; 4];
        assert!(matches!(s.read(&mut buf), Ok(0) | Err(_)));
    }
}
