//! An async client speaking the c10d TCPStore protocol, for vigil agents.
//!
//! It behaves like torch's `TCPStore(is_master=False)`: user keys get a `/`
//! in front (so `set("x")` here and `store.set("x")` in torch name the same
//! key), `get` and `multi_get` wait for their keys first, `wait` answers a
//! timeout with `CANCEL_WAIT`. It works against vigil's server and against
//! torch's own.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::protocol::{
    Request, CHECK_NOT_READY, CHECK_READY, VALIDATION_MAGIC, WAIT_CANCELED, WAIT_STOP_WAITING,
};

/// Largest reply value the client accepts.
const MAX_REPLY_LEN: u64 = 1 << 30;

/// Default per-operation timeout (torch's default store timeout is 300 s).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot connect to the store at {addr} within {timeout:?}: {source}")]
    Connect {
        addr: SocketAddr,
        timeout: Duration,
        source: std::io::Error,
    },
    #[error("store I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("store {op} timed out after {timeout:?}")]
    Timeout { op: &'static str, timeout: Duration },
    #[error("store protocol error: {0}")]
    Protocol(String),
    #[error("queue is empty")]
    QueueEmpty,
    #[error("the store connection is unusable after an interrupted or failed operation")]
    Broken,
    /// The store wants a secret this client does not have, or refused the one it has.
    #[error("{0}")]
    Auth(String),
}

impl StoreError {
    pub fn is_timeout(&self) -> bool {
        matches!(self, StoreError::Timeout { .. })
    }
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// One persistent connection to a TCPStore server. Operations take `&mut
/// self`: one request in flight at a time, as in torch. If an operation's
/// future is dropped half way, or fails on I/O, the connection is marked
/// broken and every later call returns [`StoreError::Broken`]; reconnect.
pub struct StoreClient {
    stream: BufReader<TcpStream>,
    wbuf: Vec<u8>,
    timeout: Duration,
    peer: SocketAddr,
    broken: bool,
}

pub(crate) fn user_key(key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.push(b'/');
    k.extend_from_slice(key.as_bytes());
    k
}

/// The user keys among `raw` (those with the `/` prefix), prefix removed.
pub(crate) fn user_keys(raw: Vec<Vec<u8>>) -> Vec<String> {
    raw.into_iter()
        .filter_map(|k| {
            k.strip_prefix(b"/")
                .map(|k| String::from_utf8_lossy(k).into_owned())
        })
        .collect()
}

/// `now + timeout`, or, when that overflows (`Duration::MAX`), a deadline 30
/// years away: tokio's own "far future", in effect no timeout.
fn far_deadline(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .unwrap_or_else(|| now + Duration::from_secs(30 * 365 * 86_400))
}

fn next_nonce() -> u32 {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    std::process::id() ^ COUNTER.fetch_add(1, Ordering::Relaxed).rotate_left(16)
}

/// `delay` spread over `[delay / 2, 3 delay / 2)` by `r` (uniform over u32): agents refused
/// together (the store not listening yet as a whole job starts, a full backlog) retry apart
/// instead of in lockstep, so a retry is not another storm.
pub fn jittered(delay: Duration, r: u32) -> Duration {
    delay.mul_f64(0.5 + f64::from(r) / (f64::from(u32::MAX) + 1.0))
}

/// The store's time to accept and authenticate one connection, about: what one wave of first
/// connects costs it (bench/store_costs.py measured 25 us for a connect on one core).
const ACCEPT_COST: Duration = Duration::from_micros(25);

/// How long an agent waits before its first connection to the job's store. A job whose first
/// connects (one per node) fit the store's listen queue (`cap`, the kernel's `somaxconn`)
/// connects at once: zero. A larger one arrives in waves of `cap`, each wave one wave's accept
/// time after the one before and spread over it, so no wave overflows the queue and the store
/// accepts as fast as it can (10,000 nodes at the common cap of 4,096: three waves over about
/// 0.3 s). `node_rank` picks the wave; unknown (c10d hands node ranks out later), `r` does
/// (uniform over u32), as it places the agent within its wave.
pub fn first_connect_delay(node_rank: Option<u32>, nnodes: u32, cap: u32, r: u32) -> Duration {
    let cap = cap.max(1);
    if nnodes <= cap {
        return Duration::ZERO;
    }
    let waves = nnodes.div_ceil(cap);
    let wave = match node_rank {
        Some(n) => n / cap,
        None => ((u64::from(r) * u64::from(waves)) >> 32) as u32,
    }
    .min(waves - 1);
    let span = ACCEPT_COST * cap;
    span * wave + span.mul_f64(f64::from(r) / (f64::from(u32::MAX) + 1.0))
}

impl StoreClient {
    /// Connects, retrying refused connections until `timeout` has passed
    /// (the server may still be starting; each retry after a [`jittered`] back-off of 10 ms
    /// doubling to 500 ms), then validates and pings like
    /// torch's client. `timeout` also becomes the default timeout of every
    /// operation (see [`StoreClient::set_timeout`]). A timeout too large to
    /// be a deadline (such as `Duration::MAX`) means no timeout.
    pub async fn connect(addr: SocketAddr, timeout: Duration) -> Result<StoreClient> {
        let deadline = far_deadline(timeout);
        let mut delay = Duration::from_millis(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let attempt = tokio::time::timeout(left, TcpStream::connect(addr)).await;
            let err = match attempt {
                Ok(Ok(stream)) => {
                    stream.set_nodelay(true)?;
                    let mut c = StoreClient {
                        stream: BufReader::new(stream),
                        wbuf: Vec::with_capacity(256),
                        timeout,
                        peer: addr,
                        broken: false,
                    };
                    let left = deadline.saturating_duration_since(Instant::now());
                    match c.handshake(left.max(Duration::from_millis(100))).await {
                        Ok(()) => return Ok(c),
                        // A full backlog can accept and then reset: retry.
                        Err(StoreError::Io(e)) => e,
                        Err(StoreError::Timeout { .. }) => {
                            std::io::Error::new(std::io::ErrorKind::TimedOut, "handshake timed out")
                        }
                        Err(e) => return Err(e),
                    }
                }
                Ok(Err(e)) => e,
                Err(_) => std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"),
            };
            if Instant::now() + delay >= deadline {
                return Err(StoreError::Connect {
                    addr,
                    timeout,
                    source: err,
                });
            }
            let r = getrandom::u32().unwrap_or_else(|_| next_nonce());
            tokio::time::sleep(jittered(delay, r)).await;
            delay = (delay * 2).min(Duration::from_millis(500));
        }
    }

    async fn handshake(&mut self, timeout: Duration) -> Result<()> {
        let nonce = next_nonce();
        self.wbuf.clear();
        Request::Validate {
            magic: VALIDATION_MAGIC,
        }
        .encode(&mut self.wbuf);
        Request::Ping { nonce }.encode(&mut self.wbuf);
        let got = self
            .guarded("connect", timeout, |s| {
                Box::pin(async move {
                    s.flush_wbuf().await?;
                    Ok(s.stream.read_u32_le().await?)
                })
            })
            .await?;
        if got != nonce {
            return Err(StoreError::Protocol(format!(
                "ping returned {got:#x}, expected {nonce:#x}"
            )));
        }
        Ok(())
    }

    /// Proves to a vigil store that this client holds the job's `secret`
    /// (`crate::auth`), so that it may use the `/vigil/` keys. Succeeds
    /// without sending anything secret if the store requires no secret. Fails
    /// with [`StoreError::Auth`] if the store requires one and `secret` is
    /// `None`, or refuses it (the store then closes the connection). torch's
    /// own server knows nothing of this and closes the connection.
    pub async fn authenticate(&mut self, secret: Option<&[u8]>) -> Result<()> {
        self.encode(Request::AuthChallenge);
        let t = self.timeout;
        let (required, nonce) = self
            .guarded("authenticate", t, |s| {
                Box::pin(async move {
                    s.flush_wbuf().await?;
                    let required = s.stream.read_u8().await?;
                    let mut nonce = [0u8; crate::auth::NONCE_LEN];
                    s.stream.read_exact(&mut nonce).await?;
                    Ok((required, nonce))
                })
            })
            .await?;
        let secret = match (required, secret) {
            (0, _) => return Ok(()),
            (_, None) => {
                return Err(StoreError::Auth(
                    "the store requires a secret and this agent has none: set the same VIGIL_STORE_SECRET on every node".into(),
                ))
            }
            (_, Some(s)) => s,
        };
        let proof = crate::auth::proof(secret, &nonce);
        self.encode(Request::AuthProof { proof });
        let ok = self
            .guarded("authenticate", t, |s| {
                Box::pin(async move {
                    s.flush_wbuf().await?;
                    // A refusal is a 0 and then the end of the connection.
                    Ok(s.stream.read_u8().await.unwrap_or(0))
                })
            })
            .await?;
        if ok != 1 {
            self.broken = true;
            return Err(StoreError::Auth(
                "the store refused this agent's secret: every node needs the same VIGIL_STORE_SECRET".into(),
            ));
        }
        Ok(())
    }

    /// The default timeout of operations (connect's `timeout` unless changed).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// Turns on TCP keepalive and `TCP_USER_TIMEOUT` on this connection so
    /// that a server that vanishes without closing (host lost, network cut)
    /// fails the connection after roughly `t` instead of leaving an operation
    /// hanging: `SO_KEEPALIVE`, `TCP_KEEPIDLE` = `TCP_KEEPINTVL` = `t / 3` in
    /// whole seconds (at least 1), `TCP_KEEPCNT` = 3, `TCP_USER_TIMEOUT` = `t`.
    /// See [`crate::server::set_peer_timeout`].
    pub fn set_peer_timeout(&self, t: Duration) -> std::io::Result<()> {
        crate::server::set_peer_timeout(self.stream.get_ref(), t)
    }

    /// The underlying socket, to read or set socket options. Reading from or
    /// writing to it breaks the protocol.
    pub fn socket(&self) -> &TcpStream {
        self.stream.get_ref()
    }

    /// The connection, for another client to speak on ([`crate::MuxClient::from_client`]).
    /// Fails on a broken client, or one holding bytes it read and did not consume.
    pub fn into_stream(self) -> Result<TcpStream> {
        if self.broken {
            return Err(StoreError::Broken);
        }
        if !self.stream.buffer().is_empty() {
            return Err(StoreError::Protocol(
                "unread bytes from the store before the hand-over".into(),
            ));
        }
        Ok(self.stream.into_inner())
    }

    /// True after an interrupted or failed operation; reconnect then.
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    async fn flush_wbuf(&mut self) -> std::io::Result<()> {
        self.stream.get_mut().write_all(&self.wbuf).await
    }

    async fn read_bytes(&mut self) -> Result<Vec<u8>> {
        let n = self.stream.read_u64_le().await?;
        if n > MAX_REPLY_LEN {
            return Err(StoreError::Protocol(format!("reply of {n} bytes")));
        }
        let mut v = vec![0u8; n as usize];
        self.stream.read_exact(&mut v).await?;
        Ok(v)
    }

    /// Runs `f` (which writes `wbuf` and reads the reply) under `timeout`,
    /// marking the connection broken unless it completes cleanly.
    async fn guarded<T>(
        &mut self,
        op: &'static str,
        timeout: Duration,
        f: impl for<'a> FnOnce(
            &'a mut StoreClient,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<T>> + Send + 'a>,
        >,
    ) -> Result<T> {
        if self.broken {
            return Err(StoreError::Broken);
        }
        self.broken = true;
        match tokio::time::timeout(timeout, f(self)).await {
            Ok(Ok(v)) => {
                self.broken = false;
                Ok(v)
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(StoreError::Timeout { op, timeout }),
        }
    }

    fn encode(&mut self, req: Request) {
        self.wbuf.clear();
        req.encode(&mut self.wbuf);
    }

    /// Sends a request that has no reply.
    async fn send_only(&mut self, op: &'static str, req: Request) -> Result<()> {
        self.encode(req);
        let t = self.timeout;
        self.guarded(op, t, |s| {
            Box::pin(async move {
                s.flush_wbuf().await?;
                Ok(())
            })
        })
        .await
    }

    async fn call_i64(&mut self, op: &'static str, req: Request) -> Result<i64> {
        self.encode(req);
        let t = self.timeout;
        self.guarded(op, t, |s| {
            Box::pin(async move {
                s.flush_wbuf().await?;
                Ok(s.stream.read_i64_le().await?)
            })
        })
        .await
    }

    async fn call_u8(&mut self, op: &'static str, req: Request) -> Result<u8> {
        self.encode(req);
        let t = self.timeout;
        self.guarded(op, t, |s| {
            Box::pin(async move {
                s.flush_wbuf().await?;
                Ok(s.stream.read_u8().await?)
            })
        })
        .await
    }

    async fn call_bytes(
        &mut self,
        op: &'static str,
        req: Request,
        n: usize,
    ) -> Result<Vec<Vec<u8>>> {
        self.encode(req);
        let t = self.timeout;
        self.guarded(op, t, |s| {
            Box::pin(async move {
                s.flush_wbuf().await?;
                let mut vals = Vec::with_capacity(n);
                for _ in 0..n {
                    vals.push(s.read_bytes().await?);
                }
                Ok(vals)
            })
        })
        .await
    }

    /// Sends a request answered by one wait byte (WAIT, BARRIER); on timeout
    /// sends CANCEL_WAIT and consumes the answers as torch's client does.
    async fn parked(&mut self, op: &'static str, req: Request, timeout: Duration) -> Result<()> {
        self.encode(req);
        let t = self.timeout;
        self.guarded(op, timeout.saturating_add(t), |s| {
            Box::pin(async move {
                s.flush_wbuf().await?;
                // read_u8 is cancel-safe: a timeout consumes nothing.
                if let Ok(r) = tokio::time::timeout(timeout, s.stream.read_u8()).await {
                    return match r? {
                        WAIT_STOP_WAITING => Ok(true),
                        b => Err(StoreError::Protocol(format!("{op} answered {b}"))),
                    };
                }
                s.wbuf.clear();
                Request::CancelWait.encode(&mut s.wbuf);
                s.flush_wbuf().await?;
                let mut b = s.stream.read_u8().await?;
                if b == WAIT_STOP_WAITING {
                    // Released just before the cancel arrived; the cancel is
                    // still acknowledged. torch reports a timeout here too.
                    b = s.stream.read_u8().await?;
                }
                if b != WAIT_CANCELED {
                    return Err(StoreError::Protocol(format!("cancel answered {b}")));
                }
                Ok(false)
            })
        })
        .await
        .and_then(|released| {
            if released {
                Ok(())
            } else {
                Err(StoreError::Timeout { op, timeout })
            }
        })
    }

    /// Sets `key` to `value`.
    pub async fn set(&mut self, key: &str, value: &[u8]) -> Result<()> {
        self.send_only(
            "set",
            Request::Set {
                key: user_key(key),
                value: value.to_vec(),
            },
        )
        .await
    }

    /// Waits (up to the default timeout) until `key` exists, then reads it.
    pub async fn get(&mut self, key: &str) -> Result<Vec<u8>> {
        let t = self.timeout;
        self.get_timeout(key, t).await
    }

    /// Waits up to `timeout` until `key` exists, then reads it.
    pub async fn get_timeout(&mut self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.wait(&[key], timeout).await?;
        let mut v = self
            .call_bytes("get", Request::Get { key: user_key(key) }, 1)
            .await?;
        Ok(v.pop().expect("one value"))
    }

    /// Adds `delta` to the decimal counter at `key` (created at 0) and returns
    /// the new value.
    pub async fn add(&mut self, key: &str, delta: i64) -> Result<i64> {
        self.call_i64(
            "add",
            Request::Add {
                key: user_key(key),
                delta,
            },
        )
        .await
    }

    /// True if every key exists (without waiting).
    pub async fn check(&mut self, keys: &[&str]) -> Result<bool> {
        let keys = keys.iter().map(|k| user_key(k)).collect();
        match self.call_u8("check", Request::Check { keys }).await? {
            CHECK_READY => Ok(true),
            CHECK_NOT_READY => Ok(false),
            b => Err(StoreError::Protocol(format!("check answered {b}"))),
        }
    }

    /// Waits until every key exists; [`StoreError::Timeout`] after `timeout`.
    /// `Duration::MAX` (or any timeout too large to be a deadline) waits
    /// forever.
    pub async fn wait(&mut self, keys: &[&str], timeout: Duration) -> Result<()> {
        let keys = keys.iter().map(|k| user_key(k)).collect();
        self.parked("wait", Request::Wait { keys }, timeout).await
    }

    /// torch's compare-and-set: if `key` holds `expected`, or is missing and
    /// `expected` is empty, it becomes `desired`. Returns the value after the
    /// operation; for a missing key with a non-empty `expected`, returns
    /// `expected` and changes nothing (as torch does).
    pub async fn compare_set(
        &mut self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
    ) -> Result<Vec<u8>> {
        let mut v = self
            .call_bytes(
                "compare_set",
                Request::CompareSet {
                    key: user_key(key),
                    expected: expected.to_vec(),
                    desired: desired.to_vec(),
                },
                1,
            )
            .await?;
        Ok(v.pop().expect("one value"))
    }

    /// Deletes `key`; true if it existed.
    pub async fn delete_key(&mut self, key: &str) -> Result<bool> {
        Ok(self
            .call_i64("delete_key", Request::DeleteKey { key: user_key(key) })
            .await?
            == 1)
    }

    /// Number of keys in the store (every key, not only `/`-prefixed ones).
    pub async fn num_keys(&mut self) -> Result<i64> {
        self.call_i64("num_keys", Request::GetNumKeys).await
    }

    /// Waits (default timeout) for all keys, then reads them in order.
    pub async fn multi_get(&mut self, keys: &[&str]) -> Result<Vec<Vec<u8>>> {
        let t = self.timeout;
        self.wait(keys, t).await?;
        let raw = keys.iter().map(|k| user_key(k)).collect();
        self.call_bytes("multi_get", Request::MultiGet { keys: raw }, keys.len())
            .await
    }

    /// Sets several keys in one request.
    pub async fn multi_set(&mut self, pairs: &[(&str, &[u8])]) -> Result<()> {
        let pairs = pairs
            .iter()
            .map(|(k, v)| (user_key(k), v.to_vec()))
            .collect();
        self.send_only("multi_set", Request::MultiSet { pairs })
            .await
    }

    /// Appends `value` to `key` (created if missing).
    pub async fn append(&mut self, key: &str, value: &[u8]) -> Result<()> {
        self.send_only(
            "append",
            Request::Append {
                key: user_key(key),
                value: value.to_vec(),
            },
        )
        .await
    }

    /// Round trip with a fresh nonce; returns how long it took.
    pub async fn ping(&mut self) -> Result<Duration> {
        let nonce = next_nonce();
        self.encode(Request::Ping { nonce });
        let t = self.timeout;
        let start = Instant::now();
        let got = self
            .guarded("ping", t, |s| {
                Box::pin(async move {
                    s.flush_wbuf().await?;
                    Ok(s.stream.read_u32_le().await?)
                })
            })
            .await?;
        if got != nonce {
            return Err(StoreError::Protocol(format!(
                "ping returned {got:#x}, expected {nonce:#x}"
            )));
        }
        Ok(start.elapsed())
    }

    /// Appends `value` to the queue `key`.
    pub async fn queue_push(&mut self, key: &str, value: &[u8]) -> Result<()> {
        self.send_only(
            "queue_push",
            Request::QueuePush {
                key: user_key(key),
                value: value.to_vec(),
            },
        )
        .await
    }

    /// Pops the oldest element of queue `key`. With `block`, waits (default
    /// timeout) for one; without, an empty queue is [`StoreError::QueueEmpty`].
    pub async fn queue_pop(&mut self, key: &str, block: bool) -> Result<Vec<u8>> {
        if block {
            let t = self.timeout;
            self.wait(&[key], t).await?;
        }
        self.encode(Request::QueuePop { key: user_key(key) });
        let t = self.timeout;
        self.guarded("queue_pop", t, |s| {
            Box::pin(async move {
                s.flush_wbuf().await?;
                let n = s.stream.read_i64_le().await?;
                if n <= 0 {
                    return Ok(None);
                }
                Ok(Some(s.read_bytes().await?))
            })
        })
        .await?
        .ok_or(StoreError::QueueEmpty)
    }

    /// Length of queue `key` (0 if it does not exist).
    pub async fn queue_len(&mut self, key: &str) -> Result<i64> {
        self.call_i64("queue_len", Request::QueueLen { key: user_key(key) })
            .await
    }

    /// Sends `req`, answered by a key list (`i64` count, then the keys).
    async fn call_keys(&mut self, op: &'static str, req: Request) -> Result<Vec<Vec<u8>>> {
        self.encode(req);
        let t = self.timeout;
        self.guarded(op, t, |s| {
            Box::pin(async move {
                s.flush_wbuf().await?;
                let n = s.stream.read_i64_le().await?;
                if !(0..=(1 << 24)).contains(&n) {
                    return Err(StoreError::Protocol(format!("{op} count {n}")));
                }
                let mut keys = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    keys.push(s.read_bytes().await?);
                }
                Ok(keys)
            })
        })
        .await
    }

    /// Every user key (those with the `/` prefix), prefix removed, in the
    /// server's order.
    pub async fn list_keys(&mut self) -> Result<Vec<String>> {
        let raw = self.call_keys("list_keys", Request::ListKeys).await?;
        Ok(user_keys(raw))
    }

    /// vigil's RANK_ONLY, one-way: from now on this connection carries a rank's torch client
    /// (the ranks' door sends it after [`StoreClient::authenticate`]): torch's operations on keys
    /// outside `vigil/` only, for good.
    pub async fn rank_only(&mut self) -> Result<()> {
        self.send_only("rank_only", Request::RankOnly).await
    }

    /// vigil's RENEW, one-way: adds 1 to the counter `key` and marks it renewed for the next
    /// [`StoreClient::sweep`]. Nothing comes back; a broken connection shows on the next call.
    pub async fn renew(&mut self, key: &str) -> Result<()> {
        self.send_only("renew", Request::Renew { key: user_key(key) })
            .await
    }

    /// vigil's SWEEP: the counters under `prefix` that were renewed before but not since the
    /// previous sweep of `prefix` (prefix of the user key space, returned without the leading
    /// `/`), sorted. One caller per prefix: each sweep starts the next period.
    pub async fn sweep(&mut self, prefix: &str) -> Result<Vec<String>> {
        let raw = self
            .call_keys(
                "sweep",
                Request::Sweep {
                    prefix: user_key(prefix),
                },
            )
            .await?;
        Ok(user_keys(raw))
    }

    /// Blocks until `world_size` participants called `barrier` with the same
    /// key (server-side counter, torch's BARRIER), or `timeout`.
    pub async fn barrier(&mut self, key: &str, world_size: i64, timeout: Duration) -> Result<()> {
        self.parked(
            "barrier",
            Request::Barrier {
                key: user_key(key),
                world_size,
            },
            timeout,
        )
        .await
    }
}

#[cfg(test)]
mod jitter_tests {
    use super::{first_connect_delay, jittered};
    use std::time::Duration;

    #[test]
    fn a_retry_is_spread_around_its_back_off_and_never_zero_or_doubled() {
        let d = Duration::from_millis(100);
        assert_eq!(jittered(d, 0), Duration::from_millis(50));
        assert!(jittered(d, u32::MAX) <= Duration::from_millis(150));
        assert!(jittered(d, u32::MAX) > Duration::from_millis(149));
        assert_eq!(jittered(d, 1 << 31), d);
        // Different draws, different waits: agents refused together do not retry together.
        let waits: std::collections::BTreeSet<Duration> = (0..64u32)
            .map(|i| jittered(d, i.wrapping_mul(0x9E37_79B9)))
            .collect();
        assert!(waits.len() > 60, "{}", waits.len());
    }

    #[test]
    fn a_job_that_fits_the_listen_queue_connects_at_once() {
        for r in [0, 1 << 31, u32::MAX] {
            assert_eq!(
                first_connect_delay(Some(4095), 4096, 4096, r),
                Duration::ZERO
            );
            assert_eq!(first_connect_delay(None, 2, 128, r), Duration::ZERO);
        }
    }

    #[test]
    fn a_larger_job_connects_in_waves_the_queue_holds() {
        let (n, cap) = (10_000u32, 4096u32);
        let span = Duration::from_micros(25) * cap;
        let mut per_wave = [0u32; 3];
        let mut latest = Duration::ZERO;
        for rank in 0..n {
            let d = first_connect_delay(Some(rank), n, cap, rank.wrapping_mul(0x9E37_79B9));
            let wave = (d.as_nanos() / span.as_nanos()) as usize;
            assert_eq!(wave as u32, rank / cap, "rank {rank}: {d:?}");
            per_wave[wave] += 1;
            latest = latest.max(d);
        }
        assert!(per_wave.iter().all(|w| *w <= cap), "{per_wave:?}");
        assert!(latest < span * 3, "{latest:?}");
        // Without node ranks the waves are drawn: all used, none far over the queue.
        let mut drawn = [0u32; 3];
        for i in 0..n {
            let d = first_connect_delay(None, n, cap, i.wrapping_mul(0x9E37_79B9));
            drawn[(d.as_nanos() / span.as_nanos()) as usize] += 1;
        }
        assert!(
            drawn.iter().all(|w| *w > 2_000 && *w <= cap + cap / 8),
            "{drawn:?}"
        );
    }
}
